//! Byte storage of a trace buffer: a ring of records with out-of-band
//! metadata.
//!
//! # Invariants
//!
//! * `records` lists every record in write order (oldest first); record ids
//!   are consecutive, the front has id `first_id`.
//! * Records never straddle the end of the ring: a record that does not fit
//!   before the end is preceded by a [`Owner::Padding`] record covering the
//!   tail, and written at offset 0.
//! * Records do not overlap. Because every write first evicts the records in
//!   its way, the records at offsets `>= wr` are all older than the records
//!   at offsets `< wr`, so the records in the way of the next write are
//!   always at the front of `records`.
//! * Offsets and footprints are multiples of [`RECORD_ALIGN`]; the capacity
//!   is too.

use std::collections::VecDeque;

use super::sequence::SeqIdx;

/// Alignment of every record in the ring.
pub const RECORD_ALIGN: usize = 16;

/// Capacity every record is charged on top of its bytes, for its index
/// entry: this bounds the number of records (and so the index's memory) by
/// `capacity / RECORD_OVERHEAD`. A chunk record's data starts this far into
/// the record; a chunk copied straight from shared memory keeps its 8-byte
/// header just before its data, inside this overhead.
pub const RECORD_OVERHEAD: usize = 16;

/// Footprint of a record holding `len` bytes.
pub fn footprint(len: usize) -> usize {
    len.div_ceil(RECORD_ALIGN) * RECORD_ALIGN + RECORD_OVERHEAD
}

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The unused tail of the ring before a wrap.
    Padding,
    /// A copy of chunk `ext` of sequence `seq`. The record is *live* only
    /// while that sequence's slot for `ext` still names this record id;
    /// otherwise it is dead space (read, or replaced by a relocation).
    Chunk {
        /// The sequence.
        seq: SeqIdx,
        /// Extended chunk id within the sequence.
        ext: u64,
    },
}

/// One record of the ring.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    /// Offset in the ring.
    pub offset: usize,
    /// Bytes of the ring it occupies.
    pub footprint: usize,
    /// What it holds.
    pub owner: Owner,
}

/// Where the next record of a given footprint goes, and what it evicts.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The write cursor wraps first (the tail becomes padding).
    pub wrap: bool,
    /// The number of front records that must be evicted.
    pub evict: usize,
}

/// The ring.
#[derive(Clone)]
pub struct Ring {
    data: Box<[u8]>,
    wr: usize,
    records: VecDeque<Record>,
    first_id: u64,
}

