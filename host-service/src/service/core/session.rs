//! Tracing sessions: config validation, data source instances, and the
//! start, flush and stop protocols (facts §9.1–§9.5).
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
use std::os::fd::OwnedFd;

use bytes::Bytes;
use prost::Message;
use regex::Regex;

use super::timers::{aligned_delay_ns, Timer};
use super::triggers::{self, SessionTriggers, TriggerSetup};
use super::{BufferId, ConfigError, ConnId, ProducerId, SessionId, TracingService};
use crate::ipc::PendingReply;
use crate::protos::ds_config::{self, ServiceFields};
use crate::protos::get_async_command_response::{self as cmd, Cmd};
use crate::protos::trace_config::{self, buffer_config::FillPolicy as ProtoFillPolicy};
use crate::protos::wire::{put_tag, put_varint, WireType};
use crate::protos::{
    DataSourceConfig, DataSourceDescriptor, EnableTracingResponse, FlushResponse, TraceConfig,
};
use crate::service::buffer::{FillPolicy, TraceBuffer, WriterId};
use crate::service::env::Nanos;
use crate::service::env::{FileTarget, NewSmb, TraceFile};
use crate::service::shm::ensure_valid_sizes;

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

/// `FlushFlags` (facts §5.2): reason and initiator nibbles.
pub mod flush_flags {
    /// Reason: periodic.
    pub const REASON_PERIODIC: u64 = 1;
    /// Reason: the trace is stopping.
    pub const REASON_TRACE_STOP: u64 = 2;
    /// Initiator: the tracing service.
    pub const INITIATOR_TRACED: u64 = 1 << 4;
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
}

