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
//!   [`MIN_WINDOW_LEN`](crate::smb::MIN_WINDOW_LEN) bytes is left there
//!   and the packet fits the window; otherwise the chunk is committed and
//!   the packet is encoded again at the start of a new one. The tail of the
//!   old chunk stays unused.
//! * A packet longer than 127 bytes is dropped whole
//!   ([`DropReason::PacketTooLong`]); so is every packet while the arbiter
//!   has no chunk to give ([`DropReason::SmbFull`]). Each drop is counted in
//!   [`WriterStats`] and marked on the next packet written
//!   (`previous_packet_dropped`), unless that is the sequence's first
//!   (`first_packet_on_sequence`): a reader cannot tell a mark there from
//!   the one a trace buffer puts on the first packet it reads of every
//!   sequence, so the mark waits for the packet after it.
//!
//! # Invariants
//!
//! * While a chunk is held, `count` is its published fragment count,
//!   `cursor` the payload offset after its last fragment, and the chunk's
//!   flags are empty (nothing ever continues across chunks). `inflated`
//!   says that `count` already includes the next packet's fragment (for a
//!   scraper, the last fragment of a chunk being written is unfinished);
//!   a byte is then free at `cursor` to pad it with an empty fragment
//!   before the chunk is committed.
//! * The held chunk's window limit
//!   ([`WritableChunk::set_window_limit`]) is 0 unless the count is
//!   inflated and nothing must be put in front of the next packet (no loss
//!   to mark, not the sequence's first packet, the fast path not held by
//!   the caller); then it also ends where
//!   the count could pass [`MAX_FRAGMENTS_PER_CHUNK`] (every packet takes
//!   at least its size byte, so the count grows no faster than `cursor`).
//!   So the common case, [`InPlaceWriter::write_fast`], checks one bound:
//!   a window at `cursor` within the limit. The limit is worked out in one
//!   place, after each packet [`InPlaceWriter::write_dyn`] writes;
//!   everything that puts something in front of the next packet (a loss,
//!   the caller's hold) sets it to 0, and releasing the hold leaves it
//!   there until that next packet.
//! * Packets written = the packets of the chunks returned so far plus those
//!   in the chunk held (its count, less the inflated slot): the fast path
//!   counts nothing but the chunk's count. Those it wrote are the packets
//!   written less those [`InPlaceWriter::write_dyn`] counts.

use crate::layout::{ChunkHeaderRepr, Packets, MAX_WRITER_ID};
use crate::proto::wire::WireType;
use crate::proto::Cursor;
use crate::smb::{Window, WritableChunk, WINDOW_LEN};
use crate::trace::{tag2, trace_packet};

use super::arbiter::{BufferId, ChunkArbiter};
use super::stream::{fast_path_limit, MAX_FRAGMENTS_PER_CHUNK};
use super::{DropReason, PacketOutcome, WriterError, WriterStats};

/// The two bytes of the tag of `first_packet_on_sequence` (varint), as a
/// word.
const FIRST_PACKET_TAG: u32 = u16::from_le_bytes(tag2(
    trace_packet::FIRST_PACKET_ON_SEQUENCE,
    WireType::Varint,
)) as u32;
/// The two bytes of the tag of `previous_packet_dropped` (varint), as a
/// word.
const LOSS_TAG: u32 = u16::from_le_bytes(tag2(
    trace_packet::PREVIOUS_PACKET_DROPPED,
    WireType::Varint,
)) as u32;

/// The counters of an [`InPlaceWriter`], 32 bits wide (a firmware writes
/// fewer than 2^32 packets between two reads of them); reported as
/// [`WriterStats`].
#[derive(Debug, Clone, Copy)]
struct Counters {
    /// Packets in the chunks returned to the arbiter (those in the chunk
    /// held are its count: the fast path counts nothing).
    packets_returned: u32,
    /// Packets [`InPlaceWriter::write_dyn`] wrote (the others are the fast
    /// path's).
    packets_dyn: u32,
    dropped_smb_full: u32,
    dropped_patch_storage: u32,
    dropped_too_long: u32,
    chunks_committed: u32,
}

