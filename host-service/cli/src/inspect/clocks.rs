//! Timestamp resolution as Perfetto's trace processor does it
//! (`ClockTracker`/`ClockSynchronizer`, `ProtoTraceReader`): a graph of
//! clock domains built from every clock snapshot, converted through in up
//! to [`MAX_HOPS`] hops.
//!
//! * A clock id in 64..=127 is sequence-scoped: it names a different clock
//!   on every packet sequence (the trace processor keys it by sequence
//!   id); other ids name one clock for the whole trace.
//! * Every snapshot adds one time point to each of its clocks, in a series
//!   per set of clocks snapshotted together, and links each pair of its
//!   clocks both ways. Nothing is ever forgotten: an incremental-state
//!   clear does not touch clocks.
//! * A snapshot that gives a clock another unit or incremental flag than
//!   before, names a clock twice, or makes a global clock incremental is
//!   refused whole ([`SnapshotError`]). A clock whose series goes back in
//!   time is *non-monotonic*: no conversion starts from it any more (the
//!   trace processor's rule: one time on it may match several on others);
//!   the trace clock itself going back refuses the snapshot.
//! * Converting a timestamp: an incremental clock adds the delta to its
//!   last value (which every snapshot holding the clock sets); then each
//!   hop uses the latest snapshot of the hop's series at or before the
//!   time (or the first one, if the time is before all of them) and shifts
//!   by the difference. A timestamp already on the target clock is taken as
//!   it is.
//!
//! The trace processor also retries, at the end of the trace, a timestamp
//! no snapshot converts yet; this module resolves each timestamp when it is
//! read, so a clock must be related before the first packet stamped on it
//! (as older trace processors require).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

/// First sequence-scoped clock id; ids from 128 are reserved.
pub const FIRST_SEQUENCE_SCOPED: u32 = 64;
const FIRST_RESERVED: u32 = 128;
/// Most hops a conversion takes.
pub const MAX_HOPS: usize = 4;

/// A clock domain: a builtin or producer-global id (`seq == 0`), or a
/// sequence-scoped id on sequence `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClockKey {
    /// The clock id.
    pub id: u32,
    /// The packet sequence, for sequence-scoped ids; else 0.
    pub seq: u32,
}

impl ClockKey {
    /// The domain clock `id` names on sequence `seq`.
    pub fn new(seq: u32, id: u32) -> Self {
        let scoped = (FIRST_SEQUENCE_SCOPED..FIRST_RESERVED).contains(&id);
        ClockKey {
            id,
            seq: if scoped { seq } else { 0 },
        }
    }

    fn describe(&self) -> String {
        if self.seq == 0 {
            format!("clock {}", self.id)
        } else {
            format!("clock {} of sequence {}", self.id, self.seq)
        }
    }
}

/// One clock of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotClock {
    /// Its id.
    pub id: u32,
    /// Its reading.
    pub timestamp: u64,
    /// Nanoseconds per unit (1 if unset).
    pub unit_ns: u64,
    /// Timestamps on it are deltas.
    pub incremental: bool,
}

/// Why a snapshot was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// A clock that is not sequence-scoped marked incremental.
    IncrementalGlobal(ClockKey),
    /// A clock given another unit or incremental flag than before.
    Redefined(ClockKey),
    /// A clock twice in one snapshot.
    Duplicate(ClockKey),
    /// The trace clock went back.
    TraceClockBack(ClockKey),
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::IncrementalGlobal(k) => write!(
                f,
                "{} is not sequence-scoped and cannot be incremental",
                k.describe()
            ),
            Self::Redefined(k) => write!(
                f,
                "{} was defined before with another unit or incremental flag",
                k.describe()
            ),
            Self::Duplicate(k) => write!(f, "{} appears twice", k.describe()),
            Self::TraceClockBack(k) => {
                write!(f, "the trace clock ({}) goes back in time", k.describe())
            }
        }
    }
}

/// Why a timestamp does not convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvertError {
    /// No snapshot named the timestamp's clock.
    UnknownSource,
    /// No snapshot named the target clock.
    UnknownTarget,
    /// No chain of snapshots links them (within [`MAX_HOPS`]).
    NoPath,
}

#[derive(Debug, Default)]
struct Series {
    snapshot_ids: Vec<u32>,
    timestamps: Vec<i64>,
}

