//! The writer's FIFO of pending patches.
//!
//! When a chunk is released while nested messages whose size fields lie in
//! it are still open, each such size field becomes an entry here
//! (`chunk_id`, offset from the payload start, 4 data bytes). The nested
//! message later writes its size into the entry instead of the chunk.
//!
//! # Invariants
//!
//! * An entry is *patched* once its first data byte is non-zero: sizes are
//!   always written as 4-byte redundant varints, whose first byte has the
//!   continuation bit set (0 is `80 80 80 00`).
//! * Entries leave only from the front, and only when patched, so an entry a
//!   still-open nested message points to (by sequence number) stays put.
//! * Sequence numbers are `head_seq + index` (mod 2^32): stable across pops.

use heapless::Vec;

use crate::proto::wire::SIZE_FIELD_LEN;
use crate::reader::MAX_PATCHES_PER_GROUP;

/// One patch: 4 bytes to write at `offset` bytes after the start of a chunk's
/// payload (`CommitDataRequest.ChunkToPatch.Patch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Patch {
    /// Offset from the start of the chunk payload (after the 8-byte header).
    pub offset: u16,
    /// The redundant-varint size to write there.
    pub data: [u8; SIZE_FIELD_LEN],
}

/// A pending patch and the chunk it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingPatch {
    pub(crate) chunk_id: u32,
    pub(crate) patch: Patch,
}

impl PendingPatch {
    fn is_patched(&self) -> bool {
        self.patch.data[0] != 0
    }
}

/// Consecutive patched entries of one chunk, ready to be delivered: one
/// `CommitDataRequest.ChunkToPatch`.
#[derive(Debug, Clone, Copy)]
pub struct PatchGroup<'a> {
    /// Global id of the buffer the chunk was committed to.
    pub target_buffer: u16,
    /// The writer that owns the chunk.
    pub writer_id: u16,
    /// The chunk to patch.
    pub chunk_id: u32,
    /// More patches for this chunk will follow in a later group: the chunk
    /// must stay "needs patching" after these are applied.
    pub has_more: bool,
    entries: &'a [PendingPatch],
}

impl<'a> PatchGroup<'a> {
    /// The patches, in FIFO order.
    pub fn patches(&self) -> impl ExactSizeIterator<Item = Patch> + 'a {
        self.entries.iter().map(|e| e.patch)
    }

    /// Number of patches (never 0).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Always `false`: a group holds at least one patch.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// FIFO of pending patches with room for `N` entries.
#[derive(Debug)]
pub(crate) struct PatchFifo<const N: usize> {
    entries: Vec<PendingPatch, N>,
    head_seq: u32,
}

impl<const N: usize> PatchFifo<N> {
    pub(crate) const fn new() -> Self {
        Self {
            entries: Vec::new(),
            head_seq: 0,
        }
    }

    pub(crate) fn free(&self) -> usize {
        N - self.entries.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        N == 0 || self.entries.is_empty()
    }

    /// Adds an unpatched entry; returns its sequence number, or `None` when
    /// full.
    pub(crate) fn push(&mut self, chunk_id: u32, offset: u16) -> Option<u32> {
        let seq = self.head_seq.wrapping_add(self.entries.len() as u32);
        self.entries
            .push(PendingPatch {
                chunk_id,
                patch: Patch {
                    offset,
                    data: [0; SIZE_FIELD_LEN],
                },
            })
            .ok()?;
        Some(seq)
    }

    /// Stores the data of entry `seq` (ignored if it no longer exists).
    pub(crate) fn fill(&mut self, seq: u32, data: [u8; SIZE_FIELD_LEN]) {
        let index = seq.wrapping_sub(self.head_seq) as usize;
        if let Some(e) = self.entries.get_mut(index) {
            e.patch.data = data;
        }
    }

    /// The leading group of patched entries of one chunk, if the front entry
    /// is patched. `has_more` tells whether the next entry (unpatched, or cut
    /// off by the service's group limit) is for the same chunk.
    pub(crate) fn ready_group(&self, target_buffer: u16, writer_id: u16) -> Option<PatchGroup<'_>> {
        let first = self.entries.first().filter(|e| e.is_patched())?;
        let chunk_id = first.chunk_id;
        let len = self
            .entries
            .iter()
            .take(MAX_PATCHES_PER_GROUP)
            .take_while(|e| e.chunk_id == chunk_id && e.is_patched())
            .count();
        let has_more = self
            .entries
            .get(len)
            .is_some_and(|e| e.chunk_id == chunk_id);
        let entries = self.entries.get(..len)?;
        Some(PatchGroup {
            target_buffer,
            writer_id,
            chunk_id,
            has_more,
            entries,
        })
    }

    /// Drops the first `n` entries (a delivered group).
    pub(crate) fn pop_front(&mut self, n: usize) {
        let n = n.min(self.entries.len());
        self.entries.drain(..n);
        self.head_seq = self.head_seq.wrapping_add(n as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(v: u8) -> [u8; 4] {
        [0x80 | v, 0x80, 0x80, 0x00]
    }

    #[test]
    fn groups_are_leading_patched_entries_of_one_chunk() {
        let mut f = PatchFifo::<8>::new();
        let a = f.push(10, 4).unwrap();
        let b = f.push(10, 20).unwrap();
        let c = f.push(11, 0).unwrap();
        let d = f.push(11, 8).unwrap();
        assert_eq!((a, b, c, d), (0, 1, 2, 3));
        // Nothing ready while the front is unpatched.
        f.fill(b, data(1));
        assert!(f.ready_group(1, 2).is_none());
        f.fill(a, data(2));
        let g = f.ready_group(1, 2).unwrap();
        assert_eq!((g.chunk_id, g.has_more, g.len()), (10, false, 2));
        assert_eq!(
            g.patches().map(|p| p.offset).collect::<std::vec::Vec<_>>(),
            [4, 20]
        );
        f.pop_front(2);
        // Chunk 11: first patched, second not -> has_more.
        f.fill(c, data(3));
        let g = f.ready_group(1, 2).unwrap();
        assert_eq!((g.chunk_id, g.has_more, g.len()), (11, true, 1));
        assert_eq!(g.patches().next().unwrap().data, data(3));
        f.pop_front(1);
        // Sequence numbers survive pops.
        f.fill(d, data(4));
        let g = f.ready_group(1, 2).unwrap();
        assert_eq!((g.chunk_id, g.has_more), (11, false));
        assert_eq!(
            g.patches().next().unwrap(),
            Patch {
                offset: 8,
                data: data(4)
            }
        );
        f.pop_front(1);
        assert!(f.is_empty());
    }

    #[test]
    fn full_fifo_refuses_entries() {
        let mut f = PatchFifo::<2>::new();
        assert!(f.push(1, 0).is_some());
        assert!(f.push(1, 4).is_some());
        assert_eq!(f.free(), 0);
        assert!(f.push(1, 8).is_none());
    }

    #[test]
    fn zero_size_patches_count_as_patched() {
        let mut f = PatchFifo::<2>::new();
        let s = f.push(7, 0).unwrap();
        f.fill(s, crate::proto::wire::redundant_varint4(0));
        assert!(f.ready_group(1, 1).is_some());
    }
}
