//! The firmware's [`ChunkArbiter`]: chunks from the region's SMB, commits
//! and patches into its ring.
//!
//! # Behaviour
//!
//! * Acquire: scans pages round-robin from the page of the last chunk it
//!   got, partitions free pages with its layout and takes the first free
//!   chunk ([`Smb::try_acquire_any_chunk_for_writing`]).
//! * Commit: `BeingWritten → Complete`, then one CHUNK slot (writer, chunk
//!   id, page, chunk, payload bytes used). Ring full: the chunk stays
//!   `Complete` and `ring_overflows` is incremented; a consumer that sees
//!   the counter move finds the chunk by scanning the SMB, so nothing is
//!   lost. A chunk whose release fails (a peer broke the page header) is
//!   counted in `chunks_lost`.
//! * Patches: one PATCH slot per patch, the whole group claimed at once;
//!   all but the group's last carry `has_more` (the last carries the
//!   group's). No room for the whole group: [`PatchesDeferred`], and the
//!   writer offers it again later. A ring smaller than a writer's patch
//!   capacity can therefore stall that writer's patches: give the ring at
//!   least as many slots as the writers' patch FIFOs hold.
//! * The target buffer is not recorded: a firmware region feeds one
//!   producer, and the host picks the buffer.
//! * Writers that ask ([`ChunkArbiter::tracing_enabled`],
//!   [`ChunkArbiter::clear_epoch`]) see the host's `trace_enabled` and
//!   `clear_request` words: a track event writer skips events while the
//!   host does not record, and restarts its sequence when the host asks.
//!
//! Every path is a handful of atomics and word stores: no `memcpy`, no
//! formatting, no panic.

use crate::layout::{ChunkHeaderRepr, PageLayout};
use crate::smb::{Smb, WritableChunk};
use crate::writer::{BufferId, ChunkArbiter, PatchGroup, PatchesDeferred};

use super::control::Control;
use super::ring;
use super::storage::RegionHandles;
use super::wire::{ChunkSlot, PatchSlot, SlotRepr};

/// Why a [`RegionArbiter`] could not be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArbiterError {
    /// The layout has no chunks (`NotPartitioned` or reserved).
    LayoutWithoutChunks(PageLayout),
}

impl core::fmt::Display for ArbiterError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::LayoutWithoutChunks(l) => write!(f, "page layout {l:?} has no chunks"),
        }
    }
}

impl core::error::Error for ArbiterError {}

/// The arbiter of one writer over a region. Several arbiters (one per
/// writer: thread, interrupts, another core) share one region lock-free.
///
/// ```
/// use shmtrace_abi::layout::PageLayout;
/// use shmtrace_abi::region::{RegionArbiter, RegionConfig, RegionStorage};
/// use shmtrace_abi::writer::{PacketOutcome, TraceWriter};
///
/// let mut storage = Box::new(RegionStorage::<8192, 16>::new());
/// let handles = storage.init(&RegionConfig::new("fw.track_event")).unwrap();
/// let arbiter = RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
/// let mut writer: TraceWriter<_> = TraceWriter::new(arbiter, 1, 0).unwrap();
/// assert_eq!(writer.write_packet(|p| p.uint64(8, 100)), PacketOutcome::Written);
/// writer.flush();
/// assert_eq!(handles.control.counters().ring_head, 1); // one CHUNK slot
/// ```
#[derive(Debug)]
pub struct RegionArbiter<'s> {
    smb: &'s Smb<'s>,
    control: Control<'s>,
    layout: PageLayout,
    next_page: usize,
}

impl<'s> RegionArbiter<'s> {
    /// An arbiter partitioning free pages with `layout`.
    pub fn new(handles: &RegionHandles<'s>, layout: PageLayout) -> Result<Self, ArbiterError> {
        if layout.num_chunks() == 0 {
            return Err(ArbiterError::LayoutWithoutChunks(layout));
        }
        Ok(RegionArbiter {
            smb: handles.smb,
            control: handles.control,
            layout,
            next_page: 0,
        })
    }

    /// The region's control words.
    pub fn control(&self) -> &Control<'s> {
        &self.control
    }
}

impl<'s> ChunkArbiter<'s> for RegionArbiter<'s> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        let chunk = self
            .smb
            .try_acquire_any_chunk_for_writing(self.next_page, self.layout, header)
            .ok()?;
        self.next_page = chunk.location().page;
        Some(chunk)
    }

    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, _target_buffer: BufferId) {
        let header = chunk.header();
        let used = chunk.used() as u32;
        let lost = match chunk.release_as_complete() {
            Ok(location) => {
                let slot = SlotRepr::Chunk(ChunkSlot {
                    writer_id: header.writer_id,
                    chunk_id: header.chunk_id,
                    page: location.page as u16,
                    chunk: location.chunk as u8,
                    used,
                });
                if self.control.ring().push(&slot).is_ok() {
                    return;
                }
                false
            }
            Err(_) => true,
        };
        // One counter update for either failure.
        self.control.count_failed_commit(lost);
    }

    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        let n = group.len();
        let mut patches = group.patches().enumerate();
        ring::try_push(self.control.ring(), n as u32, &mut || {
            let (i, patch) = patches.next().unwrap_or_default();
            SlotRepr::Patch(PatchSlot {
                writer_id: group.writer_id,
                chunk_id: group.chunk_id,
                has_more: i + 1 < n || group.has_more,
                offset: patch.offset,
                data: patch.data,
            })
            .to_body()
        })
        .map_err(|_| PatchesDeferred)
    }

    fn flush(&mut self) {
        // Slots are visible to the consumer as soon as they are published.
    }

    /// The host's `trace_enabled` word.
    #[inline]
    fn tracing_enabled(&self) -> bool {
        self.control.trace_enabled()
    }

    /// The host's `clear_request` word.
    #[inline]
    fn clear_epoch(&self) -> u32 {
        self.control.clear_request()
    }

    /// Counted in the region's `packets_dropped`, which the host reads.
    #[inline]
    fn count_dropped_packet(&mut self) {
        self.control.count_packets_dropped(1);
    }
}
