//! Marker functions around each measured call.
//!
//! `report.py` finds their addresses in the ELF symbol table and counts the
//! instructions QEMU executes from the entry of [`begin`] to the entry of
//! [`end`]. Both are never inlined and have bodies the optimizer must keep
//! (an `asm!` without `pure` counts as a side effect); their bodies differ so
//! that no pass merges them into one address.

/// Called just before the measured call.
#[inline(never)]
pub fn begin() {
    // SAFETY: an empty instruction sequence: touches no register, memory or
    // flag the compiler relies on.
    #[allow(unsafe_code)]
    unsafe {
        core::arch::asm!("", options(nostack, preserves_flags));
    }
}

/// Called just after the measured call.
#[inline(never)]
pub fn end() {
    // SAFETY: `nop` has no effect on registers, memory or flags.
    #[allow(unsafe_code)]
    unsafe {
        core::arch::asm!("nop", options(nostack, preserves_flags));
    }
}
