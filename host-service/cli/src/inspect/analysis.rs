//! Replays the packets of a trace the way a trace processor does and
//! collects what they hold and what is wrong with them.
//!
//! Sequence semantics (Perfetto's):
//!
//! * Packets are grouped by `trusted_packet_sequence_id`; sequence 1 is the
//!   service's own.
//! * `SEQ_INCREMENTAL_STATE_CLEARED` (or the legacy
//!   `incremental_state_cleared`) resets a sequence's interning tables and
//!   packet defaults, and makes its incremental state valid. Clocks are not
//!   touched: a trace processor keeps every clock snapshot (see
//!   [`clocks`]).
//! * `previous_packet_dropped` on any but the first packet of a sequence
//!   marks a loss: the state is invalid until the next clear, and packets
//!   flagged `SEQ_NEEDS_INCREMENTAL_STATE` are skipped until then. (The
//!   service flags the first packet it reads of every sequence; that flag
//!   means nothing.)
//! * A sequence whose first packet lacks `first_packet_on_sequence` lost its
//!   start, unless no sequence of the trace sets that flag (SDKs before v29)
//!   and the first packet clears the incremental state.
//!
//! Machines (a trace of producers behind relays): a packet's `machine_id`
//! names the machine it came from; absent or 0 is the service's own
//! machine, the host (upstream's protos/perfetto/trace/trace_packet.proto;
//! a trace processor reads each other machine's packets apart,
//! src/trace_processor/importers/proto/proto_trace_reader.cc). A
//! sequence is one writer, so of one machine: a packet of it with another
//! machine's id is a trusted-fields problem. The service describes each
//! relayed machine in a `system_info` packet with its id (its name in
//! `machine_name`, when the relay gave one), and the host in one without;
//! only the latter describes the session's machine.
//!
//! Problems are only the ones no recorded loss explains: a SLICE_END with
//! nothing open, an interned id that does not resolve, a flow that is never
//! continued or terminates nothing, a counter on a track that is not a
//! counter, a timestamp that cannot be resolved (see below), a malformed or
//! cut packet, or evidence of lost data (a lost sequence start, skipped
//! packets) that neither a loss mark nor the buffer statistics record. On a
//! sequence with a loss mark, consequences of the loss are counted, not
//! reported. `inspect --check` fails on all of them but slice ends and
//! flows, which may be the cut at the trace's edges
//! ([`ProblemKind::may_be_edge_cut`]); `--check --strict` fails on those
//! too.
//!
//! A lost sequence start, exactly:
//!
//! * The start is lost if the first packet lacks `first_packet_on_sequence`
//!   (see above; in a trace without the flag, also if the sequence's buffer
//!   wrapped: its first surviving clear may be a periodic one). A sequence
//!   whose first packet is there but that needs incremental state it never
//!   cleared is a producer bug, whatever the statistics say.
//! * A lost start is explained if the service-wide loss statistics are
//!   non-zero, or those of the sequence's buffer (of any buffer, if the
//!   trace does not say which one the sequence wrote to).
//! * If the sequence's buffer wrapped (`chunks_overwritten` or
//!   `write_wrap_count` > 0), a RING buffer overwrote the sequence's oldest
//!   chunks, with its incremental-state clear and clock snapshots: the
//!   packets that need incremental state before the sequence's first
//!   surviving clear, and those stamped on a sequence-scoped clock before
//!   a surviving snapshot defines it or relates it to the trace clock, are
//!   counted as *unresolvable after ring wrap*, not as problems.
//! * Either way, only the consequences of the lost start are excused: slice
//!   ends whose begin was lost, and anything that fails before the
//!   sequence's first clear. An interned id that does not resolve after
//!   that clear is still a problem.
//!
//! Timestamps, as a trace processor resolves them ([`clocks`]:
//! a graph of every clock snapshot, sequence-scoped clocks per sequence,
//! conversions in several hops; it sorts events by time, so a sequence's
//! time may go back):
//!
//! * An absolute timestamp earlier than the latest one of its sequence is
//!   legal: the SDK writes an event given an explicit earlier time that
//!   way. It is counted (`out_of_order`), not reported. Only the
//!   sequence's own times are compared (the trace clock, sequence-scoped
//!   clocks); a time on another global clock (MONOTONIC, REALTIME) is
//!   placed on the timeline but compared with nothing.
//! * A timestamp on an incremental clock is a delta from that clock's last
//!   value (which every snapshot holding the clock sets). A negative delta
//!   (a value of 2^63 or more) is an impossible encoding and a problem; so
//!   is a timestamp on a clock no snapshot names, or that no chain of
//!   snapshots relates to the trace clock, and a snapshot a trace processor
//!   refuses (a clock redefined with another unit or incremental flag, the
//!   trace clock going back).
//! * Two snapshots of a sequence relating one of its sequence-scoped
//!   clocks to a global one (a firmware clock to BOOTTIME, as
//!   `shmtrace bridge` does) contradict each other when the offset between
//!   the two clocks moved by more than [`SNAPSHOT_STEP_NS`] and more than a
//!   tenth of the time between them: no two clocks that are both right
//!   drift that far apart, so the events around them are misplaced by that
//!   much (a relation measured 0.5 s off, then stated right).
//! * A timestamp is resolved when it is read: a clock must be related
//!   before the first packet stamped on it (a trace processor of today
//!   retries such packets at the end of the trace; older ones drop them).
//!   The packet that carries a snapshot has its own timestamp ignored, as
//!   a trace processor ignores it.
//! * After a loss mark and before the next clear, an incremental clock's
//!   last value is unknown (deltas were lost): its deltas are not resolved.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use prost::Message as _;
use prost_reflect::{DynamicMessage, Value as ReflectValue};
use serde::Serialize;

use super::clocks::{self, Clocks, ConvertError, SnapshotClock};
use super::remote_clocks::{self, Exchange};
use super::{compressed, kinds};
use crate::schema;
use crate::trace_file::PacketReader;
use shmtrace_ipc::protos::debug_annotation::{NameField as ArgName, Value as ArgValue};
use shmtrace_ipc::protos::trace_packet::{
    Data, OptionalTrustedPacketSequenceId, OptionalTrustedUid,
};
use shmtrace_ipc::protos::tracing_service_event::EventType as ServiceEventType;
use shmtrace_ipc::protos::track_descriptor::StaticOrDynamicName;
use shmtrace_ipc::protos::track_event::{CounterValueField, NameField, Type as EventType};
use shmtrace_ipc::protos::{
    self, ClockSnapshot, DataSourceConfig, DebugAnnotation, InternedData, TraceConfig, TracePacket,
    TracePacketDefaults, TraceStats, TrackDescriptor, TrackEvent, TrackEventConfig,
};

/// `trusted_packet_sequence_id` of the service's own packets.
pub const SERVICE_SEQUENCE_ID: u32 = 1;
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
const BOOTTIME: u32 = 6;
/// Problems kept per kind (all are counted).
const MAX_PROBLEMS_PER_KIND: usize = 50;
/// How far the offset between a sequence-scoped clock and a global one
/// may move between two snapshots of a sequence (and a tenth of the time
/// between them) before they contradict each other (module docs).
pub const SNAPSHOT_STEP_NS: u64 = 100_000_000;

/// Buffer statistics that mean data was lost, with what they mean.
pub const BUFFER_LOSS_STATS: &[(&str, &str)] = &[
    (
        "chunks_overwritten",
        "the ring buffer wrapped and overwrote data not yet read (a larger buffer (-b) keeps more)",
    ),
    (
        "chunks_discarded",
        "the buffer was full and new data was dropped (fill policy DISCARD)",
    ),
    (
        "trace_writer_packet_loss",
        "times a producer abandoned a packet mid-write because its shared memory was full (each lost one or more packets)",
    ),
    (
        "abi_violations",
        "producers wrote malformed chunks into shared memory",
    ),
    (
        "patches_failed",
        "size patches arrived for chunks that were already gone",
    ),
];

/// Buffer statistics that mean a RING buffer wrapped: its oldest chunks,
/// with the incremental-state clears in them, may be gone.
pub const RING_WRAP_STATS: &[&str] = &["chunks_overwritten", "write_wrap_count"];

/// Service-wide statistics that mean data was lost. `chunks_discarded`
/// and `patches_discarded` are the service's since it started, over all
/// its sessions (upstream's `TracingServiceImpl` keeps them so): the trace
/// alone cannot tell whether they are its own; `record` counts what they
/// grew by during its session.
pub const SERVICE_LOSS_STATS: &[(&str, &str)] = &[
    (
        "chunks_discarded",
        "producers committed chunks to buffers they may not write to (the service's count \
         since it started, over all its sessions)",
    ),
    (
        "patches_discarded",
        "producers sent patches for buffers they may not write to (the service's count since \
         it started, over all its sessions)",
    ),
    (
        "invalid_packets",
        "the service rejected packets that set fields only it may set",
    ),
    (
        "filter_stats.errors",
        "the session's trace filter dropped packets whole because they did not decode",
    ),
];

