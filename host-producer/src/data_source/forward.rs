//! Forwarding finished chunks written elsewhere: a firmware behind a
//! bridge, a relay, an importer. Their packets already sit in SMB chunks
//! (8-byte header + fragments, Perfetto SMB ABI v1, written by some other
//! `TraceWriter`); a [`ChunkForwarder`] copies each one into this
//! producer's shared memory, under a writer id of this producer, and
//! commits it to the target buffer of every started instance of its data
//! source through the same outbox and `CommitData` path as the producer's
//! own writers. Patches for those chunks follow the same way.
//!
//! ```no_run
//! use shmtrace_producer::{ChunkForwarder, DataSourceOptions, NoopHandler, ProducerConfig};
//! shmtrace_producer::init(ProducerConfig::default()).unwrap();
//! // The name comes from the firmware, at run time.
//! let fw = ChunkForwarder::register("mcu.events", DataSourceOptions::default(), NoopHandler).unwrap();
//! let mut seq = fw.new_sequence(); // one per firmware writer and boot
//! # let chunk_bytes: Vec<u8> = Vec::new();
//! let report = seq.forward_chunk(&chunk_bytes);
//! # let _ = report;
//! ```
//!
//! # Sequences and lanes
//!
//! A [`ForwardedSequence`] is one packet sequence of the source (one
//! writer of one firmware boot). Into each started instance it is copied
//! as a *lane*: a writer id allocated from the producer's own allocator
//! (so it never clashes with the process's writers) and registered
//! (`RegisterTraceWriter`) before its first chunk, chunk ids counted from
//! 0 and contiguous. Chunk ids are the forwarder's, not the source's: a
//! lane starts whenever a session starts, usually in the middle of the
//! source's sequence, and the service must not see a hole (Perfetto's
//! buffer parks a sequence at a hole in its chunk ids; ours reports a gap
//! for a sequence that does not start at chunk 0). Packet counts and flags
//! are the source's, changed only as described below. Patches name the
//! source's chunk id and are mapped onto the lane's.
//!
//! # What is rewritten, and why
//!
//! * A lane's first chunk gets a *start packet* prepended: the sequence's
//!   injected packet ([`ForwardedSequence::set_injected_packet`], e.g. a
//!   clock snapshot its later packets need) plus
//!   `first_packet_on_sequence = true`.
//! * A first fragment that continues a packet whose beginning this lane
//!   never forwarded is dropped (and the chunk's
//!   `FirstPacketContinuesFromPrevChunk` cleared); a chunk holding nothing
//!   but such a piece is not forwarded.
//! * A loss (a source chunk id that does not follow the previous one, a
//!   copy this lane dropped for want of room or size, a packet the source
//!   never continued) is marked: a packet `previous_packet_dropped = 1` is
//!   prepended to the lane's next chunk, as a producer marks its own drops
//!   (readers then know the sequence's incremental state is gone until
//!   the source resets it). A lane's start counts as such a loss when the
//!   first packet it forwards that sets `sequence_flags` needs the
//!   incremental state instead of clearing it: the source wrote it before
//!   it saw the session's clear, with interned data the lane never had.
//!   If the loss left a packet open (its chunk said
//!   it goes on), the lane gets a new writer (the old one unregistered)
//!   whose start packet is followed by the loss mark: Perfetto's buffer
//!   would wait for that packet's continuation forever.
//! * After [`ForwardedSequence::set_injected_packet`] the packet is also
//!   put into every existing lane once, as an extra fragment: prepended
//!   when the chunk's first fragment starts a packet (patch offsets for
//!   that chunk then shift by the inserted length), else appended after
//!   its last fragment when that one is a whole packet (no
//!   `LastPacketContinuesOnNextChunk`, no `ChunkNeedsPatching`, no drop
//!   sentinel), else inserted after the first fragment when a packet
//!   starts after it (the patches of the bytes after it shift), else in
//!   the next chunk (a chunk of one fragment that continues a packet and
//!   does not end as a whole packet).
//!   Before rather than after: a clock
//!   snapshot stated at time T must come before the packets stamped after
//!   T, and the chunk that follows its statement may hold some (a reader
//!   converts a time through the latest snapshot at or before it, among
//!   those read so far; packets after the snapshot stamped before T keep
//!   the earlier one). Appended, a new relation would start at the chunk
//!   boundary instead of at T, and a step back in it would reorder the
//!   packets around that boundary: a slice open across it would end
//!   before it began.
//!
//! # Limits
//!
//! A forwarded chunk (trimmed after its last fragment) plus an injected
//! fragment must fit one chunk of this producer's SMB, i.e. one page less
//! the page and chunk headers: 4088 bytes with the default 4 KiB pages
//! ([`ProducerConfig::shmem_page_size_hint_bytes`](crate::ProducerConfig::shmem_page_size_hint_bytes)
//! asks the service for larger pages). A chunk that fits only without its
//! injection is forwarded without it (the injection waits for the next
//! chunk); a chunk that does not fit at all is dropped and counted. Each
//! copy takes the smallest chunk size of the page layouts that holds it
//! (pages are partitioned per page).
//!
//! Everything is counted ([`ChunkForwarder::stats`]). Nothing a source
//! writes can make this module panic: each chunk is parsed with the abi
//! reader before anything is copied.
//!
//! # Flush, stop, clear
//!
//! Forwarded chunks are committed at once (nothing is held back), so a
//! flush's acknowledgement follows every chunk forwarded before the
//! handler's [`on_flush`](crate::DataSourceHandler::on_flush) returned:
//! a forwarder pushes what it has from there. On stop the instance's lanes
//! are unregistered after the handler's `on_stop`. `ClearIncrementalState`
//! reaches the handler's
//! [`on_clear_incremental_state`](crate::DataSourceHandler::on_clear_incremental_state):
//! only the source can re-emit its state.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shmtrace_abi::layout::{
    ChunkFlags, ChunkHeaderRepr, Packets, CHUNK_HEADER_SIZE, MAX_PACKET_COUNT,
};
use shmtrace_abi::proto::encode_to_slice;
use shmtrace_abi::proto::wire::{put_varint, MAX_VARINT_LEN};
use shmtrace_abi::reader::{ChunkError, FragmentEvent, Fragments};
use shmtrace_abi::trace::{data_loss, trace_packet};

