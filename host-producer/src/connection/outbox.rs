//! Everything the producer sends to the service, in order.
//!
//! Application threads (writers returning chunks, delivering patches,
//! registering themselves) and the connection's command handler push into
//! one [`Outbox`]; the connection takes messages out and sends them.
//!
//! # Invariants
//!
//! * Messages leave in the order they were pushed. Chunk commits and patches
//!   accumulate in one pending [`CommitRequest`] (batching); pushing any
//!   other message first seals that pending request behind the messages
//!   already queued, so e.g. a `NotifyDataSourceStopped` never overtakes the
//!   last chunks of the instance it reports on.
//! * Flush acks merge: an ack for flush N acknowledges every flush up to N
//!   (the service completes each pending flush with an id <= N), so an ack
//!   pushed while the last queued message is an unsent commit, with
//!   nothing committed since, raises that commit's id instead of queueing
//!   another message. A flood of flushes costs one queued message.
//!   Nothing else is merged or dropped.
//! * Application threads never allocate here: the pending request and
//!   the spare ones have room for every chunk of the SMB
//!   ([`Outbox::reserve`]), and a chunk cannot be committed twice before
//!   the service frees it, which needs the commit to have been sent. The
//!   sender splits large requests ([`CommitRequest::split`]) to stay far
//!   below the IPC frame limit.
//! * The lock is held only to move small values in and out; nothing blocks
//!   or calls back while holding it. Spare request buffers are recycled, so
//!   steady-state commits do not allocate.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Chunks (or patch groups) per `CommitDataRequest` before it is sealed.
pub(crate) const MAX_CHUNKS_PER_COMMIT: usize = 64;

/// A lingering sender is woken once the pending commit holds this fraction
/// (1/n) of the SMB's chunks.
const URGENT_FRACTION: usize = 8;

/// Request buffers kept for reuse.
const SPARE_REQUESTS: usize = 4;

/// Messages the outbox may hold (queued or being sent) before the
/// connection stops taking the service's commands ([`Outbox::wait_below`]):
/// most commands add a message (an ack, a notification, a commit), so a
/// service that sends commands and does not read our socket would otherwise
/// grow it without bound. The IPC client then stops reading the socket
/// after its own bounded queue, which holds the service back at its sends.
/// Far above what a healthy service causes (a burst of Setup/Start/Stop
/// commands for every data source of a session, flush acks merged into
/// one), so only a service that stopped reading meets it: the producer
/// pauses its commands, not its program threads (their commits are bounded
/// by the SMB and are never held back). A service that then blocks on its
/// send without ever reading ours gets no further: the stalled sender ends
/// the connection after the send-stall limit, as for any service that
/// stopped reading.
pub(crate) const BACKLOG_CAP: usize = 1024;

/// `CommitDataRequest.ChunksToMove`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkToMove {
    /// Page index in the SMB.
    pub page: u32,
    /// Chunk index in the page.
    pub chunk: u32,
    /// Global id of the target buffer.
    pub target_buffer: u32,
    /// The chunk's bytes (header included), under shmem emulation only.
    pub data: Option<Vec<u8>>,
}

/// One patch of a `ChunkToPatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PatchEntry {
    /// Offset from the start of the chunk payload.
    pub offset: u32,
    /// The 4 bytes to write.
    pub data: [u8; 4],
}

/// `CommitDataRequest.ChunkToPatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkToPatch {
    /// Global id of the buffer holding the chunk.
    pub target_buffer: u32,
    /// The writer that owns the chunk.
    pub writer_id: u32,
    /// The chunk.
    pub chunk_id: u32,
    /// The patches (a writer delivers at most its patch capacity at once,
    /// so they are stored inline: delivering patches never allocates).
    pub patches: heapless::Vec<PatchEntry, { shmtrace_abi::writer::DEFAULT_PATCH_CAPACITY }>,
    /// More patches for this chunk will follow.
    pub has_more_patches: bool,
}

/// `CommitDataRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CommitRequest {
    /// Chunks to move into trace buffers.
    pub chunks_to_move: Vec<ChunkToMove>,
    /// Patches for chunks committed earlier.
    pub chunks_to_patch: Vec<ChunkToPatch>,
    /// Acknowledges every flush up to this id (0 = none).
    pub flush_request_id: u64,
}

