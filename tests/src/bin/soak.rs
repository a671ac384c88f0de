//! Soak (issue 18 item 9), printed as a report, asserted nowhere and not
//! run by CI: one `shmtrace serve` for a long time under producers that
//! connect, emit, get SIGKILLed and come back, and consumers that start,
//! read and stop sessions, ring buffer and write_into_file ones.
//!
//! ```text
//! cargo build --release -p shmtrace-cli --bin shmtrace -p shmtrace-tests --bin real-producer --bin real-consumer --bin soak -p shmtrace-producer --example interop_producer --example heartbeat
//! target/release/soak [--minutes M] [--producers N] [--consumers N] [--sample-s S] [--probe-ms MS] [--json] [--keep]
//! ```
//!
//! Defaults: 30 minutes, 32 producers, 4 consumer slots, a sample every
//! 10 s, a probe every 100 ms. Uses the binaries next to itself and in
//! `examples/` below it (build them in one profile).
//!
//! * Producers, in slots: every 8th our `heartbeat` example (one slice per
//!   10 ms, reports its connection), the others alternately the real SDK
//!   driver (`real-producer`, 2 threads) and our library's driver
//!   (`interop_producer`, 1 thread), each writing an iteration of 9 track
//!   events every 10 ms while a session enables them, with the SDK's
//!   default or a 64 KiB shared memory buffer. Each lives 3 to 40 s, then
//!   is SIGKILLed (whatever it is doing, mid-chunk as often as not) and
//!   started again after up to 1 s. A driver that finds no session
//!   finishes its iterations at once and exits; it is started again too.
//! * Consumer slots, each running sessions of 5 to 40 s back to back,
//!   cycling through: `shmtrace record` into a 2 MiB ring buffer stopped by
//!   the config's duration; `shmtrace record --write-into-file` (500 ms
//!   writes, 1 MiB ring) stopped by Ctrl-C; the real consumer on a ring
//!   buffer, stopped by its `stop`; the real consumer write_into_file; and
//!   `shmtrace record` into a 1 MiB DISCARD buffer that fills. Every trace
//!   is judged by `shmtrace inspect --check --json`: its counted losses are
//!   summed by cause; a trace that fails the check (data lost uncounted,
//!   broken sequences...) is kept and listed.
//! * A probe: one consumer connection asking QueryServiceState every
//!   `--probe-ms`, and a fresh connection doing the same every second:
//!   the longest round trip is the longest stall an honest client saw.
//!   The producer lists it gets time each producer from its start to its
//!   first listing (resolution: the probe period); `heartbeat` reports its
//!   own connection, timed exactly. Each stall is listed with how far a
//!   thread of the soak that sleeps 10 ms at a time overslept meanwhile:
//!   the scheduler's share, on a machine shared with other jobs. The
//!   service logs each turn of its loop over 50 ms with the CPU time it
//!   spent in it and the time its trace-file writes took; the report lists
//!   those lines: a stall with a slow turn of little CPU and no file writes
//!   was the machine's (the scheduler), one of much CPU the service's, one
//!   spent in file writes the disk's (the kernel throttling dirty pages).
//! * The service's RSS (VmRSS, VmHWM), open fds (`/proc/PID/fd`), threads
//!   and CPU, sampled every `--sample-s`; the slope of RSS and fds over the
//!   run after its first minute (warm-up: buffers, SMBs) says whether they
//!   grow.
//!
//! The whole run's directory (sockets, stderr of every process, failed
//! traces) is kept if anything failed or with `--keep`, else removed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use shmtrace_cli::consumer::Consumer;
use shmtrace_tests::config::{self, FillPolicy, TraceConfig};
use shmtrace_tests::process::{cpu_seconds, status_field, ChildProcess};
use shmtrace_tests::scenario::{self, sibling_binary};

/// The categories every producer here registers between them.
const CATEGORIES: [&str; 3] = ["interop", "interop.*", "heartbeat"];
/// How long a process may take to report what it must.
const TIMEOUT: Duration = Duration::from_secs(120);
/// The service statistics the printed report sums (`--json` has them
/// all).
const ACTIVITY: [&str; 10] = [
    "chunks_written",
    "chunks_read",
    "chunks_rewritten",
    "chunks_committed_out_of_order",
    "patches_succeeded",
    "readaheads_succeeded",
    "flushes_requested",
    "flushes_succeeded",
    "flushes_failed",
    "producers_seen",
];
/// The [`ticker`]'s sleep.
const TICK: Duration = Duration::from_millis(10);
/// A round trip longer than this is a stall (the soak's goal).
const STALL: Duration = Duration::from_millis(100);

fn main() {
    let args = <Args as clap::Parser>::parse();
    let bins = Bins::find();
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-soak-")
        .tempdir_in("/tmp")
        .expect("a temporary directory");
    let failed_dir = dir.path().join("failed");
    std::fs::create_dir_all(&failed_dir).expect("create the failed traces' directory");
    let producer_socket = dir.path().join("producer.sock");
    let consumer_socket = dir.path().join("consumer.sock");

    let mut command = Command::new(&bins.shmtrace);
    command
        .args(["serve", "--notify-ready", "--log-level", "warn"])
        .arg("--producer-socket")
        .arg(&producer_socket)
        .arg("--consumer-socket")
        .arg(&consumer_socket)
        .arg("--exit-on-stdin-eof");
    let mut service =
        ChildProcess::spawn("service", command, dir.path()).unwrap_or_else(|e| panic!("{e}"));
    service
        .expect_event("ready", TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    let service_pid = service.pid();
    eprintln!(
        "soak: {} min, {} producers, {} consumer slots, service pid {service_pid}, dir {}",
        args.minutes,
        args.producers,
        args.consumers,
        dir.path().display()
    );

    let shared = Arc::new(Shared::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut workers = Vec::new();
    {
        let (shared, stop) = (shared.clone(), stop.clone());
        let sample = Duration::from_secs(args.sample_s);
        workers.push(thread::spawn(move || {
            sampler(service_pid, started, sample, &shared, &stop)
        }));
    }
    {
        let (shared, stop, socket) = (shared.clone(), stop.clone(), consumer_socket.clone());
        let period = Duration::from_millis(args.probe_ms);
        workers.push(thread::spawn(move || {
            probe(&socket, period, started, &shared, &stop)
        }));
    }
    {
        let (shared, stop) = (shared.clone(), stop.clone());
        workers.push(thread::spawn(move || ticker(started, &shared, &stop)));
    }
    {
        let (shared, stop, bins) = (shared.clone(), stop.clone(), bins.clone());
        let (socket, log_dir) = (producer_socket.clone(), dir.path().to_path_buf());
        let count = args.producers;
        workers.push(thread::spawn(move || {
            producers(count, &bins, &socket, &log_dir, &shared, &stop)
        }));
    }
    for slot in 0..args.consumers {
        let (shared, stop, bins) = (shared.clone(), stop.clone(), bins.clone());
        let (socket, work_dir) = (consumer_socket.clone(), dir.path().to_path_buf());
        workers.push(thread::spawn(move || {
            consumers(slot, &bins, &socket, &work_dir, started, &shared, &stop)
        }));
    }

    let deadline = started + Duration::from_secs_f64(args.minutes * 60.0);
    let mut service_died = None;
    let mut last_progress = Instant::now();
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(500));
        if !service.is_running() {
            service_died = Some(started.elapsed());
            break;
        }
        if last_progress.elapsed() >= Duration::from_secs(60) {
            last_progress = Instant::now();
            progress(&shared, started);
        }
    }
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.join().expect("a soak thread panicked");
    }
    // The last sample, with every client gone.
    thread::sleep(Duration::from_secs(1));
    let last = service_died
        .is_none()
        .then(|| Sample::take(service_pid, started, 0, 0));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    service.close_stdin();
    let service_exit = service.expect_success(TIMEOUT).err().map(|e| e.to_string());

    let report = Report::new(
        &shared,
        &args,
        started.elapsed(),
        (service_died, service_exit),
        last,
        load,
        &dir.path().join("service.stderr"),
    );
    report.print();
    if args.json {
        println!("{}", report.json());
    }
    if report.failed() || args.keep {
        let kept = dir.keep();
        eprintln!("soak: kept {} (logs, failed traces)", kept.display());
    }
    if report.failed() {
        std::process::exit(1);
    }
}

