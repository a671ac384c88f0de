//! The size baseline: the demo's runtime, clock, loop and output with a
//! tracer that writes nothing.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

use cortex_m_rt::{entry, exception};
use shmtrace_firmware_example::events::NoTracer;
use shmtrace_firmware_example::{clocks, Event};

#[exception]
fn SysTick() {
    clocks::count_reload();
}

#[entry]
fn main() -> ! {
    shmtrace_firmware_example::run("skeleton", &Event::ALL, &mut NoTracer)
}
