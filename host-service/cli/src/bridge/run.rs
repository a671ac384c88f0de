//! The bridge's I/O shell: one [`FirmwareSource`], the process's producer
//! connection, the [engine](super::engine) in between.
//!
//! The calling thread reads the source and runs the engine; the
//! producer's own threads talk to the service. What the service asks of
//! the data source reaches the firmware through the source, if it can
//! take requests: a session starting it asks for an incremental-state
//! clear (the session's sequences start in the middle of the firmware's,
//! without its interned data), then enables tracing (in that order: with
//! tracing on before the clear is seen, a firmware writes on with the
//! interned data of before the session), the last one stopping
//! disables it, `ClearIncrementalState` is passed on as a clear. A flush
//! (and a stop, before it is acknowledged) waits until every event the
//! source had was forwarded, at most [`FLUSH_WAIT`].
//!
//! A hello arriving while a session runs the data source (a firmware that
//! restarted mid-session) enables tracing, whatever the firmware starts
//! with; the old boot's sequences are marked lost (the engine's "A boot
//! cut mid-session is marked"). Outside sessions the firmware is kept
//! quiet: a hello arriving while no session runs the data source (a
//! firmware that traces from boot on) and the last session's stop disable
//! tracing, then ask for a flush. So a
//! writer holds no chunk begun outside a session when the next one starts:
//! a chunk it held would carry packets written before the session's clear
//! into the session, packets whose interned data and sequence start the
//! session never got. The first hello's data source is registered (the
//! producer connects) only once the firmware showed that flush done (or
//! the source gave up on it and on its late answer,
//! [`flush_unanswered`](super::FirmwareSource::flush_unanswered)): a
//! session starting it sooner would get what the flush commits (under
//! load, QEMU's UART took a second to carry a booting firmware's backlog,
//! and the session got a second of events from before it started).
//!
//! Every session's stop asks for a flush (the last one's after disabling
//! tracing): what the firmware's writers hold in open chunks belongs to a
//! session that stops while another runs too. The bridge stopping (Ctrl-C,
//! SIGTERM, its stdin's end) while a session runs does what the last stop
//! does first, disable then flush (a hello meanwhile is quieted too), and
//! waits for that flush (at most [`FLUSH_WAIT`]), so its sessions get
//! everything the firmware wrote; a flush that runs out of time is marked
//! as a lost link is (the engine's "A link lost mid-session is marked").
//!
//! The producer is named after the first hello (unless told otherwise)
//! and connects once that hello arrived (and the firmware is quiet); the
//! bridge fails if it cannot reach the service then. Losses and counters are logged every
//! `log_interval` and returned as a [`Summary`] on exit.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shmtrace_producer::{
    ConnectError, DataSourceHandler, ForwardStats, InstanceArgs, ProducerConfig,
};

use super::engine::{ClockStatus, Engine, EngineStats};
use super::output::ProducerOutput;
use super::{FirmwareEvent, FirmwareSource, Request, SourceError};
use crate::CliError;

/// How long a flush waits for the bridge to forward what the source has.
pub const FLUSH_WAIT: Duration = Duration::from_millis(500);
/// How long the source is polled at a time (the shell's reaction time).
const POLL: Duration = Duration::from_millis(20);
/// How long the source is polled at a time while a flush waits for the
/// firmware.
const FLUSH_POLL: Duration = Duration::from_millis(1);
/// How long the producer may take to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the bridge runs.
#[derive(Debug, Clone, Default)]
pub struct BridgeOptions {
    /// The service's producer socket (`None`: `$PERFETTO_PRODUCER_SOCK_NAME`
    /// or Perfetto's default).
    pub socket: Option<String>,
    /// The producer name (`None`: the firmware's, from its hello).
    pub producer_name: Option<String>,
    /// SMB page size to ask the service for, bytes (0: its default). A
    /// forwarded chunk must fit one page.
    pub page_size_hint: u32,
    /// SMB size to ask the service for, bytes (0: its default).
    pub smb_size_hint: u32,
    /// Log the counters this often.
    pub log_interval: Option<Duration>,
    /// A fixed clock relation instead of a measured one (offline import):
    /// `boot = firmware + offset`.
    pub fixed_clock_offset: Option<i64>,
    /// Print `{"event":"enabled"}` / `{"event":"disabled"}` on stdout when
    /// a session starts the data source / the last one stops it (for
    /// scripts driving a one-way input).
    pub announce: bool,
}