/// Command-line arguments.
#[derive(Debug, clap::Parser)]
#[command(
    about = "Soak one `shmtrace serve` under producers that are killed and restart and consumers that start and stop sessions (see the module docs)"
)]
struct Args {
    /// How long to run, minutes.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Producer slots.
    #[arg(long, default_value_t = 32)]
    producers: usize,
    /// Consumer slots.
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    consumers: usize,
    /// How often the service's RSS and fds are sampled, seconds.
    #[arg(long = "sample-s", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    sample_s: u64,
    /// How often the probe asks the service for its state, milliseconds.
    #[arg(long = "probe-ms", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    probe_ms: u64,
    /// Also print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Keep the working directory (logs, traces) even if the run passes.
    #[arg(long)]
    keep: bool,
}

/// The programs the soak runs.
#[derive(Clone)]
struct Bins {
    shmtrace: PathBuf,
    real_producer: PathBuf,
    real_consumer: PathBuf,
    interop_producer: PathBuf,
    heartbeat: PathBuf,
}

impl Bins {
    fn find() -> Self {
        let find = |name: &str| sibling_binary(name).unwrap_or_else(|e| panic!("{e}"));
        Bins {
            shmtrace: find("shmtrace"),
            real_producer: find("real-producer"),
            real_consumer: find("real-consumer"),
            interop_producer: find("examples/interop_producer"),
            heartbeat: find("examples/heartbeat"),
        }
    }
}

/// What the soak's threads record, for the report.
#[derive(Default)]
struct Shared {
    samples: Mutex<Vec<Sample>>,
    probe: Mutex<Probe>,
    /// See [`ticker`].
    ticks: Mutex<Vec<(f64, f64)>>,
    producers: Mutex<ProducerStats>,
    sessions: Mutex<SessionStats>,
}

/// One sample of the service process.
#[derive(Debug, Clone, serde::Serialize)]
struct Sample {
    at_s: f64,
    rss_kib: u64,
    hwm_kib: u64,
    fds: u64,
    threads: u64,
    cpu_s: f64,
    /// Producers and sessions the probe saw last.
    producers: usize,
    sessions: usize,
}

impl Sample {
    fn take(pid: u32, started: Instant, producers: usize, sessions: usize) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| status_field(&status, name);
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
        Sample {
            at_s: started.elapsed().as_secs_f64(),
            rss_kib: field("VmRSS:"),
            hwm_kib: field("VmHWM:"),
            fds,
            threads: field("Threads:"),
            cpu_s: cpu_seconds(pid),
            producers,
            sessions,
        }
    }
}

