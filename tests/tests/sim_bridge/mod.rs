//! What the bridge tests share: a service (ours or the real one), the
//! simulated firmware (`sim-firmware`), `shmtrace bridge` with its JSON
//! summary, the real consumer, the checker with the firmware's exact
//! counts.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use shmtrace_tests::checker::{self, EventCounts, Expectation, Loss, ProducerExpectation};
use shmtrace_tests::config::{self, BufferConfig, DataSource, DataSourceConfig, FillPolicy};
use shmtrace_tests::process::{self, ChildProcess};
use shmtrace_tests::scenario::{self, ServiceImpl};
use shmtrace_tests::{real_binaries, scenario::RealBinaries};

/// The data source the simulated firmware names.
pub const DATA_SOURCE: &str = "sim.firmware";
/// How long any step may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// A test's directory, service and sockets.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub bins: RealBinaries,
    pub producer_socket: PathBuf,
    pub consumer_socket: PathBuf,
    pub service: Option<ChildProcess>,
}

impl Env {
    /// A directory, without a service yet.
    pub fn new(prefix: &str) -> Self {
        checker::ensure_environment().expect("the checker's python environment");
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/tmp")
            .expect("tempdir");
        let (producer_socket, consumer_socket) =
            (dir.path().join("p.sock"), dir.path().join("c.sock"));
        Env {
            dir,
            bins: real_binaries!(),
            producer_socket,
            consumer_socket,
            service: None,
        }
    }

    /// A directory with `service` running.
    pub fn with_service(prefix: &str, service: ServiceImpl) -> Self {
        let mut env = Self::new(prefix);
        env.service = Some(
            scenario::start_service(
                service,
                &env.bins,
                env.dir.path(),
                &env.producer_socket,
                &env.consumer_socket,
            )
            .expect("the service starts"),
        );
        env
    }

    /// `shmtrace serve` with `extra` flags (e.g. `--attach`).
    pub fn start_our_service(&mut self, extra: &[String]) {
        let mut command = Command::new(scenario::shmtrace_binary().expect("shmtrace"));
        command
            .args(["serve", "--notify-ready", "--log-level", "info"])
            .arg("--producer-socket")
            .arg(&self.producer_socket)
            .arg("--consumer-socket")
            .arg(&self.consumer_socket)
            .arg("--exit-on-stdin-eof")
            .args(extra);
        let mut service = ChildProcess::spawn("service", command, self.dir.path()).expect("spawn");
        service.expect_event("ready", TIMEOUT).expect("ready");
        self.service = Some(service);
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A FIFO named `name` in the directory, for a one-way stream.
    pub fn fifo(&self, name: &str) -> PathBuf {
        let fifo = self.path(name);
        process::make_fifo(&fifo).expect("mkfifo");
        fifo
    }

    /// The simulated firmware with `args`.
    pub fn firmware(&self, name: &str, args: &[String]) -> ChildProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sim-firmware"));
        command.args(args);
        ChildProcess::spawn(name, command, self.dir.path()).expect("spawn sim-firmware")
    }

    /// `shmtrace bridge --input INPUT --json --exit-on-stdin-eof` on this
    /// service, with `extra` flags.
    pub fn bridge(&self, input: &str, extra: &[&str]) -> ChildProcess {
        let mut command = Command::new(scenario::shmtrace_binary().expect("shmtrace"));
        command
            .args(["bridge", "--json", "--exit-on-stdin-eof", "--input", input])
            .arg("--socket")
            .arg(&self.producer_socket)
            .args(extra);
        ChildProcess::spawn("bridge", command, self.dir.path()).expect("spawn bridge")
    }

    /// Waits until the service lists the firmware's data source.
    pub fn wait_registered(&self) {
        scenario::query_until(&self.consumer_socket, "the firmware's data source", |s| {
            s["data_sources"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["name"] == DATA_SOURCE))
        });
    }

    /// The real consumer recording the firmware's data source into
    /// `trace.pftrace`; returns once its session started.
    pub fn start_consumer(&self) -> ChildProcess {
        self.start_consumer_named("trace")
    }

    /// The same into `NAME.pftrace` (a session of its own beside others).
    pub fn start_consumer_named(&self, name: &str) -> ChildProcess {
        let trace_config = config::TraceConfig {
            buffers: vec![BufferConfig {
                size_kb: Some(16 * 1024),
                fill_policy: Some(FillPolicy::Discard as i32),
            }],
            data_sources: vec![DataSource {
                config: Some(DataSourceConfig {
                    name: Some(DATA_SOURCE.into()),
                    target_buffer: Some(0),
                    track_event_config: None,
                    legacy_config: None,
                }),
            }],
            ..Default::default()
        };
        let config_file = self.path(&format!("{name}.config.pb"));
        std::fs::write(&config_file, config::encode(&trace_config)).expect("config");
        let mut command = Command::new(&self.bins.consumer);
        command
            .arg("--socket")
            .arg(&self.consumer_socket)
            .arg("--config")
            .arg(config_file)
            .arg("--out")
            .arg(self.path(&format!("{name}.pftrace")))
            .arg("--timeout-ms=120000");
        let mut consumer =
            ChildProcess::spawn("consumer", command, self.dir.path()).expect("spawn consumer");
        consumer.expect_event("started", TIMEOUT).expect("started");
        consumer
    }

    /// Stops the consumer's session and waits for the trace.
    pub fn stop_consumer(&self, consumer: ChildProcess) -> PathBuf {
        self.stop_consumer_named(consumer, "trace")
    }

    /// Stops the session of [`Env::start_consumer_named`]`(name)`.
    pub fn stop_consumer_named(&self, mut consumer: ChildProcess, name: &str) -> PathBuf {
        consumer.send_line("stop").expect("stop");
        consumer.expect_event("done", TIMEOUT).expect("the trace");
        self.path(&format!("{name}.pftrace"))
    }
}

