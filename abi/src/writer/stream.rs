//! The writer's byte stream over a sequence of chunks: the [`Sink`] the
//! protobuf encoder writes packets into.
//!
//! # Invariants
//!
//! * While a packet is written for real (`!discarding`), `chunk` is `Some`,
//!   `frag_header + 4 <= frag_start <= cursor <= capacity`, and the current
//!   fragment is the last one counted in the chunk header.
//! * A [`ChunkSlot::Inline`] slot always points into the *current* chunk:
//!   every chunk switch rewrites the inline slots of the still-open nested
//!   messages into patch entries (normal crossing) or detaches them (packet
//!   abandoned).
//! * The header's `packets` word is stored (release) only when a fragment is
//!   started in an existing chunk, when a finished packet inflates the count
//!   for scrapers, and when a chunk is handed over with new flags. The
//!   per-packet fast path therefore does exactly one atomic store.
//! * If the count is inflated, at least one payload byte is free, so the
//!   chunk can always be padded with an empty fragment before release.
//! * A packet is either written whole or dropped whole: a packet abandoned
//!   mid-way has the drop sentinel in the size field of its last fragment,
//!   and the chunk holding it is released at once (a v1 service ignores the
//!   rest of a chunk after a sentinel).
//! * The held chunk's window limit
//!   ([`WritableChunk::set_window_limit`]) is 0 unless the count is
//!   inflated, no packet is open, nothing must be put in front of the next
//!   packet (no loss to mark, not the sequence's first packet) and no patch
//!   waits for delivery; then it also ends where the count could pass
//!   [`MAX_FRAGMENTS_PER_CHUNK`] (every packet takes at least its size
//!   byte, so the count grows no faster than `cursor`). So
//!   [`ChunkStream::write_small_packet_in_place`] checks one bound: a
//!   window at `cursor` within the limit; it publishes a packet with the
//!   count's one store and delivers no patches (there are none). The
//!   limit is worked out in one place ([`ChunkStream::open_fast_path`]),
//!   from the state alone: after each packet the general paths write, and
//!   when the fast path finds the count's budget spent (a limit short of
//!   the chunk's end but not 0). A new chunk starts with a limit of 0, and
//!   everything else that puts something in front of the next packet (a
//!   packet begun, a loss) sets it to 0.

use crate::layout::{ChunkFlags, ChunkHeaderRepr, Packets, MAX_PACKET_COUNT};
use crate::proto::wire::{
    redundant_varint4, DROP_SENTINEL_BYTES, MAX_ONE_BYTE_LEN, SIZE_FIELD_LEN,
};
use crate::proto::{Cursor, Sink, SMALL_WRITE_LEN};
use crate::smb::{OutOfBounds, Window, WritableChunk, WINDOW_LEN, WINDOW_SLACK};

use super::arbiter::{BufferId, ChunkArbiter};
use super::patches::PatchFifo;
use super::{DropReason, WriterStats};

/// Start a packet in a new chunk if fewer bytes than this are left: the
/// 4-byte size field plus 8 bytes of packet ("chunk too full").
pub const MIN_PACKET_ROOM: usize = SIZE_FIELD_LEN + 8;

/// Bytes [`TraceWriter::write_encoded_packet_in`](super::TraceWriter::write_encoded_packet_in) copies at once from a
/// caller's scratch buffer when the packet is no longer.
pub const PADDED_COPY_LEN: usize = 64;

/// The variable-length copy of [`ChunkStream::try_copy_whole_packet`],
/// kept out of line: merged with the fixed-size one, both would become a
/// `memcpy` call.
#[inline(never)]
fn write_unpadded(
    chunk: &mut WritableChunk<'_>,
    at: usize,
    packet: &[u8],
) -> Result<(), OutOfBounds> {
    chunk.write(at, packet)
}

/// Most fragments a writer puts in one chunk: one below the 10-bit maximum,
/// so the count can always be inflated once more for a scraper.
pub const MAX_FRAGMENTS_PER_CHUNK: u16 = MAX_PACKET_COUNT - 1;

