//! The producer-side `TraceWriter`: writes TracePackets into SMB chunks.
//!
//! A [`TraceWriter`] owns one packet sequence (one writer id). Packets are
//! protobuf messages written with the [`proto`](crate::proto) encoder
//! straight into the chunk the writer holds; when a chunk fills up in the
//! middle of a packet the packet continues as a new fragment in the next
//! chunk, and size fields left behind in the released chunk are delivered
//! later as patches.
//!
//! # Protocol behaviour (Perfetto SMB ABI v1)
//!
//! * Every packet starts a fragment with a 4-byte size field; a packet that
//!   ends in the chunk it began in and is at most 127 bytes gets a 1-byte
//!   size, otherwise the size is a 4-byte redundant varint.
//! * A packet is started in a new chunk when fewer than
//!   [`MIN_PACKET_ROOM`] (12) bytes are left or the chunk already holds
//!   [`MAX_FRAGMENTS_PER_CHUNK`] (1022) fragments.
//! * Crossing a chunk boundary mid-packet: the old fragment's size is
//!   back-filled, the old chunk gets `LastPacketContinuesOnNextChunk` (and
//!   `ChunkNeedsPatching` if open nested size fields lie in it, which become
//!   patch entries), the new chunk starts with count 1 and
//!   `FirstPacketContinuesFromPrevChunk`.
//! * After finishing a packet the writer bumps the count right away so a
//!   scraping service sees the packet as complete ("inflated" count); the
//!   next packet reuses that slot, and a chunk returned while inflated is
//!   padded with an empty fragment (`00`).
//! * Chunk ids start at 0 and wrap at 2^32. The writer's first packet
//!   carries `first_packet_on_sequence = true` (field 87).
//!
//! # Losing data, never corrupting it
//!
//! * No chunk available (SMB exhausted, service not draining): packets are
//!   dropped whole. A packet already begun gets the drop sentinel
//!   (`FF FF FF 7F`) in its current fragment's size field, its chunk is
//!   released, and its open size fields in that chunk are detached. The first
//!   packet written after recovery carries `previous_packet_dropped = 257`
//!   (`PRESENT | SMB_FULL` of [`data_loss`], field 42). The writer tries to
//!   get a chunk again at every packet start.
//! * Patch storage full (the arbiter is not taking patches, or a packet
//!   spans chunks with more open nested messages than the FIFO holds): the
//!   packet that would need another entry is abandoned the same way and the
//!   next packet carries `previous_packet_dropped = 1`.
//! * A nested message over 2^28 - 1 bytes: the packet is abandoned the same
//!   way. Nested messages deeper than [`MAX_DEPTH`](crate::proto::MAX_DEPTH)
//!   and fields with invalid numbers are left out of an otherwise valid
//!   packet ([`PacketOutcome::Incomplete`]).
//!
//! Every loss is counted in [`WriterStats`].
//!
//! # Performance
//!
//! The per-packet fast path takes no lock, allocates nothing and does one
//! atomic operation: the release store of the chunk's packet count.
//! Atomics on the page header happen only when a chunk is acquired or
//! released. A caller that encodes small packets itself (a track event is
//! ~10-40 bytes) hands them over whole with
//! [`TraceWriter::write_encoded_packet`] / [`TraceWriter::write_encoded_packet_in`]:
//! when the packet fits the current chunk that is a 1-byte size, one copy
//! (a fixed-size one from a scratch buffer) and the count store, and it
//! leaves exactly the chunks `write_packet` would.

mod arbiter;
mod in_place;
mod patches;
mod stream;
#[cfg(test)]
mod tests;

use core::ops::{Deref, DerefMut};

use crate::layout::MAX_WRITER_ID;
use crate::proto::{Cursor, EncodeError, Encoder, Message};
use crate::smb::Window;
use crate::trace::{data_loss, trace_packet};

pub use arbiter::{BufferId, ChunkArbiter, PatchesDeferred};
pub use in_place::{packet, EncodePacket, InPlaceWriter};
pub use patches::{Patch, PatchGroup};
pub use stream::{
    ChunkSlot, ChunkStream, MAX_FRAGMENTS_PER_CHUNK, MIN_PACKET_ROOM, PADDED_COPY_LEN,
};

/// Default capacity of a writer's pending-patch FIFO.
pub const DEFAULT_PATCH_CAPACITY: usize = 32;

/// Why a packet was dropped whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DropReason {
    /// No chunk could be acquired (SMB exhausted).
    SmbFull,
    /// The packet needed a patch entry and the FIFO was full.
    PatchStorageFull,
    /// A nested message exceeded the 2^28 - 1 byte size limit.
    PacketTooLong,
}

