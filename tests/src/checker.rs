//! Runs the shared trace checker (`tests/checker/check_trace.py`, which
//! decodes with the official Perfetto protos) and exposes its report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::{HarnessError, Result};

/// Counts of what a producer emitted, by the producer driver's vocabulary;
/// the checker counts the same keys in the trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventCounts {
    /// TYPE_SLICE_BEGIN events.
    pub slice_begin: u64,
    /// TYPE_SLICE_END events.
    pub slice_end: u64,
    /// TYPE_INSTANT events (the large ones included).
    pub instant: u64,
    /// Counter events with an int64 value.
    pub counter_int: u64,
    /// Counter events with a double value.
    pub counter_double: u64,
    /// Flow ids started.
    pub flow_begin: u64,
    /// Flow ids terminated.
    pub flow_end: u64,
    /// "large" instants (huge debug annotation).
    pub large: u64,
    /// Total bytes of the huge annotations.
    pub large_bytes: u64,
    /// int64 debug annotations.
    pub arg_int: u64,
    /// uint64 debug annotations.
    pub arg_uint: u64,
    /// double debug annotations.
    pub arg_double: u64,
    /// bool debug annotations.
    pub arg_bool: u64,
    /// string debug annotations.
    pub arg_string: u64,
    /// pointer debug annotations.
    pub arg_pointer: u64,
    /// Producer only: iterations skipped because the session was not enabled.
    pub skipped_disabled: u64,
}

impl std::ops::AddAssign for EventCounts {
    fn add_assign(&mut self, c: EventCounts) {
        self.slice_begin += c.slice_begin;
        self.slice_end += c.slice_end;
        self.instant += c.instant;
        self.counter_int += c.counter_int;
        self.counter_double += c.counter_double;
        self.flow_begin += c.flow_begin;
        self.flow_end += c.flow_end;
        self.large += c.large;
        self.large_bytes += c.large_bytes;
        self.arg_int += c.arg_int;
        self.arg_uint += c.arg_uint;
        self.arg_double += c.arg_double;
        self.arg_bool += c.arg_bool;
        self.arg_string += c.arg_string;
        self.arg_pointer += c.arg_pointer;
        self.skipped_disabled += c.skipped_disabled;
    }
}

impl EventCounts {
    /// Total track events (every type).
    pub fn track_events(&self) -> u64 {
        self.slice_begin + self.slice_end + self.instant + self.counter_int + self.counter_double
    }
}

/// What the producers emitted, for one producer process.
#[derive(Debug, Clone, Serialize)]
pub struct ProducerExpectation {
    /// The producer's pid (`trusted_pid` in the trace); `None` = all producers.
    pub pid: Option<u32>,
    /// What it emitted.
    pub emitted: EventCounts,
}

/// Whether a scenario may lose data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Loss {
    /// Every emitted event must be in the trace; no loss indicator may appear.
    None,
    /// Events may be missing, but only if the trace records a loss.
    Allowed,
}

/// The checker's input.
#[derive(Debug, Clone, Serialize)]
pub struct Expectation {
    /// One entry per producer process.
    pub producers: Vec<ProducerExpectation>,
    /// Loss policy.
    pub loss: Loss,
    /// Whether a `trace_stats` packet must be present.
    pub require_trace_stats: bool,
    /// Whether the service's trace_config and clock_snapshot must be present.
    pub require_service_packets: bool,
    /// The producers connected over TCP or vsock, where the service knows
    /// no pid: their packets must carry no `trusted_pid` (instead of must
    /// carry one), and `pid` must be `None` in `producers`.
    pub remote_producers: bool,
}

