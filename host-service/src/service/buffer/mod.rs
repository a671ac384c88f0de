//! The trace buffer: where committed chunks wait for the consumer.
//!
//! A [`TraceBuffer`] stores copies of producers' chunks in a fixed-size byte
//! ring (`ring`) and hands out whole packets, per writer sequence, in the
//! order they were written ([`TraceBuffer::read`]). It is sans-IO: no
//! sockets, no shared memory, no clock — the service copies chunks out of
//! the SMB (or receives them over IPC) and passes the copies in.
//!
//! # Semantics (what a consumer sees)
//!
//! * Chunks are keyed by `{producer, writer, chunk_id}`; the producer id is
//!   the trusted id of the connection, never a value the producer wrote.
//!   Chunk ids wrap at 2^32 (`sequence` docs).
//! * **Copy, then parse.** A commit parses the fragments of its (private)
//!   copy once to find the valid prefix; only that prefix is stored. A
//!   malformed tail is an ABI violation; a drop sentinel counts as
//!   `trace_writer_packet_loss`. Both are reported as data loss at the point
//!   of the sequence where they happened.
//! * **One copy from shared memory.** [`TraceBuffer::reserve`] hands out room
//!   for a whole chunk at the write cursor; the service copies the chunk from
//!   the producer's SMB straight into it, and [`Reservation::commit`] parses
//!   that private copy in place and shrinks the record to the valid prefix.
//!   A reservation only takes room that holds nothing a reader still needs:
//!   free bytes or records already read (dead space). Where a live record or
//!   a wrap padding is in the way, there is no reservation; the service copies
//!   the chunk privately and [`TraceBuffer::commit`] evicts exactly what the
//!   valid prefix needs, once the chunk is known to be stored. So a chunk
//!   that is discarded after it was copied into a reservation (invalid
//!   header, writer not allowed) leaves nothing behind: giving the
//!   reservation back removes its record and any wrap padding placed with
//!   it, restores the write cursor and undoes its byte, padding and wrap
//!   counts. A chunk that turns out not to be new (re-commit, stale) is moved
//!   to a private copy and committed as usual.
//! * **Re-commits** of a stored chunk (a scrape, then the real commit) replace
//!   the copy when the fragment count does not shrink, no flag disappears and
//!   a complete copy is not replaced by an incomplete one; otherwise they are
//!   ABI violations and ignored. An identical re-commit is a no-op. A
//!   scraped copy the reader had read (in part) may be evicted before the
//!   producer commits the chunk: the commit is still stored, and read from
//!   where the evicted copy ended, so nothing is lost and nothing is read
//!   twice (upstream reads it again from its start).
//! * **Fill policies.** Ring buffer: the oldest records are evicted
//!   (unread ones count as overwritten). Discard: the first write that would
//!   evict unread data latches the buffer; every later new chunk is
//!   discarded (upstream's V1 DISCARD: the trace keeps its beginning).
//! * **Reading** is destructive and per sequence in chunk-id order. Records
//!   are visited oldest first and each sequence is read up to the visited
//!   chunk, which approximates the global write order across sequences.
//!   Packets spanning chunks are reassembled at read time; a packet whose
//!   chunk still needs patching, or whose next chunk has not arrived or was
//!   scraped unfinished, makes its sequence wait (other sequences go on) —
//!   unless the read is a [`ReadMode::Drain`] or the sequence is closed.
//! * **Gaps never stall a sequence.** A missing chunk id with later chunks
//!   present is skipped at once and reported; a chunk arriving after the
//!   reader moved past its id is refused as stale (`chunks_discarded`). The
//!   only waits are for data that a live producer is still expected to
//!   send, and they end at the final drain or when the chunk is evicted.
//! * **Loss reporting.** The first packet a sequence yields after any loss
//!   carries [`DataLoss`] bits (Perfetto's `TracePacket.DataLossReason`,
//!   protos/perfetto/trace/trace_packet.proto)
//!   saying why: gaps, overwrites, corrupt chunks, orphaned continuations,
//!   failed reassemblies, writer aborts. Unlike upstream V1 (a bare `1` on
//!   every sequence's first packet) a sequence that starts at chunk 0 and
//!   loses nothing reports nothing; unlike V2, a sequence whose first chunk
//!   read is not chunk 0 reports a gap.
//! * **A closed sequence's trailing loss is marked too.** A sequence that
//!   will get no more commits (its producer gone, its writer unregistered)
//!   and lost data after its last packet (a packet spanning chunks whose
//!   rest, or whose patches, never came: a producer killed mid-packet; a
//!   writer's abort or a corrupt tail in its last chunk) yields, once read
//!   to its end, an empty packet carrying that loss: only the service's
//!   trusted fields, `previous_packet_dropped` among them. (Upstream keeps
//!   such a loss for a next packet that never comes: `TraceBuffer`'s
//!   per-sequence `data_loss_reasons`, src/tracing/service/trace_buffer_v2.cc.)
//!   The unfinished rest of a chunk scraped while being written is no
//!   known loss there (a writer's count includes the slot of a packet it
//!   has not begun, so an idle writer's open chunk looks the same): it is
//!   marked only if a packet follows it. A live producer's sequence at a
//!   session's final [`ReadMode::Drain`] is not marked this way: what it
//!   left unfinished is cut by the session's end, as with DISCARD a full
//!   buffer's refusals are (counted in the buffer statistics), and a
//!   trace keeps upstream's clean prefix.
//! * **Patches** apply to the stored copy only if the chunk of that producer
//!   is still stored (not read, not evicted), at offsets inside its stored
//!   bytes ([`shmtrace_abi::reader::apply_patches`] rules).
//!
//! # Memory
//!
//! The ring is the configured size. Every record is charged
//! [`RECORD_OVERHEAD`] bytes on top of its data, which bounds the number of
//! records and index entries by `size / 16`; sequences without chunks are
//! bounded by `sequence::MAX_EMPTY_SEQUENCES`.

