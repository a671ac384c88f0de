//! The stream link's cost on the Cortex-M0 (`thumbv6m-none-eabi`, QEMU
//! `microbit`): CHUNK frames encoded between the markers, the same code as
//! the Cortex-M4 firmware's `frames` binary (`abi/firmware/src/frames.rs`
//! and `markers.rs`, included from there); `abi/firmware/report.py` builds
//! and runs it and counts their instructions.
#![no_std]
#![no_main]

mod exit;
#[path = "../../src/frames.rs"]
mod frames;
#[path = "../../src/markers.rs"]
mod markers;

use cortex_m_rt::{entry, exception, ExceptionFrame};
use cortex_m_semihosting::hprintln;

use exit::exit;

#[entry]
fn main() -> ! {
    frames::run(&mut |line| hprintln!("{}", line));
    hprintln!("done");
    exit(true)
}

#[exception]
unsafe fn HardFault(_: &ExceptionFrame) -> ! {
    hprintln!("hard fault");
    exit(false)
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    hprintln!("panic");
    exit(false)
}
