//! One tracing session, driven over the consumer socket:
//!
//! 1. EnableTracing with the config (and, for write_into_file, the output
//!    file's descriptor); its reply only comes when the session is over.
//!    A session this consumer has attached to (`--attach`) is already
//!    running: EnableTracing with `attach_notification_only` asks for that
//!    same reply instead ([`Begin::Attached`]).
//! 2. While it runs: ObserveEvents for data source instances, and
//!    GetTraceStats for the progress line.
//! 3. The end: either the service ends the session (duration, error), or
//!    the person stops it (Ctrl-C, SIGTERM): Flush, DisableTracing, then
//!    wait for the EnableTracing reply.
//! 4. ReadBuffers into the file, each packet's slices preceded by
//!    `0x0A varint(len)` (unless the service wrote the file itself), the
//!    final statistics, FreeBuffers.
//!
//! A CLONE_SNAPSHOT session's snapshots are taken beside this loop (the
//! `snapshots` module): the loop only hands each trigger over and reports
//! what came of it. Once the session has stopped, and before it is freed
//! (a clone in progress needs its source), the snapshot being taken is
//! waited for and every other one asked for is accounted for.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::progress::{Progress, Snapshot};
use super::snapshots::{FailedSnapshot, Snapshots};
use crate::config::Config;
use crate::consumer::{next, Consumer, CALL_TIMEOUT};
use crate::query::track_event_categories;
use crate::{trace_file, CliError};
use shmtrace_ipc::protos::observable_events::{
    CloneTriggerHit, DataSourceInstanceState, Type as ObservableType,
};
use shmtrace_ipc::protos::{
    consumer_port, DisableTracingRequest, EnableTracingRequest, EnableTracingResponse,
    FlushRequest, FreeBuffersRequest, ObserveEventsRequest, ReadBuffersRequest, TraceStats,
};
use shmtrace_ipc::{ClientError, PendingCall};

/// How often the loop looks at the stop flag and the session.
const POLL: Duration = Duration::from_millis(100);
/// Margin on top of the service's own timeouts before giving up waiting.
const MARGIN: Duration = Duration::from_secs(5);
/// Perfetto's default flush and data-source stop timeouts.
const DEFAULT_SERVICE_TIMEOUT_MS: u32 = 5000;
/// How long one ReadBuffers reply may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// What stops a session from this side: a flag its caller sets, and what
/// setting it meant, for the summary.
#[derive(Clone, Copy)]
pub struct Stop<'a> {
    /// Set to flush and stop the session.
    pub flag: &'a AtomicBool,
    /// Why the flag was set, asked once the session has stopped: "on
    /// request" (Ctrl-C, SIGTERM), "at the end of the input", ...
    pub why: &'a dyn Fn() -> String,
}

impl<'a> Stop<'a> {
    /// A flag that Ctrl-C or SIGTERM sets ([`stop_signals`](super::stop_signals)).
    pub fn on_request(flag: &'a AtomicBool) -> Self {
        Self {
            flag,
            why: &|| "on request".to_owned(),
        }
    }
}

/// Why the session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Stopped from this side ([`Stop`]); `flushed` says whether the
    /// flush before stopping succeeded.
    Stopped {
        /// Why, as [`Stop::why`] said it.
        why: String,
        /// The flush succeeded.
        flushed: bool,
    },
    /// The service ended it (duration elapsed, max file size, ...).
    ByService,
    /// The service refused or aborted it.
    Failed(String),
    /// Not ended: a snapshot of it was cloned (`record --clone`), and it
    /// runs on.
    Cloned {
        /// The flush before the snapshot succeeded.
        flushed: bool,
        /// The service wrote the snapshot into the file itself (a
        /// `write_into_file` session's).
        into_file: bool,
    },
}

