//! Session cloning: `ConsumerPort.CloneSession` (upstream:
//! `TracingServiceImpl::FlushAndCloneSession`, `OnFlushDoneForClone`,
//! `DoCloneBuffers` and `FinishCloneSession` in
//! src/tracing/service/tracing_service_impl.cc).
//!
//! A consumer with no session of its own asks for a snapshot of a session,
//! by id or by `unique_session_name`; id `u64::MAX` means the started
//! session with the highest `bugreport_score` above 0. Root may clone any
//! session, others only their uid's. Then:
//!
//! 1. Buffers with `clear_before_clone` that ever held data are replaced by
//!    empty ones; a `write_into_file` session's file so far is copied to the
//!    descriptor the request carried (any other session ignores it), unless
//!    that descriptor is the session's own file (same device and inode):
//!    that is refused, as the snapshot would overwrite the trace being
//!    written (upstream does not check).
//! 2. The source records `flush_started` (with a clock snapshot) and two
//!    flushes go out, reason `TraceClone` (clone target bugreport if asked):
//!    one for the instances writing into `transfer_on_clone` buffers, one for
//!    the rest, so that slow ones do not hold back the others.
//! 3. When a group's flush is over (acknowledged, timed out, or failed at
//!    once because the source is not started), that group's buffers are
//!    copied read-only ([`TraceBuffer::clone_read_only`]), or moved and
//!    replaced by empty ones for `transfer_on_clone`. A flush that failed
//!    makes the clone's `final_flush_outcome` FAILED; the clone goes on.
//! 4. With both groups copied, the copies become a new session in state
//!    `CLONED_READ_ONLY` owned by the caller: the source's config, stats,
//!    unemitted lifecycle events and clock snapshots, the triggers it
//!    received (moved: the source is left with none, and a source whose
//!    triggers gate its data then reads as waiting for one, as upstream's),
//!    the CLONE_SNAPSHOT trigger that asked for the clone, and a new UUID
//!    keeping the source's lsb. Its trace adds `clone_started`, one `buffer_cloned` per buffer and
//!    `tracing_disabled`. A clone of a `write_into_file` session is written
//!    to the caller's descriptor at once.
//! 5. The deferred `CloneSessionResponse` answers the call.
//!
//! The source keeps running, changed only by the flushes, the moved
//! buffers and the moved triggers.
//!
//! # Hostile or vanishing peers
//!
//! A clone in progress belongs to its source session and names its caller
//! by connection id (never reused). The caller hanging up drops its pending
//! clones and their copies at once; the source being freed answers them
//! with "Original session ended". A flush that never completes ends at its
//! timeout, so a clone waits at most the flush timeout.
//!
//! # Memory
//!
//! Unlike upstream (whose guardrail is the process's memory), a clone
//! counts against the service's limits like a new session: sessions plus
//! clones in progress stay within `MAX_SESSIONS` (and `MAX_SESSIONS_PER_UID`
//! per uid), and every buffer, including copies held by clones in
//! progress, within [`ServiceConfig::max_buffer_bytes`](super::ServiceConfig).
//! The limit is checked when the clone is asked for and again before each
//! copy, so clones started together cannot overshoot it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::OwnedFd;

use super::filter::SessionFilter;
use super::session::{
    flush_flags, FileSink, FlushThen, Lifecycle, Session, SessionState, MAX_SESSIONS,
    MAX_SESSIONS_PER_UID,
};
use super::triggers::ReceivedTrigger;
use super::{BufferId, CloneError, ConnId, SessionId, TracingService};
use crate::ipc::PendingReply;
use crate::protos::trace_stats::FinalFlushOutcome;
use crate::protos::{CloneSessionRequest, CloneSessionResponse};
use crate::service::buffer::TraceBuffer;
use crate::service::env::{FileTarget, Nanos, TraceFile};

/// `CloneSessionRequest.session_id` asking for the session with the
/// highest `bugreport_score`.
pub const BUGREPORT_SESSION_ID: SessionId = u64::MAX;

/// A clone waiting for the flushes of its source.
#[derive(Debug)]
pub struct PendingClone {
    /// The consumer that asked.
    consumer: ConnId,
    /// Its `CloneSession` call.
    reply: PendingReply,
    /// Buffer ids of the two flush groups: `transfer_on_clone` buffers,
    /// then the others.
    groups: [Vec<BufferId>; 2],
    /// Groups whose flush is not over yet.
    groups_pending: usize,
    /// The copies, by buffer index in the source.
    buffers: Vec<Option<TraceBuffer>>,
    /// When each buffer was copied.
    cloned_at: Vec<Nanos>,
    /// Some flush failed or timed out.
    flush_failed: bool,
    /// When the clone began.
    started_at: Nanos,
    /// The CLONE_SNAPSHOT trigger that asked for it.
    trigger: Option<ReceivedTrigger>,
    /// Where a clone of a `write_into_file` session goes (the source's file
    /// so far is in it already).
    file: Option<Box<dyn TraceFile>>,
    /// The clone reads unfiltered (`skip_trace_filter`, or a clone of
    /// the bugreport session by its magic id).
    skip_trace_filter: bool,
}

