//! Process-wide counters of what happens outside the shared memory's data
//! path (events dropped before they reached a writer, triggers, the startup
//! trace), and [`ProducerStats`], the snapshot of every counter the
//! producer keeps (the SMB data path's are the arbiter's).
//!
//! Every counter is monotonic over the process's life, across connections,
//! and updated with `Relaxed` adds: a snapshot is a set of independent
//! reads, not a consistent cut.

use std::sync::atomic::{AtomicU64, Ordering};

/// Snapshot of a producer's data-path counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Chunks handed to the service.
    pub chunks_committed: u64,
    /// Chunks that could not be handed over (a peer broke the SMB).
    pub chunks_lost: u64,
    /// Times a writer found no free chunk.
    pub acquire_failures: u64,
    /// Sleeps while stalling for a chunk.
    pub stalls: u64,
    /// Chunks taken back from idle writers.
    pub chunks_reclaimed: u64,
    /// Stalls abandoned early because every chunk was held by a writer.
    pub stalls_given_up: u64,
    /// Packets dropped (SMB full or otherwise); each loss is also marked in
    /// the trace with `previous_packet_dropped`.
    pub packets_dropped: u64,
    /// Shmem emulation (a TCP or vsock socket): chunks that did not reach
    /// the service because the `CommitData` holding them could not be sent
    /// within the IPC frame limit, because their bytes could not be read
    /// back for it, or because the connection ended while they were queued
    /// (or a writer returned them after it ended). Their packets are lost
    /// and not marked in the trace (the writer had moved on). None in a
    /// healthy producer on a healthy connection: requests are split to
    /// stay under the limit.
    pub emulated_chunks_dropped: u64,
    /// Slice ends not written because the begin of their slice was dropped
    /// (an end without its begin would close the wrong slice). Not in
    /// [`Self::packets_dropped`], and not marked in the trace (the loss of
    /// the begin is): an emitted slice that is missing from a trace shows
    /// up here and in `packets_dropped`, once each.
    pub orphan_ends_suppressed: u64,
    /// Slice ends lost (the buffer was full) after their begin was
    /// written, and never written later: a sequence writes such ends, at
    /// their times, before its next event or at a flush; these were still
    /// owed when the sequence ended (its session stopped, or its thread
    /// exited) with no room left to write them. Each leaves its slice open
    /// in the trace. Also in [`Self::packets_dropped`].
    pub slice_ends_lost: u64,
    /// Slice ends counted in [`Self::packets_dropped`] when the buffer was
    /// full, then written later all the same (at their own times, before
    /// the sequence's next event or at a flush): the trace holds them. So
    /// a trace holds the events emitted less `packets_dropped`,
    /// [`Self::orphan_ends_suppressed`], [`Self::reentrant_drops`] and
    /// [`Self::writerless_drops`], plus these.
    pub slice_ends_written_late: u64,
    /// Events and packets not written because they were emitted from
    /// inside another event or packet callback on the same thread (e.g. a
    /// `Debug` impl that traces): writing them would need the writer the
    /// outer call holds. Not marked in the trace.
    pub reentrant_drops: u64,
    /// Events and packets (one per session that enabled them) not written
    /// because the thread had no writer: emitted from a thread-local's
    /// destructor after this thread's writers were torn down, or while
    /// every writer id of the shared memory (32767) was in use. Not marked
    /// in the trace (the thread has no sequence to mark it on).
    pub writerless_drops: u64,
    /// Triggers ([`activate_triggers`](crate::activate_triggers)) not sent
    /// because their time to live ran out before a connection opened.
    pub triggers_expired: u64,
    /// Triggers not kept for a connection because
    /// [`MAX_PENDING_TRIGGERS`](crate::MAX_PENDING_TRIGGERS) already
    /// waited for one.
    pub triggers_dropped: u64,
    /// Packets written during startup tracing
    /// ([`StartupTracing`](crate::StartupTracing)) that a session adopted
    /// and that were copied into its shared memory.
    pub startup_packets_adopted: u64,
    /// Packets written during startup tracing that no session adopted
    /// within its timeout, or that the adopting session's shared memory
    /// had no room for. (Packets the startup buffer itself had no room
    /// for count in [`Self::packets_dropped`], as for any full buffer.)
    /// The startup buffer records until a session adopts it, also while a
    /// session that did not adopt it runs: events both enable reach that
    /// session too, and their startup copies count here as well.
    pub startup_packets_dropped: u64,
}

