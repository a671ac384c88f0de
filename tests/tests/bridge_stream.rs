//! `shmtrace bridge` reading a simulated firmware's frame stream (abi's
//! frame format, written by `sim-firmware stream`: abi's TrackEventWriter
//! and TraceWriter over a stream-mode RegionStorage it drains itself) and
//! forwarding it, as a producer, into our service and into the real
//! Perfetto service; the real consumer records. The checker must find
//! exactly the events the firmware wrote, every timestamp resolved through
//! the bridge's clock snapshot (clock 64 -> 65 -> BOOTTIME), and `shmtrace
//! inspect --check` must pass. Hostile streams are counted and survived.

mod sim_bridge;

use shmtrace_tests::checker::{self, Loss};
use shmtrace_tests::scenario::{self, ServiceImpl};
use sim_bridge::*;

/// Firmware (TCP server) -> bridge (TCP client, two-way) -> `service`.
/// Returns the firmware's done report, the bridge's summary and the trace.
fn tcp_run(
    env: &Env,
    firmware_args: &[&str],
    label: &str,
) -> (serde_json::Value, serde_json::Value, std::path::PathBuf) {
    let mut fw_args = args(&["stream", "--listen", "0", "--wait-enabled"]);
    fw_args.extend(args(firmware_args));
    let mut firmware = env.firmware(label, &fw_args);
    let listening = firmware
        .expect_event("listening", TIMEOUT)
        .expect("listening");
    let port = listening["port"].as_u64().expect("port");
    let bridge = env.bridge(&format!("tcp:127.0.0.1:{port}"), &[]);
    firmware.expect_event("ready", TIMEOUT).expect("ready");
    env.wait_registered();
    let consumer = env.start_consumer();
    firmware
        .expect_event("enabled", TIMEOUT)
        .expect("the bridge enabled it");
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    let trace = env.stop_consumer(consumer);
    let summary = bridge_summary(bridge);
    firmware.close_stdin();
    (done, summary, trace)
}

fn a_tcp_stream_is_recorded(service: ServiceImpl) {
    let env = Env::with_service("shmtrace-bridge-tcp-", service);
    let label = format!("tcp-{service:?}");
    let (done, summary, trace) = tcp_run(
        &env,
        &[
            "--iterations",
            "400",
            "--large-every",
            "40",
            "--rate",
            "4000",
        ],
        &label,
    );
    let emitted = emitted(&done);
    assert_eq!(
        (emitted.slice_begin, emitted.instant, emitted.large),
        (400, 410, 10),
        "{done}"
    );
    let report = check(&env, &trace, emitted, Loss::None, &label);
    report.assert_ok(&label);
    assert_eq!(report.totals.large_bytes, 10 * 3000);
    // Two sequences (the track event writer, the large-event writer), both
    // with their start.
    let sequences: Vec<_> = report.track_event_sequences().collect();
    assert_eq!(sequences.len(), 2, "{sequences:?}");
    assert!(sequences.iter().all(|s| !s.start_lost));
    assert!(
        report.buffer_stat("patches_succeeded") > 0,
        "the large events' patches were applied: {:?}",
        report.buffer_stats
    );
    inspect_passes(&trace);
    // Every event's time resolves as a trace processor resolves it: the
    // firmware's incremental clock through its sequence's snapshot to the
    // firmware clock, and through the bridge's snapshot to BOOTTIME.
    let dump = checker::semantic_dump(&trace).expect("the semantic dump");
    let events: Vec<&serde_json::Value> = dump["sequences"]
        .as_array()
        .expect("sequences")
        .iter()
        .flat_map(|s| s["events"].as_array().expect("events"))
        .collect();
    // The slices' begins and ends, the instants (the large events among them).
    assert_eq!(events.len(), 400 * 2 + 410, "{dump}");
    let unresolved: Vec<_> = events
        .iter()
        .filter(|e| e.get("timestamp").is_some())
        .collect();
    assert!(unresolved.is_empty(), "{unresolved:?}");

    // Nothing lost on the way; the clock is measured two-way and the
    // firmware clock's true offset lies within the bound.
    assert_eq!(summary["lost_anything"], false, "{summary}");
    assert_eq!(
        counter(&summary, "engine", "chunks"),
        counter(&summary, "engine", "chunks_forwarded"),
        "{summary}"
    );
    assert_eq!(counter(&summary, "engine", "chunks_without_clock"), 0);
    let clock = &summary["clock"];
    assert_eq!(clock["two_way"], true, "{summary}");
    let truth = -done["fw_minus_boottime_ns"].as_i64().expect("offset");
    let offset = clock["offset_ns"].as_i64().expect("estimate");
    let bound = clock["bound_ns"].as_u64().expect("bound");
    assert!(
        offset.abs_diff(truth) <= bound,
        "estimate {offset}, true {truth}, bound {bound}"
    );
}

