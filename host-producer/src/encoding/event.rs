//! Encoding track events into TracePackets, with per-sequence incremental
//! state (interning and track descriptors).
//!
//! # What a sequence looks like
//!
//! 1. A reset packet: `sequence_flags = sequence_flags::SEQ_INCREMENTAL_STATE_CLEARED` (1),
//!    `trace_packet_defaults` with `track_event_defaults.track_uuid` = the
//!    writing thread's track (events on that track omit `track_uuid`) and
//!    `timestamp_clock_id` = 64, and a `clock_snapshot` defining clock 64
//!    as an incremental clock that equals BOOTTIME at the reset (the C++
//!    SDK's convention). The reset packet itself is stamped on BOOTTIME.
//! 2. Descriptor packets for the thread track and the process track.
//! 3. Events, each with `sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE` (2)
//!    and a timestamp that is the delta (ns) on clock 64 since the previous
//!    event on the sequence (1-3 bytes instead of 7-9). An event stamped
//!    before the previous one, or on another clock, carries its absolute
//!    time and `timestamp_clock_id` instead; descriptor packets are stamped
//!    on BOOTTIME explicitly.
//!    Static event names, categories and annotation names are referenced by
//!    interned id (from 1 per kind); the first packet using a string carries
//!    it in `interned_data`. A track other than the thread's gets its
//!    descriptor packet before the first event that uses it.
//!
//! # Invariants
//!
//! * Every id an event references was emitted on this sequence after its
//!   last reset: interning tables and the set of emitted tracks are cleared
//!   together with each reset packet.
//! * When any packet of a sequence is lost (dropped by the writer), the
//!   sequence is reset before its next event, so readers that skipped the
//!   dependent packets after the loss resynchronise (1 after 2s).
//! * Clock 64 is incremental state like the interning tables: every packet
//!   using it needs state (flag 2), and every loss resets the sequence, whose
//!   reset packet re-defines the clock. So a reader never applies a delta
//!   to a base it did not see, and losing packets never shifts later ones.
//! * The writer's clock-64 base only moves forward, so deltas are never
//!   negative.

use shmtrace_abi::proto::wire::WireType;
use shmtrace_abi::proto::{Cursor, Message, Sink, Target, TARGET_SLACK};
use shmtrace_abi::trace::{
    builtin_clock, data_loss, debug_annotation, interned_string, sequence_flags, tag1, tag2,
    trace_packet, track_event as event_field,
};
use shmtrace_abi::track_event::encode;
use shmtrace_abi::track_event::intern::Kind;

use crate::encoding::annotation::{write_annotation, Arg, ArgName, NameRef};
use crate::encoding::intern::{Lookup, StrInterner, TrackSet};
use crate::track_event::category::Category;
use crate::track_event::track::{Clock, Flow, ThreadTrack, Timestamp, Track};

pub use shmtrace_abi::trace::track_event::Type as EventType;
pub use shmtrace_abi::track_event::CounterValue;

/// Capacity of the scratch buffer events are encoded in when the chunk
/// has no room for them in place.
pub(crate) const FAST_CAP: usize = 512;

/// The scratch buffer: [`FAST_CAP`] bytes and the cursor's slack.
pub(crate) type Scratch = [u8; FAST_CAP + TARGET_SLACK];

/// The sequence-scoped incremental clock events are stamped on (deltas in
/// ns since the previous event; the C++ SDK's choice of id).
pub const INCREMENTAL_CLOCK_ID: u32 = builtin_clock::INCREMENTAL;
/// `BuiltinClock.BOOTTIME`.
const BOOTTIME_CLOCK_ID: u32 = builtin_clock::BOOTTIME;
/// `SequenceFlags.SEQ_NEEDS_INCREMENTAL_STATE`.
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = sequence_flags::SEQ_NEEDS_INCREMENTAL_STATE;

/// New interned entries one packet can carry; beyond that, strings are
/// written inline.
const MAX_NEW_INTERNED_PER_PACKET: usize = 16;

/// Constant tags of the fast path, from the trace vocabulary.
const TAG_TIMESTAMP: u8 = tag1(trace_packet::TIMESTAMP, WireType::Varint);
const TAG_SEQUENCE_FLAGS: u8 = tag1(trace_packet::SEQUENCE_FLAGS, WireType::Varint);
const TAG_TRACK_EVENT: u8 = tag1(trace_packet::TRACK_EVENT, WireType::LengthDelimited);
const TAG_CATEGORY_IIDS: u8 = tag1(event_field::CATEGORY_IIDS, WireType::Varint);
const TAG_DEBUG_ANNOTATIONS: u8 = tag1(event_field::DEBUG_ANNOTATIONS, WireType::LengthDelimited);
const TAG_TYPE: u8 = tag1(event_field::TYPE, WireType::Varint);
const TAG_NAME_IID: u8 = tag1(event_field::NAME_IID, WireType::Varint);
const TAG_TRACK_UUID: u8 = tag1(event_field::TRACK_UUID, WireType::Varint);
const TAG_COUNTER_VALUE: [u8; 2] = tag2(event_field::COUNTER_VALUE, WireType::Varint);
/// `DebugAnnotation.name_iid`.
const TAG_ANNOTATION_NAME_IID: u8 = tag1(debug_annotation::NAME_IID, WireType::Varint);
/// `DebugAnnotation.bool_value`.
const TAG_ARG_BOOL: u8 = tag1(debug_annotation::BOOL_VALUE, WireType::Varint);
/// `DebugAnnotation.uint_value`.
const TAG_ARG_UINT: u8 = tag1(debug_annotation::UINT_VALUE, WireType::Varint);
/// `DebugAnnotation.int_value`.
const TAG_ARG_INT: u8 = tag1(debug_annotation::INT_VALUE, WireType::Varint);
/// `DebugAnnotation.double_value`.
const TAG_ARG_DOUBLE: u8 = tag1(debug_annotation::DOUBLE_VALUE, WireType::Fixed64);
/// `DebugAnnotation.string_value`.
const TAG_ARG_STRING: u8 = tag1(debug_annotation::STRING_VALUE, WireType::LengthDelimited);
/// `DebugAnnotation.pointer_value`.
const TAG_ARG_POINTER: u8 = tag1(debug_annotation::POINTER_VALUE, WireType::Varint);

