#!/usr/bin/env python3
"""Semantic checker for Perfetto traces written by the interop tests.

Decodes one or more trace files (concatenated in the order given, as the
successive ReadBuffers of one session) with the official schema from the PyPI
`perfetto` package, replays every packet sequence the way a trace processor
would, and compares what it finds with what the producers say they emitted.

    check_trace.py --trace FILE [--trace FILE ...] --expect EXPECT.json
                   [--report REPORT.json] [--quiet]

EXPECT.json:
    {
      "producers": [{"pid": 1234 | null, "emitted": {"slice_begin": 10, ...},
                     "counted_lost": 3}],
      "loss": "none" | "allowed",
      "require_trace_stats": true,
      "remote_producers": false
    }
`pid: null` matches the packets of every producer together.
`remote_producers` (optional, default false): the producers connected over
TCP or vsock, whose pid the service does not know: their packets must carry
no trusted_pid (then `pid` must be null). The keys of
`emitted` are EMITTED_KEYS below (those the producer driver reports).
`counted_lost` (optional) is how many of the emitted track events the
producer itself counts as lost (dropped, or left out for a dropped one's
sake, less those it wrote late after all): the trace must then hold exactly the emitted track events less these
(all types together), and a shortfall they account for needs no loss
indicator in the trace (a thread that never got a chunk of shared memory
has no sequence in the trace to carry a loss mark).

Checks, per producer sequence (trusted_packet_sequence_id):
  * trusted_uid, trusted_pid and trusted_packet_sequence_id are present
    (trusted_pid absent instead, for remote producers);
  * incremental state: SEQ_INCREMENTAL_STATE_CLEARED resets the interning
    tables and the packet defaults (not the clocks: a trace processor keeps
    every clock snapshot); a packet that needs incremental state while it is
    invalid (never cleared, or after a loss mark) is skipped and counted, as
    a trace processor would;
  * every interned id used (event categories, event names, debug annotation
    names, interned debug annotation string values) resolves;
  * timestamps resolve to the trace clock as a trace processor resolves them
    (ClockGraph below: every clock snapshot of the trace in one graph,
    sequence-scoped clocks 64..127 per sequence, conversions in up to four
    hops, incremental clock deltas re-based at each snapshot holding the
    clock), when they are read: a negative delta on an incremental clock, a
    sequence-scoped clock the sequence does not define, a clock no snapshot
    names or that no chain of snapshots relates to the trace clock, and a
    snapshot a trace processor refuses are violations. A packet carrying a
    snapshot has its own timestamp ignored, as a trace processor ignores
    it. An absolute timestamp earlier than the sequence's latest one is
    legal (a trace processor sorts events by time; the SDK writes an
    explicit earlier time that way): it is counted ("out_of_order"), not a
    violation; only the sequence's own times are compared (the trace clock
    and sequence-scoped clocks, not a time chosen on MONOTONIC or
    REALTIME). After a loss mark and before the next clear, incremental
    deltas are not resolved (their base may be lost);
  * slices nest per track in time order, as a trace processor pairs them
    (it sorts every event by timestamp, equal timestamps in the order it read
    them): every SLICE_END closes an open SLICE_BEGIN (LIFO), and nothing is
    left open. Packet order may differ from time order (an explicit earlier
    time, or several sequences writing on one track). An event whose time
    does not resolve takes its sequence's last resolved time;
  * flows link in time order (equal times in packet order), as a trace
    processor links them: an id in flow_ids starts a flow or, if a flow with
    that id is open, continues it (a flow may have many steps); an id in
    terminating_flow_ids continues and ends the open flow, so the id may
    start a new flow afterwards. A trace processor ignores a terminating id
    with no open flow, and makes no link of a flow started and never
    continued or terminated: both are violations. It reads flow_ids_old
    (terminating_flow_ids_old) only when flow_ids (terminating_flow_ids) is
    empty, and only on events that make a slice: a COUNTER, or a SLICE_END
    that closes no slice, links no flow;
  * counter events point at a described counter track.
Relayed machines (producers forwarded by a relay): their packets carry
machine_id, and are counted per machine too ("machines" in the report);
the service describes each machine in a system_info packet with its
machine_id, and writes its clock exchanges with the relay in a
remote_clock_sync packet with its machine_id and no sequence id (as
upstream's service writes it), which must hold at least one complete round
(a PING's and an UPDATE's readings, both sides, BOOTTIME in each). From
the exchanges the report gives each machine's clock offsets as a trace
processor computes them (see remote_clock_offsets), and the span of its
rounds; event times are reported per producer on their own machine's
trace clock (event_times), and the service's events on the central one
(service_event_times), so that a test can map each machine's events onto
the central clock and judge them. The checker itself judges nothing by
them.
Then across the trace: event counts per type match the expectation exactly
when loss is "none" (and no loss indicator may appear); when loss is
"allowed", counts may only fall short, and a shortfall must be explained by a
loss indicator (previous_packet_dropped mid-sequence, lost sequence start, or
overwrite/discard/packet-loss counters in trace_stats) or, exactly, by the
producer's `counted_lost`.

Exit status: 0 all checks passed, 1 violations found, 2 usage or environment
error. The report (JSON) carries everything the tests assert on.
"""

import argparse
import bisect
import collections
import json
import re
import sys
import zlib

try:
    from google.protobuf.message import DecodeError
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
except ImportError as e:  # pragma: no cover - environment problem
    sys.stderr.write(
        "check_trace.py: cannot import the official Perfetto protos "
        "(perfetto.protos.perfetto.trace.perfetto_trace_pb2): %s\n"
        "Install them with `pip install perfetto protobuf` "
        "(bash .ci/run does this).\n" % e)
    sys.exit(2)

