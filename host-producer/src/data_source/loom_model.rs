//! loom model of the startup hand-over ([`DataSourceType::start_replacing`],
//! `track_event::startup`'s adoption), run on this module's own code: the
//! type's slot mask, slot generations, hand-over word, instance and slot
//! locks and the threads' writers are [`crate::sync`]'s, so loom's here;
//! the writers are real ones over private heap SMBs (their words are not
//! loom's; their protocol has abi's models).
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-producer --features tracing --release --lib --target-dir target/loom loom_model`.
//!
//! The startup instance runs; a session's instance adopts it while another
//! thread writes one event: the event loads its category's enabled bits
//! (one relaxed load, as `Category::enabled_instances`) and writes through
//! [`DataSourceType::with_writers`]. The adoption moves the bits from the
//! startup slot to the session's in one store (as the category registry's
//! `move_filter` does per category), then stops the startup instance. The
//! model asserts what the `startup` module docs promise: the event goes to
//! one of the two instances, never both, never neither; both happen in
//! some execution, as does an event that read the startup's bits and is
//! redirected to the session (the startup writer already dead or never
//! made); and an event written into the startup instance is committed in
//! its buffer when the stop's wait for its writer ends (the writer flushed
//! when retired), so the hand-over copies it. (Under loom that wait lasts
//! until the writer retired, `writer::wait_deferred`; for real it gives up
//! after `HOUSEKEEPING_WAIT` and the event's end retires it later.)
//!
//! Publishing the hand-over word after the stop instead of before it
//! fails the model (an event that read the startup's bits goes nowhere).
//! The stop's `membarrier` (`crate::sync::membarrier`) lands at the event
//! thread's lock fence (the lock's own models try every point).

use std::sync::atomic::AtomicBool as Seen;
use std::sync::atomic::Ordering::Relaxed;

use shmtrace_abi::layout::{PageLayout, PageSize};
use shmtrace_abi::trace::trace_packet;
use shmtrace_ipc::shm::SharedMemory;

use super::*;
use crate::connection::outbox::Outbox;
use crate::encoding::event::PacketWriter;
use crate::sync::{membarrier, spawn_big, LightPoint};

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(4);
    b
}

/// An instance of `ty` with `id` over a private heap SMB.
fn instance(ty: &DataSourceType, id: u64) -> Arc<Instance> {
    let shm = SharedMemory::heap(16 * 1024, PageSize::DEFAULT).expect("heap SMB");
    let arbiter = Arbiter::new(shm, false, PageLayout::Div1, Arc::new(Outbox::new()));
    ty.setup(id, DataSourceConfig::default(), arbiter)
        .expect("a free slot")
}

/// Chunks committed in `inst`'s buffer (its outbox's commits).
fn committed(inst: &Instance) -> usize {
    std::iter::from_fn(|| inst.arbiter.outbox().try_next())
        .map(|m| match m {
            Outgoing::Commit(c) => c.chunks_to_move.len(),
            _ => 0,
        })
        .sum()
}

/// Outcomes seen over all executions.
#[derive(Default)]
struct Seens {
    startup: Seen,
    session: Seen,
    redirected: Seen,
}

/// One execution.
fn one(seen: &'static Seens) {
    let ty = Arc::new(DataSourceType::new(
        0,
        1,
        "modeled".into(),
        DataSourceOptions::default(),
        Arc::new(NoopHandler),
        false,
        None,
    ));
    let startup = instance(&ty, STARTUP_INSTANCE_ID);
    ty.start(&startup);
    let session = instance(&ty, 1);
    // One category's enabled bits: the startup instance's.
    let bits = Arc::new(AtomicU8::new(1 << startup.slot));

    let event = {
        let (ty, bits) = (ty.clone(), bits.clone());
        spawn_big(move || {
            let mask = bits.load(Relaxed);
            let mut to = Vec::new();
            ty.with_writers(mask, |inner, inst| {
                assert!(inner
                    .out
                    .write_packet(|p| p.uint64(trace_packet::TIMESTAMP, 1)));
                to.push(inst.slot);
            });
            membarrier::owner_exit();
            (mask, to)
        })
    };
    let session_slot = session.slot;
    ty.start_replacing(&session, &startup, || {
        bits.store(1 << session_slot, Relaxed);
    });
    let startup_committed = committed(&startup);
    let (mask, to) = event.join().expect("event");

    match to.as_slice() {
        [slot] if *slot == startup.slot => {
            seen.startup.store(true, Relaxed);
            assert_eq!(startup_committed, 1, "the startup's event not committed");
        }
        [slot] if *slot == session.slot => {
            seen.session.store(true, Relaxed);
            if mask == 1 << startup.slot {
                seen.redirected.store(true, Relaxed);
            }
        }
        other => panic!("the event went to slots {other:?}"),
    }
}

#[test]
fn an_event_racing_the_adoption_goes_to_one_instance() {
    let seen: &'static Seens = Box::leak(Box::default());
    builder().check(move || {
        membarrier::place(LightPoint::Fence);
        spawn_big(move || one(seen)).join().expect("model");
    });
    for (what, s) in [
        ("startup", &seen.startup),
        ("session", &seen.session),
        ("redirected", &seen.redirected),
    ] {
        assert!(s.load(Relaxed), "an event to the {what} never seen");
    }
}
