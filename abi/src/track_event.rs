//! Track events without `std`: slices, instants, counters, flows and debug
//! annotations on tracks, written by firmware (or any `no_std` program)
//! straight into SMB chunks.
//!
//! A [`TrackEventWriter`] writes one packet sequence. What it writes is
//! what Perfetto's C++ SDK writes for the same events (and byte for byte
//! what `shmtrace-producer` writes, both encoding through [`encode`]):
//!
//! 1. A reset packet, first and after every loss or clear request:
//!    `sequence_flags = SEQ_INCREMENTAL_STATE_CLEARED`,
//!    `trace_packet_defaults` (events on the incremental clock 64, on the
//!    writer's default track) and a `clock_snapshot` defining clock 64 as
//!    equal to the writer's absolute clock now; then the default track's
//!    descriptor.
//! 2. Events with `sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE` and their
//!    time as a delta on clock 64 (one to three bytes). Category, event and
//!    annotation names (`&'static str`) are interned per sequence, events
//!    carry their ids: a slice begin's or an instant's new names each come
//!    first in a packet of their own (`sequence_flags` and the entry alone
//!    in `interned_data`), so the event itself is the one the fast path
//!    writes; an event built with [`TrackEventWriter::event`] carries its
//!    new strings in its own `interned_data`. A track other than the
//!    default one gets its descriptor before its first event.
//!
//! Names of slice begins and instants come as two strings
//! ([`TrackEventWriter::slice_begin`]), whose ids the writer looks up in
//! its interning table at every call, or from a call site
//! ([`slice_begin!`](crate::slice_begin), [`instant!`](crate::instant),
//! [`EventSite`]), whose ids each writer caches once per sequence: the
//! cheaper call on firmware. The bytes are the same.
//!
//! Every packet is at most 127 bytes and written in place through an
//! [`InPlaceWriter`](crate::writer::InPlaceWriter): no copy, no `memcpy`.
//! An event that does not fit (long strings) first moves its new interned
//! strings into packets of their own; if it still does not fit, it is
//! dropped and counted.
//!
//! So strings have limits (see "Costs and limits" below for the numbers):
//! a category, event or annotation name of at most [`MAX_NAME_LEN`] (107)
//! bytes is interned while the interning table has room, and the event
//! carries its id; a longer one (or any name once the table is full) goes
//! inline, and string annotation *values* always do. An event whose inline
//! strings make it longer than its packet is dropped whole: counted in
//! [`TrackEventStats::events_dropped`], marked `previous_packet_dropped`,
//! and the sequence restarts (a reset packet, descriptors and names
//! again). Text longer than that (a log line, a buffer's dump) goes in a
//! packet of a [`TraceWriter`](crate::writer::TraceWriter) on a writer id of
//! its own: its packets have no size limit and continue across chunks. It
//! writes the packets it is given and nothing else: the program checks the
//! host's `trace_enabled` itself ([`Control::trace_enabled`]), stamps the
//! packets on its absolute clock (`timestamp_clock_id`, 65 by default), and
//! writes the `TrackDescriptor` of the track they name again whenever
//! tracing turns on, since a session holds only what was written during it.
//!
//! [`Control::trace_enabled`]: crate::region::Control::trace_enabled
//!
//! ```
//! use shmtrace_abi::layout::{PageLayout, PageSize};
//! use shmtrace_abi::smb::{Smb, SmbStorage};
//! use shmtrace_abi::track_event::{CounterTrack, SequenceConfig, Track, TrackEventWriter};
//! use shmtrace_abi::writer::InPlaceWriter;
//! # use shmtrace_abi::writer::{BufferId, ChunkArbiter, PatchGroup, PatchesDeferred};
//! # use shmtrace_abi::layout::ChunkHeaderRepr;
//! # use shmtrace_abi::smb::WritableChunk;
//! # struct Arbiter<'s>(&'s Smb<'s>);
//! # impl<'s> ChunkArbiter<'s> for Arbiter<'s> {
//! #     fn acquire_chunk(&mut self, h: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
//! #         self.0.try_acquire_any_chunk_for_writing(0, PageLayout::Div4, h).ok()
//! #     }
//! #     fn commit_chunk(&mut self, c: WritableChunk<'s>, _: BufferId) { let _ = c.release_as_complete(); }
//! #     fn send_patches(&mut self, _: &PatchGroup<'_>) -> Result<(), PatchesDeferred> { Ok(()) }
//! #     fn flush(&mut self) {}
//! # }
//!
//! static MAIN: Track = Track::new("main loop");
//! static TEMPERATURE: CounterTrack = CounterTrack::new("temperature").with_unit_name("mC");
//!
//! let mut storage = Box::new(SmbStorage::<8192>::new());
//! let smb = Smb::new(&mut storage, PageSize::DEFAULT).unwrap();
//! let out = InPlaceWriter::new(Arbiter(&smb), 1, 1).unwrap();
//! let mut ticks = 0u64;
//! let clock = move || { ticks += 1_000; ticks };
//! let mut w: TrackEventWriter<_, _> = TrackEventWriter::new(out, clock, SequenceConfig::new(&MAIN));
//!
//! assert!(w.slice_begin("io", "read sensor"));
//! assert!(shmtrace_abi::instant!(w, "io", "sampled"));
//! assert!(w.counter(&TEMPERATURE, 21_500));
//! assert!(w.event(shmtrace_abi::trace::track_event::Type::Instant, "io", "sample").arg("raw", 1234u32).emit());
//! assert!(w.slice_end());
//! assert_eq!(w.stats().events, 5);
//! ```
//!
//! # Costs and limits (the knobs)
//!
//! RAM, on a 32-bit target (`size_of`, measured by the firmware example on
//! `thumbv7em-none-eabihf`):
//!
//! | part | bytes |
//! |---|---|
//! | `TrackEventWriter` itself (config, time base, slice stack, counters) | 64 |
//! | interning table, `N` strings (a power of two) | 8 + 8 × `N` |
//! | described tracks, `T` (besides the default track) | 4 × `T` |
//! | cached call sites, `S` | 4 × `S` |
//! | its [`InPlaceWriter`](crate::writer::InPlaceWriter) (the chunk held, cursor, counters; no patch storage: it never fragments) | 72 |
//! | the arbiter (a [`RegionArbiter`](crate::region::RegionArbiter)) | 48 |
//!
//! So `N = 4`, `T = 2`, `S = 4` (three strings, two counter tracks, two
//! call sites) is 248 bytes, the defaults `N = 16`, `T = 4`, `S = 8` 368. Strings beyond `N` are written inline (counted in
//! [`TrackEventStats::strings_inline`]), descriptors beyond `T` again before
//! each use; events at call sites beyond the first `S` a program uses take
//! the slow path (an interning lookup) at every call. A clock that is a zero-sized
//! type (a static counter behind it) adds nothing.
//!
//! Flash: a `static` [`Track`] is 48 bytes, a [`CounterTrack`] 128 (each
//! holds its descriptor's fields as the writer hands them over; a counter
//! track also the bytes around a sample's value, one set per shape of
//! integer, so the fast path finds them in one load).
//!
//! Shared memory: every writer holds one chunk while it writes and never
//! waits for another. The page layout sets the chunk size (`(page - 8) / n`
//! bytes for `n` chunks per page): with 4 KiB pages, `Div4` gives chunks of
//! 1 KiB, so a 4 KiB SMB (one page) serves two writers with two chunks in
//! flight to the consumer; `Div14` chunks (288 bytes) commit more often and
//! waste less when several writers are idle. A packet takes at most 128
//! bytes of a chunk, and a chunk's tail shorter than the smallest window (16
//! bytes + 8 of slack) stays unused. The region's commit ring takes 32
//! bytes per slot ([`RegionStorage`](crate::region::RegionStorage)'s
//! `SLOTS`); a full ring costs nothing but a scan by the consumer.
//!
//! Time: the common events (slice begin/end and instant with interned
//! names on the default track, samples on a described counter track) take
//! one out-of-line function each: the call site's cached ids (two loads
//! and a compare; or, for names given as strings, the interning probes:
//! one or two entry compares each, or a scan of a table of at most
//! [`SCAN_MAX`](intern::SCAN_MAX) entries), a clock read, one check of the sequence state, the
//! packet's bytes as a few word stores straight into the chunk, one release
//! store of the chunk's count. No `memcpy`, no `memset`, no division. The
//! first event of a sequence (and the first after a loss or a clear) writes
//! the reset packet and descriptors and interns its strings: about ten
//! times as many instructions.
//!
//! Strings: a name of at most [`MAX_NAME_LEN`] (107) bytes always fits
//! (interned, while the table has room); a longer one goes inline, and one
//! of more than about 110 bytes drops its event. String annotation values are written inline, and the event with
//! all of its fields must fit 119 bytes (a packet's 127 less 8 kept for a
//! loss mark): one value of up to 80 bytes always fits an event with a
//! category, a name, one annotation, a flow id and a track of its own;
//! several values share that room.
//!
//! Nothing blocks: a full SMB drops the event (counted, and marked on the
//! next packet as `previous_packet_dropped`), and the sequence restarts.
//!
//! # Clocks
//!
//! See [`Clock`]: the program supplies nanoseconds on its own time base;
//! [`TickClock`] turns a tick count into one and [`Extend32`] widens a
//! wrapping 32-bit cycle counter for it ([`clock`] also says how to count
//! SysTick, which wraps too often for that).
//!
//! # Several contexts
//!
//! One writer per context (thread, interrupt priority, task), each in a
//! [`WriterCell`], each with its own writer id; see [`cell`].

pub mod cell;
pub mod clock;
pub mod encode;
pub mod intern;
pub mod site;
pub mod track;
mod writer;

pub use cell::WriterCell;
pub use clock::{Clock, Extend32, TickClock, TickRate};
pub use encode::{ArgValue, ClockValue, CounterValue};
pub use site::EventSite;
pub use track::{name_uuid, CounterTrack, Track};
pub use writer::{
    EventBuilder, SequenceConfig, TrackEventStats, TrackEventWriter, FIRMWARE_CLOCK_ID, MAX_ARGS,
    MAX_FLOWS, MAX_NAME_LEN,
};