impl DropReason {
    /// The `previous_packet_dropped` bits the next packet carries.
    pub const fn loss_bits(self) -> u32 {
        match self {
            Self::SmbFull => data_loss::PRESENT | data_loss::SMB_FULL,
            Self::PatchStorageFull | Self::PacketTooLong => data_loss::PRESENT,
        }
    }
}

impl core::fmt::Display for DropReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::SmbFull => "shared memory buffer full",
            Self::PatchStorageFull => "pending-patch storage full",
            Self::PacketTooLong => "nested message too long",
        })
    }
}

/// What happened to a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum PacketOutcome {
    /// Written whole.
    Written,
    /// Written, but some fields were left out (the error says why: invalid
    /// field number, nesting too deep).
    Incomplete(EncodeError),
    /// Dropped whole.
    Dropped(DropReason),
}

/// Counters of one writer. Nothing the writer loses goes uncounted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Packets written (including [`PacketOutcome::Incomplete`] ones).
    pub packets_written: u64,
    /// Packets written with fields left out.
    pub packets_incomplete: u64,
    /// Nested messages left out for exceeding the nesting limit.
    pub nested_messages_dropped: u64,
    /// Packets dropped because no chunk was available.
    pub packets_dropped_smb_full: u64,
    /// Packets dropped because the patch FIFO was full.
    pub packets_dropped_patch_storage: u64,
    /// Packets dropped for a nested message over the size limit.
    pub packets_dropped_too_long: u64,
    /// Chunks handed to the arbiter.
    pub chunks_committed: u64,
    /// Patch groups delivered to the arbiter.
    pub patch_groups_sent: u64,
    /// Times the arbiter deferred a patch group.
    pub patch_deliveries_deferred: u64,
}

impl WriterStats {
    const fn new() -> Self {
        Self {
            packets_written: 0,
            packets_incomplete: 0,
            nested_messages_dropped: 0,
            packets_dropped_smb_full: 0,
            packets_dropped_patch_storage: 0,
            packets_dropped_too_long: 0,
            chunks_committed: 0,
            patch_groups_sent: 0,
            patch_deliveries_deferred: 0,
        }
    }

    /// All packets dropped whole.
    pub fn packets_dropped(&self) -> u64 {
        self.packets_dropped_smb_full
            + self.packets_dropped_patch_storage
            + self.packets_dropped_too_long
    }
}

/// Why a writer could not be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriterError {
    /// Writer ids are 1..=32767.
    InvalidWriterId(u16),
}

impl core::fmt::Display for WriterError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::InvalidWriterId(id) => write!(f, "writer id {id} is outside 1..={MAX_WRITER_ID}"),
        }
    }
}

impl core::error::Error for WriterError {}

/// The message type packet fields are written through.
pub type PacketMessage<'w, 's, A, const P: usize> = Message<'w, ChunkStream<'s, A, P>>;

/// Writes the packets of one sequence into chunks supplied by an arbiter
/// `A`, with room for `P` pending patches. See the module docs.
///
/// ```
/// use shmtrace_abi::layout::PageLayout;
/// use shmtrace_abi::region::{RegionArbiter, RegionConfig, RegionReader, RegionStorage};
/// use shmtrace_abi::writer::{TraceWriter, PacketOutcome};
///
/// let mut storage = Box::new(RegionStorage::<16384, 8>::new());
/// let handles = storage.init(&RegionConfig::new("example")).unwrap();
/// let arbiter = RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
/// let mut writer: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
/// let outcome = writer.write_packet(|p| {
///     p.uint64(8, 100); // timestamp
///     p.nested(11, |te| te.uint32(9, 3)); // track_event { type: INSTANT }
/// });
/// assert_eq!(outcome, PacketOutcome::Written);
/// writer.flush();
/// let mut reader = RegionReader::attach(&handles).unwrap();
/// let mut buf = vec![0u8; reader.chunk_buffer_len()];
/// assert!(reader.poll(&mut buf).unwrap().is_some()); // the committed chunk
/// ```
pub struct TraceWriter<'s, A: ChunkArbiter<'s>, const P: usize = DEFAULT_PATCH_CAPACITY> {
    enc: Encoder<ChunkStream<'s, A, P>>,
    writer_id: u16,
    target_buffer: BufferId,
}