impl PendingClone {
    /// Bytes its copies take.
    fn held_bytes(&self) -> u64 {
        self.buffers
            .iter()
            .flatten()
            .map(|b| b.stats().buffer_size)
            .sum()
    }
}

/// A random version 4 UUID's msb (the lsb's variant bits are the caller's).
pub(super) fn uuid_v4_msb(random: u64) -> i64 {
    ((random & !0xF000) | 0x4000) as i64
}

impl TracingService {
    /// Sessions, and clones in progress (each becomes one), held in all
    /// and by `uid`: what `MAX_SESSIONS` and `MAX_SESSIONS_PER_UID` bound,
    /// for EnableTracing as for CloneSession.
    pub(super) fn sessions_held(&self, uid: u32) -> (usize, usize) {
        let pending = self
            .sessions
            .values()
            .flat_map(|s| s.pending_clones.values());
        let all = self.sessions.len() + pending.clone().count();
        let of_uid = self
            .sessions
            .values()
            .filter(|s| s.consumer_uid == uid)
            .count()
            + pending
                .filter(|p| {
                    self.consumer(p.consumer)
                        .is_some_and(|c| c.creds.uid == uid)
                })
                .count();
        (all, of_uid)
    }

    /// `ConsumerPort.CloneSession`; answered once the clone is done (or at
    /// once if it cannot start).
    pub(super) fn clone_session(
        &mut self,
        conn: ConnId,
        to: PendingReply,
        req: CloneSessionRequest,
        fd: Option<OwnedFd>,
    ) {
        if let Err(e) = self.start_clone(conn, &to, req, fd) {
            log::info!("consumer {}: CloneSession refused: {e}", conn.0);
            self.answer_clone(conn, &to, Err(e));
        }
    }

