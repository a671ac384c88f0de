//! A [`ChunkArbiter`] for programs without IPC (firmware): the producer and
//! a polling service share the SMB and a queue of commit events.
//!
//! Each writer gets its own single-producer single-consumer
//! [`CommitQueue`] (lock-free, interrupt-safe): the writer's
//! [`PollingArbiter`] acquires chunks from the shared [`Smb`] (round-robin
//! page scan, free pages partitioned with a configurable layout) and queues
//! what `CommitData` would carry: committed chunks (page, chunk, target
//! buffer) and patch batches. The service side drains the queue with
//! [`CommitReceiver::drain`]: `Complete → BeingRead`, copy, `→ Free`.
//!
//! # Invariants
//!
//! * Events of one writer are delivered in the order the writer produced
//!   them, so a chunk's commit always precedes its patches.
//! * While the writer holds a chunk, the queue has a free slot for that
//!   chunk's commit: a chunk is only handed out when at least two slots are
//!   free (one for the chunk being replaced, one for the new one), and
//!   patches are only queued if a slot stays free afterwards. Committing
//!   therefore never fails for lack of room. A full queue instead makes
//!   acquisition fail, which the writer handles as an exhausted SMB.

use heapless::spsc::{Consumer, Producer, Queue};

use crate::layout::{ChunkHeaderRepr, PageLayout};
use crate::smb::{ChunkLocation, Smb, WritableChunk};

use super::arbiter::{BufferId, ChunkArbiter, PatchesDeferred};
use super::patches::{Patch, PatchGroup};

/// Patches carried by one [`PatchBatch`] event; larger groups are split into
/// several batches (all but the last marked `has_more`).
pub const PATCH_BATCH_LEN: usize = 4;

/// A committed chunk (`CommitDataRequest.ChunksToMove` without data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkCommit {
    /// Where the chunk is.
    pub location: ChunkLocation,
    /// The buffer to move it into.
    pub target_buffer: BufferId,
}

/// Up to [`PATCH_BATCH_LEN`] patches for one chunk (part or all of one
/// `ChunkToPatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchBatch {
    /// The buffer holding the chunk.
    pub target_buffer: BufferId,
    /// The writer owning the chunk.
    pub writer_id: u16,
    /// The chunk.
    pub chunk_id: u32,
    /// More patches for this chunk follow: keep it "needs patching".
    pub has_more: bool,
    len: u8,
    patches: [Patch; PATCH_BATCH_LEN],
}

impl PatchBatch {
    /// The patches of this batch.
    pub fn patches(&self) -> &[Patch] {
        self.patches.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

/// One entry of a [`CommitQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitEvent {
    /// A chunk to move into a trace buffer.
    Chunk(ChunkCommit),
    /// Patches for an already committed chunk.
    Patches(PatchBatch),
}

/// Storage for the commit events of one writer: `Q - 1` events.
pub struct CommitQueue<const Q: usize> {
    queue: Queue<CommitEvent, Q>,
}

impl<const Q: usize> CommitQueue<Q> {
    /// An empty queue (usable in a `static`). `Q` must be at least 3.
    pub const fn new() -> Self {
        Self {
            queue: Queue::new(),
        }
    }

    /// Splits the queue into the writer's end and the service's end.
    pub fn split(&mut self) -> (CommitSender<'_>, CommitReceiver<'_>) {
        let (tx, rx) = self.queue.split();
        (CommitSender { tx }, CommitReceiver { rx })
    }
}

impl<const Q: usize> Default for CommitQueue<Q> {
    fn default() -> Self {
        Self::new()
    }
}

/// The writer's end of a [`CommitQueue`]; give it to a [`PollingArbiter`].
pub struct CommitSender<'q> {
    tx: Producer<'q, CommitEvent>,
}

impl CommitSender<'_> {
    /// Free slots (a lower bound: the service may be draining meanwhile).
    fn free(&self) -> usize {
        self.tx.capacity().saturating_sub(self.tx.len())
    }
}