impl<'s, A: ChunkArbiter<'s>, const P: usize> TraceWriter<'s, A, P> {
    /// A writer with id `writer_id` (1..=32767) committing to buffer
    /// `target_buffer`. The first chunk gets id 0.
    pub fn new(arbiter: A, writer_id: u16, target_buffer: BufferId) -> Result<Self, WriterError> {
        if writer_id == 0 || writer_id > MAX_WRITER_ID {
            return Err(WriterError::InvalidWriterId(writer_id));
        }
        Ok(Self {
            enc: Encoder::new(ChunkStream::new(arbiter, writer_id, target_buffer)),
            writer_id,
            target_buffer,
        })
    }

    /// The writer id.
    pub fn writer_id(&self) -> u16 {
        self.writer_id
    }

    /// The buffer this writer commits to.
    pub fn target_buffer(&self) -> BufferId {
        self.target_buffer
    }

    /// Starts a packet. Write its fields through the returned handle (it
    /// derefs to a [`Message`]); the packet ends when the handle is dropped
    /// or [`Packet::finish`]ed.
    pub fn new_packet(&mut self) -> Packet<'_, 's, A, P> {
        self.finish_forgotten_packet();
        let writing = self.enc.sink_and_slots().0.begin_packet();
        if writing {
            let loss = self.enc.sink().pending_loss();
            let first = self.enc.sink().first_packet();
            let mut root = self.enc.root();
            if loss != 0 {
                root.uint32(trace_packet::PREVIOUS_PACKET_DROPPED, loss);
            }
            if first {
                root.bool(trace_packet::FIRST_PACKET_ON_SEQUENCE, true);
            }
        }
        Packet {
            msg: self.enc.root(),
            finished: false,
        }
    }

    /// A [`Packet`] handle that was leaked (`mem::forget`) left its packet
    /// open: finish it now so its fragment stays well-formed.
    fn finish_forgotten_packet(&mut self) {
        if self.enc.sink().in_packet() {
            let _ = finish_packet(&mut self.enc);
        }
    }

    /// Writes one packet with `f` and returns what became of it.
    pub fn write_packet(
        &mut self,
        f: impl FnOnce(&mut PacketMessage<'_, 's, A, P>),
    ) -> PacketOutcome {
        let mut packet = self.new_packet();
        f(&mut packet);
        packet.finish()
    }

    /// Writes one whole, already-encoded TracePacket (its fields, without a
    /// size prefix). Same result and loss semantics as
    /// `write_packet(|p| p.raw(packet))` (fields 42/87 prepended when due,
    /// fragmented across chunks when needed), but a packet that fits the
    /// current chunk costs one copy and one atomic store: no size
    /// reservation, no compaction (a 1-byte size for at most 127 bytes, the
    /// general path's 4-byte one past that).
    #[inline]
    pub fn write_encoded_packet(&mut self, packet: &[u8]) -> PacketOutcome {
        self.write_encoded_packet_in(packet, packet.len())
    }

    /// [`write_encoded_packet`](Self::write_encoded_packet) for the packet
    /// `buf[..len]` in a larger scratch buffer: when `buf` has at least
    /// [`PADDED_COPY_LEN`] bytes and the packet is no longer, the writer may
    /// copy that fixed-size block whole (cheaper than a variable-length
    /// copy); the bytes past the packet land in free chunk space that is
    /// never read as data. `len > buf.len()` writes nothing: the packet
    /// is dropped as too long (counted, and marked on the next packet).
    #[inline]
    pub fn write_encoded_packet_in(&mut self, buf: &[u8], len: usize) -> PacketOutcome {
        if self.enc.sink_and_slots().0.try_copy_whole_packet(buf, len) {
            return PacketOutcome::Written;
        }
        match buf.get(..len) {
            Some(packet) => self.write_packet(|p| p.raw(packet)),
            None => {
                let reason = DropReason::PacketTooLong;
                self.enc.sink_and_slots().0.drop_unwritten(reason);
                PacketOutcome::Dropped(reason)
            }
        }
    }

    /// Encodes a small packet straight into the current chunk: `encode`
    /// writes the packet's fields (no size prefix) through a [`Cursor`]
    /// into free payload bytes, and returns `false` to give up. Returns
    /// `true` if the packet was written (one byte of size, the fields, one
    /// atomic store); `false` if this path was not available (no chunk or
    /// a new one, too little room or count left in it, a packet open, a
    /// patch waiting for delivery, a loss or the sequence's first packet
    /// to mark first, or the packet is longer than 127 bytes): nothing was
    /// committed and the caller writes the packet another way.
    #[inline]
    pub fn write_small_packet_in_place(
        &mut self,
        encode: impl FnOnce(&mut Cursor<Window<'_>>) -> bool,
    ) -> bool {
        self.enc
            .sink_and_slots()
            .0
            .write_small_packet_in_place(encode)
    }

    /// Whether a packet written now would find room, asked before encoding
    /// it. While the writer holds no chunk (its last packets were dropped
    /// for want of one, or it has written nothing yet) this asks the
    /// arbiter for one; `false` means none was available and one packet is
    /// counted as dropped (SMB full, marked on the next packet written), so
    /// a caller skips encoding a packet that would be thrown away. Always
    /// `true` while a chunk is held (a full one is exchanged when the next
    /// packet begins, as usual).
    #[inline]
    pub fn ensure_chunk(&mut self) -> bool {
        self.enc.sink_and_slots().0.ensure_chunk()
    }

    /// Returns the current chunk to the arbiter (even if almost empty),
    /// offers pending patches, and asks the arbiter to deliver everything
    /// now. The next packet starts in a new chunk.
    pub fn flush(&mut self) {
        self.finish_forgotten_packet();
        self.enc.sink_and_slots().0.flush();
    }

    /// The writer's counters.
    pub fn stats(&self) -> WriterStats {
        let mut stats = *self.enc.sink().stats();
        stats.nested_messages_dropped = u64::from(self.enc.dropped_messages());
        stats
    }

    /// Patch entries waiting to be filled or delivered.
    pub fn pending_patches(&self) -> usize {
        self.enc.sink().pending_patches()
    }

    /// The id the next acquired chunk will get.
    pub fn next_chunk_id(&self) -> u32 {
        self.enc.sink().next_chunk_id()
    }

    /// The arbiter.
    pub fn arbiter(&self) -> &A {
        self.enc.sink().arbiter()
    }

    /// The arbiter, mutably (e.g. to poll its statistics or queue).
    pub fn arbiter_mut(&mut self) -> &mut A {
        self.enc.sink_and_slots().0.arbiter_mut()
    }

    #[cfg(test)]
    pub(crate) fn set_next_chunk_id(&mut self, id: u32) {
        self.enc.sink_and_slots().0.set_next_chunk_id(id);
    }
}

