//! Startup tracing: track events written before any session reaches the
//! program (the service is not connected yet, or has not started our data
//! source yet) are kept in a bounded local buffer and handed to the first
//! session that starts track events, or dropped and counted when none does
//! in time. Perfetto's SDK has the same feature
//! (`Tracing::SetupStartupTracing`: a placeholder target buffer, a
//! timeout of 10 s by default, aborted data discarded).
//!
//! # How
//!
//! The buffer is a private, heap-allocated SMB with an arbiter of its own
//! whose outbox is never sent: [`begin`] sets up and starts a *startup
//! instance* of the track event data source on it, in one of the
//! [`MAX_INSTANCES`](crate::MAX_INSTANCES) slots, with the categories of
//! [`StartupTracing::categories`]. Events take the ordinary fast path into
//! ordinary writers (one sequence per thread); a full buffer drops packets
//! and marks the loss, as a full SMB does.
//!
//! When a session's `StartDataSource` for track events arrives, it *adopts*
//! the startup instance if its category filter enables every category the
//! startup instance enabled (it never receives events it did not ask for):
//!
//! 1. the session's instance is started in place of the startup instance:
//!    every category's enabled bits and the data source's slot mask change
//!    from the startup slot to the session's in one atomic store each, so
//!    an event goes to one of the two, never both, never neither;
//! 2. the startup instance stops: its writers flush their last chunks into
//!    the private buffer and retire;
//! 3. on the startup thread (the connection's threads may not wait for
//!    free chunks), the committed chunks are read out of the private SMB,
//!    their patches applied, and each writer's chunks copied in order into
//!    the session's SMB as a sequence of their own (`forward`'s lanes: a
//!    fresh writer id, chunk ids from 0), waiting for free chunks up to
//!    [`COPY_STALL`] each. The packets keep their own timestamps and
//!    incremental state (each sequence starts with a cleared state and a
//!    clock snapshot), so they land in the trace in order, before the
//!    session's own events of the same thread.
//!
//! [`crate::flush_all`] and the service's flushes wait (bounded) for a
//! hand-over in progress, so its chunks precede the acknowledgement.
//!
//! A stop waits only so long for a writer busy in an event. The startup
//! thread therefore waits on, without a deadline, for every writer still
//! busy when its instance stopped. When their events end, it copies their
//! last chunks into their sequences, and forwards the patches of chunks
//! it copied before (flushes do not wait for that: a flush acknowledged
//! meanwhile does not cover those chunks); if the session stopped first,
//! they are dropped and counted. Packets are never left in the private
//! buffer unseen.
//!
//! When no session adopts the buffer within [`StartupTracing::timeout`],
//! the startup instance stops and its packets are dropped and counted
//! ([`ProducerStats::startup_packets_dropped`](crate::ProducerStats::startup_packets_dropped));
//! a busy writer's, when its event ends.
//!
//! # Invariants
//!
//! * At most one startup instance exists at a time; it is either pending
//!   (in [`STATE`]), being handed over, or gone. Whoever takes it out of
//!   [`STATE`] (an adopting session or the timeout) alone stops it.
//! * The service cannot address the startup instance: its id
//!   ([`STARTUP_INSTANCE_ID`]) is skipped by the runtime's lookups, and a
//!   disconnection does not stop it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shmtrace_abi::layout::{
    ChunkFlags, ChunkHeaderRepr, Packets, PageLayout, PageSize, CHUNK_HEADER_SIZE,
};
use shmtrace_ipc::shm::SharedMemory;

use crate::connection::outbox::{ChunkToPatch, Outbox, Outgoing};
use crate::data_source::forward::SequenceCopy;
use crate::data_source::{
    busy_with, DataSourceConfig, DataSourceType, Instance, STARTUP_INSTANCE_ID,
};
use crate::error::ConnectError;
use crate::smb::arbiter::{Arbiter, BufferExhaustedPolicy};
use crate::smb::writer::{wait_deferred, WriterCell, FLAG_RETIRE};
use crate::stats::COUNTERS;
use crate::track_event::data_source::track_event_type;
use crate::track_event::filter::TrackEventConfig;

