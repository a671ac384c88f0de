//! `shmtrace inspect` on the golden trace (recorded from the real Perfetto
//! v59) and on hand-broken copies of it: what it reports, and that
//! `--check` fails exactly when something is wrong.

mod cli_common;

use std::path::Path;

use cli_common::*;
use prost_reflect::{DynamicMessage, Value};
use shmtrace_cli::schema;

/// `--check --strict` fails on `trace` with a `kind` problem containing
/// `fragment`; plain `--check` reports the same and fails too, unless every
/// problem found is of a kind that may be the cut at a trace's edges
/// (nesting, flows), which it only reports.
fn check_fails_with(trace: &EditTrace, dir: &TempDir, kind: &str, fragment: &str) {
    let path = trace.write(&dir.path("broken.pftrace"));
    let (code, a) = inspect(&[&path]);
    let (strict_code, strict) = inspect_strict(&[&path]);
    assert_eq!(a["problems"], strict["problems"]);
    let found = problems(&a);
    assert_eq!(
        strict_code, 1,
        "--check --strict accepted a broken trace: {found}"
    );
    let edge_only = a["problem_counts"]
        .as_object()
        .unwrap()
        .keys()
        .all(|k| k == "nesting" || k == "flows");
    let plain = if edge_only { 0 } else { 1 };
    assert_eq!(code, plain, "plain --check on: {found}");
    assert!(
        a["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["kind"] == kind && p["message"].as_str().unwrap().contains(fragment)),
        "no [{kind}] problem containing {fragment:?} in:\n{found}"
    );
}

/// The human report of `inspect --check FILE`, which must pass.
fn passing_report(path: &Path) -> String {
    let out = run(&["inspect", "--check", path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    text
}

fn check_passes(trace: &EditTrace, dir: &TempDir) -> serde_json::Value {
    let path = trace.write(&dir.path("ok.pftrace"));
    let (code, a) = inspect(&[&path]);
    assert_eq!(code, 0, "unexpected problems:\n{}", problems(&a));
    a
}

#[test]
fn golden_trace_is_sound_and_fully_described() {
    let (code, a) = inspect(&[Path::new(GOLDEN)]);
    assert_eq!(code, 0, "{}", problems(&a));
    assert_eq!(a["packets"], 228);
    assert_eq!(a["packets_by_kind"]["track_event"]["packets"], 202);
    assert_eq!(a["packets_by_kind"]["track_descriptor"]["packets"], 8);
    assert_eq!(a["packets_by_kind"]["trace_stats"]["packets"], 1);
    let te = &a["track_events"];
    assert_eq!(te["total"], 202);
    assert_eq!(te["slice_begin"], 50);
    assert_eq!(te["slice_end"], 50);
    assert_eq!(te["instant"], 77);
    assert_eq!(te["counter"], 25);
    assert_eq!(te["args"], 153);
    // 127 categories + 127 names + 153 argument names, as the Python
    // checker with the official schema counts them.
    assert_eq!(te["interned_resolved"], 407);
    assert_eq!(te["interned_unresolved"], 0);
    assert_eq!(te["max_depth"], 2);
    assert_eq!(te["open_slices"], 0);
    assert_eq!(te["flow_links"], 25);
    assert_eq!(te["flows_unpaired_start"], 0);
    assert_eq!(te["by_category"]["oracle"], 102);
    assert_eq!(te["by_category"]["oracle.net"], 25);
    for name in ["outer", "inner", "tick", "flow_out", "flow_in"] {
        assert_eq!(te["by_name"][name], 25, "{name}");
    }
    let sequences = a["sequences"].as_array().unwrap();
    assert_eq!(sequences.len(), 3);
    for s in sequences {
        assert_eq!(s["start_lost"], false);
        assert_eq!(s["cleared"], 1);
        assert_eq!(s["loss_marks"], 0);
        assert_eq!(s["buffer"], 0, "writer_stats map sequences to buffers");
    }
    let counters: Vec<_> = a["tracks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] == "counter")
        .collect();
    assert_eq!(counters.len(), 2);
    assert_eq!(
        counters
            .iter()
            .map(|t| t["events"].as_u64().unwrap())
            .sum::<u64>(),
        25
    );
    let session = &a["session"];
    assert!(session["service_version"]
        .as_str()
        .unwrap()
        .starts_with("Perfetto v59.0"));
    assert_eq!(session["config"]["buffers"][0][0], 16384);
    assert_eq!(session["config"]["buffers"][0][1], "discard");
    assert_eq!(session["config"]["duration_ms"], 2000);
    assert_eq!(session["uuid"], "10f711e4-6b10-eab3-46ca-75cffa38b877");
    assert_eq!(a["clocks"]["primary"], "BOOTTIME");
    assert_eq!(a["clocks"]["sequence_scoped"]["64"], 3);
    let span = a["clocks"]["last_ns"].as_u64().unwrap() - a["clocks"]["first_ns"].as_u64().unwrap();
    assert!((1_900_000_000..3_000_000_000).contains(&span), "{span}");
    assert_eq!(a["loss"]["loss_marks"], 0);
    assert_eq!(a["loss"]["stats"].as_array().unwrap().len(), 0);
    assert_eq!(a["stats"]["buffers"][0]["chunks_written"], 3);
    assert_eq!(a["stats"]["service"]["flushes_succeeded"], 1);
}

#[test]
fn human_report() {
    let out = run(&["inspect", "--config", GOLDEN]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_contains_all(
        &text,
        &[
            "228 packets",
            "Perfetto v59.0",
            "track_event (enabled: *)",
            "enabled_categories: \"*\"\n",
            "Track events: 202 (50 slices begun, 50 ended, 77 instants, 25 counters)",
            "flow_in 25",
            "counter",
            "oracle.counter.t0",
            "Data loss: none recorded",
            "buffer 0 (16.0 MiB): 12.0 KiB written in all, 3 chunks written",
            "Check: OK",
        ],
    );
}

#[test]
fn slice_end_without_begin_is_broken_nesting() {
    let dir = TempDir::new("nesting");
    let mut t = EditTrace::golden();
    let first_begin = t.events(3, SLICE_BEGIN)[0];
    // Keep the interned data it carries: only drop the event.
    t.clear(first_begin, "track_event");
    check_fails_with(&t, &dir, "nesting", "SLICE_END with no open slice");
    // The human report of plain --check says why it passed.
    let text = passing_report(&dir.path("broken.pftrace"));
    assert_contains_all(
        &text,
        &[
            "Check: OK, but for 1 problem(s) that may be slices or flows cut at the \
             trace's edges (--check --strict fails on them)",
            "broken slice nesting: 1 (may be cut at the trace's edges)",
            "SLICE_END with no open slice",
        ],
    );
}

#[test]
fn unresolved_interned_name() {
    let dir = TempDir::new("intern");
    let mut t = EditTrace::golden();
    let i = t.events(3, INSTANT)[3];
    t.edit(i, "track_event { name_iid: 999 }");
    check_fails_with(&t, &dir, "interning", "event name iid 999 does not resolve");
}

#[test]
fn unresolved_argument_name() {
    let dir = TempDir::new("arg");
    let mut t = EditTrace::golden();
    let i = t.events(4, SLICE_BEGIN)[2];
    t.edit(
        i,
        "track_event { debug_annotations { name_iid: 77 int_value: 1 } }",
    );
    check_fails_with(&t, &dir, "interning", "debug annotation name iid 77");
}

#[test]
fn interned_entry_redefined_without_a_clear() {
    let dir = TempDir::new("redefine");
    let mut t = EditTrace::golden();
    let i = t.events(3, INSTANT)[10];
    t.edit(
        i,
        "interned_data { event_names { iid: 1 name: \"renamed\" } }",
    );
    check_fails_with(
        &t,
        &dir,
        "interning",
        "redefined from \"outer\" to \"renamed\"",
    );
}

#[test]
fn marked_loss_excuses_its_consequences() {
    let dir = TempDir::new("marked");
    let mut t = EditTrace::golden();
    // A gap in the middle of sequence 3: the service marks the next packet.
    // Everything after it needs interned data the sequence no longer has.
    let i = t.events(3, SLICE_BEGIN)[10];
    t.edit(i, "previous_packet_dropped: 1");
    let a = check_passes(&t, &dir);
    let seq3 = a["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == 3)
        .unwrap()
        .clone();
    assert_eq!(seq3["loss_marks"], 1);
    assert!(seq3["skipped_packets"].as_u64().unwrap() > 50, "{seq3}");
    assert_eq!(a["loss"]["loss_marks"], 1);
}

/// `SEQ_INCREMENTAL_STATE_CLEARED` and `SEQ_NEEDS_INCREMENTAL_STATE`.
const CLEARED: u32 = 1;
const NEEDS_STATE: u32 = 2;

fn sequence_info(a: &serde_json::Value, id: u32) -> serde_json::Value {
    a["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no sequence {id}"))
        .clone()
}

/// The golden trace with sequence 3's first packet (its start, with the
/// incremental-state clear) gone.
fn golden_without_start_of_sequence_3() -> EditTrace {
    let mut t = EditTrace::golden();
    let first = t.sequence(3)[0];
    assert_eq!(t.sequence_flags(first) & CLEARED, CLEARED);
    t.remove(first);
    t
}

#[test]
fn lost_start_is_a_problem_unless_a_statistic_records_the_loss() {
    let dir = TempDir::new("start");
    let mut t = golden_without_start_of_sequence_3();
    check_fails_with(&t, &dir, "unmarked_loss", "sequence 3");

    // The same trace, with the buffer statistics admitting overwritten data.
    t.set_buffer_stat("chunks_overwritten", 1);
    let a = check_passes(&t, &dir);
    assert_eq!(a["loss"]["sequences_start_lost"], 1);
    assert_eq!(a["loss"]["stats"][0][0], "buffer 0: chunks_overwritten");
    assert!(
        sequence_info(&a, 3)["unresolvable_after_wrap"]
            .as_u64()
            .unwrap()
            > 0
    );
}

/// A RING buffer that wrapped overwrote a sequence's start, clear included:
/// the packets that need incremental state are unresolvable, counted and
/// shown, and not a problem. `write_wrap_count` alone says so too.
#[test]
fn ring_wrap_makes_packets_before_the_first_clear_unresolvable() {
    let dir = TempDir::new("wrap");
    let mut t = golden_without_start_of_sequence_3();
    let needing = t
        .sequence(3)
        .into_iter()
        .filter(|&i| t.sequence_flags(i) & NEEDS_STATE != 0)
        .count() as u64;
    assert!(needing > 50, "{needing}");
    t.set_buffer_stat("write_wrap_count", 1);
    let a = check_passes(&t, &dir);
    let seq3 = sequence_info(&a, 3);
    assert_eq!(seq3["start_lost"], true);
    assert_eq!(seq3["unresolvable_after_wrap"], needing);
    assert_eq!(seq3["skipped_packets"], 0);
    assert_eq!(a["loss"]["unresolvable_after_wrap"], needing);
    assert_eq!(a["loss"]["skipped_packets"], 0);
    // The other sequences are untouched.
    assert_eq!(sequence_info(&a, 4)["unresolvable_after_wrap"], 0);

    let text = passing_report(&t.write(&dir.path("wrapped.pftrace")));
    let line = format!("{needing} packet(s) unresolvable after ring wrap");
    assert!(text.contains(&line), "{line:?} missing from:\n{text}");
}

/// Only what the lost start explains is excused: after the sequence's
/// first surviving clear, an interned id that does not resolve is a
/// problem again, wrap or not.
#[test]
fn ring_wrap_excuses_nothing_after_the_first_clear() {
    let dir = TempDir::new("wrapclear");
    let mut t = golden_without_start_of_sequence_3();
    t.set_buffer_stat("write_wrap_count", 1);
    // A clear in the middle of the sequence that does not re-emit the
    // interned data the packets after it use.
    let middle = t.events(3, INSTANT)[10];
    t.edit(
        middle,
        &format!("sequence_flags: {}", CLEARED | NEEDS_STATE),
    );
    check_fails_with(&t, &dir, "interning", "does not resolve on sequence 3");
}

/// A sequence whose first packet is there (first_packet_on_sequence) but
/// that never clears its incremental state is the producer's bug: no
/// statistic excuses it.
#[test]
fn sequence_that_never_clears_fails_even_after_a_wrap() {
    let dir = TempDir::new("noclear");
    let mut t = EditTrace::golden();
    let first = t.sequence(3)[0];
    t.edit(first, &format!("sequence_flags: {NEEDS_STATE}"));
    check_fails_with(
        &t,
        &dir,
        "interning",
        "sequence 3 needs incremental state but never cleared it",
    );
    t.set_buffer_stat("write_wrap_count", 1);
    t.set_buffer_stat("chunks_overwritten", 1);
    check_fails_with(
        &t,
        &dir,
        "interning",
        "sequence 3 needs incremental state but never cleared it",
    );
}

#[test]
fn flow_that_never_continues_is_unpaired() {
    let dir = TempDir::new("flow");
    let mut t = EditTrace::golden();
    let i = t
        .events(4, INSTANT)
        .into_iter()
        .rev()
        .find(|&i| {
            t.packets[i]
                .to_text_format()
                .contains("terminating_flow_ids")
        })
        .unwrap();
    t.clear(i, "track_event.terminating_flow_ids");
    check_fails_with(&t, &dir, "flows", "started but never continued");
}

/// The values of `track_event.<name>` (a repeated or single integer
/// field) of packet `i`.
fn event_ints(t: &EditTrace, i: usize, name: &str) -> Vec<u64> {
    let Some(event) = t.packets[i].get_field_by_name("track_event") else {
        return Vec::new();
    };
    let Some(value) = event.as_message().and_then(|e| e.get_field_by_name(name)) else {
        return Vec::new();
    };
    match value.as_ref() {
        Value::List(items) => items.iter().filter_map(Value::as_u64).collect(),
        other => other.as_u64().into_iter().collect(),
    }
}

/// The first instant of sequence 3 that starts a flow, the event that
/// terminates that flow, and its id.
fn golden_flow(t: &EditTrace) -> (usize, usize, u64) {
    let start = t
        .events(3, INSTANT)
        .into_iter()
        .find(|&i| !event_ints(t, i, "flow_ids").is_empty())
        .unwrap();
    let id = event_ints(t, start, "flow_ids")[0];
    let end = (0..t.packets.len())
        .find(|&i| event_ints(t, i, "terminating_flow_ids").contains(&id))
        .unwrap();
    (start, end, id)
}

/// Flows attach to slices, as in a trace processor: the flow ids of a
/// COUNTER or of a SLICE_END that closes no slice link nothing, and the
/// deprecated `flow_ids_old` counts only when `flow_ids` is empty.
#[test]
fn flows_link_only_on_events_that_make_a_slice() {
    let dir = TempDir::new("flow-slice");
    let golden = EditTrace::golden();
    let (start, end, id) = golden_flow(&golden);
    let counter = golden.events(3, COUNTER)[0];
    let counter_track = event_ints(&golden, counter, "track_uuid")[0];

    // The start made a counter: the end terminates no open flow.
    let mut t = golden.clone();
    t.edit(
        start,
        &format!(
            "track_event {{ type: TYPE_COUNTER counter_value: 1 track_uuid: {counter_track} }}"
        ),
    );
    check_fails_with(
        &t,
        &dir,
        "flows",
        "1 terminating flow id(s) matched no started flow",
    );

    // The end closes no slice (its track has none open): the start is
    // never continued.
    let mut t = golden.clone();
    t.edit(end, "track_event { type: TYPE_SLICE_END track_uuid: 4242 }");
    check_fails_with(
        &t,
        &dir,
        "nesting",
        "SLICE_END with no open slice on track 4242",
    );
    check_fails_with(&t, &dir, "flows", "1 flow(s) started but never continued");

    // A stray old-style id beside flow_ids is ignored; alone, it links.
    let mut t = golden.clone();
    t.edit(start, "track_event { flow_ids_old: 999 }");
    let a = check_passes(&t, &dir);
    assert_eq!(a["track_events"]["flow_links"], 25);
    let mut t = golden.clone();
    t.clear(start, "track_event.flow_ids")
        .edit(start, &format!("track_event {{ flow_ids_old: {id} }}"));
    let a = check_passes(&t, &dir);
    assert_eq!(a["track_events"]["flow_links"], 25);
}

#[test]
fn counter_on_a_track_that_is_not_a_counter() {
    let dir = TempDir::new("counter");
    let mut t = EditTrace::golden();
    let i = t.events(3, COUNTER)[0];
    t.edit(i, "track_event { track_uuid: 42 }");
    check_fails_with(&t, &dir, "counters", "COUNTER on track 42");
}

/// Timestamps a trace processor cannot resolve: a negative delta on the
/// incremental clock 64 (an impossible encoding), a sequence-scoped clock
/// the sequence never defines, a clock whose snapshots never reach the
/// trace clock, a builtin clock no snapshot names (a trace processor drops
/// such events), and a snapshot a trace processor refuses.
#[test]
fn unresolvable_timestamps() {
    let dir = TempDir::new("time");
    let instant = |edit: &str| {
        let mut t = EditTrace::golden();
        let i = t.events(3, INSTANT)[5];
        t.edit(i, edit);
        t
    };
    let mut unanchored = EditTrace::golden();
    let first = unanchored.sequence(3)[0];
    unanchored.clear(first, "clock_snapshot").edit(
        first,
        "clock_snapshot { clocks { clock_id: 64 timestamp: 1125788182702 \
         is_incremental: true } }",
    );
    let mut redefined = EditTrace::golden();
    let i = redefined.events(3, INSTANT)[5];
    redefined.edit(
        i,
        "clock_snapshot { clocks { clock_id: 64 timestamp: 1 } clocks { clock_id: 6 \
         timestamp: 1125788182702 } }",
    );
    for (trace, fragment) in [
        (
            instant(&format!("timestamp: {}", u64::MAX - 4)),
            "negative timestamp delta -5",
        ),
        (
            instant("timestamp_clock_id: 100"),
            "sequence-scoped clock 100, which sequence 3 does not define",
        ),
        (
            unanchored,
            "clock 64 of sequence 3 cannot be converted to BOOTTIME",
        ),
        (
            instant("timestamp_clock_id: 42"),
            "clock 42, which no clock snapshot names",
        ),
        (
            redefined,
            "clock snapshot refused (as a trace processor does): clock 64 of sequence 3 was \
             defined before with another unit or incremental flag",
        ),
        (
            firmware_sequence(Some(Bridge::Missing)),
            "clock 64 of sequence 3 cannot be converted to BOOTTIME",
        ),
        (
            firmware_sequence(Some(Bridge::AfterEvents)),
            "clock 64 of sequence 3 cannot be converted to BOOTTIME",
        ),
    ] {
        check_fails_with(&trace, &dir, "timestamps", fragment);
    }
}

/// Where the bridge's snapshot relating the firmware clock to BOOTTIME
/// goes in [`firmware_sequence`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bridge {
    /// First on the sequence, before the firmware's reset packet.
    First,
    /// After the sequence's first events.
    AfterEvents,
    /// Nowhere.
    Missing,
}

/// Sequence 3 as a firmware behind the bridge writes it: its reset packet
/// (which clears the incremental state) relates its incremental clock 64
/// to its own clock 65 and names no builtin clock; the bridge relates 65
/// to BOOTTIME (firmware 1000 ns = BOOTTIME 1125788182702) in a packet of
/// its own on the sequence. `None`: `Bridge::First`.
fn firmware_sequence(bridge: Option<Bridge>) -> EditTrace {
    let bridge = bridge.unwrap_or(Bridge::First);
    let mut t = EditTrace::golden();
    let reset = t.sequence(3)[0];
    t.clear(reset, "clock_snapshot").edit(
        reset,
        "clock_snapshot { clocks { clock_id: 65 timestamp: 1000 } clocks { clock_id: 64 \
         timestamp: 1000 is_incremental: true } }",
    );
    let mut packet = EditTrace {
        packets: vec![t.packets[reset].clone()],
    };
    for field in [
        "clock_snapshot",
        "sequence_flags",
        "trace_packet_defaults",
        "timestamp",
    ] {
        packet.clear(0, field);
    }
    packet.edit(
        0,
        "clock_snapshot { clocks { clock_id: 65 timestamp: 1000 } clocks { clock_id: 6 \
         timestamp: 1125788182702 } }",
    );
    match bridge {
        Bridge::First => {
            t.clear(reset, "first_packet_on_sequence")
                .clear(reset, "previous_packet_dropped");
            t.packets.insert(reset, packet.packets.remove(0));
        }
        Bridge::AfterEvents => {
            packet
                .clear(0, "first_packet_on_sequence")
                .clear(0, "previous_packet_dropped");
            let at = t.events(3, INSTANT)[3];
            t.packets.insert(at, packet.packets.remove(0));
        }
        Bridge::Missing => {}
    }
    t
}

/// A firmware sequence (events on clock 64, defined against the
/// firmware's clock 65 at its reset) related to BOOTTIME only by the
/// bridge's snapshot before the reset: resolved in two hops (64 -> 65 ->
/// BOOTTIME), the relation kept across the reset's clear, as a trace
/// processor keeps it.
#[test]
fn a_firmware_clock_related_by_the_bridge_resolves_in_two_hops() {
    let dir = TempDir::new("firmware-clock");
    let t = firmware_sequence(None);
    let a = check_passes(&t, &dir);
    assert_eq!(a["clocks"]["sequence_scoped"]["65"], 1);
    assert_eq!(a["clocks"]["sequence_scoped"]["64"], 3);
    assert_eq!(sequence_info(&a, 3)["out_of_order"], 0);
    // The firmware's events land where the bridge put clock 65: the
    // sequence's first event (a delta of 0 from 1000 ns) at the BOOTTIME
    // the golden trace had there.
    let golden = check_passes(&EditTrace::golden(), &dir);
    assert_eq!(a["clocks"]["first_ns"], golden["clocks"]["first_ns"]);
    assert_eq!(a["clocks"]["last_ns"], golden["clocks"]["last_ns"]);
}

/// A ring wrap that overwrote a firmware sequence's start and the
/// bridge's first snapshot relating its clock to BOOTTIME: the events
/// before the next surviving snapshot cannot be placed in time. They are
/// counted as unresolvable after ring wrap, not failed; the same trace
/// without the wrap fails (see `unresolvable_timestamps`).
#[test]
fn ring_wrap_excuses_firmware_times_before_the_surviving_snapshot() {
    let dir = TempDir::new("wrap-clock");
    let mut t = firmware_sequence(Some(Bridge::AfterEvents));
    let reset = t.sequence(3)[0];
    // The first surviving packet is a periodic clear, not the start.
    t.clear(reset, "first_packet_on_sequence");
    check_fails_with(&t, &dir, "unmarked_loss", "sequence 3");
    let bridge = t
        .sequence(3)
        .into_iter()
        .find(|&i| i != reset && t.packets[i].to_text_format().contains("clock_snapshot"))
        .expect("the bridge's snapshot");
    let unplaced = t
        .sequence(3)
        .into_iter()
        .filter(|&i| i > reset && i < bridge && t.packets[i].has_field_by_name("timestamp"))
        .count() as u64;
    assert!(unplaced >= 3, "{unplaced}");
    t.set_buffer_stat("write_wrap_count", 1);
    let a = check_passes(&t, &dir);
    let seq3 = sequence_info(&a, 3);
    assert_eq!(seq3["start_lost"], true);
    assert_eq!(seq3["unresolvable_after_wrap"], unplaced);
    assert_eq!(a["loss"]["unresolvable_after_wrap"], unplaced);
}

/// The same wrap when the first surviving packet is a periodic clear that
/// does not define the sequence's clocks (the definition went with the
/// start): the events before a later clear defines them again are
/// counted, not failed. If nothing later defines them, they fail, wrap or
/// not: their time is unknown for good.
#[test]
fn ring_wrap_excuses_times_before_a_later_definition_of_their_clock() {
    let dir = TempDir::new("wrap-undefined");
    let mut t = firmware_sequence(Some(Bridge::AfterEvents));
    let reset = t.sequence(3)[0];
    let mut redefinition = EditTrace {
        packets: vec![t.packets[reset].clone()],
    };
    redefinition.clear(0, "first_packet_on_sequence");
    t.clear(reset, "first_packet_on_sequence")
        .clear(reset, "clock_snapshot");
    t.set_buffer_stat("write_wrap_count", 1);
    check_fails_with(
        &t,
        &dir,
        "timestamps",
        "sequence-scoped clock 64, which sequence 3 does not define",
    );
    // A periodic clear that defines them again, ten events on.
    let at = t.events(3, INSTANT)[10];
    t.packets.insert(at, redefinition.packets.remove(0));
    // Every time on clock 64 before it, the first clear's own included
    // (descriptors are stamped on BOOTTIME).
    let unplaced = t
        .sequence(3)
        .into_iter()
        .filter(|&i| {
            i >= reset
                && i < at
                && t.packets[i].has_field_by_name("timestamp")
                && !t.packets[i].has_field_by_name("timestamp_clock_id")
        })
        .count() as u64;
    assert!(unplaced >= 10, "{unplaced}");
    let a = check_passes(&t, &dir);
    let seq3 = sequence_info(&a, 3);
    assert_eq!(seq3["start_lost"], true);
    assert_eq!(seq3["unresolvable_after_wrap"], unplaced);
    // Without the wrap, the lost start is an unrecorded loss.
    t.set_buffer_stat("write_wrap_count", 0);
    check_fails_with(&t, &dir, "unmarked_loss", "sequence 3");
}

/// An event at an absolute time earlier than the latest one of its
/// sequence is legal (a trace processor sorts by time; the SDK writes an
/// explicit earlier time so): counted, not a problem. The deltas after it
/// still count from the incremental clock's last value, so they are in
/// order.
#[test]
fn absolute_time_earlier_than_the_latest_is_counted_not_a_problem() {
    let dir = TempDir::new("earlier");
    let mut t = EditTrace::golden();
    // An instant with no flow: flows link in time order, so moving a flow's
    // end before its begin would unpair it.
    let i = t
        .events(3, INSTANT)
        .into_iter()
        .filter(|&i| !t.packets[i].to_text_format().contains("flow"))
        .nth(5)
        .unwrap();
    // 1 ns after the sequence's clock snapshot, long before the events
    // before it.
    t.edit(i, "timestamp_clock_id: 6 timestamp: 1125788182703");
    let a = check_passes(&t, &dir);
    assert_eq!(sequence_info(&a, 3)["out_of_order"], 1);
    assert_eq!(sequence_info(&a, 4)["out_of_order"], 0);
    assert_eq!(a["clocks"]["out_of_order"], 1);
    let text = passing_report(&t.write(&dir.path("earlier.pftrace")));
    assert_contains_all(
        &text,
        &["out of order 1 packet(s) earlier than their sequence's latest time"],
    );
    let golden = check_passes(&EditTrace::golden(), &dir);
    assert_eq!(golden["clocks"]["out_of_order"], 0);
}

/// Slices pair per track in time order, as a trace processor pairs them
/// (it sorts events by time), not in packet order: a SLICE_END written
/// before its SLICE_BEGIN but later in time closes it, whether the begin
/// has an explicit earlier time on the same sequence or comes from another
/// sequence writing on the same track.
#[test]
fn slices_pair_in_time_order_not_packet_order() {
    let dir = TempDir::new("time-order");
    let golden = EditTrace::golden();
    // Absolute BOOTTIME times, 8 and 18 ns after sequence 3's clock
    // snapshot: the begin is earlier, and both are earlier than the events
    // around them. The end is written first, on a track nothing else uses.
    let (begin_ts, end_ts) = (1125788182710_u64, 1125788182720_u64);
    for (end_seq, begin_seq) in [(3, 3), (4, 3)] {
        let mut t = golden.clone();
        // After the first packets of both sequences (their clears).
        let at = t.sequence(4)[1].max(t.sequence(3)[1]) + 1;
        let event = |t: &EditTrace, seq: u32, ty: &str, ts: u64| {
            let mut packet = EditTrace {
                packets: vec![t.packets[t.events(seq, INSTANT)[0]].clone()],
            };
            packet
                .clear(0, "track_event")
                .clear(0, "interned_data")
                .clear(0, "timestamp")
                .edit(
                    0,
                    &format!(
                        "timestamp_clock_id: 6 timestamp: {ts} \
                         track_event {{ type: {ty} track_uuid: 4242 name: \"late\" }}"
                    ),
                );
            packet.packets.remove(0)
        };
        let end = event(&t, end_seq, "TYPE_SLICE_END", end_ts);
        let begin = event(&t, begin_seq, "TYPE_SLICE_BEGIN", begin_ts);
        t.packets.insert(at, end);
        t.packets.insert(at + 1, begin);
        let a = check_passes(&t, &dir);
        let te = &a["track_events"];
        assert_eq!(te["open_slices"], 0, "{end_seq}/{begin_seq}");
        assert_eq!(te["slice_begin"], 51);
        assert_eq!(te["max_depth"], 2);
    }
}

/// A sequence that clears its incremental state and defines its
/// sequence-scoped clock again is still one sequence using that clock (the
/// report said "on N sequence(s)" with N counting definitions).
#[test]
fn a_clock_defined_again_after_a_clear_counts_its_sequence_once() {
    let dir = TempDir::new("redefined");
    let mut t = EditTrace::golden();
    // The sequence's first packet clears the state and defines clock 64;
    // the same packet again, right after it, does both again and leaves
    // the sequence in the same state.
    let first = t.sequence(3)[0];
    let text = t.packets[first].to_text_format();
    assert!(text.contains("clock_id:64"), "{text}");
    assert_ne!(t.sequence_flags(first) & 1, 0, "{text}");
    assert!(!text.contains("track_event{"), "{text}");
    t.packets.insert(first + 1, t.packets[first].clone());
    t.clear(first + 1, "previous_packet_dropped")
        .clear(first + 1, "first_packet_on_sequence");
    let a = check_passes(&t, &dir);
    assert_eq!(sequence_info(&a, 3)["cleared"], 2);
    assert_eq!(a["clocks"]["sequence_scoped"]["64"], 3);
}

#[test]
fn packet_without_trusted_sequence_id() {
    let dir = TempDir::new("trusted");
    let mut t = EditTrace::golden();
    let i = t.events(4, INSTANT)[0];
    t.clear(i, "trusted_packet_sequence_id");
    check_fails_with(&t, &dir, "trusted_fields", "no trusted_packet_sequence_id");
}

#[test]
fn cut_file_is_reported() {
    let dir = TempDir::new("cut");
    let bytes = std::fs::read(GOLDEN).unwrap();
    let path = dir.path("cut.pftrace");
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let (code, a) = inspect(&[&path]);
    assert_eq!(code, 1);
    assert_eq!(a["packets"], 227, "every whole packet is still read");
    assert_eq!(a["loss"]["file_damaged"], true);
    assert!(
        problems(&a).contains("the trace was cut short"),
        "{}",
        problems(&a)
    );
    // Without --check the report is printed and the status is 0.
    let out = run(&["inspect", path.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("the file is damaged or cut short"));
}

#[test]
fn successive_reads_are_one_session() {
    let dir = TempDir::new("reads");
    let t = EditTrace::golden();
    let (head, tail) = t.packets.split_at(60);
    let first = EditTrace {
        packets: head.to_vec(),
    }
    .write(&dir.path("read-1.pftrace"));
    let second = EditTrace {
        packets: tail.to_vec(),
    }
    .write(&dir.path("read-2.pftrace"));
    let (code, a) = inspect(&[&first, &second]);
    assert_eq!(code, 0, "{}", problems(&a));
    assert_eq!(a["packets"], 228);
    assert_eq!(a["track_events"]["interned_resolved"], 407);
    // The second read alone continues sequences whose start is elsewhere.
    let (code, a) = inspect(&[&second]);
    assert_eq!(code, 1);
    assert!(
        problems(&a).contains("start is missing"),
        "{}",
        problems(&a)
    );
}

#[test]
fn not_a_trace() {
    let dir = TempDir::new("notrace");
    let path = dir.path("x.pftrace.gz");
    std::fs::write(&path, [0x1f, 0x8b, 0x08, 0x00]).unwrap();
    let out = run(&["inspect", "--check", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(6));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a Perfetto trace: the file is gzip-compressed"),
        "{err}"
    );

    let out = run(&["inspect", dir.path("missing.pftrace").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot open") && err.contains("missing.pftrace"),
        "{err}"
    );
}

/// A trace the real Perfetto recorded into a RING buffer that wrapped (see
/// `tests/data/README.md`): both sequences lost their start and their
/// clear; `--check` passes and counts what cannot be resolved. Without its
/// statistics nothing records the loss, and `--check` fails.
#[test]
fn real_ring_wrapped_trace() {
    let dir = TempDir::new("realwrap");
    let path = Path::new(REAL_RING_WRAP);
    let (code, a) = inspect(&[path]);
    assert_eq!(code, 0, "{}", problems(&a));
    assert_eq!(a["loss"]["sequences_start_lost"], 2);
    assert_eq!(a["loss"]["unresolvable_after_wrap"], 295);
    assert_eq!(a["loss"]["skipped_packets"], 0);
    assert_eq!(a["stats"]["buffers"][0]["chunks_overwritten"], 166);
    assert_eq!(a["track_events"]["interned_unresolved"], 0);

    let mut t = EditTrace::read(path);
    t.packets.retain(|p| !p.has_field_by_name("trace_stats"));
    check_fails_with(&t, &dir, "unmarked_loss", "its start is missing");
}

/// The golden trace with its packets after the first 20 deflated into
/// `compressed_packets` batches of 70, as Perfetto writes with
/// `compression_type: COMPRESSION_TYPE_DEFLATE`; `corrupt` flips a byte of
/// the last batch's checksum.
fn compressed_golden(corrupt: bool) -> EditTrace {
    use std::io::Write;

    let golden = EditTrace::golden();
    let (plain, rest) = golden.packets.split_at(20);
    let mut packets = plain.to_vec();
    for batch in rest.chunks(70) {
        let inner = EditTrace {
            packets: batch.to_vec(),
        };
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        zlib.write_all(&inner.bytes()).unwrap();
        let mut data = zlib.finish().unwrap();
        if corrupt {
            let last = data.len() - 1;
            data[last] ^= 0x55;
        }
        let mut packet = DynamicMessage::new(schema::message("TracePacket"));
        packet.set_field_by_name("compressed_packets", Value::Bytes(data.into()));
        packets.push(packet);
    }
    EditTrace { packets }
}

#[test]
fn compressed_packets_are_inflated_and_checked() {
    let dir = TempDir::new("compressed");
    let t = compressed_golden(false);
    assert_eq!(t.packets.len(), 20 + 3);
    let a = check_passes(&t, &dir);
    // Exactly what the uncompressed golden trace holds.
    assert_eq!(a["packets"], 228);
    assert_eq!(a["track_events"]["total"], 202);
    assert_eq!(a["track_events"]["interned_resolved"], 407);
    assert_eq!(a["track_events"]["flow_links"], 25);
    assert_eq!(a["compression"]["batches"], 3);
    assert_eq!(a["compression"]["packets"], 208);
    let c = &a["compression"];
    assert!(c["compressed_bytes"].as_u64() < c["inflated_bytes"].as_u64());
    assert!(a["packets_by_kind"].get("compressed_packets").is_none());

    let text = passing_report(&t.write(&dir.path("compressed.pftrace")));
    assert_contains_all(
        &text,
        &["compressed  3 compressed_packets batch(es)", "208 packets"],
    );
}

#[test]
fn corrupt_compressed_packets_are_malformed() {
    let dir = TempDir::new("badcompressed");
    check_fails_with(
        &compressed_golden(true),
        &dir,
        "malformed",
        "compressed_packets cannot be inflated: not valid zlib data",
    );
}

/// zstd batches are not inflated: `--check` cannot vouch for them and says
/// so, instead of passing or blaming their missing trusted fields.
#[test]
fn zstd_compressed_packets_are_unsupported() {
    let dir = TempDir::new("zstd");
    let mut t = EditTrace::golden();
    let mut packet = DynamicMessage::new(schema::message("TracePacket"));
    // A zstd frame's magic number, then anything.
    let frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x58, 0x01, 0x00];
    packet.set_field_by_name("zstd_compressed_packets", Value::Bytes(frame.into()));
    t.packets.push(packet);
    check_fails_with(
        &t,
        &dir,
        "unsupported",
        "zstd_compressed_packets (8 bytes) are not inflated by inspect",
    );
    let (_, a) = inspect(&[&t.write(&dir.path("z.pftrace"))]);
    assert_eq!(
        a["problem_counts"].as_object().unwrap().len(),
        1,
        "{}",
        problems(&a)
    );
    assert_eq!(a["compression"]["zstd_batches"], 1);
}

/// A ring wrap can overwrite every sequence's start, so that no packet of
/// the trace has `first_packet_on_sequence`, and a sequence's first
/// surviving packet can be a periodic clear. Slices begun before it are
/// lost: with the wrap recorded that is not a problem; without, it is.
#[test]
fn ring_wrap_that_overwrote_every_start() {
    let dir = TempDir::new("allstarts");
    let mut t = EditTrace::golden();
    for seq in [2, 3, 4] {
        if let Some(&first) = t.sequence(seq).first() {
            t.clear(first, "first_packet_on_sequence");
        }
    }
    // Sequence 3 then begins with its clear, and its first slice begin
    // ("outer") is gone; the interned data that came with it stays.
    let outer = t.events(3, SLICE_BEGIN)[0];
    let next = t.sequence(3).into_iter().find(|&i| i > outer).unwrap();
    t.edit(
        next,
        "interned_data { event_categories { iid: 1 name: \"oracle\" } \
         event_names { iid: 1 name: \"outer\" } \
         debug_annotation_names { iid: 1 name: \"iter\" } \
         debug_annotation_names { iid: 2 name: \"thread\" } }",
    );
    t.remove(outer);
    check_fails_with(&t, &dir, "nesting", "SLICE_END with no open slice");

    t.set_buffer_stat("write_wrap_count", 1);
    let a = check_passes(&t, &dir);
    assert_eq!(sequence_info(&a, 3)["start_lost"], true);
    assert_eq!(a["track_events"]["interned_unresolved"], 0);
}

#[test]
fn files_that_are_no_trace_fail_with_a_reason() {
    let dir = TempDir::new("not-a-trace");
    let empty = dir.path("empty.pftrace");
    std::fs::write(&empty, b"").unwrap();
    let garbage = dir.path("garbage.bin");
    std::fs::write(&garbage, [0x84u8, 0x12, 0xff, 0x00, 0x33].repeat(100)).unwrap();
    let cases = [
        (
            empty.clone(),
            "the file is empty (0 packets: a `shmtrace record` or `perfetto` still recording \
             into it may not have written it yet)",
        ),
        (dir.path(""), "it is a directory"),
        (
            garbage.clone(),
            "byte 0: expected a packet (tag 0x0A), found byte 0x84",
        ),
    ];
    for (path, reason) in cases {
        for check in [true, false] {
            let mut args = vec!["inspect"];
            if check {
                args.push("--check");
            }
            args.push(path.to_str().unwrap());
            let out = run(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(6), "{args:?}: {stderr}");
            assert!(
                stderr.contains("is not a Perfetto trace") && stderr.contains(reason),
                "{args:?}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{args:?} printed a report");
        }
    }
}

/// The golden trace as if sequence 4's producer ran on a relayed machine 7
/// (named vm-1 by its relay): its packets carry the machine's id, and the
/// service's sequence describes the machine (`system_info` with its id,
/// after the host's) and holds its clock exchanges.
fn golden_with_a_relayed_machine() -> EditTrace {
    let mut t = EditTrace::golden();
    for i in t.sequence(4) {
        t.edit(i, "machine_id: 7");
    }
    let host_info = t.find("tracing_service_version");
    let mut info = t.packets[host_info].clone();
    let mut one = EditTrace {
        packets: vec![info.clone()],
    };
    one.edit(
        0,
        r#"machine_id: 7
           system_info { machine_name: "vm-1" tracing_service_version: "relay 1.0"
                         utsname { sysname: "GuestOS" release: "1.2" machine: "riscv64" } }"#,
    );
    info = one.packets.remove(0);
    t.packets.insert(host_info + 1, info);
    let mut sync = EditTrace {
        packets: vec![t.packets[host_info].clone()],
    };
    sync.clear(0, "system_info")
        .clear(0, "trusted_packet_sequence_id")
        .edit(
            0,
            r#"machine_id: 7
               remote_clock_sync {
                 synced_clocks { client_clocks { clocks { clock_id: 6 timestamp: 1000010 } }
                                 host_clocks { clocks { clock_id: 6 timestamp: 20 } } }
                 synced_clocks { client_clocks { clocks { clock_id: 6 timestamp: 1000030 } }
                                 host_clocks { clocks { clock_id: 6 timestamp: 40 } } } }"#,
        );
    t.packets.insert(host_info + 2, sync.packets.remove(0));
    t
}

#[test]
fn machines_of_a_relayed_trace() {
    let dir = TempDir::new("machines");
    let t = golden_with_a_relayed_machine();
    let relayed = t.sequence(4);
    let relayed_events = relayed
        .iter()
        .filter(|&&i| t.event_type(i).is_some())
        .count();
    let a = check_passes(&t, &dir);
    // The session is the host's: the relayed machine's description does not
    // replace it.
    assert!(a["session"]["service_version"]
        .as_str()
        .unwrap()
        .starts_with("Perfetto v59.0"));
    assert!(!a["session"]["system"].as_str().unwrap().contains("GuestOS"));
    let machines = a["machines"].as_array().unwrap();
    assert_eq!(machines.len(), 2, "{machines:?}");
    let (host, vm) = (&machines[0], &machines[1]);
    assert_eq!(host["id"], 0);
    assert_eq!(host["described"], true);
    assert!(host["name"].is_null());
    assert_eq!(host["sequences"], 2);
    assert_eq!(host["clock_exchanges"], 0);
    assert_eq!(vm["id"], 7);
    assert_eq!(vm["name"], "vm-1");
    assert_eq!(vm["system"], "GuestOS 1.2 riscv64");
    assert_eq!(vm["described"], true);
    assert_eq!(vm["clock_exchanges"], 2);
    // (1000010 + 1000030) / 2 - 20 and 1000030 - (20 + 40) / 2: 1 ms ahead.
    assert_eq!(vm["clock_offset_ns"], 1_000_000);
    assert!(host["clock_offset_ns"].is_null());
    assert_eq!(a["clocks"]["unplaced_machines"], serde_json::json!([]));
    assert_eq!(vm["sequences"], 1);
    assert_eq!(vm["packets"], relayed.len() as u64);
    assert_eq!(vm["track_events"], relayed_events as u64);
    // Every producer packet and event is on one machine or the other.
    let sum = |field: &str| host[field].as_u64().unwrap() + vm[field].as_u64().unwrap();
    assert_eq!(
        sum("track_events"),
        a["track_events"]["total"].as_u64().unwrap()
    );
    let sequence_packets: u64 = a["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["packets"].as_u64().unwrap())
        .sum();
    assert_eq!(sum("packets"), sequence_packets);
    assert_eq!(sequence_info(&a, 4)["machine_id"], 7);
    assert_eq!(sequence_info(&a, 3)["machine_id"], 0);

    let text = passing_report(&dir.path("ok.pftrace"));
    assert_contains_all(&text, &["Machines: 2 (the host and 1 relayed)"]);
    let row = |prefix: &str| -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in {text}"));
        line.split_whitespace().map(str::to_owned).collect()
    };
    let vm_row = row("7  vm-1");
    assert_eq!(
        vm_row[..6],
        [
            "7".to_owned(),
            "vm-1".into(),
            "1".into(),
            relayed.len().to_string(),
            relayed_events.to_string(),
            "2".into()
        ]
    );
    assert_eq!(vm_row[6..], ["+1", "ms", "GuestOS", "1.2", "riscv64"]);
    assert_eq!(
        row("0  host")[5..7],
        ["-", "-"],
        "the host exchanges no clocks"
    );
    // Sequences name their machine.
    assert_eq!(row("4 vm-1")[0..2], ["4", "vm-1"]);
    assert_eq!(row("3 host")[0..2], ["3", "host"]);
}

/// A machine's latest `remote_clock_sync` packet sets its offset, on its
/// own exchanges (as a trace processor's last one wins).
#[test]
fn the_latest_clock_exchanges_of_a_machine_set_its_offset() {
    let dir = TempDir::new("resynced");
    let mut t = golden_with_a_relayed_machine();
    let sync = t.find("remote_clock_sync");
    let mut later = EditTrace {
        packets: vec![t.packets[sync].clone()],
    };
    later.clear(0, "remote_clock_sync").edit(
        0,
        r#"remote_clock_sync {
             synced_clocks { client_clocks { clocks { clock_id: 6 timestamp: 2000050 } }
                             host_clocks { clocks { clock_id: 6 timestamp: 60 } } }
             synced_clocks { client_clocks { clocks { clock_id: 6 timestamp: 2000070 } }
                             host_clocks { clocks { clock_id: 6 timestamp: 80 } } } }"#,
    );
    t.packets.insert(sync + 1, later.packets.remove(0));
    let path = t.write(&dir.path("resynced.pftrace"));
    let (_, a) = inspect(&[&path]);
    let vm = &a["machines"][1];
    assert_eq!(vm["clock_exchanges"], 4, "{vm}");
    // 2 ms from the later packet alone; the earlier one's 1 ms, or a round
    // across the two packets, would move it.
    assert_eq!(vm["clock_offset_ns"], 2_000_000, "{vm}");
}

/// A relayed machine without clock exchanges has no offset, and the span
/// leaves its times out, saying so.
#[test]
fn a_machine_without_clock_exchanges_is_left_out_of_the_span() {
    let dir = TempDir::new("unsynced");
    let mut t = golden_with_a_relayed_machine();
    let sync = t.find("remote_clock_sync");
    t.remove(sync);
    let path = t.write(&dir.path("unsynced.pftrace"));
    let (_, a) = inspect(&[&path]);
    let vm = &a["machines"][1];
    assert_eq!(vm["id"], 7);
    assert!(vm["clock_offset_ns"].is_null(), "{vm}");
    assert_eq!(a["clocks"]["unplaced_machines"], serde_json::json!([7]));
    let text = String::from_utf8(run(&["inspect", path.to_str().unwrap()]).stdout).unwrap();
    assert!(
        text.contains("(leaving out machine(s) 7: no clock exchanges relate their clocks"),
        "{text}"
    );
}

/// A single-machine trace says nothing of machines.
#[test]
fn one_machine_has_no_machine_section() {
    let (_, a) = inspect(&[Path::new(GOLDEN)]);
    assert_eq!(a["machines"].as_array().unwrap().len(), 0);
    assert_eq!(sequence_info(&a, 3)["machine_id"], 0);
    let text = passing_report(Path::new(GOLDEN));
    assert!(!text.contains("Machines:"), "{text}");
    let header = text.lines().find(|l| l.contains("after-wrap")).unwrap();
    assert!(!header.contains("machine"), "{header}");
}

/// A sequence is one writer on one machine: a packet of it with another
/// machine's id is no packet a service writes.
#[test]
fn a_sequence_on_two_machines_is_a_trusted_fields_problem() {
    let dir = TempDir::new("twomachines");
    let mut t = EditTrace::golden();
    let last = *t.sequence(4).last().unwrap();
    t.edit(last, "machine_id: 7");
    check_fails_with(
        &t,
        &dir,
        "trusted_fields",
        "sequence 4 of machine 0 has a packet of machine 7",
    );
}

/// Two snapshots of the firmware sequence relating its clock 65 to
/// BOOTTIME that contradict each other: the offset moved by 0.5 s in 1.5
/// s, as the bridge stated it once from a clock answer that waited behind
/// a flush (a bound of 0.5 s) and then from a prompt one. A trace
/// processor takes both, and places the events around them 0.5 s apart;
/// `--check` fails. A step within what two right clocks drift apart (1 ms
/// in 1.5 s) passes.
#[test]
fn clock_snapshots_that_contradict_each_other_fail() {
    let dir = TempDir::new("snapshot-step");
    let with_second = |boot_step_ns: u64| {
        let mut t = firmware_sequence(None);
        let first = t.sequence(3)[0];
        let mut again = EditTrace {
            packets: vec![t.packets[first].clone()],
        };
        again
            .clear(0, "clock_snapshot")
            .clear(0, "first_packet_on_sequence")
            .clear(0, "previous_packet_dropped")
            .edit(
                0,
                &format!(
                    "clock_snapshot {{ clocks {{ clock_id: 65 timestamp: 2000001000 }} clocks {{ \
                     clock_id: 6 timestamp: {} }} }}",
                    1125788182702 + boot_step_ns
                ),
            );
        let at = t.events(3, INSTANT)[3];
        t.packets.insert(at, again.packets.remove(0));
        t
    };
    check_passes(&with_second(2_000_000_000 - 1_000_000), &dir);
    check_fails_with(
        &with_second(1_500_000_000),
        &dir,
        "timestamps",
        "clock snapshot contradicts the one before it on sequence 3: the offset of clock 65 to \
         BOOTTIME moved by 0.500 s in 1.500 s",
    );
}