fn sampler(pid: u32, started: Instant, period: Duration, shared: &Shared, stop: &AtomicBool) {
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() >= next {
            next += period;
            let (producers, sessions) = {
                let probe = shared.probe.lock().unwrap();
                (probe.last_producers, probe.last_sessions)
            };
            let sample = Sample::take(pid, started, producers, sessions);
            shared.samples.lock().unwrap().push(sample);
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Round trips of the probe.
#[derive(Default)]
struct Probe {
    /// QueryServiceState on the long-lived connection, µs.
    round_trips_us: Vec<u64>,
    /// When the longest happened (s into the run).
    max_at_s: f64,
    /// Connect, bind and QueryServiceState on a fresh connection, µs.
    fresh_us: Vec<u64>,
    /// Round trips over [`STALL`]: when they started (s into the run),
    /// how long they took (ms), and whether on a fresh connection.
    stalls: Vec<(f64, f64, bool)>,
    /// Failed round trips, with their error.
    errors: Vec<String>,
    last_producers: usize,
    last_sessions: usize,
    max_producers: usize,
    max_sessions: usize,
}

/// The machine's share of a stall: a thread of the soak that sleeps
/// [`TICK`] at a time records by how much each sleep overran, if by more
/// than [`TICK`] (when it ended, s into the run; the overrun, ms). A
/// round trip that stalled while this thread overslept as long was held
/// up by the scheduler (2 shared cores), not by the service.
fn ticker(started: Instant, shared: &Shared, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let t0 = Instant::now();
        thread::sleep(TICK);
        let over = t0.elapsed().saturating_sub(TICK);
        if over > TICK {
            shared
                .ticks
                .lock()
                .unwrap()
                .push((started.elapsed().as_secs_f64(), over.as_secs_f64() * 1000.0));
        }
    }
}

fn probe(socket: &Path, period: Duration, started: Instant, shared: &Shared, stop: &AtomicBool) {
    let socket = socket.to_str().expect("a UTF-8 socket path");
    let mut connection: Option<Consumer> = None;
    let mut next_fresh = Instant::now();
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now < next {
            thread::sleep(next - now);
            continue;
        }
        next += period;
        if next < Instant::now() {
            // Do not fire a burst after a stall of our own.
            next = Instant::now() + period;
        }
        let consumer = match connection.take() {
            Some(c) => c,
            None => match Consumer::connect(Some(socket)) {
                Ok(c) => c,
                Err(e) => {
                    shared
                        .probe
                        .lock()
                        .unwrap()
                        .errors
                        .push(format!("connect: {e}"));
                    continue;
                }
            },
        };
        let t0 = Instant::now();
        let state = consumer.service_state(false);
        let took = t0.elapsed();
        match state {
            Ok(state) => {
                let pids: Vec<u32> = state
                    .producers
                    .iter()
                    .filter_map(|p| p.pid)
                    .map(|p| p as u32)
                    .collect();
                let sessions = state.tracing_sessions.len();
                {
                    let mut probe = shared.probe.lock().unwrap();
                    let us = took.as_micros() as u64;
                    let at_s = t0.duration_since(started).as_secs_f64();
                    if probe.round_trips_us.iter().all(|&m| us > m) {
                        probe.max_at_s = at_s;
                    }
                    if took > STALL {
                        probe.stalls.push((at_s, us as f64 / 1000.0, false));
                    }
                    probe.round_trips_us.push(us);
                    probe.last_producers = pids.len();
                    probe.last_sessions = sessions;
                    probe.max_producers = probe.max_producers.max(pids.len());
                    probe.max_sessions = probe.max_sessions.max(sessions);
                }
                shared.producers.lock().unwrap().listed(&pids, t0);
                connection = Some(consumer);
            }
            Err(e) => {
                shared.probe.lock().unwrap().errors.push(format!(
                    "QueryServiceState after {} ms: {e}",
                    took.as_millis()
                ));
            }
        }
        if Instant::now() >= next_fresh {
            next_fresh = Instant::now() + Duration::from_secs(1);
            let t0 = Instant::now();
            let result = Consumer::connect(Some(socket)).and_then(|c| c.service_state(true));
            let took = t0.elapsed();
            let mut probe = shared.probe.lock().unwrap();
            if took > STALL {
                let at_s = t0.duration_since(started).as_secs_f64();
                probe.stalls.push((at_s, took.as_secs_f64() * 1000.0, true));
            }
            match result {
                Ok(_) => probe.fresh_us.push(took.as_micros() as u64),
                Err(e) => probe.errors.push(format!("fresh connection: {e}")),
            }
        }
    }
}

/// The kinds of producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ProducerKind {
    /// The real SDK's driver.
    Real,
    /// Our library's driver (`interop_producer`).
    Ours,
    /// Our `heartbeat` example.
    Heartbeat,
}

impl ProducerKind {
    fn of_slot(slot: usize) -> Self {
        if slot % 8 == 7 {
            ProducerKind::Heartbeat
        } else if slot % 2 == 0 {
            ProducerKind::Real
        } else {
            ProducerKind::Ours
        }
    }

    fn name(self) -> &'static str {
        match self {
            ProducerKind::Real => "real SDK",
            ProducerKind::Ours => "ours",
            ProducerKind::Heartbeat => "heartbeat",
        }
    }
}

/// What happened to the producers.
#[derive(Default)]
struct ProducerStats {
    /// Starts per kind.
    started: BTreeMap<ProducerKind, u64>,
    /// SIGKILLs per kind.
    killed: BTreeMap<ProducerKind, u64>,
    /// Exits by themselves, per kind and status.
    exited: BTreeMap<(ProducerKind, String), u64>,
    /// Processes not yet seen in the service's producer list: pid, kind,
    /// when started.
    unlisted: HashMap<u32, (ProducerKind, Instant)>,
    /// From start to the first listing, per kind, ms.
    to_listed_ms: BTreeMap<ProducerKind, Vec<u64>>,
    /// `heartbeat` from start to its "connected", ms.
    heartbeat_connect_ms: Vec<u64>,
    /// Errors starting or killing one.
    errors: Vec<String>,
}

impl ProducerStats {
    /// The probe saw `pids` in the service's producer list, having asked
    /// at `asked`.
    fn listed(&mut self, pids: &[u32], asked: Instant) {
        for pid in pids {
            if let Some((kind, at)) = self.unlisted.remove(pid) {
                let ms = asked.saturating_duration_since(at).as_millis() as u64;
                self.to_listed_ms.entry(kind).or_default().push(ms);
            }
        }
    }
}

/// One producer slot's current process.
struct Running {
    kind: ProducerKind,
    process: ChildProcess,
    started: Instant,
    kill_at: Instant,
    connected: bool,
}

