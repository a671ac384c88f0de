//! A live session through shared RAM: the region in `.shmtrace` (PSRAM at
//! `0x2100_0000`, offset 0 of the file QEMU backs PSRAM with), consumed by
//! a host that maps it (`shmtrace serve --attach FILE`). See
//! `shmtrace_firmware_example::live`.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

use cortex_m_rt::{entry, exception};
use shmtrace_abi::link::AttachService;
use shmtrace_firmware_example::live::{self, LiveStorage, Mailbox};

// The region and the mailbox go to PSRAM (memory.x: `.shmtrace`, then
// `.hostmail`, NOLOAD). The lint counts `link_section` as unsafe code
// because a section can be anything; these only place the statics, which
// `RegionStorage::take` and `Mailbox::reset` initialize.
#[allow(unsafe_code)]
#[link_section = ".shmtrace"]
static REGION: LiveStorage = LiveStorage::new();
#[allow(unsafe_code)]
#[link_section = ".hostmail"]
static MAILBOX: Mailbox = Mailbox::new();

#[exception]
fn SysTick() {
    live::on_systick();
}

#[entry]
fn main() -> ! {
    live::run(&REGION, &MAILBOX, false, AttachService::new)
}