/// What kind of problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// A packet or the file itself does not decode.
    Malformed,
    /// A packet lacks the fields the service always sets.
    TrustedFields,
    /// A SLICE_END with no open slice on its track.
    Nesting,
    /// An interned id that does not resolve, or is redefined.
    Interning,
    /// A flow that is never continued, or terminates nothing.
    Flows,
    /// A counter event without a value or on a non-counter track.
    Counters,
    /// A timestamp that cannot be resolved (a negative delta on an
    /// incremental clock, a clock the sequence does not define or cannot
    /// convert), or a clock snapshot that a trace processor refuses or
    /// that contradicts the sequence's one before.
    Timestamps,
    /// Data is missing and nothing records a loss.
    UnmarkedLoss,
    /// Content `inspect` cannot read, so cannot check.
    Unsupported,
}

impl ProblemKind {
    /// Whether a problem of this kind may be no fault at all, only the cut
    /// at a trace's edges: a producer writes a slice's end, or a flow's
    /// next step, to the sessions enabled at that moment, so a slice begun
    /// or a flow started before the session began ends in it without its
    /// start, and one continued after it stopped is left open. Nothing in a
    /// trace tells these from a start lost without a trace, so plain
    /// `--check` counts them and `--check --strict` (for a trace that
    /// covers its producers' whole run) fails on them.
    pub fn may_be_edge_cut(self) -> bool {
        matches!(self, Self::Nesting | Self::Flows)
    }

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Malformed => "malformed data",
            Self::TrustedFields => "missing trusted fields",
            Self::Nesting => "broken slice nesting",
            Self::Interning => "unresolved interning",
            Self::Flows => "unpaired flows",
            Self::Counters => "bad counters",
            Self::Timestamps => "unresolvable timestamps or bad clock snapshots",
            Self::UnmarkedLoss => "unmarked data loss",
            Self::Unsupported => "content inspect cannot read",
        }
    }
}

/// One problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Its kind.
    pub kind: ProblemKind,
    /// What and where.
    pub message: String,
}

/// Everything found in a trace.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Analysis {
    /// The files read, in order.
    pub files: Vec<String>,
    /// Packets read (those inside `compressed_packets` batches, not the
    /// batches).
    pub packets: u64,
    /// Packet bytes (without the per-packet preamble; inflated).
    pub packet_bytes: u64,
    /// Per payload kind: packets and bytes.
    pub packets_by_kind: BTreeMap<String, KindCount>,
    /// About the session, from the service's packets.
    pub session: SessionInfo,
    /// Track events.
    pub track_events: TrackEventCounts,
    /// Described tracks and the events on them.
    pub tracks: Vec<TrackInfo>,
    /// Packet sequences (writers).
    pub sequences: Vec<SequenceInfo>,
    /// The machines of a trace with packets of other machines than the
    /// service's own (relayed producers): the host (id 0) first, then by
    /// id. Empty for a trace of one machine.
    pub machines: Vec<MachineInfo>,
    /// Clocks and the time span of the trace.
    pub clocks: ClockInfo,
    /// `compressed_packets` batches (their packets are analyzed and
    /// counted like the others).
    pub compression: CompressionInfo,
    /// Everything that records or shows lost data.
    pub loss: LossInfo,
    /// The last `trace_stats` packet, if any.
    pub stats: Option<StatsInfo>,
    /// Problems, up to a cap per kind.
    pub problems: Vec<Problem>,
    /// Problems per kind (complete counts).
    pub problem_counts: BTreeMap<ProblemKind, u64>,
}

impl Analysis {
    /// Whether `--check` passes: no problem but those that may be the cut
    /// at the trace's edges ([`ProblemKind::may_be_edge_cut`]).
    pub fn ok(&self) -> bool {
        self.problem_counts.keys().all(|k| k.may_be_edge_cut())
    }

    /// Whether `--check --strict` passes: no problem at all.
    pub fn ok_strict(&self) -> bool {
        self.problem_counts.is_empty()
    }

    /// Total problems.
    pub fn problem_total(&self) -> u64 {
        self.problem_counts.values().sum()
    }
}

/// `compressed_packets` batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CompressionInfo {
    /// Batches (`compressed_packets` packets).
    pub batches: u64,
    /// `zstd_compressed_packets` batches (not inflated: unsupported).
    pub zstd_batches: u64,
    /// Their compressed bytes.
    pub compressed_bytes: u64,
    /// What they inflated to.
    pub inflated_bytes: u64,
    /// The packets they held.
    pub packets: u64,
}

/// One machine of a multi-machine trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MachineInfo {
    /// `machine_id` (0: the service's own machine, the host).
    pub id: u32,
    /// `SystemInfo.machine_name` of its description (a relayed machine's,
    /// if its relay named it).
    pub name: Option<String>,
    /// `uname` from its description (sysname, release, machine).
    pub system: Option<String>,
    /// A `system_info` packet describes it.
    pub described: bool,
    /// Clock exchanges in its `remote_clock_sync` packets (a relayed
    /// machine's clocks are related to the host's through them).
    pub clock_exchanges: u64,
    /// How far its trace clock runs ahead of the host's (ns), from those
    /// exchanges as a trace processor computes it; `None` for the host, or
    /// without a round of exchanges.
    pub clock_offset_ns: Option<i64>,
    /// Producer packets with its id.
    pub packets: u64,
    /// Producer sequences of its packets.
    pub sequences: u64,
    /// Track events among its packets.
    pub track_events: u64,
}

impl MachineInfo {
    /// How reports name it: `host`, else its name, else its id.
    pub fn label(&self) -> String {
        match (&self.name, self.id) {
            (_, 0) => "host".to_owned(),
            (Some(name), _) => name.clone(),
            (None, id) => id.to_string(),
        }
    }
}

/// Packets and bytes of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KindCount {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// What the service's packets say about the session.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionInfo {
    /// `SystemInfo.tracing_service_version`.
    pub service_version: Option<String>,
    /// `uname` of the traced machine.
    pub system: Option<String>,
    /// The trace UUID.
    pub uuid: Option<String>,
    /// The session's config.
    pub config: Option<ConfigInfo>,
    /// Lifecycle events, in order of appearance, with counts.
    pub service_events: Vec<(String, u64)>,
    /// Triggers received.
    pub triggers: Vec<String>,
    /// Data sources the service reported slow to start or flush.
    pub slow_data_sources: Vec<String>,
}

/// The main facts of the session's TraceConfig.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConfigInfo {
    /// Buffers: size in KiB and fill policy.
    pub buffers: Vec<(u32, String)>,
    /// Data sources: name and, for track_event, the category filter.
    pub data_sources: Vec<String>,
    /// `duration_ms`, if set.
    pub duration_ms: Option<u32>,
    /// `write_into_file`.
    pub write_into_file: bool,
    /// The whole config in text format.
    pub text: String,
}

/// Track event counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TrackEventCounts {
    /// All track events.
    pub total: u64,
    /// SLICE_BEGIN events.
    pub slice_begin: u64,
    /// SLICE_END events.
    pub slice_end: u64,
    /// INSTANT events.
    pub instant: u64,
    /// COUNTER events.
    pub counter: u64,
    /// Other types.
    pub other: u64,
    /// Debug annotations (arguments).
    pub args: u64,
    /// Events per category (an event with two categories counts twice).
    pub by_category: BTreeMap<String, u64>,
    /// SLICE_BEGIN and INSTANT events per name.
    pub by_name: BTreeMap<String, u64>,
    /// Slices still open at the end.
    pub open_slices: u64,
    /// Deepest slice nesting.
    pub max_depth: u64,
    /// Flow links (an event continuing or terminating a flow).
    pub flow_links: u64,
    /// Flows that were started and never continued or terminated.
    pub flows_unpaired_start: u64,
    /// Terminating flow ids that matched no open flow.
    pub flows_unpaired_end: u64,
    /// Interned ids resolved.
    pub interned_resolved: u64,
    /// Interned ids that did not resolve.
    pub interned_unresolved: u64,
}

/// A track.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TrackInfo {
    /// Its uuid.
    pub uuid: u64,
    /// Its parent's uuid.
    pub parent: Option<u64>,
    /// `process`, `thread`, `counter` or `track`.
    pub kind: &'static str,
    /// Its name (or the process's/thread's).
    pub name: Option<String>,
    /// Process id.
    pub pid: Option<i32>,
    /// Thread id.
    pub tid: Option<i64>,
    /// Track events on it.
    pub events: u64,
    /// Whether a descriptor was seen (events may use undescribed tracks).
    pub described: bool,
}

