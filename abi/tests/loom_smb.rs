//! loom models of the SMB chunk state machine.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-abi --release --test loom_smb`
//!
//! The models drive the same generic operations as [`shmtrace_abi::smb::Smb`]
//! (`shmtrace_abi::sync::*`) on an [`OwnedPageWords`] built from loom
//! atomics (loom atomics cannot live in a mapping). Chunk payloads are loom
//! `UnsafeCell`s, one per fragment slot, so loom itself reports any payload
//! access that is not ordered by the protocol: a writer and a reader touching
//! the same chunk at once, or a scraper reading a fragment the writer has not
//! published. On top of that the models assert:
//!
//! * a chunk is never owned by two parties (writer/service) at once;
//! * every chunk released as complete is read exactly once;
//! * a scrape sees only finished fragments, with the writer's values.
// `unsafe` here: an SMB in raw memory under loom.
#![allow(unsafe_code)]
#![cfg(loom)]

use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::Mutex;
use std::vec::Vec;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use shmtrace_abi::layout::{ChunkFlags, ChunkHeaderRepr, Packets, PageLayout};
use shmtrace_abi::sync::{self, Ordering, OwnedPageWords, PageWords};

/// Chunks per model page (layout Div2).
const CHUNKS: usize = 2;
/// Fragment slots per chunk: the writer's fragments plus the empty
/// fragment that covers an inflated count.
const SLOTS: usize = 3;
const LAYOUT: PageLayout = PageLayout::Div2;

const NO_OWNER: u8 = 0;
const WRITER: u8 = 1;
const SERVICE: u8 = 2;

/// Bookkeeping outside loom's view (plain std atomics and mutexes never
/// add synchronization loom could rely on; loom runs one thread at a time).
struct Model {
    page: OwnedPageWords,
    payload: [[UnsafeCell<u8>; SLOTS]; CHUNKS],
    owner: [AtomicU8; CHUNKS],
    completed: Mutex<Vec<(u16, u32)>>,
    read: Mutex<Vec<(u16, u32)>>,
}

impl Model {
    fn new() -> Self {
        Model {
            page: OwnedPageWords::new(),
            payload: std::array::from_fn(|_| std::array::from_fn(|_| UnsafeCell::new(0))),
            owner: std::array::from_fn(|_| AtomicU8::new(NO_OWNER)),
            completed: Mutex::new(Vec::new()),
            read: Mutex::new(Vec::new()),
        }
    }

    fn take(&self, chunk: usize, who: u8) {
        let prev = self.owner[chunk].swap(who, SeqCst);
        assert_eq!(
            prev, NO_OWNER,
            "chunk {chunk} taken by {who} while owned by {prev}"
        );
    }

    fn give_back(&self, chunk: usize, who: u8) {
        assert_eq!(self.owner[chunk].swap(NO_OWNER, SeqCst), who);
    }

    fn write_slot(&self, chunk: usize, slot: usize, value: u8) {
        // SAFETY: a plain write through loom's cell pointer; loom checks that
        // no other access to this cell races with it.
        self.payload[chunk][slot].with_mut(|p| unsafe { *p = value });
    }

    fn read_slot(&self, chunk: usize, slot: usize) -> u8 {
        // SAFETY: a plain read through loom's cell pointer; loom checks that
        // no write to this cell races with it.
        self.payload[chunk][slot].with(|p| unsafe { *p })
    }

    /// Checks the first `n` fragment slots of a chunk written by
    /// `writer_id` that holds `count` fragments.
    fn check_fragments(&self, chunk: usize, writer_id: u16, count: u16, n: u16, complete: bool) {
        for slot in 0..usize::from(n) {
            let expected = if complete && slot + 1 == usize::from(count) {
                0 // the empty fragment behind an inflated count
            } else {
                fragment_value(writer_id, slot)
            };
            assert_eq!(
                self.read_slot(chunk, slot),
                expected,
                "chunk {chunk} slot {slot}"
            );
        }
    }
}

fn fragment_value(writer_id: u16, slot: usize) -> u8 {
    (writer_id as u8) * 16 + slot as u8 + 1
}

