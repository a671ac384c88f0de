//! The interop matrix: every scenario in every cell.
//!
//! A cell says who plays the service, the producers and the consumer (the
//! real Perfetto v59 or ours, see [`Cell`]); a scenario says what they do.
//! Each scenario below is one function of the cell, with every assertion the
//! scenario is about (counts, buffer stats, what the CLI reports); the
//! [`matrix!`] macro turns it into one `#[test]` per cell, named
//! `<scenario>::<cell>` (`cargo test -p shmtrace-tests ::our_service_and_cli`
//! runs one cell, `cargo test -p shmtrace-tests ring_buffer_wrap::` one
//! scenario).
//!
//! | cell (test name)               | producer | service | consumer          |
//! |--------------------------------|----------|---------|-------------------|
//! | `real`                         | real     | real    | real              |
//! | `our_producer`             (b) | ours     | real    | real              |
//! | `real_with_our_cli`        (c) | real     | real    | `shmtrace record` |
//! | `our_service`              (a) | real     | ours    | real              |
//! | `our_producer_and_service` (e) | ours     | ours    | real              |
//! | `our_service_and_cli`      (f) | real     | ours    | `shmtrace record` |
//! | `ours`                     (d) | ours     | ours    | `shmtrace record` |
//!
//! The real cell establishes what the real thing does; the others must pass
//! the same checks. Every run's trace also passes `shmtrace inspect --check`
//! (see `scenario::run`), and the cells with `shmtrace record` hold its
//! summary against the checker's report.

use std::time::{Duration, Instant};

use serde_json::Value;
use shmtrace_tests::checker::{Loss, TraceReport};
use shmtrace_tests::config::{FillPolicy, ProducerConfig};
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{
    self, BetweenPhases, Cell, ConsumerImpl, Outcome, ProducerImpl, ProducerSpec, Scenario,
    ServiceImpl, Stop,
};

/// One `#[test]` per cell for each scenario function `fn(Cell)`.
macro_rules! matrix {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            cell_tests!($scenario:
                real => REAL,
                our_producer => OUR_PRODUCER,
                real_with_our_cli => REAL_WITH_OUR_CLI,
                our_service => OUR_SERVICE,
                our_producer_and_service => OUR_PRODUCER_AND_SERVICE,
                our_service_and_cli => OUR_SERVICE_AND_CLI,
                ours => OURS,
            );
        }
    )*};
}

/// `#[test] fn <test>() { <scenario>(Cell::<CELL>) }` for each pair.
macro_rules! cell_tests {
    ($scenario:ident: $($test:ident => $cell:ident),* $(,)?) => {$(
        #[test]
        fn $test() {
            super::$scenario(shmtrace_tests::scenario::Cell::$cell);
        }
    )*};
}

matrix!(
    small_packets,
    packets_spanning_many_chunks,
    ring_buffer_wrap,
    discard_when_full,
    two_producers_two_threads_each,
    flush_mid_session,
    incremental_state_clear,
    write_into_file,
    many_threads_tiny_smb,
    producer_config_sizes_the_smb,
    deflate_read,
    deflate_write_into_file,
    trace_filter,
    trace_filter_redacts_event_names,
);

/// Scenarios only our producer plays (the real producer driver has no
/// custom data source): one `#[test]` per cell with our producer.
macro_rules! our_producer_cells {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            cell_tests!($scenario:
                our_producer => OUR_PRODUCER,
                our_producer_and_service => OUR_PRODUCER_AND_SERVICE,
                ours => OURS,
            );
        }
    )*};
}

our_producer_cells!(two_sessions_with_a_custom_data_source);

/// Plays `scenario` in `cell`; the checker must pass. In the cells with
/// `shmtrace record`, also returns its summary, after checking that it
/// agrees with the checker (official schema) on what the trace holds.
fn run(cell: Cell, scenario: &Scenario) -> (Outcome, Option<Value>) {
    let outcome = scenario::run(cell, &real_binaries!(), scenario)
        .unwrap_or_else(|e| panic!("{} in cell {}: {e}", scenario.name, cell.name()));
    outcome
        .report
        .assert_ok(&format!("{} in cell {}", scenario.name, cell.name()));
    let summary = (cell.consumer == ConsumerImpl::OurCli).then(|| assert_summary_matches(&outcome));
    (outcome, summary)
}

/// `shmtrace record`'s summary agrees with the checker.
fn assert_summary_matches(outcome: &Outcome) -> Value {
    let summary = outcome
        .cli_summary
        .clone()
        .expect("shmtrace record's summary");
    let report = &outcome.report;
    assert_eq!(summary["packets"], report.packets, "{summary}");
    assert_eq!(
        summary["track_events"],
        report.totals.track_events(),
        "{summary}"
    );
    // Every producer sequence, also those whose events all depended on
    // lost interned data (the checker counts no track event on them).
    assert_eq!(summary["sequences"], report.sequences.len(), "{summary}");
    assert_eq!(summary["file_bytes"], outcome.trace_bytes);
    let ds = &summary["data_sources"][0];
    assert_eq!(ds["name"], "track_event");
    assert!(
        ds["status"].as_str().unwrap().starts_with("recorded from "),
        "{summary}"
    );
    assert_eq!(summary["problems"], 0);
    assert_eq!(
        outcome.inspect.analysis["track_events"]["total"],
        report.totals.track_events()
    );
    summary
}

/// Every sequence that carries track events belongs to one of the producers
/// and started cleanly (first packet present, incremental state cleared).
fn assert_clean_sequences(outcome: &Outcome, expected_sequences: usize) {
    assert_clean_sequences_with_marks(outcome, expected_sequences, 0);
}

/// The same, with up to `marks` loss marks per sequence.
fn assert_clean_sequences_with_marks(outcome: &Outcome, expected_sequences: usize, marks: u64) {
    let sequences: Vec<_> = outcome.report.track_event_sequences().collect();
    assert_eq!(sequences.len(), expected_sequences, "{sequences:#?}");
    for seq in sequences {
        assert!(!seq.start_lost, "sequence {} lost its start", seq.id);
        assert!(
            seq.loss_marks <= marks,
            "sequence {} has {} loss marks",
            seq.id,
            seq.loss_marks
        );
        assert!(
            seq.cleared >= 1,
            "sequence {} never cleared its incremental state",
            seq.id
        );
        assert_eq!(seq.pids.len(), 1);
        assert!(
            outcome.producers.iter().any(|p| p.pid == seq.pids[0]),
            "sequence {} from unknown pid",
            seq.id
        );
    }
}

