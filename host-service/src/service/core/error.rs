//! Why the core refuses a request or closes a connection.
//!
//! * [`ConfigError`]: a trace config `EnableTracing` (or
//!   `ChangeTraceConfig`) refuses. Its message is what the consumer reads in
//!   `EnableTracingResponse.error`, so each variant's text is written for a
//!   user who sent the config.
//! * [`CloneError`]: why a `CloneSession` failed, the text of
//!   `CloneSessionResponse.error` (upstream's wording where upstream has the
//!   case).
//! * [`CommitError`]: a `CommitData` fault that costs the producer its
//!   connection (where upstream would abort on a `CHECK`).
//! * [`PeerFault`]: why [`Output::Disconnect`](super::Output::Disconnect)
//!   closes a connection.

use shmtrace_abi::smb::CopyError;
use shmtrace_abi::sync::ReleaseError;
use thiserror::Error;

use super::session::{
    MAX_BUFFERS_PER_SESSION, MAX_DURATION_MS, MAX_SESSIONS, MAX_SESSIONS_PER_UID,
};
use super::ProducerId;

/// Why a trace config is refused.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The `TraceConfig` is not a valid message.
    #[error("the trace config does not decode: {0}")]
    Decode(#[source] prost::DecodeError),
    /// The new config of a `ChangeTraceConfig` is not a valid message.
    #[error("the new trace config does not decode: {0}")]
    DecodeNew(#[source] prost::DecodeError),
    /// A data source's `DataSourceConfig` is not a valid message.
    #[error("a data source config does not decode: {0}")]
    DecodeDataSource(#[source] prost::DecodeError),
    /// The consumer already has a session.
    #[error("a tracing session is already active for this consumer")]
    SessionActive,
    /// `duration_ms` is over `MAX_DURATION_MS`.
    #[error("duration_ms exceeds the maximum of {MAX_DURATION_MS} ms")]
    DurationTooLong,
    /// The `trace_filter` does not load.
    #[error(transparent)]
    TraceFilter(#[from] super::filter::FilterError),
    /// zstd compression is asked for (`compression { zstd {} }`).
    #[error(
        "zstd trace compression is not supported by the shmtrace service; it compresses with \
         deflate: `compression {{ deflate {{}} }}` or `compression_type: COMPRESSION_TYPE_DEFLATE`"
    )]
    ZstdCompression,
    /// A semaphore of `session_semaphores` is held by more running
    /// sessions than it or they allow (upstream's wording).
    #[error(
        "Semaphore \"{name}\" exceeds maximum allowed other session count ({holders} > \
         min({mine}, {smallest}))"
    )]
    SemaphoreTaken {
        /// The semaphore.
        name: String,
        /// Running sessions that hold it.
        holders: u64,
        /// The new config's `max_other_session_count`.
        mine: u64,
        /// The smallest `max_other_session_count` of the holders.
        smallest: u64,
    },
    /// More than `MAX_BUFFERS_PER_SESSION` buffers.
    #[error("too many buffers: {0} (the maximum is {MAX_BUFFERS_PER_SESSION})")]
    TooManyBuffers(usize),
    /// A buffer of size 0, or of 4 GiB or more.
    #[error(
        "invalid buffer sizes: buffer {index} has size_kb {size_kb} (a buffer holds less \
         than 4 GiB: size_kb at most {})",
        u32::MAX / 1024
    )]
    BufferSize {
        /// Which buffer.
        index: usize,
        /// Its `size_kb`.
        size_kb: u32,
    },
    /// Two buffers have the same name.
    #[error("duplicate buffer name {0:?}")]
    DuplicateBufferName(String),
    /// All trace buffers together would exceed the service's limit.
    #[error(
        "the buffers take {asked} B in all and other sessions hold {held} B: over the \
         service's limit of {limit} B for all trace buffers (shmtrace serve \
         --max-buffer-memory)"
    )]
    BufferMemory {
        /// Bytes this config asks for.
        asked: u64,
        /// Bytes the other sessions hold.
        held: u64,
        /// The service's limit.
        limit: u64,
    },
    /// `target_buffer_name` names no buffer.
    #[error("data source {data_source:?}: no buffer named {buffer:?}")]
    NoBufferNamed {
        /// The data source.
        data_source: String,
        /// The name it gave.
        buffer: String,
    },
    /// `target_buffer` and `target_buffer_name` name different buffers.
    #[error("data source {0:?}: target_buffer and target_buffer_name disagree")]
    TargetBufferMismatch(String),
    /// `target_buffer` is out of range.
    #[error(
        "data source {data_source:?}: target_buffer {index} does not exist ({buffers} buffers)"
    )]
    NoSuchBuffer {
        /// The data source.
        data_source: String,
        /// Its target buffer.
        index: usize,
        /// How many buffers the config has.
        buffers: usize,
    },
    /// A `producer_name_regex_filter` is no regular expression.
    #[error("invalid producer_name_regex_filter {pattern:?}: {source}")]
    ProducerNameRegex {
        /// The pattern.
        pattern: String,
        /// Why.
        source: regex::Error,
    },
    /// `unique_session_name` is taken.
    #[error("a session named {0:?} already exists")]
    SessionNameTaken(String),
    /// `MAX_SESSIONS` sessions exist.
    #[error("too many concurrent tracing sessions ({MAX_SESSIONS})")]
    TooManySessions,
    /// The consumer's uid has `MAX_SESSIONS_PER_UID` sessions.
    #[error("too many concurrent tracing sessions for uid {0} ({MAX_SESSIONS_PER_UID})")]
    TooManySessionsForUid(u32),
    /// `write_into_file` with both or neither of a descriptor and
    /// `output_path`.
    #[error("write_into_file needs exactly one of a file descriptor and output_path")]
    WriteIntoFileTarget,
    /// The service has no buffer ids left.
    #[error("no buffer ids left")]
    NoBufferIds,
    /// `output_path` cannot be created.
    #[error("cannot create output_path {path:?}: {source}")]
    CreateOutput {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The descriptor passed for `write_into_file` cannot be written.
    #[error("cannot write the trace file descriptor: {0}")]
    OutputDescriptor(#[source] std::io::Error),
    /// `use_clone_snapshot_if_available` with a mode other than
    /// STOP_TRACING.
    #[error("trigger_mode must be STOP_TRACING when use_clone_snapshot_if_available=true")]
    CloneSnapshotIfAvailable,
    /// An unknown `trigger_mode`.
    #[error("invalid trigger_mode {0}")]
    TriggerMode(i32),
    /// `trigger_timeout_ms` is 0 or over `MAX_DURATION_MS`.
    #[error("traces with triggers need a trigger_timeout_ms in 1..={MAX_DURATION_MS} (got {0})")]
    TriggerTimeout(u32),
    /// `duration_ms` in a trace with triggers.
    #[error(
        "duration_ms must not be set in a trace with triggers (trigger_timeout_ms and \
         stop_delay_ms bound it)"
    )]
    DurationWithTriggers,
    /// `STOP_TRACING` or `CLONE_SNAPSHOT` triggers into a file.
    #[error(
        "Specifying trigger mode STOP_TRACING/CLONE_SNAPSHOT and write_into_file together is \
         unsupported"
    )]
    TriggersIntoFile(&'static str),
    /// Two triggers have the same name.
    #[error("duplicate trigger name {0:?}")]
    DuplicateTrigger(String),
    /// A trigger's `producer_name_regex` is no regular expression.
    #[error("trigger {trigger:?}: invalid producer_name_regex {pattern:?}: {source}")]
    TriggerRegex {
        /// The trigger.
        trigger: String,
        /// The pattern.
        pattern: String,
        /// Why.
        source: regex::Error,
    },
}

