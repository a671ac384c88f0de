//! The `shmtrace bridge` and `shmtrace import` commands: flags, opening the
//! input, the summary, exit statuses.
//!
//! `bridge` exits 0 once its input ended (end of file, the peer closed the
//! connection) or on SIGINT/SIGTERM (or, with `--exit-on-stdin-eof`, when
//! stdin closes), after printing its summary; 2 for bad flags; 3 if the
//! service's producer socket cannot be reached; 4 if the input cannot be
//! opened (a missing device, a refused connection, a region another reader
//! holds; a region file that does not exist yet is waited for); 5 if the
//! input fails while being read.
//! `import` exits as `record` does (0 written, 4 file errors, 5 the session
//! failed), and 5 if the input holds no firmware hello or no region.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::dump::DumpSource;
use super::frames::FrameStreamDecoder;
use super::import::{import, ImportOptions};
use super::input::{ByteStream, InputSpec, StreamSource};
use super::region::{region_name, RegionSource, DEFAULT_POLL_INTERVAL};
use super::run::{run, BridgeOptions};
use super::{FirmwareSource, SourceError};
use crate::record::{Progress, ProgressMode};
use crate::units::parse_duration;
use crate::{exit, CliError};

fn parse_level(s: &str) -> Result<log::LevelFilter, String> {
    s.parse()
        .map_err(|_| format!("unknown log level {s:?} (off, error, warn, info, debug, trace)"))
}

/// Flags of `shmtrace bridge`.
#[derive(Debug, Clone, clap::Args)]
pub struct BridgeArgs {
    /// What the firmware writes into: a file, FIFO, serial device or pty
    /// carrying frames (QEMU's `-serial`, a probe's RTT port), `tcp:HOST:PORT`
    /// (frames over TCP), or `region:FILE[@OFFSET]` (shared memory holding the
    /// firmware's region: QEMU's `memory-backend-file`, a UIO device; OFFSET
    /// in bytes, decimal or 0x hex, 8-aligned).
    #[arg(long, value_name = "INPUT")]
    pub input: InputSpec,
    /// The tracing service's producer socket (a path, or @name for an
    /// abstract socket). Default: $PERFETTO_PRODUCER_SOCK_NAME, else
    /// Perfetto's default.
    #[arg(long, value_name = "PRODUCER_SOCKET")]
    pub socket: Option<String>,
    /// The producer's name (default: the firmware's, from its hello).
    #[arg(long, value_name = "NAME")]
    pub producer_name: Option<String>,
    /// Line speed of a serial link in bits/s (sets a serial device to it;
    /// the one-way clock correction uses it). Default: a serial device's
    /// setting; none for ptys, files and TCP.
    #[arg(long, value_name = "BITS_PER_S")]
    pub baud: Option<u32>,
    /// How long a region input sleeps while its ring is empty (the attach
    /// latency), e.g. 1ms, 500us.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = parse_short_duration)]
    pub poll_interval: Duration,
    /// SMB page size to ask the service for, bytes (a forwarded chunk must
    /// fit one page; 0: the service's default, 4 KiB).
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub page_size: u32,
    /// SMB size to ask the service for, bytes (0: the service's default).
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub smb_size: u32,
    /// Log the counters this often (e.g. 10s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub log_interval: Option<Duration>,
    /// Log level: off, error, warn, info, debug, trace.
    #[arg(long, default_value = "info", value_name = "LEVEL", value_parser = parse_level)]
    pub log_level: log::LevelFilter,
    /// Stop when stdin reaches end of file (for supervisors: `serve
    /// --attach` runs each region's bridge so).
    #[arg(long)]
    pub exit_on_stdin_eof: bool,
    /// Print the summary as one JSON line on stdout (`{"event":"summary",
    /// ...}`, every counter by name) instead of text on stderr, and
    /// `{"event":"enabled"}` / `{"event":"disabled"}` lines when a session
    /// starts the firmware's data source / the last one stops it.
    #[arg(long)]
    pub json: bool,
}

/// `1ms`, `500us`, `2s`, or a number of milliseconds.
fn parse_short_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (e.g. 1ms, 500us)");
    let (digits, unit): (String, String) = s.chars().partition(|c| c.is_ascii_digit());
    let n: u64 = digits.parse().map_err(|_| bad())?;
    if !s.starts_with(digits.as_str()) {
        return Err(bad());
    }
    match unit.as_str() {
        "us" => Ok(Duration::from_micros(n)),
        "" | "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(bad()),
    }
}

/// Opens the source `input` names.
pub fn open_source(
    input: &InputSpec,
    baud: Option<u32>,
    poll_interval: Duration,
) -> Result<Box<dyn FirmwareSource>, CliError> {
    match input {
        InputSpec::Region { path, offset } => Ok(Box::new(
            RegionSource::new(path, *offset, poll_interval).map_err(|e| match e {
                SourceError::Busy(_) => e.into_cli(region_name(path, *offset)),
                e => CliError::Usage(e.to_string()),
            })?,
        )),
        stream => {
            let s = ByteStream::open_with(stream, baud).map_err(|source| CliError::Io {
                action: match stream {
                    InputSpec::Tcp(_) => "connect to",
                    _ => "open",
                },
                path: match stream {
                    InputSpec::Tcp(addr) => PathBuf::from(format!("tcp:{addr}")),
                    InputSpec::Path(p) => p.clone(),
                    InputSpec::Region { path, .. } => path.clone(),
                },
                source,
            })?;
            let baud = s.baud();
            Ok(Box::new(StreamSource::new(
                s,
                FrameStreamDecoder::new(baud),
            )))
        }
    }
}

