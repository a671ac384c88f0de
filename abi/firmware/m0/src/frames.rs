//! The stream link's cost on the Cortex-M0 (`thumbv6m-none-eabi`, QEMU
//! `microbit`): CHUNK frames encoded between the markers, the same code as
//! the Cortex-M4 firmware's `frames` binary (`abi/firmware/src/frames.rs`
//! and `markers.rs`, included from there); `abi/firmware/report.py` builds
//! and runs it and counts their instructions.
#![no_std]
#![no_main]

#[path = "../../src/frames.rs"]
mod frames;
#[path = "../../src/markers.rs"]
mod markers;

use cortex_m_rt::{entry, exception, ExceptionFrame};
use cortex_m_semihosting::{debug, hprintln};

#[entry]
fn main() -> ! {
    frames::run(&mut |line| hprintln!("{}", line));
    hprintln!("done");
    exit(true)
}

/// Ends the run with semihosting `exit`.
fn exit(success: bool) -> ! {
    debug::exit(if success {
        debug::EXIT_SUCCESS
    } else {
        debug::EXIT_FAILURE
    });
    // Only reached without a semihosting host.
    loop {
        cortex_m::asm::wfi();
    }
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
