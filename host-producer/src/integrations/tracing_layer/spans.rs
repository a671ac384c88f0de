//! The layer's per-span state in a table of its own, keyed by span id, so
//! that making, entering and closing a span takes no registry lookup, no
//! lock and no allocation.
//!
//! # Invariants
//!
//! * The table has [`GROUPS`] groups of [`GROUP`] keys, each group one
//!   cache line; a span id's group is a hash of the id, and the span's
//!   state lives in the slot of whichever key in its group holds its id.
//!   A key of 0 is free (span ids are never 0).
//! * A key is set ([`SpanTable::claim`]) by the thread making the span,
//!   which then fills the slot, and cleared ([`SpanTable::release`]) when
//!   the span closes. Span ids are unique among live spans of one
//!   registry, and a table belongs to one layer, so at most one key holds
//!   a live span's id: a claim of an id some key still holds (a close
//!   that never came) reuses that key.
//! * The first [`LANES`] keys of each group are lanes: up to [`LANES`]
//!   threads at a time each hold a lane number ([`lane`], given back when
//!   the thread exits), and only the thread holding lane `n` sets key `n`
//!   of a group, with a load and a store (no other thread sets it, so
//!   none can set it between the two: a thread making spans takes no
//!   read-modify-write for them, which costs more than the rest of the
//!   claim). The other keys are shared: a compare-and-swap sets them. A
//!   thread whose lane key is taken in the group, or that holds no lane
//!   (more threads than lanes), takes a shared key. The lane's next
//!   holder acquires what its last one released, so it sees that one's
//!   keys as they were left.
//! * Every thread that looks a span up holds a reference to it, obtained
//!   after the span was made (so after its slot was filled: its atomics
//!   need no ordering of their own), and the span cannot close, nor its
//!   key be cleared or reused, while that reference lives.
//! * A slot's hot state is atomics, and the fields the span was made with
//!   ([`Slot::given`]): written only by [`Slot::start`], which runs on the
//!   thread making the span, before any other thread can reach it (no
//!   other thread looks a span up before it was made) and after every use
//!   of the slot's previous span (its close released the key, and the
//!   claim that hands the slot out again acquires it), so they are
//!   immutable while the span lives and read without a lock. Fields
//!   recorded later, flows and (for a callsite without a number) metadata
//!   are behind a mutex taken only when [`Slot::cold`] says there is
//!   something there.
//! * Enters are counted in two words ([`Slot::enter`]): those of the
//!   thread that made the span (its owner, known by the address of a
//!   thread-local of its own) and those of every other thread. Only the
//!   owner writes its word, with a load and a store: a span entered on the
//!   thread that made it (most spans) costs no read-modify-write, which
//!   costs more than the rest of the count. Other threads add to theirs.
//!   An enter reads the other word before it counts itself in its own,
//!   and is the span's first if both were 0. Only the owner's first enter
//!   and the first of the other threads' (whose add returns 0) can be, and
//!   the earlier of their two reads comes before either count, so at least
//!   one is. When the owner and another thread first enter the span at the
//!   same moment both may read the other's word still 0, and then both
//!   slices carry the span's given fields (each keeps its own first time,
//!   and the span's life starts at the earlier one): the one way two
//!   slices of a span both carry them. Every other order (any enter after
//!   another, with the span handed between the threads in between) finds
//!   the earlier one. The others' add is a release and the owner's read of
//!   their word an acquire, so an owner's read that finds another thread's
//!   count comes after that thread's read of the owner's word, which then
//!   found 0 (relaxed, each read could in theory find the other's later
//!   count). (Counting first and reading after, as this table once did,
//!   let two such enters each find the other's count and neither be the
//!   first: the span's given fields on no slice and its whole life
//!   starting at time 0. The loom model, `loom_model`, found it.) A
//!   thread-local's address is reused only by a thread started after its
//!   owner exited (its memory freed and handed out again in between), so
//!   two threads never count in the owner's word at once.
//! * A span whose group is full has no key: the layer keeps its [`Slot`]
//!   in the registry's extensions instead (slower, same behaviour).
//!
//! The atomics, cell, lock and thread-locals are those of [`sync`]: `std`'s,
//! or `loom`'s under `RUSTFLAGS="--cfg loom"`, where `loom_model` checks
//! the protocol above (claims and releases of lane and shared keys, a
//! lane's hand-over, a span made on one thread and entered on another,
//! first enters, closes and the reuse of a key) on this code.