/// A packet sequence.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SequenceInfo {
    /// `trusted_packet_sequence_id`.
    pub id: u32,
    /// `machine_id` of its packets (0: the service's own machine).
    pub machine_id: u32,
    /// `trusted_pid`s seen.
    pub pids: Vec<i32>,
    /// `trusted_uid`s seen.
    pub uids: Vec<i32>,
    /// Buffer it wrote to, if the trace says.
    pub buffer: Option<u32>,
    /// Packets.
    pub packets: u64,
    /// Track events.
    pub track_events: u64,
    /// Incremental-state clears.
    pub cleared: u64,
    /// Loss marks (`previous_packet_dropped`) after the first packet.
    pub loss_marks: u64,
    /// The first packet lacks `first_packet_on_sequence`.
    pub start_lost: bool,
    /// Packets skipped because they needed incremental state that was not
    /// valid (those counted in `unresolvable_after_wrap` excepted).
    pub skipped_packets: u64,
    /// Packets that need incremental state before the sequence's first
    /// clear, or stamped on a sequence-scoped clock before a snapshot
    /// related it to the trace clock, on a sequence whose start a ring
    /// buffer overwrote.
    pub unresolvable_after_wrap: u64,
    /// SLICE_END events with no open slice, after a loss.
    pub unmatched_ends_after_loss: u64,
    /// Packets whose absolute timestamp is earlier than the latest one
    /// before them on the sequence (legal: a trace processor sorts).
    pub out_of_order: u64,
}

/// Clocks.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClockInfo {
    /// The primary trace clock (from the service's clock snapshots).
    pub primary: Option<String>,
    /// Clock snapshots from the service.
    pub service_snapshots: u64,
    /// Builtin clocks in the service's snapshots.
    pub builtin: Vec<String>,
    /// Sequence-scoped clock ids defined by producers, and on how many
    /// sequences.
    pub sequence_scoped: BTreeMap<u32, u64>,
    /// Earliest timestamp (producer or service packet), on the host's
    /// trace clock (a relayed machine's shifted by its clock offset), ns.
    pub first_ns: Option<u64>,
    /// Latest timestamp (producer or service packet), as `first_ns`.
    pub last_ns: Option<u64>,
    /// Relayed machines whose times are left out of `first_ns`/`last_ns`:
    /// no round of clock exchanges relates their clocks to the host's.
    pub unplaced_machines: Vec<u32>,
    /// Producer packets with an absolute timestamp earlier than the latest
    /// one before them on their sequence, all sequences (legal: a trace
    /// processor sorts events by time).
    pub out_of_order: u64,
}

/// Lost data and its causes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LossInfo {
    /// Loss marks, all sequences.
    pub loss_marks: u64,
    /// Union of the loss-mark reason bits.
    pub loss_reasons: u32,
    /// Sequences whose start is missing.
    pub sequences_start_lost: u64,
    /// Packets skipped for lack of incremental state (those counted in
    /// `unresolvable_after_wrap` excepted).
    pub skipped_packets: u64,
    /// Packets that need incremental state (or a clock snapshot) that a
    /// ring buffer overwrote, all sequences.
    pub unresolvable_after_wrap: u64,
    /// Non-zero loss statistics (`buffer N: name` / `service: name`), with
    /// their value and meaning.
    pub stats: Vec<(String, u64, String)>,
    /// Malformed packets.
    pub malformed_packets: u64,
    /// The file is damaged or cut short.
    pub file_damaged: bool,
}

impl LossInfo {
    /// Whether anything records or shows a loss.
    pub fn any(&self) -> bool {
        self.loss_marks > 0
            || self.sequences_start_lost > 0
            || self.skipped_packets > 0
            || self.unresolvable_after_wrap > 0
            || !self.stats.is_empty()
            || self.malformed_packets > 0
            || self.file_damaged
    }
}

/// The statistics of a `trace_stats` packet.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StatsInfo {
    /// Per buffer, its non-zero counters.
    pub buffers: Vec<BTreeMap<String, u64>>,
    /// The service-wide counters.
    pub service: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Table {
    Categories,
    Names,
    ArgNames,
    ArgStrings,
}

impl Table {
    fn label(self) -> &'static str {
        match self {
            Self::Categories => "event category",
            Self::Names => "event name",
            Self::ArgNames => "debug annotation name",
            Self::ArgStrings => "debug annotation string",
        }
    }
}

/// Something that looks like lost data, on a sequence without a loss mark:
/// excused if the sequence lost its start and a loss is recorded, a
/// problem otherwise.
#[derive(Debug, Clone)]
struct Evidence {
    kind: ProblemKind,
    message: String,
    /// What a lost start explains: found before the sequence's first
    /// incremental-state clear.
    lost_with_start: bool,
    /// A time on this sequence-scoped clock that no snapshot had defined
    /// or related to the trace clock yet: excused at the end if a later
    /// snapshot did, after a loss mark or a ring wrap that took the
    /// sequence's start (the snapshot that did may be gone with either).
    clock: Option<UnplacedTime>,
}

/// See [`Evidence::clock`].
#[derive(Debug, Clone, Copy)]
struct UnplacedTime {
    clock: u32,
    /// After a loss mark of its sequence.
    after_mark: bool,
}

#[derive(Debug, Default)]
struct Sequence {
    info: SequenceInfo,
    first_flagged: bool,
    /// The first packet cleared the incremental state.
    first_cleared: bool,
    marked: bool,
    valid: bool,
    ever_valid: bool,
    /// Packets skipped before the first clear and before any loss mark.
    skipped_before_clear: u64,
    interned: HashMap<(Table, u64), String>,
    defaults: Option<TracePacketDefaults>,
    /// The time of the last packet with a resolved timestamp.
    last_boot_ts: Option<u64>,
    /// The latest resolved time so far.
    latest_boot_ts: Option<u64>,
    evidence: Vec<Evidence>,
}

/// Where and when an event was, for what is matched at the end.
#[derive(Debug, Clone, Copy)]
struct Mark {
    /// BOOTTIME ns (the sequence's last known time if the packet has none).
    ts: u64,
    /// Position in the whole trace (ties between equal times).
    order: u64,
    seq_id: u32,
    /// The sequence had a loss mark before this event.
    after_loss: bool,
    /// Index into `Analysis::files`.
    file: usize,
    /// Packet index in that file.
    packet: u64,
}

/// An open flow.
#[derive(Debug, Default)]
struct Flow {
    /// Events that continued it so far.
    links: u64,
}

/// Feeds packets in, [`Analyzer::finish`] gives the [`Analysis`].
#[derive(Debug, Default)]
pub struct Analyzer {
    out: Analysis,
    sequences: BTreeMap<u32, Sequence>,
    tracks: HashMap<u64, TrackInfo>,
    /// Slice begins (`true`) and ends per track, matched at the end.
    slices: Vec<(u64, bool, Mark)>,
    /// `(ts, order, flow id, terminating)`, linked at the end.
    flow_marks: Vec<(u64, u64, u64, bool)>,
    /// `order` of the SLICE_ENDs that closed no slice (their flows link
    /// nothing).
    unmatched_ends: HashSet<u64>,
    counter_uses: Vec<(u64, u32, String)>,
    service_events: Vec<(String, u64)>,
    buffer_of_sequence: HashMap<u32, u32>,
    builtin_clocks: BTreeSet<u32>,
    /// Every clock snapshot so far.
    clock_graph: Clocks,
    /// The last readings `(scoped, global)` a snapshot of sequence `.0`
    /// gave its sequence-scoped clock `.1` and the global clock `.2`.
    related: HashMap<(u32, u32, u32), (u64, u64)>,
    /// The clock timestamps are resolved to (the service's primary trace
    /// clock, else BOOTTIME).
    trace_clock: Option<u32>,
    last_stats: Option<TraceStats>,
    /// Per machine id, what the service's packets say of it (the counts
    /// come from the sequences at the end).
    machines: BTreeMap<u32, MachineInfo>,
    /// Per machine id, the clock exchanges of its latest `remote_clock_sync`
    /// packet.
    exchanges: BTreeMap<u32, Vec<Exchange>>,
    /// Per machine id (0: the host), the earliest and latest times of its
    /// packets, on its own clocks.
    spans: BTreeMap<u32, (u64, u64)>,
    /// Inside a `compressed_packets` batch.
    inflating: bool,
}

fn clock_name(id: u32) -> String {
    use shmtrace_abi::trace::builtin_clock as clock;
    match id {
        clock::REALTIME => "REALTIME".into(),
        clock::REALTIME_COARSE => "REALTIME_COARSE".into(),
        clock::MONOTONIC => "MONOTONIC".into(),
        clock::MONOTONIC_COARSE => "MONOTONIC_COARSE".into(),
        clock::MONOTONIC_RAW => "MONOTONIC_RAW".into(),
        clock::BOOTTIME => "BOOTTIME".into(),
        clock::TSC => "TSC".into(),
        clock::PERF => "PERF".into(),
        clock::TRACE_FILE => "TRACE_FILE".into(),
        other => format!("clock {other}"),
    }
}

impl Analyzer {
    /// A fresh analysis.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the next file of the trace (several files are successive
    /// reads of one session).
    pub fn file(&mut self, name: &str) {
        self.out.files.push(name.to_owned());
    }

