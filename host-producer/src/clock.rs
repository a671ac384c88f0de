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
//! * **Calibration** (process-wide, one mutex on the slow path): the first
//!   (TSC, MONOTONIC) pair read is the origin; the rate `mult` (ns per
//!   tick, 32.32 fixed point) is the slope from the origin to a later pair,
//!   recomputed whenever the baseline has doubled, so it becomes the
//!   average rate over half the process's life. MONOTONIC runs at
//!   BOOTTIME's rate but excludes suspend, so a suspend (during which the
//!   TSC may stop) never skews the rate. A TSC that runs backwards or a
//!   slope no TSC has restarts calibration from a new origin, keeping the
//!   current rate meanwhile. A slope more than 1% off the current rate also
//!   restarts, remembering that slope: the next measurement from the new
//!   origin decides whether the current rate stays (the counter jumped
//!   once) or the remembered one was right (the current rate came from a
//!   spoiled baseline), so a wrong rate never sticks. Until the first
//!   baseline reaches [`MIN_BASELINE_NS`] no TSC time is used at all.
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
//! off by at most `pair error + ANCHOR_PERIOD_NS × rate error`.
//!
//! * The pair error is half the TSC gap of the pair: at most
//!   `MAX_PAIR_NS / 2` = 1 µs once calibrated, and at most 1000 ticks
//!   (0.33 µs at 3 GHz, 1 µs at 1 GHz) for the pairs that calibrate;
//!   typically ~20 ns.
//! * The rate error is the calibration's, at most 2 × pair error /
//!   baseline (2 µs / 1 ms = 0.2% for the first baseline of a 1 GHz TSC,
//!   below 1 ppm after seconds), plus the kernel's current NTP frequency
//!   correction relative to the average (≤ 500 ppm).
//!
//! With the 1 ms period that is ≤ 1 µs + 1 ms × 2500 ppm = 3.5 µs in the
//! worst case and well under a microsecond in steady state, plus the
//! monotonic clamp's hold after a re-anchor (bounded by the same amount).
//! A rate more than 1% off is replaced after two baselines (see above).
//! Timestamps of other producers' BOOTTIME events therefore line up within
//! microseconds.
// `unsafe` here: the rdtsc instruction.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::sys::{boottime_ns, monotonic_ns};

/// A thread re-anchors after this much time (in ticks at the calibrated
/// rate).
pub const ANCHOR_PERIOD_NS: u64 = 1_000_000;
/// Shortest calibration baseline before TSC time is used.
pub const MIN_BASELINE_NS: u64 = 1_000_000;
/// Largest gap between the two TSC reads around a `clock_gettime` for the
/// pair to be used (once the rate is known).
pub const MAX_PAIR_NS: u64 = 2_000;
/// Largest gap, in ticks, before the rate is known (0.7 µs at 3 GHz, 2 µs
/// at 1 GHz; an undisturbed pair takes a few hundred ticks).
const MAX_PAIR_TICKS_UNCALIBRATED: u64 = 2_000;
/// Rates (`mult`, ns per tick in 32.32 fixed point) a TSC can have: 1 MHz
/// to 100 GHz. A slope outside them is a jump of the counter.
const PLAUSIBLE_MULT: RangeInclusive<u64> = (1 << SHIFT) / 100..=1000 << SHIFT;
/// Fixed-point shift of `mult`.
const SHIFT: u32 = 32;

const MODE_UNKNOWN: u8 = 0;
const MODE_SYSCALL: u8 = 1;
const MODE_TSC: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(MODE_UNKNOWN);
/// Rate changes beyond this fraction of the current rate (1/100) are
/// discontinuities, not refinements.
const MAX_RATE_CHANGE_DIVISOR: u64 = 100;

/// The process-wide TSC calibration (see the module docs). The state lives
/// behind one mutex, taken only on the slow path (a thread re-anchors about
/// once per [`ANCHOR_PERIOD_NS`]), so every decision sees an origin, rate
/// and baseline that belong together. `mult` mirrors the rate for the
/// lock-free read in [`read_pair`].
struct Calibration {
    state: Mutex<CalibrationState>,
    mult: AtomicU64,
}

