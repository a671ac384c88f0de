#!/usr/bin/env python3
"""Producer-independent dump of what a trace says, for comparing producers.

Two producers that emit the same events should leave traces a trace
processor reads the same way, even if their bytes differ. This tool replays
every producer sequence of a trace (decoded with the official protos of the
PyPI `perfetto` package, as check_trace.py does) and prints what the events
*mean*: per sequence, the ordered events with their type, resolved category
names, resolved name, the track they land on described by its content, their
debug annotations as a typed tree, flows, and counter values with their type.

    semantic_dump.py TRACE                 # the dump, one line per event
    semantic_dump.py --json TRACE          # the dump, as one JSON document
    semantic_dump.py --compare A B         # exit 1 and a diff if they differ

What legitimately differs between producers is normalized away, each for the
reason given where it is done:
  * absolute timestamps and the clock they are written in (a trace processor
    converts every clock to boottime; only "the sequence's timestamps resolve
    and never go backwards" is kept; they convert through every clock
    snapshot of the trace, related as check_trace.py's ClockGraph relates
    them, so a firmware's clock resolves through its bridge's snapshots). An
    event given an explicit time names the script's time base in a uint
    annotation "time_base_ns": its time is shown relative to that base
    (exact in ns on BOOTTIME and the sequence's clocks, whether written as a
    delta or absolute; on another global clock such as MONOTONIC, converted
    through the clock snapshots, as the clock's name and whole ms), and the
    base's value is left out;
  * pids, tids, track uuids, flow ids and interned ids (numbers the producer
    picks): tracks are described by content, threads and processes by the
    order in which they first appear, flows by first use;
  * interned vs inline names and strings (a trace processor resolves both to
    the same string);
  * packet and chunk boundaries, and which packet carries a descriptor or
    interned data, as long as it comes before its first use;
  * pointer values (addresses differ between runs): only the type is kept;
  * which of several descriptors of a track says what: they are merged, as a
    trace processor keeps what each adds (a thread's track described by
    another thread has no name, by its own thread the name); descriptors
    that contradict each other mark the track "redescribed".
Anything else a TrackEvent carries is listed under "other_fields" so that an
unexpected field shows up as a difference. Known bugs of our producer are
hidden by `compare` as listed in KNOWN_DIFFERENCES, each until it is fixed.

Representation differences seen between the real SDK (v59) and
shmtrace-producer, all read the same by a trace processor:
  * dynamic event names: upstream interns them, we write `name` inline;
  * nested annotation names: inline or interned (the C API has no nested
    arguments; the fidelity driver writes them inline by hand);
  * track descriptor packets: upstream writes most without a timestamp and
    the thread/process ones with a timestamp on the sequence's incremental
    clock and SEQ_NEEDS_INCREMENTAL_STATE; we stamp every descriptor packet
    on BOOTTIME (explicit timestamp_clock_id 6) with no sequence flags.
"""

import argparse
import difflib
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_trace import (  # noqa: E402  (after the path setup)
    BOOTTIME, FIRST_SEQUENCE_SCOPED_CLOCK, SEQ_INCREMENTAL_STATE_CLEARED,
    SEQ_NEEDS_INCREMENTAL_STATE, SERVICE_SEQUENCE_ID, ClockGraph, is_repeated,
    pb)

TYPE_NAMES = {
    pb.TrackEvent.TYPE_SLICE_BEGIN: "slice_begin",
    pb.TrackEvent.TYPE_SLICE_END: "slice_end",
    pb.TrackEvent.TYPE_INSTANT: "instant",
    pb.TrackEvent.TYPE_COUNTER: "counter",
}

# TrackEvent fields the dump models; any other set field is reported as is.
MODELED_EVENT_FIELDS = {
    "type", "name", "name_iid", "categories", "category_iids", "track_uuid",
    "debug_annotations", "flow_ids", "flow_ids_old", "terminating_flow_ids",
    "terminating_flow_ids_old", "counter_value", "double_counter_value",
}

UNIT_NAMES = {v.number: v.name for v in
              pb.CounterDescriptor.DESCRIPTOR.enum_types_by_name["Unit"].values}
CLOCK_NAMES = {v.number: v.name[len("BUILTIN_CLOCK_"):] for v in
               pb.DESCRIPTOR.enum_types_by_name["BuiltinClock"].values}

