//! The consumer port: every `ConsumerPort` RPC
//! (protos/perfetto/ipc/consumer_port.proto; upstream's
//! src/tracing/ipc/service/consumer_ipc_service.cc and
//! src/tracing/service/tracing_service_endpoints_impl.cc).
//!
//! `CloneSession` is [`super::clone`]'s. What this service does not
//! implement (zstd compression, `SaveTraceForBugreport`) is refused
//! explicitly:
//! an `EnableTracing` with such a config is answered with an error string,
//! and calls that only exist for them fail or say so in their response.
//! `ChangeTraceConfig` applies producer name filters only, like upstream,
//! and logs what else it ignores ([`super::reconfigure`]).

use super::readback::ReadStream;
use super::session::{FlushThen, Session, SessionState};
use super::{ConnId, Endpoint, ProducerId, SessionId, TracingService};
use crate::ipc::{Call, PeerCredentials, PendingReply};
use crate::protos::consumer_port::Request;
use crate::protos::observable_events::{
    DataSourceInstanceState, DataSourceInstanceStateChange, Type as EventType,
};
use crate::protos::tracing_service_state as tss;
use crate::protos::{
    AttachResponse, ChangeTraceConfigResponse, DetachResponse, DisableTracingResponse,
    FreeBuffersResponse, GetTraceStatsResponse, ObservableEvents, ObserveEventsResponse,
    QueryCapabilitiesResponse, QueryServiceStateResponse, SaveTraceForBugreportResponse,
    StartTracingResponse, TracingServiceCapabilities, TracingServiceState,
};
use crate::service::buffer::BUCKET_BOUNDS;

/// Largest `QueryServiceState` reply before the state is split over
/// several replies (upstream's limit).
const QUERY_STATE_CHUNK: usize = 128 * 1024 - 128;

/// A consumer connection.
#[derive(Debug)]
pub struct ConsumerConn {
    /// Peer credentials.
    pub creds: PeerCredentials,
    /// The session it is attached to.
    pub session: Option<SessionId>,
    /// Its `ObserveEvents` stream and the event mask.
    observer: Option<(PendingReply, i32)>,
    /// Its `ReadBuffers` stream in progress.
    pub read: Option<ReadStream>,
}

impl ConsumerConn {
    /// A new consumer.
    pub fn new(creds: PeerCredentials) -> Self {
        Self {
            creds,
            session: None,
            observer: None,
            read: None,
        }
    }
}

impl TracingService {
    pub(super) fn consumer(&self, conn: ConnId) -> Option<&ConsumerConn> {
        match self.conns.get(&conn) {
            Some(Endpoint::Consumer(c)) => Some(c),
            _ => None,
        }
    }

    pub(super) fn consumer_mut(&mut self, conn: ConnId) -> Option<&mut ConsumerConn> {
        match self.conns.get_mut(&conn) {
            Some(Endpoint::Consumer(c)) => Some(c),
            _ => None,
        }
    }