/// Why a [`PollingArbiter`] could not be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArbiterError {
    /// The layout has no chunks (`NotPartitioned` or reserved).
    LayoutWithoutChunks(PageLayout),
    /// The queue holds fewer than 2 events; it cannot keep a slot for the
    /// chunk being written.
    QueueTooSmall {
        /// Events the queue holds.
        capacity: usize,
    },
}

impl core::fmt::Display for ArbiterError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::LayoutWithoutChunks(l) => write!(f, "page layout {l:?} has no chunks"),
            Self::QueueTooSmall { capacity } => {
                write!(f, "commit queue holds {capacity} events, need at least 2")
            }
        }
    }
}

impl core::error::Error for ArbiterError {}

/// Counters of a [`PollingArbiter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArbiterStats {
    /// Chunks acquired.
    pub chunks_acquired: u64,
    /// Acquisitions refused because no chunk was free.
    pub smb_full: u64,
    /// Acquisitions refused because the commit queue was full.
    pub queue_full: u64,
    /// Patch groups refused (queue full); the writer retries them.
    pub patches_deferred: u64,
    /// Chunks lost because `BeingWritten → Complete` failed (a peer broke
    /// the page header).
    pub release_failures: u64,
    /// Complete chunks freed unread because their commit could not be
    /// queued (cannot happen while the module invariants hold).
    pub commits_lost: u64,
}

/// The firmware arbiter of one writer: chunks from a shared [`Smb`], commits
/// into a [`CommitQueue`]. See the module docs.
pub struct PollingArbiter<'s, 'q> {
    smb: &'s Smb<'s>,
    layout: PageLayout,
    next_page: usize,
    tx: CommitSender<'q>,
    stats: ArbiterStats,
}

impl<'s, 'q> PollingArbiter<'s, 'q> {
    /// An arbiter partitioning free pages of `smb` with `layout`.
    pub fn new(
        smb: &'s Smb<'s>,
        layout: PageLayout,
        tx: CommitSender<'q>,
    ) -> Result<Self, ArbiterError> {
        if layout.num_chunks() == 0 {
            return Err(ArbiterError::LayoutWithoutChunks(layout));
        }
        let capacity = tx.tx.capacity();
        if capacity < 2 {
            return Err(ArbiterError::QueueTooSmall { capacity });
        }
        Ok(Self {
            smb,
            layout,
            next_page: 0,
            tx,
            stats: ArbiterStats::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> ArbiterStats {
        self.stats
    }

    /// The SMB chunks come from.
    pub fn smb(&self) -> &'s Smb<'s> {
        self.smb
    }
}

impl<'s> ChunkArbiter<'s> for PollingArbiter<'s, '_> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        if self.tx.free() < 2 {
            self.stats.queue_full += 1;
            return None;
        }
        match self
            .smb
            .try_acquire_any_chunk_for_writing(self.next_page, self.layout, header)
        {
            Ok(chunk) => {
                self.next_page = chunk.location().page;
                self.stats.chunks_acquired += 1;
                Some(chunk)
            }
            Err(_) => {
                self.stats.smb_full += 1;
                None
            }
        }
    }

    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, target_buffer: BufferId) {
        let Ok(location) = chunk.release_as_complete() else {
            self.stats.release_failures += 1;
            return;
        };
        let event = CommitEvent::Chunk(ChunkCommit {
            location,
            target_buffer,
        });
        if self.tx.tx.enqueue(event).is_err() {
            self.stats.commits_lost += 1;
            // Nobody will be told about the chunk: free it rather than leak it.
            let _ = self
                .smb
                .release_complete_as_free(location.page, location.chunk);
        }
    }

    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        let batches = group.len().div_ceil(PATCH_BATCH_LEN);
        if self.tx.free() < batches + 1 {
            self.stats.patches_deferred += 1;
            return Err(PatchesDeferred);
        }
        let mut patches = group.patches();
        for i in 0..batches {
            let mut batch = PatchBatch {
                target_buffer: group.target_buffer,
                writer_id: group.writer_id,
                chunk_id: group.chunk_id,
                has_more: i + 1 < batches || group.has_more,
                len: 0,
                patches: [Patch::default(); PATCH_BATCH_LEN],
            };
            for (slot, patch) in batch.patches.iter_mut().zip(patches.by_ref()) {
                *slot = patch;
                batch.len += 1;
            }
            // Room for every batch was checked above.
            if self.tx.tx.enqueue(CommitEvent::Patches(batch)).is_err() {
                return Err(PatchesDeferred);
            }
        }
        Ok(())
    }

    fn flush(&mut self) {
        // Events are visible to the service as soon as they are queued.
    }
}

