//! # shmtrace-producer
//!
//! What Perfetto's client library is to C++ programs, for Rust: track
//! events (slices, instants, counters, flows, debug annotations) and custom
//! data sources, written into the shared memory buffer (SMB) of a Perfetto
//! tracing service — the real `traced` or shmtrace's own `shmtrace serve`,
//! unchanged.
//!
//! ```no_run
//! use shmtrace_producer::{track_event, trace_event, trace_counter, Category, ProducerConfig};
//!
//! static RENDERING: Category = Category::new("rendering").with_description("Graphics");
//!
//! fn main() {
//!     // Connects in the background to $PERFETTO_PRODUCER_SOCK_NAME (or
//!     // Perfetto's default socket); tracing stays off until a session
//!     // enables something, and the program never waits for the service.
//!     shmtrace_producer::init(ProducerConfig::default()).unwrap();
//!     track_event::register_categories(&[&RENDERING]);
//!
//!     let _frame = trace_event!(RENDERING, "DrawFrame", "frame" => 1);
//!     trace_counter!(RENDERING, "fps", 59.9);
//! }
//! ```
//!
//! # What it does
//!
//! * **Connection** ([`init`], [`Producer`]): binds `ProducerPort`,
//!   `InitializeConnection` with the SMB size/page hints and, as the C++
//!   SDK does, a request for SMB scraping (so the service copies the
//!   finished packets of chunks still being written into the trace when
//!   the program crashes or is killed, and when a flush or session ends;
//!   [`ProducerConfig::smb_scraping`] turns it off), registers every
//!   data source (`track_event` with a `TrackEventDescriptor` listing the
//!   categories), reads the `GetAsyncCommand` stream. Without a service the
//!   program runs with tracing off and the producer retries (250 ms backoff
//!   doubling to 5 s); when the service goes away every session stops and
//!   it reconnects. The producer is named after the process's `argv[0]`,
//!   as the C++ SDK names it. The SMB fd from `SetupTracing` is mapped
//!   (only a memfd sealed against shrinking, so the service cannot pull
//!   the memory from under the program); under shmem emulation a private
//!   1 MiB SMB is used and chunks travel in `CommitData`.
//! * **A broken or hostile service** costs only its connection, never the
//!   program: malformed or unexpected messages, an SMB that could shrink, a
//!   handshake that never completes or a service that stops reading end
//!   the connection, which is logged, counted
//!   ([`Producer::connection_errors`]), kept ([`Producer::last_error`]) and
//!   retried with the backoff.
//! * **Sessions**: up to [`MAX_INSTANCES`] concurrent instances per data
//!   source, each with its own writers, target buffer and (for track
//!   events) category filter. `StartDataSource` is acknowledged with
//!   `NotifyDataSourceStarted`; `StopDataSource` flushes and retires the
//!   instance's writers, then `NotifyDataSourceStopped`; `Flush` flushes the
//!   listed instances and acknowledges with `CommitData.flush_request_id`
//!   (a writer busy in an event at that moment, e.g. stalling for a chunk,
//!   flushes when the event ends: after at most one 100 ms wait for all
//!   such writers the command is acknowledged, so their last chunk may
//!   follow the ack; likewise for `NotifyDataSourceStopped`, which
//!   upstream sends without flushing thread-local writers at all);
//!   `ClearIncrementalState` makes every writer re-emit its interned data
//!   and descriptors.
//! * **Writers**: one per (thread, instance), thread-local, created on the
//!   thread's first event. The fast path takes no lock besides the writer's
//!   own uncontended try-lock, allocates nothing, and does one atomic
//!   store to publish each packet. Finished chunks are batched into
//!   `CommitData` (chunks and patches, in order) by a sender thread.
//! * **Running out of chunks**: by default a packet is dropped and the loss
//!   is marked on the next one (`previous_packet_dropped`), and the sequence
//!   restarts its incremental state; with
//!   [`BufferExhaustedPolicy::StallThenDrop`] (per data source, or asked by
//!   the session's config) the writer waits, bounded. Idle threads never pin
//!   chunks: writers untouched since the last sweep are flushed by the
//!   sender every 500 ms and whenever a writer finds the SMB full. Nothing
//!   aborts, nothing waits forever; every loss is counted ([`stats`]),
//!   including events emitted re-entrantly or after the thread's writers
//!   are gone (a thread-local's destructor at thread exit).
//! * **Track events** ([`track_event`]): categories ([`Category`],
//!   [`DynamicCategory`]) enabled per session with the documented matching
//!   order ([`filter`]); events through the macros or the [`Event`]
//!   builder; tracks ([`Track`], [`ProcessTrack`], [`ThreadTrack`],
//!   [`CounterTrack`]) described before first use on each sequence;
//!   [`Flow`]s; [`DebugValue`] annotations including nested dictionaries
//!   and arrays; interning of names, categories and annotation names per
//!   sequence. Timestamps are boot-time nanoseconds, written as deltas on
//!   the sequence's incremental clock 64 like the C++ SDK does (1-3 bytes
//!   each); every loss resets the sequence and re-defines the clock, so
//!   losing a packet never shifts later ones. Where the CPU has an
//!   invariant TSC the kernel keeps time with, the time is read from the
//!   TSC and converted to boot time (~11 ns instead of ~30 for a vDSO
//!   `clock_gettime`; error bound in the `clock` module docs).
//! * **`tracing` and `log`** (features `tracing` and `log`): a
//!   `tracing_subscriber` layer, `TracingLayer`, and a `log` logger,
//!   `logger::TraceLogger`, writing spans, events and records as track
//!   events, each target a category (see the `tracing_layer` and `logger`
//!   module docs).
//! * **Custom data sources** ([`DataSource`]): a name, a
//!   [`DataSourceHandler`] for setup/start/stop/flush, arbitrary
//!   TracePackets from any thread ([`TraceContext`]).
//! * **Forwarded chunks** ([`ChunkForwarder`]): a data source, named at
//!   run time, whose packets were written elsewhere (a firmware behind a
//!   bridge, a relay, an importer) as finished SMB chunks: each is copied
//!   into this producer's shared memory under a writer id of its own and
//!   committed like the program's chunks; patches follow, clock snapshots
//!   can be injected, losses are marked (see the `forward` module docs).
//! * **Triggers** ([`activate_triggers`]): start, stop or clone the
//!   sessions waiting for them (`ActivateTriggers`, no reply); activated
//!   while no connection is up, they wait for one until their time to live
//!   runs out (at most [`MAX_PENDING_TRIGGERS`]; expired and dropped ones
//!   counted in [`stats`]).
//!
//! * **Startup** ([`Producer::wait_for_session`],
//!   [`ProducerConfig::startup_tracing`]): a program can wait, bounded,
//!   until the service has its data sources and any running session has
//!   started them (a typed answer: started, no session, unconfirmed, not
//!   connected); and with startup tracing, track events from the first
//!   line of `main` on wait in a bounded local buffer and are handed to
//!   the first session that starts track events, or dropped and counted
//!   after a timeout, as Perfetto's SDK does (see [`StartupTracing`]).
//!
//! Not implemented: producer-provided SMBs, direct SMB patching, the v2
//! ring buffer, thread time sampling, and `TrackEventConfig`'s fields
//! beyond the four category and tag lists.
//!
//! # Layout
//!
//! The I/O shell (`connection`) drives a sans-IO core: `runtime` (the
//! service's commands), `data_source` (types, instances, thread-local
//! writers), `writer` (the writer cells and their locking), `arbiter` (the
//! SMB: chunks, commits, writer ids), `forward` (chunks written elsewhere,
//! copied in), `outbox` (ordered messages to the
//! service), `event`/`fast`/`intern` (track event encoding), `shm` (the
//! mapping). The protobuf encoder, the trace writer (fragmentation, patches,
//! drop mode) and the SMB state machine are `shmtrace-abi`'s; the IPC client
//! and messages are `shmtrace-ipc`'s.

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
mod sys;
pub mod track_event;

#[cfg(test)]
mod test_schema;
#[cfg(test)]
mod tests;

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
pub use error::{ConnectError, RegisterError, SmbSetupError};
#[cfg(feature = "log")]
pub use integrations::logger;
#[cfg(feature = "tracing")]
pub use integrations::tracing_layer;
#[cfg(feature = "tracing")]
pub use integrations::tracing_layer::TracingLayer;
pub use runtime::{stats, MAX_PENDING_TRIGGERS};
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
