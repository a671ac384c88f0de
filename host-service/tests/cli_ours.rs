//! `shmtrace query` and `shmtrace record` against our own service
//! (`shmtrace serve`), as against the real one in the interop suite.

mod cli_common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cli_common::*;

/// `shmtrace serve` on private sockets; killed when dropped.
struct Serve(Child);

impl Serve {
    fn start(dir: &TempDir) -> (Self, String) {
        let consumer = dir.path("c.sock");
        let child = shmtrace()
            .args(["serve", "--log-level", "warn", "--producer-socket"])
            .arg(dir.path("p.sock"))
            .arg("--consumer-socket")
            .arg(&consumer)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn shmtrace serve");
        let serve = Serve(child);
        let consumer = consumer.display().to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !Path::new(&consumer).exists() {
            assert!(Instant::now() < deadline, "shmtrace serve did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        (serve, consumer)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn query_and_record_against_our_service() {
    let dir = TempDir::new("ours");
    let (_serve, socket) = Serve::start(&dir);

    let out = run(&["query", "--json", "--socket", &socket]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        state["version"].as_str().unwrap().starts_with("shmtrace"),
        "{state}"
    );
    assert_eq!(state["producers"].as_array().unwrap().len(), 0);

    // Nobody registered track_event: the session still runs, and says so.
    let trace = dir.path("t.pftrace");
    let out = run(&[
        "record",
        "--socket",
        &socket,
        "-t",
        "500ms",
        "-o",
        trace.to_str().unwrap(),
        "--progress",
        "none",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("track_event: no producer registered it"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ended by the service after the configured 500 ms"),
        "{stderr}"
    );
    // The service's own packets make a sound trace.
    let (code, a) = inspect(&[&trace]);
    assert_eq!(code, 0, "{}", problems(&a));
    assert_eq!(a["packets_by_kind"]["trace_config"]["packets"], 1);
    assert_eq!(a["session"]["config"]["duration_ms"], 500);
    assert!(a["stats"].is_object());
}
