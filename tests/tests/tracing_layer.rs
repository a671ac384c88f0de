//! shmtrace-producer's `tracing` layer and `log` logger, end to end: the
//! `tracing-program` binary (see its docs for the workload: nested spans,
//! fields of every type, events, a span recorded into, spans exited out of
//! order, `follows_from`, an instrumented task polled on three threads,
//! `log` records, a target the session disables, and wide events: packets
//! of more than 127 bytes) is recorded by the
//! stock Perfetto service (`real-service`) and by `shmtrace serve`, through
//! the real consumer, with `enabled_categories: ["*"]` and
//! `disabled_categories: ["noisy"]`.
//!
//! The checker must find exactly the events the workload makes (counts per
//! type and per annotation type, slices nested per track, the flow linked,
//! nothing lost) and `shmtrace inspect --check` must pass; then the decoded
//! events (`semantic_dump.py`) must show each thread's track with its
//! slices nested as the program nested its spans, each event and slice
//! with its category (the target), its `level` and its fields as typed
//! annotations, the task's life on a track of its own, and nothing of the
//! `noisy` target.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use shmtrace_tests::checker::{self, EventCounts, Expectation, Loss, ProducerExpectation};
use shmtrace_tests::config::{self, FillPolicy, TraceConfig, TrackEventConfig};
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, ServiceImpl};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The main thread's name (the program's file name, as the kernel keeps
/// it: at most 15 bytes).
const MAIN: &str = "tracing-program";

/// What the workload makes, by the checker's counts (see the program's
/// docs): slices `root`, `query`, `a`, `b`, five of `task` on thread
/// tracks (its four polls and its drop, which `Instrumented` runs inside
/// the span) and one on its own track; instants: the two events in
/// `root`, `follows_from`, two `log` records, three `step` events; one
/// flow id at each end of the `follows_from` flow. Every begin and instant
/// but `follows_from` has a `level` string (17). Then the three wide
/// events: instants with 3 uint, an int, a bool, a double and 5 string
/// fields, a message and a level each.
fn expected_counts() -> EventCounts {
    EventCounts {
        slice_begin: 10,
        slice_end: 10,
        instant: 8 + 3,
        flow_begin: 2,
        // int -5, code 42.
        arg_int: 2 + 3,
        // uint 7, pending 99 (on root's end), rows 3, id 1 (first poll and
        // the task's own track), step 0, 1, 2.
        arg_uint: 8 + 3 * 3,
        // flag, ok.
        arg_bool: 2 + 3,
        // ratio.
        arg_double: 1 + 3,
        // 17 levels, text, debug, table, the event's message, two log
        // messages; the wide events' levels, messages and 5 strings.
        arg_string: 23 + 3 * 7,
        ..Default::default()
    }
}

fn record(service: ServiceImpl) -> (tempfile::TempDir, std::path::PathBuf, u32) {
    checker::ensure_environment().expect("the checker's python environment");
    let bins = real_binaries!();
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-tracing-layer-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let path = |name: &str| dir.path().join(name);
    let (producer_socket, consumer_socket) = (path("p.sock"), path("c.sock"));
    let service_process = scenario::start_service(
        service,
        &bins,
        dir.path(),
        &producer_socket,
        &consumer_socket,
    )
    .expect("the service starts");

    let mut command = Command::new(env!("CARGO_BIN_EXE_tracing-program"));
    command.env("PERFETTO_PRODUCER_SOCK_NAME", &producer_socket);
    let mut program = ChildProcess::spawn("tracing-program", command, dir.path()).expect("spawn");
    scenario::query_until(&consumer_socket, "the track_event data source", |s| {
        s["data_sources"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["name"] == "track_event"))
    });

    let mut trace_config = TraceConfig::track_event(4096, FillPolicy::RingBuffer, &["*"]);
    for source in &mut trace_config.data_sources {
        if let Some(c) = &mut source.config {
            c.track_event_config = Some(TrackEventConfig {
                disabled_categories: vec!["noisy".into()],
                enabled_categories: vec!["*".into()],
            });
        }
    }
    std::fs::write(path("config.pb"), config::encode(&trace_config)).expect("write config");
    let mut consumer_command = Command::new(&bins.consumer);
    consumer_command
        .arg("--socket")
        .arg(&consumer_socket)
        .arg("--config")
        .arg(path("config.pb"))
        .arg("--out")
        .arg(path("trace.pftrace"))
        .arg("--timeout-ms=60000");
    let mut consumer =
        ChildProcess::spawn("consumer", consumer_command, dir.path()).expect("spawn consumer");
    consumer.expect_event("started", TIMEOUT).expect("started");
    program.expect_event("enabled", TIMEOUT).expect("enabled");
    program.expect_event("done", TIMEOUT).expect("done");
    consumer.send_line("stop").expect("stop");
    consumer.expect_event("done", TIMEOUT).expect("the trace");
    program
        .expect_success(TIMEOUT)
        .expect("the program exits once the session stopped");
    drop(service_process);
    let (trace, pid) = (path("trace.pftrace"), program.pid());
    (dir, trace, pid)
}

