#!/usr/bin/env python3
"""Where a trace's track events lie in time, per producer.

Replays the trace with check_trace.py's Checker (the same decoding,
incremental state and clock resolution: incremental clock 64 deltas,
sequence-scoped clocks converted through the sequence's clock snapshots)
and reports the resolved BOOTTIME of every track event:

    timeline.py --trace FILE [--trace FILE ...] [--name NAME ...]
                --report REPORT.json

REPORT.json:
    {
      "producers": {"<pid>": {"events": N, "unresolved": U,
                              "times": [t, ...]}},      sorted, ns
      "named": {"<name>": [{"pid": P, "ts": t,
                            "args": {"<arg>": value}}]}  for each --name
    }

An event whose time does not resolve (its sequence lacks the snapshots) is
counted in "unresolved" and left out of "times". Exit status: 0 written, 2
usage or environment error (as check_trace.py).
"""

import argparse
import collections
import json
import sys

import check_trace


class Timeline(check_trace.Checker):
    """A Checker that also notes each track event's resolved time."""

    def __init__(self, names):
        super().__init__({"loss": "allowed", "producers": []})
        self.names = set(names)
        self.times = collections.defaultdict(list)
        self.unresolved_times = collections.Counter()
        self.named = collections.defaultdict(list)

    def packet(self, packet, where):
        # Clear the sequence's last time first, so an event whose own time
        # does not resolve is not given its predecessor's.
        seq = self.sequences.get(packet.trusted_packet_sequence_id)
        if seq is not None:
            seq.last_boot_ts = None
        super().packet(packet, where)

    def track_event(self, seq, pid, event, where):
        super().track_event(seq, pid, event, where)
        ts = seq.last_boot_ts
        if ts is None:
            self.unresolved_times[pid] += 1
            return
        self.times[pid].append(ts)
        if not self.names:
            return
        name = None
        if event.HasField("name_iid"):
            name = seq.interned["event_names"].get(event.name_iid)
        elif event.HasField("name"):
            name = event.name
        if name not in self.names:
            return
        args = {}
        for arg in event.debug_annotations:
            if arg.HasField("name_iid"):
                arg_name = seq.interned["debug_annotation_names"].get(
                    arg.name_iid)
            else:
                arg_name = arg.name
            kind = arg.WhichOneof("value")
            if kind in ("int_value", "uint_value", "double_value",
                        "bool_value", "string_value"):
                args[arg_name] = getattr(arg, kind)
        self.named[name].append({"pid": pid, "ts": ts, "args": args})

    def timeline(self):
        pids = set(self.times) | set(self.unresolved_times)
        return {
            "producers": {
                str(pid): {
                    "events": len(self.times[pid]) +
                    self.unresolved_times[pid],
                    "unresolved": self.unresolved_times[pid],
                    "times": sorted(self.times[pid]),
                } for pid in sorted(pids)
            },
            "named": {name: self.named[name] for name in sorted(self.names)},
        }


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", action="append", required=True)
    parser.add_argument("--name", action="append", default=[])
    parser.add_argument("--report", required=True)
    args = parser.parse_args(argv)
    traces = []
    try:
        for path in args.trace:
            trace = check_trace.pb.Trace()
            with open(path, "rb") as f:
                trace.ParseFromString(f.read())
            traces.append((path, trace))
    except (OSError, check_trace.DecodeError) as e:
        sys.stderr.write("timeline.py: cannot read the trace: %s\n" % e)
        return 2
    timeline = Timeline(args.name)
    timeline.run(traces)
    with open(args.report, "w") as f:
        json.dump(timeline.timeline(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
