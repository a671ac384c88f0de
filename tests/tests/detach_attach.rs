//! The tour's detach/attach flow with a producer that comes and goes while
//! the session runs detached: `shmtrace record --detach KEY` starts the
//! session, the `hello` example writes into it and exits, then `shmtrace
//! record --attach KEY --stop` reads it. The trace holds hello's events,
//! and the summary says track events were recorded (the producer was gone
//! before the attach: it must not say that none registered).

use std::path::Path;
use std::process::Command;

use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, producer_example, shmtrace_binary, ServiceImpl};

/// Runs `shmtrace record` with `args` on `consumer`: its exit status and
/// standard error.
fn record(consumer: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(shmtrace_binary().expect("shmtrace"))
        .arg("record")
        .args(["--progress", "none", "--socket"])
        .arg(consumer)
        .args(args)
        .output()
        .expect("run shmtrace record");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_producer_gone_before_the_attach_is_in_the_trace_and_the_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (producer, consumer) = (dir.path().join("p.sock"), dir.path().join("c.sock"));
    let _service = scenario::start_service(
        ServiceImpl::Ours,
        &real_binaries!(),
        dir.path(),
        &producer,
        &consumer,
    )
    .expect("service starts");
    let (code, stderr) = record(
        &consumer,
        &[
            "-t",
            "60s",
            "--app-categories",
            "rendering",
            "--detach",
            "later",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");

    let hello = Command::new(producer_example("hello").expect("the hello example"))
        .env("PERFETTO_PRODUCER_SOCK_NAME", &producer)
        .output()
        .expect("run hello");
    let said = String::from_utf8_lossy(&hello.stdout);
    assert!(
        hello.status.success() && said.starts_with("tracing: "),
        "hello: {said} {}",
        String::from_utf8_lossy(&hello.stderr)
    );

    let trace = dir.path().join("attached.pftrace");
    let out = trace.to_str().expect("UTF-8 path");
    let (code, stderr) = record(&consumer, &["--attach", "later", "--stop", "-o", out]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("track_event: recorded"), "{stderr}");
    assert!(!stderr.contains("nothing was recorded from it"), "{stderr}");
    let analysis = scenario::inspect_passes(&trace);
    let events = &analysis["track_events"];
    assert_eq!(events["by_name"]["DrawPlayer"], 3, "{events}");
    assert_eq!(events["by_name"]["PlayerDrawn"], 3, "{events}");
}
