//! loom models of the span table's protocol (the module docs of
//! [`super`]), run on the table's own code: its atomics, lock,
//! thread-locals and the cell of a slot's given fields are loom's here
//! ([`crate::sync`]).
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-producer --features tracing --release --lib --target-dir target/loom loom_model`.
//!
//! loom runs each model in every interleaving of its threads (up to a
//! preemption bound, [`builder`]) and every value a load may read under
//! the memory model. A slot's given fields are a loom cell, so loom itself
//! fails a model where a span's start writes them while a use of the
//! slot's previous span is not ordered before it (a key handed out again
//! too early, or seen free when it is not). On top of that the models
//! assert:
//!
//! * a span made on one thread and handed to another (through a release
//!   and an acquire, as any channel a program hands a `tracing::Span`
//!   through) finds its slot there, with the fields it was made with;
//! * its owner and another thread entering it at once: at least one enter
//!   is its first, at most two, each first one sees the given fields, and
//!   the span's life starts at a first one's time (both orders seen);
//! * the last reference closes it (as the registry's count does) and its
//!   key goes back; the slot's next span, made on another thread, reuses
//!   it without a race;
//! * a lane's next holder (the thread taking it after its last holder
//!   exited) sees that one's key still holding its live span, and takes a
//!   shared key then, or the lane key once the span closed (both seen);
//! * two threads without a lane racing for the one shared key a close
//!   frees: at most one gets it, the other none.
//!
//! loom explores no load buffering (a load reading a store that comes
//! later in its thread's own order), so the acquire and release of the
//! enter count (module docs) stand on their argument there, not on these
//! models.

use std::sync::atomic::AtomicBool as Seen;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use loom::sync::atomic::{fence, AtomicU64 as Handed, AtomicUsize as Refs};
use loom::sync::Arc;
use loom::thread;
use tracing_core::field::Value;

use super::*;
use crate::encoding::annotation::DebugValue;

/// A span callsite with two fields (`n`, a number, and `s`, text), made
/// once, outside the models.
#[derive(Clone, Copy)]
struct Fixture {
    meta: &'static Metadata<'static>,
    category: &'static Category,
    number: u32,
}

fn fixture() -> Fixture {
    use tracing::callsite::Callsite as _;
    let site = tracing::callsite!(
        name: "modeled",
        kind: tracing::metadata::Kind::SPAN,
        target: "spans.loom",
        level: tracing::Level::INFO,
        fields: n, s
    );
    let meta = site.metadata();
    let (number, cs) = callsites::number(meta).expect("room for the callsite");
    Fixture {
        meta,
        category: cs.category,
        number,
    }
}

/// Span ids whose keys share one group.
fn same_group(count: usize) -> Vec<u64> {
    let group = SpanTable::group(1);
    (1..)
        .filter(|&id| SpanTable::group(id) == group)
        .take(count)
        .collect()
}

/// The text field every span is made with.
const TEXT: &str = "text";

/// Makes `slot` that of a new span with `n = n, s = TEXT` (the layer's
/// `on_new_span` after its claim).
fn start(slot: &Slot, fx: Fixture, n: u64) {
    let fields = fx.meta.fields();
    let (f_n, f_s) = (
        fields.field("n").expect("field n"),
        fields.field("s").expect("field s"),
    );
    let values = [
        (&f_n, Some(&n as &dyn Value)),
        (&f_s, Some(&TEXT as &dyn Value)),
    ];
    let values = fields.value_set(&values);
    slot.start(
        fx.meta,
        fx.category,
        Some(fx.number),
        &Attributes::new(fx.meta, &values),
    );
}

/// Asserts that `slot` holds a span made with `n = n` (reading its given
/// fields, as every enter of the layer does).
fn assert_given(slot: &Slot, n: u64) {
    let given: Vec<_> = slot
        .given()
        .args(("", ""))
        .fields()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(given, [DebugValue::Uint(n), DebugValue::Str(TEXT)]);
    assert_eq!(slot.callsite().map(|(m, _)| m.name()), Some("modeled"));
}

/// Enters the span of `slot` made with `n = n` (the layer's `on_enter`):
/// whether it was the first, whose time (`ns`) it then stores.
fn enter(slot: &Slot, n: u64, ns: u64) -> bool {
    let first = slot.enter();
    assert_given(slot, n);
    if let Some(cell) = first {
        cell.store(ns, Relaxed);
    }
    first.is_some()
}

/// Waits for a span id handed over through `cell` (as a channel would:
/// the sender's release, the receiver's acquire).
fn receive(cell: &Handed) -> u64 {
    loop {
        let id = cell.load(Acquire);
        if id != 0 {
            return id;
        }
        thread::yield_now();
    }
}

/// Drops a reference to the span `id`, entered `enters` times; the last
/// one closes it (the registry's count: a release decrement, and an
/// acquire fence before the close) and frees its key.
fn drop_ref(table: &SpanTable, refs: &Refs, id: u64, enters: u32) {
    if refs.fetch_sub(1, Release) != 1 {
        return;
    }
    fence(Acquire);
    let (slot, key) = table.get(id).expect("a closing span has its key");
    assert_eq!(slot.enters(), enters);
    assert_ne!(slot.first_ns(), 0, "no first enter stored its time");
    // Entered twice: not quiet, and no cold state to take.
    assert!(!slot.closes_quietly());
    assert!(slot.close(true).is_none());
    table.release(key);
}

/// Models with a preemption bound: every bug these models were shown to
/// catch (the enter count read after the count, each release or acquire
/// of the keys and lanes made relaxed) fails them with two preemptions;
/// four keep all three models at a few seconds.
fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(4);
    b
}

#[test]
fn a_span_made_here_is_entered_there_and_its_key_reused() {
    static ONE_FIRST: Seen = Seen::new(false);
    static BOTH_FIRST: Seen = Seen::new(false);
    let fx = fixture();
    let ids = same_group(2);
    let (a, b) = (ids[0], ids[1]);
    builder().check(move || {
        let table = Arc::new(SpanTable::new());
        let handed = Arc::new(Handed::new(0));
        // The made span's references: this thread's and the other's.
        let refs = Arc::new(Refs::new(2));
        let other = {
            let (table, handed, refs) = (table.clone(), handed.clone(), refs.clone());
            thread::spawn(move || {
                let id = receive(&handed);
                let (slot, _) = table.get(id).expect("a handed span has its slot");
                let first = enter(slot, 7, 2);
                drop_ref(&table, &refs, id, 2);
                first
            })
        };
        // This thread holds lane 0 (the only thread taking one).
        let slot = table.claim(a).expect("a free key");
        start(slot, fx, 7);
        handed.store(a, Release);
        let first_here = enter(slot, 7, 1);
        drop_ref(&table, &refs, a, 2);
        // Once its key is free (whoever closed it), the next span made
        // here takes it back: loom checks the other's uses of the slot
        // came before this start.
        while table.get(a).is_some() {
            thread::yield_now();
        }
        let next = table.claim(b).expect("a free key");
        assert!(std::ptr::eq(next, slot), "the lane key again");
        start(next, fx, 8);
        let first_there = other.join().expect("the other thread");
        match u8::from(first_here) + u8::from(first_there) {
            1 => ONE_FIRST.store(true, Relaxed),
            2 => BOTH_FIRST.store(true, Relaxed),
            n => panic!("{n} first enters"),
        }
        assert_given(next, 8);
        table.release(table.get(b).expect("the next span").1);
        assert!(table.get(a).is_none() && table.get(b).is_none());
    });
    assert!(ONE_FIRST.load(Relaxed), "no run with one first enter");
    assert!(BOTH_FIRST.load(Relaxed), "no run with both enters first");
}

#[test]
fn a_lane_s_next_holder_sees_its_last_holder_s_keys() {
    static SHARED: Seen = Seen::new(false);
    static LANE_KEY: Seen = Seen::new(false);
    let fx = fixture();
    let ids = same_group(2);
    let (x, y) = (ids[0], ids[1]);
    builder().check(move || {
        // Lanes 1 to 3 are held by threads outside the model: lane 0 is
        // the one the threads here take, one after the other.
        LANES_HELD.fetch_or(0b1110, Relaxed);
        let table = Arc::new(SpanTable::new());
        let first = {
            let table = table.clone();
            thread::spawn(move || {
                let slot = table.claim(x).expect("a free key");
                start(slot, fx, 1);
                // It exits (its lane goes back) and hands the span over.
                x
            })
        };
        let next = {
            let table = table.clone();
            thread::spawn(move || {
                // Holds lane 0 once the first thread gave it back.
                while lane().is_none() {
                    thread::yield_now();
                }
                let slot = table.claim(y).expect("a free key");
                start(slot, fx, 2);
                table.get(y).expect("its key").1
            })
        };
        // The span made by the first thread, handed here by its exit (one
        // thread spins per model: two that spin at once have loom explore
        // their endless alternations), keeps its key (the next lane holder
        // does not take it) until it closes here.
        let id = first.join().expect("the first thread");
        let (slot, key) = table.get(id).expect("a live span keeps its key");
        assert_given(slot, 1);
        table.release(key);
        let key_y = next.join().expect("the next thread") - SpanTable::group(y);
        if key_y == 0 {
            LANE_KEY.store(true, Relaxed);
        } else {
            assert!(key_y >= LANES, "key {key_y}: another lane's");
            SHARED.store(true, Relaxed);
        }
        assert_given(table.get(y).expect("the next span").0, 2);
        assert!(table.get(x).is_none());
    });
    assert!(SHARED.load(Relaxed), "no run with the lane key still taken");
    assert!(
        LANE_KEY.load(Relaxed),
        "no run with the lane key free again"
    );
}

#[test]
fn threads_without_a_lane_share_the_key_a_close_frees() {
    static ONE_GOT_IT: Seen = Seen::new(false);
    static NONE_GOT_IT: Seen = Seen::new(false);
    let fx = fixture();
    let ids = same_group(GROUP - LANES + 2);
    let (live, racing) = ids.split_at(GROUP - LANES);
    let (closing, p, q) = (live[0], racing[0], racing[1]);
    let live = live.to_vec();
    builder().check(move || {
        // Every lane is held outside the model: shared keys only.
        LANES_HELD.fetch_or(0b1111, Relaxed);
        let table = Arc::new(SpanTable::new());
        // Every shared key of the group taken.
        for (n, &id) in live.iter().enumerate() {
            start(table.claim(id).expect("a shared key"), fx, n as u64);
        }
        let race = |id: u64, n: u64| {
            let table = table.clone();
            thread::spawn(move || {
                let slot = table.claim(id)?;
                start(slot, fx, n);
                Some(table.get(id).expect("its key").1)
            })
        };
        let (tp, tq) = (race(p, 10), race(q, 11));
        // The span of the first shared key closes (its last use, then the
        // release) while the two claim.
        let (slot, key) = table.get(closing).expect("its key");
        assert_given(slot, 0);
        table.release(key);
        let got: Vec<usize> = [tp, tq]
            .into_iter()
            .filter_map(|t| t.join().expect("a claiming thread"))
            .collect();
        match got[..] {
            [] => NONE_GOT_IT.store(true, Relaxed),
            [at] => {
                assert_eq!(at, key, "the freed key");
                ONE_GOT_IT.store(true, Relaxed);
            }
            _ => panic!("two claims got the one free key: {got:?}"),
        }
    });
    assert!(ONE_GOT_IT.load(Relaxed), "no run where a claim got the key");
    assert!(
        NONE_GOT_IT.load(Relaxed),
        "no run where both claims came first"
    );
}
