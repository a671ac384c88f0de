//! # shmtrace-producer
//!
//! What Perfetto's client library is to C++ programs, for Rust: track
//! events and custom data sources, written into the shared memory buffer
//! (SMB) of a Perfetto tracing service. The user guide (what it does, how
//! it behaves when the service is gone or hostile, sessions, writers,
//! losses, startup tracing) is the crate's `README.md`.
//!
//! ```no_run
//! use shmtrace_producer::{track_event, trace_event, trace_counter, Category, ProducerConfig};
//!
//! static RENDERING: Category = Category::new("rendering").with_description("Graphics");
//!
//! shmtrace_producer::init(ProducerConfig::default()).unwrap();
//! track_event::register_categories(&[&RENDERING]);
//! let _frame = trace_event!(RENDERING, "DrawFrame", "frame" => 1);
//! trace_counter!(RENDERING, "fps", 59.9);
//! ```
//!
//! # Layout
//!
//! Bottom to top: a module imports from its own folder and the lines
//! above it, except that `track_event/`'s `category`, `filter` and
//! `track` (which import only leaves) serve every layer (events name their
//! category and track), and that `runtime` installs the `tracing` layer's
//! hook, which calls back into it. No import cycle spans more than two
//! modules.
//!
//! * `stats`, `error`, `clock`, `sys`: leaves (counters, errors, time).
//! * `encoding/`: track event encoding: `event` (`SequenceState`, the
//!   general path; `event/fast`, the hand-tuned encoders), `intern`,
//!   `annotation`.
//! * `smb/`: the shared memory's writers: `arbiter` (chunks, commits,
//!   writer ids), `writer` (writer cells, deferred work), `cell_lock`
//!   (their membarrier/Dekker lock).
//! * `connection/`: `outbox` (ordered messages to the service and their
//!   payloads), `proto` (pure conversions to and from the protocol's
//!   messages); `connection` itself is the I/O shell (sockets, threads).
//! * `data_source/`: the generic layer: types, instances, thread-local
//!   writers, the type `registry` (the narrow interface lower layers use
//!   to reach the process-wide state, like Perfetto's `tracing_muxer.h`),
//!   `forward` (chunks written elsewhere, copied in).
//! * `track_event/`: track events as a data source built on that layer:
//!   `category`, `filter`, `track`, `data_source` (the type, its handler,
//!   descriptor and observers), `startup` (startup tracing), and the API
//!   in `track_event` itself.
//! * `runtime`: the process-wide state and the service's commands, with no
//!   I/O (the connection drives it, tests call it directly).
//! * `integrations/`: the `tracing` layer and the `log` logger.
//!
//! The protobuf encoder, the trace writer (fragmentation, patches, drop
//! mode) and the SMB state machine are `shmtrace-abi`'s; the IPC client,
//! messages and the shared memory itself (`SharedMemory`: the mapping of
//! the service's memfd, or private memory) are `shmtrace-ipc`'s.

#![deny(missing_docs)]

mod clock;
mod connection;
mod data_source;
mod encoding;
mod error;
mod integrations;
mod runtime;
mod smb;
mod stats;
mod sync;
mod sys;
pub mod track_event;

#[cfg(test)]
mod test_schema;
#[cfg(test)]
mod tests;

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub use connection::{activate_triggers, flush_all, init, Producer, ProducerConfig, SessionWait};
pub use data_source::forward::{
    ChunkForwarder, ForwardError, ForwardPatch, ForwardStats, Forwarded, ForwardedSequence,
    InjectedTooLong, MAX_INJECTED_PACKET,
};
pub use data_source::{
    DataSource, DataSourceConfig, DataSourceHandler, DataSourceOptions, InstanceArgs, NoopHandler,
    SetupArgs, TraceContext, CONFIG_STALL_LIMIT,
};
pub use encoding::annotation::{Arg, ArgName, DebugValue};
pub use encoding::event::{CounterValue, EventContext, EventName, EventType};
pub use error::{ConnectError, RegisterError};
#[cfg(feature = "log")]
pub use integrations::logger;
#[cfg(feature = "tracing")]
pub use integrations::tracing_layer;
#[cfg(feature = "tracing")]
pub use integrations::tracing_layer::TracingLayer;
pub use runtime::{stats, MAX_PENDING_TRIGGERS};
/// Why an SMB could not be used ([`ConnectError::Smb`]).
pub use shmtrace_ipc::shm::ShmError;
pub use smb::arbiter::{BufferExhaustedPolicy, WriterArbiter};
pub use smb::writer::ProducerSink;
pub use stats::ProducerStats;
pub use track_event::category::{Category, MAX_INSTANCES};
pub use track_event::data_source::TRACK_EVENT_DATA_SOURCE;
pub use track_event::filter;
pub use track_event::startup::StartupTracing;
pub use track_event::track::{
    current_pid, process_uuid, set_process_name, ChildOrdering, Clock, CounterTrack, CounterUnit,
    Flow, ProcessTrack, ThreadTrack, Timestamp, Track,
};
pub use track_event::{
    DynamicCategory, Event, IntoCategory, SliceGuard, TrackEventSessionObserver,
};