use crate::connection::outbox::{ChunkToPatch, Outgoing, PatchEntry};
use crate::data_source::registry::registry;
use crate::data_source::{
    DataSourceHandler, DataSourceOptions, DataSourceType, Instance, InstanceArgs, SetupArgs,
};
use crate::error::RegisterError;
use crate::smb::arbiter::BufferExhaustedPolicy;

/// Largest packet [`ForwardedSequence::set_injected_packet`] takes.
pub const MAX_INJECTED_PACKET: usize = 1024;

/// Source chunks per lane whose mapping is kept for their patches (patches
/// follow their chunk closely: a writer sends them when the packet
/// spanning the chunk ends).
const PATCHABLE_CHUNKS: usize = 64;

/// Counters of one [`ChunkForwarder`] (monotonic). A chunk forwarded into
/// two sessions counts twice in the per-copy counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForwardStats {
    /// Chunks handed to [`ForwardedSequence::forward_chunk`].
    pub chunks_received: u64,
    /// Copies committed to a session's buffer.
    pub chunks_forwarded: u64,
    /// Chunks dropped because no session had the data source started.
    pub chunks_no_session: u64,
    /// Chunks dropped because they do not parse (header or fragments).
    pub chunks_invalid: u64,
    /// Copies dropped because the chunk does not fit a page of the SMB.
    pub chunks_too_big: u64,
    /// Copies dropped because no chunk of the needed size was free (after
    /// the data source's buffer-exhausted policy waited, if it does).
    pub chunks_no_room: u64,
    /// Copies dropped because every writer id was in use.
    pub chunks_no_writer_id: u64,
    /// Copies lost after being written (a peer broke the SMB's page header).
    pub chunks_lost: u64,
    /// Chunks with nothing to forward into a lane: only the middle of a
    /// packet whose beginning the lane never had.
    pub chunks_skipped: u64,
    /// Leading fragments dropped because the lane never had the beginning
    /// of their packet (a session started, or a lane restarted, mid-packet).
    pub orphan_fragments_dropped: u64,
    /// Losses marked in a lane (`previous_packet_dropped` on its next
    /// packet): a hole in the source's chunk ids, a copy dropped, a packet
    /// the source never continued.
    pub losses_marked: u64,
    /// Lanes that got a new writer because a loss left a packet open.
    pub lanes_restarted: u64,
    /// Packets placed into chunks: start packets, loss marks, injections.
    pub packets_injected: u64,
    /// Lanes whose first chunk could not take their start packet (its
    /// fragment count was at the maximum, or it filled a whole page).
    pub start_packets_missed: u64,
    /// Patches forwarded.
    pub patches_forwarded: u64,
    /// Patches dropped: their chunk was never forwarded, is too old, or
    /// they point into a dropped fragment.
    pub patches_dropped: u64,
}

#[derive(Default)]
struct Counters {
    chunks_received: AtomicU64,
    chunks_forwarded: AtomicU64,
    chunks_no_session: AtomicU64,
    chunks_invalid: AtomicU64,
    chunks_too_big: AtomicU64,
    chunks_no_room: AtomicU64,
    chunks_no_writer_id: AtomicU64,
    chunks_lost: AtomicU64,
    chunks_skipped: AtomicU64,
    orphan_fragments_dropped: AtomicU64,
    losses_marked: AtomicU64,
    lanes_restarted: AtomicU64,
    packets_injected: AtomicU64,
    start_packets_missed: AtomicU64,
    patches_forwarded: AtomicU64,
    patches_dropped: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> ForwardStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ForwardStats {
            chunks_received: l(&self.chunks_received),
            chunks_forwarded: l(&self.chunks_forwarded),
            chunks_no_session: l(&self.chunks_no_session),
            chunks_invalid: l(&self.chunks_invalid),
            chunks_too_big: l(&self.chunks_too_big),
            chunks_no_room: l(&self.chunks_no_room),
            chunks_no_writer_id: l(&self.chunks_no_writer_id),
            chunks_lost: l(&self.chunks_lost),
            chunks_skipped: l(&self.chunks_skipped),
            orphan_fragments_dropped: l(&self.orphan_fragments_dropped),
            losses_marked: l(&self.losses_marked),
            lanes_restarted: l(&self.lanes_restarted),
            packets_injected: l(&self.packets_injected),
            start_packets_missed: l(&self.start_packets_missed),
            patches_forwarded: l(&self.patches_forwarded),
            patches_dropped: l(&self.patches_dropped),
        }
    }
}

