//! `shmtrace record`: a consumer that runs one tracing session and writes
//! the trace file.
//!
//! Everything that can be checked is checked before tracing starts: the
//! config (it parses, has buffers and data sources, targets existing
//! buffers), the output file (it can be written), the service (it answers
//! on the consumer socket). Ctrl-C or SIGTERM ends the session cleanly —
//! flush, stop, read, write — and keeps the data; a second Ctrl-C aborts
//! and removes the incomplete file. A session that fails (the service
//! dies) leaves no empty file behind either.
//!
//! As `perfetto --detach/--attach`: `--detach KEY` starts the session and
//! leaves it running in the service under KEY (ConsumerPort Detach);
//! `--attach KEY` takes it back (Attach), waits for it to end or, with
//! `--stop`, stops it, then reads it like any session.
//!
//! As `perfetto --clone ID` / `--clone-by-name NAME`: `--clone` and
//! `--clone-by-name` write a snapshot of a running session, which runs on
//! (ConsumerPort CloneSession; the `clone` module), for a bug report with
//! `--clone-for-bugreport`. A CLONE_SNAPSHOT session's triggers have
//! snapshots taken beside it (the `snapshots` module).

mod clone;
mod progress;
mod session;
mod signals;
mod snapshots;
mod summary;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use shmtrace_ipc::protos::clone_session_request::Selector;
use shmtrace_ipc::protos::{consumer_port, AttachRequest, DetachRequest, EnableTracingRequest};

pub use progress::{Progress, ProgressMode, Snapshot};
pub use session::{Begin, Ended, Output, ServiceCounters, SessionReport, Stop};
pub use signals::stop_signals;
pub use snapshots::FailedSnapshot;
pub use summary::Summary;

use super::config::{Config, Fill, QuickConfig};
use super::consumer::{next, Consumer, CALL_TIMEOUT};
use super::inspect;
use super::query::track_event_categories;
use super::units::{parse_duration, parse_size_kb, UtcTime};
use super::{exit, CliError};

