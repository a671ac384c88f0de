//! The event kinds the firmware writes and measures, and the interface of a
//! tracer.
//!
//! [`Event::ALL`] is the table: the loop in [`crate::run`] calls each kind
//! once per round, in this order, between [`crate::markers`]; the firmware
//! prints the table's names (`kinds ...`) so the report labels its counts
//! from it.

use crate::markers;

/// An event name known at build time, with the interning id a tracer may
/// use for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Name {
    /// Interning id (non-zero, unique in [`NAMES`]).
    pub iid: u64,
    /// The name.
    pub text: &'static str,
}

/// Name of the slices.
pub const WORK: Name = Name {
    iid: 1,
    text: "work",
};
/// Name of the instants.
pub const TICK: Name = Name {
    iid: 2,
    text: "tick",
};
/// Every name the firmware uses.
pub const NAMES: [Name; 2] = [WORK, TICK];

/// Writes track events somewhere. Methods never fail: a tracer that loses
/// an event counts it in [`Tracer::dropped`].
pub trait Tracer {
    /// Writes what a sequence needs before its first event (track
    /// descriptors, interned names).
    fn start(&mut self);
    /// Begins a slice on the firmware's track.
    fn slice_begin(&mut self, ts: u64, name: Name);
    /// Ends the innermost open slice.
    fn slice_end(&mut self, ts: u64);
    /// An instant event on the firmware's track.
    fn instant(&mut self, ts: u64, name: Name);
    /// A value of the firmware's counter track.
    fn counter(&mut self, ts: u64, value: i64);
    /// Commits what was written so far (the current chunk).
    fn flush(&mut self);
    /// Moves committed data out of the SMB as the tracing service would and
    /// hands each piece to `f`.
    fn drain(&mut self, f: &mut dyn FnMut(Moved<'_>));
    /// Packets (or chunks of them) lost so far.
    fn dropped(&self) -> u64;
    /// Bytes of RAM the tracer keeps besides the SMB (writer state, commit
    /// queue, bookkeeping).
    fn state_bytes(&self) -> usize;
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

/// The tracer that writes nothing: the skeleton's.
#[derive(Debug, Default)]
pub struct NoTracer;

impl Tracer for NoTracer {
    fn start(&mut self) {}
    fn slice_begin(&mut self, _: u64, _: Name) {}
    fn slice_end(&mut self, _: u64) {}
    fn instant(&mut self, _: u64, _: Name) {}
    fn counter(&mut self, _: u64, _: i64) {}
    fn flush(&mut self) {}
    fn drain(&mut self, _: &mut dyn FnMut(Moved<'_>)) {}
    fn dropped(&self) -> u64 {
        0
    }
    fn state_bytes(&self) -> usize {
        0
    }
}

/// A kind of event the report measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Nothing between the markers: their own cost, subtracted from the
    /// others.
    MarkersOnly,
    /// [`Tracer::slice_begin`] with an interned name.
    SliceBegin,
    /// [`Tracer::slice_end`].
    SliceEnd,
    /// [`Tracer::instant`] with an interned name.
    Instant,
    /// [`Tracer::counter`].
    Counter,
}

impl Event {
    /// The table, in the order the loop calls them.
    pub const ALL: [Event; 5] = [
        Event::MarkersOnly,
        Event::SliceBegin,
        Event::SliceEnd,
        Event::Instant,
        Event::Counter,
    ];

    /// The label the firmware prints and the report uses.
    pub const fn name(self) -> &'static str {
        match self {
            Event::MarkersOnly => "markers_only",
            Event::SliceBegin => "slice_begin",
            Event::SliceEnd => "slice_end",
            Event::Instant => "instant",
            Event::Counter => "counter",
        }
    }

    /// Writes one event of this kind with `tracer` between the markers.
    #[inline(always)]
    pub fn measure<T: Tracer>(self, tracer: &mut T, ts: u64, value: i64) {
        match self {
            Event::MarkersOnly => {
                markers::begin();
                markers::end();
            }
            Event::SliceBegin => {
                markers::begin();
                tracer.slice_begin(ts, WORK);
                markers::end();
            }
            Event::SliceEnd => {
                markers::begin();
                tracer.slice_end(ts);
                markers::end();
            }
            Event::Instant => {
                markers::begin();
                tracer.instant(ts, TICK);
                markers::end();
            }
            Event::Counter => {
                markers::begin();
                tracer.counter(ts, value);
                markers::end();
            }
        }
    }
}
