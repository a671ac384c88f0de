#!/usr/bin/env python3
"""Unit tests of check_trace.py on the golden trace and hand-broken copies.

The golden trace (tests/golden/capture_run_trace.pftrace) was written by the
real Perfetto; the checker must accept it and must reject every breakage below
with the matching message. Run: python3 -m unittest tests/checker/test_check_trace.py
With $SHMTRACE_BIN naming the shmtrace binary (the Rust harness sets it), the
hand-built slice and flow traces are also judged by `shmtrace inspect
--check --strict`, which must pair their slices and link their flows the same way.
"""

import collections
import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check_trace  # noqa: E402
from check_trace import pb  # noqa: E402

GOLDEN_DIR = os.path.join(HERE, "..", "golden")
GOLDEN_TRACE = os.path.join(GOLDEN_DIR, "capture_run_trace.pftrace")
GOLDEN_EXPECT = os.path.join(GOLDEN_DIR, "capture_run_expect.json")

TE = pb.TrackEvent


def load_golden():
    trace = pb.Trace()
    with open(GOLDEN_TRACE, "rb") as f:
        trace.ParseFromString(f.read())
    return trace


def load_expect():
    return check_trace.load_expectation(GOLDEN_EXPECT)


class CheckerTest(unittest.TestCase):
    def setUp(self):
        self.trace = load_golden()
        self.expect = load_expect()
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, trace=None, expect=None):
        path = os.path.join(self.tmp.name, "t.pftrace")
        with open(path, "wb") as f:
            f.write((trace or self.trace).SerializeToString())
        return check_trace.check([path], expect or self.expect)

    def assert_violation(self, report, fragment):
        self.assertFalse(report["ok"], "checker accepted a broken trace")
        joined = "\n".join(report["violations"])
        self.assertIn(fragment, joined)

    def producer_packets(self, seq_id=3):
        return [p for p in self.trace.packet
                if p.trusted_packet_sequence_id == seq_id]

    def events(self, event_type, seq_id=3):
        return [p for p in self.producer_packets(seq_id)
                if p.HasField("track_event") and
                p.track_event.type == event_type]

    def remove(self, packet):
        for i, p in enumerate(self.trace.packet):
            if p is packet:
                del self.trace.packet[i]
                return
        raise AssertionError("packet not found")

    # ---------------------------------------------------------------
    def test_golden_trace_passes(self):
        report = self.check()
        self.assertTrue(report["ok"], report["violations"])
        self.assertEqual(report["totals"]["slice_begin"], 50)
        self.assertEqual(report["totals"]["instant"], 77)
        self.assertEqual(report["interning"]["resolved"],
                         {"event_categories": 127, "event_names": 127,
                          "debug_annotation_names": 153})
        self.assertEqual(report["slices"]["max_depth"], 2)
        self.assertEqual(report["flows"],
                         {"started": 25, "links": 25, "terminated": 25,
                          "never_continued": 0, "unmatched_ends": 0})
        self.assertEqual(report["counter_tracks"], 2)
        self.assertEqual(len(report["sequences"]), 3)

    def test_golden_file_through_cli(self):
        out = os.path.join(self.tmp.name, "report.json")
        status = check_trace.main(["--trace", GOLDEN_TRACE, "--expect",
                                   GOLDEN_EXPECT, "--report", out, "--quiet"])
        self.assertEqual(status, 0)
        with open(out) as f:
            self.assertTrue(json.load(f)["ok"])

    def test_compressed_batches_check_as_their_packets(self):
        # The golden trace as a deflating service writes it: two
        # compressed_packets batches, each a zlib stream of a Trace.
        half = len(self.trace.packet) // 2
        compressed = pb.Trace()
        for part in (self.trace.packet[:half], self.trace.packet[half:]):
            batch = pb.Trace()
            batch.packet.extend(part)
            compressed.packet.add().compressed_packets = zlib.compress(
                batch.SerializeToString(), 6)
        report = self.check(compressed)
        self.assertTrue(report["ok"], report["violations"])
        self.assertEqual(report, self.check())

    def test_count_mismatch(self):
        expect = copy.deepcopy(self.expect)
        expect["producers"][0]["emitted"]["instant"] = 78
        self.assert_violation(self.check(expect=expect),
                              "instant expected 78, trace has 77")

    def test_missing_slice_end(self):
        self.remove(self.events(TE.TYPE_SLICE_END)[-1])
        report = self.check()
        self.assert_violation(report, "slice_end expected 50, trace has 49")
        self.assert_violation(report, "slices were never closed")

    def test_slice_end_without_begin(self):
        self.remove(self.events(TE.TYPE_SLICE_BEGIN)[0])
        self.assert_violation(self.check(), "SLICE_END with no open slice")

    def test_unresolved_event_name(self):
        self.events(TE.TYPE_INSTANT)[3].track_event.name_iid = 999
        self.assert_violation(self.check(),
                              "event_names iid 999 does not resolve")

    def test_unresolved_debug_annotation_name(self):
        packet = self.events(TE.TYPE_SLICE_BEGIN)[5]
        packet.track_event.debug_annotations[0].name_iid = 777
        self.assert_violation(
            self.check(), "debug_annotation_names iid 777 does not resolve")

    def test_interned_name_redefined(self):
        later = self.events(TE.TYPE_INSTANT)[10]
        entry = later.interned_data.event_names.add()
        entry.iid = 1
        entry.name = "not-outer"
        self.assert_violation(self.check(), "redefined from 'outer'")

    def test_incremental_clear_resets_interning(self):
        # A clear in mid-sequence without re-emitted interned data leaves the
        # following events' iids dangling.
        self.events(TE.TYPE_INSTANT)[20].sequence_flags |= \
            check_trace.SEQ_INCREMENTAL_STATE_CLEARED
        self.assert_violation(self.check(), "does not resolve")

    def test_sequence_never_cleared(self):
        first = self.producer_packets()[0]
        self.assertTrue(first.sequence_flags &
                        check_trace.SEQ_INCREMENTAL_STATE_CLEARED)
        first.sequence_flags = 0
        report = self.check()
        self.assert_violation(report, "skipped_needing_incremental_state")
        self.assert_violation(report, "slice_begin expected 50, trace has 24")

    def test_missing_trusted_pid(self):
        self.producer_packets()[4].ClearField("trusted_pid")
        self.assert_violation(self.check(), "producer packet without trusted_pid")

    def test_remote_producers_carry_no_trusted_pid(self):
        expect = dict(self.expect, remote_producers=True)
        for p in expect["producers"]:
            p["pid"] = None
        self.assert_violation(self.check(expect=expect),
                              "remote producer packet with trusted_pid")
        for packet in self.trace.packet:
            packet.ClearField("trusted_pid")
        report = self.check(expect=expect)
        self.assertTrue(report["ok"], report["violations"])

    def test_missing_trusted_uid(self):
        self.producer_packets()[4].ClearField("trusted_uid")
        self.assert_violation(self.check(), "packet without trusted_uid")

    def test_missing_sequence_id(self):
        self.producer_packets()[4].ClearField("trusted_packet_sequence_id")
        self.assert_violation(self.check(),
                              "packet without trusted_packet_sequence_id")

    def test_negative_incremental_delta(self):
        self.events(TE.TYPE_INSTANT)[7].timestamp = (1 << 64) - 5
        self.assert_violation(self.check(),
                              "negative incremental timestamp delta -5")

    def test_absolute_time_earlier_than_the_latest_is_counted(self):
        # Legal (a trace processor sorts by time): counted, not a violation;
        # the deltas after it still count from the incremental clock.
        golden = self.check()
        self.assertEqual(golden["out_of_order"], 0)
        packet = self.events(TE.TYPE_INSTANT)[7]
        packet.timestamp_clock_id = check_trace.BOOTTIME
        packet.timestamp = 1
        report = self.check()
        self.assertTrue(report["ok"], report["violations"])
        self.assertEqual(report["out_of_order"], 1)
        seq3 = next(s for s in report["sequences"] if s["id"] == 3)
        self.assertEqual(seq3["out_of_order"], 1)

    def test_clock_no_snapshot_relates_to_the_trace_clock(self):
        packet = next(p for p in self.producer_packets()
                      if p.HasField("clock_snapshot"))
        del packet.clock_snapshot.clocks[:]
        packet.clock_snapshot.clocks.add(clock_id=64, timestamp=1000,
                                         is_incremental=True)
        self.assert_violation(
            self.check(), "timestamp on clock 64 of sequence 3 cannot be "
            "converted to clock 6: no chain of clock snapshots relates them")

    def test_builtin_clock_no_snapshot_names(self):
        self.events(TE.TYPE_INSTANT)[7].timestamp_clock_id = 42
        self.assert_violation(self.check(), "timestamp on clock 42, which "
                              "no clock snapshot names")

    def test_snapshot_a_trace_processor_refuses(self):
        # Clock 64 again, not incremental this time.
        packet = self.events(TE.TYPE_INSTANT)[7]
        packet.ClearField("track_event")
        packet.clock_snapshot.clocks.add(clock_id=64, timestamp=1)
        packet.clock_snapshot.clocks.add(clock_id=6, timestamp=1)
        self.assert_violation(
            self.check(), "clock snapshot refused (as a trace processor "
            "does): clock 64 of sequence 3 was defined before with another "
            "unit or incremental flag")

    def firmware_sequence(self, bridge="first"):
        """Sequence 3 as a firmware behind the bridge writes it: the reset
        packet (which clears the incremental state) relates clock 64 to the
        firmware's clock 65 and names no builtin clock; the bridge's own
        packet relates 65 to BOOTTIME, first on the sequence, after its
        first events ("late"), or nowhere (None)."""
        reset = self.producer_packets()[0]
        boot = next(c.timestamp for c in reset.clock_snapshot.clocks
                    if c.clock_id == check_trace.BOOTTIME)
        del reset.clock_snapshot.clocks[:]
        reset.clock_snapshot.clocks.add(clock_id=65, timestamp=1000)
        reset.clock_snapshot.clocks.add(clock_id=64, timestamp=1000,
                                        is_incremental=True)
        if bridge is None:
            return
        packet = pb.TracePacket()
        packet.trusted_uid = reset.trusted_uid
        packet.trusted_pid = reset.trusted_pid
        packet.trusted_packet_sequence_id = 3
        packet.clock_snapshot.clocks.add(clock_id=65, timestamp=1000)
        packet.clock_snapshot.clocks.add(clock_id=check_trace.BOOTTIME,
                                         timestamp=boot)
        if bridge == "first":
            packet.first_packet_on_sequence = True
            packet.previous_packet_dropped = 1
            reset.ClearField("first_packet_on_sequence")
            reset.ClearField("previous_packet_dropped")
            at = next(i for i, p in enumerate(self.trace.packet)
                      if p is reset)
        else:
            at = next(i for i, p in enumerate(self.trace.packet)
                      if p is self.events(TE.TYPE_INSTANT)[3])
        self.trace.packet.insert(at, packet)

    def test_firmware_clock_related_by_the_bridge_resolves_in_two_hops(self):
        self.firmware_sequence()
        report = self.check()
        self.assertTrue(report["ok"], report["violations"][:5])
        self.assertEqual(report["totals"]["instant"], 77)
        seq3 = next(s for s in report["sequences"] if s["id"] == 3)
        self.assertEqual(seq3["out_of_order"], 0)

    def test_firmware_clock_related_too_late_or_never(self):
        for where in ("late", None):
            self.trace = load_golden()
            self.firmware_sequence(where)
            self.assert_violation(
                self.check(), "timestamp on clock 64 of sequence 3 cannot be "
                "converted to clock 6")

    def test_undefined_sequence_clock(self):
        packet = self.events(TE.TYPE_INSTANT)[7]
        packet.timestamp_clock_id = 100
        self.assert_violation(self.check(), "sequence-scoped clock 100")

    def test_unterminated_flow(self):
        packet = next(p for p in self.producer_packets()
                      if p.track_event.terminating_flow_ids)
        packet.track_event.ClearField("terminating_flow_ids")
        report = self.check()
        self.assert_violation(report, "started but never continued or "
                              "terminated")
        self.assert_violation(report, "flow_end expected 25, trace has 24")

    def test_flow_id_reused_after_it_terminated_is_a_new_flow(self):
        # The second flow begins, with the first one's id, after the first
        # one terminated: it is a new flow, which its own end (under its
        # old id) no longer terminates.
        starts = [p for p in self.producer_packets()
                  if p.track_event.flow_ids]
        own = starts[1].track_event.flow_ids[0]
        starts[1].track_event.flow_ids[0] = starts[0].track_event.flow_ids[0]
        report = self.check()
        self.assert_violation(report, "flow %d started but never continued"
                              % starts[0].track_event.flow_ids[0])
        self.assert_violation(report, "terminating flow id %d matches no "
                              "open flow" % own)
        self.assertEqual(report["flows"]["started"], 25)

    def test_counter_on_undescribed_track(self):
        counter = self.events(TE.TYPE_COUNTER)[2]
        counter.track_event.track_uuid = 12345
        self.assert_violation(self.check(), "no track_descriptor describes")

    def test_mid_sequence_loss_mark(self):
        self.events(TE.TYPE_INSTANT)[30].previous_packet_dropped = 1
        report = self.check()
        self.assert_violation(report, "data loss in a scenario that allows none")
        self.assertEqual(
            report["loss_indicators"]["mid_sequence_loss_marks"], 1)

    def test_missing_trace_stats(self):
        stats = next(p for p in self.trace.packet if p.HasField("trace_stats"))
        self.remove(stats)
        self.assert_violation(self.check(), "no trace_stats packet")

    def test_write_into_file_without_flush_from_an_old_service(self):
        # The trace processor's config_write_into_file_no_flush: a
        # write_into_file config without flush_period_ms from a service
        # older than v54, or of unknown version.
        config = next(p for p in self.trace.packet
                      if p.HasField("trace_config"))
        config.trace_config.write_into_file = True
        info = next(p for p in self.trace.packet
                    if p.HasField("system_info"))
        for version, flagged in [("Perfetto v59.0-09c740d78 (09c7)", False),
                                 ("Perfetto v59.0 (shmtrace 0.1.0)", False),
                                 ("Perfetto v54-abc", False),
                                 ("Perfetto v53.1", True),
                                 ("Perfetto v59", True),
                                 ("shmtrace 0.1.0", True)]:
            info.system_info.tracing_service_version = version
            report = self.check()
            self.assertEqual(report["import_errors"],
                             ["config_write_into_file_no_flush"] if flagged
                             else [], version)
            if flagged:
                self.assert_violation(report, "config_write_into_file_no_flush")
        config.trace_config.flush_period_ms = 1000
        self.assertEqual(self.check()["import_errors"], [])

    def test_service_events_are_counted_by_kind(self):
        report = self.check()
        self.assertEqual(report["service_events"].get("tracing_started"), 1)

    def test_buffer_overwrite_stat_is_loss(self):
        stats = next(p for p in self.trace.packet if p.HasField("trace_stats"))
        stats.trace_stats.buffer_stats[0].chunks_overwritten = 2
        self.assert_violation(self.check(), "buffer.chunks_overwritten")

    def test_allowed_loss_must_be_recorded(self):
        expect = copy.deepcopy(self.expect)
        expect["loss"] = "allowed"
        for packet in self.events(TE.TYPE_INSTANT)[-3:]:
            self.remove(packet)
        self.assert_violation(self.check(expect=expect),
                              "nothing records a loss")

    def test_allowed_loss_recorded_in_stats(self):
        expect = copy.deepcopy(self.expect)
        expect["loss"] = "allowed"
        for packet in self.events(TE.TYPE_INSTANT)[-3:]:
            self.remove(packet)
        stats = next(p for p in self.trace.packet if p.HasField("trace_stats"))
        stats.trace_stats.buffer_stats[0].chunks_discarded = 1
        report = self.check(expect=expect)
        self.assertTrue(report["ok"], report["violations"])
        self.assertEqual(report["loss_indicators"],
                         {"buffer.chunks_discarded": 1})

    def counted_loss(self, counted_lost):
        """The golden trace less its last 3 instants (no loss recorded in
        the trace), checked with the producer counting `counted_lost`."""
        self.trace = load_golden()
        expect = copy.deepcopy(self.expect)
        expect["loss"] = "allowed"
        expect["producers"][0]["counted_lost"] = counted_lost
        for packet in self.events(TE.TYPE_INSTANT)[-3:]:
            self.remove(packet)
        return self.check(expect=expect)

    def test_loss_the_producer_counted_needs_no_indicator(self):
        # A thread that never got a chunk has no sequence to mark its loss
        # on: the producer's count is the record.
        report = self.counted_loss(3)
        self.assertTrue(report["ok"], report["violations"])
        self.assertEqual(report["loss_indicators"], {})

    def test_loss_the_producer_counted_must_match_exactly(self):
        for counted_lost, total in ((2, 200), (4, 198)):
            report = self.counted_loss(counted_lost)
            self.assert_violation(
                report, "199 track events in the trace, but 202 emitted less "
                "%d the producer counted lost is %d" % (counted_lost, total))
        self.assert_violation(self.counted_loss(2), "nothing records a loss")

    def test_counted_loss_must_be_a_count(self):
        path = os.path.join(self.tmp.name, "bad.json")
        for bad in (-1, "3", True):
            with open(path, "w") as f:
                json.dump({"loss": "allowed",
                           "producers": [{"pid": None, "emitted": {},
                                          "counted_lost": bad}]}, f)
            with self.assertRaises(ValueError):
                check_trace.load_expectation(path)

    def test_allowed_loss_cannot_add_events(self):
        expect = copy.deepcopy(self.expect)
        expect["loss"] = "allowed"
        expect["producers"][0]["emitted"]["instant"] = 70
        self.assert_violation(self.check(expect=expect),
                              "instant expected 70, trace has 77")

    def test_truncated_file(self):
        path = os.path.join(self.tmp.name, "cut.pftrace")
        with open(GOLDEN_TRACE, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[:len(data) - 7])
        out = os.path.join(self.tmp.name, "report.json")
        expect = os.path.join(self.tmp.name, "expect.json")
        with open(expect, "w") as f:
            json.dump(self.expect, f)
        status = check_trace.main(["--trace", path, "--expect", expect,
                                   "--report", out, "--quiet"])
        self.assertEqual(status, 1)
        with open(out) as f:
            self.assertIn("cannot decode", json.load(f)["violations"][0])

    def test_unknown_expectation_key_rejected(self):
        path = os.path.join(self.tmp.name, "bad.json")
        with open(path, "w") as f:
            json.dump({"loss": "none",
                       "producers": [{"pid": None,
                                      "emitted": {"slices": 1}}]}, f)
        with self.assertRaises(ValueError):
            check_trace.load_expectation(path)


