//! Relating a firmware's clock to the host's BOOTTIME (sans-IO: every
//! time is passed in).
//!
//! A firmware stamps its packets on its own absolute clock (nanoseconds,
//! a sequence-scoped clock id, 64..=127). The bridge measures how that
//! clock maps onto BOOTTIME, `boot = firmware + offset`, from samples of
//! the firmware's clock:
//!
//! * **Two-way** (a reverse channel: region sync words, SYNC frames): the
//!   host notes BOOTTIME `t0`, asks with a nonce, the firmware answers with
//!   its time `f` and the nonce, the host notes `t1`. The firmware read its
//!   clock somewhere in `[t0, t1]`, so `offset = (t0 + t1) / 2 - f` is off
//!   by at most `(t1 - t0) / 2`: the **error bound is half the round
//!   trip**, a hard bound (as in NTP).
//! * **One-way** (the firmware sends its time unasked): the firmware read
//!   its clock at `arrival - transfer - delay`, where `transfer` is the
//!   time the frame took on the wire (the source computes it, e.g. bits /
//!   baud rate on a UART) and `delay >= 0` is the rest (firmware queueing,
//!   the host's read latency). `offset = arrival - transfer - f` is
//!   therefore never early and late by `delay`; the least-delayed sample
//!   of the window (the smallest offset) is the estimate. The bound
//!   reported is the window's spread of offsets (the observed variation of
//!   `delay`); a constant part of `delay` cannot be seen one-way and is
//!   not in it.
//!
//! Clocks drift apart (two crystals, ±[`MAX_DRIFT_PPM`] together): a
//! sample's bound grows by that much of its age, and the estimate is the
//! sample of the window ([`WINDOW`] samples) with the smallest bound so
//! grown. A fresh clock snapshot is due ([`ClockSync::due`]) when
//! none was given yet, every [`SNAPSHOT_PERIOD_NS`], and when the estimate
//! moved by more than its (current) bound; between those the engine puts the
//! snapshot stated last into a sequence again after every
//! [`SNAPSHOT_PERIOD_BYTES`](super::engine::SNAPSHOT_PERIOD_BYTES) of
//! forwarded data (the same relation: a ring buffer overwrites the old
//! one). The bridge's engine keeps stating the
//! offset it stated before as long as it lies within the current
//! estimate's bound (a change of offset is a step in the mapping, and a
//! step back reorders events around it), so the relation a trace holds is
//! within twice the bound.
//!
//! All of that holds only for a firmware clock that runs at the host's
//! rate within [`MAX_DRIFT_PPM`]. One that does not (a clock hook whose
//! tick rate is wrong, a guest's clock on an emulator's virtual time, as
//! QEMU's `-icount`) moves the offset between samples by more than their
//! bounds: [`ClockSync::rate`] measures the firmware clock's rate over the
//! window's two-way samples and says when it lies outside what the bounds
//! and the drift allow, so the bridge can say that its bounds do not hold.

use std::collections::VecDeque;

use shmtrace_abi::proto::encode_to_slice;

/// BOOTTIME's builtin clock id.
pub const BOOTTIME: u32 = 6;
/// Assumed worst relative drift of the firmware's clock against the
/// host's, in parts per million.
pub const MAX_DRIFT_PPM: u64 = 200;
/// Samples kept.
pub const WINDOW: usize = 16;
/// Shortest span of samples a rate is judged over: a clock's readings are
/// up to a tick late, so over a short span a coarse clock (a 1 kHz SysTick,
/// a 100 Hz RTOS tick) at the right rate would look off.
pub const MIN_RATE_SPAN_NS: u64 = 4_000_000_000;
/// How far off a rate must be to be told, in parts per million (2 %:
/// a wrong tick rate, 32 000 for 32 768 Hz say, or a guest on virtual
/// time; a 100 Hz tick's two readings move the rate by at most 0.5 % over
/// [`MIN_RATE_SPAN_NS`]).
pub const RATE_TOLERANCE_PPM: u64 = 20_000;
/// Largest gap between two clock snapshots injected into a sequence.
pub const SNAPSHOT_PERIOD_NS: u64 = 1_000_000_000;
/// Sync requests kept waiting for their answer.
const PENDING: usize = 8;