pub use super::engine::FIRMWARE_NO_LOSS;

/// What the bridge did, for the summary.
#[derive(Debug, Clone)]
pub struct Summary {
    /// What was read.
    pub source: String,
    /// The engine's counters.
    pub engine: EngineStats,
    /// The forwarder's counters.
    pub forward: ForwardStats,
    /// The transport's losses (cumulative).
    pub transport: Vec<(&'static str, u64)>,
    /// The transport's other counters (cumulative).
    pub transport_counters: Vec<(&'static str, u64)>,
    /// The firmware's own counters (summed over boots).
    pub firmware: Vec<(String, u64)>,
    /// The clock relation at the end.
    pub clock: Option<ClockStatus>,
    /// Requests the source could not pass on.
    pub requests_unsupported: u64,
}

impl Summary {
    /// The summary as JSON (every counter by name), for scripts.
    pub fn to_json(&self) -> serde_json::Value {
        let f = &self.forward;
        let named = |items: &[(&'static str, u64)]| {
            serde_json::Value::Object(
                items
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).into()))
                    .collect(),
            )
        };
        let clock = self.clock.map(|c| {
            serde_json::json!({
                "clock_id": c.clock_id,
                "samples": c.samples,
                "rejected": c.rejected,
                "fixed": c.fixed,
                "offset_ns": c.estimate.map(|e| e.offset_ns),
                "bound_ns": c.estimate.map(|e| e.bound_ns),
                "loosest_stated_bound_ns": c.loosest_stated_ns,
                "two_way": c.estimate.map(|e| e.two_way),
                "rate": c.rate.map(|r| r.ratio()),
                "rate_beyond_drift": c.rate.map(|r| r.beyond_drift),
            })
        });
        serde_json::json!({
            "source": self.source,
            "engine": self.engine,
            "forward": {
                "chunks_received": f.chunks_received,
                "chunks_forwarded": f.chunks_forwarded,
                "chunks_no_session": f.chunks_no_session,
                "chunks_invalid": f.chunks_invalid,
                "chunks_too_big": f.chunks_too_big,
                "chunks_no_room": f.chunks_no_room,
                "chunks_no_writer_id": f.chunks_no_writer_id,
                "chunks_lost": f.chunks_lost,
                "chunks_skipped": f.chunks_skipped,
                "orphan_fragments_dropped": f.orphan_fragments_dropped,
                "losses_marked": f.losses_marked,
                "lanes_restarted": f.lanes_restarted,
                "packets_injected": f.packets_injected,
                "start_packets_missed": f.start_packets_missed,
                "patches_forwarded": f.patches_forwarded,
                "patches_dropped": f.patches_dropped,
            },
            "transport_loss": named(&self.transport),
            "transport": named(&self.transport_counters),
            "firmware": serde_json::Value::Object(
                self.firmware.iter().map(|(n, v)| (n.clone(), (*v).into())).collect()
            ),
            "clock": clock,
            "requests_unsupported": self.requests_unsupported,
            "lost_anything": self.lost_anything(),
        })
    }