    /// Dispatches one `ConsumerPort` call.
    pub fn on_consumer_call(&mut self, conn: ConnId, call: Call<Request>) {
        let Some(consumer) = self.consumer(conn) else {
            return;
        };
        let session = consumer.session;
        let uid = consumer.creds.uid;
        let to = call.reply;
        match call.request {
            Request::EnableTracing(req) => {
                if req.attach_notification_only.unwrap_or(false) {
                    // After Attach: answer when the attached session ends.
                    match session.and_then(|s| self.sessions.get_mut(&s)) {
                        Some(s) => s.enable_reply = Some(to),
                        None => self.reject(conn, &to),
                    }
                    return;
                }
                self.enable_tracing(conn, to, req.trace_config.unwrap_or_default(), call.fd);
            }
            Request::StartTracing(_) => match session {
                Some(sid)
                    if self
                        .sessions
                        .get(&sid)
                        .is_some_and(|s| s.state == SessionState::Configured) =>
                {
                    self.start_tracing(sid);
                    self.reply(conn, &to, &StartTracingResponse {}, false);
                }
                _ => self.reject(conn, &to),
            },
            Request::DisableTracing(_) => {
                if let Some(sid) = session {
                    self.disable_tracing(sid, false);
                }
                self.reply(conn, &to, &DisableTracingResponse {}, false);
            }
            Request::ReadBuffers(_) => self.read_buffers(conn, to),
            Request::FreeBuffers(_) => {
                if let Some(sid) = session {
                    self.free_session(sid);
                }
                self.reply(conn, &to, &FreeBuffersResponse {}, false);
            }
            Request::Flush(req) => match session {
                Some(sid) => self.flush(
                    sid,
                    req.timeout_ms.unwrap_or(0),
                    req.flags.unwrap_or(0),
                    FlushThen::Reply(conn, to),
                ),
                None => self.reject(conn, &to),
            },
            Request::ChangeTraceConfig(req) => {
                let raw = req.trace_config.unwrap_or_default();
                match session.map(|sid| self.change_trace_config(sid, &raw)) {
                    Some(Ok(())) => self.reply(conn, &to, &ChangeTraceConfigResponse {}, false),
                    Some(Err(e)) => {
                        log::info!("consumer {}: ChangeTraceConfig refused: {e}", conn.0);
                        self.reject(conn, &to);
                    }
                    None => self.reject(conn, &to),
                }
            }
            Request::Detach(req) => {
                self.detach(conn, to, session, uid, req.key.unwrap_or_default())
            }
            Request::Attach(req) => {
                self.attach(conn, to, session, uid, req.key.unwrap_or_default())
            }
            Request::GetTraceStats(_) => match session.filter(|s| self.sessions.contains_key(s)) {
                Some(sid) => {
                    let stats = self.trace_stats(sid);
                    self.reply(
                        conn,
                        &to,
                        &GetTraceStatsResponse {
                            trace_stats: Some(stats),
                        },
                        false,
                    );
                }
                None => self.reject(conn, &to),
            },
            Request::ObserveEvents(req) => {
                self.observe_events(conn, to, session, &req.events_to_observe)
            }
            Request::QueryServiceState(req) => {
                self.query_service_state(conn, to, uid, req.sessions_only.unwrap_or(false))
            }
            Request::QueryCapabilities(_) => {
                let caps = TracingServiceCapabilities {
                    has_query_capabilities: Some(true),
                    observable_events: vec![
                        EventType::DataSourcesInstances as i32,
                        EventType::AllDataSourcesStarted as i32,
                        EventType::CloneTriggerHit as i32,
                    ],
                    has_trace_config_output_path: Some(true),
                    has_clone_session: Some(true),
                };
                self.reply(
                    conn,
                    &to,
                    &QueryCapabilitiesResponse {
                        capabilities: Some(caps),
                    },
                    false,
                );
            }
            Request::SaveTraceForBugreport(_) => {
                let resp = SaveTraceForBugreportResponse {
                    success: Some(false),
                    msg: Some(
                        "SaveTraceForBugreport is not supported by the shmtrace service".into(),
                    ),
                };
                self.reply(conn, &to, &resp, false);
            }
            Request::CloneSession(req) => self.clone_session(conn, to, req, call.fd),
        }
    }

    fn detach(
        &mut self,
        conn: ConnId,
        to: PendingReply,
        session: Option<SessionId>,
        uid: u32,
        key: String,
    ) {
        let taken = self
            .sessions
            .values()
            .any(|s| s.consumer_uid == uid && s.detach_key.as_deref() == Some(&key));
        let Some(sid) = session.filter(|_| !taken && !key.is_empty()) else {
            self.reject(conn, &to);
            return;
        };
        if let Some(s) = self.sessions.get_mut(&sid) {
            s.consumer = None;
            s.detach_key = Some(key);
            s.enable_reply = None;
        }
        if let Some(c) = self.consumer_mut(conn) {
            c.session = None;
            c.read = None;
        }
        self.reply(conn, &to, &DetachResponse {}, false);
    }