# Slices in time order ----------------------------------------------------
B, E, I, C = "B", "E", "I", "C"
EVENT_TYPES = {B: TE.TYPE_SLICE_BEGIN, E: TE.TYPE_SLICE_END,
               I: TE.TYPE_INSTANT, C: TE.TYPE_COUNTER}
SHARED_TRACK = 7
COUNTER_TRACK = 8
SHMTRACE_BIN = os.environ.get("SHMTRACE_BIN")


def slice_trace(events):
    """A trace of hand-built track events, in the order given.

    `events` are `(sequence id, kind, BOOTTIME ns, name[, flow_ids[,
    terminating_flow_ids]])`, kind B or E (slice begin, end), I (instant)
    or C (a counter, on a counter track). Every sequence starts with a
    cleared, first-on-sequence descriptor of one shared track (and, if any
    event is a counter, one of a counter track); each event is a packet
    with its own absolute timestamp.
    """
    trace = pb.Trace()
    started = set()
    counters = any(e[1] == C for e in events)
    for seq_id, kind, ts, name, *flows in events:
        if seq_id not in started:
            started.add(seq_id)
            first = trace.packet.add(
                trusted_uid=1000, trusted_pid=100 + seq_id,
                trusted_packet_sequence_id=seq_id,
                first_packet_on_sequence=True,
                sequence_flags=check_trace.SEQ_INCREMENTAL_STATE_CLEARED)
            first.track_descriptor.uuid = SHARED_TRACK
            first.track_descriptor.name = "shared"
            if counters:
                counter = trace.packet.add(
                    trusted_uid=1000, trusted_pid=100 + seq_id,
                    trusted_packet_sequence_id=seq_id)
                counter.track_descriptor.uuid = COUNTER_TRACK
                counter.track_descriptor.counter.SetInParent()
        packet = trace.packet.add(
            trusted_uid=1000, trusted_pid=100 + seq_id,
            trusted_packet_sequence_id=seq_id, timestamp=ts)
        event = packet.track_event
        event.type = EVENT_TYPES[kind]
        event.track_uuid = SHARED_TRACK
        if kind == C:
            event.track_uuid = COUNTER_TRACK
            event.counter_value = 1
        if name:
            event.name = name
        if flows:
            event.flow_ids.extend(flows[0])
        if len(flows) > 1:
            event.terminating_flow_ids.extend(flows[1])
    return trace


