#!/usr/bin/env python3
"""Unit tests of timeline.py on the golden trace and changed copies.

Run: python3 -m unittest tests/checker/test_timeline.py (the Rust harness
runs it as part of `cargo test`).
"""

import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check_trace  # noqa: E402
import timeline  # noqa: E402
from check_trace import pb  # noqa: E402

GOLDEN_TRACE = os.path.join(HERE, "..", "golden", "capture_run_trace.pftrace")
GOLDEN_PID = "14971"
TRACK_EVENTS = 202


def load_golden():
    trace = pb.Trace()
    with open(GOLDEN_TRACE, "rb") as f:
        trace.ParseFromString(f.read())
    return trace


class TimelineTest(unittest.TestCase):
    def setUp(self):
        self.trace = load_golden()
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def timeline(self, names=()):
        path = os.path.join(self.tmp.name, "t.pftrace")
        with open(path, "wb") as f:
            f.write(self.trace.SerializeToString())
        report = os.path.join(self.tmp.name, "timeline.json")
        args = ["--trace", path, "--report", report]
        for name in names:
            args += ["--name", name]
        self.assertEqual(timeline.main(args), 0)
        with open(report) as f:
            return json.load(f)

    def test_every_track_event_has_its_time(self):
        report = self.timeline()
        golden = report["producers"][GOLDEN_PID]
        self.assertEqual(golden["events"], TRACK_EVENTS)
        self.assertEqual(golden["unresolved"], 0)
        times = golden["times"]
        self.assertEqual(len(times), TRACK_EVENTS)
        self.assertEqual(times, sorted(times))
        # Inside the session, which the service's clock snapshots bracket.
        service = [c.timestamp for p in self.trace.packet
                   if p.trusted_packet_sequence_id == 1 and
                   p.HasField("clock_snapshot")
                   for c in p.clock_snapshot.clocks
                   if c.clock_id == check_trace.BOOTTIME]
        self.assertEqual(len(service), 3)
        self.assertLess(service[0], times[0])
        self.assertLess(times[-1], service[-1])

    def test_named_events_carry_their_annotations(self):
        report = self.timeline(["outer", "inner", "missing"])
        self.assertEqual(len(report["named"]["outer"]), 25)
        self.assertEqual(report["named"]["missing"], [])
        first = report["named"]["outer"][0]
        self.assertEqual(first["args"], {"iter": 0, "thread": "worker-0"})
        self.assertEqual(first["pid"], int(GOLDEN_PID))
        inner = report["named"]["inner"][0]
        self.assertEqual(inner["args"]["even"], True)
        self.assertLess(first["ts"], inner["ts"])

    def test_unresolved_times_are_counted_not_guessed(self):
        # Sequence 3's reset relates its clocks to no builtin clock: none of
        # its events has a time, the other sequences' still do.
        reset = next(p for p in self.trace.packet
                     if p.trusted_packet_sequence_id == 3 and
                     p.HasField("clock_snapshot"))
        del reset.clock_snapshot.clocks[:]
        reset.clock_snapshot.clocks.add(clock_id=65, timestamp=1000)
        reset.clock_snapshot.clocks.add(clock_id=64, timestamp=1000,
                                        is_incremental=True)
        seq3 = sum(1 for p in self.trace.packet
                   if p.trusted_packet_sequence_id == 3 and
                   p.HasField("track_event"))
        report = self.timeline(["tick"])
        golden = report["producers"][GOLDEN_PID]
        self.assertEqual(golden["events"], TRACK_EVENTS)
        self.assertEqual(golden["unresolved"], seq3)
        self.assertEqual(len(golden["times"]), TRACK_EVENTS - seq3)
        self.assertEqual(len(report["named"]["tick"]), 12)


if __name__ == "__main__":
    unittest.main()
