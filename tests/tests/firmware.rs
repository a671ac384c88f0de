//! The Cortex-M4 firmware example under QEMU (`mps2-an386`) traced live,
//! with a host producer on the same timeline (issue 17 item 5):
//!
//! * `firmware_shared_ram_into_our_service`: the `attach` binary's region
//!   lies in PSRAM, which QEMU backs with a file; `shmtrace serve --attach
//!   FILE@OFFSET` records it; `shmtrace record` is the consumer, our
//!   `interop_producer` the host producer.
//! * `firmware_stream_bridge_into_the_real_service`: the `stream` binary
//!   sends its chunks as frames on UART0 (QEMU `-serial tcp:...,server=on`);
//!   `shmtrace bridge --input tcp:...` forwards them to the real Perfetto
//!   service (`real-service`), with the real consumer and the real SDK
//!   producer.
//! * `firmware_stream_bridge_into_our_service`: the same into `shmtrace
//!   serve`, with `shmtrace record` and `interop_producer`;
//!   `firmware_stream_bridge_started_late_into_our_service` starts the
//!   bridge after the firmware said its first HELLO (QEMU's `wait=off`).
//! * `firmware_stream_board_reset_mid_session`,
//!   `firmware_stream_board_reset_while_writing`: the stream firmware reset
//!   (QEMU's monitor `system_reset`) while the session runs, after its
//!   first boot finished writing or while it writes; described at
//!   `board_reset_mid_session`.
//! * `firmware_readme_walkthrough`: the README's "Tracing firmware" section
//!   run as a reader would (a crate of its own, the README's code and
//!   commands as written); described at the test.
//!
//! The firmware writes nothing until the session enables its data source
//! (plain `track_event`, which the session's track event config enables
//! along with the host producer's), then writes from its main loop and its
//! SysTick interrupt (two sequences) until the test says finish, and
//! reports exactly what it wrote. Meanwhile the test stores host marks in
//! the firmware's mailbox (in the PSRAM file), noting BOOTTIME before each
//! store and after the firmware's acknowledgement; the firmware stamps an
//! instant `host_mark` when it reads one. After the session:
//!
//! * `check_trace.py` finds exactly the events the firmware and the host
//!   producer reported, per producer, no loss, and `shmtrace inspect
//!   --check` passes;
//! * every firmware event's time resolves to BOOTTIME (the firmware stamps
//!   its own clock 65; the bridge injects the ClockSnapshot relating it)
//!   and lies inside the session, the firmware's and the host's events
//!   interleave in time;
//! * each `host_mark` instant lies inside its mark's window, give or take
//!   [`ALIGNMENT_TOLERANCE_NS`]: the clock alignment error, printed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Deserialize;
use shmtrace_tests::checker::{self, EventCounts, Expectation, Loss, ProducerExpectation};
use shmtrace_tests::config::{self, FillPolicy, TraceConfig};
use shmtrace_tests::firmware::{self, Mailbox, MarkWindow, Qemu, Timeline, Uart};
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{
    self, ConsumerImpl, ProducerImpl, ProducerSpec, RealBinaries, ServiceImpl,
};
use shmtrace_tests::walkthrough;

/// How long any one step may take.
const TIMEOUT: Duration = Duration::from_secs(20);
/// Host marks per test, and the pause between two.
const MARKS: u8 = 8;
const MARK_PAUSE: Duration = Duration::from_millis(40);
/// How far outside its window a mark's instant may lie: the bridge's
/// clock relation is as good as half its best sync round trip, on a
/// machine whose two cores run QEMU, the bridge, the service and other
/// tests (measured: within 1.5 ms; Nagle's algorithm on QEMU's TCP serial
/// skewed it by 17 ms).
const ALIGNMENT_TOLERANCE_NS: i64 = 10_000_000;
/// How long the bridge runs before the session starts.
const BRIDGE_SETTLE: Duration = Duration::from_secs(3);
/// The firmware's producer name (its region's, the bridge's).
const FIRMWARE_PRODUCER: &str = "shmtrace-firmware-example";
/// The host producer's events: 1 thread, 120 iterations 5 ms apart.
const HOST_PRODUCER: ProducerSpec = ProducerSpec {
    threads: 1,
    iterations: 120,
    phases: 1,
    large_kb: 0,
    large_every: 10,
    iteration_sleep_us: 5_000,
    shmem_kb: 0,
    sessions: 1,
    custom_source: false,
    fidelity: false,
    process_name: None,
    machine: 0,
    implementation: None,
};

/// How the firmware reaches the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// Shared RAM, read by `shmtrace serve --attach`.
    Attach,
    /// UART frames over TCP, read by `shmtrace bridge`.
    Stream,
    /// The same, with the bridge started [`LATE_BRIDGE`] after the
    /// firmware (QEMU does not wait for it), so the firmware's first
    /// HELLO went nowhere: as a board that boots before its host listens.
    StreamLate,
}

/// How long after the firmware's start `Transport::StreamLate` starts the
/// bridge: past one of the firmware's periodic HELLOs (every second).
const LATE_BRIDGE: Duration = Duration::from_millis(1_500);

