//! The size baseline: the demo's runtime, loop and output with a tracer that
//! writes nothing.
#![no_std]
#![no_main]

use cortex_m_rt::entry;
use shmtrace_firmware_example::events::NoTracer;

#[entry]
fn main() -> ! {
    shmtrace_firmware_example::run("skeleton", &mut NoTracer)
}