impl SessionState {
    /// Upstream's name (QueryServiceState).
    pub fn name(self) -> &'static str {
        match self {
            SessionState::Configured => "CONFIGURED",
            SessionState::Started => "STARTED",
            SessionState::Stopping => "STOP_WAIT",
            SessionState::Disabled => "DISABLED",
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
    /// The config sent to the producer (service fields rewritten).
    pub config: Bytes,
}

/// A flush waiting for producers' acknowledgements.
#[derive(Debug)]
pub struct PendingFlush {
    /// Producers that have not acknowledged yet.
    pub pending: BTreeSet<ProducerId>,
    /// The consumer call to answer.
    pub reply: Option<(ConnId, PendingReply)>,
    /// Stop the session once the flush is over (duration end).
    pub disable_after: bool,
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
}

/// Who a producer was, for packets read after it left.
#[derive(Debug, Clone)]
pub struct ProducerIdentity {
    /// Its uid.
    pub uid: u32,
    /// Its pid (0 if unknown).
    pub pid: i32,
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
    /// The sequence of the last producer packet read: `((producer,
    /// writer), uid, pid, sequence id)`.
    pub last_sequence: Option<((ProducerId, WriterId), u32, i32, u32)>,
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
    /// Trigger setup and the triggers received.
    pub triggers: SessionTriggers,
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

/// A config that passed validation, with what it resolved.
pub(super) struct Validated {
    config: TraceConfig,
    /// Per config data source: its decoded config and buffer index.
    data_sources: Vec<(DataSourceConfig, usize)>,
    regexes: Vec<Vec<Regex>>,
    triggers: TriggerSetup,
}

impl TracingService {
    /// Validates a config (facts §9.1 step 1) for a consumer of `uid`.
    pub(super) fn validate(
        &mut self,
        raw: &Bytes,
        conn: ConnId,
        uid: u32,
        has_fd: bool,
    ) -> Result<Validated, ConfigError> {
        let config = TraceConfig::decode(raw.clone()).map_err(ConfigError::Decode)?;
        match config.lockdown_mode {
            Some(x) if x == trace_config::LockdownModeOperation::LockdownSet as i32 => {
                self.lockdown = true
            }
            Some(x) if x == trace_config::LockdownModeOperation::LockdownClear as i32 => {
                self.lockdown = false
            }
            _ => {}
        }
        if self.consumer(conn).is_some_and(|c| c.session.is_some()) {
            return Err(ConfigError::SessionActive);
        }
        if config.duration_ms.unwrap_or(0) > MAX_DURATION_MS {
            return Err(ConfigError::DurationTooLong);
        }
        let triggers = triggers::validate(&config)?;
        if config.trace_filter.is_some() {
            return Err(ConfigError::TraceFilter);
        }
        if config.compression.is_some() || config.compression_type.unwrap_or(0) != 0 {
            return Err(ConfigError::Compression);
        }
        if !config.session_semaphores.is_empty() {
            return Err(ConfigError::SessionSemaphores);
        }
        if config.buffers.len() > MAX_BUFFERS_PER_SESSION {
            return Err(ConfigError::TooManyBuffers(config.buffers.len()));
        }
        let mut names = BTreeSet::new();
        let mut asked = 0u64;
        for (i, b) in config.buffers.iter().enumerate() {
            let size = u64::from(b.size_kb.unwrap_or(0)) * 1024;
            if size == 0 || size > u64::from(u32::MAX) {
                return Err(ConfigError::BufferSize {
                    index: i,
                    size_kb: b.size_kb.unwrap_or(0),
                });
            }
            asked += buffer_capacity(b) as u64;
            if let Some(name) = b.name.as_deref().filter(|n| !n.is_empty()) {
                if !names.insert(name) {
                    return Err(ConfigError::DuplicateBufferName(name.to_owned()));
                }
            }
        }
        let held: u64 = self
            .buffers
            .values()
            .map(|(_, b)| b.stats().buffer_size)
            .sum();
        if held + asked > self.cfg.max_buffer_bytes {
            return Err(ConfigError::BufferMemory {
                asked,
                held,
                limit: self.cfg.max_buffer_bytes,
            });
        }
        let mut data_sources = Vec::new();
        let mut regexes = Vec::new();
        for ds in &config.data_sources {
            let dsc: DataSourceConfig = crate::protos::from_raw(ds.config.as_ref())
                .map_err(ConfigError::DecodeDataSource)?;
            let name = dsc.name.clone().unwrap_or_default();
            let mut index = dsc.target_buffer.unwrap_or(0) as usize;
            if let Some(bname) = dsc.target_buffer_name.as_deref().filter(|n| !n.is_empty()) {
                let by_name = config
                    .buffers
                    .iter()
                    .position(|b| b.name.as_deref() == Some(bname))
                    .ok_or_else(|| ConfigError::NoBufferNamed {
                        data_source: name.clone(),
                        buffer: bname.to_owned(),
                    })?;
                if dsc.target_buffer.is_some_and(|t| t as usize != by_name) {
                    return Err(ConfigError::TargetBufferMismatch(name));
                }
                index = by_name;
            }
            if index >= config.buffers.len() {
                return Err(ConfigError::NoSuchBuffer {
                    data_source: name,
                    index,
                    buffers: config.buffers.len(),
                });
            }
            let mut compiled = Vec::new();
            for pattern in &ds.producer_name_regex_filter {
                let re = Regex::new(&format!("^(?:{pattern})$")).map_err(|source| {
                    ConfigError::ProducerNameRegex {
                        pattern: pattern.clone(),
                        source,
                    }
                })?;
                compiled.push(re);
            }
            regexes.push(compiled);
            data_sources.push((dsc, index));
        }
        if let Some(name) = config
            .unique_session_name
            .as_deref()
            .filter(|n| !n.is_empty())
        {
            if self
                .sessions
                .values()
                .any(|s| s.config.unique_session_name.as_deref() == Some(name))
            {
                return Err(ConfigError::SessionNameTaken(name.to_owned()));
            }
        }
        if self.sessions.len() >= MAX_SESSIONS {
            return Err(ConfigError::TooManySessions);
        }
        if self
            .sessions
            .values()
            .filter(|s| s.consumer_uid == uid)
            .count()
            >= MAX_SESSIONS_PER_UID
        {
            return Err(ConfigError::TooManySessionsForUid(uid));
        }
        if config.write_into_file.unwrap_or(false) {
            let has_path = config.output_path.as_deref().is_some_and(|p| !p.is_empty());
            if has_path == has_fd {
                return Err(ConfigError::WriteIntoFileTarget);
            }
        }
        let free_ids = usize::from(u16::MAX) - self.buffers.len();
        if config.buffers.len() > free_ids {
            return Err(ConfigError::NoBufferIds);
        }
        Ok(Validated {
            config,
            data_sources,
            regexes,
            triggers,
        })
    }

    fn alloc_buffer_id(&mut self) -> BufferId {
        loop {
            self.last_buffer_id = self.last_buffer_id.wrapping_add(1);
            if self.last_buffer_id != 0 && !self.buffers.contains_key(&self.last_buffer_id) {
                return self.last_buffer_id;
            }
        }
    }