/// `TraceStats.buffer_stats.<field>` (summed over buffers) is at least
/// `min`.
fn assert_stat_at_least(report: &TraceReport, field: &str, min: u64) {
    let value = report.buffer_stat(field);
    assert!(
        value >= min,
        "{field} = {value}, expected at least {min}: {:?}",
        report.buffer_stats
    );
}

/// A scalar field of the trace's `TraceStats` (0 when unset).
fn service_stat(outcome: &Outcome, field: &str) -> u64 {
    let stats = outcome.report.trace_stats.as_ref().expect("trace_stats");
    stats.get(field).and_then(Value::as_u64).unwrap_or(0)
}

fn assert_service_stat(outcome: &Outcome, field: &str, expected: u64) {
    assert_eq!(
        service_stat(outcome, field),
        expected,
        "TraceStats.{field}: {:?}",
        outcome.report.trace_stats
    );
}

/// The CLI's summary lists a loss with this statistic.
fn assert_summary_loss(summary: &Value, stat: &str) {
    let losses = summary["losses"].to_string();
    assert!(losses.contains(stat), "{stat} not in {losses}");
}

fn small_packets(cell: Cell) {
    let scenario = Scenario::new(
        "small",
        vec![ProducerSpec {
            threads: 2,
            iterations: 200,
            ..Default::default()
        }],
    );
    let (outcome, summary) = run(cell, &scenario);
    let emitted = outcome.emitted();
    assert_eq!(emitted.slice_begin, 800);
    assert_eq!(emitted.skipped_disabled, 0);
    assert_eq!(outcome.report.totals.track_events(), emitted.track_events());
    assert_clean_sequences(&outcome, 2);
    // Interned names and categories resolve to the right strings, for the
    // checker and for `shmtrace inspect`.
    let by_name = &outcome.report.events_by_name;
    let inspected = &outcome.inspect.analysis["track_events"]["by_name"];
    for name in ["outer", "inner", "tick", "flow_out", "flow_in"] {
        assert_eq!(by_name.get(name), Some(&400), "{name}: {by_name:?}");
        assert_eq!(inspected[name], 400, "{name}: {inspected}");
    }
    let by_category = &outcome.report.events_by_category;
    assert_eq!(
        by_category.get("interop"),
        Some(&(3 * 400)),
        "{by_category:?}"
    );
    assert_eq!(
        by_category.get("interop.flow"),
        Some(&(2 * 400)),
        "{by_category:?}"
    );
    assert_eq!(outcome.report.buffer_stat("chunks_overwritten"), 0);
    assert!(outcome.report.buffer_stat("chunks_read") > 0);
    // The service's own counters: one session, one buffer, one producer,
    // and the stop's flush (both consumers flush before stopping) acked.
    assert_service_stat(&outcome, "tracing_sessions", 1);
    assert_service_stat(&outcome, "total_buffers", 1);
    assert_service_stat(&outcome, "producers_seen", 1);
    assert_service_stat(&outcome, "data_sources_seen", 1);
    assert_service_stat(&outcome, "flushes_failed", 0);
    assert!(service_stat(&outcome, "flushes_succeeded") >= 1);
    // Every producer sequence is attributed to the session's one buffer
    // (TraceStats.writer_stats / trace_provenance, as `inspect` reads them).
    for seq in outcome.inspect.analysis["sequences"].as_array().unwrap() {
        assert_eq!(seq["buffer"], 0, "{seq}");
    }
    if let Some(summary) = summary {
        // Stopped with Ctrl-C: flushed, nothing lost.
        assert_eq!(summary["ended"], "stopped on request (flushed)");
        assert_eq!(summary["losses"].as_array().unwrap().len(), 0, "{summary}");
    }
}

fn packets_spanning_many_chunks(cell: Cell) {
    const LARGE_KB: u32 = 300;
    let scenario = Scenario {
        buffer_kb: 16 * 1024,
        ..Scenario::new(
            "large",
            vec![ProducerSpec {
                threads: 2,
                iterations: 12,
                large_kb: LARGE_KB,
                large_every: 4,
                // A packet cannot be larger than the shared memory buffer
                // (256 KiB by default): the SDK drops it.
                shmem_kb: 4096,
                ..Default::default()
            }],
        )
    };
    let (outcome, _) = run(cell, &scenario);
    let report = &outcome.report;
    // 3 huge instants per thread, each a single ~300 KiB packet spread over
    // dozens of chunks whose nested size fields were patched afterwards.
    assert_eq!(report.totals.large, 6);
    assert_eq!(report.totals.large_bytes, 6 * u64::from(LARGE_KB) * 1024);
    // Our producer sends a patch for every chunk committed before its
    // packet ended; the real SDK patches a chunk still waiting in its
    // pending CommitData itself (direct SMB patching), so its count
    // depends on when its IPC thread sent the first chunks. The exact
    // large bytes above check every size field either way.
    if cell.producer == ProducerImpl::Ours {
        assert_stat_at_least(report, "patches_succeeded", 1);
    }
    assert_stat_at_least(report, "readaheads_succeeded", 6);
    assert_eq!(report.buffer_stat("patches_failed"), 0);
    assert!(outcome.trace_bytes > 6 * u64::from(LARGE_KB) * 1024);
    assert_clean_sequences(&outcome, 2);
}

fn ring_buffer_wrap(cell: Cell) {
    let scenario = Scenario {
        buffer_kb: 256,
        fill_policy: FillPolicy::RingBuffer,
        stop: Stop::ByDuration { duration_ms: 3000 },
        clear_period_ms: Some(100),
        loss: Loss::Allowed,
        ..Scenario::new(
            "ring",
            vec![ProducerSpec {
                threads: 2,
                iterations: 4000,
                iteration_sleep_us: 150,
                ..Default::default()
            }],
        )
    };
    let (outcome, summary) = run(cell, &scenario);
    let report = &outcome.report;
    assert_stat_at_least(report, "write_wrap_count", 1);
    assert_stat_at_least(report, "chunks_overwritten", 1);
    // The oldest data is gone, the newest is there and decodes (the periodic
    // incremental-state clears make the surviving tail self-contained).
    let emitted = outcome.emitted();
    assert!(report.totals.slice_begin > 0);
    assert!(
        report.totals.slice_begin < emitted.slice_begin,
        "{} of {}",
        report.totals.slice_begin,
        emitted.slice_begin
    );
    assert!(
        report.track_event_sequences().all(|s| s.start_lost),
        "{:#?}",
        report.sequences
    );
    if let Some(summary) = summary {
        assert!(
            summary["ended"]
                .as_str()
                .unwrap()
                .starts_with("ended by the service after the configured 3.0 s"),
            "{summary}"
        );
        assert_summary_loss(&summary, "chunks_overwritten");
        assert_summary_loss(&summary, "the ring buffer wrapped");
    }
}