impl<'s, A: ChunkArbiter<'s>, const P: usize> Drop for TraceWriter<'s, A, P> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Ends the packet being written on `enc`: closes open nested messages,
/// abandons the packet if a size overflowed, finalizes the fragment, counts.
fn finish_packet<'s, A: ChunkArbiter<'s>, const P: usize>(
    enc: &mut Encoder<ChunkStream<'s, A, P>>,
) -> PacketOutcome {
    enc.close_all();
    let error = enc.take_error();
    let (stream, open) = enc.sink_and_slots();
    if let Some(EncodeError::MessageTooLong(_)) = error {
        stream.abandon(open, DropReason::PacketTooLong);
    }
    let written = stream.finish_packet();
    let stats = stream.stats_mut();
    if written {
        stats.packets_written += 1;
        match error {
            None => PacketOutcome::Written,
            Some(e) => {
                stats.packets_incomplete += 1;
                PacketOutcome::Incomplete(e)
            }
        }
    } else {
        let reason = stream.drop_reason().unwrap_or(DropReason::SmbFull);
        let stats = stream.stats_mut();
        match reason {
            DropReason::SmbFull => stats.packets_dropped_smb_full += 1,
            DropReason::PatchStorageFull => stats.packets_dropped_patch_storage += 1,
            DropReason::PacketTooLong => stats.packets_dropped_too_long += 1,
        }
        stream.arbiter_mut().count_dropped_packet();
        PacketOutcome::Dropped(reason)
    }
}

/// A packet being written. Derefs to its root [`Message`]; ends when dropped.
pub struct Packet<'w, 's, A: ChunkArbiter<'s>, const P: usize> {
    msg: PacketMessage<'w, 's, A, P>,
    finished: bool,
}

impl<'s, A: ChunkArbiter<'s>, const P: usize> Packet<'_, 's, A, P> {
    /// Ends the packet and reports what became of it.
    pub fn finish(mut self) -> PacketOutcome {
        self.finished = true;
        finish_packet(self.msg.encoder_mut())
    }
}

impl<'w, 's, A: ChunkArbiter<'s>, const P: usize> Deref for Packet<'w, 's, A, P> {
    type Target = PacketMessage<'w, 's, A, P>;
    fn deref(&self) -> &Self::Target {
        &self.msg
    }
}

impl<'s, A: ChunkArbiter<'s>, const P: usize> DerefMut for Packet<'_, 's, A, P> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.msg
    }
}

impl<'s, A: ChunkArbiter<'s>, const P: usize> Drop for Packet<'_, 's, A, P> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = finish_packet(self.msg.encoder_mut());
        }
    }
}
