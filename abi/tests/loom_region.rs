//! loom model of the region's commit ring: two producers (firmware
//! contexts) and one consumer.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-abi --release --test loom_region`
//!
//! The model runs the ring protocol of `shmtrace_abi::region::ring` (the
//! code the firmware and the reader run) over loom atomics, with slot
//! bodies in loom `UnsafeCell`s: loom reports any body access the sequence
//! words do not order (a consumer reading a record while it is written, a
//! producer overwriting one not yet read). On top of that the models assert
//! that every record is received exactly once, each producer's records in
//! the order it published them, and that the consumer never sees a slot a
//! correct peer could not have written.
// `unsafe` here: a region in raw memory under loom.
#![allow(unsafe_code)]
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU32;
use loom::sync::Arc;
use loom::thread;
use shmtrace_abi::region::ring::{self, Peek, RingWords};
use shmtrace_abi::region::SlotBody;

const SLOTS: u32 = 2;

struct LoomRing {
    head: AtomicU32,
    tail: AtomicU32,
    seq: [AtomicU32; SLOTS as usize],
    body: [UnsafeCell<SlotBody>; SLOTS as usize],
}

impl LoomRing {
    fn new() -> Self {
        // Initialized as the protocol says: `seq[i] = i`, `head = tail = 0`.
        LoomRing {
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            seq: std::array::from_fn(|i| AtomicU32::new(i as u32)),
            body: std::array::from_fn(|_| UnsafeCell::new([0; 7])),
        }
    }
}

impl RingWords for LoomRing {
    type Word = AtomicU32;

    fn slots(&self) -> u32 {
        SLOTS
    }

    fn head(&self) -> &AtomicU32 {
        &self.head
    }

    fn tail(&self) -> &AtomicU32 {
        &self.tail
    }

    fn seq(&self, index: u32) -> Option<&AtomicU32> {
        self.seq.get(index as usize)
    }

    fn write_body(&self, index: u32, body: &SlotBody) {
        // SAFETY: a plain write through loom's cell pointer; loom checks
        // that no other access to this cell races with it.
        self.body[index as usize].with_mut(|p| unsafe { *p = *body });
    }

    fn read_body(&self, index: u32) -> SlotBody {
        // SAFETY: a plain read through loom's cell pointer; loom checks that
        // no write to this cell races with it.
        self.body[index as usize].with(|p| unsafe { *p })
    }
}

/// A record: producer id and its sequence number.
fn record(producer: u32, n: u32) -> SlotBody {
    [producer, n, producer ^ n, 0, 0, 0, 0]
}

/// Publishes groups of records (a group of 1 or 2 is one claim); a group
/// that finds the ring full twice is given up, as the firmware does (it
/// counts an overflow). Returns the number of records published.
fn produce(ring: &LoomRing, producer: u32, groups: &[u32]) -> u32 {
    let mut n = 0;
    for &group in groups {
        for _ in 0..2 {
            let mut next = n;
            let pushed = ring::try_push(ring, group, &mut || {
                next += 1;
                record(producer, next - 1)
            });
            if pushed.is_ok() {
                n += group;
                break;
            }
            thread::yield_now();
        }
    }
    n
}

/// Takes what is published at the consumer's position, up to `attempts`
/// times (the consumer polls; it never waits for a producer).
fn consume(ring: &LoomRing, pos: &mut u32, got: &mut Vec<(u32, u32)>, attempts: usize) {
    for _ in 0..attempts {
        match ring::peek(ring, *pos) {
            Peek::Ready(body) => {
                assert_eq!(body[2], body[0] ^ body[1], "torn record {body:?}");
                got.push((body[0], body[1]));
                ring::release(ring, *pos);
                *pos = pos.wrapping_add(1);
            }
            Peek::NotReady => thread::yield_now(),
            other => panic!("a correct producer never leaves {other:?} at {pos}"),
        }
    }
}

/// Runs producers 1 and 2 with their groups against a consumer polling
/// meanwhile, then drains; checks exactly the published records arrived,
/// each producer's in order, groups contiguous.
fn run(groups_1: &'static [u32], groups_2: &'static [u32]) {
    let ring = Arc::new(LoomRing::new());
    let a = {
        let ring = ring.clone();
        thread::spawn(move || produce(&ring, 1, groups_1))
    };
    let b = {
        let ring = ring.clone();
        thread::spawn(move || produce(&ring, 2, groups_2))
    };
    let mut got = Vec::new();
    let mut pos = 0;
    consume(&ring, &mut pos, &mut got, 2);
    let published = [(1, a.join().unwrap()), (2, b.join().unwrap())];
    // Everything is published now: one lap of polls takes the rest.
    consume(&ring, &mut pos, &mut got, SLOTS as usize + 1);
    assert_eq!(ring::peek(&*ring, pos), Peek::NotReady);
    for (producer, count) in published {
        let mine: Vec<u32> = got
            .iter()
            .filter(|r| r.0 == producer)
            .map(|r| r.1)
            .collect();
        assert_eq!(
            mine,
            (0..count).collect::<Vec<_>>(),
            "producer {producer}: {got:?}"
        );
    }
    assert_eq!(got.len() as u32, published.iter().map(|p| p.1).sum::<u32>());
    assert_eq!(ring.tail.load(loom::sync::atomic::Ordering::Relaxed), pos);
    if groups_1.contains(&2) {
        if let Some(first) = got.iter().position(|r| r.0 == 1) {
            assert_eq!(got[first + 1].0, 1, "group split: {got:?}");
        }
    }
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

/// Two producers commit one record each, then one more while the ring of
/// two slots may be full.
#[test]
fn two_producers_one_consumer() {
    builder().check(|| run(&[1, 1], &[1]));
}

/// A producer claims two slots at once (a patch group) while another
/// commits one: the group stays contiguous and whole.
#[test]
fn a_group_claim_races_a_single_one() {
    builder().check(|| run(&[2], &[1]));
}
