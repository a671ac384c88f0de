//! A firmware region in shared memory (a file, as QEMU's
//! `memory-backend-file` backs guest RAM), written by `sim-firmware
//! region` with abi's RegionStorage, TrackEventWriter and TraceWriter:
//! recorded through `shmtrace serve --attach FILE@OFFSET` and through
//! `shmtrace bridge --input region:FILE@OFFSET` into the real Perfetto
//! service. The checker must find exactly the events the firmware wrote.

mod sim_bridge;

use shmtrace_tests::checker::Loss;
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::scenario::ServiceImpl;
use sim_bridge::*;

const OFFSET: &str = "0x10000";

/// `sim-firmware region` flags for a region at OFFSET of `file`, waiting
/// for the host to enable tracing, plus `extra`.
fn region_firmware(file: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "region",
        "--file",
        file.to_str().unwrap(),
        "--offset",
        "65536",
        "--wait-enabled",
    ]);
    a.extend(args(extra));
    a
}

/// `sim-firmware region` at OFFSET of `file`: 300 iterations at 3000/s, a
/// large event every 30; returns once it is ready.
fn short_firmware(env: &Env, file: &std::path::Path) -> ChildProcess {
    let mut firmware = env.firmware(
        "region",
        &region_firmware(
            file,
            &[
                "--iterations",
                "300",
                "--large-every",
                "30",
                "--rate",
                "3000",
            ],
        ),
    );
    firmware.expect_event("ready", TIMEOUT).expect("ready");
    firmware
}

/// `serve --attach` started before the region file exists (QEMU not
/// started yet): the region is waited for, attached once the firmware
/// initialized it, recorded; the firmware restarts mid-run (the region is
/// initialized again with a new boot id): each boot is its own sequences,
/// every event is there, the first boot's two sequences end with a loss
/// mark each (it ended mid-session).
#[test]
fn serve_attach_records_a_region_across_firmware_resets() {
    let mut env = Env::new("shmtrace-attach-");
    let ram = env.path("guest-ram");
    env.start_our_service(&args(&["--attach", &format!("{}@{OFFSET}", ram.display())]));
    // The child waits for the file.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut firmware = env.firmware(
        "region",
        &region_firmware(
            &ram,
            &[
                "--iterations",
                "400",
                "--large-every",
                "50",
                "--rate",
                "4000",
                "--reset-after",
                "200",
            ],
        ),
    );
    firmware.expect_event("ready", TIMEOUT).expect("ready");
    env.wait_registered();
    let consumer = env.start_consumer();
    firmware
        .expect_event("enabled", TIMEOUT)
        .expect("enabled by the host");
    firmware.expect_event("reset", TIMEOUT).expect("reset");
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    let trace = env.stop_consumer(consumer);
    firmware.close_stdin();
    let emitted = emitted(&done);
    assert_eq!((emitted.slice_begin, emitted.large), (400, 8), "{done}");
    let report = check_restarted(&env, &trace, emitted, 2, "attach");
    assert!(report.buffer_stat("patches_succeeded") > 0);
}

/// `shmtrace bridge --input region:FILE@OFFSET` is a normal producer: the
/// real Perfetto service records the region.
#[test]
fn bridge_region_into_the_real_service() {
    let env = Env::with_service("shmtrace-region-real-", ServiceImpl::Real);
    let ram = env.path("guest-ram");
    let mut firmware = short_firmware(&env, &ram);
    let bridge = env.bridge(&format!("region:{}@{OFFSET}", ram.display()), &[]);
    env.wait_registered();
    let consumer = env.start_consumer();
    firmware.expect_event("enabled", TIMEOUT).expect("enabled");
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    let trace = env.stop_consumer(consumer);
    let summary = bridge_summary(bridge);
    firmware.close_stdin();
    let report = check(&env, &trace, emitted(&done), Loss::None, "region-real");
    report.assert_ok("region-real");
    inspect_passes(&trace);
    assert_eq!(summary["lost_anything"], false, "{summary}");
    assert_eq!(summary["clock"]["two_way"], true, "{summary}");
    assert_eq!(counter(&summary, "transport", "attaches"), 1);
    let truth = -done["fw_minus_boottime_ns"].as_i64().expect("offset");
    let clock = &summary["clock"];
    let offset = clock["offset_ns"].as_i64().expect("estimate");
    assert!(
        offset.abs_diff(truth) <= clock["bound_ns"].as_u64().expect("bound"),
        "{summary}, true offset {truth}"
    );
}

