//! Link settings for the gateway binary.
//!
//! Packed relative relocations (DT_RELR): a position-independent executable otherwise carries
//! ~750 KB of `R_X86_64_RELATIVE` entries that the dynamic loader reads at every start, which
//! shows up as resident memory of an idle gateway. glibc 2.36+ and binutils 2.38+ (or lld)
//! understand the packed form; `GATEWAY_NO_RELR=1` turns it off for older toolchains.

fn main() {
    println!("cargo:rerun-if-env-changed=GATEWAY_NO_RELR");
    let target = std::env::var("TARGET").unwrap_or_default();
    let disabled = std::env::var_os("GATEWAY_NO_RELR").is_some_and(|v| v == "1");
    if target.ends_with("-linux-gnu") && !disabled {
        println!("cargo:rustc-link-arg-bin=gateway=-Wl,-z,pack-relative-relocs");
    }
}
