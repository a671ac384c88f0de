//! The event kinds the firmware writes and measures, and the interface of a
//! tracer.
//!
//! [`Event::ALL`] is the table: the loop in [`crate::run`] calls each kind
//! a binary measures once per round, in this order, between
//! [`crate::markers`]; the firmware prints the names of the kinds it
//! measures (`kinds ...`) so the report labels its counts from them.

use shmtrace_abi::track_event::Clock;

use crate::clocks::SysTickClock;
use crate::markers;
use crate::out::Out;

/// The category of every event.
pub const CATEGORY: &str = "fw";
/// Name of the slices.
pub const WORK: &str = "work";
/// Name of the instants.
pub const TICK: &str = "tick";

/// Writes track events somewhere. Methods never fail: a tracer that loses
/// an event counts it in [`Tracer::dropped`].
pub trait Tracer {
    /// Reads the clock the tracer stamps events with (ns).
    fn now(&mut self) -> u64;
    /// Begins a slice named [`WORK`] in [`CATEGORY`] on the firmware's
    /// track.
    fn slice_begin(&mut self);
    /// Ends the innermost open slice.
    fn slice_end(&mut self);
    /// An instant event named [`TICK`] in [`CATEGORY`] on the firmware's
    /// track.
    fn instant(&mut self);
    /// An integer sample of the firmware's counter track.
    fn counter(&mut self, value: i64);
    /// A floating-point sample of the firmware's second counter track.
    fn counter_f64(&mut self, value: f64);
    /// An instant on a track of its own, with a debug annotation `value`
    /// and a flow.
    fn step(&mut self, value: u32);
    /// Writes a `ClockSnapshot` pairing the event clock with another one.
    fn clock_snapshot(&mut self);
    /// Starts the sequence again (as a consumer's clear request would): the
    /// next event writes the reset packet, descriptors and interned names
    /// anew.
    fn clear(&mut self);
    /// Commits what was written so far (the current chunk).
    fn flush(&mut self);
    /// Moves committed data out of the SMB as the tracing service would and
    /// hands each piece to `f`.
    fn drain(&mut self, f: &mut dyn FnMut(Moved<'_>));
    /// Ends tracing from other contexts (the interrupt's writer) and
    /// commits their data.
    fn stop(&mut self);
    /// Packets, events or chunks lost so far.
    fn dropped(&self) -> u64;
    /// Prints what the report needs besides the chunks: the firmware
    /// clock now, the other contexts' events, the RAM the tracer keeps.
    fn report(&mut self, out: &mut Out);
}

/// A piece of trace data taken out of the SMB by [`Tracer::drain`].
#[derive(Debug, Clone, Copy)]
pub enum Moved<'a> {
    /// A whole chunk (8-byte header, then payload), copied out.
    Chunk(&'a [u8]),
    /// 4 bytes to write into an already moved chunk.
    Patch {
        /// Writer id of the chunk.
        writer_id: u16,
        /// Chunk id.
        chunk_id: u32,
        /// Offset from the start of the chunk payload.
        offset: u16,
        /// The bytes.
        data: [u8; 4],
        /// More patches for this chunk follow later.
        has_more: bool,
    },
}

/// The tracer that writes nothing: the skeleton's. It reads the same clock
/// as the tracers that write (the clock is the firmware's, read by the
/// [`Event::Clock`] row whatever the tracer), so the size a tracer adds
/// over the skeleton is its own.
#[derive(Debug, Default)]
pub struct NoTracer;

impl Tracer for NoTracer {
    #[inline(always)]
    fn now(&mut self) -> u64 {
        SysTickClock.now_ns()
    }
    fn slice_begin(&mut self) {}
    fn slice_end(&mut self) {}
    fn instant(&mut self) {}
    fn counter(&mut self, _: i64) {}
    fn counter_f64(&mut self, _: f64) {}
    fn step(&mut self, _: u32) {}
    fn clock_snapshot(&mut self) {}
    fn clear(&mut self) {}
    fn flush(&mut self) {}
    fn drain(&mut self, _: &mut dyn FnMut(Moved<'_>)) {}
    fn stop(&mut self) {}
    fn dropped(&self) -> u64 {
        0
    }
    fn report(&mut self, _: &mut Out) {}
}

/// A tracer that writes instants only, through `T`: the other event calls
/// do nothing, so none of `T`'s code for them is linked.
#[derive(Debug)]
pub struct InstantsOnly<T>(pub T);

impl<T: Tracer> Tracer for InstantsOnly<T> {
    #[inline(always)]
    fn now(&mut self) -> u64 {
        self.0.now()
    }
    fn slice_begin(&mut self) {}
    fn slice_end(&mut self) {}
    #[inline(always)]
    fn instant(&mut self) {
        self.0.instant();
    }
    fn counter(&mut self, _: i64) {}
    fn counter_f64(&mut self, _: f64) {}
    fn step(&mut self, _: u32) {}
    fn clock_snapshot(&mut self) {}
    fn clear(&mut self) {
        self.0.clear();
    }
    fn flush(&mut self) {
        self.0.flush();
    }
    fn drain(&mut self, f: &mut dyn FnMut(Moved<'_>)) {
        self.0.drain(f);
    }
    fn stop(&mut self) {
        self.0.stop();
    }
    fn dropped(&self) -> u64 {
        self.0.dropped()
    }
    fn report(&mut self, out: &mut Out) {
        self.0.report(out);
    }
}

/// A kind of event the report measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Nothing between the markers: their own cost, subtracted from the
    /// others.
    MarkersOnly,
    /// [`Tracer::now`]: the clock hook alone, a part of every event.
    Clock,
    /// [`Tracer::slice_begin`] with interned names (at a call site).
    SliceBegin,
    /// [`Tracer::instant`] with interned names (at a call site).
    Instant,
    /// [`Tracer::slice_end`].
    SliceEnd,
    /// [`Tracer::counter`].
    Counter,
    /// [`Tracer::counter_f64`].
    CounterF64,
    /// [`Tracer::step`]: the event builder.
    Step,
    /// [`Tracer::clock_snapshot`].
    ClockSnapshot,
}

impl Event {
    /// The table, in the order the loop calls them.
    pub const ALL: [Event; 9] = [
        Event::MarkersOnly,
        Event::Clock,
        Event::SliceBegin,
        Event::Instant,
        Event::SliceEnd,
        Event::Counter,
        Event::CounterF64,
        Event::Step,
        Event::ClockSnapshot,
    ];

    /// The kinds the size and speed goals are about: slices,
    /// instants and integer counters on tracks described once.
    pub const MINIMAL: [Event; 6] = [
        Event::MarkersOnly,
        Event::Clock,
        Event::SliceBegin,
        Event::Instant,
        Event::SliceEnd,
        Event::Counter,
    ];

    /// The kinds of the smallest producer: instants only.
    pub const INSTANTS: [Event; 3] = [Event::MarkersOnly, Event::Clock, Event::Instant];

    /// The label the firmware prints and the report uses.
    pub const fn name(self) -> &'static str {
        match self {
            Event::MarkersOnly => "markers_only",
            Event::Clock => "clock",
            Event::SliceBegin => "slice_begin",
            Event::Instant => "instant",
            Event::SliceEnd => "slice_end",
            Event::Counter => "counter",
            Event::CounterF64 => "counter_f64",
            Event::Step => "step",
            Event::ClockSnapshot => "clock_snapshot",
        }
    }

    /// Writes one event of this kind with `tracer` between the markers, in
    /// round `rep` (the values the report expects derive from it).
    #[inline(always)]
    pub fn measure<T: Tracer>(self, tracer: &mut T, rep: u32) {
        match self {
            Event::MarkersOnly => {
                markers::begin();
                markers::end();
            }
            Event::Clock => {
                markers::begin();
                let now = tracer.now();
                markers::end();
                core::hint::black_box(now);
            }
            Event::SliceBegin => {
                markers::begin();
                tracer.slice_begin();
                markers::end();
            }
            Event::Instant => {
                markers::begin();
                tracer.instant();
                markers::end();
            }
            Event::SliceEnd => {
                markers::begin();
                tracer.slice_end();
                markers::end();
            }
            Event::Counter => {
                // Opaque to the optimiser: the writer is measured for any
                // value, not specialised for this loop's range.
                let value = core::hint::black_box(i64::from(rep) - 32);
                markers::begin();
                tracer.counter(value);
                markers::end();
            }
            Event::CounterF64 => {
                let value = core::hint::black_box(f64::from(rep) * 0.25);
                markers::begin();
                tracer.counter_f64(value);
                markers::end();
            }
            Event::Step => {
                markers::begin();
                tracer.step(rep);
                markers::end();
            }
            Event::ClockSnapshot => {
                markers::begin();
                tracer.clock_snapshot();
                markers::end();
            }
        }
    }
}
