//! The clock hook: where a firmware's timestamps come from.
//!
//! A [`Clock`] returns nanoseconds on the program's own time base (from
//! boot, say). A [`TrackEventWriter`](super::TrackEventWriter) stamps its
//! sequence's first packet with that time on its absolute clock id (see
//! [`SequenceConfig::clock_id`](super::SequenceConfig)) and every event as a
//! delta on the incremental clock 64; whoever relates the firmware to the
//! rest of a trace (the host bridge) records a `ClockSnapshot` pairing the
//! absolute clock with BOOTTIME.
//!
//! Hardware counts ticks, not nanoseconds. [`TickClock`] turns a tick
//! source into a clock with a fixed-point multiply of the whole 64-bit tick
//! count (so rounding never accumulates), and [`Extend32`] widens a 32-bit
//! counter that wraps (a cycle counter) to 64 bits.
//!
//! ```
//! use shmtrace_abi::track_event::{Clock, Extend32, TickClock};
//!
//! // A 168 MHz cycle counter (on Cortex-M: DWT CYCCNT, read as a u32).
//! let mut cycles: u32 = u32::MAX - 167; // about to wrap
//! let mut wide = Extend32::new();
//! let mut clock = TickClock::new(168_000_000, move || {
//!     cycles = cycles.wrapping_add(168); // 1 us per call in this example
//!     wide.extend(cycles)
//! });
//! let t0 = clock.now_ns();
//! let t1 = clock.now_ns(); // across the wrap
//! assert!((999..=1_000).contains(&(t1 - t0))); // each reading truncated to 1 ns
//! ```
//!
//! SysTick is no such counter: 24 bits that count down from its reload
//! value and wraps every `reload + 1` ticks, far too often for
//! [`Extend32`]. Count its wraps in its interrupt handler (first thing),
//! and read `wraps * (reload + 1) + (reload - current)` with interrupts
//! masked; if SysTick's pending bit (`ICSR.PENDSTSET`) is set, it wrapped
//! and its handler has not run yet: read `current` again and count one more
//! wrap. Under QEMU, SysTick's current value reads 0 unless `-icount` is
//! on, and then it counts the guest's virtual time, which does not keep the
//! host's pace (the host tools warn about a clock that does not).
//!
//! # Invariants
//!
//! * [`TickClock::now_ns`] is `ticks * 10^9 / hz` within one part in 2^31
//!   (plus truncation of under 1 ns), computed from the 64-bit tick count
//!   each time, with 32x32-bit multiplies only (no 128-bit arithmetic, no
//!   division at run time).
//! * [`Extend32`] is correct as long as it sees every wrap: it must be read
//!   at least once per period of the counter (2^32 ticks: 25.6 s at
//!   168 MHz).

/// A source of timestamps, in nanoseconds, for one writer.
///
/// Time should not go backwards on one writer; an event stamped before the
/// previous one is written with its absolute time instead of a delta.
pub trait Clock {
    /// Now, in nanoseconds on this clock's time base.
    fn now_ns(&mut self) -> u64;
}

impl<F: FnMut() -> u64> Clock for F {
    #[inline(always)]
    fn now_ns(&mut self) -> u64 {
        self()
    }
}

/// Widens a wrapping 32-bit counter to 64 bits (see the module
/// invariants).
#[derive(Debug, Clone, Copy, Default)]
pub struct Extend32 {
    last: u32,
    high: u32,
}

impl Extend32 {
    /// A widener whose first reading is taken as less than one period after
    /// the counter's zero.
    pub const fn new() -> Self {
        Self { last: 0, high: 0 }
    }

    /// The 64-bit count for the 32-bit reading `now`.
    #[inline(always)]
    pub fn extend(&mut self, now: u32) -> u64 {
        if now < self.last {
            self.high = self.high.wrapping_add(1);
        }
        self.last = now;
        (u64::from(self.high) << 32) | u64::from(now)
    }
}

/// Ticks to nanoseconds: `ns = ticks * mult >> shift`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickRate {
    mult: u32,
    shift: u32,
}

impl TickRate {
    /// The conversion for a counter of `hz` ticks per second (1 Hz to
    /// 4 GHz).
    pub const fn new(hz: u32) -> Self {
        let hz = if hz == 0 { 1 } else { hz };
        // Largest shift (at most 32) keeping mult = 10^9 * 2^shift / hz below 2^32.
        let mut shift = 32;
        while shift > 0 && (1_000_000_000u64 << shift) / hz as u64 > u32::MAX as u64 {
            shift -= 1;
        }
        let mult = ((1_000_000_000u64 << shift) + hz as u64 / 2) / hz as u64;
        let mult = if mult > u32::MAX as u64 {
            u32::MAX
        } else {
            mult as u32
        };
        Self { mult, shift }
    }