impl CommitRequest {
    /// An empty request with room for a full batch, so filling it does not
    /// allocate.
    fn with_capacity(n: usize) -> Self {
        CommitRequest {
            chunks_to_move: Vec::with_capacity(n),
            chunks_to_patch: Vec::with_capacity(n),
            flush_request_id: 0,
        }
    }

    /// `true` if there is nothing to send.
    pub(crate) fn is_empty(&self) -> bool {
        self.chunks_to_move.is_empty()
            && self.chunks_to_patch.is_empty()
            && self.flush_request_id == 0
    }

    fn clear(&mut self) {
        self.chunks_to_move.clear();
        self.chunks_to_patch.clear();
        self.flush_request_id = 0;
    }

    fn reserve(&mut self, n: usize) {
        self.chunks_to_move
            .reserve(n.saturating_sub(self.chunks_to_move.len()));
        self.chunks_to_patch
            .reserve(n.saturating_sub(self.chunks_to_patch.len()));
    }

    /// Cuts the request into messages of at most `max` chunks or patch
    /// groups. Chunks go first, patches after all of them (a patch may be
    /// for any chunk of the request), and the flush ack with the last
    /// message: the service then sees exactly what one big request would
    /// have done.
    pub(crate) fn split(&self, max: usize) -> Vec<CommitRequest> {
        let max = max.max(1);
        let mut parts: Vec<CommitRequest> = self
            .chunks_to_move
            .chunks(max)
            .map(|c| CommitRequest {
                chunks_to_move: c.to_vec(),
                ..Default::default()
            })
            .collect();
        let mut patches = self.chunks_to_patch.chunks(max);
        // The last chunk message also carries the first patch groups.
        if let (Some(last), Some(first)) = (parts.last_mut(), patches.next()) {
            last.chunks_to_patch = first.to_vec();
        } else if let Some(first) = self.chunks_to_patch.chunks(max).next() {
            parts.push(CommitRequest {
                chunks_to_patch: first.to_vec(),
                ..Default::default()
            });
        }
        parts.extend(patches.map(|p| CommitRequest {
            chunks_to_patch: p.to_vec(),
            ..Default::default()
        }));
        match parts.last_mut() {
            Some(last) => last.flush_request_id = self.flush_request_id,
            None => parts.push(CommitRequest {
                flush_request_id: self.flush_request_id,
                ..Default::default()
            }),
        }
        parts
    }
}

/// What the connection needs to register a data source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DescriptorInfo {
    pub name: String,
    pub id: u64,
    pub no_flush: bool,
    /// Serialized `TrackEventDescriptor` (track_event only).
    pub track_event_descriptor: Option<Vec<u8>>,
    pub extra_fields: Vec<u8>,
}

/// One message to the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outgoing {
    /// `RegisterTraceWriter`.
    RegisterTraceWriter {
        /// Writer id.
        writer_id: u32,
        /// Global buffer id.
        target_buffer: u32,
    },
    /// `UnregisterTraceWriter`.
    UnregisterTraceWriter {
        /// Writer id.
        writer_id: u32,
    },
    /// `CommitData`.
    Commit(CommitRequest),
    /// `NotifyDataSourceStarted`.
    DataSourceStarted {
        /// Instance id.
        instance_id: u64,
    },
    /// `NotifyDataSourceStopped`.
    DataSourceStopped {
        /// Instance id.
        instance_id: u64,
    },
    /// `RegisterDataSource`.
    RegisterDataSource(DescriptorInfo),
    /// `UpdateDataSource`.
    UpdateDataSource(DescriptorInfo),
    /// `ActivateTriggers` (no reply asked for, as upstream).
    ActivateTriggers(Vec<String>),
    /// `Sync`, after the registrations up to this generation
    /// ([`Runtime::registrations`](crate::runtime::Runtime::registrations)):
    /// its reply comes after the service handled them and sent the
    /// commands they prompted.
    Sync(u64),
}

impl Inner {
    /// The pending commit holds enough of the SMB that a lingering sender
    /// must send it now.
    fn urgent(&self) -> bool {
        self.pending.chunks_to_move.len() >= (self.smb_chunks / URGENT_FRACTION).max(1)
    }
}