fn producers(
    count: usize,
    bins: &Bins,
    socket: &Path,
    log_dir: &Path,
    shared: &Shared,
    stop: &AtomicBool,
) {
    let mut rng = Rng::new(0x5eed);
    let mut slots: Vec<(Option<Running>, Instant)> =
        (0..count).map(|_| (None, Instant::now())).collect();
    while !stop.load(Ordering::SeqCst) {
        for (index, (slot, restart_at)) in slots.iter_mut().enumerate() {
            let now = Instant::now();
            if let Some(running) = slot.as_mut() {
                if !running.connected {
                    let connected = running
                        .process
                        .pending_events()
                        .iter()
                        .any(|e| e["event"] == "connected");
                    if connected {
                        running.connected = true;
                        shared
                            .producers
                            .lock()
                            .unwrap()
                            .heartbeat_connect_ms
                            .push(running.started.elapsed().as_millis() as u64);
                    }
                }
                if !running.process.is_running() {
                    let mut running = slot.take().expect("running");
                    let status = running
                        .process
                        .kill(TIMEOUT)
                        .map_or_else(|e| e.to_string(), |s| s.to_string());
                    let mut stats = shared.producers.lock().unwrap();
                    stats.unlisted.remove(&running.process.pid());
                    *stats.exited.entry((running.kind, status)).or_default() += 1;
                    *restart_at = now + Duration::from_millis(rng.range(200, 1000));
                } else if now >= running.kill_at {
                    let mut running = slot.take().expect("running");
                    let result = running.process.kill(TIMEOUT);
                    let mut stats = shared.producers.lock().unwrap();
                    stats.unlisted.remove(&running.process.pid());
                    match result {
                        Ok(_) => *stats.killed.entry(running.kind).or_default() += 1,
                        Err(e) => stats.errors.push(format!("kill: {e}")),
                    }
                    *restart_at = now + Duration::from_millis(rng.range(0, 1000));
                }
            } else if now >= *restart_at {
                let kind = ProducerKind::of_slot(index);
                let shmem_kb = if rng.range(0, 2) == 0 { 0 } else { 64 };
                let mut command = match kind {
                    ProducerKind::Real => {
                        let mut c = Command::new(&bins.real_producer);
                        c.arg("--threads=2");
                        c
                    }
                    ProducerKind::Ours => {
                        let mut c = Command::new(&bins.interop_producer);
                        c.arg("--threads=1");
                        c
                    }
                    ProducerKind::Heartbeat => Command::new(&bins.heartbeat),
                };
                command.env("PERFETTO_PRODUCER_SOCK_NAME", socket);
                if kind != ProducerKind::Heartbeat {
                    command.args([
                        "--iterations=100000".to_string(),
                        "--iteration-sleep-us=10000".to_string(),
                        format!("--shmem-kb={shmem_kb}"),
                        "--start-timeout-ms=3600000".to_string(),
                        "--stop-timeout-ms=3600000".to_string(),
                    ]);
                }
                let name = format!("producer {}", index + 1);
                match ChildProcess::spawn(&name, command, log_dir) {
                    Ok(process) => {
                        let started = Instant::now();
                        let mut stats = shared.producers.lock().unwrap();
                        *stats.started.entry(kind).or_default() += 1;
                        stats.unlisted.insert(process.pid(), (kind, started));
                        *slot = Some(Running {
                            kind,
                            process,
                            started,
                            kill_at: started + Duration::from_millis(rng.range(3_000, 40_000)),
                            connected: kind != ProducerKind::Heartbeat,
                        });
                    }
                    Err(e) => {
                        shared.producers.lock().unwrap().errors.push(e.to_string());
                        *restart_at = now + Duration::from_secs(1);
                    }
                }
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    // Dropping the slots kills what still runs.
}

/// The kinds of session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum SessionKind {
    /// `shmtrace record`, 2 MiB ring buffer, the config's duration.
    RecordRing,
    /// `shmtrace record --write-into-file`, stopped by Ctrl-C.
    RecordFile,
    /// The real consumer, 2 MiB ring buffer, its `stop`.
    RealRing,
    /// The real consumer, write_into_file, its `stop`.
    RealFile,
    /// `shmtrace record`, 1 MiB DISCARD buffer, the config's duration.
    RecordDiscard,
}

const SESSION_KINDS: [SessionKind; 5] = [
    SessionKind::RecordRing,
    SessionKind::RecordFile,
    SessionKind::RealRing,
    SessionKind::RealFile,
    SessionKind::RecordDiscard,
];

impl SessionKind {
    fn name(self) -> &'static str {
        match self {
            SessionKind::RecordRing => "record, ring",
            SessionKind::RecordFile => "record, write_into_file",
            SessionKind::RealRing => "real consumer, ring",
            SessionKind::RealFile => "real consumer, write_into_file",
            SessionKind::RecordDiscard => "record, discard",
        }
    }

    fn write_into_file(self) -> bool {
        matches!(self, SessionKind::RecordFile | SessionKind::RealFile)
    }

    fn config(self, duration_ms: u32) -> TraceConfig {
        let (kb, policy) = match self {
            SessionKind::RecordDiscard => (1024, FillPolicy::Discard),
            SessionKind::RecordFile | SessionKind::RealFile => (1024, FillPolicy::RingBuffer),
            SessionKind::RecordRing | SessionKind::RealRing => (2048, FillPolicy::RingBuffer),
        };
        let mut config = TraceConfig::track_event(kb, policy, &CATEGORIES);
        if matches!(self, SessionKind::RecordRing | SessionKind::RecordDiscard) {
            config.duration_ms = Some(duration_ms);
        }
        if self.write_into_file() {
            config.write_into_file = Some(true);
            config.file_write_period_ms = Some(500);
        }
        config
    }
}

/// What happened to the sessions.
#[derive(Default)]
struct SessionStats {
    /// Sessions per kind whose trace passed `inspect --check`.
    ok: BTreeMap<SessionKind, u64>,
    /// Track events in those traces, per kind.
    events: BTreeMap<SessionKind, u64>,
    /// Trace bytes, per kind.
    bytes: BTreeMap<SessionKind, u64>,
    /// Counted losses, summed by cause over every trace.
    losses: BTreeMap<String, u64>,
    /// Traces with each counted loss cause.
    traces_with_loss: BTreeMap<String, u64>,
    /// The service's statistics (the trace's last `trace_stats`), summed
    /// over every trace that passed.
    activity: BTreeMap<String, u64>,
    /// From the end of a session (its stop or duration) to the trace
    /// being complete, ms, per kind.
    stop_to_done_ms: BTreeMap<SessionKind, u64>,
    /// The slowest of those: ms, session name.
    slowest_stop: (u64, String),
    /// Every session's end: from its stop (s into the run) to its trace
    /// being complete, and its kind.
    ends: Vec<(f64, f64, SessionKind)>,
    /// Traces that pass `inspect --check` with slice ends or flows cut at
    /// their edges (see [`Verdict::edge_cuts`]), and those problems.
    edge_cuts: (u64, u64),
    /// Failures: what, with the kept trace or the error.
    failures: Vec<String>,
}

fn consumers(
    slot: usize,
    bins: &Bins,
    socket: &Path,
    work_dir: &Path,
    started: Instant,
    shared: &Shared,
    stop: &AtomicBool,
) {
    let mut rng = Rng::new(0xc0ffee + slot as u64);
    let mut round = 0usize;
    // Stagger the slots' starts so their sessions overlap unevenly.
    sleep_unless(stop, Duration::from_millis(rng.range(0, 5000)));
    while !stop.load(Ordering::SeqCst) {
        let kind = SESSION_KINDS[(slot + round) % SESSION_KINDS.len()];
        round += 1;
        let duration = Duration::from_millis(rng.range(5_000, 40_000));
        let name = format!("s{}-{round}", slot + 1);
        let trace = work_dir.join(format!("{name}.pftrace"));
        let config_path = work_dir.join(format!("{name}.pb"));
        std::fs::write(
            &config_path,
            config::encode(&kind.config(duration.as_millis() as u32)),
        )
        .expect("write a config");
        let result = session(
            kind,
            bins,
            socket,
            work_dir,
            &name,
            &config_path,
            &trace,
            duration,
            stop,
        );
        let _ = std::fs::remove_file(&config_path);
        let outcome = result.and_then(|(stopped, stop_to_done)| {
            inspect(&bins.shmtrace, &trace).map(|verdict| (stopped, stop_to_done, verdict))
        });
        let mut stats = shared.sessions.lock().unwrap();
        if let Ok((stopped, stop_to_done, _)) = &outcome {
            let at_s = stopped.duration_since(started).as_secs_f64();
            stats
                .ends
                .push((at_s, at_s + stop_to_done.as_secs_f64(), kind));
            let ms = stop_to_done.as_millis() as u64;
            let max = stats.stop_to_done_ms.entry(kind).or_default();
            *max = (*max).max(ms);
            if ms > stats.slowest_stop.0 {
                stats.slowest_stop = (ms, name.clone());
            }
        }
        match outcome.map(|(_, _, verdict)| verdict) {
            Ok(analysis) if analysis.ok => {
                if analysis.edge_cuts > 0 {
                    stats.edge_cuts.0 += 1;
                    stats.edge_cuts.1 += analysis.edge_cuts;
                }
                *stats.ok.entry(kind).or_default() += 1;
                *stats.events.entry(kind).or_default() += analysis.events;
                *stats.bytes.entry(kind).or_default() += analysis.bytes;
                for (name, n) in analysis.activity {
                    add(&mut stats.activity, name, n);
                }
                for (cause, n) in analysis.losses {
                    *stats.traces_with_loss.entry(cause.clone()).or_default() += 1;
                    add(&mut stats.losses, cause, n);
                }
                let _ = std::fs::remove_file(&trace);
            }
            Ok(analysis) => stats.failures.push(format!(
                "{} ({}): inspect --check failed: {}; kept {}",
                kind.name(),
                name,
                analysis.problems,
                keep(&trace, work_dir).display()
            )),
            Err(e) => stats.failures.push(format!(
                "{} ({}): {e}; trace {}",
                kind.name(),
                name,
                keep(&trace, work_dir).display()
            )),
        }
    }
}

/// Adds the statistic `n` of one trace to `totals`: a buffer's counter (of
/// that session alone) adds up; a service-wide one (`service: ...`) counts
/// since the service started, so the largest value is its total.
fn add(totals: &mut BTreeMap<String, u64>, name: String, n: u64) {
    let service_wide = name.starts_with("service: ");
    let total = totals.entry(name).or_default();
    if service_wide {
        *total = (*total).max(n);
    } else {
        *total += n;
    }
}

/// Runs one session of `kind` for `duration` (less if the soak ends);
/// returns when it ended and the time from then to a complete trace.
#[allow(clippy::too_many_arguments)]
fn session(
    kind: SessionKind,
    bins: &Bins,
    socket: &Path,
    log_dir: &Path,
    name: &str,
    config_path: &Path,
    trace: &Path,
    duration: Duration,
    stop: &AtomicBool,
) -> Result<(Instant, Duration), String> {
    let real = matches!(kind, SessionKind::RealRing | SessionKind::RealFile);
    let mut command = if real {
        let mut c = Command::new(&bins.real_consumer);
        c.arg("--socket")
            .arg(socket)
            .arg("--config")
            .arg(config_path)
            .arg("--out")
            .arg(trace)
            .arg(format!(
                "--timeout-ms={}",
                (duration + TIMEOUT * 2).as_millis()
            ));
        c
    } else {
        let mut c = Command::new(&bins.shmtrace);
        c.args(["record", "--progress", "json", "--socket"])
            .arg(socket)
            .arg("-c")
            .arg(config_path)
            .arg("-o")
            .arg(trace);
        c
    };
    if kind.write_into_file() {
        command.arg("--write-into-file");
    }
    let mut consumer = ChildProcess::spawn(name, command, log_dir).map_err(|e| e.to_string())?;
    consumer
        .expect_event("connected", TIMEOUT)
        .map_err(|e| e.to_string())?;
    let end = Instant::now() + duration;
    match kind {
        SessionKind::RecordRing | SessionKind::RecordDiscard => {
            // The service ends it; the soak's end cuts it short by Ctrl-C.
            sleep_unless(stop, duration);
            if Instant::now() < end {
                scenario::interrupt(&consumer).map_err(|e| e.to_string())?;
            }
        }
        SessionKind::RecordFile => {
            sleep_unless(stop, duration);
            scenario::interrupt(&consumer).map_err(|e| e.to_string())?;
        }
        SessionKind::RealRing | SessionKind::RealFile => {
            sleep_unless(stop, duration);
            consumer.send_line("stop").map_err(|e| e.to_string())?;
        }
    }
    let stopped = Instant::now().min(end);
    consumer
        .expect_event("done", TIMEOUT)
        .map_err(|e| e.to_string())?;
    let took = stopped.elapsed();
    consumer.close_stdin();
    consumer
        .expect_success(TIMEOUT)
        .map_err(|e| e.to_string())?;
    Ok((stopped, took))
}

/// Sleeps `duration`, or less if the soak is stopping.
fn sleep_unless(stop: &AtomicBool, duration: Duration) {
    let end = Instant::now() + duration;
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        thread::sleep((end - now).min(Duration::from_millis(100)));
    }
}