/// An event name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventName<'a> {
    /// No name (slice ends, counters).
    None,
    /// A `'static` name: interned per sequence (`name_iid`).
    Static(&'static str),
    /// A name built at run time: written inline (`name`).
    Dynamic(&'a str),
}

impl From<&'static str> for EventName<'_> {
    #[inline]
    fn from(s: &'static str) -> Self {
        EventName::Static(s)
    }
}

/// Everything about one event except the writer it goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventData<'a> {
    pub kind: EventType,
    pub category: Option<&'static Category>,
    pub name: EventName<'a>,
    pub track: Option<&'a Track<'a>>,
    pub timestamp: Timestamp,
    pub flows: &'a [Flow],
    pub terminating_flows: &'a [Flow],
    pub args: &'a [Arg<'a>],
    pub counter: Option<CounterValue>,
}

impl<'a> EventData<'a> {
    pub(crate) fn new(
        kind: EventType,
        category: Option<&'static Category>,
        timestamp: Timestamp,
    ) -> Self {
        EventData {
            kind,
            category,
            name: EventName::None,
            track: None,
            timestamp,
            flows: &[],
            terminating_flows: &[],
            args: &[],
            counter: None,
        }
    }
}

/// The most common event shapes, which skip [`EventData`]: a slice begin
/// or an instant with a static name (and maybe flat debug annotations with
/// static names), or a slice end, on the calling thread's track; or an
/// integer counter sample on a counter track; stamped `ns` on BOOTTIME,
/// with nothing else. A sequence writes one with a dedicated encoder when
/// everything it references is known (ids in the interning front caches,
/// the counter track's descriptor emitted just before), and as the
/// equivalent [`EventData`] otherwise.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlainEvent<'a> {
    pub kind: EventType,
    pub category: &'static Category,
    /// The event name (slice begins and instants only).
    pub name: &'static str,
    /// Debug annotations (slice begins and instants only; see
    /// [`SequenceState::write_plain_args`]).
    pub args: &'a [Arg<'a>],
    /// The counter track (counters only).
    pub track: Option<&'a Track<'a>>,
    /// The counter value (counters only).
    pub value: i64,
    /// BOOTTIME nanoseconds.
    pub ns: u64,
}

impl<'a> PlainEvent<'a> {
    /// The same event for the general path.
    fn data(&self) -> EventData<'a> {
        let mut data = EventData::new(self.kind, Some(self.category), Timestamp::boottime(self.ns));
        match self.kind {
            EventType::SliceBegin | EventType::Instant => {
                data.name = EventName::Static(self.name);
                data.args = self.args;
            }
            EventType::Counter => {
                data.track = self.track;
                data.counter = Some(CounterValue::Int(self.value));
            }
            EventType::SliceEnd => {}
        }
        data
    }
}

/// Bytes of `v` as a varint.
#[inline(always)]
fn varint_len(v: u64) -> u8 {
    shmtrace_abi::proto::wire::varint_len(v) as u8
}

/// Appends varint `v` through `f`, keeping the cursor in registers.
///
/// [`Cursor::varint`] hands a value above 32 bits to an out-of-line
/// function that takes the cursor by reference. Where that call is inlined
/// (whether or not it runs), the cursor's address escapes, so the compiler
/// keeps its pointer, mask and length in memory and reloads them after
/// every byte stored through the window. Here a value above 32 bits is
/// split into two words by a function that never sees the cursor.
#[inline(always)]
fn put_varint<T: Target>(f: &mut Cursor<T>, v: u64) {
    match u32::try_from(v) {
        Ok(v) => f.varint32(v),
        Err(_) => {
            let (low, high) = crate::encoding::intern::varint_words(v);
            let n = usize::from(varint_len(v));
            f.word(low, n.min(8));
            if n > 8 {
                f.word(u64::from(high), n - 8);
            }
        }
    }
}

/// Appends a flat debug annotation value (its tag and contents) with the
/// cursor's inlined byte writers only. [`encode::arg_value`] writes the
/// same bytes through the cursor's field writers, which the compiler may
/// leave out of line; a call that takes the cursor by reference keeps the
/// cursor in memory for the whole inlined encoder (see [`put_varint`]).
#[inline(always)]
fn put_arg_value<T: Target>(f: &mut Cursor<T>, value: encode::ArgValue<'_>) {
    use encode::ArgValue as A;
    match value {
        A::Bool(b) => f.byte2([TAG_ARG_BOOL, u8::from(b)]),
        A::Uint(u) => {
            f.byte(TAG_ARG_UINT);
            put_varint(f, u);
        }
        A::Int(i) => {
            f.byte(TAG_ARG_INT);
            put_varint(f, i as u64);
        }
        A::Double(d) => {
            f.byte(TAG_ARG_DOUBLE);
            f.word(d.to_bits(), 8);
        }
        A::Str(s) => {
            f.byte(TAG_ARG_STRING);
            put_varint(f, s.len() as u64);
            f.bytes(s.as_bytes());
        }
        A::Pointer(p) => {
            f.byte(TAG_ARG_POINTER);
            put_varint(f, p);
        }
    }
}

