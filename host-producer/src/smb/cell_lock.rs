//! The lock of a writer cell (`writer`): one owner thread that takes it
//! for every event, and rare *takers* that may pay a syscall.
//!
//! A cell has one owner thread (the thread whose thread-local entry holds
//! it) and, rarely, *takers*: the idle sweep, flush, stop and thread exit.
//! The owner locks it for every event, so its side must be cheap; takers
//! may pay a syscall. The lock is an asymmetric Dekker pair of flags:
//!
//! * `in_use` is written only by the owner: `true` for the duration of one
//!   packet group (an event and the state it depends on), then `false`
//!   with a release store.
//! * `taker` is set by one taker at a time (`swap(true)`, so takers exclude
//!   each other) and cleared with a release store.
//!
//! The owner stores `in_use = true`, then loads `taker` (acquire); if set it
//! backs off (`in_use = false`), waits for `taker` to clear and retries. A
//! taker sets `taker`, then loads `in_use` (acquire); if set it clears
//! `taker` and fails. Mutual exclusion needs the classic store-then-load
//! ordering on both sides, so that at least one of them sees the other's
//! flag:
//!
//! * [`LockMode::Asymmetric`] (Linux with `membarrier(2)`
//!   `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, registered once per process): the
//!   owner has only a compiler fence between its store and its load (no
//!   atomic read-modify-write, no `mfence`); the taker calls
//!   `membarrier(PRIVATE_EXPEDITED)` between its store and its load. The
//!   kernel runs a full memory barrier on every CPU currently running a
//!   thread of this process before the call returns (and a context switch
//!   is one), so the owner's store and load are separated by a full barrier
//!   at *some* point of its program order: if that point falls after its
//!   `in_use` store, the store is visible to the taker's later load; if it
//!   falls before, the owner's `taker` load comes after a barrier that
//!   follows the taker's store and sees it. Either way both cannot pass.
//!   This is the pairing of liburcu's and folly's asymmetric fences.
//! * [`LockMode::Symmetric`] (no membarrier: other OSes, old kernels,
//!   seccomp): both sides use sequentially consistent read-modify-writes
//!   and loads, i.e. the plain Dekker algorithm; the owner pays two atomic
//!   swaps per event (taking the lock, and releasing it before it looks
//!   for deferred work, below).
//!
//! The mode is chosen when the first cell is created and never changes, so
//! both sides of a cell always follow the same protocol.
//!
//! The lock guards nothing itself: [`CellLock`] only decides who holds
//! it; the cell keeps the data and hands it out to the holder.
//!
//! Its flags are those of [`crate::sync`]: `std`'s, or `loom`'s under
//! `RUSTFLAGS="--cfg loom"`, where `loom_model` runs this code in both
//! modes, the taker's `membarrier` being the model of
//! `crate::sync::membarrier` (the owner's compiler fence and the points
//! marked with [`sync::light_point`] are where its barrier may land; they
//! cost nothing outside loom).

use std::sync::atomic::Ordering;

use crate::sync::{self, AtomicBool, AtomicU8, LightPoint};

/// How the owner and takers of a cell order their flags (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// Owner: plain store + compiler fence; taker: `membarrier`.
    Asymmetric,
    /// Both: sequentially consistent read-modify-writes.
    Symmetric,
}

#[cfg(not(loom))]
const MODE_UNKNOWN: u8 = 0;
#[cfg(not(loom))]
const MODE_ASYMMETRIC: u8 = 1;
#[cfg(not(loom))]
const MODE_SYMMETRIC: u8 = 2;
#[cfg(not(loom))]
static MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(MODE_UNKNOWN);

/// The process's lock mode, chosen (and membarrier registered) on first
/// call. Called before any cell exists, so no cell ever sees it change.
#[cfg(not(loom))]
pub(crate) fn lock_mode() -> LockMode {
    match MODE.load(Ordering::Acquire) {
        MODE_ASYMMETRIC => LockMode::Asymmetric,
        MODE_SYMMETRIC => LockMode::Symmetric,
        _ => {
            let chosen = if register_membarrier() {
                MODE_ASYMMETRIC
            } else {
                MODE_SYMMETRIC
            };
            // Concurrent first calls agree on the first decision.
            let mode = match MODE.compare_exchange(
                MODE_UNKNOWN,
                chosen,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => chosen,
                Err(won) => won,
            };
            if mode == MODE_ASYMMETRIC {
                LockMode::Asymmetric
            } else {
                LockMode::Symmetric
            }
        }
    }
}

/// Registers this process for private expedited membarriers; `false` if
/// the kernel (or a seccomp filter) does not offer them.
#[cfg(all(any(target_os = "linux", target_os = "android"), not(loom)))]
fn register_membarrier() -> bool {
    use rustix::thread::{membarrier, membarrier_query, MembarrierCommand};
    let supported = membarrier_query();
    supported.contains_command(MembarrierCommand::PrivateExpedited)
        && supported.contains_command(MembarrierCommand::RegisterPrivateExpedited)
        && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
        // Registered: the command itself must now work.
        && membarrier(MembarrierCommand::PrivateExpedited).is_ok()
}

#[cfg(all(not(any(target_os = "linux", target_os = "android")), not(loom)))]
fn register_membarrier() -> bool {
    false
}

/// Under loom: asymmetric unless the model withholds the syscall
/// (`crate::sync::membarrier`), whatever the host offers.
#[cfg(loom)]
pub(crate) fn lock_mode() -> LockMode {
    if sync::membarrier::offered() {
        LockMode::Asymmetric
    } else {
        LockMode::Symmetric
    }
}

