//! The firmware bridge end to end, in one process: a simulated firmware
//! source (shmtrace-abi's `TraceWriter` over its own shared memory, 584-byte
//! chunks, events stamped on its clock 65; it answers the bridge's sync
//! requests with its time), the bridge's shell (`cli::bridge::run`)
//! forwarding it as a producer, the in-process service (`cli::local`) and
//! `record`'s consumer writing the trace; `inspect` judges it.
//!
//! One test per binary: the producer is a process-wide singleton.

mod bridge_common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bridge_common::{firmware_events, ITERATIONS};
use shmtrace_cli::bridge::run::{boottime_ns, run, BridgeOptions};
use shmtrace_cli::bridge::{
    ClockSample, FirmwareEvent, FirmwareSource, Hello, Request, SourceError,
};
use shmtrace_cli::config::Config;
use shmtrace_cli::consumer::Consumer;
use shmtrace_cli::local::{InProcessService, SocketDir};
use shmtrace_cli::record::{self, Begin, OutputFile, Progress, ProgressMode};
use shmtrace_service::ipc::SocketAddress;
use shmtrace_service::service::shell::ShellConfig;

const DATA_SOURCE: &str = "sim.firmware";

/// How long the simulated firmware takes to show a flush done.
const FLUSH_TAKES: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Shared {
    requests: Vec<Request>,
    /// When the first flush asked was done.
    first_flush_done: Option<Instant>,
    /// Every firmware event was handed to the bridge.
    delivered: bool,
}

struct SimFirmware {
    booted: u64,
    queue: VecDeque<FirmwareEvent>,
    generated: bool,
    shared: Arc<Mutex<Shared>>,
    finish: Arc<AtomicBool>,
    /// When the flush asked last is done.
    flush_done: Option<Instant>,
}

impl SimFirmware {
    fn now(&self) -> u64 {
        boottime_ns() - self.booted
    }
}

impl FirmwareSource for SimFirmware {
    fn poll(&mut self, timeout: Duration) -> Result<Option<FirmwareEvent>, SourceError> {
        if let Some(e) = self.queue.pop_front() {
            return Ok(Some(e));
        }
        if self.generated {
            self.shared.lock().unwrap().delivered = true;
        }
        if self.finish.load(Ordering::Relaxed) {
            return Err(SourceError::Ended);
        }
        std::thread::sleep(timeout);
        Ok(None)
    }

    fn transport_loss(&self) -> Vec<(&'static str, u64)> {
        vec![("bad_crc", 0)]
    }

    fn flush_pending(&mut self) -> bool {
        self.flush_done.is_some_and(|done| Instant::now() < done)
    }

    fn request(&mut self, r: Request) -> bool {
        let mut shared = self.shared.lock().unwrap();
        shared.requests.push(r);
        if r == Request::Flush {
            let done = Instant::now() + FLUSH_TAKES;
            self.flush_done = Some(done);
            shared.first_flush_done.get_or_insert(done);
        }
        drop(shared);
        match r {
            Request::Sync(nonce) => {
                // Answered at once, as a region's sync words would be.
                let firmware_ns = self.now();
                self.queue.push_back(FirmwareEvent::Clock(ClockSample {
                    firmware_ns,
                    nonce: Some(nonce),
                    transfer_ns: 0,
                }));
            }
            Request::Enable(true) if !self.generated => {
                self.generated = true;
                let booted = self.booted;
                let events = firmware_events(|| boottime_ns() - booted);
                self.queue.extend(events);
                self.queue
                    .push_back(FirmwareEvent::Stats(vec![("packets_dropped".into(), 0)]));
            }
            _ => {}
        }
        true
    }

    fn can_sync(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        "simulated firmware".into()
    }
}

