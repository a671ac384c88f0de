//! The session lifecycle: `EnableTracing` (buffers, data source instances,
//! SMBs), start, stop, the end of a session and its freeing, and the timers
//! that drive them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::OwnedFd;

use bytes::Bytes;

use crate::ipc::PendingReply;
use crate::protos::ds_config::{self, ServiceFields};
use crate::protos::get_async_command_response::{self as cmd, Cmd};
use crate::protos::trace_config::buffer_config::FillPolicy as ProtoFillPolicy;
use crate::protos::{DataSourceConfig, DataSourceDescriptor, EnableTracingResponse};
use crate::service::buffer::{FillPolicy, TraceBuffer};
use crate::service::core::filter::SessionFilter;
use crate::service::core::timers::{aligned_delay_ns, Timer};
use crate::service::core::triggers::{self, SessionTriggers};
use crate::service::core::{BufferId, ConfigError, ConnId, ProducerId, SessionId, TracingService};
use crate::service::env::{FileTarget, NewSmb};
use crate::service::shm::ensure_valid_sizes;

use super::config::buffer_capacity;
use super::{
    flush_flags, FileSink, FlushThen, Instance, InstanceState, Lifecycle, ProducerIdentity,
    Session, SessionState, SlowDataSources, MAX_LISTED_DATA_SOURCES, SLOW_START_TIMEOUT_MS,
};

impl TracingService {
    pub(in crate::service::core) fn alloc_buffer_id(&mut self) -> BufferId {
        loop {
            self.last_buffer_id = self.last_buffer_id.wrapping_add(1);
            if self.last_buffer_id != 0 && !self.buffers.contains_key(&self.last_buffer_id) {
                return self.last_buffer_id;
            }
        }
    }