    /// `ConsumerPort.EnableTracing`.
    pub(super) fn enable_tracing(
        &mut self,
        conn: ConnId,
        to: PendingReply,
        raw: Bytes,
        fd: Option<OwnedFd>,
    ) {
        let Some(uid) = self.consumer(conn).map(|c| c.creds.uid) else {
            return;
        };
        let result = self.validate(&raw, conn, uid, fd.is_some()).and_then(|v| {
            let file = if v.config.write_into_file.unwrap_or(false) {
                let file = match (fd, v.config.output_path.as_deref()) {
                    (Some(fd), _) => self
                        .env
                        .open_trace_file(FileTarget::Fd(fd))
                        .map_err(ConfigError::OutputDescriptor)?,
                    (None, Some(path)) => self
                        .env
                        .open_trace_file(FileTarget::Path(path))
                        .map_err(|source| ConfigError::CreateOutput {
                            path: path.to_owned(),
                            source,
                        })?,
                    (None, None) => return Err(ConfigError::WriteIntoFileTarget),
                };
                Some(FileSink {
                    file,
                    written: 0,
                    max_size: v.config.max_file_size_bytes.unwrap_or(0),
                    closed: false,
                })
            } else {
                None
            };
            Ok((v, file))
        });
        let (v, file) = match result {
            Ok(x) => x,
            Err(error) => {
                log::info!("EnableTracing refused: {error}");
                let resp = EnableTracingResponse {
                    state: Some(crate::protos::enable_tracing_response::State::Disabled(
                        true,
                    )),
                    error: Some(error.to_string()),
                };
                self.reply(conn, &to, &resp, false);
                return;
            }
        };
        let mut buffers = Vec::new();
        for b in &v.config.buffers {
            let size = buffer_capacity(b);
            let policy = match b.fill_policy {
                Some(p) if p == ProtoFillPolicy::Discard as i32 => FillPolicy::Discard,
                _ => FillPolicy::RingBuffer,
            };
            let id = self.alloc_buffer_id();
            match TraceBuffer::new(size, policy) {
                Ok(buf) => {
                    buffers.push(id);
                    self.buffers.insert(id, (0, buf));
                }
                Err(e) => log::error!("buffer of {size} bytes refused: {e}"),
            }
        }
        self.last_session_id += 1;
        let id = self.last_session_id;
        for b in &buffers {
            if let Some(entry) = self.buffers.get_mut(b) {
                entry.0 = id;
            }
        }
        let uuid = match (v.config.trace_uuid_msb, v.config.trace_uuid_lsb) {
            (Some(m), Some(l)) if m != 0 || l != 0 => (m, l),
            _ => {
                // A random version 4 UUID.
                let msb = (self.env.random_u64() & !0xF000) | 0x4000;
                let lsb = (self.env.random_u64() & !(0xC0 << 56)) | (0x80 << 56);
                (msb as i64, lsb as i64)
            }
        };
        let session = Session {
            id,
            consumer: Some(conn),
            consumer_uid: uid,
            detach_key: None,
            config: v.config,
            raw_config: raw,
            state: SessionState::Configured,
            buffers,
            instances: Vec::new(),
            enable_reply: Some(to),
            error: None,
            flushes: BTreeMap::new(),
            stop_epoch: 0,
            sequence_ids: HashMap::new(),
            last_sequence: None,
            identities: HashMap::new(),
            events: Vec::new(),
            initial_snapshot: None,
            snapshots: Vec::new(),
            preamble_done: false,
            sync_due: false,
            stats_due: false,
            uuid,
            file,
            invalid_packets: 0,
            flushes_requested: 0,
            flushes_succeeded: 0,
            flushes_failed: 0,
            final_flush_outcome: None,
            all_started_reported: false,
            start_realtime_ns: None,
            regexes: v.regexes,
            triggers: SessionTriggers {
                setup: v.triggers,
                pending: Vec::new(),
                received: 0,
                not_emitted: 0,
            },
        };
        self.sessions.insert(id, session);
        if let Some(c) = self.consumer_mut(conn) {
            c.session = Some(id);
        }
        let dss = v.data_sources;
        let producers: Vec<ProducerId> = self.producers.keys().copied().collect();
        for (index, _) in dss.iter().enumerate() {
            for &p in &producers {
                let descriptors: Vec<DataSourceDescriptor> = self
                    .producers
                    .get(&p)
                    .map(|pr| pr.data_sources.clone())
                    .unwrap_or_default();
                for d in descriptors {
                    self.maybe_setup_instance(id, index, p, &d);
                }
            }
        }
        let deferred = self
            .sessions
            .get(&id)
            .is_some_and(|s| s.config.deferred_start.unwrap_or(false));
        let awaits_trigger = self.arm_triggers(id);
        if !deferred && !awaits_trigger {
            self.start_tracing(id);
        }
    }

