//! Real-thread stress tests of the SMB through the production path
//! (`AtomicLeU32`/`AtomicLeU16` words overlaid on a heap buffer and
//! `ptr::copy_nonoverlapping` payload copies). Bounded iteration counts, no
//! timing assertions. Under miri the counts shrink and miri's data-race
//! detector checks every payload and header access.
//!
//! Property: every chunk a writer commits is read exactly once by the
//! service, in per-writer order, with the header and payload the writer
//! wrote, and the SMB drains back to all-free.
// `unsafe` here: an SMB in raw memory shared by real threads.
#![allow(unsafe_code)]

use std::sync::mpsc;
use std::thread;

use shmtrace_abi::layout::{
    ChunkFlags, ChunkHeaderRepr, Packets, PageLayout, PageSize, CHUNK_HEADER_SIZE,
};
use shmtrace_abi::smb::{ChunkLocation, Smb, SmbStorage};
use shmtrace_abi::state;
use shmtrace_abi::sync::AcquireError;

const SMB_SIZE: usize = 8 * 4096;
const CHUNKS_PER_WRITER: u32 = if cfg!(miri) { 3 } else { 5000 };
const WRITERS: [(u16, PageLayout); 3] = [
    (1, PageLayout::Div1),
    (2, PageLayout::Div4),
    (3, PageLayout::Div14),
];
/// Upper bound on acquisition attempts for one chunk (the service always
/// makes progress, so this is only hit if the protocol deadlocks).
const MAX_ATTEMPTS: u32 = 1_000_000;

fn pattern(writer_id: u16, chunk_id: u32, offset: usize) -> u8 {
    (usize::from(writer_id) * 31 + chunk_id as usize * 7 + offset) as u8
}

fn payload_len(chunk_id: u32, capacity: usize) -> usize {
    1 + (chunk_id as usize * 97) % capacity
}

/// Writes `CHUNKS_PER_WRITER` chunks through `smb` and sends each committed
/// location to the service.
fn writer(smb: &Smb<'_>, writer_id: u16, layout: PageLayout, commits: mpsc::Sender<ChunkLocation>) {
    let mut buf = vec![0u8; smb.page_size().get()];
    for chunk_id in 0..CHUNKS_PER_WRITER {
        let header = ChunkHeaderRepr {
            chunk_id,
            writer_id,
            packets: Packets::EMPTY,
        };
        let start = usize::from(writer_id) % smb.num_pages();
        let mut attempts = 0;
        let mut chunk = loop {
            match smb.try_acquire_any_chunk_for_writing(start, layout, header) {
                Ok(c) => break c,
                Err(AcquireError::NoFreeChunk | AcquireError::Contended) => {
                    attempts += 1;
                    assert!(attempts < MAX_ATTEMPTS, "writer {writer_id} starved");
                    thread::yield_now();
                }
                Err(e) => panic!("unexpected acquisition error: {e}"),
            }
        };
        let len = payload_len(chunk_id, chunk.capacity());
        for (offset, b) in buf[..len].iter_mut().enumerate() {
            *b = pattern(writer_id, chunk_id, offset);
        }
        // Write in up to three "packets", publishing the count after each.
        let mut offset = 0;
        let mut count = 0;
        for piece in buf[..len].chunks(len.div_ceil(3)) {
            chunk.write(offset, piece).unwrap();
            offset += piece.len();
            count += 1;
            chunk.set_packets(Packets::new(count, ChunkFlags::EMPTY).unwrap());
        }
        let location = chunk.release_as_complete().unwrap();
        commits.send(location).unwrap();
    }
}

/// Moves every committed chunk out, checking it.
fn service(smb: &Smb<'_>, commits: mpsc::Receiver<ChunkLocation>) {
    let mut next = [0u32; 4];
    let mut dst = vec![0u8; smb.page_size().get()];
    for location in commits {
        let chunk = smb
            .try_acquire_chunk_for_reading(location.page, location.chunk)
            .unwrap();
        let copied = chunk.copy_out(&mut dst).unwrap();
        let h = copied.header;
        let w = usize::from(h.writer_id);
        assert_eq!(
            h.chunk_id, next[w],
            "writer {w} chunks out of order or duplicated"
        );
        next[w] += 1;
        let capacity = copied.len - CHUNK_HEADER_SIZE;
        let len = payload_len(h.chunk_id, capacity);
        assert_eq!(h.packets.count(), len.div_ceil(len.div_ceil(3)) as u16);
        for (offset, b) in dst[CHUNK_HEADER_SIZE..CHUNK_HEADER_SIZE + len]
            .iter()
            .enumerate()
        {
            assert_eq!(
                *b,
                pattern(h.writer_id, h.chunk_id, offset),
                "writer {w} chunk {} byte {offset}",
                h.chunk_id
            );
        }
        chunk.release_as_free().unwrap();
    }
    for (w, _) in WRITERS {
        assert_eq!(
            next[usize::from(w)],
            CHUNKS_PER_WRITER,
            "writer {w} chunks missing"
        );
    }
}

fn assert_drained(smb: &Smb<'_>) {
    for page in 0..smb.num_pages() {
        let bitmap = smb.header_bitmap(page).unwrap();
        assert!(
            state::is_all_free(bitmap),
            "page {page} not drained: {bitmap:#x}"
        );
    }
}

/// Writers and the service share one `Smb`.
#[test]
fn shared_smb_writers_and_service() {
    let mut storage = Box::new(SmbStorage::<SMB_SIZE>::new());
    let smb = Smb::new(&mut storage, PageSize::DEFAULT).unwrap();
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        for (id, layout) in WRITERS {
            let tx = tx.clone();
            let smb = &smb;
            s.spawn(move || writer(smb, id, layout, tx));
        }
        drop(tx);
        s.spawn(|| service(&smb, rx));
    });
    assert_drained(&smb);
}

/// Producer and service each have their own view of the same memory, as two
/// processes mapping one memfd would.
#[test]
fn separate_views_of_one_buffer() {
    let mut storage = Box::new(SmbStorage::<SMB_SIZE>::new());
    let base = std::ptr::from_mut(&mut *storage).cast::<u8>();
    let page = PageSize::new(8192).unwrap();
    // SAFETY: `storage` outlives both views and is only accessed through
    // them; neither view scrapes.
    let (producer, service_view) = unsafe {
        (
            Smb::from_raw_parts(base, SMB_SIZE, page).unwrap(),
            Smb::from_raw_parts(base, SMB_SIZE, page).unwrap(),
        )
    };
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        for (id, layout) in WRITERS {
            let tx = tx.clone();
            let producer = &producer;
            s.spawn(move || writer(producer, id, layout, tx));
        }
        drop(tx);
        s.spawn(|| service(&service_view, rx));
    });
    assert_drained(&producer);
}