class HandBuiltTest(unittest.TestCase):
    """Checks traces of hand-built events (see `slice_trace`), and holds
    `shmtrace inspect --check` to the same verdict when $SHMTRACE_BIN names
    it."""

    FILE = "events.pftrace"

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, events):
        path = os.path.join(self.tmp.name, self.FILE)
        with open(path, "wb") as f:
            f.write(slice_trace(events).SerializeToString())
        kinds = collections.Counter(e[1] for e in events)
        expect = {
            "producers": [{"pid": None, "emitted": {
                "slice_begin": kinds[B], "slice_end": kinds[E],
                "instant": kinds[I], "counter_int": kinds[C]}}],
            "loss": "none",
            "require_trace_stats": False,
            "require_service_packets": False,
        }
        report = check_trace.check([path], expect)
        if SHMTRACE_BIN:
            self.assert_inspect_agrees(path, report)
        return report

    def assert_inspect_agrees(self, path, report):
        """`shmtrace inspect --check` finds the same nesting and links the
        same flows."""
        out = subprocess.run(
            [SHMTRACE_BIN, "inspect", "--check", "--strict", "--json", path],
            capture_output=True, text=True, check=False)
        self.assertIn(out.returncode, (0, 1), out.stderr)
        analysis = json.loads(out.stdout)
        events = analysis["track_events"]
        self.assertEqual(events["open_slices"], report["slices"]["open"])
        self.assertEqual(events["max_depth"], report["slices"]["max_depth"])
        theirs = sorted(p["message"].split("packet #")[1]
                        for p in analysis["problems"]
                        if p["kind"] == "nesting")
        ours = sorted(v.split(".pftrace#")[1] for v in report["violations"]
                      if "SLICE_END with no open slice" in v)
        self.assertEqual(theirs, ours)
        flows = report["flows"]
        self.assertEqual(
            (events["flow_links"], events["flows_unpaired_start"],
             events["flows_unpaired_end"]),
            (flows["links"], flows["never_continued"],
             flows["unmatched_ends"]))
        self.assertEqual(
            any(p["kind"] == "flows" for p in analysis["problems"]),
            any("flow" in v.split(": ")[-1] for v in report["violations"]))


