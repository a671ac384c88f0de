//! [`TrackEventWriter`]: one sequence of track events, written in place.
//!
//! # Paths
//!
//! * Fast: [`TrackEventWriter::site_named`] (slice begins and instants at
//!   call sites, and slice ends), [`TrackEventWriter::named_ids`] (begins
//!   and instants named by strings), [`TrackEventWriter::sample`]
//!   (counters; one function per value type) work out the event's
//!   `track_event` bytes (the site's cached ids, or the interning probes,
//!   or the track lookup) and hand them, in registers, to the one
//!   out-of-line [`TrackEventWriter::fast`]: the clock, the checks of the
//!   sequence state, the packet stored straight into the chunk by
//!   [`InPlaceWriter::write_fast_sized`], one release store. It counts
//!   no written event: its packets are the chunk writer's fast packets
//!   ([`InPlaceWriter::fast_packets`]), all events.
//! * Slow, for the same events ([`TrackEventWriter::slow`]): whatever the
//!   fast path could not do (a reset, a string to intern, a descriptor, a
//!   chunk to switch, time gone backwards), as a template ([`SLOW_EVENT`]).
//!   It writes the same bytes the fast path would.
//! * General ([`TrackEventWriter::general`]): events built with an
//!   [`EventBuilder`].
//!
//! Every packet of the cold paths goes through [`InPlaceWriter::write_dyn`],
//! compiled once; those of the fast paths' slow path (resets, descriptors,
//! interned strings, events) are templates ([`crate::proto::template`]),
//! written by one encoder ([`Cold`]).

use crate::proto::wire::{varint_groups, varint_word, WireType};
use crate::proto::{Args, Cursor, Target, Template};
use crate::smb::Window;
use crate::trace::{sequence_flags, tag1, trace_packet, track_event};
use crate::writer::{packet, ChunkArbiter, DropReason, EncodePacket, InPlaceWriter, WriterStats};

use super::clock::Clock;
use super::encode::{
    self, Arg, ArgValue, ClockValue, CounterValue, Event, NewString, Str, Time, Type,
};
use super::intern::{InternTable, Interned, Key, Kind};
use super::site::{EventSite, SiteCache};
use super::track::{AnyTrack, CounterTrack, Rest, Track, TrackSet};

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
/// Longest category, event or annotation name (bytes) that is interned
/// (its entry fits a packet of its own), so that any event can carry it.
/// A longer one goes inline, and a few bytes more make the event longer
/// than its packet: it is dropped (counted in
/// [`TrackEventStats::events_dropped`]). See the module docs' limits.
pub const MAX_NAME_LEN: usize = MAX_PACKET - PREFIX_ROOM - 12;
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
    /// own clocks; on a host, BOOTTIME (6). A firmware's writers use its
    /// region's clock id ([`RegionConfig::clock_id`], the same default):
    /// the host relates that one clock only, and packets stamped on
    /// another cannot be placed (`shmtrace inspect --check` fails them).
    ///
    /// [`RegionConfig::clock_id`]: crate::region::RegionConfig::clock_id
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
/// innermost last; deeper than 32 levels the answer is "written". A bit is
/// set for a level whose begin was *not* written, and cleared when the level
/// is popped, so pushing a written begin (the common case) only counts.
#[derive(Debug, Clone, Copy, Default)]
struct SliceStack {
    unwritten: u32,
    depth: u32,
}

impl SliceStack {
    #[inline(always)]
    fn push(&mut self, written: bool) {
        if !written && self.depth < 32 {
            self.unwritten |= 1 << self.depth;
        }
        self.depth = self.depth.wrapping_add(1);
    }

    /// Pops the innermost slice: whether its begin was written (so its end
    /// should be); `false` for an end without any open slice.
    #[inline(always)]
    fn pop(&mut self) -> bool {
        if self.depth == 0 {
            return false;
        }
        self.depth -= 1;
        if self.depth >= 32 {
            return true;
        }
        let bit = 1 << self.depth;
        let written = self.unwritten & bit == 0;
        self.unwritten &= !bit;
        written
    }
}

/// Writes track events of one sequence (one writer id) into chunks from an
/// arbiter, with per-sequence interning in a table of `N` entries (a power
/// of two), descriptors remembered for `T` tracks (besides the default one) and the interned ids of
/// `S` call sites ([`EventSite`]s) cached.
///
/// See the [module docs](super) for what the sequence looks like and what
/// each call costs. Every method returns whether its packet was written;
/// a dropped event is counted and the sequence starts again (reset packet,
/// descriptors, interned strings) with its next event.
// `repr(C)`, laid out for Cortex-M code size: the site cache at offset 0
// (a cached entry is one indexed load), then the fields a new writer sets
// to 0, in two runs around the interning table's generation (its only
// other word, which the halfword loads reach up to offset 62), then the
// configuration and the chunk writer. The compiler's own order split the
// zeros of a new writer into five runs.
#[repr(C)]
pub struct TrackEventWriter<
    's,
    A: ChunkArbiter<'s>,
    C: Clock,
    const N: usize = 16,
    const T: usize = 4,
    const S: usize = 8,
> {
    sites: SiteCache<S>,
    tracks: TrackSet<T>,
    /// Clock 64 as a reader has it: the reset's time plus every delta since.
    base: u64,
    /// The time of the last event [`Self::fast`] left to [`Self::slow`].
    missed_at: u64,
    /// The value of the last counter sample (its bits) handed to
    /// [`Self::fast`], for [`Self::slow`].
    missed_value: u64,
    slices: SliceStack,
    interned: InternTable<N>,
    stats: TrackEventStats,
    /// The consumer's `clear_request` when the sequence last restarted.
    clear_epoch: u32,
    config: SequenceConfig,
    out: InPlaceWriter<'s, A>,
    clock: C,
}

