//! Trace writers shared between their owner thread and the producer's
//! housekeeping (flush, stop, reclaiming chunks of idle threads).
//!
//! A [`WriterCell`] holds one sequence: an abi [`TraceWriter`] over the SMB
//! plus the track-event incremental state. Its owner thread uses it for
//! every event; other threads take it only to flush it.
//!
//! # Locking
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
//!   and loads, i.e. the plain Dekker algorithm; the owner pays one atomic
//!   swap per event as before.
//!
//! The mode is chosen when the first cell is created and never changes, so
//! both sides of a cell always follow the same protocol.
//!
//! Data: the holder has exclusive access to `inner`. A taker that sees
//! `in_use == false` read the owner's last release store (acquire/release
//! pair, so it sees every write the owner made under the lock); an owner
//! that sees `taker == false` read a taker's release store likewise.
//!
//! * The owner never waits for anything while holding it except, under the
//!   stall policy, for free chunks (bounded); takers wait for it only with a
//!   bound ([`WriterCell::lock_bounded`]), then leave a request in `flags`
//!   that the owner honours before releasing the lock next time.
//! * Nothing that holds a cell lock ever blocks on another cell's lock: a
//!   writer reclaiming chunks from other cells only *tries* their locks
//!   (and a try on its own cell, whose `in_use` it holds, fails).

use std::cell::UnsafeCell;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shmtrace_abi::writer::{PacketOutcome, TraceWriter};

use crate::arbiter::{Arbiter, WriterArbiter};
use crate::event::{PacketWriter, SequenceState};

/// Flag: flush at the next opportunity (a flusher could not get the lock).
pub(crate) const FLAG_FLUSH: u8 = 1;
/// Flag: reset incremental state before the next event.
pub(crate) const FLAG_CLEAR: u8 = 2;
/// Flag: the instance stopped or the connection is gone; write nothing.
pub(crate) const FLAG_DEAD: u8 = 4;

/// The abi writer type this crate uses.
pub(crate) type ProducerTraceWriter = TraceWriter<'static, WriterArbiter>;

/// The sink TrackEvent fields are written into (the chunk stream of a
/// producer trace writer).
pub type ProducerSink = shmtrace_abi::writer::ChunkStream<
    'static,
    WriterArbiter,
    { shmtrace_abi::writer::DEFAULT_PATCH_CAPACITY },
>;

/// A trace writer and whether it wrote since its last flush.
pub(crate) struct Output {
    pub(crate) writer: ProducerTraceWriter,
    pub(crate) dirty: bool,
}

impl Output {
    /// Flushes the writer if it wrote anything since the last flush.
    pub(crate) fn flush(&mut self) {
        if self.dirty {
            self.writer.flush();
            self.dirty = false;
        }
    }
}

impl PacketWriter for Output {
    type Sink = ProducerSink;

    #[inline]
    fn write_packet(
        &mut self,
        f: impl FnOnce(&mut shmtrace_abi::proto::Message<'_, Self::Sink>),
    ) -> bool {
        self.dirty = true;
        let outcome = self.writer.write_packet(f);
        !matches!(outcome, PacketOutcome::Dropped(_))
    }

    #[inline]
    fn write_encoded_packet_in(&mut self, buf: &[u8], len: usize) -> bool {
        self.dirty = true;
        let outcome = self.writer.write_encoded_packet_in(buf, len);
        !matches!(outcome, PacketOutcome::Dropped(_))
    }
}

/// What the lock protects.
pub(crate) struct WriterInner {
    /// The abi writer (declared first: dropped before the arbiter below).
    pub(crate) out: Output,
    /// Track-event incremental state of this sequence.
    pub(crate) seq: SequenceState,
    /// Custom data sources: incremental state was cleared since the user
    /// last asked.
    pub(crate) custom_cleared: bool,
    /// Keeps the SMB mapped for as long as `writer` may point into it.
    _arbiter: Arc<Arbiter>,
}

impl WriterInner {
    /// Flushes the writer if it wrote anything since the last flush.
    pub(crate) fn flush(&mut self) {
        self.out.flush();
    }

