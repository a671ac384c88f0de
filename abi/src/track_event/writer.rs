//! [`TrackEventWriter`]: one sequence of track events, written in place.

use crate::proto::wire::WireType;
use crate::proto::Cursor;
use crate::smb::Window;
use crate::trace::{sequence_flags, tag1, trace_packet, track_event};
use crate::writer::{ChunkArbiter, DropReason, InPlaceWriter, PacketOutcome, WriterStats};

use super::clock::Clock;
use super::encode::{
    self, Arg, ArgValue, ClockValue, CounterValue, Event, NewString, Str, Time, Type,
};
use super::intern::{InternTable, Interned, Kind};
use super::track::{AnyTrack, CounterTrack, Track, TrackSet};

/// The absolute clock id firmware sequences use unless told otherwise: a
/// sequence-scoped clock (64..=127), so it never collides with a host's.
pub const FIRMWARE_CLOCK_ID: u32 = 65;

/// Debug annotations one [`EventBuilder`] carries; more are dropped and
/// counted.
pub const MAX_ARGS: usize = 4;
/// Flow ids (and, separately, terminating flow ids) one [`EventBuilder`]
/// carries; more are dropped and counted.
pub const MAX_FLOWS: usize = 2;

/// Longest packet written in place (1-byte size).
const MAX_PACKET: usize = 127;
/// Room kept for `previous_packet_dropped` and `first_packet_on_sequence`,
/// which the writer may put in front of a packet.
const PREFIX_ROOM: usize = 8;

/// How a sequence is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceConfig {
    /// The clock [`Clock`] readings are on: the id the sequence's first
    /// packet and its descriptors are stamped on, and the one clock 64 is
    /// defined against. On firmware a sequence-scoped id in 65..=127
    /// ([`FIRMWARE_CLOCK_ID`] by default), which the host relates to its
    /// own clocks; on a host, BOOTTIME (6).
    pub clock_id: u32,
    /// The track events go on unless they name another (their
    /// `TrackEventDefaults.track_uuid`), described at every reset.
    pub track: &'static Track,
}

impl SequenceConfig {
    /// Events on `track`, timed by the firmware clock [`FIRMWARE_CLOCK_ID`].
    pub const fn new(track: &'static Track) -> Self {
        Self {
            clock_id: FIRMWARE_CLOCK_ID,
            track,
        }
    }

    /// The same config with another absolute clock id.
    pub const fn with_clock_id(self, clock_id: u32) -> Self {
        Self { clock_id, ..self }
    }
}

/// Counters of a [`TrackEventWriter`]. Nothing is lost uncounted: packets
/// the chunk writer dropped are in its [`WriterStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrackEventStats {
    /// Events written.
    pub events: u32,
    /// Events dropped (no chunk, or too long for one packet).
    pub events_dropped: u32,
    /// Events skipped while the consumer did not record.
    pub events_disabled: u32,
    /// Sequence starts (the first packet, and after every loss or clear).
    pub resets: u32,
    /// Strings written inline because the interning table was full.
    pub strings_inline: u32,
    /// Slice ends not written because their begin was not.
    pub ends_suppressed: u32,
    /// Annotations and flow ids left out of events for lack of room in an
    /// [`EventBuilder`].
    pub fields_dropped: u32,
}

/// Which of the slices open on the default track had their begin written,
/// innermost last; deeper than 32 levels the answer is "written".
#[derive(Debug, Clone, Copy, Default)]
struct SliceStack {
    written: u32,
    depth: u32,
}

impl SliceStack {
    #[inline(always)]
    fn push(&mut self, written: bool) {
        if self.depth < 32 {
            let bit = 1u32 << self.depth;
            if written {
                self.written |= bit;
            } else {
                self.written &= !bit;
            }
        }
        self.depth = self.depth.saturating_add(1);
    }

    /// Pops the innermost slice: whether its begin was written (so its end
    /// should be); `false` for an end without any open slice.
    #[inline(always)]
    fn pop(&mut self) -> bool {
        if self.depth == 0 {
            return false;
        }
        self.depth -= 1;
        self.depth >= 32 || self.written & (1u32 << self.depth) != 0
    }
}

