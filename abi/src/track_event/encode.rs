//! The packets of a track event sequence, encoded with a [`Cursor`]: one
//! definition of their bytes for every writer in the workspace (the
//! firmware's [`TrackEventWriter`](super::TrackEventWriter) and the host
//! producer's sequences).
//!
//! Field order and size encoding are fixed, so the same event always
//! becomes the same bytes: the TracePacket fields `timestamp`,
//! `timestamp_clock_id` (absolute times only), `sequence_flags`,
//! `track_event` (`type`, counter value, `track_uuid`, categories, name,
//! debug annotations, flows, terminating flows), then
//! `interned_data` (categories, event names, annotation names, each in the
//! order they were interned). Nested messages take a 1-byte size when the
//! encoder is told the packet stays under 128 bytes (`SHORT = true`, what
//! a packet written in place in a chunk always is), else a 2-byte
//! redundant varint.

use crate::proto::{Args, Cursor, Target, Template};
use crate::trace::{
    builtin_clock, clock, clock_snapshot, counter_descriptor, debug_annotation, interned_string,
    sequence_flags, trace_packet, trace_packet_defaults, track_descriptor, track_event,
    track_event_defaults,
};

use super::intern::Kind;
use super::track::AnyTrack;

pub use crate::trace::track_event::Type;

/// A string field: an interned id, or the string itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Str<'a> {
    /// `*_iid`: interned on this sequence.
    Iid(u64),
    /// The string inline.
    Inline(&'a str),
}

/// A flat debug annotation value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgValue<'a> {
    /// `bool_value`.
    Bool(bool),
    /// `uint_value`.
    Uint(u64),
    /// `int_value`.
    Int(i64),
    /// `double_value`.
    Double(f64),
    /// `string_value`.
    Str(&'a str),
    /// `pointer_value`.
    Pointer(u64),
}

macro_rules! arg_from {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for ArgValue<'_> {
            #[inline(always)]
            fn from(v: $t) -> Self {
                ArgValue::$v(v.into())
            }
        }
    )*};
}
arg_from!(bool => Bool, u8 => Uint, u16 => Uint, u32 => Uint, u64 => Uint,
    i8 => Int, i16 => Int, i32 => Int, i64 => Int, f32 => Double, f64 => Double);

impl<'a> From<&'a str> for ArgValue<'a> {
    #[inline(always)]
    fn from(v: &'a str) -> Self {
        ArgValue::Str(v)
    }
}

/// A debug annotation: a name and a flat value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arg<'a> {
    /// The name.
    pub name: Str<'a>,
    /// The value.
    pub value: ArgValue<'a>,
}

/// A counter sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CounterValue {
    /// `counter_value`.
    Int(i64),
    /// `double_counter_value`.
    Double(f64),
}

macro_rules! counter_from {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for CounterValue {
            #[inline(always)]
            fn from(v: $t) -> Self {
                CounterValue::$v(v.into())
            }
        }
    )*};
}
counter_from!(i8 => Int, i16 => Int, i32 => Int, i64 => Int, u8 => Int, u16 => Int, u32 => Int,
    f32 => Double, f64 => Double);

/// When an event happened, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Time {
    /// Nanoseconds since the previous event on the sequence's incremental
    /// clock 64 (the sequence's default clock).
    Delta(u64),
    /// An absolute time on clock `clock_id`.
    Absolute {
        /// `timestamp_clock_id`.
        clock_id: u32,
        /// `timestamp`.
        ns: u64,
    },
}

/// A string the packet interns (an `interned_data` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewString<'a> {
    /// Which `InternedData` field.
    pub kind: Kind,
    /// Its id.
    pub iid: u64,
    /// The string.
    pub name: &'a str,
}

/// One track event, with every string already resolved to an id or
/// inline text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event<'a> {
    /// The type.
    pub kind: Type,
    /// The time.
    pub time: Time,
    /// `track_uuid`, when not the sequence's default track.
    pub track_uuid: Option<u64>,
    /// The categories.
    pub categories: &'a [Str<'a>],
    /// The name.
    pub name: Option<Str<'a>>,
    /// Debug annotations.
    pub args: &'a [Arg<'a>],
    /// `flow_ids`.
    pub flows: &'a [u64],
    /// `terminating_flow_ids`.
    pub terminating_flows: &'a [u64],
    /// The counter value (counters).
    pub counter: Option<CounterValue>,
    /// Strings first used by this event, in the order they were interned.
    pub interned: &'a [NewString<'a>],
}

