//! The firmware's writer (`shmtrace_abi::track_event::TrackEventWriter`, in
//! place into a real SMB) and this crate's sequences (`SequenceState`,
//! through its `VecWriter` test double with the in-place path on) write the
//! same bytes for the same events: every event packet, interned data
//! included, and every reset packet.
//!
//! The firmware writer is configured as a host one would be: absolute clock
//! BOOTTIME (6), default track = the host sequence's thread track. What
//! differs by design, and so is left out of the comparison:
//!
//! * Track descriptors. After each reset the host describes its thread
//!   track and its process track (pid, tid, names: the UI nests a thread's
//!   events under its process), and its counter tracks are children of the
//!   process track with the host's counter options; firmware has neither
//!   a process nor threads and describes its own default track (a named
//!   track) and plain counter tracks. Their packets sit at the same places
//!   (after the reset, before a track's first event) and are stamped the
//!   same way (absolute, BOOTTIME), but their fields are different.
//! * `first_packet_on_sequence` (field 87): the chunk writer puts it in
//!   front of a sequence's first packet; the host's test double writes no
//!   prefix, so it is stripped from the firmware's first reset packet.
//! * Packets over 127 bytes: the host writes such an event whole (through
//!   its scratch buffer); the firmware writes only packets of at most 127
//!   bytes in place, so it moves new interned strings into packets of their
//!   own, or drops the event. The events generated here stay under 128
//!   bytes (asserted: every host event packet takes at most 127; the host
//!   writes some of them through its scratch buffer, the bytes it writes in
//!   place).

use std::cell::Cell;
use std::rc::Rc;

use proptest::prelude::*;
use proptest::sample::Index;
use prost::Message as _;
use shmtrace_abi::layout::{ChunkHeaderRepr, PageLayout, PageSize};
use shmtrace_abi::reader::{FragmentEvent, Fragments};
use shmtrace_abi::smb::{Smb, SmbStorage, WritableChunk};
use shmtrace_abi::trace::builtin_clock::BOOTTIME;
use shmtrace_abi::track_event::{
    self as fw, ArgValue as FwArg, CounterValue as FwCounter, SequenceConfig,
};
use shmtrace_abi::writer::{BufferId, ChunkArbiter, InPlaceWriter, PatchGroup, PatchesDeferred};

use crate::encoding::event::tests::VecWriter;
use crate::encoding::event::{EventData, EventName, PlainEvent, SequenceState};
use crate::test_schema as ts;
use crate::{
    Arg, Category, CounterTrack, CounterValue, DebugValue, EventType, Flow, ThreadTrack, Timestamp,
};

/// Collects the chunks a firmware writer commits, as a service would read
/// them out of the SMB.
struct Chunks<'s> {
    smb: &'s Smb<'s>,
    chunks: Vec<Vec<u8>>,
}

impl<'s> ChunkArbiter<'s> for Chunks<'s> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        self.smb
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div4, header)
            .ok()
    }

    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, _: BufferId) {
        let loc = chunk.release_as_complete().expect("release");
        let read = self
            .smb
            .try_acquire_chunk_for_reading(loc.page, loc.chunk)
            .expect("a complete chunk");
        let mut bytes = vec![0; read.chunk_size()];
        read.copy_out(&mut bytes).expect("a valid header");
        read.release_as_free().expect("free");
        self.chunks.push(bytes);
    }

    fn send_patches(&mut self, _: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        panic!("an in-place writer sends no patches");
    }

    fn flush(&mut self) {}
}

/// The packets of `chunks`, in order (whole packets only).
fn packets(chunks: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for chunk in chunks {
        let (_, fragments) = Fragments::from_chunk(chunk).expect("a chunk");
        for f in fragments {
            match f.expect("valid fragments") {
                FragmentEvent::Data(f) if f.is_whole_packet() => out.push(f.data.to_vec()),
                other => panic!("not a whole packet: {other:?}"),
            }
        }
    }
    out
}

static CATEGORIES: [Category; 3] = [
    Category::new("io"),
    Category::new("net.rx"),
    Category::new("a"),
];
const COUNTER_NAMES: [&str; 2] = ["load", "temp"];