    /// Records that the current file is damaged (`what` says how).
    pub fn damaged(&mut self, what: &str) {
        self.out.loss.file_damaged = true;
        let file = self.out.files.last().cloned().unwrap_or_default();
        self.problem(ProblemKind::Malformed, format!("{file}: {what}"));
    }

    fn problem(&mut self, kind: ProblemKind, message: String) {
        let count = self.out.problem_counts.entry(kind).or_insert(0);
        *count += 1;
        if *count as usize <= MAX_PROBLEMS_PER_KIND {
            self.out.problems.push(Problem { kind, message });
        }
    }

    /// Analyzes one packet; `index` is its position in the current file.
    pub fn packet(&mut self, index: u64, bytes: &[u8]) {
        let file = self.out.files.last().cloned().unwrap_or_default();
        self.packet_at(index, &format!("{file} packet #{index}"), bytes);
    }

    /// Analyzes one packet; `at` names it in messages.
    fn packet_at(&mut self, index: u64, at: &str, bytes: &[u8]) {
        let packet = TracePacket::decode(bytes);
        // A batch is counted in `compression`; its packets as packets.
        match &packet {
            Ok(TracePacket {
                data: Some(Data::CompressedPackets(data)),
                ..
            }) => {
                self.compressed_packets(index, at, data);
                return;
            }
            Ok(TracePacket {
                data: Some(Data::ZstdCompressedPackets(data)),
                ..
            }) => {
                let c = &mut self.out.compression;
                c.zstd_batches += 1;
                let message = format!(
                    "{at}: zstd_compressed_packets ({} bytes) are not inflated by inspect; \
                     the packets in them are not checked",
                    data.len()
                );
                self.problem(ProblemKind::Unsupported, message);
                return;
            }
            _ => {}
        }
        self.out.packets += 1;
        self.out.packet_bytes += bytes.len() as u64;
        let kind = kinds::packet_kind(bytes).unwrap_or_else(|| "(malformed)".into());
        let entry = self.out.packets_by_kind.entry(kind).or_default();
        entry.packets += 1;
        entry.bytes += bytes.len() as u64;
        let packet = match packet {
            Ok(p) => p,
            Err(e) => {
                self.out.loss.malformed_packets += 1;
                self.problem(
                    ProblemKind::Malformed,
                    format!("{at}: does not decode: {e}"),
                );
                return;
            }
        };
        let machine_id = packet.machine_id.unwrap_or(0);
        if machine_id != 0 {
            self.machine(machine_id);
        }
        // A relayed machine's clock exchanges: the service writes them with
        // the machine's id and its uid, on no sequence (as upstream's does).
        if let Some(Data::RemoteClockSync(sync)) = &packet.data {
            if machine_id == 0 || packet.optional_trusted_uid.is_none() {
                self.problem(
                    ProblemKind::TrustedFields,
                    format!("{at}: remote_clock_sync without machine_id or trusted_uid"),
                );
            } else {
                self.machine(machine_id).clock_exchanges += sync.synced_clocks.len() as u64;
                let readings = |snapshot: &Option<ClockSnapshot>| -> BTreeMap<u32, u64> {
                    snapshot
                        .iter()
                        .flat_map(|s| &s.clocks)
                        .filter_map(|c| Some((c.clock_id?, c.timestamp?)))
                        .collect()
                };
                // Each packet's exchanges give the offset on their own; a
                // later packet's replaces an earlier one's, as in a trace
                // processor (`SetRemoteClockOffset`).
                let exchanges = sync
                    .synced_clocks
                    .iter()
                    .map(|e| Exchange {
                        host: readings(&e.host_clocks),
                        client: readings(&e.client_clocks),
                    })
                    .collect();
                self.exchanges.insert(machine_id, exchanges);
            }
            return;
        }
        let Some(OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(seq_id)) =
            packet.optional_trusted_packet_sequence_id
        else {
            self.problem(
                ProblemKind::TrustedFields,
                format!("{at}: no trusted_packet_sequence_id (not written by a tracing service?)"),
            );
            return;
        };
        let uid = packet
            .optional_trusted_uid
            .map(|OptionalTrustedUid::TrustedUid(uid)| uid);
        if uid.is_none() {
            self.problem(
                ProblemKind::TrustedFields,
                format!("{at}: no trusted_uid on sequence {seq_id}"),
            );
        }
        if seq_id == SERVICE_SEQUENCE_ID {
            self.service_packet(machine_id, packet);
        } else {
            self.producer_packet(seq_id, uid, packet, at, index);
        }
    }

    /// Inflates a `compressed_packets` batch and analyzes its packets in
    /// place of it.
    fn compressed_packets(&mut self, index: u64, at: &str, data: &[u8]) {
        if self.inflating {
            self.out.loss.malformed_packets += 1;
            let message = format!("{at}: compressed_packets inside compressed_packets");
            self.problem(ProblemKind::Malformed, message);
            return;
        }
        let c = &mut self.out.compression;
        c.batches += 1;
        c.compressed_bytes += data.len() as u64;
        let inflated = match compressed::inflate(data) {
            Ok(inflated) => inflated,
            Err(e) => {
                self.out.loss.malformed_packets += 1;
                let message = format!("{at}: compressed_packets cannot be inflated: {e}");
                self.problem(ProblemKind::Malformed, message);
                return;
            }
        };
        c.inflated_bytes += inflated.len() as u64;
        self.inflating = true;
        for inner in PacketReader::new(inflated.as_slice()) {
            match inner {
                Ok(inner) => {
                    self.out.compression.packets += 1;
                    let inner_at = format!("{at} (compressed) packet #{}", inner.index);
                    self.packet_at(index, &inner_at, &inner.bytes);
                }
                Err(e) => {
                    self.out.loss.malformed_packets += 1;
                    let message = format!("{at}: the inflated compressed_packets: {e}");
                    self.problem(ProblemKind::Malformed, message);
                }
            }
        }
        self.inflating = false;
    }

    /// What the trace says of machine `id` so far.
    fn machine(&mut self, id: u32) -> &mut MachineInfo {
        self.machines.entry(id).or_insert_with(|| MachineInfo {
            id,
            ..Default::default()
        })
    }

    /// A packet of the service's own sequence; `machine_id` is the
    /// machine it is about (0: the host).
    fn service_packet(&mut self, machine_id: u32, packet: TracePacket) {
        if let Some(ts) = packet.timestamp {
            if packet.timestamp_clock_id.unwrap_or(BOOTTIME) == BOOTTIME {
                self.span(machine_id, ts);
            }
        }
        let Some(data) = packet.data else { return };
        match data {
            Data::ClockSnapshot(snapshot) => {
                self.out.clocks.service_snapshots += 1;
                if let Some(primary) = snapshot.primary_trace_clock {
                    self.out.clocks.primary = Some(clock_name(primary as u32));
                    self.trace_clock = Some(primary as u32);
                }
                self.builtin_clocks
                    .extend(snapshot.clocks.iter().filter_map(|c| c.clock_id));
                self.add_snapshot(SERVICE_SEQUENCE_ID, &snapshot, "a service clock snapshot");
            }
            Data::TraceConfig(bytes) => {
                self.out.session.config = Some(config_info(&bytes));
            }
            Data::TraceStats(stats) => {
                for writer in &stats.writer_stats {
                    if let (Some(seq), Some(buffer)) = (writer.sequence_id, writer.buffer) {
                        if let Ok(seq) = u32::try_from(seq) {
                            self.buffer_of_sequence.insert(seq, buffer);
                        }
                    }
                }
                self.last_stats = Some(stats);
            }
            Data::SystemInfo(info) => {
                let system = info.utsname.map(|u| {
                    let parts: Vec<String> = [u.sysname, u.release, u.machine]
                        .into_iter()
                        .flatten()
                        .collect();
                    parts.join(" ")
                });
                // A relayed machine's description says nothing of the
                // service (its version is its relay's).
                let machine = self.machine(machine_id);
                machine.described = true;
                machine.name = info.machine_name.filter(|n| !n.is_empty());
                machine.system = system.clone();
                if machine_id == 0 {
                    self.out.session.service_version = info.tracing_service_version;
                    self.out.session.system = system;
                }
            }
            Data::TraceUuid(uuid) => {
                let (msb, lsb) = (uuid.msb.unwrap_or(0) as u64, uuid.lsb.unwrap_or(0) as u64);
                let hex = format!("{msb:016x}{lsb:016x}");
                self.out.session.uuid = Some(format!(
                    "{}-{}-{}-{}-{}",
                    &hex[0..8],
                    &hex[8..12],
                    &hex[12..16],
                    &hex[16..20],
                    &hex[20..32]
                ));
            }
            Data::TraceProvenance(provenance) => {
                for (buffer, b) in provenance.buffers.iter().enumerate() {
                    for seq in b.sequences.iter().filter_map(|s| s.id) {
                        self.buffer_of_sequence
                            .insert(seq, u32::try_from(buffer).unwrap_or(u32::MAX));
                    }
                }
            }
            Data::Trigger(trigger) | Data::CloneSnapshotTrigger(trigger) => {
                self.out
                    .session
                    .triggers
                    .push(trigger.trigger_name.unwrap_or_default());
            }
            Data::ServiceEvent(event) => {
                let name = match event.event_type {
                    Some(ServiceEventType::TracingStarted(_)) => "tracing_started",
                    Some(ServiceEventType::AllDataSourcesStarted(_)) => "all_data_sources_started",
                    Some(ServiceEventType::FlushStarted(_)) => "flush_started",
                    Some(ServiceEventType::AllDataSourcesFlushed(_)) => "all_data_sources_flushed",
                    Some(ServiceEventType::ReadTracingBuffersCompleted(_)) => {
                        "read_tracing_buffers_completed"
                    }
                    Some(ServiceEventType::TracingDisabled(_)) => "tracing_disabled",
                    Some(ServiceEventType::SeizedForBugreport(_)) => "seized_for_bugreport",
                    Some(ServiceEventType::SlowStartingDataSources(ds)) => {
                        self.slow(ds, "slow to start");
                        "slow_starting_data_sources"
                    }
                    Some(ServiceEventType::LastFlushSlowDataSources(ds)) => {
                        self.slow(ds, "slow to flush");
                        "last_flush_slow_data_sources"
                    }
                    Some(ServiceEventType::CloneStarted(_)) => "clone_started",
                    Some(ServiceEventType::BufferCloned(_)) => "buffer_cloned",
                    None => "(unknown)",
                };
                match self.service_events.iter_mut().find(|(n, _)| n == name) {
                    Some((_, count)) => *count += 1,
                    None => self.service_events.push((name.to_owned(), 1)),
                }
            }
            _ => {}
        }
    }