    /// Resets incremental state (ClearIncrementalState).
    pub(crate) fn clear_incremental_state(&mut self) {
        self.seq.invalidate();
        self.custom_cleared = true;
    }
}

/// How the owner and takers of a cell order their flags (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// Owner: plain store + compiler fence; taker: `membarrier`.
    Asymmetric,
    /// Both: sequentially consistent read-modify-writes.
    Symmetric,
}

const MODE_UNKNOWN: u8 = 0;
const MODE_ASYMMETRIC: u8 = 1;
const MODE_SYMMETRIC: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(MODE_UNKNOWN);

/// The process's lock mode, chosen (and membarrier registered) on first
/// call. Called before any cell exists, so no cell ever sees it change.
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
#[cfg(any(target_os = "linux", target_os = "android"))]
fn register_membarrier() -> bool {
    use rustix::thread::{membarrier, membarrier_query, MembarrierCommand};
    let supported = membarrier_query();
    supported.contains_command(MembarrierCommand::PrivateExpedited)
        && supported.contains_command(MembarrierCommand::RegisterPrivateExpedited)
        && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
        // Registered: the command itself must now work.
        && membarrier(MembarrierCommand::PrivateExpedited).is_ok()
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn register_membarrier() -> bool {
    false
}

/// The fence a taker runs between [`WriterCell::claim`] and
/// [`WriterCell::confirm`] (one serves any number of cells of `mode`).
pub(crate) fn taker_fence(mode: LockMode) {
    match mode {
        LockMode::Asymmetric => heavy_barrier(),
        // The claim and the confirm are sequentially consistent already.
        LockMode::Symmetric => {}
    }
}

/// The taker's heavy side of the asymmetric fence.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn heavy_barrier() {
    use rustix::thread::{membarrier, MembarrierCommand};
    // Registration succeeded and ran this command once, so it cannot fail
    // for lack of registration.
    if membarrier(MembarrierCommand::PrivateExpedited).is_err() {
        unreachable_membarrier_failure();
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn heavy_barrier() {
    unreachable_membarrier_failure();
}

/// Asymmetric mode is only chosen after `PrivateExpedited` worked once;
/// the kernel does not revoke a registration. Aborting is the only sound
/// answer if it ever did (owners rely on the barrier for exclusion).
#[cold]
fn unreachable_membarrier_failure() -> ! {
    log::error!("membarrier(PRIVATE_EXPEDITED) failed after registration; aborting");
    std::process::abort()
}

/// One trace writer and its lock. See the module docs.
pub(crate) struct WriterCell {
    /// Written only by the owner thread.
    in_use: AtomicBool,
    /// Held by at most one taker.
    taker: AtomicBool,
    mode: LockMode,
    flags: AtomicU8,
    /// Set by the owner on every use, cleared by the idle sweep (second
    /// chance): a cell found untouched twice in a row is idle.
    touched: AtomicBool,
    /// The idle sweep claimed this cell (read and written only by the
    /// holder of the arbiter's cell list lock).
    pub(crate) swept: AtomicBool,
    writer_id: u16,
    inner: UnsafeCell<WriterInner>,
}

// SAFETY: `inner` is only accessed through a `CellGuard`, which exists only
// while its holder won the owner/taker exclusion described in the module
// docs (owner: `in_use` set and `taker` seen clear; taker: `taker` set and
// `in_use` seen clear, with the fence of the cell's mode in between);
// everything else is atomics or immutable. `WriterInner` itself is `Send`.
unsafe impl Sync for WriterCell {}

impl WriterCell {
    pub(crate) fn new(writer: ProducerTraceWriter, arbiter: Arc<Arbiter>) -> Self {
        Self::with_mode(writer, arbiter, lock_mode())
    }

    /// A cell following `mode` whatever the process's mode is. Sound as
    /// long as takers of the cell fence for `mode` (its own methods do): a
    /// `Symmetric` cell taken with a membarrier is only more ordered. Tests
    /// use it to run the fallback protocol on hosts with membarrier.
    pub(crate) fn with_mode(
        writer: ProducerTraceWriter,
        arbiter: Arc<Arbiter>,
        mode: LockMode,
    ) -> Self {
        let writer_id = writer.writer_id();
        WriterCell {
            in_use: AtomicBool::new(false),
            taker: AtomicBool::new(false),
            mode,
            flags: AtomicU8::new(0),
            touched: AtomicBool::new(true),
            swept: AtomicBool::new(false),
            writer_id,
            inner: UnsafeCell::new(WriterInner {
                out: Output {
                    writer,
                    dirty: false,
                },
                seq: SequenceState::new(),
                custom_cleared: true,
                _arbiter: arbiter,
            }),
        }
    }

    pub(crate) fn writer_id(&self) -> u16 {
        self.writer_id
    }

    /// Sets `flag` for the owner (or the next flusher) to act on.
    pub(crate) fn request(&self, flag: u8) {
        self.flags.fetch_or(flag, Ordering::Release);
    }

    /// A taker's attempt: succeeds if neither the owner nor another taker
    /// holds the cell. Must not be called by the owner for its own use
    /// (see [`WriterCell::lock_owner`]); on the owner's thread while it
    /// holds the cell it fails.
    pub(crate) fn try_lock(&self) -> Option<CellGuard<'_>> {
        if !self.claim() {
            return None;
        }
        taker_fence(self.mode);
        self.confirm()
    }

    /// A taker's first step: excludes other takers. Must be followed by
    /// [`taker_fence`] and then [`WriterCell::confirm`].
    pub(crate) fn claim(&self) -> bool {
        !self.taker.swap(true, Ordering::SeqCst)
    }

    /// A taker's last step after [`WriterCell::claim`] and a
    /// [`taker_fence`]: the cell, unless its owner is using it (then the
    /// claim is given up).
    pub(crate) fn confirm(&self) -> Option<CellGuard<'_>> {
        if self.in_use.load(Ordering::SeqCst) {
            self.taker.store(false, Ordering::Release);
            return None;
        }
        Some(CellGuard {
            cell: self,
            owner: false,
        })
    }

    /// The owner's one attempt (module docs).
    #[inline]
    fn try_lock_owner(&self) -> Option<CellGuard<'_>> {
        match self.mode {
            LockMode::Asymmetric => {
                self.in_use.store(true, Ordering::Relaxed);
                // Keeps the compiler from moving the load above the store;
                // the CPU's store-load order is the taker's membarrier's job.
                compiler_fence(Ordering::SeqCst);
            }
            LockMode::Symmetric => {
                self.in_use.swap(true, Ordering::SeqCst);
            }
        }
        if self.taker.load(Ordering::SeqCst) {
            self.in_use.store(false, Ordering::Release);
            None
        } else {
            Some(CellGuard {
                cell: self,
                owner: true,
            })
        }
    }

    /// The owner's lock: only the cell's owner thread calls it, never while
    /// it holds the cell already. Waits (spins, then yields) while a taker
    /// holds it; a taker holds it for one flush, so this terminates quickly.
    #[inline]
    pub(crate) fn lock_owner(&self) -> CellGuard<'_> {
        self.touched.store(true, Ordering::Relaxed);
        if let Some(g) = self.try_lock_owner() {
            return g;
        }
        self.lock_slow()
    }

    #[cold]
    fn lock_slow(&self) -> CellGuard<'_> {
        let mut spins = 0u32;
        loop {
            while self.taker.load(Ordering::Acquire) {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if let Some(g) = self.try_lock_owner() {
                return g;
            }
        }
    }

    /// A taker's lock: waits at most `limit` for it.
    pub(crate) fn lock_bounded(&self, limit: Duration) -> Option<CellGuard<'_>> {
        if let Some(g) = self.try_lock() {
            return Some(g);
        }
        let deadline = Instant::now() + limit;
        loop {
            std::thread::yield_now();
            if let Some(g) = self.try_lock() {
                return Some(g);
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Second-chance idleness: `true` if untouched since the last call.
    pub(crate) fn take_idle(&self) -> bool {
        !self.touched.swap(false, Ordering::Relaxed)
    }
}

/// Exclusive access to a cell's writer; releases the lock when dropped,
/// after acting on flags set meanwhile.
pub(crate) struct CellGuard<'c> {
    cell: &'c WriterCell,
    /// Held through `in_use` (owner) rather than `taker`.
    owner: bool,
}