/// Arguments of `shmtrace record`.
#[derive(Debug, Clone, clap::Args)]
pub struct RecordArgs {
    /// TraceConfig file: binary protobuf, or text format with --txt; `-`
    /// reads standard input. Without it, the quick flags build the config.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The config file is in text format (as Perfetto's `--txt`).
    #[arg(long, requires = "config")]
    pub txt: bool,
    /// Output file; `-` writes the trace to standard output [default:
    /// shmtrace-YYYYMMDD-HHMMSS.pftrace, UTC].
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Quick config: stop after this long (10s, 500ms, 2m, 1h; `0s` runs
    /// until Ctrl-C, as Perfetto's) [default: until Ctrl-C].
    #[arg(short = 't', long = "time", value_name = "DURATION", value_parser = parse_duration, conflicts_with = "config")]
    pub time: Option<Duration>,
    /// Quick config: trace buffer size (32mb, 512kb, 1gb; a bare number is
    /// KiB) [default: 32mb].
    #[arg(short = 'b', long = "buffer", value_name = "SIZE", value_parser = parse_size_kb, conflicts_with = "config")]
    pub buffer_kb: Option<u32>,
    /// Quick config: record only these track_event categories
    /// (comma-separated; patterns such as `net.*` work) [default: every
    /// category the producers enable by default]. A firmware behind
    /// `shmtrace bridge` or `serve --attach` does not see the session's
    /// config: all of its categories are recorded.
    #[arg(
        long,
        value_name = "CATEGORIES",
        value_delimiter = ',',
        conflicts_with = "config"
    )]
    pub app_categories: Vec<String>,
    /// Quick config: what happens when the buffer is full [default: ring].
    #[arg(long, value_enum, conflicts_with = "config")]
    pub fill: Option<Fill>,
    /// Have the service stream the trace into the output file while the
    /// session runs (the config's write_into_file), instead of reading the
    /// buffers at the end.
    #[arg(long)]
    pub write_into_file: bool,
    /// The service's consumer socket [default: $PERFETTO_CONSUMER_SOCK_NAME,
    /// else /run/perfetto/traced-consumer.sock if /run/perfetto exists, else
    /// /tmp/perfetto-consumer].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<String>,
    /// How to show progress.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
    /// Start the session, then detach from it: it runs on in the service
    /// under KEY, and this command exits. `--attach KEY` takes it back
    /// (as `perfetto --detach`).
    #[arg(long, value_name = "KEY", value_parser = non_empty_key)]
    pub detach: Option<String>,
    /// Attach to the session detached under KEY instead of starting one:
    /// wait for it to end (or stop it, with --stop), then read it into -o
    /// (as `perfetto --attach`).
    #[arg(
        long,
        value_name = "KEY",
        value_parser = non_empty_key,
        conflicts_with_all = ["detach", "config", "time", "buffer_kb", "app_categories", "fill", "write_into_file"]
    )]
    pub attach: Option<String>,
    /// With --attach: stop the session at once (flush, stop, read) instead
    /// of waiting for it to end.
    #[arg(long, requires = "attach")]
    pub stop: bool,
    /// Write a snapshot of the running session with this id into -o: the
    /// service flushes it and copies its buffers; it runs on (as `perfetto
    /// --clone`). `shmtrace query` lists the sessions and their ids.
    #[arg(
        long,
        value_name = "ID",
        conflicts_with_all = ["detach", "attach", "config", "time", "buffer_kb", "app_categories", "fill", "write_into_file"]
    )]
    pub clone: Option<u64>,
    /// As --clone, for the session whose config sets this
    /// unique_session_name (as `perfetto --clone-by-name`).
    #[arg(
        long,
        value_name = "NAME",
        value_parser = non_empty_key,
        conflicts_with_all = ["clone", "detach", "attach", "config", "time", "buffer_kb", "app_categories", "fill", "write_into_file"]
    )]
    pub clone_by_name: Option<String>,
    /// With --clone or --clone-by-name: a snapshot for a bug report (as
    /// `perfetto --clone-for-bugreport`): the service's flush tells the
    /// producers the clone is for a bug report, and the session's
    /// trace_filter is not applied to the snapshot.
    #[arg(long)]
    pub clone_for_bugreport: bool,
    /// Perfetto's positional atrace categories: refused with a hint.
    #[arg(hide = true, value_name = "CATEGORY")]
    pub atrace_categories: Vec<String>,
    /// Perfetto's `--query`: refused with a hint.
    #[arg(long, hide = true)]
    pub query: bool,
    /// Perfetto's `--trigger NAME`: refused with a hint.
    #[arg(long, hide = true, value_name = "NAME")]
    pub trigger: Option<String>,
}

/// The hint for a habit from Perfetto's `perfetto` command that `record`
/// spells differently, if `args` has one.
fn perfetto_habit(args: &RecordArgs) -> Option<String> {
    if !args.atrace_categories.is_empty() {
        return Some(format!(
            "unexpected argument {:?}: categories are not positional here; record \
             track_event categories with --app-categories {}",
            args.atrace_categories[0],
            args.atrace_categories.join(",")
        ));
    }
    if args.query {
        return Some(
            "--query is a command of its own here: `shmtrace query` lists the service's \
             producers, data sources and sessions"
                .into(),
        );
    }
    args.trigger.as_ref().map(|name| {
        format!(
            "--trigger is a command of its own here: `shmtrace trigger {name}` activates \
             the trigger in the sessions that wait for it"
        )
    })
}

fn non_empty_key(key: &str) -> Result<String, String> {
    if key.is_empty() {
        Err("the key must not be empty".into())
    } else {
        Ok(key.to_owned())
    }
}