/// The fence a taker runs between [`CellLock::claim`] and
/// [`CellLock::confirm`] (one serves any number of cells of `mode`).
pub(crate) fn taker_fence(mode: LockMode) {
    match mode {
        LockMode::Asymmetric => heavy_barrier(),
        // The claim and the confirm are sequentially consistent already.
        LockMode::Symmetric => sync::seq_cst_store_load(),
    }
}

/// The taker's heavy side of the asymmetric fence.
#[cfg(all(any(target_os = "linux", target_os = "android"), not(loom)))]
fn heavy_barrier() {
    use rustix::thread::{membarrier, MembarrierCommand};
    // Registration succeeded and ran this command once, so it cannot fail
    // for lack of registration.
    if membarrier(MembarrierCommand::PrivateExpedited).is_err() {
        unreachable_membarrier_failure();
    }
}

#[cfg(all(not(any(target_os = "linux", target_os = "android")), not(loom)))]
fn heavy_barrier() {
    unreachable_membarrier_failure();
}

/// The taker's heavy side under loom: the model of the syscall
/// (`crate::sync::membarrier`).
#[cfg(loom)]
fn heavy_barrier() {
    sync::heavy_fence_model();
}

/// Asymmetric mode is only chosen after `PrivateExpedited` worked once;
/// the kernel does not revoke a registration. Aborting is the only sound
/// answer if it ever did (owners rely on the barrier for exclusion).
#[cold]
#[cfg(not(loom))]
fn unreachable_membarrier_failure() -> ! {
    log::error!("membarrier(PRIVATE_EXPEDITED) failed after registration; aborting");
    std::process::abort()
}

/// The owner/taker lock of one writer cell (module docs).
pub(crate) struct CellLock {
    /// Written only by the owner thread.
    in_use: AtomicBool,
    /// Held by at most one taker.
    taker: AtomicBool,
    mode: LockMode,
}

impl CellLock {
    /// An unheld lock following `mode`.
    pub(crate) fn new(mode: LockMode) -> Self {
        CellLock {
            in_use: AtomicBool::new(false),
            taker: AtomicBool::new(false),
            mode,
        }
    }

    /// The protocol this lock follows.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn mode(&self) -> LockMode {
        self.mode
    }

    /// A taker's first step: excludes other takers. Must be followed by
    /// [`taker_fence`] and then [`CellLock::confirm`].
    pub(crate) fn claim(&self) -> bool {
        !self.taker.swap(true, Ordering::SeqCst)
    }

    /// A taker's last step after [`CellLock::claim`] and a
    /// [`taker_fence`]: `true` if the taker holds the lock now, `false`
    /// (and the claim given up) if the owner is using it.
    pub(crate) fn confirm(&self) -> bool {
        if self.in_use.load(Ordering::SeqCst) {
            self.taker.store(false, Ordering::Release);
            return false;
        }
        true
    }

    /// The owner's one attempt (module docs).
    #[inline]
    pub(crate) fn owner_enter(&self) -> bool {
        match self.mode {
            LockMode::Asymmetric => {
                sync::light_point(LightPoint::BeforeStore);
                self.in_use.store(true, Ordering::Relaxed);
                // Keeps the compiler from moving the load above the store;
                // the CPU's store-load order is the taker's membarrier's job.
                sync::light_fence();
            }
            LockMode::Symmetric => {
                self.in_use.swap(true, Ordering::SeqCst);
                sync::seq_cst_store_load();
            }
        }
        let taken = self.taker.load(Ordering::SeqCst);
        sync::light_point(LightPoint::AfterLoad);
        if taken {
            self.in_use.store(false, Ordering::Release);
            false
        } else {
            true
        }
    }

    /// The owner's lock: only the owner thread calls it, never while it
    /// holds the lock already. Waits (spins, then yields) while a taker
    /// holds it.
    #[inline]
    pub(crate) fn lock_owner(&self) {
        if !self.owner_enter() {
            self.owner_enter_slow();
        }
    }

    /// Waits for a taker to let go, until the owner's attempt succeeds.
    #[cold]
    pub(crate) fn owner_enter_slow(&self) {
        let mut spins = 0u32;
        loop {
            while self.taker.load(Ordering::Acquire) {
                spins += 1;
                sync::light_point(LightPoint::Waiting);
                if spins < 64 {
                    sync::spin_loop();
                } else {
                    sync::yield_now();
                }
            }
            if self.owner_enter() {
                return;
            }
        }
    }

    /// Lets go of the lock (`owner`: held through `in_use`, else through
    /// `taker`), then loads `work` (the cell's deferred-work flags): the
    /// load is ordered after the release as the lock's own load is after
    /// its store, so a requester that set `work` (`SeqCst`) before its
    /// claim and found the lock held is seen here.
    #[inline]
    pub(crate) fn release(&self, owner: bool, work: &AtomicU8) -> u8 {
        if !owner {
            self.taker.store(false, Ordering::SeqCst);
            sync::seq_cst_store_load();
        } else {
            match self.mode {
                LockMode::Asymmetric => {
                    self.in_use.store(false, Ordering::Release);
                    // Store, then load: the requester's membarrier orders
                    // them on the CPU, as for the lock.
                    sync::light_fence();
                }
                LockMode::Symmetric => {
                    self.in_use.swap(false, Ordering::SeqCst);
                    sync::seq_cst_store_load();
                }
            }
        }
        work.load(Ordering::SeqCst)
    }

    /// Takes the lock back after [`CellLock::release`]: the owner always
    /// gets it (it waits out a taker); a taker only if nobody holds it.
    #[cold]
    pub(crate) fn reacquire(&self, owner: bool) -> bool {
        if owner {
            self.owner_enter_slow();
            return true;
        }
        if !self.claim() {
            return false;
        }
        taker_fence(self.mode);
        self.confirm()
    }
}

#[cfg(all(test, loom))]
mod loom_model;
