//! `TrackEventWriter` over a real SMB: each behaviour the module docs
//! promise, checked on the decoded packets (see `support/sequence.rs` for
//! what the replay itself rejects: unresolvable ids, state used after a
//! loss without a reset, undescribed tracks, stray fields).
//!
//! Not built with `--cfg loom`: its `EventSite` statics need the const
//! constructor, which loom's atomics lack (the loom models are `loom_*`).
#![cfg(not(loom))]

mod support;

use shmtrace_abi::trace::counter_descriptor::Unit;
use shmtrace_abi::trace::track_event::Type;
use shmtrace_abi::track_event::{
    ClockValue, CounterTrack, CounterValue as Sample, EventSite, SequenceConfig, Track, WriterCell,
    FIRMWARE_CLOCK_ID, MAX_NAME_LEN,
};
use support::sequence::{
    read_back, smb, storage, writer, ArgValue, CounterValue, Interning, ManualClock, Sequence,
    Writer, CLEARED, NEEDS_STATE,
};

static MAIN: Track = Track::new("main loop");
static OTHER: Track = Track::new("dma").with_parent(&MAIN);
static TEMP: CounterTrack = CounterTrack::new("temperature")
    .with_unit(Unit::Count)
    .with_unit_name("mC");
static BYTES: CounterTrack = CounterTrack::new("rx").with_unit(Unit::SizeBytes);

const BEGIN: i32 = Type::SliceBegin as i32;
const END: i32 = Type::SliceEnd as i32;
const INSTANT: i32 = Type::Instant as i32;
const COUNTER: i32 = Type::Counter as i32;

fn config() -> SequenceConfig {
    SequenceConfig::new(&MAIN)
}

fn read<const N: usize, const T: usize>(w: &mut Writer<'_, N, T>) -> Sequence {
    read_back(w, FIRMWARE_CLOCK_ID, MAIN.uuid())
}

/// `(name, categories)` of every event, in order.
fn names(seq: &Sequence) -> Vec<(Option<&str>, Vec<&str>)> {
    seq.events
        .iter()
        .map(|e| {
            (
                e.name.as_deref(),
                e.categories.iter().map(String::as_str).collect(),
            )
        })
        .collect()
}

#[test]
fn the_first_packets_start_the_sequence() {
    for clock_id in [FIRMWARE_CLOCK_ID, 6] {
        let mut storage = storage();
        let smb = smb(&mut storage);
        let clock = ManualClock::at(1_000_000);
        let mut w: Writer = writer(&smb, &clock, config().with_clock_id(clock_id));
        assert!(w.slice_begin("io", "read"));
        let seq = read_back(&mut w, clock_id, MAIN.uuid());
        assert_eq!(seq.packets.len(), 5);
        // The reset packet: replay checked its defaults and snapshot (clock
        // 64 = the absolute clock at its time) and first_packet_on_sequence.
        let reset = &seq.packets[0];
        assert_eq!(seq.resets, [0]);
        assert_eq!(reset.first_packet_on_sequence, Some(true));
        assert_eq!(reset.sequence_flags, Some(CLEARED));
        assert_eq!(
            (reset.timestamp, reset.timestamp_clock_id),
            (Some(1_000_000), Some(clock_id))
        );
        let defaults = reset.trace_packet_defaults.as_ref().unwrap();
        assert_eq!(defaults.timestamp_clock_id, Some(64));
        let clocks = &reset.clock_snapshot.as_ref().unwrap().clocks;
        assert_eq!(
            clocks
                .iter()
                .map(|c| (c.clock_id, c.timestamp, c.is_incremental))
                .collect::<Vec<_>>(),
            [
                (Some(clock_id), Some(1_000_000), None),
                (Some(64), Some(1_000_000), Some(true))
            ]
        );
        assert!(seq.loss_marks.is_empty());
        // The default track's descriptor, on the absolute clock.
        let (at, d, repeat) = &seq.descriptors[0];
        assert_eq!((*at, *repeat), (1, false));
        assert_eq!(
            (
                d.uuid,
                d.name.as_deref(),
                d.parent_uuid,
                d.counter.is_some()
            ),
            (Some(MAIN.uuid()), Some("main loop"), None, false)
        );
        let p = &seq.packets[1];
        assert_eq!(
            (p.timestamp, p.timestamp_clock_id, p.sequence_flags),
            (Some(1_000_000), Some(clock_id), None)
        );
        // Its strings, each in a packet of its own (no time: interned data
        // needs none), then the event: a delta of 0 on clock 64.
        for p in &seq.packets[2..4] {
            assert_eq!(
                (p.timestamp, p.sequence_flags, p.track_event.is_some()),
                (None, Some(NEEDS_STATE), false)
            );
        }
        let e = &seq.events[0];
        assert_eq!((e.packet, e.kind, e.track), (4, BEGIN, MAIN.uuid()));
        assert_eq!((e.ts, e.absolute, e.inline_strings), (1_000_000, false, 0));
        assert_eq!(seq.packets[4].timestamp, Some(0));
        assert_eq!(seq.packets[4].sequence_flags, Some(NEEDS_STATE));
        assert!(seq.packets[4].interned_data.is_none());
        assert_eq!(names(&seq), [(Some("read"), vec!["io"])]);
        assert_eq!(
            seq.interned,
            [
                Interning {
                    packet: 2,
                    kind: 0,
                    iid: 1,
                    name: "io".into()
                },
                Interning {
                    packet: 3,
                    kind: 1,
                    iid: 1,
                    name: "read".into()
                },
            ]
        );
        let stats = w.stats();
        assert_eq!(
            (stats.events, stats.resets, stats.events_dropped),
            (1, 1, 0)
        );
    }
}