    fn attach(
        &mut self,
        conn: ConnId,
        to: PendingReply,
        session: Option<SessionId>,
        uid: u32,
        key: String,
    ) {
        let found = self
            .sessions
            .values()
            .find(|s| {
                s.consumer.is_none()
                    && s.consumer_uid == uid
                    && s.detach_key.as_deref() == Some(&key)
            })
            .map(|s| s.id);
        let (Some(sid), None) = (found, session) else {
            self.reject(conn, &to);
            return;
        };
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        s.consumer = Some(conn);
        s.detach_key = None;
        let config = s.raw_config.clone();
        if let Some(c) = self.consumer_mut(conn) {
            c.session = Some(sid);
        }
        self.reply(
            conn,
            &to,
            &AttachResponse {
                trace_config: Some(config),
            },
            false,
        );
    }

    fn observe_events(
        &mut self,
        conn: ConnId,
        to: PendingReply,
        session: Option<SessionId>,
        types: &[i32],
    ) {
        let mask = types.iter().fold(0, |m, t| m | t);
        let previous = self.consumer_mut(conn).and_then(|c| c.observer.take());
        if let Some((old, _)) = previous {
            self.reply(conn, &old, &ObserveEventsResponse::default(), false);
        }
        if mask == 0 {
            self.reply(conn, &to, &ObserveEventsResponse::default(), false);
            return;
        }
        if let Some(c) = self.consumer_mut(conn) {
            c.observer = Some((to, mask));
        }
        let all_started = session
            .and_then(|s| self.sessions.get(&s))
            .is_some_and(|s| s.all_started_reported);
        if all_started {
            self.send_event(
                conn,
                EventType::AllDataSourcesStarted,
                ObservableEvents {
                    all_data_sources_started: Some(true),
                    ..Default::default()
                },
            );
        }
    }

    pub(super) fn send_event(&mut self, conn: ConnId, kind: EventType, events: ObservableEvents) {
        let Some((to, mask)) = self.consumer(conn).and_then(|c| c.observer.clone()) else {
            return;
        };
        if mask & kind as i32 == 0 {
            return;
        }
        self.reply(
            conn,
            &to,
            &ObserveEventsResponse {
                events: Some(events),
            },
            true,
        );
    }

    /// Reports an instance state change to the session's observer
    /// (configured instances are reported as stopped, like upstream).
    pub(super) fn notify_instance_state(
        &mut self,
        sid: SessionId,
        producer: ProducerId,
        ds: &str,
        started: bool,
    ) {
        let Some(conn) = self.sessions.get(&sid).and_then(|s| s.consumer) else {
            return;
        };
        let producer_name = self
            .producers
            .get(&producer)
            .map(|p| p.name.clone())
            .unwrap_or_default();
        let state = if started {
            DataSourceInstanceState::Started
        } else {
            DataSourceInstanceState::Stopped
        };
        let change = DataSourceInstanceStateChange {
            producer_name: Some(producer_name),
            data_source_name: Some(ds.to_owned()),
            state: Some(state as i32),
        };
        let events = ObservableEvents {
            instance_state_changes: vec![change],
            ..Default::default()
        };
        self.send_event(conn, EventType::DataSourcesInstances, events);
    }

    /// Reports that every instance of the session started.
    pub(super) fn notify_all_started(&mut self, sid: SessionId) {
        let Some(conn) = self.sessions.get(&sid).and_then(|s| s.consumer) else {
            return;
        };
        let events = ObservableEvents {
            all_data_sources_started: Some(true),
            ..Default::default()
        };
        self.send_event(conn, EventType::AllDataSourcesStarted, events);
    }