/// Ends a bridge (its stdin closes) and returns its JSON summary.
pub fn bridge_summary(mut bridge: ChildProcess) -> Value {
    bridge.close_stdin();
    let summary = bridge.expect_event("summary", TIMEOUT).expect("summary");
    bridge.expect_success(TIMEOUT).expect("the bridge exits 0");
    summary
}

/// The emitted counts of a firmware's `done` report.
pub fn emitted(done: &Value) -> EventCounts {
    serde_json::from_value(done["emitted"].clone()).expect("emitted counts")
}

/// Runs the checker on `trace`, every producer together, with `loss`.
pub fn check(
    env: &Env,
    trace: &Path,
    emitted: EventCounts,
    loss: Loss,
    label: &str,
) -> checker::TraceReport {
    let expect = Expectation {
        producers: vec![ProducerExpectation { pid: None, emitted }],
        loss,
        require_trace_stats: true,
        require_service_packets: true,
        remote_producers: false,
    };
    checker::check(&[trace.to_path_buf()], &expect, env.dir.path(), label)
        .expect("the checker runs")
}

/// `shmtrace inspect --check` must pass.
pub fn inspect_passes(trace: &Path) -> Value {
    let verdict = scenario::inspect(&[trace.to_path_buf()]).expect("inspect runs");
    assert!(
        verdict.ok,
        "inspect --check failed: {}",
        verdict.analysis["problems"]
    );
    verdict.analysis
}

/// The trace of a simulated firmware that restarted `boots - 1` times
/// while the session recorded, two writers per boot: every event there
/// (the firmware flushes and sends everything before it restarts), each
/// boot on two sequences of its own, and each sequence of a boot that
/// ended mid-session with one loss mark (nothing the bridge sees tells a
/// clean restart from one that cut what the writers held: the bridge's
/// `restarts_mid_session`), the last boot's with none; `inspect --check`
/// passes and counts exactly those marks. Returns the checker's report.
pub fn check_restarted(
    env: &Env,
    trace: &Path,
    emitted: EventCounts,
    boots: usize,
    label: &str,
) -> checker::TraceReport {
    let report = check(env, trace, emitted, Loss::Allowed, label);
    report.assert_ok(label);
    assert_eq!(report.totals, emitted, "{label}: every event");
    let mut sequences: Vec<_> = report.track_event_sequences().collect();
    sequences.sort_by_key(|s| s.id);
    assert_eq!(
        sequences.len(),
        2 * boots,
        "{label}: two writers per boot: {sequences:?}"
    );
    let (ended, last) = sequences.split_at(2 * (boots - 1));
    assert!(
        ended.iter().all(|s| s.loss_marks == 1 && !s.start_lost),
        "{label}: the boots that ended: {ended:?}"
    );
    assert!(
        last.iter().all(|s| s.loss_marks == 0 && !s.start_lost),
        "{label}: the last boot: {last:?}"
    );
    let analysis = inspect_passes(trace);
    assert_eq!(
        analysis["loss"]["loss_marks"].as_u64(),
        Some(2 * (boots as u64 - 1)),
        "{label}: {}",
        analysis["loss"]
    );
    report
}

/// Records `sessions` short sessions one after the other, the firmware
/// writing on between them: each trace must pass `inspect --check` with
/// every interned name resolved and hold some of the firmware's slices.
pub fn sessions_pass_inspect(env: &Env, sessions: u32) {
    for session in 1..=sessions {
        std::thread::sleep(Duration::from_millis(300));
        let consumer = env.start_consumer();
        std::thread::sleep(Duration::from_millis(300));
        let trace = env.stop_consumer(consumer);
        let analysis = inspect_passes(&trace);
        let events = &analysis["track_events"];
        assert!(
            events["slice_begin"].as_u64() > Some(0),
            "session {session}: {events}"
        );
        assert_eq!(events["interned_unresolved"], 0, "session {session}");
    }
}

/// A named counter of a summary section.
pub fn counter(summary: &Value, section: &str, name: &str) -> u64 {
    summary[section][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no {section}.{name} in {summary}"))
}

/// Asserts the named counters of a summary section.
pub fn assert_counters(summary: &Value, section: &str, expected: &[(&str, u64)]) {
    for (name, want) in expected {
        assert_eq!(
            counter(summary, section, name),
            *want,
            "{section}.{name}: {summary}"
        );
    }
}

/// String arguments.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}