/// Moves a trace that failed into `failed/`; returns where it is now.
fn keep(trace: &Path, work_dir: &Path) -> PathBuf {
    let to = work_dir
        .join("failed")
        .join(trace.file_name().expect("a file name"));
    match std::fs::rename(trace, &to) {
        Ok(()) => to,
        Err(_) => trace.to_path_buf(),
    }
}

/// What `shmtrace inspect --check --json` said about a trace.
struct Verdict {
    ok: bool,
    events: u64,
    bytes: u64,
    /// Counted losses by cause.
    losses: BTreeMap<String, u64>,
    /// The last `trace_stats`: every buffer's counters (as `buffer:
    /// name`, summed) and the service's (`service: name`).
    activity: BTreeMap<String, u64>,
    /// The problem counts, if not ok.
    problems: String,
    /// Problems that may be the cut at the trace's edges (nesting,
    /// flows), which `inspect --check` reports without failing: a session
    /// that starts inside a producer's slice, or stops inside a flow.
    edge_cuts: u64,
}

fn inspect(shmtrace: &Path, trace: &Path) -> Result<Verdict, String> {
    let output = Command::new(shmtrace)
        .args(["inspect", "--check", "--json"])
        .arg(trace)
        .output()
        .map_err(|e| format!("cannot run shmtrace inspect: {e}"))?;
    let analysis: Value = serde_json::from_slice(&output.stdout).map_err(|e| {
        format!(
            "shmtrace inspect ({}) printed no analysis ({e}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
    })?;
    let ok = match output.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => return Err(format!("shmtrace inspect failed: {}", output.status)),
    };
    let loss = &analysis["loss"];
    let mut losses = BTreeMap::new();
    for key in [
        "loss_marks",
        "sequences_start_lost",
        "skipped_packets",
        "unresolvable_after_wrap",
        "malformed_packets",
    ] {
        let n = loss[key].as_u64().unwrap_or(0);
        if n > 0 {
            losses.insert(format!("trace: {key}"), n);
        }
    }
    if loss["file_damaged"].as_bool() == Some(true) {
        losses.insert("trace: file_damaged".into(), 1);
    }
    for stat in loss["stats"].as_array().into_iter().flatten() {
        // ("buffer N: name" | "service: name", value, meaning)
        let label = stat[0].as_str().unwrap_or("?");
        let cause = match label.split_once(": ") {
            Some((scope, name)) if scope.starts_with("buffer") => format!("buffer: {name}"),
            _ => label.to_string(),
        };
        *losses.entry(cause).or_default() += stat[1].as_u64().unwrap_or(0);
    }
    let mut activity = BTreeMap::new();
    for buffer in analysis["stats"]["buffers"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for (name, n) in buffer.as_object().into_iter().flatten() {
            if name != "buffer_size" {
                *activity.entry(format!("buffer: {name}")).or_default() += n.as_u64().unwrap_or(0);
            }
        }
    }
    for (name, n) in analysis["stats"]["service"]
        .as_object()
        .into_iter()
        .flatten()
    {
        activity.insert(format!("service: {name}"), n.as_u64().unwrap_or(0));
    }
    let edge_cuts = ["nesting", "flows"]
        .iter()
        .map(|kind| analysis["problem_counts"][kind].as_u64().unwrap_or(0))
        .sum();
    Ok(Verdict {
        activity,
        edge_cuts,
        ok,
        events: analysis["track_events"]["total"].as_u64().unwrap_or(0),
        bytes: std::fs::metadata(trace).map_or(0, |m| m.len()),
        losses,
        problems: analysis["problem_counts"].to_string(),
    })
}