/// Runs `shmtrace record`; returns the exit status.
pub fn run(args: &RecordArgs) -> Result<u8, CliError> {
    let mut progress = Progress::new(args.progress);
    let result = record(args, &mut progress);
    if let Err(e) = &result {
        progress.done();
        progress.event(json!({"event": "error", "message": e.to_string()}));
    }
    result
}

fn load_config(args: &RecordArgs) -> Result<Config, CliError> {
    let Some(path) = &args.config else {
        return Ok(Config::from_quick(&QuickConfig {
            duration: args.time,
            buffer_kb: args.buffer_kb.unwrap_or(super::config::DEFAULT_BUFFER_KB),
            categories: args
                .app_categories
                .iter()
                .map(|c| c.trim().to_owned())
                .filter(|c| !c.is_empty())
                .collect(),
            fill: args.fill.unwrap_or_default(),
        }));
    };
    let (bytes, origin) = if path.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|source| CliError::Io {
                action: "read",
                path: PathBuf::from("standard input"),
                source,
            })?;
        (bytes, "<stdin>".to_owned())
    } else {
        let bytes = std::fs::read(path).map_err(|source| CliError::Io {
            action: "read",
            path: path.clone(),
            source,
        })?;
        (bytes, path.display().to_string())
    };
    let config = if args.txt {
        let text = String::from_utf8(bytes).map_err(|_| {
            CliError::Usage(format!("{origin}: a text-format config must be UTF-8"))
        })?;
        Config::from_text(&text, &origin)?
    } else {
        Config::from_binary(bytes, &origin)?
    };
    Ok(config)
}

/// The output file, opened for writing but not truncated yet (so that a
/// failure before tracing starts leaves an existing file alone). From the
/// time this run created or truncated it until it is complete, an abort
/// (a second Ctrl-C) removes it.
#[derive(Debug)]
pub struct OutputFile {
    path: PathBuf,
    file: File,
    created: bool,
    stdout: bool,
}

/// Whether `path` names standard output (`-o -`).
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

