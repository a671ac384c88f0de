//! Issue 6's `stress` example, as CI runs it: `stress -n 20000 -t 2`
//! against `shmtrace serve`, recorded by `shmtrace record -t 2s`. What it
//! says it emitted, less what the producer's stats say it lost, is exactly
//! what the trace holds (the shared checker decodes it with the official
//! protos and compares every count), and where a sequence misses events
//! between two it holds, a loss mark says so; a session that leaves a
//! category off gets none of its events, and stress counts them as skipped.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use prost::Message;
use serde_json::Value;
use shmtrace_tests::checker::{self, EventCounts, Expectation, Loss, ProducerExpectation};
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, ServiceImpl};
use shmtrace_tests::trace_file;

/// Events stress emits, over this many threads.
const EVENTS: u64 = 20_000;
const THREADS: u64 = 2;
/// Groups of 10 events (2 slices with their ends, 4 instants of which 2
/// are flows, 2 counters) stress emits, over all threads.
const GROUPS: u64 = EVENTS / 10;
/// How long any single step may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// What one run reported and found.
struct Run {
    /// stress's `done` line.
    done: Value,
    /// Its `emitted` counts.
    emitted: EventCounts,
    /// The checker's report on the trace.
    report: checker::TraceReport,
    /// What [`gaps`] found in the trace.
    gaps: Gaps,
}

/// Runs stress (with `extra_args`) against `shmtrace serve` while
/// `shmtrace record -t 2s` records the categories `categories` (`None`:
/// the defaults, i.e. all of stress's), and checks the trace against what
/// stress reported.
fn run_stress(name: &str, extra_args: &[&str], categories: Option<&str>) -> Run {
    let dir = tempfile::Builder::new()
        .prefix(&format!("shmtrace-stress-{name}-"))
        .tempdir_in("/tmp")
        .expect("tempdir");
    let producer_socket = dir.path().join("p.sock");
    let consumer_socket = dir.path().join("c.sock");
    let trace = dir.path().join("trace.pftrace");
    let mut service = scenario::start_service(
        ServiceImpl::Ours,
        &real_binaries!(),
        dir.path(),
        &producer_socket,
        &consumer_socket,
    )
    .expect("shmtrace serve starts");

    let mut command = Command::new(scenario::producer_example("stress").expect("stress"));
    command
        .args(["-n", &EVENTS.to_string(), "-t", &THREADS.to_string()])
        .args(["--start-timeout-s", "30", "--stop-timeout-s", "30"])
        .args(extra_args)
        .arg("--socket")
        .arg(&producer_socket);
    let mut stress = ChildProcess::spawn("stress", command, dir.path()).expect("spawn stress");

    let mut command = Command::new(scenario::shmtrace_binary().expect("shmtrace"));
    command
        .args(["record", "--progress", "json", "-t", "2s", "-b", "16mb"])
        .arg("--socket")
        .arg(&consumer_socket)
        .arg("-o")
        .arg(&trace);
    if let Some(categories) = categories {
        command.args(["--app-categories", categories]);
    }
    let mut record = ChildProcess::spawn("record", command, dir.path()).expect("spawn record");

    let done = stress.expect_event("done", TIMEOUT).unwrap();
    let summary = record.expect_event("done", TIMEOUT).unwrap()["summary"].clone();
    stress.expect_event("stopped", TIMEOUT).unwrap();
    stress.expect_success(TIMEOUT).unwrap();
    record.expect_success(TIMEOUT).unwrap();
    service.close_stdin();
    service.expect_success(TIMEOUT).unwrap();

    let emitted: EventCounts =
        serde_json::from_value(done["emitted"].clone()).expect("stress's emitted counts");
    let pid = done["pid"].as_u64().expect("pid");
    assert_eq!(pid, u64::from(stress.pid()));
    assert_eq!(done["events"], emitted.track_events(), "{done}");
    assert_eq!(done["threads"], THREADS, "{done}");
    // Every one of the N events was either handed to the library or
    // skipped because its category was off.
    assert_eq!(emitted.track_events() + emitted.skipped_disabled, EVENTS);

    let dropped = stat(&done, "packets_dropped");
    let loss = if dropped == 0 {
        Loss::None
    } else {
        Loss::Allowed
    };
    let expect = Expectation {
        producers: vec![ProducerExpectation {
            pid: Some(pid as u32),
            emitted,
        }],
        loss,
        require_trace_stats: true,
        require_service_packets: true,
        remote_producers: false,
    };
    // The accounting: the trace holds what stress emitted less every loss
    // the producer counted (dropped packets, slice ends suppressed because
    // their begin was dropped, re-entrant events, events no writer could
    // take), plus the dropped slice ends it wrote later after all (each
    // thread's exit, before `done`, flushes them). The checker holds the
    // trace to it, and so needs no loss indicator in the trace for what the
    // producer counted: a thread that never got a chunk has no sequence to
    // mark its loss on.
    let lost = dropped
        + stat(&done, "orphan_ends_suppressed")
        + stat(&done, "reentrant_drops")
        + stat(&done, "writerless_drops")
        - stat(&done, "slice_ends_written_late");
    let report = checker::check_with_counted_loss(
        std::slice::from_ref(&trace),
        &expect,
        &[lost],
        dir.path(),
        "trace",
    )
    .expect("checker");
    report.assert_ok(&format!("stress ({name})"));
    assert_eq!(
        report.totals.track_events(),
        emitted.track_events() - lost,
        "emitted {emitted:?}, stats {}, sequences {:?}",
        done["stats"],
        report.sequences
    );
    assert_eq!(summary["track_events"], report.totals.track_events());
    assert_eq!(summary["producer_pids"], serde_json::json!([pid]));
    // Where a sequence misses events between two it holds, the loss is
    // marked (`previous_packet_dropped`): what a trace processor shows as
    // lost data. Losses before a sequence's first packet or after its last
    // leave no gap to mark.
    let per_group = emitted.track_events() / GROUPS;
    assert_eq!(
        per_group * GROUPS,
        emitted.track_events(),
        "every group emitted the same events: {emitted:?}"
    );
    let gaps = gaps(&trace, per_group);
    assert!(
        gaps.unmarked.is_empty(),
        "unmarked gaps: {:?}",
        gaps.unmarked
    );
    assert!(
        gaps.excess.is_empty(),
        "events stress did not emit there: {:?}",
        gaps.excess
    );
    let inspected = scenario::inspect(&[trace]).expect("shmtrace inspect");
    assert!(inspected.ok, "{}", inspected.analysis["problems"]);
    // One sequence per emitting thread; with losses, a thread that never
    // got a chunk (the other held the few there are for all its events)
    // has none, its events counted in `packets_dropped` alone.
    let sequences = report.track_event_sequences().count();
    if dropped == 0 {
        assert_eq!(sequences, THREADS as usize);
    } else {
        assert!(
            (1..=THREADS as usize).contains(&sequences),
            "{sequences} sequences"
        );
    }
    Run {
        done,
        emitted,
        report,
        gaps,
    }
}