    /// `ConsumerPort.EnableTracing`.
    pub(in crate::service::core) fn enable_tracing(
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
                let msb = super::super::clone::uuid_v4_msb(self.env.random_u64());
                let lsb = (self.env.random_u64() & !(0xC0 << 56)) | (0x80 << 56);
                (msb, lsb as i64)
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
            filter: v.filter.map(SessionFilter::new),
            triggers: SessionTriggers {
                setup: v.triggers,
                pending: Vec::new(),
                received: 0,
                emitted: Vec::new(),
                not_emitted: 0,
                clone_hits: Vec::new(),
            },
            machines_described: BTreeSet::new(),
            machines_synced: BTreeSet::new(),
            pending_clones: BTreeMap::new(),
            clone_trigger: None,
            slow_start: None,
            last_flush_slow: Vec::new(),
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
    pub(in crate::service::core) fn maybe_setup_instance(
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
        if self.lockdown && (p.emulated || p.uid != self.cfg.uid) {
            log::info!(
                "lockdown: not setting up {name:?} on producer {:?} (uid {})",
                p.name,
                p.uid
            );
            return;
        }
        // Machines (upstream's rule since v54): a filter names the machines
        // ("host" always names this one); without one, only this machine,
        // unless the config traces all machines.
        let this_machine = p.machine.id == 0;
        let machine_matches = if ds.machine_name_filter.is_empty() {
            this_machine || session.config.trace_all_machines.unwrap_or(false)
        } else {
            ds.machine_name_filter
                .iter()
                .any(|m| *m == p.machine.name || (this_machine && m == "host"))
        };
        if !machine_matches {
            log::debug!(
                "{name:?} not set up on producer {:?} of machine {} {:?}",
                p.name,
                p.machine.id,
                p.machine.name
            );
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
            machine_id: p.machine.id,
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
            buffer,
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
        let emulated = p.emulated;
        if emulated && p.emulated_setup_sent {
            return true;
        }
        let (size, page) = config_sizes
            .filter(|&(s, pg)| s != 0 || pg != 0)
            .unwrap_or((p.shm_size_hint as usize, p.page_size_hint as usize));
        let (size, page) = ensure_valid_sizes(size, page);
        if emulated {
            // The producer keeps its own buffer, of this page size: no
            // memfd, and a SetupTracing without a descriptor (the
            // transport could not carry one).
            p.emulated_setup_sent = true;
            let setup = cmd::SetupTracing {
                shared_buffer_page_size_kb: Some((page / 1024) as u32),
                shm_key_windows: None,
            };
            self.send_command(producer, Cmd::SetupTracing(setup), None);
            return true;
        }
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
    pub(in crate::service::core) fn start_tracing(&mut self, sid: SessionId) {
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
        if s.consumer.is_some() {
            self.timers.arm(
                now + SLOW_START_TIMEOUT_MS * 1_000_000,
                Timer::SlowStart { session: sid },
            );
        }
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

    /// Moves `producer`'s instance `instance_id` from `from` to `to`, if it
    /// is in `from`; returns its session and data source name.
    fn advance_instance(
        &mut self,
        producer: ProducerId,
        instance_id: u64,
        from: InstanceState,
        to: InstanceState,
    ) -> Option<(SessionId, String)> {
        let mut found = None;
        for s in self.sessions.values_mut() {
            if let Some(inst) = s
                .instances
                .iter_mut()
                .find(|i| i.id == instance_id && i.producer == producer)
            {
                if inst.state == from {
                    inst.state = to;
                    found = Some((s.id, inst.name.clone()));
                }
            }
        }
        found
    }

    /// A producer confirmed an instance started.
    pub(in crate::service::core) fn instance_started(
        &mut self,
        producer: ProducerId,
        instance_id: u64,
    ) {
        if let Some((sid, name)) = self.advance_instance(
            producer,
            instance_id,
            InstanceState::Starting,
            InstanceState::Started,
        ) {
            self.notify_instance_state(sid, producer, &name, true);
            self.check_all_started(sid);
        }
    }

    /// [`SLOW_START_TIMEOUT_MS`] after the start: unless all data sources
    /// were reported started (to an attached consumer), notes a
    /// `slow_starting_data_sources` event naming those not started
    /// (upstream: `OnAllDataSourceStartedTimeout`).
    fn note_slow_start(&mut self, sid: SessionId) {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if s.consumer.is_none() || s.all_started_reported {
            return;
        }
        let sources: Vec<(String, String)> = s
            .instances
            .iter()
            .filter(|i| i.state != InstanceState::Started)
            .filter_map(|i| {
                Some((
                    self.producers.get(&i.producer)?.name.clone(),
                    i.name.clone(),
                ))
            })
            .take(MAX_LISTED_DATA_SOURCES)
            .collect();
        log::info!(
            "session {sid}: {} data sources did not start within {SLOW_START_TIMEOUT_MS} ms",
            sources.len()
        );
        s.slow_start = Some(SlowDataSources { at: now, sources });
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

    /// Stops a session (upstream: `TracingServiceImpl::DisableTracing`,
    /// src/tracing/service/tracing_service_impl.cc); `immediately` does not wait for
    /// acknowledgements.
    pub(in crate::service::core) fn disable_tracing(&mut self, sid: SessionId, immediately: bool) {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        match s.state {
            SessionState::Disabled | SessionState::ClonedReadOnly => return,
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
    pub(in crate::service::core) fn instance_stopped(
        &mut self,
        producer: ProducerId,
        instance_id: u64,
    ) {
        if let Some((sid, name)) = self.advance_instance(
            producer,
            instance_id,
            InstanceState::Stopping,
            InstanceState::Stopped,
        ) {
            self.notify_instance_state(sid, producer, &name, false);
            self.maybe_finalize(sid);
        }
    }

    /// Finalizes a stopping session whose instances all stopped.
    pub(in crate::service::core) fn maybe_finalize(&mut self, sid: SessionId) {
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
    pub(in crate::service::core) fn free_session(&mut self, sid: SessionId) {
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
            if let FlushThen::Reply(conn, to) = f.then {
                self.reject(conn, &to);
            }
        }
        self.abort_clones(s.pending_clones);
    }

    /// Fires a timer.
    pub(in crate::service::core) fn fire(&mut self, timer: Timer) {
        let now = self.now();
        match timer {
            Timer::FlushTimeout { session, flush } => {
                if self
                    .sessions
                    .get(&session)
                    .is_some_and(|s| s.flushes.contains_key(&flush))
                {
                    log::info!("flush {flush} of session {session} timed out");
                    self.note_slow_flush(session, flush);
                    self.complete_flush(session, flush, false);
                }
            }
            Timer::SlowStart { session } => self.note_slow_start(session),
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
                    self.flush(session, 0, flags, FlushThen::Disable);
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
                self.flush(session, 0, flags, FlushThen::Nothing);
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
            Timer::CloneTriggerHit { session } => self.clone_trigger_hits(session),
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
