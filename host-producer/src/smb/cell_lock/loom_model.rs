//! loom models of the writer cell's lock ([`super`]), run on its own code:
//! its flags are loom's atomics here, the taker's `membarrier` is the
//! model of [`crate::sync::membarrier`], and the data it guards is a loom
//! cell.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-producer --features tracing --release --lib --target-dir target/loom loom_model`.
//!
//! Each model races the owner's event (its attempt, its wait for a taker
//! and retry, one write to the guarded cell, its release) with one taker's
//! claim, fence and confirm (a write to the cell if it got the lock, then
//! its release). loom fails a model where both write the cell without one
//! ordered before the other, i.e. both held the lock. The models assert
//! too:
//!
//! * the owner always gets the lock (waiting out the taker: its retry
//!   succeeds once the taker let go), and both writes made under the lock
//!   are there after;
//! * the taker both gets it and is refused in some executions, and the
//!   owner's first attempt both succeeds and backs off;
//! * once the race is over nobody holds the lock: a taker's claim and
//!   confirm succeed, then the owner's first attempt does (a taker fails
//!   only while the owner is at it, the owner only while a taker is).
//!
//! [`LockMode::Symmetric`] runs as written; loom's `SeqCst` accesses are
//! only `AcqRel`, so `crate::sync::seq_cst_store_load` gives it the store
//! then load order that C11 gives two `SeqCst` accesses (the `sync`
//! module docs). [`LockMode::Asymmetric`] runs once per point of the
//! owner's attempt where the taker's `membarrier` may put its barrier:
//! before the owner's `in_use` store, at its compiler fence (between the
//! store and its `taker` load), after the load (and wherever the owner
//! waits for the taker, or at its end, if it never reaches the point
//! during the call): the barrier's place in the owner's program is the
//! kernel's choice, so the lock must hold for each. Later points of the
//! attempt (its write, its release) order the store and the load as the
//! point after the load does.
//!
//! Dropping the taker's `membarrier` (a plain compiler fence, as the
//! owner's), or the `SeqCst` order between the symmetric sides' store and
//! load, fails these models (both write the cell).

// `unsafe` here: the guarded cell's accesses.
#![allow(unsafe_code)]

use std::sync::atomic::AtomicBool as Seen;
use std::sync::atomic::Ordering::Relaxed;

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::sync::{membarrier, UnsafeCell};

/// A lock and the data it guards.
struct Guarded {
    lock: CellLock,
    /// Owner's writes count 1, the taker's 10.
    data: UnsafeCell<u32>,
}

impl Guarded {
    fn add(&self, n: u32) {
        // SAFETY: only called by the lock's holder; loom checks that two
        // holders' accesses are ordered.
        self.data.with_mut(|p| unsafe { *p += n });
    }

    fn total(&self) -> u32 {
        // SAFETY: as `add`.
        self.data.with(|p| unsafe { *p })
    }

    /// A taker's whole attempt; `true` if it got the lock (and wrote).
    fn taker(&self) -> bool {
        assert!(self.lock.claim(), "the only taker");
        taker_fence(self.lock.mode());
        if !self.lock.confirm() {
            return false;
        }
        self.add(10);
        self.lock.release(false);
        true
    }
}

/// Outcomes seen over all executions of one model.
#[derive(Default)]
struct Seens {
    took: Seen,
    refused: Seen,
    owner_first: Seen,
    owner_backed_off: Seen,
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

/// The owner's event racing one taker, in `mode`, the membarrier's
/// barrier landing at `point` (asymmetric mode).
fn race(mode: LockMode, point: LightPoint) {
    let seen: &'static Seens = Box::leak(Box::default());
    builder().check(move || {
        membarrier::place(point);
        let cell = Arc::new(Guarded {
            lock: CellLock::new(mode),
            data: UnsafeCell::new(0),
        });
        let taker = {
            let cell = cell.clone();
            thread::spawn(move || cell.taker())
        };

        // The owner (this thread): its event, as `WriterCell::lock_owner`
        // and the guard's drop run it.
        let first = cell.lock.owner_enter();
        if !first {
            cell.lock.owner_enter_slow();
        }
        cell.add(1);
        cell.lock.release(true);
        membarrier::owner_exit();

        let took = taker.join().expect("taker");
        assert_eq!(cell.total(), if took { 11 } else { 1 });
        [
            (&seen.took, took),
            (&seen.refused, !took),
            (&seen.owner_first, first),
            (&seen.owner_backed_off, !first),
        ]
        .into_iter()
        .filter(|(_, happened)| *happened)
        .for_each(|(s, _)| s.store(true, Relaxed));

        // Nobody holds it now: a taker gets it, then the owner at once.
        assert!(cell.taker(), "a taker refused by a free lock");
        assert!(cell.lock.owner_enter(), "an owner refused by a free lock");
        cell.lock.release(true);
    });
    for (what, s) in [
        ("taker took", &seen.took),
        ("taker refused", &seen.refused),
        ("owner's first try", &seen.owner_first),
        ("owner backed off", &seen.owner_backed_off),
    ] {
        assert!(s.load(Relaxed), "{what} never seen");
    }
}

#[test]
fn symmetric_lock_excludes_owner_and_taker() {
    race(LockMode::Symmetric, LightPoint::Fence);
}

#[test]
fn asymmetric_lock_excludes_with_the_barrier_before_the_owner_store() {
    race(LockMode::Asymmetric, LightPoint::BeforeStore);
}

#[test]
fn asymmetric_lock_excludes_with_the_barrier_at_the_owner_fence() {
    race(LockMode::Asymmetric, LightPoint::Fence);
}

#[test]
fn asymmetric_lock_excludes_with_the_barrier_after_the_owner_load() {
    race(LockMode::Asymmetric, LightPoint::AfterLoad);
}