fn discard_when_full(cell: Cell) {
    let scenario = Scenario {
        buffer_kb: 128,
        fill_policy: FillPolicy::Discard,
        loss: Loss::Allowed,
        ..Scenario::new(
            "discard",
            vec![ProducerSpec {
                threads: 2,
                iterations: 3000,
                ..Default::default()
            }],
        )
    };
    let (outcome, summary) = run(cell, &scenario);
    let report = &outcome.report;
    assert_stat_at_least(report, "chunks_discarded", 1);
    assert_eq!(report.buffer_stat("chunks_overwritten"), 0);
    // What was kept is a clean prefix of each sequence (a thread that was
    // descheduled while the other filled the buffer may have none at all).
    let emitted = outcome.emitted();
    assert!(report.totals.slice_begin > 0);
    assert!(report.totals.slice_begin < emitted.slice_begin);
    let kept = report.track_event_sequences().count();
    assert!((1..=2).contains(&kept), "{:#?}", report.sequences);
    // Our service marks the packet the full buffer cut on a sequence whose
    // writer was gone by the read (unregistered, or its producer
    // disconnected): one trailing mark, after the prefix. The real service
    // leaves it unmarked (its buffer statistics count the refusals).
    let trailing = u64::from(cell.service == ServiceImpl::Ours);
    assert_clean_sequences_with_marks(&outcome, kept, trailing);
    if let Some(summary) = summary {
        assert_summary_loss(&summary, "chunks_discarded");
    }
}

fn two_producers_two_threads_each(cell: Cell) {
    let spec = ProducerSpec {
        threads: 2,
        iterations: 300,
        ..Default::default()
    };
    let (outcome, summary) = run(cell, &Scenario::new("two-producers", vec![spec, spec]));
    assert_clean_sequences(&outcome, 4);
    assert_ne!(outcome.producers[0].pid, outcome.producers[1].pid);
    // The checker matched counts per producer pid; both pids are present.
    for producer in &outcome.producers {
        let counts = outcome
            .report
            .producers
            .get(&producer.pid.to_string())
            .expect("producer in trace");
        assert_eq!(counts.slice_begin, producer.emitted().slice_begin);
    }
    assert_service_stat(&outcome, "producers_seen", 2);
    assert_service_stat(&outcome, "data_sources_seen", 2);
    if let Some(summary) = summary {
        assert_eq!(
            summary["producer_pids"].as_array().unwrap().len(),
            2,
            "{summary}"
        );
        assert_eq!(summary["sequences"], 4);
    }
}

fn flush_mid_session(cell: Cell) {
    let scenario = Scenario {
        between_phases: BetweenPhases::FlushAndRead,
        ..Scenario::new(
            "flush",
            vec![ProducerSpec {
                threads: 2,
                iterations: 150,
                phases: 2,
                ..Default::default()
            }],
        )
    };
    if !cell.reads_mid_session() {
        // `shmtrace record` reads once, when the session ends: it has no
        // command to flush and read while the session runs, so this
        // scenario cannot be played with it. The harness says so instead
        // of running something else under this name.
        let err = scenario::run(cell, &real_binaries!(), &scenario)
            .expect_err("a consumer without mid-session reads");
        assert!(err.to_string().contains("no mid-session reads"), "{err}");
        return;
    }
    let (outcome, _) = run(cell, &scenario);
    let [mid] = outcome.mid_reads.as_slice() else {
        panic!("one mid-session read expected")
    };
    assert!(mid.flush_ok, "the mid-session flush failed");
    let phase1 = outcome.producers[0].phases[0];
    // The real SDK producer leaves the chunks its threads are in the middle
    // of to the service's scrape at the end of the flush (its track_event
    // has no_flush). Under load a read right after the flush has been seen
    // to miss one such chunk, with the real service (CI, 1 run in 6: 12 of
    // 300 iterations of one thread) and with ours (1 run in 10 at load 10:
    // the same 12, one chunk written but not yet readable); the final read
    // holds it (`run` checked it). That is the real SDK's behaviour with
    // either service, reported here, not required; every cell with our
    // producer must have everything at the mid-session read.
    let real_sdk = cell.producer == ProducerImpl::Real;
    let mid_events = mid.report.totals.track_events();
    if real_sdk && mid_events < phase1.track_events() {
        eprintln!(
            "cell {}: the mid-session read has {mid_events} of the {} track events emitted \
             before the flush (the rest came in the final read)",
            cell.name(),
            phase1.track_events()
        );
        return;
    }
    // Everything emitted before the flush is readable right after it, while
    // the writer threads are still alive in the middle of their chunks.
    mid.report
        .assert_ok("flush mid-session, read after the flush");
    assert_eq!(mid.report.totals.slice_begin, phase1.slice_begin);
    assert_eq!(mid.report.totals.track_events(), phase1.track_events());
    assert!(outcome.report.totals.slice_begin > phase1.slice_begin);
}

fn incremental_state_clear(cell: Cell) {
    let scenario = Scenario {
        clear_period_ms: Some(100),
        ..Scenario::new(
            "clear",
            vec![ProducerSpec {
                threads: 2,
                iterations: 300,
                iteration_sleep_us: 3000,
                ..Default::default()
            }],
        )
    };
    let (outcome, _) = run(cell, &scenario);
    // Emission spans ~1 s: each writer saw several clears, re-emitted its
    // interned data each time, and every name still resolves.
    for seq in outcome.report.track_event_sequences() {
        assert!(
            seq.cleared >= 3,
            "sequence {} cleared only {} times",
            seq.id,
            seq.cleared
        );
    }
    for seq in outcome.inspect.analysis["sequences"].as_array().unwrap() {
        if seq["track_events"].as_u64().unwrap_or(0) > 0 {
            assert!(seq["cleared"].as_u64().unwrap() >= 3, "{seq}");
        }
    }
    assert_clean_sequences(&outcome, 2);
}

