//! Tests of the track event encoder: the fast encoders against the
//! general path and the workspace's encoder, and the sequence's
//! incremental state.

use super::fast::{put_arg_value, put_varint, ArgBytes};
#[cfg(feature = "tracing")]
use super::streamed::{FieldKey, FieldValue, FlatFields, FlatOut};
use super::*;
use crate::encoding::annotation::DebugValue;
use crate::test_schema::{self as ts, Interned};
use crate::track_event::track::{ChildOrdering, CounterTrack, CounterUnit, ProcessTrack};
use proptest::prelude::*;
use prost::Message as _;
use shmtrace_abi::proto::encode_to_slice;
use shmtrace_abi::proto::wire::redundant_varint4;
use shmtrace_abi::proto::Encoder;

/// The fast path's varint and debug annotation writers produce the
/// bytes of the cursor's own `varint` and of `encode::arg_value`, at
/// every varint length and every string length up to 52, and an
/// annotation value's size ([`ArgBytes::len`]) is what its writer wrote.
#[test]
fn inlined_writers_match_the_cursors() {
    fn bytes(f: impl FnOnce(&mut Cursor<&mut Scratch>)) -> Vec<u8> {
        let mut buf = [0u8; FAST_CAP + TARGET_SLACK];
        let mut c = Cursor::new(&mut buf);
        f(&mut c);
        let n = c.finish().expect("fits");
        buf[..n].to_vec()
    }
    use encode::ArgValue as A;
    let mut values = vec![0u64, u64::MAX, -10i64 as u64, 0x8123_4567_89AB_CDEF];
    for shift in 0..64 {
        values.extend([
            (1u64 << shift) - 1,
            1u64 << shift,
            0x5555_5555_5555_5555 >> shift,
        ]);
    }
    for v in values {
        assert_eq!(bytes(|c| put_varint(c, v)), bytes(|c| c.varint(v)), "{v}");
        for arg in [A::Uint(v), A::Int(v as i64), A::Pointer(v)] {
            let got = bytes(|c| put_arg_value(c, arg));
            assert_eq!(got, bytes(|c| encode::arg_value(c, arg)), "{arg:?}");
            assert_eq!(
                ArgBytes::with::<false, _>(arg, ArgBytes::len),
                got.len(),
                "{arg:?}"
            );
        }
    }
    let long = "s".repeat(200);
    for arg in [
        A::Bool(true),
        A::Bool(false),
        A::Double(-1.5),
        A::Str(""),
        A::Str("value"),
        A::Str(&long),
    ] {
        let got = bytes(|c| put_arg_value(c, arg));
        assert_eq!(got, bytes(|c| encode::arg_value(c, arg)), "{arg:?}");
        assert_eq!(
            ArgBytes::with::<false, _>(arg, ArgBytes::len),
            got.len(),
            "{arg:?}"
        );
    }
    // Strings of every length up to and past the word-store copies
    // (`put_short_bytes`), after a byte so the stores are unaligned.
    let text: String = ('a'..='z').chain('A'..='Z').collect();
    for n in 0..=text.len() {
        let arg = A::Str(&text[..n]);
        assert_eq!(
            ArgBytes::with::<false, _>(arg, ArgBytes::len),
            2 + n,
            "{n} bytes"
        );
        assert_eq!(
            bytes(|c| {
                c.byte(0xEE);
                put_arg_value(c, arg)
            }),
            bytes(|c| {
                c.byte(0xEE);
                encode::arg_value(c, arg)
            }),
            "{n} bytes"
        );
    }
}

/// Collects packets into byte vectors; drops the packets whose index is
/// in `drop`.
#[derive(Default)]
pub(crate) struct VecWriter {
    pub(crate) packets: Vec<Vec<u8>>,
    drop: Vec<usize>,
    attempts: usize,
    /// Accept packets encoded in place.
    in_place: bool,
    /// Packets that were.
    pub(crate) in_place_packets: usize,
    /// Packets encoded in place (written or not).
    in_place_tries: usize,
    /// Lose the next packet (as a full SMB would: no room in place,
    /// dropped by the general path).
    lose_next: bool,
    /// No chunk to give: `ensure_chunk` fails (and counts its calls).
    full: bool,
    ensure_failures: usize,
}

/// A growable sink writing every nested size as a 4-byte redundant
/// varint (valid protobuf, like a chunk writer's output).
#[derive(Default)]
pub(crate) struct VecSink(pub(crate) Vec<u8>);

impl Sink for VecSink {
    type Slot = usize;
    fn write(&mut self, bytes: &[u8], _open: &mut [usize]) {
        self.0.extend_from_slice(bytes);
    }
    fn reserve_size_field(&mut self, _open: &mut [usize]) -> usize {
        self.0.extend_from_slice(&[0; 4]);
        self.0.len() - 4
    }
    fn position(&self) -> u32 {
        self.0.len() as u32
    }
    fn fill_size_field(&mut self, slot: usize, size: u32) {
        self.0[slot..slot + 4].copy_from_slice(&redundant_varint4(size));
    }
}

impl PacketWriter for VecWriter {
    type Sink = VecSink;
    type Window<'w> = &'w mut Scratch;

    fn ensure_chunk(&mut self) -> bool {
        self.ensure_failures += usize::from(self.full);
        !self.full
    }

    /// Like a chunk with room, if `in_place` is set.
    fn write_in_place(&mut self, encode: impl FnOnce(&mut Cursor<&mut Scratch>) -> bool) -> bool {
        if !self.in_place || self.lose_next {
            return false;
        }
        let mut window = [0u8; FAST_CAP + TARGET_SLACK];
        let mut c = Cursor::new(&mut window);
        self.in_place_tries += 1;
        if !encode(&mut c) {
            return false;
        }
        match c.finish().filter(|&n| n <= 127) {
            Some(n) => {
                self.in_place_packets += 1;
                self.packets.push(window[..n].to_vec());
                true
            }
            None => false,
        }
    }

    fn write_packet(&mut self, f: impl FnOnce(&mut Message<'_, Self::Sink>)) -> bool {
        let index = self.attempts;
        self.attempts += 1;
        if std::mem::take(&mut self.lose_next) {
            return false;
        }
        let mut enc = Encoder::new(VecSink::default());
        f(&mut enc.root());
        assert_eq!(enc.error(), None);
        let bytes = enc.into_sink().0;
        if self.drop.contains(&index) {
            return false;
        }
        self.packets.push(bytes);
        true
    }
}

impl VecWriter {
    /// A writer taking packets in place (as a chunk with room would).
    pub(crate) fn in_place() -> Self {
        VecWriter {
            in_place: true,
            ..Default::default()
        }
    }

    /// The decoded packets: how many track descriptors (which a flat
    /// encoder and the general path may write in another order), and the
    /// others.
    #[cfg(feature = "tracing")]
    fn decoded_apart(&self) -> (usize, Vec<ts::TracePacket>) {
        let (d, rest): (Vec<_>, Vec<_>) = self
            .decoded()
            .into_iter()
            .partition(|p| p.track_descriptor.is_some());
        (d.len(), rest)
    }

