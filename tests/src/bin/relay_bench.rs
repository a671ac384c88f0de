//! How far relays and one central service go (issue 20 item 5), printed
//! as numbers, asserted nowhere. For each N (default 1, 2, 4, 8): `shmtrace
//! serve --enable-relay-endpoint` on TCP loopback as the central service,
//! N `shmtrace relay`s (one "machine" each, on this machine), and behind
//! each relay one `shmtrace-producer` (its `interop_producer` example)
//! writing as fast as it can, under the shmem emulation the central
//! service gives relayed producers. `shmtrace record` records one session
//! of all machines (`trace_all_machines`) into a ring buffer that holds
//! every event.
//!
//! Per N: the track events emitted and kept in the trace (a producer drops
//! what it writes while its emulated buffer is full, so the kept events
//! measure what the relays and the central service carried); the events
//! per second kept, in all and per relay, over the time the producers
//! wrote (from the last producer's `enabled` to the last one's report);
//! the CPU time of the central service, of each relay and of the
//! producers over that time (user + system, from `/proc/<pid>/stat`), also
//! as cores busy. Events still in flight when the producers report (in
//! socket buffers: a few MB) are kept but not timed. The central service saturates where
//! its CPU approaches one core (its event loop is one thread) or the
//! machine's cores are all busy, and the kept rate stops growing with N.
//!
//! ```text
//! cargo build --release -p shmtrace-cli --bin shmtrace -p shmtrace-producer --example interop_producer
//! SHMTRACE_BIN=target/release/shmtrace \
//! SHMTRACE_INTEROP_PRODUCER=target/release/examples/interop_producer \
//!   cargo run -p shmtrace-tests --bin relay-bench -- [--relays 1,2,4,8] [--events N] [--threads N]
//! ```
//!
//! This program only starts the others and counts packets, so its own
//! build profile hardly matters; the service, relays and producers should
//! be release builds (the variables above point at them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shmtrace_tests::config::{self, FillPolicy, TraceConfig};
use shmtrace_tests::process::{cpu_seconds, ChildProcess};
use shmtrace_tests::scenario::{
    self, ConsumerImpl, MachineEnv, ProducerImpl, ProducerSpec, RealBinaries, Scenario,
};

const EVENTS_PER_ITERATION: u64 = ProducerSpec::TRACK_EVENTS_PER_ITERATION;
/// The longest any step may take.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Command-line arguments.
#[derive(Debug, clap::Parser)]
#[command(
    about = "Events per second and CPU through N relays into one central service (see the module docs)"
)]
struct Args {
    /// Numbers of relays to run, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    relays: Vec<u32>,
    /// Track events each producer writes.
    #[arg(long, default_value_t = 600_000)]
    events: u64,
    /// Threads per producer.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    threads: u64,
    /// Pause after each iteration (9 events) of each thread, µs: 0 writes
    /// as fast as the producer can; more offers the relays a load they
    /// may carry whole.
    #[arg(long = "iteration-sleep-us", default_value_t = 0)]
    iteration_sleep_us: u32,
}

fn main() {
    let Args {
        relays,
        events,
        threads,
        iteration_sleep_us,
    } = clap::Parser::parse();
    let iterations = events.div_ceil(EVENTS_PER_ITERATION * threads);
    let per_producer = iterations * threads * EVENTS_PER_ITERATION;
    println!(
        "relay bench: per relay one producer, {per_producer} events ({threads} threads x \
         {iterations} iterations, {iteration_sleep_us} µs pause after each); {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:>6} {:>10} {:>10} {:>7} {:>8} {:>12} {:>12} {:>12} {:>14} {:>16} {:>14}",
        "relays",
        "emitted",
        "kept",
        "kept%",
        "wall s",
        "emitted ev/s",
        "kept ev/s",
        "per relay",
        "central CPU s",
        "relay CPU s avg",
        "producers CPU"
    );
    for n in relays {
        let run = run(n, threads as u32, iterations as u32, iteration_sleep_us);
        let wall = run.wall.as_secs_f64();
        let relay_cpu = run.relay_cpu.iter().sum::<f64>() / f64::from(n.max(1));
        println!(
            "{:>6} {:>10} {:>10} {:>6.1}% {:>8.2} {:>12.0} {:>12.0} {:>12.0} {:>7.2} ({:.2}c) {:>7.3} ({:.2}c) {:>7.2} ({:.2}c)",
            n,
            run.emitted,
            run.kept,
            100.0 * run.kept as f64 / run.emitted.max(1) as f64,
            wall,
            run.emitted as f64 / wall,
            run.kept as f64 / wall,
            run.kept as f64 / wall / f64::from(n.max(1)),
            run.central_cpu,
            run.central_cpu / wall,
            relay_cpu,
            relay_cpu / wall,
            run.producer_cpu,
            run.producer_cpu / wall,
        );
        println!(
            "       CPU per million kept events: relays {:.3} s, central {:.3} s (and {:.3} s to \
             read them out); kept per machine: {:?}",
            run.relay_cpu.iter().sum::<f64>() / (run.kept.max(1) as f64 / 1e6),
            run.central_cpu / (run.kept.max(1) as f64 / 1e6),
            run.central_read_cpu / (run.kept.max(1) as f64 / 1e6),
            run.kept_per_machine.values().collect::<Vec<_>>()
        );
    }
}