/// Why a `CloneSession` failed (upstream: the errors of
/// `TracingServiceImpl::FlushAndCloneSession` and `FinishCloneSession`,
/// src/tracing/service/tracing_service_impl.cc).
#[derive(Debug, Error)]
pub enum CloneError {
    /// No session with that id or unique name (cloned sessions have no
    /// name to be found by).
    #[error("Tracing session not found")]
    NotFound,
    /// Session id `u64::MAX` and no started session has a
    /// `bugreport_score` above 0.
    #[error("No tracing sessions eligible for bugreport found")]
    NoBugreportSession,
    /// The session belongs to another uid and the caller is not root.
    #[error("Not allowed to clone a session from another UID")]
    NotAllowed,
    /// A `write_into_file` session and no descriptor to copy its file to.
    #[error(
        "Failed to clone 'write_into_file' session: a file descriptor is required to copy \
         existing file"
    )]
    NoOutputDescriptor,
    /// The descriptor sent is the session's own `write_into_file` file:
    /// the snapshot would overwrite the trace being written (upstream does
    /// not check, and appends the snapshot to the live file).
    #[error(
        "the output file is the session's own write_into_file output: a snapshot written \
         into it would overwrite the trace being written; clone into another file"
    )]
    OutputIsSessionFile,
    /// The session's file could not be copied to the descriptor sent.
    #[error("Failed to clone 'write_into_file' session: failed to copy existing file: {0}")]
    CopyFile(#[source] std::io::Error),
    /// The copies would take the service over its buffer memory limit.
    #[error(
        "cloning needs {asked} B of trace buffers and {held} B are held: over the \
         service's limit of {limit} B for all trace buffers (shmtrace serve \
         --max-buffer-memory)"
    )]
    BufferMemory {
        /// Bytes the copies (or the fresh buffers that replace moved ones)
        /// take.
        asked: u64,
        /// Bytes the sessions and pending clones hold.
        held: u64,
        /// The service's limit.
        limit: u64,
    },
    /// `MAX_SESSIONS` sessions (counting clones in progress) exist.
    #[error("too many concurrent tracing sessions ({MAX_SESSIONS}), counting clones in progress")]
    TooManySessions,
    /// The caller's uid has `MAX_SESSIONS_PER_UID` sessions.
    #[error(
        "too many concurrent tracing sessions for uid {0} ({MAX_SESSIONS_PER_UID}), counting \
         clones in progress"
    )]
    TooManySessionsForUid(u32),
    /// The calling consumer has a session already (it can have one).
    #[error("The consumer is already attached to another tracing session")]
    AlreadyAttached,
    /// The session was freed before the clone was done.
    #[error("Original session ended")]
    SourceEnded,
    /// The service has no buffer ids left.
    #[error("Buffer id allocation failed")]
    NoBufferIds,
}