    fn slow(&mut self, ds: protos::tracing_service_event::DataSources, what: &str) {
        for d in ds.data_source {
            self.out.session.slow_data_sources.push(format!(
                "{} ({}): {what}",
                d.data_source_name.unwrap_or_default(),
                d.producer_name.unwrap_or_default()
            ));
        }
    }

    fn producer_packet(
        &mut self,
        seq_id: u32,
        uid: Option<i32>,
        mut packet: TracePacket,
        at: &str,
        index: u64,
    ) {
        let machine_id = packet.machine_id.unwrap_or(0);
        let known = self.sequences.get(&seq_id).map(|s| s.info.machine_id);
        if let Some(first) = known.filter(|&m| m != machine_id) {
            self.problem(
                ProblemKind::TrustedFields,
                format!(
                    "{at}: sequence {seq_id} of machine {first} has a packet of machine \
                     {machine_id}"
                ),
            );
            return;
        }
        let seq = self.sequences.entry(seq_id).or_insert_with(|| Sequence {
            info: SequenceInfo {
                id: seq_id,
                machine_id,
                ..Default::default()
            },
            ..Default::default()
        });
        let first = seq.info.packets == 0;
        seq.info.packets += 1;
        if let Some(pid) = packet.trusted_pid {
            if !seq.info.pids.contains(&pid) {
                seq.info.pids.push(pid);
            }
        }
        if let Some(uid) = uid {
            if !seq.info.uids.contains(&uid) {
                seq.info.uids.push(uid);
            }
        }
        let flags = packet.sequence_flags.unwrap_or(0);
        let clears = flags & SEQ_INCREMENTAL_STATE_CLEARED != 0
            || packet.incremental_state_cleared == Some(true);
        if first {
            seq.first_flagged = packet.first_packet_on_sequence == Some(true);
            seq.first_cleared = clears;
        } else if packet.previous_packet_dropped.unwrap_or(0) != 0 {
            seq.info.loss_marks += 1;
            seq.marked = true;
            seq.valid = false;
            self.out.loss.loss_reasons |= packet.previous_packet_dropped.unwrap_or(0);
        }
        if clears {
            seq.info.cleared += 1;
            seq.valid = true;
            seq.ever_valid = true;
            seq.interned.clear();
            seq.defaults = None;
        }
        if flags & SEQ_NEEDS_INCREMENTAL_STATE != 0 && !seq.valid {
            seq.info.skipped_packets += 1;
            if !seq.marked && !seq.ever_valid {
                seq.skipped_before_clear += 1;
            }
            if !seq.marked {
                let message = if seq.ever_valid {
                    format!("{at}: sequence {seq_id} needs incremental state that is not valid")
                } else {
                    format!(
                        "{at}: sequence {seq_id} needs incremental state but never cleared it \
                         (no SEQ_INCREMENTAL_STATE_CLEARED packet)"
                    )
                };
                seq.evidence.push(Evidence {
                    clock: None,
                    kind: ProblemKind::Interning,
                    lost_with_start: !seq.ever_valid,
                    message,
                });
            }
            return;
        }
        if let Some(defaults) = packet.trace_packet_defaults.take() {
            seq.defaults = Some(defaults);
        }
        if let Some(interned) = packet.interned_data.take() {
            intern(seq, interned, at);
        }
        // A trace processor takes a clock snapshot and nothing else of its
        // packet (not even the timestamp).
        if let Some(Data::ClockSnapshot(snapshot)) = &packet.data {
            self.sequence_clocks(seq_id, snapshot, at);
        } else {
            self.timestamp(seq_id, &packet, at);
        }
        match packet.data.take() {
            Some(Data::TrackDescriptor(desc)) => self.track_descriptor(desc),
            Some(Data::TrackEvent(event)) => self.track_event(seq_id, event, at, index),
            _ => {}
        }
    }

    fn sequence_clocks(&mut self, seq_id: u32, snapshot: &ClockSnapshot, at: &str) {
        for id in snapshot.clocks.iter().filter_map(|c| c.clock_id) {
            if (clocks::FIRST_SEQUENCE_SCOPED..128).contains(&id)
                && !self.clock_graph.knows(seq_id, id)
            {
                *self.out.clocks.sequence_scoped.entry(id).or_insert(0) += 1;
            }
        }
        self.add_snapshot(seq_id, snapshot, at);
    }

    /// Adds a snapshot read on `seq_id` to the clock graph; one a trace
    /// processor refuses is a problem.
    fn add_snapshot(&mut self, seq_id: u32, snapshot: &ClockSnapshot, at: &str) {
        let taken: Vec<SnapshotClock> = snapshot
            .clocks
            .iter()
            .filter_map(|c| {
                Some(SnapshotClock {
                    id: c.clock_id?,
                    timestamp: c.timestamp?,
                    unit_ns: c.unit_multiplier_ns.unwrap_or(1),
                    incremental: c.is_incremental == Some(true),
                })
            })
            .collect();
        let target = self.trace_clock.unwrap_or(BOOTTIME);
        if let Err(e) = self.clock_graph.add_snapshot(seq_id, &taken, target) {
            let message = format!("{at}: clock snapshot refused (as a trace processor does): {e}");
            self.problem(ProblemKind::Timestamps, message);
            return;
        }
        self.contradictions(seq_id, &taken, at);
    }

    /// Compares the relations a snapshot of `seq_id` states between its
    /// sequence-scoped clocks and global ones with the sequence's
    /// previous ones (module docs).
    fn contradictions(&mut self, seq_id: u32, taken: &[SnapshotClock], at: &str) {
        let scoped = |c: &SnapshotClock| (clocks::FIRST_SEQUENCE_SCOPED..128).contains(&c.id);
        let plain = |c: &&SnapshotClock| !c.incremental;
        let ns = |c: &SnapshotClock| c.timestamp.saturating_mul(c.unit_ns);
        let mut found = Vec::new();
        for a in taken.iter().filter(plain).filter(|c| scoped(c)) {
            for b in taken
                .iter()
                .filter(plain)
                .filter(|c| !scoped(c) && c.id < 128)
            {
                let now = (ns(a), ns(b));
                let Some(before) = self.related.insert((seq_id, a.id, b.id), now) else {
                    continue;
                };
                let (Some(da), Some(db)) =
                    (now.0.checked_sub(before.0), now.1.checked_sub(before.1))
                else {
                    continue; // a clock went back: the graph's rules
                };
                let step = da.abs_diff(db);
                if step > SNAPSHOT_STEP_NS && step > da.max(db) / 10 {
                    found.push(format!(
                        "{at}: clock snapshot contradicts the one before it on sequence {seq_id}: \
                         the offset of clock {} to {} moved by {:.3} s in {:.3} s (events around \
                         them are misplaced by up to that much)",
                        a.id,
                        clock_name(b.id),
                        step as f64 / 1e9,
                        db as f64 / 1e9
                    ));
                }
            }
        }
        for message in found {
            self.problem(ProblemKind::Timestamps, message);
        }
    }