/// The abi's form of a flat debug annotation value; `None` for a dict or
/// an array, which the general encoder nests.
#[inline(always)]
fn flat_value<'a>(
    value: &crate::encoding::annotation::DebugValue<'a>,
) -> Option<encode::ArgValue<'a>> {
    use crate::encoding::annotation::DebugValue as V;
    use encode::ArgValue as A;
    Some(match *value {
        V::Bool(b) => A::Bool(b),
        V::Uint(u) => A::Uint(u),
        V::Int(i) => A::Int(i),
        V::Double(d) => A::Double(d),
        V::Str(s) => A::Str(s),
        V::Pointer(p) => A::Pointer(p),
        V::Dict(_) | V::Array(_) => return None,
    })
}

/// How one event's time is written: `value` on clock `clock`; on
/// [`INCREMENTAL_CLOCK_ID`], the sequence's default, a delta written
/// without `timestamp_clock_id`. (Two scalars, so it travels in
/// registers.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    value: u64,
    clock: u32,
}

/// A callback adding fields to a TrackEvent being written.
pub(crate) type ExtraFields<'f, S> = &'f mut dyn FnMut(&mut EventContext<'_, '_, S>);

/// Something that writes whole TracePackets (a trace writer, or a test
/// buffer).
pub(crate) trait PacketWriter {
    /// The sink packets are encoded into.
    type Sink: Sink;
    /// Writes one packet with `f`; `false` if it was dropped.
    fn write_packet(&mut self, f: impl FnOnce(&mut Message<'_, Self::Sink>)) -> bool;

    /// Writes one packet whose fields are already encoded: `buf[..len]`,
    /// in a scratch buffer the writer may copy a fixed-size prefix of.
    fn write_encoded_packet_in(&mut self, buf: &[u8], len: usize) -> bool {
        self.write_packet(|p| p.raw(buf.get(..len).unwrap_or(buf)))
    }

    /// Where [`PacketWriter::write_in_place`] encodes.
    type Window<'w>: Target
    where
        Self: 'w;

    /// Encodes a small packet (at most 127 bytes) straight into the
    /// writer's current chunk: `encode` writes the packet's fields through
    /// a cursor over free payload, and returns `false` to give up. `false`
    /// if this path is not available (nothing was written; the caller
    /// writes the packet another way).
    fn write_in_place(
        &mut self,
        encode: impl FnOnce(&mut Cursor<Self::Window<'_>>) -> bool,
    ) -> bool;

    /// Whether a packet written now would find room; `false` (the packet
    /// is counted as dropped and the loss marked) while the shared memory
    /// buffer has no chunk to give. Lets a sequence that lost packets skip
    /// rebuilding its incremental state until it can be written.
    fn ensure_chunk(&mut self) -> bool {
        true
    }
}

/// The interning tables of one sequence, and the strings the packet being
/// encoded interns first (its `interned_data`).
struct Interned {
    names: StrInterner,
    categories: StrInterner,
    arg_names: StrInterner,
    new_entries: heapless::Vec<encode::NewString<'static>, MAX_NEW_INTERNED_PER_PACKET>,
}

/// Incremental state of one sequence (one trace writer).
pub(crate) struct SequenceState {
    interned: Interned,
    tracks: TrackSet,
    needs_reset: bool,
    thread_track: Track<'static>,
    /// Where the fast path encodes an event when the writer's chunk has no
    /// room for it in place, before it is copied in (events that do not
    /// fit here either are encoded straight into the writer's chunks).
    scratch: Box<Scratch>,
    /// Resets written (first one included).
    pub(crate) resets: u64,
    /// Slices open on the thread track, and whether each begin was written.
    slices: SliceStack,
    /// Slice ends not written because their begin was not.
    pub(crate) orphan_ends_suppressed: u64,
    /// A packet was written on this sequence.
    started: bool,
    /// Packets were lost before the first one was written.
    lost_before_start: bool,
    /// BOOTTIME value of clock 64 as a reader has it (the reset's time plus
    /// every delta since).
    clock_base: u64,
}

/// Which of the slices open on a thread track had their begin written,
/// innermost last; deeper than 64 levels the answer is "written".
#[derive(Default, Clone, Copy)]
pub(crate) struct SliceStack {
    written: u64,
    depth: u32,
}

impl SliceStack {
    fn push(&mut self, written: bool) {
        if self.depth < 64 {
            let bit = 1u64 << self.depth;
            if written {
                self.written |= bit;
            } else {
                self.written &= !bit;
            }
        }
        self.depth = self.depth.saturating_add(1);
    }

    /// Whether [`SliceStack::pop`] would return `true`.
    fn top_written(&self) -> bool {
        match self.depth {
            0 => false,
            d if d > 64 => true,
            d => self.written & (1u64 << (d - 1)) != 0,
        }
    }

    /// Pops the innermost slice: `true` if its begin was written (so its
    /// end should be); `false` for an end without any open slice.
    fn pop(&mut self) -> bool {
        if self.depth == 0 {
            return false;
        }
        self.depth -= 1;
        self.depth >= 64 || self.written & (1u64 << self.depth) != 0
    }
}

impl SequenceState {
    /// State of a new sequence written from the calling thread.
    pub(crate) fn new() -> Self {
        Self::for_track(ThreadTrack::current())
    }

    /// State of a new sequence whose default track is `thread_track`.
    pub(crate) fn for_track(thread_track: Track<'static>) -> Self {
        SequenceState {
            interned: Interned {
                names: StrInterner::new(),
                categories: StrInterner::new(),
                arg_names: StrInterner::new(),
                new_entries: heapless::Vec::new(),
            },
            tracks: TrackSet::new(),
            needs_reset: true,
            thread_track,
            scratch: Box::new([0; FAST_CAP + TARGET_SLACK]),
            resets: 0,
            slices: SliceStack::default(),
            orphan_ends_suppressed: 0,
            started: false,
            lost_before_start: false,
            clock_base: 0,
        }
    }

    /// The slices open on the thread track.
    pub(crate) fn open_slices(&self) -> SliceStack {
        self.slices
    }

    /// Continues `slices`, open on another sequence of this thread (the
    /// startup trace a session adopted: its slices end on the session's
    /// sequence, on the same thread track), before this sequence's first
    /// event.
    pub(crate) fn continue_slices(&mut self, slices: SliceStack) {
        if self.slices.depth == 0 {
            self.slices = slices;
        }
    }

    /// Requests a reset before the next event (ClearIncrementalState, or a
    /// packet was lost).
    pub(crate) fn invalidate(&mut self) {
        self.needs_reset = true;
    }

    /// Writes the reset packet and the thread/process descriptors.
    #[cold]
    #[inline(never)]
    fn reset<W: PacketWriter>(&mut self, w: &mut W, now: u64) -> bool {
        self.interned.clear();
        self.tracks.clear();
        self.resets += 1;
        let thread_uuid = self.thread_track.uuid();
        // Packets lost before the sequence's first one: the first packet's
        // loss bit is indistinguishable from the one a trace buffer sets on
        // every sequence it starts reading, so put a plain first packet
        // ahead and mark the loss on the reset that follows it.
        let mark_loss = !self.started && self.lost_before_start;
        if mark_loss && !w.write_packet(|p| p.uint64(trace_packet::TIMESTAMP, now)) {
            return false;
        }
        // The reset packet as every writer of the workspace encodes it
        // (clock 64 equals BOOTTIME now), with the loss marked after the
        // time fields when packets were lost before the first one.
        let mut c = Cursor::new(&mut *self.scratch);
        c.uint(trace_packet::TIMESTAMP, now);
        c.uint(
            trace_packet::TIMESTAMP_CLOCK_ID,
            u64::from(BOOTTIME_CLOCK_ID),
        );
        if mark_loss {
            c.uint(
                trace_packet::PREVIOUS_PACKET_DROPPED,
                u64::from(data_loss::PRESENT | data_loss::SMB_FULL),
            );
        }
        encode::reset_tail(&mut c, BOOTTIME_CLOCK_ID, now, thread_uuid);
        let ok = match c.finish() {
            Some(n) => w.write_encoded_packet_in(&self.scratch[..], n),
            None => false,
        };
        if ok {
            self.started = true;
            self.clock_base = now;
        }
        let process = crate::track_event::track::ProcessTrack::current();
        let thread = self.thread_track;
        ok && self.emit_descriptor(w, &thread, now) && self.emit_descriptor(w, &process, now)
    }

    #[cold]
    #[inline(never)]
    fn emit_descriptor<W: PacketWriter>(&mut self, w: &mut W, track: &Track<'_>, now: u64) -> bool {
        self.tracks.insert(track.uuid());
        w.write_packet(|p| descriptor_packet(p, track, now))
    }

    /// Makes sure the sequence's incremental state is valid and `track`'s
    /// descriptor was emitted. `false` if a packet was lost doing so.
    #[inline(always)]
    fn prepare<W: PacketWriter>(&mut self, w: &mut W, track: Option<&Track<'_>>, now: u64) -> bool {
        if self.needs_reset {
            if !self.reset(w, now) {
                return false;
            }
            self.needs_reset = false;
        }
        if let Some(t) = track {
            if t.uuid() != self.thread_track.uuid() && self.tracks.insert(t.uuid()) {
                return self.emit_track_descriptor(w, t, now);
            }
        }
        true
    }

    /// The descriptor packet of a track first used on this sequence, then
    /// those of its registered ancestors not described on it yet (see the
    /// `track` module).
    #[cold]
    #[inline(never)]
    fn emit_track_descriptor<W: PacketWriter>(
        &mut self,
        w: &mut W,
        t: &Track<'_>,
        now: u64,
    ) -> bool {
        if !w.write_packet(|p| descriptor_packet(p, t, now)) {
            return false;
        }
        let mut uuid = t.parent_uuid().unwrap_or(0);
        let (thread, process) = (
            self.thread_track.uuid(),
            crate::track_event::track::process_uuid(),
        );
        while uuid != 0 && uuid != thread && uuid != process && self.tracks.insert(uuid) {
            // Not a registered track: nothing to describe it with.
            let Some((parent, descriptor)) = crate::track_event::track::ancestor(uuid) else {
                break;
            };
            if !w.write_packet(|p| {
                p.uint64(trace_packet::TIMESTAMP, now);
                p.uint32(trace_packet::TIMESTAMP_CLOCK_ID, BOOTTIME_CLOCK_ID);
                p.bytes(trace_packet::TRACK_DESCRIPTOR, &descriptor);
            }) {
                return false;
            }
            uuid = parent;
        }
        // The event's own track is the set's most recent member again (the
        // counter encoder looks there).
        self.tracks.insert(t.uuid());
        true
    }

    /// Writes one [`PlainEvent`] (see there) of kind `KIND` (an
    /// [`EventType`] as `u8`, so each kind gets its own copy without
    /// branches on it). Returns `false` if any packet was dropped, like
    /// [`SequenceState::write_event`].
    #[inline(never)]
    pub(crate) fn write_plain<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> bool {
        debug_assert_eq!(ev.kind as u8, KIND);
        self.try_write_plain::<KIND, W>(w, ev) || self.write_event(w, &ev.data(), None)
    }

    /// The dedicated encoder of [`SequenceState::write_plain`], straight
    /// into the chunk; `false` (nothing changed) where the general path
    /// must do the work: a reset or a descriptor is due, a string is not in
    /// the front cache, the time went backwards, an end has no written
    /// begin, or the chunk has no room for a window.
    #[inline(always)]
    fn try_write_plain<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> bool {
        const BEGIN: u8 = EventType::SliceBegin as u8;
        const END: u8 = EventType::SliceEnd as u8;
        const INSTANT: u8 = EventType::Instant as u8;
        const COUNTER: u8 = EventType::Counter as u8;
        if self.needs_reset || ev.ns < self.clock_base {
            return false;
        }
        let delta = ev.ns - self.clock_base;
        // A counter's track uuid, encoded when the track became recent.
        let mut uuid_varint = (0, 0);
        // The TrackEvent after its type: two (tag, varint) fields, or none.
        let (tag_a, a, tag_b, b) = match KIND {
            BEGIN | INSTANT => {
                if ev.category.is_group() {
                    return false;
                }
                let Some(cat) = self.interned.categories.cached(ev.category.name()) else {
                    return false;
                };
                let Some(name) = self.interned.names.cached(ev.name) else {
                    return false;
                };
                ([TAG_CATEGORY_IIDS, 0], cat, [TAG_NAME_IID, 0], name)
            }
            END => {
                if !self.slices.top_written() {
                    return false;
                }
                ([0, 0], 0, [0, 0], 0)
            }
            _ => {
                let Some(track) = ev.track else { return false };
                let uuid = track.uuid();
                if uuid == self.thread_track.uuid() || !self.tracks.is_recent(uuid) {
                    return false;
                }
                uuid_varint = self.tracks.recent_varint();
                (
                    [TAG_TRACK_UUID, 0],
                    uuid,
                    TAG_COUNTER_VALUE,
                    ev.value as u64,
                )
            }
        };
        let field_len = |tag: [u8; 2], v: u64| match tag {
            [0, _] => 0,
            [_, 0] => 1 + varint_len(v),
            _ => 2 + varint_len(v),
        };
        // Below 128: a 1-byte length.
        let te_len = 2 + field_len(tag_a, a) + field_len(tag_b, b);
        let written = w.write_in_place(|f| {
            // Timestamp, sequence flags and the TrackEvent's header and type:
            // one 8-byte store when the delta takes one byte.
            let head = [
                TAG_SEQUENCE_FLAGS,
                SEQ_NEEDS_INCREMENTAL_STATE as u8,
                TAG_TRACK_EVENT,
                te_len,
                TAG_TYPE,
                KIND,
            ];
            if delta < 0x80 {
                let [h0, h1, h2, h3, h4, h5] = head;
                f.word(
                    u64::from_le_bytes([TAG_TIMESTAMP, delta as u8, h0, h1, h2, h3, h4, h5]),
                    8,
                );
            } else {
                f.byte(TAG_TIMESTAMP);
                put_varint(f, delta);
                let [h0, h1, h2, h3, h4, h5] = head;
                f.word(u64::from_le_bytes([h0, h1, h2, h3, h4, h5, 0, 0]), 6);
            }
            if KIND == COUNTER {
                let n = usize::from(varint_len(a));
                let (low, high) = uuid_varint;
                f.byte(TAG_TRACK_UUID);
                f.word(low, n.min(8));
                if n > 8 {
                    f.word(u64::from(high), n - 8);
                }
                f.byte2(TAG_COUNTER_VALUE);
                put_varint(f, b);
                return true;
            }
            // Two one-byte tags with one-byte values (category and name
            // ids): one store.
            if tag_a[1] == 0 && tag_b[1] == 0 && tag_a[0] != 0 && (a | b) < 0x80 {
                f.word(
                    u64::from_le_bytes([tag_a[0], a as u8, tag_b[0], b as u8, 0, 0, 0, 0]),
                    4,
                );
                return true;
            }
            // Slice ends (no fields), or ids of two bytes or more: the two
            // fields' tags are one byte each (a counter returned above).
            for (tag, v) in [(tag_a, a), (tag_b, b)] {
                if tag[0] != 0 {
                    f.byte(tag[0]);
                    put_varint(f, v);
                }
            }
            true
        });
        if written {
            self.clock_base = ev.ns;
            match KIND {
                BEGIN => self.slices.push(true),
                END => {
                    self.slices.pop();
                }
                _ => {}
            }
        }
        written
    }

    /// [`SequenceState::write_plain`] for a slice begin or an instant
    /// (`KIND`) with debug annotations: each has a static name and a flat
    /// value (not a dict or an array). Its own function, so that the
    /// encoder of events without annotations stays as small as it is.
    #[inline(never)]
    pub(crate) fn write_plain_args<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> bool {
        debug_assert_eq!(ev.kind as u8, KIND);
        self.try_write_plain_args::<KIND, W>(w, ev) || self.write_event(w, &ev.data(), None)
    }

    /// The dedicated encoder of [`SequenceState::write_plain_args`], into
    /// the chunk in place; `false` (nothing changed) where the general path
    /// must do the work: a reset is due, a name is not in its front cache
    /// (the general path interns it), the time went backwards, an
    /// annotation is not flat, or the packet does not fit a window. The
    /// packet (at most 127 bytes) gives every nested message a one-byte
    /// length.
    #[inline(always)]
    fn try_write_plain_args<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> bool {
        const BEGIN: u8 = EventType::SliceBegin as u8;
        if self.needs_reset || ev.ns < self.clock_base || ev.category.is_group() {
            return false;
        }
        let delta = ev.ns - self.clock_base;
        let interned = &self.interned;
        let written = w.write_in_place(|f| {
            let (Some(cat), Some(name)) = (
                interned.categories.cached(ev.category.name()),
                interned.names.cached(ev.name),
            ) else {
                return false;
            };
            f.byte(TAG_TIMESTAMP);
            put_varint(f, delta);
            f.word(
                u64::from_le_bytes([
                    TAG_SEQUENCE_FLAGS,
                    SEQ_NEEDS_INCREMENTAL_STATE as u8,
                    TAG_TRACK_EVENT,
                    0,
                    0,
                    0,
                    0,
                    0,
                ]),
                3,
            );
            let te = f.begin_short();
            f.byte2([TAG_TYPE, KIND]);
            f.byte(TAG_CATEGORY_IIDS);
            put_varint(f, cat);
            f.byte(TAG_NAME_IID);
            put_varint(f, name);
            for arg in ev.args {
                let ArgName::Static(n) = arg.name else {
                    return false;
                };
                let (Some(iid), Some(value)) =
                    (interned.arg_names.cached(n), flat_value(&arg.value))
                else {
                    return false;
                };
                f.byte(TAG_DEBUG_ANNOTATIONS);
                let a = f.begin_short();
                f.byte(TAG_ANNOTATION_NAME_IID);
                put_varint(f, iid);
                put_arg_value(f, value);
                f.end_short(a);
            }
            f.end_short(te);
            true
        });
        if written {
            self.clock_base = ev.ns;
            if KIND == BEGIN {
                self.slices.push(true);
            }
        }
        written
    }

    /// Writes one event (plus whatever incremental state it needs first).
    /// `extra` may add fields to the TrackEvent. Returns `false` if any
    /// packet was dropped; the sequence is then reset before the next event.
    // Not inlined into the caller's loop over instances: the compiler
    // would hoist (and spill) dozens of event-derived values out of it for
    // a loop that almost always runs once.
    #[inline(never)]
    pub(crate) fn write_event<W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &EventData<'_>,
        extra: Option<ExtraFields<'_, W::Sink>>,
    ) -> bool {
        let on_thread_track = ev
            .track
            .is_none_or(|t| t.uuid() == self.thread_track.uuid());
        // Its begin was lost (or came before this sequence): an end alone
        // would close an unrelated slice, or nothing.
        if on_thread_track && ev.kind == EventType::SliceEnd && !self.slices.pop() {
            self.orphan_ends_suppressed += 1;
            crate::stats::note_orphan_end();
            return true;
        }
        let ok = self.write_event_now(w, ev, extra);
        if on_thread_track && ev.kind == EventType::SliceBegin {
            self.slices.push(ok);
        }
        ok
    }

    #[inline(always)]
    fn write_event_now<W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &EventData<'_>,
        extra: Option<ExtraFields<'_, W::Sink>>,
    ) -> bool {
        // Reset and descriptor packets are stamped on BOOTTIME.
        // After a loss, while the buffer is still full: drop the event
        // before rebuilding the state (clearing the tables, encoding reset
        // and descriptor packets) for nothing.
        if self.needs_reset && !w.ensure_chunk() {
            self.lost_before_start |= !self.started;
            return false;
        }
        let now = match ev.timestamp.clock {
            Clock::Boottime => ev.timestamp.ns,
            _ => crate::clock::now_ns(),
        };
        if !self.prepare(w, ev.track, now) {
            self.needs_reset = true;
            self.lost_before_start |= !self.started;
            return false;
        }
        self.interned.new_entries.clear();
        let stamp = self.stamp(ev.timestamp);
        let ok = match extra {
            // Common case: encode with the fast path's cursor straight
            // into the chunk, or else into the scratch buffer and hand the
            // writer one copy.
            None => {
                let thread_uuid = self.thread_track.uuid();
                let interned = &mut self.interned;
                if w.write_in_place(|c| interned.encode_fast::<_, true>(c, thread_uuid, ev, stamp))
                {
                    return true;
                }
                let mut c = Cursor::new(&mut *self.scratch);
                let encoded =
                    (self.interned).encode_fast::<_, false>(&mut c, thread_uuid, ev, stamp);
                match c.finish().filter(|_| encoded) {
                    Some(n) => w.write_encoded_packet_in(&self.scratch[..], n),
                    // Nested annotations, or too big for the scratch
                    // buffer: stream it instead.
                    None => w.write_packet(|p| self.write_event_fields(p, ev, stamp, None)),
                }
            }
            Some(f) => w.write_packet(|p| self.write_event_fields(p, ev, stamp, Some(f))),
        };
        if !ok {
            self.needs_reset = true;
            self.lost_before_start |= !self.started;
        }
        ok
    }

    /// How `ts` is written on this sequence (a delta on clock 64 when it is
    /// a BOOTTIME time not before the previous one), moving the base.
    #[inline]
    fn stamp(&mut self, ts: Timestamp) -> Stamp {
        match ts.clock {
            Clock::Boottime if ts.ns >= self.clock_base => {
                let value = ts.ns - self.clock_base;
                self.clock_base = ts.ns;
                Stamp {
                    value,
                    clock: INCREMENTAL_CLOCK_ID,
                }
            }
            clock => Stamp {
                value: ts.ns,
                clock: clock.id(),
            },
        }
    }

    /// The TracePacket fields of one event (TrackEvent and new interned
    /// data). Interning is idempotent across retries: strings interned by
    /// an attempt that was abandoned stay in `new_entries` and are emitted
    /// by the next attempt.
    #[inline(never)]
    fn write_event_fields<S: Sink>(
        &mut self,
        p: &mut Message<'_, S>,
        ev: &EventData<'_>,
        stamp: Stamp,
        extra: Option<ExtraFields<'_, S>>,
    ) {
        p.uint64(trace_packet::TIMESTAMP, stamp.value);
        if stamp.clock != INCREMENTAL_CLOCK_ID {
            p.uint32(trace_packet::TIMESTAMP_CLOCK_ID, stamp.clock);
        }
        p.uint32(trace_packet::SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE);
        {
            let mut te = p.begin_nested(trace_packet::TRACK_EVENT);
            self.write_track_event(&mut te, ev);
            if let Some(f) = extra {
                let mut ctx = EventContext {
                    event: &mut te,
                    seq: self,
                };
                f(&mut ctx);
            }
        }
        self.write_interned(p);
    }

    fn write_track_event<S: Sink>(&mut self, te: &mut Message<'_, S>, ev: &EventData<'_>) {
        te.enumeration(event_field::TYPE, ev.kind as i32);
        if let Some(t) = ev.track {
            if t.uuid() != self.thread_track.uuid() {
                te.uint64(event_field::TRACK_UUID, t.uuid());
            }
        }
        if let Some(cat) = ev.category {
            if !matches!(ev.kind, EventType::SliceEnd | EventType::Counter) {
                if cat.is_group() {
                    for member in cat.members() {
                        self.write_category(te, member);
                    }
                } else {
                    self.write_category(te, cat.name());
                }
            }
        }
        match ev.name {
            EventName::None => {}
            EventName::Static(n) => match self.interned.intern(Kind::EventName, n) {
                Some(iid) => te.uint64(event_field::NAME_IID, iid),
                None => te.string(event_field::NAME, n),
            },
            EventName::Dynamic(n) => te.string(event_field::NAME, n),
        }
        for arg in ev.args {
            self.write_arg(te, arg);
        }
        for f in ev.flows {
            te.fixed64(event_field::FLOW_IDS, f.id());
        }
        for f in ev.terminating_flows {
            te.fixed64(event_field::TERMINATING_FLOW_IDS, f.id());
        }
        match ev.counter {
            Some(CounterValue::Int(v)) => te.int64(event_field::COUNTER_VALUE, v),
            Some(CounterValue::Double(v)) => te.double(event_field::DOUBLE_COUNTER_VALUE, v),
            None => {}
        }
    }

    #[inline]
    fn write_category<S: Sink>(&mut self, te: &mut Message<'_, S>, name: &'static str) {
        match self.interned.intern(Kind::Category, name) {
            Some(iid) => te.uint64(event_field::CATEGORY_IIDS, iid),
            None => te.string(event_field::CATEGORIES, name),
        }
    }

    fn write_arg<S: Sink>(&mut self, te: &mut Message<'_, S>, arg: &Arg<'_>) {
        let name = match arg.name {
            ArgName::Static(n) => match self.interned.intern(Kind::AnnotationName, n) {
                Some(iid) => NameRef::Iid(iid),
                None => NameRef::Inline(n),
            },
            ArgName::Dynamic(n) => NameRef::Inline(n),
        };
        te.nested(event_field::DEBUG_ANNOTATIONS, |a| {
            write_annotation(a, name, &arg.value)
        });
    }

    /// Writes `interned_data` for the strings first used by this event
    /// (kept until the next event starts, so a retried encoding emits them
    /// again).
    fn write_interned<S: Sink>(&mut self, p: &mut Message<'_, S>) {
        if self.interned.new_entries.is_empty() {
            return;
        }
        let mut data = p.begin_nested(trace_packet::INTERNED_DATA);
        // Group by field, as `encode::interned_data` does.
        for kind in [Kind::Category, Kind::EventName, Kind::AnnotationName] {
            for e in self.interned.new_entries.iter().filter(|e| e.kind == kind) {
                data.nested(kind.field(), |entry| {
                    entry.uint64(interned_string::IID, e.iid);
                    entry.string(interned_string::NAME, e.name);
                });
            }
        }
    }
}

impl Interned {
    /// The table interning strings of `field`.
    #[inline(always)]
    fn table(&mut self, kind: Kind) -> &mut StrInterner {
        match kind {
            Kind::Category => &mut self.categories,
            Kind::EventName => &mut self.names,
            Kind::AnnotationName => &mut self.arg_names,
        }
    }

