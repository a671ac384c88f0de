//! `shmtrace record` against a scripted ConsumerPort service: the
//! protocol it speaks (call order, config, descriptor passing), the bytes it
//! writes, Ctrl-C, and every kind of bad input.

mod cli_common;

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use cli_common::fake::{self, FakeService, Script};
use cli_common::*;
use prost::Message;
use shmtrace_service::protos::{self, DataSourceConfig, TraceConfig, TrackEventConfig};

fn producer() -> Vec<(String, String)> {
    vec![("real-producer".into(), "track_event".into())]
}

fn golden_script() -> Script {
    Script {
        packets: golden_packets(),
        registered: producer(),
        started: producer(),
        ..Default::default()
    }
}

fn spawn_record(socket: &Path, args: &[&str]) -> Child {
    shmtrace()
        .arg("record")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shmtrace record")
}

fn interrupt(child: &Child) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `calls` holds `expected` in this order (other calls may come between).
fn assert_in_order(calls: &[String], expected: &[&str]) {
    let mut it = calls.iter();
    for want in expected {
        assert!(
            it.any(|c| c == want),
            "{want} missing or out of order in {calls:?}"
        );
    }
}

fn received_config(fake: &FakeService) -> TraceConfig {
    let bytes = fake.seen.lock().unwrap().config.clone().expect("a config");
    TraceConfig::decode(bytes.as_slice()).unwrap()
}

fn finish(child: Child) -> Output {
    child.wait_with_output().expect("wait for shmtrace record")
}

/// The golden script, with the session ended by the service after `ms`.
fn ending_after(ms: u64) -> Script {
    Script {
        end_after: Some(Duration::from_millis(ms)),
        ..golden_script()
    }
}

/// A scripted service in a private directory, and where to record.
struct Bench {
    fake: FakeService,
    out_path: PathBuf,
    dir: TempDir,
}

impl Bench {
    fn start(name: &str, script: Script) -> Self {
        let dir = TempDir::new(name);
        let fake = FakeService::start(&dir.path("c.sock"), script);
        let out_path = dir.path("out.pftrace");
        Bench {
            fake,
            out_path,
            dir,
        }
    }

    /// `shmtrace record -o OUT args...`, started.
    fn spawn(&self, args: &[&str]) -> Child {
        let mut all = vec!["-o", self.out_path.to_str().unwrap()];
        all.extend_from_slice(args);
        spawn_record(&self.fake.socket, &all)
    }

    /// `shmtrace record -o OUT args...` to its end: asserts the exit
    /// status, returns stderr.
    fn record(&self, args: &[&str], status: i32) -> String {
        expect_status(finish(self.spawn(args)), status)
    }

    /// Ctrl-C once the session is enabled; asserts the exit status,
    /// returns stderr.
    fn record_until_ctrl_c(&self, args: &[&str], status: i32) -> String {
        let child = self.spawn(args);
        self.fake.wait_for("EnableTracing");
        interrupt(&child);
        expect_status(finish(child), status)
    }

    /// The output file holds the golden trace, byte for byte.
    fn assert_golden_written(&self) {
        assert_eq!(
            std::fs::read(&self.out_path).unwrap(),
            std::fs::read(GOLDEN).unwrap()
        );
    }
}

/// Asserts the exit status of `out`; returns its stderr.
fn expect_status(out: Output, status: i32) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "{stderr}");
    stderr
}