    fn query_service_state(
        &mut self,
        conn: ConnId,
        to: PendingReply,
        uid: u32,
        sessions_only: bool,
    ) {
        let mut state = TracingServiceState {
            supports_tracing_sessions: Some(true),
            num_sessions: Some(self.sessions.len() as i32),
            num_sessions_started: Some(
                self.sessions
                    .values()
                    .filter(|s| s.state == SessionState::Started)
                    .count() as i32,
            ),
            tracing_service_version: Some(self.cfg.version.clone()),
            ..TracingServiceState::default()
        };
        if !sessions_only {
            for (&id, p) in &self.producers {
                state.producers.push(tss::Producer {
                    id: Some(i32::from(id)),
                    name: Some(p.name.clone()),
                    pid: Some(p.pid),
                    uid: Some(p.uid as i32),
                    sdk_version: Some(p.sdk_version.clone()).filter(|v| !v.is_empty()),
                    // A relayed producer's machine, as a relay announced
                    // it; none for this machine's (upstream since v56,
                    // src/tracing/service/tracing_service_endpoints_impl.cc).
                    machine_id: Some(p.machine.id).filter(|&m| m != 0),
                    machine_name: Some(p.machine.name.clone())
                        .filter(|n| p.machine.id != 0 && !n.is_empty()),
                    ..tss::Producer::default()
                });
                for d in &p.data_sources {
                    state.data_sources.push(tss::DataSource {
                        ds_descriptor: Some(d.clone()),
                        producer_id: Some(i32::from(id)),
                    });
                }
            }
        }
        for s in self
            .sessions
            .values()
            .filter(|s| uid == 0 || s.consumer_uid == uid)
        {
            state.tracing_sessions.push(tss::TracingSession {
                id: Some(s.id),
                consumer_uid: Some(s.consumer_uid as i32),
                state: Some(s.state.name().to_owned()),
                unique_session_name: s.config.unique_session_name.clone(),
                buffer_size_kb: s
                    .config
                    .buffers
                    .iter()
                    .map(|b| b.size_kb.unwrap_or(0))
                    .collect(),
                duration_ms: s.config.duration_ms,
                num_data_sources: Some(s.instances.len() as u32),
                start_realtime_ns: s.start_realtime_ns,
                // For `perfetto --clone-all-for-bugreport`, which clones the
                // sessions with a score above 0.
                bugreport_score: s.config.bugreport_score,
                bugreport_filename: s.config.bugreport_filename.clone(),
                is_started: Some(s.state == SessionState::Started),
            });
        }
        // Split the data sources over several replies if the whole state
        // would not fit one; the client concatenates the replies.
        // (A queue: taking from the front of a Vec would be quadratic in
        // the number of data sources, which hostile producers choose.)
        let mut replies = Vec::new();
        let mut rest = std::collections::VecDeque::from(std::mem::take(&mut state.data_sources));
        loop {
            let mut part = TracingServiceState {
                data_sources: Vec::new(),
                ..state.clone()
            };
            if !replies.is_empty() {
                part = TracingServiceState::default();
            }
            let base = crate::protos::to_raw(&QueryServiceStateResponse {
                service_state: Some(part.clone()),
            })
            .len();
            let mut size = base;
            while let Some(d) = rest.front() {
                let len = crate::protos::to_raw(d).len() + 8;
                if size + len > QUERY_STATE_CHUNK && !part.data_sources.is_empty() {
                    break;
                }
                size += len;
                part.data_sources.extend(rest.pop_front());
            }
            replies.push(part);
            if rest.is_empty() {
                break;
            }
        }
        let last = replies.len() - 1;
        for (i, part) in replies.into_iter().enumerate() {
            self.reply(
                conn,
                &to,
                &QueryServiceStateResponse {
                    service_state: Some(part),
                },
                i != last,
            );
        }
    }

