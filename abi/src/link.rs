//! The firmware's side of the two ways a host takes its trace: the
//! services a firmware's main loop polls so the host tools
//! (`shmtrace serve --attach`, `shmtrace bridge`) get its chunks, its
//! clock and its answers.
//!
//! * [`AttachService`]: the host maps the [region](crate::region) (shared
//!   RAM: QEMU's `memory-backend-file`, a dual-core MCU's SRAM, a UIO
//!   window) and consumes its ring itself. The firmware only answers the
//!   control words a host writes: a new `flush_request` (commit what the
//!   writers hold, then `flush_ack`) and a new `sync_request` (the clock,
//!   in `sync_time`). `trace_enabled` and `clear_request` reach the writers
//!   through their [`RegionArbiter`](crate::region::RegionArbiter)s.
//! * [`StreamService`]: the host reads a byte stream (a UART, an RTT-style
//!   ring, TCP). The region is in stream mode; the service drains its ring
//!   with a [`RegionReader`](crate::region::RegionReader), sends every record as a [frame](crate::frame)
//!   (HELLO first and again every second with STATS; until the host says
//!   something, an unasked CLOCK and a clear of the writers' sequences
//!   every second too) through a [`ByteIo`], and obeys the
//!   host's frames read back from it: ENABLE/DISABLE and CLEAR (the
//!   region's own control words, which the arbiters see), FLUSH (commit
//!   what the writers hold, then send it all), SYNC (a CLOCK frame at
//!   once).
//!
//! Both are polled: [`AttachService::poll`] and [`StreamService::poll`]
//! never wait for the host (a stream's [`ByteIo::write`] may wait for the
//! line), take the firmware's flush as a closure (flush every writer: the
//! main loop's, and those of interrupts in their
//! [`WriterCell`](crate::track_event::WriterCell)s) and its clock as a
//! [`Clock`](crate::track_event::Clock) (the writers' clock hook: nanoseconds on the region's
//! `clock_id`). Poll from the main loop (or a low-priority task), often
//! enough for the host: a flush or a sync waits for the next poll, and in
//! stream mode every chunk committed waits in the SMB until a poll sends
//! it. Nothing here is on the event path, and nothing panics.
//!
//! ```
//! use shmtrace_abi::layout::PageLayout;
//! use shmtrace_abi::link::AttachService;
//! use shmtrace_abi::region::{RegionArbiter, RegionConfig, RegionStorage};
//! use shmtrace_abi::track_event::{SequenceConfig, Track, TrackEventWriter};
//! use shmtrace_abi::writer::InPlaceWriter;
//!
//! static REGION: RegionStorage<8192, 16> = RegionStorage::new();
//! static MAIN: Track = Track::new("main loop");
//! // The clock hook: a hardware counter in ns (here a stand-in).
//! fn now_ns() -> u64 { 1_000 }
//!
//! let handles = REGION.take(&RegionConfig::new("track_event")).unwrap();
//! let arbiter = RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
//! let mut w: TrackEventWriter<_, _> = TrackEventWriter::new(
//!     InPlaceWriter::new(arbiter, 1, 0).unwrap(),
//!     now_ns,
//!     SequenceConfig::new(&MAIN),
//! );
//! let mut link = AttachService::new(&handles);
//! # handles.control.request_flush(); // what a host does
//! for _ in 0..3 { // `loop` in a firmware
//!     w.slice_begin("app", "work");
//!     w.slice_end();
//!     link.poll(|| w.flush(), now_ns);
//! }
//! # assert_eq!(handles.control.flush_ack(), 1);
//! ```
//!
//! # Costs
//!
//! [`AttachService`]: 8 bytes of RAM, a few loads per poll. [`StreamService`]:
//! its chunk buffer (a page less 8 bytes: the largest chunk), a 32-byte
//! command buffer and about 100 bytes of state; the frame CRC, on a target
//! without an OS, a 1 KiB table in flash and 7 (Cortex-M4) to 10
//! (Cortex-M0) instructions per byte sent, or with the `crc-bitwise`
//! feature no table and 64 to 81 instructions per byte (see the crate
//! docs, "Features").

mod attach;
mod stream;
#[cfg(test)]
mod tests;

pub use attach::{AttachService, Served};
pub use stream::{StreamError, StreamService, DEFAULT_CHUNK_BUFFER, STATS_PERIOD_NS};

/// A byte channel to the host: what [`StreamService`] sends frames through
/// and reads the host's frames from. A UART, an RTT-style ring in RAM a
/// probe reads, a USB CDC endpoint, a socket.
///
/// ```
/// use shmtrace_abi::link::ByteIo;
///
/// /// A UART with a one-byte buffer each way (registers as plain fields).
/// struct Uart { tx: Vec<u8>, rx: Option<u8> }
///
/// impl ByteIo for Uart {
///     fn write(&mut self, bytes: &[u8]) {
///         // A real driver waits for room in its TX buffer before each byte.
///         self.tx.extend_from_slice(bytes);
///     }
///     fn read(&mut self) -> Option<u8> {
///         self.rx.take()
///     }
/// }
/// ```
pub trait ByteIo {
    /// Sends all of `bytes` (waiting for the line if it must). A frame is
    /// handed over in a few pieces; the service counts nothing as dropped,
    /// so an implementation that cannot send (a full ring it does not wait
    /// for) loses the rest of that frame, which the host counts (bad CRC,
    /// then a gap in the frame numbers).
    fn write(&mut self, bytes: &[u8]);

    /// The next byte the host sent, if one has arrived; never waits.
    fn read(&mut self) -> Option<u8>;
}

impl<T: ByteIo + ?Sized> ByteIo for &mut T {
    fn write(&mut self, bytes: &[u8]) {
        (**self).write(bytes);
    }

    fn read(&mut self) -> Option<u8> {
        (**self).read()
    }
}