    /// Sets up an instance of data source `desc` of `producer` for config
    /// entry `index` of session `sid`, if it matches.
    pub(super) fn maybe_setup_instance(
        &mut self,
        sid: SessionId,
        index: usize,
        producer: ProducerId,
        desc: &DataSourceDescriptor,
    ) {
        let Some(session) = self.sessions.get(&sid) else {
            return;
        };
        let Some(ds) = session.config.data_sources.get(index) else {
            return;
        };
        let Some(p) = self.producers.get(&producer) else {
            return;
        };
        let Ok(dsc) = crate::protos::from_raw::<DataSourceConfig>(ds.config.as_ref()) else {
            return;
        };
        let name = dsc.name.clone().unwrap_or_default();
        if name.is_empty() || desc.name.as_deref() != Some(name.as_str()) {
            return;
        }
        if self.lockdown && p.uid != self.cfg.uid {
            log::info!(
                "lockdown: not setting up {name:?} on producer {:?} (uid {})",
                p.name,
                p.uid
            );
            return;
        }
        if !ds.machine_name_filter.is_empty() && !ds.machine_name_filter.iter().any(|m| m == "host")
        {
            return;
        }
        let regexes = session.regexes.get(index).map(Vec::as_slice).unwrap_or(&[]);
        let filtered = !ds.producer_name_filter.is_empty() || !regexes.is_empty();
        let matches = ds.producer_name_filter.contains(&p.name)
            || regexes.iter().any(|r| r.is_match(&p.name));
        if filtered && !matches {
            return;
        }
        // Duplicate set-up of the same data source for the same entry.
        let buffer_index = match dsc.target_buffer_name.as_deref().filter(|n| !n.is_empty()) {
            Some(bname) => session
                .config
                .buffers
                .iter()
                .position(|b| b.name.as_deref() == Some(bname)),
            None => Some(dsc.target_buffer.unwrap_or(0) as usize),
        };
        let Some(&buffer) = buffer_index.and_then(|i| session.buffers.get(i)) else {
            return;
        };
        let fields = ServiceFields {
            target_buffer: u32::from(buffer),
            trace_duration_ms: session.config.duration_ms.unwrap_or(0),
            prefer_suspend_clock_for_duration: session
                .config
                .prefer_suspend_clock_for_duration
                .unwrap_or(false),
            stop_timeout_ms: session.stop_timeout_ms() as u32,
            enable_extra_guardrails: session.config.enable_extra_guardrails.unwrap_or(false),
            session_initiator: 0,
            tracing_session_id: sid,
            supports_tracing_v2: false,
        };
        let raw = ds.config.clone().unwrap_or_default();
        let config = match ds_config::rewrite(&raw, &fields) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("data source config of {name:?} is malformed: {e}");
                return;
            }
        };
        let page_hint = session
            .config
            .producers
            .iter()
            .find(|pc| pc.producer_name.as_deref() == Some(p.name.as_str()))
            .map(|pc| {
                (
                    pc.shm_size_kb.unwrap_or(0) as usize * 1024,
                    pc.page_size_kb.unwrap_or(0) as usize * 1024,
                )
            });
        let started = session.state == SessionState::Started;
        let identity = ProducerIdentity {
            uid: p.uid,
            pid: p.pid,
        };
        if !self.ensure_smb(producer, page_hint) {
            return;
        }
        self.last_instance_id += 1;
        let instance = Instance {
            id: self.last_instance_id,
            producer,
            name: name.clone(),
            state: InstanceState::Configured,
            notify_on_start: desc.will_notify_on_start.unwrap_or(false),
            notify_on_stop: desc.will_notify_on_stop.unwrap_or(false),
            handles_incremental_state_clear: desc.handles_incremental_state_clear.unwrap_or(false),
            no_flush: desc.no_flush.unwrap_or(false),
            config: config.clone(),
        };
        let instance_id = instance.id;
        if let Some(p) = self.producers.get_mut(&producer) {
            p.allowed_buffers.insert(buffer);
        }
        if let Some(s) = self.sessions.get_mut(&sid) {
            s.identities.insert(producer, identity);
            s.instances.push(instance);
        }
        self.send_command(
            producer,
            Cmd::SetupDataSource(cmd::SetupDataSource {
                new_instance_id: Some(instance_id),
                config: Some(config),
            }),
            None,
        );
        self.notify_instance_state(sid, producer, &name, false);
        if started {
            self.start_instance(sid, instance_id);
        }
    }

