//! # shmtrace-producer
//!
//! What Perfetto's client library is to C++ programs, for Rust: track
//! events (slices, instants, counters, flows, debug annotations) and custom
//! data sources, written into the shared memory buffer of a Perfetto
//! tracing service (ours or the real one).

#![deny(missing_docs)]

mod annotation;
mod arbiter;
mod category;
mod connection;
mod data_source;
mod error;
mod event;
mod fast;
pub mod filter;
mod intern;
mod outbox;
mod runtime;
mod shm;
mod sys;
mod track;
pub mod track_event;
mod writer;

#[cfg(test)]
mod test_schema;
#[cfg(test)]
mod tests;

pub use annotation::{Arg, ArgName, DebugValue};
pub use arbiter::{BufferExhaustedPolicy, ProducerStats, WriterArbiter};
pub use category::{Category, DynamicCategory, MAX_INSTANCES};
pub use connection::{flush_all, init, Producer, ProducerConfig};
pub use data_source::{
    DataSource, DataSourceConfig, DataSourceHandler, DataSourceOptions, InstanceArgs, NoopHandler,
    SetupArgs, TraceContext, CONFIG_STALL_LIMIT,
};
pub use error::{ConnectError, RegisterError, SmbSetupError};
pub use event::{CounterValue, EventContext, EventName, EventType};
pub use runtime::{stats, TRACK_EVENT_DATA_SOURCE};
pub use track::{
    current_pid, process_uuid, set_process_name, ChildOrdering, Clock, CounterTrack, CounterUnit,
    Flow, ProcessTrack, ThreadTrack, Timestamp, Track,
};
pub use track_event::{Event, IntoCategory, SliceGuard, TrackEventSessionObserver};
pub use writer::ProducerSink;