    /// Whether anything was lost on the way (forwarder, transport or
    /// firmware counters, or a loss the bridge marked at the end of a
    /// session or boot: a flush given up on, whose chunks come after it, a
    /// boot or a two-way link that ended mid-session, whose open chunks
    /// never came): the JSON summary's `lost_anything`, for scripts (the
    /// exit status does not depend on it).
    ///
    /// Chunks that arrived while no session had the data source started
    /// (`chunks_no_session`) are not a loss: a firmware writes while its
    /// `trace_enabled` is on, and only a two-way link can turn it off
    /// between sessions (a one-way link, an always-on firmware, the time
    /// between its hello and the bridge's DISABLE write what nobody asked
    /// to record, as a Perfetto SDK's data source records nothing before
    /// its start). What a session did expect and got too late (its flush
    /// given up on) is counted by the mark it gets instead.
    pub fn lost_anything(&self) -> bool {
        let e = &self.engine;
        let f = &self.forward;
        e.chunks_invalid
            + e.chunks_before_hello
            + e.chunks_dropped
            + e.patch_groups_dropped
            + e.trailing_losses_marked
            + e.restarts_mid_session
            + e.links_lost_mid_session
            + f.chunks_no_room
            + f.chunks_too_big
            + f.chunks_lost
            + f.patches_dropped
            > 0
            || self.transport.iter().any(|(_, v)| *v > 0)
            || self
                .firmware
                .iter()
                .any(|(n, v)| *v > 0 && !FIRMWARE_NO_LOSS.contains(&n.as_str()))
    }
}