fn write_into_file(cell: Cell) {
    let scenario = Scenario {
        write_into_file_period_ms: Some(100),
        // The service drains every 100 ms, but on a loaded machine a
        // fixed wait after a phase can end before it did: wait until it
        // has.
        between_phases: BetweenPhases::SampleFileSize {
            grow_within: Duration::from_secs(30),
        },
        ..Scenario::new(
            "file",
            vec![ProducerSpec {
                threads: 2,
                iterations: 300,
                phases: 3,
                // All three phases (~0.5 MB) fit in the shared memory
                // buffer: nothing is lost even if the service, starved of
                // CPU, frees no chunk before the last phase (with the
                // default 256 KiB, 260 iterations were dropped, and
                // marked, that way).
                shmem_kb: 2048,
                ..Default::default()
            }],
        )
    };
    let (outcome, _) = run(cell, &scenario);
    // The service wrote the file progressively while the session ran.
    let sizes = &outcome.file_sizes;
    assert_eq!(sizes.len(), 3);
    assert!(sizes[0] > 0, "nothing written during phase 1: {sizes:?}");
    assert!(
        sizes.windows(2).all(|w| w[0] < w[1]),
        "file did not grow between phases: {sizes:?}"
    );
    assert!(outcome.trace_bytes >= sizes[2]);
    assert_clean_sequences(&outcome, 2);
    // As upstream: every periodic write reads the buffers to their end and
    // closes with `read_tracing_buffers_completed`, not only the last one
    // (the file grew at least three times, and the stop writes once more,
    // but on a loaded machine the real service's trace had only three of
    // them once); the stats go out with the first write (due from the
    // start) and the last.
    let report = &outcome.report;
    let completed = report
        .service_events
        .get("read_tracing_buffers_completed")
        .copied()
        .unwrap_or(0);
    assert!(completed >= 2, "{:?}", report.service_events);
    let stats = report
        .service_packets_by_kind
        .get("trace_stats")
        .copied()
        .unwrap_or(0);
    assert!(stats >= 2, "{:?}", report.service_packets_by_kind);
    // What the trace processor would flag fails the checker already.
    assert_eq!(report.import_errors, Vec::<String>::new());
}

/// A deflating session (`compression_type: COMPRESSION_TYPE_DEFLATE`) read
/// with ReadBuffers: the checker (which inflates `compressed_packets` as a
/// trace processor does) and `inspect` find every event the producers
/// emitted, exactly as in an uncompressed trace.
fn deflate_read(cell: Cell) {
    let scenario = Scenario {
        deflate: true,
        ..Scenario::new(
            "deflate",
            vec![ProducerSpec {
                threads: 2,
                iterations: 1000,
                shmem_kb: 2048,
                ..Default::default()
            }],
        )
    };
    let (outcome, _) = run(cell, &scenario);
    let emitted = outcome.emitted();
    assert_eq!(emitted.slice_begin, 4000);
    assert_eq!(outcome.report.totals.track_events(), emitted.track_events());
    assert_eq!(
        outcome.inspect.analysis["track_events"]["total"],
        emitted.track_events()
    );
    assert_clean_sequences(&outcome, 2);
    assert_deflated(cell, &outcome, 2);
}

/// `deflate_read` in a `write_into_file` session: each periodic write is a
/// compressed batch.
fn deflate_write_into_file(cell: Cell) {
    let scenario = Scenario {
        deflate: true,
        write_into_file_period_ms: Some(100),
        between_phases: BetweenPhases::SampleFileSize {
            grow_within: Duration::from_secs(30),
        },
        ..Scenario::new(
            "deflate-file",
            vec![ProducerSpec {
                threads: 2,
                iterations: 300,
                phases: 3,
                shmem_kb: 2048,
                ..Default::default()
            }],
        )
    };
    let (outcome, _) = run(cell, &scenario);
    let emitted = outcome.emitted();
    assert_eq!(outcome.report.totals.track_events(), emitted.track_events());
    assert_clean_sequences(&outcome, 2);
    let sizes = &outcome.file_sizes;
    assert!(
        sizes[0] > 0 && sizes.windows(2).all(|w| w[0] < w[1]),
        "{sizes:?}"
    );
    assert_deflated(cell, &outcome, 3);
}

/// A session whose `trace_filter` keeps everything but the track events'
/// debug annotations (bytecode written as Perfetto's `proto_filter` writes
/// it): every event is there, no annotation is, and the stats say what the
/// filter did, under both services.
fn trace_filter(cell: Cell) {
    let scenario = Scenario {
        trace_filter: Some(shmtrace_tests::config::TraceFilter {
            bytecode: Some(filter_bytecode(NO_DEBUG_ANNOTATIONS)),
            string_filter_chain: None,
        }),
        ..Scenario::new(
            "trace-filter",
            vec![ProducerSpec {
                threads: 2,
                iterations: 500,
                ..Default::default()
            }],
        )
    };
    let outcome = scenario::run(cell, &real_binaries!(), &scenario)
        .unwrap_or_else(|e| panic!("trace_filter in cell {}: {e}", cell.name()));
    let report = &outcome.report;
    let emitted = outcome.emitted();
    // The events, without a single annotation.
    assert_eq!(report.totals.slice_begin, emitted.slice_begin);
    assert_eq!(report.totals.track_events(), emitted.track_events());
    assert!(emitted.arg_int > 0 && emitted.arg_string > 0);
    let args = &report.totals;
    assert_eq!(
        [
            args.arg_int,
            args.arg_uint,
            args.arg_double,
            args.arg_bool,
            args.arg_string,
            args.arg_pointer
        ],
        [0; 6]
    );
    let f = report.filter_stats.as_ref().expect("filter_stats");
    assert_eq!(f.get("errors").and_then(Value::as_u64), Some(0), "{f:?}");
    // Every packet but the stats went through the filter (the stats count
    // themselves after they were written).
    assert_eq!(
        f["input_packets"].as_u64(),
        Some(report.packets - 1),
        "{f:?}"
    );
    let (input, output) = (
        f["input_bytes"].as_u64().unwrap(),
        f["output_bytes"].as_u64().unwrap(),
    );
    assert!(output < input, "{f:?}");
}