/// A line on stderr every minute, so a long run shows it is alive.
fn progress(shared: &Shared, started: Instant) {
    let sample = shared.samples.lock().unwrap().last().cloned();
    let probe = shared.probe.lock().unwrap();
    let max = probe.round_trips_us.iter().max().copied().unwrap_or(0);
    let sessions = shared.sessions.lock().unwrap();
    let ok: u64 = sessions.ok.values().sum();
    eprintln!(
        "soak: {:>5.1} min: RSS {} KiB, fds {}, producers {}, sessions ok {ok}, failed {}, \
         probe max {:.1} ms, probe errors {}",
        started.elapsed().as_secs_f64() / 60.0,
        sample.as_ref().map_or(0, |s| s.rss_kib),
        sample.as_ref().map_or(0, |s| s.fds),
        probe.last_producers,
        sessions.failures.len(),
        max as f64 / 1000.0,
        probe.errors.len(),
    );
}

/// The figures of a run.
struct Report {
    minutes: f64,
    producers: usize,
    consumers: usize,
    load: String,
    service_died_at: Option<Duration>,
    service_exit_error: Option<String>,
    samples: Vec<Sample>,
    last: Option<Sample>,
    activity: BTreeMap<String, u64>,
    probe_count: usize,
    probe_max_ms: f64,
    probe_max_at_s: f64,
    probe_p99_ms: f64,
    probe_median_ms: f64,
    probe_stalls: usize,
    fresh_max_ms: f64,
    fresh_p99_ms: f64,
    fresh_stalls: usize,
    probe_errors: Vec<String>,
    /// The service's own "slow turn" warnings: its loop took over 50 ms,
    /// with how much of that it spent on the CPU.
    slow_turns: Vec<String>,
    /// The longest stalls (see [`longest_stalls`]).
    stalls: Vec<Stall>,
    /// The ticker's oversleeps (over [`TICK`]): the longest (ms), how
    /// many over [`STALL`], how many in all.
    ticker_max_ms: f64,
    ticker_over_stall: usize,
    ticker_overruns: usize,
    max_listed_producers: usize,
    max_sessions: usize,
    producer_lines: Vec<String>,
    producer_errors: Vec<String>,
    session_lines: Vec<String>,
    losses: BTreeMap<String, (u64, u64)>,
    edge_cuts: (u64, u64),
    slowest_stop: (u64, String),
    failures: Vec<String>,
    rss_slope_kib_per_min: f64,
    fd_slope_per_min: f64,
    sessions_ok: u64,
}