    /// Resolves a producer packet's timestamp to the trace clock (see the
    /// module docs for what is a problem and what is only counted).
    fn timestamp(&mut self, seq_id: u32, packet: &TracePacket, at: &str) {
        let Some(ts) = packet.timestamp else { return };
        let Some(seq) = self.sequences.get_mut(&seq_id) else {
            return;
        };
        let clock_id = packet
            .timestamp_clock_id
            .filter(|&id| id != 0)
            .or_else(|| seq.defaults.as_ref().and_then(|d| d.timestamp_clock_id))
            .filter(|&id| id != 0)
            .unwrap_or(BOOTTIME);
        let target = self.trace_clock.unwrap_or(BOOTTIME);
        if self.clock_graph.is_incremental(seq_id, clock_id) {
            if ts >= 1 << 63 {
                let message = format!(
                    "{at}: negative timestamp delta {} on incremental clock {clock_id}",
                    ts as i64
                );
                self.problem(ProblemKind::Timestamps, message);
                return;
            }
            if seq.marked && !seq.valid {
                // The deltas since the last clear may be lost with the
                // packets that carried them: the base is unknown.
                return;
            }
        }
        let boot = match self.clock_graph.convert(seq_id, clock_id, ts, target) {
            Ok(t) => t as u64,
            Err(ConvertError::UnknownSource) if clock_id >= clocks::FIRST_SEQUENCE_SCOPED => {
                if !seq.marked {
                    seq.evidence.push(Evidence {
                        kind: ProblemKind::Timestamps,
                        lost_with_start: !seq.ever_valid,
                        clock: Some(UnplacedTime {
                            clock: clock_id,
                            after_mark: false,
                        }),
                        message: format!(
                            "{at}: timestamp on sequence-scoped clock {clock_id}, which sequence \
                             {seq_id} does not define"
                        ),
                    });
                }
                return;
            }
            Err(ConvertError::UnknownSource) => {
                let message = format!(
                    "{at}: timestamp on {}, which no clock snapshot names",
                    clock_name(clock_id)
                );
                self.problem(ProblemKind::Timestamps, message);
                return;
            }
            Err(ConvertError::UnknownTarget | ConvertError::NoPath) => {
                let sequence_scoped = clock_id >= clocks::FIRST_SEQUENCE_SCOPED;
                let clock = if sequence_scoped {
                    format!("clock {clock_id} of sequence {seq_id}")
                } else {
                    clock_name(clock_id)
                };
                let message = format!(
                    "{at}: timestamp on {clock} cannot be converted to {}: no chain of clock \
                     snapshots relates them",
                    clock_name(target)
                );
                if sequence_scoped {
                    seq.evidence.push(Evidence {
                        kind: ProblemKind::Timestamps,
                        lost_with_start: false,
                        clock: Some(UnplacedTime {
                            clock: clock_id,
                            after_mark: seq.marked,
                        }),
                        message,
                    });
                } else {
                    self.problem(ProblemKind::Timestamps, message);
                }
                return;
            }
        };
        // Earlier than the latest time: legal (a trace processor sorts
        // events by time); only absolute timestamps or a clock re-anchored
        // by a snapshot can get here, as deltas are never negative. Only
        // the sequence's own times are compared (the trace clock and its
        // sequence-scoped clocks): a time on another global clock
        // (MONOTONIC, REALTIME) is one the producer chose on that clock.
        let own = clock_id == target || clock_id >= clocks::FIRST_SEQUENCE_SCOPED;
        if own {
            if seq.latest_boot_ts.is_some_and(|latest| boot < latest) {
                seq.info.out_of_order += 1;
                self.out.clocks.out_of_order += 1;
            }
            seq.latest_boot_ts = Some(seq.latest_boot_ts.map_or(boot, |l| l.max(boot)));
        }
        seq.last_boot_ts = Some(boot);
        let machine = seq.info.machine_id;
        self.span(machine, boot);
    }

    /// Widens the time span of `machine`'s packets (on its own clocks) to
    /// include `ns`.
    fn span(&mut self, machine: u32, ns: u64) {
        let span = self.spans.entry(machine).or_insert((ns, ns));
        *span = (span.0.min(ns), span.1.max(ns));
    }

    /// The trace's time span on the host's trace clock: the host's packets
    /// and each relayed machine's, shifted by its clock offset (its
    /// exchanges'); a machine without one is left out, and listed.
    fn place_spans(&mut self) {
        let target = self.trace_clock.unwrap_or(BOOTTIME);
        for (&id, exchanges) in &self.exchanges {
            let offset = remote_clocks::offset(exchanges, target);
            if let Some(m) = self.machines.get_mut(&id) {
                m.clock_offset_ns = offset;
            }
        }
        let clocks = &mut self.out.clocks;
        for (&id, &(first, last)) in &self.spans {
            let offset = match id {
                0 => Some(0),
                id => self.machines.get(&id).and_then(|m| m.clock_offset_ns),
            };
            let Some(offset) = offset else {
                clocks.unplaced_machines.push(id);
                continue;
            };
            let shift = |ns: u64| {
                u64::try_from((i128::from(ns) - i128::from(offset)).max(0)).unwrap_or(u64::MAX)
            };
            let (first, last) = (shift(first), shift(last));
            clocks.first_ns = Some(clocks.first_ns.map_or(first, |f| f.min(first)));
            clocks.last_ns = Some(clocks.last_ns.map_or(last, |l| l.max(last)));
        }
    }

    fn track_descriptor(&mut self, desc: TrackDescriptor) {
        let Some(uuid) = desc.uuid else { return };
        let track = self.tracks.entry(uuid).or_insert_with(|| TrackInfo {
            uuid,
            kind: "track",
            ..Default::default()
        });
        track.described = true;
        track.parent = desc.parent_uuid.or(track.parent);
        if let Some(name) = desc.static_or_dynamic_name.map(|n| match n {
            StaticOrDynamicName::Name(n)
            | StaticOrDynamicName::StaticName(n)
            | StaticOrDynamicName::AtraceName(n) => n,
        }) {
            track.name = Some(name);
        }
        if let Some(process) = desc.process {
            track.kind = "process";
            track.pid = process.pid;
            if track.name.is_none() {
                track.name = process
                    .process_name
                    .or_else(|| process.cmdline.into_iter().next());
            }
        }
        if let Some(thread) = desc.thread {
            track.kind = "thread";
            track.pid = thread.pid;
            track.tid = thread.tid;
            if track.name.is_none() {
                track.name = thread.thread_name;
            }
        }
        if desc.counter.is_some() {
            track.kind = "counter";
        }
    }

    fn resolve(&mut self, seq_id: u32, table: Table, iid: u64, at: &str) -> Option<String> {
        let seq = self.sequences.get_mut(&seq_id)?;
        let found = if seq.valid {
            seq.interned.get(&(table, iid)).cloned()
        } else {
            None
        };
        if found.is_some() {
            self.out.track_events.interned_resolved += 1;
        } else {
            self.out.track_events.interned_unresolved += 1;
            let message = format!(
                "{at}: {} iid {iid} does not resolve on sequence {seq_id}",
                table.label()
            );
            if !seq.marked {
                seq.evidence.push(Evidence {
                    clock: None,
                    kind: ProblemKind::Interning,
                    lost_with_start: !seq.ever_valid,
                    message,
                });
            }
        }
        found
    }

