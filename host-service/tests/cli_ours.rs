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

/// `shmtrace record` against `socket` with `args`; the exit status and
/// what it printed on stderr.
fn record(socket: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = shmtrace()
        .args(["record", "--socket", socket, "--progress", "none"])
        .args(args)
        .output()
        .expect("run shmtrace record");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The sessions `shmtrace query --json` lists.
fn sessions(socket: &str) -> Vec<serde_json::Value> {
    let out = run(&["query", "--json", "--socket", socket]);
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    state["sessions"].as_array().unwrap().clone()
}

/// `--detach KEY` leaves the session running in the service;
/// `--attach KEY --stop` takes it back, stops and reads it. A key is taken
/// once, and read once.
#[test]
fn detach_then_attach_and_stop() {
    let dir = TempDir::new("detach");
    let (_serve, socket) = Serve::start(&dir);

    let (code, stderr) = record(&socket, &["-t", "60s", "--detach", "nightly"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_contains_all(
        &stderr,
        &[
            "Detached: the session runs on in the service under the key \"nightly\"",
            "shmtrace record --attach nightly -o FILE",
        ],
    );
    // The session outlives the command that started it.
    let listed = sessions(&socket);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "STARTED");
    assert_eq!(listed[0]["duration_ms"], 60_000);

    // The key is in use.
    let (code, stderr) = record(&socket, &["-t", "60s", "--detach", "nightly"]);
    assert_eq!(code, Some(5), "{stderr}");
    assert!(stderr.contains("already detached under it"), "{stderr}");
    assert_eq!(sessions(&socket).len(), 1);

    let trace = dir.path("attached.pftrace");
    let out = trace.to_str().unwrap();
    let (code, stderr) = record(&socket, &["--attach", "nightly", "--stop", "-o", out]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_contains_all(
        &stderr,
        &["stopped on request (flushed)", "Wrote ", "attached.pftrace"],
    );
    let (code, a) = inspect(&[&trace]);
    assert_eq!(code, 0, "{}", problems(&a));
    // The session's own config, started by the first command.
    assert_eq!(a["session"]["config"]["duration_ms"], 60_000);
    assert!(sessions(&socket).is_empty());

    // Nothing is detached under the key any more: no file is left behind.
    let again = dir.path("again.pftrace");
    let (code, stderr) = record(
        &socket,
        &["--attach", "nightly", "-o", again.to_str().unwrap()],
    );
    assert_eq!(code, Some(5), "{stderr}");
    assert!(
        stderr.contains("no session of yours detached under the key \"nightly\""),
        "{stderr}"
    );
    assert!(!again.exists());
}

/// Without --stop, `--attach` waits for the session to end on its own.
/// With --write-into-file the service writes the file given at --detach.
#[test]
fn attach_waits_for_the_end_and_write_into_file_goes_to_the_detach_file() {
    let dir = TempDir::new("attachwait");
    let (_serve, socket) = Serve::start(&dir);
    let streamed = dir.path("streamed.pftrace");
    let (code, stderr) = record(
        &socket,
        &[
            "-t",
            "2s",
            "--write-into-file",
            "-o",
            streamed.to_str().unwrap(),
            "--detach",
            "k",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("the service writes the trace into"),
        "{stderr}"
    );
    let ignored = dir.path("ignored.pftrace");
    let (code, stderr) = record(&socket, &["--attach", "k", "-o", ignored.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("the service wrote its trace into the file given at --detach"),
        "{stderr}"
    );
    assert!(!ignored.exists());
    let (code, a) = inspect(&[&streamed]);
    assert_eq!(code, 0, "{}", problems(&a));
    assert_eq!(a["session"]["config"]["duration_ms"], 2000);
    assert_eq!(a["session"]["config"]["write_into_file"], true);

    // Usage errors, before anything starts.
    let (code, stderr) = record(&socket, &["--detach", "x", "-o", "somewhere.pftrace"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("read by `--attach KEY -o FILE`"),
        "{stderr}"
    );
    let (code, stderr) = record(&socket, &["--stop"]);
    assert_eq!(code, Some(2), "{stderr}");
    let (code, stderr) = record(&socket, &["--attach", "k", "-t", "1s"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(sessions(&socket).is_empty());
}
