//! The smallest producer: one writer that writes instants only (on its
//! sequence's default track, names interned at the call site), with a
//! 2-entry interning table, no track descriptors of its own and 1 cached
//! call site, its region in `.shmtrace` (PSRAM), left to a host as
//! `minimal`'s is. The report measures the .text it adds over the skeleton.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

use cortex_m_rt::{entry, exception};
use shmtrace_firmware_example::shm::HostStorage;
use shmtrace_firmware_example::tracer::ShmTracer;
use shmtrace_firmware_example::{clocks, Event, InstantsOnly};

// As in `minimal`: `link_section` only places the static, and
// `RegionStorage::take` initializes it.
#[allow(unsafe_code)]
#[link_section = ".shmtrace"]
static REGION: HostStorage = HostStorage::new();

#[exception]
fn SysTick() {
    clocks::count_reload();
}

#[entry]
fn main() -> ! {
    let mut t = InstantsOnly(ShmTracer::<2, 0, 1, false>::new(&REGION));
    shmtrace_firmware_example::run("instants", &Event::INSTANTS, &mut t)
}
