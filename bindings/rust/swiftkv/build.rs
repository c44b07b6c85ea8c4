//! Gives this crate's tests and examples an rpath to the libswiftkv that swiftkv-sys found, so
//! that `cargo test` runs without LD_LIBRARY_PATH.
fn main() {
    if let Ok(dir) = std::env::var("DEP_SWIFTKV_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