class TimeOrderTest(HandBuiltTest):
    """Slice begins and ends pair per track in time order, ties in packet
    order, as a trace processor pairs them (it sorts every event by
    timestamp, then by the order it read them), not in packet order."""

    FILE = "slices.pftrace"

    def assert_pairs(self, events, max_depth):
        report = self.check(events)
        self.assertTrue(report["ok"], report["violations"])
        self.assertEqual(report["slices"]["open"], 0)
        self.assertEqual(report["slices"]["max_depth"], max_depth)
        return report

    def test_nesting_valid_only_in_time_order(self):
        # In time: outer 10..40 holds inner 20..30. The inner begin is
        # written last, with its explicit earlier time.
        report = self.assert_pairs([(2, B, 10, "outer"), (2, E, 30, None),
                                    (2, E, 40, None), (2, B, 20, "inner")],
                                   max_depth=2)
        self.assertEqual(report["out_of_order"], 1)

    def test_end_before_its_begin_in_packet_order(self):
        # Two sequences on one track: sequence 3's chunk is read first, so
        # its end (t=30) precedes sequence 2's begin (t=10) in the file.
        self.assert_pairs([(3, E, 30, None), (2, B, 10, "async")],
                          max_depth=1)

    def test_end_earlier_than_its_begin_is_broken_nesting(self):
        # Packet order pairs these; time order puts the end first.
        report = self.check([(2, B, 20, "late"), (2, E, 10, None)])
        self.assertFalse(report["ok"], "checker accepted a broken trace")
        joined = "\n".join(report["violations"])
        self.assertIn("slices.pftrace#2: SLICE_END with no open slice on track 7",
                      joined)
        self.assertIn("1 slices were never closed", joined)

    def test_equal_times_pair_in_packet_order_begin_first(self):
        # At t=20 the begin of "a" comes before an end in the file: the end
        # closes "a", inside "outer" (an end sorted before begins would
        # close "outer" instead: depth 1).
        self.assert_pairs([(2, B, 20, "a"), (2, E, 20, None),
                           (2, B, 10, "outer"), (2, E, 30, None)],
                          max_depth=2)

    def test_equal_times_pair_in_packet_order_end_first(self):
        # At t=20 an end (closing "a") comes before the begin of "b" in the
        # file: "b" opens after "a" closed (begins sorted before ends would
        # nest it: depth 3).
        self.assert_pairs([(2, B, 5, "a"), (2, E, 20, None),
                           (2, B, 20, "b"), (2, E, 30, None),
                           (2, B, 1, "outer"), (2, E, 40, None)],
                          max_depth=2)