/// Writes track events of one sequence (one writer id) into chunks from an
/// arbiter, with per-sequence interning in a table of `N` entries (a power
/// of two) and descriptors remembered for `T` tracks.
///
/// See the [module docs](super) for what the sequence looks like and what
/// each call costs. Every method returns whether its packet was written;
/// a dropped event is counted and the sequence starts again (reset packet,
/// descriptors, interned strings) with its next event.
pub struct TrackEventWriter<
    's,
    A: ChunkArbiter<'s>,
    C: Clock,
    const N: usize = 16,
    const T: usize = 4,
> {
    out: InPlaceWriter<'s, A>,
    clock: C,
    config: SequenceConfig,
    interned: InternTable<N>,
    tracks: TrackSet<T>,
    /// Clock 64 as a reader has it: the reset's time plus every delta since.
    base: u64,
    needs_reset: bool,
    clear_epoch: u32,
    slices: SliceStack,
    stats: TrackEventStats,
}

impl<'s, A: ChunkArbiter<'s>, C: Clock, const N: usize, const T: usize>
    TrackEventWriter<'s, A, C, N, T>
{
    /// A writer of a new sequence into `out`, timed by `clock`.
    pub fn new(out: InPlaceWriter<'s, A>, clock: C, config: SequenceConfig) -> Self {
        let clear_epoch = out.arbiter().clear_epoch();
        Self {
            out,
            clock,
            config,
            interned: InternTable::new(),
            tracks: TrackSet::new(),
            base: 0,
            needs_reset: true,
            clear_epoch,
            slices: SliceStack::default(),
            stats: TrackEventStats::default(),
        }
    }

    /// Begins a slice named `name` in `category` on the default track.
    #[inline]
    pub fn slice_begin(&mut self, category: &'static str, name: &'static str) -> bool {
        let ok = self.named(Type::SliceBegin, category, name);
        self.slices.push(ok);
        ok
    }

    /// Ends the innermost slice open on the default track. An end whose
    /// begin was not written is not written either (counted in
    /// [`TrackEventStats::ends_suppressed`]), so it cannot close another
    /// slice.
    #[inline]
    pub fn slice_end(&mut self) -> bool {
        if !self.slices.pop() {
            self.stats.ends_suppressed += 1;
            return false;
        }
        self.named(Type::SliceEnd, "", "")
    }

    /// An instant event named `name` in `category` on the default track.
    #[inline]
    pub fn instant(&mut self, category: &'static str, name: &'static str) -> bool {
        self.named(Type::Instant, category, name)
    }

    /// An integer sample on a counter track.
    #[inline]
    pub fn counter(&mut self, track: &'static CounterTrack, value: i64) -> bool {
        self.sample(track, CounterValue::Int(value))
    }

    /// A floating-point sample on a counter track.
    #[inline]
    pub fn counter_f64(&mut self, track: &'static CounterTrack, value: f64) -> bool {
        self.sample(track, CounterValue::Double(value))
    }

    /// An event with more than a name: start it here, add to it, and
    /// [`emit`](EventBuilder::emit) it.
    pub fn event(
        &mut self,
        kind: Type,
        category: &'static str,
        name: &'static str,
    ) -> EventBuilder<'_, 's, A, C, N, T> {
        EventBuilder {
            w: self,
            kind,
            category,
            name,
            track: None,
            args: [NO_ARG; MAX_ARGS],
            n_args: 0,
            flows: [0; MAX_FLOWS],
            n_flows: 0,
            terminating: [0; MAX_FLOWS],
            n_terminating: 0,
            counter: None,
            at: None,
        }
    }

    /// Writes a `ClockSnapshot` pairing this sequence's clock, now, with
    /// `other` (another clock the program can read: an RTC, a GPS time, a
    /// peer's clock), so a reader can place either on the other's time
    /// line.
    pub fn clock_snapshot(&mut self, other: ClockValue) -> bool {
        let now = self.clock.now_ns();
        if !self.ready(now) {
            return false;
        }
        let clocks = [ClockValue::absolute(self.config.clock_id, now), other];
        let clock_id = self.config.clock_id;
        self.put(|c| {
            c.uint(crate::trace::trace_packet::TIMESTAMP, now);
            c.uint(
                crate::trace::trace_packet::TIMESTAMP_CLOCK_ID,
                u64::from(clock_id),
            );
            encode::clock_snapshot(c, &clocks);
        })
    }

    /// Starts the sequence again with its next event: interned strings and
    /// descriptors are written anew (a reader joining now sees them).
    pub fn clear_incremental_state(&mut self) {
        self.needs_reset = true;
    }

    /// Hands the current chunk to the arbiter.
    pub fn flush(&mut self) {
        self.out.flush();
    }

    /// The event counters.
    pub fn stats(&self) -> TrackEventStats {
        self.stats
    }

    /// The chunk writer's counters.
    pub fn writer_stats(&self) -> WriterStats {
        self.out.stats()
    }

    /// The chunk writer.
    pub fn packet_writer(&mut self) -> &mut InPlaceWriter<'s, A> {
        &mut self.out
    }

    /// Slice begins and ends and instants on the default track: written
    /// by [`Self::fast`] when the sequence is set up and both strings are
    /// interned already.
    #[inline(never)]
    fn named(&mut self, kind: Type, category: &'static str, name: &'static str) -> bool {
        if !self.out.arbiter().tracing_enabled() {
            self.stats.events_disabled += 1;
            return false;
        }
        let now = self.clock.now_ns();
        if self.can_delta(now) {
            let ids = if kind == Type::SliceEnd {
                Some((0, 0))
            } else {
                self.interned
                    .lookup(category, Kind::Category)
                    .zip(self.interned.lookup(name, Kind::EventName))
            };
            if let Some((cat, nm)) = ids {
                let delta = now - self.base;
                let outcome = self.out.write(
                    #[inline(always)]
                    move |c| named_event(c, delta, kind, cat, nm),
                );
                return self.written(outcome, now);
            }
        }
        self.named_slow(kind, category, name, now)
    }

    /// [`Self::named`] when something is missing: a reset, a string to
    /// intern, or time that went backwards.
    #[inline(never)]
    fn named_slow(
        &mut self,
        kind: Type,
        category: &'static str,
        name: &'static str,
        now: u64,
    ) -> bool {
        if !self.ready(now) {
            return false;
        }
        let time = self.time(now);
        let mut new = NewStrings::<2>::new();
        let (cat, nm) = if kind == Type::SliceEnd {
            (None, None)
        } else {
            (
                Some(self.resolve(category, Kind::Category, &mut new)),
                Some(self.resolve(name, Kind::EventName, &mut new)),
            )
        };
        self.write_split(now, time, new.as_slice(), &mut |c| {
            let te = encode::event_begin::<_, true>(c, time, kind);
            if let (Some(cat), Some(nm)) = (cat, nm) {
                encode::category(c, cat);
                encode::name(c, nm);
            }
            c.end_short(te);
        })
    }

    /// Counter samples: written by [`Self::fast`] when the sequence is set
    /// up and the track described.
    #[inline(never)]
    fn sample(&mut self, track: &'static CounterTrack, value: CounterValue) -> bool {
        if !self.out.arbiter().tracing_enabled() {
            self.stats.events_disabled += 1;
            return false;
        }
        let now = self.clock.now_ns();
        let uuid = track.uuid();
        if self.can_delta(now) && self.tracks.contains(uuid) {
            let delta = now - self.base;
            let outcome = self.out.write(
                #[inline(always)]
                move |c| counter_event(c, delta, uuid, value),
            );
            return self.written(outcome, now);
        }
        self.sample_slow(track, value, now)
    }

    /// [`Self::sample`] when a reset or the track's descriptor is due, or
    /// time went backwards.
    #[inline(never)]
    fn sample_slow(&mut self, track: &'static CounterTrack, value: CounterValue, now: u64) -> bool {
        if !self.ready(now) || !self.described(AnyTrack::Counter(track), now) {
            return false;
        }
        let time = self.time(now);
        let uuid = track.uuid();
        self.write_split(now, time, &[], &mut |c| {
            let te = encode::event_begin::<_, true>(c, time, Type::Counter);
            c.uint(track_event::TRACK_UUID, uuid);
            encode::counter_value(c, value);
            c.end_short(te);
        })
    }

    /// Whether an event at `now` can be written as a delta right away: no
    /// reset due, time not gone backwards, no clear requested.
    #[inline(always)]
    fn can_delta(&self, now: u64) -> bool {
        !self.needs_reset
            && now >= self.base
            && self.out.arbiter().clear_epoch() == self.clear_epoch
    }

    /// How an event at `now` is stamped: a delta on clock 64, or its
    /// absolute time if it lies before the previous event.
    #[inline(always)]
    fn time(&self, now: u64) -> Time {
        if now >= self.base {
            Time::Delta(now - self.base)
        } else {
            Time::Absolute {
                clock_id: self.config.clock_id,
                ns: now,
            }
        }
    }

    /// Makes sure `track`'s descriptor was written on the sequence (unless
    /// it is the default track); `false` (counted) if that packet was lost.
    fn described(&mut self, track: AnyTrack, now: u64) -> bool {
        if track.uuid() == self.config.track.uuid()
            || self.tracks.contains(track.uuid())
            || self.describe(track, now)
        {
            return true;
        }
        self.stats.events_dropped += 1;
        false
    }

    /// Writes an event packet stamped `now` at `time`: the fields `body`
    /// writes, then `interned_data` for `interned`. An event too long for
    /// one packet with its new interned strings writes them first, one
    /// packet each, then the event alone; one still too long is dropped.
    #[inline(never)]
    fn write_split(
        &mut self,
        now: u64,
        time: Time,
        interned: &[NewString<'_>],
        body: &mut dyn FnMut(&mut Cursor<Window<'_>>),
    ) -> bool {
        let whole = write_dyn(&mut self.out, &mut |c| {
            body(c);
            encode::interned_data::<_, true>(c, interned);
        });
        let outcome = match whole {
            Ok(true) => PacketOutcome::Written,
            Err(reason) => PacketOutcome::Dropped(reason),
            Ok(false) => {
                for entry in interned {
                    let one = [*entry];
                    if !self.put(|c| {
                        c.uint(
                            trace_packet::SEQUENCE_FLAGS,
                            u64::from(sequence_flags::SEQ_NEEDS_INCREMENTAL_STATE),
                        );
                        encode::interned_data::<_, true>(c, &one);
                    }) {
                        return self.lost();
                    }
                }
                match write_dyn(&mut self.out, body) {
                    Ok(true) => PacketOutcome::Written,
                    Err(reason) => PacketOutcome::Dropped(reason),
                    Ok(false) => {
                        self.out.count_dropped(DropReason::PacketTooLong);
                        PacketOutcome::Dropped(DropReason::PacketTooLong)
                    }
                }
            }
        };
        match (outcome, time) {
            (PacketOutcome::Dropped(_), _) => self.lost(),
            (_, Time::Delta(_)) => self.written(outcome, now),
            (_, Time::Absolute { .. }) => {
                self.stats.events += 1;
                true
            }
        }
    }

    /// Records what became of an event packet written at `now` as a delta.
    #[inline(always)]
    fn written(&mut self, outcome: PacketOutcome, now: u64) -> bool {
        match outcome {
            PacketOutcome::Written | PacketOutcome::Incomplete(_) => {
                self.base = now;
                self.stats.events += 1;
                true
            }
            PacketOutcome::Dropped(_) => self.lost(),
        }
    }

    #[cold]
    fn lost(&mut self) -> bool {
        self.needs_reset = true;
        self.stats.events_dropped += 1;
        false
    }

    /// Writes one packet with `f`; a drop restarts the sequence.
    fn put(&mut self, mut f: impl FnMut(&mut Cursor<Window<'_>>)) -> bool {
        match write_dyn(&mut self.out, &mut f) {
            Ok(true) => true,
            Ok(false) => {
                self.out.count_dropped(DropReason::PacketTooLong);
                self.needs_reset = true;
                false
            }
            Err(_) => {
                self.needs_reset = true;
                false
            }
        }
    }

    /// Makes the sequence ready for an event at `now`: restarts it if a
    /// loss or the consumer asked for it. `false` (and counted) if a packet
    /// of the restart was lost.
    fn ready(&mut self, now: u64) -> bool {
        let epoch = self.out.arbiter().clear_epoch();
        if epoch != self.clear_epoch {
            self.clear_epoch = epoch;
            self.needs_reset = true;
        }
        if self.needs_reset && !self.reset(now) {
            self.stats.events_dropped += 1;
            return false;
        }
        true
    }

    /// Writes the reset packet and the default track's descriptor.
    #[cold]
    #[inline(never)]
    fn reset(&mut self, now: u64) -> bool {
        self.interned.clear();
        self.tracks.clear();
        self.stats.resets += 1;
        let (clock_id, track) = (self.config.clock_id, self.config.track);
        if !self.put(|c| encode::reset(c, clock_id, now, track.uuid())) {
            return false;
        }
        self.base = now;
        self.needs_reset = false;
        self.describe(AnyTrack::Slices(track), now)
    }

    /// Writes `track`'s descriptor packet and remembers it.
    #[cold]
    #[inline(never)]
    fn describe(&mut self, track: AnyTrack, now: u64) -> bool {
        let clock_id = self.config.clock_id;
        if !self.put(|c| encode::descriptor(c, clock_id, now, &track)) {
            return false;
        }
        // A full set only means the descriptor is written again next time.
        let _ = self.tracks.insert(track.uuid());
        true
    }

    /// The general path of [`EventBuilder::emit`]: any event, interning
    /// what it needs first.
    #[inline(never)]
    fn general(&mut self, now: u64, spec: &Spec<'_>) -> bool {
        if !self.ready(now) {
            return false;
        }
        let track_uuid = match spec.track {
            Some(t) if t.uuid() != self.config.track.uuid() => {
                if !self.described(t, now) {
                    return false;
                }
                Some(t.uuid())
            }
            _ => None,
        };
        let mut new = NewStrings::<{ 2 + MAX_ARGS }>::new();
        let category = spec
            .category
            .map(|c| self.resolve(c, Kind::Category, &mut new));
        let categories = [category.unwrap_or(Str::Iid(0))];
        let name = spec
            .name
            .map(|n| self.resolve(n, Kind::EventName, &mut new));
        let mut args = [Arg {
            name: Str::Iid(0),
            value: ArgValue::Bool(false),
        }; MAX_ARGS];
        for (slot, (n, v)) in args.iter_mut().zip(spec.args) {
            *slot = Arg {
                name: self.resolve(n, Kind::AnnotationName, &mut new),
                value: *v,
            };
        }
        let time = self.time(now);
        let ev = Event {
            track_uuid,
            categories: if category.is_some() { &categories } else { &[] },
            name,
            args: args.get(..spec.args.len()).unwrap_or(&[]),
            flows: spec.flows,
            terminating_flows: spec.terminating,
            counter: spec.counter,
            ..Event::new(spec.kind, time)
        };
        self.write_split(now, time, new.as_slice(), &mut |c| {
            encode::event::<_, true>(c, &ev)
        })
    }

    /// The interned id of `s`, or `s` inline; a new id is added to `new`.
    fn resolve<const M: usize>(
        &mut self,
        s: &'static str,
        kind: Kind,
        new: &mut NewStrings<M>,
    ) -> Str<'static> {
        if s.len() <= MAX_INTERNED_LEN {
            match self.interned.intern(s, kind) {
                Interned::Known(iid) => return Str::Iid(u64::from(iid)),
                Interned::New(iid) => {
                    if new.push(NewString {
                        kind,
                        iid: u64::from(iid),
                        name: s,
                    }) {
                        return Str::Iid(u64::from(iid));
                    }
                }
                Interned::Full => {}
            }
        }
        self.stats.strings_inline += 1;
        Str::Inline(s)
    }
}

/// Longest string interned: its entry must fit a packet of its own.
const MAX_INTERNED_LEN: usize = MAX_PACKET - PREFIX_ROOM - 12;

/// The strings one event interns (category, name, annotation names): at
/// most `M`.
struct NewStrings<const M: usize> {
    list: [NewString<'static>; M],
    len: usize,
}

impl<const M: usize> NewStrings<M> {
    #[inline(always)]
    fn new() -> Self {
        const NONE: NewString<'static> = NewString {
            kind: Kind::EventName,
            iid: 0,
            name: "",
        };
        Self {
            list: [NONE; M],
            len: 0,
        }
    }

    /// Adds an entry; `false` if full (the caller sized `M` for every
    /// string one event resolves).
    fn push(&mut self, entry: NewString<'static>) -> bool {
        match self.list.get_mut(self.len) {
            Some(slot) => {
                *slot = entry;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    fn as_slice(&self) -> &[NewString<'static>] {
        self.list.get(..self.len).unwrap_or(&[])
    }
}

/// [`InPlaceWriter::try_write`] for the cold paths, compiled once for all
/// of them (the chunk handling around the encoding is not duplicated).
#[inline(never)]
fn write_dyn<'s, A: ChunkArbiter<'s>>(
    out: &mut InPlaceWriter<'s, A>,
    f: &mut dyn FnMut(&mut Cursor<Window<'_>>),
) -> Result<bool, DropReason> {
    out.try_write(f)
}

const TIMESTAMP: u8 = tag1(trace_packet::TIMESTAMP, WireType::Varint);
const FLAGS: u8 = tag1(trace_packet::SEQUENCE_FLAGS, WireType::Varint);
const NEEDS_STATE: u8 = sequence_flags::SEQ_NEEDS_INCREMENTAL_STATE as u8;
const TRACK_EVENT: u8 = tag1(trace_packet::TRACK_EVENT, WireType::LengthDelimited);
const TYPE: u8 = tag1(track_event::TYPE, WireType::Varint);
const CATEGORY_IIDS: u8 = tag1(track_event::CATEGORY_IIDS, WireType::Varint);
const NAME_IID: u8 = tag1(track_event::NAME_IID, WireType::Varint);
const TRACK_UUID: u8 = tag1(track_event::TRACK_UUID, WireType::Varint);

/// What [`encode::event`] writes for a slice begin or instant with
/// interned category and name (ids 0 for a slice end: neither is written)
/// on the default track, `delta` after the previous event. The constant
/// fields go in with word stores when the ids take one byte each, as they
/// nearly always do: the path nearly every event takes.
#[inline(always)]
fn named_event(c: &mut Cursor<Window<'_>>, delta: u64, kind: Type, cat: u16, name: u16) {
    c.byte(TIMESTAMP);
    c.varint(delta);
    if kind == Type::SliceEnd {
        c.word(
            u64::from_le_bytes([FLAGS, NEEDS_STATE, TRACK_EVENT, 2, TYPE, kind as u8, 0, 0]),
            6,
        );
    } else if cat < 0x80 && name < 0x80 {
        c.word(
            u64::from_le_bytes([
                FLAGS,
                NEEDS_STATE,
                TRACK_EVENT,
                6,
                TYPE,
                kind as u8,
                CATEGORY_IIDS,
                cat as u8,
            ]),
            8,
        );
        c.byte2([NAME_IID, name as u8]);
    } else {
        c.byte2([FLAGS, NEEDS_STATE]);
        c.byte(TRACK_EVENT);
        let te = c.begin_short();
        c.byte2([TYPE, kind as u8]);
        c.byte(CATEGORY_IIDS);
        c.varint32(u32::from(cat));
        c.byte(NAME_IID);
        c.varint32(u32::from(name));
        c.end_short(te);
    }
}

/// What [`encode::event`] writes for a counter sample on the track `uuid`
/// (described already), `delta` after the previous event.
#[inline(always)]
fn counter_event(c: &mut Cursor<Window<'_>>, delta: u64, uuid: u64, value: CounterValue) {
    c.byte(TIMESTAMP);
    c.varint(delta);
    c.word(
        u64::from_le_bytes([FLAGS, NEEDS_STATE, TRACK_EVENT, 0, 0, 0, 0, 0]),
        3,
    );
    let te = c.begin_short();
    c.word(
        u64::from_le_bytes([TYPE, Type::Counter as u8, TRACK_UUID, 0, 0, 0, 0, 0]),
        3,
    );
    c.varint(uuid);
    encode::counter_value(c, value);
    c.end_short(te);
}

/// Everything about an event but its time, before interning.
struct Spec<'a> {
    kind: Type,
    category: Option<&'static str>,
    name: Option<&'static str>,
    track: Option<AnyTrack>,
    args: &'a [(&'static str, ArgValue<'a>)],
    flows: &'a [u64],
    terminating: &'a [u64],
    counter: Option<CounterValue>,
}

const NO_ARG: (&str, ArgValue<'static>) = ("", ArgValue::Bool(false));

/// An event being put together; see [`TrackEventWriter::event`].
#[must_use = "an event is written only by `emit`"]
pub struct EventBuilder<'w, 's, A: ChunkArbiter<'s>, C: Clock, const N: usize, const T: usize> {
    w: &'w mut TrackEventWriter<'s, A, C, N, T>,
    kind: Type,
    category: &'static str,
    name: &'static str,
    track: Option<AnyTrack>,
    args: [(&'static str, ArgValue<'w>); MAX_ARGS],
    n_args: usize,
    flows: [u64; MAX_FLOWS],
    n_flows: usize,
    terminating: [u64; MAX_FLOWS],
    n_terminating: usize,
    counter: Option<CounterValue>,
    at: Option<u64>,
}

impl<'w, 's, A: ChunkArbiter<'s>, C: Clock, const N: usize, const T: usize>
    EventBuilder<'w, 's, A, C, N, T>
{
    /// Puts the event on `track` instead of the default track.
    pub fn on(mut self, track: &'static Track) -> Self {
        self.track = Some(AnyTrack::Slices(track));
        self
    }

    /// Adds a debug annotation (at most [`MAX_ARGS`]; more are counted in
    /// [`TrackEventStats::fields_dropped`]).
    pub fn arg(mut self, name: &'static str, value: impl Into<ArgValue<'w>>) -> Self {
        match self.args.get_mut(self.n_args) {
            Some(slot) => {
                *slot = (name, value.into());
                self.n_args += 1;
            }
            None => self.w.stats.fields_dropped += 1,
        }
        self
    }

    /// Adds a flow id: the event is a step of flow `id`.
    pub fn flow(mut self, id: u64) -> Self {
        match self.flows.get_mut(self.n_flows) {
            Some(slot) => {
                *slot = id;
                self.n_flows += 1;
            }
            None => self.w.stats.fields_dropped += 1,
        }
        self
    }

    /// Adds a terminating flow id: the event ends flow `id`.
    pub fn terminating_flow(mut self, id: u64) -> Self {
        match self.terminating.get_mut(self.n_terminating) {
            Some(slot) => {
                *slot = id;
                self.n_terminating += 1;
            }
            None => self.w.stats.fields_dropped += 1,
        }
        self
    }

    /// Makes the event a sample of `value` on the counter track `track`
    /// (for a counter with annotations or flows; plain samples are cheaper
    /// with [`TrackEventWriter::counter`]).
    pub fn counter(mut self, track: &'static CounterTrack, value: CounterValue) -> Self {
        self.kind = Type::Counter;
        self.track = Some(AnyTrack::Counter(track));
        self.counter = Some(value);
        self
    }

    /// Stamps the event `ns` (on the writer's clock) instead of now.
    pub fn at(mut self, ns: u64) -> Self {
        self.at = Some(ns);
        self
    }

    /// Writes the event; whether it was written.
    pub fn emit(self) -> bool {
        let w = self.w;
        if !w.out.arbiter().tracing_enabled() {
            w.stats.events_disabled += 1;
            if self.kind == Type::SliceBegin && self.track.is_none() {
                w.slices.push(false);
            }
            return false;
        }
        let on_default = self.track.is_none();
        if on_default && self.kind == Type::SliceEnd && !w.slices.pop() {
            w.stats.ends_suppressed += 1;
            return false;
        }
        let now = match self.at {
            Some(ns) => ns,
            None => w.clock.now_ns(),
        };
        let named = !matches!(self.kind, Type::SliceEnd | Type::Counter);
        let spec = Spec {
            kind: self.kind,
            category: named.then_some(self.category),
            name: named.then_some(self.name),
            track: self.track,
            args: self.args.get(..self.n_args).unwrap_or(&[]),
            flows: self.flows.get(..self.n_flows).unwrap_or(&[]),
            terminating: self.terminating.get(..self.n_terminating).unwrap_or(&[]),
            counter: self.counter,
        };
        let ok = w.general(now, &spec);
        if on_default && self.kind == Type::SliceBegin {
            w.slices.push(ok);
        }
        ok
    }
}
