#!/usr/bin/env python3
"""Unit tests of semantic_dump.py on the golden trace and rewritten copies.

A rewrite that only changes representation (interned vs inline names, track
uuids, sequence ids, flow ids, a descriptor moved to its own earlier packet,
a second descriptor of a track that adds nothing new) must leave the dump as
it was; one that changes meaning (an annotation's type, a counter's unit, an
event's name, a flow's pairing, an explicit time) must change it. A known
difference is hidden, and reported once two traces no longer show it.
Run: python3 -m unittest tests/checker/test_semantic_dump.py
"""

import json
import os
import sys
import tempfile
import unittest
from unittest import mock

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

    def last_event(self):
        """The last packet of a producer sequence, a track event: changing
        its time leaves every other event's as it was."""
        packets = self.producer_packets(self.trace)
        last = packets[-1]
        self.assertTrue(last.HasField("track_event"))
        return last

    def with_time(self, clock_id, ts, base):
        """The golden trace with its last event at `ts` on `clock_id`,
        naming the time base `base`."""
        self.reload()
        packet = self.last_event()
        packet.timestamp = ts
        packet.timestamp_clock_id = clock_id
        arg = packet.track_event.debug_annotations.add()
        arg.name = semantic_dump.TIME_BASE_ARG
        arg.uint_value = base
        return self.write(self.trace, "t%d-%d-%d" % (clock_id, ts, base))

    def lines(self, path):
        return semantic_dump.canonical(semantic_dump.dump(path))

    def test_explicit_times_show_relative_to_their_base(self):
        far = 1 << 62  # after every time of the golden trace
        at = self.with_time(semantic_dump.BOOTTIME, far, far - 1234)
        text = "\n".join(self.lines(at))
        self.assertIn('"time": 1234', text)
        self.assertIn('"<time base>"', text)
        self.assertNotIn(str(far), text)
        # The same time as another base and offset reads the same; one ns
        # later does not.
        same = self.with_time(semantic_dump.BOOTTIME, far + 10, far - 1224)
        self.assertEqual(semantic_dump.compare(at, same), [])
        later = self.with_time(semantic_dump.BOOTTIME, far + 1, far - 1234)
        self.assertTrue(any('"time": 1235' in line for line in
                            semantic_dump.compare(at, later)))

    def test_other_clocks_convert_through_the_service_snapshots(self):
        snapshots = [
            {c.clock_id: c.timestamp for c in p.clock_snapshot.clocks}
            for p in self.trace.packet
            if p.trusted_packet_sequence_id ==
            semantic_dump.SERVICE_SEQUENCE_ID and p.HasField("clock_snapshot")]
        last = snapshots[-1]
        monotonic = 3
        at = self.with_time(monotonic, last[monotonic] + 5000000,
                            last[semantic_dump.BOOTTIME] + 3000000)
        text = "\n".join(self.lines(at))
        self.assertIn('"time": ["MONOTONIC", "+2 ms"]', text)
        # Written as BOOTTIME instead: the clock shows.
        boot = self.with_time(semantic_dump.BOOTTIME,
                              last[semantic_dump.BOOTTIME] + 5000000,
                              last[semantic_dump.BOOTTIME] + 3000000)
        self.assertIn('"time": 2000000', "\n".join(self.lines(boot)))
        self.assertNotEqual(semantic_dump.compare(at, boot), [])

    def thread_descriptor_packet(self):
        return next(p for p in self.producer_packets(self.trace)
                    if p.HasField("track_descriptor") and
                    p.track_descriptor.thread.HasField("thread_name"))

    def test_a_descriptor_adding_nothing_new_changes_nothing(self):
        # Another thread describing this thread's track: no name.
        late = self.trace.packet.add()
        late.CopyFrom(self.thread_descriptor_packet())
        late.track_descriptor.thread.ClearField("thread_name")
        self.assertEqual(self.diff(self.trace), [])
        # Or first, before the thread's own: the name still shows.
        self.reload()
        early = self.thread_descriptor_packet()
        packets = list(self.trace.packet)
        index = next(i for i, p in enumerate(packets) if p is early or p == early)
        first = pb.TracePacket()
        first.CopyFrom(early)
        first.track_descriptor.thread.ClearField("thread_name")
        self.trace.ClearField("packet")
        self.trace.packet.extend(packets[:index] + [first] + packets[index:])
        self.assertEqual(self.diff(self.trace), [])

    def nested(self, parent_described, child_name="child"):
        """The golden trace with its last event on a custom track under a
        custom track, the parent described or not."""
        self.reload()
        packet = self.last_event()
        packet.track_event.track_uuid = 0xCD
        packets = list(self.trace.packet)
        at = next(i for i, p in enumerate(packets) if p == packet)
        descs = []
        for uuid, parent, name in ((0xAB, None, "parent"),
                                   (0xCD, 0xAB, child_name)):
            if parent is None and not parent_described:
                continue
            desc = pb.TracePacket()
            desc.trusted_packet_sequence_id = packet.trusted_packet_sequence_id
            desc.track_descriptor.uuid = uuid
            desc.track_descriptor.name = name
            if parent is not None:
                desc.track_descriptor.parent_uuid = parent
            descs.append(desc)
        self.trace.ClearField("packet")
        self.trace.packet.extend(packets[:at] + descs + packets[at:])
        return self.write(self.trace, "nested-%s-%s" % (parent_described,
                                                        child_name))

    def test_a_known_difference_is_hidden_until_it_is_gone(self):
        described = self.nested(True)
        undescribed = self.nested(False)
        self.assertTrue(any('"parent": {"undescribed": true}' in line
                            for line in self.lines(undescribed)))
        # An undescribed custom parent is a difference...
        self.assertNotEqual(semantic_dump.compare(described, undescribed), [])

        def hide_custom_parents(value):
            if isinstance(value, dict):
                return {k: ("<custom parent>" if k == "parent"
                            and isinstance(v, dict) and "process" not in v
                            and "thread" not in v
                            else hide_custom_parents(v))
                        for k, v in value.items()}
            if isinstance(value, list):
                return [hide_custom_parents(v) for v in value]
            return value

        # ... which a known-difference entry hides, and only that.
        with mock.patch.dict(semantic_dump.KNOWN_DIFFERENCES,
                             {"custom parents": hide_custom_parents}):
            self.assertEqual(semantic_dump.compare(described, undescribed),
                             [])
            renamed = self.nested(False, child_name="other")
            self.assertTrue(any("other" in line for line in
                                semantic_dump.compare(described, renamed)))
            # Two traces that agree on it: the entry is to go.
            stale = semantic_dump.compare(described, described)
            self.assertEqual(len(stale), 1)
            self.assertIn("no longer seen", stale[0])


if __name__ == "__main__":
    unittest.main()
