//! Producer fidelity: our producer library writes the same trace *content*
//! as the real Perfetto SDK.
//!
//! The real SDK driver (`interop/real_producer.cc`) and ours
//! (`interop_producer`) run the same script, with `--fidelity` (every
//! debug annotation type, nested dicts and arrays, a dynamic event name, a
//! named track with a parent, counter tracks with a unit, a multiplier, a
//! unit name and a category, int and double counters; events at explicit
//! times, on BOOTTIME and on MONOTONIC; events on the process track, on
//! another thread's track and on nested custom tracks; events in dynamic
//! categories; flows from one thread to another; a double counter with a
//! unit and multiplier under a custom track and an int counter under the
//! thread's track) on top of the matrix's slices, instants, flows and large
//! annotations, each against the real service and consumer.
//! `checker/semantic_dump.py` reduces each trace to what a trace processor
//! reads from it (resolved names and categories, tracks by content with
//! every descriptor of a track merged, typed annotation trees, flows by
//! first use, counter values with their type, explicit times relative to
//! the script's time base) and the two dumps must be equal, less the
//! script's known differences (`KNOWN_DIFFERENCES` there).
//!
//! What each part of the script compares (only what both the C API, as the
//! driver uses it, and our public API can say), and what it leaves out:
//!
//! * Explicit times: an instant, a slice's begin and end and a counter on
//!   a track first used there, at offsets from a base read from the SDK's
//!   clock, on BOOTTIME (upstream: absolute, or
//!   its incremental clock type, written as a delta) and an instant on
//!   MONOTONIC. Compared: each time relative to the base (exact in ns; the
//!   MONOTONIC one through the service's clock snapshots, in whole ms, with
//!   the clock's name). Not compared: absolute times. An event earlier
//!   than the previous one of its thread (upstream: absolute on BOOTTIME,
//!   its incremental clock left alone) is only in
//!   [`an_event_earlier_than_the_previous_one`]; every run checks that
//!   `shmtrace inspect` and `check_trace.py` count the same out-of-order
//!   packets.
//! * Tracks: a slice on the process track, an instant on the next worker's
//!   thread track (phase 2; the C API has no such track, so the driver
//!   writes its descriptor by hand, as the C++ SDK's
//!   `ThreadTrack::ForThread` does, less the calling thread's name that one
//!   adds), a slice on nested named tracks under the process (child
//!   ordering, sibling rank) and an instant on nested named tracks under
//!   no parent. Compared: each track's merged descriptors (so the other
//!   thread's track is the one its thread describes) and its parent chain,
//!   every custom ancestor's descriptor included.
//! * Dynamic categories: an instant and a slice in two. Compared: the
//!   events' categories, and which a filter lets through. Not compared: a
//!   dynamic category no rule of the config names (the C API disables it,
//!   ours, like the C++ SDK, enables it: by design, see
//!   `shmtrace_producer::filter`), so the configs name them all.
//! * Flows across threads: begun on one worker in phase 1, ended on another
//!   in phase 2. Compared: the pairing (flow ids by first use). Not
//!   compared: the arrows' order in time.
//! * Counters: a double counter with a unit and a multiplier under a named
//!   track, an int counter under the thread's track. Compared: value and
//!   type, the counter descriptor, the parent.
//!
//! With `SHMTRACE_KEEP_FIDELITY_TRACES` set, the test keeps both traces
//! (`real.pftrace`, `ours.pftrace`), says where, and compares nothing.

use std::path::Path;

use shmtrace_tests::checker::{semantic_diff, TraceReport};
use shmtrace_tests::config::TrackEventConfig;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, Cell, ProducerSpec, Scenario};

/// The fidelity script: 2 threads x 2 phases; `clear_period_ms` makes the
/// service clear incremental state while it runs.
fn fidelity_scenario(clear_period_ms: Option<u32>) -> Scenario {
    let producer = ProducerSpec {
        threads: 2,
        iterations: 6,
        phases: 2,
        large_kb: 2,
        large_every: 3,
        fidelity: true,
        ..Default::default()
    };
    match clear_period_ms {
        None => Scenario::new("fidelity", vec![producer]),
        // Each phase spans more than a clear period (40 x 4 ms), so the
        // second phase's --fidelity events follow a clear.
        Some(period) => Scenario {
            clear_period_ms: Some(period),
            ..Scenario::new(
                "fidelity-clear",
                vec![ProducerSpec {
                    iterations: 40,
                    iteration_sleep_us: 4000,
                    large_every: 16,
                    ..producer
                }],
            )
        },
    }
}

/// The plain fidelity scenario with a category filter instead of the
/// drivers' categories.
fn filtered(enabled: &[&str], disabled: &[&str]) -> Scenario {
    let list = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    Scenario {
        track_event_config: Some(TrackEventConfig {
            enabled_categories: list(enabled),
            disabled_categories: list(disabled),
        }),
        ..fidelity_scenario(None)
    }
}