/// How firmware time maps onto BOOTTIME now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// `boot = firmware + offset_ns`.
    pub offset_ns: i64,
    /// Bound on the error of a converted time, nanoseconds (see the
    /// module docs for what it covers one-way).
    pub bound_ns: u64,
    /// From a two-way exchange (the bound is hard).
    pub two_way: bool,
    /// The firmware time of the sample the estimate comes from.
    pub firmware_ns: u64,
}

impl Estimate {
    /// The BOOTTIME of firmware time `firmware_ns` (saturating at 0).
    pub fn boot_ns(&self, firmware_ns: u64) -> u64 {
        let boot = i128::from(firmware_ns) + i128::from(self.offset_ns);
        u64::try_from(boot.max(0)).unwrap_or(u64::MAX)
    }
}

/// The firmware clock's rate against the host's, over the window's
/// two-way samples ([`ClockSync::rate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Host time between the oldest and the newest sample (midpoints).
    pub host_span_ns: u64,
    /// Firmware time between them.
    pub firmware_span_ns: u64,
    /// Over at least [`MIN_RATE_SPAN_NS`], the offsets of the two differ
    /// by more than their bounds and [`MAX_DRIFT_PPM`] of the span allow,
    /// and by more than [`RATE_TOLERANCE_PPM`] of it: the firmware clock
    /// does not run at the host's rate, and the estimate's bound does not
    /// hold.
    pub beyond_drift: bool,
}

impl Rate {
    /// Firmware seconds per host second.
    pub fn ratio(&self) -> f64 {
        self.firmware_span_ns as f64 / self.host_span_ns.max(1) as f64
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    firmware_ns: u64,
    offset_ns: i64,
    bound_ns: u64,
    /// Host BOOTTIME when taken.
    host_ns: u64,
    two_way: bool,
}

/// The clock relation of one firmware boot. See the module docs.
#[derive(Debug, Clone)]
pub struct ClockSync {
    fixed: Option<i64>,
    pending: VecDeque<(u32, u64)>,
    samples: VecDeque<Sample>,
    next_nonce: u32,
    /// The estimate last injected, and when (host time).
    injected: Option<(Estimate, u64)>,
    /// The widest bound of an estimate injected.
    loosest_injected: Option<u64>,
    /// Samples refused (unknown nonce answered late, answers before their
    /// request, offsets out of range).
    pub rejected: u64,
}

impl Default for ClockSync {
    fn default() -> Self {
        Self::new()
    }
}

fn offset(boot: u64, firmware: u64) -> Option<i64> {
    i64::try_from(i128::from(boot) - i128::from(firmware)).ok()
}

impl ClockSync {
    /// No samples yet.
    pub fn new() -> Self {
        ClockSync {
            fixed: None,
            pending: VecDeque::new(),
            samples: VecDeque::new(),
            next_nonce: 1,
            injected: None,
            loosest_injected: None,
            rejected: 0,
        }
    }

    /// A relation given, not measured (offline import: the identity, or
    /// the user's offset); its bound is 0 and samples are ignored.
    pub fn fixed(offset_ns: i64) -> Self {
        ClockSync {
            fixed: Some(offset_ns),
            ..Self::new()
        }
    }

    /// A sync request leaves now (host time `now`): its nonce.
    pub fn request(&mut self, now: u64) -> u32 {
        let nonce = self.next_nonce;
        self.next_nonce = self.next_nonce.wrapping_add(1).max(1);
        if self.pending.len() == PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back((nonce, now));
        nonce
    }