#[test]
fn interned_ids_count_per_kind_and_are_defined_once_per_reset() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(10);
    let mut w: Writer = writer(&smb, &clock, config());
    let round = |w: &mut Writer| {
        assert!(w.instant("c1", "a"));
        assert!(w.instant("c1", "b"));
        assert!(w.instant("c2", "a"));
        assert!(w
            .event(Type::Instant, "c2", "b")
            .arg("x", 1u32)
            .arg("y", 2u32)
            .emit());
        assert!(w.event(Type::Instant, "c1", "a").arg("y", 3u32).emit());
        assert!(w.slice_begin("c1", "b"));
        assert!(w.slice_end());
    };
    round(&mut w);
    w.clear_incremental_state();
    round(&mut w);
    let seq = read(&mut w);
    assert_eq!(seq.resets.len(), 2);
    assert_eq!(names(&seq).len(), 14);
    let defs: Vec<_> = seq
        .interned
        .iter()
        .map(|i| (i.kind, i.iid, i.name.as_str()))
        .collect();
    let one_round = [
        (0, 1, "c1"),
        (1, 1, "a"),
        (1, 2, "b"),
        (0, 2, "c2"),
        (2, 1, "x"),
        (2, 2, "y"),
    ];
    assert_eq!(defs, [one_round, one_round].concat());
    // Each definition comes with the string's first use after a reset: in
    // a packet of its own right before a named event's (slice begins and
    // instants), on the packet of an event built with annotations.
    let first_uses: Vec<usize> = seq
        .interned
        .iter()
        .map(|i| {
            seq.events
                .iter()
                .position(|e| e.packet >= i.packet)
                .unwrap()
        })
        .collect();
    assert_eq!(first_uses, [0, 0, 1, 2, 3, 3, 7, 7, 8, 9, 10, 10]);
    let carrying: Vec<usize> = seq
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| seq.packets[e.packet].interned_data.is_some())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(carrying, [3, 10]);
    for i in &seq.interned {
        let p = &seq.packets[i.packet];
        if p.track_event.is_none() {
            let d = p.interned_data.as_ref().unwrap();
            let entries =
                d.event_categories.len() + d.event_names.len() + d.debug_annotation_names.len();
            assert_eq!((entries, p.sequence_flags), (1, Some(NEEDS_STATE)), "{i:?}");
        }
    }
    assert!(seq.events.iter().all(|e| e.inline_strings == 0));
    // The second round's definitions come after its reset.
    assert!(seq.interned[6].packet > seq.resets[1]);
}

#[test]
fn timestamps_are_deltas_that_sum_to_the_clock() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(5_000);
    let mut w: Writer = writer(&smb, &clock, config());
    let mut want = Vec::new();
    // Varint size boundaries, through the three event paths (named,
    // counter, builder).
    for (i, step) in [0u64, 1, 127, 128, 16_383, 16_384, 1 << 40, 3]
        .into_iter()
        .enumerate()
    {
        let now = clock.advance(step);
        let ok = match i % 3 {
            0 => w.instant("t", "tick"),
            1 => w.counter(&TEMP, i as i64),
            _ => w
                .event(Type::Instant, "t", "tock")
                .arg("i", i as u32)
                .emit(),
        };
        assert!(ok);
        want.push((now, false, step));
    }
    // Backwards: absolute time, and the base of later deltas unchanged.
    let last = clock.get();
    clock.set(last - 1_000);
    assert!(w.instant("t", "back"));
    want.push((last - 1_000, true, last - 1_000));
    clock.set(last - 2_000);
    assert!(w.counter(&TEMP, -1));
    want.push((last - 2_000, true, last - 2_000));
    clock.set(last - 3_000);
    assert!(w.event(Type::Instant, "t", "back").arg("i", 0u32).emit());
    want.push((last - 3_000, true, last - 3_000));
    clock.set(last + 10);
    assert!(w.slice_begin("t", "forward"));
    want.push((last + 10, false, 10));
    // An explicit time on the builder.
    assert!(w.event(Type::Instant, "t", "at").at(last + 15).emit());
    want.push((last + 15, false, 5));
    assert!(w.event(Type::Instant, "t", "at").at(last + 12).emit());
    want.push((last + 12, true, last + 12));
    let seq = read(&mut w);
    let got: Vec<_> = seq
        .events
        .iter()
        .map(|e| (e.ts, e.absolute, seq.packets[e.packet].timestamp.unwrap()))
        .collect();
    assert_eq!(got, want);
    for e in seq.events.iter().filter(|e| e.absolute) {
        assert_eq!(
            seq.packets[e.packet].timestamp_clock_id,
            Some(FIRMWARE_CLOCK_ID)
        );
    }
    assert_eq!(seq.resets, [0]);
}