#[test]
fn bridge_tcp_stream_into_our_service() {
    a_tcp_stream_is_recorded(ServiceImpl::Ours);
}

#[test]
fn bridge_tcp_stream_into_the_real_service() {
    a_tcp_stream_is_recorded(ServiceImpl::Real);
}

/// A FIFO (one way: no reverse channel): the firmware starts once the
/// session runs; the clock is one-way (unsolicited CLOCK frames).
#[test]
fn bridge_fifo_stream_into_our_service() {
    let env = Env::with_service("shmtrace-bridge-fifo-", ServiceImpl::Ours);
    let fifo = env.fifo("uart");
    let go = env.path("go");
    let mut bridge = env.bridge(fifo.to_str().unwrap(), &[]);
    let mut firmware = env.firmware(
        "fifo",
        &args(&[
            "stream",
            "--out",
            fifo.to_str().unwrap(),
            "--go-file",
            go.to_str().unwrap(),
            "--iterations",
            "300",
            "--large-every",
            "100",
            "--exit-when-done",
        ]),
    );
    firmware.expect_event("ready", TIMEOUT).expect("ready");
    env.wait_registered();
    let consumer = env.start_consumer();
    // No way back to the firmware: it starts once the bridge has the
    // session's data source started.
    bridge.expect_event("enabled", TIMEOUT).expect("started");
    std::fs::write(&go, b"").expect("go");
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    firmware.expect_success(TIMEOUT).expect("exits");
    // The FIFO's writer is gone: the bridge reads to its end and exits 0
    // after a flush that waited for everything.
    let trace = env.stop_consumer(consumer);
    let summary = bridge.expect_event("summary", TIMEOUT).expect("summary");
    bridge
        .expect_success(TIMEOUT)
        .expect("exits 0 at the end of the input");
    let report = check(&env, &trace, emitted(&done), Loss::None, "fifo");
    report.assert_ok("fifo");
    inspect_passes(&trace);
    assert_eq!(summary["clock"]["two_way"], false, "{summary}");
    assert_eq!(summary["lost_anything"], false, "{summary}");
    assert!(
        summary["requests_unsupported"].as_u64() > Some(0),
        "{summary}"
    );
}