#[derive(Debug, Clone)]
enum Val {
    Bool(bool),
    Uint(u64),
    Int(i64),
    Double(f64),
    Str(Index),
    Pointer(u64),
}

#[derive(Debug, Clone)]
enum Op {
    /// A slice begin (`begin`) or an instant.
    Named {
        begin: bool,
        category: usize,
        name: Index,
        args: Vec<(Index, Val)>,
        flow: Option<u64>,
        terminating: Option<u64>,
        /// Through each side's general path (EventData / builder).
        general: bool,
    },
    End {
        flow: Option<u64>,
        general: bool,
    },
    Counter {
        track: usize,
        value: i64,
        general: bool,
    },
    CounterF64 {
        track: usize,
        value: f64,
    },
    Advance(u64),
    Back(u64),
    Clear,
}

fn val() -> impl Strategy<Value = Val> {
    prop_oneof![
        any::<bool>().prop_map(Val::Bool),
        any::<u64>().prop_map(Val::Uint),
        any::<i64>().prop_map(Val::Int),
        any::<f64>()
            .prop_filter("comparable", |d| !d.is_nan())
            .prop_map(Val::Double),
        any::<Index>().prop_map(Val::Str),
        any::<u64>().prop_map(Val::Pointer),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (
            any::<bool>(),
            0..CATEGORIES.len(),
            any::<Index>(),
            prop::collection::vec((any::<Index>(), val()), 0..=2),
            prop::option::weighted(0.2, any::<u64>()),
            prop::option::weighted(0.2, any::<u64>()),
            any::<bool>(),
        )
            .prop_map(|(begin, category, name, args, flow, terminating, general)| Op::Named {
                begin,
                category,
                name,
                args,
                flow,
                terminating,
                general,
            }),
        4 => (prop::option::weighted(0.2, any::<u64>()), any::<bool>())
            .prop_map(|(flow, general)| Op::End { flow, general }),
        3 => (0..2usize, any::<i64>(), any::<bool>())
            .prop_map(|(track, value, general)| Op::Counter { track, value, general }),
        2 => (0..2usize, any::<f64>().prop_filter("comparable", |d| !d.is_nan()))
            .prop_map(|(track, value)| Op::CounterF64 { track, value }),
        6 => prop_oneof![0..200u64, 0..(1u64 << 20)].prop_map(Op::Advance),
        1 => (0..10_000u64).prop_map(Op::Back),
        1 => Just(Op::Clear),
    ]
}

/// Names of at most 6 bytes: every generated event fits 127 bytes with
/// its interned data.
fn name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z_]{1,6}", "[é☃λ]{1,2}"]
}

/// `TrackEvent` is field 11 of `TracePacket`.
fn is_event(p: &ts::TracePacket) -> bool {
    p.track_event.is_some()
}