/// `perfetto.protos.TracePacket` (the fields read here).
#[derive(Clone, PartialEq, Message)]
struct Packet {
    #[prost(uint32, optional, tag = "10")]
    trusted_packet_sequence_id: Option<u32>,
    #[prost(uint32, optional, tag = "42")]
    previous_packet_dropped: Option<u32>,
    #[prost(message, optional, tag = "11")]
    track_event: Option<TrackEvent>,
}

/// `perfetto.protos.TrackEvent` (its counter values).
#[derive(Clone, PartialEq, Message)]
struct TrackEvent {
    #[prost(int64, optional, tag = "30")]
    counter_value: Option<i64>,
    #[prost(double, optional, tag = "44")]
    double_counter_value: Option<f64>,
}

/// What [`gaps`] found.
#[derive(Debug, Default)]
struct Gaps {
    /// Pairs of successive counters on a sequence that were checked.
    pairs: u64,
    /// Pairs with events missing between them (all marked, else listed in
    /// `unmarked`).
    gaps: u64,
    /// Gaps with no `previous_packet_dropped` on the packets after the
    /// first counter up to the second.
    unmarked: Vec<String>,
    /// Pairs with more events between them than stress emitted there, or
    /// in the wrong order.
    excess: Vec<String>,
}

/// Finds the gaps in the trace's stress sequences. Each thread emits
/// groups of `per_group` events, the last two its int counter (value `g`,
/// the group's number) and its double counter (`g / 4`), so a counter says
/// where in its thread's stream it stands. Between two successive counters
/// of a sequence, every event its thread emitted is either there or lost,
/// and a loss there is marked on a packet after the first counter, up to
/// the second (the first packet written after it).
fn gaps(trace: &Path, per_group: u64) -> Gaps {
    let packets = trace_file::packets::<Packet>(trace).expect("the trace's packets");
    // Per sequence: the position of its last counter, the events since,
    // and whether a packet since marks a loss.
    let mut state: HashMap<u32, (Option<u64>, u64, bool)> = HashMap::new();
    let mut found = Gaps::default();
    for packet in packets {
        let Some(seq) = packet.trusted_packet_sequence_id else {
            continue;
        };
        let (last, events, marked) = state.entry(seq).or_default();
        *marked |= packet.previous_packet_dropped.unwrap_or(0) != 0;
        let Some(event) = packet.track_event else {
            continue;
        };
        let position = match (event.counter_value, event.double_counter_value) {
            (Some(g), _) => per_group * g as u64 + per_group - 2,
            (None, Some(quarter)) => per_group * (quarter * 4.0) as u64 + per_group - 1,
            (None, None) => {
                *events += 1;
                continue;
            }
        };
        if let Some(previous) = *last {
            found.pairs += 1;
            let between = position.checked_sub(previous + 1);
            let at = format!("sequence {seq}, events {previous}..{position}: {events} between");
            match between {
                Some(emitted) if *events > emitted => found.excess.push(at),
                None => found.excess.push(at),
                Some(emitted) if *events < emitted => {
                    found.gaps += 1;
                    if !*marked {
                        found.unmarked.push(at);
                    }
                }
                Some(_) => {}
            }
        }
        *last = Some(position);
        *events = 0;
        *marked = false;
    }
    found
}