/// Garbage between frames, duplicated data frames, STATS frames with bad
/// CRCs, bogus headers announcing 1 MiB, a last frame cut short by the end
/// of the stream: each counted exactly as made, and no event lost (the
/// faults spare the data). The cut last frame is marked in the trace on
/// each of the two sequences (the bridge cannot know it held no chunk);
/// without that mark (before `cut_by_end`) the trace said nothing lost.
/// The bridge ends at the end of its input, exit status 0.
#[test]
fn bridge_survives_a_hostile_stream_without_losing_events() {
    let env = Env::with_service("shmtrace-bridge-hostile-", ServiceImpl::Ours);
    let mut firmware = env.firmware(
        "hostile",
        &args(&[
            "stream",
            "--listen",
            "0",
            "--wait-enabled",
            "--iterations",
            "600",
            "--large-every",
            "60",
            "--rate",
            "3000",
            "--stats-every-ms",
            "20",
            "--garbage-every",
            "7",
            "--duplicate-every",
            "5",
            "--corrupt-stats-every",
            "2",
            "--oversized-every",
            "11",
            "--truncate-tail",
        ]),
    );
    let port = firmware.expect_event("listening", TIMEOUT).expect("port")["port"]
        .as_u64()
        .expect("port");
    let mut bridge = env.bridge(&format!("tcp:127.0.0.1:{port}"), &[]);
    env.wait_registered();
    let consumer = env.start_consumer();
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    // The firmware closed the connection after its cut frame: the bridge
    // forwards everything and ends.
    let summary = bridge.expect_event("summary", TIMEOUT).expect("summary");
    bridge
        .expect_success(TIMEOUT)
        .expect("exits 0 at the end of the input");
    let trace = env.stop_consumer(consumer);
    firmware.close_stdin();

    let faults = &done["faults"];
    let made = |name: &str| faults[name].as_u64().expect(name);
    assert!(
        made("duplicated") > 0 && made("corrupted") > 0 && made("oversized") > 0,
        "{done}"
    );
    let lost = |name: &str| counter(&summary, "transport_loss", name);
    assert_eq!(lost("duplicates"), made("duplicated"), "{summary}");
    // A corrupted frame never arrives: its seq is missing.
    assert_eq!(lost("frames_lost"), made("corrupted"), "{summary}");
    assert_eq!(lost("truncated"), 1, "{summary}");
    // (A CRC's bytes can read as a magic, which the decoder must then try:
    // so these are at least what was made.)
    assert!(lost("bad_crc") >= made("corrupted"), "{summary}");
    assert!(lost("oversized") >= made("oversized"), "{summary}");
    assert!(
        lost("garbage_bytes") >= made("garbage_bytes") + 12 * made("oversized"),
        "{summary}"
    );
    assert_eq!(counter(&summary, "transport", "cut_by_end"), 1, "{summary}");
    assert_eq!(
        counter(&summary, "engine", "trailing_losses_marked"),
        2,
        "{summary}"
    );
    let emitted = emitted(&done);
    let report = check(&env, &trace, emitted, Loss::Allowed, "hostile");
    report.assert_ok("hostile");
    assert_eq!(report.totals, emitted, "every event is there");
    let sequences: Vec<_> = report.track_event_sequences().collect();
    assert_eq!(sequences.len(), 2, "{sequences:?}");
    assert!(sequences.iter().all(|s| s.loss_marks == 1), "{sequences:?}");
    assert_eq!(
        report.loss_indicators,
        [("mid_sequence_loss_marks".to_owned(), 2)].into(),
        "the cut frame's marks, nothing else"
    );
    inspect_passes(&trace);
}

/// Every 8th CHUNK frame never arrives: counted as lost frames, marked as
/// loss in the trace (the checker accepts the shortfall only because the
/// trace records it), nothing else breaks.
#[test]
fn bridge_marks_chunks_lost_on_the_wire() {
    let env = Env::with_service("shmtrace-bridge-lossy-", ServiceImpl::Ours);
    let (done, summary, trace) = tcp_run(
        &env,
        &[
            "--iterations",
            "800",
            "--rate",
            "4000",
            "--drop-chunk-every",
            "8",
        ],
        "lossy",
    );
    let dropped = done["faults"]["dropped_chunks"].as_u64().expect("dropped");
    assert!(dropped >= 2, "{done}");
    assert_eq!(counter(&summary, "transport_loss", "frames_lost"), dropped);
    assert_eq!(summary["lost_anything"], true);
    let emitted = emitted(&done);
    let report = check(&env, &trace, emitted, Loss::Allowed, "lossy");
    report.assert_ok("lossy");
    assert!(report.totals.track_events() < emitted.track_events());
    assert!(
        report.loss_indicators.values().sum::<u64>() > 0,
        "{:?}",
        report.loss_indicators
    );
}