    /// Creates the producer's SMB if it has none; `false` if impossible.
    fn ensure_smb(&mut self, producer: ProducerId, config_sizes: Option<(usize, usize)>) -> bool {
        let Some(p) = self.producers.get_mut(&producer) else {
            return false;
        };
        if p.smb.is_some() {
            return true;
        }
        let (size, page) = config_sizes
            .filter(|&(s, pg)| s != 0 || pg != 0)
            .unwrap_or((p.shm_size_hint as usize, p.page_size_hint as usize));
        let (size, page) = ensure_valid_sizes(size, page);
        match self.env.create_smb(size, page) {
            Ok(NewSmb { shm, fd }) => {
                p.smb = Some(shm);
                let setup = cmd::SetupTracing {
                    shared_buffer_page_size_kb: Some((page / 1024) as u32),
                    shm_key_windows: None,
                };
                self.send_command(producer, Cmd::SetupTracing(setup), Some(fd));
                true
            }
            Err(e) => {
                log::error!(
                    "cannot create a shared memory buffer of {size} bytes for producer {}: {e}",
                    p.name
                );
                false
            }
        }
    }

    /// Starts a session (`Configured` → `Started`).
    pub(super) fn start_tracing(&mut self, sid: SessionId) {
        let now = self.now();
        let snapshot = self.env.clock_snapshot();
        let realtime = self
            .env
            .clock_snapshot()
            .iter()
            .find(|&&(id, _)| id == crate::service::env::clock_id::REALTIME)
            .map(|&(_, t)| t as i64);
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if s.state != SessionState::Configured {
            return;
        }
        s.state = SessionState::Started;
        s.start_realtime_ns = realtime;
        if !s.builtin().disable_clock_snapshotting.unwrap_or(false) {
            s.initial_snapshot = Some(snapshot);
        }
        s.event(now, Lifecycle::TracingStarted);
        let duration = s.config.duration_ms.unwrap_or(0);
        let flush_period = s.flush_period_ms();
        let clear_period = s
            .config
            .incremental_state_config
            .as_ref()
            .and_then(|c| c.clear_period_ms)
            .unwrap_or(0);
        let file_period = s.file.as_ref().map(|_| s.file_write_period_ms());
        let ids: Vec<u64> = s
            .instances
            .iter()
            .filter(|i| i.state == InstanceState::Configured)
            .map(|i| i.id)
            .collect();
        self.timers.arm(now, Timer::Snapshot { session: sid });
        if duration > 0 {
            self.timers.arm(
                now + u64::from(duration) * 1_000_000,
                Timer::Duration { session: sid },
            );
        }
        if flush_period > 0 {
            self.timers.arm(
                now + aligned_delay_ns(now, flush_period),
                Timer::PeriodicFlush { session: sid },
            );
        }
        if clear_period > 0 {
            self.timers.arm(
                now + aligned_delay_ns(now, clear_period),
                Timer::ClearIncrementalState { session: sid },
            );
        }
        if let Some(period) = file_period {
            self.timers.arm(
                now + aligned_delay_ns(now, period),
                Timer::WriteIntoFile { session: sid },
            );
        }
        for id in ids {
            self.start_instance(sid, id);
        }
        self.check_all_started(sid);
    }

    fn start_instance(&mut self, sid: SessionId, instance_id: u64) {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let Some(inst) = s.instances.iter_mut().find(|i| i.id == instance_id) else {
            return;
        };
        inst.state = if inst.notify_on_start {
            InstanceState::Starting
        } else {
            InstanceState::Started
        };
        let (producer, name, config, started) = (
            inst.producer,
            inst.name.clone(),
            inst.config.clone(),
            inst.state == InstanceState::Started,
        );
        self.send_command(
            producer,
            Cmd::StartDataSource(cmd::StartDataSource {
                new_instance_id: Some(instance_id),
                config: Some(config),
            }),
            None,
        );
        if started {
            self.notify_instance_state(sid, producer, &name, true);
        }
    }

    /// A producer confirmed an instance started.
    pub(super) fn instance_started(&mut self, producer: ProducerId, instance_id: u64) {
        let mut found = None;
        for s in self.sessions.values_mut() {
            if let Some(inst) = s
                .instances
                .iter_mut()
                .find(|i| i.id == instance_id && i.producer == producer)
            {
                if inst.state == InstanceState::Starting {
                    inst.state = InstanceState::Started;
                    found = Some((s.id, inst.name.clone()));
                }
            }
        }
        if let Some((sid, name)) = found {
            self.notify_instance_state(sid, producer, &name, true);
            self.check_all_started(sid);
        }
    }

    fn check_all_started(&mut self, sid: SessionId) {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if s.state != SessionState::Started || s.all_started_reported || !s.all_started() {
            return;
        }
        s.all_started_reported = true;
        s.event(now, Lifecycle::AllDataSourcesStarted);
        self.notify_all_started(sid);
    }