/// A `CommitData` fault: the producer loses its connection.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The producer changed a chunk's page while the service read it
    /// (upstream `PERFETTO_CHECK`-fails here, in `SharedMemoryABI::ReleaseChunk`,
    /// src/tracing/core/shared_memory_abi.cc).
    #[error("producer {producer} changed chunk {page}/{chunk} while it was being read: {source}")]
    ChunkChanged {
        /// The producer.
        producer: ProducerId,
        /// The page.
        page: usize,
        /// The chunk in the page.
        chunk: usize,
        /// What the release found.
        source: ReleaseError,
    },
    /// Copying the chunk out failed for a reason other than its header.
    #[error("producer {producer}: chunk copy failed: {source}")]
    Copy {
        /// The producer.
        producer: ProducerId,
        /// Why.
        source: CopyError,
    },
}

/// Why the core closes a connection.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PeerFault {
    /// A `CommitData` the service cannot survive.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// The producer never opened its command stream (`GetAsyncCommand`)
    /// while commands for it piled up.
    #[error("producer {0} never opened its command stream")]
    CommandStreamNeverOpened(ProducerId),
    /// A relay sent a `SyncClock` with more clocks than any machine has.
    #[error(
        "relay sent {clocks} clocks in one SyncClock (at most {} are taken)",
        super::MAX_CLOCKS_PER_SYNC
    )]
    TooManyClocks {
        /// How many it sent.
        clocks: usize,
    },
}
