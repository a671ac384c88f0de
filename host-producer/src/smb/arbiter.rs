//! The producer's side of an SMB: hands chunks to trace writers, turns
//! finished chunks and patches into `CommitData` messages, allocates writer
//! ids, and takes chunks back from idle writers.
//!
//! # Invariants
//!
//! * A chunk is listed in a commit only after its `BeingWritten → Complete`
//!   transition succeeded; a failed transition (a peer rewrote the page
//!   header) is counted as lost, never committed.
//! * When no chunk is free, the acquiring writer first reclaims chunks held
//!   by idle writers (second-chance sweep, try-locks only), kicks the
//!   sender, and then either drops the packet (policy `Drop`) or sleeps with
//!   an exponential backoff up to the policy's bound (`StallThenDrop`). It
//!   never waits forever and never stalls on the connection's own thread.
//! * Every dropped packet is counted (`ProducerStats::packets_dropped`).
//!   It is also marked in the trace (`previous_packet_dropped` on the
//!   writer's next packet), except when the writer never got a chunk at all
//!   before it retired: such a writer has no sequence in the trace to carry
//!   the mark (upstream behaves the same). Many threads on a small SMB
//!   under the drop policy can lose whole threads' worth of packets this
//!   way; only the stats show it.
//! * Writer ids are handed out round-robin over 1..=32767, skipping ids in
//!   use, so an id is reused only after every other id was handed out.
// `unsafe` here: the one call of `SharedMemory::smb_static` (writers' `'static` SMB view).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shmtrace_abi::layout::{ChunkHeaderRepr, PageLayout, MAX_WRITER_ID};
use shmtrace_abi::smb::{Smb, WritableChunk};
use shmtrace_abi::writer::{BufferId, ChunkArbiter, PatchGroup, PatchesDeferred};
use shmtrace_ipc::shm::SharedMemory;

use crate::connection::outbox::{ChunkToMove, ChunkToPatch, Outbox, PatchEntry};
use crate::smb::cell_lock::{lock_mode, taker_fence};
use crate::smb::writer::WriterCell;
use crate::stats::ProducerStats;

/// What a writer does when the SMB has no free chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BufferExhaustedPolicy {
    /// Drop the packet and mark the loss on the next one (Perfetto's SDK
    /// default).
    #[default]
    Drop,
    /// Wait for a chunk, at most this long per packet, then drop.
    StallThenDrop(Duration),
}

/// The SMB data path's counters (monotonic, across connections): chunks
/// and the packets written into them.
#[derive(Debug, Default)]
pub(crate) struct ArbiterCounters {
    pub chunks_committed: AtomicU64,
    pub chunks_lost: AtomicU64,
    pub acquire_failures: AtomicU64,
    pub stalls: AtomicU64,
    pub chunks_reclaimed: AtomicU64,
    pub stall_deadlocks_avoided: AtomicU64,
    pub packets_dropped: AtomicU64,
    pub emulated_chunks_dropped: AtomicU64,
}

/// The counters every arbiter of this process adds to.
pub(crate) static COUNTERS: ArbiterCounters = ArbiterCounters {
    chunks_committed: AtomicU64::new(0),
    chunks_lost: AtomicU64::new(0),
    acquire_failures: AtomicU64::new(0),
    stalls: AtomicU64::new(0),
    chunks_reclaimed: AtomicU64::new(0),
    stall_deadlocks_avoided: AtomicU64::new(0),
    packets_dropped: AtomicU64::new(0),
    emulated_chunks_dropped: AtomicU64::new(0),
};

impl ArbiterCounters {
    /// Copies these counters into `stats`.
    pub(crate) fn read_into(&self, stats: &mut ProducerStats) {
        stats.chunks_committed = self.chunks_committed.load(Ordering::Relaxed);
        stats.chunks_lost = self.chunks_lost.load(Ordering::Relaxed);
        stats.acquire_failures = self.acquire_failures.load(Ordering::Relaxed);
        stats.stalls = self.stalls.load(Ordering::Relaxed);
        stats.chunks_reclaimed = self.chunks_reclaimed.load(Ordering::Relaxed);
        stats.stalls_given_up = self.stall_deadlocks_avoided.load(Ordering::Relaxed);
        stats.packets_dropped = self.packets_dropped.load(Ordering::Relaxed);
        stats.emulated_chunks_dropped = self.emulated_chunks_dropped.load(Ordering::Relaxed);
    }
}