impl OutputFile {
    /// Opens (or creates) `path` for writing; fails if it cannot be written.
    /// `-` is standard output.
    pub fn open(path: &Path) -> Result<Self, CliError> {
        if is_stdout(path) {
            let file = std::io::stdout()
                .as_fd()
                .try_clone_to_owned()
                .map_err(io_error("open", Path::new("standard output")))?;
            return Ok(OutputFile {
                path: path.to_path_buf(),
                file: file.into(),
                created: false,
                stdout: true,
            });
        }
        let created = !path.exists();
        // Readable too: the service copies a write_into_file session's file
        // so far into a clone's (CloneSession), as from perfetto_cmd's.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|source| CliError::Io {
                action: "create",
                path: path.to_path_buf(),
                source,
            })?;
        Self::claimed(path.to_path_buf(), file, created)
    }

    /// Creates a new file named after the time (`shmtrace-<time>.pftrace`,
    /// with `-2`, `-3`, … if that exists: two records started in the same
    /// second get a file each).
    pub fn create_default() -> Result<Self, CliError> {
        Self::create_default_in(Path::new(""))
    }

    /// [`Self::create_default`] in directory `dir`.
    fn create_default_in(dir: &Path) -> Result<Self, CliError> {
        let stem = format!("shmtrace-{}", UtcTime::now().compact());
        let mut n = 1u32;
        loop {
            let path = dir.join(if n == 1 {
                format!("{stem}.pftrace")
            } else {
                format!("{stem}-{n}.pftrace")
            });
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => return Self::claimed(path, file, true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(source) => {
                    return Err(CliError::Io {
                        action: "create",
                        path,
                        source,
                    })
                }
            }
        }
    }

    /// Takes an exclusive lock on `file` (at `path`): a second `shmtrace
    /// record` writing the same file is refused, not left to interleave
    /// its trace with this one. The lock goes with the file.
    fn claimed(path: PathBuf, file: File, created: bool) -> Result<Self, CliError> {
        use rustix::fs::{flock, FlockOperation};
        if let Err(e) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
            if created {
                let _ = std::fs::remove_file(&path);
            }
            return Err(if e == rustix::io::Errno::WOULDBLOCK {
                CliError::Usage(format!(
                    "{} is being written by another shmtrace record, or by the service for a \
                     session started with --write-into-file; choose another -o",
                    path.display()
                ))
            } else {
                CliError::Io {
                    action: "lock",
                    path,
                    source: e.into(),
                }
            });
        }
        if created {
            signals::arm(&path);
        }
        Ok(OutputFile {
            path,
            file,
            created,
            stdout: false,
        })
    }

    /// Empties the file for a new trace (standard output: nothing to do).
    fn truncate(&self) -> Result<(), CliError> {
        if self.stdout {
            return Ok(());
        }
        self.arm();
        self.file
            .set_len(0)
            .map_err(io_error("truncate", &self.path))
    }

    /// An abort from now on removes the file (it is being written).
    fn arm(&self) {
        if !self.stdout {
            signals::arm(&self.path);
        }
    }

    /// Cuts the file where its descriptor's offset is: what a service
    /// wrote through it (from the start) stays, whatever an older file held
    /// past that goes.
    fn cut_at_position(&self) -> Result<(), CliError> {
        use std::io::Seek;
        let end = (&self.file)
            .stream_position()
            .map_err(io_error("seek", &self.path))?;
        self.file
            .set_len(end)
            .map_err(io_error("truncate", &self.path))
    }

    /// Removes the file if this run created it.
    pub(crate) fn discard(self) {
        signals::disarm(&self.path);
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// The session failed with `error`: removes the file if it holds no
    /// packet (it would look like a valid empty trace), else keeps what was
    /// written and says so in the error.
    fn fail(self, error: CliError) -> CliError {
        signals::disarm(&self.path);
        if self.stdout {
            return error;
        }
        let len = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        if len == 0 {
            let _ = std::fs::remove_file(&self.path);
            return error;
        }
        CliError::Session(format!(
            "{error}\n(the {len} B read before that are in {}; the trace is incomplete)",
            self.path.display()
        ))
    }

    /// The trace in the file is complete.
    fn keep(&self) {
        signals::disarm(&self.path);
    }
}

fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> CliError + 'a {
    move |source| CliError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn record(args: &RecordArgs, progress: &mut Progress) -> Result<u8, CliError> {
    if let Some(hint) = perfetto_habit(args) {
        return Err(CliError::Usage(hint));
    }
    // clap's `requires` holds only while no flag conflicting with the
    // required one is given: `--txt -t 1s` and `--stop -t 1s` got past it.
    if args.txt && args.config.is_none() {
        return Err(CliError::Usage(
            "--txt says the config file (-c FILE) is in text format, and there is none: \
             pass -c FILE, or drop --txt to use the quick flags"
                .into(),
        ));
    }
    if args.stop && args.attach.is_none() {
        return Err(CliError::Usage(
            "--stop stops the session taken back with --attach KEY; a session this record \
             starts stops after -t, or on Ctrl-C"
                .into(),
        ));
    }
    if args.clone_for_bugreport && args.clone.is_none() && args.clone_by_name.is_none() {
        return Err(CliError::Usage(
            "--clone-for-bugreport qualifies a snapshot taken with --clone ID or \
             --clone-by-name NAME (as perfetto's): add one of them"
                .into(),
        ));
    }
    if let Some(key) = &args.attach {
        return attach(args, key, progress);
    }
    if let Some(id) = args.clone {
        return clone::clone(args, Selector::SessionId(id), progress);
    }
    if let Some(name) = &args.clone_by_name {
        return clone::clone(args, Selector::UniqueSessionName(name.clone()), progress);
    }
    // 1. Everything that can be checked before tracing.
    let mut config = load_config(args)?;
    config.check()?;
    if args.write_into_file {
        config.set_write_into_file();
    }
    let view = config.view().clone();
    let service_path = view.output_path.clone().filter(|p| !p.is_empty());
    let (output, trace_path) = match service_path {
        Some(path) if args.out.is_some() => {
            return Err(CliError::Usage(format!(
                "the config sets output_path ({path}): the service writes the trace there; \
                 drop -o"
            )))
        }
        Some(_) if view.write_into_file != Some(true) => {
            return Err(CliError::Usage(
                "the config sets output_path without write_into_file".into(),
            ))
        }
        Some(path) => (None, PathBuf::from(path)),
        // Read at --attach, into the file named there.
        None if args.detach.is_some() && view.write_into_file != Some(true) => {
            if args.out.is_some() {
                return Err(CliError::Usage(
                    "with --detach, the trace is read by `--attach KEY -o FILE`: drop -o \
                     here (or stream into it with --write-into-file)"
                        .into(),
                ));
            }
            (None, PathBuf::new())
        }
        None if view.write_into_file == Some(true)
            && args.out.as_deref().is_some_and(is_stdout) =>
        {
            return Err(CliError::Usage(
                "write_into_file needs a file: the service writes it, and a pipe whose \
                 reader stops would stop the service; use -o FILE, or drop write_into_file \
                 (--write-into-file) to stream the trace to standard output"
                    .into(),
            ))
        }
        None => {
            let output = match &args.out {
                Some(path) => OutputFile::open(path)?,
                None => OutputFile::create_default()?,
            };
            let path = output.path.clone();
            (Some(output), path)
        }
    };

    // 2. Signals, registered before connecting so that none is lost.
    let stop = stop_signals()?;

    // 3. The service.
    let consumer = match Consumer::connect(args.socket.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            if let Some(o) = output {
                o.discard();
            }
            return Err(e);
        }
    };
    match &args.detach {
        Some(key) => detach(&consumer, &config, output, &trace_path, key, progress),
        None => record_session(
            &consumer,
            &config,
            Begin::Enable,
            output,
            trace_path,
            Stop::on_request(&stop),
            progress,
        ),
    }
}

/// `--detach KEY`: starts the session and detaches from it.
fn detach(
    consumer: &Consumer,
    config: &Config,
    output: Option<OutputFile>,
    trace_path: &Path,
    key: &str,
    progress: &mut Progress,
) -> Result<u8, CliError> {
    let into_file = config.view().write_into_file == Some(true);
    let fd: Option<OwnedFd> = match &output {
        Some(o) => {
            o.truncate()?;
            Some(
                o.file
                    .try_clone()
                    .map_err(io_error("open", &o.path))?
                    .into(),
            )
        }
        None => None,
    };
    let request = EnableTracingRequest {
        trace_config: Some(config.bytes().to_vec().into()),
        attach_notification_only: None,
    };
    let mut enable =
        consumer.start::<consumer_port::EnableTracing>("EnableTracing", &request, fd)?;
    let detached = consumer.call::<consumer_port::Detach>(
        "Detach",
        &DetachRequest {
            key: Some(key.to_owned()),
        },
        CALL_TIMEOUT,
    );
    if let Err(e) = detached {
        // A refused session is the likelier cause: its reply says why.
        let refused = next(&mut enable, Some(Duration::from_millis(500)))
            .ok()
            .and_then(|r| r.message.error)
            .filter(|e| !e.is_empty());
        if let Some(o) = output {
            o.discard();
        }
        return Err(CliError::Session(match refused {
            Some(error) => format!("refused the session: {error}"),
            None => format!(
                "did not let this session detach under the key {key:?} (is a session of \
                 yours already detached under it?): {e}"
            ),
        }));
    }
    progress.done();
    progress.event(json!({"event": "detached", "key": key}));
    let into = if into_file {
        format!(
            "; the service writes the trace into {}",
            trace_path.display()
        )
    } else {
        String::new()
    };
    // A write_into_file session's trace stays in the file the service
    // writes (which it holds locked): --attach needs no -o for it.
    let take_back = if into_file {
        format!(
            "`shmtrace record --attach {key}` (add --stop to end it at once; no -o: the trace \
             stays in {})",
            trace_path.display()
        )
    } else {
        format!("`shmtrace record --attach {key} -o FILE` (add --stop to end it at once)")
    };
    eprintln!(
        "Detached: the session runs on in the service under the key {key:?}{into}.\n\
         Take it back with {take_back} before it ends: a detached session that ends on its \
         own is freed."
    );
    Ok(exit::OK)
}