impl<'a> Event<'a> {
    /// An event of `kind` at `time` with nothing else.
    pub const fn new(kind: Type, time: Time) -> Self {
        Self {
            kind,
            time,
            track_uuid: None,
            categories: &[],
            name: None,
            args: &[],
            flows: &[],
            terminating_flows: &[],
            counter: None,
            interned: &[],
        }
    }
}

/// Writes the time fields and `sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE`.
#[inline(always)]
fn time_and_flags<T: Target>(c: &mut Cursor<T>, time: Time) {
    match time {
        Time::Delta(ns) => c.uint(trace_packet::TIMESTAMP, ns),
        Time::Absolute { clock_id, ns } => absolute_time(c, clock_id, ns),
    }
    c.uint(
        trace_packet::SEQUENCE_FLAGS,
        u64::from(sequence_flags::SEQ_NEEDS_INCREMENTAL_STATE),
    );
}

#[inline(always)]
fn str_field<T: Target>(c: &mut Cursor<T>, s: Str<'_>, iid_field: u32, field: u32) {
    match s {
        Str::Iid(iid) => c.uint(iid_field, iid),
        Str::Inline(s) => c.string(field, s),
    }
}

/// Writes a flat debug annotation value.
#[inline(always)]
pub fn arg_value<T: Target>(c: &mut Cursor<T>, value: ArgValue<'_>) {
    use debug_annotation as f;
    match value {
        ArgValue::Bool(b) => c.boolean(f::BOOL_VALUE, b),
        ArgValue::Uint(u) => c.uint(f::UINT_VALUE, u),
        ArgValue::Int(i) => c.int(f::INT_VALUE, i),
        ArgValue::Double(d) => c.double(f::DOUBLE_VALUE, d),
        ArgValue::Str(s) => c.string(f::STRING_VALUE, s),
        ArgValue::Pointer(p) => c.uint(f::POINTER_VALUE, p),
    }
}

/// Writes one event packet's fields (see the module docs).
#[inline(never)]
pub fn event<T: Target, const SHORT: bool>(c: &mut Cursor<T>, ev: &Event<'_>) {
    let te = event_head::<T, SHORT>(
        c,
        ev.time,
        ev.kind,
        ev.counter,
        ev.track_uuid,
        ev.categories,
        ev.name,
    );
    for arg in ev.args {
        let a = c.begin_message::<SHORT>(track_event::DEBUG_ANNOTATIONS);
        str_field(
            c,
            arg.name,
            debug_annotation::NAME_IID,
            debug_annotation::NAME,
        );
        arg_value(c, arg.value);
        c.end_message::<SHORT>(a);
    }
    for &flow in ev.flows {
        c.fixed64_field(track_event::FLOW_IDS, flow);
    }
    for &flow in ev.terminating_flows {
        c.fixed64_field(track_event::TERMINATING_FLOW_IDS, flow);
    }
    event_tail::<T, SHORT>(c, te, ev.interned);
}