impl CellGuard<'_> {
    /// The writer.
    #[inline]
    pub(crate) fn inner(&mut self) -> &mut WriterInner {
        // SAFETY: a guard exists only while this thread holds the cell
        // (module docs: owner/taker exclusion), so no other reference to `inner` exists; the
        // returned borrow is tied to `&mut self`.
        unsafe { &mut *self.cell.inner.get() }
    }

    /// Pending flags (acquire: pairs with `request`).
    #[inline]
    pub(crate) fn flags(&self) -> u8 {
        self.cell.flags.load(Ordering::Acquire)
    }

    /// Clears `flag`.
    pub(crate) fn clear_flag(&self, flag: u8) {
        self.cell.flags.fetch_and(!flag, Ordering::AcqRel);
    }

    /// Acts on pending CLEAR requests (before writing).
    #[inline]
    pub(crate) fn apply_clear(&mut self) {
        if self.flags() & FLAG_CLEAR != 0 {
            self.clear_flag(FLAG_CLEAR);
            self.inner().clear_incremental_state();
        }
    }
}

impl Drop for CellGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.flags() & FLAG_FLUSH != 0 {
            self.clear_flag(FLAG_FLUSH);
            self.inner().flush();
        }
        if self.owner {
            self.cell.in_use.store(false, Ordering::Release);
        } else {
            self.cell.taker.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arbiter::BufferExhaustedPolicy;
    use crate::outbox::Outbox;
    use crate::shm::SharedMemory;
    use shmtrace_abi::layout::PageLayout;
    use std::sync::atomic::AtomicUsize;

    /// A cell of `mode` over a private 16 KiB SMB (no runtime involved).
    fn cell(mode: LockMode) -> Arc<WriterCell> {
        let shm = SharedMemory::heap(16 * 1024, 4096, false).expect("heap SMB");
        let arbiter = Arbiter::new(shm, PageLayout::Div1, Arc::new(Outbox::new()));
        let id = arbiter.alloc_writer_id().expect("writer id");
        let writer = TraceWriter::new(arbiter.writer_arbiter(BufferExhaustedPolicy::Drop), id, 1)
            .expect("writer");
        Arc::new(WriterCell::with_mode(writer, arbiter, mode))
    }

    /// An owner thread locking for every "event" and two taker threads
    /// trying (and bounded-waiting for) the same cell are never inside at
    /// the same time, and both sides get in.
    fn owner_and_takers_exclude_each_other(mode: LockMode) {
        let cell = cell(mode);
        assert_eq!(cell.mode, mode);
        let inside = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let enter = |inside: &AtomicUsize| {
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            for _ in 0..20 {
                std::hint::spin_loop();
            }
            inside.fetch_sub(1, Ordering::SeqCst);
        };
        let got = Arc::new(AtomicUsize::new(0));
        let takers: Vec<_> = (0..2)
            .map(|which| {
                let (cell, inside, done, got) =
                    (cell.clone(), inside.clone(), done.clone(), got.clone());
                std::thread::spawn(move || {
                    while !done.load(Ordering::Relaxed) {
                        let g = if which == 0 {
                            cell.try_lock()
                        } else {
                            cell.lock_bounded(Duration::from_micros(50))
                        };
                        if let Some(g) = g {
                            enter(&inside);
                            drop(g);
                            got.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        // At least 5000 owner locks, and until the takers got in 200 times
        // (bounded: a loaded machine may starve them for a while).
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut owner = 0u64;
        while owner < 5_000 || (got.load(Ordering::Relaxed) < 200 && Instant::now() < deadline) {
            let g = cell.lock_owner();
            enter(&inside);
            drop(g);
            owner += 1;
        }
        done.store(true, Ordering::Relaxed);
        for h in takers {
            // A taker's failed exclusion assertion resurfaces here.
            h.join().expect("taker thread");
        }
        assert!(got.load(Ordering::Relaxed) >= 200, "takers got in");
    }

    /// The mode this host uses (membarrier where the kernel offers it).
    #[test]
    fn cell_lock_excludes_owner_and_takers_host_mode() {
        owner_and_takers_exclude_each_other(lock_mode());
    }

    /// The fallback without membarrier, whatever this host offers.
    #[test]
    fn cell_lock_excludes_owner_and_takers_symmetric() {
        owner_and_takers_exclude_each_other(LockMode::Symmetric);
    }
}