SEQ_INCREMENTAL_STATE_CLEARED = 1
SEQ_NEEDS_INCREMENTAL_STATE = 2
SERVICE_SEQUENCE_ID = 1
BOOTTIME = 6
FIRST_SEQUENCE_SCOPED_CLOCK = 64

# Keys a producer reports, and how each one is counted in the trace.
EMITTED_KEYS = (
    "slice_begin", "slice_end", "instant", "counter_int", "counter_double",
    "flow_begin", "flow_end", "large", "large_bytes", "arg_int", "arg_uint",
    "arg_double", "arg_bool", "arg_string", "arg_pointer",
)
# The keys that count track events (one each).
TRACK_EVENT_KEYS = ("slice_begin", "slice_end", "instant", "counter_int",
                    "counter_double")
# Producer-side bookkeeping with no trace counterpart.
PRODUCER_ONLY_KEYS = ("skipped_disabled",)
# The producer driver's huge-annotation event (see interop/real_producer.cc).
LARGE_EVENT_NAME = "large"
LARGE_ARG_NAME = "blob"

ARG_KIND_KEYS = {
    "int_value": "arg_int",
    "uint_value": "arg_uint",
    "double_value": "arg_double",
    "bool_value": "arg_bool",
    "string_value": "arg_string",
    "string_value_iid": "arg_string",
    "pointer_value": "arg_pointer",
}

TYPE_SLICE_BEGIN = pb.TrackEvent.TYPE_SLICE_BEGIN
TYPE_SLICE_END = pb.TrackEvent.TYPE_SLICE_END
TYPE_INSTANT = pb.TrackEvent.TYPE_INSTANT
TYPE_COUNTER = pb.TrackEvent.TYPE_COUNTER
TYPE_KEYS = {
    TYPE_SLICE_BEGIN: "slice_begin",
    TYPE_SLICE_END: "slice_end",
    TYPE_INSTANT: "instant",
}

# TraceStats.BufferStats counters that mean data was lost or rejected.
# (readaheads_failed is not one: a read that finds a fragmented packet whose
# next chunk has not been committed yet counts it and retries later.)
BUFFER_LOSS_STATS = (
    "chunks_overwritten", "chunks_discarded", "trace_writer_packet_loss",
    "abi_violations", "patches_failed",
)
SERVICE_LOSS_STATS = ("chunks_discarded", "patches_discarded",
                      "invalid_packets")

FIRST_RESERVED_CLOCK = 128
MAX_CLOCK_HOPS = 4
INT64 = 1 << 64


def to_int64(value):
    """Wraps an integer to int64, as the trace processor's arithmetic."""
    value %= INT64
    return value - INT64 if value >= 1 << 63 else value


def clock_key(seq_id, clock_id):
    """The clock domain clock_id names on seq_id: sequence-scoped ids are
    one clock per sequence, the others one clock for the whole trace."""
    scoped = FIRST_SEQUENCE_SCOPED_CLOCK <= clock_id < FIRST_RESERVED_CLOCK
    return (clock_id, seq_id if scoped else 0)


def describe_clock(key):
    clock_id, seq_id = key
    if seq_id:
        return "clock %d of sequence %d" % (clock_id, seq_id)
    return "clock %d" % clock_id


# Two clock exchanges of a relay belong to one round when the client's
# BOOTTIME readings lie less than this apart (a trace processor's rule; the
# relays sync every 30 s).
SYNC_ROUND_NS = 30 * 1000000000


