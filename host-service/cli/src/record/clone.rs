//! `record --clone ID` / `--clone-by-name NAME`: a snapshot of a running
//! session, which runs on (as `perfetto --clone` / `--clone-by-name`,
//! src/perfetto_cmd/perfetto_cmd.cc).
//!
//! CloneSession carries a descriptor of the output file, as perfetto_cmd's
//! always does: the service writes a `write_into_file` session's snapshot
//! into it itself (the file so far, then the rest), and says so in
//! `was_write_into_file`. Any other snapshot is read like a session's
//! buffers (ReadBuffers), then freed. The summary is `record`'s, from the
//! file; its config is the one in the snapshot.
//!
//! Unlike perfetto_cmd, which opens `-o` with `O_TRUNC`, the output file
//! is not emptied before the service has answered, and a file the service
//! holds open (a running `write_into_file` session's) is refused first
//! ([`CliError::LiveOutput`]): emptying or writing it would destroy the
//! trace being written. `--clone-for-bugreport` sets the request's
//! `for_bugreport` and `skip_trace_filter`, as perfetto_cmd's does.

use std::io::{BufWriter, Write};
use std::os::fd::OwnedFd;
use std::time::Duration;

use serde_json::json;

use shmtrace_abi::trace::trace_packet as tp;
use shmtrace_ipc::protos::clone_session_request::Selector;
use shmtrace_ipc::protos::wire::{Fields, Value};
use shmtrace_ipc::protos::{consumer_port, CloneSessionRequest, FreeBuffersRequest};
use shmtrace_service::service::core::CloneError;

use super::session::{self, Ended, SessionReport};
use super::{io_error, OutputFile, Progress, RecordArgs, Summary};
use crate::config::Config;
use crate::consumer::{next, Consumer, CALL_TIMEOUT};
use crate::inspect;
use crate::query::track_event_categories;
use crate::trace_file::PacketReader;
use crate::{exit, CliError};

/// How long the service may take to clone: it flushes the session first,
/// for at most its `flush_timeout_ms` (5 s unless configured), then copies.
const CLONE_TIMEOUT: Duration = Duration::from_secs(60);

/// What our service answers a clone into the session's own file
/// (`CloneError::OutputIsSessionFile`).
static LIVE_OUTPUT_REFUSAL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| CloneError::OutputIsSessionFile.to_string());

/// `TraceStats.FinalFlushOutcome.FINAL_FLUSH_FAILED`.
const FINAL_FLUSH_FAILED: i32 = 2;

/// What `--clone`/`--clone-by-name` name, in words.
fn describe(selector: &Selector) -> String {
    match selector {
        Selector::SessionId(id) => format!("session {id}"),
        Selector::UniqueSessionName(name) => format!("session named {name:?}"),
    }
}

