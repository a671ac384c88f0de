//! `shmtrace demo`: the whole stack in one command, on the same code paths
//! a real deployment takes.
//!
//! 1. The tracing service starts in this process (its epoll shell on a
//!    thread), listening on private sockets in a fresh directory.
//! 2. The example [app] starts: its producer (`shmtrace-producer`) connects
//!    to the producer socket, registers `track_event`, and gets its shared
//!    memory buffer from the service once a session starts; its threads
//!    write track events into that buffer.
//! 3. `record`'s consumer connects to the consumer socket and runs a
//!    session for a few seconds; then the app is stopped (every slice
//!    closed, every flow ended), the session is flushed and stopped, the
//!    buffers are read into `demo.pftrace`, and the summary is printed.
//!
//! Ctrl-C stops early and keeps what was recorded.

pub mod app;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{Config, Fill, QuickConfig};
use super::consumer::Consumer;
use super::local::{InProcessService, SocketDir};
use super::record::{self, OutputFile, Progress, ProgressMode};
use super::units::{parse_duration, Elapsed};
use super::CliError;
use app::App;
use shmtrace_ipc::SocketAddress;
use shmtrace_service::service::shell::ShellConfig;

/// Name of the example app's producer.
pub const PRODUCER_NAME: &str = "shmtrace-demo";

/// How long the app and the service may take to come up.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `shmtrace demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Output file.
    #[arg(
        short = 'o',
        long = "out",
        value_name = "FILE",
        default_value = "demo.pftrace"
    )]
    pub out: PathBuf,
    /// How long to record (the app runs that long once tracing started).
    #[arg(short = 't', long = "time", value_name = "DURATION", default_value = "3s", value_parser = parse_duration)]
    pub time: Duration,
    /// How to show progress.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
}

/// Waits until the service lists the app's track_event data source.
fn wait_registered(consumer: &Consumer) -> Result<(), CliError> {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        let state = consumer.service_state(false)?;
        let producer_id = state
            .producers
            .iter()
            .find(|p| p.name.as_deref() == Some(PRODUCER_NAME))
            .and_then(|p| p.id);
        let registered = producer_id.is_some()
            && state.data_sources.iter().any(|d| {
                d.producer_id == producer_id
                    && d.ds_descriptor.as_ref().and_then(|d| d.name.as_deref())
                        == Some(shmtrace_producer::TRACK_EVENT_DATA_SOURCE)
            });
        if registered {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CliError::Demo(
                "the example app did not register its data source with the service".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `shmtrace demo`; returns the exit status.
pub fn run(args: &DemoArgs) -> Result<u8, CliError> {
    let mut progress = Progress::new(args.progress);
    let output = OutputFile::open(&args.out)?;
    let signals = record::stop_signals()?;

    // 1. The service, on private sockets.
    let dir = SocketDir::create("demo")?;
    let producer_socket = dir.socket("producer.sock");
    let consumer_socket = dir.socket("consumer.sock");
    let service = InProcessService::start(ShellConfig {
        producer_sockets: vec![SocketAddress::Path(producer_socket.clone())],
        consumer_socket: SocketAddress::Path(consumer_socket.clone()),
        consumer_group: None,
        listen_any: false,
        relay_endpoint: false,
    })
    .map_err(CliError::Demo)?;
    progress.note(&format!(
        "tracing service running in this process on {}",
        dir.path().display()
    ));

    // 2. The example app and its producer.
    let producer = shmtrace_producer::init(shmtrace_producer::ProducerConfig {
        name: PRODUCER_NAME.into(),
        socket: Some(producer_socket.display().to_string()),
        ..Default::default()
    })
    .map_err(|e| CliError::Demo(format!("the example app cannot start its producer: {e}")))?;
    shmtrace_producer::set_process_name("shmtrace demo app");
    shmtrace_producer::track_event::register_categories(&app::CATEGORIES);
    if !producer.wait_connected(STARTUP_TIMEOUT) {
        return Err(CliError::Demo(
            "the example app did not connect to the tracing service".into(),
        ));
    }
    let consumer = Consumer::connect(Some(&consumer_socket.display().to_string()))?;
    wait_registered(&consumer)?;
    let app = App::start().map_err(CliError::Output)?;
    progress.note(&format!(
        "example app running: a 60 fps main loop and {} workers, categories {}",
        app::WORKERS,
        app::CATEGORIES.map(|c| c.name()).join(", ")
    ));

    // 3. Record. A controller thread stops the app after the requested
    // time (or on Ctrl-C), then tells the session to stop.
    let config = Config::from_quick(&QuickConfig {
        duration: None,
        buffer_kb: super::config::DEFAULT_BUFFER_KB,
        categories: Vec::new(),
        fill: Fill::Ring,
    })
    .with_origin("the demo: track_event, every category, 32 MiB ring buffer");
    let session_stop = Arc::new(AtomicBool::new(false));
    let time = args.time;
    let controller = {
        let (signals, session_stop) = (Arc::clone(&signals), Arc::clone(&session_stop));
        std::thread::Builder::new()
            .name("shmtrace-demo".into())
            .spawn(move || {
                // Until `until`, Ctrl-C, the session's end, or `limit`.
                let wait = |until: &dyn Fn() -> bool, limit: Duration| {
                    let deadline = Instant::now() + limit;
                    while !until()
                        && !signals.load(Ordering::Relaxed)
                        && !session_stop.load(Ordering::Relaxed)
                        && Instant::now() < deadline
                    {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                };
                wait(&|| app::FRAME.is_enabled(), STARTUP_TIMEOUT);
                // The app renders from here until stopped: `time`, unless
                // Ctrl-C or the session's end comes first.
                let rendering = Instant::now();
                wait(&|| false, time);
                let stats = app.stop();
                session_stop.store(true, Ordering::Relaxed);
                (stats, rendering.elapsed())
            })
            .map_err(CliError::Output)?
    };
    let status = record::record_session(
        &consumer,
        &config,
        record::Begin::Enable,
        Some(output),
        args.out.clone(),
        record::Stop {
            flag: &session_stop,
            why: &|| {
                if signals.load(Ordering::Relaxed) {
                    "on request".to_owned()
                } else {
                    format!("after the demo's {}", Elapsed(time))
                }
            },
        },
        &mut progress,
    );
    session_stop.store(true, Ordering::Relaxed);
    let (stats, ran) = controller.join().unwrap_or_default();
    producer.shutdown();
    drop(consumer);
    drop(service);
    drop(dir);
    let status = status?;
    eprintln!(
        "The example app rendered {} frames and ran {} jobs in {}.",
        stats.frames,
        stats.jobs,
        Elapsed(ran)
    );
    Ok(status)
}