    /// A sample of the firmware clock: `firmware_ns`, answering `nonce` if
    /// it echoes one of ours (two-way), else sent unasked (one-way,
    /// `transfer_ns` on the wire); `arrival` is the host time it was read.
    pub fn sample(&mut self, firmware_ns: u64, nonce: Option<u32>, arrival: u64, transfer_ns: u64) {
        let asked = nonce.and_then(|n| {
            let i = self.pending.iter().position(|&(p, _)| p == n)?;
            let (_, t0) = self.pending.remove(i)?;
            // Requests older than this one were not answered: drop them.
            self.pending.drain(..i);
            Some(t0)
        });
        let sample = match asked {
            Some(t0) if t0 <= arrival => {
                let rtt = arrival - t0;
                offset(t0 + rtt / 2, firmware_ns).map(|o| Sample {
                    firmware_ns,
                    offset_ns: o,
                    bound_ns: rtt.div_ceil(2),
                    host_ns: arrival,
                    two_way: true,
                })
            }
            Some(_) => None,
            None if nonce.is_some() => None,
            None => offset(arrival.saturating_sub(transfer_ns), firmware_ns).map(|o| Sample {
                firmware_ns,
                offset_ns: o,
                bound_ns: 0,
                host_ns: arrival,
                two_way: false,
            }),
        };
        log::debug!(
            "clock sample: firmware {firmware_ns}, nonce {nonce:?} asked at {asked:?}, read at \
             {arrival}: (offset, bound) {:?}",
            sample.map(|s| (s.offset_ns, s.bound_ns))
        );
        match sample {
            Some(s) => {
                if self.samples.len() == WINDOW {
                    self.samples.pop_front();
                }
                self.samples.push_back(s);
            }
            None => self.rejected += 1,
        }
    }

    /// When the newest request left, if it is still unanswered (an answer
    /// settles every request before it too).
    pub fn unanswered_since(&self) -> Option<u64> {
        self.pending.back().map(|&(_, t0)| t0)
    }

    /// Samples taken so far in the window.
    pub fn samples(&self) -> usize {
        self.samples.len()
    }

    /// The best relation known at host time `now`, if any.
    pub fn estimate(&self, now: u64) -> Option<Estimate> {
        if let Some(offset_ns) = self.fixed {
            return Some(Estimate {
                offset_ns,
                bound_ns: 0,
                two_way: true,
                firmware_ns: 0,
            });
        }
        let drift = |s: &Sample| now.saturating_sub(s.host_ns) / 1_000_000 * MAX_DRIFT_PPM;
        // Two-way samples carry hard bounds: prefer them.
        if let Some(best) = self
            .samples
            .iter()
            .filter(|s| s.two_way)
            .min_by_key(|s| s.bound_ns.saturating_add(drift(s)))
        {
            return Some(Estimate {
                offset_ns: best.offset_ns,
                bound_ns: best.bound_ns.saturating_add(drift(best)),
                two_way: true,
                firmware_ns: best.firmware_ns,
            });
        }
        let one_way = || self.samples.iter().filter(|s| !s.two_way);
        let best = one_way().min_by_key(|s| i128::from(s.offset_ns) + i128::from(drift(s)))?;
        let spread = one_way()
            .map(|s| s.offset_ns)
            .max()
            .map_or(0, |max| max.abs_diff(best.offset_ns));
        Some(Estimate {
            offset_ns: best.offset_ns,
            bound_ns: spread.saturating_add(drift(best)),
            two_way: false,
            firmware_ns: best.firmware_ns,
        })
    }

    /// The firmware clock's rate over the two-way samples of the window
    /// (the oldest and the newest; one-way samples carry no bound to tell
    /// a rate from a varying delay): `None` with fewer than two, or for a
    /// relation given rather than measured.
    pub fn rate(&self) -> Option<Rate> {
        if self.fixed.is_some() {
            return None;
        }
        let mut two_way = self.samples.iter().filter(|s| s.two_way);
        let first = two_way.next()?;
        let last = two_way.next_back()?;
        // The host time the firmware read its clock at: `firmware + offset`.
        let host = |s: &Sample| i128::from(s.firmware_ns) + i128::from(s.offset_ns);
        let host_span = u64::try_from(host(last) - host(first)).ok()?;
        let firmware_span = last.firmware_ns.checked_sub(first.firmware_ns)?;
        let moved = last.offset_ns.abs_diff(first.offset_ns);
        let allowed = first
            .bound_ns
            .saturating_add(last.bound_ns)
            .saturating_add(host_span / 1_000_000 * MAX_DRIFT_PPM);
        let off = host_span >= MIN_RATE_SPAN_NS
            && moved > allowed
            && u128::from(moved) * 1_000_000
                > u128::from(host_span) * u128::from(RATE_TOLERANCE_PPM);
        Some(Rate {
            host_span_ns: host_span,
            firmware_span_ns: firmware_span,
            beyond_drift: off,
        })
    }