/// Why [`ForwardedSequence::forward_chunk`] forwarded nothing at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    /// The chunk does not parse.
    #[error("invalid chunk: {0}")]
    Invalid(ChunkError),
    /// No session has the data source started.
    #[error("no session has the data source started")]
    NoSession,
}

/// What [`ForwardedSequence::forward_chunk`] did with a chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forwarded {
    /// Sessions (instances) that got a copy.
    pub copies: usize,
    /// Sessions whose copy was dropped (see [`ForwardStats`] for why).
    pub dropped: usize,
    /// Sessions where the chunk had nothing to forward (see
    /// [`ForwardStats::chunks_skipped`]).
    pub skipped: usize,
}

/// One patch for a forwarded chunk, as the source's writer produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardPatch {
    /// Offset from the start of the source chunk's payload.
    pub offset: u32,
    /// The 4 bytes to write there.
    pub data: [u8; 4],
}

/// The forwarder's side of a data source: its lanes, by sequence.
struct Shared {
    ty: Mutex<Option<Arc<DataSourceType>>>,
    lanes: Mutex<HashMap<u64, Vec<Lane>>>,
    counters: Counters,
    next_sequence: AtomicU64,
}

impl Shared {
    fn lanes(&self) -> MutexGuard<'_, HashMap<u64, Vec<Lane>>> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ty(&self) -> Option<Arc<DataSourceType>> {
        self.ty.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Unregisters every lane of `instance` (it stopped).
    fn release_instance(&self, instance_id: u64) {
        let mut lanes = self.lanes();
        for list in lanes.values_mut() {
            list.retain(|l| {
                let keep = l.instance.id != instance_id;
                if !keep {
                    l.release();
                }
                keep
            });
        }
    }
}

/// Wraps the user's handler: lanes go when their instance stops.
struct ForwardingHandler<H> {
    user: H,
    shared: Arc<Shared>,
}

impl<H: DataSourceHandler> DataSourceHandler for ForwardingHandler<H> {
    fn on_setup(&self, args: &SetupArgs<'_>) {
        self.user.on_setup(args);
    }
    fn on_start(&self, args: &InstanceArgs<'_>) {
        self.user.on_start(args);
    }
    fn on_stop(&self, args: &InstanceArgs<'_>) {
        self.user.on_stop(args);
        self.shared.release_instance(args.instance_id);
    }
    fn on_flush(&self, args: &InstanceArgs<'_>) {
        self.user.on_flush(args);
    }
    fn on_clear_incremental_state(&self, args: &InstanceArgs<'_>) {
        self.user.on_clear_incremental_state(args);
    }
}

/// A data source whose chunks are written elsewhere and forwarded whole.
/// See the module docs.
#[derive(Clone)]
pub struct ChunkForwarder {
    ty: Arc<DataSourceType>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ChunkForwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkForwarder")
            .field("name", &self.ty.name)
            .finish()
    }
}

impl ChunkForwarder {
    /// Registers data source `name` (known only at run time: a firmware
    /// names its own) for forwarded chunks. `handler` learns about setup,
    /// start, stop, flush and `ClearIncrementalState`; `options` are those
    /// of any data source (its buffer-exhausted policy decides whether a
    /// forward waits for a free chunk). `name` may be `track_event` (a
    /// firmware's track events, recorded by a plain track event config) in
    /// a program that registers no track event categories itself.
    pub fn register(
        name: &str,
        options: DataSourceOptions,
        handler: impl DataSourceHandler,
    ) -> Result<Self, RegisterError> {
        let shared = Arc::new(Shared {
            ty: Mutex::new(None),
            lanes: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            next_sequence: AtomicU64::new(1),
        });
        let handler = ForwardingHandler {
            user: handler,
            shared: shared.clone(),
        };
        let ty = registry().register(name, options, Arc::new(handler))?;
        *shared.ty.lock().unwrap_or_else(|e| e.into_inner()) = Some(ty.clone());
        Ok(ChunkForwarder { ty, shared })
    }

    /// The data source's name.
    pub fn name(&self) -> &str {
        &self.ty.name
    }

    /// Whether any session has the data source started.
    pub fn is_enabled(&self) -> bool {
        self.ty.enabled_mask() != 0
    }

    /// Sessions (instances) that have the data source started now.
    pub fn started_instances(&self) -> usize {
        live_instances(&self.ty).len()
    }

    /// A new sequence (one writer of the source, e.g. one firmware writer
    /// in one boot): never mixed with any other in the trace.
    pub fn new_sequence(&self) -> ForwardedSequence {
        let id = self.shared.next_sequence.fetch_add(1, Ordering::Relaxed);
        ForwardedSequence {
            id,
            shared: self.shared.clone(),
            inject: None,
        }
    }

    /// Sends everything committed so far to the service now, rather than
    /// after the sender's batching delay.
    pub fn flush(&self) {
        registry().outbox().kick();
    }

    /// The forwarder's counters.
    pub fn stats(&self) -> ForwardStats {
        self.shared.counters.snapshot()
    }
}

/// Instances of `ty` that are started and not stopping.
fn live_instances(ty: &DataSourceType) -> Vec<Arc<Instance>> {
    ty.instances().into_iter().filter(|i| i.is_live()).collect()
}

