//! CloneSession against the real Perfetto service and against `shmtrace
//! serve`: a ring-buffer session named "flight" (recorded by `shmtrace
//! record --txt`) runs while a producer writes into it — our producer
//! library's `hello` example, or the real SDK's producer driver — and is
//! snapshotted twice while it runs: by `shmtrace record --clone-by-name`
//! and by the real Perfetto consumer client (`real-consumer --clone-id`,
//! ConsumerEndpoint::CloneSession, OnSessionCloned, ReadBuffers). Both
//! snapshots hold what the producer wrote and the clone's lifecycle events
//! and pass `inspect --check`; the session runs on and its final trace
//! holds everything too. A clone of a session that does not exist fails
//! with the same error on both services. The shared checker
//! (`checker/semantic_dump.py`, which needs the official protos:
//! `SHMTRACE_PYTHON`) reads the same in each snapshot as in the session's
//! own trace, and, for the real SDK's producer, the same in ours as in the
//! real service's. And a CLONE_SNAPSHOT session: each trigger makes
//! `record` write a snapshot (`OUT.0`, `OUT.1`) on either service. And
//! `transfer_on_clone`, `clear_before_clone`, `write_into_file` sessions
//! (cloned over an older, longer file, and refused into the session's own
//! live file, which is left whole), `--clone-for-bugreport`, and a clone
//! that takes a STOP_TRACING session's trigger, each alike on both
//! services.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use shmtrace_tests::checker::semantic_diff;
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{
    inspect_passes, producer_example, shmtrace_binary, start_service, ServiceImpl,
};

/// The session: a 4 MiB ring buffer of track events (every category),
/// found by its name.
const CONFIG: &str = "buffers { size_kb: 4096 fill_policy: RING_BUFFER }
data_sources {
  config {
    name: \"track_event\"
    track_event_config { enabled_categories: \"*\" }
  }
}
unique_session_name: \"flight\"
";

/// [`CONFIG`] with a trigger config of `mode`: trigger `name` with
/// `stop_delay_ms`, a 60 s trigger timeout.
fn with_trigger(mode: &str, name: &str, stop_delay_ms: u32) -> String {
    format!(
        "{CONFIG}trigger_config {{
  trigger_mode: {mode}
  trigger_timeout_ms: 60000
  triggers {{ name: \"{name}\" stop_delay_ms: {stop_delay_ms} }}
}}
"
    )
}

/// Who writes into the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Producer {
    /// Our library's `hello` example: 3 `DrawPlayer` slices and 3
    /// `PlayerDrawn` instants, then it exits.
    Ours,
    /// The real SDK (`real-producer --iterations 5`): 5 `outer` slices,
    /// then it waits for the session to stop.
    Real,
}

fn shmtrace() -> Command {
    Command::new(shmtrace_binary().expect("shmtrace binary"))
}