mod loss;
mod read;
mod ring;
mod sequence;
mod stats;
#[cfg(test)]
mod tests;
mod writers;

use shmtrace_abi::layout::{ChunkFlags, ChunkHeaderRepr, Packets, CHUNK_HEADER_SIZE};
use shmtrace_abi::reader::{
    apply_patches, ChunkError, FragmentEvent, Fragments, PatchOutcome, TooManyPatches,
};
use thiserror::Error;

pub use loss::DataLoss;
pub use read::{Packet, ReadMode, ReadStatus};
pub use ring::{RECORD_ALIGN, RECORD_OVERHEAD};
pub use stats::BufferStats;
pub use writers::{ChunkHistogram, WriterStats, BUCKET_BOUNDS};

use ring::{Owner, Ring};
use sequence::{Resume, Sequences, Slot, Tail};

/// A producer id, assigned by the service per connection.
pub type ProducerId = u16;
/// A writer id, chosen by the producer (1..=32767).
pub type WriterId = u16;

/// What to do when the buffer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillPolicy {
    /// Overwrite the oldest data.
    RingBuffer,
    /// Keep the oldest data; refuse new chunks once full.
    Discard,
}

/// Why a buffer could not be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum BufferError {
    /// The size is below the minimum.
    #[error("trace buffer of {size} bytes is too small (minimum {min})")]
    TooSmall {
        /// Requested size.
        size: usize,
        /// Minimum size.
        min: usize,
    },
}

/// One chunk offered to a buffer: a private copy of its payload and its
/// (untrusted) header fields.
#[derive(Debug, Clone, Copy)]
pub struct ChunkCommit<'a> {
    /// Trusted producer id.
    pub producer: ProducerId,
    /// Writer id from the chunk header.
    pub writer: WriterId,
    /// Chunk id from the chunk header.
    pub chunk_id: u32,
    /// The `packets` word from the chunk header.
    pub packets: Packets,
    /// The chunk payload (after the 8-byte header), copied.
    pub payload: &'a [u8],
    /// `false` for a chunk scraped while still being written: only its first
    /// `count - 1` fragments are finished.
    pub complete: bool,
}

impl<'a> ChunkCommit<'a> {
    /// The commit of a chunk with (copied) `header` and `payload`.
    pub fn new(
        producer: ProducerId,
        header: &ChunkHeaderRepr,
        payload: &'a [u8],
        complete: bool,
    ) -> Self {
        Self {
            producer,
            writer: header.writer_id,
            chunk_id: header.chunk_id,
            packets: header.packets,
            payload,
            complete,
        }
    }
}

/// What [`TraceBuffer::commit`] did with a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// A new chunk was stored.
    Stored,
    /// A stored copy was replaced by a newer version of the same chunk.
    Rewritten,
    /// The same version was already stored (or already read): nothing to
    /// do.
    Duplicate,
    /// The chunk was not stored.
    Refused(Refusal),
}