/// Runs `scenario` in `cell`, keeping its trace in `trace`; returns the
/// checker's report (checked, unless the scenario filters categories).
fn record(cell: Cell, scenario: &Scenario, trace: &Path) -> TraceReport {
    let scenario = Scenario {
        keep_trace: Some(trace.into()),
        ..scenario.clone()
    };
    let outcome = scenario::run(cell, &real_binaries!(), &scenario)
        .unwrap_or_else(|e| panic!("{} in cell {}: {e}", scenario.name, cell.name()));
    let report = outcome.report;
    // Both judges resolve time alike: the same packets are out of order.
    let inspected = outcome.inspect.analysis["clocks"]["out_of_order"].as_u64();
    assert_eq!(
        inspected,
        Some(report.out_of_order),
        "{} in cell {}: inspect and check_trace.py count different out-of-order packets",
        scenario.name,
        cell.name()
    );
    if scenario.track_event_config.is_some() {
        return report;
    }
    report.assert_ok(&format!("{} in cell {}", scenario.name, cell.name()));
    // The comparison covers the --fidelity events (the checker counted
    // them against what the driver says it emitted): once per thread (2)
    // and phase (2).
    let by_name = &report.events_by_name;
    for (name, n) in [
        ("fidelity", 4),
        ("dyn.0", 2),
        ("dyn.1", 2),
        ("on_named", 4),
        ("on_global", 4),
        ("flowing", 4),
        ("flow_sink", 4),
        ("ts.base", 4),
        ("ts.slice", 4),
        ("ts.mono", 4),
        ("on_process", 4),
        ("on_inner", 4),
        ("on_leaf", 4),
        ("dyncat.instant", 4),
        ("dyncat.slice", 4),
        // Flows cross from phase 1 to phase 2; the other thread's track is
        // known from phase 2 on.
        ("xflow_out", 2),
        ("xflow_in", 2),
        ("on_peer", 2),
    ] {
        assert_eq!(by_name.get(name), Some(&n), "{name}: {by_name:?}");
    }
    assert!(by_name.get("large").is_some_and(|&n| n > 0), "{by_name:?}");
    report
}

/// Records `scenario` with the real SDK and with ours (side by side) and
/// requires equal semantic dumps; returns both checker reports.
fn assert_same_content(scenario: &Scenario) -> (TraceReport, TraceReport) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let real = dir.path().join("real.pftrace");
    let ours = dir.path().join("ours.pftrace");
    let reports = std::thread::scope(|s| {
        let real_report = s.spawn(|| record(Cell::REAL, scenario, &real));
        let our_report = record(Cell::OUR_PRODUCER, scenario, &ours);
        (real_report.join().unwrap(), our_report)
    });
    if std::env::var_os("SHMTRACE_KEEP_FIDELITY_TRACES").is_some() {
        eprintln!("{} traces kept in {}", scenario.name, dir.keep().display());
        return reports;
    }
    if let Some(diff) = semantic_diff(&real, &ours).expect("semantic_dump.py runs") {
        let kept = dir.keep();
        panic!(
            "{}: our producer's trace says something else than the real SDK's \
             (traces kept in {}):\n{diff}",
            scenario.name,
            kept.display()
        );
    }
    reports
}

#[test]
fn our_producer_writes_what_the_real_sdk_writes() {
    assert_same_content(&fidelity_scenario(None));
}

/// The same through incremental-state clears: what each producer re-emits
/// after a clear (interned names, descriptors) must still say the same.
#[test]
fn the_same_through_incremental_state_clears() {
    let (real, ours) = assert_same_content(&fidelity_scenario(Some(100)));
    for report in [real, ours] {
        for seq in report.track_event_sequences() {
            assert!(
                seq.cleared >= 2,
                "sequence {} cleared {} times",
                seq.id,
                seq.cleared
            );
        }
    }
}

/// The dump tool's own unit tests (`checker/test_semantic_dump.py`: what it
/// normalizes reads the same, what it must see shows) run under `cargo
/// test` too.
#[test]
fn semantic_dump_unit_tests() {
    shmtrace_tests::checker::python_unit_tests("test_semantic_dump")
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Category filters select the same events: exact names and patterns, in
/// the enabled and the disabled list, against each other.
#[test]
fn category_filters_select_the_same_events() {
    let scenario = filtered(
        &["interop", "interop.large", "interop.c*"],
        &["interop.flow", "interop.*"],
    );
    let (real, _) = assert_same_content(&scenario);
    // Something was filtered out, something let through; dynamic
    // categories too.
    let cats = &real.events_by_category;
    assert!(cats.get("interop").is_some_and(|&n| n > 0), "{cats:?}");
    assert_eq!(cats.get("interop.flow"), None, "{cats:?}");
    assert_eq!(cats.get("interop.cdyn"), Some(&4), "{cats:?}");
    assert_eq!(cats.get("interop.dynamic"), None, "{cats:?}");
}

/// An event at an explicit time before the previous event of its thread
/// (in the script's category `fidelity.earlier`, which only this test
/// enables): upstream writes it as an absolute BOOTTIME timestamp and keeps
/// its incremental clock where it was, and so must we. Perfetto allows a
/// sequence's time to go back (a trace processor sorts events by time), so
/// both judges pass the trace and count the step back, once per thread and
/// phase; every other time of the script is in order.
#[test]
fn an_event_earlier_than_the_previous_one() {
    let scenario = filtered(&["interop", "interop.*", "fidelity.earlier"], &[]);
    let (real, ours) = assert_same_content(&scenario);
    for report in [real, ours] {
        assert_eq!(report.events_by_name.get("ts.earlier"), Some(&4));
        assert_eq!(report.out_of_order, 4, "{:?}", report.sequences);
        assert!(
            report.violations.iter().all(|v| !v.contains("timestamp")),
            "{:?}",
            report.violations
        );
    }
}
