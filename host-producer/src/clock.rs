//! The trace clock: `CLOCK_BOOTTIME` nanoseconds, read for the price of a
//! cycle-counter read where the hardware allows it.
//!
//! A vDSO `clock_gettime` costs ~30 ns on a VM; every track event takes
//! one. On x86-64 CPUs with an invariant TSC (`constant_tsc` and
//! `nonstop_tsc`: a fixed rate that does not stop in idle states) that the
//! kernel itself uses as its clocksource (so it verified the TSCs of all
//! CPUs agree), [`now_ns`] reads the TSC instead and converts ticks to
//! boot-time nanoseconds. Everywhere else (and with `SHMTRACE_NO_TSC` set
//! in the environment) it is `clock_gettime(BOOTTIME)`.
//!
//! # How ticks become boot-time nanoseconds
//!
//! * **Calibration** (process-wide): the first (TSC, MONOTONIC) pair read
//!   is the origin; the rate `mult` (ns per tick, 32.32 fixed point) is the
//!   slope from the origin to a later pair, recomputed whenever the baseline
//!   has doubled, so it becomes the average rate over half the process's
//!   life. MONOTONIC runs at BOOTTIME's rate but excludes suspend, so a
//!   suspend (during which the TSC may stop) never skews the rate; a TSC
//!   that runs backwards or a slope more than 1% off the current rate (the
//!   TSC was reset) restarts calibration from a new origin, keeping the
//!   current rate meanwhile. Until the first baseline reaches
//!   [`MIN_BASELINE_NS`] no TSC time is used at all.
//! * **Anchoring** (per thread): each thread keeps an anchor pair and
//!   extrapolates `ns = anchor_ns + (tsc - anchor_tsc) * mult >> 32`. An
//!   anchor older than [`ANCHOR_PERIOD_NS`] of ticks (or a TSC that went
//!   backwards) is replaced by a fresh pair from `clock_gettime(BOOTTIME)`,
//!   so errors never accumulate and NTP/suspend steps of BOOTTIME are
//!   followed within one period.
//! * **Pairs** are read as TSC, BOOTTIME, TSC; the TSC midpoint is used,
//!   and pairs whose two TSC reads lie more than [`MAX_PAIR_NS`] apart
//!   (preempted in between) are read again.
//! * **Monotonic per thread**: a value below the last one returned on the
//!   same thread is raised to it (a re-anchor that lands slightly earlier
//!   than the extrapolation freezes the clock for that difference instead
//!   of stepping back). A sequence is written by one thread, so its
//!   timestamps never go backwards.
//!
//! # Error bound
//!
//! Against `clock_gettime(BOOTTIME)` read at the same instant, a value is
//! off by at most
//! `pair error + ANCHOR_PERIOD_NS × rate error`, where the pair error is
//! half the TSC gap of the pair (≤ `MAX_PAIR_NS / 2` = 1 µs, typically
//! ~20 ns) and the rate error is the calibration's (≤ 2 × pair error /
//! baseline, 2 µs / 1 ms = 2000 ppm in the first milliseconds, below 1 ppm
//! after seconds) plus the kernel's current NTP frequency correction
//! relative to the average (≤ 500 ppm). With the 1 ms period that is
//! ≤ 1 µs + 1 ms × 2500 ppm = 3.5 µs in the worst case and well under a
//! microsecond in steady state, plus the monotonic clamp's hold after a
//! re-anchor (bounded by the same amount). Timestamps of other producers'
//! BOOTTIME events therefore line up within microseconds.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::sys::{boottime_ns, monotonic_ns};

/// A thread re-anchors after this much time (in ticks at the calibrated
/// rate).
pub const ANCHOR_PERIOD_NS: u64 = 1_000_000;
/// Shortest calibration baseline before TSC time is used.
pub const MIN_BASELINE_NS: u64 = 1_000_000;
/// Largest gap between the two TSC reads around a `clock_gettime` for the
/// pair to be used (once the rate is known).
pub const MAX_PAIR_NS: u64 = 2_000;
/// Largest gap, in ticks, before the rate is known (~7 µs at 3 GHz).
const MAX_PAIR_TICKS_UNCALIBRATED: u64 = 20_000;
/// Fixed-point shift of `mult`.
const SHIFT: u32 = 32;

