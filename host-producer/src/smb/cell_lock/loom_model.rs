//! loom models of the writer cell's lock ([`super`]), run on its own code:
//! its flags are loom's atomics here, the taker's `membarrier` is the
//! model of [`crate::sync::membarrier`], and the data it guards is a loom
//! cell.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-producer --features tracing --release --lib --target-dir target/loom loom_model`.
//!
//! Each model races the owner's event (its attempt, its wait for a taker
//! and retry, one write to the guarded cell, its release and look for
//! deferred work) with one taker, which requests work first (a flush, as
//! `writer::request_all` does: a `SeqCst` read-modify-write of the flags
//! before the claim), then claims, fences and confirms, and with the lock
//! does the work, writes the cell and lets go. Whoever lets go takes the
//! lock back while work is pending and does it (`writer::CellGuard`'s
//! drop). loom fails a model where two write the cell without one ordered
//! before the other, i.e. both held the lock. The models assert too:
//!
//! * the owner always gets the lock (waiting out the taker: its retry
//!   succeeds once the taker let go), and every write made under the lock
//!   is there after;
//! * the requested work is done exactly once: by the taker if it got the
//!   lock, else by the owner, whose look after its release sees the
//!   request (never left behind, never done twice);
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
//! attempt (its write) order the store and the load as the point after
//! the load does; the release's own compiler fence is a landing point too
//! (the "fence" models), between its `in_use` store and its look at the
//! flags.
//!
//! Dropping the taker's `membarrier` (a plain compiler fence, as the
//! owner's), or the `SeqCst` order between the symmetric sides' store and
//! load, fails these models (both write the cell).

// `unsafe` here: the guarded cell's accesses.
#![allow(unsafe_code)]

use std::sync::atomic::AtomicBool as Seen;
use std::sync::atomic::Ordering::{AcqRel, Relaxed, SeqCst};

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::sync::{membarrier, AtomicU8, UnsafeCell};

/// A lock, the data it guards and deferred-work flags, as a writer cell
/// has them (`crate::smb::writer`).
struct Guarded {
    lock: CellLock,
    /// Owner's writes count 1, the taker's 10.
    data: UnsafeCell<u32>,
    /// [`WORK`] while requested work is not done.
    flags: AtomicU8,
}

/// The one deferred-work flag of the models (a flush, say).
const WORK: u8 = 1;

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

    /// Does the requested work, if any, under the lock: 1 if it did.
    fn run_deferred(&self) -> u32 {
        let work = self.flags.fetch_and(!WORK, AcqRel) & WORK;
        if work != 0 {
            self.add(100);
        }
        u32::from(work)
    }

    /// Lets go as a writer cell's guard does: release, look for work,
    /// take the lock back and do it while there is some. Returns the work
    /// done.
    fn let_go(&self, owner: bool) -> u32 {
        let mut done = 0;
        while self.lock.release(owner, &self.flags) & WORK != 0 && self.lock.reacquire(owner) {
            done += self.run_deferred();
        }
        done
    }

    /// The owner's event: lock (waiting out a taker), write, let go.
    /// Returns whether its first attempt got the lock, and the work done.
    fn owner_event(&self) -> (bool, u32) {
        let first = self.lock.owner_enter();
        if !first {
            self.lock.owner_enter_slow();
        }
        self.add(1);
        (first, self.let_go(true))
    }

    /// A taker as `request_all`: requests the work, then claims, fences
    /// and confirms; with the lock, does the work, writes and lets go.
    /// Returns whether it got the lock, and the work done.
    fn taker(&self) -> (bool, u32) {
        self.flags.fetch_or(WORK, SeqCst);
        assert!(self.lock.claim(), "the only taker");
        taker_fence(self.lock.mode());
        if !self.lock.confirm() {
            return (false, 0);
        }
        let done = self.run_deferred();
        self.add(10);
        (true, done + self.let_go(false))
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
    b.preemption_bound = Some(5);
    b
}

/// The owner's event racing one taker, in `mode`, the membarrier's
/// barrier landing at `point` (asymmetric mode).
fn race(mode: LockMode, point: LightPoint) {
    let seen: &'static Seens = Box::leak(Box::default());
    builder().check(move || {
        membarrier::place(point);
        if mode == LockMode::Symmetric {
            membarrier::withhold();
        }
        let cell = Arc::new(Guarded {
            lock: CellLock::new(mode),
            data: UnsafeCell::new(0),
            flags: AtomicU8::new(0),
        });
        let taker = {
            let cell = cell.clone();
            thread::spawn(move || cell.taker())
        };
        // The owner is this thread.
        let (first, owner_did) = cell.owner_event();
        membarrier::owner_exit();
        let (took, taker_did) = taker.join().expect("taker");

        // The work was done once, by the taker or by the owner when it let
        // go, and every write made under the lock is there.
        assert_eq!(owner_did + taker_did, 1, "requested work done once");
        assert_eq!(cell.total(), 101 + if took { 10 } else { 0 });
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
        assert_eq!(cell.taker(), (true, 1), "a taker refused by a free lock");
        assert_eq!(
            cell.owner_event(),
            (true, 0),
            "an owner refused by a free lock"
        );
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
