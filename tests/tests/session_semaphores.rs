//! `TraceConfig.session_semaphores` against the real Perfetto service and
//! against `shmtrace serve`: while a detached session holds semaphore
//! "solo" (no other session allowed), a second session that declares it
//! is refused with the same error on both services, one that declares
//! another semaphore runs, and once the first session ended the second
//! one runs too.

use std::path::Path;
use std::process::Command;

use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{shmtrace_binary, start_service, ServiceImpl};

/// A session of `track_event` holding semaphore `name` (at most `max`
/// other sessions may hold it too).
fn config(name: &str, max: u64) -> String {
    format!(
        "buffers {{ size_kb: 1024 }}
data_sources {{ config {{ name: \"track_event\" }} }}
duration_ms: 60000
session_semaphores {{ name: \"{name}\" max_other_session_count: {max} }}
"
    )
}

/// `shmtrace record` of `args` on `consumer`: its exit code and stderr.
fn record(consumer: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(shmtrace_binary().expect("shmtrace binary"))
        .args(["record", "--progress", "none"])
        .args(args)
        .arg("--socket")
        .arg(consumer)
        .output()
        .expect("run shmtrace record");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The refusal a second holder of "solo" gets from `service`.
fn refusal(service: ServiceImpl) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let _service = start_service(
        service,
        &real_binaries!(),
        dir.path(),
        &dir.path().join("p.sock"),
        &dir.path().join("c.sock"),
    )
    .expect("service starts");
    let consumer = dir.path().join("c.sock");
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write config");
        path.to_str().expect("utf-8 path").to_owned()
    };
    let solo = write("solo.txtpb", config("solo", 0));
    let other = write("other.txtpb", config("other", 0));
    let out = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();

    let (code, stderr) = record(&consumer, &["--txt", "-c", &solo, "--detach", "first"]);
    assert_eq!(code, Some(0), "{service:?}: {stderr}");
    let (code, refused) = record(&consumer, &["--txt", "-c", &solo, "-o", &out("2.pftrace")]);
    assert_eq!(code, Some(5), "{service:?}: {refused}");
    // Another semaphore is free.
    let (code, stderr) = record(&consumer, &["--txt", "-c", &other, "--detach", "second"]);
    assert_eq!(code, Some(0), "{service:?}: {stderr}");
    // Once the holder stopped, "solo" is free again.
    for key in ["first", "second"] {
        let (code, stderr) = record(
            &consumer,
            &[
                "--attach",
                key,
                "--stop",
                "-o",
                &out(&format!("{key}.pftrace")),
            ],
        );
        assert_eq!(code, Some(0), "{service:?}: {stderr}");
    }
    let (code, stderr) = record(&consumer, &["--txt", "-c", &solo, "--detach", "third"]);
    assert_eq!(code, Some(0), "{service:?}: {stderr}");
    let (code, stderr) = record(
        &consumer,
        &["--attach", "third", "--stop", "-o", &out("3.pftrace")],
    );
    assert_eq!(code, Some(0), "{service:?}: {stderr}");
    refused
}

#[test]
fn a_semaphore_refuses_another_session_alike_on_either_service() {
    let want = "Semaphore \"solo\" exceeds maximum allowed other session count (1 > min(0, 0))";
    let ours = refusal(ServiceImpl::Ours);
    let real = refusal(ServiceImpl::Real);
    assert!(ours.contains(want), "ours: {ours}");
    assert!(real.contains(want), "real: {real}");
}