fn list<N: fmt::Display>(items: &[(N, u64)]) -> String {
    if items.is_empty() {
        return "none reported".into();
    }
    items
        .iter()
        .map(|(n, v)| format!("{n} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Summary {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.engine;
        let f = &self.forward;
        writeln!(out, "firmware bridge: {}", self.source)?;
        writeln!(
            out,
            "  boots {}, resets {}, hellos refused {}, boots ended mid-session {} (their open \
             chunks and undrained ring lost: marked), links lost mid-session {} (the same)",
            e.boots, e.resets, e.hellos_refused, e.restarts_mid_session, e.links_lost_mid_session
        )?;
        writeln!(
            out,
            "  chunks {}: forwarded {} ({} copies), no session {} (written while nobody \
             recorded: not lost), invalid {}, before a hello {}, dropped {} (no room {}, too big \
             {}, no writer id {}), without a clock {}",
            e.chunks,
            e.chunks_forwarded,
            f.chunks_forwarded,
            e.chunks_no_session,
            e.chunks_invalid,
            e.chunks_before_hello,
            e.chunks_dropped,
            f.chunks_no_room,
            f.chunks_too_big,
            f.chunks_no_writer_id,
            e.chunks_without_clock
        )?;
        writeln!(
            out,
            "  patches: {} groups, {} dropped; {} patches forwarded, {} dropped",
            e.patch_groups, e.patch_groups_dropped, f.patches_forwarded, f.patches_dropped
        )?;
        writeln!(
            out,
            "  sequences: {} losses marked ({} with a new writer, {} at the end of a session for \
             the firmware's or the link's drops, or a boot's end mid-session), {} orphan \
             fragments dropped",
            f.losses_marked,
            f.lanes_restarted,
            e.trailing_losses_marked,
            f.orphan_fragments_dropped
        )?;
        match &self.clock {
            Some(ClockStatus {
                clock_id,
                estimate: Some(est),
                fixed: true,
                ..
            }) => writeln!(
                out,
                "  clock {clock_id}: BOOTTIME = firmware {} {:.6} s (given, not measured; {} \
                 snapshots injected, {} again into one sequence)",
                if est.offset_ns < 0 { "-" } else { "+" },
                est.offset_ns.unsigned_abs() as f64 / 1e9,
                e.snapshots,
                e.snapshots_reinjected
            )?,
            Some(ClockStatus {
                clock_id,
                estimate: Some(est),
                samples,
                rejected,
                fixed: false,
                loosest_stated_ns,
                ..
            }) => writeln!(
                out,
                "  clock {clock_id}: BOOTTIME = firmware {} {:.6} s, error within {:.3} ms \
                 ({}, {samples} samples, {rejected} refused; {} snapshots injected, {} again \
                 into one sequence{})",
                if est.offset_ns < 0 { "-" } else { "+" },
                est.offset_ns.unsigned_abs() as f64 / 1e9,
                est.bound_ns as f64 / 1e6,
                if est.two_way {
                    "two-way"
                } else {
                    "one-way, plus the link's fixed latency"
                },
                e.snapshots,
                e.snapshots_reinjected,
                match loosest_stated_ns {
                    Some(w) if *w > est.bound_ns => format!(
                        "; the loosest stated in the trace within {:.3} ms",
                        *w as f64 / 1e6
                    ),
                    _ => String::new(),
                }
            )?,
            Some(ClockStatus { clock_id, .. }) if *clock_id >= 64 => writeln!(
                out,
                "  clock {clock_id}: not measured (no sample from the firmware)"
            )?,
            _ => {}
        }
        if let Some(ClockStatus {
            clock_id,
            rate: Some(rate),
            ..
        }) = &self.clock
        {
            if rate.beyond_drift {
                writeln!(
                    out,
                    "  clock {clock_id}: runs at {:.4}x the host's rate (over {:.3} s), beyond the \
                     drift allowed for: the error bound does not hold; is the clock hook's tick \
                     rate right?",
                    rate.ratio(),
                    rate.host_span_ns as f64 / 1e9
                )?;
            }
        }
        writeln!(out, "  firmware counters: {}", list(&self.firmware))?;
        writeln!(out, "  transport losses: {}", list(&self.transport))?;
        write!(out, "  transport: {}", list(&self.transport_counters))?;
        if self.requests_unsupported > 0 {
            write!(
                out,
                "\n  {} requests (enable, clear, flush, sync) could not reach the firmware \
                 (no reverse channel)",
                self.requests_unsupported
            )?;
        }
        Ok(())
    }
}

/// What the producer's threads ask of the bridge's thread.
#[derive(Default)]
struct Control {
    state: Mutex<ControlState>,
    changed: Condvar,
    instances: AtomicUsize,
}

#[derive(Default)]
struct ControlState {
    requests: Vec<Request>,
    flushes_asked: u64,
    flushes_done: u64,
    /// Instances started, not yet told to the engine.
    started: Vec<u64>,
    /// Instances stopping, with the flush that ends them.
    ending: Vec<(u64, u64)>,
}

impl Control {
    fn state(&self) -> MutexGuard<'_, ControlState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ask(&self, r: Request) {
        self.state().requests.push(r);
    }

    /// Asks the firmware for `requests`, a flush last, and counts that
    /// flush under the same lock (so the bridge's thread never completes
    /// a flush it sent before it was counted); the flush ends instance
    /// `ending`, if given. Returns the flush to wait for (`flushes_done`
    /// reaching it).
    fn ask_flush(&self, requests: &[Request], ending: Option<u64>) -> u64 {
        let mut st = self.state();
        st.requests.extend_from_slice(requests);
        st.flushes_asked += 1;
        let target = st.flushes_asked;
        if let Some(id) = ending {
            st.ending.push((id, target));
        }
        target
    }

    /// [`Control::ask_flush`], then waits (at most [`FLUSH_WAIT`]) until
    /// the bridge's thread forwarded everything its source had (and, for
    /// instance `ending`, marked the losses it never saw marked:
    /// [`Engine::session_ending`]).
    fn flush(&self, requests: &[Request], ending: Option<u64>) {
        let target = self.ask_flush(requests, ending);
        let deadline = Instant::now() + FLUSH_WAIT;
        let mut st = self.state();
        while st.flushes_done < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

/// What the last session's stop asks (disabled first: nothing is written
/// after the flush that would wait in a held chunk for the next session),
/// and the bridge's own stop while a session runs.
const QUIET: [Request; 2] = [Request::Enable(false), Request::Flush];

struct Handler(Arc<Control>);

impl DataSourceHandler for Handler {
    fn on_start(&self, args: &InstanceArgs<'_>) {
        self.0.instances.fetch_add(1, Ordering::Relaxed);
        self.0.state().started.push(args.instance_id);
        // The clear first: a writer that sees tracing on has seen it, so
        // its first packet in the session is its sequence's restart.
        self.0.ask(Request::Clear);
        self.0.ask(Request::Enable(true));
    }
    fn on_stop(&self, args: &InstanceArgs<'_>) {
        // Every stop flushes: what the writers hold in open chunks is this
        // session's too, also while another session runs on.
        let requests: &[Request] = if self.0.instances.fetch_sub(1, Ordering::Relaxed) == 1 {
            &QUIET
        } else {
            &[Request::Flush]
        };
        self.0.flush(requests, Some(args.instance_id));
    }
    fn on_flush(&self, _: &InstanceArgs<'_>) {
        self.0.flush(&[Request::Flush], None);
    }
    fn on_clear_incremental_state(&self, _: &InstanceArgs<'_>) {
        self.0.ask(Request::Clear);
    }
}

/// The link's losses so far for [`Engine::link_loss`]: flushes the source
/// gave up on (what they committed comes late: after a session's stop, it
/// has no session), restarts that cut the old boot's last frame and an
/// end of the input that cut its last frame, summed. (Its other losses
/// are of frames a later chunk of their sequence reveals, or of no data:
/// a corrupt STATS frame, garbage.)
fn link_loss(source: &dyn FirmwareSource) -> u64 {
    source
        .counters()
        .into_iter()
        .filter(|(n, _)| ["flush_timeouts", "cut_by_restart", "cut_by_end"].contains(n))
        .fold(0u64, |t, (_, v)| t.saturating_add(v))
}

/// The flushes up to `target` are done: everything the source had is
/// forwarded, so the sessions they end are told to the engine (which marks
/// their losses), the output is flushed and the waiters are woken.
fn flush_done(
    control: &Control,
    engine: &mut Engine<ProducerOutput>,
    source: &dyn FirmwareSource,
    target: u64,
) {
    let ending: Vec<u64> = {
        let mut st = control.state();
        let (done, later) = std::mem::take(&mut st.ending)
            .into_iter()
            .partition(|(_, t)| *t <= target);
        st.ending = later;
        done.into_iter().map(|(id, _)| id).collect()
    };
    engine.link_loss(link_loss(source));
    for id in ending {
        engine.session_ending(id);
    }
    engine.output().flush();
    control.state().flushes_done = target;
    control.changed.notify_all();
}

/// Host BOOTTIME, nanoseconds.
pub fn boottime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// Runs the bridge until `stop` is set or the source ends (`Ok`), or the
/// source fails or the service cannot be reached (`Err`). Logs through
/// `log`; returns the summary.
pub fn run(
    source: &mut dyn FirmwareSource,
    options: &BridgeOptions,
    stop: &AtomicBool,
) -> Result<Summary, CliError> {
    let control = Arc::new(Control::default());
    let output = ProducerOutput::new(Arc::new(Handler(control.clone())));
    let mut engine = match options.fixed_clock_offset {
        Some(o) => Engine::with_fixed_clock(output, o),
        None => Engine::new(output),
    };
    let mut producer = None;
    let mut requests_unsupported = 0;
    let mut last_log = Instant::now();
    let mut result = Ok(());
    let mut drained = true;
    // The first hello's quieting flush is pending: connect once it is done.
    let mut connect_when_quiet = false;
    // Stopping while a session runs: the flush waited for first (module
    // docs), and until when.
    let mut stopping: Option<(u64, Instant)> = None;
    let mut link_lost = false;
    loop {
        if stop.load(Ordering::Relaxed) && stopping.is_none() {
            if producer.is_none() || control.instances.load(Ordering::Relaxed) == 0 {
                break;
            }
            stopping = Some((control.ask_flush(&QUIET, None), Instant::now() + FLUSH_WAIT));
        }
        if let Some((target, deadline)) = stopping {
            if control.state().flushes_done >= target || Instant::now() >= deadline {
                break;
            }
        }
        let mut pending_flush = {
            let mut st = control.state();
            // Before the requests: a session's enable lets an offline
            // source go on, and its losses count from its start (the
            // link's up to now included: a flush given up on before it
            // started, the first hello's, lost it nothing).
            if !st.started.is_empty() {
                engine.link_loss(link_loss(&*source));
            }
            for id in std::mem::take(&mut st.started) {
                engine.session_started(id);
            }
            for r in std::mem::take(&mut st.requests) {
                if let (Request::Enable(on), true) = (r, options.announce) {
                    let event = if on { "enabled" } else { "disabled" };
                    println!("{{\"event\":\"{event}\"}}");
                }
                if !source.request(r) {
                    requests_unsupported += 1;
                }
            }
            (st.flushes_done < st.flushes_asked).then_some(st.flushes_asked)
        };
        let timeout = if !drained {
            Duration::ZERO
        } else if pending_flush.is_some() || connect_when_quiet {
            // The firmware is still flushing: read on without spinning.
            FLUSH_POLL
        } else {
            POLL
        };
        match source.poll(timeout) {
            Ok(Some(event)) => {
                drained = false;
                let hello = matches!(event, FirmwareEvent::Hello(_));
                if hello || matches!(event, FirmwareEvent::Reset) {
                    // It may end a boot. A flush the old boot answered
                    // first (a stop's, in the same read as the new boot's
                    // hello) is done: the sessions it ends lost nothing
                    // to the restart.
                    if let Some(target) = pending_flush.filter(|_| !source.flush_pending()) {
                        flush_done(&control, &mut engine, &*source, target);
                        pending_flush = None;
                    }
                    // The link's losses until now (a frame a reset cut)
                    // are marked on the old boot's sequences.
                    engine.link_loss(link_loss(&*source));
                }
                engine.handle(event, boottime_ns());
                if hello && (control.instances.load(Ordering::Relaxed) == 0 || stopping.is_some()) {
                    // No session, or the bridge stopping: quiet (module
                    // docs). A session starting meanwhile has its requests
                    // applied after these.
                    let mut asked = true;
                    for r in QUIET {
                        if !source.request(r) {
                            requests_unsupported += 1;
                            asked = false;
                        }
                    }
                    connect_when_quiet = asked && producer.is_none();
                } else if hello && !source.request(Request::Enable(true)) {
                    // A session is on: a firmware that (re)started with
                    // tracing off (`RegionConfig::trace_enabled`) joins it.
                    requests_unsupported += 1;
                }
                if hello && producer.is_none() && !connect_when_quiet {
                    if let Some(h) = engine.hello() {
                        producer = Some(connect(options, &h.producer)?);
                    }
                }
            }
            Ok(None) => {
                drained = true;
                // Quiet once the firmware showed the flush done, even after
                // the source stopped waiting for it (at most
                // `FLUSH_ANSWER_WAIT`): what it still commits was written
                // before any session.
                if connect_when_quiet && !source.flush_pending() && !source.flush_unanswered() {
                    connect_when_quiet = false;
                    if let Some(h) = engine.hello() {
                        producer = Some(connect(options, &h.producer)?);
                    }
                }
                if pending_flush.is_some() && source.flush_pending() {
                    // Not done until the firmware says so (bounded by the
                    // source).
                } else if let Some(target) = pending_flush {
                    flush_done(&control, &mut engine, &*source, target);
                }
            }
            Err(SourceError::Ended) => {
                link_lost = source.link_lost();
                break;
            }
            Err(e) => {
                result = Err(e.into_cli(source.describe()));
                break;
            }
        }
        // No clock request while the firmware is still busy with a flush:
        // it would wait behind the flush (the engine's
        // `SYNC_ANSWER_WAIT_NS`).
        let can_sync = source.can_sync() && !source.flush_unanswered();
        for r in engine.tick(boottime_ns(), can_sync) {
            if !source.request(r) {
                requests_unsupported += 1;
            }
        }
        for note in engine.take_notes() {
            log::warn!("{note}");
        }
        if let Some(every) = options.log_interval {
            if last_log.elapsed() >= every {
                last_log = Instant::now();
                let s = summary(&engine, &*source, requests_unsupported);
                log::info!("{s}");
            }
        }
    }
    // Everything read is forwarded (losses left unmarked get their mark);
    // the producer sends it before going.
    // A stop's flush that ran out of time left the firmware's open chunks
    // behind: cut off as by a lost link (if requests reach the firmware:
    // a one-way input's end is no cut either).
    let unflushed = stopping.is_some_and(|(t, _)| control.state().flushes_done < t);
    engine.link_loss(link_loss(&*source));
    engine.finish(link_lost || (unflushed && source.can_sync()));
    for note in engine.take_notes() {
        log::warn!("{note}");
    }
    engine.output().flush();
    let summary = summary(&engine, &*source, requests_unsupported);
    drop(engine);
    // Nothing more will be read: flushes (the producer's own at shutdown
    // among them) need not wait for this thread.
    control.state().flushes_done = u64::MAX;
    control.changed.notify_all();
    if producer.is_some() {
        if let Some(p) = shmtrace_producer::Producer::get() {
            p.shutdown();
        }
    }
    result.map(|()| summary)
}

fn summary(
    engine: &Engine<ProducerOutput>,
    source: &dyn FirmwareSource,
    requests_unsupported: u64,
) -> Summary {
    Summary {
        source: source.describe(),
        engine: engine.stats().clone(),
        forward: engine.output().stats(),
        transport: source.transport_loss(),
        transport_counters: source.counters(),
        firmware: engine.firmware_counters(),
        clock: engine.clock(boottime_ns()),
        requests_unsupported,
    }
}

/// Starts the producer, named `name` unless the options say otherwise,
/// and waits for its connection.
fn connect(
    options: &BridgeOptions,
    name: &str,
) -> Result<&'static shmtrace_producer::Producer, CliError> {
    let name = options
        .producer_name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| (!name.is_empty()).then(|| name.to_owned()))
        .unwrap_or_else(|| "shmtrace-bridge".into());
    let config = ProducerConfig {
        name,
        socket: options.socket.clone(),
        shmem_size_hint_bytes: options.smb_size_hint,
        shmem_page_size_hint_bytes: options.page_size_hint,
        ..Default::default()
    };
    let address = options
        .socket
        .clone()
        .unwrap_or_else(shmtrace_ipc::socket::producer_socket_name);
    let producer = shmtrace_producer::init(config).map_err(|e| CliError::Bridge(e.to_string()))?;
    if !producer.wait_connected(CONNECT_TIMEOUT) {
        return Err(CliError::ProducerUnreachable {
            address,
            detail: unreachable_detail(producer.last_error().as_deref()),
        });
    }
    Ok(producer)
}

