//! Tracing sessions: what a session is (this module), and
//!
//! * [`config`]: config validation, what `EnableTracing` accepts;
//! * [`lifecycle`]: enabling (buffers, data source instances, SMBs),
//!   starting, stopping, ending and freeing a session, and the timers that
//!   drive it;
//! * [`flush`]: the flush protocol and incremental state clearing.
//!
//! Upstream: `TracingServiceImpl::EnableTracing`, `StartTracing`,
//! `DisableTracing`, `Flush` and `FreeBuffers` in
//! src/tracing/service/tracing_service_impl.cc.
//!
//! # Lifecycle
//!
//! `Configured` (buffers allocated, instances set up) → `Started`
//! (`StartDataSource` sent) → `Stopping` (`StopDataSource` sent, waiting for
//! the acknowledgements of data sources that said `will_notify_on_stop`, at
//! most `data_source_stop_timeout_ms`) → `Disabled` (SMBs scraped, the
//! consumer's `EnableTracing` answered, buffers still readable) → freed
//! (`FreeBuffers` or consumer gone).
//!
//! Every wait has a timer: flushes end at their timeout with failure, stops
//! end at the stop timeout with the stragglers marked stopped. A producer
//! that never answers delays its session by at most those timeouts and
//! never blocks another session.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use regex::Regex;

use super::filter::SessionFilter;
use super::triggers::{ReceivedTrigger, SessionTriggers};
use super::{BufferId, ConnId, ProducerId, SessionId};
use crate::ipc::PendingReply;
use crate::protos::trace_config::{self};
use crate::protos::wire::{put_tag, put_varint, WireType};
use crate::protos::TraceConfig;
use crate::service::buffer::WriterId;
use crate::service::env::Nanos;
use crate::service::env::TraceFile;

pub mod config;
pub mod flush;
pub mod lifecycle;

/// `TraceConfig.duration_ms` (uint32).
const TRACE_CONFIG_DURATION_MS: u32 = 3;

/// Longest `duration_ms` (7 days).
pub const MAX_DURATION_MS: u32 = 7 * 24 * 3600 * 1000;
/// Most buffers one session may have.
pub const MAX_BUFFERS_PER_SESSION: usize = 128;
/// Most sessions at once.
pub const MAX_SESSIONS: usize = 15;
/// Most sessions one uid may have at once.
pub const MAX_SESSIONS_PER_UID: usize = 5;
/// Most flushes pending in one session.
pub const MAX_PENDING_FLUSHES: usize = 1000;
/// Flush events kept per kind between reads.
pub const MAX_EVENTS_PER_KIND: usize = 64;
/// Default flush and data source stop timeout.
pub const DEFAULT_TIMEOUT_MS: u32 = 5000;
/// Default period of clock snapshots, sync markers and stats.
pub const DEFAULT_SNAPSHOT_INTERVAL_MS: u32 = 10_000;
/// Default `file_write_period_ms`, and its minimum.
pub const DEFAULT_FILE_WRITE_PERIOD_MS: u32 = 5000;
/// Minimum `file_write_period_ms`.
pub const MIN_FILE_WRITE_PERIOD_MS: u32 = 100;

/// `FlushFlags` (include/perfetto/tracing/core/flush_flags.h): reason and
/// initiator nibbles.
pub mod flush_flags {
    /// Reason: periodic.
    pub const REASON_PERIODIC: u64 = 1;
    /// Reason: the trace is stopping.
    pub const REASON_TRACE_STOP: u64 = 2;
    /// Reason: a clone of the session.
    pub const REASON_TRACE_CLONE: u64 = 3;
    /// Initiator: the tracing service.
    pub const INITIATOR_TRACED: u64 = 1 << 4;
    /// Clone target: a bugreport.
    pub const CLONE_TARGET_BUGREPORT: u64 = 1 << 8;
}

/// State of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Set up, waiting for `StartTracing`.
    Configured,
    /// Tracing.
    Started,
    /// Stop sent, waiting for data sources to acknowledge.
    Stopping,
    /// Stopped; buffers readable until freed.
    Disabled,
    /// A snapshot of another session ([`super::clone`]): buffers readable
    /// until freed, nothing runs.
    ClonedReadOnly,
}

impl SessionState {
    /// Upstream's name (QueryServiceState).
    pub fn name(self) -> &'static str {
        match self {
            SessionState::Configured => "CONFIGURED",
            SessionState::Started => "STARTED",
            SessionState::Stopping => "STOP_WAIT",
            SessionState::Disabled => "DISABLED",
            SessionState::ClonedReadOnly => "CLONED_READ_ONLY",
        }
    }
}