class FlowOrderTest(HandBuiltTest):
    """Flows link in time order, ties in packet order, as a trace processor
    links them: an id in flow_ids starts a flow or, if one with that id is
    open, continues it; an id in terminating_flow_ids continues and ends an
    open flow, and is ignored if none is open. Only events that make a slice
    (begins, matched ends, instants) carry flows."""

    FILE = "flows.pftrace"

    def assert_links(self, events, started, links, terminated):
        report = self.check(events)
        self.assertTrue(report["ok"], report["violations"])
        self.assertEqual(report["flows"],
                         {"started": started, "links": links,
                          "terminated": terminated, "never_continued": 0,
                          "unmatched_ends": 0})
        return report

    def assert_unlinked(self, events, never_continued, unmatched_ends,
                        fragments):
        report = self.check(events)
        self.assertFalse(report["ok"], "checker accepted a broken trace")
        self.assertEqual(report["flows"]["never_continued"], never_continued)
        self.assertEqual(report["flows"]["unmatched_ends"], unmatched_ends)
        joined = "\n".join(report["violations"])
        for fragment in fragments:
            self.assertIn(fragment, joined)
        return report

    def test_multi_step_flows(self):
        # 1: a -> b -> c, terminated. 2: d -> e, continued and never
        # terminated, which links it all the same.
        self.assert_links([(2, I, 10, "a", [1]), (2, I, 20, "b", [1]),
                           (2, B, 25, "d", [2]), (2, E, 28, None),
                           (2, I, 30, "c", [], [1]), (2, I, 40, "e", [2])],
                          started=2, links=3, terminated=1)

    def test_end_before_its_start_links_nothing(self):
        # The start is written first, with a later explicit time: the end
        # finds no open flow, and the start is never continued.
        self.assert_unlinked(
            [(2, I, 30, "start", [1]), (2, I, 20, "end", [], [1])],
            never_continued=1, unmatched_ends=1,
            fragments=["flows.pftrace#2: terminating flow id 1 matches no "
                       "open flow",
                       "flows.pftrace#1: flow 1 started but never continued "
                       "or terminated"])

    def test_flow_id_reused_after_it_terminated(self):
        self.assert_links([(2, I, 10, "a", [1]), (2, I, 20, "b", [], [1]),
                           (2, I, 30, "c", [1]), (2, I, 40, "d", [], [1])],
                          started=2, links=2, terminated=2)

    def test_flows_across_two_sequences(self):
        # Sequence 3's chunk is read first. In time: 2 starts flow 1 (10),
        # 3 ends it (30) and starts it again (50), 2 ends that one (60). In
        # packet order the first end would come before any start.
        self.assert_links([(3, I, 30, "b", [], [1]), (3, I, 50, "c", [1]),
                           (2, I, 10, "a", [1]), (2, I, 60, "d", [], [1])],
                          started=2, links=2, terminated=2)

    def test_equal_times_link_in_packet_order(self):
        # At t=20 the end comes first in the file: it matches nothing (a
        # start sorted first would pair them).
        self.assert_unlinked(
            [(2, I, 20, "end", [], [1]), (2, I, 20, "start", [1])],
            never_continued=1, unmatched_ends=1,
            fragments=["terminating flow id 1 matches no open flow"])

    def test_flows_on_a_counter_are_ignored(self):
        # A trace processor makes no slice of a counter, so its flow ids
        # link nothing: the instant's end matches no open flow.
        self.assert_unlinked(
            [(2, C, 10, None, [1]), (2, I, 20, "end", [], [1])],
            never_continued=0, unmatched_ends=1,
            fragments=["terminating flow id 1 matches no open flow"])

    def test_flows_on_an_end_that_closes_nothing_are_ignored(self):
        # The end closes no slice, so its terminating id ends nothing.
        self.assert_unlinked(
            [(2, I, 10, "start", [1]), (2, E, 20, None, [], [1])],
            never_continued=1, unmatched_ends=0,
            fragments=["SLICE_END with no open slice",
                       "flow 1 started but never continued or terminated"])