/// The counters outside the SMB data path (see the module docs).
#[derive(Debug)]
pub(crate) struct Counters {
    pub orphan_ends_suppressed: AtomicU64,
    pub slice_ends_lost: AtomicU64,
    pub slice_ends_written_late: AtomicU64,
    pub reentrant_drops: AtomicU64,
    pub writerless_drops: AtomicU64,
    pub triggers_expired: AtomicU64,
    pub triggers_dropped: AtomicU64,
    pub startup_packets_adopted: AtomicU64,
    pub startup_packets_dropped: AtomicU64,
}

/// This process's counters.
pub(crate) static COUNTERS: Counters = Counters {
    orphan_ends_suppressed: AtomicU64::new(0),
    slice_ends_lost: AtomicU64::new(0),
    slice_ends_written_late: AtomicU64::new(0),
    reentrant_drops: AtomicU64::new(0),
    writerless_drops: AtomicU64::new(0),
    triggers_expired: AtomicU64::new(0),
    triggers_dropped: AtomicU64::new(0),
    startup_packets_adopted: AtomicU64::new(0),
    startup_packets_dropped: AtomicU64::new(0),
};

impl Counters {
    /// Copies these counters into `stats`.
    pub(crate) fn read_into(&self, stats: &mut ProducerStats) {
        stats.orphan_ends_suppressed = self.orphan_ends_suppressed.load(Ordering::Relaxed);
        stats.slice_ends_lost = self.slice_ends_lost.load(Ordering::Relaxed);
        stats.slice_ends_written_late = self.slice_ends_written_late.load(Ordering::Relaxed);
        stats.reentrant_drops = self.reentrant_drops.load(Ordering::Relaxed);
        stats.writerless_drops = self.writerless_drops.load(Ordering::Relaxed);
        stats.triggers_expired = self.triggers_expired.load(Ordering::Relaxed);
        stats.triggers_dropped = self.triggers_dropped.load(Ordering::Relaxed);
        stats.startup_packets_adopted = self.startup_packets_adopted.load(Ordering::Relaxed);
        stats.startup_packets_dropped = self.startup_packets_dropped.load(Ordering::Relaxed);
    }
}

/// Counts a slice end that was not written because its slice's begin was
/// lost (the track event encoder calls it; see
/// [`ProducerStats::orphan_ends_suppressed`]).
pub(crate) fn note_orphan_end() {
    COUNTERS
        .orphan_ends_suppressed
        .fetch_add(1, Ordering::Relaxed);
}

/// Counts `n` slice ends lost for good (see
/// [`ProducerStats::slice_ends_lost`]).
pub(crate) fn note_slice_ends_lost(n: u64) {
    COUNTERS.slice_ends_lost.fetch_add(n, Ordering::Relaxed);
}

/// Counts a lost slice end written late after all (see
/// [`ProducerStats::slice_ends_written_late`]).
pub(crate) fn note_slice_end_written_late() {
    COUNTERS
        .slice_ends_written_late
        .fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphan_ends_are_counted() {
        let read = || {
            let mut s = ProducerStats::default();
            COUNTERS.read_into(&mut s);
            s.orphan_ends_suppressed
        };
        let before = read();
        note_orphan_end();
        note_orphan_end();
        // Other tests may add theirs concurrently: at least ours.
        assert!(read() >= before + 2);
    }
}