/// Clones the session `selector` names into `-o` (or the default file).
pub fn clone(
    args: &RecordArgs,
    selector: Selector,
    progress: &mut Progress,
) -> Result<u8, CliError> {
    let what = describe(&selector);
    if args.out.as_deref().is_some_and(super::is_stdout) {
        return Err(CliError::Usage(
            "a snapshot goes into a file (the service may write it itself, and record reads \
             it back for its summary): use -o FILE, not -o -"
                .into(),
        ));
    }
    let output = match &args.out {
        Some(path) => OutputFile::open(path)?,
        None => OutputFile::create_default()?,
    };
    let path = output.path.clone();
    let consumer = match Consumer::connect(args.socket.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            output.discard();
            return Err(e);
        }
    };
    progress.event(json!({"event": "connected", "socket": consumer.address().to_string()}));
    progress.note(&format!(
        "cloning the {what} into {} (the service flushes it first)",
        path.display()
    ));
    // perfetto_cmd's --clone-for-bugreport sets both (perfetto_cmd.cc,
    // ConnectToServiceAndRun): the service's flush names the bugreport as
    // the clone's target, and the session's trace_filter is not applied.
    let for_bugreport = args.clone_for_bugreport.then_some(true);
    let request = CloneSessionRequest {
        selector: Some(selector),
        for_bugreport,
        skip_trace_filter: for_bugreport,
        ..Default::default()
    };
    let mut report = match snapshot(&consumer, request, &output, progress) {
        Ok(report) => report,
        Err(Refused(error)) => {
            output.discard();
            return Err(CliError::Session(format!(
                "could not clone the {what}: {error}{}",
                if error == "Tracing session not found" {
                    " (`shmtrace query` lists the sessions)"
                } else {
                    ""
                }
            )));
        }
        // The file is a live session's: left as it is, however short.
        Err(Failed(e @ CliError::LiveOutput { .. })) => {
            output.discard();
            return Err(e);
        }
        Err(Failed(e)) => return Err(output.fail(e)),
    };
    progress.event(json!({"event": "cloned"}));
    if let Ok(state) = consumer.service_state(false) {
        for d in state
            .data_sources
            .into_iter()
            .filter_map(|d| d.ds_descriptor)
        {
            report.categories.extend(track_event_categories(&d));
            report.registered.extend(d.name);
        }
    }
    let analysis = inspect::analyze_recorded(&path).ok();
    if let Some((Some(first), Some(last))) = analysis
        .as_ref()
        .map(|a| (a.clocks.first_ns, a.clocks.last_ns))
    {
        report.elapsed = Duration::from_nanos(last.saturating_sub(first));
    }
    let config = snapshot_config(&path, &what)?;
    let file_bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    let summary = Summary::new(&path, file_bytes, &config, &report, analysis.as_ref());
    progress.done();
    summary
        .render(&mut std::io::stderr().lock())
        .map_err(CliError::Output)?;
    progress.event(json!({"event": "done", "summary": summary}));
    Ok(exit::OK)
}

/// Why [`snapshot`] made none.
pub(super) enum SnapshotError {
    /// The service refused the clone, saying this.
    Refused(String),
    /// Talking to the service or writing the file failed.
    Failed(CliError),
}
use SnapshotError::{Failed, Refused};

impl From<CliError> for SnapshotError {
    fn from(e: CliError) -> Self {
        Failed(e)
    }
}

/// Clones a session as `request` says on `consumer` (which must have no
/// session) into `output`: the service writes a `write_into_file`
/// session's snapshot itself, any other is read here; then frees the
/// clone. What was written, as a session's report.
///
/// `output` is not emptied before the service has answered: it may be the
/// session's own `write_into_file` file (see [`check_not_live`]), which the
/// service refuses to clone into, and which must then be left alone. Once
/// the service has written a snapshot into it, whatever an older file had
/// past the snapshot's end is cut off; a snapshot read here empties it
/// first.
pub(super) fn snapshot(
    consumer: &Consumer,
    request: CloneSessionRequest,
    output: &OutputFile,
    progress: &mut Progress,
) -> Result<SessionReport, SnapshotError> {
    check_not_live(consumer, output)?;
    // From here the service may write into it.
    output.arm();
    let fd: OwnedFd = output
        .file
        .try_clone()
        .map_err(io_error("open", &output.path))?
        .into();
    let mut call =
        consumer.start::<consumer_port::CloneSession>("CloneSession", &request, Some(fd))?;
    let reply = next(&mut call, Some(CLONE_TIMEOUT))
        .map_err(|source| CliError::Ipc {
            what: "CloneSession",
            source,
        })?
        .message;
    if reply.success != Some(true) {
        if reply.error.as_deref() == Some(LIVE_OUTPUT_REFUSAL.as_str()) {
            return Err(Failed(live_output(
                output,
                "the service said so, and refused the clone".into(),
            )));
        }
        return Err(Refused(
            reply.error.filter(|e| !e.is_empty()).unwrap_or_else(|| {
                "no reason given (a service without CloneSession answers so)".into()
            }),
        ));
    }
    let into_file = reply.was_write_into_file == Some(true);
    let mut report = SessionReport {
        ended: Ended::Cloned {
            flushed: true,
            into_file,
        },
        elapsed: Duration::ZERO,
        packets_written: 0,
        bytes_written: 0,
        incomplete_packets: 0,
        started: Default::default(),
        observed: false,
        attached: true,
        registered: Default::default(),
        categories: Default::default(),
        stats: None,
        service_at_start: Default::default(),
        snapshots: Vec::new(),
        failed_snapshots: Vec::new(),
    };
    if into_file {
        output.cut_at_position()?;
    } else {
        output.truncate()?;
        read_snapshot(consumer, output, &mut report, progress)?;
    }
    output.keep();
    report.stats = consumer.trace_stats().ok().flatten();
    if let Some(stats) = &report.stats {
        if stats.final_flush_outcome == Some(FINAL_FLUSH_FAILED) {
            report.ended = Ended::Cloned {
                flushed: false,
                into_file,
            };
        }
    }
    // The snapshot is in the file; freeing it only returns its memory
    // sooner (disconnecting frees it too).
    let _ = consumer.call::<consumer_port::FreeBuffers>(
        "FreeBuffers",
        &FreeBuffersRequest { buffer_ids: vec![] },
        CALL_TIMEOUT,
    );
    Ok(report)
}

