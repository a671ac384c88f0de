//! Reading packets out of a trace buffer: per-sequence iteration in chunk-id
//! order, reassembly of packets spanning chunks, and loss reporting.
//!
//! A *read pass* ([`TraceBuffer::begin_read`]) visits the ring's records
//! oldest first; for each live chunk it reads that chunk's sequence up to and
//! including it. A pass may be split over several [`TraceBuffer::read`]
//! calls (each stops once it has returned `budget` bytes); a sequence that
//! has to wait is skipped for the rest of the pass.

use shmtrace_abi::layout::{ChunkFlags, Packets};
use shmtrace_abi::reader::{FragmentEvent, Fragments};

use super::loss::DataLoss;
use super::ring::Owner;
use super::sequence::{Sequence, Slot, Tail};
use super::stats::BufferStats;
use super::writers::WriterStats;
use super::{ProducerId, TraceBuffer, WriterId};

/// How a read treats data that may still be completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// Producers are live: wait for unfinished chunks, pending patches and
    /// the rest of packets spanning chunks.
    #[default]
    Live,
    /// Final read (the session stopped): give up on whatever is unfinished,
    /// report it as lost, and return everything else.
    Drain,
}

/// Whether a read pass returned everything it could.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStatus {
    /// The pass is over.
    Done,
    /// The budget was used up; call [`TraceBuffer::read`] again to go on.
    More,
}

/// One packet read from a buffer: one or more slices of the buffer's memory
/// (a packet that spanned chunks has one slice per fragment).
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// Producer that wrote it.
    pub producer: ProducerId,
    /// Writer (sequence) that wrote it.
    pub writer: WriterId,
    /// Loss on this sequence since the previous packet it yielded.
    pub loss: DataLoss,
    data: &'a [u8],
    ranges: &'a [(usize, usize)],
    len: usize,
}

impl<'a> Packet<'a> {
    /// The packet's bytes, slice by slice.
    pub fn slices(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let data = self.data;
        self.ranges
            .iter()
            .map(move |&(start, end)| data.get(start..end).unwrap_or(&[]))
    }

