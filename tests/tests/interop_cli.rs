//! The CLI against the real Perfetto: real producer -> real service <-
//! `shmtrace record` in the scenarios of the matrix (all but the mid-session
//! read, which the CLI does not do), and `shmtrace query` against the real
//! service. Every run also passes `shmtrace inspect --check` (the harness
//! requires it of every trace, in every cell).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use shmtrace_tests::checker::Loss;
use shmtrace_tests::config::FillPolicy;
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{
    self, shmtrace_binary, BetweenPhases, Cell, Outcome, ProducerSpec, Scenario, Stop,
};

fn run(scenario: &Scenario) -> Outcome {
    scenario::run(Cell::REAL_WITH_OUR_CLI, &real_binaries!(), scenario)
        .unwrap_or_else(|e| panic!("{}: {e}", scenario.name))
}

/// The CLI's own summary agrees with the checker (official schema) on
/// what the trace holds.
fn assert_summary_matches(outcome: &Outcome) -> Value {
    let summary = outcome
        .cli_summary
        .clone()
        .expect("shmtrace record's summary");
    let report = &outcome.report;
    assert_eq!(summary["packets"], report.packets, "{summary}");
    assert_eq!(
        summary["track_events"],
        report.totals.track_events(),
        "{summary}"
    );
    assert_eq!(
        summary["sequences"],
        report.track_event_sequences().count(),
        "{summary}"
    );
    assert_eq!(summary["file_bytes"], outcome.trace_bytes);
    let ds = &summary["data_sources"][0];
    assert_eq!(ds["name"], "track_event");
    assert!(
        ds["status"].as_str().unwrap().starts_with("recorded from "),
        "{summary}"
    );
    assert_eq!(summary["problems"], 0);
    assert_eq!(
        outcome.inspect.analysis["track_events"]["total"],
        report.totals.track_events()
    );
    summary
}

#[test]
fn small_packets_stopped_with_ctrl_c() {
    let scenario = Scenario::new(
        "cli-small",
        vec![ProducerSpec {
            threads: 2,
            iterations: 200,
            ..Default::default()
        }],
    );
    let outcome = run(&scenario);
    outcome.report.assert_ok("cli: small packets");
    assert_eq!(outcome.emitted().slice_begin, 800);
    assert_eq!(
        outcome.report.totals.track_events(),
        outcome.emitted().track_events()
    );
    let summary = assert_summary_matches(&outcome);
    assert_eq!(summary["ended"], "stopped on request (flushed)");
    assert_eq!(summary["losses"].as_array().unwrap().len(), 0, "{summary}");
    let by_name = &outcome.inspect.analysis["track_events"]["by_name"];
    for name in ["outer", "inner", "tick", "flow_out", "flow_in"] {
        assert_eq!(by_name[name], 400, "{name}: {by_name}");
    }
}

#[test]
fn packets_spanning_many_chunks() {
    const LARGE_KB: u32 = 300;
    let scenario = Scenario {
        buffer_kb: 16 * 1024,
        ..Scenario::new(
            "cli-large",
            vec![ProducerSpec {
                threads: 2,
                iterations: 12,
                large_kb: LARGE_KB,
                large_every: 4,
                shmem_kb: 4096,
                ..Default::default()
            }],
        )
    };
    let outcome = run(&scenario);
    outcome.report.assert_ok("cli: large packets");
    assert_eq!(outcome.report.totals.large, 6);
    assert!(outcome.trace_bytes > 6 * u64::from(LARGE_KB) * 1024);
    assert_summary_matches(&outcome);
}

#[test]
fn ring_buffer_wrap_ended_by_duration() {
    let scenario = Scenario {
        buffer_kb: 256,
        fill_policy: FillPolicy::RingBuffer,
        stop: Stop::ByDuration { duration_ms: 3000 },
        clear_period_ms: Some(100),
        loss: Loss::Allowed,
        ..Scenario::new(
            "cli-ring",
            vec![ProducerSpec {
                threads: 2,
                iterations: 4000,
                iteration_sleep_us: 150,
                ..Default::default()
            }],
        )
    };
    let outcome = run(&scenario);
    outcome.report.assert_ok("cli: ring buffer wrap");
    assert!(outcome.report.buffer_stat("chunks_overwritten") > 0);
    let summary = assert_summary_matches(&outcome);
    assert!(
        summary["ended"]
            .as_str()
            .unwrap()
            .starts_with("ended by the service after the configured 3.0 s"),
        "{summary}"
    );
    let losses = summary["losses"].to_string();
    assert!(losses.contains("chunks_overwritten"), "{losses}");
    assert!(losses.contains("the ring buffer wrapped"), "{losses}");
}

#[test]
fn discard_when_full() {
    let scenario = Scenario {
        buffer_kb: 128,
        fill_policy: FillPolicy::Discard,
        loss: Loss::Allowed,
        ..Scenario::new(
            "cli-discard",
            vec![ProducerSpec {
                threads: 2,
                iterations: 3000,
                ..Default::default()
            }],
        )
    };
    let outcome = run(&scenario);
    outcome.report.assert_ok("cli: discard when full");
    assert!(outcome.report.buffer_stat("chunks_discarded") > 0);
    let summary = assert_summary_matches(&outcome);
    assert!(
        summary["losses"].to_string().contains("chunks_discarded"),
        "{summary}"
    );
}