/// Refuses `output` if the service holds it open, which makes it the file
/// a `write_into_file` session is writing (or another clone's): the
/// service would write the snapshot over it. Looked up in the service's
/// open files (`/proc/PID/fd`, the pid from the socket's peer
/// credentials); where they cannot be read (a service of another user),
/// our service still refuses it itself (the real one does not check).
fn check_not_live(consumer: &Consumer, output: &OutputFile) -> Result<(), CliError> {
    let Some(pid) = consumer.service_pid() else {
        return Ok(());
    };
    let Ok(ours) = rustix::fs::fstat(&output.file) else {
        return Ok(());
    };
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Ok(());
    };
    let held = fds.filter_map(Result::ok).any(|fd| {
        rustix::fs::stat(fd.path())
            .is_ok_and(|st| st.st_dev == ours.st_dev && st.st_ino == ours.st_ino)
    });
    if held {
        return Err(live_output(
            output,
            format!("the tracing service, pid {pid}, has it open"),
        ));
    }
    Ok(())
}

/// [`CliError::LiveOutput`] for `output`.
fn live_output(output: &OutputFile, how: String) -> CliError {
    CliError::LiveOutput {
        path: output.path.clone(),
        how,
    }
}

/// Reads the cloned session's buffers into the output file.
fn read_snapshot(
    consumer: &Consumer,
    output: &OutputFile,
    report: &mut SessionReport,
    progress: &mut Progress,
) -> Result<(), CliError> {
    progress.note("reading the snapshot");
    let file = output
        .file
        .try_clone()
        .map_err(io_error("open", &output.path))?;
    let mut writer = BufWriter::new(file);
    session::read_buffers(consumer, &mut writer, &output.path, report)?;
    writer.flush().map_err(io_error("write", &output.path))
}

/// The config in the snapshot's `trace_config` packet (the cloned
/// session's), or an empty one if it has none (`disable_trace_config`).
fn snapshot_config(path: &std::path::Path, what: &str) -> Result<Config, CliError> {
    let origin = format!("the cloned {what}");
    let config_of = |packet: &[u8]| {
        Fields::new(packet)
            .map_while(Result::ok)
            .find_map(|f| match f.value {
                Value::LengthDelimited(b) if f.number == tp::TRACE_CONFIG => Some(b.to_vec()),
                _ => None,
            })
    };
    let bytes = std::fs::File::open(path)
        .ok()
        .and_then(|f| {
            PacketReader::new(f)
                .map_while(Result::ok)
                .find_map(|p| config_of(&p.bytes))
        })
        .unwrap_or_default();
    Ok(Config::from_binary(bytes, &origin)?)
}