/// Why a chunk was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Refusal {
    /// The chunk does not fit the buffer (ABI violation).
    #[error("chunk of {footprint} bytes does not fit a {capacity}-byte buffer")]
    TooLarge {
        /// Footprint of the chunk.
        footprint: usize,
        /// Buffer capacity.
        capacity: usize,
    },
    /// The reader already moved past this chunk id.
    #[error("chunk arrived after the reader moved past it")]
    Stale,
    /// The DISCARD policy refused it: the buffer is full.
    #[error("buffer full (discard policy)")]
    Full,
    /// A re-commit that shrinks the fragment count, drops flags, or turns a
    /// complete copy into an incomplete one (ABI violation).
    #[error("invalid re-commit of a stored chunk")]
    InvalidRecommit,
    /// The buffer is a read-only snapshot of a cloned session.
    #[error("the buffer is read-only (a cloned session's)")]
    ReadOnly,
}

/// What [`TraceBuffer::patch`] did with one `ChunkToPatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchResult {
    /// The chunk is stored: patches were applied as `outcome` says.
    Applied(PatchOutcome),
    /// No such chunk stored for this producer (already read, evicted, or
    /// never committed): nothing applied (`patches_failed`).
    ChunkNotFound,
    /// More patches than one group may hold: nothing applied (the service
    /// counts them in `patches_discarded`).
    TooMany(TooManyPatches),
}

/// The valid prefix of a chunk payload, found at commit time.
#[derive(Debug, Clone, Copy)]
struct Parsed {
    count: u16,
    len: usize,
    flags: ChunkFlags,
    tail: Tail,
}

const TAIL_FLAGS: ChunkFlags =
    ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK.union(ChunkFlags::CHUNK_NEEDS_PATCHING);

fn parse(payload: &[u8], packets: Packets, complete: bool) -> Parsed {
    let mut it = if complete {
        Fragments::new(payload, packets)
    } else {
        Fragments::new_incomplete(payload, packets)
    };
    let flags = it.flags();
    let total = if complete {
        packets.count()
    } else {
        packets.count().saturating_sub(1)
    };
    let (count, tail) = loop {
        match it.next() {
            None => break (total, Tail::Clean),
            Some(Ok(FragmentEvent::Data(_))) => {}
            Some(Ok(FragmentEvent::Dropped(d))) => break (d.index, Tail::WriterAbort),
            Some(Err(e)) => {
                let index = match e {
                    ChunkError::CountExceedsContent { found, .. } => found,
                    ChunkError::TruncatedSize { index, .. }
                    | ChunkError::SizeTooLong { index, .. }
                    | ChunkError::FragmentOverflow { index, .. } => index,
                    _ => 0,
                };
                break (index, Tail::Corrupt);
            }
        }
    };
    let len = if count == 0 { 0 } else { it.consumed() };
    let flags = if tail == Tail::Clean {
        flags
    } else {
        flags.difference(TAIL_FLAGS)
    };
    Parsed {
        count,
        len,
        flags,
        tail,
    }
}

/// A trace buffer. See the module docs.
pub struct TraceBuffer {
    ring: Ring,
    seqs: Sequences,
    policy: FillPolicy,
    discard_latched: bool,
    stats: BufferStats,
    writers: WriterStats,
    read: read::ReadState,
    /// Private copy of a reserved chunk that turned out not to be new.
    scratch: Vec<u8>,
    /// A snapshot ([`TraceBuffer::clone_read_only`],
    /// [`TraceBuffer::set_read_only`]): commits, reservations and patches
    /// are refused; only reads change it.
    read_only: bool,
}