/// The fields [`event`] writes before the debug annotations: time, flags,
/// `type`, the counter value, `track_uuid`, categories and name, leaving
/// the `track_event` open; close it with [`event_tail`]. (An event without
/// annotations and flows is these two calls.)
#[cfg_attr(target_os = "none", inline(never))]
#[cfg_attr(not(target_os = "none"), inline)]
pub fn event_head<T: Target, const SHORT: bool>(
    c: &mut Cursor<T>,
    time: Time,
    kind: Type,
    counter: Option<CounterValue>,
    track_uuid: Option<u64>,
    categories: &[Str<'_>],
    name: Option<Str<'_>>,
) -> usize {
    let te = event_begin::<T, SHORT>(c, time, kind);
    if let Some(v) = counter {
        counter_value(c, v);
    }
    if let Some(uuid) = track_uuid {
        c.uint(track_event::TRACK_UUID, uuid);
    }
    for &cat in categories {
        category(c, cat);
    }
    if let Some(n) = name {
        self::name(c, n);
    }
    te
}

/// The fields [`event`] writes after the flows: closes the `track_event`
/// opened at `te` and writes `interned_data`.
#[cfg_attr(target_os = "none", inline(never))]
#[cfg_attr(not(target_os = "none"), inline)]
pub fn event_tail<T: Target, const SHORT: bool>(
    c: &mut Cursor<T>,
    te: usize,
    interned: &[NewString<'_>],
) {
    c.end_message::<SHORT>(te);
    interned_data::<T, SHORT>(c, interned);
}

/// Writes an event's fields up to and including its `type`, leaving its
/// `track_event` open: close it with [`Cursor::end_message`] after the
/// fields that follow ([`event`]'s order).
#[inline]
pub fn event_begin<T: Target, const SHORT: bool>(
    c: &mut Cursor<T>,
    time: Time,
    kind: Type,
) -> usize {
    time_and_flags(c, time);
    let te = c.begin_message::<SHORT>(trace_packet::TRACK_EVENT);
    c.uint(track_event::TYPE, kind as u64);
    te
}

/// Writes a category (`category_iids` or `categories`).
#[inline]
pub fn category<T: Target>(c: &mut Cursor<T>, s: Str<'_>) {
    str_field(c, s, track_event::CATEGORY_IIDS, track_event::CATEGORIES);
}

/// Writes an event name (`name_iid` or `name`).
#[inline]
pub fn name<T: Target>(c: &mut Cursor<T>, s: Str<'_>) {
    str_field(c, s, track_event::NAME_IID, track_event::NAME);
}

/// Writes a counter value (`counter_value` or `double_counter_value`).
#[inline]
pub fn counter_value<T: Target>(c: &mut Cursor<T>, v: CounterValue) {
    match v {
        CounterValue::Int(v) => c.int(track_event::COUNTER_VALUE, v),
        CounterValue::Double(v) => c.double(track_event::DOUBLE_COUNTER_VALUE, v),
    }
}

/// Writes `interned_data` for `entries` (nothing if there are none),
/// grouped by field: categories, event names, annotation names.
#[inline(never)]
pub fn interned_data<T: Target, const SHORT: bool>(c: &mut Cursor<T>, entries: &[NewString<'_>]) {
    if entries.is_empty() {
        return;
    }
    let d = c.begin_message::<SHORT>(trace_packet::INTERNED_DATA);
    for kind in [Kind::Category, Kind::EventName, Kind::AnnotationName] {
        for e in entries.iter().filter(|e| e.kind == kind) {
            interned_entry::<T, SHORT>(c, e);
        }
    }
    c.end_message::<SHORT>(d);
}

/// Writes one entry of `interned_data` (an `InternedString` in the field of
/// its kind), as [`interned_data`] writes each.
#[inline]
pub fn interned_entry<T: Target, const SHORT: bool>(c: &mut Cursor<T>, e: &NewString<'_>) {
    let entry = c.begin_message::<SHORT>(e.kind.field());
    c.uint(interned_string::IID, e.iid);
    c.string(interned_string::NAME, e.name);
    c.end_message::<SHORT>(entry);
}

/// Writes the fields of the packet that starts (or restarts) a sequence:
/// stamped `ns` on `clock_id`, `sequence_flags = SEQ_INCREMENTAL_STATE_CLEARED`,
/// `trace_packet_defaults` (events on clock 64, on track `default_track`),
/// and a `clock_snapshot` defining clock 64 as an incremental clock equal
/// to `clock_id` now (the C++ SDK's convention): [`RESET`].
pub fn reset<T: Target>(c: &mut Cursor<T>, clock_id: u32, ns: u64, default_track: u64) {
    c.template(RESET, &reset_args(clock_id, ns, &[default_track]));
}

/// Writes `timestamp = ns` and `timestamp_clock_id = clock_id`: a packet
/// stamped on an absolute clock.
#[cfg_attr(target_os = "none", inline(never))]
#[cfg_attr(not(target_os = "none"), inline)]
pub fn absolute_time<T: Target>(c: &mut Cursor<T>, clock_id: u32, ns: u64) {
    c.uint(trace_packet::TIMESTAMP, ns);
    c.uint(trace_packet::TIMESTAMP_CLOCK_ID, u64::from(clock_id));
}

/// [`reset`] after its time fields (a writer that marks a loss between
/// them and the rest): [`RESET_TAIL`].
pub fn reset_tail<T: Target>(c: &mut Cursor<T>, clock_id: u32, ns: u64, default_track: u64) {
    c.template(RESET_TAIL, &reset_args(clock_id, ns, &[default_track]));
}

/// One clock's reading in a `ClockSnapshot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockValue {
    /// `clock_id`.
    pub clock_id: u32,
    /// `timestamp` (ns).
    pub ns: u64,
    /// `is_incremental`.
    pub incremental: bool,
}

impl ClockValue {
    /// An absolute clock's reading.
    pub const fn absolute(clock_id: u32, ns: u64) -> Self {
        Self {
            clock_id,
            ns,
            incremental: false,
        }
    }
}

/// Writes a `clock_snapshot` field with `clocks`.
#[inline(never)]
pub fn clock_snapshot<T: Target>(c: &mut Cursor<T>, clocks: &[ClockValue]) {
    let s = c.begin_short_field(trace_packet::CLOCK_SNAPSHOT);
    for k in clocks {
        let m = c.begin_short_field(clock_snapshot::CLOCKS);
        c.uint(clock::CLOCK_ID, u64::from(k.clock_id));
        c.uint(clock::TIMESTAMP, k.ns);
        if k.incremental {
            c.boolean(clock::IS_INCREMENTAL, true);
        }
        c.end_short(m);
    }
    c.end_short(s);
}

/// Writes a track descriptor packet's fields: stamped `ns` on `clock_id`
/// (not on clock 64: descriptors do not need incremental state, so a reader
/// may see one while clock 64 is invalid): [`DESCRIPTOR`].
pub fn descriptor<T: Target>(c: &mut Cursor<T>, clock_id: u32, ns: u64, track: &AnyTrack) {
    c.template(
        DESCRIPTOR,
        &track.track().descriptor([ns, u64::from(clock_id)]),
    );
}

// The packets of a sequence as templates (see `proto::template`): the one
// definition of their bytes, which the firmware writer hands to one
// encoder and the functions above write with a cursor.

/// Value of [`RESET`] and [`DESCRIPTOR`]: the packet's time (ns).
pub const NS: usize = 0;
/// Value of [`RESET`] and [`DESCRIPTOR`]: the clock of [`NS`].
pub const CLOCK: usize = 1;
/// Value of [`RESET`] (the default track's) and [`DESCRIPTOR`]: a track's
/// uuid.
pub const UUID: usize = 2;
/// Value of [`DESCRIPTOR`]: the parent track's uuid.
pub const PARENT: usize = 3;
/// Value of [`DESCRIPTOR`]: a counter track's unit.
pub const UNIT: usize = 4;

/// `timestamp` and `timestamp_clock_id` of values [`NS`] and [`CLOCK`].
const fn time(t: Template) -> Template {
    t.uint(trace_packet::TIMESTAMP, NS)
        .uint(trace_packet::TIMESTAMP_CLOCK_ID, CLOCK)
}

/// A reset packet after its time fields.
const fn reset_fields(t: Template) -> Template {
    t.constant(
        trace_packet::SEQUENCE_FLAGS,
        sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED as u64,
    )
    .begin(trace_packet::TRACE_PACKET_DEFAULTS)
    .constant(
        trace_packet_defaults::TIMESTAMP_CLOCK_ID,
        builtin_clock::INCREMENTAL as u64,
    )
    .begin(trace_packet_defaults::TRACK_EVENT_DEFAULTS)
    .uint(track_event_defaults::TRACK_UUID, UUID)
    .end()
    .end()
    // Clock `CLOCK` and clock 64, both at `NS`, 64 incremental.
    .begin(trace_packet::CLOCK_SNAPSHOT)
    .begin(clock_snapshot::CLOCKS)
    .uint(clock::CLOCK_ID, CLOCK)
    .uint(clock::TIMESTAMP, NS)
    .end()
    .begin(clock_snapshot::CLOCKS)
    .constant(clock::CLOCK_ID, builtin_clock::INCREMENTAL as u64)
    .uint(clock::TIMESTAMP, NS)
    .constant(clock::IS_INCREMENTAL, 1)
    .end()
    .end()
}

/// Skip bit of [`RESET`]: the time fields alone (a plain packet).
pub const PLAIN: u32 = 1;

/// The reset packet ([`reset`]): values [`NS`], [`CLOCK`], [`UUID`]; with
/// skip bit [`PLAIN`], its time fields alone.
pub const RESET: &[u8] =
    crate::template!(reset_fields(time(Template::new()).skip_if(PLAIN)).end_skip());

/// [`RESET`] after its time fields ([`reset_tail`]).
pub const RESET_TAIL: &[u8] = crate::template!(reset_fields(Template::new()));

/// [`RESET`]'s and [`RESET_TAIL`]'s [`Args`]; `default_track` holds the
/// default track's uuid.
#[inline(always)]
pub fn reset_args(clock_id: u32, ns: u64, default_track: &[u64; 1]) -> Args<'_> {
    Args {
        skip: 0,
        t: [ns, u64::from(clock_id)],
        v: default_track,
        s: &[],
    }
}

/// A packet of one `interned_data` entry, what [`interned_data`] writes
/// for it after `sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE`: the entry
/// in the field whose tag (length-delimited) is value 0, its `iid` value 1,
/// its `name` string 0 ([`entry_args`]).
pub const INTERNED_ALONE: &[u8] = crate::template!(Template::new()
    .constant(
        trace_packet::SEQUENCE_FLAGS,
        sequence_flags::SEQ_NEEDS_INCREMENTAL_STATE as u64
    )
    .begin(trace_packet::INTERNED_DATA)
    .begin_slot(0)
    .uint(interned_string::IID, 1)
    .string(interned_string::NAME, 0)
    .end()
    .end());

/// [`INTERNED_ALONE`]'s [`Args`] for `e`, whose name `name` holds.
#[inline(always)]
pub fn entry_args<'a>(e: &NewString<'_>, name: &'a [&'a str; 1]) -> Args<'a> {
    let field = crate::proto::wire::tag(
        e.kind.field(),
        crate::proto::wire::WireType::LengthDelimited,
    );
    Args {
        skip: 0,
        t: [u64::from(field), e.iid],
        v: &[],
        s: name,
    }
}

