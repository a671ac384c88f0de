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
//!    it in `interned_data`, except for a plain slice begin or instant
//!    (`write_plain`), whose new category and name each come first in a
//!    packet of their own, as `shmtrace_abi::track_event` writes them. A
//!    track other than the thread's gets its descriptor packet before the
//!    first event that uses it.
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
//! * A slice end on the thread track that is lost while its begin was
//!   written is *owed*: the reset before the sequence's next event writes
//!   it, at its own (absolute) time, ahead of that event. So a full buffer
//!   loses events but never leaves a slice open under which every later
//!   one would nest. (An end whose begin was lost is not written at all.)
//!   [`OWED_ENDS`] times are kept; more ends take the latest time (they
//!   close outer slices, later than they ended but in order). A flush
//!   (and so a stop) writes them too, if there is room. Ends still owed
//!   when the sequence ends (its writer retires) are counted in
//!   `ProducerStats::slice_ends_lost`; at the startup trace's hand-over
//!   they go on to the session's sequence with the open slices. A lost
//!   end counts in `packets_dropped` when it is lost and, once written,
//!   in `ProducerStats::slice_ends_written_late`.

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

mod fast;
#[cfg(feature = "tracing")]
mod flat_heads;
#[cfg(feature = "tracing")]
mod streamed;

#[cfg(feature = "tracing")]
pub(crate) use streamed::{FieldKey, FieldValue, FlatFields, FlatOut, Streamed};

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
    /// Thread-track slice ends lost while their begins were written: the
    /// next reset writes them (module docs).
    owed_ends: OwedEnds,
    /// Owed slice ends written late.
    pub(crate) slice_ends_written_late: u64,
    /// A packet was written on this sequence.
    started: bool,
    /// Packets were lost before the first one was written.
    lost_before_start: bool,
    /// BOOTTIME value of clock 64 as a reader has it (the reset's time plus
    /// every delta since).
    clock_base: u64,
    /// Pre-encoded heads of recent flat events.
    #[cfg(feature = "tracing")]
    flat_heads: flat_heads::FlatHeads,
}

/// Times of owed slice ends a sequence keeps (module docs).
pub(crate) const OWED_ENDS: usize = 16;

/// Slice ends owed to a sequence's next reset, oldest first: each time with
/// how many ends fall on it (more than one only in the last, once
/// [`OWED_ENDS`] times are kept).
#[derive(Debug, Default)]
pub(crate) struct OwedEnds(heapless::Vec<(Timestamp, u32), OWED_ENDS>);

impl OwedEnds {
    /// Owes an end at `ts`: a time of its own, or, with every time taken,
    /// the last one moved to `ts`.
    fn push(&mut self, ts: Timestamp) {
        if let Err(end) = self.0.push((ts, 1)) {
            if let Some(last) = self.0.last_mut() {
                *last = (end.0, last.1 + 1);
            }
        }
    }

    /// How many ends are owed.
    fn count(&self) -> u64 {
        self.0.iter().map(|&(_, n)| u64::from(n)).sum()
    }

    /// Owes `other`'s ends after these.
    fn append(&mut self, other: OwedEnds) {
        for (ts, n) in other.0 {
            for _ in 0..n {
                self.push(ts);
            }
        }
    }
}

/// What a sequence leaves open on its thread track for the next one of the
/// thread ([`SequenceState::continue_slices`]).
pub(crate) struct OpenSlices {
    slices: SliceStack,
    owed: OwedEnds,
}