/// `--attach KEY [--stop]`: takes back a detached session, lets it end
/// (or stops it) and reads it.
fn attach(args: &RecordArgs, key: &str, progress: &mut Progress) -> Result<u8, CliError> {
    // The output file is checked before attaching: once attached, a
    // failure here would end the session with this process.
    let output = match &args.out {
        Some(path) => OutputFile::open(path)?,
        None => OutputFile::create_default()?,
    };
    let path = output.path.clone();
    let stop = stop_signals()?;
    let consumer = match Consumer::connect(args.socket.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            output.discard();
            return Err(e);
        }
    };
    let reply = match consumer.call::<consumer_port::Attach>(
        "Attach",
        &AttachRequest {
            key: Some(key.to_owned()),
        },
        CALL_TIMEOUT,
    ) {
        Ok(reply) => reply,
        Err(e) => {
            output.discard();
            return Err(CliError::Session(format!(
                "has no session of yours detached under the key {key:?} (it may have ended, \
                 which frees a detached session, or been attached already): {e}"
            )));
        }
    };
    let origin = format!("the session detached under {key:?}");
    let config = Config::from_binary(reply.trace_config.unwrap_or_default().to_vec(), &origin)?;
    if args.stop {
        stop.store(true, Ordering::Relaxed);
    }
    let why_stopped = || if args.stop { "by --stop" } else { "on request" }.to_owned();
    let stop = Stop {
        flag: &stop,
        why: &why_stopped,
    };
    progress.event(json!({"event": "attached", "key": key}));
    if config.view().write_into_file == Some(true) {
        // The service writes this session into the file given at --detach.
        output.discard();
        let report = session::run(
            &consumer,
            &config,
            Begin::Attached,
            Output::ByService,
            None,
            stop,
            progress,
        )?;
        progress.done();
        if let Ended::Failed(error) = report.ended {
            return Err(CliError::Session(format!(
                "ended the session with an error: {error}"
            )));
        }
        eprintln!(
            "The session has ended; the service wrote its trace into the file given at \
             --detach (write_into_file), not into {}.",
            path.display()
        );
        return Ok(exit::OK);
    }
    record_session(
        &consumer,
        &config,
        Begin::Attached,
        Some(output),
        path,
        stop,
        progress,
    )
}

