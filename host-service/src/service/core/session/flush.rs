//! Flushes: `Flush` requests to the producers, their acknowledgements and
//! timeouts, and incremental state clearing.

use std::collections::BTreeMap;

use super::{
    flush_flags, FlushThen, InstanceState, Lifecycle, PendingFlush, SessionState, SlowDataSources,
    MAX_LISTED_DATA_SOURCES, MAX_PENDING_FLUSHES,
};
use crate::protos::get_async_command_response::{self as cmd, Cmd};
use crate::protos::FlushResponse;
use crate::service::core::timers::Timer;
use crate::service::core::{BufferId, ProducerId, SessionId, TracingService};

impl TracingService {
    /// Starts a flush of every instance of the session (upstream:
    /// `TracingServiceImpl::Flush`, src/tracing/service/tracing_service_impl.cc).
    pub(in crate::service::core) fn flush(
        &mut self,
        sid: SessionId,
        timeout_ms: u32,
        flags: u64,
        then: FlushThen,
    ) {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            if let FlushThen::Reply(conn, to) = then {
                self.reject(conn, &to);
            }
            return;
        };
        if s.state == SessionState::Started && s.flushes.len() < MAX_PENDING_FLUSHES {
            s.event(now, Lifecycle::FlushStarted);
        }
        let mut per_producer: BTreeMap<ProducerId, Vec<u64>> = BTreeMap::new();
        for inst in s
            .instances
            .iter()
            .filter(|i| i.state != InstanceState::Stopped)
        {
            let ids = per_producer.entry(inst.producer).or_default();
            if !inst.no_flush {
                ids.push(inst.id);
            }
        }
        // A producer whose instances all have `no_flush` is asked only if
        // the service cannot scrape it: an emulated producer with scraping
        // enabled gets an empty request so that it scrapes itself, and its
        // ack, sent after the chunks it committed before, orders them
        // before the flush completes (upstream: `TracingServiceImpl::Flush`).
        per_producer.retain(|p, ids| {
            self.producers
                .get(p)
                .is_some_and(|p| !ids.is_empty() || (p.emulated && p.scraping))
        });
        self.flush_instances(sid, timeout_ms, flags, per_producer, then);
    }

    /// Starts a flush of the instances that write into `buffers`, for a
    /// clone (upstream: `GetFlushableDataSourceInstancesForBuffers`,
    /// src/tracing/service/tracing_service_impl.cc); `then` is the clone's
    /// [`FlushThen::Clone`].
    pub(in crate::service::core) fn flush_buffers(
        &mut self,
        sid: SessionId,
        buffers: &[BufferId],
        flags: u64,
        then: FlushThen,
    ) {
        let mut per_producer: BTreeMap<ProducerId, Vec<u64>> = BTreeMap::new();
        if let Some(s) = self.sessions.get(&sid) {
            for inst in s.instances.iter().filter(|i| {
                i.state != InstanceState::Stopped && !i.no_flush && buffers.contains(&i.buffer)
            }) {
                per_producer.entry(inst.producer).or_default().push(inst.id);
            }
        }
        per_producer.retain(|p, _| self.producers.contains_key(p));
        self.flush_instances(sid, 0, flags, per_producer, then);
    }

    /// Sends `Flush` to each producer of `per_producer` and arms the
    /// timeout (upstream: `TracingServiceImpl::FlushDataSourceInstances`,
    /// src/tracing/service/tracing_service_impl.cc). A session not started
    /// (or with too many flushes pending) fails the flush at once.
    fn flush_instances(
        &mut self,
        sid: SessionId,
        timeout_ms: u32,
        flags: u64,
        per_producer: BTreeMap<ProducerId, Vec<u64>>,
        then: FlushThen,
    ) {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if s.state != SessionState::Started || s.flushes.len() >= MAX_PENDING_FLUSHES {
            match then {
                FlushThen::Nothing => s.flushes_failed += 1,
                FlushThen::Reply(conn, to) => {
                    s.flushes_failed += 1;
                    self.reject(conn, &to);
                }
                FlushThen::Disable => {
                    s.flushes_failed += 1;
                    self.disable_tracing(sid, false);
                }
                FlushThen::Clone { clone, group } => {
                    self.clone_flush_done(sid, clone, group, false);
                }
            }
            return;
        }
        self.last_flush_id += 1;
        let flush_id = self.last_flush_id;
        let timeout = if timeout_ms > 0 {
            u64::from(timeout_ms)
        } else {
            s.flush_timeout_ms()
        };
        s.flushes_requested += 1;
        s.last_flush_slow.clear();
        s.flushes.insert(
            flush_id,
            PendingFlush {
                pending: per_producer.keys().copied().collect(),
                flags,
                then,
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
    pub(in crate::service::core) fn flush_acked(&mut self, producer: ProducerId, flush_id: u64) {
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
    pub(in crate::service::core) fn complete_flush(
        &mut self,
        sid: SessionId,
        flush_id: u64,
        success: bool,
    ) {
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
        let disable_after = matches!(f.then, FlushThen::Disable);
        if disable_after {
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
        match f.then {
            FlushThen::Nothing => {}
            FlushThen::Reply(conn, to) if success => {
                self.reply(conn, &to, &FlushResponse {}, false)
            }
            FlushThen::Reply(conn, to) => self.reject(conn, &to),
            FlushThen::Disable => self.disable_tracing(sid, false),
            FlushThen::Clone { clone, group } => self.clone_flush_done(sid, clone, group, success),
        }
    }

    /// A stop's or a clone's flush timed out: notes a
    /// `last_flush_slow_data_sources` event naming the data sources of the
    /// producers it waited for (upstream: `OnFlushTimeout`, which counts a
    /// producer and each of its data sources against
    /// [`MAX_LISTED_DATA_SOURCES`]).
    pub(in crate::service::core) fn note_slow_flush(&mut self, sid: SessionId, flush_id: u64) {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let Some(f) = s.flushes.get(&flush_id) else {
            return;
        };
        let reason = f.flags & 0xF;
        if reason != flush_flags::REASON_TRACE_STOP && reason != flush_flags::REASON_TRACE_CLONE {
            return;
        }
        let mut sources = Vec::new();
        let mut listed = 0;
        'producers: for p in &f.pending {
            let Some(producer) = self.producers.get(p) else {
                continue;
            };
            listed += 1;
            if listed > MAX_LISTED_DATA_SOURCES {
                break;
            }
            for i in s.instances.iter().filter(|i| i.producer == *p) {
                sources.push((producer.name.clone(), i.name.clone()));
                listed += 1;
                if listed > MAX_LISTED_DATA_SOURCES {
                    break 'producers;
                }
            }
        }
        s.last_flush_slow.push(SlowDataSources { at: now, sources });
    }

    /// Sends `ClearIncrementalState` for the instances that handle it.
    pub(super) fn clear_incremental_state(&mut self, sid: SessionId) {
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
}