/// Encodes a packet's fields in place: what [`InPlaceWriter::write_dyn`]
/// takes as a trait object. Every `FnMut(&mut Cursor<Window>)` is one
/// ([`packet`] turns a closure into one); a trait of its own rather than
/// `dyn FnMut`, whose every vtable carries a `call_once` shim nobody calls.
pub trait EncodePacket {
    /// Writes the fields through `c`.
    fn encode(&mut self, c: &mut Cursor<Window<'_>>);
}

impl<F: FnMut(&mut Cursor<Window<'_>>)> EncodePacket for F {
    #[inline(always)]
    fn encode(&mut self, c: &mut Cursor<Window<'_>>) {
        self(c)
    }
}

/// `f` as a `&mut dyn EncodePacket` (the closure's argument type is
/// inferred from this signature).
#[inline(always)]
pub fn packet<F: FnMut(&mut Cursor<Window<'_>>)>(f: &mut F) -> &mut dyn EncodePacket {
    f
}

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
// `repr(C)`: what the fast path and the other paths touch most (the flags,
// cursor and count, the chunk's payload and count word) first, within reach
// of the Cortex-M short loads from the writer (bytes to 31, halfwords to
// 62, words to 124). The fields a new writer sets to 0 are one run
// (from `pending_loss` to `stats`) at a 4-byte boundary, cleared with one
// aligned call; the arbiter last.
#[repr(C)]
pub struct InPlaceWriter<'s, A: ChunkArbiter<'s>> {
    held: bool,
    inflated: bool,
    first_packet: bool,
    /// 16 bits: a chunk's payload is below 64 KiB (and the window check
    /// `cursor + WINDOW_LEN + WINDOW_SLACK` cannot overflow).
    cursor: u16,
    count: u16,
    chunk: Option<WritableChunk<'s>>,
    target_buffer: BufferId,
    writer_id: u16,
    /// `previous_packet_dropped` bits the next packet carries (0: none).
    pending_loss: u32,
    next_chunk_id: u32,
    stats: Counters,
    arbiter: A,
}

impl<'s, A: ChunkArbiter<'s>> InPlaceWriter<'s, A> {
    /// A writer with id `writer_id` (1..=32767) committing to buffer
    /// `target_buffer`. The first chunk gets id 0.
    // Inline, with its counters a literal: built in place in the caller's
    // writer (on firmware, a `default()` went through a copy on the stack).
    #[inline(always)]
    pub fn new(arbiter: A, writer_id: u16, target_buffer: BufferId) -> Result<Self, WriterError> {
        if writer_id == 0 || writer_id > MAX_WRITER_ID {
            return Err(WriterError::InvalidWriterId(writer_id));
        }
        Ok(Self {
            chunk: None,
            arbiter,
            first_packet: true,
            held: false,
            inflated: false,
            target_buffer,
            writer_id,
            cursor: 0,
            count: 0,
            next_chunk_id: 0,
            pending_loss: 0,
            stats: Counters {
                packets_returned: 0,
                packets_dyn: 0,
                dropped_smb_full: 0,
                dropped_patch_storage: 0,
                dropped_too_long: 0,
                chunks_committed: 0,
            },
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
    /// The common case ([`InPlaceWriter::write_fast`]) is inlined into the
    /// caller with its encoder; everything else runs in one out-of-line
    /// function shared by every caller ([`InPlaceWriter::write_dyn`]).
    #[inline(always)]
    pub fn try_write(
        &mut self,
        mut encode: impl FnMut(&mut Cursor<Window<'_>>),
    ) -> Result<bool, DropReason> {
        if self.write_fast(&mut encode) {
            Ok(true)
        } else {
            self.write_dyn(&mut encode)
        }
    }

    /// The common case of [`InPlaceWriter::try_write`]: a packet written
    /// behind a 1-byte size into the current chunk, which has a whole
    /// window ([`WINDOW_LEN`] bytes) of room, with nothing to put in front
    /// of it; one release store of the count publishes it. `false`, with
    /// nothing committed, in every other case (or when `encode` writes more
    /// than 127 bytes): then write the packet with
    /// [`InPlaceWriter::write_dyn`].
    #[inline(always)]
    pub fn write_fast(&mut self, encode: impl FnOnce(&mut Cursor<Window<'_>>)) -> bool {
        self.fast::<false>(encode)
    }

    /// [`InPlaceWriter::write_fast`] for an encoder that writes the
    /// packet's 1-byte size itself, first (it knows it: one store fewer).
    /// The size must be the length of what follows it.
    #[inline(always)]
    pub fn write_fast_sized(&mut self, encode: impl FnOnce(&mut Cursor<Window<'_>>)) -> bool {
        self.fast::<true>(encode)
    }

    /// [`InPlaceWriter::write_fast`], the size written by the encoder if
    /// `SIZED`.
    #[inline(always)]
    fn fast<const SIZED: bool>(&mut self, encode: impl FnOnce(&mut Cursor<Window<'_>>)) -> bool {
        let Some(chunk) = self.chunk.as_mut() else {
            return false;
        };
        let at = usize::from(self.cursor);
        // Within the limit: the count is inflated, it has room, and nothing
        // goes first (invariants).
        let Some(window) = chunk.limited_window(at) else {
            return false;
        };
        let mut c = Cursor::new_at(window, usize::from(!SIZED));
        encode(&mut c);
        // At most the window: a 1-byte size and 127 bytes.
        let Some(end) = c.finish() else {
            return false;
        };
        if !SIZED {
            c.put_at(0, (end - 1) as u8);
        }
        // The packet took the inflated slot; the count grows by one more
        // for the next packet (a window always leaves a byte free).
        let next = self.count + 1;
        chunk.set_packets(Packets::from_bits(next));
        self.count = next;
        self.cursor = (at + end) as u16;
        true
    }

    /// [`InPlaceWriter::try_write`] out of line, for every case: takes a new
    /// chunk when the current one lacks room (a chunk's tail shorter than
    /// the packet is left unused), puts `previous_packet_dropped` and
    /// `first_packet_on_sequence` first when due, and runs `encode` again,
    /// from scratch, in a new chunk when the first window was too short.
    /// Compiled once for all callers.
    #[inline(never)]
    pub fn write_dyn(&mut self, encode: &mut dyn EncodePacket) -> Result<bool, DropReason> {
        let mut took = false;
        loop {
            let (at, count, inflated) = (usize::from(self.cursor), self.count, self.inflated);
            let (loss, first) = (self.pending_loss, self.first_packet);
            // The held chunk takes another packet if its count has room
            // and a window of at least `MIN_WINDOW_LEN` bytes is left.
            'room: {
                let Some(chunk) = self.chunk.as_mut() else {
                    break 'room;
                };
                if count + u16::from(!inflated) > MAX_FRAGMENTS_PER_CHUNK {
                    break 'room;
                }
                let Some(window) = chunk.window_at_most(at) else {
                    break 'room;
                };
                let full_window = window.len() == WINDOW_LEN;
                let mut c = Cursor::new_at(window, 1);
                // The sequence's first packet is marked as such, and a loss
                // before it waits for the packet after it: a reader cannot
                // tell a loss mark on a sequence's first packet from the one
                // a trace buffer puts on the first packet it reads of every
                // sequence.
                // One tag and one varint for either field (a bool is a
                // varint 1): with the templates, this is the cursor's only
                // caller of a field writer on firmware, which would link
                // one just for it. Both tags take two bytes, stored with
                // one word store (the window has room past the packet).
                if first || loss != 0 {
                    let (tag, value) = if first {
                        (FIRST_PACKET_TAG, 1)
                    } else {
                        (LOSS_TAG, loss)
                    };
                    c.word32(tag, 2);
                    c.varint(u64::from(value));
                }
                encode.encode(&mut c);
                if let Some(end) = c.finish() {
                    c.put_at(0, (end - 1) as u8);
                    // The packet's fragment, then the inflated one for the
                    // next.
                    let next = count + u16::from(!inflated) + 1;
                    chunk.set_packets(Packets::from_bits(next));
                    self.count = next;
                    self.cursor = (at + end) as u16;
                    self.inflated = true;
                    if !first {
                        self.pending_loss = 0;
                    }
                    self.first_packet = false;
                    // The window limit (invariants), worked out here
                    // only: the count is inflated and the sequence's first
                    // packet written now, so a loss still to mark (after a
                    // first packet) or the caller's hold refuses windows.
                    let limit = if self.pending_loss == 0
                        && !self.held
                        && next <= MAX_FRAGMENTS_PER_CHUNK
                    {
                        fast_path_limit(usize::from(self.cursor), next)
                    } else {
                        0
                    };
                    chunk.set_window_limit(limit);
                    self.stats.packets_dyn = self.stats.packets_dyn.wrapping_add(1);
                    return Ok(true);
                }
                if full_window {
                    return Ok(false);
                }
            }
            // No room, or the window was too short: a new chunk, once (a
            // new chunk without room for the packet cannot take it).
            if took {
                return Ok(false);
            }
            self.take_new_chunk()?;
            took = true;
        }
    }

    /// Refuses the fast path (a window limit of 0) until
    /// [`InPlaceWriter::write_dyn`] writes the next packet, which sets the
    /// limit from the invariants again: for a change that makes something
    /// go in front of the next packet.
    #[inline(always)]
    fn refuse_fast_path(&mut self) {
        if let Some(chunk) = self.chunk.as_mut() {
            chunk.set_window_limit(0);
        }
    }

    /// Holds the fast path ([`InPlaceWriter::write_fast`] refuses every
    /// packet, so each goes through [`InPlaceWriter::write_dyn`]) or
    /// releases it: for a caller with something to do before its next
    /// packet (a sequence restart), which then needs no flag of its own on
    /// its fast path. Released, the fast path takes packets again after the
    /// next packet [`InPlaceWriter::write_dyn`] writes (the limit is set in
    /// that one place).
    // Inline: a new writer's hold is one store (it has no chunk).
    #[inline(always)]
    pub fn hold_fast_path(&mut self, held: bool) {
        self.held = held;
        if held {
            self.refuse_fast_path();
        }
    }

    /// Whether the fast path is held ([`InPlaceWriter::hold_fast_path`]).
    pub fn fast_path_held(&self) -> bool {
        self.held
    }

    /// Returns the current chunk, if any, and takes a new one with a count
    /// of 0 (the next packet is its first). A failure drops the packet
    /// (counted, marked on the next one).
    fn take_new_chunk(&mut self) -> Result<(), DropReason> {
        self.return_chunk();
        if self.acquire() {
            Ok(())
        } else {
            self.count_dropped(DropReason::SmbFull);
            Err(DropReason::SmbFull)
        }
    }

    /// Asks the arbiter for a chunk (count 0); `true` if one is held now.
    fn acquire(&mut self) -> bool {
        let header = ChunkHeaderRepr {
            chunk_id: self.next_chunk_id,
            writer_id: self.writer_id,
            packets: Packets::EMPTY,
        };
        let Some(chunk) = self.arbiter.acquire_chunk(header) else {
            return false;
        };
        self.chunk = Some(chunk);
        self.next_chunk_id = self.next_chunk_id.wrapping_add(1);
        self.cursor = 0;
        self.count = 0;
        self.inflated = false;
        true
    }

    /// Hands the current chunk, if any, to the arbiter, padding an inflated
    /// count with an empty fragment first.
    fn return_chunk(&mut self) {
        // Counted while the chunk is still held: `packets_in_chunk` is 0
        // without one.
        self.stats.packets_returned = self
            .stats
            .packets_returned
            .wrapping_add(self.packets_in_chunk());
        let Some(mut chunk) = self.chunk.take() else {
            return;
        };
        if self.inflated {
            // In bounds: an inflated count leaves a byte free (invariants).
            let _ = chunk.write_u8(usize::from(self.cursor), 0);
            self.cursor += 1;
            self.inflated = false;
        }
        chunk.set_used(usize::from(self.cursor));
        self.arbiter.commit_chunk(chunk, self.target_buffer);
        self.stats.chunks_committed += 1;
    }

    /// Packets written into the chunk held (0 if none).
    fn packets_in_chunk(&self) -> u32 {
        match self.chunk {
            Some(_) => u32::from(self.count) - u32::from(self.inflated),
            None => 0,
        }
    }

    #[cold]
    fn too_long(&mut self) -> PacketOutcome {
        self.count_dropped(DropReason::PacketTooLong);
        PacketOutcome::Dropped(DropReason::PacketTooLong)
    }

    /// Counts a packet the caller gave up on (e.g. too long after
    /// [`InPlaceWriter::try_write`]) as dropped, and marks the loss on the
    /// next packet written. Out of line: a rare path, called from several.
    #[inline(never)]
    pub fn count_dropped(&mut self, reason: DropReason) {
        self.pending_loss |= reason.loss_bits();
        self.refuse_fast_path();
        match reason {
            DropReason::SmbFull => self.stats.dropped_smb_full += 1,
            DropReason::PatchStorageFull => self.stats.dropped_patch_storage += 1,
            DropReason::PacketTooLong => self.stats.dropped_too_long += 1,
        }
        self.arbiter.count_dropped_packet();
    }

    /// Returns the current chunk to the arbiter (even if almost empty) and
    /// asks it to deliver everything now. The next packet starts in a new
    /// chunk.
    pub fn flush(&mut self) {
        self.return_chunk();
        self.arbiter.flush();
    }

    /// Whether a packet written now would find a chunk; `false` (one packet
    /// counted as dropped, the loss marked on the next one) while the
    /// arbiter has none to give. See
    /// [`TraceWriter::ensure_chunk`](super::TraceWriter::ensure_chunk).
    #[inline]
    pub fn ensure_chunk(&mut self) -> bool {
        if self.chunk.is_some() || self.acquire() {
            return true;
        }
        self.count_dropped(DropReason::SmbFull);
        false
    }

    /// Whether the next packet written is the sequence's first (it will
    /// carry `first_packet_on_sequence`).
    pub fn first_packet_pending(&self) -> bool {
        self.first_packet
    }

    /// Whether packets were dropped since the last one written (the next
    /// packet but a sequence's first will carry `previous_packet_dropped`).
    pub fn loss_pending(&self) -> bool {
        self.pending_loss != 0
    }

    /// The writer id.
    pub fn writer_id(&self) -> u16 {
        self.writer_id
    }

    /// The writer's counters.
    pub fn stats(&self) -> WriterStats {
        let s = self.stats;
        WriterStats {
            packets_written: u64::from(s.packets_returned.wrapping_add(self.packets_in_chunk())),
            packets_dropped_smb_full: u64::from(s.dropped_smb_full),
            packets_dropped_patch_storage: u64::from(s.dropped_patch_storage),
            packets_dropped_too_long: u64::from(s.dropped_too_long),
            chunks_committed: u64::from(s.chunks_committed),
            ..WriterStats::default()
        }
    }

    /// Packets the fast paths ([`InPlaceWriter::write_fast`],
    /// [`InPlaceWriter::write_fast_sized`]) wrote, modulo 2^32: a caller
    /// that writes one kind of packet there counts them without a store of
    /// its own.
    pub fn fast_packets(&self) -> u32 {
        let s = self.stats;
        s.packets_returned
            .wrapping_add(self.packets_in_chunk())
            .wrapping_sub(s.packets_dyn)
    }

    /// The arbiter.
    pub fn arbiter(&self) -> &A {
        &self.arbiter
    }

    /// The arbiter, mutably.
    pub fn arbiter_mut(&mut self) -> &mut A {
        &mut self.arbiter
    }
}

impl<'s, A: ChunkArbiter<'s>> Drop for InPlaceWriter<'s, A> {
    fn drop(&mut self) {
        self.flush();
    }
}