const MODE_UNKNOWN: u8 = 0;
const MODE_SYSCALL: u8 = 1;
const MODE_TSC: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(MODE_UNKNOWN);
/// Rate changes beyond this fraction of the current rate (1/100) are
/// discontinuities, not refinements.
const MAX_RATE_CHANGE_DIVISOR: u64 = 100;

/// The process-wide TSC calibration (see the module docs). Relaxed
/// atomics: racing threads each store a valid state; a mix of two only
/// affects when the next refinement or restart happens.
struct Calibration {
    /// Origin: ticks and MONOTONIC ns (0 ns: not set). Set before `MODE`
    /// becomes `MODE_TSC`.
    origin_ticks: AtomicU64,
    origin_ns: AtomicU64,
    /// Current rate (0: not calibrated yet) and the baseline, in ticks, it
    /// was measured over.
    mult: AtomicU64,
    baseline_ticks: AtomicU64,
}

static CALIBRATION: Calibration = Calibration::new();

/// One thread's anchor. `mult == 0`: no valid anchor (every read takes the
/// slow path).
#[derive(Clone, Copy)]
struct Anchor {
    ticks: u64,
    ns: u64,
    mult: u64,
    /// Ticks after `ticks` within which the anchor is used.
    period: u64,
    /// Last value returned on this thread.
    last: u64,
}

thread_local! {
    static ANCHOR: Cell<Anchor> = const {
        Cell::new(Anchor { ticks: 0, ns: 0, mult: 0, period: 0, last: 0 })
    };
}

/// Boot-time nanoseconds now (see the module docs).
#[inline]
pub fn now_ns() -> u64 {
    let Some(t) = ticks() else {
        return boottime_ns();
    };
    ANCHOR
        .try_with(|cell| {
            let a = cell.get();
            let elapsed = t.wrapping_sub(a.ticks);
            if elapsed < a.period {
                let ns = a.ns.wrapping_add(ticks_to_ns(elapsed, a.mult)).max(a.last);
                cell.set(Anchor { last: ns, ..a });
                ns
            } else {
                reanchor(cell)
            }
        })
        // Thread-local storage torn down (a thread's last moments).
        .unwrap_or_else(|_| boottime_ns())
}

/// `ticks × mult` in nanoseconds (`mult` is ns per tick, 32.32 fixed
/// point).
#[inline]
fn ticks_to_ns(ticks: u64, mult: u64) -> u64 {
    ((u128::from(ticks) * u128::from(mult)) >> SHIFT) as u64
}

/// The rate, as `mult`, of `ns` nanoseconds elapsed over `ticks` ticks.
fn mult_for(ticks: u64, ns: u64) -> Option<u64> {
    if ticks == 0 {
        return None;
    }
    u64::try_from((u128::from(ns) << SHIFT) / u128::from(ticks)).ok()
}

/// Ticks that `ns` nanoseconds take at rate `mult`.
fn ns_to_ticks(ns: u64, mult: u64) -> u64 {
    if mult == 0 {
        return 0;
    }
    u64::try_from((u128::from(ns) << SHIFT) / u128::from(mult)).unwrap_or(u64::MAX)
}

/// The slow path: a fresh anchor (or plain `clock_gettime` while TSC time
/// is not usable).
#[cold]
fn reanchor(cell: &Cell<Anchor>) -> u64 {
    let last = cell.get().last;
    if mode() != MODE_TSC {
        return boottime_ns().max(last);
    }
    let Some(Pair {
        ticks: t,
        boot: ns,
        mono,
    }) = read_pair()
    else {
        return boottime_ns().max(last);
    };
    let mult = CALIBRATION.update(t, mono);
    let period = ns_to_ticks(ANCHOR_PERIOD_NS, mult);
    let now = ns.max(last);
    cell.set(Anchor {
        ticks: t,
        ns,
        mult,
        // Not calibrated yet: stay on the slow path.
        period: if mult == 0 { 0 } else { period },
        last: now,
    });
    now
}