#[test]
fn ctrl_c_flushes_stops_reads_and_writes_the_trace_byte_for_byte() {
    let bench = Bench::start("ctrlc", golden_script());
    let fake = &bench.fake;
    let child = bench.spawn(&[
        "-b",
        "1mb",
        "--app-categories",
        "gfx,net",
        "--progress",
        "plain",
    ]);
    fake.wait_for("EnableTracing");
    std::thread::sleep(Duration::from_millis(300));
    interrupt(&child);
    let stderr = expect_status(finish(child), 0);

    // Each packet came in three slices; the file is `0A len packet` each,
    // exactly as the real Perfetto wrote the golden trace.
    bench.assert_golden_written();
    assert_in_order(
        &fake.calls(),
        &[
            "ObserveEvents",
            "EnableTracing",
            "Flush",
            "DisableTracing",
            "ReadBuffers",
            "FreeBuffers",
        ],
    );
    assert!(!fake.seen.lock().unwrap().got_fd);

    let config = received_config(fake);
    assert_eq!(config.buffers[0].size_kb, Some(1024));
    assert_eq!(config.duration_ms, None);
    let ds: DataSourceConfig = protos::from_raw(config.data_sources[0].config.as_ref()).unwrap();
    assert_eq!(ds.name.as_deref(), Some("track_event"));
    let te: TrackEventConfig = protos::from_raw(ds.track_event_config.as_ref()).unwrap();
    assert_eq!(te.disabled_categories, ["*"]);
    assert_eq!(te.enabled_categories, ["gfx", "net"]);

    assert_contains_all(
        &stderr,
        &[
            "stopping: flushing the producers' data (at most 5.0 s; Ctrl-C again aborts \
             without a trace)",
            "stopped on request (flushed)",
            "228 packets",
            "track events  202 on 3 sequence(s)",
            "track_event: recorded from real-producer",
            "data loss     none",
            "https://ui.perfetto.dev",
        ],
    );
}

#[test]
fn session_ended_by_the_service() {
    let bench = Bench::start("duration", ending_after(400));
    let stderr = bench.record(&["-t", "400ms", "--fill", "discard"], 0);
    assert!(
        stderr.contains("ended by the service after the configured 400 ms"),
        "{stderr}"
    );
    // Where the trace goes, once the service took the session.
    let recording = stderr.find("recording into").expect("recording into");
    assert!(
        stderr[recording..].contains("tracing for 400 ms; press Ctrl-C to stop"),
        "{stderr}"
    );
    let calls = bench.fake.calls();
    assert!(
        !calls.iter().any(|c| c == "Flush" || c == "DisableTracing"),
        "{calls:?}"
    );
    assert_in_order(&calls, &["EnableTracing", "ReadBuffers", "FreeBuffers"]);
    let config = received_config(&bench.fake);
    assert_eq!(config.duration_ms, Some(400));
    assert_eq!(config.buffers[0].size_kb, Some(32 * 1024), "the default -b");
    assert_eq!(
        config.buffers[0].fill_policy,
        Some(protos::trace_config::buffer_config::FillPolicy::Discard as i32)
    );
    bench.assert_golden_written();
}

#[test]
fn write_into_file_passes_the_descriptor_and_never_reads() {
    let bench = Bench::start("wif", golden_script());
    // A stale, longer file must not leave bytes behind.
    std::fs::write(&bench.out_path, vec![0u8; 20_000]).unwrap();
    let stderr = bench.record_until_ctrl_c(&["--write-into-file"], 0);
    let fake = &bench.fake;
    assert!(fake.seen.lock().unwrap().got_fd);
    assert!(!fake.calls().iter().any(|c| c == "ReadBuffers"));
    assert_eq!(received_config(fake).write_into_file, Some(true));
    bench.assert_golden_written();
    assert!(stderr.contains("228 packets"), "{stderr}");
}

#[test]
fn text_config_is_sent_as_written() {
    let bench = Bench::start("txt", ending_after(200));
    let config_path = bench.dir.path("config.pbtxt");
    std::fs::write(
        &config_path,
        r#"
# As Perfetto users write it.
buffers: {
    size_kb: 2048
    fill_policy: RING_BUFFER
}
buffers { size_kb: 512 fill_policy: DISCARD }
data_sources: {
    config {
        name: "track_event"
        target_buffer: 1
        track_event_config {
            disabled_categories: "*"
            enabled_categories: ["rendering", "net.*"]
        }
    }
    producer_name_filter: "my-app"
}
duration_ms: 10000
flush_period_ms: 2000
incremental_state_config { clear_period_ms: 500 }
"#,
    )
    .unwrap();
    bench.record(&["--txt", "-c", config_path.to_str().unwrap()], 0);
    let config = received_config(&bench.fake);
    assert_eq!(config.buffers.len(), 2);
    assert_eq!(config.buffers[1].size_kb, Some(512));
    assert_eq!(config.duration_ms, Some(10_000));
    assert_eq!(config.flush_period_ms, Some(2000));
    assert_eq!(
        config.incremental_state_config.unwrap().clear_period_ms,
        Some(500)
    );
    assert_eq!(config.data_sources[0].producer_name_filter, ["my-app"]);
    let ds: DataSourceConfig = protos::from_raw(config.data_sources[0].config.as_ref()).unwrap();
    assert_eq!(ds.target_buffer, Some(1));
    let te: TrackEventConfig = protos::from_raw(ds.track_event_config.as_ref()).unwrap();
    assert_eq!(te.enabled_categories, ["rendering", "net.*"]);
}