impl Report {
    /// `service`: when it died, if it did, and its exit's error, if any;
    /// `last`: the sample once every client had gone; `service_log`: the
    /// service's stderr.
    fn new(
        shared: &Shared,
        args: &Args,
        elapsed: Duration,
        service: (Option<Duration>, Option<String>),
        last: Option<Sample>,
        load: String,
        service_log: &Path,
    ) -> Self {
        let (service_died_at, service_exit_error) = service;
        let samples = shared.samples.lock().unwrap().clone();
        let probe = shared.probe.lock().unwrap();
        let ticks = shared.ticks.lock().unwrap().clone();
        let producers = shared.producers.lock().unwrap();
        let sessions = shared.sessions.lock().unwrap();
        let ms = |us: u64| us as f64 / 1000.0;
        let mut trips = probe.round_trips_us.clone();
        trips.sort_unstable();
        let mut fresh = probe.fresh_us.clone();
        fresh.sort_unstable();
        let stall_us = STALL.as_micros() as u64;

        let mut producer_lines = Vec::new();
        for kind in [
            ProducerKind::Real,
            ProducerKind::Ours,
            ProducerKind::Heartbeat,
        ] {
            let mut listed = producers
                .to_listed_ms
                .get(&kind)
                .cloned()
                .unwrap_or_default();
            listed.sort_unstable();
            let exited: Vec<String> = producers
                .exited
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .map(|((_, status), n)| format!("{n} x {status}"))
                .collect();
            producer_lines.push(format!(
                "{:<9} started {:>5}, SIGKILLed {:>5}, exited by themselves: {}; \
                 start to listed: median {} ms, p99 {} ms, max {} ms ({} listed)",
                kind.name(),
                producers.started.get(&kind).copied().unwrap_or(0),
                producers.killed.get(&kind).copied().unwrap_or(0),
                if exited.is_empty() {
                    "none".into()
                } else {
                    exited.join(", ")
                },
                percentile(&listed, 0.5),
                percentile(&listed, 0.99),
                listed.last().copied().unwrap_or(0),
                listed.len(),
            ));
        }
        let mut hb = producers.heartbeat_connect_ms.clone();
        hb.sort_unstable();
        producer_lines.push(format!(
            "heartbeat start to its own \"connected\": median {} ms, p99 {} ms, max {} ms ({})",
            percentile(&hb, 0.5),
            percentile(&hb, 0.99),
            hb.last().copied().unwrap_or(0),
            hb.len()
        ));

        let session_lines = SESSION_KINDS
            .iter()
            .map(|kind| {
                format!(
                    "{:<31} {:>4} traces passed, {:>11} track events, {:>7.1} MiB, \
                     end to trace max {} ms",
                    kind.name(),
                    sessions.ok.get(kind).copied().unwrap_or(0),
                    sessions.events.get(kind).copied().unwrap_or(0),
                    sessions.bytes.get(kind).copied().unwrap_or(0) as f64 / 1048576.0,
                    sessions.stop_to_done_ms.get(kind).copied().unwrap_or(0),
                )
            })
            .collect();
        let losses = sessions
            .losses
            .iter()
            .map(|(cause, n)| {
                (
                    cause.clone(),
                    (
                        *n,
                        sessions.traces_with_loss.get(cause).copied().unwrap_or(0),
                    ),
                )
            })
            .collect();
        // Slopes over the run after its first minute (warm-up).
        let steady: Vec<&Sample> = samples.iter().filter(|s| s.at_s >= 60.0).collect();
        let slope = |value: &dyn Fn(&Sample) -> f64| {
            slope(
                &steady
                    .iter()
                    .map(|s| (s.at_s / 60.0, value(s)))
                    .collect::<Vec<_>>(),
            )
        };
        Report {
            minutes: elapsed.as_secs_f64() / 60.0,
            producers: args.producers,
            consumers: args.consumers,
            load: load.trim().to_string(),
            service_died_at,
            service_exit_error,
            rss_slope_kib_per_min: slope(&|s| s.rss_kib as f64),
            fd_slope_per_min: slope(&|s| s.fds as f64),
            samples,
            last,
            activity: sessions.activity.clone(),
            probe_count: trips.len(),
            probe_max_ms: ms(trips.last().copied().unwrap_or(0)),
            probe_max_at_s: probe.max_at_s,
            probe_p99_ms: ms(percentile(&trips, 0.99)),
            probe_median_ms: ms(percentile(&trips, 0.5)),
            probe_stalls: trips.iter().filter(|&&t| t > stall_us).count(),
            fresh_max_ms: ms(fresh.last().copied().unwrap_or(0)),
            fresh_p99_ms: ms(percentile(&fresh, 0.99)),
            fresh_stalls: fresh.iter().filter(|&&t| t > stall_us).count(),
            probe_errors: probe.errors.clone(),
            slow_turns: std::fs::read_to_string(service_log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("slow turn of the service loop"))
                .map(str::to_string)
                .collect(),
            stalls: longest_stalls(&probe.stalls, &ticks, &sessions.ends),
            ticker_overruns: ticks.len(),
            ticker_max_ms: ticks.iter().map(|t| t.1).fold(0.0, f64::max),
            ticker_over_stall: ticks
                .iter()
                .filter(|t| t.1 > STALL.as_secs_f64() * 1000.0)
                .count(),
            max_listed_producers: probe.max_producers,
            max_sessions: probe.max_sessions,
            producer_lines,
            producer_errors: producers.errors.clone(),
            session_lines,
            losses,
            edge_cuts: sessions.edge_cuts,
            slowest_stop: sessions.slowest_stop.clone(),
            failures: sessions.failures.clone(),
            sessions_ok: sessions.ok.values().sum(),
        }
    }

    fn failed(&self) -> bool {
        self.service_died_at.is_some()
            || self.service_exit_error.is_some()
            || !self.failures.is_empty()
            || !self.probe_errors.is_empty()
            || !self.producer_errors.is_empty()
    }

    fn print(&self) {
        println!(
            "soak: {:.1} min, {} producer slots, {} consumer slots; load average at the end: {}",
            self.minutes, self.producers, self.consumers, self.load
        );
        if let Some(at) = self.service_died_at {
            println!("SERVICE DIED after {:.1} s", at.as_secs_f64());
        }
        if let Some(e) = &self.service_exit_error {
            println!("service exit: {e}");
        }
        println!("service, sampled:");
        println!(
            "  {:>7} {:>10} {:>10} {:>5} {:>7} {:>8} {:>9} {:>8}",
            "t (s)", "RSS (KiB)", "HWM (KiB)", "fds", "threads", "CPU (s)", "producers", "sessions"
        );
        for s in &self.samples {
            println!(
                "  {:>7.0} {:>10} {:>10} {:>5} {:>7} {:>8.1} {:>9} {:>8}",
                s.at_s, s.rss_kib, s.hwm_kib, s.fds, s.threads, s.cpu_s, s.producers, s.sessions
            );
        }
        if let Some(s) = &self.last {
            println!(
                "  {:>7.0} {:>10} {:>10} {:>5} {:>7} {:>8.1}   (every client gone)",
                s.at_s, s.rss_kib, s.hwm_kib, s.fds, s.threads, s.cpu_s
            );
        }
        let (rss, fds) = (
            self.samples.iter().map(|s| s.rss_kib),
            self.samples.iter().map(|s| s.fds),
        );
        println!(
            "  RSS {}..{} KiB, fds {}..{}; after the first minute RSS {:+.1} KiB/min, \
             fds {:+.3}/min (least squares)",
            rss.clone().min().unwrap_or(0),
            rss.max().unwrap_or(0),
            fds.clone().min().unwrap_or(0),
            fds.max().unwrap_or(0),
            self.rss_slope_kib_per_min,
            self.fd_slope_per_min
        );
        println!(
            "  at most {} producers listed and {} sessions at once",
            self.max_listed_producers, self.max_sessions
        );
        println!(
            "probe (QueryServiceState every round, one connection): {} round trips, median {:.2} ms, \
             p99 {:.2} ms, max {:.1} ms (at {:.0} s), {} over {} ms",
            self.probe_count,
            self.probe_median_ms,
            self.probe_p99_ms,
            self.probe_max_ms,
            self.probe_max_at_s,
            self.probe_stalls,
            STALL.as_millis()
        );
        println!(
            "probe (connect + bind + QueryServiceState, every second): p99 {:.2} ms, max {:.1} ms, \
             {} over {} ms",
            self.fresh_p99_ms,
            self.fresh_max_ms,
            self.fresh_stalls,
            STALL.as_millis()
        );
        println!(
            "  the soak's own {tick} ms sleeps (the scheduler's share): {} overran by over {tick} ms, \
             {} by over {} ms, the longest by {:.1} ms",
            self.ticker_overruns,
            self.ticker_over_stall,
            STALL.as_millis(),
            self.ticker_max_ms,
            tick = TICK.as_millis(),
        );
        for stall in &self.stalls {
            println!(
                "  stall at {:.1} s: {:.1} ms{}; meanwhile the soak's sleeps overran by up to \
                 {:.1} ms; sessions ending: {}",
                stall.at_s,
                stall.ms,
                if stall.fresh {
                    " (fresh connection)"
                } else {
                    ""
                },
                stall.ticker_ms,
                if stall.ending.is_empty() {
                    "none".to_string()
                } else {
                    stall.ending.join(", ")
                }
            );
        }
        println!(
            "  the service's slow turns (its loop over 50 ms): {}",
            self.slow_turns.len()
        );
        for line in self.slow_turns.iter().take(10) {
            println!("    {line}");
        }
        for e in &self.probe_errors {
            println!("  probe error: {e}");
        }
        println!("producers:");
        for line in &self.producer_lines {
            println!("  {line}");
        }
        for e in &self.producer_errors {
            println!("  producer error: {e}");
        }
        println!(
            "sessions ({} traces passed; the slowest from its end to its trace: {}, {} ms):",
            self.sessions_ok, self.slowest_stop.1, self.slowest_stop.0
        );
        for line in &self.session_lines {
            println!("  {line}");
        }
        println!(
            "  of which {} passed inspect --check with {} slice ends or flows cut at their \
             edges (a session started inside a producer's slice or stopped inside a flow; \
             not a loss)",
            self.edge_cuts.0, self.edge_cuts.1
        );
        println!(
            "counted losses, by cause (total, traces with it; a service-wide counter's total \
             is its largest value, it counts since the service started):"
        );
        if self.losses.is_empty() {
            println!("  none");
        }
        for (cause, (n, traces)) in &self.losses {
            println!("  {cause:<48} {n:>10} {traces:>6}");
        }
        println!("the service's statistics, summed over the traces that passed (service-wide: the largest):");
        let line: Vec<String> = self
            .activity
            .iter()
            .filter(|(name, _)| ACTIVITY.iter().any(|a| name.ends_with(a)))
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        for chunk in line.chunks(4) {
            println!("  {}", chunk.join(", "));
        }
        println!("failures: {}", self.failures.len());
        for f in &self.failures {
            println!("  {f}");
        }
    }

