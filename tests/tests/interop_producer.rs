//! Cell (b) of the interop matrix: our producer (shmtrace-producer's
//! `interop_producer` example, a twin of `real-producer`) -> the real
//! Perfetto service <- the real Perfetto consumer, for every scenario of
//! `interop_real.rs`, with the same checks, plus a many-threads scenario
//! with a tiny shared memory buffer.

use std::time::Duration;

use shmtrace_tests::checker::Loss;
use shmtrace_tests::config::FillPolicy;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, BetweenPhases, Cell, Outcome, ProducerSpec, Scenario, Stop};

fn run(scenario: &Scenario) -> Outcome {
    scenario::run(Cell::OUR_PRODUCER, &real_binaries!(), scenario)
        .unwrap_or_else(|e| panic!("{}: {e}", scenario.name))
}

/// Every sequence that carries track events belongs to one of the producers
/// and started cleanly (first packet present, incremental state cleared).
fn assert_clean_sequences(outcome: &Outcome, expected_sequences: usize) {
    let sequences: Vec<_> = outcome.report.track_event_sequences().collect();
    assert_eq!(sequences.len(), expected_sequences, "{sequences:#?}");
    for seq in sequences {
        assert!(!seq.start_lost, "sequence {} lost its start", seq.id);
        assert_eq!(seq.loss_marks, 0, "sequence {} has loss marks", seq.id);
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

#[test]
fn small_packets() {
    let scenario = Scenario::new(
        "small",
        vec![ProducerSpec {
            threads: 2,
            iterations: 200,
            ..Default::default()
        }],
    );
    let outcome = run(&scenario);
    outcome.report.assert_ok("small packets");
    let emitted = outcome.emitted();
    assert_eq!(emitted.slice_begin, 800);
    assert_eq!(emitted.skipped_disabled, 0);
    assert_eq!(outcome.report.totals.track_events(), emitted.track_events());
    assert_clean_sequences(&outcome, 2);
    // Interned names and categories resolve to the right strings.
    let by_name = &outcome.report.events_by_name;
    for name in ["outer", "inner", "tick", "flow_out", "flow_in"] {
        assert_eq!(by_name.get(name), Some(&400), "{name}: {by_name:?}");
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
}

#[test]
fn packets_spanning_many_chunks() {
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
    let outcome = run(&scenario);
    outcome.report.assert_ok("large packets");
    // 3 huge instants per thread, each a single ~300 KiB packet spread over
    // dozens of chunks whose nested size fields were patched afterwards.
    assert_eq!(outcome.report.totals.large, 6);
    assert_eq!(
        outcome.report.totals.large_bytes,
        6 * u64::from(LARGE_KB) * 1024
    );
    assert!(
        outcome.report.buffer_stat("patches_succeeded") > 0,
        "{:?}",
        outcome.report.buffer_stats
    );
    assert!(
        outcome.report.buffer_stat("readaheads_succeeded") >= 6,
        "{:?}",
        outcome.report.buffer_stats
    );
    assert_eq!(outcome.report.buffer_stat("patches_failed"), 0);
    assert!(outcome.trace_bytes > 6 * u64::from(LARGE_KB) * 1024);
    assert_clean_sequences(&outcome, 2);
}

#[test]
fn ring_buffer_wrap() {
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
    let outcome = run(&scenario);
    outcome.report.assert_ok("ring buffer wrap");
    let report = &outcome.report;
    assert!(
        report.buffer_stat("write_wrap_count") > 0,
        "{:?}",
        report.buffer_stats
    );
    assert!(
        report.buffer_stat("chunks_overwritten") > 0,
        "{:?}",
        report.buffer_stats
    );
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
}

#[test]
fn discard_when_full() {
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
    let outcome = run(&scenario);
    outcome.report.assert_ok("discard when full");
    let report = &outcome.report;
    assert!(
        report.buffer_stat("chunks_discarded") > 0,
        "{:?}",
        report.buffer_stats
    );
    assert_eq!(report.buffer_stat("chunks_overwritten"), 0);
    // What was kept is a clean prefix of each sequence (a thread that was
    // descheduled while the other filled the buffer may have none at all).
    let emitted = outcome.emitted();
    assert!(report.totals.slice_begin > 0);
    assert!(report.totals.slice_begin < emitted.slice_begin);
    let kept = report.track_event_sequences().count();
    assert!((1..=2).contains(&kept), "{:#?}", report.sequences);
    assert_clean_sequences(&outcome, kept);
}

#[test]
fn two_producers_two_threads_each() {
    let spec = ProducerSpec {
        threads: 2,
        iterations: 300,
        ..Default::default()
    };
    let outcome = run(&Scenario::new("two-producers", vec![spec, spec]));
    outcome.report.assert_ok("2 producers x 2 threads");
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
}

#[test]
fn flush_mid_session() {
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
    let outcome = run(&scenario);
    outcome.report.assert_ok("flush mid-session, whole trace");
    let [mid] = outcome.mid_reads.as_slice() else {
        panic!("one mid-session read expected")
    };
    assert!(mid.flush_ok, "the mid-session flush failed");
    // Everything emitted before the flush is readable right after it, while
    // the writer threads are still alive in the middle of their chunks.
    mid.report
        .assert_ok("flush mid-session, read after the flush");
    let phase1 = outcome.producers[0].phases[0];
    assert_eq!(mid.report.totals.slice_begin, phase1.slice_begin);
    assert_eq!(mid.report.totals.track_events(), phase1.track_events());
    assert!(outcome.report.totals.slice_begin > phase1.slice_begin);
}

#[test]
fn incremental_state_clear() {
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
    let outcome = run(&scenario);
    outcome.report.assert_ok("incremental state clear");
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
    assert_clean_sequences(&outcome, 2);
}

#[test]
fn write_into_file() {
    let scenario = Scenario {
        write_into_file_period_ms: Some(100),
        between_phases: BetweenPhases::SampleFileSize {
            settle: Duration::from_millis(500),
        },
        ..Scenario::new(
            "file",
            vec![ProducerSpec {
                threads: 2,
                iterations: 300,
                phases: 3,
                ..Default::default()
            }],
        )
    };
    let outcome = run(&scenario);
    outcome.report.assert_ok("write_into_file");
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
}

/// 32 threads and a 64 KiB shared memory buffer (16 chunks): the writers
/// share chunks, idle ones give theirs back, nothing deadlocks, and every
/// loss is marked so the checker can account for it.
#[test]
fn many_threads_tiny_smb() {
    let scenario = Scenario {
        buffer_kb: 32 * 1024,
        loss: Loss::Allowed,
        ..Scenario::new(
            "tiny-smb",
            vec![ProducerSpec {
                threads: 32,
                iterations: 500,
                shmem_kb: 64,
                ..Default::default()
            }],
        )
    };
    let outcome = run(&scenario);
    outcome.report.assert_ok("32 threads, 64 KiB SMB");
    let emitted = outcome.emitted();
    assert_eq!(emitted.skipped_disabled, 0);
    assert!(outcome.report.totals.slice_begin > 0);
    assert!(outcome.report.totals.slice_begin <= emitted.slice_begin);
    assert!(outcome.report.track_event_sequences().count() >= 1);
}