impl std::fmt::Debug for TraceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceBuffer")
            .field("capacity", &self.ring.capacity())
            .field("policy", &self.policy)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl TraceBuffer {
    /// Smallest buffer: room for one record of a 4 KiB page's chunk.
    pub const MIN_SIZE: usize = 4096 + 2 * RECORD_OVERHEAD;

    /// A buffer of `size` bytes (rounded down to [`RECORD_ALIGN`]).
    pub fn new(size: usize, policy: FillPolicy) -> Result<Self, BufferError> {
        if size < Self::MIN_SIZE {
            return Err(BufferError::TooSmall {
                size,
                min: Self::MIN_SIZE,
            });
        }
        let capacity = size / RECORD_ALIGN * RECORD_ALIGN;
        Ok(Self {
            ring: Ring::new(capacity),
            seqs: Sequences::default(),
            policy,
            discard_latched: false,
            stats: BufferStats {
                buffer_size: capacity as u64,
                ..BufferStats::default()
            },
            writers: WriterStats::default(),
            read: read::ReadState::default(),
            scratch: Vec::new(),
            read_only: false,
        })
    }

    /// A read-only copy, for a cloned session (upstream:
    /// `TraceBuffer::CloneReadOnly`, src/tracing/service/trace_buffer.h):
    /// the same bytes, sequences, read position, write stats and writer
    /// histograms, so reading the copy yields exactly what reading this
    /// buffer would yield now. Its read counters (bytes and chunks read,
    /// readaheads) start from zero, as upstream's: they count the copy's
    /// own reads. This buffer is left as it was.
    pub fn clone_read_only(&self) -> Self {
        Self {
            ring: self.ring.clone(),
            seqs: self.seqs.clone(),
            policy: self.policy,
            discard_latched: self.discard_latched,
            stats: self.stats.without_reads(),
            writers: self.writers.clone(),
            read: self.read.clone(),
            scratch: Vec::new(),
            read_only: true,
        }
    }

    /// Makes this buffer read-only (a buffer moved into a cloned session
    /// by `transfer_on_clone`).
    pub fn set_read_only(&mut self) {
        self.read_only = true;
    }

    /// Whether any chunk was ever stored (upstream: `TraceBuffer::has_data`).
    pub fn has_data(&self) -> bool {
        self.stats.chunks_written > 0
    }

    /// The counters.
    pub fn stats(&self) -> &BufferStats {
        &self.stats
    }

    /// Payload-size histograms of the writers whose chunks were read.
    pub fn writer_stats(&self) -> &WriterStats {
        &self.writers
    }

    /// Every `{producer, writer}` with data in this buffer so far: chunks
    /// read ([`writer_stats`](Self::writer_stats)) or still stored, sorted.
    pub fn writers_seen(&self) -> Vec<(ProducerId, WriterId)> {
        let mut out: Vec<(ProducerId, WriterId)> = self
            .writers
            .iter()
            .map(|(p, w, _)| (p, w))
            .chain(self.seqs.iter().map(|s| (s.producer, s.writer)))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The fill policy.
    pub fn policy(&self) -> FillPolicy {
        self.policy
    }

    /// Stores a chunk (or a newer version of a stored one).
    pub fn commit(&mut self, c: &ChunkCommit<'_>) -> CommitOutcome {
        let parsed = parse(c.payload, c.packets, c.complete);
        log::trace!(
            "commit producer {} writer {} chunk {} count {} flags {:#x} complete {}",
            c.producer,
            c.writer,
            c.chunk_id,
            c.packets.count(),
            c.packets.flags().bits(),
            c.complete
        );
        if self.read_only {
            return CommitOutcome::Refused(Refusal::ReadOnly);
        }
        let footprint = ring::footprint(parsed.len);
        if footprint > self.ring.capacity() {
            self.stats.abi_violations += 1;
            return CommitOutcome::Refused(Refusal::TooLarge {
                footprint,
                capacity: self.ring.capacity(),
            });
        }
        let idx = self
            .seqs
            .current_or_insert(c.producer, c.writer, c.chunk_id);
        let Some(seq) = self.seqs.get_mut(idx) else {
            return CommitOutcome::Refused(Refusal::Stale);
        };
        let ext = seq.ext_of(c.chunk_id);
        if let Some(resume) = seq.resume.filter(|r| r.ext == ext && ext == seq.floor) {
            if !seq.chunks.contains_key(&ext) {
                if parsed.count < resume.count || parsed.len < resume.len {
                    self.stats.abi_violations += 1;
                    return CommitOutcome::Refused(Refusal::InvalidRecommit);
                }
                if parsed.count == resume.count && !c.complete {
                    // Scraped again, with nothing new in it.
                    return CommitOutcome::Duplicate;
                }
            }
        }
        if ext < seq.floor {
            let duplicate =
                seq.last_consumed == Some((ext, parsed.count, parsed.flags, c.complete));
            if duplicate {
                return CommitOutcome::Duplicate;
            }
            self.stats.chunks_discarded += 1;
            self.seqs.emptied(idx);
            return CommitOutcome::Refused(Refusal::Stale);
        }
        match seq.chunks.get(&ext).copied() {
            Some(old) => self.recommit(idx, ext, old, c, parsed),
            None => self.store_new(idx, ext, c, parsed),
        }
    }

    fn store_new(
        &mut self,
        idx: u32,
        ext: u64,
        c: &ChunkCommit<'_>,
        parsed: Parsed,
    ) -> CommitOutcome {
        let footprint = ring::footprint(parsed.len);
        let Some((record, offset)) = self.alloc(footprint, Owner::Chunk { seq: idx, ext }) else {
            self.stats.chunks_discarded += 1;
            self.seqs.emptied(idx);
            return CommitOutcome::Refused(Refusal::Full);
        };
        self.copy_in(offset, &c.payload[..parsed.len]);
        let slot = new_slot(record, offset, footprint, c.complete, parsed);
        self.index_new(idx, ext, c.chunk_id, slot)
    }

    /// Indexes a new chunk whose bytes are in the ring.
    fn index_new(&mut self, idx: u32, ext: u64, chunk_id: u32, slot: Slot) -> CommitOutcome {
        self.count_tail(None, slot.tail);
        self.stats.chunks_written += 1;
        let Some(seq) = self.seqs.get_mut(idx) else {
            return CommitOutcome::Refused(Refusal::Stale);
        };
        if seq.note_stored(chunk_id, ext) {
            self.stats.chunks_committed_out_of_order += 1;
        }
        let mut slot = slot;
        if let Some(resume) = seq.resume.take_if(|r| r.ext == ext) {
            // The head was read from a scraped copy, since evicted: only
            // the fragments after it are new (`commit` checked that the
            // chunk did not shrink).
            slot.consumed = resume.count;
            slot.consumed_bytes = resume.len;
            self.stats.chunks_rewritten += 1;
        }
        seq.chunks.insert(ext, slot);
        CommitOutcome::Stored
    }

    /// Room for a chunk of `chunk_size` bytes (8-byte header included) at the
    /// write cursor, to be filled straight from the producer's memory (see
    /// the module docs). `None` if the chunk cannot go this way: it is larger
    /// than the buffer, a DISCARD buffer is latched, or a record still needed
    /// (or a wrap padding) is in the way. Then copy the chunk privately and
    /// [`commit`](Self::commit) it, which decides exactly.
    pub fn reserve(&mut self, chunk_size: usize) -> Option<Reservation<'_>> {
        if self.read_only {
            return None;
        }
        let payload = chunk_size.checked_sub(CHUNK_HEADER_SIZE)?;
        let footprint = ring::footprint(payload);
        if footprint > self.ring.capacity() {
            return None;
        }
        if self.policy == FillPolicy::Discard && self.discard_latched {
            return None;
        }
        let plan = self.ring.plan(footprint);
        if !self.evicts_only_dead_space(plan) {
            return None;
        }
        let wr = self.ring.write_cursor();
        let placed = self.alloc_planned(plan, footprint, Owner::Padding)?;
        Some(Reservation {
            buf: self,
            record: placed.id,
            offset: placed.offset,
            footprint,
            chunk_size,
            padding: placed.padding,
            wrap: plan.wrap,
            wr,
            open: true,
        })
    }

    /// Whether every record `plan` evicts is a chunk record nothing refers
    /// to any more (read, or replaced): evicting it changes no sequence and
    /// no stat.
    fn evicts_only_dead_space(&self, plan: ring::Plan) -> bool {
        (0..plan.evict).all(|i| {
            self.ring.nth(i).is_some_and(|(id, r)| {
                matches!(r.owner, Owner::Chunk { .. }) && self.live_slot(id, r.owner).is_none()
            })
        })
    }

    fn recommit(
        &mut self,
        idx: u32,
        ext: u64,
        old: Slot,
        c: &ChunkCommit<'_>,
        parsed: Parsed,
    ) -> CommitOutcome {
        if old.count == parsed.count
            && old.committed_flags == parsed.flags
            && old.complete == c.complete
        {
            return CommitOutcome::Duplicate;
        }
        let shrinks = parsed.count < old.count;
        let drops_flags = !parsed.flags.contains(old.committed_flags);
        if shrinks || drops_flags || (old.complete && !c.complete) {
            self.stats.abi_violations += 1;
            return CommitOutcome::Refused(Refusal::InvalidRecommit);
        }
        let footprint = ring::footprint(parsed.len);
        let (record, offset, footprint) = if footprint <= old.footprint {
            (old.record, old.offset, old.footprint)
        } else {
            // Take the old slot out so the allocation may evict its record
            // as dead space; put it back if the buffer refuses.
            if let Some(seq) = self.seqs.get_mut(idx) {
                seq.chunks.remove(&ext);
            }
            match self.alloc(footprint, Owner::Chunk { seq: idx, ext }) {
                Some((record, offset)) => {
                    self.stats.chunks_relocated += 1;
                    (record, offset, footprint)
                }
                None => {
                    self.stats.chunks_discarded += 1;
                    if let Some(seq) = self.seqs.get_mut(idx) {
                        seq.chunks.insert(ext, old);
                    }
                    return CommitOutcome::Refused(Refusal::Full);
                }
            }
        };
        self.copy_in(offset, &c.payload[..parsed.len]);
        self.count_tail(Some(old.tail), parsed.tail);
        self.stats.chunks_rewritten += 1;
        let mut slot = new_slot(record, offset, footprint, c.complete, parsed);
        slot.consumed = old.consumed;
        slot.consumed_bytes = old.consumed_bytes;
        if let Some(seq) = self.seqs.get_mut(idx) {
            seq.chunks.insert(ext, slot);
        }
        CommitOutcome::Rewritten
    }

    fn count_tail(&mut self, old: Option<Tail>, new: Tail) {
        if old == Some(new) {
            return;
        }
        match new {
            Tail::Clean => {}
            Tail::Corrupt => self.stats.abi_violations += 1,
            Tail::WriterAbort => self.stats.trace_writer_packet_loss += 1,
        }
    }

    fn copy_in(&mut self, offset: usize, bytes: &[u8]) {
        if let Some(dst) = self.ring.bytes_mut(offset, bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    }

    /// Makes room for a record and places it: its id and data offset
    /// (`RECORD_OVERHEAD` into the record). `None` if the DISCARD policy
    /// refuses.
    fn alloc(&mut self, footprint: usize, owner: Owner) -> Option<(u64, usize)> {
        let plan = self.ring.plan(footprint);
        self.alloc_planned(plan, footprint, owner)
            .map(|placed| (placed.id, placed.offset))
    }

    /// [`alloc`](Self::alloc) with the plan made already.
    fn alloc_planned(
        &mut self,
        plan: ring::Plan,
        footprint: usize,
        owner: Owner,
    ) -> Option<Placed> {
        if self.policy == FillPolicy::Discard {
            if self.discard_latched {
                return None;
            }
            if self.evicts_unread(plan) {
                self.discard_latched = true;
                return None;
            }
        }
        for _ in 0..plan.evict {
            if let Some((id, record)) = self.ring.pop_front() {
                self.evict(id, record);
            }
        }
        let (padding, id, offset) = self.ring.place(plan, footprint, owner);
        if plan.wrap {
            self.stats.write_wrap_count += 1;
        }
        self.stats.padding_bytes_written += padding as u64;
        self.stats.bytes_written += (padding + footprint) as u64;
        Some(Placed {
            id,
            offset: offset + RECORD_OVERHEAD,
            padding,
        })
    }

    /// Whether the evictions of `plan` would destroy data not read yet.
    fn evicts_unread(&self, plan: ring::Plan) -> bool {
        (0..plan.evict).any(|i| {
            self.ring
                .nth(i)
                .is_some_and(|(id, r)| self.live_slot(id, r.owner).is_some_and(|s| s.has_unread()))
        })
    }

    fn live_slot(&self, id: u64, owner: Owner) -> Option<&Slot> {
        let Owner::Chunk { seq, ext } = owner else {
            return None;
        };
        self.seqs
            .get(seq)?
            .chunks
            .get(&ext)
            .filter(|s| s.record == id)
    }

    fn evict(&mut self, id: u64, record: ring::Record) {
        let Owner::Chunk { seq: idx, ext } = record.owner else {
            self.stats.padding_bytes_cleared += record.footprint as u64;
            return;
        };
        let Some(seq) = self.seqs.get_mut(idx) else {
            return;
        };
        if seq.chunks.get(&ext).is_none_or(|s| s.record != id) {
            return;
        }
        let Some(slot) = seq.chunks.remove(&ext) else {
            return;
        };
        if slot.has_unread() || !slot.complete {
            seq.overwritten_upto = Some(seq.overwritten_upto.map_or(ext, |u| u.max(ext)));
        }
        if slot.consumed > 0 && !slot.complete {
            // The reader was inside this scraped copy: the producer may
            // still commit the chunk, with more fragments. Reading resumes
            // after this copy's fragments then; if anything else of the
            // sequence comes first, the gap check reports the rest lost.
            seq.floor = seq.floor.max(ext);
            seq.resume = Some(Resume {
                ext,
                count: slot.count,
                len: slot.len,
            });
            if slot.has_unread() {
                seq.loss |= DataLoss::because(DataLoss::OVERWRITE);
            }
        } else if slot.consumed > 0 {
            // The reader was inside this chunk: a later commit of it must not
            // be read again from its start, and the gap check will not see
            // what it lost, so report that now.
            seq.floor = seq.floor.max(ext + 1);
            if slot.has_unread() {
                seq.loss |= DataLoss::because(DataLoss::OVERWRITE);
            }
        }
        if slot.has_unread() {
            self.stats.chunks_overwritten += 1;
            self.stats.bytes_overwritten += record.footprint as u64;
        } else {
            self.stats.chunks_read += 1;
            self.stats.bytes_read += record.footprint as u64;
        }
        if seq.chunks.is_empty() {
            self.seqs.emptied(idx);
        }
    }

    /// Applies one group of patches (`ChunkToPatch`) to chunk
    /// `{producer, writer, chunk_id}`. When `has_more` is false and every
    /// patch landed, the chunk no longer needs patching.
    pub fn patch(
        &mut self,
        producer: ProducerId,
        writer: WriterId,
        chunk_id: u32,
        patches: &[(u32, &[u8])],
        has_more: bool,
    ) -> PatchResult {
        if self.read_only {
            return PatchResult::ChunkNotFound;
        }
        let slot = self.seqs.current(producer, writer).and_then(|idx| {
            let seq = self.seqs.get_mut(idx)?;
            let ext = seq.ext_of(chunk_id);
            seq.chunks.get_mut(&ext)
        });
        let Some(slot) = slot else {
            self.stats.patches_failed += 1;
            return PatchResult::ChunkNotFound;
        };
        let Some(payload) = self.ring.bytes_mut(slot.offset, slot.len) else {
            self.stats.patches_failed += 1;
            return PatchResult::ChunkNotFound;
        };
        let outcome = match apply_patches(payload, patches.iter().copied()) {
            Ok(outcome) => outcome,
            Err(e) => return PatchResult::TooMany(e),
        };
        self.stats.patches_succeeded += u64::from(outcome.applied);
        if outcome.failed.is_some() {
            self.stats.patches_failed += 1;
        } else if !has_more {
            slot.flags = slot.flags.difference(ChunkFlags::CHUNK_NEEDS_PATCHING);
        }
        PatchResult::Applied(outcome)
    }

    /// A writer was unregistered: its id may be reused, and a chunk 0 for it
    /// then starts a new sequence. (Registration is not ordered with the
    /// writer's commits by the C++ SDK, so it carries no such meaning.)
    pub fn writer_unregistered(&mut self, producer: ProducerId, writer: WriterId) {
        self.seqs.unregister(producer, writer);
    }

    /// A producer disconnected: none of its sequences gets more chunks.
    pub fn producer_gone(&mut self, producer: ProducerId) {
        self.seqs.close_producer(producer);
    }
}

/// Room for one chunk at the write cursor of a [`TraceBuffer`]
/// ([`TraceBuffer::reserve`]). Fill [`chunk_mut`](Self::chunk_mut) with the
/// whole chunk, header first, then [`commit`](Self::commit); dropping it
/// unused gives the room back and leaves no trace (it evicted only dead
/// space).
#[must_use = "a reservation that is not committed stores nothing"]
pub struct Reservation<'a> {
    buf: &'a mut TraceBuffer,
    record: u64,
    /// Data offset: the payload goes here, the header just before it.
    offset: usize,
    footprint: usize,
    chunk_size: usize,
    /// Footprint of the wrap padding placed with it (0 if none).
    padding: usize,
    /// The write cursor wrapped for it.
    wrap: bool,
    /// The write cursor before it.
    wr: usize,
    open: bool,
}