fn packets(count: u16) -> u16 {
    Packets::new(count, ChunkFlags::EMPTY).unwrap().bits()
}

/// How a [`writer`] gets its chunk.
#[derive(Clone, Copy)]
enum Acquire {
    /// Partitions the page if it is free, then tries each chunk.
    InTwoSteps,
    /// `try_acquire_first_free`: both in one compare-and-swap.
    FirstFree,
}

/// A producer writer: gets a chunk (partitioning the page if it is free),
/// writes `fragments` fragments the way the C++ writer does (payload first,
/// then a release store of the inflated count), pads with an empty fragment
/// and releases the chunk as complete.
fn writer(m: &Model, writer_id: u16, fragments: usize) -> bool {
    write_chunk(m, writer_id, fragments, Acquire::InTwoSteps)
}

/// [`writer`], getting its chunk `how`.
fn write_chunk(m: &Model, writer_id: u16, fragments: usize, how: Acquire) -> bool {
    let header = ChunkHeaderRepr {
        chunk_id: u32::from(writer_id) * 100,
        writer_id,
        packets: Packets::EMPTY,
    };
    let candidates = match how {
        Acquire::InTwoSteps => {
            let _ = sync::try_partition(&m.page, LAYOUT);
            0..CHUNKS
        }
        Acquire::FirstFree => match sync::try_acquire_first_free(&m.page, LAYOUT, &header) {
            Ok((layout, chunk)) => {
                assert_eq!(layout, LAYOUT);
                chunk..chunk + 1
            }
            Err(_) => 0..0,
        },
    };
    for chunk in candidates {
        let layout = match how {
            Acquire::InTwoSteps => match sync::try_acquire_for_writing(&m.page, chunk, &header) {
                Ok(layout) => layout,
                Err(_) => continue,
            },
            Acquire::FirstFree => LAYOUT,
        };
        m.take(chunk, WRITER);
        let words = m.page.chunk_words(layout, chunk).unwrap();
        assert_eq!(
            words.load(Ordering::Relaxed).writer_id,
            writer_id,
            "the header was initialized"
        );
        for slot in 0..fragments {
            m.write_slot(chunk, slot, fragment_value(writer_id, slot));
            // Finishing fragment `slot` inflates the count to slot + 2.
            words
                .packets
                .store(packets(slot as u16 + 2), Ordering::Release);
        }
        m.write_slot(chunk, fragments, 0);
        m.give_back(chunk, WRITER);
        sync::release_as_complete(&m.page, layout, chunk).unwrap();
        m.completed
            .lock()
            .unwrap()
            .push((writer_id, header.chunk_id));
        return true;
    }
    false
}

/// The service: per chunk, scrape it, then move it out if it is complete.
fn service(m: &Model, rounds: usize) {
    for _ in 0..rounds {
        for chunk in 0..CHUNKS {
            if let Ok(snap) = sync::scrape_snapshot(&m.page, chunk) {
                let count = snap.header.packets.count();
                let trusted = if snap.complete() { count } else { count - 1 };
                m.check_fragments(
                    chunk,
                    snap.header.writer_id,
                    count,
                    trusted,
                    snap.complete(),
                );
            }
            if let Ok(layout) = sync::try_acquire_for_reading(&m.page, chunk) {
                m.take(chunk, SERVICE);
                let h = m
                    .page
                    .chunk_words(layout, chunk)
                    .unwrap()
                    .load(Ordering::Relaxed);
                let count = h.packets.count();
                m.check_fragments(chunk, h.writer_id, count, count, true);
                m.read.lock().unwrap().push((h.writer_id, h.chunk_id));
                m.give_back(chunk, SERVICE);
                sync::release_as_free(&m.page, layout, chunk).unwrap();
            }
        }
    }
}

/// A model builder with a preemption bound (the bugs this protocol could
/// have need at most a couple of preemptions; the bound keeps each model
/// well under a minute).
fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b
}

fn assert_read_exactly_once(m: &Model) {
    let mut completed = m.completed.lock().unwrap().clone();
    let mut read = m.read.lock().unwrap().clone();
    completed.sort_unstable();
    read.sort_unstable();
    assert_eq!(completed, read, "completed chunks vs chunks read");
}

