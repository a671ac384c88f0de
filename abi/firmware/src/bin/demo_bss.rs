//! The demo with its SMB as an ordinary static in `.bss`: the report reads
//! the alignment gap the storage leaves before it there.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

use cortex_m_rt::{entry, exception};
use shmtrace_firmware_example::shm::Storage;
use shmtrace_firmware_example::tracer::{self, ShmTracer};
use shmtrace_firmware_example::{clocks, Event};

static REGION: Storage = Storage::new();

#[exception]
fn SysTick() {
    tracer::on_systick(clocks::count_reload());
}

#[entry]
fn main() -> ! {
    let mut t = ShmTracer::<16, 4, 8, true>::new(&REGION);
    shmtrace_firmware_example::run("demo-bss", &Event::ALL, &mut t)
}
