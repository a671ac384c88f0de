//! Offline import: a recorded firmware source (an SMB dump with its commit
//! ring, a capture of the framed stream) into a trace file, through the
//! same path as a live bridge: a tracing service inside this process
//! ([`local`](crate::local)), the bridge's shell forwarding the
//! source as a producer, `record`'s consumer writing the file. So the
//! trusted fields, patching, reassembly and loss marking are the
//! service's own.
//!
//! The source is held back after its hello until the session has the data
//! source started (an offline source has everything at once; without a
//! session it would all be dropped); the session stops once the source
//! ended and the bridge sent everything. The firmware clock is related to
//! BOOTTIME by a fixed offset (the identity by default): there is no live
//! clock to measure.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::run::{run, BridgeOptions, Summary};
use super::{FirmwareEvent, FirmwareSource, Request, SourceError};
use crate::config::Config;
use crate::consumer::Consumer;
use crate::local::{InProcessService, SocketDir};
use crate::record::{self, Begin, OutputFile, Progress};
use crate::CliError;
use shmtrace_ipc::SocketAddress;
use shmtrace_service::service::shell::ShellConfig;

/// How long the source may take to yield its hello, and the bridge to
/// register.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How an import runs.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// `boot = firmware + offset` (ns).
    pub clock_offset_ns: i64,
    /// The session's buffer, KiB.
    pub buffer_kb: u32,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            clock_offset_ns: 0,
            buffer_kb: 64 * 1024,
        }
    }
}

/// The source, held back after its hello until a session enabled it.
struct Gated {
    inner: Box<dyn FirmwareSource>,
    first: Vec<FirmwareEvent>,
    enabled: bool,
}

impl FirmwareSource for Gated {
    fn poll(&mut self, timeout: Duration) -> Result<Option<FirmwareEvent>, SourceError> {
        if !self.first.is_empty() {
            return Ok(Some(self.first.remove(0)));
        }
        if !self.enabled {
            std::thread::sleep(timeout);
            return Ok(None);
        }
        self.inner.poll(timeout)
    }

    fn transport_loss(&self) -> Vec<(&'static str, u64)> {
        self.inner.transport_loss()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.inner.counters()
    }

    fn request(&mut self, request: Request) -> bool {
        if request == Request::Enable(true) {
            self.enabled = true;
        }
        // A recording cannot be asked anything, and needs nothing asked:
        // the gate is the only answer.
        let _ = self.inner.request(request);
        true
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Imports `source` into the trace file `out`; the `record` exit status
/// and the bridge's summary. A failure before the session starts (no
/// hello, no region) leaves no file behind that this run created.
pub fn import(
    source: Box<dyn FirmwareSource>,
    out: &Path,
    options: &ImportOptions,
    progress: &mut Progress,
) -> Result<(u8, Summary), CliError> {
    let mut output = Some(OutputFile::open(out)?);
    let result = import_into(source, out, &mut output, options, progress);
    if let Some(unused) = output {
        unused.discard();
    }
    result
}

/// [`import`] into `output`, which the session takes once it starts.
fn import_into(
    mut source: Box<dyn FirmwareSource>,
    out: &Path,
    output: &mut Option<OutputFile>,
    options: &ImportOptions,
    progress: &mut Progress,
) -> Result<(u8, Summary), CliError> {
    // Read up to the hello: the session's config names its data source.
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let mut first = Vec::new();
    let hello = loop {
        match source.poll(Duration::from_millis(50)) {
            Ok(Some(FirmwareEvent::Hello(h))) => {
                first.push(FirmwareEvent::Hello(h.clone()));
                break h;
            }
            Ok(Some(other)) => first.push(other),
            Ok(None) if Instant::now() < deadline => {}
            Ok(None) | Err(SourceError::Ended) => {
                return Err(CliError::Bridge(format!(
                    "{}: no firmware hello found (the data source name and clock come from it)",
                    source.describe()
                )))
            }
            Err(e) => return Err(CliError::Bridge(format!("{}: {e}", source.describe()))),
        }
    };

    let dir = SocketDir::create("import")?;
    let producer_socket = dir.socket("producer.sock");
    let consumer_socket = dir.socket("consumer.sock");
    let service = InProcessService::start(ShellConfig {
        producer_sockets: vec![SocketAddress::Path(producer_socket.clone())],
        consumer_socket: SocketAddress::Path(consumer_socket.clone()),
        consumer_group: None,
        listen_any: false,
        relay_endpoint: false,
    })
    .map_err(CliError::Bridge)?;

    let bridge_options = BridgeOptions {
        socket: Some(producer_socket.display().to_string()),
        fixed_clock_offset: Some(options.clock_offset_ns),
        ..Default::default()
    };
    let gated = Gated {
        inner: source,
        first,
        enabled: false,
    };
    let abort = Arc::new(AtomicBool::new(false));
    let bridge = {
        let abort = abort.clone();
        std::thread::Builder::new()
            .name("shmtrace-import".into())
            .spawn(move || {
                let mut gated = gated;
                run(&mut gated, &bridge_options, &abort)
            })
            .map_err(CliError::Output)?
    };
    let finish = |abort: &AtomicBool, bridge: std::thread::JoinHandle<_>| {
        abort.store(true, Ordering::Relaxed);
        bridge
            .join()
            .unwrap_or_else(|_| Err(CliError::Bridge("the bridge thread panicked".into())))
    };

    let consumer = Consumer::connect(Some(&consumer_socket.display().to_string()))?;
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        let state = consumer.service_state(false)?;
        if state.data_sources.iter().any(|d| {
            d.ds_descriptor.as_ref().and_then(|d| d.name.as_deref())
                == Some(hello.data_source.as_str())
        }) {
            break;
        }
        if bridge.is_finished() || Instant::now() >= deadline {
            let summary = finish(&abort, bridge)?;
            return Err(CliError::Bridge(format!(
                "the bridge did not register data source {:?}:\n{summary}",
                hello.data_source
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let config = Config::from_text(
        &format!(
            "buffers {{ size_kb: {} fill_policy: RING_BUFFER }} \
             data_sources {{ config {{ name: {:?} }} }}",
            options.buffer_kb, hello.data_source
        ),
        "the import's session",
    )?;
    // The session stops once the bridge is done: the source ended and
    // the producer sent everything.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        let bridge = bridge;
        std::thread::spawn(move || {
            let result = bridge.join();
            stop.store(true, Ordering::Relaxed);
            result
        })
    };
    let status = record::record_session(
        &consumer,
        &config,
        Begin::Enable,
        output.take(),
        out.to_path_buf(),
        record::Stop {
            flag: &stop,
            why: &|| "at the end of the input".to_owned(),
        },
        progress,
    );
    abort.store(true, Ordering::Relaxed);
    let summary = watcher
        .join()
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| Err(CliError::Bridge("the bridge thread panicked".into())));
    drop(consumer);
    drop(service);
    drop(dir);
    Ok((status?, summary?))
}