/// The service's end of a [`CommitQueue`].
pub struct CommitReceiver<'q> {
    rx: Consumer<'q, CommitEvent>,
}

/// What [`CommitReceiver::drain`] hands to its callback.
#[derive(Debug)]
pub enum Drained<'a> {
    /// A chunk moved out of the SMB: `bytes` is the whole chunk (8-byte
    /// header, then payload), copied before the chunk was freed.
    Chunk {
        /// The buffer to move it into.
        target_buffer: BufferId,
        /// Where it was.
        location: ChunkLocation,
        /// The validated header (from the copy).
        header: ChunkHeaderRepr,
        /// The copy.
        bytes: &'a [u8],
    },
    /// Patches to apply to a chunk moved earlier.
    Patches(&'a PatchBatch),
}

/// Counters of [`CommitReceiver::drain`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Chunks copied and freed.
    pub chunks_moved: u64,
    /// Patch batches passed on.
    pub patch_batches: u64,
    /// Commit events whose chunk was not `Complete` (or out of range).
    pub chunks_not_complete: u64,
    /// Chunks freed without a usable copy (buffer too small, invalid header).
    pub chunks_dropped: u64,
    /// Chunks that could not be freed (a peer broke the page header).
    pub release_failures: u64,
}

impl CommitReceiver<'_> {
    /// The next event, if any.
    pub fn poll(&mut self) -> Option<CommitEvent> {
        self.rx.dequeue()
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// `true` if no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.len() == 0
    }

    /// Processes every waiting event: for a chunk commit, takes the chunk
    /// (`Complete → BeingRead`), copies it into `buf` (which must hold a
    /// whole chunk: page size - 8 bytes covers every layout), frees it, and
    /// calls `f` with the copy; patch batches are passed to `f` as they are.
    pub fn drain<F>(&mut self, smb: &Smb<'_>, buf: &mut [u8], mut f: F) -> DrainStats
    where
        F: FnMut(Drained<'_>),
    {
        let mut stats = DrainStats::default();
        while let Some(event) = self.rx.dequeue() {
            match event {
                CommitEvent::Chunk(ChunkCommit {
                    location,
                    target_buffer,
                }) => {
                    let Ok(chunk) =
                        smb.try_acquire_chunk_for_reading(location.page, location.chunk)
                    else {
                        stats.chunks_not_complete += 1;
                        continue;
                    };
                    let copied = chunk.copy_out(buf);
                    if chunk.release_as_free().is_err() {
                        stats.release_failures += 1;
                    }
                    match copied
                        .ok()
                        .and_then(|c| Some((c.header, buf.get(..c.len)?)))
                    {
                        Some((header, bytes)) => {
                            stats.chunks_moved += 1;
                            f(Drained::Chunk {
                                target_buffer,
                                location,
                                header,
                                bytes,
                            });
                        }
                        None => stats.chunks_dropped += 1,
                    }
                }
                CommitEvent::Patches(batch) => {
                    stats.patch_batches += 1;
                    f(Drained::Patches(&batch));
                }
            }
        }
        stats
    }
}
