//! The synchronization types of the crate's hand-written cross-thread
//! protocols: `std`'s normally, `loom`'s under `RUSTFLAGS="--cfg loom"` (as
//! `shmtrace_abi::sync::atomic` does), so that the loom models next to
//! those protocols (`loom_model` modules: the `tracing` layer's span table,
//! the writer cell's lock and deferred work, the startup hand-over in
//! `data_source`) run their own code.
//!
//! [`UnsafeCell`] is `loom`'s interface over `std`'s cell: a closure gets
//! the pointer, so loom sees each access (and reports two threads' accesses
//! that no synchronization orders). `thread_local!` takes `std`'s forms
//! (`const` or not); loom's thread-locals are made on first use.
//!
//! What loom cannot run goes through a seam here that costs nothing
//! outside `cfg(loom)`:
//!
//! * [`seq_cst_store_load`]: loom runs `SeqCst` loads, stores and
//!   read-modify-writes as `AcqRel` (loom's README, "Unsupported
//!   features"), so a Dekker pair made of them (a `SeqCst` store then a
//!   `SeqCst` load of another flag, on both sides) would fail its model
//!   although C11's single total order of `SeqCst` operations makes it
//!   correct. Code calls this between such a store and load; it is
//!   nothing normally and `fence(SeqCst)` under loom, which gives loom the
//!   store-then-load order the two `SeqCst` accesses have.
//! * The asymmetric fence (`membarrier(2)`): [`light_fence`] and
//!   [`light_point`] on the owner's side, `heavy_fence_model` (under
//!   loom only) standing for the taker's syscall; see `membarrier` (its
//!   model, under loom only).
//! * [`spin_loop`] and [`yield_now`] are loom's under loom, which then
//!   schedules another thread (a spin loop on `std`'s would never end).
//!
//! Elsewhere, under `cfg(loom)` only: `writer::wait_deferred` waits until
//! done, yielding, instead of sleeping up to a deadline (loom cannot
//! replay real time), and the process-wide track event data source type
//! is never made (`track_event::data_source::advertise`: its loom atomics
//! would live outside any model).

#[cfg(loom)]
#[cfg_attr(not(feature = "tracing"), allow(unused_imports))]
pub(crate) use loom::{
    cell::UnsafeCell,
    hint::spin_loop,
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize},
    sync::{Mutex, MutexGuard},
    thread::yield_now,
};
#[cfg(not(loom))]
#[cfg_attr(not(feature = "tracing"), allow(unused_imports))]
pub(crate) use std::{
    hint::spin_loop,
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize},
    sync::{Mutex, MutexGuard},
    thread::yield_now,
    thread_local,
};