/// A session whose filter marks event names — `TrackEvent.name` and the
/// interned `EventName.name` — as strings to filter, with one rule that
/// redacts every name whole: every event is there, each under a redacted
/// name (`P60REDACTED` cut to the name's length, or padded with `-`),
/// under both services.
fn trace_filter_redacts_event_names(cell: Cell) {
    use shmtrace_tests::config::{StringFilterChain, StringFilterRule, TraceFilter};
    let scenario = Scenario {
        trace_filter: Some(TraceFilter {
            bytecode: Some(filter_bytecode(REDACT_EVENT_NAMES)),
            string_filter_chain: Some(StringFilterChain {
                rules: vec![StringFilterRule {
                    policy: Some(1),
                    regex_pattern: Some("(.*)".into()),
                }],
            }),
        }),
        ..Scenario::new(
            "trace-filter-names",
            vec![ProducerSpec {
                threads: 2,
                iterations: 200,
                ..Default::default()
            }],
        )
    };
    let outcome = scenario::run(cell, &real_binaries!(), &scenario).unwrap_or_else(|e| {
        panic!(
            "trace_filter_redacts_event_names in cell {}: {e}",
            cell.name()
        )
    });
    let report = &outcome.report;
    assert_eq!(
        report.totals.track_events(),
        outcome.emitted().track_events()
    );
    let redacted = |name: &str| {
        let cut = name.len().min(11);
        name[..cut] == "P60REDACTED"[..cut] && name[cut..].bytes().all(|b| b == b'-')
    };
    assert!(!report.events_by_name.is_empty());
    for name in report.events_by_name.keys().filter(|n| !n.is_empty()) {
        assert!(redacted(name), "{name:?} in {:?}", report.events_by_name);
    }
    let f = report.filter_stats.as_ref().expect("filter_stats");
    assert_eq!(f.get("errors").and_then(Value::as_u64), Some(0), "{f:?}");
}

/// Every field id from 1 on.
const ALL_FIELDS: u32 = (1 << 29) - 1;

/// Filter bytecode words, one list per message (the end-of-message word
/// left out); each word `field << 3 | opcode`: 1 simple, 2 a range whose
/// length follows, 3 a message whose index follows, 4 a string to filter.
/// `Trace.packet` is message 1, which keeps every field, and `track_event`
/// (11) as message 2, which keeps every field but `debug_annotations` (4).
const NO_DEBUG_ANNOTATIONS: &[&[u32]] = &[
    &[1 << 3 | 3, 1],
    &[1 << 3 | 2, 10, 11 << 3 | 3, 2, 12 << 3 | 2, ALL_FIELDS - 12],
    &[1 << 3 | 2, 3, 5 << 3 | 2, ALL_FIELDS - 5],
];

/// Every field kept, but `TrackEvent.name` (23) a string to filter, and
/// `interned_data` (12, message 3) keeping `event_names` (2) as message 4,
/// whose `name` (2) is a string to filter.
const REDACT_EVENT_NAMES: &[&[u32]] = &[
    &[1 << 3 | 3, 1],
    &[
        1 << 3 | 2,
        10,
        11 << 3 | 3,
        2,
        12 << 3 | 3,
        3,
        13 << 3 | 2,
        ALL_FIELDS - 13,
    ],
    &[1 << 3 | 2, 22, 23 << 3 | 4, 24 << 3 | 2, ALL_FIELDS - 24],
    &[1 << 3 | 1, 2 << 3 | 3, 4, 3 << 3 | 2, ALL_FIELDS - 3],
    &[1 << 3 | 1, 2 << 3 | 4, 3 << 3 | 2, ALL_FIELDS - 3],
];