/// Where a source chunk went in one lane, for its patches.
#[derive(Debug, Clone, Copy)]
struct Mapped {
    source_chunk: u32,
    writer_id: u16,
    chunk_id: u32,
    /// Bytes dropped at the start of the payload (an orphan fragment).
    stripped: u32,
    /// Bytes inserted at the start of the payload (a prepended packet).
    inserted: u32,
    /// Bytes inserted after the first fragment (at `middle_at` of the
    /// source payload): an injected packet.
    middle: u32,
    /// Where in the source payload `middle` went (the first fragment's end).
    middle_at: u32,
}

impl Mapped {
    /// Where the byte at `offset` of the source chunk's payload is in the
    /// copy; `None` if it was stripped.
    fn offset(&self, offset: u32) -> Option<u32> {
        let shift = if offset >= self.middle_at {
            self.middle
        } else {
            0
        };
        offset
            .checked_sub(self.stripped)?
            .checked_add(self.inserted)?
            .checked_add(shift)
    }
}

/// One sequence copied into one instance. See the module docs.
struct Lane {
    instance: Arc<Instance>,
    /// 0 when none could be allocated.
    writer_id: u16,
    next_chunk_id: u32,
    /// The last source chunk id this lane saw (forwarded or skipped).
    last_source: Option<u32>,
    /// The last forwarded chunk ends in a packet continued in the next.
    open_packet: bool,
    /// Something was forwarded (the start packet is behind us).
    started: bool,
    /// The lane lost a chunk (mark the loss at the next one).
    broken: bool,
    /// A loss is to be marked before the next packet.
    loss_pending: bool,
    /// No packet forwarded yet said how it uses the sequence's incremental
    /// state (see [`state_use`]).
    awaiting_state: bool,
    /// The sequence's injected packet is due in this lane.
    inject_due: bool,
    recent: VecDeque<Mapped>,
}

impl Lane {
    fn new(instance: Arc<Instance>, inject_due: bool) -> Self {
        Lane {
            instance,
            writer_id: 0,
            next_chunk_id: 0,
            last_source: None,
            open_packet: false,
            started: false,
            broken: false,
            loss_pending: false,
            awaiting_state: true,
            inject_due,
            recent: VecDeque::new(),
        }
    }

    /// Allocates and registers a writer id if the lane has none; `false`
    /// if every id is in use.
    fn ensure_writer(&mut self) -> bool {
        if self.writer_id != 0 {
            return true;
        }
        let arbiter = &self.instance.arbiter;
        let Some(id) = arbiter.alloc_writer_id() else {
            return false;
        };
        self.writer_id = id;
        arbiter.outbox().push(Outgoing::RegisterTraceWriter {
            writer_id: u32::from(id),
            target_buffer: self.instance.config.target_buffer,
        });
        true
    }

    /// Unregisters and frees the lane's writer id.
    fn release(&self) {
        if self.writer_id == 0 {
            return;
        }
        let arbiter = &self.instance.arbiter;
        if !arbiter.is_closed() {
            arbiter.outbox().push(Outgoing::UnregisterTraceWriter {
                writer_id: u32::from(self.writer_id),
            });
        }
        arbiter.free_writer_id(self.writer_id);
    }

    /// Ends the lane's current writer: the next chunk starts a new one.
    fn restart(&mut self) {
        self.release();
        self.writer_id = 0;
        self.next_chunk_id = 0;
        self.open_packet = false;
        self.started = false;
    }

    fn remember(&mut self, m: Mapped) {
        if self.recent.len() == PATCHABLE_CHUNKS {
            self.recent.pop_front();
        }
        self.recent.push_back(m);
    }

    /// Commits `patches` (offset into the source chunk's payload, bytes)
    /// for the source chunk `source_chunk` onto the lane's copy of it;
    /// how many went out, or `None` if the lane did not copy that chunk
    /// (or no longer remembers it). A patch whose bytes the lane stripped
    /// is dropped and counted.
    fn forward_patches(
        &self,
        source_chunk: u32,
        patches: impl Iterator<Item = (u32, [u8; 4])>,
        has_more: bool,
        c: &Counters,
    ) -> Option<usize> {
        let m = *self
            .recent
            .iter()
            .rev()
            .find(|m| m.source_chunk == source_chunk)?;
        let mut group = ChunkToPatch {
            target_buffer: self.instance.config.target_buffer,
            writer_id: u32::from(m.writer_id),
            chunk_id: m.chunk_id,
            patches: heapless::Vec::new(),
            has_more_patches: has_more,
        };
        let outbox = self.instance.arbiter.outbox();
        let mut sent = 0;
        for (offset, data) in patches {
            let Some(offset) = m.offset(offset) else {
                bump(&c.patches_dropped);
                continue;
            };
            let entry = PatchEntry { offset, data };
            if let Err(entry) = group.patches.push(entry) {
                let full = ChunkToPatch {
                    patches: std::mem::take(&mut group.patches),
                    has_more_patches: true,
                    ..group.clone()
                };
                outbox.commit_patches(full);
                let _ = group.patches.push(entry);
            }
            sent += 1;
        }
        if !group.patches.is_empty() {
            outbox.commit_patches(group);
        }
        Some(sent)
    }
}

