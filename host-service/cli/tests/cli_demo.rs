//! `shmtrace demo`: our service, our producer and our consumer end to end,
//! through real sockets and the real shared memory buffer; the trace it
//! writes must be sound and hold what the example app emits.

mod cli_common;

use std::collections::BTreeSet;

use cli_common::*;

#[test]
fn demo_records_a_sound_trace_of_the_example_app() {
    let dir = TempDir::new("demo");
    let out_path = dir.path("demo.pftrace");
    let out = run(&[
        "demo",
        "-o",
        out_path.to_str().unwrap(),
        "-t",
        "1s",
        "--progress",
        "plain",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_contains_all(
        &stderr,
        &[
            "tracing service running in this process on",
            // It stops itself: not "on request", which is Ctrl-C's.
            "stopped after the demo's 1.0 s (flushed)",
            "track_event: recorded from shmtrace-demo",
            "data loss     none",
            "https://ui.perfetto.dev",
        ],
    );
    assert!(!stderr.contains("problem"), "{stderr}");

    let (code, a) = inspect(&[&out_path]);
    assert_eq!(code, 0, "the demo trace fails --check:\n{}", problems(&a));
    let te = &a["track_events"];
    // A 60 fps loop for a second: each frame is frame > update, render >
    // draw, present, and three counters.
    let frames = te["by_name"]["frame"].as_u64().unwrap();
    assert!(frames >= 20, "only {frames} frames in {te}");
    for name in ["update", "render", "draw", "present"] {
        assert_eq!(te["by_name"][name], frames, "{name}");
    }
    assert_eq!(te["slice_begin"], te["slice_end"]);
    assert_eq!(te["open_slices"], 0);
    assert_eq!(te["max_depth"], 3);
    // Every job submitted on the main thread ran on a worker.
    let jobs = te["by_name"]["submit job"].as_u64().unwrap();
    assert!(jobs > 0);
    assert_eq!(te["by_name"]["run job"], jobs);
    assert_eq!(te["flow_links"], jobs);
    assert_eq!(te["flows_unpaired_start"], 0);
    assert_eq!(te["counter"], 3 * frames);
    assert_eq!(te["interned_unresolved"], 0);

    let tracks_of_kind = |kind: &str| -> BTreeSet<&str> {
        a["tracks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["kind"] == kind)
            .filter_map(|t| t["name"].as_str())
            .collect()
    };
    assert_eq!(
        tracks_of_kind("thread"),
        BTreeSet::from(["demo-main", "demo-worker-0", "demo-worker-1"])
    );
    assert_eq!(
        tracks_of_kind("counter"),
        BTreeSet::from(["frame time", "queued jobs", "heap"])
    );
    assert!(a["tracks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["kind"] == "process" && t["name"] == "shmtrace demo app"));
    // One producer process, three writers; the service's own packets too.
    let sequences = a["sequences"].as_array().unwrap();
    assert_eq!(sequences.len(), 3);
    assert!(sequences
        .iter()
        .all(|s| s["start_lost"] == false && s["loss_marks"] == 0));
    let session = &a["session"];
    assert!(session["service_version"]
        .as_str()
        .unwrap()
        .starts_with("Perfetto v59.0 (shmtrace "));
    assert_eq!(a["stats"]["service"]["flushes_succeeded"], 1);

    // The private socket directory is gone.
    let socket_dir = stderr
        .lines()
        .find_map(|l| {
            l.split("tracing service running in this process on ")
                .nth(1)
        })
        .expect("the socket directory is named");
    assert!(socket_dir.contains("shmtrace-demo-"), "{socket_dir}");
    assert!(
        !std::path::Path::new(socket_dir).exists(),
        "{socket_dir} left behind"
    );
}

#[test]
fn demo_refuses_an_unwritable_output() {
    let dir = TempDir::new("demo-out");
    let out = run(&[
        "demo",
        "-o",
        dir.path("missing/dir/demo.pftrace").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot create"));
}

/// Ctrl-C ends the demo early, and its last line gives the time the app
/// ran, not the `-t` it was asked for.
#[test]
fn ctrl_c_ends_the_demo_and_it_says_how_long_the_app_ran() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let dir = TempDir::new("demo-ctrl-c");
    let out_path = dir.path("demo.pftrace");
    let mut child = shmtrace()
        .args(["demo", "-t", "60s", "--progress", "plain", "-o"])
        .arg(&out_path)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut text = String::new();
    while !text.contains("press Ctrl-C to stop") {
        assert_ne!(stderr.read_line(&mut text).unwrap(), 0, "{text}");
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0), "{text}{rest}");
    let last = rest.lines().last().unwrap_or_default();
    assert!(last.starts_with("The example app rendered "), "{rest}");
    let time = last.rsplit(" in ").next().unwrap_or_default();
    let seconds = |suffix: &str, scale: f64| {
        time.strip_suffix(suffix)
            .and_then(|t| t.parse::<f64>().ok())
            .map(|t| t * scale)
    };
    let ran = seconds(" s.", 1.0)
        .or_else(|| seconds(" ms.", 1e-3))
        .unwrap_or_else(|| panic!("no time in {last:?}"));
    assert!((0.3..30.0).contains(&ran), "{last}");
}
