//! [`WriterCell`]: a writer in a `static`, reachable from any context
//! (thread, interrupt handler, RTOS task) without `unsafe` in user code and
//! without ever blocking.
//!
//! Writing from several contexts takes one writer per context (each its own
//! sequence and writer id), each in its own cell: an interrupt handler
//! borrows its writer with [`WriterCell::try_with`], which is one
//! compare-and-swap in and one store out. Two contexts never wait for each
//! other. If a context finds its cell busy (the same cell used by a
//! context that preempted another user of it, e.g. a nested interrupt of a
//! handler sharing the cell), the event is not written and the miss is
//! counted ([`WriterCell::busy_misses`]).
//!
//! What is lock-free: this cell, chunk acquisition and release (a bounded
//! number of compare-and-swaps on the page header), writing a packet (one
//! release store). What is not: nothing on the event path waits; a
//! critical section (`critical_section::with`) around one shared writer is
//! the alternative for programs that prefer one sequence for all contexts
//! and accept masking interrupts for the length of an event.
//!
//! A writer kept in a `static` needs a type it can name: the clock hook
//! as a `fn() -> u64` (a function item coerces to it), the arbiter and the
//! region `'static`. An interrupt writes through its cell; the main loop
//! sets it up once and flushes it with its own writer when the host asks:
//!
//! ```
//! use shmtrace_abi::layout::PageLayout;
//! use shmtrace_abi::link::AttachService;
//! use shmtrace_abi::region::{RegionArbiter, RegionConfig, RegionStorage};
//! use shmtrace_abi::track_event::{SequenceConfig, Track, TrackEventWriter, WriterCell};
//! use shmtrace_abi::writer::InPlaceWriter;
//!
//! type Writer = TrackEventWriter<'static, RegionArbiter<'static>, fn() -> u64>;
//!
//! static REGION: RegionStorage<8192, 16> = RegionStorage::new();
//! static MAIN: Track = Track::new("main loop");
//! static IRQ_TRACK: Track = Track::new("timer interrupt");
//! static IRQ: WriterCell<Writer> = WriterCell::new();
//!
//! fn now_ns() -> u64 {
//!     1_000 // the clock hook: a hardware counter in ns
//! }
//!
//! // The interrupt handler (`#[exception] fn SysTick()` with cortex-m-rt).
//! fn on_timer() {
//!     IRQ.try_with(|w| w.instant("irq", "tick"));
//! }
//!
//! // In `main`: one arbiter and writer id per context.
//! let region = REGION.take(&RegionConfig::new("track_event")).unwrap();
//! let writer = |id, track| -> Writer {
//!     let arbiter = RegionArbiter::new(&region, PageLayout::Div4).unwrap();
//!     let out = InPlaceWriter::new(arbiter, id, 0).unwrap();
//!     TrackEventWriter::new(out, now_ns, SequenceConfig::new(track))
//! };
//! let mut main = writer(1, &MAIN);
//! assert!(IRQ.set(writer(2, &IRQ_TRACK)).is_ok()); // before the interrupt is enabled
//! let mut link = AttachService::new(&region);
//! # region.control.request_flush(); // what a host does
//! on_timer();
//! main.slice_begin("app", "work");
//! main.slice_end();
//! // Flush both writers when the host asks.
//! link.poll(
//!     || {
//!         main.flush();
//!         IRQ.try_with(|w| w.flush());
//!     },
//!     now_ns,
//! );
//! # assert_eq!(region.control.flush_ack(), 1);
//! assert_eq!(IRQ.try_with(|w| w.stats().events), Some(1));
//! ```
//!
//! # Invariants
//!
//! * `state` is `EMPTY` (no value), `READY` (a value, nobody borrows it) or
//!   `BUSY` (one party has exclusive access to the slot). Only the party
//!   that moved `state` to `BUSY` (compare-and-swap, `Acquire`) touches the
//!   slot, and it leaves `BUSY` with a `Release` store, so a value written
//!   by one context is fully visible to the next that borrows it.
//! * No `&mut W` outlives the closure it is given to.

use core::mem::MaybeUninit;

use crate::sync::atomic::AtomicU32;
use crate::sync::Ordering::{Acquire, Relaxed, Release};

#[cfg(not(loom))]
use core::cell::UnsafeCell;
#[cfg(loom)]
use loom::cell::UnsafeCell;

const EMPTY: u32 = 0;
const BUSY: u32 = 1;
const READY: u32 = 2;

/// A slot for one writer, usable in a `static`. See the module docs.
pub struct WriterCell<W> {
    state: AtomicU32,
    misses: AtomicU32,
    value: UnsafeCell<MaybeUninit<W>>,
}

// SAFETY: the value is only ever accessed by the one party that moved
// `state` to BUSY (see the module invariants), so sharing the cell between
// contexts hands the value from one to another, which `W: Send` allows.
#[allow(unsafe_code)]
unsafe impl<W: Send> Sync for WriterCell<W> {}