/// `[name, [type, value]]` annotations as a map.
fn args(event: &Value) -> BTreeMap<String, Value> {
    event["args"]
        .as_array()
        .map(|args| {
            args.iter()
                .map(|a| (a[0].as_str().unwrap().to_string(), a[1].clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The events on the track of the thread named `thread`, in order.
fn thread_events<'a>(events: &[&'a Value], thread: &str) -> Vec<&'a Value> {
    events
        .iter()
        .copied()
        .filter(|e| e["track"]["thread"]["name"] == thread)
        .collect()
}

/// A thread track's events as nested text: `name{...}` per slice, the
/// name per instant (`event` for a `tracing` event).
fn nesting(events: &[&Value]) -> String {
    let mut out = Vec::new();
    for e in events {
        let name = e["name"].as_str().unwrap_or("");
        let name = if name.starts_with("event ") {
            "event"
        } else {
            name
        };
        match e["type"].as_str() {
            Some("slice_begin") => out.push(format!("{name}{{")),
            Some("slice_end") => out.push("}".into()),
            _ => out.push(name.to_string()),
        }
    }
    out.join(" ")
}

fn string(s: &str) -> Value {
    json!(["string", s])
}

fn tracing_program_is_recorded(service: ServiceImpl) {
    let (dir, trace, pid) = record(service);
    let label = format!("tracing-layer-{service:?}");
    let emitted = expected_counts();
    let expect = Expectation {
        producers: vec![ProducerExpectation {
            pid: Some(pid),
            emitted,
        }],
        loss: Loss::None,
        require_trace_stats: true,
        require_service_packets: true,
        remote_producers: false,
    };
    let report = checker::check(std::slice::from_ref(&trace), &expect, dir.path(), &label)
        .expect("the checker runs");
    report.assert_ok(&label);
    let verdict = scenario::inspect(std::slice::from_ref(&trace)).expect("shmtrace inspect runs");
    assert!(verdict.ok, "shmtrace inspect --check: {}", verdict.analysis);

    let dump = checker::semantic_dump(&trace).expect("the semantic dump");
    let events: Vec<&Value> = dump["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["events"].as_array().unwrap())
        .collect();
    // Nothing of the disabled target.
    for e in &events {
        let text = e.to_string();
        assert!(
            !text.contains("noisy") && !text.contains("hidden") && !text.contains("filtered"),
            "{e}"
        );
    }

    // The main thread: the spans nested as the program nested them
    // (`b` ends before `a`, which was exited first), then the task's first
    // and last polls and its drop.
    let main = thread_events(&events, MAIN);
    assert_eq!(
        nesting(&main),
        "root{ query{ event } event follows_from a{ b{ } } log log } \
         task{ event } task{ } task{ } event event event",
        "{main:#?}"
    );
    // Categories are targets.
    let categories: Vec<&Value> = main.iter().map(|e| &e["categories"]).collect();
    let app = json!(["app"]);
    let db = json!(["app::db"]);
    let log = json!(["app::log"]);
    let none = Value::Null;
    assert_eq!(
        categories,
        [
            &app, &db, &db, &none, &app, &app, &app, &app, &none, &none, &log, &log, &none, &app,
            &app, &none, &app, &none, &app, &none, &app, &app, &app,
        ],
        "{main:#?}"
    );
    // Fields of every type, typed.
    let root = args(main[0]);
    assert_eq!(root["level"], string("INFO"));
    assert_eq!(root["int"], json!(["int", -5]));
    assert_eq!(root["uint"], json!(["uint", 7]));
    assert_eq!(root["flag"], json!(["bool", true]));
    assert_eq!(root["ratio"], json!(["double", 0.25]));
    assert_eq!(root["text"], string("hello"));
    assert_eq!(root["debug"], string("Some(3)"));
    assert!(!root.contains_key("pending"), "{root:?}");
    assert_eq!(
        args(main[1]),
        BTreeMap::from([
            ("level".into(), string("INFO")),
            ("table".into(), string("users"))
        ])
    );
    assert_eq!(
        args(main[2]),
        BTreeMap::from([
            ("level".into(), string("INFO")),
            ("message".into(), string("query done")),
            ("rows".into(), json!(["uint", 3])),
        ])
    );
    assert_eq!(
        args(main[4]),
        BTreeMap::from([
            ("level".into(), string("WARN")),
            ("code".into(), json!(["int", 42])),
            ("ok".into(), json!(["bool", false])),
        ])
    );
    // The log records.
    assert_eq!(
        args(main[10]),
        BTreeMap::from([
            ("level".into(), string("INFO")),
            ("message".into(), string("plain literal"))
        ])
    );
    assert_eq!(
        args(main[11]),
        BTreeMap::from([
            ("level".into(), string("WARN")),
            ("message".into(), string("formatted 5"))
        ])
    );
    // `pending`, recorded while root was entered, on root's end.
    assert_eq!(
        args(main[12]),
        BTreeMap::from([("pending".into(), json!(["uint", 99]))])
    );
    // The flow: from the instant inside root to the task's first slice.
    let flow = main[5]["flows"].clone();
    assert_eq!(flow.as_array().map(Vec::len), Some(1), "{:#?}", main[5]);
    assert_eq!(main[13]["flows"], flow, "{:#?}", main[13]);
    assert_eq!(
        args(main[13]),
        BTreeMap::from([
            ("level".into(), string("INFO")),
            ("id".into(), json!(["uint", 1]))
        ])
    );
    assert_eq!(args(main[14])["step"], json!(["uint", 0]));
    // Later polls carry only the level.
    assert_eq!(
        args(main[16]),
        BTreeMap::from([("level".into(), string("INFO"))])
    );

    // The wide events: the first written the general way (its names
    // interned), the second after the callsite's head made for it, the
    // third streamed; every field typed, the long text whole.
    // The dump's form of a text over 64 bytes: its length and the first
    // 12 hex digits of its SHA-1 (the program's 150-byte `BODY`).
    let body = "<150 bytes, sha1 e2d9975818eb>";
    for (i, e) in main[20..].iter().enumerate() {
        let i = i as u64;
        assert_eq!(
            args(e),
            BTreeMap::from([
                ("level".into(), string("INFO")),
                (
                    "message".into(),
                    string("a literal message of forty-three bytes here")
                ),
                ("i".into(), json!(["uint", i])),
                ("big".into(), json!(["uint", 1u64 << 40])),
                ("neg".into(), json!(["int", -10])),
                ("flag".into(), json!(["bool", true])),
                ("ratio".into(), json!(["double", 0.5])),
                ("text".into(), string("wide")),
                ("unit".into(), string("bytes")),
                ("source".into(), string("tracing-program")),
                ("dbg".into(), string("[1, 2, 3]")),
                ("body".into(), string(body)),
                ("seq".into(), json!(["uint", i * 3])),
            ]),
            "{e:#?}"
        );
    }

    // The middle polls, on their threads.
    for (thread, step) in [("poll-b", 1), ("poll-c", 2)] {
        let polled = thread_events(&events, thread);
        assert_eq!(nesting(&polled), "task{ event }", "{polled:#?}");
        assert_eq!(args(polled[1])["step"], json!(["uint", step]));
        assert_eq!(polled[0]["categories"], app);
    }

    // The task's life on a track of its own, named after it.
    let own: Vec<&Value> = events
        .iter()
        .copied()
        .filter(|e| e["track"]["name"] == "task")
        .collect();
    assert_eq!(nesting(&own), "task{ }", "{own:#?}");
    assert_eq!(
        args(own[0]),
        BTreeMap::from([
            ("level".into(), string("INFO")),
            ("id".into(), json!(["uint", 1]))
        ])
    );
    assert!(own[0]["track"]["thread"].is_null(), "{:#?}", own[0]);

    // Every event is one of those.
    assert_eq!(
        events.len(),
        main.len() + 2 * 3 + own.len(),
        "events on other tracks: {events:#?}"
    );
}

#[test]
fn a_tracing_program_is_recorded_by_the_real_service() {
    tracing_program_is_recorded(ServiceImpl::Real);
}

#[test]
fn a_tracing_program_is_recorded_by_our_service() {
    tracing_program_is_recorded(ServiceImpl::Ours);
}