/// What the firmware reported when it finished.
#[derive(Debug, Clone, Deserialize)]
struct Done {
    emitted: EventCounts,
    marks: u32,
    rounds: u32,
    lost: u64,
}

fn firmware_into_a_trace(
    transport: Transport,
    service: ServiceImpl,
    producer: ProducerImpl,
    consumer: ConsumerImpl,
) {
    let (elf_dir, bins, dir) = setup("shmtrace-firmware-");
    let path = |name: &str| dir.path().join(name);
    let (producer_socket, consumer_socket) = (path("p.sock"), path("c.sock"));

    // The service and the firmware, connected by the bridge.
    let (mut qemu, ready, mailbox, mut service_process, mut bridge) = match transport {
        Transport::Attach => {
            assert_eq!(service, ServiceImpl::Ours, "only our service attaches");
            let mut qemu =
                Qemu::start(&elf_dir, "attach", dir.path(), Uart::None).expect("QEMU starts");
            let (ready, mailbox) = qemu.ready().expect("the firmware is ready");
            let attach = format!("{}@{}", qemu.psram.display(), ready.region_offset());
            let service = start_our_service(
                dir.path(),
                &producer_socket,
                &consumer_socket,
                &["--attach", &attach],
            );
            (qemu, ready, mailbox, service, None)
        }
        Transport::Stream | Transport::StreamLate => {
            let late = transport == Transport::StreamLate;
            let service_process = match service {
                ServiceImpl::Ours => {
                    start_our_service(dir.path(), &producer_socket, &consumer_socket, &[])
                }
                ServiceImpl::Real => scenario::start_service(
                    service,
                    &bins,
                    dir.path(),
                    &producer_socket,
                    &consumer_socket,
                )
                .expect("the service starts"),
            };
            let (mut qemu, port) =
                Qemu::start_serving(&elf_dir, "stream", dir.path(), !late).expect("QEMU starts");
            let early = if late {
                let ready = qemu.ready().expect("the firmware is ready");
                std::thread::sleep(LATE_BRIDGE);
                Some(ready)
            } else {
                None
            };
            let bridge = start_bridge(dir.path(), port, &producer_socket);
            let (ready, mailbox) = match early {
                Some(ready) => ready,
                None => qemu.ready().expect("the firmware is ready"),
            };
            (qemu, ready, mailbox, service_process, Some(bridge))
        }
    };
    let mode = match transport {
        Transport::Attach => "attach",
        Transport::Stream | Transport::StreamLate => "stream",
    };
    assert_eq!(ready.mode, mode);
    assert_eq!(ready.region_offset(), 0, "the region is at PSRAM offset 0");
    assert!(ready.region_size > 0);

    // A bridge runs long before a session starts: it has sampled the
    // firmware's clock a few times (once a second) and keeps the best
    // sample. (Under QEMU a UART's input reaches the firmware a byte per
    // main loop turn: a SYNC's round trip takes 1 to 60 ms, so one sample
    // alone can be off by tens of milliseconds, within its stated bound.)
    std::thread::sleep(BRIDGE_SETTLE);
    let mut host = start_host_producer(producer, &bins, dir.path(), &producer_socket);
    // Both producers have registered track_event before the session starts.
    let state = scenario::query_until(
        &consumer_socket,
        "the firmware's and the host's producer",
        |s| {
            let firmware = s["producers"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == FIRMWARE_PRODUCER);
            let track_event = s["data_sources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["name"] == "track_event")
                .count();
            firmware.is_some() && track_event >= 2
        },
    );
    let firmware_pid = state["producers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == FIRMWARE_PRODUCER)
        .and_then(|p| p["pid"].as_u64())
        .and_then(|p| u32::try_from(p).ok())
        .filter(|&p| p > 0)
        .unwrap_or_else(|| panic!("the firmware's producer has no pid: {state}"));
    if let Some(bridge) = &bridge {
        assert_eq!(
            firmware_pid,
            bridge.pid(),
            "the bridge is the firmware's producer"
        );
    }

    let trace_config =
        TraceConfig::track_event(8 * 1024, FillPolicy::Discard, &["interop", "interop.*"]);
    std::fs::write(path("config.pb"), config::encode(&trace_config)).expect("write config");
    let trace = path("trace.pftrace");
    let session_start = firmware::boottime_ns();
    let mut consumer_process =
        start_consumer(consumer, &bins, dir.path(), &consumer_socket, &trace);

    qemu.process
        .expect_event("enabled", TIMEOUT)
        .expect("the firmware is enabled");
    host.expect_event("enabled", TIMEOUT)
        .expect("the host producer is enabled");
    let mut windows = Vec::new();
    for mark in 1..=MARKS {
        windows.push(
            mailbox
                .mark(mark, TIMEOUT)
                .expect("the firmware sees the mark"),
        );
        std::thread::sleep(MARK_PAUSE);
    }
    let host_phase = host
        .expect_event("phase", TIMEOUT)
        .expect("the host producer's phase");
    let done = finish(&mut qemu, &mailbox);
    assert_eq!(done.marks, u32::from(MARKS));
    assert!(
        done.rounds >= 100,
        "the firmware wrote for long enough: {done:?}"
    );

    // Stop the session: the service flushes the bridge, which flushes the
    // firmware.
    match consumer {
        ConsumerImpl::Real => consumer_process.send_line("stop").expect("stop"),
        ConsumerImpl::OurCli => scenario::interrupt(&consumer_process).expect("Ctrl-C"),
    }
    consumer_process
        .expect_event("done", TIMEOUT)
        .expect("the trace");
    consumer_process.close_stdin();
    consumer_process
        .expect_success(TIMEOUT)
        .expect("the consumer exits");
    let session_end = firmware::boottime_ns();
    host.expect_event("stopped", TIMEOUT)
        .expect("the host producer stops");
    host.expect_success(TIMEOUT)
        .expect("the host producer exits");
    // The host side goes first: a firmware (QEMU) that exits while the
    // bridge's last requests wait unread in its socket resets the
    // connection, and the bridge would report a failed input. The
    // bridge's own account (`--json`) gives its clock estimate's bound.
    let stated_bound = bridge.as_mut().map(|bridge| {
        bridge.close_stdin();
        let summary = bridge
            .expect_event("summary", TIMEOUT)
            .expect("the bridge's summary");
        bridge.expect_success(TIMEOUT).expect("the bridge exits 0");
        summary["clock"]["bound_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("the bridge has a clock estimate: {summary}"))
    });
    service_process.close_stdin();
    service_process
        .expect_success(TIMEOUT)
        .expect("the service exits 0");
    mailbox.exit().expect("exit");
    let exit = qemu
        .process
        .expect_event("exit", TIMEOUT)
        .expect("the firmware exits");
    assert_eq!(exit["lost"], 0, "{exit}");
    qemu.process.expect_success(TIMEOUT).expect("QEMU exits 0");

    // The trace holds exactly what both producers reported.
    let host_emitted: EventCounts =
        serde_json::from_value(host_phase["emitted"].clone()).expect("host counts");
    assert_eq!(
        host_emitted.skipped_disabled, 0,
        "the host producer ran inside the session"
    );
    let expect = Expectation {
        producers: vec![
            ProducerExpectation {
                pid: Some(firmware_pid),
                emitted: done.emitted,
            },
            ProducerExpectation {
                pid: Some(host.pid()),
                emitted: host_emitted,
            },
        ],
        loss: Loss::None,
        require_trace_stats: true,
        require_service_packets: true,
        remote_producers: false,
    };
    let label = format!("firmware-{transport:?}-{service:?}");
    let report = checker::check(std::slice::from_ref(&trace), &expect, dir.path(), &label)
        .expect("the checker runs");
    report.assert_ok(&label);
    let firmware_sequences: Vec<_> = report
        .track_event_sequences()
        .filter(|s| s.pids == [firmware_pid])
        .collect();
    assert_eq!(
        firmware_sequences.len(),
        2,
        "the main loop's and the interrupt's sequences: {:?}",
        report.sequences
    );
    assert!(firmware_sequences
        .iter()
        .all(|s| !s.start_lost && s.loss_marks == 0));
    let inspected = scenario::inspect(std::slice::from_ref(&trace)).expect("shmtrace inspect runs");
    assert!(
        inspected.ok,
        "shmtrace inspect --check: {}",
        inspected.analysis
    );

    // One timeline.
    let timeline =
        firmware::timeline(&[trace], &["host_mark"], dir.path(), &label).expect("the timeline");
    let alignment = check_timeline(
        &timeline,
        firmware_pid,
        host.pid(),
        (session_start, session_end),
        &windows,
    );
    println!(
        "{label}: {} firmware and {} host events; mark instants vs host windows: {alignment}{}",
        done.emitted.track_events(),
        host_emitted.track_events(),
        stated_bound.map_or(String::new(), |b| format!(
            "; the bridge's stated bound {:.3} ms",
            b as f64 / 1e6
        )),
    );
    drop(qemu);
}

/// Checks the firmware's and the host's events lie on one timeline (see the
/// module docs); returns the alignment measured, for printing.
fn check_timeline(
    timeline: &Timeline,
    firmware_pid: u32,
    host_pid: u32,
    session: (u64, u64),
    windows: &[MarkWindow],
) -> String {
    let firmware = &timeline.producers[&firmware_pid];
    let host = &timeline.producers[&host_pid];
    assert_eq!(
        firmware.unresolved, 0,
        "every firmware time resolves to BOOTTIME"
    );
    assert_eq!(host.unresolved, 0);
    let (first, last) = (firmware.times[0], firmware.times[firmware.times.len() - 1]);
    assert!(
        session.0 <= first && last <= session.1,
        "firmware events from {first} to {last} ns lie inside the session {session:?}"
    );
    // Merged in time, the two producers take turns: the host writes an
    // iteration every 5 ms, the firmware a round every 0.5 ms.
    let mut merged: Vec<(u64, bool)> = firmware
        .times
        .iter()
        .map(|&t| (t, true))
        .chain(host.times.iter().map(|&t| (t, false)))
        .collect();
    merged.sort_unstable();
    let turns = merged.windows(2).filter(|w| w[0].1 != w[1].1).count();
    let host_iterations = HOST_PRODUCER.iterations as usize;
    assert!(
        turns >= host_iterations,
        "firmware and host events interleave: {turns} turns between them, expected at least \
         one per host iteration ({host_iterations})"
    );

    // Each mark's instant, placed by the bridge's clock relation, against
    // the window in which the firmware read its clock.
    let instants = &timeline.named["host_mark"];
    assert_eq!(
        instants.len(),
        windows.len(),
        "one instant per mark: {instants:?}"
    );
    let mut errors = Vec::new();
    for w in windows {
        let instant = instants
            .iter()
            .find(|i| i.args.get("mark").and_then(|v| v.as_u64()) == Some(u64::from(w.mark)))
            .unwrap_or_else(|| panic!("no host_mark instant for mark {}: {instants:?}", w.mark));
        assert_eq!(instant.pid, firmware_pid);
        let ts = instant.ts as i64;
        let (before, after) = (w.before_ns as i64, w.after_ns as i64);
        // 0 inside the window, else how far outside.
        let outside = if ts < before {
            ts - before
        } else if ts > after {
            ts - after
        } else {
            0
        };
        errors.push((ts - before, after - before, outside));
    }
    let worst = errors.iter().map(|e| e.2.abs()).max().unwrap_or(0);
    let width = errors.iter().map(|e| e.1).max().unwrap_or(0);
    let summary = format!(
        "worst {worst} ns outside its window, windows up to {width} ns wide; (instant - store, \
         window) in us: {}",
        errors
            .iter()
            .map(|(d, w, _)| format!("({:.1}, {:.1})", *d as f64 / 1e3, *w as f64 / 1e3))
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(
        worst <= ALIGNMENT_TOLERANCE_NS,
        "each firmware host_mark instant lies within {ALIGNMENT_TOLERANCE_NS} ns of the window \
         the host stored its mark in: {summary}"
    );
    summary
}

/// The test's directory: removed when the test passes, kept (and named on
/// stderr) when it fails, with every process's stderr log in it.
struct WorkDir(Option<tempfile::TempDir>);

impl WorkDir {
    fn path(&self) -> &Path {
        self.0.as_ref().map_or(Path::new("/"), |d| d.path())
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let (true, Some(dir)) = (std::thread::panicking(), self.0.take()) {
            eprintln!("kept the failed run's directory {}", dir.keep().display());
        }
    }
}

/// The checker's environment, the firmware's binaries' directory, the
/// real binaries and a work directory named `prefix`...
fn setup(prefix: &str) -> (PathBuf, RealBinaries, WorkDir) {
    checker::ensure_environment().expect("the checker's python environment");
    let elf_dir = firmware::build().expect("the firmware builds");
    let dir = WorkDir(Some(
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/tmp")
            .expect("tempdir"),
    ));
    (elf_dir, real_binaries!(), dir)
}

/// Tells the firmware to finish; its counts, having lost nothing.
fn finish(qemu: &mut Qemu, mailbox: &Mailbox) -> Done {
    mailbox.finish().expect("finish");
    let done = qemu
        .process
        .expect_event("done", TIMEOUT)
        .expect("the firmware's counts");
    let done: Done = serde_json::from_value(done).expect("the firmware's done line");
    assert_eq!(done.lost, 0, "the firmware lost nothing: {done:?}");
    done
}

/// `shmtrace serve` with `extra` flags, ready.
fn start_our_service(
    dir: &Path,
    producer_socket: &Path,
    consumer_socket: &Path,
    extra: &[&str],
) -> ChildProcess {
    let mut command = Command::new(scenario::shmtrace_binary().expect("shmtrace"));
    command
        .args([
            "serve",
            "--notify-ready",
            "--log-level",
            "warn",
            "--exit-on-stdin-eof",
        ])
        .arg("--producer-socket")
        .arg(producer_socket)
        .arg("--consumer-socket")
        .arg(consumer_socket)
        .args(extra);
    let mut service = ChildProcess::spawn("service", command, dir).expect("spawn shmtrace serve");
    service
        .expect_event("ready", TIMEOUT)
        .expect("shmtrace serve is ready");
    service
}

/// `shmtrace bridge --json` from the firmware's UART at TCP `port`.
fn start_bridge(dir: &Path, port: u16, producer_socket: &Path) -> ChildProcess {
    let mut command = Command::new(scenario::shmtrace_binary().expect("shmtrace"));
    command
        .args([
            "bridge",
            "--json",
            "--log-level",
            "warn",
            "--exit-on-stdin-eof",
        ])
        .arg("--input")
        .arg(format!("tcp:127.0.0.1:{port}"))
        .arg("--socket")
        .arg(producer_socket);
    ChildProcess::spawn("shmtrace bridge", command, dir).expect("spawn shmtrace bridge")
}

fn start_host_producer(
    which: ProducerImpl,
    bins: &RealBinaries,
    dir: &Path,
    producer_socket: &Path,
) -> ChildProcess {
    scenario::start_producer(which, bins, dir, 0, &HOST_PRODUCER, producer_socket)
        .expect("the host producer starts")
}

fn start_consumer(
    which: ConsumerImpl,
    bins: &RealBinaries,
    dir: &Path,
    consumer_socket: &Path,
    trace: &PathBuf,
) -> ChildProcess {
    let config = dir.join("config.pb");
    let mut command = match which {
        ConsumerImpl::Real => {
            let mut command = Command::new(&bins.consumer);
            command
                .arg("--socket")
                .arg(consumer_socket)
                .arg("--config")
                .arg(&config)
                .arg("--out")
                .arg(trace)
                .arg("--timeout-ms=60000");
            command
        }
        ConsumerImpl::OurCli => {
            let mut command = Command::new(scenario::shmtrace_binary().expect("shmtrace"));
            command
                .args(["record", "--progress", "json", "--socket"])
                .arg(consumer_socket)
                .arg("-c")
                .arg(&config)
                .arg("-o")
                .arg(trace);
            command
        }
    };
    command.current_dir(dir);
    ChildProcess::spawn("consumer", command, dir).expect("spawn the consumer")
}

#[test]
fn firmware_shared_ram_into_our_service() {
    firmware_into_a_trace(
        Transport::Attach,
        ServiceImpl::Ours,
        ProducerImpl::Ours,
        ConsumerImpl::OurCli,
    );
}

#[test]
fn firmware_stream_bridge_into_the_real_service() {
    firmware_into_a_trace(
        Transport::Stream,
        ServiceImpl::Real,
        ProducerImpl::Real,
        ConsumerImpl::Real,
    );
}

#[test]
fn firmware_stream_bridge_into_our_service() {
    firmware_into_a_trace(
        Transport::Stream,
        ServiceImpl::Ours,
        ProducerImpl::Ours,
        ConsumerImpl::OurCli,
    );
}

/// A board that booted before its host listened: the bridge learns the
/// boot from the HELLO the firmware repeats, and the session is complete.
#[test]
fn firmware_stream_bridge_started_late_into_our_service() {
    firmware_into_a_trace(
        Transport::StreamLate,
        ServiceImpl::Ours,
        ProducerImpl::Ours,
        ConsumerImpl::OurCli,
    );
}

/// `checker/timeline.py`'s own unit tests (golden trace and changed copies).
#[test]
fn timeline_unit_tests() {
    checker::python_unit_tests("test_timeline").unwrap_or_else(|e| panic!("{e}"));
}

/// How long one group of the README's commands may take (a cold build of
/// the walk-through's firmware among them).
const WALKTHROUGH_TIMEOUT: Duration = Duration::from_secs(900);

/// The README's "Tracing firmware" walk-through, as a reader follows it
/// (its blocks: `shmtrace_tests::walkthrough`): `cargo new` next to a
/// checkout of this repository, the README's files and patch written, its
/// commands run by bash as they stand, with `shmtrace` on the PATH as
/// `cargo install` puts it. Only what is the test's own differs: the
/// sockets (`PERFETTO_*_SOCK_NAME`) and the PSRAM file are in the test's
/// directory, the TCP port is a free one, the project starts from the
/// firmware example's `Cargo.lock` (its crate versions, no registry
/// update) and builds into a target dir kept between runs. Every trace
/// the commands write passes `inspect --check` (they run it as well) and
/// holds the firmware's slices, every interned name resolved. Then the
/// firmware it built reaches `main` at once under `-icount`
/// ([`readme_firmware_starts_at_once`]).
#[test]
fn firmware_readme_walkthrough() {
    firmware::check_qemu().unwrap_or_else(|e| panic!("{e}"));
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository");
    let readme = std::fs::read_to_string(repo.join("README.md")).expect("README.md");
    let steps = walkthrough::parse(&readme).expect("the README's walk-through");
    let dir = WorkDir(Some(
        tempfile::Builder::new()
            .prefix("shmtrace-readme-")
            .tempdir_in("/tmp")
            .expect("tempdir"),
    ));
    let root = dir.path().to_path_buf();
    std::os::unix::fs::symlink(&repo, root.join("shmtrace")).expect("the checkout");
    let bin = root.join("bin");
    std::fs::create_dir(&bin).expect("bin");
    let shmtrace = scenario::shmtrace_binary().expect("shmtrace");
    std::os::unix::fs::symlink(shmtrace, bin.join("shmtrace")).expect("shmtrace on the PATH");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let psram = root.join("fw-ram");
    let record = root.join("project");

    let mut project: Option<PathBuf> = None;
    let mut traces = Vec::new();
    for step in &steps {
        let project_dir = || {
            project
                .clone()
                .expect("a project made by the first commands")
        };
        match step {
            walkthrough::Step::File { path, append, text } => {
                let file = project_dir().join(path);
                std::fs::create_dir_all(file.parent().expect("a parent")).expect("mkdir");
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .append(*append)
                    .truncate(!*append)
                    .open(&file)
                    .expect("open");
                std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
            }
            walkthrough::Step::Patch { path, diff } => {
                let file = project_dir().join(path);
                let source = std::fs::read_to_string(&file).expect("the file to patch");
                let patched = walkthrough::apply_patch(&source, diff)
                    .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                std::fs::write(&file, patched).expect("write");
            }
            walkthrough::Step::Commands { group, script } => {
                let script = script.replace("/dev/shm/fw-ram", &psram.display().to_string());
                let cwd = project.clone().unwrap_or_else(|| root.clone());
                let run = |port: u16| -> shmtrace_tests::Result<()> {
                    let script = script.replace("127.0.0.1:4444", &format!("127.0.0.1:{port}"));
                    // All output to the log; background jobs stopped at the
                    // end, also when a command fails; the directory the
                    // commands end in is the project (`cd` in the first
                    // group).
                    let full = format!(
                        "exec 1>&2\ntrap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\n{script}\
                         pwd > '{}'\n",
                        record.display()
                    );
                    let mut command = Command::new("bash");
                    command
                        .args(["-e", "-c", &full])
                        .current_dir(&cwd)
                        .env("PATH", &path)
                        .env("PERFETTO_PRODUCER_SOCK_NAME", root.join("producer.sock"))
                        .env("PERFETTO_CONSUMER_SOCK_NAME", root.join("consumer.sock"))
                        .env_remove("RUSTFLAGS")
                        .env_remove("CARGO_ENCODED_RUSTFLAGS")
                        .env_remove("CARGO_BUILD_TARGET")
                        .env_remove("CARGO_TARGET_DIR");
                    let mut run = ChildProcess::spawn(&format!("commands {group}"), command, &root)
                        .expect("bash");
                    match run.expect_success(WALKTHROUGH_TIMEOUT) {
                        // QEMU lost the port to another process between its
                        // pick and QEMU's bind: with_free_port tries again.
                        Err(e) if run.stderr_contains("Address already in use") => Err(e),
                        result => {
                            result
                                .unwrap_or_else(|e| panic!("the README's `{group}` commands: {e}"));
                            Ok(())
                        }
                    }
                };
                if script.contains("127.0.0.1:4444") {
                    scenario::with_free_port(&format!("the README's `{group}` commands"), run)
                        .unwrap_or_else(|e| panic!("the README's `{group}` commands: {e}"));
                } else {
                    run(0).expect("commands without a port");
                }
                let words: Vec<&str> = script.split_whitespace().collect();
                traces.extend(
                    words
                        .windows(2)
                        .filter(|w| w[0] == "-o")
                        .map(|w| w[1].to_owned()),
                );
                if project.is_none() {
                    let made = PathBuf::from(
                        std::fs::read_to_string(&record)
                            .expect("the project directory")
                            .trim(),
                    );
                    // The test's own: the example's crate versions, and a
                    // target dir kept between runs.
                    std::fs::copy(
                        repo.join("abi/firmware/Cargo.lock"),
                        made.join("Cargo.lock"),
                    )
                    .expect("Cargo.lock");
                    let target = repo.join("target").join("readme-walkthrough");
                    std::fs::create_dir_all(&target).expect("the target dir");
                    std::os::unix::fs::symlink(&target, made.join("target")).expect("target");
                    project = Some(made);
                }
            }
        }
    }
    assert!(traces.len() >= 4, "the commands write traces: {traces:?}");
    let project = project.expect("a project");
    for trace in &traces {
        let verdict = scenario::inspect(&[project.join(trace)]).expect("inspect runs");
        let events = &verdict.analysis["track_events"];
        assert!(
            verdict.ok,
            "{trace}: inspect --check: {}",
            verdict.analysis["problems"]
        );
        assert!(
            events["slice_begin"].as_u64() > Some(0),
            "{trace}: {events}"
        );
        assert_eq!(events["interned_unresolved"], 0, "{trace}: {events}");
    }
    readme_firmware_starts_at_once(&project, &root);
}

/// Instructions (nanoseconds under `-icount shift=0`) from reset to the
/// README firmware's first event, at most: its `.bss` and region set up,
/// about 0.3 million. A region section inserted after `.bss` made
/// cortex-m-rt's reset handler zero everything up to it, 16 MiB from RAM
/// through the hole to PSRAM: 17.2 million, the first byte on UART0 11.7 s
/// late under `-singlestep -d exec` logging.
const README_FIRST_EVENT_NS: u64 = 5_000_000;

/// The README firmware the walk-through built in `project`, run under
/// `-icount shift=0` (one instruction per virtual nanosecond, the FPGA
/// counter its clock hook reads at 25 MHz of them) with UART0 into a file
/// until 8 KiB of frames are there, then imported (the firmware's clock
/// taken as BOOTTIME, so the trace's earliest timestamp is the firmware's
/// first): its first event lies within [`README_FIRST_EVENT_NS`]
/// instructions of reset.
fn readme_firmware_starts_at_once(project: &Path, dir: &Path) {
    let elf = project.join("target/thumbv7em-none-eabihf/release/fw-hello");
    let frames = dir.join("icount.frames");
    let mut qemu = Command::new("qemu-system-arm");
    qemu.args(["-M", "mps2-an386", "-cpu", "cortex-m4"])
        .args(["-display", "none", "-monitor", "none", "-icount", "shift=0"])
        .arg("-serial")
        .arg(format!("file:{}", frames.display()))
        .arg("-kernel")
        .arg(&elf);
    let mut qemu = ChildProcess::spawn("qemu icount", qemu, dir).expect("QEMU");
    let deadline = Instant::now() + TIMEOUT;
    // A chunk is at most a 4 KiB page: past that, one went out whole.
    while std::fs::metadata(&frames).map_or(0, |m| m.len()) < 8192 {
        assert!(
            qemu.is_running() && Instant::now() < deadline,
            "8 KiB of frames from {} under -icount: {}",
            elf.display(),
            qemu.stderr_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    qemu.kill(TIMEOUT).expect("QEMU stops");
    let trace = dir.join("icount.pftrace");
    let import = Command::new(scenario::shmtrace_binary().expect("shmtrace"))
        .arg("import")
        .arg("--frames")
        .arg(&frames)
        .arg("-o")
        .arg(&trace)
        .output()
        .expect("shmtrace import");
    assert!(
        import.status.success(),
        "shmtrace import: {}",
        String::from_utf8_lossy(&import.stderr)
    );
    let analysis = scenario::inspect_passes(&trace);
    assert!(
        analysis["track_events"]["slice_begin"].as_u64() > Some(0),
        "{}",
        analysis["track_events"]
    );
    let first = analysis["clocks"]["first_ns"]
        .as_u64()
        .expect("the trace's first timestamp");
    assert!(
        first <= README_FIRST_EVENT_NS,
        "the README firmware's first event {first} instructions after reset, more than \
         {README_FIRST_EVENT_NS}: does its reset handler zero more than .bss?"
    );
}

/// When [`board_reset_mid_session`] resets the board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResetAt {
    /// Once the first boot reported its counts and had a second to send
    /// them: a clean restart, whose counts are known.
    AfterCounts,
    /// [`RESET_WHILE_WRITING`] into the first boot's writing: what its
    /// writers held in their open chunks, and its ring and UART had not
    /// sent, is lost.
    WhileWriting,
}

/// How long the first boot of [`ResetAt::WhileWriting`] writes before the
/// reset (about 2,500 events).
const RESET_WHILE_WRITING: Duration = Duration::from_millis(300);

/// A board reset mid-session (QEMU's `system_reset`, as a reset button,
/// with the UART's connection kept): the firmware boots again (its region
/// is taken anew, its frames start at seq 0; PSRAM, a file, keeps the old
/// header, so the boot id is the old one + 1), the bridge takes the HELLO
/// as a new boot, enables tracing again as the session still runs, and
/// the trace holds both boots' events, each boot's writers on sequences of
/// their own (2 + 2). The old boot's two sequences end with a loss mark
/// each, the new boot's carry none: a reset while a session records cuts
/// what the writers held and the ring had not sent, and nothing the bridge
/// sees tells a clean restart from one that cut something (the mark is
/// the bridge's, `restarts_mid_session`), so it marks both. The second
/// boot's events are there exactly, the first boot's too `at`
/// [`ResetAt::AfterCounts`]; `shmtrace inspect --check` passes, counting
/// the marks.
fn board_reset_mid_session(at: ResetAt) {
    let label = match at {
        ResetAt::AfterCounts => "firmware-board-reset",
        ResetAt::WhileWriting => "firmware-board-reset-while-writing",
    };
    let (elf_dir, bins, dir) = setup(&format!("shmtrace-{label}-"));
    let path = |name: &str| dir.path().join(name);
    let (producer_socket, consumer_socket) = (path("p.sock"), path("c.sock"));
    let mut service_process =
        start_our_service(dir.path(), &producer_socket, &consumer_socket, &[]);
    let (mut qemu, port) =
        Qemu::start_serving(&elf_dir, "stream", dir.path(), true).expect("QEMU starts");
    let mut bridge = start_bridge(dir.path(), port, &producer_socket);
    let (_, mut mailbox) = qemu.ready().expect("the firmware is ready");
    scenario::query_until(&consumer_socket, "the firmware's producer", |s| {
        s["data_sources"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["name"] == "track_event"))
    });
    let trace_config =
        TraceConfig::track_event(8 * 1024, FillPolicy::Discard, &["interop", "interop.*"]);
    std::fs::write(path("config.pb"), config::encode(&trace_config)).expect("write config");
    let trace = path("trace.pftrace");
    let mut consumer = start_consumer(
        ConsumerImpl::OurCli,
        &bins,
        dir.path(),
        &consumer_socket,
        &trace,
    );

    // What the boots reported: both, or the second alone.
    let mut emitted = EventCounts::default();
    for boot in 1..=2 {
        qemu.process
            .expect_event("enabled", TIMEOUT)
            .unwrap_or_else(|e| panic!("boot {boot} is enabled: {e}"));
        if boot == 1 && at == ResetAt::WhileWriting {
            std::thread::sleep(RESET_WHILE_WRITING);
        } else {
            std::thread::sleep(Duration::from_millis(300));
            let done = finish(&mut qemu, &mailbox);
            assert!(done.emitted.track_events() > 0, "boot {boot}: {done:?}");
            emitted += done.emitted;
        }
        if boot == 1 {
            if at == ResetAt::AfterCounts {
                // Everything the first boot wrote has gone out on the UART.
                std::thread::sleep(Duration::from_secs(1));
            }
            qemu.system_reset().expect("QEMU resets the board");
            mailbox = qemu.ready().expect("the firmware is ready again").1;
        }
    }

    scenario::interrupt(&consumer).expect("Ctrl-C");
    consumer.expect_event("done", TIMEOUT).expect("the trace");
    consumer.close_stdin();
    consumer
        .expect_success(TIMEOUT)
        .expect("the consumer exits");
    bridge.close_stdin();
    let summary = bridge
        .expect_event("summary", TIMEOUT)
        .expect("the bridge's summary");
    bridge.expect_success(TIMEOUT).expect("the bridge exits 0");
    let engine = &summary["engine"];
    assert_eq!(engine["boots"], 2, "{summary}");
    assert_eq!(engine["resets"], 1, "{summary}");
    assert_eq!(engine["restarts_mid_session"], 1, "{summary}");
    // One mark on each of the old boot's two sequences, in the one session.
    assert_eq!(engine["trailing_losses_marked"], 2, "{summary}");
    assert_eq!(summary["lost_anything"], true, "{summary}");
    if at == ResetAt::AfterCounts {
        assert_eq!(summary["transport"]["cut_by_restart"], 0, "{summary}");
    }
    service_process.close_stdin();
    service_process
        .expect_success(TIMEOUT)
        .expect("the service exits 0");
    mailbox.exit().expect("exit");
    qemu.process
        .expect_event("exit", TIMEOUT)
        .expect("the firmware exits");

    let expect = Expectation {
        producers: vec![ProducerExpectation {
            pid: Some(bridge.pid()),
            emitted,
        }],
        loss: Loss::Allowed,
        require_trace_stats: true,
        require_service_packets: true,
        remote_producers: false,
    };
    let report = checker::check(std::slice::from_ref(&trace), &expect, dir.path(), label)
        .expect("the checker runs");
    let mut sequences: Vec<_> = report.track_event_sequences().collect();
    sequences.sort_by_key(|s| s.id);
    assert_eq!(
        sequences.len(),
        4,
        "the main loop's and the interrupt's, of each boot: {sequences:?}"
    );
    let (old, new) = sequences.split_at(2);
    assert!(
        old.iter().all(|s| !s.start_lost && s.loss_marks == 1),
        "the old boot's: {old:?}"
    );
    assert!(
        new.iter().all(|s| !s.start_lost && s.loss_marks == 0),
        "the new boot's: {new:?}"
    );
    let second: u64 = new.iter().map(|s| s.track_events).sum();
    let first: u64 = old.iter().map(|s| s.track_events).sum();
    match at {
        // Every event of both boots: the marks are the bridge's caution.
        ResetAt::AfterCounts => {
            report.assert_ok(label);
            assert_eq!(report.totals, emitted, "{label}");
        }
        // The second boot's events exactly; the first boot's, as many as
        // came before the reset, are more than the expectation (the second
        // boot's) holds: the only violations.
        ResetAt::WhileWriting => {
            assert_eq!(second, emitted.track_events(), "{sequences:?}");
            assert!(first > 0, "{sequences:?}");
            assert!(
                report.violations.iter().all(|v| excess(v)),
                "{label}: the trace checker found violations:\n  {}",
                report.violations.join("\n  ")
            );
        }
    }
    let inspected = scenario::inspect(std::slice::from_ref(&trace)).expect("shmtrace inspect runs");
    assert!(
        inspected.ok,
        "shmtrace inspect --check: {}",
        inspected.analysis
    );
    let marks: u64 = report.sequences.iter().map(|s| s.loss_marks).sum();
    assert_eq!(
        inspected.analysis["loss"]["loss_marks"].as_u64(),
        Some(marks),
        "{}",
        inspected.analysis["loss"]
    );
    println!(
        "{label}: {first} + {second} firmware events over 2 boots, {} chunks forwarded, {marks} \
         loss marks in the trace, cut_by_restart {}",
        summary["engine"]["chunks_forwarded"], summary["transport"]["cut_by_restart"]
    );
    drop(qemu);
}

/// Whether a checker violation says the trace holds more of an event kind
/// than expected ("...: KEY expected N, trace has M", M > N).
fn excess(violation: &str) -> bool {
    let Some((_, counts)) = violation.rsplit_once(" expected ") else {
        return false;
    };
    let Some((want, have)) = counts.split_once(", trace has ") else {
        return false;
    };
    matches!((want.parse::<u64>(), have.parse::<u64>()), (Ok(w), Ok(h)) if h > w)
}

/// [`board_reset_mid_session`] once the first boot reported its counts.
#[test]
fn firmware_stream_board_reset_mid_session() {
    board_reset_mid_session(ResetAt::AfterCounts);
}

/// [`board_reset_mid_session`] while the first boot writes: before the
/// bridge marked a boot cut mid-session, the trace held 2,524 to 2,723 of
/// its events with no loss mark (4 runs), though its writers' open chunks
/// and its unsent ring were gone; now 2,717 to 2,775 (3 runs) and a mark
/// on each of its 2 sequences.
#[test]
fn firmware_stream_board_reset_while_writing() {
    board_reset_mid_session(ResetAt::WhileWriting);
}