/// The window limit of a chunk whose fast path may take the next packet at
/// `cursor`, `count` (at most [`MAX_FRAGMENTS_PER_CHUNK`]) fragments in:
/// a window's end, plus a byte for each fragment the count has left. Every
/// packet takes at least its size byte, so the count cannot pass
/// [`MAX_FRAGMENTS_PER_CHUNK`] before the cursor passes the limit. The
/// in-place writers' one bound ([`crate::smb::WritableChunk::set_window_limit`]).
#[inline(always)]
pub(super) const fn fast_path_limit(cursor: usize, count: u16) -> usize {
    cursor + WINDOW_LEN + WINDOW_SLACK + (MAX_FRAGMENTS_PER_CHUNK - count) as usize
}

/// Where the size field of an open nested message lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkSlot {
    /// In the current chunk, at this payload offset.
    Inline(u16),
    /// In the writer's patch FIFO, entry with this sequence number.
    Patch(u32),
    /// Nowhere: the packet is being discarded.
    Detached,
}

/// The chunk stream of one writer. See the module invariants.
pub struct ChunkStream<'s, A, const P: usize> {
    arbiter: A,
    writer_id: u16,
    target_buffer: BufferId,
    next_chunk_id: u32,

    chunk: Option<WritableChunk<'s>>,
    chunk_id: u32,
    capacity: usize,
    cursor: usize,
    count: u16,
    flags: ChunkFlags,
    inflated: bool,

    frag_header: usize,
    frag_start: usize,
    frag_base: u32,
    continuation: bool,
    discarding: bool,
    discard_pos: u32,
    drop_reason: Option<DropReason>,
    pending_loss: u32,
    in_packet: bool,
    first_packet: bool,

    patches: PatchFifo<P>,
    stats: WriterStats,
}