def c_div(a, b):
    """Integer division rounding toward zero, as C++'s."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def remote_clock_offsets(exchanges):
    """A relayed machine's clock offsets (its clock minus the central
    one's, ns, per clock id), computed as Perfetto's trace processor does
    from the exchanges of a remote_clock_sync packet (`exchanges`: [(host
    clocks, client clocks)], each {clock id: timestamp}, in order), and the
    rounds it used.

    Each exchange and the one after it are taken as a round (a PING, read
    t1c by the relay and t1h by the service on receipt, and an UPDATE, t2c
    and t2h), unless the relay's BOOTTIME readings lie SYNC_ROUND_NS or
    more apart. A round gives two estimates per clock both sides read
    (non-zero): the midpoint of the relay's two readings less t1h, and t2c
    less the midpoint of the service's; the offset is the mean of every
    estimate, truncated as C++ integers are. Returns {"offsets": {clock id:
    offset}, "rounds": n, "max_span": ns}, where a round's span is the
    longer of t2c - t1c and t2h - t1h on BOOTTIME: the true offset of
    clocks that differ by a constant lies within half of it of either
    estimate."""
    estimates = collections.defaultdict(list)
    rounds = 0
    max_span = 0
    for (h1, c1), (h2, c2) in zip(exchanges, exchanges[1:]):
        if c2.get(BOOTTIME, 0) - c1.get(BOOTTIME, 0) >= SYNC_ROUND_NS:
            continue
        rounds += 1
        max_span = max(max_span, c2.get(BOOTTIME, 0) - c1.get(BOOTTIME, 0),
                       h2.get(BOOTTIME, 0) - h1.get(BOOTTIME, 0))
        for clock in set(h1) | set(c1):
            t1h, t1c = h1.get(clock, 0), c1.get(clock, 0)
            t2h, t2c = h2.get(clock, 0), c2.get(clock, 0)
            if not (t1h and t1c and t2h and t2c):
                continue
            estimates[clock].append(c_div(t1c + t2c, 2) - t1h)
            estimates[clock].append(t2c - c_div(t1h + t2h, 2))
    return {"offsets": {str(clock): c_div(sum(e), len(e))
                        for clock, e in sorted(estimates.items())},
            "rounds": rounds, "max_span": max_span}


class ClockGraph:
    """Every clock snapshot of a trace, as Perfetto's trace processor keeps
    them (ClockTracker/ClockSynchronizer): per clock domain and per set of
    clocks snapshotted together, a series of (snapshot id, time); an edge
    between each pair of clocks of a snapshot, both ways; conversions along
    the shortest chain of snapshots (breadth first, at most four hops),
    each hop through the latest snapshot of its series at or before the
    time (or the first one)."""

    def __init__(self):
        # key -> {"series": {set_id: ([snapshot ids], [times])},
        #         "unit": int, "incremental": bool, "last": int}
        self.domains = {}
        self.sets = {}
        self.edges = collections.defaultdict(set)  # key -> {(key, set_id)}
        self.non_monotonic = set()
        self.snapshots = 0

    def knows(self, seq_id, clock_id):
        return clock_key(seq_id, clock_id) in self.domains

    def is_incremental(self, seq_id, clock_id):
        domain = self.domains.get(clock_key(seq_id, clock_id))
        return domain is not None and domain["incremental"]

    def add_snapshot(self, seq_id, clocks, trace_clock):
        """Adds a snapshot read on seq_id; returns why a trace processor
        refuses it, or None."""
        keys = [clock_key(seq_id, c.clock_id) for c in clocks]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            return "%s appears twice" % describe_clock(dup)
        for c, key in zip(clocks, keys):
            unit = c.unit_multiplier_ns or 1
            domain = self.domains.get(key)
            if domain is None and c.is_incremental and key[1] == 0:
                return ("%s is not sequence-scoped and cannot be incremental"
                        % describe_clock(key))
            if domain is not None and (domain["unit"] != unit or
                                       domain["incremental"] !=
                                       c.is_incremental):
                return ("%s was defined before with another unit or "
                        "incremental flag" % describe_clock(key))
        set_id = self.sets.setdefault(tuple(sorted(keys)), len(self.sets))
        trace_key = clock_key(0, trace_clock)
        for c, key in zip(clocks, keys):
            if key != trace_key or key not in self.domains:
                continue
            ns = to_int64(c.timestamp * (c.unit_multiplier_ns or 1))
            times = self.domains[key]["series"].get(set_id, ([], []))[1]
            if times and ns < times[-1]:
                return ("the trace clock (%s) goes back in time" %
                        describe_clock(key))
        snapshot = self.snapshots
        self.snapshots += 1
        for c, key in zip(clocks, keys):
            domain = self.domains.setdefault(key, {
                "series": {}, "unit": c.unit_multiplier_ns or 1,
                "incremental": c.is_incremental, "last": 0})
            ns = to_int64(c.timestamp * domain["unit"])
            domain["last"] = ns
            ids, times = domain["series"].setdefault(set_id, ([], []))
            if times and ns < times[-1]:
                # Not monotonic: no conversion starts from it any more.
                self.non_monotonic.add(key)
                self.edges.pop(key, None)
            ids.append(snapshot)
            times.append(ns)
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                if a not in self.non_monotonic:
                    self.edges[a].add((b, set_id))
                if b not in self.non_monotonic:
                    self.edges[b].add((a, set_id))
        return None

    def find_path(self, src, dst):
        queue = collections.deque([(src, [])])
        while queue:
            at, path = queue.popleft()
            if len(path) >= MAX_CLOCK_HOPS:
                continue
            for nxt, set_id in sorted(self.edges.get(at, ())):
                step = path + [(at, nxt, set_id)]
                if nxt == dst:
                    return step
                queue.append((nxt, step))
        return None

    def convert(self, seq_id, clock_id, timestamp, target):
        """(time on the target clock, None) or (None, why not)."""
        src = clock_key(seq_id, clock_id)
        dst = clock_key(0, target)
        if src == dst:
            return timestamp, None
        if src not in self.domains:
            return None, "unknown source"
        if dst not in self.domains:
            return None, "no path"
        path = self.find_path(src, dst)
        if path is None:
            return None, "no path"
        domain = self.domains[src]
        if domain["incremental"]:
            domain["last"] = to_int64(domain["last"] +
                                      timestamp * domain["unit"])
            ns = domain["last"]
        else:
            ns = to_int64(timestamp * domain["unit"])
        for a, b, set_id in path:
            ids_a, times_a = self.domains[a]["series"][set_id]
            ids_b, times_b = self.domains[b]["series"][set_id]
            i = max(bisect.bisect_right(times_a, ns) - 1, 0)
            j = bisect.bisect_left(ids_b, ids_a[i])
            ns = to_int64(ns + times_b[j] - times_a[i])
        return ns, None


class Sequence:
    """Replay state of one packet sequence."""

    def __init__(self, seq_id):
        self.id = seq_id
        self.pids = set()
        self.uids = set()
        self.packets = 0
        self.track_events = 0
        self.cleared = 0
        self.loss_marks = 0
        self.start_lost = False
        self.lossy = False
        self.skipped_incremental = 0
        self.valid = False
        self.interned = {}
        self.defaults = None
        self.latest_boot_ts = None
        self.last_boot_ts = None
        self.out_of_order = 0

    def reset_incremental_state(self):
        self.valid = True
        self.interned = {
            "event_categories": {},
            "event_names": {},
            "debug_annotation_names": {},
            "debug_annotation_string_values": {},
        }
        self.defaults = None

    def summary(self):
        return {
            "id": self.id,
            "pids": sorted(self.pids),
            "uids": sorted(self.uids),
            "packets": self.packets,
            "track_events": self.track_events,
            "cleared": self.cleared,
            "loss_marks": self.loss_marks,
            "start_lost": self.start_lost,
            "skipped_incremental": self.skipped_incremental,
            "out_of_order": self.out_of_order,
        }


def is_repeated(field):
    # protobuf >= 5 has `is_repeated`; older releases only `label`.
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def scalar_fields(message):
    """The set scalar fields of a message, as a plain dict."""
    out = {}
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE and not is_repeated(field):
            out[field.name] = value
    return out


class Checker:
    def __init__(self, expect):
        self.expect = expect
        self.violations = []
        self.sequences = {}
        self.kinds = collections.Counter()
        self.counts = collections.defaultdict(collections.Counter)
        self.by_name = collections.Counter()
        self.by_category = collections.Counter()
        self.resolved = collections.Counter()
        self.unresolved = collections.Counter()
        # (track, ts, packet number, begin?, lossy?) per slice event, paired
        # in time order at the end.
        self.slice_marks = []
        # (number of its first packet, path) per trace file.
        self.files = []
        self.open_slices = 0
        self.max_depth = 0
        self.unmatched_ends_after_loss = 0
        # (ts, packet number, flow ids, terminating flow ids) per event
        # with flows, linked in time order at the end.
        self.flow_marks = []
        # Packet numbers of the SLICE_ENDs that closed no slice.
        self.unmatched_end_packets = set()
        self.flows = collections.Counter()
        self.counter_tracks = set()
        self.counter_track_uses = collections.Counter()
        self.described_tracks = set()
        self.trace_stats = None
        self.service_kinds = collections.Counter()
        # TracingServiceEvent fields set, by name.
        self.service_events = collections.Counter()
        self.trace_config = None
        self.service_version = None
        self.packets = 0
        # Per machine id (0: the service's machine): producer packets and
        # track event counts; machines described and clock-synced.
        self.machine = 0
        self.machine_packets = collections.Counter()
        self.machine_counts = collections.defaultdict(collections.Counter)
        self.machines_described = set()
        self.remote_clock_syncs = {}
        # Per machine id, its clock exchanges: [(host clocks, client
        # clocks)], each {clock id: timestamp}, in trace order.
        self.remote_exchanges = {}
        # Per producer pid: [machine id, first, last] track event time on
        # its machine's trace clock.
        self.event_times = {}
        # Service event name -> its packets' timestamps.
        self.service_event_times = collections.defaultdict(list)
        self.clocks = ClockGraph()
        self.trace_clock = BOOTTIME

    def violation(self, message):
        if len(self.violations) < 200:
            self.violations.append(message)
        elif len(self.violations) == 200:
            self.violations.append("... (further violations omitted)")

    # ------------------------------------------------------------------
    def run(self, traces):
        for path, trace in traces:
            self.files.append((self.packets, path))
            for index, packet in enumerate(trace.packet):
                self.packets += 1
                self.packet(packet, "%s#%d" % (path, index))
        self.finish()

    def packet(self, packet, where):
        kind = packet.WhichOneof("data") or "(none)"
        self.kinds[kind] += 1
        if kind == "remote_clock_sync":
            self.remote_clock_sync(packet, where)
            return
        if not packet.HasField("trusted_packet_sequence_id"):
            self.violation("%s: packet without trusted_packet_sequence_id" %
                           where)
            return
        if not packet.HasField("trusted_uid"):
            self.violation("%s: packet without trusted_uid" % where)
        seq_id = packet.trusted_packet_sequence_id
        if seq_id == SERVICE_SEQUENCE_ID:
            self.service_kinds[kind] += 1
            if kind == "trace_stats":
                self.trace_stats = packet.trace_stats
            elif kind == "service_event":
                for field, _ in packet.service_event.ListFields():
                    self.service_events[field.name] += 1
                    if packet.HasField("timestamp"):
                        self.service_event_times[field.name].append(
                            packet.timestamp)
            elif kind == "trace_config":
                self.trace_config = packet.trace_config
            elif kind == "system_info" and packet.machine_id:
                self.machines_described.add(packet.machine_id)
            elif kind == "system_info":
                if packet.system_info.HasField("tracing_service_version"):
                    self.service_version = \
                        packet.system_info.tracing_service_version
            elif kind == "clock_snapshot":
                snapshot = packet.clock_snapshot
                if snapshot.primary_trace_clock:
                    self.trace_clock = snapshot.primary_trace_clock
                self.clock_snapshot(seq_id, snapshot, where)
            return
        if self.expect.get("remote_producers", False):
            if packet.HasField("trusted_pid"):
                self.violation("%s: remote producer packet with trusted_pid %d"
                               % (where, packet.trusted_pid))
        elif not packet.HasField("trusted_pid"):
            self.violation("%s: producer packet without trusted_pid" % where)
        seq = self.sequences.get(seq_id)
        first = seq is None
        if first:
            seq = self.sequences[seq_id] = Sequence(seq_id)
        seq.packets += 1
        self.machine = packet.machine_id
        self.machine_packets[packet.machine_id] += 1
        seq.pids.add(packet.trusted_pid)
        seq.uids.add(packet.trusted_uid)
        pid = packet.trusted_pid

        if first and not packet.first_packet_on_sequence:
            seq.start_lost = True
            seq.lossy = True
        if packet.previous_packet_dropped and not first:
            # The very first packet read from a sequence is flagged by the
            # service (TraceBufferV1) with no loss involved.
            seq.loss_marks += 1
            seq.lossy = True
            seq.valid = False
        flags = packet.sequence_flags
        if flags & SEQ_INCREMENTAL_STATE_CLEARED:
            seq.cleared += 1
            seq.reset_incremental_state()
        if (flags & SEQ_NEEDS_INCREMENTAL_STATE) and not seq.valid:
            seq.skipped_incremental += 1
            return
        if packet.HasField("trace_packet_defaults"):
            seq.defaults = packet.trace_packet_defaults
        if packet.HasField("interned_data"):
            self.intern(seq, packet.interned_data, where)
        # track_event, clock_snapshot and track_descriptor are members of
        # the `data` oneof: `kind` says which one is set.
        if kind == "clock_snapshot":
            # A trace processor takes the snapshot and nothing else of its
            # packet (not even the timestamp).
            self.clock_snapshot(seq.id, packet.clock_snapshot, where)
            return
        if kind == "track_descriptor":
            desc = packet.track_descriptor
            self.described_tracks.add(desc.uuid)
            if desc.HasField("counter"):
                self.counter_tracks.add(desc.uuid)
        boot = self.timestamp(seq, packet, where)
        if kind == "track_event" and boot is not None:
            times = self.event_times.setdefault(pid, [packet.machine_id, boot,
                                                      boot])
            times[1] = min(times[1], boot)
            times[2] = max(times[2], boot)
        if kind == "track_event":
            seq.track_events += 1
            self.track_event(seq, pid, packet.track_event, where)

    def intern(self, seq, data, where):
        if not seq.valid:
            # Interned data on a sequence whose state is unknown cannot be
            # trusted to be complete; a cleared packet will come first.
            return
        for table in seq.interned:
            for entry in getattr(data, table):
                name = entry.name if table != "debug_annotation_string_values" \
                    else entry.str
                old = seq.interned[table].get(entry.iid)
                if old is not None and old != name:
                    self.violation(
                        "%s: %s iid %d redefined from %r to %r without an "
                        "incremental state clear" %
                        (where, table, entry.iid, old, name))
                seq.interned[table][entry.iid] = name

    def clock_snapshot(self, seq_id, snapshot, where):
        clocks = [c for c in snapshot.clocks
                  if c.HasField("clock_id") and c.HasField("timestamp")]
        why = self.clocks.add_snapshot(seq_id, clocks, self.trace_clock)
        if why is not None:
            self.violation("%s: clock snapshot refused (as a trace processor "
                           "does): %s" % (where, why))

    def timestamp(self, seq, packet, where):
        """The packet's time on the trace clock, or None."""
        if not packet.HasField("timestamp"):
            return None
        clock_id = packet.timestamp_clock_id
        if not clock_id and seq.defaults is not None:
            clock_id = seq.defaults.timestamp_clock_id
        clock_id = clock_id or BOOTTIME
        ts = packet.timestamp
        if self.clocks.is_incremental(seq.id, clock_id):
            if ts >= 1 << 63:
                self.violation("%s: negative incremental timestamp delta "
                               "%d on clock %d" % (where, ts - (1 << 64),
                                                   clock_id))
                return None
            if seq.loss_marks and not seq.valid:
                return None  # The deltas since the last clear may be lost.
        boot, why = self.clocks.convert(seq.id, clock_id, ts,
                                        self.trace_clock)
        if why == "unknown source" and \
                clock_id >= FIRST_SEQUENCE_SCOPED_CLOCK:
            self.violation("%s: timestamp on sequence-scoped clock %d that "
                           "sequence %d never defined" %
                           (where, clock_id, seq.id))
            return None
        if why == "unknown source":
            self.violation("%s: timestamp on clock %d, which no clock "
                           "snapshot names" % (where, clock_id))
            return None
        if why is not None:
            self.violation("%s: timestamp on %s cannot be converted to clock "
                           "%d: no chain of clock snapshots relates them" %
                           (where, describe_clock(clock_key(seq.id,
                                                            clock_id)),
                            self.trace_clock))
            return None
        # Earlier than the latest time is legal: a trace processor sorts.
        # Deltas are never negative, so only an absolute timestamp or a clock
        # a snapshot re-anchored gets here. Only the sequence's own times are
        # compared (the trace clock, sequence-scoped clocks): a time on
        # another global clock (MONOTONIC, REALTIME) is one the producer chose
        # on that clock.
        if clock_id == self.trace_clock or \
                clock_id >= FIRST_SEQUENCE_SCOPED_CLOCK:
            if seq.latest_boot_ts is not None and boot < seq.latest_boot_ts:
                seq.out_of_order += 1
            else:
                seq.latest_boot_ts = boot
        seq.last_boot_ts = boot
        return boot

    def resolve(self, seq, table, iid, where):
        name = seq.interned[table].get(iid) if seq.valid else None
        if name is None:
            self.unresolved[table] += 1
            self.violation("%s: %s iid %d does not resolve on sequence %d" %
                           (where, table, iid, seq.id))
        else:
            self.resolved[table] += 1
        return name

    def remote_clock_sync(self, packet, where):
        """A relayed machine's clock exchanges (see the module docs)."""
        if not packet.machine_id:
            self.violation("%s: remote_clock_sync without machine_id" % where)
            return
        if not packet.HasField("trusted_uid"):
            self.violation("%s: remote_clock_sync without trusted_uid" % where)
        exchanges = packet.remote_clock_sync.synced_clocks
        self.remote_exchanges[packet.machine_id] = [
            tuple({c.clock_id: c.timestamp for c in s.clocks}
                  for s in (e.host_clocks, e.client_clocks))
            for e in exchanges]
        boot = []
        for e in exchanges:
            sides = [{c.clock_id: c.timestamp for c in s.clocks}
                     for s in (e.client_clocks, e.host_clocks)]
            if all(BOOTTIME in s for s in sides):
                boot.append(sides)
        if len(boot) < 2:
            self.violation("%s: remote_clock_sync of machine %d holds %d "
                           "exchanges with BOOTTIME on both sides, a round "
                           "needs 2" % (where, packet.machine_id, len(boot)))
        else:
            # Each side's clock moves forward from one exchange to the next.
            for a, b in zip(boot, boot[1:]):
                for side in (0, 1):
                    if b[side][BOOTTIME] < a[side][BOOTTIME]:
                        self.violation("%s: remote_clock_sync of machine %d "
                                       "goes back in time" %
                                       (where, packet.machine_id))
        if packet.machine_id in self.remote_clock_syncs:
            self.violation("%s: a second remote_clock_sync of machine %d" %
                           (where, packet.machine_id))
        self.remote_clock_syncs[packet.machine_id] = len(exchanges)

    def track_event(self, seq, pid, event, where):
        counts = TeeCounter(self.counts[pid],
                            self.machine_counts[self.machine])
        name = None
        name_field = event.WhichOneof("name_field")
        if name_field == "name_iid":
            name = self.resolve(seq, "event_names", event.name_iid, where)
        elif name_field == "name":
            name = event.name
        by_category = self.by_category
        for cat in event.categories:
            by_category[cat] += 1
        for iid in event.category_iids:
            cat = self.resolve(seq, "event_categories", iid, where)
            if cat is not None:
                by_category[cat] += 1
        event_type = event.type
        if event_type != TYPE_SLICE_END and event_type != TYPE_COUNTER:
            self.by_name[name] += 1

        if event.HasField("track_uuid"):
            track = event.track_uuid
        elif seq.defaults is not None and \
                seq.defaults.track_event_defaults.HasField("track_uuid"):
            track = seq.defaults.track_event_defaults.track_uuid
        else:
            track = 0

        type_key = TYPE_KEYS.get(event_type)
        if type_key:
            counts[type_key] += 1
        if event_type == TYPE_SLICE_BEGIN or event_type == TYPE_SLICE_END:
            self.slice_marks.append((
                track, seq.last_boot_ts or 0, self.packets,
                event_type == TYPE_SLICE_BEGIN, seq.lossy))
        elif event_type == TYPE_COUNTER:
            which = event.WhichOneof("counter_value_field")
            if which == "counter_value":
                counts["counter_int"] += 1
            elif which == "double_counter_value":
                counts["counter_double"] += 1
            else:
                self.violation("%s: COUNTER event without a value" % where)
            self.counter_track_uses[track] += 1
            if track not in self.counter_tracks and not seq.lossy:
                self.violation("%s: counter on track %d, which no "
                               "track_descriptor describes as a counter" %
                               (where, track))
        elif event_type != TYPE_INSTANT:
            self.violation("%s: unexpected track event type %d" %
                           (where, event_type))

        counts["flow_begin"] += len(event.flow_ids) + len(event.flow_ids_old)
        counts["flow_end"] += len(event.terminating_flow_ids) + \
            len(event.terminating_flow_ids_old)
        begun = event.flow_ids or event.flow_ids_old
        ended = event.terminating_flow_ids or event.terminating_flow_ids_old
        if (begun or ended) and event_type in TYPE_KEYS:
            self.flow_marks.append((seq.last_boot_ts or 0, self.packets,
                                    list(begun), list(ended)))

        large = name == LARGE_EVENT_NAME
        if large:
            counts["large"] += 1
        for arg in event.debug_annotations:
            arg_name = None
            arg_name_field = arg.WhichOneof("name_field")
            if arg_name_field == "name_iid":
                arg_name = self.resolve(seq, "debug_annotation_names",
                                        arg.name_iid, where)
            elif arg_name_field == "name":
                arg_name = arg.name
            kind = arg.WhichOneof("value")
            if kind == "string_value_iid":
                self.resolve(seq, "debug_annotation_string_values",
                             arg.string_value_iid, where)
            key = ARG_KIND_KEYS.get(kind)
            if key:
                counts[key] += 1
            if large and arg_name == LARGE_ARG_NAME and \
                    kind == "string_value":
                counts["large_bytes"] += len(arg.string_value)

    # ------------------------------------------------------------------
    def finish(self):
        self.match_slices()
        if self.open_slices and self.expect["loss"] == "none":
            self.violation("%d slices were never closed" % self.open_slices)
        self.check_flows()
        self.check_counts()

    def match_slices(self):
        """Pairs slice ends with begins per track in time order (equal times
        in packet order): a SLICE_END closes the innermost open slice."""
        depth = collections.Counter()
        self.slice_marks.sort(key=lambda m: (m[0], m[1], m[2]))
        for track, _, number, begin, lossy in self.slice_marks:
            if begin:
                depth[track] += 1
                self.max_depth = max(self.max_depth, depth[track])
            elif depth[track]:
                depth[track] -= 1
            else:
                # No slice: a trace processor links none of its flows.
                self.unmatched_end_packets.add(number)
                if lossy:
                    self.unmatched_ends_after_loss += 1
                else:
                    self.violation(
                        "%s: SLICE_END with no open slice on track %d" %
                        (self.where(number), track))
        self.open_slices = sum(depth.values())

    def where(self, number):
        """`path#index` of the packet counted `number` (from 1) in run()."""
        first, path = [f for f in self.files if f[0] < number][-1]
        return "%s#%d" % (path, number - first - 1)

    def check_flows(self):
        """Links flows in time order (equal times in packet order)."""
        strict = self.expect["loss"] == "none"
        flows = self.flows
        # Open flow id -> (packet number of its start, links so far).
        open_flows = {}
        self.flow_marks.sort(key=lambda m: (m[0], m[1]))
        for _, number, begun, ended in self.flow_marks:
            if number in self.unmatched_end_packets:
                continue  # No slice to link.
            for flow in begun:
                if flow in open_flows:
                    start, links = open_flows[flow]
                    open_flows[flow] = (start, links + 1)
                    flows["links"] += 1
                else:
                    open_flows[flow] = (number, 0)
                    flows["started"] += 1
            for flow in ended:
                if flow in open_flows:
                    del open_flows[flow]
                    flows["links"] += 1
                    flows["terminated"] += 1
                    continue
                flows["unmatched_ends"] += 1
                if strict:
                    self.violation("%s: terminating flow id %d matches no "
                                   "open flow" % (self.where(number), flow))
        for flow, (start, links) in sorted(open_flows.items(),
                                           key=lambda f: f[1]):
            if links:
                continue
            flows["never_continued"] += 1
            if strict:
                self.violation("%s: flow %d started but never continued or "
                               "terminated" % (self.where(start), flow))

    def buffer_stats(self):
        if self.trace_stats is None:
            return []
        return [scalar_fields(b) for b in self.trace_stats.buffer_stats]

    def loss_indicators(self):
        out = collections.Counter()
        for seq in self.sequences.values():
            out["mid_sequence_loss_marks"] += seq.loss_marks
            out["sequences_start_lost"] += int(seq.start_lost)
            out["skipped_needing_incremental_state"] += seq.skipped_incremental
        for stats in self.buffer_stats():
            for key in BUFFER_LOSS_STATS:
                out["buffer." + key] += stats.get(key, 0)
        if self.trace_stats is not None:
            service = scalar_fields(self.trace_stats)
            for key in SERVICE_LOSS_STATS:
                out["service." + key] += service.get(key, 0)
        return {k: v for k, v in out.items() if v}

    def import_errors(self):
        """The import errors Perfetto's trace processor (v59) would record
        for this trace that depend on what the service wrote.

        config_write_into_file_no_flush: a write_into_file config without
        flush_period_ms, from a service older than v54 or of unknown
        version (src/trace_processor/importers/proto/proto_trace_reader.cc:
        since v54 the service flushes around its periodic writes; the
        version is the major number after "Perfetto v" in
        SystemInfo.tracing_service_version, up to a '.' or '-').
        """
        errors = []
        config = self.trace_config
        if config is not None and config.write_into_file and \
                not config.flush_period_ms:
            major = None
            version = self.service_version or ""
            prefix = "Perfetto v"
            if version.startswith(prefix):
                digits = re.match(r"(\d+)[.-]", version[len(prefix):])
                if digits:
                    major = int(digits.group(1))
            if major is None or major < 54:
                errors.append("config_write_into_file_no_flush")
        return errors

    def check_counts(self):
        loss = self.expect["loss"]
        indicators = self.loss_indicators()
        if loss == "none" and indicators:
            self.violation("data loss in a scenario that allows none: %s" %
                           json.dumps(indicators, sort_keys=True))
        if self.expect.get("require_trace_stats", True) and \
                self.trace_stats is None:
            self.violation("no trace_stats packet")
        for error in self.import_errors():
            self.violation("Perfetto's trace processor would record the "
                           "import error %s" % error)
        for required in ("trace_config", "clock_snapshot"):
            if self.expect.get("require_service_packets", True) and \
                    not self.service_kinds[required]:
                self.violation("no %s packet from the service" % required)

        explained = bool(indicators)
        for producer in self.expect["producers"]:
            pid = producer.get("pid")
            if pid is None:
                got = collections.Counter()
                for c in self.counts.values():
                    got.update(c)
                label = "all producers"
            else:
                got = self.counts.get(pid, collections.Counter())
                label = "producer pid %d" % pid
            emitted = producer["emitted"]
            counted_lost = producer.get("counted_lost")
            counted = False
            if counted_lost is not None:
                want = sum(emitted.get(k, 0) for k in TRACK_EVENT_KEYS)
                have = sum(got.get(k, 0) for k in TRACK_EVENT_KEYS)
                counted = have == want - counted_lost
                if not counted:
                    self.violation(
                        "%s: %d track events in the trace, but %d emitted "
                        "less %d the producer counted lost is %d" %
                        (label, have, want, counted_lost, want - counted_lost))
            for key, want in sorted(emitted.items()):
                if key in PRODUCER_ONLY_KEYS:
                    continue
                have = got.get(key, 0)
                if have == want:
                    continue
                if loss == "allowed" and have < want:
                    if not (explained or counted):
                        self.violation(
                            "%s: %s %d of %d, and nothing records a loss" %
                            (label, key, have, want))
                    continue
                self.violation("%s: %s expected %d, trace has %d" %
                               (label, key, want, have))

    def report(self):
        totals = collections.Counter()
        for c in self.counts.values():
            totals.update(c)
        service = scalar_fields(self.trace_stats) \
            if self.trace_stats is not None else None
        filter_stats = None
        if self.trace_stats is not None and \
                self.trace_stats.HasField("filter_stats"):
            filter_stats = scalar_fields(self.trace_stats.filter_stats)
        return {
            "ok": not self.violations,
            "violations": self.violations,
            "packets": self.packets,
            "packets_by_kind": dict(self.kinds),
            "service_packets_by_kind": dict(self.service_kinds),
            "service_events": dict(self.service_events),
            "import_errors": self.import_errors(),
            "totals": {k: totals.get(k, 0) for k in EMITTED_KEYS},
            "producers": {str(pid): {k: c.get(k, 0) for k in EMITTED_KEYS}
                          for pid, c in self.counts.items()},
            "events_by_name": {str(k): v for k, v in self.by_name.items()},
            "events_by_category": dict(self.by_category),
            "sequences": [s.summary() for _, s in
                          sorted(self.sequences.items())],
            "interning": {"resolved": dict(self.resolved),
                          "unresolved": dict(self.unresolved)},
            "slices": {"open": self.open_slices,
                       "max_depth": self.max_depth,
                       "unmatched_ends_after_loss":
                           self.unmatched_ends_after_loss},
            "flows": {k: self.flows.get(k, 0) for k in (
                "started", "links", "terminated", "never_continued",
                "unmatched_ends")},
            "counter_tracks": len(self.counter_tracks),
            "out_of_order": sum(s.out_of_order
                                for s in self.sequences.values()),
            "loss_indicators": self.loss_indicators(),
            "machines": {str(m): {"packets": n,
                                  "totals": {k: self.machine_counts[m].get(k, 0)
                                             for k in EMITTED_KEYS}}
                         for m, n in sorted(self.machine_packets.items())},
            "machines_described": sorted(self.machines_described),
            "remote_clock_syncs": {str(m): n for m, n in
                                   sorted(self.remote_clock_syncs.items())},
            "remote_clock_offsets": {
                str(m): remote_clock_offsets(e)
                for m, e in sorted(self.remote_exchanges.items())},
            "event_times": {str(pid): {"machine": t[0], "first": t[1],
                                       "last": t[2]}
                            for pid, t in sorted(self.event_times.items())},
            "service_event_times": dict(self.service_event_times),
            "trace_stats": service,
            "filter_stats": filter_stats,
            "buffer_stats": self.buffer_stats(),
        }