#[test]
fn counter_tracks_are_described_once_per_reset() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(1);
    let mut w: Writer = writer(&smb, &clock, config());
    let values = [0, -1, i64::MIN, i64::MAX, 21_500];
    let doubles = [1.5, -0.25, f64::MAX, f64::MIN_POSITIVE];
    for _ in 0..2 {
        for (&v, &d) in values.iter().zip(&doubles) {
            clock.advance(10);
            assert!(w.counter(&TEMP, v));
            assert!(w.counter_f64(&BYTES, d));
        }
        assert!(w
            .event(Type::Counter, "", "")
            .counter(&TEMP, Sample::Double(0.5))
            .arg("why", "builder")
            .emit());
        w.clear_incremental_state();
    }
    let seq = read(&mut w);
    assert_eq!(seq.resets.len(), 2);
    let described: Vec<_> = seq
        .descriptors
        .iter()
        .map(|(_, d, repeat)| {
            let c = d.counter.as_ref();
            (
                d.uuid.unwrap(),
                d.name.clone().unwrap(),
                c.and_then(|c| c.unit),
                c.and_then(|c| c.unit_name.clone()),
                *repeat,
            )
        })
        .collect();
    let one_reset = [
        (MAIN.uuid(), "main loop".to_string(), None, None, false),
        (
            TEMP.uuid(),
            "temperature".into(),
            Some(Unit::Count as i32),
            Some("mC".into()),
            false,
        ),
        (
            BYTES.uuid(),
            "rx".into(),
            Some(Unit::SizeBytes as i32),
            None,
            false,
        ),
    ];
    assert_eq!(described, [one_reset.clone(), one_reset].concat());
    // Each descriptor precedes the first sample on its track.
    for (at, d, _) in seq
        .descriptors
        .iter()
        .filter(|(_, d, _)| d.counter.is_some())
    {
        let first = seq.events.iter().find(|e| e.packet > *at).unwrap();
        assert_eq!(first.track, d.uuid.unwrap());
    }
    let samples: Vec<_> = seq
        .of_kind(COUNTER)
        .map(|e| (e.track, e.counter.unwrap()))
        .collect();
    let mut want = Vec::new();
    for (&v, &d) in values.iter().zip(&doubles) {
        want.push((TEMP.uuid(), CounterValue::Int(v)));
        want.push((BYTES.uuid(), CounterValue::Double(d)));
    }
    want.push((TEMP.uuid(), CounterValue::Double(0.5)));
    assert_eq!(samples, [want.clone(), want].concat());
    let builder = seq.events.iter().find(|e| !e.args.is_empty()).unwrap();
    assert_eq!(
        builder.args,
        [("why".into(), ArgValue::Str("builder".into()))]
    );
    assert_eq!(
        (builder.name.as_deref(), builder.categories.len()),
        (None, 0)
    );
}

#[test]
fn builder_events_carry_tracks_annotations_and_flows() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(100);
    let mut w: Writer = writer(&smb, &clock, config());
    assert!(w
        .event(Type::SliceBegin, "dma", "transfer")
        .on(&OTHER)
        .arg("ok", true)
        .arg("len", u64::MAX)
        .arg("delta", -5i64)
        .arg("ratio", 2.5f64)
        .flow(1)
        .flow(u64::MAX)
        .emit());
    clock.advance(7);
    assert!(w
        .event(Type::Instant, "dma", "irq")
        .arg("label", "half")
        .arg(
            "addr",
            shmtrace_abi::track_event::ArgValue::Pointer(0x2000_0000)
        )
        .arg("small", 3u8)
        .arg("neg", i8::MIN)
        .arg("dropped", 1u32)
        .terminating_flow(1)
        .terminating_flow(2)
        .terminating_flow(3)
        .flow(4)
        .emit());
    clock.advance(9);
    assert!(w.event(Type::SliceEnd, "", "").on(&OTHER).emit());
    assert!(w.event(Type::Instant, "dma", "irq").on(&OTHER).emit());
    let stats = w.stats();
    assert_eq!(stats.fields_dropped, 2); // a fifth annotation, a third flow
    let seq = read(&mut w);
    // OTHER described once, under MAIN, before its first event.
    let others: Vec<_> = seq
        .descriptors
        .iter()
        .filter(|(_, d, _)| d.uuid == Some(OTHER.uuid()))
        .collect();
    assert_eq!(others.len(), 1);
    assert_eq!(others[0].1.parent_uuid, Some(MAIN.uuid()));
    assert_eq!(others[0].1.name.as_deref(), Some("dma"));
    assert!(others[0].0 < seq.events[0].packet);
    let e = &seq.events;
    assert_eq!(e.len(), 4);
    assert_eq!((e[0].kind, e[0].track), (BEGIN, OTHER.uuid()));
    assert_eq!(
        e[0].args,
        [
            ("ok".into(), ArgValue::Bool(true)),
            ("len".into(), ArgValue::Uint(u64::MAX)),
            ("delta".into(), ArgValue::Int(-5)),
            ("ratio".into(), ArgValue::Double(2.5)),
        ]
    );
    assert_eq!(
        (e[0].flows.clone(), e[0].terminating.len()),
        (vec![1, u64::MAX], 0)
    );
    assert_eq!((e[1].kind, e[1].track), (INSTANT, MAIN.uuid()));
    assert_eq!(
        e[1].args,
        [
            ("label".into(), ArgValue::Str("half".into())),
            ("addr".into(), ArgValue::Pointer(0x2000_0000)),
            ("small".into(), ArgValue::Uint(3)),
            ("neg".into(), ArgValue::Int(-128)),
        ]
    );
    assert_eq!(
        (e[1].flows.clone(), e[1].terminating.clone()),
        (vec![4], vec![1, 2])
    );
    assert_eq!((e[2].kind, e[2].track, e[2].ts), (END, OTHER.uuid(), 116));
    assert_eq!((e[3].kind, e[3].track), (INSTANT, OTHER.uuid()));
    assert_eq!(names(&seq)[3], (Some("irq"), vec!["dma"]));
    // The default track's uuid is never written on an event.
    assert!(seq.events.iter().all(|e| (seq.packets[e.packet]
        .track_event
        .as_ref()
        .unwrap()
        .track_uuid
        .is_some())
        == (e.track != MAIN.uuid())));
}