    fn start_clone(
        &mut self,
        conn: ConnId,
        to: &PendingReply,
        req: CloneSessionRequest,
        fd: Option<OwnedFd>,
    ) -> Result<(), CloneError> {
        use crate::protos::clone_session_request::Selector;
        let Some(uid) = self.consumer(conn).map(|c| c.creds.uid) else {
            return Ok(());
        };
        let mut for_bugreport = req.for_bugreport.unwrap_or(false);
        let mut skip_trace_filter = req.skip_trace_filter.unwrap_or(false);
        let sid = match req.selector {
            Some(Selector::SessionId(BUGREPORT_SESSION_ID)) => {
                for_bugreport = true;
                skip_trace_filter = true;
                self.max_bugreport_session()
                    .ok_or(CloneError::NoBugreportSession)?
            }
            Some(Selector::SessionId(id)) if id != 0 => id,
            Some(Selector::UniqueSessionName(name)) if !name.is_empty() => self
                .sessions
                .values()
                .find(|s| {
                    s.state != SessionState::ClonedReadOnly
                        && s.config.unique_session_name.as_deref() == Some(name.as_str())
                })
                .map(|s| s.id)
                .ok_or(CloneError::NotFound)?,
            _ => return Err(CloneError::NotFound),
        };
        let src = self.sessions.get(&sid).ok_or(CloneError::NotFound)?;
        if uid != 0 && uid != src.consumer_uid {
            return Err(CloneError::NotAllowed);
        }
        let (all, of_uid) = self.sessions_held(uid);
        if all >= MAX_SESSIONS {
            return Err(CloneError::TooManySessions);
        }
        if of_uid >= MAX_SESSIONS_PER_UID {
            return Err(CloneError::TooManySessionsForUid(uid));
        }
        let src_buffers = src.buffers.clone();
        let asked = self.buffers_bytes(&src_buffers);
        self.check_buffer_memory(asked)?;
        // The descriptor is for a write_into_file source only.
        let writes_file = self.sessions.get(&sid).is_some_and(|s| s.file.is_some());
        let file = match fd {
            _ if !writes_file => None,
            None => return Err(CloneError::NoOutputDescriptor),
            Some(fd) => {
                let own = self.sessions.get(&sid).and_then(|s| s.file.as_ref());
                if own.is_some_and(|sink| sink.file.is_same_file(&fd)) {
                    return Err(CloneError::OutputIsSessionFile);
                }
                let mut out = self
                    .env
                    .open_trace_file(FileTarget::Fd(fd))
                    .map_err(CloneError::CopyFile)?;
                if let Some(sink) = self.sessions.get_mut(&sid).and_then(|s| s.file.as_mut()) {
                    sink.file.copy_to(&mut *out).map_err(CloneError::CopyFile)?;
                }
                Some(out)
            }
        };
        let now = self.now();
        let snapshot = self.env.clock_snapshot();
        let Some(src) = self.sessions.get_mut(&sid) else {
            return Err(CloneError::NotFound);
        };
        // clear_before_clone: what is left in those buffers goes.
        for (b, id) in src.config.buffers.iter().zip(&src.buffers) {
            if !b.clear_before_clone.unwrap_or(false) {
                continue;
            }
            if let Some((_, buf)) = self.buffers.get_mut(id).filter(|(_, buf)| buf.has_data()) {
                if let Ok(fresh) = TraceBuffer::new(buf.stats().buffer_size as usize, buf.policy())
                {
                    *buf = fresh;
                }
            }
        }
        let mut groups: [Vec<BufferId>; 2] = [Vec::new(), Vec::new()];
        for (b, &id) in src.config.buffers.iter().zip(&src.buffers) {
            let transfer = b.transfer_on_clone.unwrap_or(false);
            groups[usize::from(!transfer)].push(id);
        }
        self.last_clone_id += 1;
        let clone = self.last_clone_id;
        let trigger = req
            .clone_trigger_name
            .filter(|n| !n.is_empty())
            .map(|name| ReceivedTrigger {
                time: req.clone_trigger_boot_time_ns.unwrap_or(0),
                name,
                producer_name: req.clone_trigger_producer_name.unwrap_or_default(),
                producer_uid: req.clone_trigger_trusted_producer_uid.unwrap_or(0) as u32,
                stop_delay_ms: u32::try_from(req.clone_trigger_delay_ms.unwrap_or(0))
                    .unwrap_or(u32::MAX),
            });
        src.event(now, Lifecycle::FlushStarted);
        if !src.builtin().disable_clock_snapshotting.unwrap_or(false) {
            src.add_snapshot(snapshot);
        }
        src.pending_clones.insert(
            clone,
            PendingClone {
                consumer: conn,
                reply: to.clone(),
                groups: groups.clone(),
                groups_pending: groups.len(),
                buffers: (0..src_buffers.len()).map(|_| None).collect(),
                cloned_at: vec![0; src_buffers.len()],
                flush_failed: false,
                started_at: now,
                trigger,
                file,
                skip_trace_filter,
            },
        );
        let mut flags = flush_flags::INITIATOR_TRACED | flush_flags::REASON_TRACE_CLONE;
        if for_bugreport {
            flags |= flush_flags::CLONE_TARGET_BUGREPORT;
        }
        for (group, ids) in groups.iter().enumerate() {
            // A group's flush may end at once and its copy fail the clone:
            // then no flush for the next group.
            let pending = self.sessions.get(&sid);
            if !pending.is_some_and(|s| s.pending_clones.contains_key(&clone)) {
                break;
            }
            self.flush_buffers(sid, ids, flags, FlushThen::Clone { clone, group });
        }
        Ok(())
    }