    /// The iid of `s` (a `field` string) on this sequence, interning it if
    /// new (then it goes into this packet's `interned_data`); `None`: write
    /// it inline. The front-cache hit is inlined into the encoders.
    #[inline(always)]
    fn intern(&mut self, kind: Kind, s: &'static str) -> Option<u64> {
        match self.table(kind).cached(s) {
            Some(iid) => Some(iid),
            None => self.intern_slow(kind, s),
        }
    }

    #[inline(never)]
    fn intern_slow(&mut self, kind: Kind, s: &'static str) -> Option<u64> {
        let full = self.new_entries.is_full();
        let table = self.table(kind);
        if full {
            // Only strings already known can be referenced now.
            return table.lookup(s);
        }
        match table.intern(s) {
            Lookup::Known(iid) => Some(iid),
            Lookup::New(iid) => {
                // Room was checked above.
                let _ = self
                    .new_entries
                    .push(encode::NewString { kind, iid, name: s });
                Some(iid)
            }
            Lookup::Full => None,
        }
    }

    /// Forgets every interned string (a reset).
    fn clear(&mut self) {
        self.names.clear();
        self.categories.clear();
        self.arg_names.clear();
    }

    /// [`SequenceState::write_event_fields`] for events without nested
    /// annotations, through the workspace's event encoder
    /// ([`encode::event`]; nested sizes of one byte if `SHORT`, for a
    /// packet written in place, else two). `false` if the event does not
    /// qualify: a dict or array value, or more categories, annotations or
    /// flows than the fixed arrays here hold (interned strings stay pending
    /// for the retry).
    #[inline(always)]
    fn encode_fast<T: Target, const SHORT: bool>(
        &mut self,
        c: &mut Cursor<T>,
        thread_uuid: u64,
        ev: &EventData<'_>,
        stamp: Stamp,
    ) -> bool {
        let mut categories: heapless::Vec<encode::Str<'_>, MAX_FAST_CATEGORIES> =
            heapless::Vec::new();
        if let Some(cat) = ev.category {
            if !matches!(ev.kind, EventType::SliceEnd | EventType::Counter) {
                let mut add = |this: &mut Self, name: &'static str| {
                    let s = match this.intern(Kind::Category, name) {
                        Some(iid) => encode::Str::Iid(iid),
                        None => encode::Str::Inline(name),
                    };
                    categories.push(s).is_ok()
                };
                let fits = if cat.is_group() {
                    cat.members().all(|m| add(self, m))
                } else {
                    add(self, cat.name())
                };
                if !fits {
                    return false;
                }
            }
        }
        let name = match ev.name {
            EventName::None => None,
            EventName::Static(n) => Some(match self.intern(Kind::EventName, n) {
                Some(iid) => encode::Str::Iid(iid),
                None => encode::Str::Inline(n),
            }),
            EventName::Dynamic(n) => Some(encode::Str::Inline(n)),
        };
        let mut args: heapless::Vec<encode::Arg<'_>, MAX_FAST_ARGS> = heapless::Vec::new();
        for arg in ev.args {
            let Some(value) = flat_value(&arg.value) else {
                return false;
            };
            let name = match arg.name {
                ArgName::Static(n) => match self.intern(Kind::AnnotationName, n) {
                    Some(iid) => encode::Str::Iid(iid),
                    None => encode::Str::Inline(n),
                },
                ArgName::Dynamic(n) => encode::Str::Inline(n),
            };
            if args.push(encode::Arg { name, value }).is_err() {
                return false;
            }
        }
        let mut flows: heapless::Vec<u64, MAX_FAST_FLOWS> = heapless::Vec::new();
        let mut terminating: heapless::Vec<u64, MAX_FAST_FLOWS> = heapless::Vec::new();
        for (out, from) in [
            (&mut flows, ev.flows),
            (&mut terminating, ev.terminating_flows),
        ] {
            for f in from {
                if out.push(f.id()).is_err() {
                    return false;
                }
            }
        }
        let time = if stamp.clock == INCREMENTAL_CLOCK_ID {
            encode::Time::Delta(stamp.value)
        } else {
            encode::Time::Absolute {
                clock_id: stamp.clock,
                ns: stamp.value,
            }
        };
        let event = encode::Event {
            kind: ev.kind,
            time,
            track_uuid: ev.track.map(|t| t.uuid()).filter(|&u| u != thread_uuid),
            categories: &categories,
            name,
            args: &args,
            flows: &flows,
            terminating_flows: &terminating,
            counter: ev.counter,
            interned: &self.new_entries,
        };
        encode::event::<T, SHORT>(c, &event);
        true
    }
}