/// State of a data source instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    /// `SetupDataSource` sent.
    Configured,
    /// `StartDataSource` sent, waiting for `NotifyDataSourceStarted`.
    Starting,
    /// Running.
    Started,
    /// `StopDataSource` sent, waiting for `NotifyDataSourceStopped`.
    Stopping,
    /// Stopped.
    Stopped,
}

/// One data source instance: a registered data source of one producer,
/// set up for one entry of a session's config.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Instance id (global).
    pub id: u64,
    /// Producer running it.
    pub producer: ProducerId,
    /// Data source name.
    pub name: String,
    /// Its state.
    pub state: InstanceState,
    /// The descriptor's flags.
    pub notify_on_start: bool,
    /// The descriptor's flags.
    pub notify_on_stop: bool,
    /// The descriptor's flags.
    pub handles_incremental_state_clear: bool,
    /// The descriptor's flags.
    pub no_flush: bool,
    /// The buffer it writes into.
    pub buffer: BufferId,
    /// The config sent to the producer (service fields rewritten).
    pub config: Bytes,
}

/// Most data sources a `slow_starting_data_sources` or
/// `last_flush_slow_data_sources` event lists (upstream:
/// `kMaxLifecycleEventsListedDataSources`).
pub const MAX_LISTED_DATA_SOURCES: usize = 32;

/// How long after the start a session's data sources may take to start
/// before a `slow_starting_data_sources` event names the late ones
/// (upstream: `kAllDataSourceStartedTimeout`).
pub const SLOW_START_TIMEOUT_MS: u64 = 20_000;

/// A service event naming data sources, `(producer, data source)`:
/// `slow_starting_data_sources` or `last_flush_slow_data_sources`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowDataSources {
    /// When it was noted.
    pub at: Nanos,
    /// The data sources, at most [`MAX_LISTED_DATA_SOURCES`].
    pub sources: Vec<(String, String)>,
}

/// A flush waiting for producers' acknowledgements.
#[derive(Debug)]
pub struct PendingFlush {
    /// Producers that have not acknowledged yet.
    pub pending: BTreeSet<ProducerId>,
    /// Its `FlushFlags` ([`flush_flags`]).
    pub flags: u64,
    /// What to do when it is over.
    pub then: FlushThen,
}

/// What a flush does when it is over.
#[derive(Debug)]
pub enum FlushThen {
    /// Nothing more (the service's periodic flushes).
    Nothing,
    /// Answer a consumer's `Flush`.
    Reply(ConnId, PendingReply),
    /// Stop the session (duration end, STOP_TRACING trigger).
    Disable,
    /// Copy buffer group `group` of pending clone `clone`
    /// ([`super::clone`]).
    Clone {
        /// The pending clone.
        clone: u64,
        /// The buffer group.
        group: usize,
    },
}

/// Lifecycle events recorded as `service_event` packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// `tracing_started` (field 2).
    TracingStarted,
    /// `all_data_sources_started` (field 1).
    AllDataSourcesStarted,
    /// `flush_started` (field 9).
    FlushStarted,
    /// `all_data_sources_flushed` (field 3).
    AllDataSourcesFlushed,
    /// `read_tracing_buffers_completed` (field 4).
    ReadTracingBuffersCompleted,
    /// `tracing_disabled` (field 5).
    TracingDisabled,
    /// `clone_started` (field 10): in a cloned session, when the clone
    /// began.
    CloneStarted,
    /// `buffer_cloned` (field 11): in a cloned session, when buffer `n`
    /// (index in the session) was copied.
    BufferCloned(u32),
}

/// Who a producer was, for packets read after it left.
#[derive(Debug, Clone)]
pub struct ProducerIdentity {
    /// Its uid.
    pub uid: u32,
    /// Its pid (0 if unknown).
    pub pid: i32,
    /// Its machine id (0: this machine).
    pub machine_id: u32,
}

/// Where a `write_into_file` session writes.
#[derive(Debug)]
pub struct FileSink {
    /// The file.
    pub file: Box<dyn TraceFile>,
    /// Bytes written so far.
    pub written: u64,
    /// `max_file_size_bytes` (0: unlimited).
    pub max_size: u64,
    /// Writing stopped (size limit or error).
    pub closed: bool,
}