    fn decoded(&self) -> Vec<ts::TracePacket> {
        self.packets
            .iter()
            .map(|b| ts::TracePacket::decode(&b[..]).expect("valid TracePacket"))
            .collect()
    }
}

static CAT: Category = Category::new("cat");
static GROUP: Category = Category::new("a,b");

fn ev(kind: EventType, name: EventName<'static>) -> EventData<'static> {
    let mut e = EventData::new(kind, Some(&CAT), Timestamp::boottime(1000));
    e.name = name;
    e
}

fn seq() -> SequenceState {
    SequenceState::for_track(ThreadTrack::for_thread(4242))
}

/// The dedicated encoder of plain events writes what the general path
/// writes (as decoded packets), and hands over to it whenever state is
/// missing: first uses of strings and tracks, groups, orphan ends, time
/// going backwards, resets, lost packets, annotations too long for a
/// window.
#[test]
fn plain_events_match_the_general_path() {
    let counter = CounterTrack::new("c");
    let other = CounterTrack::new("d");
    let long = "x".repeat(150);
    let flat = [Arg::new("k", 7u64), Arg::new("label", "text")];
    let scalars = [
        Arg::new("neg", -3i64),
        Arg::new("big", u64::MAX),
        Arg::new("b", true),
        Arg::new("d", 1.5f64),
        Arg {
            name: ArgName::Static("p"),
            value: DebugValue::Pointer(0xdead_beef),
        },
        Arg::new("empty", ""),
    ];
    let too_long = [Arg::new("k", 1u64), Arg::new("s", long.as_str())];
    let plain = |kind, category: &'static Category, name, ns| PlainEvent {
        kind,
        category,
        name,
        args: &[],
        track: None,
        value: 0,
        ns,
    };
    let count = |track, value, ns| PlainEvent {
        track: Some(track),
        value,
        ..plain(EventType::Counter, &CAT, "", ns)
    };
    let mut events = Vec::new();
    let mut ns = 1_000;
    // Ids past 127 (two-byte varints): 130 names, each used twice.
    let many: Vec<&'static str> = (0..130)
        .map(|i| &*Box::leak(format!("n{i}").into_boxed_str()))
        .collect();
    for name in many.iter().chain(&many) {
        ns += 5;
        events.push(plain(EventType::Instant, &CAT, name, ns));
    }
    for round in 0..3u64 {
        for name in ["a", "b", "a"] {
            ns += 70;
            events.push(plain(EventType::SliceBegin, &CAT, name, ns));
            ns += 200 + round * 100_000;
            events.push(plain(EventType::Instant, &CAT, "i", ns));
            events.push(plain(EventType::Instant, &GROUP, "i", ns));
            events.push(count(counter.track(), -5 - round as i64, ns));
            events.push(count(counter.track(), i64::MAX, ns + 1));
            events.push(count(other.track(), 3, ns + 2));
            for args in [&flat[..], &scalars[..], &too_long[..], &flat[..]] {
                ns += 3;
                events.push(PlainEvent {
                    args,
                    ..plain(EventType::Instant, &CAT, "i", ns)
                });
            }
            events.push(PlainEvent {
                args: &flat,
                ..plain(EventType::SliceBegin, &CAT, "a", ns + 1)
            });
            events.push(PlainEvent {
                args: &scalars,
                ..plain(EventType::Instant, &GROUP, "i", ns + 1)
            });
            ns += 9;
            events.push(plain(EventType::SliceEnd, &CAT, "", ns));
            ns += 9;
            events.push(plain(EventType::SliceEnd, &CAT, "", ns));
        }
        // An orphan end, and time going backwards.
        events.push(plain(EventType::SliceEnd, &CAT, "", ns));
        events.push(plain(EventType::Instant, &CAT, "a", ns - 500));
    }
    let mut fast = seq();
    let mut general = seq();
    let mut a = VecWriter {
        in_place: true,
        ..Default::default()
    };
    let mut b = VecWriter::default();
    for (i, e) in events.iter().enumerate() {
        if i == 300 {
            fast.invalidate();
            general.invalidate();
        }
        if i == 310 {
            a.lose_next = true;
            b.lose_next = true;
        }
        let ok_a = match e.kind {
            EventType::SliceBegin if !e.args.is_empty() => fast.write_plain_args::<1, _>(&mut a, e),
            EventType::Instant if !e.args.is_empty() => fast.write_plain_args::<3, _>(&mut a, e),
            EventType::SliceBegin => fast.write_plain::<1, _>(&mut a, e),
            EventType::SliceEnd => fast.write_plain::<2, _>(&mut a, e),
            EventType::Instant => fast.write_plain::<3, _>(&mut a, e),
            EventType::Counter => fast.write_plain::<4, _>(&mut a, e),
        };
        let ok_b = general.write_event(&mut b, &e.data(), None);
        assert_eq!(ok_a, ok_b, "event {i}");
    }
    // Descriptor packets carry the process name, which another test may
    // change between the two sequences' resets: compare them by count.
    // The plain path writes a new string in a packet of its own before
    // its event (as the firmware's writer does), the general path in the
    // event's `interned_data`: the plain path's are moved into the event
    // that follows them, which must not carry any of its own.
    let split = |w: &VecWriter, fold: bool| {
        let (d, rest): (Vec<_>, Vec<_>) = w
            .decoded()
            .into_iter()
            .partition(|p| p.track_descriptor.is_some());
        let mut out: Vec<ts::TracePacket> = Vec::new();
        let mut pending: Option<ts::InternedData> = None;
        for mut p in rest {
            if fold && p.track_event.is_none() && p.interned_data.is_some() {
                assert_eq!(p.sequence_flags, Some(2), "{p:?}");
                let data = p.interned_data.take().unwrap_or_default();
                assert_eq!(
                    p,
                    ts::TracePacket {
                        sequence_flags: Some(2),
                        ..Default::default()
                    }
                );
                let all = pending.get_or_insert_with(Default::default);
                all.event_categories.extend(data.event_categories);
                all.event_names.extend(data.event_names);
                all.debug_annotation_names
                    .extend(data.debug_annotation_names);
                continue;
            }
            if let Some(data) = pending.take() {
                assert!(
                    p.track_event.is_some() && p.interned_data.is_none(),
                    "{p:?}"
                );
                p.interned_data = Some(data);
            }
            out.push(p);
        }
        assert!(pending.is_none(), "interned data with no event after it");
        (d.len(), out)
    };
    let (folded, written) = (split(&a, true), split(&b, false));
    assert!(
        a.packets.len() > b.packets.len(),
        "no packet of interned data alone"
    );
    assert_eq!(folded, written);
    assert_eq!(fast.orphan_ends_suppressed, general.orphan_ends_suppressed);
    assert!(fast.orphan_ends_suppressed >= 3);
    assert!(
        a.in_place_packets > events.len() / 2,
        "the dedicated encoder wrote {} of {} events",
        a.in_place_packets,
        events.len()
    );
}

/// Once their names are interned, flat annotations are encoded by the
/// dedicated encoder, with one-byte nested lengths, and decode to the
/// annotations given.
#[test]
fn flat_annotations_take_the_dedicated_encoder() {
    let args = [
        Arg::new("count", 300u64),
        Arg::new("label", "value"),
        Arg::new("neg", -1i64),
    ];
    let event = |ns| PlainEvent {
        kind: EventType::SliceBegin,
        category: &CAT,
        name: "slice",
        args: &args,
        track: None,
        value: 0,
        ns,
    };
    let mut s = seq();
    let mut w = VecWriter {
        in_place: true,
        ..Default::default()
    };
    // The first one interns the names (general path).
    assert!(!s.try_write_plain_args::<1, _>(&mut w, &event(1_000)));
    assert!(s.write_plain_args::<1, _>(&mut w, &event(1_000)));
    let before = w.packets.len();
    assert!(s.try_write_plain_args::<1, _>(&mut w, &event(1_010)));
    assert_eq!(w.packets.len(), before + 1);
    let bytes = w.packets.last().unwrap().clone();
    // timestamp delta 10, sequence flags 2, TrackEvent with a 1-byte
    // length, type SLICE_BEGIN.
    assert_eq!(bytes[..4], [0x40, 10, 0x68, 2]);
    assert_eq!(bytes[4], 0x5A);
    assert_eq!(usize::from(bytes[5]), bytes.len() - 6);
    assert_eq!(bytes[6..8], [0x48, 1]);
    let p = w.decoded().pop().unwrap();
    let te = p.track_event.expect("a track event");
    assert_eq!(te.r#type, Some(1));
    assert!(te.name_iid.is_some() && !te.category_iids.is_empty());
    let got: Vec<_> = te
        .debug_annotations
        .iter()
        .map(|a| {
            (
                a.name_iid,
                a.uint_value,
                a.string_value.clone(),
                a.int_value,
            )
        })
        .collect();
    let first = got[0].0.expect("interned name");
    assert_eq!(
        got,
        vec![
            (Some(first), Some(300), None, None),
            (Some(first + 1), None, Some("value".into()), None),
            (Some(first + 2), None, None, Some(-1)),
        ]
    );
    assert_eq!(p.sequence_flags, Some(SEQ_NEEDS_INCREMENTAL_STATE));
    // A nested annotation is not flat, nor is a name made at run time
    // interned: the general path writes them (write_plain_args hands
    // them over).
    let entries = [("x", DebugValue::Uint(1))];
    let nested = [
        Arg::new("count", 1u64),
        Arg::new("d", DebugValue::Dict(&entries)),
    ];
    let dynamic = [
        Arg::new("count", 2u64),
        Arg {
            name: ArgName::Dynamic("made"),
            value: DebugValue::Uint(3),
        },
    ];
    for (args, ns) in [(&nested, 1_020), (&dynamic, 1_030)] {
        let e = PlainEvent { args, ..event(ns) };
        assert!(!s.try_write_plain_args::<1, _>(&mut w, &e));
        assert!(s.write_plain_args::<1, _>(&mut w, &e));
    }
    let p = w.decoded();
    let [.., nested, dynamic] = &p[..] else {
        panic!("{p:?}")
    };
    let nested = &nested.track_event.as_ref().unwrap().debug_annotations;
    assert_eq!(nested[0].uint_value, Some(1));
    assert_eq!(nested[1].dict_entries[0].uint_value, Some(1));
    let dynamic = &dynamic.track_event.as_ref().unwrap().debug_annotations;
    assert_eq!(dynamic[0].uint_value, Some(2));
    assert_eq!(dynamic[1].name.as_deref(), Some("made"));
    assert_eq!(dynamic[1].uint_value, Some(3));
}

/// `N` names made for a test (`prefix` and a number, at addresses of
/// their own) whose front-cache slots `group` maps to one value.
fn names_sharing<const N: usize>(
    prefix: &str,
    group: impl Fn(usize) -> usize,
) -> [&'static str; N] {
    let mut by_group: std::collections::HashMap<usize, Vec<&'static str>> = Default::default();
    for i in 0.. {
        let s: &'static str = Box::leak(format!("{prefix}{i}").into_boxed_str());
        let names = by_group
            .entry(group(crate::encoding::intern::cache_slot(s)))
            .or_default();
        names.push(s);
        if let Ok(names) = <[&'static str; N]>::try_from(names.as_slice()) {
            return names;
        }
    }
    unreachable!("names without end")
}

/// Plain events with flat annotations (`write_plain_args`) of any size
/// (up to 8 annotations tried in place, more encoded into the scratch
/// buffer at once; texts of 128 bytes or more; names whose front-cache
/// slots other names hold) are the same bytes whether written in place or
/// through the scratch buffer, every length as short as it goes, and
/// decode as the general path's packets.
#[test]
fn wide_plain_events_match_in_place_and_copied() {
    // Three annotation names of one pair of front-cache slots (two ways):
    // one of them is never found there.
    let colliding: [_; 3] = names_sharing("c", |slot| slot & !1);
    let long = "x".repeat(150);
    let wide = [
        Arg::new("level", "INFO"),
        Arg::new("message", "a literal message of forty-three bytes here"),
        Arg::new("count", 7u64),
        Arg::new("label", "value"),
        Arg::new("index", 300u64),
        Arg::new("kind", "wide"),
        Arg::new("ok", true),
        Arg::new("total", 1u64 << 40),
        Arg::new("ratio", 0.5f64),
        Arg::new("delta", -10i64),
        Arg {
            name: ArgName::Static("p"),
            value: DebugValue::Pointer(0xdead_beef),
        },
        Arg::new(colliding[0], 1u64),
        Arg::new(colliding[1], 2u64),
        Arg::new(colliding[2], 3u64),
    ];
    let long_text = [Arg::new("count", 1u64), Arg::new("text", long.as_str())];
    let few = [Arg::new("count", 2u64), Arg::new("label", "value")];
    // Messages of 20 to 68 bytes and back: packets across 128 bytes.
    let message = "a literal message of forty-three bytes here and then some more text";
    let sweep: Vec<[Arg<'_>; 6]> = (20..=message.len())
        .chain((20..message.len()).rev())
        .map(|n| {
            [
                Arg::new("level", "INFO"),
                Arg::new("message", &message[..n]),
                Arg::new("count", 5u64),
                Arg::new("label", "sixteen bytes..."),
                Arg::new("kind", "sixteen bytes..."),
                Arg::new("ratio", 1.5f64),
            ]
        })
        .collect();
    let mut shapes: Vec<&[Arg<'_>]> = vec![&wide, &long_text, &few];
    shapes.extend(sweep.iter().map(|a| &a[..]));
    let (mut in_place, mut copied, mut general) = (seq(), seq(), seq());
    let (mut a, mut b, mut c) = (
        VecWriter::in_place(),
        VecWriter::default(),
        VecWriter::default(),
    );
    let mut ns = 1_000;
    for round in 0..3 {
        for (i, args) in shapes.iter().enumerate() {
            // Deltas of one, two and three bytes.
            ns += [100, 1_000, 20_000][round];
            let e = PlainEvent {
                kind: if i % 2 == 0 {
                    EventType::Instant
                } else {
                    EventType::SliceBegin
                },
                category: &CAT,
                name: "event",
                args,
                track: None,
                value: 0,
                ns,
            };
            let (ok_a, ok_b) = match e.kind {
                EventType::Instant => (
                    in_place.write_plain_args::<3, _>(&mut a, &e),
                    copied.write_plain_args::<3, _>(&mut b, &e),
                ),
                _ => (
                    in_place.write_plain_args::<1, _>(&mut a, &e),
                    copied.write_plain_args::<1, _>(&mut b, &e),
                ),
            };
            assert!(ok_a && ok_b);
            assert!(general.write_event(&mut c, &e.data(), None));
            if e.kind == EventType::SliceBegin {
                ns += 1;
                let mut end = ev(EventType::SliceEnd, EventName::None);
                end.timestamp = Timestamp::boottime(ns);
                for (s, w) in [
                    (&mut in_place, &mut a),
                    (&mut copied, &mut b),
                    (&mut general, &mut c),
                ] {
                    assert!(s.write_event(w, &end, None));
                }
            }
        }
    }
    // (The slice ends, which the general path writes, take a two-byte
    // length where they are not written in place.)
    let not_ends = |w: &VecWriter| -> Vec<Vec<u8>> {
        w.packets
            .iter()
            .zip(w.decoded())
            .filter(|(_, d)| {
                d.track_event.as_ref().and_then(|t| t.r#type) != Some(EventType::SliceEnd as i32)
            })
            .map(|(p, _)| p.clone())
            .collect()
    };
    let (x, y) = (not_ends(&a), not_ends(&b));
    assert_eq!(x.len(), y.len());
    if let Some(i) = (0..x.len()).find(|&i| x[i] != y[i]) {
        panic!("packet {i}: {:?} in place, {:?} copied", x[i], y[i]);
    }
    assert_eq!(a.decoded(), c.decoded());
    // Every event's lengths as short as they go (but the first uses of
    // names, which the general path writes): some of 128 bytes or more,
    // some shorter in a packet longer than 127 bytes; short ones in place.
    let (long, band) = lengths_as_short_as_they_go(&a);
    assert!(
        long >= 3 * 20 && band >= 3,
        "{long} long, {band} in between"
    );
    assert!(
        a.in_place_packets >= 3 * 40,
        "{} in place",
        a.in_place_packets
    );
}

#[test]
fn timestamps_are_deltas_on_clock_64() {
    let mut w = VecWriter::default();
    let mut s = seq();
    let mut at = |s: &mut SequenceState, clock, ns| {
        let mut e = ev(EventType::Instant, "t".into());
        e.timestamp = Timestamp { clock, ns };
        assert!(s.write_event(&mut w, &e, None));
    };
    at(&mut s, Clock::Boottime, 1000);
    at(&mut s, Clock::Boottime, 1500);
    at(&mut s, Clock::Boottime, 1200); // before the previous event
    at(&mut s, Clock::Monotonic, 7);
    at(&mut s, Clock::Boottime, 1600);
    s.invalidate();
    at(&mut s, Clock::Boottime, 5000);
    at(&mut s, Clock::Boottime, 5001);
    let p = w.decoded();
    // Reset: stamped on BOOTTIME, clock 64 defined as BOOTTIME then,
    // and made the default.
    let reset = &p[0];
    assert_eq!(
        (reset.timestamp, reset.timestamp_clock_id),
        (Some(1000), Some(6))
    );
    let defaults = reset.trace_packet_defaults.as_ref().unwrap();
    assert_eq!(defaults.timestamp_clock_id, Some(INCREMENTAL_CLOCK_ID));
    let clocks = &reset.clock_snapshot.as_ref().unwrap().clocks;
    assert_eq!(clocks.len(), 2);
    assert_eq!(
        (clocks[0].clock_id, clocks[0].timestamp),
        (Some(6), Some(1000))
    );
    assert_eq!(
        (
            clocks[1].clock_id,
            clocks[1].timestamp,
            clocks[1].is_incremental
        ),
        (Some(64), Some(1000), Some(true))
    );
    // Descriptors: absolute on BOOTTIME.
    for d in &p[1..3] {
        assert_eq!((d.timestamp, d.timestamp_clock_id), (Some(1000), Some(6)));
    }
    let stamps: Vec<_> = p
        .iter()
        .filter(|p| p.track_event.is_some())
        .map(|p| (p.timestamp.unwrap(), p.timestamp_clock_id))
        .collect();
    assert_eq!(
        stamps,
        [
            (0, None),
            (500, None),
            (1200, Some(6)), // backwards: absolute, base unchanged
            (7, Some(3)),
            (100, None),
            (0, None), // after the second reset (at 5000)
            (1, None),
        ]
    );
    let second_reset = p
        .iter()
        .rposition(|p| p.sequence_flags == Some(sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED))
        .unwrap();
    let clocks = &p[second_reset].clock_snapshot.as_ref().unwrap().clocks;
    assert_eq!(clocks[1].timestamp, Some(5000));
}

#[test]
fn first_packets_reset_the_sequence() {
    let mut w = VecWriter::default();
    let mut s = seq();
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "hello".into()), None));
    let p = w.decoded();
    assert_eq!(
        p.len(),
        4,
        "reset, thread descriptor, process descriptor, event"
    );
    assert_eq!(
        p[0].sequence_flags,
        Some(sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED)
    );
    let defaults = p[0].trace_packet_defaults.as_ref().unwrap();
    assert_eq!(
        defaults.track_event_defaults.as_ref().unwrap().track_uuid,
        Some(4242 ^ crate::process_uuid())
    );
    let thread = p[1].track_descriptor.as_ref().unwrap();
    assert_eq!(thread.uuid, Some(4242 ^ crate::process_uuid()));
    assert_eq!(thread.thread.as_ref().unwrap().tid, Some(4242));
    assert_eq!(
        thread.thread.as_ref().unwrap().pid,
        Some(crate::current_pid())
    );
    let process = p[2].track_descriptor.as_ref().unwrap();
    assert_eq!(process.uuid, Some(crate::process_uuid()));
    assert_eq!(
        process.process.as_ref().unwrap().pid,
        Some(crate::current_pid())
    );
    assert!(!process.process.as_ref().unwrap().cmdline.is_empty());
    let e = &p[3];
    assert_eq!(e.sequence_flags, Some(SEQ_NEEDS_INCREMENTAL_STATE));
    // A delta on clock 64 (defined at 1000 by the reset packet).
    assert_eq!(e.timestamp, Some(0));
    assert_eq!(e.timestamp_clock_id, None);
    let te = e.track_event.as_ref().unwrap();
    assert_eq!(te.r#type, Some(EventType::Instant as i32));
    assert_eq!(te.track_uuid, None, "thread track comes from the defaults");
    assert_eq!(te.name_iid, Some(1));
    assert_eq!(te.category_iids, vec![1]);
    let data = e.interned_data.as_ref().unwrap();
    assert_eq!(data.event_names[0].iid, Some(1));
    assert_eq!(data.event_names[0].name.as_deref(), Some("hello"));
    assert_eq!(data.event_categories[0].name.as_deref(), Some("cat"));
}

#[test]
fn interning_reuses_ids_and_restarts_after_clear() {
    let mut w = VecWriter::default();
    let mut s = seq();
    for name in ["a", "b", "a"] {
        assert!(s.write_event(
            &mut w,
            &ev(EventType::SliceBegin, EventName::Static(name)),
            None
        ));
    }
    let p = w.decoded();
    let events: Vec<_> = p.iter().filter(|p| p.track_event.is_some()).collect();
    let iids: Vec<_> = events
        .iter()
        .map(|p| p.track_event.as_ref().unwrap().name_iid.unwrap())
        .collect();
    assert_eq!(iids, [1, 2, 1]);
    assert!(
        events[2].interned_data.is_none(),
        "known strings are not re-emitted"
    );
    assert_eq!(
        events[1].interned_data.as_ref().unwrap().event_names.len(),
        1
    );
    assert!(events[1]
        .interned_data
        .as_ref()
        .unwrap()
        .event_categories
        .is_empty());

    s.invalidate();
    w.packets.clear();
    assert!(s.write_event(
        &mut w,
        &ev(EventType::SliceBegin, EventName::Static("b")),
        None
    ));
    let p = w.decoded();
    assert_eq!(
        p[0].sequence_flags,
        Some(sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED)
    );
    let e = p.last().unwrap();
    assert_eq!(
        e.track_event.as_ref().unwrap().name_iid,
        Some(1),
        "ids restart at 1"
    );
    assert_eq!(
        e.interned_data.as_ref().unwrap().event_names[0]
            .name
            .as_deref(),
        Some("b")
    );
    assert_eq!(s.resets, 2);
}

#[test]
fn losses_before_the_first_packet_are_marked_after_it() {
    // The first two attempts (a reset, then the next event's reset) are
    // lost before anything was written.
    let mut w = VecWriter {
        drop: vec![0, 1],
        ..Default::default()
    };
    let mut s = seq();
    assert!(!s.write_event(&mut w, &ev(EventType::Instant, "a".into()), None));
    assert!(!s.write_event(&mut w, &ev(EventType::Instant, "b".into()), None));
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "c".into()), None));
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "d".into()), None));
    let p = w.decoded();
    // A plain first packet, then the reset carrying the loss mark.
    assert_eq!(
        p[0],
        ts::TracePacket {
            timestamp: Some(1000),
            ..Default::default()
        }
    );
    assert_eq!(
        p[1].sequence_flags,
        Some(sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED)
    );
    assert_eq!(p[1].previous_packet_dropped, Some(257));
    assert_eq!(p.len(), 1 + 3 + 2);
    assert!(p[2..].iter().all(|x| x.previous_packet_dropped.is_none()));
    // Later losses are marked by the writer itself (not here).
    let mut w = VecWriter::default();
    let mut s = seq();
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "a".into()), None));
    assert_eq!(
        w.decoded()[0].sequence_flags,
        Some(sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED),
        "no preamble without loss"
    );
}