/// Why the producer could not connect, after [`CliError::ProducerUnreachable`]'s
/// address: for a socket nobody listens on, the system's reason alone (the
/// library's own message repeats the address and points at
/// `ProducerConfig::socket`, where a bridge user has `--socket`).
fn unreachable_detail(error: Option<&ConnectError>) -> String {
    match error {
        Some(ConnectError::Unreachable { source, .. }) => source.to_string(),
        Some(e) => e.to_string(),
        None => "no connection".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(engine: EngineStats, transport_counters: Vec<(&'static str, u64)>) -> Summary {
        Summary {
            source: "test".into(),
            engine,
            forward: ForwardStats::default(),
            transport: vec![("bad_crc", 0)],
            transport_counters,
            firmware: vec![("packets_dropped".into(), 0)],
            clock: None,
            requests_unsupported: 0,
        }
    }

    /// Chunks a firmware wrote while nobody recorded are no loss; a flush
    /// given up on in a session, which the trace got a mark for, is one
    /// (before: exit status 0 with the trace saying data was lost).
    #[test]
    fn lost_anything_agrees_with_the_trace_s_marks() {
        let quiet = summary(
            EngineStats {
                chunks: 9,
                chunks_forwarded: 2,
                chunks_no_session: 7,
                ..Default::default()
            },
            vec![("flush_timeouts", 0)],
        );
        assert!(!quiet.lost_anything());
        assert!(quiet
            .to_string()
            .contains("no session 7 (written while nobody recorded: not lost)"));
        let given_up = summary(
            EngineStats {
                chunks: 9,
                chunks_forwarded: 2,
                chunks_no_session: 7,
                trailing_losses_marked: 2,
                ..Default::default()
            },
            vec![("flush_timeouts", 1)],
        );
        assert!(given_up.lost_anything());
        assert_eq!(given_up.to_json()["lost_anything"], true);
        // A board reset mid-session: its sequences marked, and a loss even
        // where no sequence of the boot had a chunk in the session to carry
        // a mark (what its writers held never came).
        for marked in [2, 0] {
            let cut = summary(
                EngineStats {
                    boots: 2,
                    resets: 1,
                    restarts_mid_session: 1,
                    trailing_losses_marked: marked,
                    ..Default::default()
                },
                vec![("cut_by_restart", 0)],
            );
            assert!(cut.lost_anything());
            assert_eq!(cut.to_json()["engine"]["restarts_mid_session"], 1);
            assert!(cut
                .to_string()
                .contains("boots ended mid-session 1 (their open chunks and undrained ring lost"));
        }
    }

    /// A relation first stated loose (its first samples queued behind a
    /// slow link), then tight: the summary names both bounds.
    #[test]
    fn the_summary_names_the_loosest_relation_the_trace_holds() {
        use crate::bridge::clock::Estimate;
        let mut s = summary(EngineStats::default(), Vec::new());
        s.clock = Some(ClockStatus {
            clock_id: 65,
            estimate: Some(Estimate {
                offset_ns: 2_000_000_000,
                bound_ns: 1_000_000,
                two_way: true,
                firmware_ns: 0,
            }),
            samples: 16,
            rejected: 0,
            fixed: false,
            rate: None,
            loosest_stated_ns: Some(500_000_000),
        });
        let text = s.to_string();
        assert!(
            text.contains("error within 1.000 ms (two-way")
                && text.contains("; the loosest stated in the trace within 500.000 ms)"),
            "{text}"
        );
        assert_eq!(s.to_json()["clock"]["loosest_stated_bound_ns"], 500_000_000);
        // Never looser than now: not said.
        if let Some(c) = &mut s.clock {
            c.loosest_stated_ns = Some(1_000_000);
        }
        assert!(!s.to_string().contains("loosest"));
    }

    #[test]
    fn an_unreachable_service_is_said_once_with_the_flag_to_pass() {
        let error = ConnectError::Unreachable {
            address: "/run/p.sock".into(),
            source: std::io::ErrorKind::NotFound.into(),
        };
        let message = CliError::ProducerUnreachable {
            address: "/run/p.sock".into(),
            detail: unreachable_detail(Some(&error)),
        }
        .to_string();
        assert_eq!(
            message,
            "cannot connect to the tracing service's producer socket at /run/p.sock: entity \
             not found\nIs the service running (`shmtrace serve`, or Perfetto's `traced`)? \
             Pass --socket, or set PERFETTO_PRODUCER_SOCK_NAME."
        );
        assert_eq!(unreachable_detail(None), "no connection");
    }
}