    /// The started session with the highest `bugreport_score` above 0 (the
    /// first of equals).
    fn max_bugreport_session(&self) -> Option<SessionId> {
        let mut best: Option<(i32, SessionId)> = None;
        for s in self.sessions.values() {
            let score = s.config.bugreport_score.unwrap_or(0);
            if score <= 0 || s.state != SessionState::Started {
                continue;
            }
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, s.id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// Bytes of the buffers `ids`.
    fn buffers_bytes(&self, ids: &[BufferId]) -> u64 {
        ids.iter()
            .filter_map(|id| self.buffers.get(id))
            .map(|(_, b)| b.stats().buffer_size)
            .sum()
    }

    /// Bytes all buffers take: the sessions' and the copies clones in
    /// progress hold.
    pub(super) fn buffer_bytes_held(&self) -> u64 {
        let sessions: u64 = self
            .buffers
            .values()
            .map(|(_, b)| b.stats().buffer_size)
            .sum();
        let clones: u64 = self
            .sessions
            .values()
            .flat_map(|s| s.pending_clones.values())
            .map(PendingClone::held_bytes)
            .sum();
        sessions + clones
    }

    fn check_buffer_memory(&self, asked: u64) -> Result<(), CloneError> {
        let held = self.buffer_bytes_held();
        let limit = self.cfg.max_buffer_bytes;
        if held + asked > limit {
            return Err(CloneError::BufferMemory { asked, held, limit });
        }
        Ok(())
    }

    /// The flush of `group` of clone `clone` of session `sid` is over:
    /// copies that group's buffers, and finishes the clone after the last
    /// group.
    pub(super) fn clone_flush_done(
        &mut self,
        sid: SessionId,
        clone: u64,
        group: usize,
        success: bool,
    ) {
        let now = self.now();
        let Some(ids) = self
            .sessions
            .get(&sid)
            .and_then(|s| s.pending_clones.get(&clone))
            .and_then(|op| op.groups.get(group).cloned())
        else {
            // The caller left, or the source was freed.
            return;
        };
        let copied = self
            .check_buffer_memory(self.buffers_bytes(&ids))
            .map(|()| self.copy_buffers(sid, clone, &ids, now));
        let Some(src) = self.sessions.get_mut(&sid) else {
            return;
        };
        let Some(op) = src.pending_clones.get_mut(&clone) else {
            return;
        };
        op.flush_failed |= !success;
        op.groups_pending = op.groups_pending.saturating_sub(1);
        if copied.is_ok() && op.groups_pending > 0 {
            return;
        }
        let Some(op) = src.pending_clones.remove(&clone) else {
            return;
        };
        let (conn, to) = (op.consumer, op.reply.clone());
        if self.consumer(conn).is_none() {
            return;
        }
        let result = copied.and_then(|()| self.finish_clone(sid, op));
        match &result {
            Ok((new, ..)) => log::info!(
                "consumer {}: session {sid} cloned as session {new} (flushes {})",
                conn.0,
                if success { "succeeded" } else { "failed" }
            ),
            Err(e) => log::info!("consumer {}: cloning session {sid} failed: {e}", conn.0),
        }
        self.answer_clone(conn, &to, result.map(|(_, uuid, wif)| (uuid, wif)));
    }

    /// Copies (or, for `transfer_on_clone`, moves) buffers `ids` of session
    /// `sid` into pending clone `clone` (upstream: `DoCloneBuffers`).
    fn copy_buffers(&mut self, sid: SessionId, clone: u64, ids: &[BufferId], now: Nanos) {
        let Some(src) = self.sessions.get_mut(&sid) else {
            return;
        };
        let Some(op) = src.pending_clones.get_mut(&clone) else {
            return;
        };
        for (index, (config, id)) in src.config.buffers.iter().zip(&src.buffers).enumerate() {
            if !ids.contains(id) {
                continue;
            }
            let Some((_, buf)) = self.buffers.get_mut(id) else {
                continue;
            };
            let copy = if config.transfer_on_clone.unwrap_or(false) {
                match TraceBuffer::new(buf.stats().buffer_size as usize, buf.policy()) {
                    Ok(fresh) => std::mem::replace(buf, fresh),
                    Err(_) => buf.clone_read_only(),
                }
            } else {
                buf.clone_read_only()
            };
            if let Some(slot) = op.buffers.get_mut(index) {
                *slot = Some(copy);
            }
            if let Some(t) = op.cloned_at.get_mut(index) {
                *t = now;
            }
        }
    }

    /// Makes the cloned session of `op` (upstream: `FinishCloneSession`):
    /// its id, UUID and whether it was written to the caller's file.
    fn finish_clone(
        &mut self,
        src_sid: SessionId,
        op: PendingClone,
    ) -> Result<(SessionId, (i64, i64), bool), CloneError> {
        let now = self.now();
        let snapshot = self.env.clock_snapshot();
        let msb = uuid_v4_msb(self.env.random_u64());
        let consumer = self.consumer(op.consumer).ok_or(CloneError::SourceEnded)?;
        if consumer.session.is_some() {
            return Err(CloneError::AlreadyAttached);
        }
        let consumer_uid = consumer.creds.uid;
        let copies: Vec<TraceBuffer> = op.buffers.into_iter().flatten().collect();
        let free_ids = usize::from(u16::MAX) - self.buffers.len();
        if copies.len() > free_ids {
            return Err(CloneError::NoBufferIds);
        }
        let src = self
            .sessions
            .get_mut(&src_sid)
            .ok_or(CloneError::SourceEnded)?;
        self.last_session_id += 1;
        let id = self.last_session_id;
        let triggers = src.triggers.take_for_clone();
        let mut events: Vec<(Nanos, Lifecycle, bool)> = src
            .events
            .iter()
            .filter(|(_, _, emitted)| !emitted)
            .copied()
            .collect();
        events.push((op.started_at, Lifecycle::CloneStarted, false));
        events.extend(
            op.cloned_at
                .iter()
                .enumerate()
                .map(|(i, &t)| (t, Lifecycle::BufferCloned(i as u32), false)),
        );
        let outcome = if op.flush_failed {
            FinalFlushOutcome::FinalFlushFailed
        } else {
            FinalFlushOutcome::FinalFlushSucceeded
        };
        let was_write_into_file = op.file.is_some();
        let mut session = Session {
            id,
            consumer: Some(op.consumer),
            consumer_uid,
            detach_key: None,
            config: src.config.clone(),
            raw_config: src.raw_config.clone(),
            state: SessionState::ClonedReadOnly,
            buffers: Vec::with_capacity(copies.len()),
            instances: Vec::new(),
            enable_reply: None,
            error: None,
            flushes: BTreeMap::new(),
            stop_epoch: 0,
            sequence_ids: HashMap::new(),
            last_sequence: None,
            identities: src.identities.clone(),
            events,
            initial_snapshot: src.initial_snapshot.clone(),
            snapshots: src.snapshots.clone(),
            preamble_done: false,
            sync_due: false,
            stats_due: true,
            uuid: (msb, src.uuid.1),
            file: op.file.map(|file| FileSink {
                file,
                written: 0,
                max_size: 0,
                closed: false,
            }),
            invalid_packets: src.invalid_packets,
            flushes_requested: src.flushes_requested,
            flushes_succeeded: src.flushes_succeeded,
            flushes_failed: src.flushes_failed,
            final_flush_outcome: Some(outcome as i32),
            all_started_reported: false,
            // Its source's start (upstream derives it from the copied
            // initial clock snapshot).
            start_realtime_ns: src.start_realtime_ns,
            regexes: Vec::new(),
            // Upstream's clone for a bugreport skips the filter
            // (`skip_trace_filter`); the filter counts anew.
            filter: src
                .filter
                .as_ref()
                .filter(|_| !op.skip_trace_filter)
                .map(|f| SessionFilter::new(f.shared())),
            triggers,
            machines_described: BTreeSet::new(),
            machines_synced: BTreeSet::new(),
            pending_clones: BTreeMap::new(),
            clone_trigger: op.trigger,
            slow_start: src.slow_start.clone(),
            last_flush_slow: src.last_flush_slow.clone(),
        };
        session.event(now, Lifecycle::TracingDisabled);
        if !session
            .builtin()
            .disable_clock_snapshotting
            .unwrap_or(false)
        {
            session.add_snapshot(snapshot);
        }
        let uuid = session.uuid;
        for mut buf in copies {
            buf.set_read_only();
            let buffer = self.alloc_buffer_id();
            self.buffers.insert(buffer, (id, buf));
            session.buffers.push(buffer);
        }
        self.sessions.insert(id, session);
        if let Some(c) = self.consumer_mut(op.consumer) {
            c.session = Some(id);
        }
        if was_write_into_file {
            self.drain_to_file(id, true);
        }
        Ok((id, uuid, was_write_into_file))
    }

    /// Sends the `CloneSessionResponse`: the new UUID and whether the trace
    /// went to the caller's file, or why there is none.
    fn answer_clone(
        &mut self,
        conn: ConnId,
        to: &PendingReply,
        result: Result<((i64, i64), bool), CloneError>,
    ) {
        let resp = match result {
            Ok(((msb, lsb), was_write_into_file)) => CloneSessionResponse {
                success: Some(true),
                error: Some(String::new()),
                uuid_msb: Some(msb),
                uuid_lsb: Some(lsb),
                was_write_into_file: Some(was_write_into_file),
            },
            Err(e) => CloneSessionResponse {
                success: Some(false),
                error: Some(e.to_string()),
                uuid_msb: Some(0),
                uuid_lsb: Some(0),
                was_write_into_file: Some(false),
            },
        };
        self.reply(conn, to, &resp, false);
    }

    /// Session `sid` is being freed: its clones in progress fail.
    pub(super) fn abort_clones(&mut self, pending: BTreeMap<u64, PendingClone>) {
        for op in pending.into_values() {
            if self.consumer(op.consumer).is_some() {
                self.answer_clone(op.consumer, &op.reply, Err(CloneError::SourceEnded));
            }
        }
    }

    /// Consumer `conn` hung up: its clones in progress go, copies and all.
    pub(super) fn drop_clones_of(&mut self, conn: ConnId) {
        for s in self.sessions.values_mut() {
            s.pending_clones.retain(|_, op| op.consumer != conn);
        }
    }
}
