//! [`InPlaceWriter`]: the lean packet writer firmware uses, for packets of
//! at most 127 bytes encoded straight into the chunk.
//!
//! It writes the same chunks a [`TraceWriter`](super::TraceWriter) writes
//! for such packets (1-byte sizes, inflated counts for scrapers, fields 42
//! and 87 first when due), but it holds no encoder stack and no patch
//! storage, and it never fragments: a packet is encoded once, in place,
//! through a [`Cursor`] over a [`Window`] of free payload. So its state is
//! small, and the code it pulls into a firmware image is the chunk
//! acquisition and this one path (no `memcpy`, no `memmove`).
//!
//! # Rules
//!
//! * A packet goes into the current chunk if a window of at least
//!   [`MIN_WINDOW_LEN`](crate::smb::MIN_WINDOW_LEN) bytes is left there and
//!   the packet fits the window; otherwise the chunk is committed and the
//!   packet is encoded again at the start of a new one. The tail of the
//!   old chunk stays unused.
//! * A packet longer than 127 bytes is dropped whole
//!   ([`DropReason::PacketTooLong`]); so is every packet while the arbiter
//!   has no chunk to give ([`DropReason::SmbFull`]). Each drop is counted in
//!   [`WriterStats`] and marked on the next packet written
//!   (`previous_packet_dropped`).

use crate::proto::Cursor;
use crate::smb::Window;

use super::arbiter::{BufferId, ChunkArbiter};
use super::stream::{ChunkStream, InPlaceError};
use super::{DropReason, PacketOutcome, WriterError, WriterStats};
use crate::layout::MAX_WRITER_ID;

/// Writes the small packets of one sequence (one writer id) into chunks
/// from an arbiter `A`. See the module docs.
///
/// ```
/// use shmtrace_abi::layout::{PageLayout, PageSize};
/// use shmtrace_abi::smb::{Smb, SmbStorage};
/// use shmtrace_abi::trace::trace_packet;
/// # use shmtrace_abi::writer::{BufferId, ChunkArbiter, PatchGroup, PatchesDeferred};
/// # use shmtrace_abi::layout::ChunkHeaderRepr;
/// # use shmtrace_abi::smb::WritableChunk;
/// use shmtrace_abi::writer::{InPlaceWriter, PacketOutcome};
/// # struct Arbiter<'s>(&'s Smb<'s>, Vec<u32>);
/// # impl<'s> ChunkArbiter<'s> for Arbiter<'s> {
/// #     fn acquire_chunk(&mut self, h: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
/// #         self.0.try_acquire_any_chunk_for_writing(0, PageLayout::Div4, h).ok()
/// #     }
/// #     fn commit_chunk(&mut self, c: WritableChunk<'s>, _: BufferId) {
/// #         self.1.push(c.header().chunk_id);
/// #         let _ = c.release_as_complete();
/// #     }
/// #     fn send_patches(&mut self, _: &PatchGroup<'_>) -> Result<(), PatchesDeferred> { Ok(()) }
/// #     fn flush(&mut self) {}
/// # }
///
/// let mut storage = Box::new(SmbStorage::<8192>::new());
/// let smb = Smb::new(&mut storage, PageSize::DEFAULT).unwrap();
/// let mut w = InPlaceWriter::new(Arbiter(&smb, Vec::new()), 1, 1).unwrap();
/// let outcome = w.write(|p| p.uint(trace_packet::TIMESTAMP, 100));
/// assert_eq!(outcome, PacketOutcome::Written);
/// w.flush();
/// assert_eq!(w.arbiter().1, [0]); // chunk 0 committed
/// ```
pub struct InPlaceWriter<'s, A: ChunkArbiter<'s>> {
    stream: ChunkStream<'s, A, 0>,
}

