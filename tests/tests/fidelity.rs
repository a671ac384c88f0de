//! Producer fidelity: our producer library writes the same trace *content*
//! as the real Perfetto SDK.
//!
//! The real SDK driver (`interop/real_producer.cc`) and ours
//! (`interop_producer`) run the same script, with `--fidelity` (every
//! debug annotation type, nested dicts and arrays, a dynamic event name, a
//! named track with a parent, counter tracks with a unit, a multiplier, a
//! unit name and a category, int and double counters) on top of the
//! matrix's slices, instants, flows and large annotations, each against the
//! real service and consumer. `checker/semantic_dump.py` reduces each trace
//! to what a trace processor reads from it (resolved names and categories,
//! tracks by content, typed annotation trees, flows by first use, counter
//! values with their type) and the two dumps must be equal.
//!
//! With `SHMTRACE_KEEP_FIDELITY_TRACES` set, the test keeps both traces
//! (`real.pftrace`, `ours.pftrace`), says where, and compares nothing.

use std::path::Path;

use shmtrace_tests::checker::semantic_diff;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, Cell, ProducerSpec, Scenario};

fn record(cell: Cell, trace: &Path) {
    let scenario = Scenario {
        keep_trace: Some(trace.into()),
        ..Scenario::new(
            "fidelity",
            vec![ProducerSpec {
                threads: 2,
                iterations: 6,
                phases: 2,
                large_kb: 2,
                large_every: 3,
                fidelity: true,
                ..Default::default()
            }],
        )
    };
    let outcome = scenario::run(cell, &real_binaries!(), &scenario)
        .unwrap_or_else(|e| panic!("fidelity in cell {}: {e}", cell.name()));
    outcome
        .report
        .assert_ok(&format!("fidelity in cell {}", cell.name()));
    // The comparison covers the --fidelity events (the checker counted
    // them against what the driver says it emitted).
    let by_name = &outcome.report.events_by_name;
    // Once per thread (2) and phase (2); "large" every third of 12
    // iterations per thread.
    for (name, n) in [
        ("fidelity", 4),
        ("dyn.0", 2),
        ("dyn.1", 2),
        ("on_named", 4),
        ("on_global", 4),
        ("flowing", 4),
        ("flow_sink", 4),
        ("large", 8),
    ] {
        assert_eq!(by_name.get(name), Some(&n), "{name}: {by_name:?}");
    }
}

#[test]
fn our_producer_writes_what_the_real_sdk_writes() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let real = dir.path().join("real.pftrace");
    let ours = dir.path().join("ours.pftrace");
    std::thread::scope(|s| {
        s.spawn(|| record(Cell::REAL, &real));
        s.spawn(|| record(Cell::OUR_PRODUCER, &ours));
    });
    if std::env::var_os("SHMTRACE_KEEP_FIDELITY_TRACES").is_some() {
        eprintln!("fidelity traces kept in {}", dir.keep().display());
        return;
    }
    if let Some(diff) = semantic_diff(&real, &ours).expect("semantic_dump.py runs") {
        let kept = dir.keep();
        panic!(
            "our producer's trace says something else than the real SDK's \
             (traces kept in {}):\n{diff}",
            kept.display()
        );
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