impl Calibration {
    const fn new() -> Self {
        Calibration {
            origin_ticks: AtomicU64::new(0),
            origin_ns: AtomicU64::new(0),
            mult: AtomicU64::new(0),
            baseline_ticks: AtomicU64::new(0),
        }
    }

    fn mult(&self) -> u64 {
        self.mult.load(Ordering::Relaxed)
    }

    /// Sets the first origin (a racing probe's later one is ignored: it
    /// would only shorten the first baseline, which the doubling refines).
    fn set_origin(&self, t: u64, mono: u64) {
        if self
            .origin_ns
            .compare_exchange(0, mono, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.origin_ticks.store(t, Ordering::Relaxed);
        }
    }

    /// Folds the pair (`t` ticks, `mono` MONOTONIC ns) in; returns the rate
    /// to use (0: not calibrated yet).
    fn update(&self, t: u64, mono: u64) -> u64 {
        let baseline = t.wrapping_sub(self.origin_ticks.load(Ordering::Relaxed));
        let elapsed_ns = mono.wrapping_sub(self.origin_ns.load(Ordering::Relaxed));
        let current = self.mult();
        if baseline > u64::MAX / 2 || elapsed_ns > u64::MAX / 2 {
            // The TSC ran backwards (or a racing thread's origin is ahead).
            self.restart(t, mono);
            return current;
        }
        let measured = self.baseline_ticks.load(Ordering::Relaxed);
        let longer = current == 0 || baseline / 2 >= measured;
        if elapsed_ns < MIN_BASELINE_NS || !longer {
            return current;
        }
        let Some(m) = mult_for(baseline, elapsed_ns) else {
            return current;
        };
        if current != 0 && m.abs_diff(current) > current / MAX_RATE_CHANGE_DIVISOR {
            self.restart(t, mono);
            return current;
        }
        self.mult.store(m, Ordering::Relaxed);
        self.baseline_ticks.store(baseline, Ordering::Relaxed);
        m
    }

    /// Makes `(t, mono)` the origin; the current rate stays until the new
    /// baseline is long enough.
    #[cold]
    fn restart(&self, t: u64, mono: u64) {
        self.origin_ticks.store(t, Ordering::Relaxed);
        self.origin_ns.store(mono, Ordering::Relaxed);
        self.baseline_ticks.store(0, Ordering::Relaxed);
    }
}

/// Clock readings taken together.
struct Pair {
    /// TSC midpoint of the readings.
    ticks: u64,
    boot: u64,
    mono: u64,
}

/// Reads BOOTTIME and MONOTONIC between two TSC reads that are close
/// together.
fn read_pair() -> Option<Pair> {
    let mult = CALIBRATION.mult();
    let max_gap = if mult == 0 {
        MAX_PAIR_TICKS_UNCALIBRATED
    } else {
        ns_to_ticks(MAX_PAIR_NS, mult)
    };
    for _ in 0..4 {
        let t0 = ticks()?;
        let boot = boottime_ns();
        let mono = monotonic_ns();
        let t1 = ticks()?;
        let gap = t1.wrapping_sub(t0);
        if gap <= max_gap {
            return Some(Pair {
                ticks: t0.wrapping_add(gap / 2),
                boot,
                mono,
            });
        }
    }
    None
}

/// How `now_ns` reads time; probes the CPU and kernel once.
fn mode() -> u8 {
    match MODE.load(Ordering::Acquire) {
        MODE_UNKNOWN => probe(),
        m => m,
    }
}

#[cold]
fn probe() -> u8 {
    let mode = if tsc_is_trustworthy() {
        match read_pair() {
            Some(pair) => {
                CALIBRATION.set_origin(pair.ticks, pair.mono);
                MODE_TSC
            }
            None => MODE_SYSCALL,
        }
    } else {
        MODE_SYSCALL
    };
    // Release: the origin is visible to whoever sees MODE_TSC.
    match MODE.compare_exchange(MODE_UNKNOWN, mode, Ordering::Release, Ordering::Acquire) {
        Ok(_) => mode,
        Err(current) => current,
    }
}

