//! Property tests for the SMB geometry, header encodings and the chunk state
//! machine (pure functions, the generic atomic operations and the real `Smb`
//! against a reference model).
//!
//! Case counts drop under miri (`cargo +nightly miri test -p shmtrace-abi`).

use std::collections::HashMap;

use proptest::prelude::*;
use shmtrace_abi::layout::{
    ChunkFlags, ChunkHeader, ChunkHeaderRepr, Packets, PageHeader, PageHeaderRepr, PageLayout,
    PageSize, CHUNK_ALIGNMENT, CHUNK_HEADER_SIZE, MAX_CHUNKS_PER_PAGE, PAGE_HEADER_SIZE,
};
use shmtrace_abi::smb::{Smb, SmbStorage};
use shmtrace_abi::state::{self, ChunkState, Transition, TransitionError};
use shmtrace_abi::sync::{self, OwnedPageWords, PageWords};

fn config() -> ProptestConfig {
    let mut config = ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 });
    if cfg!(miri) {
        // miri's isolation forbids the regression-file lookup.
        config.failure_persistence = None;
    }
    config
}

fn any_page_size() -> impl Strategy<Value = PageSize> {
    (1usize..=16).prop_map(|units| PageSize::new(units * 4096).unwrap())
}

fn any_layout() -> impl Strategy<Value = PageLayout> {
    (0u32..8).prop_map(PageLayout::from_bits)
}

fn any_state() -> impl Strategy<Value = ChunkState> {
    (0u32..4).prop_map(ChunkState::from_bits)
}

