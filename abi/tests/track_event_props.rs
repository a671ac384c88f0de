//! Property: whatever a program calls on a `TrackEventWriter` (any event
//! kinds, strings of any length and content, clocks that jump forward and
//! back, a full SMB, recording switched off, clear requests, flushes;
//! names given as strings or at call sites, whose ids the writer caches), it
//! never panics, and the trace read back is exactly what a simple model
//! says: every event the writer reported written is there once, in order,
//! with its names, fields and time; nothing else is; resets come exactly
//! when due (first event, after a loss or a clear) and each loss is marked;
//! every loss, skip and suppressed end is counted once.
//!
//! Not built with `--cfg loom`: its `EventSite` statics need the const
//! constructor, which loom's atomics lack (the loom models are `loom_*`).
#![cfg(not(loom))]

mod support;

use proptest::prelude::*;
use proptest::sample::Index;
use shmtrace_abi::trace::track_event::Type;
use shmtrace_abi::track_event::{
    ArgValue as Arg, ClockValue, CounterTrack, CounterValue as Sample, EventSite, SequenceConfig,
    Track, TrackEventStats, FIRMWARE_CLOCK_ID,
};
use support::sequence::{
    read_back, smb, storage, writer, ArgValue, CounterValue, Event, ManualClock, Writer,
};

static MAIN: Track = Track::new("main");
static EXTRA: Track = Track::new("extra").with_parent(&MAIN);
static COUNTERS: [CounterTrack; 2] = [
    CounterTrack::new("c0").with_unit_name("mA"),
    CounterTrack::new("c1"),
];

/// Call sites, their strings unlike the pool's (sharing some between
/// them), one too long to intern.
static SITES: [EventSite; 4] = [
    EventSite::new("Site-A", "Site-x"),
    EventSite::new("Site-A", "Site-y"),
    EventSite::new("Site-B", "Site-x"),
    EventSite::new(
        "Site-B",
        "Site: a name too long to be interned (over 107 bytes), so the writer puts it inline in every event it names.",
    ),
];

/// Largest event (its fields, not its interned data, which may go into
/// packets of its own) that surely fits a packet with both prefix fields
/// (`previous_packet_dropped`, `first_packet_on_sequence`: 5 bytes).
const SURELY_FITS: usize = 127 - 5;

#[derive(Debug, Clone)]
enum Val {
    Bool(bool),
    Uint(u64),
    Int(i64),
    Double(f64),
    Str(Index),
    Pointer(u64),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Begin,
    End,
    Instant,
    Counter,
}

#[derive(Debug, Clone)]
struct Spec {
    kind: Kind,
    category: Index,
    name: Index,
    /// On EXTRA instead of the default track (not counters).
    extra: bool,
    counter: (usize, Sample),
    args: Vec<(Index, Val)>,
    flows: Vec<u64>,
    terminating: Vec<u64>,
    /// An explicit time, relative to now.
    at: Option<i64>,
}

/// A slice begin's or instant's category and name.
#[derive(Debug, Clone, Copy)]
enum Names {
    /// Strings of the pool.
    Pool(Index, Index),
    /// A call site of [`SITES`].
    Site(usize),
}

#[derive(Debug, Clone)]
enum Op {
    Begin(Names),
    End,
    Instant(Names),
    Counter(usize, i64),
    CounterF64(usize, f64),
    Event(Box<Spec>),
    Snapshot(u64),
    Advance(u64),
    Back(u64),
    Clear,
    Flush,
    Full(bool),
    Enabled(bool),
    Epoch,
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "[a-z_]{0,10}",
        2 => any::<String>().prop_map(|s| s.chars().take(12).collect()),
        1 => "[a-z ]{40,100}",
        1 => "[a-z]{100,160}",
    ]
}

fn names() -> impl Strategy<Value = Names> {
    prop_oneof![
        (any::<Index>(), any::<Index>()).prop_map(|(c, n)| Names::Pool(c, n)),
        (0..SITES.len()).prop_map(Names::Site),
    ]
}

fn double() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("NaN never equals itself", |d| !d.is_nan())
}

