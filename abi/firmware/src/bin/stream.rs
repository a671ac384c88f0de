//! A live session through UART0: the firmware drains its own region (in
//! stream mode) into frames on UART0 and obeys the host's frames from it
//! (`shmtrace bridge --input tcp:...` with QEMU's `-serial tcp:...`). See
//! `shmtrace_firmware_example::live`.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

use cortex_m_rt::{entry, exception};
use shmtrace_firmware_example::live::{self, LiveStorage, Mailbox};

// As in `attach`: the region and the mailbox in PSRAM, which a host can
// map (the test harness writes the mailbox there).
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
    live::run(&REGION, &MAILBOX, true, live::uart_stream)
}