#[test]
fn a_simulated_firmware_is_recorded_through_the_bridge() {
    let dir = SocketDir::create("bridge-test").unwrap();
    let (producer_socket, consumer_socket) =
        (dir.socket("producer.sock"), dir.socket("consumer.sock"));
    let _service = InProcessService::start(ShellConfig {
        producer_sockets: vec![SocketAddress::Path(producer_socket.clone())],
        consumer_socket: SocketAddress::Path(consumer_socket.clone()),
        consumer_group: None,
        listen_any: false,
        relay_endpoint: false,
    })
    .unwrap();

    let shared = Arc::new(Mutex::new(Shared::default()));
    let finish = Arc::new(AtomicBool::new(false));
    let booted = boottime_ns() - 5_000_000;
    let mut source = SimFirmware {
        booted,
        queue: VecDeque::from([FirmwareEvent::Hello(Hello {
            boot_id: 0x1234,
            data_source: DATA_SOURCE.into(),
            producer: "sim-mcu".into(),
            clock_id: 65,
        })]),
        generated: false,
        shared: shared.clone(),
        finish: finish.clone(),
        flush_done: None,
    };
    let options = BridgeOptions {
        socket: Some(producer_socket.display().to_string()),
        ..Default::default()
    };
    let bridge = std::thread::spawn(move || {
        let never = AtomicBool::new(false);
        run(&mut source, &options, &never)
    });

    let consumer = Consumer::connect(Some(&consumer_socket.display().to_string())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = consumer.service_state(false).unwrap();
        let listed = state
            .data_sources
            .iter()
            .any(|d| d.ds_descriptor.as_ref().and_then(|d| d.name.as_deref()) == Some(DATA_SOURCE));
        let named = state
            .producers
            .iter()
            .any(|p| p.name.as_deref() == Some("sim-mcu"));
        if listed && named {
            // Not before the firmware was quiet (the flush asked at its
            // hello done): a session starting sooner would get what that
            // flush commits.
            let quiet = shared.lock().unwrap().first_flush_done;
            assert!(
                quiet.is_some_and(|t| t <= Instant::now()),
                "registered before the quieting flush was done"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the bridge never registered");
        std::thread::sleep(Duration::from_millis(20));
    }
    let config = Config::from_text(
        &format!(
            "buffers {{ size_kb: 4096 }} data_sources {{ config {{ name: \"{DATA_SOURCE}\" }} }}"
        ),
        "the test",
    )
    .unwrap();
    let trace = dir.socket("trace.pftrace");
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = {
        let (stop, shared) = (stop.clone(), shared.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !shared.lock().unwrap().delivered && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            stop.store(true, Ordering::Relaxed);
        })
    };
    let status = record::record_session(
        &consumer,
        &config,
        Begin::Enable,
        Some(OutputFile::open(&trace).unwrap()),
        trace.clone(),
        record::Stop::on_request(&stop),
        &mut Progress::new(ProgressMode::None),
    )
    .unwrap();
    stopper.join().unwrap();
    assert_eq!(status, 0);
    finish.store(true, Ordering::Relaxed);
    let summary = bridge.join().unwrap().unwrap();

    eprintln!("{summary}");
    let analysis = shmtrace_cli::inspect::analyze_files(&[trace]).unwrap();
    assert!(analysis.ok(), "{:?}", analysis.problems);
    let te = &analysis.track_events;
    assert_eq!(
        (te.slice_begin, te.slice_end, te.instant, te.open_slices),
        (ITERATIONS, ITERATIONS, ITERATIONS, 0)
    );
    assert_eq!(te.by_name.get("tick"), Some(&ITERATIONS));

    // The firmware was kept quiet until the session (its hello came with
    // none running: disabled, then flushed), saw the session start (a
    // clear, then enabled), the session's flush, and the end: disabled,
    // then flushed.
    let requests = shared.lock().unwrap().requests.clone();
    assert!(requests.iter().any(|r| matches!(r, Request::Sync(_))));
    let asked: Vec<Request> = requests
        .iter()
        .copied()
        .filter(|r| !matches!(r, Request::Sync(_)))
        .collect();
    let (quiet, enable, end) = (
        [Request::Enable(false), Request::Flush],
        [Request::Clear, Request::Enable(true)],
        asked.len().saturating_sub(2),
    );
    assert!(asked.len() >= 7, "{asked:?}");
    assert_eq!(asked[..2], quiet, "{asked:?}");
    assert_eq!(asked[2..4], enable, "{asked:?}");
    assert!(asked[4..end].contains(&Request::Flush), "{asked:?}");
    assert_eq!(asked[end..], quiet, "{asked:?}");

    let e = &summary.engine;
    assert_eq!(e.boots, 1);
    assert!(e.chunks >= 8, "{summary}");
    assert_eq!(e.chunks_forwarded, e.chunks, "{summary}");
    assert_eq!(e.chunks_without_clock, 0, "{summary}");
    assert!(e.patch_groups > 0, "{summary}");
    assert_eq!(summary.forward.patches_dropped, 0, "{summary}");
    let clock = summary.clock.unwrap();
    let est = clock.estimate.expect("a measured clock");
    assert!(est.two_way);
    // The simulated firmware's clock is BOOTTIME - booted, exactly: the
    // estimate is within its bound of that.
    assert!(
        est.offset_ns.abs_diff(booted as i64) <= est.bound_ns,
        "{summary}"
    );
    assert!(!summary.lost_anything(), "{summary}");
    let text = summary.to_string();
    assert!(text.contains("clock 65: BOOTTIME = firmware +"), "{text}");
}