/// A second reader of a region `serve --attach` reads (a user's `bridge
/// --input region:` of the same region) would take the first one's
/// records and control words: it is refused at once, naming the holder,
/// exit status 4, and the service records every event as if it had not
/// been there.
#[test]
fn a_second_reader_of_an_attached_region_is_refused() {
    let mut env = Env::new("shmtrace-attach-twice-");
    let ram = env.path("guest-ram");
    let region = format!("{}@{OFFSET}", ram.display());
    env.start_our_service(&args(&["--attach", &region]));
    let mut firmware = short_firmware(&env, &ram);
    env.wait_registered();
    let mut second = env.bridge(&format!("region:{region}"), &[]);
    let status = second
        .expect_exit(TIMEOUT)
        .expect("the second reader exits");
    assert_eq!(status.code(), Some(4), "{}", second.stderr_tail());
    assert!(
        second.stderr_contains(&format!(
            "shmtrace: error: cannot attach region:{}@0x10000: the region is already being \
             read by another reader (pid ",
            ram.display()
        )),
        "{}",
        second.stderr_tail()
    );
    let consumer = env.start_consumer();
    firmware.expect_event("enabled", TIMEOUT).expect("enabled");
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    let trace = env.stop_consumer(consumer);
    firmware.close_stdin();
    let report = check(&env, &trace, emitted(&done), Loss::None, "attach-twice");
    report.assert_ok("attach-twice");
    let sequences: Vec<_> = report.track_event_sequences().collect();
    assert_eq!(sequences.len(), 2, "two writers, one boot: {sequences:?}");
    let log = std::fs::read_to_string(env.path("service.stderr")).expect("service log");
    assert!(!log.contains("the firmware restarted"), "{log}");
}

/// Two regions attached: one whose header is of an unknown version (a
/// firmware of another ABI, or scribbled), one good. The bad one costs its
/// own child only (refused, retried with a backoff); the service and the
/// good region record as if it were not there.
#[test]
fn serve_attach_survives_a_bad_region() {
    let mut env = Env::new("shmtrace-attach-bad-");
    let bad = env.path("bad-ram");
    // "shmtrace", version 2, the rest zeros: a header this reader refuses.
    let mut bytes = vec![0u8; 0x10000 + 4096];
    bytes[0x10000..0x10008].copy_from_slice(b"shmtrace");
    bytes[0x10008] = 2;
    std::fs::write(&bad, &bytes).expect("bad region");
    let ram = env.path("guest-ram");
    env.start_our_service(&args(&[
        "--attach",
        &format!("{}@{OFFSET}", bad.display()),
        "--attach",
        &format!("{}@{OFFSET}", ram.display()),
    ]));
    let mut firmware = env.firmware(
        "region",
        &region_firmware(
            &ram,
            &[
                "--iterations",
                "200",
                "--large-every",
                "40",
                "--rate",
                "3000",
            ],
        ),
    );
    firmware.expect_event("ready", TIMEOUT).expect("ready");
    env.wait_registered();
    let consumer = env.start_consumer();
    firmware.expect_event("enabled", TIMEOUT).expect("enabled");
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    let trace = env.stop_consumer(consumer);
    firmware.close_stdin();
    let report = check(&env, &trace, emitted(&done), Loss::None, "attach-bad");
    report.assert_ok("attach-bad");
    // The service logged the refusal (its children log to its stderr).
    let log = std::fs::read_to_string(env.path("service.stderr")).expect("service log");
    assert!(
        log.contains("region refused: region header: region version 2 (supported: 1)"),
        "{log}"
    );
}

/// A firmware that traces from boot on (`trace_enabled` set before any
/// host is there), recorded session after session through `serve
/// --attach`: no packet the firmware wrote outside a session reaches one
/// (each session's sequence starts with its reset), so every trace
/// passes `inspect --check`, and each holds the firmware's events.
#[test]
fn serve_attach_records_an_always_on_firmware_session_after_session() {
    let mut env = Env::new("shmtrace-attach-always-on-");
    let ram = env.path("guest-ram");
    env.start_our_service(&args(&["--attach", &format!("{}@{OFFSET}", ram.display())]));
    let fw_args = args(&[
        "region",
        "--file",
        ram.to_str().unwrap(),
        "--offset",
        "65536",
        "--iterations",
        "1000000",
        "--rate",
        "4000",
    ]);
    let mut firmware = env.firmware("region", &fw_args);
    firmware.expect_event("ready", TIMEOUT).expect("ready");
    env.wait_registered();
    sessions_pass_inspect(&env, 3);
}
