//! The firmware bridge: takes what a firmware's tracing writes (finished
//! SMB chunks and patches, its hello, clock samples and counters) from a
//! [`FirmwareSource`] and forwards it as a normal producer
//! (shmtrace-producer's [`ChunkForwarder`](shmtrace_producer::ChunkForwarder)),
//! so any Perfetto service records it: ours or a stock `traced`.
//!
//! * [`engine`]: the sans-IO core. Per firmware boot, fresh sequences (a
//!   restart is never mixed with the old run); chunks validated and
//!   forwarded per firmware writer; a clock snapshot relating the
//!   firmware's clock to BOOTTIME injected into every sequence before its
//!   first packet in a session and whenever due, and stated again every
//!   [`SNAPSHOT_PERIOD_BYTES`](engine::SNAPSHOT_PERIOD_BYTES) forwarded (a
//!   ring buffer keeps one near its oldest data); every loss counted.
//! * [`clock`]: the clock relation, from two-way or one-way samples, with
//!   its error bound.
//! * [`output`]: what the engine drives: the forwarding API of the producer
//!   library ([`output::ProducerOutput`]), or a recording double in tests.
//! * [`import`]: offline: a recorded source into a trace file, through a
//!   service inside this process.
//! * [`input`]: `--input` specs, byte streams (files, devices, TCP) and the
//!   adapter a stream decoder plugs into.
//! * [`run`]: the I/O shell: one source, one producer connection, the
//!   producer's commands (flush, clear, start, stop) passed on to the
//!   source, a summary at log intervals and on exit.
//!
//! Sources decode a transport: shared RAM (`abi::region`) or a framed
//! byte stream (`abi::frame`). The engine does not depend on either: it
//! takes [`FirmwareEvent`]s.

pub mod attach;
pub mod clock;
pub mod command;
pub mod dump;
pub mod engine;
pub mod frames;
pub mod import;
pub mod input;
pub mod output;
pub mod patches;
pub mod region;
pub mod run;
#[cfg(test)]
mod testing;

use std::time::Duration;

pub use shmtrace_producer::ForwardPatch;

use crate::CliError;

/// What a firmware says when it (re)starts or a transport (re)attaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Differs between boots: a new boot starts new sequences.
    pub boot_id: u32,
    /// The data source its packets belong to (registered with the service).
    pub data_source: String,
    /// The producer name it asks for (the bridge's producer is named after
    /// the first hello it sees).
    pub producer: String,
    /// The firmware's absolute clock: a sequence-scoped id (64..=127) the
    /// bridge relates to BOOTTIME, or a builtin clock (< 64) it leaves
    /// alone (the firmware stamps host time already).
    pub clock_id: u32,
}

/// Patches for one chunk of one firmware writer (one `ChunkToPatch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchGroup {
    /// The firmware's writer id.
    pub writer_id: u16,
    /// The firmware's chunk id.
    pub chunk_id: u32,
    /// More patches for the chunk follow later.
    pub has_more: bool,
    /// The patches (offsets from the start of the chunk's payload).
    pub patches: Vec<ForwardPatch>,
}

/// A sample of the firmware's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// The firmware's time, nanoseconds on its clock.
    pub firmware_ns: u64,
    /// The host nonce it answers (two-way), if any.
    pub nonce: Option<u32>,
    /// How long the sample took on the wire (one-way correction; 0 if
    /// unknown or negligible).
    pub transfer_ns: u64,
}

/// One thing a firmware source delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirmwareEvent {
    /// The firmware (re)started or the transport (re)attached.
    Hello(Hello),
    /// A finished chunk: 8-byte header + payload (bytes after the last
    /// fragment may be missing).
    Chunk(Vec<u8>),
    /// Patches for a chunk delivered before.
    Patches(PatchGroup),
    /// A sample of the firmware's clock.
    Clock(ClockSample),
    /// The firmware's own counters (cumulative since its boot): packets it
    /// dropped, ring overflows, ...
    Stats(Vec<(String, u64)>),
    /// The firmware reset (or the region was re-initialized): what follows
    /// belongs to a new boot, announced by its hello.
    Reset,
}

/// Something the bridge asks of the firmware, on sources that can (a
/// region's control words, a stream's reverse channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Start (`true`) or stop tracing.
    Enable(bool),
    /// Reset every writer's incremental state (interned data, track
    /// descriptors, the incremental clock) before its next packet.
    Clear,
    /// Commit every open chunk now.
    Flush,
    /// Answer with the firmware's time and this nonce.
    Sync(u32),
}

/// Why a source stopped delivering.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The source ended (end of file, connection closed).
    #[error("the input ended")]
    Ended,
    /// The source cannot go on.
    #[error("{0}")]
    Failed(String),
    /// Another reader holds the input (a region has one reader): it cannot
    /// be opened.
    #[error("{0}")]
    Busy(String),
}

impl SourceError {
    /// The command's error for this failure of the input `input` (a
    /// source's [`describe`](FirmwareSource::describe)): one another reader
    /// holds could not be opened (exit status 4); any other failed while
    /// read (5).
    pub fn into_cli(self, input: String) -> CliError {
        match self {
            SourceError::Busy(why) => CliError::Io {
                action: "attach",
                path: input.into(),
                source: std::io::Error::new(std::io::ErrorKind::ResourceBusy, why),
            },
            e => CliError::Bridge(format!("{input}: {e}")),
        }
    }
}

/// Where firmware events come from: a decoder over a transport.
pub trait FirmwareSource: Send {
    /// The next event, waiting at most `timeout`; `Ok(None)` if none came.
    fn poll(&mut self, timeout: Duration) -> Result<Option<FirmwareEvent>, SourceError>;
    /// What the transport lost so far (cumulative counters by name: frames
    /// with a bad CRC, gaps in sequence numbers, bytes skipped, ...).
    fn transport_loss(&self) -> Vec<(&'static str, u64)>;
    /// What the transport did that is no loss (frames decoded, chunks
    /// found by a scan, ...), cumulative, by name.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// A [`Request::Flush`] was passed on and the firmware has not shown
    /// it done yet (a region's `flush_ack`, a stream's barrier): the bridge
    /// keeps reading before it acknowledges the flush. Bounded by the
    /// source.
    fn flush_pending(&mut self) -> bool {
        false
    }
    /// Asks the firmware for something; `false` if this source cannot.
    fn request(&mut self, _request: Request) -> bool {
        false
    }
    /// Whether [`Request::Sync`] reaches the firmware (two-way clock).
    fn can_sync(&self) -> bool {
        false
    }
    /// The firmware has not shown the end of the last flush yet, also one
    /// the bridge gave up waiting for (a stream's barrier not answered yet,
    /// for at most [`FLUSH_ANSWER_WAIT`](input::FLUSH_ANSWER_WAIT)): it is
    /// still busy with it, so a clock request sent now would wait behind it
    /// and its round trip would measure the flush, and what it commits
    /// (written before the flush was asked for) is still to come.
    fn flush_unanswered(&self) -> bool {
        false
    }
    /// Whether the input ended as a two-way link ends when the firmware
    /// is lost (a TCP peer gone, a serial device hung up), not as a
    /// recording ends (a file, a FIFO): the engine's "A link lost
    /// mid-session is marked".
    fn link_lost(&self) -> bool {
        false
    }
    /// What it reads, for messages (`/dev/ttyUSB0`, `tcp:host:port`, ...).
    fn describe(&self) -> String;
}