    fn track_event(&mut self, seq_id: u32, event: TrackEvent, at: &str, index: u64) {
        // Time order across sequences: the packet's timestamp, else the
        // sequence's last one.
        let ts = self
            .sequences
            .get(&seq_id)
            .and_then(|s| s.last_boot_ts)
            .unwrap_or(0);
        let event_type = EventType::try_from(event.r#type.unwrap_or(0)).ok();
        // Only events that make a slice carry flows.
        if matches!(
            event_type,
            Some(EventType::SliceBegin | EventType::SliceEnd | EventType::Instant)
        ) {
            self.flow_event(&event, ts);
        }
        self.out.track_events.total += 1;
        if let Some(seq) = self.sequences.get_mut(&seq_id) {
            seq.info.track_events += 1;
        }
        let name = match event.name_field {
            Some(NameField::NameIid(iid)) => Some(
                self.resolve(seq_id, Table::Names, iid, at)
                    .unwrap_or_else(|| format!("(unresolved name #{iid})")),
            ),
            Some(NameField::Name(name)) => Some(name),
            None => None,
        };
        let mut categories = event.categories.clone();
        for &iid in &event.category_iids {
            categories.push(
                self.resolve(seq_id, Table::Categories, iid, at)
                    .unwrap_or_else(|| format!("(unresolved category #{iid})")),
            );
        }
        for category in categories {
            *self
                .out
                .track_events
                .by_category
                .entry(category)
                .or_insert(0) += 1;
        }
        for arg in &event.debug_annotations {
            self.annotation(seq_id, arg, at);
        }
        let track = event.track_uuid.unwrap_or_else(|| {
            self.sequences
                .get(&seq_id)
                .and_then(|s| s.defaults.as_ref())
                .and_then(|d| d.track_event_defaults.as_ref())
                .and_then(|d| d.track_uuid)
                .unwrap_or(0)
        });
        self.tracks
            .entry(track)
            .or_insert_with(|| TrackInfo {
                uuid: track,
                kind: "track",
                ..Default::default()
            })
            .events += 1;
        let marked = self.sequences.get(&seq_id).is_some_and(|s| s.marked);
        let mark = Mark {
            ts,
            order: self.out.packets,
            seq_id,
            after_loss: marked,
            file: self.out.files.len().saturating_sub(1),
            packet: index,
        };
        let counts = &mut self.out.track_events;
        match event_type {
            Some(EventType::SliceBegin) => {
                counts.slice_begin += 1;
                let label = name.unwrap_or_else(|| "(unnamed)".into());
                *counts.by_name.entry(label).or_insert(0) += 1;
                self.slices.push((track, true, mark));
            }
            Some(EventType::SliceEnd) => {
                counts.slice_end += 1;
                self.slices.push((track, false, mark));
            }
            Some(EventType::Instant) => {
                counts.instant += 1;
                let label = name.unwrap_or_else(|| "(unnamed)".into());
                *counts.by_name.entry(label).or_insert(0) += 1;
            }
            Some(EventType::Counter) => {
                counts.counter += 1;
                match event.counter_value_field {
                    Some(CounterValueField::CounterValue(_))
                    | Some(CounterValueField::DoubleCounterValue(_)) => {}
                    None => self.problem(
                        ProblemKind::Counters,
                        format!("{at}: COUNTER without a value"),
                    ),
                }
                if !marked {
                    self.counter_uses.push((track, seq_id, at.to_owned()));
                }
            }
            _ => counts.other += 1,
        }
    }

    /// Collects the flow ids of an event that makes a slice (linked in
    /// time order at the end). As a trace processor, reads the deprecated
    /// `*_flow_ids_old` fields (still found in traces) only when their
    /// successors are empty.
    #[allow(deprecated)]
    fn flow_event(&mut self, event: &TrackEvent, ts: u64) {
        fn or_old<'a>(ids: &'a [u64], old: &'a [u64]) -> &'a [u64] {
            if ids.is_empty() {
                old
            } else {
                ids
            }
        }
        let order = self.out.packets;
        for &id in or_old(&event.flow_ids, &event.flow_ids_old) {
            self.flow_marks.push((ts, order, id, false));
        }
        for &id in or_old(&event.terminating_flow_ids, &event.terminating_flow_ids_old) {
            self.flow_marks.push((ts, order, id, true));
        }
    }

    /// Matches slice ends to begins per track, in time order (tracks can be
    /// shared by sequences, whose packets are not interleaved in time order
    /// in a trace file), and files unmatched ends with their sequence.
    fn match_slices(&mut self, sequences: &mut BTreeMap<u32, Sequence>) {
        let mut slices = std::mem::take(&mut self.slices);
        slices.sort_by_key(|(track, _, m)| (*track, m.ts, m.order));
        let mut depth: HashMap<u64, u64> = HashMap::new();
        for (track, begin, mark) in slices {
            let d = depth.entry(track).or_insert(0);
            if begin {
                *d += 1;
                let counts = &mut self.out.track_events;
                counts.max_depth = counts.max_depth.max(*d);
            } else if *d > 0 {
                *d -= 1;
            } else {
                self.unmatched_ends.insert(mark.order);
                let Some(seq) = sequences.get_mut(&mark.seq_id) else {
                    continue;
                };
                if mark.after_loss {
                    seq.info.unmatched_ends_after_loss += 1;
                } else {
                    let file = self.out.files.get(mark.file).cloned().unwrap_or_default();
                    seq.evidence.push(Evidence {
                        clock: None,
                        kind: ProblemKind::Nesting,
                        lost_with_start: false,
                        message: format!(
                            "{file} packet #{}: SLICE_END with no open slice on track {track}",
                            mark.packet
                        ),
                    });
                }
            }
        }
        self.out.track_events.open_slices = depth.values().sum();
    }

    /// Links flows as Perfetto does, in time order (equal times in packet
    /// order): an id in `flow_ids` starts a flow or, if one with that id is
    /// open, continues it; an id in `terminating_flow_ids` continues and
    /// closes it (a trace processor ignores one with no open flow). Flows
    /// attach to slices: a SLICE_END that closed no slice links none (so
    /// [`Self::match_slices`] runs first).
    fn match_flows(&mut self) {
        let mut marks = std::mem::take(&mut self.flow_marks);
        marks.sort_by_key(|&(ts, order, _, _)| (ts, order));
        let mut open: HashMap<u64, Flow> = HashMap::new();
        let counts = &mut self.out.track_events;
        for (_, order, id, terminating) in marks {
            if self.unmatched_ends.contains(&order) {
                continue;
            }
            match (open.get_mut(&id), terminating) {
                (Some(flow), false) => {
                    flow.links += 1;
                    counts.flow_links += 1;
                }
                (None, false) => {
                    open.insert(id, Flow::default());
                }
                (Some(_), true) => {
                    open.remove(&id);
                    counts.flow_links += 1;
                }
                (None, true) => counts.flows_unpaired_end += 1,
            }
        }
        counts.flows_unpaired_start = open.values().filter(|f| f.links == 0).count() as u64;
    }

    fn annotation(&mut self, seq_id: u32, arg: &DebugAnnotation, at: &str) {
        self.out.track_events.args += 1;
        if let Some(ArgName::NameIid(iid)) = arg.name_field {
            self.resolve(seq_id, Table::ArgNames, iid, at);
        }
        if let Some(ArgValue::StringValueIid(iid)) = arg.value {
            self.resolve(seq_id, Table::ArgStrings, iid, at);
        }
        for nested in arg.dict_entries.iter().chain(&arg.array_values) {
            self.annotation(seq_id, nested, at);
        }
    }

    /// Ends the analysis.
    pub fn finish(mut self) -> Analysis {
        self.place_spans();
        // Lifecycle events and statistics.
        self.out.session.service_events = std::mem::take(&mut self.service_events);
        self.out.clocks.builtin = self.builtin_clocks.iter().map(|&c| clock_name(c)).collect();
        let stats = self.last_stats.take();
        let mut lossy_buffers: BTreeSet<u32> = BTreeSet::new();
        let mut wrapped_buffers: BTreeSet<u32> = BTreeSet::new();
        let mut service_loss = 0;
        if let Some(stats) = &stats {
            let info = stats_info(stats);
            for (index, buffer) in info.buffers.iter().enumerate() {
                if RING_WRAP_STATS
                    .iter()
                    .any(|name| buffer.contains_key(*name))
                {
                    wrapped_buffers.insert(index as u32);
                }
                for &(name, meaning) in BUFFER_LOSS_STATS {
                    if let Some(&value) = buffer.get(name).filter(|&&v| v > 0) {
                        lossy_buffers.insert(index as u32);
                        self.out.loss.stats.push((
                            format!("buffer {index}: {name}"),
                            value,
                            meaning.to_owned(),
                        ));
                    }
                }
            }
            for &(name, meaning) in SERVICE_LOSS_STATS {
                if let Some(&value) = info.service.get(name).filter(|&&v| v > 0) {
                    service_loss += value;
                    self.out.loss.stats.push((
                        format!("service: {name}"),
                        value,
                        meaning.to_owned(),
                    ));
                }
            }
            self.out.stats = Some(info);
        }
        let any_first_flag = self.sequences.values().any(|s| s.first_flagged);
        let mut sequences = std::mem::take(&mut self.sequences);
        self.match_slices(&mut sequences);
        self.match_flows();
        let mut any_loss = service_loss > 0 || !lossy_buffers.is_empty();
        for seq in sequences.values_mut() {
            seq.info.buffer = self.buffer_of_sequence.get(&seq.info.id).copied();
            let recorded = service_loss > 0 || applies(&lossy_buffers, seq.info.buffer);
            let wrapped = applies(&wrapped_buffers, seq.info.buffer);
            // Without `first_packet_on_sequence` anywhere in the trace
            // (SDKs before v29, or a ring wrap that overwrote every
            // sequence's start), a sequence that starts with a clear started
            // cleanly, unless its buffer wrapped: then that clear may be a
            // periodic one, after the overwritten start.
            seq.info.start_lost =
                !seq.first_flagged && (any_first_flag || !seq.first_cleared || wrapped);
            let mut evidence = std::mem::take(&mut seq.evidence);
            // Times on a clock a later snapshot related: the earlier
            // snapshot that did may have gone with a marked loss, or with
            // a start a ring buffer overwrote (those are counted).
            let target = self.trace_clock.unwrap_or(BOOTTIME);
            let mut unplaced_after_wrap = 0;
            evidence.retain(|e| {
                let Some(t) = e.clock else { return true };
                if !self.clock_graph.relates(seq.info.id, t.clock, target) {
                    return true;
                }
                if t.after_mark {
                    return false;
                }
                let counted = seq.info.start_lost && wrapped;
                unplaced_after_wrap += u64::from(counted);
                !counted
            });
            if seq.info.start_lost && wrapped {
                seq.info.unresolvable_after_wrap = seq.skipped_before_clear + unplaced_after_wrap;
                seq.info.skipped_packets -= seq.skipped_before_clear;
            }
            let loss = &mut self.out.loss;
            loss.loss_marks += seq.info.loss_marks;
            loss.skipped_packets += seq.info.skipped_packets;
            loss.unresolvable_after_wrap += seq.info.unresolvable_after_wrap;
            if seq.info.start_lost {
                loss.sequences_start_lost += 1;
            }
            any_loss |= seq.marked || seq.info.start_lost || seq.info.skipped_packets > 0;
            if seq.info.start_lost {
                if recorded || wrapped {
                    // What the lost start explains: slices begun before it,
                    // and whatever failed before the first clear.
                    for e in evidence {
                        if e.kind != ProblemKind::Nesting && !e.lost_with_start {
                            self.problem(e.kind, e.message);
                        }
                    }
                } else {
                    let consequences = if evidence.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; {} event(s) depend on what is missing, e.g. {}",
                            evidence.len(),
                            evidence[0].message
                        )
                    };
                    self.problem(
                        ProblemKind::UnmarkedLoss,
                        format!(
                            "sequence {} (pid {:?}): its first packet lacks \
                             first_packet_on_sequence, so its start is missing, and no \
                             statistic records a loss{consequences}",
                            seq.info.id, seq.info.pids
                        ),
                    );
                }
            } else {
                for e in evidence {
                    self.problem(e.kind, e.message);
                }
            }
        }
        for (track, seq_id, at) in std::mem::take(&mut self.counter_uses) {
            let is_counter = self.tracks.get(&track).is_some_and(|t| t.kind == "counter");
            let excused = sequences.get(&seq_id).is_some_and(|s| s.info.start_lost);
            if !is_counter && !excused {
                self.problem(
                    ProblemKind::Counters,
                    format!(
                        "{at}: COUNTER on track {track}, which no descriptor declares a counter"
                    ),
                );
            }
        }
        let open_starts = self.out.track_events.flows_unpaired_start;
        let any_loss = any_loss || self.out.loss.any();
        if !any_loss {
            if open_starts > 0 {
                self.problem(
                    ProblemKind::Flows,
                    format!("{open_starts} flow(s) started but never continued or terminated"),
                );
            }
            let ends = self.out.track_events.flows_unpaired_end;
            if ends > 0 {
                self.problem(
                    ProblemKind::Flows,
                    format!("{ends} terminating flow id(s) matched no started flow"),
                );
            }
        }
        self.out.sequences = sequences.into_values().map(|s| s.info).collect();
        self.out.machines = machines(std::mem::take(&mut self.machines), &self.out.sequences);
        let mut tracks: Vec<TrackInfo> = self.tracks.into_values().collect();
        tracks.sort_by_key(|t| (t.pid, t.tid, t.kind != "process", t.uuid));
        self.out.tracks = tracks;
        self.out.problems.sort_by_key(|p| p.kind);
        self.out
    }
}

