//! loom models of a writer cell's hand-over to its takers ([`super`]'s
//! "Locking" and "Deferred work"), run on its own code: the cell's lock,
//! flags and the cell holding its writer are loom's here
//! ([`crate::sync`]), its writer an abi trace writer over a private heap
//! SMB (`tests::cell_and_arbiter`; the SMB's words are not loom's, their
//! protocol has abi's models).
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-producer --features tracing --release --lib --target-dir target/loom loom_model`.
//!
//! The owner thread writes one event (`lock_owner`, a packet, the
//! guard's drop) while another thread asks for a flush with
//! [`request_all`] (as flush, stop and thread exit do). loom fails a model
//! where both reach the writer without one ordered before the other. The
//! models assert that the flush is never left behind (its flag is clear
//! after): done by the requester at once (`request_all` counts it) or by
//! the owner when it lets go; that it came after the event (its packet
//! committed in one commit, the writer clean) or before it (nothing
//! committed, the packet still in the writer), nothing else; and that
//! each of those happens in some execution. (Exactly once is the lock
//! models' assertion, `cell_lock::loom_model`, on the same code.)
//!
//! The barrier of the requester's `membarrier` lands at each point of the
//! owner's side in turn, as in the lock's models (`cell_lock::loom_model`).

use std::sync::atomic::AtomicBool as Seen;
use std::sync::atomic::Ordering::Relaxed;

use shmtrace_abi::trace::trace_packet;

use super::tests::cell_and_arbiter;
use super::*;
use crate::connection::outbox::Outgoing;
use crate::encoding::event::PacketWriter;
use crate::sync::{membarrier, spawn_big, LightPoint};

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(4);
    b
}

/// Outcomes seen over all executions of one model.
#[derive(Default)]
struct Seens {
    done_at_once: Seen,
    done_by_owner: Seen,
    flushed_after_event: Seen,
    flushed_before_event: Seen,
}

/// The owner's event racing a flush request on a cell of `mode`, the
/// requester's barrier landing at `point`.
fn race(mode: LockMode, point: LightPoint) {
    let seen: &'static Seens = Box::leak(Box::default());
    builder().check(move || {
        // The model runs on a thread of its own: the SMB's set-up and the
        // writer's encoders want more stack than loom's threads have.
        spawn_big(move || one(mode, point, seen))
            .join()
            .expect("model");
    });
    for (what, s) in [
        ("done at once", &seen.done_at_once),
        ("done by the owner", &seen.done_by_owner),
        ("flushed after the event", &seen.flushed_after_event),
        ("flushed before the event", &seen.flushed_before_event),
    ] {
        assert!(s.load(Relaxed), "{what} never seen");
    }
}

/// One execution of [`race`].
fn one(mode: LockMode, point: LightPoint, seen: &'static Seens) {
    membarrier::place(point);
    if mode == LockMode::Symmetric {
        membarrier::withhold();
    }

    let (cell, arbiter) = cell_and_arbiter(mode);
    let requester = {
        let cell = cell.clone();
        spawn_big(move || request_all(&[cell], FLAG_FLUSH))
    };
    let owner = {
        let cell = cell.clone();
        spawn_big(move || {
            let mut g = cell.lock_owner();
            assert!(g
                .inner()
                .out
                .write_packet(|p| p.uint64(trace_packet::TIMESTAMP, 1)));
            drop(g);
            membarrier::owner_exit();
        })
    };
    owner.join().expect("owner");
    let at_once = requester.join().expect("requester");

    assert!(!cell.has_flags(FLAG_FLUSH), "the flush left behind");
    let commits: Vec<usize> = std::iter::from_fn(|| arbiter.outbox().try_next())
        .map(|m| match m {
            Outgoing::Commit(c) => c.chunks_to_move.len(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let dirty = cell.lock_owner().inner().out.dirty;
    // The flush came after the event (its packet committed, the writer
    // clean) or before it (nothing committed, the packet in the writer).
    match (commits.as_slice(), dirty) {
        ([1], false) => seen.flushed_after_event.store(true, Relaxed),
        ([], true) => seen.flushed_before_event.store(true, Relaxed),
        other => panic!("flush and event: {other:?}"),
    }
    assert!(at_once <= 1);
    if at_once == 1 {
        seen.done_at_once.store(true, Relaxed);
    } else {
        seen.done_by_owner.store(true, Relaxed);
    }
}

#[test]
fn a_flush_racing_an_event_is_never_left_behind_symmetric() {
    race(LockMode::Symmetric, LightPoint::Fence);
}

#[test]
fn a_flush_racing_an_event_is_never_left_behind_barrier_before_the_owner_store() {
    race(LockMode::Asymmetric, LightPoint::BeforeStore);
}

#[test]
fn a_flush_racing_an_event_is_never_left_behind_barrier_at_the_owner_fence() {
    race(LockMode::Asymmetric, LightPoint::Fence);
}

#[test]
fn a_flush_racing_an_event_is_never_left_behind_barrier_after_the_owner_load() {
    race(LockMode::Asymmetric, LightPoint::AfterLoad);
}
