//! The seam between a [`TraceWriter`](super::TraceWriter) and whoever owns
//! the shared memory buffer and talks to the service.
//!
//! A std producer implements [`ChunkArbiter`] by batching chunk commits and
//! patches into `CommitData` IPCs; firmware without IPC uses
//! [`RegionArbiter`](crate::region::RegionArbiter), which publishes them in
//! the commit ring of a shared-RAM region.

use crate::layout::ChunkHeaderRepr;
use crate::smb::WritableChunk;

use super::patches::PatchGroup;

/// Global id of a service trace buffer (`DataSourceConfig.target_buffer`).
pub type BufferId = u16;

/// The arbiter could not take patches now; the writer keeps them and offers
/// them again later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchesDeferred;

impl core::fmt::Display for PatchesDeferred {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("no room to queue patches now")
    }
}

impl core::error::Error for PatchesDeferred {}

/// Supplies chunks to a writer and delivers what it produces.
///
/// Implementations are called only from the writer's thread, between (never
/// during) the writer's own accesses to a chunk.
pub trait ChunkArbiter<'s> {
    /// Takes a free chunk (`Free → BeingWritten`, partitioning a page if
    /// needed) and initializes its header with `header`. `None` means the
    /// SMB is exhausted (or the arbiter cannot accept another commit): the
    /// writer then drops packets until a later acquisition succeeds.
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>>;

    /// Takes back a finished chunk: marks it `Complete` and arranges for the
    /// service to move it into `target_buffer`. Must not lose it silently:
    /// an implementation that cannot deliver must count the loss.
    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, target_buffer: BufferId);

    /// Delivers one group of patches (one `ChunkToPatch`). Returning
    /// [`PatchesDeferred`] keeps them in the writer for a later attempt.
    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred>;

    /// The writer was flushed: deliver pending commits now rather than after
    /// any batching delay.
    fn flush(&mut self);

    /// Whether whoever consumes the chunks records packets now. Writers
    /// that can skip work check it before each packet (a firmware region's
    /// host clears it while no session records the firmware). Always `true`
    /// unless an implementation says otherwise.
    #[inline]
    fn tracing_enabled(&self) -> bool {
        true
    }

    /// A number the consumer changes to ask every writer to clear its
    /// sequence's incremental state (a session started and must see the
    /// interned strings and descriptors again). Constant (0) unless an
    /// implementation says otherwise.
    #[inline]
    fn clear_epoch(&self) -> u32 {
        0
    }

    /// The writer dropped a packet (no chunk, too long, no room for its
    /// patches). Its next packet marks the loss in the trace; an arbiter
    /// whose consumer keeps loss counters (a firmware region's
    /// `packets_dropped`) counts it here too, so a loss at the end of what
    /// the writer wrote is counted as well. Nothing by default.
    #[inline]
    fn count_dropped_packet(&mut self) {}
}

impl<'s, A: ChunkArbiter<'s> + ?Sized> ChunkArbiter<'s> for &mut A {
    #[inline]
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        (**self).acquire_chunk(header)
    }

    #[inline]
    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, target_buffer: BufferId) {
        (**self).commit_chunk(chunk, target_buffer)
    }

    #[inline]
    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        (**self).send_patches(group)
    }

    #[inline]
    fn flush(&mut self) {
        (**self).flush()
    }

    #[inline]
    fn tracing_enabled(&self) -> bool {
        (**self).tracing_enabled()
    }

    #[inline]
    fn clear_epoch(&self) -> u32 {
        (**self).clear_epoch()
    }

    #[inline]
    fn count_dropped_packet(&mut self) {
        (**self).count_dropped_packet()
    }
}
