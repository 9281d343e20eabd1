//! Builds `clock_shift/shim.rs`, the preloadable library that moves a
//! test `redis-server`'s wall clock (see `src/clock_shift.rs`), with the
//! same compiler, into `OUT_DIR`; its path reaches the crate as
//! `FLOTILLA_CLOCK_SHIFT_LIB` (empty where it cannot be built).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "clock_shift/shim.rs";
    println!("cargo:rerun-if-changed={source}");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let library = out_dir.join("libflotilla_clock_shift.so");
    let target = std::env::var("TARGET").unwrap_or_default();
    let supported =
        target.contains("linux") && (target.starts_with("x86_64") || target.starts_with("aarch64"));
    let built = supported && {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let status = Command::new(rustc)
            .args([
                "--edition",
                "2024",
                "--crate-type",
                "cdylib",
                "-O",
                "-C",
                "panic=abort",
            ])
            .arg("--target")
            .arg(&target)
            .arg(source)
            .arg("-o")
            .arg(&library)
            .status();
        match status {
            Ok(s) if s.success() => true,
            other => {
                println!("cargo:warning=the clock-shift test library was not built: {other:?}");
                false
            }
        }
    };
    let path = if built {
        library.display().to_string()
    } else {
        String::new()
    };
    println!("cargo:rustc-env=FLOTILLA_CLOCK_SHIFT_LIB={path}");
}