/// How long the copy into a session's SMB waits for each free chunk.
const COPY_STALL: Duration = Duration::from_secs(1);

/// The page size of the startup buffer.
const PAGE: PageSize = PageSize::DEFAULT;

/// How often the startup thread looks at writers still busy in an event
/// after its instance stopped.
const STRAGGLER_POLL: Duration = Duration::from_millis(10);

/// How tracing starts before a session reaches the program (see the module
/// docs). Set [`ProducerConfig::startup_tracing`](crate::ProducerConfig::startup_tracing)
/// to use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupTracing {
    /// Size of the local buffer in bytes (rounded up to 4 KiB pages; 1 MiB
    /// by default). Events that do not fit are dropped and counted.
    pub buffer_size: usize,
    /// How long the buffer waits for a session to adopt it (10 s by
    /// default, as Perfetto's SDK); then its events are dropped and
    /// counted.
    pub timeout: Duration,
    /// The categories traced meanwhile (by default those a session with an
    /// empty track event config enables: all but the ones tagged `slow` or
    /// `debug`; `tracing` targets and `log` targets are categories too).
    /// Only a session enabling all of them adopts the buffer; one that does
    /// not is logged with the categories it leaves out.
    pub categories: TrackEventConfig,
}

impl Default for StartupTracing {
    fn default() -> Self {
        StartupTracing {
            buffer_size: 1 << 20,
            timeout: Duration::from_secs(10),
            categories: TrackEventConfig::default(),
        }
    }
}

/// An adopted startup instance.
struct Handover {
    /// The startup instance, stopped.
    from: Arc<Instance>,
    /// The session's instance.
    to: Arc<Instance>,
    /// `from`'s writers busy in an event when it stopped.
    busy: Vec<Arc<WriterCell>>,
}

/// The startup instance waiting for a session.
struct Pending {
    instance: Arc<Instance>,
    deadline: Instant,
}