#[test]
fn an_end_whose_begin_was_not_written_is_not_written() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(100);
    let mut w: Writer = writer(&smb, &clock, config());
    // An end with nothing open.
    assert!(!w.slice_end());
    assert!(w.slice_begin("s", "outer"));
    // The inner begin is lost (no chunk), so is its end; the outer end is
    // written.
    w.arbiter_mut().full = true;
    w.flush();
    assert!(!w.slice_begin("s", "inner"));
    w.arbiter_mut().full = false;
    assert!(!w.slice_end());
    assert!(w.slice_end());
    // The same through the builder, and with recording off.
    w.arbiter_mut().enabled = false;
    assert!(!w.event(Type::SliceBegin, "s", "off").emit());
    w.arbiter_mut().enabled = true;
    assert!(!w.event(Type::SliceEnd, "", "").emit());
    assert!(!w.event(Type::SliceEnd, "", "").emit());
    let stats = w.stats();
    assert_eq!(stats.ends_suppressed, 4);
    assert_eq!(
        (stats.events, stats.events_dropped, stats.events_disabled),
        (2, 1, 1)
    );
    let seq = read(&mut w);
    let kinds: Vec<_> = seq.events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [BEGIN, END]);
}

#[test]
fn a_full_smb_drops_and_counts_and_the_sequence_starts_again() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(1_000);
    let mut w: Writer = writer(&smb, &clock, config());
    // The collector leaves chunks in the SMB: it fills up for real.
    w.arbiter_mut().hold = true;
    let mut written = Vec::new();
    let mut dropped = 0u32;
    for i in 0..2_000u32 {
        clock.advance(1);
        let ok = if i % 2 == 0 {
            w.slice_begin("cat", "work")
        } else {
            w.counter(&TEMP, i64::from(i))
        };
        if ok {
            assert_eq!(dropped, 0, "event {i} written after a drop");
            written.push(i);
        } else {
            dropped += 1;
            if dropped == 5 {
                break;
            }
        }
    }
    assert_eq!(dropped, 5, "16 KiB of SMB never filled");
    let stats = w.stats();
    assert_eq!(stats.events_dropped, 5);
    assert!(w.writer_stats().packets_dropped_smb_full >= 5);
    // The service drains; writing goes on.
    w.arbiter_mut().drain();
    w.arbiter_mut().hold = false;
    clock.advance(1);
    assert!(w.instant("cat", "after"));
    assert!(w.counter(&TEMP, -7));
    let seq = read(&mut w);
    assert_eq!(seq.events.len(), written.len() + 2);
    assert_eq!(seq.resets.len(), 2);
    let second = seq.resets[1];
    // The loss is marked on the reset packet, which comes first after it.
    assert_eq!(seq.loss_marks, [(second, 257)]);
    let last_before = written.len() - 1;
    assert_eq!(seq.events[last_before].packet, second - 1);
    // State is re-emitted: the default track's and TEMP's descriptors, the
    // interned strings from id 1.
    let after: Vec<_> = seq
        .descriptors
        .iter()
        .filter(|(at, _, _)| *at > second)
        .map(|(_, d, _)| d.uuid.unwrap())
        .collect();
    assert_eq!(after, [MAIN.uuid(), TEMP.uuid()]);
    let defs: Vec<_> = seq
        .interned
        .iter()
        .filter(|i| i.packet > second)
        .map(|i| (i.kind, i.iid, i.name.as_str()))
        .collect();
    assert_eq!(defs, [(0, 1, "cat"), (1, 1, "after")]);
    let tail: Vec<_> = seq.events[written.len()..]
        .iter()
        .map(|e| (e.kind, e.counter))
        .collect();
    assert_eq!(
        tail,
        [(INSTANT, None), (COUNTER, Some(CounterValue::Int(-7)))]
    );
}