class RemoteClockOffsetTest(unittest.TestCase):
    """remote_clock_offsets on hand-made exchanges: a relay whose BOOTTIME
    runs 3,600 s ahead and whose MONOTONIC runs 7 s behind."""

    AHEAD = 3600 * 10**9
    BEHIND = -7 * 10**9

    def exchange(self, host_boot, client_boot):
        host = {6: host_boot, 3: host_boot - 1000}
        client = {6: client_boot, 3: client_boot - self.AHEAD + self.BEHIND
                  - 1000}
        return host, client

    def test_a_round_gives_the_mean_of_its_two_estimates(self):
        # PING read by the relay at 10,000 (its clock), received at 10,100
        # (the service's, plus the offset); UPDATE read at 10,400, received
        # at 10,450.
        a = self.AHEAD
        exchanges = [self.exchange(10100, a + 10000),
                     self.exchange(10450, a + 10400)]
        got = check_trace.remote_clock_offsets(exchanges)
        # BOOTTIME: (10000 + 10400) / 2 - 10100 = 100 and 10400 - (10100 +
        # 10450) / 2 = 125 on top of AHEAD; their mean 112.5 truncates.
        self.assertEqual(got["rounds"], 1)
        self.assertEqual(got["offsets"]["6"], a + 112)
        # MONOTONIC: the same estimates on top of BEHIND; the mean is
        # negative, and truncates toward zero as in C++.
        self.assertEqual(got["offsets"]["3"], self.BEHIND + 113)
        self.assertEqual(got["max_span"], 400)

    def test_exchanges_30_s_apart_are_no_round(self):
        a = self.AHEAD
        s = 30 * 10**9
        exchanges = [self.exchange(100, a), self.exchange(200, a + 100),
                     self.exchange(s + 300, a + s + 100),
                     self.exchange(s + 400, a + s + 300)]
        got = check_trace.remote_clock_offsets(exchanges)
        self.assertEqual(got["rounds"], 2)
        # Estimates: round 1: 50 - 100 = -50, 100 - 150 = -50; round 2:
        # s + 200 - (s + 300) = -100, s + 300 - (s + 350) = -50.
        self.assertEqual(got["offsets"]["6"], a + (-50 - 50 - 100 - 50) // 4)

    def test_a_clock_one_side_lacks_gets_no_offset(self):
        exchanges = [({6: 100}, {6: 90, 1: 5}), ({6: 200}, {6: 190, 1: 6})]
        got = check_trace.remote_clock_offsets(exchanges)
        self.assertEqual(set(got["offsets"]), {"6"})
        self.assertEqual(check_trace.c_div(-7, 2), -3)


if __name__ == "__main__":
    unittest.main()