/// `loom::thread_local!` for a `std` declaration.
#[cfg(loom)]
#[cfg_attr(not(feature = "tracing"), allow(unused_macros))]
macro_rules! loom_thread_local {
    ($(#[$attr:meta])* static $name:ident: $t:ty = const { $init:expr };) => {
        loom::thread_local!($(#[$attr])* static $name: $t = $init;);
    };
    ($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;) => {
        loom::thread_local!($(#[$attr])* static $name: $t = $init;);
    };
}
#[cfg(loom)]
#[cfg_attr(not(feature = "tracing"), allow(unused_imports))]
pub(crate) use loom_thread_local as thread_local;

/// `std`'s `UnsafeCell` with `loom`'s interface (see the module docs).
#[cfg(not(loom))]
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
#[derive(Default)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
impl<T> UnsafeCell<T> {
    /// A cell holding `value`.
    #[inline(always)]
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a pointer to the value, for reading.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a pointer to the value, for writing.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Between a `SeqCst` store (or read-modify-write) and a `SeqCst` load of
/// a Dekker pair: nothing, or `fence(SeqCst)` under loom (module docs).
#[inline(always)]
pub(crate) fn seq_cst_store_load() {
    #[cfg(loom)]
    loom::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Points of the light side's program where the heavy side's barrier may
/// land (see the module docs); [`light_point`] marks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LightPoint {
    /// Before the light side's flag store.
    BeforeStore,
    /// Its [`light_fence`], between its store and its load (named under
    /// loom only).
    #[cfg_attr(not(loom), allow(dead_code))]
    Fence,
    /// After its load of the heavy side's flag.
    AfterLoad,
    /// A wait for the heavy side to let go.
    Waiting,
}

/// The light side of an asymmetric fence, between its store and its load:
/// a compiler fence (the CPU's order is the heavy side's job), a landing
/// point of the heavy side's barrier under loom.
#[inline(always)]
pub(crate) fn light_fence() {
    #[cfg(not(loom))]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(loom)]
    membarrier::land(LightPoint::Fence);
}

/// Another point of the light side's program where the heavy side's
/// barrier may land: nothing, except under loom.
#[inline(always)]
pub(crate) fn light_point(point: LightPoint) {
    #[cfg(loom)]
    membarrier::land(point);
    #[cfg(not(loom))]
    let _ = point;
}

#[cfg(loom)]
pub(crate) use membarrier::heavy as heavy_fence_model;

/// Spawns `f` on a loom thread with a 1 MiB stack: models that set up an
/// SMB and write packets need more than loom's threads have.
#[cfg(all(test, loom))]
pub(crate) fn spawn_big<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> loom::thread::JoinHandle<T> {
    loom::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(f)
        .expect("spawn")
}

/// The loom model of `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`.
///
/// The syscall's guarantee (membarrier(2)): on return, every other running
/// thread of the process has passed through a state where its memory
/// accesses match program order between the call's entry and its return
/// (the kernel runs `smp_mb()` there, by IPI; a thread not running is in
/// that state already, its last context switch being a full barrier). So
/// for the one light-side thread a model has (a writer cell's owner) it is:
/// a `fence(SeqCst)` at *some* point of the owner's program order,
/// executed after the caller's entry `fence(SeqCst)` and before its return
/// `fence(SeqCst)` (the kernel's barriers at entry and exit), in the single
/// order of `SeqCst` fences (loom runs them in the order it executes them,
/// joining each thread's causality with the fences' before it).
///
/// Which point is not the caller's choice, so a model sets one with
/// [`membarrier::place`] and runs once per [`LightPoint`] of interest: the caller's
/// [`membarrier::heavy`] enters (fence), asks, and waits; the owner's fence runs the
/// first time, after the request, that it reaches the placed point, or a
/// [`LightPoint::Waiting`] point (it cannot go on until the caller is
/// done, so the barrier falls there), or its end ([`membarrier::owner_exit`]: the
/// context switch of a thread no longer running, after which the call no
/// longer waits). Requiring the owner's fence to come after the caller's
/// entry is what makes the encoding faithful: a fence at the owner's
/// point placed anywhere in the fences' order (e.g. before the caller's
/// store) lets both sides of a correct Dekker pair pass, which the
/// syscall rules out.
#[cfg(loom)]
pub(crate) mod membarrier {
    use std::sync::atomic::Ordering::{Relaxed, SeqCst};

    use loom::sync::atomic::{fence, AtomicBool, AtomicU8};

    use super::LightPoint;

    /// One execution's state.
    struct State {
        /// The process has the syscall (else its lock mode is symmetric).
        offered: AtomicBool,
        /// The placed [`LightPoint`], as its index.
        placed: AtomicU8,
        /// A call waits for the owner's fence.
        requested: AtomicBool,
        /// The owner thread ended.
        gone: AtomicBool,
    }

    std::thread_local! {
        /// The running execution's state: loom runs an execution's threads
        /// on the test's one OS thread, and [`place`] makes a new one (leaked:
        /// loom drops its statics before the thread-locals of an
        /// execution's threads, whose writers' retirement calls [`heavy`]).
        static STATE: std::cell::Cell<Option<&'static State>> = const { std::cell::Cell::new(None) };
    }

    /// This execution's state; `None` before [`place`].
    fn state() -> Option<&'static State> {
        STATE.with(std::cell::Cell::get)
    }

    /// Starts an execution's model of the syscall, its owner's fence landing
    /// at `point` (module docs); called before spawning the threads.
    pub(crate) fn place(point: LightPoint) {
        let state = Box::leak(Box::new(State {
            offered: AtomicBool::new(true),
            placed: AtomicU8::new(point as u8),
            requested: AtomicBool::new(false),
            gone: AtomicBool::new(false),
        }));
        STATE.with(|s| s.set(Some(state)));
    }

    /// This execution's process has no membarrier: its lock mode is
    /// symmetric (`cell_lock::lock_mode`); called after [`place`].
    pub(crate) fn withhold() {
        let state = state().expect("membarrier::place first");
        state.offered.store(false, Relaxed);
    }

    /// Whether this execution's process has the syscall.
    pub(crate) fn offered() -> bool {
        state().is_none_or(|s| s.offered.load(Relaxed))
    }

    /// The owner reached `point`: its fence, if a call waits for it and
    /// the point is the placed one (or a wait). Nothing without a model.
    pub(crate) fn land(point: LightPoint) {
        let Some(state) = state() else { return };
        let here = point == LightPoint::Waiting || state.placed.load(Relaxed) == point as u8;
        if here && state.requested.load(Relaxed) {
            fence(SeqCst);
            state.requested.store(false, Relaxed);
        }
    }

    /// The owner thread's end: its last fence (a thread not running).
    pub(crate) fn owner_exit() {
        let state = state().expect("membarrier::place first");
        fence(SeqCst);
        state.gone.store(true, Relaxed);
    }

    /// The caller's `membarrier(PRIVATE_EXPEDITED)` (one call at a time).
    pub(crate) fn heavy() {
        let state = state().expect("membarrier::place first");
        fence(SeqCst);
        state.requested.store(true, Relaxed);
        while state.requested.load(Relaxed) && !state.gone.load(Relaxed) {
            loom::thread::yield_now();
        }
        state.requested.store(false, Relaxed);
        fence(SeqCst);
    }
}