/// A tracing session.
#[derive(Debug)]
pub struct Session {
    /// Id.
    pub id: SessionId,
    /// The consumer connection attached to it (`None` when detached).
    pub consumer: Option<ConnId>,
    /// The consumer's uid.
    pub consumer_uid: u32,
    /// The detach key, while detached.
    pub detach_key: Option<String>,
    /// The config, decoded.
    pub config: TraceConfig,
    /// The config as the consumer sent it (emitted as `trace_config`).
    pub raw_config: Bytes,
    /// State.
    pub state: SessionState,
    /// Global ids of its buffers, in config order.
    pub buffers: Vec<BufferId>,
    /// Data source instances.
    pub instances: Vec<Instance>,
    /// The consumer's `EnableTracing`, answered when the session stops.
    pub enable_reply: Option<PendingReply>,
    /// Why the session ended abnormally (sent with the `EnableTracing`
    /// reply).
    pub error: Option<String>,
    /// Flushes in flight.
    pub flushes: BTreeMap<u64, PendingFlush>,
    /// Incremented at each stop, so stale stop timers are ignored.
    pub stop_epoch: u64,
    /// Packet sequence ids by `(producer, writer)`; 1 is the service's.
    pub sequence_ids: HashMap<(ProducerId, WriterId), u32>,
    /// The sequence of the last producer packet read: `(producer,
    /// writer)`, who wrote it, its sequence id.
    pub last_sequence: Option<((ProducerId, WriterId), ProducerIdentity, u32)>,
    /// Identities of the producers that had instances.
    pub identities: HashMap<ProducerId, ProducerIdentity>,
    /// Lifecycle events, with whether they were emitted.
    pub events: Vec<(Nanos, Lifecycle, bool)>,
    /// The clock snapshot taken at start, until emitted.
    pub initial_snapshot: Option<Vec<(u32, u64)>>,
    /// Snapshots taken since the last read (at most 16).
    pub snapshots: Vec<Vec<(u32, u64)>>,
    /// The once-per-trace packets were emitted.
    pub preamble_done: bool,
    /// A sync marker is due.
    pub sync_due: bool,
    /// A `trace_stats` packet is due.
    pub stats_due: bool,
    /// Trace UUID (msb, lsb).
    pub uuid: (i64, i64),
    /// Output of `write_into_file`.
    pub file: Option<FileSink>,
    /// Producer packets rejected by the validator.
    pub invalid_packets: u64,
    /// Flush counters.
    pub flushes_requested: u64,
    /// Flush counters.
    pub flushes_succeeded: u64,
    /// Flush counters.
    pub flushes_failed: u64,
    /// `FinalFlushOutcome` of the flush before the stop.
    pub final_flush_outcome: Option<i32>,
    /// `all_data_sources_started` was reported.
    pub all_started_reported: bool,
    /// Wall-clock start time (ns), for QueryServiceState.
    pub start_realtime_ns: Option<i64>,
    /// Compiled producer name regexes, per config data source.
    pub regexes: Vec<Vec<Regex>>,
    /// The `trace_filter` reads go through, and what it did.
    pub filter: Option<SessionFilter>,
    /// Trigger setup and the triggers received.
    pub triggers: SessionTriggers,
    /// Relayed machines whose `system_info` was written.
    pub machines_described: BTreeSet<u32>,
    /// Relayed machines whose `remote_clock_sync` was written.
    pub machines_synced: BTreeSet<u32>,
    /// Clones of this session waiting for their flushes.
    pub pending_clones: BTreeMap<u64, super::clone::PendingClone>,
    /// In a cloned session: the CLONE_SNAPSHOT trigger that asked for it,
    /// emitted once as `clone_snapshot_trigger`.
    pub clone_trigger: Option<ReceivedTrigger>,
    /// The data sources not started [`SLOW_START_TIMEOUT_MS`] after the
    /// start, until a read emits them.
    pub slow_start: Option<SlowDataSources>,
    /// The data sources a stop's or a clone's flush timed out waiting for
    /// (the last flush's only: each flush clears it), until a read emits
    /// them.
    pub last_flush_slow: Vec<SlowDataSources>,
}

impl Session {
    /// Sets the duration the service applies (a trigger mode replaced the
    /// configured one). The emitted `trace_config` shows it too, as
    /// upstream's re-serialized config does: the field is appended to the
    /// consumer's bytes (protobuf's last value wins).
    pub fn set_duration_ms(&mut self, ms: u32) {
        self.config.duration_ms = Some(ms);
        let mut raw = self.raw_config.to_vec();
        put_tag(&mut raw, TRACE_CONFIG_DURATION_MS, WireType::Varint);
        put_varint(&mut raw, u64::from(ms));
        self.raw_config = Bytes::from(raw);
    }