    /// The `TraceStats` of a session.
    pub(super) fn trace_stats(&self, sid: SessionId) -> crate::protos::TraceStats {
        use crate::protos::trace_stats::BufferStats as P;
        let Some(s) = self.sessions.get(&sid) else {
            return Default::default();
        };
        let buffer_stats = s
            .buffers
            .iter()
            .filter_map(|b| self.buffers.get(b))
            .map(|(_, buf)| {
                let x = buf.stats();
                P {
                    buffer_size: Some(x.buffer_size),
                    bytes_written: Some(x.bytes_written),
                    bytes_overwritten: Some(x.bytes_overwritten),
                    bytes_read: Some(x.bytes_read),
                    padding_bytes_written: Some(x.padding_bytes_written),
                    padding_bytes_cleared: Some(x.padding_bytes_cleared),
                    chunks_written: Some(x.chunks_written),
                    chunks_rewritten: Some(x.chunks_rewritten),
                    chunks_relocated: Some(x.chunks_relocated),
                    chunks_overwritten: Some(x.chunks_overwritten),
                    chunks_discarded: Some(x.chunks_discarded),
                    chunks_read: Some(x.chunks_read),
                    chunks_committed_out_of_order: Some(x.chunks_committed_out_of_order),
                    write_wrap_count: Some(x.write_wrap_count),
                    patches_succeeded: Some(x.patches_succeeded),
                    patches_failed: Some(x.patches_failed),
                    readaheads_succeeded: Some(x.readaheads_succeeded),
                    readaheads_failed: Some(x.readaheads_failed),
                    abi_violations: Some(x.abi_violations),
                    trace_writer_packet_loss: Some(x.trace_writer_packet_loss),
                    ..P::default()
                }
            })
            .collect();
        let data_sources: usize = self.producers.values().map(|p| p.data_sources.len()).sum();
        let writer_stats = if s.builtin().disable_chunk_usage_histograms.unwrap_or(false) {
            Vec::new()
        } else {
            self.writer_stats(s)
        };
        let chunk_payload_histogram_def = if writer_stats.is_empty() {
            Vec::new()
        } else {
            BUCKET_BOUNDS.to_vec()
        };
        crate::protos::TraceStats {
            buffer_stats,
            chunk_payload_histogram_def,
            writer_stats,
            producers_connected: Some(self.producers.len() as u32),
            producers_seen: Some(self.stats.producers_seen),
            data_sources_registered: Some(data_sources as u32),
            data_sources_seen: Some(self.stats.data_sources_seen),
            tracing_sessions: Some(self.sessions.len() as u32),
            total_buffers: Some(self.buffers.len() as u32),
            chunks_discarded: Some(self.stats.chunks_discarded),
            patches_discarded: Some(self.stats.patches_discarded),
            invalid_packets: Some(s.invalid_packets),
            flushes_requested: Some(s.flushes_requested),
            flushes_succeeded: Some(s.flushes_succeeded),
            flushes_failed: Some(s.flushes_failed),
            final_flush_outcome: s.final_flush_outcome,
            filter_stats: s.filter.as_ref().map(|f| f.stats().to_proto()),
        }
    }

    /// `TraceStats.writer_stats` of session `s`: per buffer (by index in the
    /// session), each writer's chunk payload histogram, under the packet
    /// sequence id its packets carry in the trace. A writer none of whose
    /// packets reached the trace has no sequence id there and is left out.
    fn writer_stats(&self, s: &Session) -> Vec<crate::protos::trace_stats::WriterStats> {
        let mut out = Vec::new();
        for (index, b) in s.buffers.iter().enumerate() {
            let Some((_, buf)) = self.buffers.get(b) else {
                continue;
            };
            for (producer, writer, h) in buf.writer_stats().iter() {
                let Some(&id) = s.sequence_ids.get(&(producer, writer)) else {
                    continue;
                };
                out.push(crate::protos::trace_stats::WriterStats {
                    sequence_id: Some(u64::from(id)),
                    buffer: Some(index as u32),
                    chunk_payload_histogram_counts: h.counts.to_vec(),
                    chunk_payload_histogram_sum: h.sums.to_vec(),
                });
            }
        }
        out
    }

    /// A consumer connection closed: its session is freed unless detached.
    pub(super) fn consumer_gone(&mut self, conn: ConnId, c: ConsumerConn) {
        // A flush it asked for before it detached answers nobody now.
        for s in self.sessions.values_mut() {
            for f in s.flushes.values_mut() {
                if matches!(f.then, FlushThen::Reply(c, _) if c == conn) {
                    f.then = FlushThen::Nothing;
                }
            }
        }
        if let Some(sid) = c.session {
            let attached = self
                .sessions
                .get(&sid)
                .is_some_and(|s| s.consumer.is_some());
            if attached {
                if let Some(s) = self.sessions.get_mut(&sid) {
                    s.consumer = None;
                    s.enable_reply = None;
                }
                self.free_session(sid);
            }
        }
    }

    /// Sessions by id, for tests.
    #[cfg(test)]
    pub(super) fn session_states(&self) -> std::collections::BTreeMap<SessionId, SessionState> {
        self.sessions.iter().map(|(&id, s)| (id, s.state)).collect()
    }
}