impl Drop for SequenceState {
    fn drop(&mut self) {
        let lost = self.owed_ends.count();
        if lost > 0 {
            crate::stats::note_slice_ends_lost(lost);
        }
    }
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
            owed_ends: OwedEnds::default(),
            slice_ends_written_late: 0,
            started: false,
            lost_before_start: false,
            clock_base: 0,
            #[cfg(feature = "tracing")]
            flat_heads: flat_heads::FlatHeads::new(),
        }
    }

    /// Hands over the slices open on the thread track and the ends owed
    /// there: this sequence writes no more of them.
    pub(crate) fn take_open_slices(&mut self) -> OpenSlices {
        OpenSlices {
            slices: std::mem::take(&mut self.slices),
            owed: std::mem::take(&mut self.owed_ends),
        }
    }

    /// Continues `open`, left by another sequence of this thread (the
    /// startup trace a session adopted: its slices end on the session's
    /// sequence, on the same thread track), before this sequence's first
    /// event; its owed ends are written by this sequence's first reset.
    pub(crate) fn continue_slices(&mut self, open: OpenSlices) {
        if self.slices.depth == 0 {
            self.slices = open.slices;
        }
        self.owed_ends.append(open.owed);
        if self.owed_ends.count() > 0 {
            self.needs_reset = true;
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
        ok && self.emit_descriptor(w, &thread, now)
            && self.emit_descriptor(w, &process, now)
            && self.pay_owed_ends(w)
    }

    /// Writes the slice ends owed since a loss (module docs), each at its
    /// own time; `false` if one was lost again (it and those after it stay
    /// owed).
    fn pay_owed_ends<W: PacketWriter>(&mut self, w: &mut W) -> bool {
        while let Some(&(ts, n)) = self.owed_ends.0.first() {
            let end = EventData::new(EventType::SliceEnd, None, ts);
            // Absolute: the reset just set clock 64 to a later time.
            let stamp = Stamp {
                value: ts.ns,
                clock: ts.clock.id(),
            };
            if !w.write_packet(|p| self.write_event_fields(p, &end, stamp, None)) {
                return false;
            }
            self.slice_ends_written_late += 1;
            crate::stats::note_slice_end_written_late();
            if n > 1 {
                self.owed_ends.0[0].1 = n - 1;
            } else {
                self.owed_ends.0.remove(0);
            }
        }
        true
    }

    /// Writes the slice ends owed since a loss now (after the reset they
    /// need), if the writer has room: for a flush or a stop, which may come
    /// before the thread's next event.
    pub(crate) fn pay_owed_ends_now<W: PacketWriter>(&mut self, w: &mut W) {
        if self.owed_ends.count() > 0 {
            // The reset writes them (a loss left one due already).
            self.needs_reset = true;
            let _ = self.prepare(w, None, crate::clock::now_ns());
        }
    }

    /// A slice end on the thread track whose begin was written was lost:
    /// owed to the next reset.
    #[cold]
    fn owe_end(&mut self, ts: Timestamp) {
        self.owed_ends.push(ts);
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
        self.write_event_sized::<W, true>(w, ev, extra)
    }

    /// [`SequenceState::write_event`] for an event whose packet the caller
    /// knows takes 128 bytes or more: not tried in place (one-byte
    /// lengths) first, which would fail once most of it is encoded.
    #[cfg(feature = "tracing")]
    #[inline(never)]
    pub(crate) fn write_long_event<W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &EventData<'_>,
    ) -> bool {
        self.write_event_sized::<W, false>(w, ev, None)
    }

    /// [`SequenceState::write_event`], trying the packet in place first if
    /// `SHORT_FIRST`.
    #[inline(always)]
    fn write_event_sized<W: PacketWriter, const SHORT_FIRST: bool>(
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
        let ok = self.write_event_now::<W, SHORT_FIRST>(w, ev, extra);
        if on_thread_track {
            match ev.kind {
                EventType::SliceBegin => self.slices.push(ok),
                EventType::SliceEnd if !ok => self.owe_end(ev.timestamp),
                _ => {}
            }
        }
        ok
    }

    #[inline(always)]
    fn write_event_now<W: PacketWriter, const SHORT_FIRST: bool>(
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
                if SHORT_FIRST
                    && w.write_in_place(|c| {
                        interned.encode_fast::<_, true>(c, thread_uuid, ev, stamp)
                    })
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
        // The value first, as `encode::event` orders them.
        match ev.counter {
            Some(CounterValue::Int(v)) => te.int64(event_field::COUNTER_VALUE, v),
            Some(CounterValue::Double(v)) => te.double(event_field::DOUBLE_COUNTER_VALUE, v),
            None => {}
        }
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
}

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
pub(crate) mod tests;