/// The machines of a trace whose packets name machines other than the
/// host (none otherwise), with the counts of their `sequences`.
fn machines(mut seen: BTreeMap<u32, MachineInfo>, sequences: &[SequenceInfo]) -> Vec<MachineInfo> {
    for s in sequences {
        let m = seen.entry(s.machine_id).or_insert_with(|| MachineInfo {
            id: s.machine_id,
            ..Default::default()
        });
        m.sequences += 1;
        m.packets += s.packets;
        m.track_events += s.track_events;
    }
    if seen.keys().all(|&id| id == 0) {
        return Vec::new();
    }
    seen.entry(0).or_default();
    seen.into_values().collect()
}

/// Whether a buffer statistic of `buffers` concerns a sequence that wrote
/// to `buffer` (to an unknown buffer: any of them).
fn applies(buffers: &BTreeSet<u32>, buffer: Option<u32>) -> bool {
    match buffer {
        Some(buffer) => buffers.contains(&buffer),
        None => !buffers.is_empty(),
    }
}

fn intern(seq: &mut Sequence, data: InternedData, at: &str) {
    if !seq.valid {
        // Entries on a sequence whose state is unknown cannot be trusted to
        // be complete; a cleared packet comes first.
        return;
    }
    let put = |seq: &mut Sequence, table: Table, iid: Option<u64>, value: String| {
        let Some(iid) = iid else { return };
        if let Some(old) = seq.interned.insert((table, iid), value.clone()) {
            if old != value && !seq.marked {
                seq.evidence.push(Evidence {
                    clock: None,
                    kind: ProblemKind::Interning,
                    lost_with_start: !seq.ever_valid,
                    message: format!(
                        "{at}: {} iid {iid} redefined from {old:?} to {value:?} without an \
                         incremental-state clear",
                        table.label()
                    ),
                });
            }
        }
    };
    for e in data.event_categories {
        put(seq, Table::Categories, e.iid, e.name.unwrap_or_default());
    }
    for e in data.event_names {
        put(seq, Table::Names, e.iid, e.name.unwrap_or_default());
    }
    for e in data.debug_annotation_names {
        put(seq, Table::ArgNames, e.iid, e.name.unwrap_or_default());
    }
    for e in data.debug_annotation_string_values {
        let text = String::from_utf8_lossy(e.str.as_deref().unwrap_or_default()).into_owned();
        put(seq, Table::ArgStrings, e.iid, text);
    }
}

/// The main facts of a serialized TraceConfig.
pub fn config_info(bytes: &[u8]) -> ConfigInfo {
    let text = crate::config::to_text(bytes);
    let Ok(config) = TraceConfig::decode(bytes) else {
        return ConfigInfo {
            text,
            ..Default::default()
        };
    };
    let buffers = config
        .buffers
        .iter()
        .map(|b| {
            let policy = match b.fill_policy.unwrap_or(0) {
                2 => "discard",
                _ => "ring buffer",
            };
            (b.size_kb.unwrap_or(0), policy.to_owned())
        })
        .collect();
    let data_sources = config
        .data_sources
        .iter()
        .map(|ds| {
            let Ok(ds) = protos::from_raw::<DataSourceConfig>(ds.config.as_ref()) else {
                return "(undecodable data source config)".to_owned();
            };
            let name = ds.name.clone().unwrap_or_else(|| "(unnamed)".into());
            match protos::from_raw::<TrackEventConfig>(ds.track_event_config.as_ref()) {
                Ok(te) if ds.track_event_config.is_some() => {
                    let mut parts = Vec::new();
                    if !te.enabled_categories.is_empty() {
                        parts.push(format!("enabled: {}", te.enabled_categories.join(", ")));
                    }
                    if !te.disabled_categories.is_empty() {
                        parts.push(format!("disabled: {}", te.disabled_categories.join(", ")));
                    }
                    if parts.is_empty() {
                        name
                    } else {
                        format!("{name} ({})", parts.join("; "))
                    }
                }
                _ => name,
            }
        })
        .collect();
    ConfigInfo {
        buffers,
        data_sources,
        duration_ms: config.duration_ms.filter(|&d| d > 0),
        write_into_file: config.write_into_file == Some(true),
        text,
    }
}

/// The counters of a TraceStats, by field name (only integer fields that
/// are set and non-zero, plus `buffer_size`); the service's include its
/// `filter_stats` counters as `filter_stats.NAME`.
pub fn stats_info(stats: &TraceStats) -> StatsInfo {
    let counters = |message: DynamicMessage| -> BTreeMap<String, u64> {
        message
            .fields()
            .filter_map(|(field, value)| {
                let v = match value {
                    ReflectValue::U64(v) => *v,
                    ReflectValue::U32(v) => u64::from(*v),
                    ReflectValue::I64(v) => u64::try_from(*v).ok()?,
                    ReflectValue::I32(v) => u64::try_from(*v).ok()?,
                    ReflectValue::EnumNumber(v) => u64::try_from(*v).ok()?,
                    _ => return None,
                };
                (v > 0).then(|| (field.name().to_owned(), v))
            })
            .collect()
    };
    let decode = |name: &str, bytes: Vec<u8>| {
        DynamicMessage::decode(schema::message(name), bytes.as_slice())
            .unwrap_or_else(|_| DynamicMessage::new(schema::message(name)))
    };
    StatsInfo {
        buffers: stats
            .buffer_stats
            .iter()
            .map(|b| counters(decode("TraceStats.BufferStats", b.encode_to_vec())))
            .collect(),
        service: counters(decode("TraceStats", stats.encode_to_vec()))
            .into_iter()
            .chain(stats.filter_stats.iter().flat_map(|f| {
                let filter = counters(decode("TraceStats.FilterStats", f.encode_to_vec()));
                filter
                    .into_iter()
                    .map(|(name, v)| (format!("filter_stats.{name}"), v))
            }))
            .collect(),
    }
}
