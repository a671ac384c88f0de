//! The smallest useful producer: one writer (slices, instants, an integer
//! counter) with a 4-entry interning table, room for 2 track descriptors
//! and 4 cached call sites, its region in `.shmtrace` (PSRAM), left to a host: the
//! report reads it from the file QEMU backs PSRAM with, and measures the
//! issue's size goal on this binary.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

use cortex_m_rt::{entry, exception};
use shmtrace_firmware_example::shm::HostStorage;
use shmtrace_firmware_example::tracer::ShmTracer;
use shmtrace_firmware_example::{clocks, Event};

// The region goes to `.shmtrace` (memory.x: PSRAM, NOLOAD). The lint counts
// `link_section` as unsafe code because a section can be anything; this one
// only places the static, and `RegionStorage::take` initializes it.
#[allow(unsafe_code)]
#[link_section = ".shmtrace"]
static REGION: HostStorage = HostStorage::new();

#[exception]
fn SysTick() {
    clocks::count_reload();
}

#[entry]
fn main() -> ! {
    let mut t = ShmTracer::<4, 2, 4, false>::new(&REGION);
    shmtrace_firmware_example::run("minimal", &Event::MINIMAL, &mut t)
}