#[test]
fn a_clear_request_from_the_consumer_restarts_the_sequence() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(50);
    let mut w: Writer = writer(&smb, &clock, config());
    assert!(w.instant("c", "a"));
    assert!(w.counter(&TEMP, 1));
    w.arbiter_mut().epoch = 1;
    clock.advance(5);
    assert!(w.instant("c", "a"));
    assert!(w.counter(&TEMP, 2));
    // The same epoch again: nothing to do.
    assert!(w.instant("c", "a"));
    w.arbiter_mut().epoch = 2;
    assert!(w.counter(&TEMP, 3));
    assert!(w.event(Type::Instant, "c", "b").emit());
    let seq = read(&mut w);
    assert!(seq.loss_marks.is_empty());
    let resets_before: Vec<usize> = seq
        .events
        .iter()
        .map(|e| seq.resets.iter().filter(|&&r| r < e.packet).count())
        .collect();
    assert_eq!(resets_before, [1, 1, 2, 2, 2, 3, 3]);
    // Each reset re-describes TEMP before its next sample and re-interns.
    let temp: Vec<usize> = seq
        .descriptors
        .iter()
        .filter(|(_, d, _)| d.uuid == Some(TEMP.uuid()))
        .map(|(at, _, _)| *at)
        .collect();
    assert_eq!(temp.len(), 3);
    let stamps: Vec<_> = seq.events.iter().map(|e| e.ts).collect();
    assert_eq!(stamps, [50, 50, 55, 55, 55, 55, 55]);
    assert_eq!(w.stats().resets, 3);
}

#[test]
fn with_recording_off_events_are_skipped_and_counted() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(50);
    let mut w: Writer = writer(&smb, &clock, config());
    assert!(w.instant("c", "a"));
    w.arbiter_mut().enabled = false;
    assert!(!w.instant("c", "a"));
    assert!(!w.slice_begin("c", "a"));
    assert!(!w.counter(&TEMP, 1));
    assert!(!w.counter_f64(&TEMP, 1.0));
    assert!(!w.event(Type::Instant, "c", "b").emit());
    assert!(!w.slice_end()); // its begin was skipped
    w.arbiter_mut().enabled = true;
    clock.advance(3);
    assert!(w.instant("c", "a"));
    let stats = w.stats();
    assert_eq!(
        (stats.events, stats.events_disabled, stats.ends_suppressed),
        (2, 5, 1)
    );
    // Skipping loses nothing: no loss mark, no second reset.
    assert_eq!((stats.resets, stats.events_dropped), (1, 0));
    let seq = read(&mut w);
    assert_eq!((seq.resets.len(), seq.loss_marks.len()), (1, 0));
    assert_eq!(
        seq.events.iter().map(|e| e.ts).collect::<Vec<_>>(),
        [50, 53]
    );
    // Reset, descriptor, the two strings' packets, the two events.
    assert_eq!(seq.packets.len(), 6);
}

#[test]
fn a_full_interning_table_writes_strings_inline() {
    static NAMES: [&str; 6] = ["n0", "n1", "n2", "n3", "n4", "n5"];
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(50);
    let mut w: Writer<4> = writer(&smb, &clock, config());
    for name in NAMES {
        assert!(w.instant("cat", name));
    }
    // Four entries for all kinds: "cat" and three names.
    assert!(w
        .event(Type::Instant, "cat", NAMES[1])
        .arg("k", 1u32)
        .emit());
    assert_eq!(w.stats().strings_inline, 4);
    w.clear_incremental_state();
    assert!(w.instant("cat", NAMES[5]));
    let seq = read(&mut w);
    let inline: Vec<_> = seq.events.iter().map(|e| e.inline_strings).collect();
    assert_eq!(inline, [0, 0, 0, 1, 1, 1, 1, 0]);
    for e in &seq.events[3..6] {
        let te = seq.packets[e.packet].track_event.as_ref().unwrap();
        assert_eq!(te.name.as_deref(), e.name.as_deref());
        assert_eq!(te.name_iid, None);
    }
    let last_arg = &seq.packets[seq.events[6].packet]
        .track_event
        .as_ref()
        .unwrap()
        .debug_annotations[0];
    assert_eq!(
        (last_arg.name.as_deref(), last_arg.name_iid),
        (Some("k"), None)
    );
    assert_eq!(
        names(&seq),
        NAMES
            .iter()
            .chain([&NAMES[1], &NAMES[5]])
            .map(|&n| (Some(n), vec!["cat"]))
            .collect::<Vec<_>>()
    );
    // After the reset "n5" is interned again.
    let last = seq.interned.last().unwrap();
    assert_eq!((last.kind, last.iid, last.name.as_str()), (1, 1, "n5"));
}

