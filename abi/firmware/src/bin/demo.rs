//! The demo: track events into an SMB placed in `.shmtrace` (PSRAM at
//! `0x2100_0000`, the RAM QEMU can share with a host process).
#![no_std]
#![no_main]

use core::ptr::addr_of_mut;

use cortex_m_rt::entry;
use shmtrace_firmware_example::tracer::{self, Storage};

#[link_section = ".shmtrace"]
static mut SMB: Storage = Storage::new();

#[entry]
fn main() -> ! {
    // SAFETY: `main` runs once and is the only code that names `SMB`, so this
    // is the only reference to it, for the rest of the run.
    let storage = unsafe { &mut *addr_of_mut!(SMB) };
    tracer::with_tracer(storage, |t| shmtrace_firmware_example::run("demo", t))
}