    /// `ticks` in nanoseconds.
    #[inline(always)]
    pub fn ns(self, ticks: u64) -> u64 {
        let lo = mul_wide(ticks as u32, self.mult);
        let hi = mul_wide((ticks >> 32) as u32, self.mult);
        // (hi * 2^32 + lo) >> shift, with shift <= 32.
        let hi_part = if self.shift == 32 {
            hi
        } else {
            hi << (32 - self.shift)
        };
        let lo_part = if self.shift == 32 {
            lo >> 32
        } else {
            lo >> self.shift
        };
        hi_part.wrapping_add(lo_part)
    }
}

/// `a * b`, all 64 bits of it. ARMv6-M (Cortex-M0/M0+) and ARMv8-M
/// Baseline (Cortex-M23) have no 32x32->64-bit multiply (`UMULL`; the
/// build script sets `shmtrace_no_umull` for them), so the compiler calls
/// its 64x64-bit routine (`__aeabi_lmul`, 37 instructions with the call)
/// for `u64::from(a) * u64::from(b)`; four 16x16-bit products inline are
/// about half of that. Elsewhere the product is one instruction.
#[inline(always)]
fn mul_wide(a: u32, b: u32) -> u64 {
    #[cfg(shmtrace_no_umull)]
    let product = mul_wide_halves(a, b);
    #[cfg(not(shmtrace_no_umull))]
    let product = u64::from(a) * u64::from(b);
    product
}

/// `a * b` from the four products of their 16-bit halves, each of which
/// fits 32 bits: `a1*b1 << 32 + (a0*b1 + a1*b0) << 16 + a0*b0`.
#[cfg(any(test, shmtrace_no_umull))]
#[inline(always)]
fn mul_wide_halves(a: u32, b: u32) -> u64 {
    let (a0, a1) = (a & 0xFFFF, a >> 16);
    let (b0, b1) = (b & 0xFFFF, b >> 16);
    // The middle sum may carry into bit 32 (2^48 of the product).
    let (middle, middle_carry) = (a0 * b1).overflowing_add(a1 * b0);
    let (low, low_carry) = (a0 * b0).overflowing_add(middle << 16);
    let high = a1 * b1 + (middle >> 16) + (u32::from(middle_carry) << 16) + u32::from(low_carry);
    (u64::from(high) << 32) | u64::from(low)
}

/// A [`Clock`] over a 64-bit tick source of known frequency.
pub struct TickClock<F: FnMut() -> u64> {
    rate: TickRate,
    ticks: F,
}

impl<F: FnMut() -> u64> TickClock<F> {
    /// A clock reading `ticks` (`hz` per second).
    pub const fn new(hz: u32, ticks: F) -> Self {
        Self {
            rate: TickRate::new(hz),
            ticks,
        }
    }
}

impl<F: FnMut() -> u64> Clock for TickClock<F> {
    #[inline(always)]
    fn now_ns(&mut self) -> u64 {
        self.rate.ns((self.ticks)())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(ticks: u64, hz: u32) -> u64 {
        (u128::from(ticks) * 1_000_000_000 / u128::from(hz)) as u64
    }

    #[test]
    fn conversion_is_exact_to_a_part_in_two_billion() {
        for hz in [
            1,
            1_000,
            32_768,
            1_000_000,
            25_000_000,
            168_000_000,
            1_000_000_000,
            u32::MAX,
        ] {
            let rate = TickRate::new(hz);
            for ticks in [0, 1, 999, 1 << 20, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 50] {
                let want = exact(ticks, hz);
                let got = rate.ns(ticks);
                let err = want.abs_diff(got);
                assert!(
                    err <= want / (1 << 31) + 1,
                    "hz {hz} ticks {ticks}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn products_of_halves_are_the_full_products() {
        let edges = [
            0,
            1,
            0xFFFF,
            0x1_0000,
            0xFFFF_FFFF,
            0x8000_0000,
            0xFFFF_0001,
        ];
        for a in edges {
            for b in edges {
                assert_eq!(
                    mul_wide_halves(a, b),
                    u64::from(a) * u64::from(b),
                    "{a:#x} * {b:#x}"
                );
            }
        }
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (a, b) = (x as u32, (x >> 32) as u32);
            assert_eq!(
                mul_wide_halves(a, b),
                u64::from(a) * u64::from(b),
                "{a:#x} * {b:#x}"
            );
            assert_eq!(mul_wide(a, b), u64::from(a) * u64::from(b));
        }
    }

    #[test]
    fn extension_counts_wraps() {
        let mut e = Extend32::new();
        assert_eq!(e.extend(10), 10);
        assert_eq!(e.extend(u32::MAX), u64::from(u32::MAX));
        assert_eq!(e.extend(5), (1 << 32) + 5);
        assert_eq!(e.extend(6), (1 << 32) + 6);
    }
}