/// Skip bits of [`TRACK`] and [`DESCRIPTOR`]: no parent, not a counter
/// track, no unit, no unit name.
pub const NO_PARENT: u32 = 1;
/// See [`NO_PARENT`].
pub const NOT_COUNTER: u32 = 2;
/// See [`NO_PARENT`].
pub const NO_UNIT: u32 = 4;
/// See [`NO_PARENT`].
pub const NO_UNIT_NAME: u32 = 8;

/// A `TrackDescriptor`'s fields: `uuid` ([`UUID`]), `parent_uuid`
/// ([`PARENT`]), `name` (string 0), and a counter track's `counter`:
/// `unit` ([`UNIT`]), `unit_name` (string 1).
const fn track_fields(t: Template) -> Template {
    t.uint(track_descriptor::UUID, UUID)
        .skip_if(NO_PARENT)
        .uint(track_descriptor::PARENT_UUID, PARENT)
        .end_skip()
        .string(track_descriptor::NAME, 0)
        .skip_if(NOT_COUNTER)
        .begin(track_descriptor::COUNTER)
        .skip_if(NO_UNIT)
        .uint(counter_descriptor::UNIT, UNIT)
        .end_skip()
        .skip_if(NO_UNIT_NAME)
        .string(counter_descriptor::UNIT_NAME, 1)
        .end_skip()
        .end()
        .end_skip()
}

