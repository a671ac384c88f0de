#!/usr/bin/env python3
"""Unit tests of semantic_dump.py on the golden trace and rewritten copies.

A rewrite that only changes representation (interned vs inline names, track
uuids, sequence ids, flow ids, a descriptor moved to its own earlier packet)
must leave the dump as it was; one that changes meaning (an annotation's
type, a counter's unit, an event's name, a flow's pairing) must change it.
Run: python3 -m unittest tests/checker/test_semantic_dump.py
"""

import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import semantic_dump  # noqa: E402
from check_trace import pb  # noqa: E402

GOLDEN_TRACE = os.path.join(HERE, "..", "golden", "capture_run_trace.pftrace")


class SemanticDumpTest(unittest.TestCase):
    def setUp(self):
        self.reload()
        self.tmp = tempfile.TemporaryDirectory()
        self.golden = self.write(self.trace, "golden")

    def reload(self):
        self.trace = pb.Trace()
        with open(GOLDEN_TRACE, "rb") as f:
            self.trace.ParseFromString(f.read())

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, trace, name):
        path = os.path.join(self.tmp.name, name + ".pftrace")
        with open(path, "wb") as f:
            f.write(trace.SerializeToString())
        return path

    def diff(self, trace):
        return semantic_dump.compare(self.golden, self.write(trace, "b"))

    def producer_packets(self, trace):
        return [p for p in trace.packet
                if p.trusted_packet_sequence_id !=
                semantic_dump.SERVICE_SEQUENCE_ID]

    def test_golden_resolves_everything(self):
        lines = semantic_dump.canonical(semantic_dump.dump(self.golden))
        text = "\n".join(lines)
        self.assertNotIn("unresolved", text)
        self.assertNotIn("undescribed", text)
        self.assertIn('"name": "outer"', text)
        self.assertIn('["bool", true]', text)
        self.assertIn('"unit": "UNIT_UNSPECIFIED"', text)
        self.assertGreater(len(lines), 100)
        self.assertEqual(self.diff(self.trace), [])

    def test_inline_names_read_like_interned_ones(self):
        names = {}
        for p in self.producer_packets(self.trace):
            for e in p.interned_data.event_names:
                names[(p.trusted_packet_sequence_id, e.iid)] = e.name
            if p.HasField("track_event") and \
                    p.track_event.HasField("name_iid"):
                ev = p.track_event
                ev.name = names[(p.trusted_packet_sequence_id, ev.name_iid)]
        self.assertEqual(self.diff(self.trace), [])

    def test_uuids_sequence_ids_and_flow_ids_are_numbers_only(self):
        for p in self.producer_packets(self.trace):
            p.trusted_packet_sequence_id += 100
            if p.HasField("track_descriptor"):
                d = p.track_descriptor
                d.uuid ^= 0x5A5A
                if d.parent_uuid:
                    d.parent_uuid ^= 0x5A5A
            if p.HasField("trace_packet_defaults"):
                ted = p.trace_packet_defaults.track_event_defaults
                if ted.HasField("track_uuid"):
                    ted.track_uuid ^= 0x5A5A
            if p.HasField("track_event"):
                ev = p.track_event
                if ev.HasField("track_uuid"):
                    ev.track_uuid ^= 0x5A5A
                for flows in (ev.flow_ids, ev.terminating_flow_ids):
                    for i in range(len(flows)):
                        flows[i] += 12345
        self.assertEqual(self.diff(self.trace), [])

    def first_event_with(self, predicate):
        for p in self.producer_packets(self.trace):
            if p.HasField("track_event") and predicate(p.track_event):
                return p.track_event
        self.fail("the golden trace has no such event")

    def test_an_annotation_type_change_shows(self):
        ev = self.first_event_with(lambda e: any(
            a.HasField("int_value") for a in e.debug_annotations))
        arg = next(a for a in ev.debug_annotations if a.HasField("int_value"))
        arg.uint_value = arg.int_value
        self.assertTrue(any('"uint"' in line for line in self.diff(self.trace)))

    def test_a_counter_unit_and_value_type_show(self):
        for p in self.producer_packets(self.trace):
            if p.HasField("track_descriptor") and \
                    p.track_descriptor.HasField("counter"):
                p.track_descriptor.counter.unit = \
                    pb.CounterDescriptor.UNIT_SIZE_BYTES
                break
        diff = self.diff(self.trace)
        self.assertTrue(any("UNIT_SIZE_BYTES" in line for line in diff))
        self.reload()
        ev = self.first_event_with(lambda e: e.HasField("counter_value"))
        ev.double_counter_value = float(ev.counter_value)
        self.assertTrue(any('["double"' in line for line in self.diff(self.trace)))

    def test_a_track_described_two_ways_shows(self):
        descs = [p for p in self.producer_packets(self.trace)
                 if p.HasField("track_descriptor") and
                 p.track_descriptor.HasField("counter")]
        late = self.trace.packet.add()
        late.CopyFrom(descs[0])
        late.track_descriptor.name = "renamed track"
        diff = self.diff(self.trace)
        self.assertTrue(any("redescribed" in line for line in diff))

    def test_a_name_and_a_flow_pairing_show(self):
        ev = self.first_event_with(lambda e: e.HasField("name_iid"))
        ev.ClearField("name_iid")
        ev.name = "renamed"
        self.assertTrue(any("renamed" in line for line in self.diff(self.trace)))
        self.reload()
        ev = self.first_event_with(lambda e: len(e.terminating_flow_ids) > 0)
        ev.terminating_flow_ids[0] += 1
        self.assertNotEqual(self.diff(self.trace), [])


if __name__ == "__main__":
    unittest.main()