impl<'s, A: ChunkArbiter<'s>, const P: usize> ChunkStream<'s, A, P> {
    pub(crate) fn new(arbiter: A, writer_id: u16, target_buffer: BufferId) -> Self {
        Self {
            arbiter,
            writer_id,
            target_buffer,
            next_chunk_id: 0,
            chunk: None,
            chunk_id: 0,
            capacity: 0,
            cursor: 0,
            count: 0,
            flags: ChunkFlags::EMPTY,
            inflated: false,
            frag_header: 0,
            frag_start: 0,
            frag_base: 0,
            continuation: false,
            discarding: false,
            discard_pos: 0,
            drop_reason: None,
            pending_loss: 0,
            in_packet: false,
            first_packet: true,
            patches: PatchFifo::new(),
            stats: WriterStats::new(),
        }
    }

    pub(crate) fn stats(&self) -> &WriterStats {
        &self.stats
    }

    pub(crate) fn stats_mut(&mut self) -> &mut WriterStats {
        &mut self.stats
    }

    pub(crate) fn arbiter(&self) -> &A {
        &self.arbiter
    }

    pub(crate) fn arbiter_mut(&mut self) -> &mut A {
        &mut self.arbiter
    }

    pub(crate) fn pending_patches(&self) -> usize {
        P - self.patches.free()
    }

    /// What a scraper would copy from the current chunk: its `packets` word
    /// and payload.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> Option<(Packets, std::vec::Vec<u8>)> {
        let chunk = self.chunk.as_ref()?;
        let mut payload = std::vec![0u8; self.capacity];
        chunk.read_back(0, &mut payload).ok()?;
        Some((chunk.packets(), payload))
    }

    #[cfg(test)]
    pub(crate) fn set_next_chunk_id(&mut self, id: u32) {
        self.next_chunk_id = id;
    }

    pub(crate) fn next_chunk_id(&self) -> u32 {
        self.next_chunk_id
    }

    pub(crate) fn drop_reason(&self) -> Option<DropReason> {
        self.drop_reason
    }

    /// Loss bits the next written packet must carry (field 42), 0 if none.
    pub(crate) fn pending_loss(&self) -> u32 {
        self.pending_loss
    }

    /// No packet has been written yet (the next one carries field 87).
    pub(crate) fn first_packet(&self) -> bool {
        self.first_packet
    }

    /// A packet was begun and not finished yet.
    pub(crate) fn in_packet(&self) -> bool {
        self.in_packet
    }

    fn header(&self, packets: Packets) -> ChunkHeaderRepr {
        ChunkHeaderRepr {
            chunk_id: self.next_chunk_id,
            writer_id: self.writer_id,
            packets,
        }
    }

    fn packets(&self) -> Packets {
        // `count` never exceeds MAX_PACKET_COUNT (capped at
        // MAX_FRAGMENTS_PER_CHUNK + 1 by the inflation), so `new` succeeds.
        Packets::new(self.count, self.flags).unwrap_or(Packets::EMPTY)
    }

    fn publish_packets(&self) {
        if let Some(chunk) = &self.chunk {
            chunk.set_packets(self.packets());
        }
    }

    #[inline]
    fn chunk_write(&mut self, offset: usize, bytes: &[u8]) {
        if let Some(chunk) = &mut self.chunk {
            // In bounds by the module invariants; a failure would only lose
            // bytes of our own chunk, never memory safety.
            let _ = chunk.write(offset, bytes);
        }
    }

    /// Installs a freshly acquired chunk (header already written by the
    /// arbiter with `count`/`flags`).
    fn install(&mut self, chunk: WritableChunk<'s>, count: u16, flags: ChunkFlags) {
        self.capacity = chunk.capacity();
        self.chunk = Some(chunk);
        self.chunk_id = self.next_chunk_id;
        self.next_chunk_id = self.next_chunk_id.wrapping_add(1);
        self.cursor = 0;
        self.count = count;
        self.flags = flags;
        self.inflated = false;
    }

    /// Hands the current chunk (between packets) to the arbiter, padding an
    /// inflated count with an empty fragment first.
    fn return_chunk(&mut self) {
        if self.inflated {
            let at = self.cursor;
            self.chunk_write(at, &[0]);
            self.cursor += 1;
            self.inflated = false;
        }
        if let Some(mut chunk) = self.chunk.take() {
            chunk.set_used(self.cursor);
            self.arbiter.commit_chunk(chunk, self.target_buffer);
            self.stats.chunks_committed += 1;
        }
        self.deliver_patches();
    }

    /// Offers every ready patch group to the arbiter, in FIFO order.
    #[inline]
    pub(crate) fn deliver_patches(&mut self) {
        if !self.patches.is_empty() {
            self.deliver_patches_slow();
        }
    }

    #[cold]
    fn deliver_patches_slow(&mut self) {
        while let Some(group) = self.patches.ready_group(self.target_buffer, self.writer_id) {
            let n = group.len();
            if self.arbiter.send_patches(&group).is_err() {
                self.stats.patch_deliveries_deferred += 1;
                return;
            }
            self.stats.patch_groups_sent += 1;
            self.patches.pop_front(n);
        }
    }

    /// Starts a packet: makes sure a chunk with room is available, counts
    /// the new fragment and reserves its size field. Returns `false` if the
    /// packet is dropped (no chunk available).
    pub(crate) fn begin_packet(&mut self) -> bool {
        self.in_packet = true;
        self.discarding = false;
        self.drop_reason = None;
        self.continuation = false;
        let need_chunk = match &self.chunk {
            None => true,
            Some(_) => {
                let next_count = if self.inflated {
                    self.count
                } else {
                    self.count + 1
                };
                self.capacity.saturating_sub(self.cursor) < MIN_PACKET_ROOM
                    || next_count > MAX_FRAGMENTS_PER_CHUNK
            }
        };
        if need_chunk {
            // Between packets nothing in the full chunk is needed any more:
            // hand it back before asking for a new one, so a stalling arbiter
            // never waits while this writer holds a chunk (hold-and-wait).
            if self.chunk.is_some() {
                self.return_chunk();
            }
            let packets = Packets::new(1, ChunkFlags::EMPTY).unwrap_or(Packets::EMPTY);
            match self.arbiter.acquire_chunk(self.header(packets)) {
                Some(chunk) => self.install(chunk, 1, ChunkFlags::EMPTY),
                None => {
                    self.discarding = true;
                    self.discard_pos = 0;
                    self.drop_reason = Some(DropReason::SmbFull);
                    self.pending_loss |= DropReason::SmbFull.loss_bits();
                    return false;
                }
            }
        } else {
            // A packet is open: the fast path refuses (invariants).
            self.refuse_fast_path();
            if self.inflated {
                self.inflated = false;
            } else {
                self.count += 1;
                self.publish_packets();
            }
        }
        self.frag_header = self.cursor;
        self.cursor += SIZE_FIELD_LEN;
        self.frag_start = self.cursor;
        self.frag_base = 0;
        self.deliver_patches();
        true
    }

    /// Between packets, while no chunk is held (none yet, or packets were
    /// lost for want of one): asks the arbiter for one now, so a caller
    /// learns that its packet would be dropped before encoding it. `true`
    /// if a chunk is held afterwards (acquired with a count of 0: the next
    /// packet is its first, as upstream's writer does); `false` if none was
    /// available, and one packet is counted as dropped (SMB full) with the
    /// loss marked on the next packet written, exactly as if the caller's
    /// packet had been begun and dropped.
    pub(crate) fn ensure_chunk(&mut self) -> bool {
        if self.chunk.is_some() || self.in_packet {
            return true;
        }
        match self.arbiter.acquire_chunk(self.header(Packets::EMPTY)) {
            Some(chunk) => {
                self.install(chunk, 0, ChunkFlags::EMPTY);
                true
            }
            None => {
                self.drop_unwritten(DropReason::SmbFull);
                false
            }
        }
    }

    /// Writes a whole, already-encoded packet into the current chunk with a
    /// 1-byte size (at most 127 bytes) or else the general path's 4-byte
    /// one, if it fits there and nothing
    /// else must be prepended (no pending loss, not the sequence's first
    /// packet, no packet open). The bytes and the chunk state end up exactly
    /// as [`begin_packet`](Self::begin_packet) + writing + [`finish_packet`](Self::finish_packet)
    /// would leave them, with a single release store of the count. Returns
    /// `false`, having changed nothing, when the general path must be taken.
    ///
    /// The packet is `buf[..len]`; when `buf` holds at least
    /// [`PADDED_COPY_LEN`] bytes, the packet is that short and the chunk has
    /// the room, the first `PADDED_COPY_LEN` bytes are copied instead (one
    /// fixed-size copy, no `memcpy` call): the bytes past the packet land in
    /// free payload space, beyond the last fragment, that later writes
    /// overwrite and readers never parse.
    #[inline]
    pub(crate) fn try_copy_whole_packet(&mut self, buf: &[u8], len: usize) -> bool {
        let Some(packet) = buf.get(..len) else {
            return false;
        };
        if self.in_packet || self.first_packet || self.pending_loss != 0 {
            return false;
        }
        let Some(chunk) = &mut self.chunk else {
            return false;
        };
        let room = self.capacity.saturating_sub(self.cursor);
        // `count` after the fragment: an inflated count already includes it.
        let count = if self.inflated {
            self.count
        } else {
            self.count + 1
        };
        // Same "chunk too full" rule as `begin_packet`, and the packet must
        // fit behind a 4-byte size reservation like the general path's (so
        // both split packets at the same places).
        if room < MIN_PACKET_ROOM || room < SIZE_FIELD_LEN + len || count > MAX_FRAGMENTS_PER_CHUNK
        {
            return false;
        }
        let at = self.cursor;
        if len > MAX_ONE_BYTE_LEN as usize {
            // As `finish_packet` leaves a packet too long to compact.
            let size = redundant_varint4(len as u32);
            if chunk.write(at, &size).is_err()
                || write_unpadded(chunk, at + SIZE_FIELD_LEN, packet).is_err()
            {
                return false;
            }
            self.cursor = at + SIZE_FIELD_LEN + len;
        } else {
            let padded: Option<&[u8; PADDED_COPY_LEN]> = buf
                .get(..PADDED_COPY_LEN)
                .and_then(|b| b.try_into().ok())
                .filter(|_| len <= PADDED_COPY_LEN && room > PADDED_COPY_LEN);
            let copied = match padded {
                Some(block) => chunk.write(at + 1, block),
                None => write_unpadded(chunk, at + 1, packet),
            };
            if copied.is_err() || chunk.write_u8(at, len as u8).is_err() {
                return false;
            }
            self.cursor = at + 1 + len;
        }
        self.inflated = false;
        self.stats.packets_written += 1;
        self.seal_packet(count);
        self.deliver_patches();
        self.open_fast_path();
        true
    }

    /// Sets the held chunk's window limit (module invariants): where the
    /// count could pass [`MAX_FRAGMENTS_PER_CHUNK`] if the fast path may
    /// take the next packet, else 0. The one place that works it out, after
    /// each packet a general path writes (and its patches offered).
    fn open_fast_path(&mut self) {
        let open = self.inflated
            && !self.in_packet
            && !self.first_packet
            && self.pending_loss == 0
            && self.patches.is_empty()
            && self.count <= MAX_FRAGMENTS_PER_CHUNK;
        let limit = if open {
            fast_path_limit(self.cursor, self.count)
        } else {
            0
        };
        if let Some(chunk) = &mut self.chunk {
            chunk.set_window_limit(limit);
        }
    }

    /// Refuses the fast path (a window limit of 0) until
    /// [`Self::open_fast_path`] works the limit out again.
    fn refuse_fast_path(&mut self) {
        if let Some(chunk) = &mut self.chunk {
            chunk.set_window_limit(0);
        }
    }

    /// Works the window limit out again when the fast path found none
    /// within it although the limit is neither 0 nor the chunk's end: the
    /// count's budget ran out, and the packets written since may leave it
    /// more. `true` if a window at the cursor is within the new limit.
    #[cold]
    #[inline(never)]
    fn reopen_fast_path(&mut self) -> bool {
        self.open_fast_path();
        let at = self.cursor;
        self.chunk
            .as_mut()
            .is_some_and(|chunk| chunk.limited_window(at).is_some())
    }

    /// Encodes a packet of at most 127 bytes in place, behind a 1-byte
    /// size, in the common case: `encode` writes the packet's fields through
    /// a [`Cursor`] over a [`Window`] whose index 0 is the size byte (the
    /// cursor starts at 1) and returns `false` to give up. `false` (nothing
    /// committed; the window's bytes lie in free payload space that later
    /// writes overwrite and readers never parse) if the packet cannot take
    /// this path: the window at the cursor passes the chunk's window limit
    /// (a packet is open, loss must be marked first, it is the sequence's
    /// first packet or its chunk's first, a patch waits, the chunk lacks a
    /// whole window or the count its room: module invariants), or the
    /// packet is longer than 127 bytes. Packets it declines go the general
    /// way, whose rules split packets at the same places.
    #[inline(always)]
    pub(crate) fn write_small_packet_in_place(
        &mut self,
        encode: impl FnOnce(&mut Cursor<Window<'_>>) -> bool,
    ) -> bool {
        let at = self.cursor;
        let Some(mut chunk) = self.chunk.as_mut() else {
            return false;
        };
        // Within the limit: the count is inflated, it has room, nothing goes
        // first and no patch waits (invariants). The size byte, up to 127
        // bytes of packet, the slack: all in the payload, so the general
        // path's rule (room for a 4-byte size and the packet) holds too.
        let window = match chunk.limited_window(at) {
            Some(window) => window,
            None => {
                // Out of count budget rather than room: the limit again.
                let limit = chunk.window_limit();
                if limit == 0 || limit == self.capacity || !self.reopen_fast_path() {
                    return false;
                }
                let Some(again) = self.chunk.as_mut() else {
                    return false;
                };
                chunk = again;
                let Some(window) = chunk.limited_window(at) else {
                    return false;
                };
                window
            }
        };
        let mut c = Cursor::new_at(window, 1);
        if !encode(&mut c) {
            return false;
        }
        let Some(end) = c.finish() else {
            return false;
        };
        c.put_at(0, (end - 1) as u8);
        // The packet took the inflated slot; the count grows by one more for
        // the next packet (a window always leaves a byte free), one release
        // store. The limit stays: it already allows for this packet.
        let next = self.count + 1;
        chunk.set_packets(Packets::masked(next, self.flags));
        self.count = next;
        self.cursor = at + end;
        self.stats.packets_written += 1;
        true
    }

    /// Counts a packet dropped before any of it was written and marks the
    /// loss on the next one.
    pub(crate) fn drop_unwritten(&mut self, reason: DropReason) {
        self.pending_loss |= reason.loss_bits();
        // The loss goes in front of the next packet (invariants).
        self.refuse_fast_path();
        match reason {
            DropReason::SmbFull => self.stats.packets_dropped_smb_full += 1,
            DropReason::PatchStorageFull => self.stats.packets_dropped_patch_storage += 1,
            DropReason::PacketTooLong => self.stats.packets_dropped_too_long += 1,
        }
    }

    /// Abandons the packet being written: sentinel into its last fragment's
    /// size field, inline size slots detached, chunk released, rest of the
    /// packet discarded.
    pub(crate) fn abandon(&mut self, open: &mut [ChunkSlot], reason: DropReason) {
        if self.discarding {
            return;
        }
        let pos = self.position();
        let at = self.frag_header;
        self.chunk_write(at, &DROP_SENTINEL_BYTES);
        for slot in open.iter_mut() {
            if matches!(slot, ChunkSlot::Inline(_)) {
                *slot = ChunkSlot::Detached;
            }
        }
        self.inflated = false;
        if let Some(mut chunk) = self.chunk.take() {
            chunk.set_used(self.cursor);
            self.arbiter.commit_chunk(chunk, self.target_buffer);
            self.stats.chunks_committed += 1;
        }
        self.discarding = true;
        self.discard_pos = pos;
        self.drop_reason = Some(reason);
        self.pending_loss |= reason.loss_bits();
        self.deliver_patches();
    }

    /// Moves the packet being written into a new chunk (the current one is
    /// full). On failure the packet is abandoned.
    fn cross(&mut self, open: &mut [ChunkSlot]) {
        let inline = open
            .iter()
            .filter(|s| matches!(s, ChunkSlot::Inline(_)))
            .count();
        if self.patches.free() < inline {
            // Delivered-but-deferred groups may be accepted by now.
            self.deliver_patches();
            if self.patches.free() < inline {
                self.abandon(open, DropReason::PatchStorageFull);
                return;
            }
        }
        let packets = Packets::new(1, ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK)
            .unwrap_or(Packets::EMPTY);
        let Some(new) = self.arbiter.acquire_chunk(self.header(packets)) else {
            self.abandon(open, DropReason::SmbFull);
            return;
        };
        let pos = self.position();
        let size = self.cursor.saturating_sub(self.frag_start) as u32;
        let at = self.frag_header;
        self.chunk_write(at, &redundant_varint4(size));
        self.flags = self.flags | ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK;
        for slot in open.iter_mut() {
            if let ChunkSlot::Inline(offset) = *slot {
                // Room was checked above.
                *slot = match self.patches.push(self.chunk_id, offset) {
                    Some(seq) => ChunkSlot::Patch(seq),
                    None => ChunkSlot::Detached,
                };
                self.flags = self.flags | ChunkFlags::CHUNK_NEEDS_PATCHING;
            }
        }
        self.publish_packets();
        if let Some(mut old) = self.chunk.take() {
            old.set_used(self.cursor);
            self.arbiter.commit_chunk(old, self.target_buffer);
            self.stats.chunks_committed += 1;
        }
        self.install(new, 1, ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
        self.frag_header = 0;
        self.cursor = SIZE_FIELD_LEN;
        self.frag_start = SIZE_FIELD_LEN;
        self.frag_base = pos;
        self.continuation = true;
        self.deliver_patches();
    }

    /// Ends the packet: writes the last fragment's size, inflates the count
    /// for scrapers (or returns a chunk with no room left), delivers ready
    /// patches. Returns `false` if the packet was dropped.
    pub(crate) fn finish_packet(&mut self) -> bool {
        self.in_packet = false;
        if self.discarding {
            self.discarding = false;
            self.deliver_patches();
            return false;
        }
        let size = self.cursor.saturating_sub(self.frag_start);
        let at = self.frag_header;
        if self.continuation || size > MAX_ONE_BYTE_LEN as usize || !self.compact(at, size) {
            self.chunk_write(at, &redundant_varint4(size as u32));
        }
        self.seal_packet(self.count);
        self.pending_loss = 0;
        self.first_packet = false;
        self.deliver_patches();
        self.open_fast_path();
        true
    }

    /// After a packet's last fragment, `count` fragments in the chunk:
    /// inflates the count for scrapers if a byte is left, else publishes the
    /// count and returns the full chunk. (The count comes in a register: the
    /// fast path computed it, and reloading a just-stored `u16` stalls.)
    #[inline]
    fn seal_packet(&mut self, count: u16) {
        if self.capacity > self.cursor {
            self.count = count + 1;
            self.inflated = true;
        } else {
            self.count = count;
        }
        let packets = Packets::new(self.count, self.flags).unwrap_or(Packets::EMPTY);
        if let Some(chunk) = &self.chunk {
            chunk.set_packets(packets);
        }
        if !self.inflated {
            self.return_chunk();
        }
    }

    /// Rewrites the 4-byte size field at `at` (followed by a `size`-byte
    /// body ending at the cursor, `size <= 127`) as a 1-byte size, moving the
    /// body back. Returns `false` (nothing changed) if that was impossible.
    fn compact(&mut self, at: usize, size: usize) -> bool {
        let mut body = [0u8; MAX_ONE_BYTE_LEN as usize];
        let (Some(body), Some(chunk)) = (body.get_mut(..size), &mut self.chunk) else {
            return false;
        };
        if chunk.read_back(at + SIZE_FIELD_LEN, body).is_err() {
            return false;
        }
        let _ = chunk.write_u8(at, size as u8);
        let _ = chunk.write(at + 1, body);
        self.cursor -= SIZE_FIELD_LEN - 1;
        true
    }

    /// Returns the current chunk (flush), padding an inflated count.
    pub(crate) fn flush(&mut self) {
        if self.chunk.is_some() {
            self.return_chunk();
        }
        self.deliver_patches();
        self.arbiter.flush();
    }

    /// Slow path of [`Sink::write`]: fills the chunk, crosses to the next.
    #[cold]
    fn write_slow(&mut self, mut bytes: &[u8], open: &mut [ChunkSlot]) {
        loop {
            if self.discarding || self.chunk.is_none() {
                self.discard_pos = self.discard_pos.wrapping_add(bytes.len() as u32);
                return;
            }
            let n = bytes.len().min(self.capacity.saturating_sub(self.cursor));
            let (now, rest) = bytes.split_at(n);
            let at = self.cursor;
            self.chunk_write(at, now);
            self.cursor += n;
            if rest.is_empty() {
                return;
            }
            bytes = rest;
            self.cross(open);
        }
    }
}

impl<'s, A: ChunkArbiter<'s>, const P: usize> Sink for ChunkStream<'s, A, P> {
    type Slot = ChunkSlot;

    #[inline]
    fn write(&mut self, bytes: &[u8], open: &mut [ChunkSlot]) {
        if !self.discarding {
            if let Some(chunk) = &mut self.chunk {
                let end = self.cursor + bytes.len();
                if end <= self.capacity {
                    let _ = chunk.write(self.cursor, bytes);
                    self.cursor = end;
                    return;
                }
            }
        }
        self.write_slow(bytes, open);
    }

    #[inline]
    fn write_small(&mut self, buf: &[u8; SMALL_WRITE_LEN], len: usize, open: &mut [ChunkSlot]) {
        if !self.discarding {
            if let Some(chunk) = &mut self.chunk {
                if self.cursor + SMALL_WRITE_LEN <= self.capacity {
                    // The bytes past `len` land in unused payload space that
                    // later writes overwrite.
                    let _ = chunk.write(self.cursor, buf);
                    self.cursor += len;
                    return;
                }
            }
        }
        self.write_slow(buf.get(..len).unwrap_or(buf), open);
    }

    fn reserve_size_field(&mut self, open: &mut [ChunkSlot]) -> ChunkSlot {
        if !self.discarding && self.capacity.saturating_sub(self.cursor) < SIZE_FIELD_LEN {
            self.cross(open);
        }
        if self.discarding || self.chunk.is_none() {
            self.discard_pos = self.discard_pos.wrapping_add(SIZE_FIELD_LEN as u32);
            return ChunkSlot::Detached;
        }
        let at = self.cursor;
        self.cursor += SIZE_FIELD_LEN;
        ChunkSlot::Inline(at as u16)
    }

    #[inline]
    fn position(&self) -> u32 {
        if self.discarding {
            self.discard_pos
        } else {
            self.frag_base
                .wrapping_add(self.cursor.saturating_sub(self.frag_start) as u32)
        }
    }

    fn fill_size_field(&mut self, slot: ChunkSlot, size: u32) {
        match slot {
            ChunkSlot::Inline(offset) => {
                let at = usize::from(offset);
                if self.discarding {
                    return;
                }
                let contiguous = at + SIZE_FIELD_LEN + size as usize == self.cursor;
                if size > MAX_ONE_BYTE_LEN || !contiguous || !self.compact(at, size as usize) {
                    self.chunk_write(at, &redundant_varint4(size));
                }
            }
            ChunkSlot::Patch(seq) => self.patches.fill(seq, redundant_varint4(size)),
            ChunkSlot::Detached => {}
        }
    }
}
