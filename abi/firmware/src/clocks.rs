//! Clock hooks: where the firmware's timestamps come from.
//!
//! A [`Clock`] returns nanoseconds on the firmware's own time base. Two
//! examples for a Cortex-M:
//!
//! * [`SysTickClock`] (used by the demo): the SysTick interrupt counts
//!   reloads ([`count_reload`], called from the `SysTick` handler), and a
//!   reading is `reloads * period + ticks into this period`, converted with
//!   a [`TickRate`] (a fixed-point multiply of the whole 64-bit count, so no
//!   rounding error accumulates). Its resolution is one SysTick tick (40 ns
//!   at 25 MHz).
//! * [`dwt_clock`]: the DWT cycle counter, widened to 64 bits with
//!   [`Extend32`] and converted by a [`TickClock`]. One cycle of resolution
//!   and no interrupt, but it must be read at least once per 2^32 cycles
//!   (25.6 s at 168 MHz) and the core must have a DWT (not the
//!   Cortex-M0/M0+). It is compiled here but not used by the run: QEMU does
//!   not model the cycle counter (it reads 0).
//!
//! Under QEMU 7.2 (`mps2-an386`, SysTick on the 25 MHz core clock): without
//! `-icount`, SysTick advances with the host's time and its current value
//! reads 0, so [`SysTickClock`] then only moves by whole periods; with
//! `-icount shift=0` (one instruction per virtual nanosecond) it counts one
//! tick per 40 instructions, as the report runs it.

use core::sync::atomic::{AtomicU32, Ordering::Relaxed};

use cortex_m::peripheral::syst::SystClkSource;
use cortex_m::peripheral::{DCB, DWT, SCB, SYST};
use shmtrace_abi::track_event::{Clock, Extend32, TickClock, TickRate};

/// The SysTick clock: the core clock of QEMU's mps2 boards (SYSCLK).
pub const SYSTICK_HZ: u32 = 25_000_000;
/// SysTick interrupts per second: one every 20 µs (500 ticks, 20,000
/// instructions under `-icount shift=0`), often enough that the interrupt's
/// writer has work during the short run.
pub const TICK_HZ: u32 = 50_000;
/// SysTick ticks per period.
pub const PERIOD: u32 = SYSTICK_HZ / TICK_HZ;
/// One period in nanoseconds.
pub const PERIOD_NS: u64 = 1_000_000_000 / TICK_HZ as u64;

const RATE: TickRate = TickRate::new(SYSTICK_HZ);

/// SysTick reloads (wraps) so far, counted by the `SysTick` handler.
static RELOADS: AtomicU32 = AtomicU32::new(0);

/// Starts SysTick on the core clock with an interrupt every period.
pub fn start_systick(syst: &mut SYST) {
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(PERIOD - 1);
    syst.clear_current();
    syst.enable_interrupt();
    syst.enable_counter();
}

/// Counts one reload: the first thing the `SysTick` handler does. Returns
/// the new count.
#[inline(always)]
pub fn count_reload() -> u32 {
    // Only the SysTick handler writes it, and it does not preempt itself.
    let n = RELOADS.load(Relaxed).wrapping_add(1);
    RELOADS.store(n, Relaxed);
    n
}

/// Reloads counted so far.
pub fn reloads() -> u32 {
    RELOADS.load(Relaxed)
}

/// SysTick ticks since it started, as a 64-bit count.
///
/// Correct from any context that reads it within one period: a reload the
/// handler has not counted yet (this code runs with the interrupt masked,
/// or in a handler of higher priority) shows as the pending SysTick
/// exception, and a reload counted while this ran makes it read again.
#[inline(always)]
pub fn ticks() -> u64 {
    loop {
        let reloads = RELOADS.load(Relaxed);
        let mut current = SYST::get_current();
        let mut whole = reloads;
        if SCB::is_pendst_pending() {
            // The counter wrapped and the handler has not run: count that
            // period, and read the value after the wrap.
            whole = whole.wrapping_add(1);
            current = SYST::get_current();
        }
        if RELOADS.load(Relaxed) == reloads {
            // SysTick counts PERIOD - 1 down to 0 and pends its exception
            // as it reaches 0, the last tick of a period: 0 is a whole
            // number of periods, PERIOD - 1 one tick more. (A value the
            // counter cannot hold, PERIOD or more, counts as 0 too: the
            // difference wraps to PERIOD or more. One compare, no branch.)
            let into = PERIOD.wrapping_sub(current);
            let into = if into < PERIOD { into } else { 0 };
            return u64::from(whole) * u64::from(PERIOD) + u64::from(into);
        }
    }
}

/// The demo's clock: SysTick ticks in nanoseconds (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct SysTickClock;

impl Clock for SysTickClock {
    #[inline(always)]
    fn now_ns(&mut self) -> u64 {
        RATE.ns(ticks())
    }
}

/// The RTOS-style tick clock the demo pairs with [`SysTickClock`] in a
/// `ClockSnapshot`: whole SysTick periods, in nanoseconds.
pub fn tick_clock_ns() -> u64 {
    u64::from(reloads()) * PERIOD_NS
}

/// The DWT cycle-counter clock of a core running at `core_hz` (see the
/// module docs): starts the counter and returns the clock. Compiled, not
/// used by the run.
pub fn dwt_clock(core_hz: u32, dcb: &mut DCB, dwt: &mut DWT) -> impl Clock {
    dcb.enable_trace();
    dwt.enable_cycle_counter();
    let mut wide = Extend32::new();
    TickClock::new(core_hz, move || wide.extend(DWT::cycle_count()))
}