/// One run with N relays.
struct Run {
    /// Track events the producers emitted.
    emitted: u64,
    /// Track events in the trace.
    kept: u64,
    /// Per machine id, its track events in the trace.
    kept_per_machine: BTreeMap<u32, u64>,
    /// From the last producer's `enabled` to the last one's report.
    wall: Duration,
    /// CPU the central service spent over `wall`.
    central_cpu: f64,
    /// CPU the central service spent after `wall`: the stop, and the
    /// read of the whole trace.
    central_read_cpu: f64,
    /// CPU each relay spent over `wall`.
    relay_cpu: Vec<f64>,
    /// CPU the producers spent together over `wall`.
    producer_cpu: f64,
}

fn run(relays: u32, threads: u32, iterations: u32, iteration_sleep_us: u32) -> Run {
    let fail = |e: shmtrace_tests::HarnessError| -> ! { panic!("{e}") };
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-relay-bench-")
        .tempdir_in("/tmp")
        .expect("a temporary directory");
    let path = |name: &str| dir.path().join(name);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free TCP port")
        .port();
    let central = PathBuf::from(format!("127.0.0.1:{port}"));
    let consumer_socket = path("consumer.sock");
    // Never started: only our service, relays, producers and CLI run.
    let bins = RealBinaries {
        service: PathBuf::from("real-service"),
        producer: PathBuf::from("real-producer"),
        consumer: PathBuf::from("real-consumer"),
    };
    let mut service = scenario::start_service_with(
        scenario::ServiceImpl::Ours,
        &bins,
        dir.path(),
        &central,
        &consumer_socket,
        true,
        false,
    )
    .unwrap_or_else(|e| fail(e));
    let mut relay_processes = Vec::new();
    let mut producers = Vec::new();
    let spec = |machine| ProducerSpec {
        threads,
        iterations,
        iteration_sleep_us,
        machine,
        ..Default::default()
    };
    for machine in 0..relays {
        let machine_dir = path(&scenario::machine_name(machine));
        std::fs::create_dir_all(&machine_dir).expect("a machine directory");
        let listen = machine_dir.join("producer.sock");
        relay_processes.push(
            scenario::start_relay(dir.path(), machine, MachineEnv::HOST, &listen, &central)
                .unwrap_or_else(|e| fail(e)),
        );
        producers.push(
            scenario::start_producer_on(
                ProducerImpl::Ours,
                &bins,
                dir.path(),
                machine as usize,
                &spec(machine),
                &listen,
                MachineEnv::HOST,
            )
            .unwrap_or_else(|e| fail(e)),
        );
    }
    let config_path = path("config.pb");
    let trace = path("trace.pftrace");
    // Room for every event (under 48 bytes each, packet and chunk overhead
    // included), at most 2 GiB (over 40 million events, more than this
    // machine carries in a run of the default size).
    let events = u64::from(relays * threads * iterations) * EVENTS_PER_ITERATION;
    let buffer_kb = (64 * 1024 + events * 48 / 1024).min(2 * 1024 * 1024) as u32;
    let mut config =
        TraceConfig::track_event(buffer_kb, FillPolicy::RingBuffer, &["interop", "interop.*"]);
    config.trace_all_machines = Some(true);
    std::fs::write(&config_path, config::encode(&config)).expect("write the config");
    let mut consumer = scenario::start_consumer(
        ConsumerImpl::OurCli,
        &bins,
        dir.path(),
        0,
        &consumer_socket,
        &config_path,
        &trace,
        &Scenario::new("relay-bench", vec![spec(0)]),
    )
    .unwrap_or_else(|e| fail(e));
    let step = |p: &mut ChildProcess, event: &str| {
        p.expect_event(event, TIMEOUT).unwrap_or_else(|e| fail(e))
    };
    step(&mut consumer, "connected");
    for producer in &mut producers {
        step(producer, "enabled");
    }
    let started = Instant::now();
    let cpu_at_start = Cpu::read(&service, &relay_processes, &producers);
    let mut emitted = 0;
    for producer in &mut producers {
        let phase = step(producer, "phase");
        emitted += [
            "slice_begin",
            "slice_end",
            "instant",
            "counter_int",
            "counter_double",
        ]
        .iter()
        .map(|k| phase["emitted"][k].as_u64().unwrap_or(0))
        .sum::<u64>();
    }
    let wall = started.elapsed();
    let cpu = Cpu::read(&service, &relay_processes, &producers).since(&cpu_at_start);
    scenario::interrupt(&consumer).unwrap_or_else(|e| fail(e));
    step(&mut consumer, "done");
    let central_read_cpu = cpu_seconds(service.pid()) - cpu_at_start.central - cpu.central;
    for producer in &mut producers {
        step(producer, "stopped");
    }
    consumer.close_stdin();
    consumer.expect_success(TIMEOUT).unwrap_or_else(|e| fail(e));
    for p in &mut producers {
        p.expect_success(TIMEOUT).unwrap_or_else(|e| fail(e));
    }
    service.close_stdin();
    service.expect_success(TIMEOUT).unwrap_or_else(|e| fail(e));
    for relay in &mut relay_processes {
        relay.close_stdin();
        relay.expect_success(TIMEOUT).unwrap_or_else(|e| fail(e));
    }
    let kept_per_machine = track_events_per_machine(&trace);
    let kept: u64 = kept_per_machine.values().sum();
    if kept * 48 / 1024 > u64::from(buffer_kb) * 9 / 10 {
        eprintln!(
            "warning: {relays} relays: the trace buffer ({buffer_kb} KiB) may have wrapped: \
             fewer events"
        );
    }
    Run {
        emitted,
        kept,
        kept_per_machine,
        wall,
        central_cpu: cpu.central,
        central_read_cpu,
        relay_cpu: cpu.relays,
        producer_cpu: cpu.producers.iter().sum(),
    }
}