/// What happened.
#[derive(Debug, Clone)]
pub struct SessionReport {
    /// Why it ended.
    pub ended: Ended,
    /// From EnableTracing to the end.
    pub elapsed: Duration,
    /// Packets written into the file by this consumer (0 if the service
    /// wrote the file).
    pub packets_written: u64,
    /// Bytes written into the file by this consumer.
    pub bytes_written: u64,
    /// A packet whose last slice never came (dropped, counted here).
    pub incomplete_packets: u64,
    /// Data source instances seen started: `(producer, data source)`.
    pub started: BTreeSet<(String, String)>,
    /// Whether ObserveEvents worked (else `started` is empty).
    pub observed: bool,
    /// This consumer attached to a running session: which producers
    /// registered and started its data sources before was not seen.
    pub attached: bool,
    /// Data source names registered with the service at the end.
    pub registered: BTreeSet<String>,
    /// Track event categories (with their tags) the producers registered
    /// with the service, as seen at the end (and, by `record`, at the
    /// start): a program that came and went in between is not seen.
    pub categories: BTreeMap<String, Vec<String>>,
    /// The last statistics the service gave.
    pub stats: Option<TraceStats>,
    /// The service-wide counters of the statistics as the session started,
    /// or as this consumer attached to it ([`ServiceCounters`]): what they
    /// held then was lost before, by other sessions (or while detached).
    pub service_at_start: ServiceCounters,
    /// Snapshots written for CLONE_SNAPSHOT triggers: `<output>.<n>`, as
    /// perfetto_cmd names them (n counts the triggers fired).
    pub snapshots: Vec<PathBuf>,
    /// Snapshots CLONE_SNAPSHOT triggers asked for and that were not
    /// written, each with its number kept.
    pub failed_snapshots: Vec<FailedSnapshot>,
}

/// `TraceStats` counters that are the service's since it started, over all
/// its sessions, not the session's: upstream's `TracingServiceImpl` keeps
/// `chunks_discarded` and `patches_discarded` service-wide (and Perfetto's
/// trace processor files them as info, not loss). A session's share is
/// what they grew by while it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceCounters {
    /// `TraceStats.chunks_discarded`.
    pub chunks_discarded: u64,
    /// `TraceStats.patches_discarded`.
    pub patches_discarded: u64,
}

impl ServiceCounters {
    /// The names of the service-wide counters, as `TraceStats` spells them.
    pub const NAMES: [&str; 2] = ["chunks_discarded", "patches_discarded"];

    /// The service-wide counters of `stats`.
    pub fn of(stats: &TraceStats) -> Self {
        ServiceCounters {
            chunks_discarded: stats.chunks_discarded.unwrap_or(0),
            patches_discarded: stats.patches_discarded.unwrap_or(0),
        }
    }

    /// The counter named `name` (a [`NAMES`](Self::NAMES) entry), 0 for
    /// any other name.
    pub fn get(&self, name: &str) -> u64 {
        match name {
            "chunks_discarded" => self.chunks_discarded,
            "patches_discarded" => self.patches_discarded,
            _ => 0,
        }
    }
}

/// How this consumer came to the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// It starts the session with its config.
    Enable,
    /// It attached to a running session (ConsumerPort Attach).
    Attached,
}

/// Where the trace goes.
#[derive(Debug)]
pub enum Output<'a> {
    /// This consumer reads the buffers into `file` at the end.
    Read {
        /// The opened output file.
        file: File,
        /// Its path (for messages).
        path: &'a Path,
    },
    /// The service writes into `fd` while the session runs.
    IntoFile {
        /// A descriptor of the output file for the service.
        fd: OwnedFd,
    },
    /// The service writes the file named in the config (`output_path`).
    ByService,
}

/// Short names of the loss counters (the ones `inspect` explains), for the
/// status line; the service-wide ones less what they held at `start`.
fn loss_counters(stats: &TraceStats, start: ServiceCounters) -> Vec<(&'static str, u64)> {
    let mut out: Vec<(&'static str, u64)> = Vec::new();
    let mut add = |name: &'static str, v: Option<u64>| {
        let v = v.unwrap_or(0);
        if v > 0 {
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, total)) => *total += v,
                None => out.push((name, v)),
            }
        }
    };
    for b in &stats.buffer_stats {
        add("overwritten", b.chunks_overwritten);
        add("discarded", b.chunks_discarded);
        add("packets cut short by producers", b.trace_writer_packet_loss);
        add("malformed", b.abi_violations);
        add("failed patches", b.patches_failed);
    }
    let during = |v: Option<u64>, before: u64| v.map(|v| v.saturating_sub(before));
    add(
        "refused chunks",
        during(stats.chunks_discarded, start.chunks_discarded),
    );
    add(
        "refused patches",
        during(stats.patches_discarded, start.patches_discarded),
    );
    add("invalid packets", stats.invalid_packets);
    add(
        "packets the trace filter found malformed",
        stats.filter_stats.as_ref().and_then(|f| f.errors),
    );
    out
}