/// Replay summary of one packet sequence.
#[derive(Debug, Clone, Deserialize)]
pub struct SequenceSummary {
    /// trusted_packet_sequence_id.
    pub id: u32,
    /// trusted_pid values seen.
    pub pids: Vec<u32>,
    /// Packets on the sequence.
    pub packets: u64,
    /// Track events on the sequence.
    pub track_events: u64,
    /// Packets with SEQ_INCREMENTAL_STATE_CLEARED.
    pub cleared: u64,
    /// previous_packet_dropped marks after the first packet.
    pub loss_marks: u64,
    /// The sequence's first packet is missing from the trace.
    pub start_lost: bool,
    /// Packets skipped because they needed lost incremental state.
    pub skipped_incremental: u64,
}

/// The checker's report (see `check_trace.py`).
#[derive(Debug, Clone, Deserialize)]
pub struct TraceReport {
    /// True when no check failed.
    pub ok: bool,
    /// Every failed check, human-readable.
    pub violations: Vec<String>,
    /// Packets in the trace.
    #[serde(default)]
    pub packets: u64,
    /// Counts over all producers.
    #[serde(default)]
    pub totals: EventCounts,
    /// Counts per producer pid.
    #[serde(default)]
    pub producers: BTreeMap<String, EventCounts>,
    /// Producer sequences.
    #[serde(default)]
    pub sequences: Vec<SequenceSummary>,
    /// Non-END, non-COUNTER track events by resolved name.
    #[serde(default)]
    pub events_by_name: BTreeMap<String, u64>,
    /// Track events by resolved category.
    #[serde(default)]
    pub events_by_category: BTreeMap<String, u64>,
    /// Non-zero loss indicators by name.
    #[serde(default)]
    pub loss_indicators: BTreeMap<String, u64>,
    /// `TraceStats.buffer_stats`, one map of set scalar fields per buffer.
    #[serde(default)]
    pub buffer_stats: Vec<BTreeMap<String, serde_json::Value>>,
    /// Scalar fields of `TraceStats` (the last `trace_stats` packet).
    #[serde(default)]
    pub trace_stats: Option<BTreeMap<String, serde_json::Value>>,
    /// Scalar fields of its `filter_stats`, if the session had a trace
    /// filter.
    #[serde(default)]
    pub filter_stats: Option<BTreeMap<String, serde_json::Value>>,
    /// The service's packets (trusted sequence 1), by kind (`trace_stats`,
    /// `service_event`...).
    #[serde(default)]
    pub service_packets_by_kind: BTreeMap<String, u64>,
    /// `TracingServiceEvent`s by the field set (`tracing_started`,
    /// `read_tracing_buffers_completed`...).
    #[serde(default)]
    pub service_events: BTreeMap<String, u64>,
    /// Import errors Perfetto's trace processor would record that depend
    /// on what the service wrote (each is also a violation).
    #[serde(default)]
    pub import_errors: Vec<String>,
    /// Packets whose absolute timestamp is earlier than the latest one of
    /// their sequence (legal: a trace processor sorts), all sequences.
    #[serde(default)]
    pub out_of_order: u64,
    /// Per machine id ("0": the service's machine), its producer packets
    /// and track event counts.
    #[serde(default)]
    pub machines: BTreeMap<String, MachineSummary>,
    /// Relayed machines with a `system_info` packet of their own.
    #[serde(default)]
    pub machines_described: Vec<u32>,
    /// Per relayed machine id, the clock exchanges its `remote_clock_sync`
    /// packet holds.
    #[serde(default)]
    pub remote_clock_syncs: BTreeMap<String, u64>,
    /// Per relayed machine id, its clock offsets as a trace processor
    /// computes them from its `remote_clock_sync` exchanges.
    #[serde(default)]
    pub remote_clock_offsets: BTreeMap<String, RemoteClockOffsets>,
    /// Per producer pid, the times of its first and last track events, on
    /// its machine's trace clock.
    #[serde(default)]
    pub event_times: BTreeMap<String, EventTimes>,
    /// Per service event (`tracing_started`, `tracing_disabled`...), its
    /// packets' timestamps, on the service's trace clock.
    #[serde(default)]
    pub service_event_times: BTreeMap<String, Vec<u64>>,
}