/// CPU seconds (user + system) spent so far.
struct Cpu {
    central: f64,
    relays: Vec<f64>,
    producers: Vec<f64>,
}

impl Cpu {
    fn read(central: &ChildProcess, relays: &[ChildProcess], producers: &[ChildProcess]) -> Self {
        let of = |ps: &[ChildProcess]| ps.iter().map(|p| cpu_seconds(p.pid())).collect();
        Cpu {
            central: cpu_seconds(central.pid()),
            relays: of(relays),
            producers: of(producers),
        }
    }

    /// What was spent since `before`.
    fn since(&self, before: &Cpu) -> Cpu {
        let minus = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a - b).collect();
        Cpu {
            central: self.central - before.central,
            relays: minus(&self.relays, &before.relays),
            producers: minus(&self.producers, &before.producers),
        }
    }
}

/// `TracePacket` with only `track_event` (field 11) and `machine_id` (98).
#[derive(Clone, PartialEq, prost::Message)]
struct Packet {
    #[prost(bytes = "vec", optional, tag = "11")]
    track_event: Option<Vec<u8>>,
    #[prost(uint32, optional, tag = "98")]
    machine_id: Option<u32>,
}

/// Track event packets in the trace at `path`, per machine id.
fn track_events_per_machine(path: &Path) -> BTreeMap<u32, u64> {
    let mut kept = BTreeMap::new();
    for packet in
        shmtrace_tests::trace_file::packets::<Packet>(path).unwrap_or_else(|e| panic!("{e}"))
    {
        if packet.track_event.is_some() {
            *kept.entry(packet.machine_id.unwrap_or(0)).or_default() += 1;
        }
    }
    kept
}