impl<'s, A: ChunkArbiter<'s>, C: Clock, const N: usize, const T: usize, const S: usize>
    TrackEventWriter<'s, A, C, N, T, S>
{
    /// A writer of a new sequence into `out`, timed by `clock`.
    // Inline: built in place in the caller's storage.
    #[inline(always)]
    pub fn new(out: InPlaceWriter<'s, A>, clock: C, config: SequenceConfig) -> Self {
        let mut out = out;
        // The sequence starts with its reset packet (a reset is due while
        // the fast path is held), which reads the consumer's
        // `clear_request` into `clear_epoch` (the fast path, held, writes
        // nothing before).
        out.hold_fast_path(true);
        Self {
            out,
            base: 0,
            missed_at: 0,
            missed_value: 0,
            slices: SliceStack::default(),
            stats: TrackEventStats::default(),
            tracks: TrackSet::new(),
            sites: SiteCache::new(),
            interned: InternTable::new(),
            config,
            clear_epoch: 0,
            clock,
        }
    }

    /// Begins a slice named `name` in `category` on the default track.
    #[inline]
    pub fn slice_begin(&mut self, category: &'static str, name: &'static str) -> bool {
        self.named(Type::SliceBegin, category, name)
    }

    /// Begins a slice named at `site` on the default track: as
    /// [`Self::slice_begin`], with the site's interned ids cached by the
    /// writer (see [`EventSite`]), so the common case skips the interning
    /// lookups.
    #[inline]
    pub fn slice_begin_at(&mut self, site: &'static EventSite) -> bool {
        self.site_named(Type::SliceBegin as u32, Some(site))
    }

    /// An instant event named at `site` on the default track: as
    /// [`Self::instant`], with the site's interned ids cached.
    #[inline]
    pub fn instant_at(&mut self, site: &'static EventSite) -> bool {
        self.site_named(Type::Instant as u32, Some(site))
    }

    /// Ends the innermost slice open on the default track, however it
    /// began ([`Self::slice_begin`], [`Self::slice_begin_at`], or
    /// [`Self::event`] with [`Type::SliceBegin`] on the default track). An
    /// end whose begin was not written is not written either (counted in
    /// [`TrackEventStats::ends_suppressed`]), so it cannot close another
    /// slice. An end that is lost itself (no room) leaves its slice open
    /// in the trace; the loss is marked.
    #[inline]
    pub fn slice_end(&mut self) -> bool {
        self.site_named(Type::SliceEnd as u32, None)
    }

    /// An instant event named `name` in `category` on the default track.
    #[inline]
    pub fn instant(&mut self, category: &'static str, name: &'static str) -> bool {
        self.named(Type::Instant, category, name)
    }

    /// An integer sample on a counter track.
    #[inline]
    pub fn counter(&mut self, track: &'static CounterTrack, value: i64) -> bool {
        self.sample_int(track, value)
    }

    /// A floating-point sample on a counter track.
    #[inline]
    pub fn counter_f64(&mut self, track: &'static CounterTrack, value: f64) -> bool {
        self.sample_double(track, value)
    }

    /// An event with more than a name: start it here, add to it, and
    /// [`emit`](EventBuilder::emit) it.
    #[inline(always)]
    pub fn event(
        &mut self,
        kind: Type,
        category: &'static str,
        name: &'static str,
    ) -> EventBuilder<'_, 's, A, C, N, T, S> {
        EventBuilder {
            w: self,
            kind,
            category,
            name,
            track: None,
            args: heapless::Vec::new(),
            flows: heapless::Vec::new(),
            terminating: heapless::Vec::new(),
            counter: None,
            at: None,
        }
    }

    /// Writes a `ClockSnapshot` pairing this sequence's clock, now, with
    /// `other` (another clock the program can read: an RTC, a GPS time, a
    /// peer's clock), so a reader can place either on the other's time
    /// line.
    pub fn clock_snapshot(&mut self, other: ClockValue) -> bool {
        let now = self.now();
        if !self.ready(now) {
            return false;
        }
        let clocks = [ClockValue::absolute(self.config.clock_id, now), other];
        let clock_id = self.config.clock_id;
        self.put(packet(&mut |c| {
            encode::absolute_time(c, clock_id, now);
            encode::clock_snapshot(c, &clocks);
        }))
    }

    /// Starts the sequence again with its next event: interned strings and
    /// descriptors are written anew (a reader joining now sees them).
    pub fn clear_incremental_state(&mut self) {
        self.out.hold_fast_path(true);
    }

    /// Hands the current chunk to the arbiter.
    pub fn flush(&mut self) {
        self.out.flush();
    }

    /// The event counters.
    pub fn stats(&self) -> TrackEventStats {
        // The fast path counts nothing: its packets are events, counted
        // by the chunk writer.
        TrackEventStats {
            events: self.stats.events.wrapping_add(self.out.fast_packets()),
            ..self.stats
        }
    }

    /// The chunk writer's counters.
    pub fn writer_stats(&self) -> WriterStats {
        self.out.stats()
    }

    /// The arbiter.
    pub fn arbiter(&self) -> &A {
        self.out.arbiter()
    }

    /// The arbiter, mutably.
    pub fn arbiter_mut(&mut self) -> &mut A {
        self.out.arbiter_mut()
    }

    /// Slice begins and instants on the default track, with the slice
    /// stack kept here (one call, not one per caller). Inline: the
    /// interning keys of constant strings are constants.
    #[inline(always)]
    fn named(&mut self, kind: Type, category: &'static str, name: &'static str) -> bool {
        let ids = NamedIds::new(
            kind,
            Key::new(category, Kind::Category),
            Key::new(name, Kind::EventName),
        );
        self.named_ids(ids, category, name)
    }

    /// [`Self::named`] out of line, for every caller: written right here
    /// when the sequence is set up, both strings are interned already with
    /// ids below 128 (as they nearly always are), the delta is below 2^28
    /// ns and the chunk has room; otherwise by [`Self::slow`].
    #[inline(never)]
    fn named_ids(&mut self, ids: NamedIds, category: &'static str, name: &'static str) -> bool {
        let kind = ids.kind_bits();
        let names = Names {
            kind,
            category,
            name,
        };
        // The ids first (the strings are dead after them): `None` if the
        // fast path cannot write them (a string not interned, or an id of
        // 128 or more).
        let cat = self.interned.lookup_word(ids.category(category));
        let nm = self.interned.lookup_word(ids.name(name));
        let (rest, a) = if (cat | nm) < 0x80 {
            (&Rest::NAMED, named_word(u32::from(kind), nm << 8 | cat))
        } else {
            (&Rest::SLOW, 0)
        };
        self.named_fast(u32::from(kind), rest, a, || Needs::Names(&names))
    }

    /// [`Self::named_ids`] for an event at `site` (a slice begin or an
    /// instant), or a slice end (no `site`): its ids from the site cache,
    /// or else (once per site and interning generation) by [`Self::slow`],
    /// which interns the site's strings and caches their ids. One function
    /// for the three kinds: the end's tests are a few instructions, a copy
    /// of its own some 400 bytes.
    #[inline(never)]
    fn site_named(&mut self, kind: u32, site: Option<&'static EventSite>) -> bool {
        let (rest, a) = match site {
            None => {
                if !self.slices.pop() {
                    self.stats.ends_suppressed += 1;
                    return false;
                }
                (&Rest::END, named_word(kind, 0))
            }
            // Cached ids are below 128.
            Some(site) => match self.sites.get(site.number(), self.interned.generation()) {
                Some(ids) => (&Rest::NAMED, named_word(kind, ids)),
                None => (&Rest::SLOW, 0),
            },
        };
        self.named_fast(kind, rest, a, || match site {
            Some(site) if kind == Type::SliceBegin as u32 => Needs::Begin(site),
            Some(site) => Needs::Instant(site),
            None => Needs::End,
        })
    }

    /// The end of [`Self::named_ids`] and [`Self::site_named`]: the event
    /// of type `kind` (its value), whose track event `rest` and `a`
    /// describe (see [`Self::fast`]), written by the fast path or else by
    /// [`Self::missed`] with what `needs` makes ready.
    #[inline(always)]
    fn named_fast<'a>(
        &mut self,
        kind: u32,
        rest: &Rest,
        a: u64,
        needs: impl FnOnce() -> Needs<'a>,
    ) -> bool {
        match self.fast(rest, a) {
            Fast::Written => {
                if kind == Type::SliceBegin as u32 {
                    self.slices.push(true);
                }
                true
            }
            fast => self.missed(fast, needs()),
        }
    }

    /// An event the fast path did not write (`fast` says why): written by
    /// [`Self::slow`] unless tracing is off; a slice begin's outcome goes
    /// on the slice stack. Out of line: the fast paths' callers keep no
    /// registers or stack for it.
    #[inline(never)]
    fn missed(&mut self, fast: Fast, needs: Needs<'_>) -> bool {
        let written = fast == Fast::Slow && self.slow(needs);
        if needs.kind() == Type::SliceBegin as u8 {
            self.slices.push(written);
        }
        written
    }

    /// Counter samples: written right here when the sequence is set up, the
    /// track described, the value an integer within 32 bits or a double,
    /// the delta below 2^28 ns and the chunk has room; otherwise by
    /// [`Self::slow`]. Inline into one out-of-line function per value
    /// type ([`Self::sample_int`], [`Self::sample_double`]): each encodes
    /// its own type only, and a program sampling integers only links no
    /// floating-point path.
    #[inline(always)]
    fn sample(&mut self, track: &'static CounterTrack, value: CounterValue) -> bool {
        // The value for the slow path, in the writer: no register keeps it
        // across the fast path's call (one store, no stack frame).
        let needs = match value {
            CounterValue::Int(v) => {
                self.missed_value = v as u64;
                Needs::Int(track)
            }
            CounterValue::Double(v) => {
                self.missed_value = v.to_bits();
                Needs::Double(track)
            }
        };
        // The rest is the track's (in flash).
        let (rest, a) = match self
            .tracks
            .contains(AnyTrack::Counter(track).key())
            .then_some(value)
        {
            Some(CounterValue::Int(v)) => match int_word(v) {
                Some((shape, a)) => (track.sample_rest(shape), a),
                None => (&Rest::SLOW, 0),
            },
            Some(CounterValue::Double(v)) => (track.sample_rest(Rest::DOUBLE), v.to_bits()),
            None => (&Rest::SLOW, 0),
        };
        match self.fast(rest, a) {
            Fast::Written => true,
            fast => self.missed(fast, needs),
        }
    }

    /// [`Self::sample`] of an integer.
    #[inline(never)]
    fn sample_int(&mut self, track: &'static CounterTrack, value: i64) -> bool {
        self.sample(track, CounterValue::Int(value))
    }

    /// [`Self::sample`] of a double.
    #[inline(never)]
    fn sample_double(&mut self, track: &'static CounterTrack, value: f64) -> bool {
        self.sample(track, CounterValue::Double(value))
    }

    /// The fast path of every kind of event ([`Self::named_fast`],
    /// [`Self::sample`]): the event whose `track_event` holds the bytes
    /// `rest` and `a` describe (see [`Rest`]; a slice's `rest` is a
    /// constant, a sample's its track's), written right here when tracing
    /// is on, the sequence is set up, the delta is below 2^28 ns and the
    /// chunk has room. Otherwise, or for [`Rest::SLOW`] (the caller
    /// cannot write the event this way), [`Fast::Slow`], the time left in
    /// `missed_at`: the caller writes it with [`Self::missed`]. One copy
    /// for every kind: the clock (read here, inline: its one reading per
    /// event), the checks, the packet's head and the counts.
    #[inline(never)]
    fn fast(&mut self, rest: &Rest, a: u64) -> Fast {
        if !self.out.arbiter().tracing_enabled() {
            self.stats.events_disabled += 1;
            return Fast::Disabled;
        }
        let now = self.clock.now_ns();
        if let Some(delta) = self.delta(now, rest.lens) {
            let base = &mut self.base;
            if self.out.write_fast_sized(
                #[inline(always)]
                |c| {
                    // The window's checks passed: the packet is written
                    // (and counted by the chunk writer: see `stats`).
                    // Its time first, so the time's registers are free for
                    // the stores.
                    *base = now;
                    fast_event(c, delta, rest, a)
                },
            ) {
                return Fast::Written;
            }
        }
        self.missed_at = now;
        Fast::Slow
    }

    /// The clock's reading for the paths other than [`Self::fast`] (which
    /// reads the clock inline, its one reading per event): clock snapshots
    /// and general events. Out of line on firmware, one copy of the
    /// clock's code for them (a SysTick or cycle counter extension is some
    /// 70 bytes).
    #[cfg_attr(target_os = "none", inline(never))]
    #[cfg_attr(not(target_os = "none"), inline(always))]
    fn now(&mut self) -> u64 {
        self.clock.now_ns()
    }

    /// The time of an event at `now` as a delta on clock 64, if the fast
    /// paths can write it so: an event they write (`lens`, its
    /// [`Rest::lens`], without [`Rest::SLOW_BIT`]), no clear requested, time
    /// not gone backwards, less than 2^28 ns (4-byte varint) since the
    /// previous event. (While a reset is due the chunk writer's fast path
    /// is held.)
    #[inline(always)]
    fn delta(&self, now: u64, lens: u32) -> Option<u32> {
        if self.out.arbiter().clear_epoch() != self.clear_epoch {
            return None;
        }
        // Time gone backwards wraps around to 2^64 - x: too large as well.
        let delta = now.wrapping_sub(self.base);
        // Below 2^28: the high word and the low word's top 4 bits are 0,
        // tested as one word with the slow bit (bit 31): one instruction
        // each on a 32-bit machine.
        let (high, low) = ((delta >> 32) as u32, delta as u32);
        (high | low >> 28 | lens >> 31 == 0).then_some(low)
    }

    /// The slow path of [`Self::fast`]'s callers, through
    /// [`Self::missed`] (the event `needs` describes: a slice begin, end or
    /// instant, or a counter sample), at the time `fast` left in
    /// `missed_at`: restarts the sequence if due,
    /// describes the counter track, interns the names (a new one in a
    /// packet of its own, [`Self::intern_alone`]) and caches a site's ids,
    /// stamps the event as a delta (or its absolute time if time went
    /// backwards) and writes it with [`SLOW_EVENT`]: the bytes the fast
    /// paths write for it. Inline: the body of [`Self::missed`], its one
    /// caller.
    #[inline(always)]
    fn slow(&mut self, needs: Needs<'_>) -> bool {
        let kind = needs.kind();
        // The fast path's reading (one clock read per event).
        let now = self.missed_at;
        if !self.ready(now) {
            return false;
        }
        let (site, names) = match needs {
            Needs::Begin(site) | Needs::Instant(site) => {
                (Some(site), Some((site.category(), site.name())))
            }
            Needs::Names(n) => (None, Some((n.category, n.name))),
            _ => (None, None),
        };
        // The skip bits, values 3 and 4 and the strings of `SLOW_EVENT`
        // (a named event's; the others read none).
        let strings: [&str; 2];
        let (skip, ids, s): (_, _, &[&str]) = match (needs, names) {
            (_, Some((category, name))) => {
                let Some(cat) = self.intern_alone(category, Kind::Category) else {
                    return self.lost();
                };
                let Some(nm) = self.intern_alone(name, Kind::EventName) else {
                    return self.lost();
                };
                if let Some(site) = site {
                    let generation = self.interned.generation();
                    self.sites.put(site.numbered(), generation, cat, nm);
                }
                let (skip, ids) = named_fields(cat, nm);
                strings = [category, name];
                (skip, ids, &strings)
            }
            (Needs::Int(track) | Needs::Double(track), _) => {
                if !self.described(AnyTrack::Counter(track), now) {
                    return false;
                }
                let bits = self.missed_value;
                let value = match needs {
                    Needs::Double(_) => CounterValue::Double(f64::from_bits(bits)),
                    _ => CounterValue::Int(bits as i64),
                };
                let (skip, ids) = sample_fields(track.uuid(), value);
                (skip, ids, &[])
            }
            _ => (0, (0, 0), &[]),
        };
        let (skip, time) = stamp(skip, self.time(now));
        let v = [u64::from(kind), ids.0, ids.1];
        let args = Args {
            skip,
            t: time,
            v: &v,
            s,
        };
        if !self.put_cold(SLOW_EVENT, &args) {
            self.stats.events_dropped += 1;
            return false;
        }
        self.stats.events = self.stats.events.wrapping_add(1);
        if skip & DELTA != 0 {
            self.base = now;
        }
        true
    }

    /// `s`'s interned id, a new one's entry written first in a packet of
    /// its own; 0 (`s` goes inline) if the table is full or `s` too long to
    /// intern (counted in [`TrackEventStats::strings_inline`]). `None` if
    /// that packet was lost.
    fn intern_alone(&mut self, s: &'static str, kind: Kind) -> Option<u32> {
        let interned = if s.len() <= MAX_NAME_LEN {
            self.interned.intern(s, kind)
        } else {
            Interned::Full
        };
        let iid = match interned {
            Interned::Known(iid) => iid,
            Interned::New(iid) => {
                let entry = NewString {
                    kind,
                    iid: u64::from(iid),
                    name: s,
                };
                let name = [s];
                if !self.put_cold(encode::INTERNED_ALONE, &encode::entry_args(&entry, &name)) {
                    return None;
                }
                iid
            }
            Interned::Full => {
                self.stats.strings_inline += 1;
                0
            }
        };
        Some(u32::from(iid))
    }

    /// How an event at `now` is stamped: a delta on clock 64, or its
    /// absolute time if it lies before the previous event.
    #[inline(always)]
    fn time(&self, now: u64) -> Time {
        match now.checked_sub(self.base) {
            Some(delta) => Time::Delta(delta),
            None => Time::Absolute {
                clock_id: self.config.clock_id,
                ns: now,
            },
        }
    }

    /// Makes sure `track`'s descriptor was written on the sequence (the
    /// caller knows it is not the default track's, described at every
    /// reset); `false` (counted) if that packet was lost.
    fn described(&mut self, track: AnyTrack, now: u64) -> bool {
        if self.tracks.contains(track.key()) {
            return true;
        }
        if self.describe(track, now) {
            // A full set only means the descriptor is written again next
            // time.
            let _ = self.tracks.insert(track.key());
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
        body: &mut dyn EncodePacket,
    ) -> bool {
        // The event with its new strings, if they fit one packet.
        let whole = !interned.is_empty()
            && match self.out.write_dyn(packet(&mut |c| {
                body.encode(c);
                encode::interned_data::<_, true>(c, interned);
            })) {
                Ok(whole) => whole,
                Err(_) => {
                    self.dropped();
                    return self.lost();
                }
            };
        if !whole {
            for entry in interned {
                if !self.put(packet(&mut |c| {
                    c.uint(
                        trace_packet::SEQUENCE_FLAGS,
                        u64::from(sequence_flags::SEQ_NEEDS_INCREMENTAL_STATE),
                    );
                    encode::interned_data::<_, true>(c, core::slice::from_ref(entry));
                })) {
                    return self.lost();
                }
            }
            if !self.put(body) {
                return self.lost();
            }
        }
        self.stats.events = self.stats.events.wrapping_add(1);
        if let Time::Delta(_) = time {
            self.base = now;
        }
        true
    }

    /// Counts an event lost with one of its packets; `false`. The packet's
    /// drop held the fast path ([`Self::dropped`]), so the sequence
    /// restarts with the next event.
    #[cold]
    fn lost(&mut self) -> bool {
        self.stats.events_dropped += 1;
        false
    }

    /// Writes the packet `template` describes with `args` ([`Cold`]).
    fn put_cold(&mut self, template: &'static [u8], args: &Args<'_>) -> bool {
        self.put(&mut Cold { template, args })
    }

    /// Writes one packet with `f`; a drop restarts the sequence.
    fn put(&mut self, f: &mut dyn EncodePacket) -> bool {
        match self.out.write_dyn(f) {
            Ok(true) => return true,
            Ok(false) => self.out.count_dropped(DropReason::PacketTooLong),
            Err(_) => {}
        }
        self.dropped()
    }

    /// A packet was dropped (by [`Self::put`], or by a caller that wrote
    /// it): holds the fast path, so that the sequence restarts with the
    /// next event; `false`.
    #[inline(always)]
    fn dropped(&mut self) -> bool {
        self.out.hold_fast_path(true);
        false
    }

    /// Makes the sequence ready for an event at `now`: restarts it if a
    /// loss or the consumer asked for it. `false` (and counted) if a packet
    /// of the restart was lost.
    fn ready(&mut self, now: u64) -> bool {
        let epoch = self.out.arbiter().clear_epoch();
        // A restart that fails leaves the fast path held (every failed
        // packet holds it), so the next event tries again.
        if epoch != self.clear_epoch || self.out.fast_path_held() {
            self.clear_epoch = epoch;
            if !self.reset(now) {
                self.stats.events_dropped += 1;
                return false;
            }
        }
        true
    }

    /// Writes the reset packet and the default track's descriptor.
    fn reset(&mut self, now: u64) -> bool {
        self.interned.clear();
        if self.interned.generation() == 1 {
            // The generations start over: no cached site may match again.
            self.sites.clear();
        }
        self.tracks.clear();
        self.stats.resets += 1;
        let (clock_id, track) = (self.config.clock_id, self.config.track);
        // One set of values for the packets of a restart: the default
        // track's descriptor's, whose time and uuid are the reset packet's
        // too ([`encode::RESET`] reads nothing else).
        let mut args = track.descriptor([now, u64::from(clock_id)]);
        let descriptor_skip = args.skip;
        // Packets lost before the sequence's first one: first a plain
        // packet (its time alone), so that the reset after it carries the
        // loss mark where a reader sees it (as the host producer does). One
        // encoder for both packets.
        let mut plain = self.out.first_packet_pending() && self.out.loss_pending();
        loop {
            args.skip = if plain { encode::PLAIN } else { 0 };
            if !self.put_cold(encode::RESET, &args) {
                return false;
            }
            if !plain {
                break;
            }
            plain = false;
        }
        self.base = now;
        self.out.hold_fast_path(false);
        // The default track's descriptor (not remembered in the track set:
        // no event looks it up).
        args.skip = descriptor_skip;
        self.put_cold(encode::DESCRIPTOR, &args)
    }

    /// Writes `track`'s descriptor packet (any track's but the default
    /// one's, which [`Self::reset`] writes).
    #[inline]
    fn describe(&mut self, track: AnyTrack, now: u64) -> bool {
        let clock_id = self.config.clock_id;
        let args = track.track().descriptor([now, u64::from(clock_id)]);
        self.put_cold(encode::DESCRIPTOR, &args)
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
        let mut args = heapless::Vec::<Arg<'_>, MAX_ARGS>::new();
        for (n, v) in spec.args {
            let name = self.resolve(n, Kind::AnnotationName, &mut new);
            // The builder holds at most MAX_ARGS.
            let _ = args.push(Arg { name, value: *v });
        }
        let time = self.time(now);
        let ev = Event {
            track_uuid,
            categories: if category.is_some() { &categories } else { &[] },
            name,
            args: &args,
            flows: spec.flows,
            terminating_flows: spec.terminating,
            counter: spec.counter,
            ..Event::new(spec.kind, time)
        };
        self.write_split(
            now,
            time,
            &new,
            packet(&mut |c| encode::event::<_, true>(c, &ev)),
        )
    }

    /// The interned id of `s`, or `s` inline; a new id is added to `new`.
    fn resolve<const M: usize>(
        &mut self,
        s: &'static str,
        kind: Kind,
        new: &mut NewStrings<M>,
    ) -> Str<'static> {
        if s.len() <= MAX_NAME_LEN {
            match self.interned.intern(s, kind) {
                Interned::Known(iid) => return Str::Iid(u64::from(iid)),
                Interned::New(iid) => {
                    let entry = NewString {
                        kind,
                        iid: u64::from(iid),
                        name: s,
                    };
                    if new.push(entry).is_ok() {
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

/// The strings one event interns (category, name, annotation names): at
/// most `M` (a vector: nothing to initialize until used).
type NewStrings<const M: usize> = heapless::Vec<NewString<'static>, M>;

const FLAGS: u8 = tag1(trace_packet::SEQUENCE_FLAGS, WireType::Varint);
const NEEDS_STATE: u8 = sequence_flags::SEQ_NEEDS_INCREMENTAL_STATE as u8;
const TRACK_EVENT: u8 = tag1(trace_packet::TRACK_EVENT, WireType::LengthDelimited);
const TYPE: u8 = tag1(track_event::TYPE, WireType::Varint);
const CATEGORY_IIDS: u8 = tag1(track_event::CATEGORY_IIDS, WireType::Varint);
const NAME_IID: u8 = tag1(track_event::NAME_IID, WireType::Varint);

/// Writes the event [`TrackEventWriter::fast`] writes: its 1-byte size,
/// its timestamp `delta` (below 2^28) after the previous event,
/// `sequence_flags` and the `track_event` `rest` and `a` describe; what
/// [`encode::event`] writes for the same event (see the tests). A few word
/// stores: each word is stored whole, and the bytes past the packet lie in
/// the window, where the next packet overwrites them.
#[inline(always)]
fn fast_event<T: Target>(c: &mut Cursor<T>, delta: u32, rest: &Rest, a: u64) {
    let lens = rest.lens;
    let (time, n) = varint_word(delta);
    // At most 31, as the tail's offset (so no window index needs masking).
    let len = lens >> 24 & 0x1F;
    // The size (`lens`' byte 0 plus the varint's length), the timestamp's
    // tag and varint: the low half of `lens + n`, then the varint.
    let head = (lens + n as u32) & 0xFFFF | time << 16;
    c.word(u64::from(head) | u64::from(time >> 16) << 32, 2 + n);
    c.word32(
        u32::from_le_bytes([FLAGS, NEEDS_STATE, TRACK_EVENT, 0]) | len << 24,
        4,
    );
    if lens & Rest::A_ONLY != 0 {
        c.word(a, len as usize);
    } else {
        // A sample: its head, value and tail, in this order (see `Rest`).
        c.word32_at(0, rest.head);
        c.word_at(Rest::VALUE_AT, a);
        c.word_at((lens >> 16 & 0x1F) as usize, rest.tail);
        c.skip(len as usize);
    }
}

/// What [`TrackEventWriter::fast`] did with an event (a word: no zero
/// extension for the caller).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Fast {
    /// Written.
    Written,
    /// Not written: tracing is off (counted).
    Disabled,
    /// Not written: the slow path's turn.
    Slow,
}

impl Rest {
    /// A slice begin's or an instant's (6 bytes, all in `a`).
    const NAMED: Rest = Rest::only(6);
    /// A slice end's (2 bytes, all in `a`).
    const END: Rest = Rest::only(2);
    /// Nothing the fast path writes: the slow path's event.
    const SLOW: Rest = Rest {
        tail: 0,
        head: 0,
        lens: Rest::SLOW_BIT,
    };

    /// A track event of `n` bytes (at most 8), all in `a`.
    const fn only(n: u32) -> Self {
        Rest {
            tail: 0,
            head: 0,
            lens: Rest::lens(n, 0) | Rest::A_ONLY,
        }
    }
}

/// A slice begin's or an instant's `track_event` (type `kind`) with the
/// interned category and name `ids` (`name << 8 | category`, both below
/// 128), or a slice end's if `kind` is [`Type::SliceEnd`] (`ids` unused),
/// on the default track: its `a` (its rest is [`Rest::NAMED`], or
/// [`Rest::END`]).
#[inline(always)]
fn named_word(kind: u32, ids: u32) -> u64 {
    // Type, category and name; an end's is its type only. (A type's value
    // is below 128.)
    let low = u32::from_le_bytes([TYPE, 0, CATEGORY_IIDS, 0]) | kind << 8 | ids << 24;
    let high = u32::from(NAME_IID) | ids & 0xFF00;
    u64::from(low) | u64::from(high) << 32
}

/// An integer sample's `a` (its varint bytes, or a negative one's first 8)
/// and its shape (the index of its rest in its track's,
/// [`CounterTrack::sample_rest`]), if the fast path writes it: a value in
/// `i32` range below 2^28 (a negative one is always 10 varint bytes, the
/// last 2 the same for all).
#[inline(always)]
fn int_word(v: i64) -> Option<(usize, u64)> {
    if (0..1 << 28).contains(&v) {
        let (word, n) = varint_word(v as u32);
        return Some((n - 1, u64::from(word)));
    }
    // In `i32` range: a word compare of the high word with the low word's
    // sign (a 64-bit range check is a compare chain).
    if v < 0 && v == i64::from(v as i32) {
        // Bytes 0..=3: bits 0..=27; byte 4: bits 28..=31, three set sign
        // bits and the continuation bit; bytes 5..=7: 0xFF. Bytes 4..=7 are
        // the low word's arithmetic shift by 28, one instruction.
        let low = varint_groups(v as u32) | 0x8080_8080;
        return Some((
            Rest::NEGATIVE,
            u64::from(low) | u64::from(((v as i32) >> 28) as u32) << 32,
        ));
    }
    None
}

/// A packet of the cold paths: a template and the values it writes, all
/// written by one encoder (its `encode`).
struct Cold<'a> {
    template: &'static [u8],
    args: &'a Args<'a>,
}

impl EncodePacket for Cold<'_> {
    fn encode(&mut self, c: &mut Cursor<Window<'_>>) {
        c.template(self.template, self.args);
    }
}

// Skip bits of `SLOW_EVENT`.
/// Stamped as a delta: no `timestamp_clock_id`.
const DELTA: u32 = 1 << 0;
/// A slice begin or an instant: its category and name.
const NAMED: u32 = 1 << 1;
/// The category inline, not by its id.
const CATEGORY_INLINE: u32 = 1 << 2;
/// The name inline, not by its id.
const NAME_INLINE: u32 = 1 << 3;
/// A counter sample: its track and value.
const SAMPLE: u32 = 1 << 4;
/// The value a double.
const DOUBLE: u32 = 1 << 5;

/// An event of the fast paths written by the slow path: what
/// [`encode::event`] writes for it. Values: the time (0), its clock (1, an
/// absolute time's), the type (2), the category's id or a counter's track
/// uuid (3), the name's id or a counter's value (4); strings: the category
/// (0) and the name (1) when inline.
const SLOW_EVENT: &[u8] = crate::template!(Template::new()
    .uint(trace_packet::TIMESTAMP, 0)
    .skip_if(DELTA)
    .uint(trace_packet::TIMESTAMP_CLOCK_ID, 1)
    .end_skip()
    .constant(
        trace_packet::SEQUENCE_FLAGS,
        sequence_flags::SEQ_NEEDS_INCREMENTAL_STATE as u64
    )
    .begin(trace_packet::TRACK_EVENT)
    .uint(track_event::TYPE, 2)
    .skip_unless(NAMED)
    .skip_if(CATEGORY_INLINE)
    .uint(track_event::CATEGORY_IIDS, 3)
    .end_skip()
    .skip_unless(CATEGORY_INLINE)
    .string(track_event::CATEGORIES, 0)
    .end_skip()
    .skip_if(NAME_INLINE)
    .uint(track_event::NAME_IID, 4)
    .end_skip()
    .skip_unless(NAME_INLINE)
    .string(track_event::NAME, 1)
    .end_skip()
    .end_skip()
    .skip_unless(SAMPLE)
    .skip_if(DOUBLE)
    .uint(track_event::COUNTER_VALUE, 4)
    .end_skip()
    .skip_unless(DOUBLE)
    .fixed64(track_event::DOUBLE_COUNTER_VALUE, 4)
    .end_skip()
    .uint(track_event::TRACK_UUID, 3)
    .end_skip()
    .end());

/// A slice begin's or an instant's [`SLOW_EVENT`] skip bits and values 3
/// and 4: its category and name by their interned ids `cat` and `nm`, or
/// (id 0) inline.
#[inline(always)]
fn named_fields(cat: u32, nm: u32) -> (u32, (u64, u64)) {
    let inline = (u32::from(cat == 0) * CATEGORY_INLINE) | (u32::from(nm == 0) * NAME_INLINE);
    (NAMED | inline, (u64::from(cat), u64::from(nm)))
}

/// A counter sample's [`SLOW_EVENT`] skip bits and values 3 and 4: `value`
/// on the track `uuid`.
#[inline(always)]
fn sample_fields(uuid: u64, value: CounterValue) -> (u32, (u64, u64)) {
    match value {
        CounterValue::Int(v) => (SAMPLE, (uuid, v as u64)),
        CounterValue::Double(v) => (SAMPLE | DOUBLE, (uuid, v.to_bits())),
    }
}

/// `skip` with [`SLOW_EVENT`]'s time bit, and its values 0 and 1, for an
/// event stamped `time`.
#[inline(always)]
fn stamp(skip: u32, time: Time) -> (u32, [u64; 2]) {
    let (skip, ns, clock_id) = match time {
        Time::Delta(ns) => (skip | DELTA, ns, 0),
        Time::Absolute { clock_id, ns } => (skip, ns, clock_id),
    };
    (skip, [ns, u64::from(clock_id)])
}

/// A named event's type and its two interning keys' bits, in one word (a
/// constant where the strings are): bits 0..=8 the category's
/// ([`Key::bits`] shifted down 23), 16..=22 the type, 23..=31 the name's.
#[derive(Clone, Copy)]
struct NamedIds(u32);

impl NamedIds {
    #[inline(always)]
    fn new(kind: Type, category: Key, name: Key) -> Self {
        NamedIds(category.bits() >> 23 | (kind as u32) << 16 | name.bits())
    }

    /// The type's value.
    #[inline(always)]
    fn kind_bits(self) -> u8 {
        (self.0 >> 16 & 0x7F) as u8
    }

    /// The category's key (`category` is the string the ids were made
    /// from).
    #[inline(always)]
    fn category(self, category: &'static str) -> Key {
        Key::from_bits(category, self.0 << 23)
    }

    /// The name's key (`name` is the string the ids were made from).
    #[inline(always)]
    fn name(self, name: &'static str) -> Key {
        Key::from_bits(name, self.0 >> 23 << 23)
    }
}

/// What [`TrackEventWriter::slow`] makes ready besides the sequence. The
/// discriminants of the kinds of event with a type of their own are that
/// type's value (so the type is the discriminant, and the site's caller
/// makes one from its type with no branch).
#[derive(Clone, Copy)]
#[repr(u8)]
enum Needs<'a> {
    /// A slice begin at a call site: its category and name interned, and
    /// their ids cached for the site.
    Begin(&'static EventSite) = Type::SliceBegin as u8,
    /// A slice end: nothing.
    End = Type::SliceEnd as u8,
    /// An instant at a call site, as [`Needs::Begin`].
    Instant(&'static EventSite) = Type::Instant as u8,
    /// A sample of an integer on a counter track, described; the value
    /// is the writer's `missed_value`.
    Int(&'static CounterTrack) = Type::Counter as u8,
    /// A slice begin's or an instant's category and name, interned.
    Names(&'a Names),
    /// [`Needs::Int`] of a double (`missed_value` its bits).
    Double(&'static CounterTrack),
}

impl Needs<'_> {
    /// The event's type (its value).
    #[inline(always)]
    fn kind(self) -> u8 {
        let kind = match self {
            Needs::Begin(_) => Type::SliceBegin,
            Needs::Instant(_) => Type::Instant,
            Needs::Names(n) => return n.kind,
            Needs::End => Type::SliceEnd,
            Needs::Int(_) | Needs::Double(_) => Type::Counter,
        };
        kind as u8
    }
}

/// A slice begin's or an instant's type (its value) and strings.
struct Names {
    kind: u8,
    category: &'static str,
    name: &'static str,
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

/// An event being put together; see [`TrackEventWriter::event`].
#[must_use = "an event is written only by `emit`"]
pub struct EventBuilder<
    'w,
    's,
    A: ChunkArbiter<'s>,
    C: Clock,
    const N: usize,
    const T: usize,
    const S: usize,
> {
    w: &'w mut TrackEventWriter<'s, A, C, N, T, S>,
    kind: Type,
    category: &'static str,
    name: &'static str,
    track: Option<AnyTrack>,
    // Vecs: nothing to initialize (and so no template copied) until used.
    args: heapless::Vec<(&'static str, ArgValue<'w>), MAX_ARGS>,
    flows: heapless::Vec<u64, MAX_FLOWS>,
    terminating: heapless::Vec<u64, MAX_FLOWS>,
    counter: Option<CounterValue>,
    at: Option<u64>,
}

impl<'w, 's, A: ChunkArbiter<'s>, C: Clock, const N: usize, const T: usize, const S: usize>
    EventBuilder<'w, 's, A, C, N, T, S>
{
    /// Puts the event on `track` instead of the default track.
    #[inline(always)]
    pub fn on(mut self, track: &'static Track) -> Self {
        self.track = Some(AnyTrack::Slices(track));
        self
    }

    /// Adds a debug annotation (at most [`MAX_ARGS`]; more are counted in
    /// [`TrackEventStats::fields_dropped`]).
    #[inline(always)]
    pub fn arg(mut self, name: &'static str, value: impl Into<ArgValue<'w>>) -> Self {
        if self.args.push((name, value.into())).is_err() {
            self.w.stats.fields_dropped += 1;
        }
        self
    }

    /// Adds a flow id: the event is a step of flow `id`. Flow ids are
    /// trace-wide (`TrackEvent.flow_ids`): every writer, and every boot of
    /// the firmware, that uses an id takes part in one flow, so ids counted
    /// from 0 at each boot link two boots' events in one trace (give them
    /// high bits that differ between boots).
    #[inline(always)]
    pub fn flow(mut self, id: u64) -> Self {
        if self.flows.push(id).is_err() {
            self.w.stats.fields_dropped += 1;
        }
        self
    }

    /// Adds a terminating flow id: the event ends flow `id`.
    #[inline(always)]
    pub fn terminating_flow(mut self, id: u64) -> Self {
        if self.terminating.push(id).is_err() {
            self.w.stats.fields_dropped += 1;
        }
        self
    }

    /// Makes the event a sample of `value` on the counter track `track`
    /// (for a counter with annotations or flows; plain samples are cheaper
    /// with [`TrackEventWriter::counter`]).
    #[inline(always)]
    pub fn counter(mut self, track: &'static CounterTrack, value: CounterValue) -> Self {
        self.kind = Type::Counter;
        self.track = Some(AnyTrack::Counter(track));
        self.counter = Some(value);
        self
    }

    /// Stamps the event `ns` (on the writer's clock) instead of now.
    #[inline(always)]
    pub fn at(mut self, ns: u64) -> Self {
        self.at = Some(ns);
        self
    }

    /// Writes the event; whether it was written.
    #[inline(always)]
    pub fn emit(self) -> bool {
        let w = self.w;
        let on_default = self.track.is_none();
        if on_default && self.kind == Type::SliceEnd && !w.slices.pop() {
            w.stats.ends_suppressed += 1;
            return false;
        }
        let written = if w.out.arbiter().tracing_enabled() {
            let now = match self.at {
                Some(ns) => ns,
                None => w.now(),
            };
            let named = !matches!(self.kind, Type::SliceEnd | Type::Counter);
            let spec = Spec {
                kind: self.kind,
                category: named.then_some(self.category),
                name: named.then_some(self.name),
                track: self.track,
                args: &self.args,
                flows: &self.flows,
                terminating: &self.terminating,
                counter: self.counter,
            };
            w.general(now, &spec)
        } else {
            w.stats.events_disabled += 1;
            false
        };
        if on_default && self.kind == Type::SliceBegin {
            w.slices.push(written);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::TARGET_SLACK;
    use std::vec::Vec;

    fn bytes(f: impl FnOnce(&mut Cursor<&mut [u8; 128 + TARGET_SLACK]>)) -> Vec<u8> {
        let mut b = [0u8; 128 + TARGET_SLACK];
        let mut c = Cursor::new(&mut b);
        f(&mut c);
        let n = c.finish().unwrap();
        b[..n].to_vec()
    }

    const DELTAS: [u32; 7] = [0, 1, 127, 128, 16_384, 1 << 21, (1 << 28) - 1];

    #[test]
    fn the_fast_named_events_are_the_general_encoding() {
        for delta in DELTAS {
            for kind in [Type::SliceBegin, Type::SliceEnd, Type::Instant] {
                for (cat, name) in [(1u8, 2u8), (0x7F, 0x7F)] {
                    let (cats, nm) = if kind == Type::SliceEnd {
                        (&[][..], None)
                    } else {
                        (
                            &[Str::Iid(u64::from(cat))][..],
                            Some(Str::Iid(u64::from(name))),
                        )
                    };
                    let want = bytes(|c| {
                        let ev = Event {
                            categories: cats,
                            name: nm,
                            ..Event::new(kind, Time::Delta(u64::from(delta)))
                        };
                        encode::event::<_, true>(c, &ev)
                    });
                    let ids = u32::from(name) << 8 | u32::from(cat);
                    let a = named_word(kind as u32, ids);
                    let rest = if kind == Type::SliceEnd {
                        Rest::END
                    } else {
                        Rest::NAMED
                    };
                    let got = bytes(|c| fast_event(c, delta, &rest, a));
                    assert_eq!(usize::from(got[0]), want.len(), "{kind:?} after {delta} ns");
                    assert_eq!(got[1..], want, "{kind:?} after {delta} ns");
                }
            }
        }
    }

    #[test]
    fn the_slow_events_are_the_general_encoding() {
        let times = [
            Time::Delta(0),
            Time::Delta(300),
            Time::Delta(1 << 28),
            Time::Delta(u64::MAX),
            Time::Absolute {
                clock_id: FIRMWARE_CLOCK_ID,
                ns: 12_345_678_901,
            },
        ];
        let strs = [
            Str::Iid(1),
            Str::Iid(127),
            Str::Iid(128),
            Str::Iid(70_000),
            Str::Inline("a"),
            Str::Inline("sensor.read"),
        ];
        let values = [
            CounterValue::Int(0),
            CounterValue::Int(-1),
            CounterValue::Int(1 << 40),
            CounterValue::Int(i64::MIN),
            CounterValue::Double(-21.5),
        ];
        for time in times {
            let mut cases = Vec::new();
            for kind in [Type::SliceBegin, Type::Instant] {
                for cat in strs {
                    for name in strs {
                        cases.push((kind, Some((cat, name)), None));
                    }
                }
            }
            cases.push((Type::SliceEnd, None, None));
            for uuid in [1, 0xFFFF_FFFF, 1 << 35, u64::MAX] {
                for value in values {
                    cases.push((Type::Counter, None, Some((uuid, value))));
                }
            }
            for (kind, names, counter) in cases {
                let want = bytes(|c| {
                    let cats = names.map(|(cat, _)| [cat]);
                    let ev = Event {
                        categories: cats.as_ref().map_or(&[][..], |c| &c[..]),
                        name: names.map(|(_, name)| name),
                        track_uuid: counter.map(|(uuid, _)| uuid),
                        counter: counter.map(|(_, value)| value),
                        ..Event::new(kind, time)
                    };
                    encode::event::<_, true>(c, &ev)
                });
                let id = |s: Str<'static>| match s {
                    Str::Iid(iid) => (u32::try_from(iid).unwrap(), ""),
                    Str::Inline(s) => (0, s),
                };
                // As the writer: strings for a named event only.
                let strings;
                let (skip, ids, s): (_, _, &[&str]) = match (names, counter) {
                    (Some((cat, nm)), _) => {
                        let ((cat, category), (nm, name)) = (id(cat), id(nm));
                        let (skip, ids) = named_fields(cat, nm);
                        strings = [category, name];
                        (skip, ids, &strings)
                    }
                    (_, Some((uuid, value))) => {
                        let (skip, ids) = sample_fields(uuid, value);
                        (skip, ids, &[])
                    }
                    _ => (0, (0, 0), &[]),
                };
                let (skip, time) = stamp(skip, time);
                let v = [kind as u64, ids.0, ids.1];
                let args = Args {
                    skip,
                    t: time,
                    v: &v,
                    s,
                };
                let got = bytes(|c| c.template(SLOW_EVENT, &args));
                assert_eq!(got, want, "{kind:?} {names:?} {counter:?} at {time:?}");
            }
        }
    }

    #[test]
    fn the_fast_counter_samples_are_the_general_encoding() {
        static TRACKS: [CounterTrack; 3] = [
            CounterTrack::new("c"),
            CounterTrack::new("c").with_uuid(5),
            CounterTrack::new("c").with_uuid((1 << 35) - 1),
        ];
        let values = [
            CounterValue::Int(0),
            CounterValue::Int(1),
            CounterValue::Int(300),
            CounterValue::Int(1 << 14),
            CounterValue::Int((1 << 21) - 1),
            CounterValue::Int(1 << 21),
            CounterValue::Int((1 << 28) - 1),
            CounterValue::Int(-1),
            CounterValue::Int(-300),
            CounterValue::Int(-(1 << 28)),
            CounterValue::Int(i64::from(i32::MIN)),
            CounterValue::Double(0.0),
            CounterValue::Double(-21.5),
            CounterValue::Double(f64::MAX),
        ];
        for track in &TRACKS {
            for delta in DELTAS {
                for value in values {
                    let want = bytes(|c| {
                        let ev = Event {
                            track_uuid: Some(track.uuid()),
                            counter: Some(value),
                            ..Event::new(Type::Counter, Time::Delta(u64::from(delta)))
                        };
                        encode::event::<_, true>(c, &ev)
                    });
                    let (rest, a) = match value {
                        CounterValue::Int(v) => {
                            let (shape, a) = int_word(v).unwrap();
                            (*track.sample_rest(shape), a)
                        }
                        CounterValue::Double(v) => (*track.sample_rest(Rest::DOUBLE), v.to_bits()),
                    };
                    let got = bytes(|c| fast_event(c, delta, &rest, a));
                    assert_eq!(
                        usize::from(got[0]),
                        want.len(),
                        "{value:?} after {delta} ns"
                    );
                    assert_eq!(
                        got[1..],
                        want,
                        "{value:?} on {:#x} after {delta} ns",
                        track.uuid()
                    );
                }
            }
        }
        for v in [
            1 << 28,
            1 << 32,
            i64::from(i32::MIN) - 1,
            -(1 << 32),
            i64::MAX,
            i64::MIN,
        ] {
            assert!(int_word(v).is_none(), "{v}");
        }
    }
}