    /// Stops a session (facts §9.4); `immediately` does not wait for
    /// acknowledgements.
    pub(super) fn disable_tracing(&mut self, sid: SessionId, immediately: bool) {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        match s.state {
            SessionState::Disabled => return,
            SessionState::Stopping if !immediately => return,
            _ => {}
        }
        let mut stops = Vec::new();
        for inst in &mut s.instances {
            if inst.state == InstanceState::Stopped {
                continue;
            }
            let asked = inst.state == InstanceState::Stopping;
            if asked && !immediately {
                continue;
            }
            let wait = !immediately
                && inst.notify_on_stop
                && matches!(inst.state, InstanceState::Starting | InstanceState::Started);
            inst.state = if wait {
                InstanceState::Stopping
            } else {
                InstanceState::Stopped
            };
            stops.push((inst.producer, inst.id, inst.name.clone(), !wait, !asked));
        }
        s.state = SessionState::Stopping;
        s.stop_epoch += 1;
        let epoch = s.stop_epoch;
        let timeout = s.stop_timeout_ms();
        let all_stopped = s
            .instances
            .iter()
            .all(|i| i.state == InstanceState::Stopped);
        for (producer, id, name, stopped, send) in stops {
            if send {
                self.send_command(
                    producer,
                    Cmd::StopDataSource(cmd::StopDataSource {
                        instance_id: Some(id),
                    }),
                    None,
                );
            }
            if stopped {
                self.notify_instance_state(sid, producer, &name, false);
            }
        }
        if all_stopped {
            self.finalize_disable(sid);
        } else {
            self.timers.arm(
                now + timeout * 1_000_000,
                Timer::StopTimeout {
                    session: sid,
                    epoch,
                },
            );
        }
    }

    /// A producer confirmed an instance stopped.
    pub(super) fn instance_stopped(&mut self, producer: ProducerId, instance_id: u64) {
        let mut found = None;
        for s in self.sessions.values_mut() {
            if let Some(inst) = s
                .instances
                .iter_mut()
                .find(|i| i.id == instance_id && i.producer == producer)
            {
                if inst.state == InstanceState::Stopping {
                    inst.state = InstanceState::Stopped;
                    found = Some((s.id, inst.name.clone()));
                }
            }
        }
        if let Some((sid, name)) = found {
            self.notify_instance_state(sid, producer, &name, false);
            self.maybe_finalize(sid);
        }
    }

    /// Finalizes a stopping session whose instances all stopped.
    pub(super) fn maybe_finalize(&mut self, sid: SessionId) {
        let ready = self.sessions.get(&sid).is_some_and(|s| {
            s.state == SessionState::Stopping
                && s.instances
                    .iter()
                    .all(|i| i.state == InstanceState::Stopped)
        });
        if ready {
            self.finalize_disable(sid);
        }
    }

    fn finalize_disable(&mut self, sid: SessionId) {
        let now = self.now();
        let snapshot = self.env.clock_snapshot();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        for inst in &mut s.instances {
            inst.state = InstanceState::Stopped;
        }
        s.state = SessionState::Disabled;
        let producers: Vec<ProducerId> = s.identities.keys().copied().collect();
        for p in producers {
            self.scrape_producer(p, Some(sid));
        }
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        s.event(now, Lifecycle::TracingDisabled);
        if !s.builtin().disable_clock_snapshotting.unwrap_or(false) {
            s.add_snapshot(snapshot);
        }
        s.stats_due = true;
        if s.file.is_some() {
            self.drain_to_file(sid, true);
        }
        self.answer_enable(sid);
        let detached = self
            .sessions
            .get(&sid)
            .is_some_and(|s| s.consumer.is_none());
        if detached {
            // Nobody will read a detached session that ended on its own.
            self.free_session(sid);
        }
    }

    /// Answers the consumer's `EnableTracing`: the session is over.
    fn answer_enable(&mut self, sid: SessionId) {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let (Some(conn), Some(to)) = (s.consumer, s.enable_reply.take()) else {
            return;
        };
        let resp = EnableTracingResponse {
            state: Some(crate::protos::enable_tracing_response::State::Disabled(
                true,
            )),
            error: s.error.clone(),
        };
        self.reply(conn, &to, &resp, false);
    }

    /// Stops (immediately) and destroys a session and its buffers.
    pub(super) fn free_session(&mut self, sid: SessionId) {
        self.disable_tracing(sid, true);
        let Some(s) = self.sessions.remove(&sid) else {
            return;
        };
        self.timers.forget_session(sid);
        for b in &s.buffers {
            self.buffers.remove(b);
        }
        for p in self.producers.values_mut() {
            for b in &s.buffers {
                p.allowed_buffers.remove(b);
            }
            p.writers.retain(|_, b| !s.buffers.contains(b));
        }
        if let Some(conn) = s.consumer {
            if let Some(c) = self.consumer_mut(conn) {
                if c.session == Some(sid) {
                    c.session = None;
                }
            }
            if let Some(to) = s.enable_reply {
                let resp = EnableTracingResponse {
                    state: Some(crate::protos::enable_tracing_response::State::Disabled(
                        true,
                    )),
                    error: s.error,
                };
                self.reply(conn, &to, &resp, false);
            }
        }
        for (_, f) in s.flushes {
            if let Some((conn, to)) = f.reply {
                self.reject(conn, &to);
            }
        }
    }