// `unsafe`: the lock-free access to a slot's given fields (see the
// invariants above); two blocks, in `Slot::start` and `Slot::given`.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use crate::sync::{
    self, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Mutex, MutexGuard, UnsafeCell,
};

use tracing_core::span::Attributes;
use tracing_core::Metadata;

use super::callsites;
use super::fields::{Collect, GivenFields, SpanFields, Visitor};
use crate::Category;
use crate::Flow;

/// Keys per group: one cache line of `u64`s.
const GROUP: usize = 8;
/// Groups in a table (a power of two).
const GROUPS: usize = 128;
/// Keys of a group set by the thread holding the lane of that number
/// (module docs).
const LANES: usize = 4;
/// The bits of a span id the table hashes ([`SpanTable::group`]): its
/// registry slot's index and thread, not the slot's generation.
const ID_BITS: u64 = (1 << 50) - 1;
/// [`Slot::callsite`] of a span whose callsite has no number.
const NO_CALLSITE: u32 = u32::MAX;

/// What the layer keeps about a span.
#[derive(Default)]
pub(super) struct Slot {
    /// Its callsite's number ([`callsites`]), or [`NO_CALLSITE`].
    callsite: AtomicU32,
    /// The thread that made the span ([`this_thread`]).
    owner: AtomicUsize,
    /// Times its owner entered it (written by the owner only).
    own_enters: AtomicU32,
    /// Times other threads entered it.
    other_enters: AtomicU32,
    /// Boot time of its first slice, if the owner's enter was the first
    /// (else 0); read when it closes, after every enter.
    own_first_ns: AtomicU64,
    /// The same for another thread's first enter.
    other_first_ns: AtomicU64,
    /// The fields the span was made with (module docs: written only by
    /// [`Slot::start`]).
    given: UnsafeCell<GivenFields>,
    /// Whether its first slice carried them (no slice if its category was
    /// off at the first enter; read when it closes, after every enter).
    pub(super) given_carried: AtomicBool,
    /// Whether `rest` holds anything: recorded fields, flows or the
    /// metadata.
    cold: AtomicBool,
    /// Whether `rest` holds what no event wrote yet (changed fields,
    /// flows): a close that finds it clear, of a span entered at most
    /// once, has nothing to write and takes no lock. Set under the lock
    /// ([`Slot::note_pending`]); read without it only at close, when every
    /// other use of the span happened before.
    pending: AtomicBool,
    rest: Mutex<Cold>,
}

// SAFETY: `given` is the slot's only field that is not `Sync` by itself;
// it is written only by `Slot::start` while no other thread can reach the
// slot, and only read otherwise (module docs), so sharing the slot between
// threads never lets one write it while another uses it.
unsafe impl Sync for Slot {}

/// The parts of a span's state most spans do not have.
#[derive(Default)]
pub(super) struct Cold {
    pub(super) fields: SpanFields,
    /// Flows for the span's next slice (or its close).
    pub(super) flows: Vec<Flow>,
    /// The metadata of a span whose callsite has no number.
    meta: Option<(&'static Metadata<'static>, &'static Category)>,
}

impl Slot {
    /// Makes the slot that of a new span of `meta` (in `category`), with
    /// the fields `attrs` gives. Called only by the thread making the span,
    /// on a slot no other thread can reach (module docs).
    pub(super) fn start(
        &self,
        meta: &'static Metadata<'static>,
        category: &'static Category,
        callsite: Option<u32>,
        attrs: &Attributes<'_>,
    ) {
        self.owner.store(this_thread(), Ordering::Relaxed);
        self.own_enters.store(0, Ordering::Relaxed);
        self.other_enters.store(0, Ordering::Relaxed);
        self.own_first_ns.store(0, Ordering::Relaxed);
        self.other_first_ns.store(0, Ordering::Relaxed);
        self.given_carried.store(false, Ordering::Relaxed);
        self.callsite
            .store(callsite.unwrap_or(NO_CALLSITE), Ordering::Relaxed);
        self.given.with_mut(|given| {
            // SAFETY: the caller makes the span, so no other thread can
            // reach the slot yet, and every use of its previous span
            // happened before (module docs): this is the only reference to
            // `given`.
            let given = unsafe { &mut *given };
            given.clear();
            // (A callsite without fields has no values: no visit of the
            // value set to find out.)
            if !meta.fields().is_empty() && !attrs.values().is_empty() {
                attrs.record(&mut Visitor(Collect(given)));
            }
        });
        if callsite.is_none() {
            let mut rest = self.rest();
            rest.fields.clear();
            rest.flows.clear();
            rest.meta = Some((meta, category));
            self.note_pending(&rest);
            self.cold.store(true, Ordering::Relaxed);
        } else {
            self.cold.store(false, Ordering::Relaxed);
        }
    }