/// Runs the session until it ends; writes the trace. `announce`, if
/// given, is noted once the service has not refused the session (where
/// the trace goes, say), before "tracing". The snapshots its
/// CLONE_SNAPSHOT triggers ask for are taken beside it (`snapshots`
/// module) and all accounted for before it returns, even with an error.
pub fn run(
    consumer: &Consumer,
    config: &Config,
    begin: Begin,
    output: Output<'_>,
    announce: Option<&str>,
    stop: Stop<'_>,
    progress: &mut Progress,
) -> Result<SessionReport, CliError> {
    let base = match &output {
        Output::Read { path, .. } => Some(*path),
        Output::IntoFile { .. } | Output::ByService => None,
    };
    let mut snapshots = Snapshots::new(consumer.address().clone(), base);
    let view = config.view();
    let mut events_to_observe = vec![
        ObservableType::DataSourcesInstances as i32,
        ObservableType::AllDataSourcesStarted as i32,
    ];
    if config.clone_snapshots() {
        events_to_observe.push(ObservableType::CloneTriggerHit as i32);
    }
    let mut observe = consumer
        .start::<consumer_port::ObserveEvents>(
            "ObserveEvents",
            &ObserveEventsRequest { events_to_observe },
            None,
        )
        .ok();
    let (fd, mut read_into) = match output {
        Output::Read { file, path } => (None, Some((BufWriter::new(file), path))),
        Output::IntoFile { fd } => (Some(fd), None),
        Output::ByService => (None, None),
    };
    let request = match begin {
        Begin::Enable => EnableTracingRequest {
            trace_config: Some(config.bytes().to_vec().into()),
            attach_notification_only: None,
        },
        Begin::Attached => EnableTracingRequest {
            trace_config: None,
            attach_notification_only: Some(true),
        },
    };
    let mut enable =
        consumer.start::<consumer_port::EnableTracing>("EnableTracing", &request, fd)?;
    // A service refuses a session in its reply to EnableTracing, before it
    // answers the next call on this connection: one round trip tells a
    // refusal (over a limit, say) before "tracing" is printed. Its
    // statistics are the service-wide counters' baseline.
    let service_at_start = consumer
        .trace_stats()
        .ok()
        .flatten()
        .map(|s| ServiceCounters::of(&s))
        .unwrap_or_default();
    let mut early = session_reply(&mut enable, Duration::ZERO)?;
    if let Some(error) = early
        .as_ref()
        .and_then(|r| r.error.as_deref())
        .filter(|e| !e.is_empty())
    {
        return Err(CliError::Session(format!("refused the session: {error}")));
    }
    if let Some(announce) = announce {
        progress.note(announce);
    }
    let started_at = Instant::now();
    progress.event(json!({"event": "tracing"}));
    progress.note(&format!(
        "{}{}; press Ctrl-C to stop",
        match begin {
            Begin::Enable if config.waits_for_start_trigger() => {
                "waiting for a START_TRACING trigger"
            }
            Begin::Enable => "tracing",
            Begin::Attached => "attached to the session",
        },
        match view.duration_ms.filter(|&d| d > 0) {
            Some(ms) => format!(
                " {}{}",
                if begin == Begin::Attached {
                    "configured for "
                } else {
                    "for "
                },
                crate::units::Elapsed(Duration::from_millis(ms.into()))
            ),
            None => String::new(),
        }
    ));

    let mut report = SessionReport {
        ended: Ended::ByService,
        elapsed: Duration::ZERO,
        packets_written: 0,
        bytes_written: 0,
        incomplete_packets: 0,
        started: BTreeSet::new(),
        // Attached: the data sources started before this consumer came.
        observed: observe.is_some() && begin == Begin::Enable,
        attached: begin == Begin::Attached,
        registered: BTreeSet::new(),
        categories: BTreeMap::new(),
        stats: None,
        service_at_start,
        snapshots: Vec::new(),
        failed_snapshots: Vec::new(),
    };
    let mut all_started_reported = false;
    let mut hits = Vec::new();
    let hint = "Ctrl-C to stop";

    // 1. Until the service ends the session or we are told to stop.
    let reply = loop {
        if let Some(reply) = early.take() {
            break Some(reply);
        }
        if stop.flag.load(Ordering::Relaxed) {
            break None;
        }
        let reply =
            session_reply(&mut enable, POLL).map_err(|e| abandon(e, &mut snapshots, progress))?;
        if let Some(reply) = reply {
            break Some(reply);
        }
        drain_observed(
            &mut observe,
            &mut report,
            progress,
            &mut all_started_reported,
            &mut hits,
        );
        for hit in hits.drain(..) {
            snapshots.start(hit, progress);
        }
        snapshots.poll(progress);
        if progress.due() {
            let stats = consumer.trace_stats().ok().flatten();
            let snapshot = snapshot(started_at, stats.as_ref(), &report);
            if stats.is_some() {
                report.stats = stats;
            }
            progress.update(&snapshot, hint);
        }
    };

    // Snapshots asked for and not begun yet are not taken now; the one
    // being taken goes on beside the stop.
    snapshots.end();

    // 2. Stop, if the person asked.
    let reply = match reply {
        Some(reply) => reply,
        None => {
            let flush_ms = view
                .flush_timeout_ms
                .filter(|&t| t > 0)
                .unwrap_or(DEFAULT_SERVICE_TIMEOUT_MS);
            // A producer that does not answer holds the flush for its
            // whole timeout: say how long, and how not to wait.
            progress.note(&format!(
                "stopping: flushing the producers' data (at most {}; Ctrl-C again aborts \
                 without a trace)",
                crate::units::Elapsed(Duration::from_millis(flush_ms.into()))
            ));
            progress.event(json!({"event": "stopping"}));
            let flushed = consumer
                .call::<consumer_port::Flush>(
                    "Flush",
                    &FlushRequest {
                        timeout_ms: Some(flush_ms),
                        flags: None,
                    },
                    Duration::from_millis(flush_ms.into()) + MARGIN,
                )
                .is_ok();
            if !flushed {
                progress.warn(
                    "the flush did not complete in time: data still in the producers' \
                     buffers may be missing",
                );
            }
            consumer
                .call::<consumer_port::DisableTracing>(
                    "DisableTracing",
                    &DisableTracingRequest {},
                    CALL_TIMEOUT,
                )
                .map_err(|e| abandon(e, &mut snapshots, progress))?;
            let stop_ms = view
                .data_source_stop_timeout_ms
                .filter(|&t| t > 0)
                .unwrap_or(DEFAULT_SERVICE_TIMEOUT_MS);
            let reply = next(
                &mut enable,
                Some(Duration::from_millis(stop_ms.into()) + MARGIN),
            )
            .map_err(|source| {
                let e = CliError::Ipc {
                    what: "waiting for the session to stop",
                    source,
                };
                abandon(e, &mut snapshots, progress)
            })?;
            report.ended = Ended::Stopped {
                why: (stop.why)(),
                flushed,
            };
            reply.message
        }
    };
    report.elapsed = started_at.elapsed();
    if let Some(error) = reply.error.filter(|e| !e.is_empty()) {
        report.ended = Ended::Failed(error);
    }
    drain_observed(
        &mut observe,
        &mut report,
        progress,
        &mut all_started_reported,
        &mut hits,
    );
    // Triggers that came as the session ended keep their numbers, and are
    // reported as not taken.
    for hit in hits.drain(..) {
        snapshots.start(hit, progress);
    }
    // Before the session is freed: a clone in progress needs its source.
    snapshots.finish(progress);
    report.snapshots = std::mem::take(&mut snapshots.written);
    report.failed_snapshots = std::mem::take(&mut snapshots.failed);

    // 3. Read what the buffers hold.
    if let Some((writer, path)) = read_into.as_mut() {
        progress.note("reading the trace buffers");
        read_buffers(consumer, writer, path, &mut report)?;
        writer.flush().map_err(|source| CliError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        })?;
    }
    if let Ok(Some(stats)) = consumer.trace_stats() {
        report.stats = Some(stats);
    }
    // The session is over; a failure to free it only leaks it until we
    // disconnect, which frees it too.
    let _ = consumer.call::<consumer_port::FreeBuffers>(
        "FreeBuffers",
        &FreeBuffersRequest { buffer_ids: vec![] },
        CALL_TIMEOUT,
    );
    if let Ok(state) = consumer.service_state(false) {
        let descriptors = state
            .data_sources
            .into_iter()
            .filter_map(|d| d.ds_descriptor);
        for d in descriptors {
            report.categories.extend(track_event_categories(&d));
            report.registered.extend(d.name);
        }
    }
    Ok(report)
}