/// Two writers race for the chunks of one page while the service scrapes and
/// moves chunks out; afterwards the service drains what is left.
#[test]
fn writers_and_service_race_on_one_page() {
    builder(2).check(|| {
        let m = Arc::new(Model::new());
        let writers: Vec<_> = [1u16, 2]
            .into_iter()
            .map(|id| {
                let m = m.clone();
                thread::spawn(move || writer(&m, id, 1))
            })
            .collect();
        service(&m, 1);
        for w in writers {
            w.join().unwrap();
        }
        service(&m, 1);
        assert_read_exactly_once(&m);
        assert!(sync::is_page_free(&m.page), "every chunk was freed");
    });
}

/// A writer publishing two fragments races with a scraping service: the
/// scraper must only ever see finished fragments.
#[test]
fn scrape_sees_only_finished_fragments() {
    builder(3).check(|| {
        let m = Arc::new(Model::new());
        let w = {
            let m = m.clone();
            thread::spawn(move || assert!(writer(&m, 3, 2)))
        };
        for _ in 0..2 {
            if let Ok(snap) = sync::scrape_snapshot(&m.page, 0) {
                let count = snap.header.packets.count();
                assert_eq!(
                    snap.header.writer_id, 3,
                    "header published before the count"
                );
                let trusted = if snap.complete() { count } else { count - 1 };
                m.check_fragments(0, 3, count, trusted, snap.complete());
            }
        }
        w.join().unwrap();
        service(&m, 1);
        assert_read_exactly_once(&m);
        assert_eq!(m.read.lock().unwrap().len(), 1);
    });
}

/// Three writers race to partition the page and take its two chunks: at most
/// one wins each chunk, and the two chunks are both taken.
#[test]
fn three_writers_never_share_a_chunk() {
    builder(2).check(|| {
        let m = Arc::new(Model::new());
        let handles: Vec<_> = [1u16, 2, 3]
            .into_iter()
            .map(|id| {
                let m = m.clone();
                thread::spawn(move || writer(&m, id, 0))
            })
            .collect();
        let winners = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&won| won)
            .count();
        assert_eq!(winners, CHUNKS, "exactly one writer per chunk");
        assert!(!sync::is_page_free(&m.page));
        service(&m, 1);
        assert_read_exactly_once(&m);
        assert!(sync::is_page_free(&m.page));
    });
}

/// Writers that partition and take a chunk in one compare-and-swap race
/// with one that does it in two steps: each chunk goes to one writer, and
/// both are taken.
#[test]
fn one_step_acquisitions_never_share_a_chunk() {
    builder(2).check(|| {
        let m = Arc::new(Model::new());
        let how = [Acquire::FirstFree, Acquire::InTwoSteps, Acquire::FirstFree];
        let handles: Vec<_> = [1u16, 2, 3]
            .into_iter()
            .zip(how)
            .map(|(id, how)| {
                let m = m.clone();
                thread::spawn(move || write_chunk(&m, id, 0, how))
            })
            .collect();
        let winners = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&won| won)
            .count();
        assert_eq!(winners, CHUNKS, "exactly one writer per chunk");
        service(&m, 1);
        assert_read_exactly_once(&m);
        assert!(sync::is_page_free(&m.page));
    });
}

/// One-step writers race with the service moving chunks out (which frees,
/// and so unpartitions, the page): nothing is owned twice or lost.
#[test]
fn one_step_writers_and_service_race_on_one_page() {
    builder(2).check(|| {
        let m = Arc::new(Model::new());
        let writers: Vec<_> = [1u16, 2]
            .into_iter()
            .map(|id| {
                let m = m.clone();
                thread::spawn(move || write_chunk(&m, id, 1, Acquire::FirstFree))
            })
            .collect();
        service(&m, 1);
        for w in writers {
            w.join().unwrap();
        }
        service(&m, 1);
        assert_read_exactly_once(&m);
        assert!(sync::is_page_free(&m.page), "every chunk was freed");
    });
}
