//! Emits `cfg(shmtrace_no_umull)` for ARM cores without the 32x32->64-bit
//! multiply (`UMULL`), which stable Rust's `cfg` cannot name: ARMv6-M
//! (Cortex-M0/M0+) and ARMv8-M Baseline (Cortex-M23) implement only the
//! Thumb-1 multiply, and so does any ARM target without 32-bit atomics
//! (ARMv4T/v5TE in Thumb mode). `track_event::clock` multiplies in 16-bit
//! halves there instead of calling the 64x64-bit library routine.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(shmtrace_no_umull)");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let arm = var("CARGO_CFG_TARGET_ARCH") == "arm";
    let atomic32 = var("CARGO_CFG_TARGET_HAS_ATOMIC")
        .split(',')
        .any(|w| w == "32");
    let target = var("TARGET");
    let thumb1 = ["thumbv6m", "thumbv8m.base"]
        .iter()
        .any(|arch| target.starts_with(arch));
    if arm && (!atomic32 || thumb1) {
        println!("cargo::rustc-cfg=shmtrace_no_umull");
    }
}