/// A relayed machine's clock offsets, computed as Perfetto's trace
/// processor does (`remote_clock_offsets` in `check_trace.py`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RemoteClockOffsets {
    /// Per clock id, the machine's clock less the central machine's, ns.
    pub offsets: BTreeMap<String, i64>,
    /// Rounds of exchanges (a PING and its UPDATE) they come from.
    pub rounds: u64,
    /// The longest round, ns: the true offset of clocks that differ by a
    /// constant lies within half of it of the computed one.
    pub max_span: u64,
}

/// When a producer's track events happened, on its machine's trace clock.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct EventTimes {
    /// Its machine's id (0: the service's).
    pub machine: u32,
    /// The earliest event, ns.
    pub first: i64,
    /// The latest event, ns.
    pub last: i64,
}

/// What the trace holds of one machine's producers.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MachineSummary {
    /// Producer packets with this machine id.
    pub packets: u64,
    /// Their event counts.
    pub totals: EventCounts,
}

impl TraceReport {
    /// A `TraceStats.BufferStats` field summed over buffers (0 when unset).
    pub fn buffer_stat(&self, field: &str) -> u64 {
        self.buffer_stats
            .iter()
            .filter_map(|b| b.get(field)?.as_u64())
            .sum()
    }

    /// Sequences that carry track events.
    pub fn track_event_sequences(&self) -> impl Iterator<Item = &SequenceSummary> {
        self.sequences.iter().filter(|s| s.track_events > 0)
    }

    /// Fails with every violation when the checker did not pass.
    pub fn assert_ok(&self, context: &str) {
        assert!(
            self.ok,
            "{context}: the trace checker found violations:\n  {}",
            self.violations.join("\n  ")
        );
    }
}

fn python() -> PathBuf {
    std::env::var_os("SHMTRACE_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

fn checker_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("checker")
        .join("check_trace.py")
}

/// Verifies once per process that python3 and the official protos import.
pub fn ensure_environment() -> Result<()> {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let outcome = CHECKED.get_or_init(|| {
        let output = Command::new(python())
            .args([
                "-c",
                "import google.protobuf, perfetto.protos.perfetto.trace.perfetto_trace_pb2",
            ])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", python().display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or("import failed")
                .to_string())
        }
    });
    outcome
        .clone()
        .map_err(|detail| HarnessError::CheckerEnvironment { detail })
}

/// Checks `traces` (concatenated in order) against `expect`. `work_dir`
/// receives the expectation and report files, named after `label`.
pub fn check(
    traces: &[PathBuf],
    expect: &Expectation,
    work_dir: &Path,
    label: &str,
) -> Result<TraceReport> {
    let json = serde_json::to_value(expect).map_err(|e| HarnessError::Checker(e.to_string()))?;
    run_checker(traces, &json, work_dir, label)
}

/// Like [`check`], where `counted_lost[i]` track events of what producer
/// `i` of `expect` emitted are lost by its own count (dropped, or left out
/// for a dropped one's sake): the trace must hold exactly the emitted track
/// events less these, and a shortfall they account for needs no loss
/// indicator in the trace (a thread that never got a chunk has no sequence
/// to carry a loss mark). See `counted_lost` in `check_trace.py`.
pub fn check_with_counted_loss(
    traces: &[PathBuf],
    expect: &Expectation,
    counted_lost: &[u64],
    work_dir: &Path,
    label: &str,
) -> Result<TraceReport> {
    if counted_lost.len() != expect.producers.len() {
        return Err(HarnessError::Checker(format!(
            "{} counted losses for {} producers",
            counted_lost.len(),
            expect.producers.len()
        )));
    }
    let mut json =
        serde_json::to_value(expect).map_err(|e| HarnessError::Checker(e.to_string()))?;
    for (producer, &lost) in json["producers"]
        .as_array_mut()
        .into_iter()
        .flatten()
        .zip(counted_lost)
    {
        producer["counted_lost"] = lost.into();
    }
    run_checker(traces, &json, work_dir, label)
}