# The debug annotation that asks for an event's time: a uint, the boot-time
# ns the script took as its time base (see `Dumper.event`).
TIME_BASE_ARG = "time_base_ns"


def merge_descriptor(old, new):
    """`old` with what `new` says added, and whether they contradict each
    other: a field both set to different values (a trace processor keeps
    what each descriptor of a track adds, e.g. a thread's name written by
    that thread while another thread's descriptor of its track has none)."""
    merged = type(old)()
    merged.CopyFrom(old)
    conflict = False
    for field, value in new.ListFields():
        if is_repeated(field):
            mine = list(getattr(old, field.name))
            if mine and mine != list(value):
                conflict = True
            merged.ClearField(field.name)
            getattr(merged, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            sub, sub_conflict = merge_descriptor(getattr(old, field.name),
                                                 value)
            conflict |= sub_conflict
            getattr(merged, field.name).CopyFrom(sub)
        else:
            if old.HasField(field.name) and getattr(old, field.name) != value:
                conflict = True
            setattr(merged, field.name, value)
    return merged, conflict


class Numbering:
    """Replaces numbers a producer picks by their order of first use."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.seen = {}

    def __call__(self, value):
        if value not in self.seen:
            self.seen[value] = "%s%d" % (self.prefix, len(self.seen))
        return self.seen[value]


class SeqState:
    def __init__(self, seq_id):
        self.id = seq_id
        self.valid = False
        self.interned = {}
        self.defaults = None
        self.last_boot = None
        self.packets = []

    def reset(self):
        self.valid = True
        self.interned = {t: {} for t in (
            "event_categories", "event_names", "debug_annotation_names",
            "debug_annotation_string_values")}
        self.defaults = None


class Dumper:
    def __init__(self):
        self.tracks = {}  # uuid -> TrackDescriptor (merged, see below)
        # Descriptors that contradict an earlier one with the same uuid (a
        # renamed thread, or a producer bug).
        self.redescribed = set()
        self.seqs = {}
        self.order = []
        # Every clock snapshot of the trace (the service's and the
        # producers'), as a trace processor relates clocks.
        self.clocks = ClockGraph()

    def load(self, trace):
        for packet in trace.packet:
            seq_id = packet.trusted_packet_sequence_id
            if seq_id == SERVICE_SEQUENCE_ID:
                if packet.HasField("clock_snapshot"):
                    self.clock_snapshot(seq_id, packet.clock_snapshot)
                continue
            seq = self.seqs.get(seq_id)
            if seq is None:
                seq = self.seqs[seq_id] = SeqState(seq_id)
                self.order.append(seq_id)
                seq.first = {
                    "first_packet_on_sequence":
                        packet.first_packet_on_sequence,
                    "incremental_state_cleared": bool(
                        packet.sequence_flags & SEQ_INCREMENTAL_STATE_CLEARED),
                }
                seq.problems = []
                seq.events = []
            self.packet(seq, packet)

    def packet(self, seq, packet):
        if packet.sequence_flags & SEQ_INCREMENTAL_STATE_CLEARED:
            seq.reset()
        if packet.sequence_flags & SEQ_NEEDS_INCREMENTAL_STATE \
                and not seq.valid:
            seq.problems.append("packet needing incremental state skipped")
            return
        if packet.HasField("trace_packet_defaults"):
            seq.defaults = packet.trace_packet_defaults
        if packet.HasField("interned_data"):
            for table, entries in seq.interned.items():
                for e in getattr(packet.interned_data, table):
                    entries[e.iid] = e.str if table.endswith("values") \
                        else e.name
        kind = packet.WhichOneof("data")
        if kind == "track_descriptor":
            desc = packet.track_descriptor
            old = self.tracks.get(desc.uuid)
            if old is not None:
                desc, conflict = merge_descriptor(old, desc)
                if conflict:
                    self.redescribed.add(desc.uuid)
            self.tracks[desc.uuid] = desc
        elif kind == "clock_snapshot":
            why = self.clock_snapshot(seq.id, packet.clock_snapshot)
            if why is not None:
                seq.problems.append("clock snapshot refused: " + why)
        elif kind == "track_event":
            ts_ok, time = self.timestamp(seq, packet)
            seq.events.append((packet.track_event, ts_ok, time,
                               dict(seq.interned), seq.defaults,
                               packet.sequence_flags))

    def clock_snapshot(self, seq_id, snapshot):
        """Adds a snapshot to the clock graph; why a trace processor
        refuses it, or None."""
        clocks = [c for c in snapshot.clocks
                  if c.HasField("clock_id") and c.HasField("timestamp")]
        return self.clocks.add_snapshot(seq_id, clocks, BOOTTIME)

    def timestamp(self, seq, packet):
        """The packet's timestamp: whether it resolves (and, on the
        sequence's clocks, goes forward), and its time: the boot-time ns, or
        (clock id, value) on another global clock (`global_boot` converts
        it once every snapshot is loaded). A sequence-scoped clock converts
        when read, through the chain of snapshots that relates it to
        BOOTTIME (a firmware's clock: its sequence's snapshot relates it to
        the firmware's clock, the bridge's relates that to BOOTTIME)."""
        if not packet.HasField("timestamp"):
            return "missing", None
        clock_id = packet.timestamp_clock_id \
            if packet.HasField("timestamp_clock_id") else (
                seq.defaults.timestamp_clock_id
                if seq.defaults is not None and
                seq.defaults.HasField("timestamp_clock_id") else BOOTTIME)
        ts = packet.timestamp
        if clock_id != BOOTTIME and clock_id < FIRST_SEQUENCE_SCOPED_CLOCK:
            # Order is checked on the sequence's own clocks only (as
            # check_trace.py does): a trace processor sorts events anyway.
            return "ok", (clock_id, ts)
        boot, why = self.clocks.convert(seq.id, clock_id, ts, BOOTTIME)
        if why == "unknown source":
            return "unresolvable clock %d" % clock_id, None
        if why is not None:
            return "clock %d with no chain of snapshots to boottime" % \
                clock_id, None
        backwards = seq.last_boot is not None and boot < seq.last_boot
        seq.last_boot = boot
        return ("backwards" if backwards else "ok"), boot

    def global_boot(self, clock_id, value):
        """`value` on global clock `clock_id` in boot-time ns, through the
        latest snapshot at or before it that relates the two (as a trace
        processor converts), or None."""
        return self.clocks.convert(0, clock_id, value, BOOTTIME)[0]

    # ------------------------------------------------------------------
    def describe_track(self, uuid, depth=0):
        desc = self.tracks.get(uuid)
        if desc is None:
            return {"undescribed": True}
        out = {}
        if uuid in self.redescribed:
            out["redescribed"] = True
        if desc.HasField("name"):
            out["name"] = desc.name
        elif desc.HasField("static_name"):
            # Static or dynamic: both are the track's name to a trace
            # processor.
            out["name"] = desc.static_name
        if desc.HasField("description"):
            out["description"] = desc.description
        if desc.HasField("thread"):
            t = desc.thread
            out["thread"] = {"pid": t.pid, "tid": [t.pid, t.tid]}
            if t.HasField("thread_name"):
                out["thread"]["name"] = t.thread_name
        if desc.HasField("process"):
            p = desc.process
            # The process name and command line are the program's own
            # (different binaries here); what is kept is whether it is named,
            # whether the name is argv[0] (upstream's default), and the
            # arguments after argv[0].
            out["process"] = {
                "pid": p.pid,
                "named": p.HasField("process_name"),
                "name_is_argv0": bool(p.cmdline) and
                p.process_name == p.cmdline[0],
                "args": list(p.cmdline[1:]),
            }
        if desc.HasField("counter"):
            c = desc.counter
            counter = {
                "unit": UNIT_NAMES.get(c.unit, c.unit),
                "unit_multiplier": c.unit_multiplier or 1,
                "is_incremental": c.is_incremental,
                "categories": sorted(c.categories),
            }
            if c.HasField("unit_name"):
                counter["unit_name"] = c.unit_name
            out["counter"] = counter
        for field in ("child_ordering", "sibling_order_rank"):
            if desc.HasField(field):
                out[field] = getattr(desc, field)
        if desc.HasField("parent_uuid") and desc.parent_uuid and depth < 8:
            out["parent"] = self.describe_track(desc.parent_uuid, depth + 1)
        return out

    def annotation_value(self, arg, interned):
        kind = arg.WhichOneof("value")
        if kind == "string_value_iid":
            v = interned["debug_annotation_string_values"].get(
                arg.string_value_iid)
            return ["string", v if v is not None else "<unresolved iid>"]
        if kind == "pointer_value":
            return ["pointer", "nonzero" if arg.pointer_value else "zero"]
        if kind == "string_value" and len(arg.string_value) > 64:
            # Long strings as length and digest: the diff stays readable.
            data = arg.string_value.encode()
            return ["string", "<%d bytes, sha1 %s>" % (
                len(data), hashlib.sha1(data).hexdigest()[:12])]
        if kind is not None:
            return [kind[:-len("_value")] if kind.endswith("_value")
                    else kind, getattr(arg, kind)]
        if len(arg.dict_entries):
            return ["dict", [self.annotation(e, interned)
                             for e in arg.dict_entries]]
        if len(arg.array_values):
            return ["array", [self.annotation_value(e, interned)
                              for e in arg.array_values]]
        return ["empty"]

    def annotation(self, arg, interned):
        which = arg.WhichOneof("name_field")
        if which == "name_iid":
            name = interned["debug_annotation_names"].get(arg.name_iid,
                                                          "<unresolved iid>")
        else:
            name = arg.name if which == "name" else None
        return [name, self.annotation_value(arg, interned)]

    def event(self, event, ts_ok, time, interned, defaults, flags):
        out = {"type": TYPE_NAMES.get(event.type, event.type)}
        if flags != SEQ_NEEDS_INCREMENTAL_STATE:
            # A trace processor drops packets that need incremental state
            # after a loss, and keeps the others: the flags matter.
            out["sequence_flags"] = flags
        cats = list(event.categories) + [
            interned["event_categories"].get(i, "<unresolved iid>")
            for i in event.category_iids]
        if cats:
            out["categories"] = sorted(cats)
        which = event.WhichOneof("name_field")
        if which == "name_iid":
            out["name"] = interned["event_names"].get(event.name_iid,
                                                      "<unresolved iid>")
        elif which == "name":
            out["name"] = event.name
        if event.HasField("track_uuid"):
            uuid = event.track_uuid
        elif defaults is not None and \
                defaults.track_event_defaults.HasField("track_uuid"):
            uuid = defaults.track_event_defaults.track_uuid
        else:
            uuid = None
        out["track"] = self.describe_track(uuid) \
            if uuid is not None else {"default": True}
        if ts_ok != "ok":
            out["timestamp"] = ts_ok
        if len(event.debug_annotations):
            out["args"] = [self.annotation(a, interned)
                           for a in event.debug_annotations]
            self.explicit_time(out, time)
        # flow_ids_old / terminating_flow_ids_old (fixed64) are the same ids
        # to a trace processor.
        begun = list(event.flow_ids) + list(event.flow_ids_old)
        if begun:
            out["flows"] = begun
        ended = list(event.terminating_flow_ids) + \
            list(event.terminating_flow_ids_old)
        if ended:
            out["terminating_flows"] = ended
        value = event.WhichOneof("counter_value_field")
        if value == "counter_value":
            out["counter"] = ["int", event.counter_value]
        elif value == "double_counter_value":
            out["counter"] = ["double", event.double_counter_value]
        other = sorted(f.name for f, _ in event.ListFields()
                       if f.name not in MODELED_EVENT_FIELDS)
        if other:
            out["other_fields"] = other
        return out

    def explicit_time(self, out, time):
        """An event given an explicit time names the script's time base in
        a `time_base_ns` annotation: its time relative to that base is what
        both producers must agree on (the base itself, a clock reading,
        differs between runs and is left out). Times on the sequence's
        clocks are exact, in ns; on another global clock the dump keeps the
        clock's name (the clock the event was given on) and the offset in
        whole ms (the base and the other clock's reading are a few us apart,
        and so are the service's snapshots of the two clocks)."""
        for arg in out["args"]:
            name, value = arg
            if name != TIME_BASE_ARG or value[0] != "uint":
                continue
            base = value[1]
            arg[1] = ["uint", "<time base>"]
            if isinstance(time, tuple):
                clock_id, ts = time
                boot = self.global_boot(clock_id, ts)
                out["time"] = [CLOCK_NAMES.get(clock_id, clock_id),
                               "no snapshot" if boot is None else
                               "%+d ms" % round((boot - base) / 1e6)]
            elif time is not None:
                out["time"] = time - base

    def dump(self):
        sequences = []
        for seq_id in self.order:
            seq = self.seqs[seq_id]
            if not seq.events:
                continue  # descriptor-only sequences say nothing by events
            sequences.append({
                "start": seq.first,
                "problems": seq.problems,
                "events": [self.event(*e) for e in seq.events],
            })
        return {"sequences": sequences}


def dump(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    dumper = Dumper()
    dumper.load(trace)
    return dumper.dump()


# Keys whose values are numbers a producer picks (raw in `Dumper.dump`).
RENUMBERED = {"pid": "P", "tid": "T", "flows": "F", "terminating_flows": "F"}


def renumber(value, numberings, strip=False):
    """`value` with pids, tids and flow ids replaced by their order of first
    use (`numberings`), or left out (`strip`)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k not in RENUMBERED:
                out[k] = renumber(v, numberings, strip)
            elif not strip:
                number = numberings[RENUMBERED[k]]
                out[k] = [number(json.dumps(f)) for f in v] \
                    if k.endswith("flows") else number(json.dumps(v))
        return out
    if isinstance(value, list):
        return [renumber(v, numberings, strip) for v in value]
    return value


def canonical(d):
    """One line per event. Sequences are ordered by their first event (less
    the numbers a producer picks), then pids, tids and flow ids are numbered
    in that order, so neither the service's sequence ids nor which thread
    started first show."""
    lines = []
    seqs = sorted(d["sequences"], key=lambda s: json.dumps(
        renumber(s["events"][0], None, strip=True), sort_keys=True))
    numberings = {p: Numbering(p) for p in set(RENUMBERED.values())}
    seqs = [dict(s, events=renumber(s["events"], numberings)) for s in seqs]
    for i, s in enumerate(seqs):
        lines.append("sequence %d start=%s problems=%s" %
                     (i, json.dumps(s["start"], sort_keys=True),
                      json.dumps(s["problems"])))
        for e in s["events"]:
            lines.append("  " + json.dumps(e, sort_keys=True))
    return lines


# Known differences between the real SDK's traces and ours: bugs of our
# producer, hidden from `compare` until they are fixed. Each hides as little
# as it can, and `compare` reports one that two traces it applies to no
# longer need, so that it goes away with the fix.
KNOWN_DIFFERENCES = {
    # None at the moment. (The last one, custom parents of nested tracks
    # left undescribed by shmtrace-producer, was fixed: its ancestors are
    # now described, as upstream's are.)
}


def compare(a, b):
    """Returns the unified diff of two traces' dumps (empty if the same),
    less the KNOWN_DIFFERENCES; or a line per known difference that
    applies to the two traces and is not needed any more."""
    dumps = [dump(a), dump(b)]

    def diff(skip=None):
        lines = []
        for d in dumps:
            for name, hide in KNOWN_DIFFERENCES.items():
                if name != skip:
                    d = hide(d)
            lines.append(canonical(d))
        return list(difflib.unified_diff(lines[0], lines[1], a, b,
                                         lineterm="", n=2))

    found = diff()
    if found:
        return found
    stale = []
    for name, hide in KNOWN_DIFFERENCES.items():
        applies = any(hide(d) != d for d in dumps)
        if applies and not diff(skip=name):
            stale.append("known difference %r no longer seen: remove it "
                         "from KNOWN_DIFFERENCES" % name)
    return stale


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", nargs="?")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    parser.add_argument("--max-lines", type=int, default=200)
    parser.add_argument("--json", action="store_true",
                        help="print the dump as one JSON document (raw "
                        "pids, tids and flow ids)")
    args = parser.parse_args(argv)
    if args.compare:
        diff = compare(*args.compare)
        for line in diff[:args.max_lines]:
            print(line)
        if len(diff) > args.max_lines:
            print("... (%d more diff lines)" % (len(diff) - args.max_lines))
        sys.stderr.write("semantic_dump.py: %s\n" %
                         ("DIFFERENT" if diff else "SAME"))
        return 1 if diff else 0
    if not args.trace:
        parser.error("a trace or --compare A B")
    if args.json:
        print(json.dumps(dump(args.trace)))
    else:
        print("\n".join(canonical(dump(args.trace))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