/// `messages` as bytecode: their words as varints, each message ended by
/// word 0, then the checksum, the low 32 bits of the FNV-1a 64 hash of the
/// words' little-endian bytes (src/protozero/filtering/filter_bytecode_parser.cc).
fn filter_bytecode(messages: &[&[u32]]) -> Vec<u8> {
    let words: Vec<u32> = messages
        .iter()
        .flat_map(|m| m.iter().copied().chain([0]))
        .collect();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in words.iter().flat_map(|w| w.to_le_bytes()) {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut out = Vec::new();
    for mut w in words.into_iter().chain([hash as u32]) {
        while w >= 0x80 {
            out.push(w as u8 | 0x80);
            w >>= 7;
        }
        out.push(w as u8);
    }
    out
}

/// Under our service, every packet of the trace came in one of at least
/// `min_batches` `compressed_packets` batches, which deflate shrank. The
/// real service of the drivers (the SDK amalgamation, built without zlib)
/// skips compression, as upstream does without a compressor
/// (`TracingServiceImpl::EnableTracing`,
/// src/tracing/service/tracing_service_impl.cc): its trace has no batch.
fn assert_deflated(cell: Cell, outcome: &Outcome, min_batches: u64) {
    let c = &outcome.inspect.analysis["compression"];
    if cell.service == ServiceImpl::Real {
        assert_eq!(c["batches"], 0, "{c}");
        return;
    }
    assert!(c["batches"].as_u64().unwrap() >= min_batches, "{c}");
    assert_eq!(c["zstd_batches"], 0, "{c}");
    assert_eq!(c["packets"], outcome.report.packets, "{c}");
    assert_eq!(
        outcome.inspect.analysis["packets"], outcome.report.packets,
        "{c}"
    );
    let (compressed, inflated) = (
        c["compressed_bytes"].as_u64().unwrap(),
        c["inflated_bytes"].as_u64().unwrap(),
    );
    assert!(compressed * 2 < inflated, "{c}");
}

/// 32 threads and a 64 KiB shared memory buffer (16 chunks): the writers
/// share chunks, idle ones give theirs back, nothing deadlocks, and every
/// loss is marked so the checker can account for it.
fn many_threads_tiny_smb(cell: Cell) {
    let scenario = Scenario {
        buffer_kb: 32 * 1024,
        loss: Loss::Allowed,
        ..Scenario::new(
            "tiny-smb",
            vec![ProducerSpec {
                threads: 32,
                iterations: 250,
                shmem_kb: 64,
                ..Default::default()
            }],
        )
    };
    let (outcome, _) = run(cell, &scenario);
    let emitted = outcome.emitted();
    assert_eq!(emitted.skipped_disabled, 0);
    assert!(outcome.report.totals.slice_begin > 0);
    assert!(outcome.report.totals.slice_begin <= emitted.slice_begin);
    assert!(outcome.report.track_event_sequences().count() >= 1);
}

/// `TraceConfig.producers` sizes the shared memory of the producer it
/// names: 32 KiB pages (the most the real service allows) in 1 MiB. What
/// shows it in the trace is the service's own account of the chunks it
/// read (`TraceStats.writer_stats`): with 20 KiB annotations spanning
/// chunks, chunks carry more than 16 KiB of payload, which 4 KiB pages
/// (the default) cannot hold. Both SDKs name their producer after the
/// process's `argv[0]`, which the harness sets.
fn producer_config_sizes_the_smb(cell: Cell) {
    const NAME: &str = "interop-sized-producer";
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-producer-config-")
        .tempdir_in("/tmp")
        .unwrap();
    let trace = dir.path().join("trace.pftrace");
    let scenario = Scenario {
        producer_configs: vec![ProducerConfig {
            producer_name: Some(NAME.into()),
            shm_size_kb: Some(1024),
            page_size_kb: Some(32),
        }],
        keep_trace: Some(trace.clone()),
        ..Scenario::new(
            "producer-config",
            vec![ProducerSpec {
                threads: 2,
                iterations: 30,
                large_kb: 20,
                large_every: 3,
                process_name: Some(NAME),
                ..Default::default()
            }],
        )
    };
    let (outcome, _) = run(cell, &scenario);
    assert_clean_sequences(&outcome, 2);
    let stats = trace_stats::read(&trace);
    let bounds = &stats.chunk_payload_histogram_def;
    // The last bound is 16 KiB; the bucket after it counts bigger chunks.
    assert_eq!(bounds.last(), Some(&16384), "{stats:?}");
    let over_16k: u64 = stats
        .writer_stats
        .iter()
        .filter_map(|w| w.chunk_payload_histogram_counts.get(bounds.len()))
        .sum();
    assert!(over_16k > 0, "no chunk over 16 KiB: {stats:?}");
}

/// The part of `TraceStats` that [`producer_config_sizes_the_smb`] reads.
mod trace_stats {
    use prost::Message;

    /// Reads the `TraceStats` packet of a trace file.
    pub fn read(path: &std::path::Path) -> TraceStats {
        let packets = shmtrace_tests::trace_file::packets::<Packet>(path).unwrap();
        let mut stats = packets.into_iter().filter_map(|p| p.trace_stats);
        let found = stats.next().expect("a trace_stats packet");
        assert!(stats.next().is_none(), "more than one trace_stats packet");
        found
    }

    /// `TracePacket`: only `trace_stats` (field 35).
    #[derive(Clone, PartialEq, Message)]
    pub struct Packet {
        #[prost(message, optional, tag = "35")]
        pub trace_stats: Option<TraceStats>,
    }

    /// `TraceStats`: the chunk-size histograms.
    #[derive(Clone, PartialEq, Message)]
    pub struct TraceStats {
        /// Upper bounds of the histogram's buckets but the last (field 17).
        #[prost(int64, repeated, tag = "17")]
        pub chunk_payload_histogram_def: Vec<i64>,
        /// One per sequence (field 18).
        #[prost(message, repeated, tag = "18")]
        pub writer_stats: Vec<WriterStats>,
    }

    /// `TraceStats.WriterStats`.
    #[derive(Clone, PartialEq, Message)]
    pub struct WriterStats {
        /// The sequence (field 1).
        #[prost(uint64, optional, tag = "1")]
        pub sequence_id: Option<u64>,
        /// Chunks read per payload-size bucket (field 2).
        #[prost(uint64, repeated, tag = "2")]
        pub chunk_payload_histogram_counts: Vec<u64>,
    }
}

/// Two consumers, each with its own session enabling track_event and the
/// custom data source of our producer (tagged with the session's label in
/// its `legacy_config`), trace concurrently: the producer runs two
/// instances of each data source, with their own writers and target
/// buffers, so each trace holds every track event once and exactly its
/// own session's custom packets, whole and in order.
fn two_sessions_with_a_custom_data_source(cell: Cell) {
    const THREADS: u32 = 2;
    const ITERATIONS: u32 = 150;
    let scenario = Scenario::new(
        "two-sessions",
        vec![ProducerSpec {
            threads: THREADS,
            iterations: ITERATIONS,
            sessions: 2,
            custom_source: true,
            ..Default::default()
        }],
    );
    let (outcome, _) = run(cell, &scenario);
    let emitted = outcome.emitted();
    assert_eq!(emitted.slice_begin, u64::from(2 * THREADS * ITERATIONS));
    let per_session = u64::from(THREADS * ITERATIONS);
    let producer = &outcome.producers[0];
    let labels = [scenario::session_label(0), scenario::session_label(1)];
    assert_eq!(
        producer.custom,
        labels.iter().map(|l| (l.clone(), per_session)).collect(),
        "the driver's custom packets per session"
    );
    assert_eq!(outcome.sessions.len(), 2);
    for (session, label) in outcome.sessions.iter().zip(&labels) {
        let context = format!("{label} in cell {}", cell.name());
        session.report.assert_ok(&context);
        // Every track event, in each session's own trace.
        assert_eq!(session.report.totals, emitted, "{context}");
        let track_event_sequences: Vec<u32> = session
            .report
            .track_event_sequences()
            .map(|s| s.id)
            .collect();
        assert_eq!(track_event_sequences.len(), THREADS as usize, "{context}");
        // Exactly this session's custom packets: one sequence per thread,
        // from the producer, each iteration once and in order.
        let custom = &session.test_events;
        assert_eq!(
            custom.by_label,
            [(label.clone(), per_session)].into_iter().collect(),
            "{context}"
        );
        assert_eq!(custom.sequences.len(), THREADS as usize, "{context}");
        // Each thread writes the custom source through writers of its own
        // (sequences of their own), not its track_event writers.
        for (id, sequence) in &custom.sequences {
            assert!(!track_event_sequences.contains(id), "{context}: {id}");
            assert_eq!(sequence.pids, [producer.pid], "{context}");
            assert_eq!(sequence.labels, std::slice::from_ref(label), "{context}");
            assert_eq!(sequence.threads.len(), 1, "{context}: {sequence:?}");
            assert_eq!(
                sequence.seq_values,
                (0..ITERATIONS).collect::<Vec<_>>(),
                "{context}"
            );
        }
        if let Some(summary) = &session.cli_summary {
            let names = summary["data_sources"].to_string();
            assert!(names.contains(scenario::CUSTOM_SOURCE), "{summary}");
            assert_eq!(summary["problems"], 0, "{summary}");
        }
    }
}

/// The checker's own unit tests (golden trace + hand-broken copies) run as
/// part of `cargo test` too.
#[test]
fn checker_unit_tests() {
    shmtrace_tests::checker::python_unit_tests("test_check_trace")
        .unwrap_or_else(|e| panic!("{e}"));
}

/// `shmtrace query` (QueryServiceState) against each service, with each
/// producer connected and then with a session running: what it prints is
/// what the service knows (decoded fields), not just "no error".
mod query {
    use shmtrace_tests::scenario::{ProducerImpl, ServiceImpl};

    #[test]
    fn real_service_real_producer() {
        super::query(ServiceImpl::Real, ProducerImpl::Real);
    }

    #[test]
    fn real_service_our_producer() {
        super::query(ServiceImpl::Real, ProducerImpl::Ours);
    }

    #[test]
    fn our_service_real_producer() {
        super::query(ServiceImpl::Ours, ProducerImpl::Real);
    }

    #[test]
    fn our_service_our_producer() {
        super::query(ServiceImpl::Ours, ProducerImpl::Ours);
    }
}

fn query(service: ServiceImpl, producer: ProducerImpl) {
    const TIMEOUT: Duration = Duration::from_secs(20);
    let bins = real_binaries!();
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-query-")
        .tempdir_in("/tmp")
        .unwrap();
    let producer_socket = dir.path().join("p.sock");
    let consumer_socket = dir.path().join("c.sock");
    let mut service_process = scenario::start_service(
        service,
        &bins,
        dir.path(),
        &producer_socket,
        &consumer_socket,
    )
    .unwrap();

    // Nobody connected yet.
    let state = scenario::query_json(&consumer_socket);
    let version = state["version"].as_str().unwrap_or_default();
    // Ours names the Perfetto version it implements, as readers parse it.
    let expected_version = match service {
        ServiceImpl::Real => "Perfetto v59",
        ServiceImpl::Ours => "Perfetto v59.0 (shmtrace ",
    };
    assert!(version.starts_with(expected_version), "{state}");
    assert_eq!(state["producers"].as_array().unwrap().len(), 0, "{state}");
    assert_eq!(
        state["data_sources"].as_array().unwrap().len(),
        0,
        "{state}"
    );
    assert_eq!(state["sessions"].as_array().unwrap().len(), 0, "{state}");
    assert_eq!(state["lists_sessions"], true, "{state}");

    // A producer registers its track_event data source. Started as
    // `./query-producer` would be from a shell: both SDKs name a producer
    // after its whole argv[0].
    const ARGV0: &str = "./query-producer";
    let spec = ProducerSpec {
        iterations: 1,
        process_name: Some(ARGV0),
        ..Default::default()
    };
    let mut producer_process =
        scenario::start_producer(producer, &bins, dir.path(), 0, &spec, &producer_socket).unwrap();
    let state = scenario::query_until(&consumer_socket, "the producer's data source", |s| {
        !s["data_sources"].as_array().unwrap().is_empty()
    });
    let producers = state["producers"].as_array().unwrap();
    assert_eq!(producers.len(), 1, "{state}");
    assert_eq!(
        producers[0]["pid"].as_u64(),
        Some(u64::from(producer_process.pid())),
        "{state}"
    );
    assert_eq!(producers[0]["name"], ARGV0, "{state}");
    let expected_sdk = match producer {
        ProducerImpl::Real => "Perfetto v59",
        ProducerImpl::Ours => "shmtrace-producer ",
    };
    let sdk = producers[0]["sdk_version"].as_str().unwrap_or_default();
    assert!(sdk.starts_with(expected_sdk), "{state}");
    let data_sources = state["data_sources"].as_array().unwrap();
    assert_eq!(data_sources.len(), 1, "{state}");
    let ds = &data_sources[0];
    assert_eq!(ds["name"], "track_event", "{state}");
    assert_eq!(ds["producer_id"], producers[0]["id"], "{state}");
    let categories: Vec<&str> = ds["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    for category in [
        "interop",
        "interop.flow",
        "interop.counter",
        "interop.large",
    ] {
        assert!(categories.contains(&category), "{category}: {state}");
    }
    let flags = ds["flags"].to_string();
    for flag in [
        "notifies start",
        "notifies stop",
        "clears incremental state",
    ] {
        assert!(flags.contains(flag), "{flag}: {state}");
    }
    // And the table for people.
    let text = scenario::query_output(&consumer_socket, false);
    assert!(text.contains("1 producer(s), 1 data source(s)"), "{text}");
    assert!(text.contains("track_event"), "{text}");
    assert!(text.contains("categories: "), "{text}");

    // A session: its buffer and data source show while it runs.
    let scenario = Scenario::new("query", vec![spec]);
    let config = dir.path().join("config.pb");
    std::fs::write(
        &config,
        shmtrace_tests::config::encode(&scenario.trace_config()),
    )
    .unwrap();
    let mut consumer = scenario::start_consumer(
        ConsumerImpl::Real,
        &bins,
        dir.path(),
        0,
        &consumer_socket,
        &config,
        &dir.path().join("trace.pftrace"),
        &scenario,
    )
    .unwrap();
    consumer.expect_event("connected", TIMEOUT).unwrap();
    producer_process.expect_event("enabled", TIMEOUT).unwrap();
    producer_process.expect_event("phase", TIMEOUT).unwrap();
    let state = scenario::query_until(&consumer_socket, "the session", |s| {
        !s["sessions"].as_array().unwrap().is_empty()
    });
    let sessions = state["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{state}");
    let session = &sessions[0];
    assert_eq!(
        session["buffer_size_kb"],
        serde_json::json!([4096]),
        "{state}"
    );
    assert_eq!(session["num_data_sources"], 1, "{state}");
    assert_eq!(session["state"], "STARTED", "{state}");
    // The same user runs the consumer and the producer.
    assert_eq!(
        session["consumer_uid"], state["producers"][0]["uid"],
        "{state}"
    );
    assert_eq!(state["num_sessions"], 1, "{state}");
    assert_eq!(state["num_sessions_started"], 1, "{state}");

    consumer.send_line("stop").unwrap();
    consumer.expect_event("done", TIMEOUT).unwrap();
    consumer.close_stdin();
    consumer.expect_success(TIMEOUT).unwrap();
    producer_process.expect_event("stopped", TIMEOUT).unwrap();
    producer_process.expect_success(TIMEOUT).unwrap();
    // The session is gone once its consumer is.
    scenario::query_until(&consumer_socket, "the end of the session", |s| {
        s["sessions"].as_array().unwrap().is_empty()
    });
    service_process.close_stdin();
    service_process.expect_success(TIMEOUT).unwrap();
}

/// Issue 5: a trace of 1 M track events from 2 producers x 2 threads
/// through our service, with a 32 MiB shared memory buffer each, loses
/// nothing: every event the producers emitted is in the trace, no loss
/// indicator is set, and every sequence is whole.
///
/// The heaviest test of the crate (a 33 MB trace for both judges): its name
/// sorts first so that it starts first and overlaps the matrix instead of
/// lengthening it.
///
/// Its stop reads the 33 MB through debug builds of the service and the
/// real consumer, a few CPU-seconds each: 9-20 s on a 2-core machine
/// with other tests running, and beyond the default 30 s (3 runs in 3)
/// with two more test binaries beside it; it gets 2 minutes.
#[test]
fn a_million_events_through_our_service_lose_nothing() {
    let spec = ProducerSpec {
        threads: 2,
        iterations: 27_778,
        shmem_kb: 32 * 1024,
        ..Default::default()
    };
    let scenario = Scenario {
        buffer_kb: 256 * 1024,
        stop_timeout: Duration::from_secs(120),
        ..Scenario::new("million", vec![spec, spec])
    };
    let started = Instant::now();
    let (outcome, _) = run(Cell::OUR_SERVICE, &scenario);
    eprintln!("1 M events: {:?}", started.elapsed());
    // 9 track events per iteration (2 slices, 3 instants, 2 counters).
    assert_eq!(outcome.emitted().track_events(), 1_000_008);
    assert_eq!(outcome.report.totals.track_events(), 1_000_008);
    assert_clean_sequences(&outcome, 4);
    for stat in ["chunks_overwritten", "chunks_discarded", "patches_failed"] {
        assert_eq!(outcome.report.buffer_stat(stat), 0, "{stat}");
    }
}

/// The service benchmarks' run (`workload::run`: `smb-bench`,
/// shmtrace-bench's `service_vs_perfetto`) counts what each service kept
/// and measures it: 9,000 track events from each producer driver through
/// both services, recorded by `shmtrace record` (the comparison's
/// consumer) and once by the real consumer (`smb-bench`'s); every trace
/// holds exactly what was emitted, and the service's peak RSS was read.
#[test]
fn the_service_benchmark_workload_runs_through_both_services() {
    use shmtrace_tests::workload::{self, Workload};
    let spec = ProducerSpec {
        threads: 2,
        iterations: 500,
        shmem_kb: 4096,
        ..Default::default()
    };
    let cases = [
        (ProducerImpl::Real, ConsumerImpl::OurCli),
        (ProducerImpl::Ours, ConsumerImpl::OurCli),
        (ProducerImpl::Real, ConsumerImpl::Real),
    ];
    for (producer, consumer) in cases {
        for service in [ServiceImpl::Real, ServiceImpl::Ours] {
            let work = Workload {
                producer,
                spec,
                consumer,
                buffer_kb: 16 * 1024,
            };
            let run = workload::run(&real_binaries!(), service, &work)
                .unwrap_or_else(|e| panic!("{producer:?} {service:?} {consumer:?}: {e}"));
            let what = format!("{producer:?} producer, {service:?} service, {consumer:?}");
            assert_eq!(run.emitted, 9_000, "{what}");
            assert_eq!(run.kept, 9_000, "{what}");
            assert!(run.service_peak_rss_kib > 0, "{what}: no VmHWM");
        }
    }
}

/// Issue 18 item 1: a chunk the service scraped while the real SDK was
/// still writing it, whose copy the periodic write already put in the file
/// and the buffer then wrapped over, is committed later with more packets.
/// `write_into_file` every 100 ms into a 512 KiB ring buffer; two real SDK
/// producers play two paced bursts: a slow one (one thread, an iteration
/// every 300 ms: its chunk stays open for seconds) and a fast one (about
/// 1.3 MB per burst, several times the buffer). Between the bursts the
/// consumer flushes (the SDK's track events commit nothing on a flush, so
/// the service scrapes the chunks its threads hold open) and the harness
/// waits until the next periodic write has put the scraped copies in the
/// file. In the second burst the fast producer wraps the buffer over the
/// slow one's scraped chunk long before the slow thread fills and commits
/// it. Our service must keep the commit and read only the packets it had
/// not read from the scraped copy: the trace holds exactly what the
/// producers emitted, no duplicate and no loss (before, the commit was
/// refused as stale, `chunks_discarded` 1, and the slow thread's packets
/// written after the flush were lost: 6,090 of the 6,180 track events).
/// The real service reads such a chunk again from its start: its trace
/// holds the head twice (6,270 track events, 2 runs of 2), so only our
/// service plays this.
#[test]
fn late_commits_of_scraped_chunks_are_kept_in_write_into_file() {
    let slow = ProducerSpec {
        threads: 1,
        iterations: 10,
        phases: 2,
        iteration_sleep_us: 300_000,
        ..Default::default()
    };
    let fast = ProducerSpec {
        threads: 1,
        iterations: 300,
        phases: 2,
        large_kb: 4,
        large_every: 1,
        iteration_sleep_us: 2_000,
        ..Default::default()
    };
    let scenario = Scenario {
        buffer_kb: 512,
        write_into_file_period_ms: Some(100),
        between_phases: BetweenPhases::FlushAndSampleFileSize {
            grow_within: Duration::from_secs(30),
        },
        ..Scenario::new("late-commit", vec![slow, fast])
    };
    let (outcome, _) = run(Cell::OUR_SERVICE, &scenario);
    let emitted = outcome.emitted();
    eprintln!(
        "late commits: emitted {} track events, the trace holds {}; buffer stats {:?}",
        emitted.track_events(),
        outcome.report.totals.track_events(),
        outcome.report.buffer_stats
    );
    assert_eq!(outcome.report.totals.track_events(), emitted.track_events());
    assert_clean_sequences(&outcome, 2);
    for stat in ["chunks_overwritten", "chunks_discarded", "abi_violations"] {
        assert_eq!(outcome.report.buffer_stat(stat), 0, "{stat}");
    }
    // The buffer did wrap (the scraped chunk was gone when its commit came).
    assert_stat_at_least(&outcome.report, "write_wrap_count", 1);
}