/// Round-robin writer id allocator over 1..=[`MAX_WRITER_ID`].
struct WriterIds {
    used: Vec<u64>,
    next: u16,
    in_use: usize,
}

impl WriterIds {
    fn new() -> Self {
        WriterIds {
            used: vec![0; usize::from(MAX_WRITER_ID) / 64 + 1],
            next: 1,
            in_use: 0,
        }
    }

    fn is_used(&self, id: u16) -> bool {
        self.used[usize::from(id) / 64] & (1 << (id % 64)) != 0
    }

    fn alloc(&mut self) -> Option<u16> {
        if self.in_use >= usize::from(MAX_WRITER_ID) {
            return None;
        }
        loop {
            let id = self.next;
            self.next = if id >= MAX_WRITER_ID { 1 } else { id + 1 };
            if !self.is_used(id) {
                self.used[usize::from(id) / 64] |= 1 << (id % 64);
                self.in_use += 1;
                return Some(id);
            }
        }
    }

    fn free(&mut self, id: u16) {
        if id != 0 && id <= MAX_WRITER_ID && self.is_used(id) {
            self.used[usize::from(id) / 64] &= !(1 << (id % 64));
            self.in_use -= 1;
        }
    }
}

/// One SMB and everything about how this producer uses it.
pub(crate) struct Arbiter {
    /// Owned here, in the `Arc`'s allocation: every `WriterArbiter`'s
    /// `'static` view points into it (see `Arbiter::writer_arbiter`).
    shm: SharedMemory,
    /// Shmem emulation: chunks travel inside `CommitData`.
    emulated: bool,
    layout: PageLayout,
    cursor: AtomicUsize,
    outbox: Arc<Outbox>,
    ids: Mutex<WriterIds>,
    cells: Mutex<Vec<Arc<WriterCell>>>,
    closed: AtomicBool,
    /// Bumped each time a commit reached the service: only then can chunks
    /// become free again, so a writer that found the SMB full retries only
    /// after it changed.
    commit_epoch: AtomicU64,
    pub(crate) counters: &'static ArbiterCounters,
}

impl Arbiter {
    /// The arbiter of `shm`, `emulated` if its chunks travel inside
    /// `CommitData` (shmem emulation, startup tracing).
    pub(crate) fn new(
        shm: SharedMemory,
        emulated: bool,
        layout: PageLayout,
        outbox: Arc<Outbox>,
    ) -> Arc<Self> {
        Arc::new(Arbiter {
            shm,
            emulated,
            layout,
            cursor: AtomicUsize::new(0),
            outbox,
            ids: Mutex::new(WriterIds::new()),
            cells: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            commit_epoch: AtomicU64::new(0),
            counters: &COUNTERS,
        })
    }