#[test]
fn long_names_are_interned_in_packets_of_their_own() {
    static CAT: &str = "a category name that is long enough to matter, 60 bytes ...";
    static NAME: &str = "an event name that is also long enough to matter, 60 bytes..";
    static ARG: &str = "an annotation name of 40 bytes, long....";
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(50);
    let mut w: Writer = writer(&smb, &clock, config());
    assert!(w.instant(CAT, NAME));
    clock.advance(1);
    assert!(w.event(Type::Instant, CAT, "short").arg(ARG, 7u32).emit());
    clock.advance(1);
    assert!(w.instant(CAT, NAME));
    let seq = read(&mut w);
    // The first event and its two new strings exceed 127 bytes: each
    // string goes first in a packet of its own. The second one's new
    // strings ("short" and ARG) fit with it.
    let shape: Vec<_> = seq
        .packets
        .iter()
        .map(|p| {
            (
                p.track_event.is_some(),
                p.interned_data.as_ref().map(|d| {
                    (
                        d.event_categories.len(),
                        d.event_names.len(),
                        d.debug_annotation_names.len(),
                    )
                }),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (false, None),
            (false, None),
            (false, Some((1, 0, 0))),
            (false, Some((0, 1, 0))),
            (true, None),
            (true, Some((0, 1, 1))),
            (true, None),
        ]
    );
    // The split-off packets carry no time and need state.
    for p in &seq.packets[2..4] {
        assert_eq!((p.timestamp, p.sequence_flags), (None, Some(NEEDS_STATE)));
    }
    assert_eq!(
        names(&seq),
        [
            (Some(NAME), vec![CAT]),
            (Some("short"), vec![CAT]),
            (Some(NAME), vec![CAT])
        ]
    );
    assert_eq!(seq.events[1].args, [(ARG.into(), ArgValue::Uint(7))]);
    assert_eq!(
        seq.events.iter().map(|e| e.ts).collect::<Vec<_>>(),
        [50, 51, 52]
    );
    assert_eq!(w.stats().strings_inline, 0);
}

#[test]
fn an_event_too_long_for_a_packet_is_dropped_and_counted() {
    static HUGE: &str = concat!(
        "a name longer than any interned string may be, so it goes inline ",
        "and makes the event longer than the 127 bytes of a packet ........"
    );
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(50);
    let mut w: Writer = writer(&smb, &clock, config());
    assert!(w.instant("c", "before"));
    assert!(!w.instant("c", HUGE));
    let long_value = "v".repeat(200);
    assert!(!w
        .event(Type::Instant, "c", "arg")
        .arg("s", long_value.as_str())
        .emit());
    assert!(w.instant("c", "after"));
    let stats = w.stats();
    assert_eq!((stats.events, stats.events_dropped), (2, 2));
    assert_eq!(stats.strings_inline, 1);
    assert_eq!(w.writer_stats().packets_dropped_too_long, 2);
    let seq = read(&mut w);
    assert_eq!(
        names(&seq),
        [(Some("before"), vec!["c"]), (Some("after"), vec!["c"])]
    );
    // Each drop is marked (PRESENT, not SMB_FULL) on the reset that
    // follows it. The second event's new strings were written before its
    // body was found too long: defined, never used.
    assert_eq!(seq.resets.len(), 3);
    assert_eq!(seq.loss_marks, [(seq.resets[1], 1), (seq.resets[2], 1)]);
    let defs: Vec<_> = seq
        .interned
        .iter()
        .map(|i| (i.kind, i.name.as_str()))
        .collect();
    assert_eq!(
        defs,
        [
            (0, "c"),
            (1, "before"),
            (0, "c"),
            (1, "arg"),
            (2, "s"),
            (0, "c"),
            (1, "after")
        ]
    );
}

/// The limits the module docs state: a name of [`MAX_NAME_LEN`] bytes is
/// interned and its event written, one a few bytes longer goes inline and
/// drops its event; a string
/// annotation value of 80 bytes fits an event with a category, a name, a
/// flow id and a track of its own, whether stamped as a delta or (time
/// gone backwards) absolute.
#[test]
fn the_documented_string_limits_hold() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(1_000_000_000);
    let mut w: Writer = writer(&smb, &clock, config());
    // Names are `&'static str`: from statics (not leaked, for miri).
    static NAME: [u8; MAX_NAME_LEN] = [b'n'; MAX_NAME_LEN];
    static LONGER: [u8; MAX_NAME_LEN + 8] = [b'm'; MAX_NAME_LEN + 8];
    let name = core::str::from_utf8(&NAME).unwrap();
    let longer = core::str::from_utf8(&LONGER).unwrap();
    assert!(w.instant("c", name));
    assert!(!w.instant("c", longer));
    assert_eq!(w.stats().events_dropped, 1);
    assert_eq!(w.stats().strings_inline, 1);
    let value = "v".repeat(80);
    let event = |w: &mut Writer| {
        w.event(Type::Instant, "c", "with a value")
            .on(&OTHER)
            .flow(u64::MAX)
            .arg("text", value.as_str())
            .emit()
    };
    clock.advance(200_000_000); // a 4-byte delta
    assert!(event(&mut w));
    clock.set(1); // before the previous event: an absolute time
    assert!(event(&mut w));
    let seq = read(&mut w);
    assert_eq!(
        names(&seq),
        [
            (Some(name), vec!["c"]),
            (Some("with a value"), vec!["c"]),
            (Some("with a value"), vec!["c"])
        ]
    );
    assert!(!seq.events[1].absolute);
    assert!(seq.events[2].absolute);
}