class TeeCounter:
    """Adds to two counters at once (a producer's, its machine's)."""

    def __init__(self, first, second):
        self.first = first
        self.second = second

    def __getitem__(self, key):
        return self.first[key]

    def __setitem__(self, key, value):
        delta = value - self.first[key]
        self.first[key] = value
        self.second[key] += delta


def load_expectation(path):
    with open(path) as f:
        expect = json.load(f)
    if expect.get("loss") not in ("none", "allowed"):
        raise ValueError("'loss' must be \"none\" or \"allowed\"")
    producers = expect.get("producers")
    if not isinstance(producers, list) or not producers:
        raise ValueError("'producers' must be a non-empty list")
    for producer in producers:
        unknown = set(producer.get("emitted", {})) - set(EMITTED_KEYS) - \
            set(PRODUCER_ONLY_KEYS)
        if unknown:
            raise ValueError("unknown emitted keys: %s" % sorted(unknown))
        lost = producer.get("counted_lost")
        if lost is not None and (isinstance(lost, bool) or
                                 not isinstance(lost, int) or lost < 0):
            raise ValueError("'counted_lost' must be a count, not %r" % lost)
    return expect


def inflated(trace):
    """`trace` with each `compressed_packets` batch (a zlib stream of a
    serialized Trace, written when the config asks for deflate) replaced by
    the packets it holds, as a trace processor reads them."""
    if not any(p.HasField("compressed_packets") for p in trace.packet):
        return trace
    out = pb.Trace()
    for packet in trace.packet:
        if packet.HasField("compressed_packets"):
            batch = pb.Trace()
            batch.ParseFromString(zlib.decompress(packet.compressed_packets))
            out.packet.extend(batch.packet)
        else:
            out.packet.append(packet)
    return out


def check(trace_paths, expect):
    """Decodes and checks the traces; returns the report dict."""
    traces = []
    for path in trace_paths:
        trace = pb.Trace()
        with open(path, "rb") as f:
            data = f.read()
        trace.ParseFromString(data)
        traces.append((path, inflated(trace)))
    checker = Checker(expect)
    checker.run(traces)
    return checker.report()


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", action="append", required=True)
    parser.add_argument("--expect", required=True)
    parser.add_argument("--report")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        expect = load_expectation(args.expect)
    except (OSError, ValueError) as e:
        sys.stderr.write("check_trace.py: bad expectation %s: %s\n" %
                         (args.expect, e))
        return 2
    try:
        report = check(args.trace, expect)
    except (OSError, DecodeError) as e:  # findings, not crashes
        report = {"ok": False, "violations": ["cannot decode: %s" % e]}
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    if not args.quiet:
        for v in report["violations"]:
            sys.stderr.write("VIOLATION: %s\n" % v)
        sys.stderr.write("check_trace.py: %s (%s packets)\n" %
                         ("OK" if report["ok"] else "FAILED",
                          report.get("packets", "?")))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
