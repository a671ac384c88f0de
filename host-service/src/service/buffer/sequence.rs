//! Per-sequence state: the chunks of one writer, in chunk-id order, and the
//! reader's position in them.
//!
//! # Extended chunk ids
//!
//! Chunk ids are `u32` and wrap. Each sequence maps them onto `u64`
//! *extended* ids, relative to the newest id it has seen: an id `d` ahead
//! (wrapping difference read as `i32`) maps to `newest + d`. The first chunk
//! with id `c` maps to [`BASE`]` + c`, so the extended ids of a sequence
//! never go below `BASE - 2^31` and order exactly like the writer's chunk
//! order as long as no two live chunks are 2^31 ids apart.
//!
//! # Invariants
//!
//! * Every slot's extended id is `>= floor`: the reader has consumed or
//!   given up everything below `floor`, and commits for those ids are
//!   refused as stale.
//! * A [`Resume`] applies only while its chunk is the floor and not stored:
//!   the chunk's head was read from a scraped copy since evicted, and its
//!   commit is stored with that head marked as consumed.
//! * `floor` starts at the extended id of chunk 0 (writers start at chunk 0),
//!   so a sequence whose first chunk read is not chunk 0 reports a gap.
//! * A slot's `record` names the ring record holding its bytes; a ring
//!   record whose slot names another record (or no slot) is dead.

use std::collections::{BTreeMap, HashMap, VecDeque};

use shmtrace_abi::layout::ChunkFlags;

use super::loss::DataLoss;
use super::{ProducerId, WriterId};

/// Index of a sequence in [`Sequences`].
pub type SeqIdx = u32;

/// Extended id of chunk 0 of a new sequence.
pub const BASE: u64 = 1 << 32;

/// Empty sequences kept for gap detection before the oldest is forgotten.
pub const MAX_EMPTY_SEQUENCES: usize = 1024;

/// How a stored chunk ends after its valid fragments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// All counted fragments parsed.
    Clean,
    /// Parsing failed after the valid fragments (already counted as an ABI
    /// violation).
    Corrupt,
    /// The writer's drop sentinel follows the valid fragments (already
    /// counted as `trace_writer_packet_loss`).
    WriterAbort,
}

/// A stored chunk.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    /// Ring record holding the bytes.
    pub record: u64,
    /// Offset of the bytes in the ring.
    pub offset: usize,
    /// Footprint of the record.
    pub footprint: usize,
    /// Stored payload bytes (the valid fragments only).
    pub len: usize,
    /// Valid fragments (zero-length ones included).
    pub count: u16,
    /// Flags as committed, after sanitizing (what re-commits are compared
    /// with).
    pub committed_flags: ChunkFlags,
    /// Flags the reader applies: `committed_flags`, minus
    /// `CHUNK_NEEDS_PATCHING` once the last patch arrived.
    pub flags: ChunkFlags,
    /// The producer had finished the chunk (not a scrape of a chunk being
    /// written).
    pub complete: bool,
    /// What follows the valid fragments.
    pub tail: Tail,
    /// Fragments the reader has consumed.
    pub consumed: u16,
    /// Payload offset where fragment `consumed` starts.
    pub consumed_bytes: usize,
}

impl Slot {
    /// The chunk has fragments the reader has not consumed.
    pub fn has_unread(&self) -> bool {
        self.consumed < self.count
    }
}

/// One writer's chunks in one buffer.
#[derive(Debug, Clone)]
pub struct Sequence {
    /// Producer of the writer (trusted: from the connection).
    pub producer: ProducerId,
    /// The writer.
    pub writer: WriterId,
    /// Stored chunks by extended id.
    pub chunks: BTreeMap<u64, Slot>,
    newest_ext: u64,
    /// Chunk id of `newest_ext`.
    pub newest_id: u32,
    /// Everything below has been consumed or given up.
    pub floor: u64,
    /// Highest extended id evicted while unread.
    pub overwritten_upto: Option<u64>,
    /// Loss to report on the next packet.
    pub loss: DataLoss,
    /// No more commits will come (writer unregistered, producer gone): the
    /// reader never waits for this sequence.
    pub closed: bool,
    /// The writer was unregistered (its id may be reused).
    pub unregistered: bool,
    /// The read pass in which reading this sequence stalled.
    pub stalled_pass: u64,
    /// The last chunk consumed, to recognize a duplicate re-commit of it:
    /// `(ext, count, flags, complete)`.
    pub last_consumed: Option<(u64, u16, ChunkFlags, bool)>,
    /// A scraped (unfinished) chunk the reader was inside when its record
    /// was evicted: its commit may still come, and is then read from where
    /// the evicted copy ended.
    pub resume: Option<Resume>,
    empty_stamp: u64,
}