#[test]
fn tracks_beyond_the_remembered_ones_are_described_before_each_use() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(50);
    // T = 1: one track remembered besides the default one (described at
    // every reset, never looked up): the first counter track.
    let mut w: Writer<16, 1> = writer(&smb, &clock, config());
    for i in 0..3 {
        assert!(w.counter(&TEMP, i));
        assert!(w.counter(&BYTES, i));
    }
    let seq = read(&mut w);
    let described: Vec<_> = seq
        .descriptors
        .iter()
        .map(|(_, d, _)| d.uuid.unwrap())
        .collect();
    assert_eq!(described[0], MAIN.uuid());
    assert_eq!(
        &described[1..],
        [TEMP.uuid(), BYTES.uuid(), BYTES.uuid(), BYTES.uuid()]
    );
    assert_eq!(seq.of_kind(COUNTER).count(), 6);
    assert_eq!(seq.resets.len(), 1);
}

#[test]
fn a_clock_snapshot_pairs_the_writer_clock_with_another() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(7_000);
    let mut w: Writer = writer(&smb, &clock, config());
    assert!(w.clock_snapshot(ClockValue::absolute(6, 123_456_789)));
    clock.advance(10);
    assert!(w.instant("c", "a"));
    let seq = read(&mut w);
    assert_eq!(seq.resets, [0]);
    let (_, ts, clocks) = &seq.snapshots[0];
    assert_eq!(*ts, 7_000);
    let clocks: Vec<_> = clocks
        .iter()
        .map(|c| (c.clock_id, c.timestamp, c.is_incremental))
        .collect();
    assert_eq!(
        clocks,
        [
            (Some(FIRMWARE_CLOCK_ID), Some(7_000), None),
            (Some(6), Some(123_456_789), None)
        ]
    );
    // It does not move clock 64's base.
    assert_eq!(seq.events[0].ts, 7_010);
    assert_eq!(seq.packets[seq.events[0].packet].timestamp, Some(10));
}

#[test]
fn writers_in_cells_from_two_contexts() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(50);
    let cell = WriterCell::new();
    assert!(cell.set(writer::<16, 4>(&smb, &clock, config())).is_ok());
    assert_eq!(cell.try_with(|w| w.instant("c", "task")), Some(true));
    // A context that finds the cell busy (it preempted the borrower) misses.
    let inner = cell.try_with(|w| {
        let nested = cell.try_with(|w2: &mut Writer| w2.instant("c", "irq"));
        (w.instant("c", "task"), nested)
    });
    assert_eq!(inner, Some((true, None)));
    assert_eq!(cell.busy_misses(), 1);
    let mut w = cell.take().unwrap();
    let seq = read(&mut w);
    assert_eq!(
        names(&seq),
        [(Some("task"), vec!["c"]), (Some("task"), vec!["c"])]
    );
}

/// A slice end skipped while recording is off still closes its slice on
/// the writer's stack, whichever call ends it: a later end then pairs with
/// the right begin.
#[test]
fn a_builder_end_while_off_pops_its_slice() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(50);
    let mut w: Writer = writer(&smb, &clock, config());
    assert!(w.slice_begin("s", "outer"));
    w.arbiter_mut().enabled = false;
    assert!(!w.slice_begin("s", "inner"));
    assert!(!w.event(Type::SliceEnd, "", "").emit()); // ends "inner"
    w.arbiter_mut().enabled = true;
    // Ends "outer", whose begin was written: so must its end be.
    assert!(w.slice_end());
    let seq = read(&mut w);
    let kinds: Vec<_> = seq.events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [BEGIN, END]);
}

/// Packets lost before a sequence's first one are marked where a reader
/// sees the mark: a trace buffer flags the first packet it reads of every
/// sequence as after a loss, so a mark on the first packet (next to
/// `first_packet_on_sequence`) records nothing. The host producer writes a
/// plain first packet and marks the loss on the reset after it.
#[test]
fn a_loss_before_the_first_packet_is_marked_after_it() {
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(50);
    let mut w: Writer = writer(&smb, &clock, config());
    w.arbiter_mut().full = true;
    assert!(!w.instant("c", "lost"));
    w.arbiter_mut().full = false;
    assert!(w.instant("c", "kept"));
    let seq = read(&mut w);
    assert_eq!(seq.events.len(), 1);
    assert!(
        seq.loss_marks.iter().any(|&(p, bits)| p > 0 && bits == 257),
        "{:?}",
        seq.loss_marks
    );
}

