//! SMB scraping (upstream: `TracingServiceImpl::ScrapeSharedMemoryBuffers`,
//! src/tracing/service/tracing_service_impl.cc, for a producer that asked for
//! it with `InitializeConnectionRequest.smb_scraping_mode`, as the C++ SDK's
//! system backend does): a producer that crashes mid-session
//! loses nothing it finished writing.
//!
//! A producer writes a known set of track events from three threads, which
//! then idle (alive, none flushing, each still holding the chunk it was
//! writing into), and is killed with SIGKILL while the session runs. Once
//! the service has seen it go, the consumer stops the session. A producer
//! that asked for scraping (`InitializeConnectionRequest.smb_scraping_mode
//! = SMB_SCRAPING_ENABLED`, as the SDK's system backend does) has its
//! chunks still being written copied into the trace when it disconnects,
//! so every event it wrote is there: the chunks it committed and the ones
//! it never did. Nothing is in flight at the kill: the driver reports its
//! phase after its threads finished every packet, and the harness kills it
//! only once a committed chunk of every thread is in the service's buffer,
//! so the service knows every writer (see [`Stop::AfterKillingProducers`]).
//! Our producer's sender commits the chunks of idle writers itself, never
//! sooner than its idle sweep period after their last writes: a run of it
//! counts only if the kill came sooner ([`BELOW_IDLE_SWEEP_PERIOD`]; timed
//! from the harness's "next" that starts the last of two phases, before
//! which the threads cannot have written their last events), else
//! its open chunks may all have been committed and the trace says nothing
//! about scraping; such a run is replayed, and a cell that gets none fails.
//!
//! Cells: the real SDK producer against the real service and ours (the
//! reference: both services scrape a producer that asks), and our producer
//! against both (it asks, unless `ProducerConfig::smb_scraping` is off:
//! without scraping the trace lacks the events of its open chunks, ~816 of
//! 1,080 found, and records no loss).

use std::time::Duration;

use shmtrace_tests::checker::{EventCounts, Loss};
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, Cell, Outcome, ProducerImpl, ProducerSpec, Scenario, Stop};

/// Emitting threads of the producer.
const THREADS: u64 = 3;
/// Iterations per thread (see `interop/real_producer.cc`): enough to fill
/// some chunks, so that the trace needs both the committed ones and the
/// scraped ones. Played in [`PHASES`] phases.
const ITERATIONS: u64 = 40;
/// Phases: the harness times the kill from the start of the last one
/// ([`scenario::ProducerRun::killed_after`]), which is short.
const PHASES: u64 = 2;
/// Track events per iteration: slices "outer" and "inner" (a begin and an
/// end each), instants "tick", "flow_out" and "flow_in", two counters.
const EVENTS_PER_ITERATION: u64 = 9;

/// Below our producer's idle sweep period (`IDLE_SWEEP_PERIOD`, 500 ms, in
/// host-producer/src/connection.rs; keep the two in step), with margin.
/// The sweep flushes a writer idle at one sweep at the next, so no open
/// chunk of our producer is committed sooner than a period after the
/// threads' last writes. Killed sooner, every chunk still open at the kill
/// reaches the trace only by scraping; killed later, the sweep may have
/// committed them all and the run proves nothing about scraping.
const BELOW_IDLE_SWEEP_PERIOD: Duration = Duration::from_millis(400);
/// Runs of a cell of our producer, at most, to get one whose kill came
/// within [`BELOW_IDLE_SWEEP_PERIOD`].
const ATTEMPTS: usize = 4;