#[test]
fn two_producers_two_threads_each() {
    let spec = ProducerSpec {
        threads: 2,
        iterations: 300,
        ..Default::default()
    };
    let outcome = run(&Scenario::new("cli-two-producers", vec![spec, spec]));
    outcome.report.assert_ok("cli: 2 producers x 2 threads");
    let summary = assert_summary_matches(&outcome);
    assert_eq!(
        summary["producer_pids"].as_array().unwrap().len(),
        2,
        "{summary}"
    );
    assert_eq!(summary["sequences"], 4);
}

#[test]
fn incremental_state_clear() {
    let scenario = Scenario {
        clear_period_ms: Some(100),
        ..Scenario::new(
            "cli-clear",
            vec![ProducerSpec {
                threads: 2,
                iterations: 300,
                iteration_sleep_us: 3000,
                ..Default::default()
            }],
        )
    };
    let outcome = run(&scenario);
    outcome.report.assert_ok("cli: incremental state clear");
    for seq in outcome.inspect.analysis["sequences"].as_array().unwrap() {
        assert!(seq["cleared"].as_u64().unwrap() >= 3, "{seq}");
    }
    assert_summary_matches(&outcome);
}

#[test]
fn write_into_file() {
    let scenario = Scenario {
        write_into_file_period_ms: Some(100),
        between_phases: BetweenPhases::SampleFileSize {
            settle: Duration::from_millis(500),
        },
        ..Scenario::new(
            "cli-file",
            vec![ProducerSpec {
                threads: 2,
                iterations: 300,
                phases: 3,
                ..Default::default()
            }],
        )
    };
    let outcome = run(&scenario);
    outcome.report.assert_ok("cli: write_into_file");
    let sizes = &outcome.file_sizes;
    assert!(sizes[0] > 0, "nothing written during phase 1: {sizes:?}");
    assert!(
        sizes.windows(2).all(|w| w[0] < w[1]),
        "file did not grow: {sizes:?}"
    );
    assert_summary_matches(&outcome);
}

#[test]
fn mid_session_reads_are_not_offered() {
    let scenario = Scenario {
        between_phases: BetweenPhases::FlushAndRead,
        ..Scenario::new(
            "cli-flush",
            vec![ProducerSpec {
                phases: 2,
                ..Default::default()
            }],
        )
    };
    let err = scenario::run(Cell::REAL_WITH_OUR_CLI, &real_binaries!(), &scenario)
        .expect_err("the CLI cell cannot read mid-session");
    assert!(err.to_string().contains("no mid-session reads"), "{err}");
}

fn query_json(socket: &std::path::Path) -> Value {
    let out = Command::new(shmtrace_binary().unwrap())
        .args(["query", "--json", "--socket"])
        .arg(socket)
        .output()
        .expect("run shmtrace query");
    assert!(
        out.status.success(),
        "shmtrace query: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("query --json prints JSON")
}

#[test]
fn query_the_real_service() {
    let bins = real_binaries!();
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-cli-query-")
        .tempdir_in("/tmp")
        .unwrap();
    let producer_socket = dir.path().join("p.sock");
    let consumer_socket = dir.path().join("c.sock");
    let mut service = Command::new(&bins.service);
    service
        .arg("--producer-socket")
        .arg(&producer_socket)
        .arg("--consumer-socket")
        .arg(&consumer_socket)
        .arg("--exit-on-stdin-eof");
    let mut service = ChildProcess::spawn("service", service, dir.path()).unwrap();
    service
        .expect_event("ready", Duration::from_secs(20))
        .unwrap();

    // Nobody connected yet.
    let state = query_json(&consumer_socket);
    assert!(
        state["version"]
            .as_str()
            .unwrap()
            .starts_with("Perfetto v59"),
        "{state}"
    );
    assert_eq!(state["producers"].as_array().unwrap().len(), 0, "{state}");

    let mut producer = Command::new(&bins.producer);
    producer
        .env("PERFETTO_PRODUCER_SOCK_NAME", &producer_socket)
        .args(["--threads=1", "--iterations=1"]);
    let _producer = ChildProcess::spawn("producer", producer, dir.path()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let state = loop {
        let state = query_json(&consumer_socket);
        if !state["data_sources"].as_array().unwrap().is_empty() {
            break state;
        }
        assert!(
            Instant::now() < deadline,
            "the producer never registered: {state}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let producers = state["producers"].as_array().unwrap();
    assert_eq!(producers.len(), 1, "{state}");
    assert!(producers[0]["pid"].as_i64().unwrap() > 0);
    let ds = &state["data_sources"][0];
    assert_eq!(ds["name"], "track_event");
    assert_eq!(ds["producer_id"], producers[0]["id"]);
    let categories: Vec<&str> = ds["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(categories.contains(&"interop"), "{categories:?}");
    assert_eq!(state["lists_sessions"], true);

    // And the table for people.
    let out = Command::new(shmtrace_binary().unwrap())
        .args(["query", "--socket"])
        .arg(&consumer_socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 producer(s), 1 data source(s)"), "{text}");
    assert!(text.contains("track_event"), "{text}");
    assert!(text.contains("categories: "), "{text}");
}