/// The session failed with `error` while snapshots may be in progress:
/// each is accounted for ([`Snapshots::finish`]) before the error is
/// returned.
fn abandon(error: CliError, snapshots: &mut Snapshots, progress: &mut Progress) -> CliError {
    snapshots.finish(progress);
    error
}

/// The EnableTracing reply (the session's end) if it comes within `wait`.
fn session_reply(
    enable: &mut PendingCall<consumer_port::EnableTracing>,
    wait: Duration,
) -> Result<Option<EnableTracingResponse>, CliError> {
    let source = match enable.next(Some(wait)) {
        Some(Ok(reply)) => return Ok(Some(reply.message)),
        Some(Err(ClientError::Timeout)) => return Ok(None),
        Some(Err(source)) => source,
        None => ClientError::Disconnected,
    };
    Err(CliError::Ipc {
        what: "the session",
        source,
    })
}

fn snapshot(started_at: Instant, stats: Option<&TraceStats>, report: &SessionReport) -> Snapshot {
    let producers: BTreeSet<&String> = report.started.iter().map(|(p, _)| p).collect();
    Snapshot {
        elapsed: started_at.elapsed(),
        bytes: stats.map_or(0, |s| {
            s.buffer_stats
                .iter()
                .map(|b| b.bytes_written.unwrap_or(0))
                .sum()
        }),
        producers: producers.len(),
        data_sources: report.started.len(),
        losses: stats
            .map(|s| loss_counters(s, report.service_at_start))
            .unwrap_or_default(),
    }
}