#[derive(Debug)]
struct Domain {
    /// One series per set of clocks snapshotted together.
    series: HashMap<u32, Series>,
    unit_ns: i64,
    incremental: bool,
    last_ns: i64,
}

/// The clock graph of a trace. See the module docs.
#[derive(Debug, Default)]
pub struct Clocks {
    domains: HashMap<ClockKey, Domain>,
    /// Ids of the sets of clocks snapshotted together.
    sets: HashMap<Vec<ClockKey>, u32>,
    /// `(from, to, set)`: a snapshot of `set` relates `from` to `to`.
    edges: BTreeSet<(ClockKey, ClockKey, u32)>,
    non_monotonic: HashSet<ClockKey>,
    snapshots: u32,
}

impl Clocks {
    /// Whether any snapshot named clock `id` on sequence `seq`.
    pub fn knows(&self, seq: u32, id: u32) -> bool {
        self.domains.contains_key(&ClockKey::new(seq, id))
    }

    /// Whether clock `id` of sequence `seq` is incremental (as a snapshot
    /// defined it).
    pub fn is_incremental(&self, seq: u32, id: u32) -> bool {
        self.domains
            .get(&ClockKey::new(seq, id))
            .is_some_and(|d| d.incremental)
    }

    /// Adds a snapshot read on sequence `seq`; `trace_clock` is the clock
    /// timestamps are converted to.
    pub fn add_snapshot(
        &mut self,
        seq: u32,
        clocks: &[SnapshotClock],
        trace_clock: u32,
    ) -> Result<(), SnapshotError> {
        let keys: Vec<ClockKey> = clocks.iter().map(|c| ClockKey::new(seq, c.id)).collect();
        let mut seen = HashSet::new();
        for (c, key) in clocks.iter().zip(&keys) {
            if !seen.insert(*key) {
                return Err(SnapshotError::Duplicate(*key));
            }
            match self.domains.get(key) {
                None if c.incremental && key.seq == 0 => {
                    return Err(SnapshotError::IncrementalGlobal(*key))
                }
                Some(d) if d.unit_ns != unit(c) || d.incremental != c.incremental => {
                    return Err(SnapshotError::Redefined(*key))
                }
                _ => {}
            }
        }
        let mut sorted = keys.clone();
        sorted.sort();
        let next_set = self.sets.len() as u32;
        let set = *self.sets.entry(sorted).or_insert(next_set);
        let id = self.snapshots;
        let trace_key = ClockKey::new(0, trace_clock);
        // The trace clock must not go back (checked before anything
        // changes).
        for (c, key) in clocks.iter().zip(&keys) {
            if *key != trace_key {
                continue;
            }
            let ns = (c.timestamp as i64).wrapping_mul(unit(c));
            let back = self
                .domains
                .get(key)
                .and_then(|d| d.series.get(&set))
                .and_then(|s| s.timestamps.last())
                .is_some_and(|&last| ns < last);
            if back {
                return Err(SnapshotError::TraceClockBack(*key));
            }
        }
        self.snapshots += 1;
        for (c, key) in clocks.iter().zip(&keys) {
            let domain = self.domains.entry(*key).or_insert_with(|| Domain {
                series: HashMap::new(),
                unit_ns: unit(c),
                incremental: c.incremental,
                last_ns: 0,
            });
            let ns = (c.timestamp as i64).wrapping_mul(domain.unit_ns);
            domain.last_ns = ns;
            let series = domain.series.entry(set).or_default();
            if series.timestamps.last().is_some_and(|&last| ns < last) {
                self.non_monotonic.insert(*key);
                let from = (*key, ClockKey { id: 0, seq: 0 }, 0);
                let drop: Vec<_> = self
                    .edges
                    .range(from..)
                    .take_while(|e| e.0 == *key)
                    .copied()
                    .collect();
                for e in drop {
                    self.edges.remove(&e);
                }
            }
            series.snapshot_ids.push(id);
            series.timestamps.push(ns);
        }
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                if !self.non_monotonic.contains(a) {
                    self.edges.insert((*a, *b, set));
                }
                if !self.non_monotonic.contains(b) {
                    self.edges.insert((*b, *a, set));
                }
            }
        }
        Ok(())
    }

    /// Whether the snapshots read so far relate clock `id` of sequence
    /// `seq` to clock `target` (a global clock).
    pub fn relates(&self, seq: u32, id: u32, target: u32) -> bool {
        let (src, dst) = (ClockKey::new(seq, id), ClockKey::new(0, target));
        src == dst
            || (self.domains.contains_key(&src)
                && self.domains.contains_key(&dst)
                && self.find_path(src, dst).is_some())
    }

    /// Converts `timestamp` on clock `id` of sequence `seq` to clock
    /// `target` (a global clock).
    pub fn convert(
        &mut self,
        seq: u32,
        id: u32,
        timestamp: u64,
        target: u32,
    ) -> Result<i64, ConvertError> {
        let src = ClockKey::new(seq, id);
        let dst = ClockKey::new(0, target);
        if src == dst {
            return Ok(timestamp as i64);
        }
        if !self.domains.contains_key(&dst) {
            return Err(if self.domains.contains_key(&src) {
                ConvertError::UnknownTarget
            } else {
                ConvertError::UnknownSource
            });
        }
        if !self.domains.contains_key(&src) {
            return Err(ConvertError::UnknownSource);
        }
        let path = self.find_path(src, dst).ok_or(ConvertError::NoPath)?;
        let domain = self
            .domains
            .get_mut(&src)
            .ok_or(ConvertError::UnknownSource)?;
        let mut ns = if domain.incremental {
            domain.last_ns = domain
                .last_ns
                .wrapping_add((timestamp as i64).wrapping_mul(domain.unit_ns));
            domain.last_ns
        } else {
            (timestamp as i64).wrapping_mul(domain.unit_ns)
        };
        for (from, to, set) in path {
            let (Some(a), Some(b)) = (
                self.domains.get(&from).and_then(|d| d.series.get(&set)),
                self.domains.get(&to).and_then(|d| d.series.get(&set)),
            ) else {
                return Err(ConvertError::NoPath);
            };
            // The latest time point at or before `ns`, else the first.
            let i = a.timestamps.partition_point(|&t| t <= ns).saturating_sub(1);
            let (Some(&at), Some(&snapshot)) = (a.timestamps.get(i), a.snapshot_ids.get(i)) else {
                return Err(ConvertError::NoPath);
            };
            let Ok(j) = b.snapshot_ids.binary_search(&snapshot) else {
                return Err(ConvertError::NoPath);
            };
            ns = ns.wrapping_add(b.timestamps[j].wrapping_sub(at));
        }
        Ok(ns)
    }

    /// The shortest chain of snapshots from `src` to `dst` (breadth
    /// first, edges in key order).
    fn find_path(&self, src: ClockKey, dst: ClockKey) -> Option<Vec<(ClockKey, ClockKey, u32)>> {
        let mut queue = VecDeque::from([(src, Vec::new())]);
        while let Some((at, path)) = queue.pop_front() {
            if path.len() >= MAX_HOPS {
                continue;
            }
            let from = (at, ClockKey { id: 0, seq: 0 }, 0);
            for &(a, b, set) in self.edges.range(from..).take_while(|e| e.0 == at) {
                let mut next = path.clone();
                next.push((a, b, set));
                if b == dst {
                    return Some(next);
                }
                queue.push_back((b, next));
            }
        }
        None
    }
}