impl Ring {
    /// A ring of `capacity` bytes (a non-zero multiple of [`RECORD_ALIGN`]).
    /// The memory is zeroed lazily by the allocator.
    pub fn new(capacity: usize) -> Self {
        debug_assert!(capacity > 0 && capacity % RECORD_ALIGN == 0);
        Self {
            data: vec![0u8; capacity].into_boxed_slice(),
            wr: 0,
            records: VecDeque::new(),
            first_id: 0,
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.data.len()
    }

    /// All bytes of the ring.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The bytes of one record.
    pub fn bytes_mut(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        self.data.get_mut(offset..offset.checked_add(len)?)
    }

    /// Id of the oldest record (the next id if empty).
    pub fn front_id(&self) -> u64 {
        self.first_id
    }

    /// One past the id of the newest record.
    pub fn end_id(&self) -> u64 {
        self.first_id + self.records.len() as u64
    }

    /// The record with id `id`, if it is still in the ring.
    pub fn get(&self, id: u64) -> Option<&Record> {
        let index = usize::try_from(id.checked_sub(self.first_id)?).ok()?;
        self.records.get(index)
    }

    /// The `i`-th record from the front.
    pub fn nth(&self, i: usize) -> Option<(u64, &Record)> {
        self.records.get(i).map(|r| (self.first_id + i as u64, r))
    }

    /// Plans a write of `footprint` bytes (`<= capacity`).
    pub fn plan(&self, footprint: usize) -> Plan {
        let cap = self.data.len();
        let mut wr = self.wr;
        let mut evict = 0;
        let mut wrap = false;
        if wr + footprint > cap {
            // Everything in the tail goes with the padding: those records are
            // the oldest, at the front.
            wrap = true;
            while self.records.get(evict).is_some_and(|r| r.offset >= wr) {
                evict += 1;
            }
            wr = 0;
        }
        while self
            .records
            .get(evict)
            .is_some_and(|r| r.offset >= wr && r.offset < wr + footprint)
        {
            evict += 1;
        }
        Plan { wrap, evict }
    }

    /// Removes the oldest record.
    pub fn pop_front(&mut self) -> Option<(u64, Record)> {
        let record = self.records.pop_front()?;
        let id = self.first_id;
        self.first_id += 1;
        Some((id, record))
    }

    /// Writes a record after the evictions of `plan` happened: returns the
    /// padding footprint written (0 if none) and the new record's id and
    /// offset.
    pub fn place(&mut self, plan: Plan, footprint: usize, owner: Owner) -> (usize, u64, usize) {
        let mut padding = 0;
        if plan.wrap {
            padding = self.data.len() - self.wr;
            if padding > 0 {
                self.records.push_back(Record {
                    offset: self.wr,
                    footprint: padding,
                    owner: Owner::Padding,
                });
            }
            self.wr = 0;
        }
        let offset = self.wr;
        self.records.push_back(Record {
            offset,
            footprint,
            owner,
        });
        self.wr += footprint;
        (padding, self.end_id() - 1, offset)
    }

    /// Gives the newest record its final owner and a footprint no larger
    /// than it was placed with; the rest returns to the write cursor.
    pub fn finish_back(&mut self, owner: Owner, footprint: usize) {
        if let Some(last) = self.records.back_mut() {
            let footprint = footprint.min(last.footprint);
            last.owner = owner;
            last.footprint = footprint;
            self.wr = last.offset + footprint;
        }
    }

    /// The write cursor.
    pub fn write_cursor(&self) -> usize {
        self.wr
    }

    /// Undoes the newest [`place`](Self::place) (a reservation given up):
    /// removes its record, and the wrap padding placed with it if
    /// `with_padding`, and puts the write cursor back to `wr`, where it was
    /// before. Records evicted for it stay evicted.
    pub fn unplace(&mut self, with_padding: bool, wr: usize) {
        self.records.pop_back();
        if with_padding {
            self.records.pop_back();
        }
        self.wr = wr;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(ext: u64) -> Owner {
        Owner::Chunk { seq: 0, ext }
    }

    #[test]
    fn footprints_round_up_and_charge_the_overhead() {
        assert_eq!(footprint(0), 16);
        assert_eq!(footprint(1), 32);
        assert_eq!(footprint(16), 32);
        assert_eq!(footprint(4088), 4096 + 16);
    }

    #[test]
    fn writes_evict_the_oldest_records_in_their_way() {
        let mut ring = Ring::new(128);
        for ext in 0..4 {
            let plan = ring.plan(32);
            assert_eq!((plan.wrap, plan.evict), (false, 0));
            ring.place(plan, 32, chunk(ext));
        }
        // Full: the next 48 bytes wrap (no padding: wr == cap) and evict two.
        let plan = ring.plan(48);
        assert_eq!((plan.wrap, plan.evict), (true, 2));
        for _ in 0..plan.evict {
            ring.pop_front();
        }
        let (padding, id, offset) = ring.place(plan, 48, chunk(4));
        assert_eq!((padding, id, offset), (0, 4, 0));
        // 32 bytes at 48 evict the record at 64 only.
        let plan = ring.plan(32);
        assert_eq!((plan.wrap, plan.evict), (false, 1));
        ring.pop_front();
        ring.place(plan, 32, chunk(5));
        // 64 bytes at 80 do not fit: the tail [80, 128) holds the record at
        // 96 (evicted with the padding), and [0, 64) holds ids 4 and 5.
        let plan = ring.plan(64);
        assert_eq!((plan.wrap, plan.evict), (true, 3));
        for _ in 0..3 {
            ring.pop_front();
        }
        let (padding, id, offset) = ring.place(plan, 64, chunk(6));
        assert_eq!((padding, offset), (48, 0));
        assert_eq!(ring.get(id).map(|r| r.owner), Some(chunk(6)));
        assert_eq!(ring.nth(0).map(|(_, r)| r.owner), Some(Owner::Padding));
    }

    #[test]
    fn the_newest_record_shrinks_or_goes_back_to_the_cursor() {
        let mut ring = Ring::new(128);
        let plan = ring.plan(64);
        ring.place(plan, 64, Owner::Padding);
        ring.finish_back(chunk(0), 32);
        let plan = ring.plan(96);
        assert_eq!((plan.wrap, plan.evict), (false, 0), "96 bytes fit after 32");
        let wr = ring.write_cursor();
        let (_, id, offset) = ring.place(plan, 96, Owner::Padding);
        assert_eq!((id, offset), (1, 32));
        ring.unplace(false, wr);
        assert_eq!(ring.end_id(), 1);
        let (_, id, offset) = ring.place(ring.plan(16), 16, chunk(1));
        assert_eq!((id, offset), (1, 32), "the cursor went back");
        assert_eq!(
            ring.get(0).map(|r| (r.footprint, r.owner)),
            Some((32, chunk(0)))
        );
    }

    #[test]
    fn undoing_a_wrapping_place_removes_its_padding_and_restores_the_cursor() {
        let mut ring = Ring::new(128);
        ring.place(ring.plan(96), 96, chunk(0));
        ring.pop_front();
        let wr = ring.write_cursor();
        let plan = ring.plan(64);
        assert!(plan.wrap);
        let (padding, _, offset) = ring.place(plan, 64, Owner::Padding);
        assert_eq!((padding, offset), (32, 0));
        ring.unplace(true, wr);
        assert_eq!(
            (ring.write_cursor(), ring.end_id(), ring.front_id()),
            (96, 1, 1)
        );
        let (padding, id, offset) = ring.place(ring.plan(32), 32, chunk(1));
        assert_eq!(
            (padding, id, offset),
            (0, 1, 96),
            "nothing of the undone wrap is left"
        );
    }
}