    fn json(&self) -> Value {
        json!({
            "minutes": self.minutes,
            "producers": self.producers,
            "consumers": self.consumers,
            "load": self.load,
            "service_died_at_s": self.service_died_at.map(|d| d.as_secs_f64()),
            "service_exit_error": self.service_exit_error,
            "samples": self.samples,
            "last_sample": self.last,
            "activity": self.activity,
            "rss_slope_kib_per_min": self.rss_slope_kib_per_min,
            "fd_slope_per_min": self.fd_slope_per_min,
            "probe": {
                "round_trips": self.probe_count,
                "median_ms": self.probe_median_ms,
                "p99_ms": self.probe_p99_ms,
                "max_ms": self.probe_max_ms,
                "max_at_s": self.probe_max_at_s,
                "over_100ms": self.probe_stalls,
                "fresh_p99_ms": self.fresh_p99_ms,
                "fresh_max_ms": self.fresh_max_ms,
                "fresh_over_100ms": self.fresh_stalls,
                "errors": self.probe_errors,
                "stalls": self.stalls,
                "service_slow_turns": self.slow_turns,
                "ticker_max_overrun_ms": self.ticker_max_ms,
                "ticker_overruns_over_100ms": self.ticker_over_stall,
                "ticker_overruns_over_10ms": self.ticker_overruns,
            },
            "producers": self.producer_lines,
            "producer_errors": self.producer_errors,
            "sessions": self.session_lines,
            "sessions_ok": self.sessions_ok,
            "edge_cuts": {"traces": self.edge_cuts.0, "problems": self.edge_cuts.1},
            "slowest_stop": {"session": self.slowest_stop.1, "ms": self.slowest_stop.0},
            "losses": self.losses.iter().map(|(c, (n, t))| (c.clone(), json!({"total": n, "traces": t}))).collect::<serde_json::Map<_, _>>(),
            "failures": self.failures,
        })
    }
}

/// A round trip of the probe over [`STALL`], and what happened meanwhile.
#[derive(Debug, Clone, serde::Serialize)]
struct Stall {
    /// When it started, s into the run.
    at_s: f64,
    /// How long it took.
    ms: f64,
    /// On a fresh connection (connect, bind and QueryServiceState).
    fresh: bool,
    /// The longest [`ticker`] overrun that overlapped it, ms.
    ticker_ms: f64,
    /// The sessions whose end (from their stop to their complete trace,
    /// and a second either side) overlapped it.
    ending: Vec<&'static str>,
}

/// The ten longest `stalls` (start s, ms, fresh), each with the longest
/// [`ticker`] overrun (`ticks`: end s, ms) and the session `ends` that
/// overlapped it.
fn longest_stalls(
    stalls: &[(f64, f64, bool)],
    ticks: &[(f64, f64)],
    ends: &[(f64, f64, SessionKind)],
) -> Vec<Stall> {
    let mut longest = stalls.to_vec();
    longest.sort_by(|a, b| b.1.total_cmp(&a.1));
    longest.truncate(10);
    longest
        .into_iter()
        .map(|(at_s, ms, fresh)| {
            let end = at_s + ms / 1000.0;
            let ticker_ms = ticks
                .iter()
                .filter(|(tick_end, over)| *tick_end >= at_s && tick_end - over / 1000.0 <= end)
                .map(|t| t.1)
                .fold(0.0, f64::max);
            let ending = ends
                .iter()
                .filter(|(stop, done, _)| stop - 1.0 <= end && done + 1.0 >= at_s)
                .map(|(_, _, kind)| kind.name())
                .collect();
            Stall {
                at_s,
                ms,
                fresh,
                ticker_ms,
                ending,
            }
        })
        .collect()
}

/// The `q` quantile of sorted `values` (0 if empty).
fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index]
}

/// Least-squares slope of `points` (x, y); 0 with fewer than 2.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// xorshift64*, seeded from the clock and a per-thread constant: the soak
/// need not replay, only vary.
struct Rng(u64);

impl Rng {
    fn new(salt: u64) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Rng((now ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    /// Uniform in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        lo + self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % (hi - lo).max(1)
    }
}