/// The firmware restarts twice mid-run (new boot ids, writer and chunk ids
/// from 0 again): each boot's writers are new sequences, never mixed with
/// the old ones; every event is there; the two boots that ended while the
/// session recorded are marked lost on their 2 + 2 sequences, 1 mark each
/// (before: none, and a real board's reset lost its writers' open chunks
/// with no mark: `firmware_stream_board_reset_while_writing`).
#[test]
fn bridge_keeps_a_restarted_firmware_s_boots_apart() {
    let env = Env::with_service("shmtrace-bridge-reset-", ServiceImpl::Ours);
    let (done, summary, trace) = tcp_run(
        &env,
        &[
            "--iterations",
            "300",
            "--large-every",
            "50",
            "--rate",
            "3000",
            "--reset-after",
            "100",
        ],
        "reset",
    );
    assert_restarts_marked(&summary);
    check_restarted(&env, &trace, emitted(&done), 3, "reset");
}

/// The bridge's summary of three boots, two of them ended mid-session.
fn assert_restarts_marked(summary: &serde_json::Value) {
    assert_eq!(counter(summary, "engine", "boots"), 3, "{summary}");
    assert_eq!(counter(summary, "engine", "resets"), 2, "{summary}");
    assert_eq!(
        counter(summary, "engine", "restarts_mid_session"),
        2,
        "{summary}"
    );
    assert_eq!(
        counter(summary, "engine", "trailing_losses_marked"),
        4,
        "{summary}"
    );
    assert_eq!(counter(summary, "transport", "cut_by_restart"), 0);
    assert_eq!(summary["lost_anything"], true, "{summary}");
}

/// The same with the boot id repeated on each restart (QEMU zero-fills the
/// region's RAM at a reset, so nothing counts boots): a HELLO at seq 0 is
/// still a new boot, and each boot, starting with tracing off, is enabled
/// again by the bridge, as the session still runs. Without either, the
/// later boots' chunks went into the first boot's sequences, or nothing
/// of them was written.
#[test]
fn bridge_keeps_boots_apart_when_the_boot_id_repeats() {
    let env = Env::with_service("shmtrace-bridge-reset-same-id-", ServiceImpl::Ours);
    let (done, summary, trace) = tcp_run(
        &env,
        &[
            "--iterations",
            "300",
            "--large-every",
            "50",
            "--rate",
            "3000",
            "--reset-after",
            "100",
            "--repeat-boot-id",
        ],
        "reset-same-id",
    );
    assert_restarts_marked(&summary);
    check_restarted(&env, &trace, emitted(&done), 3, "reset-same-id");
}

/// A firmware that traces from boot on (no `--wait-enabled`: tracing is on
/// before the bridge connects), recorded session after session through
/// the bridge: no packet written outside a session reaches one, so every
/// trace passes `inspect --check` (see `serve_attach_records_an_always_on_
/// firmware_session_after_session` for shared RAM).
#[test]
fn bridge_records_an_always_on_firmware_session_after_session() {
    let env = Env::with_service("shmtrace-bridge-always-on-", ServiceImpl::Ours);
    let mut firmware = env.firmware(
        "always-on",
        &args(&[
            "stream",
            "--listen",
            "0",
            "--iterations",
            "1000000",
            "--rate",
            "4000",
        ]),
    );
    let listening = firmware
        .expect_event("listening", TIMEOUT)
        .expect("listening");
    let port = listening["port"].as_u64().expect("port");
    let _bridge = env.bridge(&format!("tcp:127.0.0.1:{port}"), &[]);
    firmware.expect_event("ready", TIMEOUT).expect("ready");
    env.wait_registered();
    sessions_pass_inspect(&env, 3);
}