/// A counter of the producer's stats in stress's `done` line.
fn stat(done: &Value, field: &str) -> u64 {
    done["stats"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no stats.{field} in {done}"))
}

#[test]
fn stress_emits_n_events_and_the_trace_holds_them() {
    let run = run_stress("all", &[], None);
    assert_eq!(run.emitted.track_events(), EVENTS, "{}", run.done);
    assert_eq!(run.emitted.skipped_disabled, 0);
    // The mix: per group 2 slices (and their ends), 4 instants, 2 flows
    // (a start and a terminating end), 2 counters.
    assert_eq!(run.emitted.slice_begin, 2 * GROUPS);
    assert_eq!(run.emitted.slice_end, 2 * GROUPS);
    assert_eq!(run.emitted.instant, 4 * GROUPS);
    assert_eq!(run.emitted.flow_begin, GROUPS);
    assert_eq!(run.emitted.counter_double, GROUPS);
    // A 4 MiB shared memory buffer and a fast service: nothing lost.
    assert_eq!(stat(&run.done, "packets_dropped"), 0, "{}", run.done);
    assert_eq!(run.report.totals, run.emitted);
    // Every counter is seen: 2 per group, in pairs on each thread's
    // sequence.
    assert_eq!(run.gaps.pairs, 2 * GROUPS - THREADS, "{:?}", run.gaps);
    assert_eq!(run.gaps.gaps, 0);
}

#[test]
fn stress_counts_events_of_categories_the_session_leaves_off_as_skipped() {
    let run = run_stress("no-flows", &[], Some("stress,stress.counter"));
    // flow_out and flow_in (stress.flow) were never emitted.
    assert_eq!(run.emitted.skipped_disabled, 2 * GROUPS, "{}", run.done);
    assert_eq!(run.emitted.flow_begin + run.emitted.flow_end, 0);
    assert_eq!(run.emitted.instant, 2 * GROUPS);
    assert_eq!(run.emitted.counter_int, GROUPS);
    // The checker files slice begins and instants by category: only
    // `stress` ones (2 slices, "tick" and "nested" per group).
    let by_category = &run.report.events_by_category;
    assert_eq!(
        by_category.iter().collect::<Vec<_>>(),
        [(&"stress".to_string(), &(4 * GROUPS))],
        "{by_category:?}"
    );
    let by_name = &run.report.events_by_name;
    assert_eq!(by_name.get("flow_out"), None, "{by_name:?}");
    assert_eq!(by_name.get("nested"), Some(&GROUPS), "{by_name:?}");
    assert_eq!(run.report.totals.flow_begin, 0);
}

#[test]
fn stress_through_a_tiny_smb_loses_only_what_the_stats_count() {
    // 8 KiB of shared memory for two threads emitting flat out: the
    // service cannot keep up, packets are dropped, and slice ends whose
    // begin was dropped are suppressed; `run_stress` holds the trace to
    // emitted - dropped - suppressed, and every gap inside a sequence to a
    // loss mark. (The trace need not show a loss at all: a thread that
    // never got a chunk has no sequence, and one that lost only its first
    // or last events has no gap; the producer's stats count both.)
    let run = run_stress("tiny-smb", &["--shmem-kb", "8"], None);
    assert_eq!(run.emitted.track_events(), EVENTS);
    assert!(stat(&run.done, "packets_dropped") > 0, "{}", run.done);
    assert!(run.gaps.pairs > 0, "no counters to check: {:?}", run.gaps);
}
