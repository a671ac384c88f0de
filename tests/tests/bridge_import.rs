//! `shmtrace import`: a RAM dump of a firmware region (the file
//! `sim-firmware region` wrote, as a probe or QEMU's RAM file leaves it)
//! and a captured frame stream become trace files; the checker must find
//! exactly the events the firmware wrote, with the clock offset given.

mod sim_bridge;

use std::path::Path;
use std::process::Command;

use shmtrace_tests::checker::Loss;
use shmtrace_tests::{scenario, trace_file};
use sim_bridge::*;

fn import(env: &Env, what: &[&str], out: &Path) -> std::process::Output {
    let output = Command::new(scenario::shmtrace_binary().expect("shmtrace"))
        .arg("import")
        .args(what)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run shmtrace import");
    std::fs::write(
        env.path(&format!(
            "{}.stderr",
            out.file_name().unwrap().to_string_lossy()
        )),
        &output.stderr,
    )
    .expect("log");
    output
}

fn run_firmware(env: &Env, name: &str, a: &[&str]) -> serde_json::Value {
    let mut firmware = env.firmware(name, &args(a));
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    firmware.expect_success(TIMEOUT).expect("exits");
    done
}

/// A region dump: every chunk the firmware committed, in order, with its
/// patches; the same dump taken while the writers still held their last
/// chunks (scraped, as Perfetto's service scrapes): the same events.
#[test]
fn import_of_a_region_dump() {
    let env = Env::new("shmtrace-import-dump-");
    for (name, open) in [("committed", false), ("open", true)] {
        let ram = env.path(name);
        let mut a = vec![
            "region",
            "--file",
            ram.to_str().unwrap(),
            "--offset",
            "65536",
            "--iterations",
            "300",
            "--large-every",
            "50",
            "--exit-when-done",
        ];
        if open {
            a.push("--leave-open");
        }
        let done = run_firmware(&env, name, &a);
        let out = env.path(&format!("{name}.pftrace"));
        let output = import(
            &env,
            &["--region-dump", &format!("{}@0x10000", ram.display())],
            &out,
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        // The import stops itself once the dump is read: not "on request".
        assert!(
            stderr.contains("stopped at the end of the input (flushed)"),
            "{stderr}"
        );
        let report = check(&env, &out, emitted(&done), Loss::None, name);
        report.assert_ok(name);
        assert_eq!(report.totals.large, 6);
        inspect_passes(&out);
        let transport = stderr
            .lines()
            .find(|l| l.contains("transport: "))
            .unwrap_or_default();
        if open {
            assert!(
                transport.contains("chunks_scraped 2"),
                "both writers' open chunks scraped: {transport}"
            );
        } else {
            assert!(transport.contains("chunks_scraped 0"), "{transport}");
        }
    }
    // No region at the offset: a clear error, status 5.
    let output = import(
        &env,
        &[
            "--region-dump",
            &format!("{}@0x20000", env.path("committed").display()),
        ],
        &env.path("none.pftrace"),
    );
    assert_eq!(output.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is the offset right?"), "{stderr}");
    // A failed import leaves no (empty) trace file behind.
    assert!(
        !env.path("none.pftrace").exists(),
        "the failed import left none.pftrace behind"
    );
    // Nor does a frame capture without a hello (here: the RAM dump).
    let output = import(
        &env,
        &["--frames", env.path("committed").to_str().unwrap()],
        &env.path("no-hello.pftrace"),
    );
    assert_eq!(output.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no firmware hello found"), "{stderr}");
    assert!(!env.path("no-hello.pftrace").exists());
}

/// A dump of a region whose SMB filled (nobody drained it): the writers'
/// last packets were dropped, and no packet followed to carry their
/// `previous_packet_dropped`. The import marks that loss (the firmware
/// counted it) at the end of every firmware sequence: the checker and
/// `inspect` see it, and every event the firmware wrote before is there.
#[test]
fn import_of_a_full_region_marks_the_firmware_losses() {
    let env = Env::new("shmtrace-import-full-");
    let ram = env.path("full");
    let done = run_firmware(
        &env,
        "full",
        &[
            "region",
            "--file",
            ram.to_str().unwrap(),
            "--offset",
            "65536",
            "--iterations",
            "20000",
            "--large-every",
            "50",
            "--exit-when-done",
        ],
    );
    assert!(done["dropped"].as_u64() > Some(0), "the SMB filled: {done}");
    let out = env.path("full.pftrace");
    let output = import(
        &env,
        &["--region-dump", &format!("{}@0x10000", ram.display())],
        &out,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("packets_dropped "), "{stderr}");
    let report = check(&env, &out, emitted(&done), Loss::Allowed, "full");
    report.assert_ok("full");
    let firmware: Vec<_> = report
        .sequences
        .iter()
        .filter(|s| s.track_events > 0)
        .collect();
    assert!(!firmware.is_empty(), "{:?}", report.sequences);
    // The end's mark on each, plus any the service put on an injected
    // clock snapshot after a packet it could not reassemble (a patch the
    // dump did not hold).
    for s in &firmware {
        assert!(s.loss_marks >= 1, "sequence {}: {s:?}\n{stderr}", s.id);
    }
    assert!(
        stderr.contains(&format!(
            "{} at the end of a session for the firmware's or the link's drops",
            firmware.len()
        )),
        "{stderr}"
    );
    let analysis = inspect_passes(&out);
    let marks: u64 = firmware.iter().map(|s| s.loss_marks).sum();
    assert_eq!(
        analysis["loss"]["loss_marks"].as_u64(),
        Some(marks),
        "{}",
        analysis["loss"]
    );
}

/// The simulated firmware's frame stream with `extra` flags, captured in
/// `uart.log`: its path and the firmware's `done` report.
fn capture_frames(env: &Env, extra: &[&str]) -> (std::path::PathBuf, serde_json::Value) {
    let capture = env.path("uart.log");
    let mut a = vec!["stream", "--out", capture.to_str().unwrap()];
    a.extend_from_slice(extra);
    a.push("--exit-when-done");
    let done = run_firmware(env, "stream", &a);
    (capture, done)
}

/// A captured frame stream, with and without a clock offset: the same
/// events, every one of them the offset later.
#[test]
fn import_of_a_frame_capture() {
    let env = Env::new("shmtrace-import-frames-");
    let (capture, done) = capture_frames(&env, &["--iterations", "300", "--large-every", "60"]);
    let mut spans = Vec::new();
    for (name, offset) in [("plain", "0"), ("shifted", "5000000000")] {
        let out = env.path(&format!("{name}.pftrace"));
        let output = import(
            &env,
            &[
                "--frames",
                capture.to_str().unwrap(),
                "--clock-offset",
                offset,
            ],
            &out,
        );
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report = check(&env, &out, emitted(&done), Loss::None, name);
        report.assert_ok(name);
        let analysis = inspect_passes(&out);
        // The earliest time: the firmware's first packet (its clock reads
        // about 1 s, long before the service's own packets).
        spans.push(analysis["clocks"]["first_ns"].as_u64().expect("a time"));
    }
    assert!(spans[0] < 10_000_000_000, "{spans:?}");
    assert_eq!(spans[1] - spans[0], 5_000_000_000);
}

/// `TracePacket`: its sequence, whether it is a track event, its clock
/// snapshot.
#[derive(Clone, PartialEq, prost::Message)]
struct Packet {
    #[prost(message, optional, tag = "6")]
    clock_snapshot: Option<Snapshot>,
    #[prost(uint32, optional, tag = "10")]
    trusted_packet_sequence_id: Option<u32>,
    #[prost(bytes = "vec", optional, tag = "11")]
    track_event: Option<Vec<u8>>,
}

/// `ClockSnapshot`.
#[derive(Clone, PartialEq, prost::Message)]
struct Snapshot {
    #[prost(message, repeated, tag = "1")]
    clocks: Vec<SnapshotClock>,
}

/// `ClockSnapshot.Clock`.
#[derive(Clone, PartialEq, prost::Message)]
struct SnapshotClock {
    #[prost(uint32, optional, tag = "1")]
    clock_id: Option<u32>,
}

/// A capture twice the size of a small RING buffer, imported into it: the
/// buffer wraps and overwrites the firmware sequences' starts with the
/// clock snapshot the bridge put there. The bridge states the relation
/// again every 16 KiB it forwards, so each firmware sequence still holds
/// one near its oldest packet: few of its packets precede it (about 16 of
/// 256 KiB; without the restatements every one did, and no time on the
/// firmware's clock could be placed).
#[test]
fn a_wrapped_ring_keeps_the_firmware_clock_related() {
    let env = Env::new("shmtrace-import-ring-");
    // Paced so that the firmware drops nothing; writer 2's packets (on
    // the firmware clock 65) fit a chunk, so the bridge's snapshot finds
    // a packet boundary at a chunk's start or end.
    let (capture, done) = capture_frames(
        &env,
        &[
            "--iterations",
            "3200",
            "--large-every",
            "2",
            "--large-bytes",
            "200",
            "--rate",
            "20000",
        ],
    );
    assert_eq!(done["dropped"], 0, "{done}");
    let size = std::fs::metadata(&capture).expect("capture").len();
    assert!(size > 2 * 256 * 1024, "{size} bytes");
    let out = env.path("ring.pftrace");
    let output = import(
        &env,
        &["--frames", capture.to_str().unwrap(), "--buffer-kb", "256"],
        &out,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let analysis = inspect_passes(&out);
    assert!(
        analysis["stats"].to_string().contains("chunks_overwritten"),
        "the ring wrapped: {}",
        analysis["stats"]
    );
    // Per sequence with track events (the firmware's): its packets, and
    // those before its first snapshot relating clock 65 to BOOTTIME.
    let mut sequences = std::collections::BTreeMap::<u32, (u64, u64, bool)>::new();
    let mut firmware = std::collections::BTreeSet::new();
    for p in trace_file::packets::<Packet>(&out).expect("the trace") {
        let Some(seq) = p.trusted_packet_sequence_id else {
            continue;
        };
        let ids: Vec<_> = p
            .clock_snapshot
            .iter()
            .flat_map(|s| s.clocks.iter().filter_map(|c| c.clock_id))
            .collect();
        if p.track_event.is_some() {
            firmware.insert(seq);
        }
        let (packets, unrelated, related) = sequences.entry(seq).or_default();
        *related |= ids.contains(&65) && ids.contains(&6);
        *packets += 1;
        *unrelated += u64::from(!*related);
    }
    let (packets, unrelated) = firmware
        .iter()
        .map(|s| sequences[s])
        .fold((0, 0), |(p, u), (sp, su, _)| (p + sp, u + su));
    assert_eq!(firmware.len(), 2, "{sequences:?}");
    assert!(
        packets > 1000 && unrelated * 10 <= packets,
        "{unrelated} of {packets} packets before a relating snapshot: {sequences:?}\n{stderr}"
    );
}
