//! Uses the committed raw bindings (`src/bindings.rs`) and finds libswiftkv. A consumer needs no
//! bindgen: the bindings are regenerated only on request, with the `bindgen` command (Debian's
//! bindgen CLI; no crates are fetched), and the project's own tests do that to check that the
//! committed copy is what the header gives.
//!
//! Where things are, and what to do:
//!   SWIFTKV_INCLUDE_DIR       the directory holding swiftkv/swiftkv.h (default: pkg-config's,
//!                             else the source tree's include/), for regeneration
//!   SWIFTKV_LIB_DIR           the directory holding libswiftkv.so (default: pkg-config's)
//!   BINDGEN                   the bindgen command (default: bindgen)
//!   SWIFTKV_SYS_REGENERATE=1  run bindgen and fail when src/bindings.rs differs (the drift check)
//!   SWIFTKV_SYS_BLESS=1       run bindgen and overwrite src/bindings.rs with what it gives
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
              "SWIFTKV_SYS_REGENERATE", "PKG_CONFIG_PATH"] {
        println!("cargo:rerun-if-env-changed={}", v);
    }
    let committed_path = manifest.join("src/bindings.rs");
    println!("cargo:rerun-if-changed={}", committed_path.display());

    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    let bless = env::var("SWIFTKV_SYS_BLESS").as_deref() == Ok("1");
    let regenerate = bless || env::var("SWIFTKV_SYS_REGENERATE").as_deref() == Ok("1");
    if !regenerate {
        fs::copy(&committed_path, &out).unwrap_or_else(|e| {
            panic!("cannot copy {}: {}", committed_path.display(), e)
        });
        link(&include);
        return;
    }
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
    let committed = fs::read_to_string(&committed_path).unwrap_or_default();
    if bless {
        fs::write(&committed_path, &generated).unwrap();
    } else if generated != committed {
        panic!(
            "src/bindings.rs no longer matches {}: the C header changed. Review the change, \
             cover it in the safe crate, then regenerate with SWIFTKV_SYS_BLESS=1 cargo build",
            header.display()
        );
    }
    link(&include);
}

// Where libswiftkv is, for the linker (and a run path for this package's own tests).
fn link(include: &Path) {

    let lib_dir = env::var("SWIFTKV_LIB_DIR").ok().or_else(|| pkg_config(&["--variable=libdir"]));
    if let Some(dir) = lib_dir {
        println!("cargo:rustc-link-search=native={}", dir);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
        println!("cargo:lib_dir={}", dir);
    }
    println!("cargo:rustc-link-lib=dylib=swiftkv");
    println!("cargo:include={}", include.display());
}
