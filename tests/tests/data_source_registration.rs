//! Which data sources a program traced with shmtrace-producer offers: the
//! `custom_data_source` example registers only `com.example.counters` and
//! never touches track events, so, as with Perfetto's SDK (where the
//! program calls `PerfettoTeInit` / `TrackEvent::Register`), the service
//! lists no `track_event` for it. Against `shmtrace serve` and the real
//! service, through `shmtrace query --json`.

use std::process::Command;
use std::time::Duration;

use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, ServiceImpl};

fn only_custom_data_source_is_offered(service: ServiceImpl) {
    let bins = real_binaries!();
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-registration-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let producer_socket = dir.path().join("p.sock");
    let consumer_socket = dir.path().join("c.sock");
    let _service = scenario::start_service(
        service,
        &bins,
        dir.path(),
        &producer_socket,
        &consumer_socket,
    )
    .expect("the service starts");

    let mut command = Command::new(
        scenario::producer_example("custom_data_source").expect("custom_data_source example"),
    );
    command.env("PERFETTO_PRODUCER_SOCK_NAME", &producer_socket);
    let program = ChildProcess::spawn("custom_data_source", command, dir.path()).expect("spawn");

    // The example waits up to 10 s for a session: query while it does.
    scenario::query_until(&consumer_socket, "the data source", |s| {
        !s["data_sources"].as_array().unwrap().is_empty()
    });
    // Whatever the producer sends, it sends on connecting: give a stray
    // registration time to arrive.
    std::thread::sleep(Duration::from_millis(200));
    let state = scenario::query_json(&consumer_socket);
    let names: Vec<&str> = state["data_sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["com.example.counters"], "{state}");
    let producers = state["producers"].as_array().unwrap();
    assert_eq!(producers.len(), 1, "{state}");
    assert_eq!(
        producers[0]["pid"].as_u64(),
        Some(u64::from(program.pid())),
        "{state}"
    );
}

#[test]
fn without_track_events_only_the_custom_data_source_is_offered_to_our_service() {
    only_custom_data_source_is_offered(ServiceImpl::Ours);
}

#[test]
fn without_track_events_only_the_custom_data_source_is_offered_to_the_real_service() {
    only_custom_data_source_is_offered(ServiceImpl::Real);
}