    /// Starts a flush (facts §9.3).
    pub(super) fn flush(
        &mut self,
        sid: SessionId,
        timeout_ms: u32,
        flags: u64,
        reply: Option<(ConnId, PendingReply)>,
        disable_after: bool,
    ) {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            if let Some((conn, to)) = reply {
                self.reject(conn, &to);
            }
            return;
        };
        if s.state != SessionState::Started || s.flushes.len() >= MAX_PENDING_FLUSHES {
            s.flushes_failed += 1;
            if let Some((conn, to)) = reply {
                self.reject(conn, &to);
            }
            if disable_after {
                self.disable_tracing(sid, false);
            }
            return;
        }
        self.last_flush_id += 1;
        let flush_id = self.last_flush_id;
        let mut per_producer: BTreeMap<ProducerId, Vec<u64>> = BTreeMap::new();
        for inst in &s.instances {
            if !inst.no_flush && inst.state != InstanceState::Stopped {
                per_producer.entry(inst.producer).or_default().push(inst.id);
            }
        }
        per_producer.retain(|p, _| self.producers.contains_key(p));
        let timeout = if timeout_ms > 0 {
            u64::from(timeout_ms)
        } else {
            s.flush_timeout_ms()
        };
        s.flushes_requested += 1;
        s.event(now, Lifecycle::FlushStarted);
        s.flushes.insert(
            flush_id,
            PendingFlush {
                pending: per_producer.keys().copied().collect(),
                reply,
                disable_after,
            },
        );
        let empty = per_producer.is_empty();
        for (producer, ids) in per_producer {
            let f = cmd::Flush {
                data_source_ids: ids,
                request_id: Some(flush_id),
                flags: Some(flags),
            };
            self.send_command(producer, Cmd::Flush(f), None);
        }
        if empty {
            self.complete_flush(sid, flush_id, true);
        } else {
            self.timers.arm(
                now + timeout * 1_000_000,
                Timer::FlushTimeout {
                    session: sid,
                    flush: flush_id,
                },
            );
        }
    }

    /// A producer acknowledged every flush up to `flush_id` (acks are
    /// cumulative).
    pub(super) fn flush_acked(&mut self, producer: ProducerId, flush_id: u64) {
        let mut done = Vec::new();
        for s in self.sessions.values_mut() {
            for (&id, f) in s.flushes.range_mut(..=flush_id) {
                f.pending.remove(&producer);
                if f.pending.is_empty() {
                    done.push((s.id, id));
                }
            }
        }
        for (sid, id) in done {
            self.complete_flush(sid, id, true);
        }
    }

    /// Ends a flush.
    pub(super) fn complete_flush(&mut self, sid: SessionId, flush_id: u64, success: bool) {
        let now = self.now();
        let snapshot = self.env.clock_snapshot();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let Some(f) = s.flushes.remove(&flush_id) else {
            return;
        };
        if success {
            s.flushes_succeeded += 1;
        } else {
            s.flushes_failed += 1;
        }
        if f.disable_after {
            use crate::protos::trace_stats::FinalFlushOutcome;
            let outcome = if success {
                FinalFlushOutcome::FinalFlushSucceeded
            } else {
                FinalFlushOutcome::FinalFlushFailed
            };
            s.final_flush_outcome = Some(outcome as i32);
        }
        let producers: Vec<ProducerId> = s.identities.keys().copied().collect();
        for p in producers {
            self.scrape_producer(p, Some(sid));
        }
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        s.event(now, Lifecycle::AllDataSourcesFlushed);
        if !s.builtin().disable_clock_snapshotting.unwrap_or(false) {
            s.add_snapshot(snapshot);
        }
        if let Some((conn, to)) = f.reply {
            if success {
                self.reply(conn, &to, &FlushResponse {}, false);
            } else {
                self.reject(conn, &to);
            }
        }
        if f.disable_after {
            self.disable_tracing(sid, false);
        }
    }

    /// Sends `ClearIncrementalState` for the instances that handle it.
    fn clear_incremental_state(&mut self, sid: SessionId) {
        let Some(s) = self.sessions.get(&sid) else {
            return;
        };
        let mut per_producer: BTreeMap<ProducerId, Vec<u64>> = BTreeMap::new();
        for inst in s
            .instances
            .iter()
            .filter(|i| i.handles_incremental_state_clear)
        {
            per_producer.entry(inst.producer).or_default().push(inst.id);
        }
        for (producer, ids) in per_producer {
            let c = cmd::ClearIncrementalState {
                data_source_ids: ids,
            };
            self.send_command(producer, Cmd::ClearIncrementalState(c), None);
        }
    }

    /// Fires a timer.
    pub(super) fn fire(&mut self, timer: Timer) {
        let now = self.now();
        match timer {
            Timer::FlushTimeout { session, flush } => {
                if self
                    .sessions
                    .get(&session)
                    .is_some_and(|s| s.flushes.contains_key(&flush))
                {
                    log::info!("flush {flush} of session {session} timed out");
                    self.complete_flush(session, flush, false);
                }
            }
            Timer::StopTimeout { session, epoch } => {
                let Some(s) = self.sessions.get_mut(&session) else {
                    return;
                };
                if s.state != SessionState::Stopping || s.stop_epoch != epoch {
                    return;
                }
                let late: Vec<(ProducerId, String)> = s
                    .instances
                    .iter_mut()
                    .filter(|i| i.state != InstanceState::Stopped)
                    .map(|i| {
                        i.state = InstanceState::Stopped;
                        (i.producer, i.name.clone())
                    })
                    .collect();
                log::info!(
                    "session {session}: {} data sources did not confirm the stop in time",
                    late.len()
                );
                for (p, name) in late {
                    self.notify_instance_state(session, p, &name, false);
                }
                self.finalize_disable(session);
            }
            Timer::Duration { session } => {
                // After a STOP_TRACING trigger, its stop_delay_ms decides.
                if self.sessions.get(&session).is_some_and(|s| {
                    s.state == SessionState::Started
                        && !(s.triggers.setup.mode == triggers::TriggerMode::StopTracing
                            && s.triggers.received > 0)
                }) {
                    let flags = flush_flags::REASON_TRACE_STOP | flush_flags::INITIATOR_TRACED;
                    self.flush(session, 0, flags, None, true);
                }
            }
            Timer::PeriodicFlush { session } => {
                let Some(s) = self.sessions.get(&session) else {
                    return;
                };
                if s.state != SessionState::Started {
                    return;
                }
                let period = s.flush_period_ms();
                self.timers.arm(
                    now + aligned_delay_ns(now, period),
                    Timer::PeriodicFlush { session },
                );
                let flags = flush_flags::REASON_PERIODIC | flush_flags::INITIATOR_TRACED;
                self.flush(session, 0, flags, None, false);
            }
            Timer::ClearIncrementalState { session } => {
                let Some(s) = self.sessions.get(&session) else {
                    return;
                };
                if s.state != SessionState::Started {
                    return;
                }
                let period = s
                    .config
                    .incremental_state_config
                    .as_ref()
                    .and_then(|c| c.clear_period_ms)
                    .unwrap_or(0);
                if period > 0 {
                    self.timers.arm(
                        now + aligned_delay_ns(now, period),
                        Timer::ClearIncrementalState { session },
                    );
                }
                self.clear_incremental_state(session);
            }
            Timer::WriteIntoFile { session } => {
                let Some(s) = self.sessions.get(&session) else {
                    return;
                };
                if !matches!(s.state, SessionState::Started | SessionState::Stopping) {
                    return;
                }
                let period = s.file_write_period_ms();
                self.timers.arm(
                    now + aligned_delay_ns(now, period),
                    Timer::WriteIntoFile { session },
                );
                self.drain_to_file(session, false);
            }
            Timer::TriggerTimeout { session } => self.start_trigger_timeout(session),
            Timer::TriggerStop { session } => self.trigger_stop(session),
            Timer::Snapshot { session } => {
                let snapshot = self.env.clock_snapshot();
                let Some(s) = self.sessions.get_mut(&session) else {
                    return;
                };
                if s.state != SessionState::Started {
                    return;
                }
                if !s.builtin().disable_clock_snapshotting.unwrap_or(false) {
                    s.add_snapshot(snapshot);
                }
                s.sync_due = true;
                s.stats_due = true;
                let period = s.snapshot_interval_ms();
                self.timers.arm(
                    now + aligned_delay_ns(now, period),
                    Timer::Snapshot { session },
                );
            }
        }
    }
}

/// The bytes a buffer of `config` takes (at least [`TraceBuffer::MIN_SIZE`]).
fn buffer_capacity(config: &crate::protos::trace_config::BufferConfig) -> usize {
    (config.size_kb.unwrap_or(0) as usize * 1024).max(TraceBuffer::MIN_SIZE)
}