/// How a packet uses its sequence's incremental state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateUse {
    /// It clears it (`SEQ_INCREMENTAL_STATE_CLEARED`).
    Clears,
    /// It needs it (`SEQ_NEEDS_INCREMENTAL_STATE`) without clearing it.
    Needs,
}

/// How the first packet that begins in `body` (`count` fragments, chunk
/// flags `flags`) and says anything of the incremental state uses it;
/// `None` if none says.
fn state_use(body: &[u8], count: u16, flags: ChunkFlags) -> Option<StateUse> {
    use shmtrace_abi::trace::sequence_flags::{
        SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE,
    };
    let packets = Packets::new(count, flags)?;
    for event in Fragments::new(body, packets) {
        let FragmentEvent::Data(f) = event.ok()? else {
            return None;
        };
        if f.continues_from_prev {
            continue;
        }
        let bits = packet_sequence_flags(f.data).unwrap_or(0);
        if bits & u64::from(SEQ_INCREMENTAL_STATE_CLEARED) != 0 {
            return Some(StateUse::Clears);
        }
        if bits & u64::from(SEQ_NEEDS_INCREMENTAL_STATE) != 0 {
            return Some(StateUse::Needs);
        }
    }
    None
}

/// `TracePacket.sequence_flags` of the packet that starts with `data` (as
/// far as its top-level fields read; `None` if it has none there).
fn packet_sequence_flags(data: &[u8]) -> Option<u64> {
    use shmtrace_abi::proto::wire::read_varint;
    let mut rest = data;
    let mut found = None;
    while !rest.is_empty() {
        let (key, n) = read_varint(rest).ok()?;
        rest = &rest[n..];
        let skip = match key & 7 {
            0 => {
                let (v, n) = read_varint(rest).ok()?;
                if key >> 3 == u64::from(trace_packet::SEQUENCE_FLAGS) {
                    found = Some(v);
                }
                n
            }
            1 => 8,
            5 => 4,
            2 => {
                let (len, n) = read_varint(rest).ok()?;
                n.checked_add(usize::try_from(len).ok()?)?
            }
            _ => return found,
        };
        rest = rest.get(skip..).unwrap_or_default();
    }
    found
}

/// A parsed source chunk.
struct Parsed<'a> {
    header: ChunkHeaderRepr,
    /// The payload up to the end of its last counted fragment.
    payload: &'a [u8],
    /// End of fragment 0 in `payload` (0 if there is none).
    first_end: usize,
    /// A drop sentinel ends the chunk (nothing after it is read).
    sentinel: bool,
}

impl<'a> Parsed<'a> {
    fn parse(chunk: &'a [u8]) -> Result<Self, ChunkError> {
        let (header, fragments) = Fragments::from_chunk(chunk)?;
        let full = &chunk[CHUNK_HEADER_SIZE..];
        let mut fragments = fragments;
        let mut end = None;
        for f in fragments.by_ref() {
            if let FragmentEvent::Dropped(d) = f? {
                // The sentinel is the 4-byte size field `FF FF FF 7F`.
                end = Some(d.offset + 4);
            }
        }
        let sentinel = end.is_some();
        let end = end.unwrap_or_else(|| fragments.consumed()).min(full.len());
        let count = header.packets.count();
        let first_end = if count == 0 {
            0
        } else {
            // Fragment 0 alone (padding included: its end is where the
            // iterator stands after it).
            let one = Packets::new(1, header.packets.flags()).unwrap_or(Packets::EMPTY);
            let mut first = Fragments::new(full, one);
            match first.next() {
                Some(Ok(FragmentEvent::Dropped(d))) => d.offset + 4,
                _ => first.consumed(),
            }
        };
        Ok(Parsed {
            header,
            payload: &full[..end],
            first_end: first_end.min(end),
            sentinel,
        })
    }

    fn flags(&self) -> ChunkFlags {
        self.header.packets.flags()
    }

    fn count(&self) -> u16 {
        self.header.packets.count()
    }
}

/// One sequence of the source. See the module docs.
pub struct ForwardedSequence {
    id: u64,
    shared: Arc<Shared>,
    inject: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for ForwardedSequence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardedSequence")
            .field("id", &self.id)
            .finish()
    }
}

/// Why a packet cannot be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an injected packet is {len} bytes, more than the {MAX_INJECTED_PACKET} allowed")]
pub struct InjectedTooLong {
    /// Its length.
    pub len: usize,
}

impl ForwardedSequence {
    /// Sets the packet (TracePacket bytes) every lane of this sequence
    /// carries in its start packet, and puts it into every existing lane
    /// once (module docs). A clock snapshot relating the source's clock to
    /// the host's is the reason this exists: packets stamped on the
    /// source's clock need it before them.
    pub fn set_injected_packet(&mut self, packet: &[u8]) -> Result<(), InjectedTooLong> {
        if packet.len() > MAX_INJECTED_PACKET {
            return Err(InjectedTooLong { len: packet.len() });
        }
        self.inject = Some(packet.into());
        if let Some(list) = self.shared.lanes().get_mut(&self.id) {
            for lane in list {
                lane.inject_due = true;
            }
        }
        Ok(())
    }

    /// Lanes (sessions) this sequence has now.
    pub fn lanes(&self) -> usize {
        self.shared.lanes().get(&self.id).map_or(0, Vec::len)
    }

