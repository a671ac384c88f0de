//! The demo: track events from the main loop and the `SysTick` interrupt
//! into an SMB placed in `.shmtrace` (PSRAM at `0x2100_0000`, the RAM QEMU
//! can share with a host process).
#![no_std]
#![no_main]
#![deny(unsafe_code)]

use cortex_m_rt::{entry, exception};
use shmtrace_firmware_example::shm::Storage;
use shmtrace_firmware_example::tracer::{self, ShmTracer};
use shmtrace_firmware_example::{clocks, Event};

// The region goes to `.shmtrace` (memory.x: PSRAM, NOLOAD). The lint counts
// `link_section` as unsafe code because a section can be anything; this one
// only places the static, and `RegionStorage::take` initializes it.
#[allow(unsafe_code)]
#[link_section = ".shmtrace"]
static REGION: Storage = Storage::new();

#[exception]
fn SysTick() {
    tracer::on_systick(clocks::count_reload());
}

#[entry]
fn main() -> ! {
    let mut t = ShmTracer::<16, 4, 8, true>::new(&REGION);
    shmtrace_firmware_example::run("demo", &Event::ALL, &mut t)
}