#[test]
fn a_lost_packet_resets_the_sequence() {
    let mut w = VecWriter {
        drop: vec![4],
        ..Default::default()
    };
    let mut s = seq();
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "x".into()), None)); // packets 0..=3
    assert!(!s.write_event(&mut w, &ev(EventType::Instant, "y".into()), None)); // 4 dropped
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "y".into()), None));
    let p = w.decoded();
    // 4 packets, then a new reset + 2 descriptors + the event.
    assert_eq!(p.len(), 8);
    assert_eq!(
        p[4].sequence_flags,
        Some(sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED)
    );
    let mut interned = Interned::default();
    for pk in &p {
        interned.update(pk);
        if let Some(te) = &pk.track_event {
            assert_eq!(pk.sequence_flags, Some(SEQ_NEEDS_INCREMENTAL_STATE));
            interned.event_name(te).unwrap();
        }
    }
    assert_eq!(
        interned
            .event_name(p[7].track_event.as_ref().unwrap())
            .as_deref(),
        Some("y")
    );
}

#[test]
fn a_full_buffer_drops_events_without_rebuilding_the_state() {
    let mut w = VecWriter {
        drop: vec![4],
        ..Default::default()
    };
    let mut s = seq();
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "x".into()), None)); // 0..=3
    assert!(!s.write_event(&mut w, &ev(EventType::Instant, "y".into()), None)); // 4: lost
    assert_eq!((s.resets, w.attempts), (1, 5));
    // Still no chunk: every event is dropped before any reset work.
    w.full = true;
    for _ in 0..100 {
        assert!(!s.write_event(&mut w, &ev(EventType::Instant, "y".into()), None));
    }
    assert_eq!((s.resets, w.attempts, w.ensure_failures), (1, 5, 100));
    // Room again: one reset, then the event.
    w.full = false;
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "y".into()), None));
    assert_eq!(s.resets, 2);
    let p = w.decoded();
    assert_eq!(p.len(), 8);
    assert_eq!(
        p[4].sequence_flags,
        Some(sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED)
    );
    assert!(p[7].track_event.is_some());
    // A writer in good standing is never asked.
    w.full = true;
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "z".into()), None));
    assert_eq!(w.ensure_failures, 100);
}

