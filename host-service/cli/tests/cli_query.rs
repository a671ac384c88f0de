//! `shmtrace query` against a scripted ConsumerPort service whose state
//! arrives in two stream replies.

mod cli_common;

use cli_common::fake::{session, FakeService, Script};
use cli_common::*;

fn script() -> Script {
    Script {
        registered: vec![
            ("app-a".into(), "track_event".into()),
            ("app-a".into(), "custom.counters".into()),
            ("app-b".into(), "track_event".into()),
        ],
        sessions: vec![session(7, "STARTED")],
        ..Default::default()
    }
}

#[test]
fn tables() {
    let dir = TempDir::new("query");
    let fake = FakeService::start(&dir.path("c.sock"), script());
    let out = run(&["query", "--socket", fake.socket.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_contains_all(
        &stdout,
        &[
            "fake-service 0.1",
            "2 producer(s), 3 data source(s), 1 tracing session(s), 0 started",
            "app-a",
            "4001",
            "fake 1.0",
            "custom.counters",
            "categories: gfx, net; notifies stop",
            "2 app-b",
            "STARTED",
            "4.0 MiB, 1.0 MiB",
            "10.0 s",
            "2026-11-21 07:19:01 UTC",
        ],
    );
    assert_eq!(fake.calls(), ["QueryServiceState"]);
}

#[test]
fn json() {
    let dir = TempDir::new("queryjson");
    let fake = FakeService::start(&dir.path("c.sock"), script());
    let out = run(&["query", "--json", "--socket", fake.socket.to_str().unwrap()]);
    assert!(out.status.success());
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["version"], "fake-service 0.1");
    assert_eq!(state["producers"].as_array().unwrap().len(), 2);
    assert_eq!(state["producers"][1]["name"], "app-b");
    let sources = state["data_sources"].as_array().unwrap();
    assert_eq!(sources.len(), 3);
    assert_eq!(sources[0]["categories"][1], "net");
    assert_eq!(sources[1]["categories"].as_array().unwrap().len(), 0);
    assert_eq!(state["sessions"][0]["id"], 7);
    assert_eq!(state["sessions"][0]["buffer_size_kb"][0], 4096);
}

#[test]
fn unreachable() {
    let dir = TempDir::new("querynone");
    let out = run(&["query", "--socket", dir.path("none.sock").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot connect to the tracing service at"),
        "{stderr}"
    );
}