#[test]
fn data_source_nobody_registered() {
    let script = Script {
        end_after: Some(Duration::from_millis(300)),
        registered: vec![("other".into(), "linux.ftrace".into())],
        ..Default::default()
    };
    let bench = Bench::start("unregistered", script);
    let stderr = bench.record(&[], 0);
    assert_contains_all(
        &stderr,
        &[
            "warning: no producer has registered the data source \"track_event\"",
            "track_event: no producer registered it; nothing was recorded from it",
        ],
    );
    assert_in_order(
        &bench.fake.calls(),
        &["EnableTracing", "ReadBuffers", "FreeBuffers"],
    );
    assert!(
        bench.out_path.exists(),
        "the (empty) trace is still written"
    );
}

#[test]
fn unreachable_service() {
    let dir = TempDir::new("nosvc");
    let out_path = dir.path("out.pftrace");
    let out = finish(spawn_record(
        &dir.path("nobody.sock"),
        &["-o", out_path.to_str().unwrap()],
    ));
    let stderr = expect_status(out, 3);
    assert_contains_all(
        &stderr,
        &[
            "cannot connect to the tracing service at",
            "nobody.sock",
            "PERFETTO_CONSUMER_SOCK_NAME",
        ],
    );
    assert!(!out_path.exists(), "no empty file left behind");

    // The same through the environment variable, as Perfetto's tools read it.
    let out = shmtrace()
        .args(["record", "-o", out_path.to_str().unwrap()])
        .env("PERFETTO_CONSUMER_SOCK_NAME", dir.path("env.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out.stderr).contains("env.sock"));
}

#[test]
fn unwritable_output_fails_before_tracing() {
    let bench = Bench::start("unwritable", golden_script());
    let out = finish(spawn_record(
        &bench.fake.socket,
        &[
            "-o",
            bench.dir.path("no/such/dir/out.pftrace").to_str().unwrap(),
        ],
    ));
    let stderr = expect_status(out, 4);
    assert_contains_all(&stderr, &["cannot create", "no/such/dir/out.pftrace"]);
    assert_eq!(bench.fake.seen.lock().unwrap().connections, 0);
}

#[test]
fn existing_file_survives_a_failure_before_tracing() {
    let dir = TempDir::new("keep");
    let out_path = dir.path("precious.pftrace");
    std::fs::write(&out_path, b"old trace").unwrap();
    let out = finish(spawn_record(
        &dir.path("nobody.sock"),
        &["-o", out_path.to_str().unwrap()],
    ));
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(std::fs::read(&out_path).unwrap(), b"old trace");
}

#[test]
fn refused_session() {
    let script = Script {
        refuse: Some("Too many concurrent tracing sesions (5)".into()),
        ..golden_script()
    };
    let bench = Bench::start("refused", script);
    let stderr = bench.record(&[], 5);
    assert_contains_all(
        &stderr,
        &["the service refused the session: Too many concurrent tracing sesions (5)"],
    );
    // Refused before "recording into" and "tracing" are printed.
    assert!(!stderr.contains("recording into"), "{stderr}");
    assert!(!stderr.contains("press Ctrl-C"), "{stderr}");
    assert!(!bench.out_path.exists());
}

#[test]
fn dash_o_dash_writes_the_trace_to_standard_output() {
    let bench = Bench::start("stdout", ending_after(200));
    let child = spawn_record(&bench.fake.socket, &["-o", "-", "--progress", "plain"]);
    let out = finish(child);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(out.stdout, std::fs::read(GOLDEN).unwrap());
    // What standard output holds cannot be read back: the summary does not
    // claim 0 track events.
    assert_contains_all(
        &stderr,
        &[
            "recording into standard output (config: the command line)",
            "Wrote standard output: ",
            "228 packets",
            "track events  not counted: the trace went to standard output",
        ],
    );
    assert!(!stderr.contains("track events  0"), "{stderr}");
    assert!(!bench.dir.path("-").exists());
}

#[test]
fn perfetto_habits_get_a_hint_before_connecting() {
    let bench = Bench::start("habits", golden_script());
    let cases: &[(&[&str], &str)] = &[
        (
            &["sched", "gfx"],
            "categories are not positional here; record track_event categories with \
             --app-categories sched,gfx",
        ),
        (&["--query"], "`shmtrace query` lists"),
        (&["--trigger", "t1"], "`shmtrace trigger t1` activates"),
        (
            &["-b", "5gb"],
            "size_kb 5242880 is over the limit: a buffer holds less than 4 GiB (size_kb at \
             most 4194303)",
        ),
    ];
    for (args, expected) in cases {
        let stderr = bench.record(args, 2);
        assert_contains_all(&stderr, &[expected]);
        assert!(!stderr.contains("tip: a similar argument"), "{stderr}");
    }
    assert_eq!(bench.fake.seen.lock().unwrap().connections, 0);
    assert!(!bench.out_path.exists());
}

/// Flags that only mean something beside another (`--txt` with `-c`,
/// `--stop` with `--attach`) are refused without it, with the quick flags
/// too (clap's `requires` alone let `--txt -t 1s` through).
#[test]
fn flags_without_the_flag_they_qualify_are_refused() {
    let bench = Bench::start("qualify", ending_after(200));
    let cases: &[(&[&str], &str)] = &[
        (
            &["--txt", "-t", "1s"],
            "--txt says the config file (-c FILE) is in text format",
        ),
        (
            &["--stop", "-t", "1s"],
            "--stop stops the session taken back with --attach KEY",
        ),
        (&["--txt"], "--config <FILE>"),
        (&["--stop"], "--attach <KEY>"),
    ];
    for (args, expected) in cases {
        assert_contains_all(&bench.record(args, 2), &[expected]);
    }
    assert_eq!(bench.fake.seen.lock().unwrap().connections, 0);
}

#[test]
fn bad_configs_are_rejected_before_connecting() {
    let bench = Bench::start("badcfg", golden_script());
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "buffers {\n  size_kb: 1024\n}\ndata_sources {\n  config {\n    name: \"track_event\"\n    track_event_config { enabled_categoris: \"a\" }\n  }\n}\n",
            &["--txt"],
            "config.txt:7:26: ",
        ),
        ("buffers { size_kb: 1024 }\n", &["--txt"], "no data_sources"),
        (
            "buffers { size_kb: 1024 }\ndata_sources { config { name: \"x\" target_buffer: 3 } }\n",
            &["--txt"],
            "target_buffer is 3, but the config declares 1 buffer(s)",
        ),
        ("buffers { size_kb: 1024 }\n", &[], "add --txt"),
    ];
    let path = bench.dir.path("config.txt");
    for (config, flags, expected) in cases {
        std::fs::write(&path, config).unwrap();
        let mut args = vec!["-c", path.to_str().unwrap()];
        args.extend_from_slice(flags);
        assert_contains_all(&bench.record(&args, 2), &[expected]);
    }
    // Quick flags and a config do not mix; units are checked.
    for args in [
        &["-c", "x", "-t", "10s"][..],
        &["-t", "10 parsecs"],
        &["-b", "0"],
    ] {
        bench.record(args, 2);
    }
    assert_eq!(bench.fake.seen.lock().unwrap().connections, 0);
}