    /// Counts an enter by the calling thread (module docs): if it is the
    /// span's first, where to store the time of its slice
    /// ([`Slot::first_ns`]).
    #[inline]
    pub(super) fn enter(&self) -> Option<&AtomicU64> {
        // Each reads the other word before counting itself (module docs).
        if self.owner.load(Ordering::Relaxed) == this_thread() {
            let n = self.own_enters.load(Ordering::Relaxed);
            // Acquire: pairs with the others' release (module docs).
            let first = n == 0 && self.other_enters.load(Ordering::Acquire) == 0;
            self.own_enters.store(n.wrapping_add(1), Ordering::Relaxed);
            first.then_some(&self.own_first_ns)
        } else {
            let own = self.own_enters.load(Ordering::Relaxed);
            let n = self.other_enters.fetch_add(1, Ordering::Release);
            (n == 0 && own == 0).then_some(&self.other_first_ns)
        }
    }

    /// Times the span was entered (read when it closes, after every
    /// enter).
    #[inline]
    pub(super) fn enters(&self) -> u32 {
        let own = self.own_enters.load(Ordering::Relaxed);
        own.saturating_add(self.other_enters.load(Ordering::Relaxed))
    }

    /// Boot time of the span's first slice (the earlier of two that both
    /// were first: module docs); 0 if it was never entered.
    pub(super) fn first_ns(&self) -> u64 {
        let own = self.own_first_ns.load(Ordering::Relaxed);
        let other = self.other_first_ns.load(Ordering::Relaxed);
        match (own, other) {
            (0, t) | (t, 0) => t,
            (a, b) => a.min(b),
        }
    }

    /// The fields the span was made with.
    #[inline]
    pub(super) fn given(&self) -> &GivenFields {
        // SAFETY: only `start` writes `given`, before the span can be
        // reached, and a slot is reached only through a live span (module
        // docs), whose start happened before: nothing writes it while this
        // borrow (bounded by the caller's use of the span) lives.
        self.given.with(|given| unsafe { &*given })
    }

    /// The span's metadata and category.
    #[inline]
    pub(super) fn callsite(&self) -> Option<(&'static Metadata<'static>, &'static Category)> {
        match self.callsite.load(Ordering::Relaxed) {
            NO_CALLSITE => self.rest().meta,
            n => callsites::get(n).map(|cs| (cs.meta, cs.category)),
        }
    }

    /// The cold state, if the span has any.
    #[inline]
    pub(super) fn cold(&self) -> Option<MutexGuard<'_, Cold>> {
        self.cold.load(Ordering::Relaxed).then(|| self.rest())
    }