fn output(command: &mut Command) -> (Output, String) {
    let out = command.output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

/// The sessions `shmtrace query` lists: `(id, state)`.
fn sessions(consumer: &Path) -> Vec<(u64, String)> {
    let (out, stderr) = output(
        shmtrace()
            .args(["query", "--json", "--socket"])
            .arg(consumer),
    );
    assert!(out.status.success(), "{stderr}");
    let state: Value = serde_json::from_slice(&out.stdout).expect("json");
    state["sessions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    (
                        s["id"].as_u64().unwrap_or(0),
                        s["state"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Starts the producer `which` on `socket`; the real one is returned
/// running, once it has emitted its events.
fn run_producer(which: Producer, socket: &Path) -> Option<Child> {
    match which {
        Producer::Ours => {
            let hello = Command::new(producer_example("hello").expect("the hello example"))
                .env("PERFETTO_PRODUCER_SOCK_NAME", socket)
                .output()
                .expect("run hello");
            assert!(
                hello.status.success(),
                "hello: {}",
                String::from_utf8_lossy(&hello.stderr)
            );
            None
        }
        Producer::Real => {
            // The socket in the environment: the process's arguments are in
            // the trace, and must not differ between runs.
            let mut child = Command::new(real_binaries!().producer)
                .args(["--iterations", "5"])
                .env("PERFETTO_PRODUCER_SOCK_NAME", socket)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn real-producer");
            let stdout = child.stdout.take().expect("stdout");
            let mut lines = BufReader::new(stdout).lines();
            loop {
                let line = lines
                    .next()
                    .expect("real-producer reports its phase")
                    .expect("read real-producer");
                if line.contains("\"event\":\"phase\"") {
                    break;
                }
            }
            Some(child)
        }
    }
}

/// What one service did.
#[derive(Debug)]
struct Run {
    /// The directory holding the traces (kept until the comparison).
    _recording: Recording,
    /// The CLI's snapshot, the real consumer's snapshot, the session's own
    /// trace.
    traces: [PathBuf; 3],
    /// Track events by name: the CLI's snapshot, the real consumer's
    /// snapshot, the session's own trace.
    events: [Value; 3],
    /// Service events by name, same order.
    service_events: [Vec<String>; 3],
    /// Each trace's service events with their counts, in order, and its
    /// session's statistics (`inspect --json`).
    service_view: [(Value, Value); 3],
    /// The errors of clones of a session that does not exist: the CLI's
    /// stderr, the real consumer's `cloned` line.
    missing: (String, Value),
}

fn service_event_names(analysis: &Value) -> Vec<String> {
    analysis["session"]["service_events"]
        .as_array()
        .expect("service_events")
        .iter()
        .map(|e| e[0].as_str().unwrap_or("").to_owned())
        .collect()
}

/// The real consumer's `cloned` line, and how it exited.
fn real_clone(consumer: &Path, selector: [&str; 2], out: &Path) -> (Value, Option<i32>) {
    let run = Command::new(real_binaries!().consumer)
        .args(selector)
        .arg("--out")
        .arg(out)
        .arg("--socket")
        .arg(consumer)
        .stdin(Stdio::null())
        .output()
        .expect("run real-consumer");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let cloned = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "cloned")
        .unwrap_or_else(|| {
            panic!(
                "real-consumer said no \"cloned\": {stdout} {}",
                String::from_utf8_lossy(&run.stderr)
            )
        });
    (cloned, run.status.code())
}

/// `service`, started in a new directory on its sockets `p.sock`
/// (producers) and `c.sock` (consumers), with `shmtrace record` running a
/// session of a text config into `full.pftrace` there.
#[derive(Debug)]
struct Recording {
    service: ServiceImpl,
    dir: tempfile::TempDir,
    _process: ChildProcess,
    record: Child,
}

impl Recording {
    /// Starts `service` and `record` with `config` (`--progress` as
    /// `progress`: with `json` its events are on its stdout); returns once
    /// the session is listed.
    fn start(service: ServiceImpl, config: &str, progress: &str) -> Self {
        Self::start_with(service, config, progress, true)
    }

    /// [`Self::start`]; `$DIR` in `config` is the directory, and without
    /// `own_output` record gets no `-o` (the config's `output_path` names
    /// the file, which the service creates).
    fn start_with(service: ServiceImpl, config: &str, progress: &str, own_output: bool) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config.replace("$DIR", &dir.path().display().to_string());
        let process = start_service(
            service,
            &real_binaries!(),
            dir.path(),
            &dir.path().join("p.sock"),
            &dir.path().join("c.sock"),
        )
        .expect("service starts");
        std::fs::write(dir.path().join("config.txtpb"), config).expect("write config");
        let mut record = shmtrace();
        record
            .args(["record", "--progress", progress, "--txt", "-c"])
            .arg(dir.path().join("config.txtpb"));
        if own_output {
            record.arg("-o").arg(dir.path().join("full.pftrace"));
        }
        let record = record
            .arg("--socket")
            .arg(dir.path().join("c.sock"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn shmtrace record");
        let recording = Recording {
            service,
            dir,
            _process: process,
            record,
        };
        let started = Instant::now();
        while sessions(&recording.consumer()).is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{service:?}: the session did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        recording
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn producer(&self) -> PathBuf {
        self.path("p.sock")
    }

    fn consumer(&self) -> PathBuf {
        self.path("c.sock")
    }

    /// `shmtrace record --clone-by-name flight -o out`, which must succeed;
    /// what it printed on stderr.
    fn clone_into(&self, out: &Path) -> String {
        self.clone_with(out, &[], 0)
    }

    /// `shmtrace record --clone-by-name flight -o out` with `extra`
    /// arguments, which must exit with `status`; what it printed on
    /// stderr.
    fn clone_with(&self, out: &Path, extra: &[&str], status: i32) -> String {
        let (run, stderr) = output(
            shmtrace()
                .args([
                    "record",
                    "--progress",
                    "none",
                    "--clone-by-name",
                    "flight",
                    "-o",
                ])
                .arg(out)
                .args(extra)
                .arg("--socket")
                .arg(self.consumer()),
        );
        assert_eq!(
            run.status.code(),
            Some(status),
            "{:?}: {stderr}",
            self.service
        );
        stderr
    }

    /// Activates trigger `name` with `shmtrace trigger`.
    fn trigger(&self, name: &str) {
        let (out, stderr) = output(
            shmtrace()
                .args(["trigger", name, "--socket"])
                .arg(self.producer()),
        );
        assert!(out.status.success(), "{:?}: {stderr}", self.service);
    }

    /// Stops the session as Ctrl-C does and waits for `record`, which must
    /// succeed; what it printed on stderr.
    fn stop(&mut self) -> String {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.record),
            rustix::process::Signal::INT,
        )
        .expect("SIGINT record");
        let mut stderr = String::new();
        if let Some(mut pipe) = self.record.stderr.take() {
            std::io::Read::read_to_string(&mut pipe, &mut stderr).expect("record's stderr");
        }
        let status = self.record.wait().expect("record ends");
        assert!(status.success(), "{:?}: {stderr}", self.service);
        stderr
    }
}

fn clone_flow(service: ServiceImpl, producer: Producer) -> Run {
    let mut rec = Recording::start(service, CONFIG, "none");
    let consumer = rec.consumer();
    let id = sessions(&consumer)[0].0;
    let running = run_producer(producer, &rec.producer());

    // The CLI's snapshot, by name.
    let snap_cli = rec.path("snap-cli.pftrace");
    let stderr = rec.clone_into(&snap_cli);
    assert!(
        stderr.contains("a snapshot of the running session, which runs on (flushed)"),
        "{service:?}: {stderr}"
    );
    // The real consumer's, by id.
    let snap_real = rec.path("snap-real.pftrace");
    let id_arg = id.to_string();
    let (cloned, code) = real_clone(&consumer, ["--clone-id", &id_arg], &snap_real);
    assert_eq!(code, Some(0), "{service:?}: {cloned}");
    assert_eq!(cloned["success"], true);
    assert_eq!(cloned["was_write_into_file"], false);
    // The clones are gone with their consumers; the session runs on.
    assert_eq!(sessions(&consumer), [(id, "STARTED".to_owned())]);

    // Clones of a session that does not exist.
    let none = rec.path("none.pftrace");
    let (out, cli_error) = output(
        shmtrace()
            .args(["record", "--progress", "none", "--clone", "999", "-o"])
            .arg(&none)
            .arg("--socket")
            .arg(&consumer),
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(!none.exists(), "no empty file left behind");
    let (missing, code) = real_clone(
        &consumer,
        ["--clone-name", "nope"],
        &rec.path("nope.pftrace"),
    );
    assert_eq!(code, Some(2));

    // Stop the session: its trace has everything.
    rec.stop();
    if let Some(mut child) = running {
        assert!(child.wait().expect("real-producer ends").success());
    }
    let traces = [snap_cli, snap_real, rec.path("full.pftrace")];
    let analyses = traces.clone().map(|t| inspect_passes(&t));
    // The producer wrote everything before the clones: a trace processor
    // reads the same in each snapshot as in the session's own trace.
    for snapshot in &traces[..2] {
        let diff = semantic_diff(snapshot, &traces[2]).expect("the checker runs");
        assert!(diff.is_none(), "{service:?}: {}", diff.unwrap_or_default());
    }
    Run {
        _recording: rec,
        traces,
        events: analyses
            .clone()
            .map(|a| a["track_events"]["by_name"].clone()),
        service_events: analyses.clone().map(|a| service_event_names(&a)),
        service_view: analyses.map(|a| {
            // The session's counters; those of producers come and go as
            // the producers' processes do.
            let stats: serde_json::Map<String, Value> = a["stats"]["service"]
                .as_object()
                .expect("statistics")
                .iter()
                .filter(|(k, _)| {
                    k.starts_with("flushes_")
                        || ["final_flush_outcome", "total_buffers", "tracing_sessions"]
                            .contains(&k.as_str())
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (a["session"]["service_events"].clone(), Value::Object(stats))
        }),
        missing: (cli_error, missing),
    }
}

fn both_services_clone(producer: Producer) {
    let real = clone_flow(ServiceImpl::Real, producer);
    let ours = clone_flow(ServiceImpl::Ours, producer);
    for run in [&real, &ours] {
        let expected = match producer {
            Producer::Ours => [("DrawPlayer", 3), ("PlayerDrawn", 3)],
            Producer::Real => [("outer", 5), ("inner", 5)],
        };
        for events in &run.events {
            for (name, count) in expected {
                assert_eq!(events[name], count, "{name}: {events}");
            }
        }
        for snapshot in &run.service_events[..2] {
            for kind in ["clone_started", "buffer_cloned", "tracing_disabled"] {
                assert!(snapshot.iter().any(|e| e == kind), "{kind}: {snapshot:?}");
            }
        }
        assert!(
            !run.service_events[2].iter().any(|e| e == "clone_started"),
            "{:?}",
            run.service_events[2]
        );
        assert!(
            run.missing
                .0
                .contains("could not clone the session 999: Tracing session not found"),
            "{}",
            run.missing.0
        );
        assert_eq!(run.missing.1["success"], false);
    }
    assert_eq!(ours.events, real.events, "the same track events");
    assert_eq!(
        ours.missing.1["error"], real.missing.1["error"],
        "the same error"
    );
    let kinds = |run: &Run, i: usize| -> Vec<String> {
        let mut k = run.service_events[i].clone();
        k.sort();
        k.dedup();
        k
    };
    for i in 0..3 {
        assert_eq!(
            kinds(&ours, i),
            kinds(&real, i),
            "service events of trace {i}"
        );
        // The real SDK's producer writes deterministically: what a trace
        // processor reads in the traces of either service is the same
        // (tests/checker/semantic_dump.py). (Our `hello` hands its startup
        // buffer over as timing decides, which may split its events over
        // two sequences on either service.)
        // The service's own packets say the same: lifecycle events (the
        // clone's flush, clone_started, buffer_cloned, tracing_disabled)
        // in the same order and numbers, and the same statistics (flushes,
        // final_flush_outcome, sessions, buffers).
        assert_eq!(ours.service_view[i], real.service_view[i], "trace {i}");
        if producer == Producer::Real {
            let diff = semantic_diff(&real.traces[i], &ours.traces[i]).expect("the checker runs");
            assert!(diff.is_none(), "trace {i}: {}", diff.unwrap_or_default());
        }
    }
}

#[test]
fn our_producer_s_session_clones_alike_on_either_service() {
    both_services_clone(Producer::Ours);
}

#[test]
fn a_real_sdk_producer_s_session_clones_alike_on_either_service() {
    both_services_clone(Producer::Real);
}

/// A CLONE_SNAPSHOT session: a trigger makes the service tell `record`,
/// which clones the session into `<out>.0` (as perfetto_cmd does); the
/// snapshot holds what the producer wrote, the trigger that asked for it
/// (`clone_snapshot_trigger`) and passes the check; the session runs on,
/// and its own file stays empty (it is read only through clones).
/// Its track events by name, packet kinds, and the triggers and service
/// events the snapshot records.
fn clone_snapshot_flow(service: ServiceImpl) -> (Value, Vec<String>, (Value, Value)) {
    let config = with_trigger("CLONE_SNAPSHOT", "snap", 0);
    let mut rec = Recording::start(service, &config, "json");
    let mut events = BufReader::new(rec.record.stdout.take().expect("stdout")).lines();
    let mut wait_for = |event: &str| loop {
        let line = events
            .next()
            .unwrap_or_else(|| panic!("{service:?}: record ended before {event:?}"))
            .expect("read record");
        let v: Value = serde_json::from_str(&line).expect("a JSON event");
        if v["event"] == event {
            break v;
        }
    };
    wait_for("tracing");
    run_producer(Producer::Ours, &rec.producer());
    rec.trigger("snap");
    let snap = wait_for("snapshot");
    assert_eq!(snap["trigger"], "snap");
    let snapshot = rec.path("full.pftrace.0");
    assert_eq!(snap["path"], snapshot.display().to_string());
    assert_eq!(sessions(&rec.consumer()).len(), 1, "the session runs on");
    // A second trigger: the next number.
    rec.trigger("snap");
    let second = wait_for("snapshot");
    assert_eq!(
        second["path"],
        rec.path("full.pftrace.1").display().to_string()
    );
    let stderr = rec.stop();
    assert!(
        stderr.contains("full.pftrace.0 (a CLONE_SNAPSHOT trigger's)")
            && stderr.contains("full.pftrace.1"),
        "{stderr}"
    );
    let full = std::fs::metadata(rec.path("full.pftrace")).expect("the session's file");
    assert_eq!(full.len(), 0, "{service:?}: read only through clones");
    let analysis = inspect_passes(&snapshot);
    let kinds: Vec<String> = analysis["packets_by_kind"]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    let said = (
        analysis["session"]["triggers"].clone(),
        analysis["session"]["service_events"].clone(),
    );
    (analysis["track_events"]["by_name"].clone(), kinds, said)
}

#[test]
fn a_clone_snapshot_trigger_makes_record_write_a_snapshot_on_either_service() {
    let real = clone_snapshot_flow(ServiceImpl::Real);
    let ours = clone_snapshot_flow(ServiceImpl::Ours);
    for (events, kinds, _) in [&real, &ours] {
        assert_eq!(events["DrawPlayer"], 3, "{events}");
        assert!(
            kinds.iter().any(|k| k == "clone_snapshot_trigger"),
            "{kinds:?}"
        );
    }
    assert_eq!(ours.0, real.0, "the same track events");
    // The same triggers ("snap" twice: as clone_snapshot_trigger and as
    // the trigger received) and lifecycle events.
    assert_eq!(real.2 .0, serde_json::json!(["snap", "snap"]));
    assert_eq!(ours.2, real.2);
}

/// A `write_into_file` session (its file written every 100 ms): the
/// service copies the file so far into the snapshot's, then writes what its
/// buffers still hold after it (`was_write_into_file`), on either service;
/// the snapshot starts with the session's file as it was and holds what
/// the producer wrote.
fn write_into_file_clone(service: ServiceImpl) -> Value {
    let config = format!("{CONFIG}write_into_file: true\nfile_write_period_ms: 100\n");
    let mut rec = Recording::start(service, &config, "none");
    run_producer(Producer::Ours, &rec.producer());
    // A periodic write has put something into the file.
    std::thread::sleep(Duration::from_millis(300));
    let before = std::fs::read(rec.path("full.pftrace")).expect("the session's file");
    assert!(!before.is_empty(), "{service:?}: written every 100 ms");
    // An older, longer file where the snapshot goes: the service writes
    // the snapshot from its start, and what is left past its end is cut.
    let snap = rec.path("snap.pftrace");
    std::fs::write(&snap, vec![0xEE; 4 << 20]).expect("an older file");
    let stderr = rec.clone_into(&snap);
    assert!(
        stderr.contains("the service wrote it (write_into_file)"),
        "{service:?}: {stderr}"
    );
    let bytes = std::fs::read(&snap).expect("the snapshot");
    assert!(
        bytes.len() < 4 << 20 && !bytes.ends_with(&[0xEE; 64]),
        "{service:?}: the older file's rest is gone ({} B)",
        bytes.len()
    );
    assert!(
        bytes.len() > before.len() && bytes.starts_with(&before[..before.len().min(64)]),
        "{service:?}: the session's file first"
    );
    rec.stop();
    inspect_passes(&snap)["track_events"]["by_name"].clone()
}

#[test]
fn a_write_into_file_session_clones_into_the_callers_file_on_either_service() {
    let real = write_into_file_clone(ServiceImpl::Real);
    let ours = write_into_file_clone(ServiceImpl::Ours);
    assert_eq!(real["DrawPlayer"], 3, "{real}");
    assert_eq!(ours, real);
}

/// A `write_into_file` session writing `live.pftrace` (its config's
/// `output_path`: the service created the file, and no record holds it):
/// `record --clone -o live.pftrace` is refused with an error that says so,
/// and the live file is left alone (it used to be emptied before the
/// clone); the session writes on into it, and its trace ends whole. A
/// clone into another file still works. What the live trace and the
/// snapshot hold, on `service`.
fn clone_into_the_live_file(service: ServiceImpl) -> (Value, Value) {
    let config = format!(
        "{CONFIG}write_into_file: true\nfile_write_period_ms: 100\noutput_path: \"$DIR/live.pftrace\"\n"
    );
    let mut rec = Recording::start_with(service, &config, "none", false);
    run_producer(Producer::Ours, &rec.producer());
    std::thread::sleep(Duration::from_millis(300));
    let live = rec.path("live.pftrace");
    let before = std::fs::read(&live).expect("the session's file");
    assert!(!before.is_empty(), "{service:?}: written every 100 ms");
    let stderr = rec.clone_with(&live, &[], 2);
    assert!(
        stderr.contains(&format!(
            "{} is the file a running session writes its trace into",
            live.display()
        )) && stderr.contains("clone into another file (-o)"),
        "{service:?}: {stderr}"
    );
    let after = std::fs::read(&live).expect("the session's file");
    assert!(
        after.starts_with(&before),
        "{service:?}: the live file was changed ({} B, then {} B)",
        before.len(),
        after.len()
    );
    let snap = rec.path("snap.pftrace");
    rec.clone_into(&snap);
    rec.stop();
    let full = std::fs::read(&live).expect("the session's trace");
    assert!(full.starts_with(&before), "{service:?}");
    (
        inspect_passes(&live)["track_events"]["by_name"].clone(),
        inspect_passes(&snap)["track_events"]["by_name"].clone(),
    )
}

#[test]
fn a_clone_into_the_live_file_is_refused_and_leaves_it_whole_on_either_service() {
    let real = clone_into_the_live_file(ServiceImpl::Real);
    let ours = clone_into_the_live_file(ServiceImpl::Ours);
    assert_eq!(real.0["DrawPlayer"], 3, "{}", real.0);
    assert_eq!(real.1["DrawPlayer"], 3, "{}", real.1);
    assert_eq!(ours, real);
}

/// `--clone-for-bugreport` (CloneSessionRequest `for_bugreport` and
/// `skip_trace_filter`, as perfetto_cmd sends them) is taken by either
/// service: the snapshot holds what the producer wrote, as a plain one.
fn bugreport_clone(service: ServiceImpl) -> Value {
    let mut rec = Recording::start(service, CONFIG, "none");
    run_producer(Producer::Ours, &rec.producer());
    let snap = rec.path("bugreport.pftrace");
    let stderr = rec.clone_with(&snap, &["--clone-for-bugreport"], 0);
    assert!(
        stderr.contains("a snapshot of the running session, which runs on (flushed)"),
        "{service:?}: {stderr}"
    );
    rec.stop();
    inspect_passes(&snap)["track_events"]["by_name"].clone()
}

#[test]
fn a_clone_for_bugreport_is_taken_on_either_service() {
    let real = bugreport_clone(ServiceImpl::Real);
    let ours = bugreport_clone(ServiceImpl::Ours);
    assert_eq!(real["DrawPlayer"], 3, "{real}");
    assert_eq!(ours, real);
}

/// A STOP_TRACING session whose trigger came is cloned before the trigger's
/// stop delay ends it: the clone takes the triggers received (its trace
/// records "go"), and the session, left with none, then reads as one that
/// is still waiting for its trigger. What its own trace holds, and the
/// snapshot's triggers, on `service`.
fn triggered_then_cloned(service: ServiceImpl) -> (u64, Value, Value) {
    let config = with_trigger("STOP_TRACING", "go", 1500);
    let mut rec = Recording::start(service, &config, "none");
    run_producer(Producer::Ours, &rec.producer());
    rec.trigger("go");
    let snap = rec.path("snap.pftrace");
    rec.clone_into(&snap);
    // The trigger's stop delay ends the session.
    rec.stop();
    let full = std::fs::metadata(rec.path("full.pftrace")).expect("the session's file");
    let analysis = inspect_passes(&snap);
    (
        full.len(),
        analysis["session"]["triggers"].clone(),
        analysis["track_events"]["by_name"].clone(),
    )
}

#[test]
fn a_clone_takes_the_triggers_received_on_either_service() {
    let real = triggered_then_cloned(ServiceImpl::Real);
    let ours = triggered_then_cloned(ServiceImpl::Ours);
    assert_eq!(real.1, serde_json::json!(["go"]));
    assert_eq!(real.2["DrawPlayer"], 3);
    assert_eq!(real.0, 0, "the session's own trace is empty");
    assert_eq!(ours, real);
}

/// The session's buffer set `option: true` (`transfer_on_clone` or
/// `clear_before_clone`); `hello` writes, then two snapshots are taken and
/// the session stops: the track events by name of the two snapshots and of
/// the session's own trace, on `service`.
fn buffer_option_flow(service: ServiceImpl, option: &str) -> [Value; 3] {
    let config = CONFIG.replace(
        "fill_policy: RING_BUFFER }",
        &format!("fill_policy: RING_BUFFER {option}: true }}"),
    );
    assert_ne!(config, CONFIG);
    let mut rec = Recording::start(service, &config, "none");
    run_producer(Producer::Ours, &rec.producer());
    let snaps = [rec.path("snap0.pftrace"), rec.path("snap1.pftrace")];
    for snap in &snaps {
        rec.clone_into(snap);
    }
    rec.stop();
    [&snaps[0], &snaps[1], &rec.path("full.pftrace")]
        .map(|t| inspect_passes(t)["track_events"]["by_name"].clone())
}

#[test]
fn transfer_on_clone_and_clear_before_clone_act_alike_on_either_service() {
    for option in ["transfer_on_clone", "clear_before_clone"] {
        let real = buffer_option_flow(ServiceImpl::Real, option);
        let ours = buffer_option_flow(ServiceImpl::Ours, option);
        // transfer_on_clone: the first snapshot takes the buffer away;
        // clear_before_clone: the buffer is emptied before each snapshot.
        let first = match option {
            "transfer_on_clone" => serde_json::json!({"DrawPlayer": 3, "PlayerDrawn": 3}),
            _ => serde_json::json!({}),
        };
        let empty = serde_json::json!({});
        assert_eq!(real, [first, empty.clone(), empty], "{option}");
        assert_eq!(ours, real, "{option}");
    }
}