/// Call sites shared by two writers whose sequences give their strings
/// different ids: each writer's events name what their site names, through
/// clears (the writer's and the consumer's), a loss, and the interning
/// generations wrapping around.
#[test]
fn call_sites_name_their_events_on_every_sequence() {
    static WORK: EventSite = EventSite::new("site", "work");
    static TICK: EventSite = EventSite::new("site", "tick");
    let (mut sa, mut sb) = (storage(), storage());
    let (smb_a, smb_b) = (smb(&mut sa), smb(&mut sb));
    let clock = ManualClock::at(100);
    let mut a: Writer = writer(&smb_a, &clock, config());
    let mut b: Writer = writer(&smb_b, &clock, config());
    // `a` interns other strings first: its ids for the sites' strings are
    // 2 and up, `b`'s 1 and up.
    assert!(a.instant("other", "first"));
    let mut want_a = vec![(Some("first"), vec!["other"])];
    let mut want_b = vec![];
    let round = |w: &mut Writer, want: &mut Vec<(Option<&str>, Vec<&str>)>| {
        clock.advance(10);
        assert!(shmtrace_abi::slice_begin!(w, "macro", "slice"));
        assert!(w.instant_at(&TICK));
        assert!(w.slice_begin_at(&WORK));
        assert!(w.slice_end());
        assert!(w.slice_end());
        want.extend([
            (Some("slice"), vec!["macro"]),
            (Some("tick"), vec!["site"]),
            (Some("work"), vec!["site"]),
            (None, vec![]),
            (None, vec![]),
        ]);
    };
    let both = |a: &mut Writer, b: &mut Writer, want_a: &mut Vec<_>, want_b: &mut Vec<_>| {
        round(b, want_b);
        round(a, want_a);
    };
    both(&mut a, &mut b, &mut want_a, &mut want_b);
    both(&mut a, &mut b, &mut want_a, &mut want_b);
    // A clear of `a` only: it interns the sites' strings anew, after
    // another string again, so their ids change on `a` and not on `b`.
    a.clear_incremental_state();
    assert!(a.instant("again", "first"));
    want_a.push((Some("first"), vec!["again"]));
    both(&mut a, &mut b, &mut want_a, &mut want_b);
    // The consumer clears `b`; `b` starts with another string this time.
    b.arbiter_mut().epoch = 1;
    assert!(b.instant("later", "first"));
    want_b.push((Some("first"), vec!["later"]));
    both(&mut a, &mut b, &mut want_a, &mut want_b);
    // A loss on `a` (its next chunk refused): the event is dropped, the
    // sequence starts again.
    a.flush();
    a.arbiter_mut().full = true;
    assert!(!a.instant_at(&TICK));
    a.arbiter_mut().full = false;
    assert!(a.instant("lost", "first"));
    want_a.push((Some("first"), vec!["lost"]));
    both(&mut a, &mut b, &mut want_a, &mut want_b);
    let (seq_a, seq_b) = (read(&mut a), read(&mut b));
    assert_eq!(names(&seq_a), want_a);
    assert_eq!(names(&seq_b), want_b);
    assert_eq!((seq_a.resets.len(), seq_b.resets.len()), (3, 2));
    // The sites' strings had other ids on `a` than on `b`.
    let iids = |seq: &Sequence| -> Vec<(u64, String)> {
        seq.interned
            .iter()
            .filter(|i| i.name == "tick")
            .map(|i| (i.iid, i.name.clone()))
            .collect()
    };
    assert_eq!(iids(&seq_b), [(2, "tick".into()), (3, "tick".into())]);
    assert_eq!(
        iids(&seq_a),
        [(3, "tick".into()), (3, "tick".into()), (3, "tick".into())]
    );
}

/// A site's cached ids never come back to life when the interning
/// generations wrap around (127 clears later).
#[test]
fn call_sites_survive_the_interning_generations_wrapping() {
    static SITE: EventSite = EventSite::new("wrap", "site");
    let mut storage = storage();
    let smb = smb(&mut storage);
    let clock = ManualClock::at(100);
    let mut w: Writer = writer(&smb, &clock, config());
    // Cached as ids (1, 1) in the first generation.
    assert!(w.instant_at(&SITE));
    assert!(w.instant_at(&SITE));
    let mut want = vec![(Some("site"), vec!["wrap"]); 2];
    for _ in 0..127 {
        w.clear_incremental_state();
        // Another string takes ids (1, 1) in every later generation.
        assert!(w.instant("other", "name"));
        want.push((Some("name"), vec!["other"]));
    }
    // The generation now is the first one's again.
    assert!(w.instant_at(&SITE));
    assert!(w.instant_at(&SITE));
    want.extend(vec![(Some("site"), vec!["wrap"]); 2]);
    let seq = read(&mut w);
    assert_eq!(seq.resets.len(), 128);
    assert_eq!(names(&seq), want);
}