    /// Forwards one whole chunk (8-byte header + payload, as the source's
    /// writer committed it; bytes after the last fragment are ignored)
    /// into every started instance. The header's writer id is ignored (the
    /// sequence is this object); its chunk id orders the chunks.
    pub fn forward_chunk(&mut self, chunk: &[u8]) -> Result<Forwarded, ForwardError> {
        let c = &self.shared.counters;
        bump(&c.chunks_received);
        let parsed = match Parsed::parse(chunk) {
            Ok(p) => p,
            Err(e) => {
                bump(&c.chunks_invalid);
                return Err(ForwardError::Invalid(e));
            }
        };
        let Some(ty) = self.shared.ty() else {
            bump(&c.chunks_no_session);
            return Err(ForwardError::NoSession);
        };
        let instances = live_instances(&ty);
        let mut all = self.shared.lanes();
        let lanes = all.entry(self.id).or_default();
        // Lanes of instances that stopped (or of an old connection) go.
        lanes.retain(|l| {
            let keep = instances.iter().any(|i| Arc::ptr_eq(i, &l.instance));
            if !keep {
                l.release();
            }
            keep
        });
        if instances.is_empty() {
            bump(&c.chunks_no_session);
            return Err(ForwardError::NoSession);
        }
        let mut out = Forwarded::default();
        for inst in instances {
            let lane = match lanes.iter().position(|l| Arc::ptr_eq(&l.instance, &inst)) {
                Some(i) => &mut lanes[i],
                None => {
                    lanes.push(Lane::new(inst, self.inject.is_some()));
                    let last = lanes.len() - 1;
                    &mut lanes[last]
                }
            };
            match forward_into(
                lane,
                &parsed,
                self.inject.as_deref(),
                lane.instance.policy,
                c,
            ) {
                Outcome::Done => out.copies += 1,
                Outcome::Dropped => out.dropped += 1,
                Outcome::Skipped => out.skipped += 1,
            }
        }
        Ok(out)
    }

    /// Forwards patches for the source chunk `source_chunk_id` of this
    /// sequence (`has_more`: more patches for it follow later) into every
    /// lane that forwarded it. Returns how many patches went out (counting
    /// each lane's copy).
    pub fn forward_patches(
        &mut self,
        source_chunk_id: u32,
        patches: &[ForwardPatch],
        has_more: bool,
    ) -> usize {
        let c = &self.shared.counters;
        let mut sent = 0;
        let mut matched = false;
        let mut all = self.shared.lanes();
        for lane in all.get_mut(&self.id).into_iter().flatten() {
            let patches = patches.iter().map(|p| (p.offset, p.data));
            if let Some(n) = lane.forward_patches(source_chunk_id, patches, has_more, c) {
                matched = true;
                sent += n;
            }
        }
        if !matched {
            c.patches_dropped
                .fetch_add(patches.len() as u64, Ordering::Relaxed);
        }
        c.patches_forwarded
            .fetch_add(sent as u64, Ordering::Relaxed);
        sent
    }
}

impl ForwardedSequence {
    /// Marks a loss at the end of this sequence's lanes: in each lane
    /// (of instance `instance_id`, or of every instance if `None`), one
    /// more chunk, the lane's next chunk id, holding one packet
    /// `previous_packet_dropped = 1` (after the start packet, if the lane
    /// forwarded nothing yet). For losses the source reports but never
    /// marks itself: a writer marks a drop on its next packet, and a drop
    /// that is the last thing it did has none. A lane whose last packet
    /// was left open gets a new writer first (module docs). Returns the
    /// lanes marked.
    pub fn mark_loss(&mut self, instance_id: Option<u64>) -> usize {
        let c = &self.shared.counters;
        let mut marked = 0;
        let mut all = self.shared.lanes();
        for lane in all.get_mut(&self.id).into_iter().flatten() {
            if instance_id.is_some_and(|id| id != lane.instance.id) || !lane.instance.is_live() {
                continue;
            }
            // An empty chunk that follows the last one the lane saw: no
            // gap, no orphan; the pending loss puts the mark in it.
            let last = lane.last_source;
            let empty = Parsed {
                header: ChunkHeaderRepr {
                    chunk_id: last.map_or(0, |l| l.wrapping_add(1)),
                    writer_id: 1,
                    packets: Packets::EMPTY,
                },
                payload: &[],
                first_end: 0,
                sentinel: false,
            };
            let was_pending = lane.loss_pending || lane.broken || lane.open_packet;
            lane.loss_pending = true;
            let policy = lane.instance.policy;
            let outcome = forward_into(lane, &empty, self.inject.as_deref(), policy, c);
            // The chunk was not the source's: its next chunk still follows
            // the last one it wrote.
            lane.last_source = last;
            if matches!(outcome, Outcome::Done) {
                marked += 1;
                if !was_pending {
                    bump(&c.losses_marked);
                }
            }
        }
        marked
    }
}

impl Drop for ForwardedSequence {
    fn drop(&mut self) {
        if let Some(list) = self.shared.lanes().remove(&self.id) {
            for lane in &list {
                lane.release();
            }
        }
    }
}

enum Outcome {
    Done,
    Dropped,
    Skipped,
}

/// One sequence of chunks copied into an instance as a lane of its own,
/// in order, as its writer committed them, over as many calls as the
/// chunks take to arrive: startup tracing's hand-over. The lane's writer
/// is unregistered when this drops.
pub(crate) struct SequenceCopy {
    lane: Lane,
    counters: Counters,
}

