//! Patch records (region PATCH slots, PATCH frame entries) grouped into
//! [`PatchGroup`]s, one per `ChunkToPatch`.
//!
//! A firmware publishes the patches of one chunk as consecutive records,
//! all but the last with `has_more`, the last with it only if the writer has
//! more patches for that chunk to come later. So a group ends at a record
//! without `has_more`, at a record for another chunk, or before any other
//! record (a chunk, a clock sample, a reset: [`PatchGrouper::finish`]); a
//! group ended by anything but its own last record keeps `has_more`.
//!
//! # Invariants
//!
//! * Records come out in the order they went in; nothing is merged across
//!   chunks.
//! * At most [`MAX_GROUP`] patches are held: a longer run is handed on in
//!   pieces (each but the last with `has_more`), so memory is bounded
//!   whatever a peer sends.

use shmtrace_abi::region::PatchSlot;

use super::{FirmwareEvent, ForwardPatch, PatchGroup};

/// Most patches held in one group.
pub const MAX_GROUP: usize = 1024;

/// Groups patch records. See the module docs.
#[derive(Debug, Default)]
pub struct PatchGrouper {
    pending: Option<PatchGroup>,
}

impl PatchGrouper {
    /// No group open.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one record; complete groups go to `out`.
    pub fn push(&mut self, p: PatchSlot, out: &mut impl Extend<FirmwareEvent>) {
        let same = self
            .pending
            .as_ref()
            .is_some_and(|g| (g.writer_id, g.chunk_id) == (p.writer_id, p.chunk_id));
        if !same {
            self.finish(out);
        }
        let group = self.pending.get_or_insert_with(|| PatchGroup {
            writer_id: p.writer_id,
            chunk_id: p.chunk_id,
            has_more: true,
            patches: Vec::new(),
        });
        group.patches.push(ForwardPatch {
            offset: u32::from(p.offset),
            data: p.data,
        });
        if !p.has_more {
            group.has_more = false;
            self.finish(out);
        } else if group.patches.len() >= MAX_GROUP {
            self.finish(out);
        }
    }

    /// Ends the open group, if any (something else than a patch follows).
    pub fn finish(&mut self, out: &mut impl Extend<FirmwareEvent>) {
        if let Some(group) = self.pending.take() {
            out.extend(Some(FirmwareEvent::Patches(group)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(writer_id: u16, chunk_id: u32, offset: u16, has_more: bool) -> PatchSlot {
        PatchSlot {
            writer_id,
            chunk_id,
            has_more,
            offset,
            data: [offset as u8; 4],
        }
    }

    fn groups(out: &[FirmwareEvent]) -> Vec<(u16, u32, bool, Vec<u32>)> {
        out.iter()
            .map(|e| match e {
                FirmwareEvent::Patches(g) => (
                    g.writer_id,
                    g.chunk_id,
                    g.has_more,
                    g.patches.iter().map(|p| p.offset).collect(),
                ),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_group_ends_at_its_last_record_another_chunk_or_anything_else() {
        let mut g = PatchGrouper::new();
        let mut out = Vec::new();
        g.push(slot(1, 7, 4, true), &mut out);
        g.push(slot(1, 7, 8, false), &mut out);
        assert_eq!(groups(&out), [(1, 7, false, vec![4, 8])]);
        // The writer has more for chunk 8 later; a patch of chunk 9 ends
        // the group, which keeps has_more.
        out.clear();
        g.push(slot(1, 8, 12, true), &mut out);
        g.push(slot(1, 9, 16, false), &mut out);
        assert_eq!(
            groups(&out),
            [(1, 8, true, vec![12]), (1, 9, false, vec![16])]
        );
        // Another writer's patch for the same chunk id is another chunk.
        out.clear();
        g.push(slot(1, 10, 0, true), &mut out);
        g.push(slot(2, 10, 4, true), &mut out);
        g.finish(&mut out);
        assert_eq!(
            groups(&out),
            [(1, 10, true, vec![0]), (2, 10, true, vec![4])]
        );
        g.finish(&mut out);
        assert_eq!(out.len(), 2, "nothing open");
    }

    #[test]
    fn a_long_run_is_handed_on_in_bounded_pieces() {
        let mut g = PatchGrouper::new();
        let mut out = Vec::new();
        for i in 0..(2 * MAX_GROUP + 1) {
            g.push(slot(3, 1, i as u16, true), &mut out);
        }
        assert_eq!(out.len(), 2);
        g.push(slot(3, 1, 0, false), &mut out);
        let got = groups(&out);
        assert_eq!(got.len(), 3);
        assert!(got[..2].iter().all(|g| g.2 && g.3.len() == MAX_GROUP));
        assert_eq!((got[2].2, got[2].3.len()), (false, 2));
    }
}