/// A bridge killed with SIGKILL mid-packet: a firmware chunk whose last
/// packet continues on the next chunk was forwarded, the next never was.
/// The service, seeing the producer gone, gives the rest up and marks the
/// loss on the bridge's sequence after its last packet (an empty packet:
/// nothing else follows on it); `inspect --check` passes and counts the
/// mark. Before that mark the trace said nothing was lost. (What a killed
/// bridge held in its own memory, or had not yet read, no service can see:
/// a producer that exits between packets looks the same.)
#[test]
fn a_bridge_killed_mid_packet_leaves_a_loss_mark() {
    use shmtrace_abi::frame::{FrameEncoder, Hello};
    use shmtrace_abi::layout::{ChunkFlags, Packets, PageSize};
    use shmtrace_abi::region::Name;
    use std::io::Write as _;
    use std::time::{Duration, Instant};

    let env = Env::with_service("shmtrace-bridge-killed-", ServiceImpl::Ours);
    let fifo = env.fifo("uart");
    let mut bridge = env.bridge(fifo.to_str().unwrap(), &[]);
    let mut uart = std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("the FIFO's write end");
    let mut enc = FrameEncoder::new();
    let mut wire = Vec::new();
    let mut send = |frame: &dyn Fn(&mut FrameEncoder, &mut Vec<u8>)| {
        wire.clear();
        frame(&mut enc, &mut wire);
        uart.write_all(&wire).expect("write");
    };
    let hello = Hello {
        version: shmtrace_abi::frame::VERSION,
        boot_id: 1,
        clock_id: 65,
        page_size: PageSize::DEFAULT.get() as u32,
        flags: 0,
        data_source: Name::new(DATA_SOURCE).unwrap(),
        producer: Name::new("killed-mcu").unwrap(),
    };
    send(&|e, w| e.hello(&hello, &mut |b: &[u8]| w.extend_from_slice(b)));
    send(&|e, w| e.clock(1_000_000, 0, &mut |b: &[u8]| w.extend_from_slice(b)));
    env.wait_registered();
    let consumer = env.start_consumer();
    bridge.expect_event("enabled", TIMEOUT).expect("started");
    // Chunk 0 of writer 1: a whole packet (a bare timestamp), then the
    // start of one that continues on chunk 1.
    let mut chunk = 0u32.to_le_bytes().to_vec();
    chunk.extend_from_slice(&1u16.to_le_bytes());
    let packets = Packets::new(2, ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK).unwrap();
    chunk.extend_from_slice(&packets.bits().to_le_bytes());
    chunk.extend_from_slice(&[2, 0x40, 0x64, 2, 0x40, 0x65]);
    send(&|e, w| e.clock(2_000_000, 0, &mut |b: &[u8]| w.extend_from_slice(b)));
    send(&|e, w| e.chunk(&chunk, &mut |b: &[u8]| w.extend_from_slice(b)));
    // Read by the bridge (nothing left in the FIFO), and forwarded.
    let deadline = Instant::now() + TIMEOUT;
    while rustix::io::ioctl_fionread(&uart).expect("FIONREAD") > 0 {
        assert!(Instant::now() < deadline, "the bridge never read");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    bridge.kill(TIMEOUT).expect("SIGKILL");
    scenario::query_until(&env.consumer_socket, "the bridge gone", |s| {
        s["data_sources"]
            .as_array()
            .is_none_or(|d| !d.iter().any(|d| d["name"] == DATA_SOURCE))
    });
    let trace = env.stop_consumer(consumer);
    drop(uart);

    let analysis = inspect_passes(&trace);
    let loss = &analysis["loss"];
    assert_eq!(loss["loss_marks"], 1, "{analysis}");
    // PRESENT | REASSEMBLY_GAP (Perfetto's DataLossReason bits).
    assert_eq!(loss["loss_reasons"], 1 | 16, "{analysis}");
}

/// A TCP firmware that runs 300 iterations with its writers' last chunks
/// left open (`--leave-open`: uncommitted, as a firmware's between two
/// flushes), recorded by `sessions` sessions, all started before its first
/// event; returns the firmware, the bridge, the consumers (named `s1`,
/// `s2`, ...) and the firmware's done report.
fn left_open_run(
    env: &Env,
    label: &str,
    sessions: usize,
) -> (
    shmtrace_tests::process::ChildProcess,
    shmtrace_tests::process::ChildProcess,
    Vec<shmtrace_tests::process::ChildProcess>,
    serde_json::Value,
) {
    let go = env.path(&format!("{label}.go"));
    let mut firmware = env.firmware(
        label,
        &args(&[
            "stream",
            "--listen",
            "0",
            "--wait-enabled",
            "--go-file",
            go.to_str().expect("a path"),
            "--leave-open",
            "--iterations",
            "300",
            "--large-every",
            "50",
            "--rate",
            "3000",
        ]),
    );
    let port = firmware
        .expect_event("listening", TIMEOUT)
        .expect("listening")["port"]
        .as_u64()
        .expect("port");
    let bridge = env.bridge(&format!("tcp:127.0.0.1:{port}"), &[]);
    firmware.expect_event("ready", TIMEOUT).expect("ready");
    env.wait_registered();
    let consumers: Vec<_> = (1..=sessions)
        .map(|n| env.start_consumer_named(&format!("s{n}")))
        .collect();
    firmware.expect_event("enabled", TIMEOUT).expect("enabled");
    std::fs::write(&go, b"").expect("go");
    let done = firmware.expect_event("done", TIMEOUT).expect("done");
    // Everything committed was sent and read.
    std::thread::sleep(std::time::Duration::from_millis(500));
    (firmware, bridge, consumers, done)
}

/// Both firmware sequences of `trace`, each with `marks` loss marks and
/// its start; `inspect --check` passes. Returns the marks it counts.
fn assert_firmware_sequences(
    trace: &std::path::Path,
    report: &checker::TraceReport,
    marks: u64,
) -> u64 {
    let sequences: Vec<_> = report.track_event_sequences().collect();
    assert_eq!(sequences.len(), 2, "{sequences:?}");
    assert!(
        sequences
            .iter()
            .all(|s| s.loss_marks == marks && !s.start_lost),
        "{sequences:?}"
    );
    let analysis = inspect_passes(trace);
    analysis["loss"]["loss_marks"]
        .as_u64()
        .unwrap_or_else(|| panic!("{analysis}"))
}

/// The firmware's link lost while a session records (the firmware process
/// SIGKILLed with its writers' last chunks open): the bridge's TCP input
/// ends, and it marks the boot's two sequences, says so in its summary and
/// exits 0. Before, the open chunks' events were missing with no mark in
/// the trace, and the summary said nothing was lost.
#[test]
fn a_tcp_link_lost_mid_session_is_marked() {
    let env = Env::with_service("shmtrace-bridge-link-lost-", ServiceImpl::Ours);
    let (mut firmware, mut bridge, mut consumers, done) = left_open_run(&env, "link-lost", 1);
    firmware.kill(TIMEOUT).expect("SIGKILL");
    let summary = bridge
        .expect_event("summary", TIMEOUT)
        .expect("the bridge's summary at the end of its input");
    bridge.expect_success(TIMEOUT).expect("the bridge exits 0");
    assert_counters(
        &summary,
        "engine",
        &[("links_lost_mid_session", 1), ("trailing_losses_marked", 2)],
    );
    assert_eq!(summary["lost_anything"], true, "{summary}");
    assert!(bridge.stderr_contains("ended while 1 session(s) recorded it"));

    let trace = env.stop_consumer_named(consumers.remove(0), "s1");
    let emitted = emitted(&done);
    let report = check(&env, &trace, emitted, Loss::Allowed, "link-lost");
    report.assert_ok("link-lost");
    assert!(
        report.totals.track_events() < emitted.track_events(),
        "the open chunks' events never came: {:?} of {emitted:?}",
        report.totals
    );
    // The bridge's marks, and the service's on the large events' writer,
    // whose last packet's end was in its open chunk (REASSEMBLY_GAP).
    assert_eq!(assert_firmware_sequences(&trace, &report, 1), 3);
}

/// Two sessions; the first stops while the second runs on, disabled with
/// no flush first (a consumer's DisableTracing alone). The data source's
/// stop asks the firmware to flush (without disabling it), as a Perfetto
/// SDK's writers commit their chunks when theirs stops, so the session
/// gets every event, those of the writers' open chunks too (before, only
/// the last session's stop flushed: the first session's trace missed
/// them, unmarked). The second, stopped last, gets every event too.
#[test]
fn a_session_that_stops_while_another_runs_gets_the_open_chunks() {
    let env = Env::with_service("shmtrace-bridge-two-sessions-", ServiceImpl::Ours);
    let (firmware, bridge, mut consumers, done) = left_open_run(&env, "two-sessions", 2);
    let second = consumers.pop().expect("two consumers");
    let mut first = consumers.pop().expect("two consumers");
    first.send_line("disable").expect("disable");
    first.expect_event("done", TIMEOUT).expect("the trace");
    let first = env.path("s1.pftrace");
    let emitted = emitted(&done);
    let report = check(&env, &first, emitted, Loss::None, "first-session");
    report.assert_ok("first-session");
    assert_eq!(report.totals, emitted, "the first session: every event");
    assert_eq!(assert_firmware_sequences(&first, &report, 0), 0);
    // The firmware was not disabled: the second session still records.
    let second = env.stop_consumer_named(second, "s2");
    let report = check(&env, &second, emitted, Loss::None, "second-session");
    report.assert_ok("second-session");
    assert_eq!(report.totals, emitted, "the second session: every event");
    assert_eq!(assert_firmware_sequences(&second, &report, 0), 0);
    let summary = bridge_summary(bridge);
    assert_eq!(summary["lost_anything"], false, "{summary}");
    drop(firmware);
}

/// The bridge stopped (its stdin closed, as Ctrl-C does) while a session
/// records: it disables and flushes the firmware first, so the session
/// gets every event, those of the open chunks too, and no loss mark
/// (before: the open chunks' events were missing, unmarked).
#[test]
fn a_bridge_stopped_mid_session_flushes_the_firmware_first() {
    let env = Env::with_service("shmtrace-bridge-stopped-", ServiceImpl::Ours);
    let (firmware, mut bridge, mut consumers, done) = left_open_run(&env, "stopped", 1);
    bridge.close_stdin();
    bridge
        .expect_event("disabled", TIMEOUT)
        .expect("the bridge disables the firmware before it goes");
    let summary = bridge.expect_event("summary", TIMEOUT).expect("summary");
    bridge.expect_success(TIMEOUT).expect("the bridge exits 0");
    assert_eq!(summary["lost_anything"], false, "{summary}");
    assert_counters(&summary, "engine", &[("links_lost_mid_session", 0)]);
    drop(firmware);
    let trace = env.stop_consumer_named(consumers.remove(0), "s1");
    let emitted = emitted(&done);
    let report = check(&env, &trace, emitted, Loss::None, "stopped");
    report.assert_ok("stopped");
    assert_eq!(report.totals, emitted, "every event");
    assert_eq!(assert_firmware_sequences(&trace, &report, 0), 0);
}

/// A firmware that restarts right after answering the last session's stop
/// flush, its new boot's HELLO in the same TCP segment as that answer:
/// the flush was done before the restart, so the session lost nothing to
/// it (before: the hello was taken while the session still ran, and the
/// old boot's sequence was marked lost in it).
#[test]
fn a_restart_right_after_the_last_stop_s_flush_is_not_marked() {
    use shmtrace_abi::frame::{Frame, FrameDecoder, FrameEncoder, Hello};
    use shmtrace_abi::layout::{ChunkFlags, Packets, PageSize};
    use shmtrace_abi::region::Name;
    use std::io::{Read as _, Write as _};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let env = Env::with_service("shmtrace-bridge-restart-after-stop-", ServiceImpl::Ours);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("port").port();
    let mut bridge = env.bridge(&format!("tcp:127.0.0.1:{port}"), &[]);
    let (mut uart, _) = listener.accept().expect("the bridge connects");
    let hello = |boot_id| Hello {
        version: shmtrace_abi::frame::VERSION,
        boot_id,
        clock_id: 65,
        page_size: PageSize::DEFAULT.get() as u32,
        flags: 0,
        data_source: Name::new(DATA_SOURCE).unwrap(),
        producer: Name::new("restarting-mcu").unwrap(),
    };
    let t0 = std::time::Instant::now();
    let now = move || 1_000_000_000 + t0.elapsed().as_nanos() as u64;
    let mut enc = FrameEncoder::new();
    let mut wire = Vec::new();
    enc.hello(&hello(1), &mut |b: &[u8]| wire.extend_from_slice(b));
    enc.clock(now(), 0, &mut |b: &[u8]| wire.extend_from_slice(b));
    uart.write_all(&wire).expect("hello");

    // The firmware's side: every SYNC answered; the first ENABLE answered
    // with a chunk (writer 1, two whole packets); the SYNC of the flush
    // after a DISABLE that follows it with the answer and boot 2's HELLO,
    // in one write.
    let restarted = Arc::new(AtomicBool::new(false));
    let firmware = {
        let restarted = restarted.clone();
        let mut reader = uart.try_clone().expect("clone");
        std::thread::spawn(move || {
            let mut decoder = FrameDecoder::new(vec![0u8; 256]);
            let (mut enabled, mut disabled_after) = (false, false);
            let mut bytes = [0u8; 256];
            loop {
                let n = match reader.read(&mut bytes) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let mut input = &bytes[..n];
                let mut frames = Vec::new();
                while !input.is_empty() {
                    let (used, f) = decoder.push(input);
                    input = &input[used..];
                    if let Some(Ok(f)) = f.map(|f| f.parse()) {
                        frames.push(match f {
                            Frame::Enable => (1, 0),
                            Frame::Disable => (2, 0),
                            Frame::Sync(nonce) => (5, nonce),
                            _ => (0, 0),
                        });
                    }
                }
                for (what, nonce) in frames {
                    let mut wire = Vec::new();
                    match what {
                        1 if !enabled => {
                            enabled = true;
                            let mut chunk = 0u32.to_le_bytes().to_vec();
                            chunk.extend_from_slice(&1u16.to_le_bytes());
                            let packets = Packets::new(2, ChunkFlags::EMPTY).unwrap();
                            chunk.extend_from_slice(&packets.bits().to_le_bytes());
                            chunk.extend_from_slice(&[2, 0x40, 0x64, 2, 0x40, 0x65]);
                            enc.chunk(&chunk, &mut |b: &[u8]| wire.extend_from_slice(b));
                        }
                        2 if enabled => disabled_after = true,
                        5 => {
                            enc.clock(now(), nonce, &mut |b: &[u8]| wire.extend_from_slice(b));
                            if disabled_after && !restarted.swap(true, Ordering::Relaxed) {
                                // A reset: frames from seq 0 again.
                                enc = FrameEncoder::new();
                                enc.hello(&hello(2), &mut |b: &[u8]| wire.extend_from_slice(b));
                            }
                        }
                        _ => {}
                    }
                    if !wire.is_empty() && uart.write_all(&wire).is_err() {
                        return;
                    }
                }
            }
        })
    };
    env.wait_registered();
    let consumer = env.start_consumer();
    bridge.expect_event("enabled", TIMEOUT).expect("enabled");
    let trace = env.stop_consumer(consumer);
    assert!(restarted.load(Ordering::Relaxed), "the firmware restarted");
    let summary = bridge_summary(bridge);
    let _ = firmware.join();
    assert_counters(
        &summary,
        "engine",
        &[
            ("boots", 2),
            ("chunks_forwarded", 1),
            ("restarts_mid_session", 0),
            ("trailing_losses_marked", 0),
        ],
    );
    assert_eq!(summary["lost_anything"], false, "{summary}");
    let analysis = inspect_passes(&trace);
    assert_eq!(analysis["loss"]["loss_marks"], 0, "{}", analysis["loss"]);
}
