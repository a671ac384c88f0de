//! The end of a run, for both binaries.

use cortex_m_semihosting::debug;

/// Ends the run with semihosting `exit`.
pub fn exit(success: bool) -> ! {
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