#[derive(Clone, Copy)]
struct CalibrationState {
    /// Origin: ticks and MONOTONIC ns (`None`: not set yet).
    origin: Option<(u64, u64)>,
    /// Current rate (0: not calibrated yet) and the baseline, in ticks, it
    /// was measured over.
    mult: u64,
    baseline_ticks: u64,
    /// A rate measured from the current origin after a disagreement with
    /// `mult`: the next measurement decides which of the two was wrong.
    candidate: Option<u64>,
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
            state: Mutex::new(CalibrationState {
                origin: None,
                mult: 0,
                baseline_ticks: 0,
                candidate: None,
            }),
            mult: AtomicU64::new(0),
        }
    }

    fn mult(&self) -> u64 {
        self.mult.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, CalibrationState> {
        // Nothing panics while the lock is held; a poisoned state is still
        // a consistent one.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the first origin (a racing probe's later one is ignored: it
    /// would only shorten the first baseline, which the doubling refines).
    fn set_origin(&self, t: u64, mono: u64) {
        let mut st = self.lock();
        if st.origin.is_none() {
            st.origin = Some((t, mono));
        }
    }

    /// Folds the pair (`t` ticks, `mono` MONOTONIC ns) in; returns the rate
    /// to use (0: not calibrated yet).
    fn update(&self, t: u64, mono: u64) -> u64 {
        let mut st = self.lock();
        let Some((origin_ticks, origin_ns)) = st.origin else {
            st.origin = Some((t, mono));
            return st.mult;
        };
        let baseline = t.wrapping_sub(origin_ticks);
        let elapsed_ns = mono.wrapping_sub(origin_ns);
        if baseline > u64::MAX / 2 || elapsed_ns > u64::MAX / 2 {
            // The TSC ran backwards: nothing measured across it counts.
            st.restart(t, mono, None);
            return st.mult;
        }
        if elapsed_ns < MIN_BASELINE_NS {
            return st.mult;
        }
        let Some(m) = mult_for(baseline, elapsed_ns).filter(|m| PLAUSIBLE_MULT.contains(m)) else {
            // No TSC runs at this rate: the counter jumped.
            st.restart(t, mono, None);
            return st.mult;
        };
        let agrees = |rate: u64| m.abs_diff(rate) <= rate / MAX_RATE_CHANGE_DIVISOR;
        let accept = if st.mult == 0 {
            true
        } else if let Some(candidate) = st.candidate {
            // The measurement after a disagreement: if it confirms the
            // rejected rate, the current rate was the wrong one (say, a
            // first baseline spoiled by a preempted pair); if it confirms
            // the current rate, the disagreement was a one-off jump.
            if agrees(candidate) || agrees(st.mult) {
                true
            } else {
                st.restart(t, mono, Some(m));
                return st.mult;
            }
        } else if !agrees(st.mult) {
            st.restart(t, mono, Some(m));
            return st.mult;
        } else {
            baseline / 2 >= st.baseline_ticks
        };
        if accept {
            st.mult = m;
            st.baseline_ticks = baseline;
            st.candidate = None;
            self.mult.store(m, Ordering::Relaxed);
        }
        st.mult
    }
}

impl CalibrationState {
    /// Makes `(t, mono)` the origin; the current rate stays until a
    /// baseline from the new origin is long enough.
    fn restart(&mut self, t: u64, mono: u64, candidate: Option<u64>) {
        self.origin = Some((t, mono));
        self.baseline_ticks = 0;
        self.candidate = candidate;
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

    fn state(c: &Calibration) -> CalibrationState {
        *c.lock()
    }

    #[test]
    fn discontinuities_restart_calibration() {
        let c = Calibration::new();
        c.set_origin(1_000_000, 5_000_000);
        c.set_origin(7, 7); // a racing probe's origin is ignored
        assert_eq!(state(&c).origin, Some((1_000_000, 5_000_000)));
        // Too short a baseline: not calibrated.
        assert_eq!(c.update(1_000_000 + 1_000, 5_000_000 + 333), 0);
        // 3 ticks per ns over 2 ms.
        let m = c.update(1_000_000 + 6_000_000, 5_000_000 + 2_000_000);
        assert_eq!(m, (1u64 << 32) / 3);
        assert_eq!(c.mult(), m);
        // A TSC that runs backwards: the rate stays, the origin moves.
        assert_eq!(c.update(10, 8_000_000), m);
        assert_eq!(state(&c).origin, Some((10, 8_000_000)));
        // A slope 2x off (the TSC stopped or was reset): rate kept, restart
        // with the slope as a candidate.
        assert_eq!(c.update(10 + 3_000_000, 8_000_000 + 2_000_000), m);
        assert_eq!(state(&c).origin, Some((3_000_010, 10_000_000)));
        assert!(state(&c).candidate.is_some());
        // The next baseline confirms the current rate: it stays.
        assert_eq!(c.update(3_000_010 + 9_000_000, 10_000_000 + 3_000_000), m);
        assert_eq!(state(&c).baseline_ticks, 9_000_000);
        assert_eq!(state(&c).candidate, None);
        // A baseline shorter than twice the measured one does not replace it.
        assert_eq!(c.update(3_000_010 + 12_000_000, 10_000_000 + 4_000_001), m);
        assert_eq!(state(&c).baseline_ticks, 9_000_000);
        // A slope no TSC has (a jump by a day of ticks): restart, no candidate.
        assert_eq!(c.update(3_000_010 + (1 << 50), 10_000_000 + 5_000_000), m);
        assert_eq!(state(&c).candidate, None);
        assert_eq!(state(&c).origin, Some((3_000_010 + (1 << 50), 15_000_000)));
    }

    #[test]
    fn a_wrong_first_rate_is_corrected() {
        let c = Calibration::new();
        c.set_origin(0, 0);
        // The first baseline is 2% off (a preempted pair).
        let wrong = c.update(3_060_000, 1_000_000);
        assert_eq!(wrong, mult_for(3_060_000, 1_000_000).unwrap());
        // Exact readings: the first disagrees by 2% and restarts...
        assert_eq!(c.update(6_000_000, 2_000_000), wrong);
        // ...the second confirms it: the exact rate replaces the wrong one,
        // and later doublings refine it.
        let right = (1u64 << 32) / 3;
        assert_eq!(c.update(9_000_000, 3_000_000), right);
        assert_eq!(c.update(15_000_000, 5_000_000), right);
        assert_eq!(state(&c).baseline_ticks, 9_000_000);
    }

    #[test]
    fn racing_threads_never_calibrate_against_half_an_origin() {
        // Every thread sets the origin and folds in pairs consistent with
        // 3 ticks per ns: whatever the interleaving, the rate is that one.
        let c = Calibration::new();
        std::thread::scope(|s| {
            for k in 0..4u64 {
                let c = &c;
                s.spawn(move || {
                    c.set_origin(3_000_000_000 + k, 1_000_000_000);
                    for i in 1..200u64 {
                        let ns = 1_000_000_000 + i * 100_000 + k;
                        let m = c.update(3 * ns, ns);
                        assert!(
                            m == 0 || m.abs_diff((1u64 << 32) / 3) < (1 << 32) / 3000,
                            "{m}"
                        );
                    }
                });
            }
        });
        assert!(c.mult().abs_diff((1u64 << 32) / 3) < (1 << 32) / 3000);
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