    /// The cold state, from now on marked as holding something (emptied
    /// first if it held nothing of this span).
    pub(super) fn cold_mut(&self) -> MutexGuard<'_, Cold> {
        let mut rest = self.rest();
        if !self.cold.swap(true, Ordering::Relaxed) {
            rest.fields.clear();
            rest.flows.clear();
        }
        rest
    }

    /// Records whether `cold` (this slot's, locked) holds what no event
    /// wrote yet; called after every change to it.
    #[inline]
    pub(super) fn note_pending(&self, cold: &Cold) {
        self.pending.store(
            cold.fields.is_dirty() || !cold.flows.is_empty(),
            Ordering::Relaxed,
        );
    }

    /// [`Slot::note_pending`] for `cold` once its changed fields are
    /// written (called just before they are).
    #[inline]
    pub(super) fn note_fields_written(&self, cold: &Cold) {
        self.pending
            .store(!cold.flows.is_empty(), Ordering::Relaxed);
    }

    fn rest(&self) -> MutexGuard<'_, Cold> {
        self.rest.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the closing span has nothing left to write: entered at
    /// most once, its given fields carried by its slice (or none), and no
    /// cold state (no recorded field, flow or metadata of its own). Its
    /// close then only releases its key.
    #[inline]
    pub(super) fn closes_quietly(&self) -> bool {
        let enters = self.enters();
        enters <= 1
            && !self.cold.load(Ordering::Relaxed)
            && (self.given().is_empty()
                || (enters == 1 && self.given_carried.load(Ordering::Relaxed)))
    }

    /// The cold state of a closing span, if it has any and the close
    /// needs it (`all`, or something no event wrote): let go when the
    /// guard drops (the buffers stay for the slot's next span; one not
    /// taken here is emptied by the next [`Slot::start`] or
    /// [`Slot::cold_mut`]).
    #[inline]
    pub(super) fn close(&self, all: bool) -> Option<Closing<'_>> {
        // No other thread holds the span any more: loads and a store, not
        // a read-modify-write, and no lock when nothing is pending.
        if !self.cold.load(Ordering::Relaxed) {
            return None;
        }
        self.cold.store(false, Ordering::Relaxed);
        if !all && !self.pending.load(Ordering::Relaxed) {
            return None;
        }
        Some(Closing(self.rest()))
    }
}

/// The cold state of a closing span ([`Slot::close`]).
pub(super) struct Closing<'a>(MutexGuard<'a, Cold>);

impl std::ops::Deref for Closing<'_> {
    type Target = Cold;
    fn deref(&self) -> &Cold {
        &self.0
    }
}

impl std::ops::DerefMut for Closing<'_> {
    fn deref_mut(&mut self) -> &mut Cold {
        &mut self.0
    }
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.0.fields.clear();
        self.0.flows.clear();
        self.0.meta = None;
    }
}

sync::thread_local! {
    /// A byte whose address tells the thread ([`this_thread`]).
    static THREAD: u8 = const { 0 };
}

/// The calling thread, as no other live thread is: the address of its
/// [`THREAD`].
#[inline(always)]
fn this_thread() -> usize {
    THREAD.with(|t| t as *const u8 as usize)
}

/// Lanes held by live threads, one bit each (module docs).
#[cfg(not(loom))]
static LANES_HELD: AtomicU8 = AtomicU8::new(0);
#[cfg(loom)]
loom::lazy_static! {
    /// Lanes held by live threads: one set per execution of a model,
    /// leaked (loom drops its statics before the thread-locals of a
    /// model's main thread, whose lane goes back after).
    static ref LANES_HELD: &'static AtomicU8 = Box::leak(Box::new(AtomicU8::new(0)));
}
/// [`Lane`] of a thread holding none.
const NO_LANE: u8 = u8::MAX;

/// The lane a thread holds (of those in `held`), given back when it exits.
struct Lane {
    /// Its number, [`NO_LANE`] while it holds none.
    n: Cell<u8>,
    held: &'static AtomicU8,
}

impl Lane {
    const fn new(held: &'static AtomicU8) -> Self {
        Lane {
            n: Cell::new(NO_LANE),
            held,
        }
    }

    /// The lane held, taken now if none is and one is free.
    #[inline]
    fn get(&self) -> Option<usize> {
        let n = self.n.get();
        if usize::from(n) < LANES {
            return Some(usize::from(n));
        }
        self.take()
    }

    /// Takes a free lane, if there is one.
    #[cold]
    fn take(&self) -> Option<usize> {
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            let free = !held & ((1 << LANES) - 1);
            if free == 0 {
                return None;
            }
            let n = free.trailing_zeros() as u8;
            // Acquire: the lane's last holder's uses of its keys happened
            // before (its release).
            match self.held.compare_exchange_weak(
                held,
                held | 1 << n,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.n.set(n);
                    return Some(usize::from(n));
                }
                Err(now) => held = now,
            }
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        let n = self.n.get();
        if usize::from(n) < LANES {
            // Release: this thread's uses of its lane keys happen before
            // the next holder's.
            self.held.fetch_and(!(1 << n), Ordering::Release);
        }
    }
}