fn val() -> impl Strategy<Value = Val> {
    prop_oneof![
        any::<bool>().prop_map(Val::Bool),
        any::<u64>().prop_map(Val::Uint),
        any::<i64>().prop_map(Val::Int),
        double().prop_map(Val::Double),
        any::<Index>().prop_map(Val::Str),
        any::<u64>().prop_map(Val::Pointer),
    ]
}

fn sample() -> impl Strategy<Value = Sample> {
    prop_oneof![
        any::<i64>().prop_map(Sample::Int),
        double().prop_map(Sample::Double)
    ]
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::sample::select(vec![Kind::Begin, Kind::End, Kind::Instant, Kind::Counter]),
        any::<Index>(),
        any::<Index>(),
        any::<bool>(),
        (0..2usize, sample()),
        prop::collection::vec((any::<Index>(), val()), 0..6),
        prop::collection::vec(any::<u64>(), 0..4),
        prop::collection::vec(any::<u64>(), 0..4),
        prop::option::weighted(0.2, -5_000i64..5_000),
    )
        .prop_map(
            |(kind, category, name, extra, counter, args, flows, terminating, at)| Spec {
                kind,
                category,
                name,
                extra,
                counter,
                args,
                flows,
                terminating,
                at,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => names().prop_map(Op::Begin),
        5 => Just(Op::End),
        6 => names().prop_map(Op::Instant),
        3 => (0..2usize, any::<i64>()).prop_map(|(t, v)| Op::Counter(t, v)),
        2 => (0..2usize, double()).prop_map(|(t, v)| Op::CounterF64(t, v)),
        6 => spec().prop_map(|s| Op::Event(Box::new(s))),
        1 => any::<u64>().prop_map(Op::Snapshot),
        6 => prop_oneof![0..200u64, 0..20_000u64, 0..(1u64 << 40)].prop_map(Op::Advance),
        1 => (0..100_000u64).prop_map(Op::Back),
        1 => Just(Op::Clear),
        1 => Just(Op::Flush),
        1 => any::<bool>().prop_map(Op::Full),
        1 => any::<bool>().prop_map(Op::Enabled),
        1 => Just(Op::Epoch),
    ]
}

/// What the model expects of one written event.
#[derive(Debug, Clone, PartialEq)]
struct Expected {
    kind: i32,
    track: u64,
    categories: Vec<String>,
    name: Option<String>,
    args: Vec<(String, ArgValue)>,
    flows: Vec<u64>,
    terminating: Vec<u64>,
    counter: Option<CounterValue>,
    ts: u64,
    absolute: bool,
}

impl Expected {
    fn of(e: &Event) -> Self {
        Expected {
            kind: e.kind,
            track: e.track,
            categories: e.categories.clone(),
            name: e.name.clone(),
            args: e.args.clone(),
            flows: e.flows.clone(),
            terminating: e.terminating.clone(),
            counter: e.counter,
            ts: e.ts,
            absolute: e.absolute,
        }
    }
}

/// What became of one call, as the model predicts it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// Must be written.
    Written,
    /// Must not be: recording is off.
    Disabled,
    /// Must not be: an end whose begin was not written.
    Suppressed,
    /// Must not be: no chunk to give.
    NoChunk,
    /// Too long for a packet, perhaps: either, but a drop must be counted
    /// as one.
    MaybeTooLong,
}

/// An upper bound of an event's fields, every string counted inline.
fn bound(
    strings: &[&str],
    args: &[(usize, &Val)],
    pool: &[&str],
    explicit_track: bool,
    extra: usize,
) -> usize {
    // Absolute timestamp and clock id, flags, track_event header, type.
    let mut n = 11 + 7 + 2 + 2 + 2 + extra;
    if explicit_track {
        n += 11;
    }
    for s in strings {
        n += 4 + s.len();
    }
    for (name, v) in args {
        n += 2 + 3 + pool[*name].len();
        n += match v {
            Val::Bool(_) => 2,
            Val::Double(_) => 9,
            Val::Str(i) => 3 + pool[i.index(pool.len())].len(),
            _ => 11,
        };
    }
    n
}