impl<'s, A: ChunkArbiter<'s>> InPlaceWriter<'s, A> {
    /// A writer with id `writer_id` (1..=32767) committing to buffer
    /// `target_buffer`. The first chunk gets id 0.
    pub fn new(arbiter: A, writer_id: u16, target_buffer: BufferId) -> Result<Self, WriterError> {
        if writer_id == 0 || writer_id > MAX_WRITER_ID {
            return Err(WriterError::InvalidWriterId(writer_id));
        }
        Ok(Self {
            stream: ChunkStream::new(arbiter, writer_id, target_buffer),
        })
    }

    /// Writes one packet whose fields `encode` writes (it may run twice;
    /// see the module docs) and reports what became of it.
    #[inline(always)]
    pub fn write(&mut self, encode: impl FnMut(&mut Cursor<Window<'_>>)) -> PacketOutcome {
        match self.try_write(encode) {
            Ok(true) => PacketOutcome::Written,
            Ok(false) => self.too_long(),
            Err(reason) => PacketOutcome::Dropped(reason),
        }
    }

    /// Like [`InPlaceWriter::write`], but a packet longer than 127 bytes is
    /// not dropped: `Ok(false)` says so (nothing counted, nothing marked),
    /// so the caller can split it. `Err` if the packet was dropped for
    /// want of a chunk.
    ///
    /// The common case (a chunk with room for a whole window, nothing to
    /// put in front of the packet) is inlined into the caller with its
    /// encoder; everything else runs in one out-of-line function shared by
    /// every caller.
    #[inline(always)]
    pub fn try_write(
        &mut self,
        mut encode: impl FnMut(&mut Cursor<Window<'_>>),
    ) -> Result<bool, DropReason> {
        let fast = self.stream.write_small_packet_in_place(
            #[inline(always)]
            |c| {
                encode(c);
                true
            },
        );
        if fast {
            Ok(true)
        } else {
            self.try_write_slow(&mut encode)
        }
    }

    #[inline(never)]
    fn try_write_slow(
        &mut self,
        encode: &mut dyn FnMut(&mut Cursor<Window<'_>>),
    ) -> Result<bool, DropReason> {
        match self.stream.put_in_place(encode) {
            Ok(()) => Ok(true),
            Err(InPlaceError::Dropped(reason)) => Err(reason),
            Err(InPlaceError::TooLong) => Ok(false),
        }
    }

    #[cold]
    fn too_long(&mut self) -> PacketOutcome {
        self.count_dropped(DropReason::PacketTooLong);
        PacketOutcome::Dropped(DropReason::PacketTooLong)
    }

    /// Counts a packet the caller gave up on (e.g. too long after
    /// [`InPlaceWriter::try_write`]) as dropped, and marks the loss on the
    /// next packet written.
    pub fn count_dropped(&mut self, reason: DropReason) {
        self.stream.drop_unwritten(reason);
    }

    /// Returns the current chunk to the arbiter (even if almost empty) and
    /// asks it to deliver everything now. The next packet starts in a new
    /// chunk.
    pub fn flush(&mut self) {
        self.stream.flush();
    }

    /// Whether a packet written now would find a chunk; `false` (one packet
    /// counted as dropped, the loss marked on the next one) while the
    /// arbiter has none to give. See
    /// [`TraceWriter::ensure_chunk`](super::TraceWriter::ensure_chunk).
    #[inline]
    pub fn ensure_chunk(&mut self) -> bool {
        self.stream.ensure_chunk()
    }

    /// The writer id.
    pub fn writer_id(&self) -> u16 {
        self.stream.writer_id()
    }

    /// The writer's counters.
    pub fn stats(&self) -> WriterStats {
        *self.stream.stats()
    }

    /// The arbiter.
    pub fn arbiter(&self) -> &A {
        self.stream.arbiter()
    }

    /// The arbiter, mutably.
    pub fn arbiter_mut(&mut self) -> &mut A {
        self.stream.arbiter_mut()
    }
}

impl<'s, A: ChunkArbiter<'s>> Drop for InPlaceWriter<'s, A> {
    fn drop(&mut self) {
        self.flush();
    }
}