    /// Total length in bytes: 0 only for a loss mark (see
    /// [`is_empty`](Self::is_empty)).
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` only for a loss mark: a closed sequence lost data after its
    /// last packet, so its `loss` comes on a packet of its own, with no
    /// bytes of the producer's (empty packets the producer wrote are
    /// skipped).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, concatenated.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for s in self.slices() {
            out.extend_from_slice(s);
        }
        out
    }
}

/// Read-pass state kept in the buffer.
#[derive(Debug, Clone)]
pub(super) struct ReadState {
    pass: u64,
    pos: u64,
    /// Every record with a lower id is dead (read or replaced).
    dead_before: u64,
    mode: ReadMode,
    ranges: Vec<(usize, usize)>,
}

impl Default for ReadState {
    fn default() -> Self {
        // Sequences start with `stalled_pass == 0`: pass 1 stalls nobody.
        Self {
            pass: 1,
            pos: 0,
            dead_before: 0,
            mode: ReadMode::Live,
            ranges: Vec::new(),
        }
    }
}

impl TraceBuffer {
    /// Starts a read pass from the oldest record.
    pub fn begin_read(&mut self, mode: ReadMode) {
        self.read.pass += 1;
        self.read.pos = self.read.dead_before;
        self.read.mode = mode;
    }

    /// Reads packets of the current pass, calling `visit` for each, until
    /// `budget` bytes were returned or the pass is over. Every call that
    /// returns [`ReadStatus::More`] returned at least one packet, so a loop
    /// until [`ReadStatus::Done`] always ends.
    pub fn read(&mut self, budget: usize, visit: impl FnMut(&Packet<'_>)) -> ReadStatus {
        let mut reader = Reader {
            data: self.ring.data(),
            stats: &mut self.stats,
            writers: &mut self.writers,
            ranges: &mut self.read.ranges,
            drain: self.read.mode == ReadMode::Drain,
            pass: self.read.pass,
            budget,
            emitted: 0,
            visit,
        };
        let mut pos = self.read.pos.max(self.ring.front_id());
        while pos < self.ring.end_id() {
            let mut live = false;
            if let Some(&Owner::Chunk { seq: idx, ext }) = self.ring.get(pos).map(|r| &r.owner) {
                if let Some(seq) = self.seqs.get_mut(idx) {
                    let names =
                        |seq: &Sequence| seq.chunks.get(&ext).is_some_and(|s| s.record == pos);
                    live = names(seq);
                    if live && seq.stalled_pass != reader.pass {
                        let outcome = reader.read_sequence(seq, ext, pos);
                        live = names(seq);
                        if seq.chunks.is_empty() {
                            self.seqs.emptied(idx);
                        }
                        if outcome == SeqRead::OutOfBudget {
                            self.read.pos = pos;
                            return ReadStatus::More;
                        }
                    }
                }
            }
            // Records never come back to life: a dead prefix is skipped by
            // every later pass.
            if !live && pos == self.read.dead_before.max(self.ring.front_id()) {
                self.read.dead_before = pos + 1;
            }
            pos += 1;
        }
        self.read.pos = pos;
        ReadStatus::Done
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SeqRead {
    /// Everything up to the target chunk was read.
    Caught,
    /// The sequence has to wait (skipped for the rest of the pass).
    Stalled,
    /// The budget is used up.
    OutOfBudget,
}

/// One fragment parsed from a stored payload.
enum Frag {
    /// Data at `start..end` of the payload; `end` is where the next fragment
    /// starts.
    Data { start: usize, end: usize },
    /// A drop sentinel (written by a patch after the commit).
    Sentinel,
    /// Unparsable (changed by a patch after the commit).
    Corrupt,
}

fn fragment_at(payload: &[u8], pos: usize) -> Frag {
    let Some(rest) = payload.get(pos..) else {
        return Frag::Corrupt;
    };
    let mut it = Fragments::new(rest, Packets::from_bits(1));
    match it.next() {
        None => Frag::Data {
            start: pos + it.consumed(),
            end: pos + it.consumed(),
        },
        Some(Ok(FragmentEvent::Data(f))) => {
            let end = pos + it.consumed();
            Frag::Data {
                start: end - f.data.len(),
                end,
            }
        }
        Some(Ok(FragmentEvent::Dropped(_))) => Frag::Sentinel,
        Some(Err(_)) => Frag::Corrupt,
    }
}

enum Assembly {
    /// Reassembled; the packet ends in chunk `final_ext` at payload offset
    /// `final_end`.
    Done { final_ext: u64, final_end: usize },
    /// Not yet possible; the loss to report if the reader gives up.
    Wait(DataLoss),
    /// Impossible.
    Broken(DataLoss),
}

struct Reader<'r, F> {
    data: &'r [u8],
    stats: &'r mut BufferStats,
    writers: &'r mut WriterStats,
    ranges: &'r mut Vec<(usize, usize)>,
    drain: bool,
    pass: u64,
    budget: usize,
    emitted: usize,
    visit: F,
}

impl<F: FnMut(&Packet<'_>)> Reader<'_, F> {
    fn payload(&self, slot: &Slot) -> &[u8] {
        self.data
            .get(slot.offset..slot.offset + slot.len)
            .unwrap_or(&[])
    }

    fn emit(&mut self, seq: &mut Sequence) {
        let len = self.ranges.iter().map(|(s, e)| e - s).sum();
        if len == 0 {
            return;
        }
        self.visit_packet(seq, len);
    }

    /// Yields `seq`'s pending loss on an empty packet of its own (module
    /// docs: a trailing loss).
    fn emit_loss(&mut self, seq: &mut Sequence) {
        self.ranges.clear();
        self.visit_packet(seq, 0);
    }

    fn visit_packet(&mut self, seq: &mut Sequence, len: usize) {
        let packet = Packet {
            producer: seq.producer,
            writer: seq.writer,
            loss: seq.loss,
            data: self.data,
            ranges: self.ranges,
            len,
        };
        (self.visit)(&packet);
        seq.loss = DataLoss::NONE;
        self.emitted += len;
    }

    /// Removes the consumed chunk `ext` and moves the floor past it.
    fn finish(&mut self, seq: &mut Sequence, ext: u64) {
        if let Some(slot) = seq.chunks.remove(&ext) {
            self.stats.chunks_read += 1;
            self.stats.bytes_read += slot.footprint as u64;
            if slot.complete {
                self.writers.chunk_read(seq.producer, seq.writer, slot.len);
            }
            seq.last_consumed = Some((ext, slot.count, slot.committed_flags, slot.complete));
        }
        seq.floor = seq.floor.max(ext + 1);
    }

    /// Reads `seq` up to chunk `target` (and beyond it, through chunks whose
    /// records the pass has already visited: up to record id `pos`).
    fn read_sequence(&mut self, seq: &mut Sequence, target: u64, pos: u64) -> SeqRead {
        let drain = self.drain || seq.closed;
        // The loss before the unfinished rest of the last chunk read was
        // given up on, if it was (the give-up alone is no known loss at
        // the end: see below).
        let mut before_give_up = None;
        'chunks: loop {
            let Some((&ext, head)) = seq.chunks.first_key_value() else {
                let ambiguous = before_give_up.is_some_and(|b: DataLoss| {
                    b.is_empty() && seq.loss == DataLoss::because(DataLoss::READ_GAP)
                });
                if seq.closed && !seq.loss.is_empty() && !ambiguous {
                    // Nothing will follow to carry it: a trailing loss.
                    self.emit_loss(seq);
                }
                return SeqRead::Caught;
            };
            before_give_up = None;
            if ext > target && head.record > pos {
                return SeqRead::Caught;
            }
            if ext > seq.floor {
                log::debug!(
                    "producer {} writer {}: {} chunk(s) before chunk {} never arrived",
                    seq.producer,
                    seq.writer,
                    ext - seq.floor,
                    (ext as u32)
                );
                seq.loss |= seq.gap_loss();
                seq.floor = ext;
            }
            loop {
                let Some(&slot) = seq.chunks.get(&ext) else {
                    continue 'chunks;
                };
                if slot.consumed >= slot.count {
                    break;
                }
                if self.emitted > 0 && self.emitted >= self.budget {
                    return SeqRead::OutOfBudget;
                }
                let index = slot.consumed;
                let (start, end) = match fragment_at(self.payload(&slot), slot.consumed_bytes) {
                    Frag::Data { start, end } => (start, end),
                    bad => {
                        // The stored bytes stopped parsing: a patch rewrote a
                        // fragment header. Abandon the rest of the chunk.
                        seq.loss |= if matches!(bad, Frag::Sentinel) {
                            self.stats.trace_writer_packet_loss += 1;
                            DataLoss::because(DataLoss::WRITER_ABORT)
                        } else {
                            self.stats.abi_violations += 1;
                            DataLoss::because(DataLoss::CHUNK_CORRUPTED)
                        };
                        advance(seq, ext, slot.count, slot.len);
                        break;
                    }
                };
                let from_prev = index == 0
                    && slot
                        .flags
                        .contains(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
                let on_next = index + 1 == slot.count
                    && slot
                        .flags
                        .contains(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK);
                if from_prev {
                    // The beginning of this packet was never read.
                    seq.loss |= DataLoss::because(DataLoss::ORPHAN_CONTINUATION);
                    advance(seq, ext, index + 1, end);
                    continue;
                }
                self.ranges.clear();
                if end > start {
                    self.ranges.push((slot.offset + start, slot.offset + end));
                }
                if !on_next {
                    advance(seq, ext, index + 1, end);
                    self.emit(seq);
                    continue;
                }
                match self.reassemble(seq, ext) {
                    Assembly::Done {
                        final_ext,
                        final_end,
                    } => {
                        self.stats.readaheads_succeeded += 1;
                        self.emit(seq);
                        let done: Vec<u64> =
                            seq.chunks.range(ext..final_ext).map(|(&e, _)| e).collect();
                        for e in done {
                            self.finish(seq, e);
                        }
                        advance(seq, final_ext, 1, final_end);
                        continue 'chunks;
                    }
                    Assembly::Wait(_) if !drain => {
                        seq.stalled_pass = self.pass;
                        return SeqRead::Stalled;
                    }
                    Assembly::Wait(loss) | Assembly::Broken(loss) => {
                        self.stats.readaheads_failed += 1;
                        seq.loss |= loss;
                        advance(seq, ext, index + 1, end);
                    }
                }
            }
            let Some(&slot) = seq.chunks.get(&ext) else {
                continue;
            };
            if !slot.complete {
                if !drain {
                    // Scraped while being written: the rest comes with the
                    // commit.
                    seq.stalled_pass = self.pass;
                    return SeqRead::Stalled;
                }
                // Giving up on the unfinished rest. If the writer had only
                // inflated its count, nothing is lost, but then nothing
                // follows on this sequence either; a packet that does follow
                // was written after data we never got.
                before_give_up = Some(seq.loss);
                seq.loss |= DataLoss::because(DataLoss::READ_GAP);
            }
            match slot.tail {
                Tail::Clean => {}
                Tail::Corrupt => seq.loss |= DataLoss::because(DataLoss::CHUNK_CORRUPTED),
                Tail::WriterAbort => seq.loss |= DataLoss::because(DataLoss::WRITER_ABORT),
            }
            self.finish(seq, ext);
        }
    }

    /// Gathers the packet that begins with the last fragment of chunk
    /// `head` (already in `ranges`) from the following chunks.
    fn reassemble(&mut self, seq: &Sequence, head: u64) -> Assembly {
        let patching = |s: &Slot| s.flags.contains(ChunkFlags::CHUNK_NEEDS_PATCHING);
        if seq.chunks.get(&head).is_some_and(patching) {
            return Assembly::Wait(DataLoss::because(DataLoss::REASSEMBLY_BROKEN_CHAIN));
        }
        let mut ext = head + 1;
        loop {
            let Some(&slot) = seq.chunks.get(&ext) else {
                let gap = DataLoss::because(DataLoss::REASSEMBLY_GAP);
                return if seq.chunks.range(ext..).next().is_some() {
                    Assembly::Broken(gap)
                } else {
                    Assembly::Wait(gap)
                };
            };
            if slot.count == 0 {
                return match slot.tail {
                    Tail::Corrupt => Assembly::Broken(DataLoss::because(DataLoss::CHUNK_CORRUPTED)),
                    Tail::WriterAbort => {
                        Assembly::Broken(DataLoss::because(DataLoss::WRITER_ABORT))
                    }
                    Tail::Clean if !slot.complete => {
                        Assembly::Wait(DataLoss::because(DataLoss::REASSEMBLY_GAP))
                    }
                    Tail::Clean => {
                        Assembly::Broken(DataLoss::because(DataLoss::REASSEMBLY_BROKEN_CHAIN))
                    }
                };
            }
            if !slot
                .flags
                .contains(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK)
            {
                return Assembly::Broken(DataLoss::because(DataLoss::REASSEMBLY_BROKEN_CHAIN));
            }
            let (start, end) = match fragment_at(self.payload(&slot), 0) {
                Frag::Data { start, end } => (start, end),
                Frag::Sentinel => {
                    return Assembly::Broken(DataLoss::because(DataLoss::WRITER_ABORT))
                }
                Frag::Corrupt => {
                    return Assembly::Broken(DataLoss::because(DataLoss::CHUNK_CORRUPTED))
                }
            };
            if end > start {
                self.ranges.push((slot.offset + start, slot.offset + end));
            }
            let continues = slot.count == 1
                && slot
                    .flags
                    .contains(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK);
            if !continues {
                return Assembly::Done {
                    final_ext: ext,
                    final_end: end,
                };
            }
            if patching(&slot) {
                return Assembly::Wait(DataLoss::because(DataLoss::REASSEMBLY_BROKEN_CHAIN));
            }
            ext += 1;
        }
    }
}

/// Marks fragments `..consumed` of chunk `ext` as read, the next one
/// starting at payload offset `bytes`.
fn advance(seq: &mut Sequence, ext: u64, consumed: u16, bytes: usize) {
    if let Some(slot) = seq.chunks.get_mut(&ext) {
        slot.consumed = consumed;
        slot.consumed_bytes = bytes;
    }
}