#[test]
fn ends_of_lost_or_unknown_slices_are_not_written() {
    // Packet 4 (the begin of "b") is dropped.
    let mut w = VecWriter {
        drop: vec![4],
        ..Default::default()
    };
    let mut s = seq();
    let end = || EventData::new(EventType::SliceEnd, Some(&CAT), Timestamp::boottime(9));
    assert!(s.write_event(&mut w, &ev(EventType::SliceBegin, "a".into()), None)); // 0..=3
    assert!(!s.write_event(&mut w, &ev(EventType::SliceBegin, "b".into()), None)); // 4: lost
    assert!(s.write_event(&mut w, &end(), None)); // end of "b": suppressed
    assert!(s.write_event(&mut w, &end(), None)); // end of "a": written (after a reset)
    assert!(s.write_event(&mut w, &end(), None)); // nothing open: suppressed
    assert_eq!(s.orphan_ends_suppressed, 2);
    let types: Vec<i32> = w
        .decoded()
        .iter()
        .filter_map(|p| p.track_event.as_ref()?.r#type)
        .collect();
    assert_eq!(
        types,
        [EventType::SliceBegin as i32, EventType::SliceEnd as i32]
    );
    // Slices on other tracks are not tracked (they may end elsewhere).
    let t = Track::global(5);
    let mut e = end();
    e.track = Some(&t);
    assert!(s.write_event(&mut w, &e, None));
    assert_eq!(s.orphan_ends_suppressed, 2);
}

/// A slice end lost while its begin was written is owed: the reset before
/// the next event writes it at its own time (absolute, on BOOTTIME), ahead
/// of that event, so the next slice does not nest under it.
#[test]
fn a_lost_end_is_written_before_the_next_event() {
    // Packet 5 (the end of "a", after 0..=3 and a's begin) is lost.
    let mut w = VecWriter {
        drop: vec![5],
        ..Default::default()
    };
    let mut s = seq();
    let at = |kind, name: &'static str, ns| {
        let mut e = EventData::new(kind, Some(&CAT), Timestamp::boottime(ns));
        e.name = name.into();
        e
    };
    assert!(s.write_event(&mut w, &at(EventType::SliceBegin, "x", 1000), None)); // 0..=3
    assert!(s.write_event(&mut w, &at(EventType::SliceBegin, "a", 2000), None)); // 4
    assert!(!s.write_event(&mut w, &at(EventType::SliceEnd, "", 3000), None)); // 5: lost
    assert!(s.write_event(&mut w, &at(EventType::SliceBegin, "b", 4000), None));
    assert!(s.write_event(&mut w, &at(EventType::SliceEnd, "", 5000), None));
    assert!(s.write_event(&mut w, &at(EventType::SliceEnd, "", 6000), None));
    let p = w.decoded();
    // After the lost end: a reset, 2 descriptors, a's end, b's begin and
    // end, x's end.
    assert_eq!(
        p[5].sequence_flags,
        Some(sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED)
    );
    let owed = &p[8];
    assert_eq!(
        owed.track_event.as_ref().and_then(|t| t.r#type),
        Some(EventType::SliceEnd as i32)
    );
    assert_eq!(
        (owed.timestamp, owed.timestamp_clock_id),
        (Some(3000), Some(6))
    );
    let types: Vec<i32> = p
        .iter()
        .filter_map(|p| p.track_event.as_ref()?.r#type)
        .collect();
    let (b, e) = (EventType::SliceBegin as i32, EventType::SliceEnd as i32);
    assert_eq!(types, [b, b, e, b, e, e]);
    assert_eq!(s.orphan_ends_suppressed, 0);
    assert_eq!(s.slice_ends_written_late, 1);
}

/// A flush writes the ends still owed (after the reset they need) when
/// no event comes to do it.
#[test]
fn a_flush_pays_owed_ends() {
    let mut w = VecWriter::default();
    let mut s = seq();
    let at = |kind, ns| EventData::new(kind, Some(&CAT), Timestamp::boottime(ns));
    assert!(s.write_event(&mut w, &at(EventType::SliceBegin, 100), None));
    w.lose_next = true;
    assert!(!s.write_event(&mut w, &at(EventType::SliceEnd, 200), None));
    let before = w.packets.len();
    let late_before = crate::stats().slice_ends_written_late;
    assert_eq!(s.slice_ends_written_late, 0);
    s.pay_owed_ends_now(&mut w);
    // Counted as written late: exactly once on the sequence, and in the
    // process-wide stats (which other tests may add to as well).
    assert_eq!(s.slice_ends_written_late, 1);
    assert!(crate::stats().slice_ends_written_late > late_before);
    let p = w.decoded();
    let last = p.last().unwrap();
    assert_eq!(
        last.track_event.as_ref().and_then(|t| t.r#type),
        Some(EventType::SliceEnd as i32)
    );
    assert_eq!(
        (last.timestamp, last.timestamp_clock_id),
        (Some(200), Some(6))
    );
    assert_eq!(
        p[before].sequence_flags,
        Some(sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED)
    );
    // Nothing owed: nothing written.
    let n = w.packets.len();
    s.pay_owed_ends_now(&mut w);
    assert_eq!(w.packets.len(), n);
}

/// Owed ends wait while the buffer stays full and are written in order
/// once it has room; beyond [`OWED_ENDS`] times, the newest ends (of the
/// outer slices) share the latest time, so none is left open. Ends still
/// owed when a sequence ends are counted as lost.
#[test]
fn owed_ends_wait_for_room_and_the_newest_share_the_last_time() {
    let mut w = VecWriter::default();
    let mut s = seq();
    let at = |kind, ns| EventData::new(kind, Some(&CAT), Timestamp::boottime(ns));
    let depth = OWED_ENDS as u64 + 3;
    for i in 0..depth {
        assert!(s.write_event(&mut w, &at(EventType::SliceBegin, 100 + i), None));
    }
    w.full = true;
    w.lose_next = true;
    for i in 0..depth {
        assert!(!s.write_event(&mut w, &at(EventType::SliceEnd, 1000 + i), None));
    }
    w.full = false;
    let before = w.packets.len();
    assert!(s.write_event(&mut w, &at(EventType::Instant, 5000), None));
    let p = w.decoded();
    let ends: Vec<u64> = p[before..]
        .iter()
        .filter(|p| {
            p.track_event.as_ref().and_then(|t| t.r#type) == Some(EventType::SliceEnd as i32)
        })
        .map(|p| p.timestamp.unwrap())
        .collect();
    let last = 1000 + depth - 1;
    let mut expected: Vec<u64> = (0..OWED_ENDS as u64 - 1).map(|i| 1000 + i).collect();
    expected.extend([last; 4]);
    assert_eq!(
        ends, expected,
        "the first ones at their times, then the rest"
    );

    // Owed and never written: counted when the sequence goes.
    let lost_before = crate::stats().slice_ends_lost;
    let mut s = seq();
    assert!(s.write_event(&mut w, &at(EventType::SliceBegin, 6000), None));
    assert!(s.write_event(&mut w, &at(EventType::SliceBegin, 6001), None));
    w.full = true;
    w.lose_next = true;
    assert!(!s.write_event(&mut w, &at(EventType::SliceEnd, 6002), None));
    assert!(!s.write_event(&mut w, &at(EventType::SliceEnd, 6003), None));
    drop(s);
    // Other tests may count too: at least these two.
    assert!(crate::stats().slice_ends_lost >= lost_before + 2);
}

#[test]
fn slice_stack_deeper_than_64() {
    let mut st = SliceStack::default();
    for i in 0..70 {
        st.push(i % 2 == 0);
    }
    for _ in 0..6 {
        assert!(st.pop(), "beyond 64 levels: assumed written");
    }
    for i in (0..64).rev() {
        assert_eq!(st.pop(), i % 2 == 0, "level {i}");
    }
    assert!(!st.pop());
}

#[test]
fn group_dynamic_names_and_ends() {
    let mut w = VecWriter::default();
    let mut s = seq();
    let mut e = EventData::new(EventType::SliceBegin, Some(&GROUP), Timestamp::boottime(5));
    let dynamic = String::from("dyn-name");
    e.name = EventName::Dynamic(&dynamic);
    assert!(s.write_event(&mut w, &e, None));
    let end = EventData::new(EventType::SliceEnd, Some(&GROUP), Timestamp::boottime(6));
    assert!(s.write_event(&mut w, &end, None));
    let p = w.decoded();
    let mut interned = Interned::default();
    p.iter().for_each(|pk| interned.update(pk));
    let begin = p[3].track_event.as_ref().unwrap();
    assert_eq!(begin.name.as_deref(), Some("dyn-name"));
    assert_eq!(begin.name_iid, None);
    assert_eq!(interned.event_categories(begin), ["a", "b"]);
    let end = p[4].track_event.as_ref().unwrap();
    assert_eq!(end.r#type, Some(EventType::SliceEnd as i32));
    assert!(end.category_iids.is_empty() && end.name.is_none() && end.name_iid.is_none());
}

#[test]
fn annotations_flows_counters_timestamps() {
    let mut w = VecWriter::default();
    let mut s = seq();
    let dict = [
        ("x", DebugValue::from(-3)),
        ("inner", DebugValue::Array(&[DebugValue::Bool(true)])),
    ];
    let arr = [DebugValue::from(1.5), DebugValue::from("s")];
    let dyn_name = String::from("runtime");
    let args = [
        Arg::new("b", true),
        Arg::new("i", -7i64),
        Arg::new("u", u64::MAX),
        Arg::new("d", 0.25),
        Arg::new("s", "str"),
        Arg::new("p", DebugValue::Pointer(0xdead)),
        Arg::new("dict", DebugValue::Dict(&dict)),
        Arg::new("arr", DebugValue::Array(&arr)),
        Arg::dynamic(&dyn_name, 1u8),
    ];
    let flows = [Flow::global(11), Flow::global(u64::MAX)];
    let term = [Flow::global(12)];
    let mut e = ev(EventType::Instant, "args".into());
    e.args = &args;
    e.flows = &flows;
    e.terminating_flows = &term;
    e.timestamp = Timestamp {
        clock: Clock::Monotonic,
        ns: 77,
    };
    assert!(s.write_event(&mut w, &e, None));
    let counter = CounterTrack::new("Memory")
        .with_unit(CounterUnit::SizeBytes)
        .with_multiplier(1024);
    let mut c = EventData::new(EventType::Counter, Some(&CAT), Timestamp::boottime(9));
    c.track = Some(counter.track());
    c.counter = Some(CounterValue::Int(4));
    assert!(s.write_event(&mut w, &c, None));
    c.counter = Some(CounterValue::Double(2.5));
    assert!(s.write_event(&mut w, &c, None));

    let p = w.decoded();
    let mut interned = Interned::default();
    p.iter().for_each(|pk| interned.update(pk));
    let pk = &p[3];
    assert_eq!((pk.timestamp, pk.timestamp_clock_id), (Some(77), Some(3)));
    let te = pk.track_event.as_ref().unwrap();
    assert_eq!(te.flow_ids, [11, u64::MAX]);
    assert_eq!(te.terminating_flow_ids, [12]);
    let a = &te.debug_annotations;
    let names: Vec<_> = a.iter().map(|x| interned.arg_name(x).unwrap()).collect();
    assert_eq!(
        names,
        ["b", "i", "u", "d", "s", "p", "dict", "arr", "runtime"]
    );
    assert_eq!(
        a[8].name.as_deref(),
        Some("runtime"),
        "dynamic names are inline"
    );
    assert_eq!(a[0].bool_value, Some(true));
    assert_eq!(a[1].int_value, Some(-7));
    assert_eq!(a[2].uint_value, Some(u64::MAX));
    assert_eq!(a[3].double_value, Some(0.25));
    assert_eq!(a[4].string_value.as_deref(), Some("str"));
    assert_eq!(a[5].pointer_value, Some(0xdead));
    assert_eq!(a[6].dict_entries.len(), 2);
    assert_eq!(a[6].dict_entries[0].name.as_deref(), Some("x"));
    assert_eq!(a[6].dict_entries[0].int_value, Some(-3));
    assert_eq!(a[6].dict_entries[1].array_values[0].bool_value, Some(true));
    assert_eq!(a[7].array_values[0].double_value, Some(1.5));
    assert_eq!(a[7].array_values[1].string_value.as_deref(), Some("s"));
    assert_eq!(a[7].array_values[1].name, None);

    // Counter: descriptor once, then two samples on its track.
    let desc = p[4].track_descriptor.as_ref().unwrap();
    assert_eq!(desc.uuid, Some(counter.track().uuid()));
    assert_eq!(desc.parent_uuid, Some(ProcessTrack::current().uuid()));
    assert_eq!(desc.name.as_deref(), Some("Memory"));
    let cd = desc.counter.as_ref().unwrap();
    assert_eq!((cd.unit, cd.unit_multiplier), (Some(3), Some(1024)));
    let c1 = p[5].track_event.as_ref().unwrap();
    assert_eq!(
        (c1.r#type, c1.track_uuid, c1.counter_value),
        (Some(4), Some(counter.track().uuid()), Some(4))
    );
    assert!(c1.category_iids.is_empty());
    let c2 = p[6].track_event.as_ref().unwrap();
    assert_eq!(c2.double_counter_value, Some(2.5));
    assert_eq!(p.len(), 7);
}

#[test]
fn custom_track_descriptors_once_per_reset() {
    let mut w = VecWriter::default();
    let mut s = seq();
    let root = Track::global(10)
        .with_name("Root")
        .with_child_ordering(ChildOrdering::Explicit);
    let child = Track::child_of(&root, 3)
        .with_name("C")
        .with_sibling_order_rank(-100);
    for t in [&root, &child, &child] {
        let mut e = ev(EventType::Instant, "on".into());
        e.track = Some(t);
        assert!(s.write_event(&mut w, &e, None));
    }
    s.invalidate();
    let mut e = ev(EventType::Instant, "on".into());
    e.track = Some(&child);
    assert!(s.write_event(&mut w, &e, None));
    let descs: Vec<_> = w
        .decoded()
        .into_iter()
        .filter_map(|p| p.track_descriptor)
        .collect();
    let uuids: Vec<_> = descs.iter().map(|d| d.uuid.unwrap()).collect();
    let t = 4242 ^ crate::process_uuid();
    let pr = crate::process_uuid();
    // After the reset the child comes first, then its parent.
    assert_eq!(uuids, [t, pr, 10, 3 ^ 10, t, pr, 3 ^ 10, 10]);
    assert_eq!(descs[2].child_ordering, Some(3));
    assert_eq!(descs[3].sibling_order_rank, Some(-100));
    assert_eq!(descs[3].parent_uuid, Some(10));
    assert_eq!(descs[7], descs[2]);
}

/// An event on a nested track describes every custom ancestor first
/// (each once per reset), as upstream's nested tracks do.
#[test]
fn nested_tracks_describe_every_ancestor() {
    let mut w = VecWriter::default();
    let mut s = seq();
    let root = Track::global(0x5000)
        .with_name("R")
        .with_child_ordering(ChildOrdering::Explicit);
    let mid = Track::named_child_of(&root, "M", 1).with_sibling_order_rank(2);
    let leaf = Track::named_child_of(&mid, "L", 2);
    let gauge = CounterTrack::child_of(&leaf, "gauge");
    let on = |t: &Track<'_>, w: &mut VecWriter, s: &mut SequenceState| {
        let mut e = ev(EventType::Instant, "on".into());
        e.track = Some(t);
        assert!(s.write_event(w, &e, None));
    };
    on(&leaf, &mut w, &mut s);
    on(&mid, &mut w, &mut s);
    on(gauge.track(), &mut w, &mut s);
    s.invalidate();
    on(gauge.track(), &mut w, &mut s);
    let descs: Vec<_> = w
        .decoded()
        .into_iter()
        .filter_map(|p| p.track_descriptor)
        .collect();
    let uuids: Vec<_> = descs.iter().map(|d| d.uuid.unwrap()).collect();
    let t = 4242 ^ crate::process_uuid();
    let pr = crate::process_uuid();
    let (r, m, l, g) = (root.uuid(), mid.uuid(), leaf.uuid(), gauge.track().uuid());
    assert_eq!(uuids, [t, pr, l, m, r, g, t, pr, g, l, m, r]);
    let by_uuid = |u: u64| descs.iter().find(|d| d.uuid == Some(u)).unwrap();
    assert_eq!(by_uuid(r).name.as_deref(), Some("R"));
    assert_eq!(by_uuid(r).child_ordering, Some(3));
    assert_eq!(by_uuid(r).parent_uuid, None);
    assert_eq!(by_uuid(m).name.as_deref(), Some("M"));
    assert_eq!(by_uuid(m).sibling_order_rank, Some(2));
    assert_eq!(by_uuid(m).parent_uuid, Some(r));
    assert_eq!(by_uuid(l).parent_uuid, Some(m));
    assert_eq!(by_uuid(g).parent_uuid, Some(l));
}

/// Writer whose attempts succeed or fail following `mask` (cycled).
struct MaskWriter {
    inner: VecWriter,
    mask: Vec<bool>,
    /// For each attempt: was it written?
    outcomes: Vec<bool>,
}

impl PacketWriter for MaskWriter {
    type Sink = VecSink;
    type Window<'w> = &'w mut Scratch;

    fn write_in_place(&mut self, encode: impl FnOnce(&mut Cursor<&mut Scratch>) -> bool) -> bool {
        let _ = encode;
        false
    }

    fn write_packet(&mut self, f: impl FnOnce(&mut Message<'_, Self::Sink>)) -> bool {
        let drop = self.mask[self.outcomes.len() % self.mask.len()];
        if drop {
            self.inner.drop.push(self.inner.attempts);
        }
        let ok = self.inner.write_packet(f);
        self.outcomes.push(ok);
        ok
    }
}

#[derive(Debug, Clone)]
enum Op {
    Event {
        kind: u8,
        name: usize,
        cat: usize,
        arg: usize,
        track: usize,
    },
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..4, 0usize..4, 0usize..2, 0usize..4, 0usize..3)
            .prop_map(|(kind, name, cat, arg, track)| Op::Event { kind, name, cat, arg, track }),
        1 => Just(Op::Clear),
    ]
}

static CATS: [Category; 2] = [Category::new("p.one"), Category::new("p.a,p.b")];
const NAMES: [&str; 4] = ["n0", "n1", "n2", "n3"];
const ARGS: [&str; 4] = ["a0", "a1", "a2", "a3"];

proptest! {
    /// The interning state machine, as a trace reader sees it: whatever
    /// is lost and whenever state is cleared, every packet that needs
    /// incremental state comes after a reset on the same sequence with
    /// no loss in between, every id it uses was defined since that
    /// reset, ids count from 1 per table after each reset, and every
    /// written event decodes to what was emitted.
    #[test]
    fn interning_state_machine(ops in prop::collection::vec(op(), 1..80),
                               mask in prop::collection::vec(prop::bool::weighted(0.15), 1..40)) {
        let tracks = [None, Some(Track::global(1000)), Some(Track::global(2000).with_name("t2"))];
        let mut w = MaskWriter { inner: VecWriter::default(), mask, outcomes: Vec::new() };
        let mut s = seq();
        let mut expected = Vec::new();
        for op in &ops {
            match *op {
                Op::Clear => s.invalidate(),
                Op::Event { kind, name, cat, arg, track } => {
                    let kind = [EventType::SliceBegin, EventType::Instant, EventType::Counter, EventType::SliceEnd][kind as usize];
                    if kind == EventType::SliceEnd {
                        continue; // slice pairing is covered elsewhere
                    }
                    let args = [Arg::new(ARGS[arg], arg as u64)];
                    let mut e = EventData::new(kind, Some(&CATS[cat]), Timestamp::boottime(1));
                    e.name = EventName::Static(NAMES[name]);
                    e.args = &args;
                    e.track = tracks[track].as_ref();
                    if kind == EventType::Counter {
                        e.counter = Some(CounterValue::Int(1));
                    }
                    let before = w.inner.packets.len();
                    if s.write_event(&mut w, &e, None) {
                        // The event is the last packet written.
                        prop_assert!(w.inner.packets.len() > before);
                        expected.push((w.inner.packets.len() - 1, kind, name, cat, arg, track));
                    }
                }
            }
        }
        // Replay as a reader. A loss invalidates the state; only a reset
        // (flag 1) validates it again.
        let packets = w.inner.decoded();
        let mut valid = false;
        let mut interned = Interned::default();
        let mut next_iid = [1u64; 3];
        let mut seen_tracks = std::collections::HashSet::new();
        let mut written_index = 0usize;
        let mut lost_since_last = false;
        let mut lost_before: Vec<bool> = Vec::new();
        for ok in &w.outcomes {
            if *ok { lost_before.push(lost_since_last); lost_since_last = false; } else { lost_since_last = true; }
        }
        for (i, p) in packets.iter().enumerate() {
            if lost_before[i] { valid = false; }
            let flags = p.sequence_flags.unwrap_or(0);
            if flags & sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED != 0 {
                valid = true;
                next_iid = [1; 3];
                seen_tracks.clear();
            }
            if let Some(d) = &p.track_descriptor { seen_tracks.insert(d.uuid.unwrap()); }
            if let Some(data) = &p.interned_data {
                for (k, entries) in [&data.event_categories, &data.event_names, &data.debug_annotation_names].into_iter().enumerate() {
                    for e in entries {
                        prop_assert_eq!(e.iid, Some(next_iid[k]), "iids count from 1 per table");
                        next_iid[k] += 1;
                    }
                }
            }
            interned.update(p);
            if let Some(te) = &p.track_event {
                prop_assert_eq!(flags, SEQ_NEEDS_INCREMENTAL_STATE);
                prop_assert!(valid, "packet {} needs state after a loss, before a reset", i);
                if let Some(u) = te.track_uuid { prop_assert!(seen_tracks.contains(&u), "track described before use"); }
                let (at, kind, name, cat, arg, track) = expected[written_index];
                written_index += 1;
                prop_assert_eq!(at, i);
                prop_assert_eq!(te.r#type, Some(kind as i32));
                prop_assert_eq!(interned.event_name(te), Some(NAMES[name].to_string()));
                if kind != EventType::Counter {
                    let cats: Vec<String> = CATS[cat].name().split(',').map(String::from).collect();
                    prop_assert_eq!(interned.event_categories(te), cats);
                }
                prop_assert_eq!(interned.arg_name(&te.debug_annotations[0]), Some(ARGS[arg].to_string()));
                prop_assert_eq!(te.track_uuid, tracks[track].map(|t| t.uuid()));
            }
        }
        prop_assert_eq!(written_index, expected.len());
    }
}

#[test]
fn fast_path_matches_the_general_encoder() {
    let dynamic = String::from("dyn");
    let long = "L".repeat(200);
    let track = Track::global(77).with_name("t");
    let flows = [Flow::global(1), Flow::global(u64::MAX)];
    let args = [
        Arg::new("b", false),
        Arg::new("u", u64::MAX),
        Arg::new("i", i64::MIN),
        Arg::new("d", -0.5),
        Arg::new("s", "string"),
        Arg::new("p", DebugValue::Pointer(7)),
        Arg::dynamic(&dynamic, 3),
        Arg::new("long", long.as_str()),
    ];
    let mut events = Vec::new();
    for kind in [
        EventType::SliceBegin,
        EventType::SliceEnd,
        EventType::Instant,
        EventType::Counter,
    ] {
        let mut e = ev(kind, "n".into());
        events.push(e);
        e.args = &args;
        e.flows = &flows;
        e.terminating_flows = &flows[..1];
        e.track = Some(&track);
        e.timestamp = Timestamp {
            clock: Clock::Monotonic,
            ns: u64::MAX,
        };
        e.counter = Some(CounterValue::Int(-1));
        events.push(e);
        e.counter = Some(CounterValue::Double(1e300));
        e.name = EventName::Dynamic(&dynamic);
        e.category = Some(&GROUP);
        events.push(e);
    }
    let mut fast = seq();
    let mut general = seq();
    for (i, e) in events.iter().enumerate() {
        fast.interned.new_entries.clear();
        general.interned.new_entries.clear();
        let mut a = [0u8; FAST_CAP + TARGET_SLACK];
        let stamp = fast.stamp(e.timestamp);
        assert_eq!(stamp, general.stamp(e.timestamp));
        let uuid = fast.thread_track.uuid();
        let mut c = Cursor::new(&mut a);
        assert!(fast
            .interned
            .encode_fast::<_, false>(&mut c, uuid, e, stamp));
        let n = c.finish().expect("fits");
        let mut b = vec![0u8; 4096];
        let m = encode_to_slice(&mut b, |p| general.write_event_fields(p, e, stamp, None)).unwrap();
        let pa = ts::TracePacket::decode(&a[..n]).unwrap();
        let pb = ts::TracePacket::decode(&b[..m]).unwrap();
        assert_eq!(pa, pb, "event {i}");
    }
    // Nested values and tiny buffers are not for the fast path.
    let dict = [("k", DebugValue::from(1))];
    let nested = [Arg::new("d", DebugValue::Dict(&dict))];
    let mut e = ev(EventType::Instant, "n".into());
    e.args = &nested;
    let stamp = fast.stamp(e.timestamp);
    let uuid = fast.thread_track.uuid();
    let mut buf = [0u8; FAST_CAP + TARGET_SLACK];
    let mut c = Cursor::new(&mut buf);
    assert!(!fast
        .interned
        .encode_fast::<_, false>(&mut c, uuid, &e, stamp));
    let huge = "H".repeat(FAST_CAP);
    let big = [Arg::new("big", huge.as_str())];
    e.args = &big;
    let mut c = Cursor::new(&mut buf);
    let encoded = fast
        .interned
        .encode_fast::<_, false>(&mut c, uuid, &e, stamp);
    assert!(encoded && c.finish().is_none(), "too long for the buffer");
}

#[test]
fn extra_fields_through_the_context() {
    let mut w = VecWriter::default();
    let mut s = seq();
    let mut f = |ctx: &mut EventContext<'_, '_, VecSink>| {
        ctx.event().string(1001, "ext");
        ctx.add_arg(&Arg::new("late", 5));
    };
    assert!(s.write_event(&mut w, &ev(EventType::Instant, "e".into()), Some(&mut f)));
    let p = w.decoded();
    let te = p[3].track_event.as_ref().unwrap();
    assert_eq!(te.test_extension.as_deref(), Some("ext"));
    assert_eq!(te.debug_annotations[0].int_value, Some(5));
    assert_eq!(
        p[3].interned_data.as_ref().unwrap().debug_annotation_names[0]
            .name
            .as_deref(),
        Some("late")
    );
}

/// The site ([`SequenceState::write_flat`]) of the flat tests' trace
/// points: one per name and head annotation value (a site promises both).
#[cfg(feature = "tracing")]
fn site(name: &'static str, head: (&'static str, &'static str)) -> usize {
    match (name, head.1) {
        ("event", "INFO") => 1,
        ("event", "WARN") => 2,
        // Other names: their own address.
        (name, _) => name.as_ptr() as usize,
    }
}

/// The `tracing` layer's instants and slice begins
/// ([`SequenceState::write_flat`]): the same packets as the general path
/// for the same annotations (and the same slice ends after), written in
/// place once their names are interned (then from the trace point's
/// pre-encoded head, across changes of its later annotations' names, and
/// resets; a head annotation of another value is another site), including
/// names whose front-cache slot another name holds; the general path takes
/// first uses, texts too long for a window, resets and losses.
#[cfg(feature = "tracing")]
#[test]
fn flat_events_match_the_general_path() {
    use crate::encoding::annotation::{FlatArgs, FlatValue};
    // Annotation names that share one front-cache slot.
    let colliding: [_; 2] = names_sharing("f", |slot| slot);
    let long = "x".repeat(150);
    let text = format!("valuemessage{long}");
    let values = [
        ("count", FlatValue::Uint(300)),
        ("label", FlatValue::Text(0, 5)),
        ("neg", FlatValue::Int(-3)),
        ("b", FlatValue::Bool(true)),
        ("d", FlatValue::Double(1.5)),
        (colliding[0], FlatValue::Text(5, 12)),
        (colliding[1], FlatValue::Uint(u64::MAX)),
        ("empty", FlatValue::Text(12, 12)),
    ];
    let too_long = [("s", FlatValue::Text(12, text.len()))];
    // Other names where a trace point's last event had `count`, `label`.
    let renamed = [("neg", FlatValue::Int(-4)), ("count", FlatValue::Uint(1))];
    let shapes: [&[(&'static str, FlatValue)]; 5] =
        [&values, &values[..2], &too_long, &renamed, &[]];
    let mut fast = seq();
    let mut general = seq();
    let mut a = VecWriter::in_place();
    let mut b = VecWriter::default();
    let mut ns = 1_000;
    let mut events = 0;
    for round in 0..6 {
        if round == 3 {
            fast.invalidate();
            general.invalidate();
            // Another name interned first after the reset: the trace
            // point's ids differ from those before.
            ns += 77;
            let first = FlatArgs::head_only(("first", "x"));
            let list: Vec<Arg<'_>> = first.iter().map(|(n, v)| Arg::new(n, v)).collect();
            let mut data = ev(EventType::Instant, EventName::Static("before"));
            data.timestamp = Timestamp::boottime(ns);
            data.args = &list;
            assert!(fast.write_flat::<{ EventType::Instant as u8 }, _>(
                &mut a,
                site("before", first.head),
                &CAT,
                "before",
                &first,
                ns
            ));
            assert!(general.write_event(&mut b, &data, None));
        }
        if round == 4 {
            a.lose_next = true;
            b.lose_next = true;
        }
        // Instants and slice begins alike; the kind of a round's last
        // events is that of the next round's first (across the reset).
        let kinds = if round % 2 == 0 {
            [EventType::Instant, EventType::SliceBegin]
        } else {
            [EventType::SliceBegin, EventType::Instant]
        };
        for (kind, (i, values)) in kinds
            .into_iter()
            .flat_map(|k| shapes.into_iter().enumerate().map(move |v| (k, v)))
        {
            ns += 77;
            events += 1;
            // The same trace point with another head annotation now and
            // then (a pre-encoded head is reused only for the same
            // strings).
            let values = field_ids(values);
            let args = FlatArgs {
                head: ("level", if i == 1 { "WARN" } else { "INFO" }),
                values: &values,
                text: &text,
            };
            let at = site("event", args.head);
            let list: Vec<Arg<'_>> = args.iter().map(|(n, v)| Arg::new(n, v)).collect();
            let mut data = ev(kind, EventName::Static("event"));
            data.timestamp = Timestamp::boottime(ns);
            data.args = &list;
            let ok_a = match kind {
                EventType::Instant => fast.write_flat::<{ EventType::Instant as u8 }, _>(
                    &mut a, at, &CAT, "event", &args, ns,
                ),
                _ => fast.write_flat::<{ EventType::SliceBegin as u8 }, _>(
                    &mut a, at, &CAT, "event", &args, ns,
                ),
            };
            let ok_b = general.write_event(&mut b, &data, None);
            assert_eq!(ok_a, ok_b, "round {round}");
            if kind == EventType::SliceBegin {
                // Both stacks know whether the begin was written: the end
                // follows it, or not, alike.
                ns += 1;
                let mut end = ev(EventType::SliceEnd, EventName::None);
                end.timestamp = Timestamp::boottime(ns);
                let ok_a = fast.write_event(&mut a, &end, None);
                let ok_b = general.write_event(&mut b, &end, None);
                assert_eq!(ok_a, ok_b, "round {round}");
            }
        }
    }
    assert_eq!(a.decoded_apart(), b.decoded_apart());
    // Everything but first uses, the long text and the lost one: in place.
    assert!(
        a.in_place_packets >= events / 2,
        "{} of {events} in place",
        a.in_place_packets
    );
}

/// A field of [`TestFields`].
#[cfg(feature = "tracing")]
#[derive(Clone, Copy)]
enum TestField {
    Value(&'static str, FieldValue<'static>),
    Debug(&'static str, &'static dyn std::fmt::Debug),
    Literal(&'static str, &'static str),
}

/// Fields handed over from a list; `complete: false` asks to decline.
#[cfg(feature = "tracing")]
struct TestFields<'a> {
    fields: &'a [TestField],
    complete: bool,
}

#[cfg(feature = "tracing")]
impl FlatFields for TestFields<'_> {
    fn each<O: FlatOut>(&self, out: &mut O) -> bool {
        for f in self.fields {
            match *f {
                TestField::Value(n, v) => out.value(TestKey(n), v),
                TestField::Debug(n, d) => {
                    // Formatted at each call, as the layer's source hands
                    // over the text it formats once per event (its own
                    // tests); a failing `Debug` leaves what it wrote.
                    let mut text = String::new();
                    let _ = std::fmt::write(&mut text, format_args!("{d:?}"));
                    out.value(TestKey(n), text.as_str());
                }
                TestField::Literal(n, s) => out.literal(TestKey(n), s),
            }
        }
        self.complete
    }
}

/// The names of [`TestFields`]' fields, as one trace point declares them:
/// a field's index is its name's place here, whichever fields an event
/// hands over and in whichever order, except that the ninth and later
/// come after the indices whose prefixes a pre-encoded head keeps (a trace
/// point of more fields than that).
#[cfg(feature = "tracing")]
const FIELD_NAMES: [&str; 14] = [
    "message", "count", "label", "b", "d", "pieces", "text", "big", "failing", "empty", "z",
    "wide", "neg", "fresh",
];

/// A field of [`TestFields`] by its name.
#[cfg(feature = "tracing")]
#[derive(Clone, Copy)]
struct TestKey(&'static str);

#[cfg(feature = "tracing")]
impl FieldKey for TestKey {
    /// As a trace point gives them: one index per name (by its place in
    /// [`FIELD_NAMES`], else one after those, the thread's first use).
    fn index(self) -> usize {
        // The ninth name and later: past the kept prefixes.
        let spread = |i: usize| {
            if i < 8 {
                i
            } else {
                super::flat_heads::FIELDS + i - 8
            }
        };
        thread_local! {
            static MORE: std::cell::RefCell<Vec<&'static str>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        spread(
            FIELD_NAMES
                .iter()
                .position(|&n| n == self.0)
                .unwrap_or_else(|| {
                    MORE.with_borrow_mut(|more| {
                        let i = more.iter().position(|&n| n == self.0).unwrap_or_else(|| {
                            more.push(self.0);
                            more.len() - 1
                        });
                        FIELD_NAMES.len() + i
                    })
                }),
        )
    }
    fn name(self) -> &'static str {
        self.0
    }
}

/// `values` as the layer collects them: each name with its field's id.
#[cfg(feature = "tracing")]
fn field_ids(
    values: &[(&'static str, crate::encoding::annotation::FlatValue)],
) -> Vec<(
    crate::encoding::annotation::FieldId,
    crate::encoding::annotation::FlatValue,
)> {
    values
        .iter()
        .map(|&(name, value)| {
            (
                crate::encoding::annotation::FieldId::of(TestKey(name)),
                value,
            )
        })
        .collect()
}

/// What the layer collects of `fields` for the flat path: each name with
/// its field's id and its value, texts (a `Debug` value formatted) in one
/// string.
#[cfg(feature = "tracing")]
fn collected(
    fields: &[TestField],
) -> (
    Vec<(
        crate::encoding::annotation::FieldId,
        crate::encoding::annotation::FlatValue,
    )>,
    String,
) {
    use crate::encoding::annotation::FlatValue;
    use std::fmt::Write as _;
    let mut text = String::new();
    let mut values = Vec::new();
    for f in fields {
        let value = match *f {
            TestField::Value(_, FieldValue::Int(v)) => FlatValue::Int(v),
            TestField::Value(_, FieldValue::Uint(v)) => FlatValue::Uint(v),
            TestField::Value(_, FieldValue::Bool(v)) => FlatValue::Bool(v),
            TestField::Value(_, FieldValue::Double(v)) => FlatValue::Double(v),
            TestField::Value(_, FieldValue::Str(s)) | TestField::Literal(_, s) => {
                let start = text.len();
                text.push_str(s);
                FlatValue::Text(start, text.len())
            }
            TestField::Debug(_, d) => {
                let start = text.len();
                let _ = write!(text, "{d:?}");
                FlatValue::Text(start, text.len())
            }
        };
        let (TestField::Value(name, _) | TestField::Debug(name, _) | TestField::Literal(name, _)) =
            *f;
        values.push((name, value));
    }
    (field_ids(&values), text)
}

/// `Debug` in several pieces.
#[cfg(feature = "tracing")]
struct Pieces;

#[cfg(feature = "tracing")]
impl std::fmt::Debug for Pieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ab")?;
        f.write_str("cdefghijklmnopqrstu")?;
        write!(f, "{}", 7)
    }
}

/// `Debug` that fails after writing a part.
#[cfg(feature = "tracing")]
struct Failing;

#[cfg(feature = "tracing")]
impl std::fmt::Debug for Failing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("part")?;
        Err(std::fmt::Error)
    }
}

/// [`least_flat_len`](super::fast::least_flat_len) is at most the size of
/// the TrackEvent the in-place encoders write for the same flat event,
/// and that size for ids and integers below 128 (so that skipping the
/// in-place encoders when it is 128 or more changes nothing but the work).
#[cfg(feature = "tracing")]
#[test]
fn least_flat_len_bounds_the_track_event() {
    use super::fast::{flat_value, least_flat_len, put_event_ids, put_flat_annotation};
    use crate::encoding::annotation::{FieldId, FlatArgs, FlatValue};
    let text = "x".repeat(100);
    for n in 0..24 {
        for len in [0, 1, 5, 16, 17, 40, 100] {
            for (iid, small) in [(1, true), (300, false)] {
                let values: Vec<_> = (0..n)
                    .map(|i| {
                        let value = match i % 5 {
                            0 => FlatValue::Text(0, len),
                            1 => FlatValue::Uint(if small { 5 } else { 1 << 20 }),
                            2 => FlatValue::Int(if small { 1 } else { -1 }),
                            3 => FlatValue::Bool(true),
                            _ => FlatValue::Double(0.5),
                        };
                        (
                            FieldId {
                                index: i,
                                name: "f",
                            },
                            value,
                        )
                    })
                    .collect();
                let args = FlatArgs {
                    head: ("level", "INFO"),
                    values: &values,
                    text: &text,
                };
                let mut buf = [0u8; 4096 + TARGET_SLACK];
                let mut c = Cursor::new(&mut buf);
                put_event_ids(&mut c, EventType::Instant as u8, iid, iid);
                put_flat_annotation(&mut c, iid, encode::ArgValue::Str(args.head.1));
                for (_, value) in args.fields() {
                    put_flat_annotation(&mut c, iid, flat_value(&value).unwrap());
                }
                let got = c.finish().unwrap();
                let least = least_flat_len(&args);
                assert!(least <= got, "{n} fields, {len} B texts, id {iid}");
                if small {
                    assert_eq!(least, got, "{n} fields, {len} B texts");
                }
            }
        }
    }
}

/// Collected annotations streamed after a pre-encoded head (the `tracing`
/// layer's slice begins: `FlatArgs` as [`FlatFields`]) are the bytes
/// `write_flat` writes for them, values of every kind, in place and
/// through the scratch buffer.
#[cfg(feature = "tracing")]
#[test]
fn streamed_flat_args_match_the_flat_path() {
    use crate::encoding::annotation::{FlatArgs, FlatValue};
    const B: u8 = EventType::SliceBegin as u8;
    let values = [
        ("count", FlatValue::Uint(300)),
        ("neg", FlatValue::Int(-3)),
        ("b", FlatValue::Bool(true)),
        ("d", FlatValue::Double(1.5)),
        ("label", FlatValue::Text(0, 5)),
        ("empty", FlatValue::Text(5, 5)),
    ];
    let head = ("level", "INFO");
    let at = site("event", head);
    let (mut streamed, mut flat) = (seq(), seq());
    let (mut a, mut b) = (VecWriter::in_place(), VecWriter::in_place());
    let mut ns = 1_000;
    for round in 0..4 {
        if round == 2 {
            (a.in_place, b.in_place) = (false, false);
        }
        // Fields on the first begin of each round, the head alone after.
        for fields in [&values[..], &[]] {
            let fields = field_ids(fields);
            let args = FlatArgs {
                head,
                values: &fields,
                text: "value",
            };
            ns += 10;
            let s = streamed.write_flat_streamed::<B, _, _>(&mut a, at, &CAT, &args, ns);
            // The first begin interns the names (the general path), the
            // second makes the trace point's head (in place).
            assert_eq!(s == Streamed::Declined, round == 0, "round {round}");
            if s == Streamed::Declined {
                assert!(streamed.write_flat::<B, _>(&mut a, at, &CAT, "event", &args, ns));
            }
            assert!(flat.write_flat::<B, _>(&mut b, at, &CAT, "event", &args, ns));
            ns += 1;
            let mut end = ev(EventType::SliceEnd, EventName::None);
            end.timestamp = Timestamp::boottime(ns);
            assert!(streamed.write_event(&mut a, &end, None));
            assert!(flat.write_event(&mut b, &end, None));
        }
    }
    assert_eq!(a.packets, b.packets);
    assert_eq!(a.decoded(), b.decoded());
}

/// The `tracing` layer's streamed instants and slice begins
/// ([`SequenceState::write_flat_streamed`], falling back to
/// [`SequenceState::write_flat`] where it declines): byte for byte the
/// packets `write_flat` writes for the same fields collected first (values
/// of every kind, `Debug` values written in pieces, failing, or too long
/// for a window, names not interned yet, a source asking to decline,
/// resets and a loss), most of them streamed.
#[cfg(feature = "tracing")]
#[test]
fn streamed_events_match_the_flat_path() {
    use crate::encoding::annotation::FlatArgs;
    static LONG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "y".repeat(200));
    let long: &'static dyn std::fmt::Debug = &*LONG;
    use TestField::{Debug as D, Literal as L, Value as V};
    let all = [
        D("message", &"event"),
        V("count", FieldValue::Uint(300)),
        V("label", FieldValue::Str("value")),
        V("b", FieldValue::Bool(true)),
        V("d", FieldValue::Double(1.5)),
        D("pieces", &Pieces),
        D("failing", &Failing),
        V("empty", FieldValue::Str("")),
        // The ninth: past the names a pre-encoded head keeps.
        V("z", FieldValue::Bool(false)),
    ];
    let wide = [
        D("wide", &u128::MAX),
        V("neg", FieldValue::Int(-3)),
        V("count", FieldValue::Uint(1)),
    ];
    let bench = [
        L("message", "event"),
        V("count", FieldValue::Uint(7)),
        V("label", FieldValue::Str("value")),
    ];
    // Values past a word store or two, with kept prefixes and without
    // (and another literal of the message, which replaces the one kept).
    let long_values = [
        L("message", "a literal message"),
        V("text", FieldValue::Str("seventeen bytes..")),
        V("big", FieldValue::Uint(1 << 28)),
        V("neg", FieldValue::Int(-1 << 27)),
        V("d", FieldValue::Str("0123456789abcdef")),
        V("count", FieldValue::Uint((1 << 28) - 1)),
    ];
    let too_long = [D("message", long)];
    // A literal too long for a head to keep.
    let long_literal = [
        L(
            "message",
            "a literal message of more than sixty-four bytes, longer than a head keeps",
        ),
        V("count", FieldValue::Uint(2)),
    ];
    let fresh = [V("fresh", FieldValue::Uint(1)), D("message", &"x")];
    let shapes: [(&[TestField], bool); 10] = [
        (&bench, true),
        // Again: its literal message kept by the first.
        (&bench, true),
        (&all, true),
        (&wide, true),
        (&long_values, true),
        (&long_literal, true),
        (&too_long, true),
        (&fresh, true),
        (&bench, false),
        (&[], true),
    ];
    let mut streamed = seq();
    let mut flat = seq();
    let mut a = VecWriter::in_place();
    let mut b = VecWriter::in_place();
    let mut ns = 1_000;
    // Events streamed, by round.
    let mut taken = Vec::new();
    let mut events = 0;
    // Rounds 0 to 5 with room in place, then 6 and 7 without.
    let mut lost_begin = false;
    for round in 0..8 {
        taken.push(0);
        if round == 3 {
            streamed.invalidate();
            flat.invalidate();
        }
        if round == 4 {
            a.lose_next = true;
            b.lose_next = true;
        }
        if round == 6 {
            (a.in_place, b.in_place) = (false, false);
        }
        // Round 7 inside a slice of its own (the slice whose begin is lost
        // below must not end it).
        let outer = |kind, ns| {
            let mut e = ev(kind, EventName::Static("outer"));
            e.timestamp = Timestamp::boottime(ns);
            e
        };
        if round == 7 {
            ns += 1;
            let begin = outer(EventType::SliceBegin, ns);
            assert!(streamed.write_event(&mut a, &begin, None));
            assert!(flat.write_event(&mut b, &begin, None));
        }
        for (kind, (fields, complete)) in [EventType::Instant, EventType::SliceBegin]
            .into_iter()
            .flat_map(|k| shapes.into_iter().map(move |s| (k, s)))
        {
            ns += 77;
            events += 1;
            let head = ("level", if round == 1 { "WARN" } else { "INFO" });
            let at = site("event", head);
            let source = TestFields { fields, complete };
            let (values, text) = collected(fields);
            let args = FlatArgs {
                head,
                values: &values,
                text: &text,
            };
            const I: u8 = EventType::Instant as u8;
            const B: u8 = EventType::SliceBegin as u8;
            // A slice begin lost on the way through the scratch buffer: its
            // end is not written either.
            if round == 7 && kind == EventType::SliceBegin && !lost_begin {
                (a.lose_next, b.lose_next, lost_begin) = (true, true, true);
            }
            let (ok_a, ok_b) = match kind {
                EventType::Instant => {
                    let s = streamed.write_flat_streamed::<I, _, _>(&mut a, at, &CAT, &source, ns);
                    *taken.last_mut().unwrap() += usize::from(s == Streamed::Written);
                    (
                        match s {
                            Streamed::Declined => {
                                streamed.write_flat::<I, _>(&mut a, at, &CAT, "event", &args, ns)
                            }
                            s => s == Streamed::Written,
                        },
                        flat.write_flat::<I, _>(&mut b, at, &CAT, "event", &args, ns),
                    )
                }
                _ => {
                    let s = streamed.write_flat_streamed::<B, _, _>(&mut a, at, &CAT, &source, ns);
                    *taken.last_mut().unwrap() += usize::from(s == Streamed::Written);
                    (
                        match s {
                            Streamed::Declined => {
                                streamed.write_flat::<B, _>(&mut a, at, &CAT, "event", &args, ns)
                            }
                            s => s == Streamed::Written,
                        },
                        flat.write_flat::<B, _>(&mut b, at, &CAT, "event", &args, ns),
                    )
                }
            };
            assert_eq!(ok_a, ok_b, "round {round}");
            if kind == EventType::SliceBegin {
                ns += 1;
                let mut end = ev(EventType::SliceEnd, EventName::None);
                end.timestamp = Timestamp::boottime(ns);
                let ok_a = streamed.write_event(&mut a, &end, None);
                let ok_b = flat.write_event(&mut b, &end, None);
                assert_eq!(ok_a, ok_b, "round {round}");
            }
        }
        if round == 7 {
            ns += 1;
            let end = outer(EventType::SliceEnd, ns);
            assert!(streamed.write_event(&mut a, &end, None));
            assert!(flat.write_event(&mut b, &end, None));
        }
    }
    // With room in place and without, the same bytes.
    assert_eq!(a.packets, b.packets);
    assert_eq!(a.decoded(), b.decoded());
    // Streamed: all but the declining source, the first event of each
    // kind in a round (the two kinds share the trace point's slot), the
    // first use of a name and the lost ones (the long text through the
    // scratch buffer); without room in place as many as with room (round
    // 6 as round 5, which neither a reset nor a loss disturbs), through
    // the scratch buffer.
    let all: usize = taken.iter().sum();
    assert!(all >= events / 2, "{all} of {events} streamed");
    assert_eq!(taken[6], taken[5], "streamed without room in place");
    assert_eq!(taken[5], 16, "streamed in a round");
}

/// The length of the TrackEvent of an event packet of the flat encoders
/// (its time, flags, then the TrackEvent) and the bytes that length
/// takes; `None` for another packet.
fn track_event_len(p: &[u8]) -> Option<(usize, usize)> {
    use shmtrace_abi::proto::wire::read_varint;
    let time = tag1(trace_packet::TIMESTAMP, WireType::Varint);
    let flags = tag1(trace_packet::SEQUENCE_FLAGS, WireType::Varint);
    let track_event = tag1(trace_packet::TRACK_EVENT, WireType::LengthDelimited);
    let (_, n) = read_varint(p.get(1..)?).ok().filter(|_| p[0] == time)?;
    let rest = p.get(1 + n..)?;
    if rest.get(..3)? != [flags, SEQ_NEEDS_INCREMENTAL_STATE as u8, track_event] {
        return None;
    }
    let (len, bytes) = read_varint(&rest[3..]).ok()?;
    Some((len as usize, bytes))
}

/// Checks that the TrackEvent length of every event packet `w` wrote
/// (but those carrying interned data, which the general path writes) is
/// as short as it goes, and returns how many TrackEvents took 128 bytes
/// or more and how many shorter ones were in a packet longer than 127
/// bytes.
fn lengths_as_short_as_they_go(w: &VecWriter) -> (usize, usize) {
    let (mut long, mut band) = (0, 0);
    for (p, d) in w.packets.iter().zip(w.decoded()) {
        let Some((len, bytes)) = track_event_len(p).filter(|_| d.interned_data.is_none()) else {
            continue;
        };
        assert_eq!(bytes, if len < 128 { 1 } else { 2 }, "{p:?}");
        long += usize::from(len >= 128);
        band += usize::from(len < 128 && p.len() > 127);
    }
    (long, band)
}

/// Wide events (packets of more than 127 bytes: many fields, long texts,
/// a `Debug` text too long for a one-byte length) are streamed through
/// the scratch buffer with every length as short as it goes (a
/// TrackEvent of 128 bytes or more: two bytes), byte for byte what
/// `write_flat` writes for the same fields, and decode as the general
/// path's packets. Events of a trace point growing across 128 bytes and
/// back (a TrackEvent shorter than 128 bytes in a packet longer than 127
/// included): after one too long for a window, the next is encoded into
/// the scratch buffer at once (not tried in place), and one short enough
/// there is the packet written in place.
#[cfg(feature = "tracing")]
#[test]
fn wide_events_match_the_flat_path() {
    use crate::encoding::annotation::FlatArgs;
    use TestField::{Debug as D, Literal as L, Value as V};
    static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "z".repeat(150));
    static DEBUG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "y".repeat(126));
    const MESSAGE: &str = "a literal message of forty-three bytes here and then some more text";
    let text: &'static str = &TEXT;
    let debug: &'static dyn std::fmt::Debug = &*DEBUG;
    // The layer's wide event: 11 fields and a 43-byte literal message.
    let wide = [
        L("message", &MESSAGE[..43]),
        V("count", FieldValue::Uint(7)),
        V("label", FieldValue::Str("value")),
        V("b", FieldValue::Bool(true)),
        V("d", FieldValue::Double(0.5)),
        V("big", FieldValue::Uint(1 << 40)),
        V("neg", FieldValue::Int(-10)),
        V("text", FieldValue::Str("seventeen bytes..")),
        V("empty", FieldValue::Str("")),
        V("z", FieldValue::Bool(false)),
        V("fresh", FieldValue::Uint(3)),
        V("pieces", FieldValue::Uint(300)),
    ];
    let long_text = [
        V("text", FieldValue::Str(text)),
        V("count", FieldValue::Uint(1)),
    ];
    // A `Debug` text whose annotation takes 128 bytes or more.
    let long_debug = [D("pieces", debug), V("count", FieldValue::Uint(2))];
    let mut shapes: Vec<Vec<TestField>> = vec![wide.to_vec(), long_text.to_vec()];
    // The message growing a byte at a time, then shrinking.
    let tail = [
        V("count", FieldValue::Uint(5)),
        V("label", FieldValue::Str("sixteen bytes...")),
        V("text", FieldValue::Str("sixteen bytes...")),
        V("d", FieldValue::Double(1.5)),
        V("big", FieldValue::Uint(1 << 20)),
    ];
    let sweep: Vec<usize> = (20..=MESSAGE.len())
        .chain((20..MESSAGE.len()).rev())
        .collect();
    for &n in &sweep {
        let mut fields = vec![L("message", &MESSAGE[..n])];
        fields.extend_from_slice(&tail);
        shapes.push(fields);
    }
    shapes.push(long_debug.to_vec());
    shapes.push(wide.to_vec());
    let (mut streamed, mut flat, mut general) = (seq(), seq(), seq());
    let (mut a, mut b, mut c) = (
        VecWriter::in_place(),
        VecWriter::in_place(),
        VecWriter::default(),
    );
    let head = ("level", "INFO");
    let at = site("event", head);
    let mut ns = 1_000;
    // Streamed events, those not tried in place first, and the size of
    // the last packet.
    let (mut taken, mut at_once, mut last) = (0, 0, 0);
    for round in 0..3 {
        if round == 2 {
            (a.in_place, b.in_place) = (false, false);
        }
        for fields in &shapes {
            // Deltas of one, two and three bytes.
            ns += [100, 1_000, 20_000][round];
            let (values, text) = collected(fields);
            let args = FlatArgs {
                head,
                values: &values,
                text: &text,
            };
            const I: u8 = EventType::Instant as u8;
            let source = TestFields {
                fields,
                complete: true,
            };
            let tries = a.in_place_tries;
            let s = streamed.write_flat_streamed::<I, _, _>(&mut a, at, &CAT, &source, ns);
            if s == Streamed::Written {
                taken += 1;
                // Tried in place unless the last packet was too long for
                // that (or there is no room in place).
                let tried = a.in_place_tries > tries;
                assert_eq!(tried, a.in_place && last <= 127, "round {round}");
                at_once += usize::from(!tried);
            }
            if s == Streamed::Declined {
                assert!(streamed.write_flat::<I, _>(&mut a, at, &CAT, "event", &args, ns));
            }
            assert!(flat.write_flat::<I, _>(&mut b, at, &CAT, "event", &args, ns));
            let list: Vec<Arg<'_>> = args.iter().map(|(n, v)| Arg::new(n, v)).collect();
            let mut data = ev(EventType::Instant, EventName::Static("event"));
            data.timestamp = Timestamp::boottime(ns);
            data.args = &list;
            assert!(general.write_event(&mut c, &data, None));
            last = a.packets.last().map_or(0, Vec::len);
        }
    }
    assert_eq!(a.packets, b.packets);
    assert_eq!(a.decoded_apart(), c.decoded_apart());
    // Every TrackEvent's length as short as it goes (but the first event's,
    // which the general path writes); some of 128 bytes or more, some
    // shorter in a packet longer than 127 bytes.
    let (long, band) = lengths_as_short_as_they_go(&a);
    assert!(
        long >= 3 * 20 && band >= 3,
        "{long} long, {band} in between"
    );
    // All but the first two events (the first interns the names, the
    // second makes the trace point's head).
    let events = 3 * shapes.len();
    assert_eq!(taken, events - 2, "{taken} of {events} streamed");
    assert!(at_once >= long, "{at_once} of {taken} not tried in place");
}
