//! One producer workload through one tracing service, measured from
//! outside: what the service comparisons share (`smb-bench`, and
//! shmtrace-bench's `service_vs_perfetto`).
//!
//! A run starts the service ([`ServiceImpl`]: `real-service` or `shmtrace
//! serve`) on private sockets in a temporary directory, a consumer
//! recording one track_event session into one ring buffer, and one
//! producer driver ([`ProducerImpl`]) writing a [`ProducerSpec`]'s one
//! phase as fast as it can (its `phases` ignored). Once the producer has
//! reported its phase and the service has gone idle (it has taken what was
//! committed), the consumer stops the session and reads the trace out;
//! every process must then exit cleanly. The service's CPU time (all its threads, to the
//! nanosecond, from `/proc/PID/task/*/schedstat`; neither service ends a
//! thread during such a run) is sampled when it is ready, when it has
//! gone idle after the producer's phase, and once the trace is read; its peak
//! resident set (`VmHWM`) at the end. The trace's track events are counted
//! against what the producer reports it emitted.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::checker::EventCounts;
use crate::config::{self, FillPolicy, TraceConfig};
use crate::error::{HarnessError, Result};
use crate::process::{live_threads_cpu_seconds as cpu_seconds, peak_rss_kib};
use crate::scenario::{
    self, ConsumerImpl, ProducerImpl, ProducerSpec, RealBinaries, Scenario, ServiceImpl,
};

/// How long a process may take to reach a step of the run.
const TIMEOUT: Duration = Duration::from_secs(300);

/// The same work for every service.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// The producer driver.
    pub producer: ProducerImpl,
    /// What it writes (one phase).
    pub spec: ProducerSpec,
    /// The consumer that records the session.
    pub consumer: ConsumerImpl,
    /// The session's ring buffer, KiB.
    pub buffer_kb: u32,
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Track events the producer emitted while the session was on.
    pub emitted: u64,
    /// Track events in the trace.
    pub kept: u64,
    /// Service CPU seconds from its start until it was ready.
    pub service_cpu_startup: f64,
    /// Service CPU seconds from ready until it went idle after the
    /// producer had written its phase: taking what the producer committed.
    pub service_cpu_writing: f64,
    /// Service CPU seconds from then until the consumer had the whole
    /// trace: the stop, the flush (the chunks the producer still held) and
    /// the read-out.
    pub service_cpu_reading: f64,
    /// The service's peak resident set, KiB (`VmHWM`), once the trace is
    /// read.
    pub service_peak_rss_kib: u64,
    /// From the session reaching the producer to its phase report.
    pub producer_wall: Duration,
}

impl Run {
    /// Service CPU seconds from ready until the trace was read.
    pub fn service_cpu(&self) -> f64 {
        self.service_cpu_writing + self.service_cpu_reading
    }
}

/// Runs `workload` once through `service`; `bins` are the real drivers
/// (our service, producer and consumer are found as [`scenario`] finds
/// them).
pub fn run(bins: &RealBinaries, service: ServiceImpl, workload: &Workload) -> Result<Run> {
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-workload-")
        .tempdir_in("/tmp")
        .map_err(|source| HarnessError::Io {
            action: "create a temporary directory in",
            path: "/tmp".into(),
            source,
        })?;
    let path = |name: &str| dir.path().join(name);
    let (producer_socket, consumer_socket) = (path("producer.sock"), path("consumer.sock"));
    let mut service = scenario::start_service(
        service,
        bins,
        dir.path(),
        &producer_socket,
        &consumer_socket,
    )?;
    let cpu_ready = cpu_seconds(service.pid());
    let spec = ProducerSpec {
        phases: 1,
        ..workload.spec
    };
    let mut producer = scenario::start_producer(
        workload.producer,
        bins,
        dir.path(),
        0,
        &spec,
        &producer_socket,
    )?;
    let config_path = path("config.pb");
    let trace = path("trace.pftrace");
    let config = TraceConfig::track_event(
        workload.buffer_kb,
        FillPolicy::RingBuffer,
        &["interop", "interop.*"],
    );
    std::fs::write(&config_path, config::encode(&config)).map_err(|source| HarnessError::Io {
        action: "write",
        path: config_path.clone(),
        source,
    })?;
    let mut consumer = scenario::start_consumer(
        workload.consumer,
        bins,
        dir.path(),
        0,
        &consumer_socket,
        &config_path,
        &trace,
        &Scenario::new("workload", vec![spec]),
    )?;
    consumer.expect_event("connected", TIMEOUT)?;
    producer.expect_event("enabled", TIMEOUT)?;
    let started = Instant::now();
    let phase = producer.expect_event("phase", TIMEOUT)?;
    let producer_wall = started.elapsed();
    let cpu_written = settled_cpu_seconds(service.pid());
    let emitted = serde_json::from_value::<EventCounts>(phase["emitted"].clone())
        .map_err(|e| HarnessError::Scenario(format!("the producer's phase report: {e}")))?
        .track_events();
    match workload.consumer {
        ConsumerImpl::OurCli => scenario::interrupt(&consumer)?,
        ConsumerImpl::Real => consumer.send_line("stop")?,
    }
    consumer.expect_event("done", TIMEOUT)?;
    let cpu_read = cpu_seconds(service.pid());
    let service_peak_rss_kib = peak_rss_kib(service.pid());
    producer.expect_event("stopped", TIMEOUT)?;
    consumer.close_stdin();
    service.close_stdin();
    for p in [&mut consumer, &mut producer, &mut service] {
        p.expect_success(TIMEOUT)?;
    }
    Ok(Run {
        emitted,
        kept: track_events(&trace)?,
        service_cpu_startup: cpu_ready,
        service_cpu_writing: cpu_written - cpu_ready,
        service_cpu_reading: cpu_read - cpu_written,
        service_peak_rss_kib,
        producer_wall,
    })
}

/// How long a service may stay busy after the producer's phase.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the CPU of a settling service is sampled.
const SETTLE_SAMPLE: Duration = Duration::from_millis(50);
/// CPU seconds per [`SETTLE_SAMPLE`] under which a service counts as idle.
const IDLE_CPU: f64 = 0.001;

/// The CPU seconds of process `pid` once it has gone idle (less than
/// [`IDLE_CPU`] in one [`SETTLE_SAMPLE`]), or after [`SETTLE_TIMEOUT`]:
/// the producer reports its phase when its threads are done, which may be
/// before the service has taken every chunk they committed.
fn settled_cpu_seconds(pid: u32) -> f64 {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let mut last = cpu_seconds(pid);
    loop {
        std::thread::sleep(SETTLE_SAMPLE);
        let now = cpu_seconds(pid);
        if now - last < IDLE_CPU || Instant::now() >= deadline {
            return now;
        }
        last = now;
    }
}

/// `TracePacket` with only `track_event` (field 11).
#[derive(Clone, PartialEq, prost::Message)]
struct Packet {
    #[prost(bytes = "vec", optional, tag = "11")]
    track_event: Option<Vec<u8>>,
}

/// Track event packets in the trace at `path`.
fn track_events(path: &Path) -> Result<u64> {
    Ok(crate::trace_file::packets::<Packet>(path)?
        .iter()
        .filter(|p| p.track_event.is_some())
        .count() as u64)
}