/// Sets `stop` on SIGINT and SIGTERM, and (if asked) when stdin closes.
fn stop_on_signals(stop: &Arc<AtomicBool>, stdin_eof: bool) -> Result<(), CliError> {
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())
            .map_err(|e| CliError::Usage(format!("cannot handle signal {signal}: {e}")))?;
    }
    if stdin_eof {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    Ok(())
}

/// Runs `shmtrace bridge`; see the module docs for the exit statuses.
pub fn run_bridge(args: &BridgeArgs) -> Result<u8, CliError> {
    shmtrace_service::service::daemon::init_logging(args.log_level);
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop, args.exit_on_stdin_eof)?;
    let mut source = open_source(&args.input, args.baud, args.poll_interval)?;
    let options = BridgeOptions {
        socket: args.socket.clone(),
        producer_name: args.producer_name.clone(),
        page_size_hint: args.page_size,
        smb_size_hint: args.smb_size,
        log_interval: args.log_interval,
        fixed_clock_offset: None,
        announce: args.json,
    };
    log::info!("reading {}", source.describe());
    let summary = run(source.as_mut(), &options, &stop)?;
    if args.json {
        let mut line = summary.to_json();
        line["event"] = "summary".into();
        println!("{line}");
    } else {
        eprintln!("{summary}");
    }
    Ok(exit::OK)
}

/// Flags of `shmtrace import`.
#[derive(Debug, Clone, clap::Args)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["region_dump", "frames"]))]
pub struct ImportArgs {
    /// A RAM dump holding the firmware's region at OFFSET (bytes, decimal
    /// or 0x hex; default 0): a probe's memory read, a copy of QEMU's RAM
    /// file. Every complete chunk is imported, open ones scraped, with the
    /// patches the ring still holds.
    #[arg(long, value_name = "FILE[@OFFSET]")]
    pub region_dump: Option<String>,
    /// A capture of the firmware's framed stream (what `shmtrace bridge`
    /// reads: a UART log, `-serial file:`).
    #[arg(long, value_name = "FILE")]
    pub frames: Option<PathBuf>,
    /// The trace file to write.
    #[arg(short = 'o', long = "out", value_name = "OUT.pftrace")]
    pub out: PathBuf,
    /// Where the firmware's clock lies on the trace's BOOTTIME: boot time
    /// = firmware time + NS (default 0: the firmware's nanoseconds as they
    /// are).
    #[arg(
        long,
        value_name = "NS",
        default_value_t = 0,
        allow_hyphen_values = true
    )]
    pub clock_offset: i64,
    /// The session's buffer, KiB (the whole import must fit).
    #[arg(long, value_name = "KB", default_value_t = 64 * 1024)]
    pub buffer_kb: u32,
    /// How to show progress.
    #[arg(long, value_enum, default_value_t = ProgressMode::None)]
    pub progress: ProgressMode,
}

/// Runs `shmtrace import`.
pub fn run_import(args: &ImportArgs) -> Result<u8, CliError> {
    let source: Box<dyn FirmwareSource> = match (&args.region_dump, &args.frames) {
        (Some(spec), _) => {
            let parsed = format!("region:{spec}")
                .parse::<InputSpec>()
                .map_err(|e| CliError::Usage(e.to_string()))?;
            let InputSpec::Region { path, offset } = parsed else {
                return Err(CliError::Usage(format!("invalid region dump {spec:?}")));
            };
            Box::new(DumpSource::open(&path, offset).map_err(dump_error)?)
        }
        (None, Some(path)) => {
            open_source(&InputSpec::Path(path.clone()), None, DEFAULT_POLL_INTERVAL)?
        }
        (None, None) => {
            return Err(CliError::Usage(
                "give --region-dump FILE[@OFFSET] or --frames FILE".into(),
            ))
        }
    };
    import_from(source, &args.out, args)
}

fn dump_error(e: super::dump::DumpError) -> CliError {
    match e {
        super::dump::DumpError::Io { path, source } => CliError::Io {
            action: "read",
            path: path.into(),
            source,
        },
        other => CliError::Bridge(other.to_string()),
    }
}

fn import_from(
    source: Box<dyn FirmwareSource>,
    out: &Path,
    args: &ImportArgs,
) -> Result<u8, CliError> {
    let options = ImportOptions {
        clock_offset_ns: args.clock_offset,
        buffer_kb: args.buffer_kb,
    };
    let mut progress = Progress::new(args.progress);
    let (status, summary) = import(source, out, &options, &mut progress)?;
    eprintln!("{summary}");
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_intervals_parse() {
        assert_eq!(parse_short_duration("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(
            parse_short_duration("250us"),
            Ok(Duration::from_micros(250))
        );
        assert_eq!(parse_short_duration("2"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_short_duration("1s"), Ok(Duration::from_secs(1)));
        for bad in ["", "ms", "1h", "x1ms", "1 ms"] {
            assert!(parse_short_duration(bad).is_err(), "{bad}");
        }
    }
}