/// Runs `check_trace.py` on `traces` with the expectation `expect` (its
/// JSON form).
fn run_checker(
    traces: &[PathBuf],
    expect: &serde_json::Value,
    work_dir: &Path,
    label: &str,
) -> Result<TraceReport> {
    ensure_environment()?;
    let expect_path = work_dir.join(format!("{label}.expect.json"));
    let report_path = work_dir.join(format!("{label}.report.json"));
    let json =
        serde_json::to_vec_pretty(expect).map_err(|e| HarnessError::Checker(e.to_string()))?;
    std::fs::write(&expect_path, json).map_err(|source| HarnessError::Io {
        action: "write",
        path: expect_path.clone(),
        source,
    })?;
    let mut command = Command::new(python());
    command.arg(checker_script());
    for trace in traces {
        command.arg("--trace").arg(trace);
    }
    command
        .arg("--expect")
        .arg(&expect_path)
        .arg("--report")
        .arg(&report_path)
        .arg("--quiet");
    let output = command
        .output()
        .map_err(|e| HarnessError::Checker(format!("cannot run {}: {e}", python().display())))?;
    match output.status.code() {
        Some(0 | 1) => {}
        _ => {
            return Err(HarnessError::Checker(format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }
    let report = std::fs::read(&report_path).map_err(|source| HarnessError::Io {
        action: "read",
        path: report_path.clone(),
        source,
    })?;
    serde_json::from_slice(&report)
        .map_err(|e| HarnessError::Checker(format!("{}: {e}", report_path.display())))
}

/// What `checker/semantic_dump.py --compare` finds between two traces:
/// `None` if they say the same (events, names, categories, tracks,
/// annotations, flows, counters; see the script for what it normalizes),
/// else the diff of their dumps.
pub fn semantic_diff(a: &Path, b: &Path) -> Result<Option<String>> {
    ensure_environment()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("checker")
        .join("semantic_dump.py");
    let output = Command::new(python())
        .arg(&script)
        .arg("--compare")
        .arg(a)
        .arg(b)
        .output()
        .map_err(|e| HarnessError::Checker(format!("cannot run {}: {e}", python().display())))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    match output.status.code() {
        Some(0) => Ok(None),
        Some(1) => Ok(Some(stdout)),
        _ => Err(HarnessError::Checker(format!(
            "{} failed ({}): {}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))),
    }
}

/// What `checker/semantic_dump.py` reads in the trace at `path`: per
/// sequence, its events with resolved names, categories, tracks,
/// annotations and flows (see the script for the format).
pub fn semantic_dump(path: &Path) -> Result<serde_json::Value> {
    ensure_environment()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("checker")
        .join("semantic_dump.py");
    let output = Command::new(python())
        .arg(&script)
        .arg("--json")
        .arg(path)
        .output()
        .map_err(|e| HarnessError::Checker(format!("cannot run {}: {e}", python().display())))?;
    if !output.status.success() {
        return Err(HarnessError::Checker(format!(
            "{} failed ({}): {}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|e| HarnessError::Checker(format!("{}: {e}", script.display())))
}

/// Runs the Python unit tests of module `module` (in `checker/`, e.g.
/// `test_check_trace`); `Err` carries their report if any fails. They get
/// the shmtrace binary as `$SHMTRACE_BIN` when it is built (tests that
/// compare the checker with `shmtrace inspect` need it).
pub fn python_unit_tests(module: &str) -> Result<()> {
    ensure_environment()?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("checker");
    let mut command = Command::new(python());
    if let Ok(shmtrace) = crate::scenario::shmtrace_binary() {
        command.env("SHMTRACE_BIN", shmtrace);
    }
    let output = command
        .args(["-m", "unittest", "-q", module])
        .current_dir(dir)
        .output()
        .map_err(|e| HarnessError::Checker(format!("cannot run {}: {e}", python().display())))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Checker(format!(
            "{module} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}