fn any_transition() -> impl Strategy<Value = Transition> {
    (0usize..5).prop_map(|i| Transition::ALL[i])
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn chunk_geometry_fits_aligned_and_disjoint(page in any_page_size(), layout in any_layout()) {
        let n = layout.num_chunks();
        match page.chunk_size(layout) {
            None => prop_assert_eq!(n, 0),
            Some(size) => {
                prop_assert_eq!(size, ((page.get() - 8) / n) & !3);
                prop_assert!(size <= usize::from(u16::MAX));
                let mut prev_end = PAGE_HEADER_SIZE;
                for chunk in 0..n {
                    let g = page.chunk_geometry(layout, chunk).unwrap();
                    prop_assert_eq!(g.size, size);
                    prop_assert_eq!(g.offset % CHUNK_ALIGNMENT, 0);
                    prop_assert!(g.offset >= prev_end, "chunks overlap");
                    prop_assert!(g.end() <= page.get(), "chunk past the page end");
                    prop_assert!(g.payload_size() > 0);
                    prop_assert_eq!(g.payload_size() + CHUNK_HEADER_SIZE, g.size);
                    prev_end = g.end();
                }
                // The unused tail is less than one chunk plus alignment.
                prop_assert!(page.get() - prev_end < n * CHUNK_ALIGNMENT);
            }
        }
        prop_assert_eq!(page.chunk_geometry(layout, n), None);
        prop_assert_eq!(page.chunk_geometry(layout, MAX_CHUNKS_PER_PAGE), None);
    }

    #[test]
    fn page_size_validators_agree(bytes in 0usize..80_000) {
        let abi = PageSize::new(bytes);
        prop_assert_eq!(abi.is_ok(), (4096..=65536).contains(&bytes) && bytes % 4096 == 0);
        let service = PageSize::new_service(bytes);
        prop_assert_eq!(service.is_ok(), [4096, 8192, 16384, 32768].contains(&bytes));
        if let Ok(s) = service {
            prop_assert_eq!(Ok(s), abi);
        }
    }

    #[test]
    fn chunk_header_bytes_round_trip(bytes in any::<[u8; 8]>()) {
        let repr = ChunkHeaderRepr::from_bytes(bytes);
        prop_assert_eq!(repr.to_bytes(), bytes);
        let view = ChunkHeader::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(ChunkHeaderRepr::parse(&view), repr);
        prop_assert_eq!(repr.chunk_id, u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
        prop_assert_eq!(repr.writer_id, u16::from_le_bytes([bytes[4], bytes[5]]));
        let packets = u16::from_le_bytes([bytes[6], bytes[7]]);
        prop_assert_eq!(repr.packets.count(), packets & 0x3FF);
        prop_assert_eq!(u16::from(repr.packets.flags().bits()), packets >> 10);
        let mut out = [0u8; 8];
        repr.emit(&mut ChunkHeader::new_unchecked(&mut out[..]));
        prop_assert_eq!(out, bytes);
        let page = PageHeaderRepr::from_bytes(bytes);
        prop_assert_eq!(page.to_bytes(), bytes);
        prop_assert_eq!(PageHeaderRepr::parse(&PageHeader::new_checked(&bytes[..]).unwrap()), page);
    }

    #[test]
    fn packets_pack_and_unpack(count in 0u16..=1023, flags in 0u8..64, other in 0u16..=1023) {
        let f = ChunkFlags::from_bits_retain(flags);
        let p = Packets::new(count, f).unwrap();
        prop_assert_eq!((p.count(), p.flags()), (count, f));
        prop_assert_eq!(Packets::from_bits(p.bits()), p);
        prop_assert_eq!(p.with_count(other).unwrap().flags(), f);
        prop_assert_eq!(p.with_flags(ChunkFlags::EMPTY).count(), count);
        prop_assert_eq!(Packets::new(count + 1024, f), None);
    }

    #[test]
    fn bitmap_state_set_get_round_trip(bitmap in any::<u32>(), chunk in 0usize..16, s in any_state()) {
        let n = state::num_chunks(bitmap);
        match state::with_chunk_state(bitmap, chunk, s) {
            None => {
                prop_assert!(chunk >= n);
                prop_assert_eq!(state::chunk_state(bitmap, chunk), None);
            }
            Some(next) => {
                prop_assert!(chunk < n);
                prop_assert_eq!(state::chunk_state(next, chunk), Some(s));
                prop_assert_eq!(state::layout(next), state::layout(bitmap));
                prop_assert_eq!(next & !state::ALL_CHUNKS_MASK, bitmap & !state::ALL_CHUNKS_MASK);
                for other in (0..n).filter(|&o| o != chunk) {
                    prop_assert_eq!(state::chunk_state(next, other), state::chunk_state(bitmap, other));
                }
                let free = state::free_chunks(next);
                prop_assert_eq!(free & (1 << chunk) != 0, s == ChunkState::Free);
                prop_assert_eq!(u32::from(free) >> n, 0);
            }
        }
    }

    #[test]
    fn only_legal_transitions_apply(bitmap in any::<u32>(), chunk in 0usize..16, t in any_transition()) {
        let n = state::num_chunks(bitmap);
        let result = state::apply(bitmap, chunk, t);
        match state::chunk_state(bitmap, chunk) {
            None => prop_assert_eq!(result, Err(TransitionError::ChunkOutOfRange { chunk, num_chunks: n })),
            Some(found) if found != t.from() => {
                prop_assert_eq!(result, Err(TransitionError::WrongState { expected: t.from(), found }));
            }
            Some(_) => {
                let next = result.unwrap();
                let set = state::with_chunk_state(bitmap, chunk, t.to()).unwrap();
                if t.to() == ChunkState::Free && state::is_all_free(set) {
                    prop_assert_eq!(next, 0);
                } else {
                    prop_assert_eq!(next, set);
                }
            }
        }
    }
}

/// Reference model of one page: plain data, written independently of
/// `state`.
#[derive(Clone, Debug, PartialEq)]
struct RefPage {
    layout: PageLayout,
    states: Vec<ChunkState>,
}

impl RefPage {
    fn free() -> Self {
        RefPage {
            layout: PageLayout::NotPartitioned,
            states: Vec::new(),
        }
    }

    fn bitmap(&self) -> u32 {
        let mut b = self.layout.bits() << 28;
        for (i, s) in self.states.iter().enumerate() {
            b |= (*s as u32) << (2 * i);
        }
        b
    }

    /// Returns whether the operation is legal, applying it if so.
    fn step(&mut self, op: &Op) -> bool {
        match *op {
            Op::Partition(l) => {
                if self.layout != PageLayout::NotPartitioned || !l.is_partition_layout() {
                    return false;
                }
                self.layout = l;
                self.states = vec![ChunkState::Free; l.num_chunks()];
                true
            }
            Op::Move(chunk, t) => {
                let Some(s) = self.states.get_mut(chunk) else {
                    return false;
                };
                if *s != t.from() {
                    return false;
                }
                *s = t.to();
                if self.states.iter().all(|s| *s == ChunkState::Free) {
                    *self = RefPage::free();
                }
                true
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Partition(PageLayout),
    Move(usize, Transition),
}

fn any_op() -> impl Strategy<Value = Op> {
    // Mostly low chunk indices, so that sequences reach deep states.
    let chunk = prop_oneof![4 => 0usize..3, 1 => 0usize..15];
    prop_oneof![
        1 => any_layout().prop_map(Op::Partition),
        4 => (chunk, any_transition()).prop_map(|(c, t)| Op::Move(c, t)),
    ]
}

fn header(op_index: usize) -> ChunkHeaderRepr {
    ChunkHeaderRepr {
        chunk_id: op_index as u32,
        writer_id: 1 + (op_index % 32767) as u16,
        packets: Packets::new((op_index % 1024) as u16, ChunkFlags::EMPTY).unwrap(),
    }
}

/// Runs `op` through the generic operations on any `PageWords`.
fn run_generic<P: PageWords>(page: &P, op: &Op, i: usize) -> bool {
    let bitmap = sync::AtomicWord32::load(page.header_bitmap(), sync::Ordering::Relaxed);
    let layout = state::layout(bitmap);
    match *op {
        Op::Partition(l) => sync::try_partition(page, l).is_ok(),
        Op::Move(chunk, t) => match t {
            Transition::AcquireForWriting => {
                sync::try_acquire_for_writing(page, chunk, &header(i)).is_ok()
            }
            Transition::ReleaseAsComplete => sync::release_as_complete(page, layout, chunk).is_ok(),
            Transition::AcquireForReading => sync::try_acquire_for_reading(page, chunk).is_ok(),
            Transition::ReleaseAsFree => sync::release_as_free(page, layout, chunk).is_ok(),
            Transition::EmulationReleaseAsFree => {
                sync::release_complete_as_free(page, chunk).is_ok()
            }
        },
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn generic_ops_match_the_reference_model(ops in prop::collection::vec(any_op(), 1..60)) {
        let page = OwnedPageWords::new();
        let mut model = RefPage::free();
        for (i, op) in ops.iter().enumerate() {
            let legal = model.step(op);
            prop_assert_eq!(run_generic(&page, op, i), legal, "op {} {:?}", i, op);
            let bitmap = sync::AtomicWord32::load(page.header_bitmap(), sync::Ordering::Relaxed);
            prop_assert_eq!(bitmap, model.bitmap());
            if legal {
                if let Op::Move(chunk, t) = *op {
                    let words = page.chunk_words(PageLayout::Div14, chunk).unwrap();
                    let h = words.load(sync::Ordering::Relaxed);
                    match t {
                        Transition::AcquireForWriting => prop_assert_eq!(h, header(i)),
                        Transition::ReleaseAsFree | Transition::EmulationReleaseAsFree => {
                            prop_assert_eq!(h, ChunkHeaderRepr::default());
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// The same sequences through the real `Smb` (atomics overlaid on
    /// memory): tokens are kept while their chunk is held, payload bytes are
    /// stamped when writing and checked in the copy when reading.
    #[test]
    fn smb_matches_the_reference_model(ops in prop::collection::vec(any_op(), 1..40), page in 0usize..2) {
        let mut storage = Box::new(SmbStorage::<8192>::new());
        let smb = Smb::new(&mut storage, PageSize::DEFAULT).unwrap();
        let mut model = RefPage::free();
        let mut writing = HashMap::new();
        let mut reading = HashMap::new();
        let mut dst = vec![0u8; 4096];
        for (i, op) in ops.iter().enumerate() {
            let legal = model.step(op);
            let done = match *op {
                Op::Partition(l) => smb.try_partition_page(page, l).is_ok(),
                Op::Move(chunk, Transition::AcquireForWriting) => {
                    match smb.try_acquire_chunk_for_writing(page, chunk, header(i)) {
                        Ok(mut w) => {
                            let cap = w.capacity();
                            w.write_u8(0, i as u8).unwrap();
                            w.write_u8(cap - 1, !(i as u8)).unwrap();
                            prop_assert!(writing.insert(chunk, w).is_none());
                            true
                        }
                        Err(_) => false,
                    }
                }
                Op::Move(chunk, Transition::ReleaseAsComplete) => match writing.remove(&chunk) {
                    Some(w) => w.release_as_complete().is_ok(),
                    None => false,
                },
                Op::Move(chunk, Transition::AcquireForReading) => {
                    match smb.try_acquire_chunk_for_reading(page, chunk) {
                        Ok(r) => {
                            let copied = r.copy_out(&mut dst).unwrap();
                            let end = copied.len - 1;
                            let stamp = copied.header.chunk_id as u8;
                            prop_assert_eq!(copied.header, header(copied.header.chunk_id as usize));
                            prop_assert_eq!((dst[CHUNK_HEADER_SIZE], dst[end]), (stamp, !stamp));
                            prop_assert!(reading.insert(chunk, r).is_none());
                            true
                        }
                        Err(_) => false,
                    }
                }
                Op::Move(chunk, Transition::ReleaseAsFree) => match reading.remove(&chunk) {
                    Some(r) => r.release_as_free().is_ok(),
                    None => false,
                },
                Op::Move(chunk, Transition::EmulationReleaseAsFree) => {
                    smb.release_complete_as_free(page, chunk).is_ok()
                }
            };
            prop_assert_eq!(done, legal, "op {} {:?}", i, op);
            prop_assert_eq!(smb.header_bitmap(page), Some(model.bitmap()));
            prop_assert_eq!(smb.header_bitmap(1 - page), Some(0), "the other page is untouched");
        }
        // Hand back what is still held so the page can drain.
        for (_, w) in writing.drain() {
            let loc = w.location();
            prop_assert!(w.release_as_complete().is_ok());
            prop_assert!(smb.release_complete_as_free(loc.page, loc.chunk).is_ok());
        }
        for (_, r) in reading.drain() {
            prop_assert!(r.release_as_free().is_ok());
        }
        for chunk in 0..MAX_CHUNKS_PER_PAGE {
            let _ = smb.release_complete_as_free(page, chunk);
        }
        // A partitioned page with every chunk free stays partitioned.
        prop_assert!(state::is_all_free(smb.header_bitmap(page).unwrap()));
    }
}
