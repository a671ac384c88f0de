//! Issue 6, "no service" and "reconnect after a service restart": a program
//! traced with shmtrace-producer (the `heartbeat` example, one slice every
//! 10 ms while tracing is on) starts before any service exists and keeps
//! running with tracing off; once `shmtrace serve` comes up it connects and
//! a session recorded by `shmtrace record` holds its events; after the
//! service is killed and restarted it connects again (its second
//! connection) and the next session holds its events again; after a clean
//! shutdown and restart, its third.

use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::Duration;

use serde_json::Value;
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, ServiceImpl};

/// How long any single step may take.
const TIMEOUT: Duration = Duration::from_secs(20);
/// How long the program runs before any service exists.
const NO_SERVICE: Duration = Duration::from_secs(1);

/// What `shmtrace record` and `shmtrace inspect --check` found in one
/// 1-second session.
struct Recorded {
    /// "beat" slices in the trace.
    beats: u64,
    /// The inspected trace (`shmtrace inspect --check --json`).
    analysis: Value,
}

/// Records a 1 s session with `shmtrace record` into `out` and judges it.
fn record(consumer_socket: &Path, out: &Path, heartbeat_pid: u32) -> Recorded {
    let bin = scenario::shmtrace_binary().expect("shmtrace binary");
    let output = Command::new(bin)
        .args(["record", "--progress", "json", "-t", "1s", "-b", "1mb"])
        .arg("--socket")
        .arg(consumer_socket)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run shmtrace record");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "shmtrace record: {stderr}");
    let done: Value = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|event| event["event"] == "done")
        .unwrap_or_else(|| panic!("shmtrace record reported no summary: {stderr}"));
    let summary = &done["summary"];
    assert_eq!(
        summary["producer_pids"],
        serde_json::json!([heartbeat_pid]),
        "{summary}"
    );
    assert_eq!(summary["losses"], serde_json::json!([]), "{summary}");

    let verdict = scenario::inspect(&[out.to_path_buf()]).expect("shmtrace inspect");
    let analysis = verdict.analysis;
    assert!(verdict.ok, "inspect --check: {}", analysis["problems"]);
    assert_eq!(
        summary["track_events"], analysis["track_events"]["total"],
        "{summary}"
    );
    // One heartbeat thread, one sequence, cleanly started: the new
    // connection's shared memory and writers started from scratch.
    let sequences = analysis["sequences"].as_array().expect("sequences");
    let with_events: Vec<_> = sequences
        .iter()
        .filter(|s| s["track_events"].as_u64() > Some(0))
        .collect();
    assert_eq!(with_events.len(), 1, "{sequences:?}");
    let sequence = with_events[0];
    assert_eq!(sequence["pids"], serde_json::json!([heartbeat_pid]));
    assert_eq!(sequence["loss_marks"], 0, "{sequence}");
    assert!(sequence["cleared"].as_u64() >= Some(1), "{sequence}");
    let beats = analysis["track_events"]["by_name"]["beat"]
        .as_u64()
        .unwrap_or(0);
    Recorded { beats, analysis }
}

/// The `"connections"` count of a heartbeat `connected`/`disconnected` line.
fn connections(event: &Value) -> u64 {
    event["connections"]
        .as_u64()
        .unwrap_or_else(|| panic!("no connection count in {event}"))
}

/// Waits for the heartbeat's connection number `nth`, records a session
/// into `out`, requires the heartbeat's events in it, and the heartbeat to
/// report the session's start and stop.
fn connect_and_record(heartbeat: &mut ChildProcess, nth: u64, consumer_socket: &Path, out: &Path) {
    let connected = heartbeat.expect_event("connected", TIMEOUT).unwrap();
    assert_eq!(connections(&connected), nth, "{connected}");
    let recorded = record(consumer_socket, out, heartbeat.pid());
    assert!(recorded.beats > 0, "{}", recorded.analysis["track_events"]);
    heartbeat
        .expect_event("session_start", TIMEOUT)
        .expect("the session starts the heartbeat's track_event instance");
    heartbeat
        .expect_event("session_stop", TIMEOUT)
        .expect("the session's end stops it");
}

#[test]
fn producer_runs_without_a_service_and_reconnects_after_a_restart() {
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-reconnect-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let producer_socket = dir.path().join("p.sock");
    let consumer_socket = dir.path().join("c.sock");
    let bins = real_binaries!();
    let start_service = || {
        scenario::start_service(
            ServiceImpl::Ours,
            &bins,
            dir.path(),
            &producer_socket,
            &consumer_socket,
        )
        .expect("shmtrace serve starts")
    };

    let mut command = Command::new(scenario::producer_example("heartbeat").expect("heartbeat"));
    command.env("PERFETTO_PRODUCER_SOCK_NAME", &producer_socket);
    let mut heartbeat = ChildProcess::spawn("heartbeat", command, dir.path()).expect("spawn");

    // No service: the program runs on, tracing off, and says nothing.
    thread::sleep(NO_SERVICE);
    assert!(heartbeat.is_running(), "{}", heartbeat.stderr_tail());
    assert_eq!(heartbeat.pending_events(), Vec::<Value>::new());

    // The service appears: the background retries find it.
    let first_service = start_service();
    connect_and_record(
        &mut heartbeat,
        1,
        &consumer_socket,
        &dir.path().join("1.pftrace"),
    );

    // The service dies (SIGKILL, no goodbye): the program notices, runs on.
    drop(first_service);
    let disconnected = heartbeat.expect_event("disconnected", TIMEOUT).unwrap();
    assert_eq!(connections(&disconnected), 1, "{disconnected}");
    assert!(heartbeat.is_running(), "{}", heartbeat.stderr_tail());

    // A new service on the same sockets: the second connection traces again.
    let mut second_service = start_service();
    connect_and_record(
        &mut heartbeat,
        2,
        &consumer_socket,
        &dir.path().join("2.pftrace"),
    );

    // A clean shutdown of the service (end of its stdin): the same again,
    // up to the third connection.
    second_service.close_stdin();
    second_service.expect_success(TIMEOUT).unwrap();
    let disconnected = heartbeat.expect_event("disconnected", TIMEOUT).unwrap();
    assert_eq!(connections(&disconnected), 2, "{disconnected}");
    let mut third_service = start_service();
    let connected = heartbeat.expect_event("connected", TIMEOUT).unwrap();
    assert_eq!(connections(&connected), 3, "{connected}");
    third_service.close_stdin();
    third_service.expect_success(TIMEOUT).unwrap();
    assert!(heartbeat.is_running(), "{}", heartbeat.stderr_tail());
}