impl SequenceCopy {
    pub(crate) fn new(instance: &Arc<Instance>) -> Self {
        SequenceCopy {
            lane: Lane::new(instance.clone(), false),
            counters: Counters::default(),
        }
    }

    /// Copies the next `chunks` of the sequence: whether each was (waiting
    /// for a free chunk as `policy` allows); a chunk that does not parse
    /// is not.
    pub(crate) fn copy<'a>(
        &mut self,
        chunks: impl IntoIterator<Item = &'a [u8]>,
        policy: BufferExhaustedPolicy,
    ) -> Vec<bool> {
        chunks
            .into_iter()
            .map(|chunk| {
                Parsed::parse(chunk).is_ok_and(|parsed| {
                    !matches!(
                        forward_into(&mut self.lane, &parsed, None, policy, &self.counters),
                        Outcome::Dropped
                    )
                })
            })
            .collect()
    }

    /// Patches a chunk copied by an earlier [`Self::copy`] (its source
    /// chunk id); `false` if this copy does not know it.
    pub(crate) fn patch(&self, group: &ChunkToPatch) -> bool {
        let patches = group.patches.iter().map(|p| (p.offset, p.data));
        self.lane
            .forward_patches(
                group.chunk_id,
                patches,
                group.has_more_patches,
                &self.counters,
            )
            .is_some()
    }
}

impl Drop for SequenceCopy {
    fn drop(&mut self) {
        self.lane.release();
    }
}

/// The bytes of one fragment holding `packet`.
fn fragment(packet: &[u8]) -> Vec<u8> {
    let mut size = [0u8; MAX_VARINT_LEN];
    let n = put_varint(packet.len() as u64, &mut size);
    let mut out = Vec::with_capacity(n + packet.len());
    out.extend_from_slice(&size[..n]);
    out.extend_from_slice(packet);
    out
}

/// A packet of `inject`'s fields (if any) and one marker field: the
/// sequence's first packet (`first_packet_on_sequence`), or a loss before
/// it (`previous_packet_dropped`).
fn marked_packet(inject: Option<&[u8]>, loss: bool) -> Vec<u8> {
    let mut marker = [0u8; 16];
    let n = encode_to_slice(&mut marker, |p| {
        if loss {
            p.uint32(trace_packet::PREVIOUS_PACKET_DROPPED, data_loss::PRESENT);
        } else {
            p.bool(trace_packet::FIRST_PACKET_ON_SEQUENCE, true);
        }
    })
    .unwrap_or(0);
    let mut packet = inject.map(<[u8]>::to_vec).unwrap_or_default();
    packet.extend_from_slice(&marker[..n]);
    packet
}