fn unit(c: &SnapshotClock) -> i64 {
    if c.unit_ns == 0 {
        1
    } else {
        c.unit_ns as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: u32 = 6;
    const MONO: u32 = 3;

    fn clock(id: u32, timestamp: u64) -> SnapshotClock {
        SnapshotClock {
            id,
            timestamp,
            unit_ns: 1,
            incremental: false,
        }
    }

    fn incremental(id: u32, timestamp: u64) -> SnapshotClock {
        SnapshotClock {
            incremental: true,
            ..clock(id, timestamp)
        }
    }

    #[test]
    fn a_firmware_clock_converts_in_two_hops_and_survives_clears() {
        let mut c = Clocks::default();
        // The bridge: fw clock 65 = BOOTTIME - 1000 on sequence 2.
        c.add_snapshot(2, &[clock(65, 5_000), clock(BOOT, 6_000)], BOOT)
            .unwrap();
        // The firmware's reset packet: clock 64 (incremental) = 65 now.
        c.add_snapshot(2, &[clock(65, 5_100), incremental(64, 5_100)], BOOT)
            .unwrap();
        assert_eq!(c.convert(2, 64, 10, BOOT), Ok(6_110));
        assert_eq!(c.convert(2, 64, 5, BOOT), Ok(6_115));
        // Clock 64 is another clock on sequence 3.
        assert_eq!(c.convert(3, 64, 5, BOOT), Err(ConvertError::UnknownSource));
        // A later reset re-bases 64; 65 is still related to BOOTTIME.
        c.add_snapshot(2, &[clock(65, 9_000), incremental(64, 9_000)], BOOT)
            .unwrap();
        assert_eq!(c.convert(2, 64, 1, BOOT), Ok(10_001));
        assert_eq!(c.convert(2, 65, 9_500, BOOT), Ok(10_500));
        assert!(c.knows(2, 65) && !c.knows(3, 65));
    }

    #[test]
    fn the_latest_snapshot_at_or_before_the_time_is_used() {
        let mut c = Clocks::default();
        c.add_snapshot(1, &[clock(MONO, 100), clock(BOOT, 1_100)], BOOT)
            .unwrap();
        c.add_snapshot(1, &[clock(MONO, 200), clock(BOOT, 1_300)], BOOT)
            .unwrap();
        assert_eq!(c.convert(5, MONO, 50, BOOT), Ok(1_050), "before all: first");
        assert_eq!(c.convert(5, MONO, 150, BOOT), Ok(1_150));
        assert_eq!(c.convert(5, MONO, 250, BOOT), Ok(1_350));
        assert_eq!(c.convert(5, BOOT, 7, BOOT), Ok(7), "already on target");
    }

    #[test]
    fn three_hops_across_sets_and_no_path_beyond_reach() {
        let mut c = Clocks::default();
        c.add_snapshot(1, &[clock(1, 10), clock(2, 20)], BOOT)
            .unwrap();
        c.add_snapshot(1, &[clock(2, 30), clock(3, 300)], BOOT)
            .unwrap();
        c.add_snapshot(1, &[clock(3, 400), clock(BOOT, 4_000)], BOOT)
            .unwrap();
        // 1:15 -> 2:25 -> 3:295 -> BOOT:3_895.
        assert_eq!(c.convert(1, 1, 15, BOOT), Ok(3_895));
        c.add_snapshot(1, &[clock(7, 1), clock(8, 2)], BOOT)
            .unwrap();
        assert_eq!(c.convert(1, 7, 1, BOOT), Err(ConvertError::NoPath));
        assert_eq!(c.convert(1, 9, 1, BOOT), Err(ConvertError::UnknownSource));
        assert_eq!(c.convert(1, 7, 1, 11), Err(ConvertError::UnknownTarget));
        // A chain of five hops is out of reach.
        let mut long = Clocks::default();
        for (a, b) in [(1, 2), (2, 3), (3, 4), (4, 5), (5, BOOT)] {
            long.add_snapshot(1, &[clock(a, 0), clock(b, 0)], BOOT)
                .unwrap();
        }
        assert_eq!(long.convert(1, 2, 0, BOOT), Ok(0), "four hops");
        assert_eq!(long.convert(1, 1, 0, BOOT), Err(ConvertError::NoPath));
    }

    #[test]
    fn bad_snapshots_are_refused_and_a_clock_going_back_stops_converting() {
        let mut c = Clocks::default();
        assert_eq!(
            c.add_snapshot(1, &[incremental(MONO, 1), clock(BOOT, 1)], BOOT),
            Err(SnapshotError::IncrementalGlobal(ClockKey {
                id: MONO,
                seq: 0
            }))
        );
        c.add_snapshot(2, &[clock(65, 10), clock(BOOT, 100)], BOOT)
            .unwrap();
        assert_eq!(
            c.add_snapshot(2, &[incremental(65, 11), clock(BOOT, 101)], BOOT),
            Err(SnapshotError::Redefined(ClockKey { id: 65, seq: 2 }))
        );
        assert_eq!(
            c.add_snapshot(2, &[clock(65, 11), clock(65, 12)], BOOT),
            Err(SnapshotError::Duplicate(ClockKey { id: 65, seq: 2 }))
        );
        assert_eq!(
            c.add_snapshot(2, &[clock(65, 20), clock(BOOT, 50)], BOOT),
            Err(SnapshotError::TraceClockBack(ClockKey { id: BOOT, seq: 0 }))
        );
        // 65 going back: it can no longer be converted from.
        c.add_snapshot(2, &[clock(65, 5), clock(BOOT, 200)], BOOT)
            .unwrap();
        assert_eq!(c.convert(2, 65, 6, BOOT), Err(ConvertError::NoPath));
    }
}
