//! Link settings for the gateway binary.
//!
//! Packed relative relocations (DT_RELR): a position-independent executable otherwise carries
//! a large table of `R_X86_64_RELATIVE` entries that the dynamic loader reads at every start,
//! which shows up as resident memory of an idle gateway. glibc 2.36+ and binutils 2.38+ (or lld)
//! understand the packed form; `GATEWAY_NO_RELR=1` turns it off for older toolchains.
//!
//! Function order (release builds): the functions a gateway runs are laid out together, in the
//! order of `link-order.txt` (written by `benches/harness/link_order.py`), so the pages of code
//! an idle or busy gateway keeps resident hold code it runs, not its neighbours spread over the
//! whole `.text` (the kernel maps 64 KiB around every page of code it faults in); the figures
//! are in docs/performance-log.md. Only lld orders by
//! symbol; the toolchain ships one (`rust-lld`, behind `gcc-ld/ld.lld`), which is used when it
//! is there. `GATEWAY_LINK_ORDER=0` links without the order.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=GATEWAY_NO_RELR");
    println!("cargo:rerun-if-env-changed=GATEWAY_LINK_ORDER");
    println!("cargo:rerun-if-changed=link-order.txt");
    let target = std::env::var("TARGET").unwrap_or_default();
    if !target.ends_with("-linux-gnu") {
        return;
    }
    if std::env::var_os("GATEWAY_NO_RELR").is_none_or(|v| v != "1") {
        println!("cargo:rustc-link-arg-bin=gateway=-Wl,-z,pack-relative-relocs");
    }
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let wanted = std::env::var_os("GATEWAY_LINK_ORDER").is_none_or(|v| v != "0");
    let order =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("link-order.txt");
    if !(release && wanted && order.is_file()) {
        return;
    }
    match bundled_lld_dir() {
        Some(dir) => {
            println!("cargo:rustc-link-arg-bin=gateway=-B{}", dir.display());
            println!("cargo:rustc-link-arg-bin=gateway=-fuse-ld=lld");
            println!(
                "cargo:rustc-link-arg-bin=gateway=-Wl,--symbol-ordering-file={}",
                order.display()
            );
            // Names of functions the build no longer has (another toolchain or dependency
            // version) are skipped; the list only loses some of its effect.
            println!("cargo:rustc-link-arg-bin=gateway=-Wl,--no-warn-symbol-ordering");
        }
        None => println!(
            "cargo:warning=no rust-lld in the toolchain: the gateway is linked without \
             link-order.txt (idle RSS ~3 MB higher)"
        ),
    }
}

/// The directory of the toolchain's `ld.lld` wrapper around `rust-lld`, which the C compiler
/// driver picks with `-B DIR -fuse-ld=lld`.
fn bundled_lld_dir() -> Option<PathBuf> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let host = std::env::var("HOST").ok()?;
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = String::from_utf8(out.stdout).ok()?;
    let dir = Path::new(sysroot.trim()).join(format!("lib/rustlib/{host}/bin/gcc-ld"));
    dir.join("ld.lld").is_file().then_some(dir)
}