/// Plays the scenario in `cell`. With our producer, retries a run killed
/// too late to tell scraping from the idle sweep (each attempt with fresh
/// services and producer), and fails if every attempt was.
fn run_conclusive(cell: Cell, scenario: &Scenario, context: &str) -> Outcome {
    let mut windows = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let outcome = scenario::run(cell, &real_binaries!(), scenario)
            .unwrap_or_else(|e| panic!("{context}: {e}"));
        let window = outcome
            .producers
            .iter()
            .map(|p| p.killed_after.expect("killed producers are timed"))
            .max()
            .unwrap_or_default();
        println!("{context}: attempt {attempt}: killed {window:?} after the last phase began");
        if cell.producer != ProducerImpl::Ours || window < BELOW_IDLE_SWEEP_PERIOD {
            return outcome;
        }
        windows.push(window);
    }
    panic!(
        "{context}: inconclusive: in each of {ATTEMPTS} runs the producer was killed \
         {windows:?} after its last phase began, not within {BELOW_IDLE_SWEEP_PERIOD:?}, \
         so its idle sweep may have committed every open chunk before the kill and the \
         trace cannot show whether the service scraped them (a machine too loaded?)"
    );
}

fn killed_producer(cell: Cell) {
    let scenario = Scenario {
        stop: Stop::AfterKillingProducers,
        // The checker's usual rule: events may be missing only where the
        // trace records a loss. Below, none may be missing.
        loss: Loss::Allowed,
        ..Scenario::new(
            "killed_producer",
            vec![ProducerSpec {
                threads: THREADS as u32,
                iterations: (ITERATIONS / PHASES) as u32,
                phases: PHASES as u32,
                ..ProducerSpec::default()
            }],
        )
    };
    let context = format!("killed_producer in cell {}", cell.name());
    let outcome = run_conclusive(cell, &scenario, &context);
    let report = &outcome.report;
    let [producer] = outcome.producers.as_slice() else {
        panic!("{context}: one producer expected");
    };
    let emitted = producer.emitted();
    let per_thread = ITERATIONS * EVENTS_PER_ITERATION;
    assert_eq!(emitted.skipped_disabled, 0, "{context}: {emitted:?}");
    assert_eq!(emitted.track_events(), THREADS * per_thread, "{emitted:?}");

    // Every event the producer wrote before the kill is in the trace.
    let found = report
        .producers
        .get(&producer.pid.to_string())
        .copied()
        .unwrap_or_default();
    assert_eq!(
        EventCounts {
            skipped_disabled: 0,
            ..found
        },
        emitted,
        "{context}: the trace holds {} of the {} track events the producer wrote \
         before it was killed; the checker says: {:?}; loss indicators {:?}",
        found.track_events(),
        emitted.track_events(),
        report.violations,
        report.loss_indicators,
    );
    for name in ["outer", "inner", "tick", "flow_out", "flow_in"] {
        assert_eq!(
            report.events_by_name.get(name).copied(),
            Some(THREADS * ITERATIONS),
            "{context}: events named {name}: {:?}",
            report.events_by_name
        );
    }
    // One sequence per thread, each whole: begun, never marked lossy.
    let sequences: Vec<_> = report.track_event_sequences().collect();
    assert_eq!(
        sequences.len(),
        THREADS as usize,
        "{context}: {sequences:#?}"
    );
    for seq in sequences {
        assert_eq!(seq.pids, [producer.pid], "{context}: {seq:?}");
        assert_eq!(seq.track_events, per_thread, "{context}: {seq:?}");
        assert!(!seq.start_lost && seq.loss_marks == 0, "{context}: {seq:?}");
    }
    // Nothing is missing, so nothing may claim a loss either.
    assert!(
        report.loss_indicators.is_empty(),
        "{context}: {:?}",
        report.loss_indicators
    );
    report.assert_ok(&context);
}

mod killed_producer {
    use shmtrace_tests::scenario::Cell;

    #[test]
    fn real() {
        super::killed_producer(Cell::REAL);
    }

    #[test]
    fn our_service() {
        super::killed_producer(Cell::OUR_SERVICE);
    }

    #[test]
    fn our_producer() {
        super::killed_producer(Cell::OUR_PRODUCER);
    }

    #[test]
    fn our_producer_and_service() {
        super::killed_producer(Cell::OUR_PRODUCER_AND_SERVICE);
    }
}