/// A track's `TrackDescriptor` fields ([`Track::encode`](super::Track::encode)).
pub const TRACK: &[u8] = crate::template!(track_fields(Template::new()));

/// A track descriptor packet ([`descriptor`]).
pub const DESCRIPTOR: &[u8] = crate::template!(track_fields(
    time(Template::new()).begin(trace_packet::TRACK_DESCRIPTOR)
)
.end());

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::TARGET_SLACK;
    use std::vec::Vec;

    fn bytes(f: impl FnOnce(&mut Cursor<&mut [u8; 256 + TARGET_SLACK]>)) -> Vec<u8> {
        let mut b = [0u8; 256 + TARGET_SLACK];
        let mut c = Cursor::new(&mut b);
        f(&mut c);
        let n = c.finish().unwrap();
        b[..n].to_vec()
    }

    #[test]
    fn a_plain_slice_begin() {
        let ev = Event {
            categories: &[Str::Iid(1)],
            name: Some(Str::Iid(2)),
            ..Event::new(Type::SliceBegin, Time::Delta(5))
        };
        let b = bytes(|c| event::<_, true>(c, &ev));
        assert_eq!(b, [0x40, 5, 0x68, 2, 0x5A, 6, 0x48, 1, 0x18, 1, 0x50, 2]);
    }

    #[test]
    fn short_and_long_sizes_differ_only_in_size_bytes() {
        let interned = [NewString {
            kind: Kind::EventName,
            iid: 1,
            name: "n",
        }];
        let args = [Arg {
            name: Str::Inline("k"),
            value: ArgValue::Int(-1),
        }];
        let ev = Event {
            name: Some(Str::Iid(1)),
            args: &args,
            flows: &[7],
            interned: &interned,
            ..Event::new(
                Type::Instant,
                Time::Absolute {
                    clock_id: 6,
                    ns: 300,
                },
            )
        };
        let short = bytes(|c| event::<_, true>(c, &ev));
        let long = bytes(|c| event::<_, false>(c, &ev));
        // 4 nested messages (track event, annotation, interned data and
        // its entry), one more size byte each.
        assert_eq!(long.len(), short.len() + 4);
        assert_eq!(&short[..8], &[0x40, 0xAC, 0x02, 0xD0, 0x03, 6, 0x68, 2]);
    }

    #[test]
    fn one_entry_is_interned_data_of_one() {
        for kind in [Kind::Category, Kind::EventName, Kind::AnnotationName] {
            for (iid, name) in [(1, ""), (127, "io"), (128, "a name"), (70_000, "λ")] {
                let e = NewString { kind, iid, name };
                let want = bytes(|c| interned_data::<_, true>(c, &[e]));
                let got = bytes(|c| {
                    let d = c.begin_short_field(trace_packet::INTERNED_DATA);
                    interned_entry::<_, true>(c, &e);
                    c.end_short(d);
                });
                assert_eq!(got, want, "{kind:?} {iid} {name}");
                // The entry's field: the kind's InternedData field.
                assert_eq!(want[2] >> 3, kind.field() as u8);
                // The template of a packet of it alone.
                let alone = bytes(|c| c.template(INTERNED_ALONE, &entry_args(&e, &[name])));
                let flags = [0x68, sequence_flags::SEQ_NEEDS_INCREMENTAL_STATE as u8];
                assert_eq!(alone, [&flags[..], &want].concat(), "{kind:?} {iid} {name}");
            }
        }
    }

    #[test]
    fn the_reset_packet_defines_clock_64() {
        let b = bytes(|c| reset(c, 65, 1000, 9));
        assert_eq!(
            b,
            [
                0x40, 0xE8, 0x07, 0xD0, 0x03, 65, 0x68, 1, // time, clock, flags
                0xDA, 0x03, 7, 0xD0, 0x03, 64, 0x5A, 2, 0x58, 9, // defaults
                0x32, 16, 0x0A, 5, 0x08, 65, 0x10, 0xE8, 0x07, // clock 65
                0x0A, 7, 0x08, 64, 0x10, 0xE8, 0x07, 0x18, 1 // clock 64
            ]
        );
        // Its tail, after the time fields.
        assert_eq!(bytes(|c| reset_tail(c, 65, 1000, 9)), b[6..]);
        // With `PLAIN`, its time fields alone.
        let plain = Args {
            skip: PLAIN,
            ..reset_args(65, 1000, &[9])
        };
        assert_eq!(bytes(|c| c.template(RESET, &plain)), b[..6]);
        // A track's descriptor values are its reset's values too (the
        // writer writes both packets of a restart with one set).
        static DEFAULT: super::super::track::Track =
            super::super::track::Track::new("d").with_uuid(9);
        let mut args = DEFAULT.descriptor([1000, 65]);
        for skip in [0, PLAIN] {
            args.skip = skip;
            let want = Args {
                skip,
                ..reset_args(65, 1000, &[9])
            };
            assert_eq!(
                bytes(|c| c.template(RESET, &args)),
                bytes(|c| c.template(RESET, &want))
            );
        }
    }

    #[test]
    fn descriptors_are_stamped_on_the_absolute_clock() {
        use super::super::track::{CounterTrack, Track};
        use crate::trace::counter_descriptor::Unit;
        static PARENT: Track = Track::new("motor").with_uuid(7);
        static PLAIN: Track = Track::new("t").with_uuid(3);
        static CURRENT: CounterTrack = CounterTrack::new("i")
            .with_uuid(9)
            .with_parent(&PARENT)
            .with_unit(Unit::Count)
            .with_unit_name("mA");
        let b = bytes(|c| descriptor(c, 65, 300, &AnyTrack::Slices(&PLAIN)));
        assert_eq!(
            b,
            [0x40, 0xAC, 0x02, 0xD0, 0x03, 65, 0xE2, 0x03, 5, 0x08, 3, 0x12, 1, b't']
        );
        let b = bytes(|c| descriptor(c, 65, 300, &AnyTrack::Counter(&CURRENT)));
        let mut fields = [0u8; 32 + crate::proto::TARGET_SLACK];
        let mut f = Cursor::new(&mut fields);
        CURRENT.encode(&mut f);
        let n = f.finish().unwrap();
        assert_eq!(b[..6], [0x40, 0xAC, 0x02, 0xD0, 0x03, 65]);
        assert_eq!(b[6..9], [0xE2, 0x03, n as u8]);
        assert_eq!(b[9..], fields[..n]);
    }
}