fn drain_observed(
    observe: &mut Option<PendingCall<consumer_port::ObserveEvents>>,
    report: &mut SessionReport,
    progress: &mut Progress,
    all_started_reported: &mut bool,
    hits: &mut Vec<CloneTriggerHit>,
) {
    let Some(call) = observe else { return };
    loop {
        match call.next(Some(Duration::ZERO)) {
            Some(Ok(reply)) => {
                let events = reply.message.events.unwrap_or_default();
                for change in events.instance_state_changes {
                    let key = (
                        change.producer_name.unwrap_or_default(),
                        change.data_source_name.unwrap_or_default(),
                    );
                    if change.state == Some(DataSourceInstanceState::Started as i32) {
                        progress.event(json!({
                            "event": "data_source_started",
                            "producer": key.0,
                            "data_source": key.1,
                        }));
                        report.started.insert(key);
                    }
                }
                hits.extend(events.clone_trigger_hit);
                if events.all_data_sources_started == Some(true) && !*all_started_reported {
                    *all_started_reported = true;
                    progress.event(json!({"event": "started"}));
                }
                if !reply.has_more {
                    *observe = None;
                    return;
                }
            }
            Some(Err(ClientError::Timeout)) => return,
            // The service does not support it, or the stream ended.
            Some(Err(_)) | None => {
                *observe = None;
                return;
            }
        }
    }
}

pub(super) fn read_buffers(
    consumer: &Consumer,
    writer: &mut impl Write,
    path: &Path,
    report: &mut SessionReport,
) -> Result<(), CliError> {
    let write_error = |source| CliError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    };
    let mut call = consumer.start::<consumer_port::ReadBuffers>(
        "ReadBuffers",
        &ReadBuffersRequest {},
        None,
    )?;
    let mut pending: Vec<bytes::Bytes> = Vec::new();
    loop {
        let reply = next(&mut call, Some(READ_TIMEOUT)).map_err(|source| CliError::Ipc {
            what: "ReadBuffers",
            source,
        })?;
        for slice in reply.message.slices {
            pending.push(slice.data.unwrap_or_default());
            if slice.last_slice_for_packet == Some(true) {
                let len: usize = pending.iter().map(|s| s.len()).sum();
                let preamble = trace_file::write_preamble(writer, len).map_err(write_error)?;
                for s in pending.drain(..) {
                    writer.write_all(&s).map_err(write_error)?;
                }
                report.packets_written += 1;
                report.bytes_written += (preamble + len) as u64;
            }
        }
        if !reply.has_more {
            break;
        }
    }
    if !pending.is_empty() {
        report.incomplete_packets += 1;
    }
    Ok(())
}
