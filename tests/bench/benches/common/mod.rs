//! What the benchmarks share: the tracing service they record through,
//! a session enabling the benchmark's categories (started through the
//! Perfetto C SDK's consumer API, which works with either service), and
//! timing by CPU time in rounds.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use perfetto_sdk::producer::{Backends, Producer as CProducer, ProducerInitArgsBuilder};
use perfetto_sdk::tracing_session::TracingSession;
use shmtrace_abi::proto::{encode_to_slice, encoded_len, Message, Sink};

/// Iterations per round and rounds per cell.
pub const ITERATIONS: u64 = 50_000;
pub const ROUNDS: usize = 9;

/// The tracing service the benchmark records through.
pub struct Service {
    child: Option<Child>,
    _dir: PathBuf,
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts the service `$SHMTRACE_BENCH_SERVICE` with
/// `$SHMTRACE_BENCH_SERVICE_ARGS` (default: the harness's `real-service`
/// flags) on private sockets, and points `$PERFETTO_PRODUCER_SOCK_NAME` /
/// `$PERFETTO_CONSUMER_SOCK_NAME` at them; without it, uses a service
/// already listening there; `None` with neither (`name` says which
/// benchmark skips).
pub fn start_service(name: &str) -> Option<Service> {
    let dir = std::env::temp_dir().join(format!("shmtrace-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let Some(bin) = std::env::var_os("SHMTRACE_BENCH_SERVICE") else {
        let running = std::env::var_os("PERFETTO_PRODUCER_SOCK_NAME").is_some()
            && std::env::var_os("PERFETTO_CONSUMER_SOCK_NAME").is_some();
        if !running {
            println!(
                "{name}: skipped: set SHMTRACE_BENCH_SERVICE to a tracing service binary (e.g. \
                 the harness's real-service), or PERFETTO_PRODUCER_SOCK_NAME and \
                 PERFETTO_CONSUMER_SOCK_NAME to a running service"
            );
        }
        return running.then_some(Service {
            child: None,
            _dir: dir,
        });
    };
    let producer = dir.join("producer.sock");
    let consumer = dir.join("consumer.sock");
    let template = std::env::var("SHMTRACE_BENCH_SERVICE_ARGS").unwrap_or_else(|_| {
        "--producer-socket {producer} --consumer-socket {consumer} --exit-on-stdin-eof".into()
    });
    let args: Vec<String> = template
        .split_whitespace()
        .map(|a| {
            a.replace("{producer}", &producer.to_string_lossy())
                .replace("{consumer}", &consumer.to_string_lossy())
        })
        .collect();
    let child = Command::new(&bin)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", PathBuf::from(&bin).display()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(producer.exists() && consumer.exists()) {
        assert!(
            Instant::now() < deadline,
            "the service did not create its sockets"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::env::set_var("PERFETTO_PRODUCER_SOCK_NAME", &producer);
    std::env::set_var("PERFETTO_CONSUMER_SOCK_NAME", &consumer);
    Some(Service {
        child: Some(child),
        _dir: dir,
    })
}

/// Initializes the Perfetto C SDK with its system backend (its producer,
/// and the consumer that starts the session), asking for an SMB of
/// `smb_kb`.
pub fn init_c_sdk(smb_kb: u32) {
    CProducer::init(
        ProducerInitArgsBuilder::new()
            .backends(Backends::SYSTEM)
            .shmem_size_hint_kb(smb_kb)
            .build(),
    );
}

/// Starts a session (256 MiB ring buffer) whose track event config
/// enables exactly `categories`.
pub fn start_session(categories: &[&str]) -> TracingSession {
    let mut config = vec![0u8; encoded_len(|c| write_config(c, categories)) as usize];
    let n = encode_to_slice(&mut config, |c| write_config(c, categories)).expect("config encodes");
    config.truncate(n);
    let mut session = TracingSession::system().expect("consumer session");
    session.setup(&config);
    session.start_blocking();
    session
}

fn write_config<S: Sink>(c: &mut Message<'_, S>, categories: &[&str]) {
    // TraceConfig.buffers (1): {size_kb (1) = 256 MiB, fill_policy (4) = RING_BUFFER (1)}
    c.nested(1, |b| {
        b.uint32(1, 256 * 1024);
        b.enumeration(4, 1);
    });
    // TraceConfig.data_sources (2): {config (1): {name (1), track_event_config (113)}}
    c.nested(2, |ds| {
        ds.nested(1, |cfg| {
            cfg.string(1, "track_event");
            cfg.nested(113, |te| {
                te.string(1, "*");
                for on in categories {
                    te.string(2, on);
                }
            });
        });
    });
}

/// Stops `session` and, if `$SHMTRACE_BENCH_TRACE` names a file, writes
/// the trace it recorded there (to check with `shmtrace inspect` that the
/// events measured were recorded).
pub fn stop_session(mut session: TracingSession) {
    session.stop_blocking();
    let Some(path) = std::env::var_os("SHMTRACE_BENCH_TRACE") else {
        return;
    };
    let trace = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = trace.clone();
    session.read_trace_blocking(move |data, _last| {
        sink.lock().expect("trace buffer").extend_from_slice(data);
    });
    let trace = trace.lock().expect("trace buffer");
    std::fs::write(&path, &*trace).expect("the trace file is written");
    println!(
        "trace: {} bytes written to {}",
        trace.len(),
        PathBuf::from(path).display()
    );
}

/// Starts our producer `name` (an SMB of `smb_kb` KiB) on the service's
/// socket, registers `categories` and waits (at most `timeout`) until it
/// is connected.
pub fn start_producer(
    name: &str,
    smb_kb: u32,
    categories: &[&'static shmtrace_producer::Category],
    timeout: Duration,
) {
    let producer = shmtrace_producer::init(shmtrace_producer::ProducerConfig {
        name: name.into(),
        socket: std::env::var("PERFETTO_PRODUCER_SOCK_NAME").ok(),
        shmem_size_hint_bytes: smb_kb * 1024,
        ..Default::default()
    })
    .expect("our producer starts");
    shmtrace_producer::track_event::register_categories(categories);
    assert!(
        producer.wait_connected(timeout),
        "our producer did not connect"
    );
}

/// Waits (at most 10 s) until `ready` holds: the session reached every
/// producer.
pub fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// CPU time of the calling thread: other processes on the machine do not
/// inflate it.
pub fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// One implementation's timed loop for one row: runs the body
/// `ITERATIONS` times and returns CPU ns per iteration. Each sampler is its
/// own closure with the body inlined in its loop (monomorphic: no indirect
/// call per iteration); the only dynamic call is the one per round.
pub type Sampler<'a> = Box<dyn FnMut() -> f64 + 'a>;

/// A [`Sampler`] running `$body` (with the iteration number bound to `$i`)
/// in a tight loop between two reads of the thread's CPU clock.
macro_rules! sampler {
    (|$i:ident| $body:expr) => {
        sampler!($crate::common::ITERATIONS, |$i| $body)
    };
    ($n:expr, |$i:ident| $body:expr) => {
        Box::new(|| {
            let start = $crate::common::cpu_ns();
            for $i in 0..$n {
                $body;
            }
            ($crate::common::cpu_ns() - start) as f64 / $n as f64
        }) as $crate::common::Sampler<'_>
    };
}

/// Median CPU ns per operation of each implementation over `ROUNDS`
/// rounds, the implementations interleaved (rotating which goes first) so
/// none pays for the service draining another's data.
pub fn measure<const N: usize>(mut row: [Sampler<'_>; N]) -> [f64; N] {
    // Warm-up: writers created, interning tables and caches filled.
    for f in row.iter_mut() {
        f();
    }
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    for round in 0..ROUNDS {
        for k in 0..N {
            let which = (round + k) % N;
            // Let the service drain the SMB between samples.
            std::thread::sleep(Duration::from_millis(20));
            samples[which].push(row[which]());
        }
    }
    samples.map(|mut s| {
        s.sort_by(|a, b| a.total_cmp(b));
        s[ROUNDS / 2]
    })
}

/// Whether cargo runs the benchmark as a test: it then only checks that it
/// starts. `cargo bench` passes `--bench`; `cargo test --benches` passes no
/// argument to a benchmark without libtest's harness, but runs it, as every
/// cargo command that runs a program does, with `$CARGO_MANIFEST_DIR` set.
/// A benchmark run by hand (say, under valgrind) has neither, and runs;
/// libtest's `--test` and `--list` also mean test mode.
pub fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let by_cargo = std::env::var_os("CARGO_MANIFEST_DIR").is_some();
    args.iter().any(|a| a == "--test" || a == "--list")
        || (by_cargo && !args.iter().any(|a| a == "--bench"))
}