fn forward_into(
    lane: &mut Lane,
    chunk: &Parsed<'_>,
    inject: Option<&[u8]>,
    policy: BufferExhaustedPolicy,
    c: &Counters,
) -> Outcome {
    let id = chunk.header.chunk_id;
    let flags = chunk.flags();
    let first_continues = flags.contains(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
    let gap = lane.last_source.is_some_and(|l| l.wrapping_add(1) != id);
    let dangling = lane.open_packet && !first_continues;
    if lane.broken || gap || dangling {
        // Something between the last chunk and this one was lost.
        if lane.started && lane.open_packet {
            // The packet left open would wait for a continuation forever
            // (Perfetto's buffer parks the sequence there): a new writer.
            lane.restart();
            bump(&c.lanes_restarted);
        }
        lane.broken = false;
        lane.loss_pending = true;
        bump(&c.losses_marked);
    }
    lane.last_source = Some(id);

    // The part of the payload to copy, and its header.
    let mut count = chunk.count();
    let mut flags = flags;
    let mut body = chunk.payload;
    let mut stripped = 0u32;
    if first_continues && !lane.open_packet && count > 0 {
        body = &body[chunk.first_end..];
        stripped = chunk.first_end as u32;
        count -= 1;
        flags = flags.difference(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
        bump(&c.orphan_fragments_dropped);
        if count == 0 {
            bump(&c.chunks_skipped);
            return Outcome::Skipped;
        }
    }
    // A lane starts in the middle of the source's sequence: if the first
    // packet that says how it uses the incremental state needs it rather
    // than clearing it (written before the source saw the session's clear),
    // its state is lost to this lane until the source clears it: marked.
    if lane.awaiting_state {
        match state_use(body, count, flags) {
            _ if lane.loss_pending => lane.awaiting_state = false,
            Some(StateUse::Needs) => {
                lane.awaiting_state = false;
                lane.loss_pending = true;
                bump(&c.losses_marked);
            }
            Some(StateUse::Clears) => lane.awaiting_state = false,
            None => {}
        }
    }
    let first_starts = !flags.contains(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
    let last_continues =
        !chunk.sentinel && flags.contains(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK);
    let whole_last =
        !last_continues && !chunk.sentinel && !flags.contains(ChunkFlags::CHUNK_NEEDS_PATCHING);

    // Extra fragments: before the body, the start packet of a new lane and
    // the mark of a loss (the injected packet rides on the first of them);
    // else a due injection alone, before the body (or after it, if the
    // first fragment continues a packet; see the module docs).
    let due = if lane.inject_due { inject } else { None };
    let (mut with_inject, mut with_loss) = (false, false);
    let mut pre: Vec<Vec<u8>> = Vec::new();
    let mut middle = None;
    let mut post = None;
    if first_starts {
        if !lane.started {
            pre.push(fragment(&marked_packet(inject, false)));
            with_inject = inject.is_some();
        }
        if lane.loss_pending {
            let carried = due.filter(|_| !with_inject);
            pre.push(fragment(&marked_packet(carried, true)));
            with_inject |= carried.is_some();
            with_loss = true;
        }
    }
    if let Some(packet) = due.filter(|_| !with_inject) {
        if first_starts {
            pre.push(fragment(packet));
            with_inject = true;
        } else if whole_last {
            post = Some(fragment(packet));
            with_inject = true;
        } else if count >= 2 && !chunk.sentinel {
            // A packet starts after the first fragment (which ends the
            // one continued from the previous chunk).
            middle = Some(fragment(packet));
            with_inject = true;
        }
    }
    let arbiter = lane.instance.arbiter.clone();
    let base = CHUNK_HEADER_SIZE + body.len();
    if arbiter.layout_for(base).is_none() {
        bump(&c.chunks_too_big);
        lane.broken = true;
        return Outcome::Dropped;
    }
    let extra_len: usize = pre.iter().chain(&middle).chain(&post).map(Vec::len).sum();
    let extra_count = pre.len() + usize::from(middle.is_some()) + usize::from(post.is_some());
    let fits = usize::from(count) + extra_count <= usize::from(MAX_PACKET_COUNT)
        && arbiter.layout_for(base + extra_len).is_some();
    if !fits {
        // Forwarded as it is; what was due stays due (a start packet
        // cannot come later: that one is counted as missed).
        if !lane.started {
            bump(&c.start_packets_missed);
        }
        pre.clear();
        middle = None;
        post = None;
        with_inject = false;
        with_loss = false;
    }
    if !lane.ensure_writer() {
        bump(&c.chunks_no_writer_id);
        lane.broken = true;
        return Outcome::Dropped;
    }
    let inserted: usize = pre.iter().map(Vec::len).sum();
    let added = pre.len() + usize::from(middle.is_some()) + usize::from(post.is_some());
    let total = base
        + pre
            .iter()
            .chain(&middle)
            .chain(&post)
            .map(Vec::len)
            .sum::<usize>();
    let Some(packets) = u16::try_from(added)
        .ok()
        .and_then(|a| Packets::new(count + a, flags))
    else {
        // Unreachable: the count was checked against the maximum above.
        bump(&c.chunks_invalid);
        return Outcome::Dropped;
    };
    let header = ChunkHeaderRepr {
        chunk_id: lane.next_chunk_id,
        writer_id: lane.writer_id,
        packets,
    };
    let Some(mut out) = acquire(&arbiter, total, header, policy) else {
        bump(&c.chunks_no_room);
        lane.broken = true;
        return Outcome::Dropped;
    };
    // `middle` goes after the first fragment (no bytes were stripped
    // then: the first fragment continues a packet this lane has open).
    let (head, tail) = match &middle {
        Some(_) => body.split_at(chunk.first_end),
        None => (body, &[][..]),
    };
    let mut at = 0;
    for part in pre
        .iter()
        .map(Vec::as_slice)
        .chain([head])
        .chain(middle.as_deref())
        .chain([tail])
        .chain(post.as_deref())
    {
        let _ = out.write(at, part);
        at += part.len();
    }
    if !arbiter.commit(out, lane.instance.config.target_buffer) {
        bump(&c.chunks_lost);
        lane.broken = true;
        return Outcome::Dropped;
    }
    bump(&c.chunks_forwarded);
    c.packets_injected
        .fetch_add(added as u64, Ordering::Relaxed);
    if with_inject {
        lane.inject_due = false;
    }
    if with_loss {
        lane.loss_pending = false;
    }
    lane.remember(Mapped {
        source_chunk: id,
        writer_id: lane.writer_id,
        chunk_id: lane.next_chunk_id,
        stripped,
        inserted: inserted as u32,
        middle: middle.as_ref().map_or(0, |m| m.len() as u32),
        middle_at: chunk.first_end as u32,
    });
    lane.next_chunk_id = lane.next_chunk_id.wrapping_add(1);
    lane.started = true;
    lane.open_packet = last_continues;
    Outcome::Done
}

/// A chunk of at least `size` bytes, waiting for one as `policy` allows
/// (never on the producer's own threads).
fn acquire(
    arbiter: &crate::smb::arbiter::Arbiter,
    size: usize,
    header: ChunkHeaderRepr,
    policy: BufferExhaustedPolicy,
) -> Option<shmtrace_abi::smb::WritableChunk<'_>> {
    if let Some(c) = arbiter.acquire_chunk_of(size, header) {
        return Some(c);
    }
    arbiter.outbox().kick();
    let BufferExhaustedPolicy::StallThenDrop(limit) = policy else {
        return None;
    };
    if crate::smb::arbiter::stalls_forbidden() {
        return None;
    }
    let deadline = Instant::now() + limit;
    let mut sleep = Duration::from_micros(100);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || arbiter.is_closed() {
            return None;
        }
        std::thread::sleep(sleep.min(left));
        sleep = (sleep * 2).min(Duration::from_millis(10));
        if let Some(c) = arbiter.acquire_chunk_of(size, header) {
            return Some(c);
        }
        arbiter.outbox().kick();
    }
}