/// Where reading resumes in a chunk whose unfinished copy was read (in
/// part) and then evicted: the fragments before `count`, which end at
/// payload offset `len`, were read or lost with the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    /// Extended id of the chunk (`== floor` while it applies).
    pub ext: u64,
    /// Fragments of the chunk read or lost.
    pub count: u16,
    /// Payload offset where fragment `count` starts.
    pub len: usize,
}

impl Sequence {
    fn new(producer: ProducerId, writer: WriterId, first_id: u32) -> Self {
        Self {
            producer,
            writer,
            chunks: BTreeMap::new(),
            newest_ext: BASE + u64::from(first_id),
            newest_id: first_id,
            floor: BASE,
            overwritten_upto: None,
            loss: DataLoss::NONE,
            closed: false,
            unregistered: false,
            stalled_pass: 0,
            last_consumed: None,
            resume: None,
            empty_stamp: 0,
        }
    }

    /// Extended id of `chunk_id` (see the module docs).
    pub fn ext_of(&self, chunk_id: u32) -> u64 {
        let delta = i64::from(chunk_id.wrapping_sub(self.newest_id) as i32);
        self.newest_ext.saturating_add_signed(delta)
    }

    /// Notes that `chunk_id` (extended `ext`) was stored; returns `true` if
    /// it is older than the newest id seen (committed out of order).
    pub fn note_stored(&mut self, chunk_id: u32, ext: u64) -> bool {
        if ext > self.newest_ext {
            self.newest_ext = ext;
            self.newest_id = chunk_id;
            false
        } else {
            ext < self.newest_ext
        }
    }

    /// The reason to report for a gap starting at `floor`.
    pub fn gap_loss(&self) -> DataLoss {
        match self.overwritten_upto {
            Some(upto) if upto >= self.floor => DataLoss::because(DataLoss::OVERWRITE),
            _ => DataLoss::because(DataLoss::READ_GAP),
        }
    }
}

/// All sequences of a buffer.
///
/// The *current* sequence of a `(producer, writer)` receives its commits.
/// It is replaced by a new one when a writer id is reused (see
/// [`Sequences::current_or_insert`]). Closed sequences (their producer left)
/// get no more chunks: the reader never waits for them, and they are freed
/// once empty. Empty current sequences
/// are kept (for gap detection) up to [`MAX_EMPTY_SEQUENCES`].
#[derive(Debug, Default, Clone)]
pub struct Sequences {
    slab: Vec<Option<Sequence>>,
    free: Vec<SeqIdx>,
    current: HashMap<(ProducerId, WriterId), SeqIdx>,
    empty: VecDeque<(SeqIdx, u64)>,
    next_stamp: u64,
}

impl Sequences {
    /// Every sequence in the buffer.
    pub fn iter(&self) -> impl Iterator<Item = &Sequence> {
        self.slab.iter().flatten()
    }

    /// The sequence at `idx`, if it exists.
    pub fn get(&self, idx: SeqIdx) -> Option<&Sequence> {
        self.slab.get(idx as usize)?.as_ref()
    }

    /// The sequence at `idx`, if it exists.
    pub fn get_mut(&mut self, idx: SeqIdx) -> Option<&mut Sequence> {
        self.slab.get_mut(idx as usize)?.as_mut()
    }

    /// The current sequence of a writer, if any.
    pub fn current(&self, producer: ProducerId, writer: WriterId) -> Option<SeqIdx> {
        self.current.get(&(producer, writer)).copied()
    }

    /// The current sequence of a writer, created for a first chunk
    /// `chunk_id` if there is none.
    pub fn current_or_insert(
        &mut self,
        producer: ProducerId,
        writer: WriterId,
        chunk_id: u32,
    ) -> SeqIdx {
        if let Some(&idx) = self.current.get(&(producer, writer)) {
            // Chunk 0 of an unregistered writer id that had gone past chunk
            // 0 is a new writer reusing the id: it starts a new sequence.
            let reused = chunk_id == 0
                && self
                    .get(idx)
                    .is_some_and(|s| s.unregistered && s.newest_id != 0);
            if !reused {
                return idx;
            }
            self.current.remove(&(producer, writer));
            self.close_idx(idx);
        }
        let seq = Sequence::new(producer, writer, chunk_id);
        let idx = match self.free.pop() {
            Some(idx) => {
                self.slab[idx as usize] = Some(seq);
                idx
            }
            None => {
                self.slab.push(Some(seq));
                (self.slab.len() - 1) as SeqIdx
            }
        };
        self.current.insert((producer, writer), idx);
        idx
    }