/// Where [`TraceBuffer::alloc_planned`] placed a record.
struct Placed {
    /// Record id.
    id: u64,
    /// Data offset (`RECORD_OVERHEAD` into the record).
    offset: usize,
    /// Footprint of the wrap padding placed before it (0 if none).
    padding: usize,
}

impl Reservation<'_> {
    /// The reserved bytes: exactly `chunk_size`, for the chunk header and
    /// payload.
    pub fn chunk_mut(&mut self) -> &mut [u8] {
        let start = self.offset - CHUNK_HEADER_SIZE;
        self.buf
            .ring
            .bytes_mut(start, self.chunk_size)
            .unwrap_or_default()
    }

    /// Stores the chunk now in [`chunk_mut`](Self::chunk_mut) for
    /// `producer` (`complete`: see [`ChunkCommit::complete`]). The header and
    /// payload are read from this private copy only; the payload is parsed
    /// in place and the record shrunk to its valid prefix.
    pub fn commit(mut self, producer: ProducerId, complete: bool) -> CommitOutcome {
        let mut head = [0u8; CHUNK_HEADER_SIZE];
        head.copy_from_slice(self.chunk().get(..CHUNK_HEADER_SIZE).unwrap_or(&[0; 8]));
        let header = ChunkHeaderRepr::from_bytes(head);
        let seqs = &mut self.buf.seqs;
        let idx = seqs.current_or_insert(producer, header.writer_id, header.chunk_id);
        let new_ext = seqs.get_mut(idx).and_then(|seq| {
            let ext = seq.ext_of(header.chunk_id);
            let resumes = seq.resume.is_some_and(|r| r.ext == ext);
            (ext >= seq.floor && !seq.chunks.contains_key(&ext) && !resumes).then_some(ext)
        });
        let Some(ext) = new_ext else {
            // A re-commit, duplicate or stale chunk: the usual path decides,
            // on a private copy (the reservation goes back first).
            let mut scratch = std::mem::take(&mut self.buf.scratch);
            scratch.clear();
            scratch.extend_from_slice(self.chunk().get(CHUNK_HEADER_SIZE..).unwrap_or(&[]));
            self.give_back();
            let outcome = self
                .buf
                .commit(&ChunkCommit::new(producer, &header, &scratch, complete));
            self.buf.scratch = scratch;
            return outcome;
        };
        let parsed = parse(
            self.chunk().get(CHUNK_HEADER_SIZE..).unwrap_or(&[]),
            header.packets,
            complete,
        );
        log::trace!(
            "commit in place producer {producer} writer {} chunk {} count {} complete {complete}",
            header.writer_id,
            header.chunk_id,
            header.packets.count(),
        );
        let footprint = ring::footprint(parsed.len);
        self.open = false;
        let buf = &mut *self.buf;
        buf.ring
            .finish_back(Owner::Chunk { seq: idx, ext }, footprint);
        buf.stats.bytes_written -= (self.footprint - footprint) as u64;
        let slot = new_slot(self.record, self.offset, footprint, complete, parsed);
        buf.index_new(idx, ext, header.chunk_id, slot)
    }

    /// The reserved bytes, read-only.
    fn chunk(&self) -> &[u8] {
        let start = self.offset - CHUNK_HEADER_SIZE;
        self.buf
            .ring
            .data()
            .get(start..start + self.chunk_size)
            .unwrap_or_default()
    }

    /// Undoes the reservation: its record, its wrap padding, the write
    /// cursor and the stats it counted.
    fn give_back(&mut self) {
        if std::mem::take(&mut self.open) && self.buf.ring.end_id() == self.record + 1 {
            let buf = &mut *self.buf;
            buf.ring.unplace(self.padding > 0, self.wr);
            let stats = &mut buf.stats;
            stats.bytes_written -= (self.padding + self.footprint) as u64;
            stats.padding_bytes_written -= self.padding as u64;
            if self.wrap {
                stats.write_wrap_count -= 1;
            }
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.give_back();
    }
}

fn new_slot(record: u64, offset: usize, footprint: usize, complete: bool, parsed: Parsed) -> Slot {
    Slot {
        record,
        offset,
        footprint,
        len: parsed.len,
        count: parsed.count,
        committed_flags: parsed.flags,
        flags: parsed.flags,
        complete,
        tail: parsed.tail,
        consumed: 0,
        consumed_bytes: 0,
    }
}