    /// Records a lifecycle event.
    /// Records a lifecycle event. Emitted events are forgotten; of those
    /// not yet emitted, at most [`MAX_EVENTS_PER_KIND`] flush events (and one
    /// of every other kind) are kept, newest first, like upstream.
    pub fn event(&mut self, now: Nanos, e: Lifecycle) {
        self.events.retain(|&(_, _, emitted)| !emitted);
        let limit = match e {
            Lifecycle::FlushStarted | Lifecycle::AllDataSourcesFlushed => MAX_EVENTS_PER_KIND,
            _ => 1,
        };
        let same: Vec<usize> = self
            .events
            .iter()
            .enumerate()
            .filter(|(_, x)| x.1 == e)
            .map(|(i, _)| i)
            .collect();
        if same.len() >= limit {
            self.events.remove(same[0]);
        }
        self.events.push((now, e, false));
    }

    /// Keeps a clock snapshot for the next read: if none is pending, or if
    /// some clock drifted at least 10 ms against BOOTTIME since the newest
    /// (at most 16 kept). The TSC counts ticks, not ns, so on x86-64 it
    /// "drifts" within a few ms at any rate away from 1 GHz and nearly every
    /// snapshot is kept — as upstream, which compares the same way; the
    /// frequent TSC/BOOTTIME pairs are what a trace processor needs to
    /// convert TSC timestamps.
    pub fn add_snapshot(&mut self, snap: Vec<(u32, u64)>) {
        const SIGNIFICANT_DRIFT_NS: i128 = 10_000_000;
        let keep = match self.snapshots.last() {
            None => true,
            Some(prev) => {
                let boot = |s: &[(u32, u64)]| s.first().map_or(0, |&(_, t)| i128::from(t));
                let (b0, b1) = (boot(prev), boot(&snap));
                snap.iter().any(|&(id, t)| {
                    prev.iter()
                        .find(|&&(pid, _)| pid == id)
                        .is_some_and(|&(_, pt)| {
                            ((i128::from(t) - i128::from(pt)) - (b1 - b0)).abs()
                                >= SIGNIFICANT_DRIFT_NS
                        })
                })
            }
        };
        if keep {
            if self.snapshots.len() == 16 {
                self.snapshots.remove(0);
            }
            self.snapshots.push(snap);
        }
    }

    /// Every instance is started (vacuously true without instances).
    pub fn all_started(&self) -> bool {
        self.instances
            .iter()
            .all(|i| i.state == InstanceState::Started)
    }

    /// The packet sequence id of a writer.
    pub fn sequence_id(&mut self, producer: ProducerId, writer: WriterId) -> u32 {
        let next = self.sequence_ids.len() as u32 + 2;
        *self.sequence_ids.entry((producer, writer)).or_insert(next)
    }

    fn timeout_ms(value: Option<u32>) -> u64 {
        u64::from(value.filter(|&v| v > 0).unwrap_or(DEFAULT_TIMEOUT_MS))
    }

    /// The flush timeout.
    pub fn flush_timeout_ms(&self) -> u64 {
        Self::timeout_ms(self.config.flush_timeout_ms)
    }

    /// The data source stop timeout.
    pub fn stop_timeout_ms(&self) -> u64 {
        Self::timeout_ms(self.config.data_source_stop_timeout_ms)
    }

    /// The snapshot period.
    pub fn snapshot_interval_ms(&self) -> u32 {
        self.config
            .builtin_data_sources
            .as_ref()
            .and_then(|b| b.snapshot_interval_ms)
            .filter(|&v| v > 0)
            .unwrap_or(DEFAULT_SNAPSHOT_INTERVAL_MS)
    }

    /// The builtin data source switches.
    pub fn builtin(&self) -> trace_config::BuiltinDataSource {
        self.config.builtin_data_sources.unwrap_or_default()
    }

    /// `file_write_period_ms`, defaulted and clamped.
    pub fn file_write_period_ms(&self) -> u32 {
        self.config
            .file_write_period_ms
            .filter(|&v| v > 0)
            .unwrap_or(DEFAULT_FILE_WRITE_PERIOD_MS)
            .max(MIN_FILE_WRITE_PERIOD_MS)
    }

    /// The period of the service's own flushes (0: none). In
    /// `write_into_file` sessions the default flush mode flushes every 5 s
    /// (or every write period if that is longer); `WRITE_FLUSH_DISABLED`
    /// keeps `flush_period_ms`.
    pub fn flush_period_ms(&self) -> u32 {
        let configured = self.config.flush_period_ms.unwrap_or(0);
        let disabled = self.config.write_flush_mode
            == Some(trace_config::WriteFlushMode::WriteFlushDisabled as i32);
        if self.file.is_some() && !disabled {
            let write = self.file_write_period_ms();
            let enabled = self.config.write_flush_mode
                == Some(trace_config::WriteFlushMode::WriteFlushEnabled as i32);
            if enabled || write > DEFAULT_FILE_WRITE_PERIOD_MS {
                return write;
            }
            return DEFAULT_FILE_WRITE_PERIOD_MS;
        }
        configured
    }
}