#[test]
fn failed_flush_is_reported_and_the_data_kept() {
    let script = Script {
        fail_flush: true,
        ..golden_script()
    };
    let bench = Bench::start("flushfail", script);
    let stderr = bench.record_until_ctrl_c(&[], 0);
    assert!(stderr.contains("the flush did not complete"), "{stderr}");
    bench.assert_golden_written();
}

#[test]
fn json_progress_for_programs() {
    let bench = Bench::start("json", ending_after(1500));
    let out = finish(bench.spawn(&["--progress", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let events: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_in_order(
        &names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        &[
            "connected",
            "tracing",
            "data_source_started",
            "started",
            "progress",
            "done",
        ],
    );
    let progress = events.iter().find(|e| e["event"] == "progress").unwrap();
    assert_eq!(progress["producers"], 1);
    assert_eq!(progress["data_sources"], 1);
    let done = events.last().unwrap();
    assert_eq!(done["event"], "done");
    assert_eq!(done["summary"]["packets"], 228);
    assert_eq!(done["summary"]["track_events"], 202);
    assert_eq!(
        done["summary"]["data_sources"][0]["producers"][0],
        "real-producer"
    );
}

#[test]
fn started_data_source_that_recorded_nothing_is_called_out() {
    let script = Script {
        packets: vec![],
        ..ending_after(300)
    };
    let bench = Bench::start("empty", script);
    let stderr = bench.record(&[], 0);
    assert!(
        stderr.contains(
            "track_event: started on real-producer, but no track events were recorded \
             (it enables gfx, net of the categories its producers registered: did they emit \
             events in them?)"
        ),
        "{stderr}"
    );
    // A mistyped category: the summary names the registered ones, none of
    // which the session enables (by the SDK's matching: `n*` matches
    // net).
    for (categories, expected) in [
        ("gxf", "only gxf"),
        ("gxf,ner", "only gxf, ner"),
        ("n*", "it enables net of the categories"),
    ] {
        let stderr = bench.record(&["--app-categories", categories], 0);
        let expected = if expected.starts_with("only") {
            format!(
                "track_event: started on real-producer, but no track events were recorded \
                 (it enables none of the categories its producers registered (gfx, net), \
                 {expected})"
            )
        } else {
            expected.to_owned()
        };
        assert!(stderr.contains(&expected), "{categories}: {stderr}");
    }
}

/// The summary counts what a ring buffer's wrap left unresolvable, with
/// the cause, as `inspect` does.
#[test]
fn summary_names_packets_a_ring_wrap_left_unresolvable() {
    let mut trace = EditTrace::golden();
    let first = trace.sequence(3)[0];
    trace.remove(first);
    trace.set_buffer_stat("write_wrap_count", 2);
    trace.set_buffer_stat("chunks_overwritten", 1);
    let script = Script {
        packets: trace.packets.iter().map(Message::encode_to_vec).collect(),
        ..ending_after(200)
    };
    let stderr = Bench::start("wrapsummary", script).record(&[], 0);
    assert_contains_all(
        &stderr,
        &[
            "1 sequence(s) lost their first packets",
            "packet(s) unresolvable after ring wrap: the ring buffer overwrote the \
             incremental-state clear they need",
            "chunks_overwritten = 1",
        ],
    );
}

/// A CLONE_SNAPSHOT config whose triggers are the scripted service's.
const CLONE_SNAPSHOT_CONFIG: &str = "buffers { size_kb: 1024 }
data_sources { config { name: \"track_event\" } }
trigger_config {
  trigger_mode: CLONE_SNAPSHOT
  trigger_timeout_ms: 60000
  triggers { name: \"snap0\" }
  triggers { name: \"snap1\" }
}
";

impl Bench {
    /// `shmtrace record --progress PROGRESS` of [`CLONE_SNAPSHOT_CONFIG`]
    /// (written into the bench's directory), started.
    fn spawn_clone_snapshot_session(&self, progress: &str) -> Child {
        let config = self.dir.path("snapshots.txtpb");
        std::fs::write(&config, CLONE_SNAPSHOT_CONFIG).unwrap();
        self.spawn(&[
            "--progress",
            progress,
            "--txt",
            "-c",
            config.to_str().unwrap(),
        ])
    }

    /// Snapshot `n` of the session (`OUT.n`).
    fn snapshot(&self, n: u32) -> String {
        format!("{}.{n}", self.out_path.display())
    }

    /// Waits until `method` was called `times` times (up to 20 s).
    fn wait_for_calls(&self, method: &str, times: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let calls = self.fake.calls();
            if calls.iter().filter(|c| *c == method).count() >= times {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{method} not {times} times in {calls:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The `done` event's summary among `record --progress json`'s events.
fn done_summary(stdout: &[u8]) -> serde_json::Value {
    text(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["event"] == "done")
        .expect("a done event")["summary"]
        .clone()
}

/// A CLONE_SNAPSHOT trigger's snapshot is taken beside the session's
/// loop, as perfetto_cmd takes it on a thread of its own: Ctrl-C while a
/// slow clone (3 s) is in progress stops the session at once (its
/// DisableTracing comes before the clone is answered); the snapshot in
/// progress is still finished and written; the one asked for after it,
/// not begun when the session stopped, keeps its number and is reported
/// as not taken, in the summary too.
#[test]
fn ctrl_c_stops_the_session_while_a_slow_snapshot_is_taken() {
    let script = Script {
        clone_triggers: vec![Duration::ZERO, Duration::ZERO],
        clone_delay: Duration::from_secs(3),
        ..golden_script()
    };
    let bench = Bench::start("slowclone", script);
    let child = bench.spawn_clone_snapshot_session("json");
    bench.fake.wait_for("CloneSession");
    interrupt(&child);
    let out = finish(child);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let calls = bench.fake.calls();
    let at = |name: &str| {
        calls
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("no {name} in {calls:?}"))
    };
    assert!(
        at("DisableTracing") < at(fake::CLONE_ANSWERED),
        "the stop waited for the snapshot: {calls:?}"
    );
    assert_eq!(
        calls.iter().filter(|c| *c == "CloneSession").count(),
        1,
        "{calls:?}"
    );
    {
        let seen = bench.fake.seen.lock().unwrap();
        let request = &seen.clones[0];
        assert_eq!(
            request.selector,
            Some(protos::clone_session_request::Selector::SessionId(
                fake::SESSION_ID
            ))
        );
        assert_eq!(request.clone_trigger_name.as_deref(), Some("snap0"));
        assert_eq!(
            request.clone_trigger_producer_name.as_deref(),
            Some("fake-producer")
        );
        assert_eq!(request.clone_trigger_boot_time_ns, Some(123));
    }
    let (snap0, snap1) = (bench.snapshot(0), bench.snapshot(1));
    assert!(Path::new(&snap0).exists(), "{stderr}");
    assert!(!Path::new(&snap1).exists(), "{stderr}");
    let not_taken = "not taken: the session had ended before its turn came";
    assert_contains_all(
        &stderr,
        &[
            &format!("snapshots     {snap0} (a CLONE_SNAPSHOT trigger's)"),
            &format!("no snapshot   {snap1} (the CLONE_SNAPSHOT trigger \"snap1\"'s): {not_taken}"),
        ],
    );
    let summary = done_summary(&out.stdout);
    assert_eq!(summary["snapshots"], serde_json::json!([snap0]));
    assert_eq!(
        summary["failed_snapshots"],
        serde_json::json!([{"path": snap1, "trigger": "snap1", "error": not_taken}])
    );
    // The session's own trace is read as ever.
    bench.assert_golden_written();
}

/// A snapshot the service refuses keeps its number: the next trigger's
/// goes into `OUT.1`, and the summary names both.
#[test]
fn a_refused_snapshot_keeps_its_number_and_is_in_the_summary() {
    let script = Script {
        clone_triggers: vec![Duration::ZERO, Duration::from_millis(500)],
        clone_errors: vec!["no room for a clone".into()],
        ..golden_script()
    };
    let bench = Bench::start("refusedclone", script);
    let child = bench.spawn_clone_snapshot_session("none");
    bench.wait_for_calls(fake::CLONE_ANSWERED, 2);
    // The second snapshot is read and written after its answer.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !bench.fake.calls().iter().any(|c| c == "FreeBuffers") {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            bench.fake.calls()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    interrupt(&child);
    let stderr = expect_status(finish(child), 0);
    let (snap0, snap1) = (bench.snapshot(0), bench.snapshot(1));
    assert!(!Path::new(&snap0).exists(), "{stderr}");
    assert!(Path::new(&snap1).exists(), "{stderr}");
    assert_contains_all(
        &stderr,
        &[
            &format!(
                "the CLONE_SNAPSHOT trigger \"snap0\" fired, and no snapshot went into {snap0}: \
                 the service refused: no room for a clone"
            ),
            &format!("snapshots     {snap1} (a CLONE_SNAPSHOT trigger's)"),
            &format!(
                "no snapshot   {snap0} (the CLONE_SNAPSHOT trigger \"snap0\"'s): the service \
                 refused: no room for a clone"
            ),
        ],
    );
}

/// `--clone-for-bugreport` asks for a bugreport clone as perfetto_cmd
/// does: `CloneSessionRequest.for_bugreport` and `skip_trace_filter` both
/// set; a plain `--clone` sets neither. Without --clone or
/// --clone-by-name it is refused before connecting.
#[test]
fn clone_for_bugreport_sets_the_request_s_bugreport_fields() {
    use protos::clone_session_request::Selector;
    let bench = Bench::start("bugreport", golden_script());
    bench.record(
        &[
            "--progress",
            "none",
            "--clone",
            "7",
            "--clone-for-bugreport",
        ],
        0,
    );
    bench.record(&["--progress", "none", "--clone-by-name", "flight"], 0);
    {
        let seen = bench.fake.seen.lock().unwrap();
        let asked: Vec<_> = seen
            .clones
            .iter()
            .map(|c| (c.selector.clone(), c.for_bugreport, c.skip_trace_filter))
            .collect();
        assert_eq!(
            asked,
            [
                (Some(Selector::SessionId(7)), Some(true), Some(true)),
                (
                    Some(Selector::UniqueSessionName("flight".into())),
                    None,
                    None
                ),
            ]
        );
    }
    let stderr = bench.record(&["--clone-for-bugreport", "-t", "1s"], 2);
    assert!(
        stderr.contains("--clone-for-bugreport qualifies a snapshot taken with --clone ID"),
        "{stderr}"
    );
    assert_eq!(bench.fake.seen.lock().unwrap().connections, 2);
}

/// `--clone -o FILE` where FILE is one the service holds open (the file a
/// `write_into_file` session writes; here the scripted service's process
/// holds it) is refused before anything is asked or truncated, and the
/// file is left as it was. A service that refuses such a clone itself (as
/// ours does, for the session's own file) gets the same error.
#[test]
fn a_clone_into_the_file_the_service_writes_is_refused_and_leaves_it_alone() {
    use shmtrace_service::service::core::CloneError;
    let script = Script {
        clone_errors: vec![CloneError::OutputIsSessionFile.to_string()],
        ..golden_script()
    };
    let bench = Bench::start("liveout", script);
    let live = bench.dir.path("live.pftrace");
    std::fs::copy(GOLDEN, &live).unwrap();
    let clone_into_live = || {
        expect_status(
            finish(spawn_record(
                &bench.fake.socket,
                &[
                    "--progress",
                    "none",
                    "--clone",
                    "7",
                    "-o",
                    live.to_str().unwrap(),
                ],
            )),
            2,
        )
    };
    let held = std::fs::File::open(&live).unwrap();
    let stderr = clone_into_live();
    let refused = format!(
        "{} is the file a running session writes its trace into",
        live.display()
    );
    assert_contains_all(
        &stderr,
        &[
            &refused,
            &format!(
                "(the tracing service, pid {}, has it open)",
                std::process::id()
            ),
            "so it was left alone; clone into another file (-o)",
        ],
    );
    assert!(
        !bench.fake.calls().iter().any(|c| c == "CloneSession"),
        "{:?}",
        bench.fake.calls()
    );
    assert_eq!(
        std::fs::read(&live).unwrap(),
        std::fs::read(GOLDEN).unwrap()
    );
    drop(held);
    let stderr = clone_into_live();
    assert_contains_all(
        &stderr,
        &[&refused, "(the service said so, and refused the clone)"],
    );
    assert_eq!(
        std::fs::read(&live).unwrap(),
        std::fs::read(GOLDEN).unwrap()
    );
}