impl<W> Default for WriterCell<W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<W> WriterCell<W> {
    /// An empty cell.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self {
            state: AtomicU32::new(EMPTY),
            misses: AtomicU32::new(0),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// An empty cell (loom's types have no `const` constructors).
    #[cfg(loom)]
    pub fn new() -> Self {
        Self {
            state: AtomicU32::new(EMPTY),
            misses: AtomicU32::new(0),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Moves `state` from `from` to BUSY; `true` if this call did.
    #[inline(always)]
    fn lock(&self, from: u32) -> bool {
        self.try_lock(from).is_ok()
    }

    /// Moves `state` from `from` to BUSY; else the state found.
    #[inline(always)]
    fn try_lock(&self, from: u32) -> Result<u32, u32> {
        self.state.compare_exchange(from, BUSY, Acquire, Relaxed)
    }

    /// Runs `f` on the slot. Only call while holding BUSY.
    #[inline(always)]
    #[allow(unsafe_code)]
    fn with_slot<R>(&self, f: impl FnOnce(&mut MaybeUninit<W>) -> R) -> R {
        #[cfg(not(loom))]
        {
            // SAFETY: the caller holds BUSY, so no other party accesses the
            // slot until it stores another state (module invariants); the
            // `&mut` does not escape `f`.
            f(unsafe { &mut *self.value.get() })
        }
        #[cfg(loom)]
        {
            // SAFETY: as above.
            self.value.with_mut(|p| f(unsafe { &mut *p }))
        }
    }

    /// Puts `writer` in the cell; gives it back if the cell holds one
    /// already (or is busy).
    pub fn set(&self, writer: W) -> Result<(), W> {
        if !self.lock(EMPTY) {
            return Err(writer);
        }
        self.with_slot(|slot| {
            slot.write(writer);
        });
        self.state.store(READY, Release);
        Ok(())
    }

    /// Runs `f` with exclusive access to the writer. `None` if the cell is
    /// empty or busy (counted in [`WriterCell::busy_misses`] when busy).
    #[inline]
    pub fn try_with<R>(&self, f: impl FnOnce(&mut W) -> R) -> Option<R> {
        // The state the compare-and-swap found decides (a second load
        // could see the holder done already, and the miss would go
        // uncounted).
        if let Err(found) = self.try_lock(READY) {
            if found == BUSY {
                self.misses.fetch_add(1, Relaxed);
            }
            return None;
        }
        #[allow(unsafe_code)]
        let r = self.with_slot(|slot| {
            // SAFETY: READY means the slot holds an initialized value
            // (written by `set` before its Release store of READY, which our
            // Acquire compare-and-swap observed).
            f(unsafe { slot.assume_init_mut() })
        });
        self.state.store(READY, Release);
        Some(r)
    }

    /// Takes the writer out, leaving the cell empty. `None` if it was empty
    /// or busy.
    pub fn take(&self) -> Option<W> {
        if !self.lock(READY) {
            return None;
        }
        #[allow(unsafe_code)]
        let w = self.with_slot(|slot| {
            // SAFETY: READY means initialized (see `try_with`); the state
            // goes to EMPTY below, so the value is read out exactly once.
            unsafe { slot.assume_init_read() }
        });
        self.state.store(EMPTY, Release);
        Some(w)
    }

    /// Borrows that found the cell busy.
    pub fn busy_misses(&self) -> u32 {
        self.misses.load(Relaxed)
    }
}

impl<W> Drop for WriterCell<W> {
    fn drop(&mut self) {
        if self.lock(READY) {
            #[allow(unsafe_code)]
            self.with_slot(|slot| {
                // SAFETY: READY means initialized; `&mut self` excludes
                // every other party, and the value is dropped once.
                unsafe { slot.assume_init_drop() }
            });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn set_borrow_take() {
        let cell = WriterCell::new();
        assert_eq!(cell.try_with(|w: &mut u32| *w), None);
        assert_eq!(cell.set(5), Ok(()));
        assert_eq!(cell.set(6), Err(6));
        assert_eq!(
            cell.try_with(|w| {
                *w += 1;
                *w
            }),
            Some(6)
        );
        assert_eq!(cell.take(), Some(6));
        assert_eq!(cell.take(), None);
        assert_eq!(cell.busy_misses(), 0);
    }

    #[test]
    fn a_nested_borrow_misses_and_is_counted() {
        let cell = WriterCell::new();
        cell.set(1u32).unwrap();
        let inner = cell.try_with(|_| cell.try_with(|w| *w));
        assert_eq!(inner, Some(None));
        assert_eq!(cell.busy_misses(), 1);
    }

    #[test]
    fn the_value_is_dropped_with_the_cell() {
        let v = Arc::new(());
        let cell = WriterCell::new();
        cell.set(Arc::clone(&v)).unwrap();
        assert_eq!(Arc::strong_count(&v), 2);
        drop(cell);
        assert_eq!(Arc::strong_count(&v), 1);
    }
}