sync::thread_local! {
    /// The calling thread's lane.
    static LANE: Lane = const { Lane::new(&LANES_HELD) };
}

/// The lane the calling thread holds, taken now if it holds none and one
/// is free; `None` if none is (or the thread is exiting).
#[inline]
fn lane() -> Option<usize> {
    LANE.try_with(Lane::get).ok().flatten()
}

/// Per-span slots keyed by span id (see the module docs).
pub(super) struct SpanTable {
    keys: Box<[AtomicU64]>,
    slots: Box<[Slot]>,
}

impl SpanTable {
    /// An empty table.
    pub(super) fn new() -> Self {
        SpanTable {
            keys: (0..GROUPS * GROUP).map(|_| AtomicU64::new(0)).collect(),
            slots: (0..GROUPS * GROUP).map(|_| Slot::default()).collect(),
        }
    }

    /// The first index of `id`'s group.
    #[inline]
    fn group(id: u64) -> usize {
        // Fibonacci hashing: the registry's ids differ mostly in low bits.
        // Their top bits count the generations of the registry's slot (its
        // slab's layout, in sharded-slab's `cfg.rs`: 37 bits of index, 13 of
        // thread, then the generation): left out, a registry slot's next
        // span (a thread making spans in a loop) lands in the same group, and
        // mostly the same table slot, whose cache lines are still warm. Any
        // hash of the id is correct; this one only keeps the hot lines few.
        let h =
            (id & ID_BITS).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - GROUPS.trailing_zeros());
        h as usize * GROUP
    }

    /// A slot for the new span `id`, or `None` if its group has no key
    /// for it (its lane key, if the calling thread holds a lane, and every
    /// shared key are taken).
    #[inline]
    pub(super) fn claim(&self, id: u64) -> Option<&Slot> {
        self.claim_in(id, lane())
    }

    /// [`SpanTable::claim`] by a thread holding `lane` (module docs).
    #[inline(always)]
    fn claim_in(&self, id: u64, lane: Option<usize>) -> Option<&Slot> {
        let start = Self::group(id);
        let keys = &self.keys[start..start + GROUP];
        if let Some(i) = keys.iter().position(|k| k.load(Ordering::Relaxed) == id) {
            return Some(&self.slots[start + i]);
        }
        // Acquire (here and in the swap): the release of the slot's
        // previous span, and so every use of it, happened before the new
        // span's start.
        if let Some(lane) = lane {
            // Only this thread sets this key (module docs).
            let k = &keys[lane];
            if k.load(Ordering::Acquire) == 0 {
                k.store(id, Ordering::Relaxed);
                return Some(&self.slots[start + lane]);
            }
        }
        let i = keys[LANES..].iter().position(|k| {
            k.compare_exchange(0, id, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })?;
        Some(&self.slots[start + LANES + i])
    }

    /// The slot of the live span `id`, if it has one, and the index of
    /// its key (for [`SpanTable::release`]).
    #[inline]
    pub(super) fn get(&self, id: u64) -> Option<(&Slot, usize)> {
        let start = Self::group(id);
        let i = self.keys[start..start + GROUP]
            .iter()
            .position(|k| k.load(Ordering::Relaxed) == id)?;
        Some((&self.slots[start + i], start + i))
    }

    /// Frees the key `at` ([`SpanTable::get`]) of a span that closed.
    #[inline]
    pub(super) fn release(&self, at: usize) {
        if let Some(k) = self.keys.get(at) {
            k.store(0, Ordering::Release);
        }
    }

    /// How many keys hold a span (none once every span closed).
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.keys
            .iter()
            .filter(|k| k.load(Ordering::Relaxed) != 0)
            .count()
    }
}