    /// Notes that a writer was unregistered: its id may be reused by a new
    /// writer, whose chunk ids restart at 0. Late commits of the old writer
    /// still go to its sequence.
    pub fn unregister(&mut self, producer: ProducerId, writer: WriterId) {
        if let Some(idx) = self.current.get(&(producer, writer)).copied() {
            if let Some(seq) = self.get_mut(idx) {
                seq.unregistered = true;
            }
        }
    }

    /// Closes every current sequence of a producer.
    pub fn close_producer(&mut self, producer: ProducerId) {
        let idxs: Vec<SeqIdx> = self
            .current
            .iter()
            .filter(|((p, _), _)| *p == producer)
            .map(|(_, &i)| i)
            .collect();
        self.current.retain(|(p, _), _| *p != producer);
        for idx in idxs {
            self.close_idx(idx);
        }
    }

    fn close_idx(&mut self, idx: SeqIdx) {
        if let Some(seq) = self.get_mut(idx) {
            seq.closed = true;
            if seq.chunks.is_empty() {
                self.release(idx);
            }
        }
    }

    fn release(&mut self, idx: SeqIdx) {
        if let Some(slot) = self.slab.get_mut(idx as usize) {
            if slot.take().is_some() {
                self.free.push(idx);
            }
        }
    }

    /// Called when the sequence at `idx` lost its last chunk: frees it if it
    /// is closed, otherwise remembers it among the empty ones and forgets
    /// the oldest empty one beyond the limit.
    pub fn emptied(&mut self, idx: SeqIdx) {
        let stamp = self.next_stamp + 1;
        let Some(seq) = self.get_mut(idx) else { return };
        if !seq.chunks.is_empty() {
            return;
        }
        if seq.closed {
            self.release(idx);
            return;
        }
        seq.empty_stamp = stamp;
        self.next_stamp = stamp;
        self.empty.push_back((idx, stamp));
        while self.empty.len() > MAX_EMPTY_SEQUENCES {
            let Some((old, stamp)) = self.empty.pop_front() else {
                break;
            };
            let forget = self.get(old).and_then(|s| {
                (s.chunks.is_empty() && !s.closed && s.empty_stamp == stamp)
                    .then_some((s.producer, s.writer))
            });
            if let Some(key) = forget {
                self.current.remove(&key);
                self.release(old);
            }
        }
    }

    /// Number of sequences held (current and closed).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slab.iter().filter(|s| s.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_ids_follow_u32_wrap() {
        let mut seq = Sequence::new(1, 1, u32::MAX - 1);
        assert_eq!(seq.ext_of(u32::MAX - 1), BASE + u64::from(u32::MAX) - 1);
        let a = seq.ext_of(u32::MAX);
        assert!(!seq.note_stored(u32::MAX, a));
        let b = seq.ext_of(0);
        assert_eq!(b, a + 1);
        assert!(!seq.note_stored(0, b));
        let c = seq.ext_of(1);
        assert_eq!(c, b + 1);
        // An id behind the newest is older, even across the wrap.
        assert_eq!(seq.ext_of(u32::MAX - 3), a - 3);
        assert!(seq.note_stored(u32::MAX - 3, a - 3));
    }

    #[test]
    fn empty_sequences_are_forgotten_beyond_the_limit() {
        let mut seqs = Sequences::default();
        for w in 0..(MAX_EMPTY_SEQUENCES as u16 + 10) {
            let idx = seqs.current_or_insert(1, w + 1, 0);
            seqs.emptied(idx);
        }
        assert_eq!(seqs.len(), MAX_EMPTY_SEQUENCES);
        // The oldest ones were forgotten, the newest kept.
        assert_eq!(seqs.current(1, 1), None);
        assert!(seqs.current(1, MAX_EMPTY_SEQUENCES as u16 + 10).is_some());
        // Closing an empty sequence frees it.
        seqs.close_producer(1);
        assert_eq!(seqs.len(), 0);
    }
}