struct Model<'p> {
    pool: &'p [&'static str],
    enabled: bool,
    no_chunk: bool,
    /// Default-track slices open, and whether each begin was written.
    slices: Vec<bool>,
    /// A reset must come before the next packet written.
    reset_due: bool,
    /// A packet was dropped since the last one written.
    loss: bool,
    /// Clock 64 as the trace has it.
    base: u64,
    expected: Vec<Expected>,
    /// Per written event or snapshot: (event index or None, reset due,
    /// loss since the previous one).
    written: Vec<(Option<usize>, bool, bool)>,
    snapshots: Vec<(u64, u64)>,
    fields_dropped: u32,
}

impl Model<'_> {
    fn s(&self, i: Index) -> &'static str {
        self.pool[i.index(self.pool.len())]
    }

    /// The verdict for an event (not a slice end) whose fields are at
    /// most `size` bytes.
    fn verdict(&self, size: usize) -> Verdict {
        if !self.enabled {
            Verdict::Disabled
        } else if self.no_chunk {
            Verdict::NoChunk
        } else if size <= SURELY_FITS {
            Verdict::Written
        } else {
            Verdict::MaybeTooLong
        }
    }

    /// Records a written event at `now`.
    fn wrote(&mut self, mut e: Expected, now: u64) {
        if self.reset_due {
            self.base = now;
        }
        e.ts = now;
        e.absolute = now < self.base;
        if !e.absolute {
            self.base = now;
        }
        self.written
            .push((Some(self.expected.len()), self.reset_due, self.loss));
        self.expected.push(e);
        self.reset_due = false;
        self.loss = false;
    }
}

/// Checks one call's outcome `ok` against `verdict` and the stats before
/// and after it.
fn judge(
    what: &dyn std::fmt::Debug,
    verdict: Verdict,
    ok: bool,
    before: (TrackEventStats, u64),
    after: (TrackEventStats, u64),
) -> Result<(), TestCaseError> {
    let (b, b_too_long) = before;
    let (a, a_too_long) = after;
    let counted = (a.events_dropped - b.events_dropped)
        + (a.events_disabled - b.events_disabled)
        + (a.ends_suppressed - b.ends_suppressed);
    if ok {
        prop_assert_eq!(a.events, b.events + 1, "{:?}", what);
        prop_assert_eq!(counted, 0, "{:?}", what);
    } else {
        prop_assert_eq!(a.events, b.events, "{:?}", what);
        prop_assert_eq!(
            counted,
            1,
            "{:?} not counted once: {:?} -> {:?}",
            what,
            b,
            a
        );
    }
    match verdict {
        Verdict::Written => prop_assert!(ok, "{:?} not written", what),
        Verdict::Disabled => {
            prop_assert!(!ok, "{:?} written while off", what);
            prop_assert_eq!(a.events_disabled, b.events_disabled + 1, "{:?}", what);
        }
        Verdict::Suppressed => {
            prop_assert!(!ok, "{:?}: an orphan end written", what);
            prop_assert_eq!(a.ends_suppressed, b.ends_suppressed + 1, "{:?}", what);
        }
        Verdict::NoChunk => {
            prop_assert!(!ok, "{:?} written without a chunk", what);
            prop_assert_eq!(a.events_dropped, b.events_dropped + 1, "{:?}", what);
        }
        Verdict::MaybeTooLong if !ok => {
            prop_assert_eq!(a.events_dropped, b.events_dropped + 1, "{:?}", what);
            prop_assert!(
                a_too_long > b_too_long,
                "{:?} dropped, but not as too long",
                what
            );
        }
        Verdict::MaybeTooLong => {}
    }
    Ok(())
}

fn named(kind: i32, category: &str, name: &str) -> Expected {
    Expected {
        kind,
        track: MAIN.uuid(),
        categories: vec![category.to_string()],
        name: Some(name.to_string()),
        args: Vec::new(),
        flows: Vec::new(),
        terminating: Vec::new(),
        counter: None,
        ts: 0,
        absolute: false,
    }
}