/// Whether the TSC runs at a constant rate through idle states on every
/// CPU and the kernel keeps time with it.
fn tsc_is_trustworthy() -> bool {
    if !cfg!(target_arch = "x86_64") || std::env::var_os("SHMTRACE_NO_TSC").is_some() {
        return false;
    }
    let flags_ok = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|l| {
                let has = |f: &str| l.split_whitespace().any(|x| x == f);
                has("constant_tsc") && has("nonstop_tsc")
            })
    });
    let source =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|s| s.trim() == "tsc");
    flags_ok && source
}

/// The cycle counter, where there is one this module uses.
#[inline(always)]
fn ticks() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` exists on every x86-64 CPU, has no memory
        // operands and no preconditions.
        Some(unsafe { core::arch::x86_64::_rdtsc() })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_point_conversion() {
        // 3 GHz: 1/3 ns per tick.
        let m = mult_for(3_000_000_000, 1_000_000_000).unwrap();
        assert_eq!(m, (1u64 << 32) / 3);
        let ns = ticks_to_ns(3_000_000, m);
        assert!((999_999..=1_000_000).contains(&ns), "{ns}");
        assert_eq!(ns_to_ticks(1_000_000, m), 3_000_000);
        // 24 MHz (an ARM generic timer): 41.67 ns per tick.
        let m = mult_for(24_000_000, 1_000_000_000).unwrap();
        assert_eq!(ticks_to_ns(24, m), 999);
        assert_eq!(ticks_to_ns(24_000_000, m), 999_999_999);
        // A whole day of ticks at 5 GHz does not overflow.
        let m = mult_for(5, 1).unwrap();
        assert_eq!(
            ticks_to_ns(5 * 86_400 * 1_000_000_000, m) / 1_000_000_000,
            86_399
        );
        assert_eq!(mult_for(0, 5), None);
        assert_eq!(ns_to_ticks(5, 0), 0);
    }

    #[test]
    fn discontinuities_restart_calibration() {
        let c = Calibration::new();
        c.set_origin(1_000_000, 5_000_000);
        c.set_origin(7, 7); // a racing probe's origin is ignored
                            // Too short a baseline: not calibrated.
        assert_eq!(c.update(1_000_000 + 1_000, 5_000_000 + 333), 0);
        // 3 ticks per ns over 2 ms.
        let m = c.update(1_000_000 + 6_000_000, 5_000_000 + 2_000_000);
        assert_eq!(m, (1u64 << 32) / 3);
        // A TSC that runs backwards: the rate stays, the origin moves.
        assert_eq!(c.update(10, 8_000_000), m);
        assert_eq!(c.origin_ticks.load(Ordering::Relaxed), 10);
        // A slope 2x off (the TSC stopped or was reset): rate kept, restart.
        assert_eq!(c.update(10 + 3_000_000, 8_000_000 + 2_000_000), m);
        assert_eq!(c.origin_ticks.load(Ordering::Relaxed), 3_000_010);
        // A consistent, long enough baseline from the new origin: used.
        assert_eq!(c.update(3_000_010 + 9_000_000, 10_000_000 + 3_000_000), m);
        assert_eq!(c.baseline_ticks.load(Ordering::Relaxed), 9_000_000);
        // A baseline shorter than twice the measured one does not replace it.
        assert_eq!(c.update(3_000_010 + 12_000_000, 10_000_000 + 4_000_001), m);
        assert_eq!(c.baseline_ticks.load(Ordering::Relaxed), 9_000_000);
    }

    /// As an assertion on correctness (not speed): once calibrated, the
    /// clock agrees with `clock_gettime(BOOTTIME)` read around it within the
    /// documented bound (plus slack for a loaded machine), and never goes
    /// backwards on a thread.
    #[test]
    fn agrees_with_boottime_and_is_monotonic() {
        const BOUND_NS: u64 = 50_000;
        let mut last = 0;
        let start = boottime_ns();
        // Through calibration (the first milliseconds) and a few anchors.
        while boottime_ns() - start < 20 * ANCHOR_PERIOD_NS {
            let before = boottime_ns();
            let t = now_ns();
            let after = boottime_ns();
            assert!(t >= last, "went backwards: {t} < {last}");
            last = t;
            assert!(
                t + BOUND_NS >= before && t <= after + BOUND_NS,
                "{t} not within {BOUND_NS} ns of [{before}, {after}] (mode {})",
                mode()
            );
        }
    }
}
