//! Generates the raw bindings from the public header with the `bindgen` command (Debian's
//! bindgen CLI; no crates are fetched), checks them against the committed copy so that a header
//! change nobody regenerated for fails the build, and finds libswiftkv.
//!
//! Where things are:
//!   SWIFTKV_INCLUDE_DIR  the directory holding swiftkv/swiftkv.h (default: pkg-config's, else
//!                        the source tree's include/)
//!   SWIFTKV_LIB_DIR      the directory holding libswiftkv.so (default: pkg-config's)
//!   BINDGEN              the bindgen command (default: bindgen)
//!   SWIFTKV_SYS_BLESS=1  overwrite src/bindings.rs with what the header gives now
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config").args(args).arg("swiftkv").output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn include_dir(manifest: &Path) -> PathBuf {
    if let Ok(d) = env::var("SWIFTKV_INCLUDE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = pkg_config(&["--variable=includedir"]) {
        if Path::new(&d).join("swiftkv/swiftkv.h").exists() {
            return PathBuf::from(d);
        }
    }
    manifest.join("../../../include")
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let include = include_dir(&manifest);
    let header = include.join("swiftkv/swiftkv.h");
    println!("cargo:rerun-if-changed={}", header.display());
    for v in ["SWIFTKV_INCLUDE_DIR", "SWIFTKV_LIB_DIR", "BINDGEN", "SWIFTKV_SYS_BLESS",
              "PKG_CONFIG_PATH"] {
        println!("cargo:rerun-if-env-changed={}", v);
    }

    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    let bindgen = env::var("BINDGEN").unwrap_or_else(|_| "bindgen".to_string());
    let status = Command::new(&bindgen)
        .arg(&header)
        .arg("-o").arg(&out)
        .args(["--allowlist-function", "swiftkv_.*"])
        .args(["--allowlist-type", "swiftkv_.*"])
        .args(["--allowlist-var", "SWIFTKV_.*"])
        .args(["--default-enum-style", "consts", "--no-prepend-enum-name"])
        .args(["--no-doc-comments", "--size_t-is-usize"])
        .arg("--")
        .arg(format!("-I{}", include.display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run `{}` (install Debian's bindgen): {}", bindgen, e));
    assert!(status.success(), "bindgen failed on {}", header.display());

    // Drift check: the committed bindings must be what the header gives.
    let generated = fs::read_to_string(&out).unwrap();
    let committed_path = manifest.join("src/bindings.rs");
    let committed = fs::read_to_string(&committed_path).unwrap_or_default();
    if env::var("SWIFTKV_SYS_BLESS").as_deref() == Ok("1") {
        fs::write(&committed_path, &generated).unwrap();
    } else if generated != committed {
        panic!(
            "src/bindings.rs no longer matches {}: the C header changed. Review the change, \
             cover it in the safe crate, then regenerate with SWIFTKV_SYS_BLESS=1 cargo build",
            header.display()
        );
    }

    let lib_dir = env::var("SWIFTKV_LIB_DIR").ok().or_else(|| pkg_config(&["--variable=libdir"]));
    if let Some(dir) = lib_dir {
        println!("cargo:rustc-link-search=native={}", dir);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
        println!("cargo:lib_dir={}", dir);
    }
    println!("cargo:rustc-link-lib=dylib=swiftkv");
    println!("cargo:include={}", include.display());
}