fn compare(pool: Vec<String>, start: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut names: Vec<String> = Vec::new();
    for n in pool {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let names: Vec<&'static str> = names
        .into_iter()
        .map(|s| &*Box::leak(s.into_boxed_str()))
        .collect();
    let pick = |i: &Index| names[i.index(names.len())];
    let thread = ThreadTrack::for_thread(4242);
    let counters: Vec<CounterTrack<'static>> = COUNTER_NAMES
        .iter()
        .map(|&n| CounterTrack::new(n))
        .collect();
    // The firmware's tracks, with the host's uuids.
    let fw_thread: &'static fw::Track =
        Box::leak(Box::new(fw::Track::new("thread").with_uuid(thread.uuid())));
    let fw_counters: Vec<&'static fw::CounterTrack> = counters
        .iter()
        .zip(COUNTER_NAMES)
        .map(|(c, n)| {
            &*Box::leak(Box::new(
                fw::CounterTrack::new(n).with_uuid(c.track().uuid()),
            ))
        })
        .collect();

    let mut host = SequenceState::for_track(thread);
    let mut out = VecWriter::in_place();
    let mut storage = Box::new(SmbStorage::<{ 64 * 1024 }>::new());
    let smb = Smb::new(&mut storage, PageSize::DEFAULT).expect("an SMB");
    let now = Rc::new(Cell::new(start));
    let clock = {
        let now = Rc::clone(&now);
        move || now.get()
    };
    let chunks = Chunks {
        smb: &smb,
        chunks: Vec::new(),
    };
    let mut firmware: fw::TrackEventWriter<'_, _, _, 64> = fw::TrackEventWriter::new(
        InPlaceWriter::new(chunks, 1, 0).expect("a writer"),
        clock,
        SequenceConfig::new(fw_thread).with_clock_id(BOOTTIME),
    );

    for op in &ops {
        let ns = now.get();
        let suppressed_before = host.orphan_ends_suppressed;
        let (host_ok, fw_ok) = match op {
            Op::Named {
                begin,
                category,
                name,
                args,
                flow,
                terminating,
                general,
            } => {
                let category = &CATEGORIES[*category];
                let name = pick(name);
                let kind = if *begin {
                    EventType::SliceBegin
                } else {
                    EventType::Instant
                };
                let host_args: Vec<Arg<'static>> = args
                    .iter()
                    .map(|(n, v)| {
                        let value = match v {
                            Val::Bool(b) => DebugValue::Bool(*b),
                            Val::Uint(u) => DebugValue::Uint(*u),
                            Val::Int(i) => DebugValue::Int(*i),
                            Val::Double(d) => DebugValue::Double(*d),
                            Val::Str(s) => DebugValue::Str(pick(s)),
                            Val::Pointer(p) => DebugValue::Pointer(*p),
                        };
                        Arg::new(pick(n), value)
                    })
                    .collect();
                let flows: Vec<Flow> = flow.iter().map(|&f| Flow::global(f)).collect();
                let ends: Vec<Flow> = terminating.iter().map(|&f| Flow::global(f)).collect();
                let host_ok = if *general || !flows.is_empty() || !ends.is_empty() {
                    let data = EventData {
                        name: EventName::Static(name),
                        args: &host_args,
                        flows: &flows,
                        terminating_flows: &ends,
                        ..EventData::new(kind, Some(category), Timestamp::boottime(ns))
                    };
                    host.write_event(&mut out, &data, None)
                } else {
                    let plain = PlainEvent {
                        kind,
                        category,
                        name,
                        args: &host_args,
                        track: None,
                        value: 0,
                        ns,
                    };
                    match (kind, host_args.is_empty()) {
                        (EventType::SliceBegin, true) => host.write_plain::<1, _>(&mut out, &plain),
                        (EventType::SliceBegin, false) => {
                            host.write_plain_args::<1, _>(&mut out, &plain)
                        }
                        (_, true) => host.write_plain::<3, _>(&mut out, &plain),
                        (_, false) => host.write_plain_args::<3, _>(&mut out, &plain),
                    }
                };
                let fw_ok =
                    if *general || !args.is_empty() || flow.is_some() || terminating.is_some() {
                        let mut b = firmware.event(kind, category.name(), name);
                        for (n, v) in args {
                            let value = match v {
                                Val::Bool(b) => FwArg::Bool(*b),
                                Val::Uint(u) => FwArg::Uint(*u),
                                Val::Int(i) => FwArg::Int(*i),
                                Val::Double(d) => FwArg::Double(*d),
                                Val::Str(s) => FwArg::Str(pick(s)),
                                Val::Pointer(p) => FwArg::Pointer(*p),
                            };
                            b = b.arg(pick(n), value);
                        }
                        if let Some(f) = flow {
                            b = b.flow(*f);
                        }
                        if let Some(f) = terminating {
                            b = b.terminating_flow(*f);
                        }
                        b.emit()
                    } else if *begin {
                        firmware.slice_begin(category.name(), name)
                    } else {
                        firmware.instant(category.name(), name)
                    };
                (host_ok, fw_ok)
            }
            Op::End { flow, general } => {
                let flows: Vec<Flow> = flow.iter().map(|&f| Flow::global(f)).collect();
                let host_ok = if *general || flow.is_some() {
                    let data = EventData {
                        flows: &flows,
                        ..EventData::new(
                            EventType::SliceEnd,
                            Some(&CATEGORIES[0]),
                            Timestamp::boottime(ns),
                        )
                    };
                    host.write_event(&mut out, &data, None)
                } else {
                    let plain = PlainEvent {
                        kind: EventType::SliceEnd,
                        category: &CATEGORIES[0],
                        name: "",
                        args: &[],
                        track: None,
                        value: 0,
                        ns,
                    };
                    host.write_plain::<2, _>(&mut out, &plain)
                };
                let fw_ok = if *general || flow.is_some() {
                    let mut b = firmware.event(EventType::SliceEnd, "", "");
                    if let Some(f) = flow {
                        b = b.flow(*f);
                    }
                    b.emit()
                } else {
                    firmware.slice_end()
                };
                (host_ok, fw_ok)
            }
            Op::Counter {
                track,
                value,
                general,
            } => {
                let host_ok = if *general {
                    let data = EventData {
                        track: Some(counters[*track].track()),
                        counter: Some(CounterValue::Int(*value)),
                        ..EventData::new(EventType::Counter, None, Timestamp::boottime(ns))
                    };
                    host.write_event(&mut out, &data, None)
                } else {
                    let plain = PlainEvent {
                        kind: EventType::Counter,
                        category: &CATEGORIES[0],
                        name: "",
                        args: &[],
                        track: Some(counters[*track].track()),
                        value: *value,
                        ns,
                    };
                    host.write_plain::<4, _>(&mut out, &plain)
                };
                let fw_ok = if *general {
                    firmware
                        .event(EventType::Counter, "", "")
                        .counter(fw_counters[*track], FwCounter::Int(*value))
                        .emit()
                } else {
                    firmware.counter(fw_counters[*track], *value)
                };
                (host_ok, fw_ok)
            }
            Op::CounterF64 { track, value } => {
                let data = EventData {
                    track: Some(counters[*track].track()),
                    counter: Some(CounterValue::Double(*value)),
                    ..EventData::new(EventType::Counter, None, Timestamp::boottime(ns))
                };
                let host_ok = host.write_event(&mut out, &data, None);
                (host_ok, firmware.counter_f64(fw_counters[*track], *value))
            }
            Op::Advance(d) => {
                now.set(ns + d);
                continue;
            }
            Op::Back(d) => {
                now.set(ns.saturating_sub(*d));
                continue;
            }
            Op::Clear => {
                host.invalidate();
                firmware.clear_incremental_state();
                continue;
            }
        };
        // The host's `true` means "nothing lost", the firmware's "written":
        // they differ for an end with no open slice, which neither writes.
        let suppressed = host.orphan_ends_suppressed > suppressed_before;
        prop_assert!(host_ok, "{:?}", op);
        prop_assert_eq!(fw_ok, !suppressed, "{:?}", op);
    }
    prop_assert_eq!(firmware.stats().events_dropped, 0);
    firmware.flush();
    let fw_packets = packets(&firmware.arbiter().chunks);
    let host_packets = out.packets.clone();
    let decode = |b: &Vec<u8>| ts::TracePacket::decode(&b[..]).expect("a packet");
    let keep = |packets: &[Vec<u8>]| -> Vec<Vec<u8>> {
        packets
            .iter()
            .filter(|b| decode(b).track_descriptor.is_none())
            .cloned()
            .collect()
    };
    let mut fw_kept = keep(&fw_packets);
    let host_kept = keep(&host_packets);
    // Field 87 (first_packet_on_sequence = true) in front of the first.
    if let Some(first) = fw_kept.first_mut() {
        prop_assert_eq!(&first[..3], &[0xB8, 0x05, 0x01]);
        first.drain(..3);
    }
    for b in host_kept.iter().filter(|b| is_event(&decode(b))) {
        prop_assert!(b.len() <= 127, "an event over 127 bytes: {:?}", decode(b));
    }
    prop_assert_eq!(fw_kept.len(), host_kept.len());
    for (i, (f, h)) in fw_kept.iter().zip(&host_kept).enumerate() {
        prop_assert_eq!(
            f,
            h,
            "packet {} (of the resets and events)\nfirmware {:?}\nhost     {:?}",
            i,
            decode(f),
            decode(h)
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn firmware_and_host_write_the_same_event_bytes(
        pool in prop::collection::vec(name(), 1..8),
        start in 0..(1u64 << 30),
        ops in prop::collection::vec(op(), 1..100),
    ) {
        compare(pool, start, ops)?;
    }
}
