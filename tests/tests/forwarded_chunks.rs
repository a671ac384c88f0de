//! Forwarded chunks ([`shmtrace_producer::ChunkForwarder`], the host side of
//! firmware tracing): shmtrace-producer's `forward_chunks` example
//! simulates a firmware that writes track events with shmtrace-abi's
//! `TraceWriter` into its own shared memory (584-byte chunks), stamped on
//! its own sequence-scoped clock 65, and forwards every chunk and patch it
//! commits (a 3000-byte annotation spans six chunks, with patches) with a
//! clock snapshot {65, BOOTTIME} injected before its first packet. The
//! stock Perfetto service (`real-service`) and `shmtrace serve` record
//! them through the real consumer; the checker must find exactly the
//! events the example wrote, every timestamp resolved through the injected
//! snapshot (a timestamp on clock 65 without it is a violation), slices
//! nested, no loss, and the service must have applied the patches.

use std::process::Command;
use std::time::Duration;

use shmtrace_tests::checker::{self, EventCounts, Expectation, Loss, ProducerExpectation};
use shmtrace_tests::config::{self, BufferConfig, DataSource, DataSourceConfig, FillPolicy};
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, ServiceImpl};

const DATA_SOURCE: &str = "shmtrace.forwarded";
const TIMEOUT: Duration = Duration::from_secs(30);

fn forwarded_chunks_are_recorded(service: ServiceImpl) {
    checker::ensure_environment().expect("the checker's python environment");
    let bins = real_binaries!();
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-forwarded-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let path = |name: &str| dir.path().join(name);
    let (producer_socket, consumer_socket) = (path("p.sock"), path("c.sock"));
    let _service = scenario::start_service(
        service,
        &bins,
        dir.path(),
        &producer_socket,
        &consumer_socket,
    )
    .expect("the service starts");

    let mut command =
        Command::new(scenario::producer_example("forward_chunks").expect("forward_chunks"));
    command
        .env("PERFETTO_PRODUCER_SOCK_NAME", &producer_socket)
        .args(["--data-source", DATA_SOURCE, "--iterations", "60"])
        .args(["--large-every", "10", "--large-bytes", "3000"]);
    let mut firmware = ChildProcess::spawn("forward_chunks", command, dir.path()).expect("spawn");
    scenario::query_until(&consumer_socket, "the forwarded data source", |s| {
        s["data_sources"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["name"] == DATA_SOURCE))
    });

    let trace_config = config::TraceConfig {
        buffers: vec![BufferConfig {
            size_kb: Some(4096),
            fill_policy: Some(FillPolicy::RingBuffer as i32),
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
    firmware.expect_event("enabled", TIMEOUT).expect("enabled");
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    consumer.send_line("stop").expect("stop");
    consumer.expect_event("done", TIMEOUT).expect("the trace");
    firmware
        .expect_success(TIMEOUT)
        .expect("the example exits once the session stopped");

    let emitted: EventCounts =
        serde_json::from_value(done["emitted"].clone()).expect("emitted counts");
    assert_eq!(emitted.slice_begin, 60);
    assert_eq!(emitted.large, 6);
    let forward = &done["forward"];
    assert_eq!(forward["chunks_dropped"], 0, "{done}");
    assert_eq!(forward["patches_dropped"], 0, "{done}");
    assert_eq!(forward["packets_injected"], 1, "{done}");
    assert!(forward["patches_forwarded"].as_u64() > Some(0), "{done}");
    assert_eq!(forward["chunks_forwarded"], forward["chunks_received"]);

    let expect = Expectation {
        producers: vec![ProducerExpectation {
            pid: Some(firmware.pid()),
            emitted,
        }],
        loss: Loss::None,
        require_trace_stats: true,
        require_service_packets: true,
        remote_producers: false,
    };
    let label = format!("forwarded-{service:?}");
    let report = checker::check(&[path("trace.pftrace")], &expect, dir.path(), &label)
        .expect("the checker runs");
    report.assert_ok(&label);
    assert_eq!(report.totals.large_bytes, 6 * 3000);
    let sequences: Vec<_> = report.track_event_sequences().collect();
    assert_eq!(sequences.len(), 1, "one forwarded sequence: {sequences:?}");
    assert_eq!(sequences[0].track_events, emitted.track_events());
    assert!(!sequences[0].start_lost);
    assert!(
        report.buffer_stat("patches_succeeded") > 0,
        "the service applied the forwarded patches: {:?}",
        report.buffer_stats
    );
}

#[test]
fn forwarded_chunks_are_recorded_by_the_real_service() {
    forwarded_chunks_are_recorded(ServiceImpl::Real);
}

#[test]
fn forwarded_chunks_are_recorded_by_our_service() {
    forwarded_chunks_are_recorded(ServiceImpl::Ours);
}