    pub(crate) fn smb(&self) -> &Smb<'_> {
        self.shm.smb()
    }

    pub(crate) fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    pub(crate) fn is_emulated(&self) -> bool {
        self.emulated
    }

    /// `true` if some chunk is committed and not yet freed (`Complete` or
    /// `BeingRead`), or some commit is still queued: waiting for a free
    /// chunk can succeed.
    fn chunks_on_their_way(&self) -> bool {
        // The high bit of a chunk's 2-bit state is set for BeingRead (2)
        // and Complete (3); bits 28..31 are the layout.
        const HIGH_STATE_BITS: u32 = 0x0AAA_AAAA;
        let smb = self.smb();
        self.outbox.has_pending()
            || (0..smb.num_pages())
                .any(|p| smb.header_bitmap(p).unwrap_or(0) & HIGH_STATE_BITS != 0)
    }

    /// Changes whenever a chunk was committed or a commit reached the
    /// service: chunks are circulating.
    fn progress(&self) -> (u64, u64) {
        (
            self.counters.chunks_committed.load(Ordering::Relaxed),
            self.commit_epoch.load(Ordering::Acquire),
        )
    }

    /// A commit was sent to the service (chunks may free up).
    pub(crate) fn commit_sent(&self) {
        self.commit_epoch.fetch_add(1, Ordering::Release);
    }

    /// Starts fetching the header of the page after `page`, where the next
    /// acquisition looks first once `page` is full.
    fn prefetch_page_after(&self, page: usize) {
        let smb = self.smb();
        let next = if page + 1 >= smb.num_pages() {
            0
        } else {
            page + 1
        };
        self.shm.prefetch_for_write(next * smb.page_size().get());
    }

    /// No more chunks are handed out (connection gone).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn ids(&self) -> MutexGuard<'_, WriterIds> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn cells(&self) -> MutexGuard<'_, Vec<Arc<WriterCell>>> {
        self.cells.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn alloc_writer_id(&self) -> Option<u16> {
        self.ids().alloc()
    }

    pub(crate) fn free_writer_id(&self, id: u16) {
        self.ids().free(id);
    }

    pub(crate) fn add_cell(&self, cell: Arc<WriterCell>) {
        self.cells().push(cell);
    }

    pub(crate) fn remove_cell(&self, cell: &Arc<WriterCell>) {
        self.cells().retain(|c| !Arc::ptr_eq(c, cell));
    }

    /// A writer-side handle for a writer with `policy`.
    pub(crate) fn writer_arbiter(self: &Arc<Self>, policy: BufferExhaustedPolicy) -> WriterArbiter {
        WriterArbiter {
            // SAFETY: `self.shm` lives inside this `Arc`'s allocation, which
            // never moves and is dropped only with the last clone of the
            // `Arc`; nothing borrows it mutably (an `Arc` lends `&` only, and
            // `Arc::get_mut` fails while another clone lives). The
            // `WriterArbiter` keeps a clone of the `Arc` (`arbiter`) as long
            // as it keeps `smb`. The chunks it hands out go to the
            // `TraceWriter` that owns this `WriterArbiter` (or back to it in
            // `commit_chunk`; nothing else stores them), so they are gone
            // before it is; the `WriterInner` of a writer cell holds one more
            // clone of the `Arc`, in a field declared after (so dropped
            // after) its writer.
            smb: unsafe { self.shm.smb_static() },
            arbiter: self.clone(),
            policy,
            full_at: None,
            skipped: 0,
        }
    }

    /// Flushes writers that stayed idle since the previous sweep (second
    /// chance) so they do not pin chunks. Only tries locks. Returns how
    /// many were flushed.
    ///
    /// A writer calling this from inside its own event skips itself: its
    /// lock is taken.
    pub(crate) fn sweep_idle(&self) -> usize {
        self.try_sweep_idle().unwrap_or(0)
    }

    /// [`Arbiter::sweep_idle`], or `None` if another thread holds the
    /// writer list (sweeping, or adding or removing a writer).
    fn try_sweep_idle(&self) -> Option<usize> {
        let Ok(cells) = self.cells.try_lock() else {
            return None;
        };
        // Claim every idle cell first, so that one (asymmetric) fence
        // serves them all; `swept` marks our claims (only the holder of
        // `cells` touches it).
        let mut any = false;
        for cell in cells.iter() {
            if cell.take_idle() && cell.claim() {
                cell.swept.store(true, Ordering::Relaxed);
                any = true;
            }
        }
        let mut flushed = 0;
        if any {
            taker_fence(lock_mode());
            for cell in cells.iter() {
                if !cell.swept.swap(false, Ordering::Relaxed) {
                    continue;
                }
                if let Some(mut g) = cell.confirm() {
                    if g.inner().out.dirty {
                        g.inner().flush();
                        flushed += 1;
                    }
                }
            }
        }
        drop(cells);
        self.counters
            .chunks_reclaimed
            .fetch_add(flushed as u64, Ordering::Relaxed);
        Some(flushed)
    }

    /// The page layout whose chunks are the smallest that hold `size` bytes
    /// (header included) in this SMB's pages, if any does.
    pub(crate) fn layout_for(&self, size: usize) -> Option<PageLayout> {
        let page_size = self.smb().page_size();
        PageLayout::PARTITIONED
            .iter()
            .rev()
            .copied()
            .find(|&l| page_size.chunk_size(l).is_some_and(|c| c >= size))
    }

    /// Takes a free chunk of at least `size` bytes (header included) and
    /// writes `header` into it, for packets written elsewhere and copied in
    /// whole (`forward`). Free pages are partitioned with
    /// [`Arbiter::layout_for`]`(size)`; pages already partitioned are used
    /// if their chunks are large enough, whatever their layout. `None` when
    /// no such chunk is free (or `size` exceeds a whole page), or the
    /// connection is gone. The chunk borrows the arbiter.
    pub(crate) fn acquire_chunk_of(
        &self,
        size: usize,
        header: ChunkHeaderRepr,
    ) -> Option<WritableChunk<'_>> {
        let layout = self.layout_for(size)?;
        if self.is_closed() {
            return None;
        }
        let smb = self.shm.smb();
        let pages = smb.num_pages();
        let start = self.cursor.load(Ordering::Relaxed) % pages;
        for i in 0..pages {
            let page = (start + i) % pages;
            if smb.is_page_free(page) {
                // Losing this race is fine: the page then has a layout.
                let _ = smb.try_partition_page(page, layout);
            }
            let fits = smb
                .page_layout(page)
                .and_then(|l| smb.chunk_size(l))
                .is_some_and(|c| c >= size);
            if !fits {
                continue;
            }
            let mut free = smb.free_chunks(page);
            while free != 0 {
                let chunk = free.trailing_zeros() as usize;
                free &= free - 1;
                if let Ok(c) = smb.try_acquire_chunk_for_writing(page, chunk, header) {
                    self.cursor.store(page, Ordering::Relaxed);
                    return Some(c);
                }
            }
        }
        None
    }

    /// Hands a finished chunk over: `BeingWritten → Complete`, then queued
    /// for the service's `target_buffer`. `false` (counted as lost, never
    /// committed) if the transition failed because a peer rewrote the page
    /// header. A chunk returned after the connection ended is not queued;
    /// under emulation it is lost with this buffer, and counted
    /// ([`Self::note_undelivered`]).
    pub(crate) fn commit(&self, chunk: WritableChunk<'_>, target_buffer: u32) -> bool {
        match chunk.release_as_complete() {
            Ok(loc) => {
                self.counters
                    .chunks_committed
                    .fetch_add(1, Ordering::Relaxed);
                let queued = self.outbox.commit_chunk(ChunkToMove {
                    page: loc.page as u32,
                    chunk: loc.chunk as u32,
                    target_buffer,
                    data: None,
                });
                if !queued {
                    self.note_undelivered(1);
                }
                true
            }
            Err(_) => {
                self.counters.chunks_lost.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// `chunks` committed chunks will never be sent: the connection ended
    /// first. Under shmem emulation their only copy is in this private
    /// buffer, so they are lost: counted in
    /// [`ProducerStats::emulated_chunks_dropped`](crate::ProducerStats::emulated_chunks_dropped)
    /// and logged. In a shared buffer they stay `Complete` where the
    /// service can still scrape them, so nothing is counted here.
    pub(crate) fn note_undelivered(&self, chunks: usize) {
        if !self.emulated || chunks == 0 {
            return;
        }
        self.counters
            .emulated_chunks_dropped
            .fetch_add(chunks as u64, Ordering::Relaxed);
        log::warn!(
            "shmtrace-producer: {chunks} chunk(s) lost: the connection ended before they were sent"
        );
    }

    /// Shmem emulation: copies the bytes of every chunk of a commit
    /// (header included) into the request and frees the chunk in this
    /// buffer, which the service never sees: from here on the request holds
    /// the only copy. A chunk that cannot be read back (not `Complete`: only
    /// a bug of ours could do that) is taken out of the request and counted
    /// in [`ProducerStats::emulated_chunks_dropped`](crate::ProducerStats::emulated_chunks_dropped):
    /// a page reference means nothing to a service without our memory.
    /// Without emulation, nothing changes.
    pub(crate) fn materialize(&self, chunks: &mut Vec<ChunkToMove>) {
        if !self.is_emulated() {
            return;
        }
        let smb = self.smb();
        for c in chunks.iter_mut().filter(|c| c.data.is_none()) {
            let Ok(readable) = smb.try_acquire_chunk_for_reading(c.page as usize, c.chunk as usize)
            else {
                continue;
            };
            let mut buf = vec![0u8; readable.chunk_size()];
            if let Ok(copied) = readable.copy_out(&mut buf) {
                buf.truncate(copied.len);
                c.data = Some(buf);
            }
            let _ = readable.release_as_free();
        }
        let before = chunks.len();
        chunks.retain(|c| c.data.is_some());
        self.counters
            .emulated_chunks_dropped
            .fetch_add((before - chunks.len()) as u64, Ordering::Relaxed);
    }
}

/// Stalls after which a stalling writer gives up, each with no chunk
/// committed-but-not-freed, none committed or sent since the previous one,
/// and the writer's own sweep through the writer list finding none idle
/// (stalls whose sweep was skipped for a busy list do not count, nor break
/// the run): the sweeps of idle writers had their chance.
const STUCK_STALLS: u32 = 3;

/// A writer that found the SMB full retries after a commit, or after this
/// many dropped packets at the latest.
const RETRY_EVERY: u32 = 256;

thread_local! {
    /// Set on the connection's own threads: they must never stall for
    /// chunks (they are the ones freeing them).
    static NO_STALL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread must never stall for chunks.
pub(crate) fn stalls_forbidden() -> bool {
    NO_STALL.with(|c| c.get())
}

/// Marks the calling thread as one that must never stall for chunks.
pub(crate) fn forbid_stalls_on_this_thread() {
    NO_STALL.with(|c| c.set(true));
}

/// The [`ChunkArbiter`] of one trace writer: a handle to the shared
/// SMB arbiter plus the writer's buffer-exhausted policy. Only reachable
/// through [`ProducerSink`](crate::ProducerSink), the type TrackEvent fields
/// are written into.
pub struct WriterArbiter {
    // `smb` points into `arbiter`'s shared memory; the Arc next to it keeps
    // that alive (see `Arbiter::writer_arbiter`).
    smb: &'static Smb<'static>,
    arbiter: Arc<Arbiter>,
    policy: BufferExhaustedPolicy,
    /// Commit epoch at which this writer last found the SMB full.
    full_at: Option<u64>,
    /// Acquisitions skipped since then.
    skipped: u32,
}

impl WriterArbiter {
    fn try_acquire(&self, header: ChunkHeaderRepr) -> Option<WritableChunk<'static>> {
        let pages = self.smb.num_pages();
        for _ in 0..2 {
            let start = self.arbiter.cursor.load(Ordering::Relaxed) % pages;
            if let Ok(chunk) =
                self.smb
                    .try_acquire_any_chunk_for_writing(start, self.arbiter.layout, header)
            {
                let page = chunk.location().page;
                self.arbiter.cursor.store(page, Ordering::Relaxed);
                self.arbiter.prefetch_page_after(page);
                return Some(chunk);
            }
        }
        None
    }
}

impl ChunkArbiter<'static> for WriterArbiter {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'static>> {
        if self.arbiter.is_closed() {
            return None;
        }
        let epoch = self.arbiter.commit_epoch.load(Ordering::Acquire);
        if self.full_at == Some(epoch)
            && self.skipped < RETRY_EVERY
            && self.policy == BufferExhaustedPolicy::Drop
        {
            // Nothing was committed since the SMB was found full: scanning
            // it again now would only cost time. Drop straight away.
            self.skipped += 1;
            return None;
        }
        self.skipped = 0;
        if let Some(c) = self.try_acquire(header) {
            self.full_at = None;
            return Some(c);
        }
        self.full_at = Some(epoch);
        self.arbiter
            .counters
            .acquire_failures
            .fetch_add(1, Ordering::Relaxed);
        self.arbiter.sweep_idle();
        self.arbiter.outbox.kick();
        let BufferExhaustedPolicy::StallThenDrop(limit) = self.policy else {
            return None;
        };
        if NO_STALL.with(|c| c.get()) {
            return None;
        }
        let start = Instant::now();
        let mut sleep_us: u64 = 8;
        let mut stuck = 0;
        let mut progress = self.arbiter.progress();
        loop {
            let remaining = limit.saturating_sub(start.elapsed());
            if remaining.is_zero() || self.arbiter.is_closed() {
                return None;
            }
            self.arbiter.counters.stalls.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(sleep_us).min(remaining));
            sleep_us = (sleep_us * 8).min(100_000);
            if let Some(c) = self.try_acquire(header) {
                return Some(c);
            }
            let swept = self.arbiter.try_sweep_idle();
            self.arbiter.outbox.kick();
            let now = self.arbiter.progress();
            // Chunks moving, or an idle writer swept: not stuck. A sweep
            // skipped because another thread held the writer list neither
            // proves progress nor its absence (writers stalling together
            // collide there), so that stall does not count either way.
            if swept.is_some_and(|n| n > 0) || now != progress || self.arbiter.chunks_on_their_way()
            {
                progress = now;
                stuck = 0;
            } else if swept.is_some() {
                stuck += 1;
            }
            if stuck >= STUCK_STALLS {
                // Every chunk stayed held by a writer (each, like this one,
                // possibly waiting with a full chunk) while idle ones were
                // swept: waiting cannot free anything. Drop instead;
                // returning our chunk then lets the others go on.
                self.arbiter
                    .counters
                    .stall_deadlocks_avoided
                    .fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
    }

    fn commit_chunk(&mut self, chunk: WritableChunk<'static>, target_buffer: BufferId) {
        self.arbiter.commit(chunk, u32::from(target_buffer));
    }

    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        let new_group = || ChunkToPatch {
            target_buffer: u32::from(group.target_buffer),
            writer_id: u32::from(group.writer_id),
            chunk_id: group.chunk_id,
            patches: heapless::Vec::new(),
            has_more_patches: group.has_more,
        };
        // A group normally fits one entry (its size is bounded by the
        // writer's patch capacity); split defensively if not.
        let mut current = new_group();
        for p in group.patches() {
            let entry = PatchEntry {
                offset: u32::from(p.offset),
                data: p.data,
            };
            if let Err(entry) = current.patches.push(entry) {
                let mut full = std::mem::replace(&mut current, new_group());
                full.has_more_patches = true;
                self.arbiter.outbox.commit_patches(full);
                let _ = current.patches.push(entry);
            }
        }
        self.arbiter.outbox.commit_patches(current);
        Ok(())
    }

    fn flush(&mut self) {
        self.arbiter.outbox.kick();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_ids_round_robin_and_skip_used() {
        let mut ids = WriterIds::new();
        assert_eq!(ids.alloc(), Some(1));
        assert_eq!(ids.alloc(), Some(2));
        ids.free(1);
        assert_eq!(ids.alloc(), Some(3), "freed ids are not reused right away");
        ids.next = MAX_WRITER_ID;
        assert_eq!(ids.alloc(), Some(MAX_WRITER_ID));
        assert_eq!(ids.alloc(), Some(1), "wraps to 1, skipping 0");
        assert_eq!(ids.alloc(), Some(4), "skips 2 and 3, still in use");
        ids.free(0);
        ids.free(9999); // not in use: ignored
        assert_eq!(ids.in_use, 5);
    }

    #[test]
    fn writer_ids_exhaust_cleanly() {
        let mut ids = WriterIds::new();
        for _ in 0..MAX_WRITER_ID {
            assert!(ids.alloc().is_some());
        }
        assert_eq!(ids.alloc(), None);
        ids.free(77);
        assert_eq!(ids.alloc(), Some(77));
    }
}