/// Most categories (group members), annotations and flow ids an event
/// encoded by [`Interned::encode_fast`] has; the general encoder takes
/// larger ones.
const MAX_FAST_CATEGORIES: usize = 8;
const MAX_FAST_ARGS: usize = 16;
const MAX_FAST_FLOWS: usize = 8;

/// A packet with `track`'s descriptor, stamped `now` on BOOTTIME (not on
/// the sequence's default clock 64: descriptors do not need incremental
/// state, so a reader may see one while clock 64 is invalid).
fn descriptor_packet<S: Sink>(p: &mut Message<'_, S>, track: &Track<'_>, now: u64) {
    p.uint64(trace_packet::TIMESTAMP, now);
    p.uint32(trace_packet::TIMESTAMP_CLOCK_ID, BOOTTIME_CLOCK_ID);
    p.nested(trace_packet::TRACK_DESCRIPTOR, |d| {
        track.write_descriptor(d)
    });
}

/// Access to the TrackEvent being written, for fields the typed API does
/// not cover (e.g. extensions or a `log_message`).
pub struct EventContext<'m, 'a, S: Sink> {
    event: &'m mut Message<'a, S>,
    seq: &'m mut SequenceState,
}

impl<'a, S: Sink> EventContext<'_, 'a, S> {
    /// The TrackEvent message: write any field by number.
    pub fn event(&mut self) -> &mut Message<'a, S> {
        self.event
    }

    /// Adds a debug annotation (static names are interned).
    pub fn add_arg(&mut self, arg: &Arg<'_>) {
        self.seq.write_arg(self.event, arg);
    }
}

