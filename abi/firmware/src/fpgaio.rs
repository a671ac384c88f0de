//! A clock hook on the `mps2` boards' FPGA counter, for live sessions:
//! [`CounterClock`].
//!
//! The FPGA I/O block (`0x4002_8000`) has a free-running 32-bit `COUNTER`
//! (offset `0x18`) that counts its 25 MHz prescaler clock (with `PRESCALE`
//! at 0, its reset value): 40 ns per tick. QEMU derives it from its virtual
//! clock, which (without `-icount`) is the host's monotonic time while the
//! machine runs, so a firmware stamping events with it keeps the host's
//! rate: the bridge's clock relation needs no drift correction and a
//! firmware event lines up with a host event to within the relation's
//! error. (SysTick cannot do that under QEMU 7.2: without `-icount` its
//! current value reads 0, see [`crate::clocks`].)
//!
//! The 32-bit count wraps every 171.8 s; one widening state shared by
//! every context ([`Extend32`], updated in a critical section) makes it 64
//! bits, so a writer that stays idle for longer still reads the right time
//! as long as some context reads the clock at least once per wrap (the
//! live loop does, all the time).

use core::cell::Cell;

use cortex_m::interrupt::{self, Mutex};
use shmtrace_abi::track_event::{Clock, Extend32, TickRate};

/// The FPGA I/O block's `COUNTER` register.
const COUNTER: usize = 0x4002_8018;
/// Its rate with `PRESCALE` 0.
pub const COUNTER_HZ: u32 = 25_000_000;

const RATE: TickRate = TickRate::new(COUNTER_HZ);

/// The widening state every reader shares.
static WIDE: Mutex<Cell<Extend32>> = Mutex::new(Cell::new(Extend32::new()));

/// The raw 32-bit count.
pub fn count() -> u32 {
    // SAFETY: COUNTER is an aligned 32-bit register of the FPGA I/O block
    // in the board's memory map (always mapped device memory); reading it
    // has no side effect and touches no memory Rust knows.
    #[allow(unsafe_code)]
    unsafe {
        core::ptr::read_volatile(COUNTER as *const u32)
    }
}

/// Nanoseconds since the counter started (reset), from any context.
#[derive(Debug, Clone, Copy, Default)]
pub struct CounterClock;

impl Clock for CounterClock {
    #[inline]
    fn now_ns(&mut self) -> u64 {
        interrupt::free(|cs| {
            let cell = WIDE.borrow(cs);
            let mut wide = cell.get();
            let ticks = wide.extend(count());
            cell.set(wide);
            RATE.ns(ticks)
        })
    }
}
