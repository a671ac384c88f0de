//! `shmtrace trigger` against the real Perfetto service and against
//! `shmtrace serve`: the same STOP_TRACING session (recorded by `shmtrace
//! record --txt`) ends early on both when the trigger arrives, and both
//! traces carry the same `trigger` packet. The same with a program using
//! our producer library's `activate_triggers` (shmtrace-producer's
//! `trigger` example) instead of the CLI. And a START_TRACING session that
//! the trigger starts: its trace passes `shmtrace inspect --check` (its
//! clock snapshots, the trigger's among them, in time order).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{producer_example, shmtrace_binary, start_service, ServiceImpl};

/// The session's trigger timeout: the trigger must end it long before.
const TIMEOUT_MS: u64 = 60_000;

/// The session: STOP_TRACING, trigger "go" with a 100 ms stop delay, a
/// 60 s trigger timeout (shared with `shmtrace`'s own CLI tests).
const CONFIG: &str = include_str!("../../host-service/cli/tests/data/stop_on_trigger.txtpb");

/// A START_TRACING session: trigger "go" starts it, and it ends 300 ms
/// later (its stop delay).
const START_CONFIG: &str = "buffers { size_kb: 1024 }
data_sources { config { name: \"track_event\" } }
trigger_config {
  trigger_mode: START_TRACING
  trigger_timeout_ms: 60000
  triggers { name: \"go\" stop_delay_ms: 300 }
}
";

/// The fields of a trace this test looks at (field numbers of Perfetto's
/// trace.proto / trace_packet.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct Trace {
    #[prost(message, repeated, tag = "1")]
    packet: Vec<Packet>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Packet {
    #[prost(uint64, optional, tag = "8")]
    timestamp: Option<u64>,
    #[prost(message, optional, tag = "46")]
    trigger: Option<Trigger>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Trigger {
    #[prost(string, optional, tag = "1")]
    trigger_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    producer_name: Option<String>,
    #[prost(int32, optional, tag = "3")]
    trusted_producer_uid: Option<i32>,
    #[prost(uint64, optional, tag = "4")]
    stop_delay_ms: Option<u64>,
}

fn shmtrace() -> Command {
    Command::new(shmtrace_binary().expect("shmtrace binary"))
}

fn output(command: &mut Command) -> (Output, String) {
    let out = command.output().expect("run shmtrace");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

fn sessions(consumer: &Path) -> usize {
    let (out, stderr) = output(
        shmtrace()
            .args(["query", "--json", "--socket"])
            .arg(consumer),
    );
    assert!(out.status.success(), "{stderr}");
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    state["sessions"].as_array().map_or(0, Vec::len)
}

/// Activates the triggers "go" and "unlisted" with the `shmtrace trigger`
/// CLI through the producer socket `producer`.
fn cli_trigger(which: ServiceImpl, producer: &Path) {
    let (out, stderr) = output(
        shmtrace()
            .args(["trigger", "go", "unlisted", "--socket"])
            .arg(producer),
    );
    assert_eq!(out.status.code(), Some(0), "{which:?}: {stderr}");
}

/// shmtrace-producer's `trigger` example: our producer library's
/// `activate_triggers`.
fn trigger_example() -> PathBuf {
    producer_example("trigger").expect("the trigger example")
}

/// Activates the triggers "go" and "unlisted" with a program using our
/// producer library, through the producer socket `producer`.
fn library_trigger(which: ServiceImpl, producer: &Path) {
    let out = Command::new(trigger_example())
        .args(["go", "unlisted"])
        .env("PERFETTO_PRODUCER_SOCK_NAME", producer)
        .output()
        .expect("run the trigger example");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{which:?}: {stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "activated: go unlisted"
    );
}

/// Runs the trigger flow against `which`, the triggers activated by
/// `trigger`; the trace's trigger packets.
fn triggered_session(which: ServiceImpl, trigger: fn(ServiceImpl, &Path)) -> Vec<Trigger> {
    let (trace, _dir, stderr) = triggered_trace(which, trigger, CONFIG);
    // The summary says what ended the session.
    assert!(
        stderr.contains("ended by the service after the STOP_TRACING trigger \"go\""),
        "{which:?}: {stderr}"
    );
    trace
        .packet
        .iter()
        .filter_map(|p| {
            let t = p.trigger.clone()?;
            assert!(
                p.timestamp.is_some_and(|t| t > 0),
                "{which:?}: no timestamp"
            );
            Some(t)
        })
        .collect()
}

/// Records a session of `config` against `which`, the triggers activated
/// by `trigger`: the trace, the directory holding it (`trace.pftrace`),
/// and what `record` printed on stderr (its summary).
fn triggered_trace(
    which: ServiceImpl,
    trigger: fn(ServiceImpl, &Path),
    config: &str,
) -> (Trace, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| -> PathBuf { dir.path().join(name) };
    let (producer, consumer) = (path("p.sock"), path("c.sock"));
    let _service = start_service(which, &real_binaries!(), dir.path(), &producer, &consumer)
        .expect("service starts");
    std::fs::write(path("config.txtpb"), config).expect("write config");
    let started = Instant::now();
    let record = shmtrace()
        .args(["record", "--progress", "none", "--txt", "-c"])
        .arg(path("config.txtpb"))
        .arg("-o")
        .arg(path("trace.pftrace"))
        .arg("--socket")
        .arg(&consumer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shmtrace record");
    while sessions(&consumer) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the session did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    trigger(which, &producer);

    let out = record.wait_with_output().expect("record ends");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{which:?}: {stderr}");
    assert!(
        started.elapsed() < Duration::from_millis(TIMEOUT_MS / 2),
        "{which:?}: ended by the trigger, not the trigger timeout"
    );
    let bytes = std::fs::read(path("trace.pftrace")).expect("read trace");
    let trace = <Trace as prost::Message>::decode(bytes.as_slice()).expect("decode trace");
    (trace, dir, stderr)
}

/// Runs the trigger flow with `trigger` against both services: the real
/// one took "go" (and ignored "unlisted", which no session lists), its
/// packet names "go" and the sending producer `producer_name`, and ours
/// wrote the same packet.
fn both_services_stop_on(trigger: fn(ServiceImpl, &Path), producer_name: &str) {
    let real = triggered_session(ServiceImpl::Real, trigger);
    let ours = triggered_session(ServiceImpl::Ours, trigger);
    assert_eq!(
        real.len(),
        1,
        "the real service accepted the trigger: {real:?}"
    );
    let expected = Trigger {
        trigger_name: Some("go".into()),
        producer_name: Some(producer_name.into()),
        trusted_producer_uid: real[0].trusted_producer_uid,
        stop_delay_ms: Some(100),
    };
    assert_eq!(real[0], expected);
    assert_eq!(ours, real, "both services write the same trigger packet");
}

#[test]
fn shmtrace_trigger_stops_a_session_of_either_service_with_the_same_trigger_packet() {
    both_services_stop_on(cli_trigger, "shmtrace-trigger");
}

#[test]
fn activate_triggers_of_our_producer_stops_a_session_of_either_service() {
    // Our producer is named as Perfetto's SDK names it, by its argv[0]
    // (the path it was started with); the service puts the name of the
    // producer that sent the trigger into the packet.
    let example = trigger_example();
    both_services_stop_on(library_trigger, example.to_str().expect("UTF-8 path"));
}

/// A START_TRACING session started by `shmtrace trigger`: both services
/// write the trigger, and ours a trace that passes `inspect --check`. Its
/// clock snapshots go in time order; before, the start's went ahead of
/// the earlier one the trigger took, and a trace processor refuses a
/// snapshot whose trace clock goes back. (The real service, v59, writes
/// them in that order: its trace has one refused snapshot, which the
/// others make up for.)
#[test]
fn a_session_started_by_a_trigger_passes_the_check_on_our_service() {
    for which in [ServiceImpl::Real, ServiceImpl::Ours] {
        let (trace, dir, stderr) = triggered_trace(which, cli_trigger, START_CONFIG);
        assert!(
            stderr.contains(
                "ended by the service: the START_TRACING trigger \"go\" started it, and its \
                 stop delay ended it"
            ),
            "{which:?}: {stderr}"
        );
        assert!(
            trace.packet.iter().any(|p| p
                .trigger
                .as_ref()
                .is_some_and(|t| t.trigger_name.as_deref() == Some("go"))),
            "{which:?}: no trigger packet"
        );
        if which == ServiceImpl::Ours {
            shmtrace_tests::scenario::inspect_passes(&dir.path().join("trace.pftrace"));
        }
    }
}
