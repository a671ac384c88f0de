//! Issue 6's `stress` example, as CI runs it: `stress -n 20000 -t 2`
//! against `shmtrace serve`, recorded by `shmtrace record -t 2s`. What it
//! says it emitted, less what the producer's stats say it dropped, is
//! exactly what the trace holds (the shared checker decodes it with the
//! official protos and compares every count); a session that leaves a
//! category off gets none of its events, and stress counts them as skipped.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use shmtrace_tests::checker::{self, EventCounts, Expectation, Loss, ProducerExpectation};
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, ServiceImpl};

/// Events stress emits, over this many threads.
const EVENTS: u64 = 20_000;
const THREADS: u64 = 2;
/// Groups of 10 events (2 slices with their ends, 4 instants of which 2
/// are flows, 2 counters) each thread emits.
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
    };
    let report = checker::check(std::slice::from_ref(&trace), &expect, dir.path(), "trace")
        .expect("checker");
    report.assert_ok(&format!("stress ({name})"));
    // The accounting: the trace holds what stress emitted less every loss
    // the producer counted (dropped packets, slice ends suppressed because
    // their begin was dropped, re-entrant events).
    let lost = dropped + stat(&done, "orphan_ends_suppressed") + stat(&done, "reentrant_drops");
    assert_eq!(
        report.totals.track_events(),
        emitted.track_events() - lost,
        "emitted {emitted:?}, stats {}, sequences {:?}",
        done["stats"],
        report.sequences
    );
    assert_eq!(summary["track_events"], report.totals.track_events());
    assert_eq!(summary["producer_pids"], serde_json::json!([pid]));
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
    }
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
    // service cannot keep up, packets are dropped (and marked), and slice
    // ends whose begin was dropped are suppressed; `run_stress` holds the
    // trace to emitted - dropped - suppressed.
    let run = run_stress("tiny-smb", &["--shmem-kb", "8"], None);
    assert_eq!(run.emitted.track_events(), EVENTS);
    assert!(stat(&run.done, "packets_dropped") > 0, "{}", run.done);
    assert!(
        run.report.loss_indicators.values().any(|&n| n > 0),
        "{:?}",
        run.report.loss_indicators
    );
}