#[cfg(test)]
pub(crate) mod tests {
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
    /// every varint length.
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
        let mut values = vec![0u64, u64::MAX];
        for shift in 0..64 {
            values.extend([(1u64 << shift) - 1, 1u64 << shift]);
        }
        for v in values {
            assert_eq!(bytes(|c| put_varint(c, v)), bytes(|c| c.varint(v)), "{v}");
            for arg in [A::Uint(v), A::Int(v as i64), A::Pointer(v)] {
                assert_eq!(
                    bytes(|c| put_arg_value(c, arg)),
                    bytes(|c| encode::arg_value(c, arg)),
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
            assert_eq!(
                bytes(|c| put_arg_value(c, arg)),
                bytes(|c| encode::arg_value(c, arg)),
                "{arg:?}"
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
        fn write_in_place(
            &mut self,
            encode: impl FnOnce(&mut Cursor<&mut Scratch>) -> bool,
        ) -> bool {
            if !self.in_place || self.lose_next {
                return false;
            }
            let mut window = [0u8; FAST_CAP + TARGET_SLACK];
            let mut c = Cursor::new(&mut window);
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
                EventType::SliceBegin if !e.args.is_empty() => {
                    fast.write_plain_args::<1, _>(&mut a, e)
                }
                EventType::Instant if !e.args.is_empty() => {
                    fast.write_plain_args::<3, _>(&mut a, e)
                }
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
        let split = |w: &VecWriter| {
            let (d, rest): (Vec<_>, Vec<_>) = w
                .decoded()
                .into_iter()
                .partition(|p| p.track_descriptor.is_some());
            (d.len(), rest)
        };
        assert_eq!(split(&a), split(&b));
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
        // A nested annotation is not flat: the general path writes it.
        let nested = [Arg::new("d", DebugValue::Dict(&[]))];
        let e = PlainEvent {
            args: &nested,
            ..event(1_020)
        };
        assert!(!s.try_write_plain_args::<1, _>(&mut w, &e));
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

        fn write_in_place(
            &mut self,
            encode: impl FnOnce(&mut Cursor<&mut Scratch>) -> bool,
        ) -> bool {
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
            let m =
                encode_to_slice(&mut b, |p| general.write_event_fields(p, e, stamp, None)).unwrap();
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
}
