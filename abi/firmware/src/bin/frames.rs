//! The stream link's cost on the Cortex-M4: CHUNK frames encoded between
//! the markers (see `shmtrace_firmware_example::frames`); `report.py`
//! counts their instructions.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

use cortex_m_rt::entry;
use shmtrace_firmware_example::{frames, out};

#[entry]
fn main() -> ! {
    let mut out = out::Out::open();
    frames::run(&mut |line| out.line(line));
    out.line(format_args!("done"));
    out::exit(true)
}