/// Runs one session of `config` on `consumer` into `output` (or, with
/// `None`, into the config's `output_path`, which is `trace_path`), then
/// prints the summary; returns the exit status.
pub fn record_session(
    consumer: &Consumer,
    config: &Config,
    begin: Begin,
    output: Option<OutputFile>,
    trace_path: PathBuf,
    stop: Stop<'_>,
    progress: &mut Progress,
) -> Result<u8, CliError> {
    let view = config.view();
    progress.event(json!({"event": "connected", "socket": consumer.address().to_string()}));
    let wanted = config.data_source_names();
    let mut registered: BTreeSet<String> = BTreeSet::new();
    let mut categories: BTreeMap<String, Vec<String>> = BTreeMap::new();
    match consumer.service_state(false) {
        Ok(state) => {
            for d in state
                .data_sources
                .into_iter()
                .filter_map(|d| d.ds_descriptor)
            {
                categories.extend(track_event_categories(&d));
                registered.extend(d.name);
            }
            for name in wanted.iter().filter(|n| !registered.contains(*n)) {
                progress.warn(&format!(
                    "no producer has registered the data source {name:?} (yet); the session \
                     runs, and a producer that registers it later joins"
                ));
            }
        }
        Err(e) => progress.warn(&format!("cannot list the service's data sources: {e}")),
    }

    // 4. The session.
    let session_output = match &output {
        Some(o) => {
            o.truncate()?;
            if view.write_into_file == Some(true) {
                let fd: OwnedFd = o
                    .file
                    .try_clone()
                    .map_err(io_error("open", &o.path))?
                    .into();
                Output::IntoFile { fd }
            } else {
                let file = o.file.try_clone().map_err(io_error("open", &o.path))?;
                Output::Read {
                    file,
                    path: &o.path,
                }
            }
        }
        None => Output::ByService,
    };
    let announce = format!(
        "recording into {} (config: {})",
        if is_stdout(&trace_path) {
            "standard output".to_owned()
        } else {
            trace_path.display().to_string()
        },
        config.origin()
    );
    let mut report = match session::run(
        consumer,
        config,
        begin,
        session_output,
        Some(&announce),
        stop,
        progress,
    ) {
        Ok(report) => report,
        Err(e) => {
            return Err(match output {
                Some(o) => o.fail(e),
                None => e,
            })
        }
    };
    if let Some(o) = &output {
        o.keep();
    }
    registered.extend(std::mem::take(&mut report.registered));
    report.registered = registered;
    categories.append(&mut report.categories);
    report.categories = categories;

    // 5. The summary, from the file itself (standard output cannot be read
    // back: from what was written).
    let to_stdout = is_stdout(&trace_path);
    let analysis = if to_stdout {
        None
    } else {
        inspect::analyze_recorded(&trace_path).ok()
    };
    if begin == Begin::Attached {
        // The session ran before this consumer attached: its length is the
        // span of the trace.
        if let Some((Some(first), Some(last))) = analysis
            .as_ref()
            .map(|a| (a.clocks.first_ns, a.clocks.last_ns))
        {
            report.elapsed = Duration::from_nanos(last.saturating_sub(first));
        }
    }
    let file_bytes = if to_stdout {
        report.bytes_written
    } else {
        std::fs::metadata(&trace_path).map_or(0, |m| m.len())
    };
    let summary = Summary::new(&trace_path, file_bytes, config, &report, analysis.as_ref());
    progress.done();
    if let Ended::Failed(error) = &report.ended {
        if summary.packets == 0 {
            if let Some(o) = output {
                o.discard();
            }
            return Err(CliError::Session(format!("refused the session: {error}")));
        }
    }
    summary
        .render(&mut std::io::stderr().lock())
        .map_err(CliError::Output)?;
    progress.event(json!({"event": "done", "summary": summary}));
    match report.ended {
        Ended::Failed(error) => Err(CliError::Session(format!(
            "ended the session with an error: {error} (what was recorded is in {})",
            trace_path.display()
        ))),
        _ => Ok(exit::OK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("shmtrace-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn default_outputs_of_one_second_are_distinct_files() {
        let dir = scratch("default-out");
        let a = OutputFile::create_default_in(&dir).unwrap();
        let b = OutputFile::create_default_in(&dir).unwrap();
        assert_ne!(a.path, b.path);
        assert!(a.path.exists() && b.path.exists());
        a.discard();
        b.discard();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_being_written_by_another_record_is_refused() {
        let dir = scratch("locked-out");
        let path = dir.join("same.pftrace");
        let first = OutputFile::open(&path).unwrap();
        let Err(e) = OutputFile::open(&path) else {
            panic!("a second writer of {path:?} was let in");
        };
        assert_eq!(e.exit_code(), exit::USAGE);
        assert!(
            e.to_string()
                .contains("is being written by another shmtrace record"),
            "{e}"
        );
        assert!(path.exists(), "the first one's file stays");
        drop(first);
        let again = OutputFile::open(&path).unwrap();
        again.discard();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