    /// The estimate to inject, if a snapshot is due at host time `now`
    /// (module docs); [`injected`](Self::injected) says it went out.
    pub fn due(&self, now: u64) -> Option<Estimate> {
        let est = self.estimate(now)?;
        let due = match self.injected {
            None => true,
            // The offset stated last lies outside what is known now: a
            // tighter estimate can show a loose one off by less than the
            // loose bound, yet by far more than its own (a relation first
            // measured with a bound of 0.5 s, then within 0.5 ms).
            Some((last, at)) => {
                now.saturating_sub(at) >= SNAPSHOT_PERIOD_NS
                    || last.offset_ns.abs_diff(est.offset_ns) > est.bound_ns
            }
        };
        due.then_some(est)
    }

    /// A snapshot of `est` was injected at host time `now`.
    pub fn injected(&mut self, est: Estimate, now: u64) {
        self.injected = Some((est, now));
        self.loosest_injected = self.loosest_injected.max(Some(est.bound_ns));
    }

    /// The widest bound of a relation injected so far: the trace's events
    /// near that snapshot are placed within it (the latest estimate's
    /// bound may be far tighter).
    pub fn loosest_injected(&self) -> Option<u64> {
        self.loosest_injected
    }

    /// The relation injected last.
    pub fn last_injected(&self) -> Option<Estimate> {
        self.injected.map(|(est, _)| est)
    }
}

/// Field numbers of `TracePacket.clock_snapshot` and `ClockSnapshot`.
const PACKET_CLOCK_SNAPSHOT: u32 = 6;
const SNAPSHOT_CLOCKS: u32 = 1;
const CLOCK_ID: u32 = 1;
const CLOCK_TIMESTAMP: u32 = 2;

/// A TracePacket holding `clock_snapshot { {clock_id, firmware_ns},
/// {BOOTTIME, boot_ns} }`.
pub fn snapshot_packet(clock_id: u32, firmware_ns: u64, boot_ns: u64) -> Vec<u8> {
    let mut buf = [0u8; 48];
    // Two clocks of at most 2 + 6 + 11 bytes each and their headers:
    // always fits 48 bytes.
    let n = encode_to_slice(&mut buf, |p| {
        p.nested(PACKET_CLOCK_SNAPSHOT, |s| {
            for (id, ts) in [(clock_id, firmware_ns), (BOOTTIME, boot_ns)] {
                s.nested(SNAPSHOT_CLOCKS, |c| {
                    c.uint32(CLOCK_ID, id);
                    c.uint64(CLOCK_TIMESTAMP, ts);
                });
            }
        });
    })
    .unwrap_or(0);
    buf[..n].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn two_way_takes_the_midpoint_and_half_the_round_trip() {
        let mut c = ClockSync::new();
        let n = c.request(1000 * MS);
        // The firmware read 5 ms on its clock; answered 2 ms later.
        c.sample(5 * MS, Some(n), 1002 * MS, 0);
        let e = c.estimate(1002 * MS).unwrap();
        assert_eq!(e.offset_ns, (1001 - 5) as i64 * MS as i64);
        assert_eq!(e.bound_ns, MS);
        assert!(e.two_way);
        assert_eq!(e.boot_ns(5 * MS), 1001 * MS);
        // A tighter exchange wins.
        let n = c.request(2000 * MS);
        c.sample(1004 * MS + 100_000, Some(n), 2000 * MS + 200_000, 0);
        let e = c.estimate(2000 * MS + 200_000).unwrap();
        assert_eq!(e.bound_ns, 100_000);
        assert_eq!(e.offset_ns, (996 * MS) as i64);
    }

    /// The summary says how loose the loosest relation stated in the
    /// trace was, not only the latest estimate's bound.
    #[test]
    fn the_loosest_relation_injected_is_kept() {
        let mut c = ClockSync::new();
        assert_eq!(c.loosest_injected(), None);
        let n = c.request(1000 * MS);
        c.sample(5 * MS, Some(n), 2000 * MS, 0); // bound 500 ms
        let loose = c.estimate(2000 * MS).unwrap();
        c.injected(loose, 2000 * MS);
        let n = c.request(3000 * MS);
        c.sample(2004 * MS, Some(n), 3000 * MS + 2 * MS, 0); // bound 1 ms
        let tight = c.estimate(3000 * MS + 2 * MS).unwrap();
        assert_eq!(tight.bound_ns, MS);
        c.injected(tight, 3000 * MS + 2 * MS);
        assert_eq!(c.loosest_injected(), Some(500 * MS));
    }

    #[test]
    fn an_old_tight_sample_loses_to_drift() {
        let mut c = ClockSync::new();
        let n = c.request(0);
        c.sample(0, Some(n), 10_000, 0); // bound 5 µs
        let n = c.request(10_000 * MS);
        c.sample(10_000 * MS, Some(n), 10_000 * MS + 100_000, 0); // 50 µs
                                                                  // 10 s of drift allowance (2 ms) outweighs the older one's
                                                                  // tighter round trip.
        let e = c.estimate(10_000 * MS + 100_000).unwrap();
        assert_eq!(e.bound_ns, 50_000);
        assert_eq!(e.firmware_ns, 10_000 * MS);
    }

    /// Two-way samples every `period` host ns with a round trip of
    /// `rtt`, the firmware clock reading `fw(host)`.
    fn sampled(fw: impl Fn(u64) -> u64, period: u64, rtt: u64, n: u64) -> ClockSync {
        let mut c = ClockSync::new();
        for i in 0..n {
            let t0 = 1_000 * MS + i * period;
            let nonce = c.request(t0);
            c.sample(fw(t0 + rtt / 2), Some(nonce), t0 + rtt, 0);
        }
        c
    }

    /// A coarse clock at the right rate (a 100 Hz tick: readings up to
    /// 10 ms late), sampled as a boot is (eight syncs 10 ms apart, then
    /// one a second) with round trips of 50 µs to 1 ms: never told.
    #[test]
    fn a_coarse_clock_at_the_hosts_rate_is_not_told() {
        let tick = 10 * MS;
        let mut c = ClockSync::new();
        let mut t0 = 1_000 * MS;
        for i in 0..24u64 {
            // At every phase of the tick.
            t0 += if i < 8 { 10 * MS } else { 1_000 * MS } + i * 3_700_000 % tick;
            let rtt = 50_000 + (i * 7919 % 20) * 50_000;
            let nonce = c.request(t0);
            let read = t0 + rtt * (i % 3) / 2;
            c.sample(read / tick * tick, Some(nonce), t0 + rtt, 0);
            let r = c.rate();
            assert!(r.is_none_or(|r| !r.beyond_drift), "sample {i}: {r:?}");
        }
    }

    #[test]
    fn a_firmware_clock_at_the_hosts_rate_is_within_the_drift() {
        // 150 ppm fast: within the 200 the relation allows for.
        let c = sampled(|t| 5 * MS + t + t / 1_000_000 * 150, 250 * MS, 200_000, 12);
        let r = c.rate().unwrap();
        assert_eq!(r.host_span_ns, 11 * 250 * MS);
        assert!(!r.beyond_drift, "{r:?}");
        assert!((r.ratio() - 1.000_15).abs() < 1e-6, "{}", r.ratio());
    }

    #[test]
    fn a_firmware_clock_at_another_rate_is_told() {
        // A clock hook that counts at an eighth of the rate it declares
        // (or a guest on virtual time): its offsets run away from their
        // bounds of 0.1 ms; told once the samples span 4 s.
        let c = sampled(|t| t / 8, 250 * MS, 200_000, 16);
        let r = c.rate().unwrap();
        assert!(!r.beyond_drift, "under {MIN_RATE_SPAN_NS} ns: {r:?}");
        let c = sampled(|t| t / 8, 500 * MS, 200_000, 9);
        let r = c.rate().unwrap();
        assert!(r.beyond_drift, "{r:?}");
        assert!((r.ratio() - 0.125).abs() < 1e-3, "{}", r.ratio());
        // Twice as fast: the same.
        let c = sampled(|t| 2 * t, 500 * MS, 200_000, 9);
        assert!(c.rate().unwrap().beyond_drift);
        assert!((c.rate().unwrap().ratio() - 2.0).abs() < 1e-3);
        // 3 % slow (a tick rate a little wrong) is told; 1 % is not.
        let c = sampled(|t| t / 100 * 97, 1000 * MS, 200_000, 6);
        assert!(c.rate().unwrap().beyond_drift);
        let c = sampled(|t| t / 100 * 99, 1000 * MS, 200_000, 6);
        assert!(!c.rate().unwrap().beyond_drift);
        // One sample, or a relation given: nothing to measure.
        assert_eq!(sampled(|t| t / 8, 250 * MS, 200_000, 1).rate(), None);
        assert_eq!(ClockSync::fixed(0).rate(), None);
    }

    #[test]
    fn answers_to_unknown_or_future_requests_are_refused() {
        let mut c = ClockSync::new();
        c.sample(1, Some(77), 100, 0);
        let n = c.request(500);
        c.sample(1, Some(n), 400, 0); // answered before asked
        assert_eq!(c.rejected, 2);
        assert_eq!(c.estimate(1000), None);
    }

    #[test]
    fn one_way_takes_the_least_delayed_sample_and_reports_the_spread() {
        let mut c = ClockSync::new();
        // True offset 1000 ms; delays 3, 1, 2 ms; 0.5 ms on the wire.
        for (f, delay) in [(10, 3), (20, 1), (30, 2)] {
            c.sample(f * MS, None, (f + 1000 + delay) * MS + MS / 2, MS / 2);
        }
        let e = c.estimate(1032 * MS).unwrap();
        assert!(!e.two_way);
        // The least delayed sample (1 ms late: never early), the spread of
        // the delays (2 ms) plus its 10 ms of age in drift allowance.
        assert_eq!(e.offset_ns, (1001 * MS) as i64);
        assert_eq!(e.bound_ns, 2 * MS + 10 * MAX_DRIFT_PPM);
    }

    #[test]
    fn snapshots_are_due_first_periodically_and_when_the_offset_moves() {
        let mut c = ClockSync::new();
        let due = |c: &mut ClockSync, now: u64| {
            let est = c.due(now)?;
            c.injected(est, now);
            Some(est)
        };
        assert_eq!(due(&mut c, 0), None, "nothing measured yet");
        let n = c.request(0);
        c.sample(0, Some(n), 2 * MS, 0);
        assert!(c.due(2 * MS).is_some());
        assert!(c.due(2 * MS).is_some(), "due until injected");
        assert!(due(&mut c, 2 * MS).is_some());
        assert!(due(&mut c, 3 * MS).is_none());
        assert!(due(&mut c, 1002 * MS).is_some(), "a second later");
        // A sample 10 ms off, with a tight bound: due at once.
        let n = c.request(1100 * MS);
        c.sample(1090 * MS, Some(n), 1100 * MS + 1000, 0);
        let e = due(&mut c, 1100 * MS + 1000).unwrap();
        assert_eq!(e.bound_ns, 500);
    }

    #[test]
    fn a_fixed_relation_needs_no_samples() {
        let c = ClockSync::fixed(-5);
        let e = c.due(0).unwrap();
        assert_eq!((e.offset_ns, e.bound_ns), (-5, 0));
        assert_eq!(e.boot_ns(3), 0, "saturates");
        assert_eq!(e.boot_ns(10), 5);
    }

    #[test]
    fn the_snapshot_packet_decodes() {
        use prost::Message as _;
        #[derive(Clone, PartialEq, prost::Message)]
        struct Packet {
            #[prost(message, optional, tag = "6")]
            clock_snapshot: Option<Snapshot>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct Snapshot {
            #[prost(message, repeated, tag = "1")]
            clocks: Vec<Clock>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct Clock {
            #[prost(uint32, optional, tag = "1")]
            clock_id: Option<u32>,
            #[prost(uint64, optional, tag = "2")]
            timestamp: Option<u64>,
        }
        let bytes = snapshot_packet(65, u64::MAX, 12345);
        let p = Packet::decode(&bytes[..]).unwrap();
        let clocks: Vec<_> = p
            .clock_snapshot
            .unwrap()
            .clocks
            .iter()
            .map(|c| (c.clock_id.unwrap(), c.timestamp.unwrap()))
            .collect();
        assert_eq!(clocks, [(65, u64::MAX), (6, 12345)]);
    }
}