/// Where the startup buffer is.
#[derive(Default)]
struct State {
    pending: Option<Pending>,
    /// Adopted, for the startup thread to copy.
    handover: Option<Handover>,
    /// A hand-over is being copied (or waits to be).
    copying: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

static STATE: Shared = Shared {
    state: Mutex::new(State {
        pending: None,
        handover: None,
        copying: false,
    }),
    changed: Condvar::new(),
};

fn state() -> MutexGuard<'static, State> {
    STATE.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts startup tracing with `cfg` on `ty` (the track event data source),
/// chunks split as `layout`: events are recorded from now on. Does nothing
/// if a startup instance is already pending.
pub(crate) fn begin(
    ty: &DataSourceType,
    cfg: &StartupTracing,
    layout: PageLayout,
) -> Result<(), ConnectError> {
    let mut st = state();
    if st.pending.is_some() || st.copying {
        return Ok(());
    }
    let page = PAGE.get();
    let size = cfg.buffer_size.max(page).div_ceil(page) * page;
    let shm = SharedMemory::heap(size, PAGE).map_err(ConnectError::StartupBuffer)?;
    let outbox = Arc::new(Outbox::new());
    outbox.reserve(shm.smb().num_pages() * layout.num_chunks());
    let arbiter = Arbiter::new(shm, true, layout, outbox);
    let config = DataSourceConfig {
        name: crate::TRACK_EVENT_DATA_SOURCE.to_owned(),
        track_event_config: Some(cfg.categories.clone()),
        ..DataSourceConfig::default()
    };
    let Some(instance) = ty.setup(STARTUP_INSTANCE_ID, config, arbiter) else {
        log::warn!("shmtrace-producer: no free data source slot for startup tracing");
        return Ok(());
    };
    // The thread waits for the lock held here.
    if std::thread::Builder::new()
        .name("shmtrace-startup".into())
        .spawn(run)
        .is_err()
    {
        // Nothing was written yet: the instance never started.
        let _ = ty.stop(&instance);
        return Err(ConnectError::Thread);
    }
    ty.start(&instance);
    st.pending = Some(Pending {
        instance,
        deadline: Instant::now() + cfg.timeout,
    });
    Ok(())
}

/// `StartDataSource` of a track event instance (`false` for any other
/// type's): if a startup instance is
/// pending and `inst`'s filter enables all it enabled, `inst` starts in its
/// place and the buffer is handed over (module docs); `true` then.
pub(crate) fn adopt(ty: &DataSourceType, inst: &Arc<Instance>) -> bool {
    if !std::ptr::eq(ty, &**track_event_type()) {
        return false;
    }
    let mut st = state();
    let Some(pending) = &st.pending else {
        return false;
    };
    let filter = inst.config.track_event_config.clone().unwrap_or_default();
    let missing =
        crate::track_event::category::registry().not_covered(pending.instance.slot, &filter);
    if !missing.is_empty() {
        log::warn!(
            "shmtrace-producer: the session of data source instance {} does not take the startup \
             trace: it does not enable {} of the categories the startup trace records ({}{}); \
             the startup trace waits for another session, then is dropped and counted at its \
             timeout (set StartupTracing::categories to what your sessions enable)",
            inst.id,
            missing.len(),
            missing[..missing.len().min(5)].join(", "),
            if missing.len() > 5 { ", …" } else { "" }
        );
        return false;
    }
    let Some(pending) = st.pending.take() else {
        return false;
    };
    st.copying = true;
    drop(st);
    let busy = ty.start_replacing(inst, &pending.instance, || {
        crate::track_event::category::registry().move_filter(
            pending.instance.slot,
            inst.slot,
            filter,
        )
    });
    log::info!(
        "shmtrace-producer: the session of data source instance {} adopts the startup trace",
        inst.id
    );
    state().handover = Some(Handover {
        from: pending.instance,
        to: inst.clone(),
        busy,
    });
    STATE.changed.notify_all();
    true
}

/// Waits at most `timeout` for a hand-over in progress to be copied.
pub(crate) fn wait_handed_over(timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut st = state();
    while st.copying {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        st = STATE
            .changed
            .wait_timeout(st, left)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

/// The startup thread: copies a hand-over, or drops the buffer at its
/// deadline; then waits for the writers that were busy in an event when
/// the startup instance stopped, and copies or drops their last chunks
/// too; ends when nothing is left to do.
fn run() {
    loop {
        let mut st = state();
        if let Some(Handover { from, to, busy }) = st.handover.take() {
            drop(st);
            let mut copy = SessionCopy::new(&to);
            let (copied, dropped) = copy.chunks(&from.arbiter);
            count(copied, dropped);
            log::info!(
                "shmtrace-producer: startup trace handed over: {copied} packet(s), {dropped} dropped"
            );
            state().copying = false;
            STATE.changed.notify_all();
            if wait_for_stragglers(&busy) {
                let (copied, dropped) = copy.chunks(&from.arbiter);
                count(copied, dropped);
                log::info!(
                    "shmtrace-producer: startup trace: {copied} more packet(s) handed over once \
                     the events in progress ended, {dropped} dropped"
                );
            }
            return;
        }
        let Some(deadline) = st.pending.as_ref().map(|p| p.deadline) else {
            if !st.copying {
                return;
            }
            // Adopted, the hand-over not posted yet.
            let _ = STATE.changed.wait_timeout(st, Duration::from_millis(10));
            continue;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let Some(pending) = st.pending.take() else {
                continue;
            };
            drop(st);
            let busy = track_event_type().stop(&pending.instance);
            let dropped = drop_committed(&pending.instance.arbiter);
            log::info!(
                "shmtrace-producer: no session took the startup trace within its timeout: \
                 {dropped} packet(s) dropped"
            );
            STATE.changed.notify_all();
            if wait_for_stragglers(&busy) {
                drop_committed(&pending.instance.arbiter);
            }
            return;
        }
        let _ = STATE.changed.wait_timeout(st, left);
    }
}

/// Waits, without a deadline, until every writer of `busy` (busy in an
/// event when its instance stopped) has ended its event and committed its
/// last chunk; `false` if there were none.
fn wait_for_stragglers(busy: &[Arc<WriterCell>]) -> bool {
    if busy.is_empty() {
        return false;
    }
    // Most events end soon: look often at first, then every poll.
    if wait_deferred(busy, FLAG_RETIRE, Instant::now() + STRAGGLER_POLL) > 0 {
        let mut left = busy_with(busy, FLAG_RETIRE);
        while !left.is_empty() {
            std::thread::sleep(STRAGGLER_POLL);
            left = busy_with(&left, FLAG_RETIRE);
        }
    }
    true
}

/// Counts the packets committed to the startup buffer `arbiter` (since
/// the last look) as dropped; how many.
fn drop_committed(arbiter: &Arbiter) -> u64 {
    let (chunks, _) = drain(arbiter);
    let dropped = chunks.iter().map(|c| c.packets).sum();
    count(0, dropped);
    dropped
}

fn count(adopted: u64, dropped: u64) {
    COUNTERS
        .startup_packets_adopted
        .fetch_add(adopted, Ordering::Relaxed);
    COUNTERS
        .startup_packets_dropped
        .fetch_add(dropped, Ordering::Relaxed);
}

/// One chunk read out of the startup buffer.
struct Chunk {
    bytes: Vec<u8>,
    header: ChunkHeaderRepr,
    /// Packets that start in it.
    packets: u64,
}

/// Reads every chunk the (stopped) startup instance committed out of its
/// buffer, with their patches applied; the patches of chunks not found
/// are returned.
fn drain(arbiter: &Arbiter) -> (Vec<Chunk>, Vec<ChunkToPatch>) {
    let mut chunks = Vec::new();
    let mut patches = Vec::new();
    while let Some(msg) = arbiter.outbox().try_next() {
        let Outgoing::Commit(mut req) = msg else {
            continue;
        };
        arbiter.materialize(&mut req.chunks_to_move);
        for bytes in req.chunks_to_move.into_iter().filter_map(|c| c.data) {
            let Some(head) = bytes.first_chunk::<CHUNK_HEADER_SIZE>() else {
                continue;
            };
            let header = ChunkHeaderRepr::from_bytes(*head);
            let flags = header.packets.flags();
            let continued = flags.contains(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
            let packets = u64::from(header.packets.count()) - u64::from(continued);
            chunks.push(Chunk {
                bytes,
                header,
                packets,
            });
        }
        patches.extend(req.chunks_to_patch);
    }
    let unapplied = patches
        .into_iter()
        .filter(|group| !apply_patches(&mut chunks, group))
        .collect();
    (chunks, unapplied)
}

/// Applies `group` to its chunk; `false` if the chunk is not there.
fn apply_patches(chunks: &mut [Chunk], group: &ChunkToPatch) -> bool {
    let Some(chunk) = chunks.iter_mut().find(|c| {
        u32::from(c.header.writer_id) == group.writer_id && c.header.chunk_id == group.chunk_id
    }) else {
        return false;
    };
    for p in &group.patches {
        let at = CHUNK_HEADER_SIZE + p.offset as usize;
        if let Some(dst) = chunk.bytes.get_mut(at..at + p.data.len()) {
            dst.copy_from_slice(&p.data);
        }
    }
    if !group.has_more_patches {
        let flags = chunk
            .header
            .packets
            .flags()
            .difference(ChunkFlags::CHUNK_NEEDS_PATCHING);
        if let Some(packets) = Packets::new(chunk.header.packets.count(), flags) {
            chunk.header.packets = packets;
            chunk.bytes[..CHUNK_HEADER_SIZE].copy_from_slice(&chunk.header.to_bytes());
        }
    }
    true
}

/// The copy of a stopped startup instance's chunks into the adopting
/// session's SMB: one sequence per writer, kept for the chunks and patches
/// of writers that were busy at the stop.
struct SessionCopy {
    to: Arc<Instance>,
    sequences: BTreeMap<u16, SequenceCopy>,
}

impl SessionCopy {
    fn new(to: &Arc<Instance>) -> Self {
        SessionCopy {
            to: to.clone(),
            sequences: BTreeMap::new(),
        }
    }

    /// Copies what the startup buffer `from` committed since the last
    /// call, after forwarding the patches of chunks copied before (as
    /// their writer sent them: before its next chunks); (packets copied,
    /// packets dropped).
    fn chunks(&mut self, from: &Arbiter) -> (u64, u64) {
        let (chunks, patches) = drain(from);
        if self.to.state().stopped {
            // The session is gone (its buffer id may be another's by now):
            // nothing more goes there.
            self.sequences.clear();
            return (0, chunks.iter().map(|c| c.packets).sum());
        }
        for group in &patches {
            if let Some(sequence) = u16::try_from(group.writer_id)
                .ok()
                .and_then(|w| self.sequences.get(&w))
            {
                sequence.patch(group);
            }
        }
        let (mut copied, mut dropped) = (0, 0);
        let mut writers: Vec<u16> = chunks.iter().map(|c| c.header.writer_id).collect();
        writers.sort_unstable();
        writers.dedup();
        for writer in writers {
            let sequence: Vec<&Chunk> = chunks
                .iter()
                .filter(|c| c.header.writer_id == writer)
                .collect();
            let outcome = self
                .sequences
                .entry(writer)
                .or_insert_with(|| SequenceCopy::new(&self.to))
                .copy(
                    sequence.iter().map(|c| c.bytes.as_slice()),
                    BufferExhaustedPolicy::StallThenDrop(COPY_STALL),
                );
            for (chunk, ok) in sequence.iter().zip(outcome) {
                if ok {
                    copied += chunk.packets;
                } else {
                    dropped += chunk.packets;
                }
            }
        }
        self.to.arbiter.outbox().kick();
        (copied, dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::outbox::PatchEntry;

    fn chunk(writer_id: u16, chunk_id: u32, flags: ChunkFlags) -> Chunk {
        let header = ChunkHeaderRepr {
            chunk_id,
            writer_id,
            packets: Packets::new(2, flags).unwrap(),
        };
        let mut bytes = header.to_bytes().to_vec();
        bytes.extend_from_slice(&[0; 16]);
        Chunk {
            bytes,
            header,
            packets: 2,
        }
    }

    #[test]
    fn patches_are_applied_to_their_chunk_and_the_last_clears_the_flag() {
        let needs =
            ChunkFlags::CHUNK_NEEDS_PATCHING.union(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK);
        let mut chunks = vec![chunk(1, 0, needs), chunk(2, 0, needs)];
        let mut group = ChunkToPatch {
            target_buffer: 0,
            writer_id: 2,
            chunk_id: 0,
            patches: heapless::Vec::new(),
            has_more_patches: true,
        };
        group
            .patches
            .push(PatchEntry {
                offset: 4,
                data: [1, 2, 3, 4],
            })
            .unwrap();
        assert!(apply_patches(&mut chunks, &group));
        assert_eq!(chunks[1].bytes[12..16], [1, 2, 3, 4]);
        assert_eq!(
            chunks[0].bytes[12..16],
            [0; 4],
            "writer 1's chunk untouched"
        );
        let still = ChunkHeaderRepr::from_bytes(*chunks[1].bytes.first_chunk().unwrap());
        assert!(still
            .packets
            .flags()
            .contains(ChunkFlags::CHUNK_NEEDS_PATCHING));
        group.has_more_patches = false;
        group.patches[0].offset = 15; // past the end: ignored
        assert!(apply_patches(&mut chunks, &group));
        let done = ChunkHeaderRepr::from_bytes(*chunks[1].bytes.first_chunk().unwrap());
        assert_eq!(
            done.packets.flags(),
            ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK
        );
        assert_eq!(done.packets.count(), 2);
        group.chunk_id = 7;
        assert!(!apply_patches(&mut chunks, &group), "no such chunk");
    }
}
