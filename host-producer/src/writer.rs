//! Trace writers shared between their owner thread and the producer's
//! housekeeping (flush, stop, reclaiming chunks of idle threads).
//!
//! A [`WriterCell`] holds one sequence: an abi [`TraceWriter`] over the SMB
//! plus the track-event incremental state. Its owner thread uses it for
//! every event; other threads take it only to flush it.
//!
//! # Locking
//!
//! * `lock` is a try-lock (`swap(true, Acquire)` / `store(false,
//!   Release)`). The owner takes it for the duration of one packet group
//!   (an event and the state it depends on); others take it to flush. While
//!   it is held, the holder has exclusive access to `inner`.
//! * The owner never waits for anything while holding it except, under the
//!   stall policy, for free chunks (bounded); others wait for it only with a
//!   bound ([`WriterCell::lock_bounded`]), then leave a request in `flags`
//!   that the owner honours before releasing the lock next time.
//! * Nothing that holds a cell lock ever blocks on another cell's lock: a
//!   writer reclaiming chunks from other cells only *tries* their locks.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
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

/// One trace writer and its lock. See the module docs.
pub(crate) struct WriterCell {
    lock: AtomicBool,
    flags: AtomicU8,
    /// Set by the owner on every use, cleared by the idle sweep (second
    /// chance): a cell found untouched twice in a row is idle.
    touched: AtomicBool,
    writer_id: u16,
    inner: UnsafeCell<WriterInner>,
}

// SAFETY: `inner` is only accessed through a `CellGuard`, which exists only
// while `lock` is held by exactly one thread (see `try_lock`); everything
// else is atomics or immutable. `WriterInner` itself is `Send`.
unsafe impl Sync for WriterCell {}

impl WriterCell {
    pub(crate) fn new(writer: ProducerTraceWriter, arbiter: Arc<Arbiter>) -> Self {
        let writer_id = writer.writer_id();
        WriterCell {
            lock: AtomicBool::new(false),
            flags: AtomicU8::new(0),
            touched: AtomicBool::new(true),
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

    /// Takes the lock if it is free.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<CellGuard<'_>> {
        if self.lock.swap(true, Ordering::Acquire) {
            None
        } else {
            Some(CellGuard { cell: self })
        }
    }

    /// The owner's lock: spins (then yields) while a flusher holds it. A
    /// flusher holds it for one flush, so this terminates quickly.
    #[inline]
    pub(crate) fn lock_owner(&self) -> CellGuard<'_> {
        self.touched.store(true, Ordering::Relaxed);
        if let Some(g) = self.try_lock() {
            return g;
        }
        self.lock_slow()
    }

    #[cold]
    fn lock_slow(&self) -> CellGuard<'_> {
        let mut spins = 0u32;
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Waits at most `limit` for the lock.
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
}

impl CellGuard<'_> {
    /// The writer.
    #[inline]
    pub(crate) fn inner(&mut self) -> &mut WriterInner {
        // SAFETY: a guard exists only while this thread holds `lock`
        // (module docs), so no other reference to `inner` exists; the
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
        self.cell.lock.store(false, Ordering::Release);
    }
}