fn decoded(v: &Val, pool: &[&'static str]) -> (Arg<'static>, ArgValue) {
    match *v {
        Val::Bool(b) => (Arg::Bool(b), ArgValue::Bool(b)),
        Val::Uint(u) => (Arg::Uint(u), ArgValue::Uint(u)),
        Val::Int(i) => (Arg::Int(i), ArgValue::Int(i)),
        Val::Double(d) => (Arg::Double(d), ArgValue::Double(d)),
        Val::Str(i) => {
            let s = pool[i.index(pool.len())];
            (Arg::Str(s), ArgValue::Str(s.to_string()))
        }
        Val::Pointer(p) => (Arg::Pointer(p), ArgValue::Pointer(p)),
    }
}

fn sample_value(s: Sample) -> CounterValue {
    match s {
        Sample::Int(v) => CounterValue::Int(v),
        Sample::Double(v) => CounterValue::Double(v),
    }
}

fn run(pool: Vec<String>, start: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    // Distinct texts, so a string's text names its address (interning is
    // by address).
    let mut texts: Vec<String> = Vec::new();
    for s in pool {
        if !texts.contains(&s) {
            texts.push(s);
        }
    }
    let pool: Vec<&'static str> = texts
        .into_iter()
        .map(|s| &*Box::leak(s.into_boxed_str()))
        .collect();
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(start);
    let mut w: Writer = writer(&smb, &clock, SequenceConfig::new(&MAIN));
    let mut m = Model {
        pool: &pool,
        enabled: true,
        no_chunk: false,
        slices: Vec::new(),
        reset_due: true,
        loss: false,
        base: 0,
        expected: Vec::new(),
        written: Vec::new(),
        snapshots: Vec::new(),
        fields_dropped: 0,
    };
    let stats = |w: &Writer| (w.stats(), w.writer_stats().packets_dropped_too_long);
    for op in &ops {
        let before = stats(&w);
        let dropped_before = w.writer_stats().packets_dropped();
        let now = clock.get();
        let (verdict, ok, expected, at) = match op {
            Op::Begin(names) | Op::Instant(names) => {
                let begin = matches!(op, Op::Begin(..));
                let (c, n, ok) = match *names {
                    Names::Pool(c, n) => {
                        let (c, n) = (m.s(c), m.s(n));
                        let ok = if begin {
                            w.slice_begin(c, n)
                        } else {
                            w.instant(c, n)
                        };
                        (c, n, ok)
                    }
                    Names::Site(i) => {
                        let site = &SITES[i];
                        let ok = if begin {
                            w.slice_begin_at(site)
                        } else {
                            w.instant_at(site)
                        };
                        (site.category(), site.name(), ok)
                    }
                };
                if begin {
                    m.slices.push(ok);
                }
                let kind = if begin {
                    Type::SliceBegin
                } else {
                    Type::Instant
                };
                let verdict = m.verdict(bound(&[c, n], &[], &pool, false, 0));
                (verdict, ok, Some(named(kind as i32, c, n)), now)
            }
            Op::End => {
                let popped = m.slices.pop().unwrap_or(false);
                let ok = w.slice_end();
                let verdict = if !popped {
                    Verdict::Suppressed
                } else {
                    m.verdict(0)
                };
                let e = Expected {
                    categories: vec![],
                    name: None,
                    ..named(Type::SliceEnd as i32, "", "")
                };
                (verdict, ok, Some(e), now)
            }
            Op::Counter(t, v) => {
                let ok = w.counter(&COUNTERS[*t], *v);
                let e = Expected {
                    track: COUNTERS[*t].uuid(),
                    counter: Some(CounterValue::Int(*v)),
                    categories: vec![],
                    name: None,
                    ..named(Type::Counter as i32, "", "")
                };
                (
                    m.verdict(bound(&[], &[], &pool, true, 12)),
                    ok,
                    Some(e),
                    now,
                )
            }
            Op::CounterF64(t, v) => {
                let ok = w.counter_f64(&COUNTERS[*t], *v);
                let e = Expected {
                    track: COUNTERS[*t].uuid(),
                    counter: Some(CounterValue::Double(*v)),
                    categories: vec![],
                    name: None,
                    ..named(Type::Counter as i32, "", "")
                };
                (
                    m.verdict(bound(&[], &[], &pool, true, 12)),
                    ok,
                    Some(e),
                    now,
                )
            }
            // Not played: a slice end through the builder while recording
            // is off leaves its slice on the writer's stack (see
            // `track_event_writer.rs`, `a_builder_end_while_off_pops_its_slice`),
            // which the model would not follow.
            Op::Event(spec) if spec.kind == Kind::End && !spec.extra && !m.enabled => continue,
            Op::Event(spec) => {
                let (c, n) = (m.s(spec.category), m.s(spec.name));
                let kind = match spec.kind {
                    Kind::Begin => Type::SliceBegin,
                    Kind::End => Type::SliceEnd,
                    Kind::Instant => Type::Instant,
                    Kind::Counter => Type::Counter,
                };
                let counter_track = &COUNTERS[spec.counter.0];
                let mut b = w.event(kind, c, n);
                let on_default = !spec.extra && spec.kind != Kind::Counter;
                if spec.extra && spec.kind != Kind::Counter {
                    b = b.on(&EXTRA);
                }
                if spec.kind == Kind::Counter {
                    b = b.counter(counter_track, spec.counter.1);
                }
                let mut args = Vec::new();
                for (i, (name, v)) in spec.args.iter().enumerate() {
                    let (value, seen) = decoded(v, &pool);
                    let name = m.s(*name);
                    b = b.arg(name, value);
                    if i < 4 {
                        args.push((name.to_string(), seen));
                    } else {
                        m.fields_dropped += 1;
                    }
                }
                for &f in &spec.flows {
                    b = b.flow(f);
                }
                for &f in &spec.terminating {
                    b = b.terminating_flow(f);
                }
                m.fields_dropped += (spec.flows.len().saturating_sub(2)
                    + spec.terminating.len().saturating_sub(2))
                    as u32;
                let at = match spec.at {
                    Some(off) => {
                        let at = now.saturating_add_signed(off);
                        b = b.at(at);
                        at
                    }
                    None => now,
                };
                let ok = b.emit();
                let flows: Vec<u64> = spec.flows.iter().take(2).copied().collect();
                let terminating: Vec<u64> = spec.terminating.iter().take(2).copied().collect();
                let arg_refs: Vec<(usize, &Val)> = spec
                    .args
                    .iter()
                    .take(4)
                    .map(|(n, v)| (n.index(pool.len()), v))
                    .collect();
                let names: Vec<&str> = match spec.kind {
                    Kind::Begin | Kind::Instant => vec![c, n],
                    _ => vec![],
                };
                let size = bound(
                    &names,
                    &arg_refs,
                    &pool,
                    !on_default,
                    10 * (flows.len() + terminating.len()) + 12,
                );
                let verdict = match (on_default, spec.kind) {
                    (true, Kind::Begin) => {
                        m.slices.push(ok);
                        m.verdict(size)
                    }
                    (true, Kind::End) if !m.slices.pop().unwrap_or(false) => Verdict::Suppressed,
                    _ => m.verdict(size),
                };
                let e = Expected {
                    kind: kind as i32,
                    track: match spec.kind {
                        Kind::Counter => counter_track.uuid(),
                        _ if spec.extra => EXTRA.uuid(),
                        _ => MAIN.uuid(),
                    },
                    categories: names
                        .first()
                        .map(|c| vec![c.to_string()])
                        .unwrap_or_default(),
                    name: names.get(1).map(|n| n.to_string()),
                    args,
                    flows,
                    terminating,
                    counter: (spec.kind == Kind::Counter).then(|| sample_value(spec.counter.1)),
                    ts: 0,
                    absolute: false,
                };
                (verdict, ok, Some(e), at)
            }
            Op::Snapshot(other) => {
                if w.clock_snapshot(ClockValue::absolute(6, *other)) {
                    if m.reset_due {
                        m.base = now;
                    }
                    m.written.push((None, m.reset_due, m.loss));
                    m.snapshots.push((now, *other));
                    m.reset_due = false;
                    m.loss = false;
                } else {
                    prop_assert!(m.no_chunk, "snapshot dropped with room");
                    m.reset_due = true;
                    m.loss = true;
                }
                continue;
            }
            Op::Advance(d) => {
                clock.set(now.saturating_add(*d).min(1 << 62));
                continue;
            }
            Op::Back(d) => {
                clock.set(now.saturating_sub(*d));
                continue;
            }
            Op::Clear => {
                w.clear_incremental_state();
                m.reset_due = true;
                continue;
            }
            Op::Flush => {
                w.flush();
                continue;
            }
            Op::Full(full) => {
                w.arbiter_mut().full = *full;
                if *full {
                    // No current chunk either: nothing fits anywhere.
                    w.flush();
                }
                m.no_chunk = *full;
                continue;
            }
            Op::Enabled(on) => {
                w.arbiter_mut().enabled = *on;
                m.enabled = *on;
                continue;
            }
            Op::Epoch => {
                w.arbiter_mut().epoch += 1;
                m.reset_due = true;
                continue;
            }
        };
        judge(op, verdict, ok, before, stats(&w))?;
        if ok {
            m.wrote(expected.expect("an event"), at);
        } else if w.writer_stats().packets_dropped() > dropped_before {
            m.loss = true;
            m.reset_due = true;
        } else if w.stats().events_dropped > before.0.events_dropped {
            // Dropped before a packet was tried: a lost reset was counted
            // then (by the writer's stats) and the reset is still due.
            prop_assert!(m.reset_due || m.loss, "{:?} dropped for nothing", op);
        }
    }
    prop_assert_eq!(w.stats().fields_dropped, m.fields_dropped);
    let seq = read_back(&mut w, FIRMWARE_CLOCK_ID, MAIN.uuid());
    let got: Vec<Expected> = seq.events.iter().map(Expected::of).collect();
    prop_assert_eq!(&got, &m.expected);
    // Resets exactly when due, each loss marked on the first packet
    // written after it (the reset).
    let mut prev = 0usize;
    let mut snapshots = seq.snapshots.iter();
    for (index, due, loss) in &m.written {
        let packet = match index {
            Some(i) => seq.events[*i].packet,
            None => snapshots.next().expect("a snapshot").0,
        };
        let resets = seq
            .resets
            .iter()
            .filter(|&&r| r >= prev && r < packet)
            .count();
        if *due {
            prop_assert!(resets >= 1, "no reset before packet {}", packet);
        } else {
            prop_assert_eq!(
                resets,
                0,
                "a reset before packet {} without a cause",
                packet
            );
        }
        let marked = seq.loss_marks.iter().any(|&(p, _)| p >= prev && p < packet);
        prop_assert_eq!(marked, *loss, "loss mark before packet {}", packet);
        prev = packet + 1;
    }
    let got_snapshots: Vec<(u64, u64)> = seq
        .snapshots
        .iter()
        .map(|(_, ts, clocks)| (*ts, clocks[1].timestamp.unwrap()))
        .collect();
    prop_assert_eq!(got_snapshots, m.snapshots);
    // Strings are defined once per reset, tracks described once (three
    // tracks besides the default one: all remembered).
    let mut period = 0;
    let mut defined = std::collections::BTreeSet::new();
    for i in &seq.interned {
        let p = seq.resets.iter().filter(|&&r| r < i.packet).count();
        if p != period {
            period = p;
            defined.clear();
        }
        prop_assert!(
            defined.insert((i.kind, i.name.clone())),
            "{:?} defined twice",
            i
        );
    }
    prop_assert!(seq.descriptors.iter().all(|(_, _, repeat)| !repeat));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 256 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    // The generated names must be `&'static str` (interning is by address),
    // so each case leaks its pool, which miri reports as a leak.
    #[cfg_attr(miri, ignore = "leaks its generated &'static str names by design")]
    fn the_trace_is_what_the_model_says(
        pool in prop::collection::vec(text(), 1..10),
        start in prop_oneof![0..1_000u64, 0..(1u64 << 62)],
        ops in prop::collection::vec(op(), 1..150),
    ) {
        run(pool, start, ops)?;
    }
}