struct Inner {
    /// Messages taken out but not reported sent yet.
    in_flight: usize,
    queue: VecDeque<Outgoing>,
    pending: CommitRequest,
    spare: Vec<CommitRequest>,
    /// Capacity every request buffer is given.
    capacity: usize,
    closed: bool,
    /// Threads blocked waiting for something to send ([`Outbox::next_timeout`]):
    /// committers only pay for a wake-up, a system call, when one sleeps.
    waiting_for_work: usize,
    /// The sender is batching commits ([`Outbox::linger`]): committers wake
    /// it only when the pending commit grew large.
    lingering: bool,
    /// Chunks in the current SMB (0: unknown).
    smb_chunks: usize,
    /// Bumped by requests that end a linger early (kicks, drains).
    interrupts: u64,
}

/// The ordered queue of messages to the service. See the module docs.
pub(crate) struct Outbox {
    inner: Mutex<Inner>,
    ready: Condvar,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Outbox {
    /// An empty outbox.
    pub(crate) fn new() -> Self {
        Outbox {
            inner: Mutex::new(Inner {
                in_flight: 0,
                queue: VecDeque::with_capacity(64),
                pending: CommitRequest::with_capacity(MAX_CHUNKS_PER_COMMIT),
                spare: (0..SPARE_REQUESTS)
                    .map(|_| CommitRequest::with_capacity(MAX_CHUNKS_PER_COMMIT))
                    .collect(),
                closed: false,
                capacity: MAX_CHUNKS_PER_COMMIT,
                waiting_for_work: 0,
                lingering: false,
                smb_chunks: 0,
                interrupts: 0,
            }),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves `Inner` consistent (pushes and
        // moves only), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn seal(inner: &mut Inner) {
        if !inner.pending.is_empty() {
            let capacity = inner.capacity;
            let fresh = inner
                .spare
                .pop()
                .unwrap_or_else(|| CommitRequest::with_capacity(capacity));
            let full = std::mem::replace(&mut inner.pending, fresh);
            inner.queue.push_back(Outgoing::Commit(full));
        }
    }

    /// Gives every request buffer room for `chunks` chunks (all the chunks
    /// of a new SMB), so committing never allocates.
    pub(crate) fn reserve(&self, chunks: usize) {
        let mut inner = self.lock();
        inner.smb_chunks = chunks;
        inner.capacity = inner.capacity.max(chunks);
        let capacity = inner.capacity;
        inner.pending.reserve(capacity);
        for s in &mut inner.spare {
            s.reserve(capacity);
        }
    }

    fn after_commit_push(&self, inner: MutexGuard<'_, Inner>, was_empty: bool) {
        // A sender that is not waiting finds the commit when it next looks
        // (it only waits after finding nothing, under the lock we hold).
        let wake = (was_empty && inner.waiting_for_work > 0) || (inner.lingering && inner.urgent());
        drop(inner);
        if wake {
            self.ready.notify_all();
        }
    }

    /// Adds a chunk to the pending commit; `false` (the chunk dropped) if
    /// the outbox is closed: no connection is up.
    pub(crate) fn commit_chunk(&self, chunk: ChunkToMove) -> bool {
        let mut inner = self.lock();
        if inner.closed {
            return false;
        }
        let was_empty = inner.pending.is_empty() && inner.queue.is_empty();
        inner.pending.chunks_to_move.push(chunk);
        self.after_commit_push(inner, was_empty);
        true
    }

    /// Adds a patch group to the pending commit.
    pub(crate) fn commit_patches(&self, patch: ChunkToPatch) {
        let mut inner = self.lock();
        if inner.closed {
            return;
        }
        let was_empty = inner.pending.is_empty() && inner.queue.is_empty();
        inner.pending.chunks_to_patch.push(patch);
        self.after_commit_push(inner, was_empty);
    }

    /// Acknowledges flush `id` with the pending commit and sends it now;
    /// merged into the last queued commit if nothing was committed since
    /// (see the module docs).
    pub(crate) fn ack_flush(&self, id: u64) {
        let mut guard = self.lock();
        if guard.closed {
            return;
        }
        let inner = &mut *guard;
        let merged = match inner.queue.back_mut() {
            Some(Outgoing::Commit(last)) if inner.pending.is_empty() => {
                last.flush_request_id = last.flush_request_id.max(id);
                true
            }
            _ => false,
        };
        if !merged {
            inner.pending.flush_request_id = inner.pending.flush_request_id.max(id);
            Self::seal(inner);
        }
        drop(guard);
        self.ready.notify_one();
    }

    /// Queues a message after everything pushed so far; `false` (the
    /// message dropped) if the outbox is closed: no connection is up.
    pub(crate) fn push(&self, msg: Outgoing) -> bool {
        let mut inner = self.lock();
        if inner.closed {
            return false;
        }
        Self::seal(&mut inner);
        inner.queue.push_back(msg);
        drop(inner);
        self.ready.notify_one();
        true
    }

    /// `true` if anything waits to be sent or is being sent.
    pub(crate) fn has_pending(&self) -> bool {
        let inner = self.lock();
        inner.in_flight > 0 || !inner.queue.is_empty() || !inner.pending.is_empty()
    }

    /// Messages queued or being sent (the pending commit counts as one).
    #[cfg(test)]
    pub(crate) fn backlog(&self) -> usize {
        Self::backlog_of(&self.lock())
    }

    fn backlog_of(inner: &Inner) -> usize {
        inner.queue.len() + inner.in_flight + usize::from(!inner.pending.is_empty())
    }

    /// Waits up to `timeout` while the backlog is above `cap` (the sender
    /// reports each message sent); whether it is at or below `cap` now.
    pub(crate) fn wait_below(&self, cap: usize, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut inner = self.lock();
        while Self::backlog_of(&inner) > cap {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            inner = self
                .ready
                .wait_timeout(inner, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }

    /// Wakes the sender (e.g. a writer is waiting for chunks to free up).
    pub(crate) fn kick(&self) {
        self.lock().interrupts += 1;
        self.ready.notify_all();
    }

    /// The next message, if any (sealing the pending commit when the queue
    /// is empty).
    pub(crate) fn try_next(&self) -> Option<Outgoing> {
        let mut inner = self.lock();
        if inner.queue.is_empty() {
            Self::seal(&mut inner);
        }
        inner.queue.pop_front()
    }

    /// The next message, if any (sealing the pending commit when the queue
    /// is empty), waiting up to `timeout` for one.
    pub(crate) fn next_timeout(&self, timeout: Duration) -> Option<Outgoing> {
        let mut inner = self.lock();
        if inner.queue.is_empty() && inner.pending.is_empty() && !inner.closed {
            inner.waiting_for_work += 1;
            inner = self
                .ready
                .wait_timeout(inner, timeout)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
            inner.waiting_for_work -= 1;
        }
        if inner.queue.is_empty() {
            Self::seal(&mut inner);
        }
        let msg = inner.queue.pop_front();
        inner.in_flight += usize::from(msg.is_some());
        msg
    }

    /// The sender batches commits: waits up to `period` (without being
    /// woken by each committed chunk) unless something else is queued, a
    /// flush or drain asks, or the pending commit reaches 1/`URGENT_FRACTION`
    /// of the SMB. Under a steady stream of chunks this turns one wake-up
    /// (a system call in the committing writer) per chunk into none.
    pub(crate) fn linger(&self, period: Duration) {
        let mut inner = self.lock();
        if !inner.queue.is_empty() || inner.closed {
            return;
        }
        let deadline = std::time::Instant::now() + period;
        let interrupts = inner.interrupts;
        inner.lingering = true;
        while inner.queue.is_empty()
            && !inner.closed
            && inner.interrupts == interrupts
            && !inner.urgent()
        {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            inner = self
                .ready
                .wait_timeout(inner, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        inner.lingering = false;
    }

    /// The sender finished sending a message from [`Outbox::next_timeout`].
    pub(crate) fn sent(&self) {
        let mut inner = self.lock();
        inner.in_flight = inner.in_flight.saturating_sub(1);
        drop(inner);
        self.ready.notify_all();
    }

    /// Waits (at most `timeout`) until everything pushed so far was sent, or
    /// the outbox is closed.
    pub(crate) fn drain_wait(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        let mut inner = self.lock();
        inner.interrupts += 1;
        self.ready.notify_all();
        while !inner.closed
            && (inner.in_flight > 0 || !inner.queue.is_empty() || !inner.pending.is_empty())
        {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            let wait = left.min(Duration::from_millis(5));
            inner = self
                .ready
                .wait_timeout(inner, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Waits up to `timeout` until something is queued or pending.
    #[cfg(test)]
    pub(crate) fn wait(&self, timeout: Duration) {
        let mut inner = self.lock();
        if inner.queue.is_empty() && inner.pending.is_empty() && !inner.closed {
            inner.waiting_for_work += 1;
            let (mut inner, _) = self
                .ready
                .wait_timeout(inner, timeout)
                .unwrap_or_else(|e| e.into_inner());
            inner.waiting_for_work -= 1;
        }
    }

    /// Returns a sent request's buffers for reuse.
    pub(crate) fn recycle(&self, mut req: CommitRequest) {
        req.clear();
        let mut inner = self.lock();
        if inner.spare.len() < SPARE_REQUESTS {
            inner.spare.push(req);
        }
    }

    /// Accepts pushes again (a new connection) with `first` queued ahead
    /// of anything pushed later, in one step. Whatever was left from before
    /// belongs to no connection and is dropped.
    pub(crate) fn open_with(&self, first: impl IntoIterator<Item = Outgoing>) {
        let mut inner = self.lock();
        inner.closed = false;
        inner.in_flight = 0;
        inner.queue.clear();
        inner.pending.clear();
        inner.queue.extend(first);
        drop(inner);
        self.ready.notify_all();
    }

    /// Drops everything queued and ignores later pushes (connection gone),
    /// or (with `false`) accepts pushes again for a new connection. Returns
    /// how many committed chunks were dropped unsent.
    pub(crate) fn set_closed(&self, closed: bool) -> usize {
        let mut inner = self.lock();
        inner.closed = closed;
        inner.in_flight = 0;
        let mut dropped = 0;
        if closed {
            dropped = inner.pending.chunks_to_move.len()
                + inner
                    .queue
                    .iter()
                    .map(|m| match m {
                        Outgoing::Commit(c) => c.chunks_to_move.len(),
                        _ => 0,
                    })
                    .sum::<usize>();
            inner.queue.clear();
            inner.pending.clear();
        }
        drop(inner);
        self.ready.notify_all();
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lingering_sender_is_woken_only_by_a_large_commit_or_a_message() {
        let o = std::sync::Arc::new(Outbox::new());
        o.reserve(16); // urgent at 16 / URGENT_FRACTION = 2 pending chunks
        let lingerer = |o: &std::sync::Arc<Outbox>| {
            let o = o.clone();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                o.linger(Duration::from_secs(30));
                start.elapsed()
            })
        };
        let wait_lingering = |o: &Outbox| {
            while !o.lock().lingering {
                std::thread::yield_now();
            }
        };
        // One chunk: not woken (the lingerer is still lingering after it).
        let t = lingerer(&o);
        wait_lingering(&o);
        o.commit_chunk(chunk(1));
        std::thread::sleep(Duration::from_millis(20));
        assert!(o.lock().lingering, "a single chunk must not wake it");
        // The second one makes the commit large: woken.
        o.commit_chunk(chunk(2));
        assert!(t.join().unwrap() < Duration::from_secs(30));
        // A writer finding the SMB full kicks it.
        let _ = o.try_next();
        let t = lingerer(&o);
        wait_lingering(&o);
        o.kick();
        assert!(t.join().unwrap() < Duration::from_secs(30));
        // A queued message always wakes it.
        let _ = o.try_next();
        let t = lingerer(&o);
        wait_lingering(&o);
        o.push(Outgoing::UnregisterTraceWriter { writer_id: 1 });
        assert!(t.join().unwrap() < Duration::from_secs(30));
    }

    fn chunk(page: u32) -> ChunkToMove {
        ChunkToMove {
            page,
            chunk: 0,
            target_buffer: 1,
            data: None,
        }
    }

    #[test]
    fn commits_batch_and_keep_order_with_other_messages() {
        let o = Outbox::new();
        o.commit_chunk(chunk(1));
        o.commit_chunk(chunk(2));
        o.push(Outgoing::DataSourceStopped { instance_id: 7 });
        o.commit_chunk(chunk(3));
        match o.try_next() {
            Some(Outgoing::Commit(c)) => {
                assert_eq!(
                    c.chunks_to_move.iter().map(|c| c.page).collect::<Vec<_>>(),
                    [1, 2]
                );
                o.recycle(c);
            }
            other => panic!("expected a commit, got {other:?}"),
        }
        assert_eq!(
            o.try_next(),
            Some(Outgoing::DataSourceStopped { instance_id: 7 })
        );
        match o.try_next() {
            Some(Outgoing::Commit(c)) => assert_eq!(c.chunks_to_move.len(), 1),
            other => panic!("expected a commit, got {other:?}"),
        }
        assert_eq!(o.try_next(), None);
    }

    #[test]
    fn flush_ack_rides_on_the_pending_commit() {
        let o = Outbox::new();
        o.commit_chunk(chunk(1));
        o.ack_flush(5);
        o.ack_flush(3);
        let Some(Outgoing::Commit(c)) = o.try_next() else {
            panic!("no commit")
        };
        // 5 acknowledges 3 as well.
        assert_eq!((c.chunks_to_move.len(), c.flush_request_id), (1, 5));
        assert_eq!(o.try_next(), None);
    }

    #[test]
    fn flush_acks_merge_only_into_a_commit_with_nothing_after_it() {
        let o = Outbox::new();
        for id in 1..=1000 {
            o.ack_flush(id);
        }
        assert_eq!(o.backlog(), 1, "a flood of flushes queues one ack");
        // A chunk committed since: the next ack must follow it.
        o.commit_chunk(chunk(1));
        o.ack_flush(1001);
        // A message after the commit: the ack goes after it.
        o.push(Outgoing::DataSourceStopped { instance_id: 7 });
        o.ack_flush(1002);
        o.ack_flush(1003);
        let acks = |m: Option<Outgoing>| match m {
            Some(Outgoing::Commit(c)) => (c.chunks_to_move.len(), c.flush_request_id),
            other => panic!("expected a commit, got {other:?}"),
        };
        assert_eq!(acks(o.try_next()), (0, 1000));
        assert_eq!(acks(o.try_next()), (1, 1001));
        assert_eq!(
            o.try_next(),
            Some(Outgoing::DataSourceStopped { instance_id: 7 })
        );
        assert_eq!(acks(o.try_next()), (0, 1003));
        assert_eq!(o.try_next(), None);
        assert_eq!(o.backlog(), 0);
    }

    #[test]
    fn waiting_for_room_ends_when_the_sender_drains() {
        let o = std::sync::Arc::new(Outbox::new());
        for id in 0..10 {
            o.push(Outgoing::DataSourceStopped { instance_id: id });
        }
        assert_eq!(o.backlog(), 10);
        assert!(!o.wait_below(4, Duration::from_millis(20)));
        let sender = {
            let o = o.clone();
            std::thread::spawn(move || {
                while o.next_timeout(Duration::from_millis(5)).is_some() {
                    o.sent();
                }
            })
        };
        assert!(o.wait_below(4, Duration::from_secs(30)));
        assert!(o.backlog() <= 4);
        sender.join().unwrap();
    }

    #[test]
    fn large_batches_are_split() {
        let o = Outbox::new();
        o.reserve(1000);
        for i in 0..(MAX_CHUNKS_PER_COMMIT as u32 * 2 + 1) {
            o.commit_chunk(chunk(i));
        }
        o.ack_flush(9);
        let Some(Outgoing::Commit(c)) = o.try_next() else {
            panic!("no commit")
        };
        assert!(o.try_next().is_none(), "one request, however large");
        let parts = c.split(MAX_CHUNKS_PER_COMMIT);
        let sizes: Vec<_> = parts
            .iter()
            .map(|p| (p.chunks_to_move.len(), p.flush_request_id))
            .collect();
        assert_eq!(
            sizes,
            [
                (MAX_CHUNKS_PER_COMMIT, 0),
                (MAX_CHUNKS_PER_COMMIT, 0),
                (1, 9)
            ]
        );
        let pages: Vec<u32> = parts
            .iter()
            .flat_map(|p| p.chunks_to_move.iter().map(|c| c.page))
            .collect();
        assert_eq!(
            pages,
            (0..(MAX_CHUNKS_PER_COMMIT as u32 * 2 + 1)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn closed_outbox_drops_everything() {
        let o = Outbox::new();
        assert!(o.commit_chunk(chunk(1)));
        assert!(o.push(Outgoing::DataSourceStarted { instance_id: 1 }));
        assert!(o.commit_chunk(chunk(2)));
        assert!(o.commit_chunk(chunk(3)));
        // One chunk in a sealed commit, two pending.
        assert_eq!(o.set_closed(true), 3);
        assert!(!o.commit_chunk(chunk(4)));
        assert!(!o.push(Outgoing::DataSourceStarted { instance_id: 1 }));
        assert_eq!(o.try_next(), None);
        o.set_closed(false);
        assert!(o.push(Outgoing::DataSourceStarted { instance_id: 1 }));
        assert_eq!(
            o.try_next(),
            Some(Outgoing::DataSourceStarted { instance_id: 1 })
        );
    }
}