#[cfg(all(test, loom))]
mod loom_model;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_span_finds_its_slot_until_released() {
        let table = SpanTable::new();
        table
            .claim(7)
            .unwrap()
            .other_enters
            .store(70, Ordering::Relaxed);
        table
            .claim(9)
            .unwrap()
            .other_enters
            .store(90, Ordering::Relaxed);
        let enters = |id| {
            table
                .get(id)
                .map(|(s, _)| s.other_enters.load(Ordering::Relaxed))
        };
        let release = |id| table.release(table.get(id).unwrap().1);
        assert_eq!(enters(7), Some(70));
        assert_eq!(enters(9), Some(90));
        assert_eq!(enters(8), None);
        release(7);
        assert_eq!(enters(7), None);
        assert_eq!(enters(9), Some(90));
        // A claim of an id still held gets its slot again (a lost close).
        assert!(std::ptr::eq(
            table.claim(9).unwrap(),
            table.get(9).unwrap().0
        ));
        release(9);
        assert_eq!(enters(9), None);
    }

    #[test]
    fn the_first_enter_is_found_on_and_off_the_owner_thread() {
        let table = SpanTable::new();
        let first_on = |slot: &Slot, ns: u64| {
            let first = slot.enter();
            if let Some(cell) = first {
                cell.store(ns, Ordering::Relaxed);
            }
            first.is_some()
        };
        let elsewhere = |slot: &Slot, ns: u64| {
            std::thread::scope(|s| s.spawn(|| first_on(slot, ns)).join().unwrap())
        };
        let made_here = |id| {
            let slot = table.claim(id).unwrap();
            slot.owner.store(this_thread(), Ordering::Relaxed);
            slot
        };
        // Entered here first, then on another thread, then here.
        let a = made_here(1);
        let firsts = [first_on(a, 50), elsewhere(a, 60), first_on(a, 70)];
        assert_eq!(firsts, [true, false, false]);
        assert_eq!((a.enters(), a.first_ns()), (3, 50));
        // Entered on another thread first.
        let b = made_here(2);
        let firsts = [elsewhere(b, 80), first_on(b, 90), elsewhere(b, 95)];
        assert_eq!(firsts, [true, false, false]);
        assert_eq!((b.enters(), b.first_ns()), (3, 80));
        // Both first at once (module docs): the earlier time.
        b.own_first_ns.store(75, Ordering::Relaxed);
        assert_eq!(b.first_ns(), 75);
    }

    #[test]
    fn a_full_group_refuses_a_claim() {
        let table = SpanTable::new();
        // Ids that share a group.
        let group = SpanTable::group(1);
        let same: Vec<u64> = (1..)
            .filter(|&id| SpanTable::group(id) == group)
            .take(GROUP + 1)
            .collect();
        // The shared keys and the lane key of the claiming thread, which
        // holds lane 1 (a lane of its own: tests on other threads take the
        // process's lanes).
        let lane = Some(1);
        let room = GROUP - LANES + 1;
        for &id in &same[..room] {
            table
                .claim_in(id, lane)
                .unwrap()
                .other_enters
                .store(id as u32, Ordering::Relaxed);
        }
        assert!(table.claim_in(same[room], lane).is_none());
        for &id in &same[..room] {
            let (slot, at) = table.get(id).unwrap();
            assert_eq!(slot.other_enters.load(Ordering::Relaxed), id as u32);
            // No other lane's key.
            let key = at - group;
            assert!(
                key >= LANES || Some(key) == lane,
                "key {key}, lane {lane:?}"
            );
        }
        // One closes: the next claim gets its key.
        table.release(table.get(same[room - 1]).unwrap().1);
        assert!(table.claim_in(same[room], lane).is_some());
        assert!(table.get(same[room - 1]).is_none());
    }

    #[test]
    fn lanes_are_held_by_one_thread_each_until_it_exits() {
        // Lanes of a set of their own (the process's may be held by
        // tests on other threads).
        static HELD: AtomicU8 = AtomicU8::new(0);
        let barrier = std::sync::Barrier::new(LANES + 1);
        // More threads than lanes at once: each lane held once, one thread
        // without.
        let mut got: Vec<Option<usize>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..=LANES)
                .map(|_| {
                    s.spawn(|| {
                        let lane = Lane::new(&HELD);
                        let n = lane.get();
                        // Still held on the second ask.
                        assert_eq!(lane.get(), n);
                        barrier.wait();
                        n
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        got.sort();
        let mut want = vec![None];
        want.extend((0..LANES).map(Some));
        assert_eq!(got, want);
        // All given back: the next holder takes the first.
        assert_eq!(HELD.load(Ordering::Relaxed), 0);
        assert_eq!(Lane::new(&HELD).get(), Some(0));
    }
}
