//! The producer socket over TCP (issue 20): the real Perfetto SDK producer
//! connects to `127.0.0.1:PORT`, gets shmem emulation from the service
//! (`InitializeConnectionResponse.use_shmem_emulation`), and sends its
//! chunks inline in `CommitData`. The same scenario runs against the real
//! service (the reference) and ours, recorded by the real consumer and by
//! `shmtrace record`; the checker counts every event, the large packets
//! (patched after their first chunks were written) and the mid-session flush.
//!
//! What the real SDK (v59) does under emulation, and the real service shows
//! the same way: it sends a chunk only once the chunk is complete, and does
//! not scrape itself on a flush (it never sets `chunk_incomplete`), so a
//! mid-session read lacks what its idle threads left in their current
//! chunks; they go when its threads exit. Its packets of 300 KiB (the size
//! `interop::packets_spanning_many_chunks` uses over UNIX sockets) lose
//! packets to `trace_writer_packet_loss` under emulation against either
//! service; 64 KiB ones, spanning 17 chunks, do not.
//!
//! Our producer over TCP does both: it sends its chunks once complete, and
//! on a flush it commits every idle writer's current chunk (its writers
//! can be taken from another thread, see the producer's README), so the
//! mid-session read holds every event emitted before the flush, against
//! either service.

use shmtrace_tests::checker::TraceReport;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{
    self, BetweenPhases, Cell, Outcome, ProducerImpl, ProducerSocket, ProducerSpec, Scenario,
};

const LARGE_KB: u32 = 64;

/// Two threads, two phases with a flush and a read between them, and a
/// 64 KiB packet every 40th iteration.
fn scenario(flush_mid_session: bool) -> Scenario {
    Scenario {
        buffer_kb: 16 * 1024,
        producer_socket: ProducerSocket::Tcp,
        between_phases: if flush_mid_session {
            BetweenPhases::FlushAndRead
        } else {
            BetweenPhases::Nothing
        },
        ..Scenario::new(
            "tcp",
            vec![ProducerSpec {
                threads: 2,
                iterations: 200,
                phases: 2,
                large_kb: LARGE_KB,
                large_every: 40,
                ..Default::default()
            }],
        )
    }
}

fn run(cell: Cell) -> Outcome {
    let scenario = scenario(cell.reads_mid_session());
    let outcome = scenario::run(cell, &real_binaries!(), &scenario)
        .unwrap_or_else(|e| panic!("tcp in cell {}: {e}", cell.name()));
    outcome
        .report
        .assert_ok(&format!("tcp in cell {}", cell.name()));
    check(cell, &outcome, &outcome.report);
    outcome
}

fn check(cell: Cell, outcome: &Outcome, report: &TraceReport) {
    let emitted = outcome.emitted();
    // 2 threads x 200 iterations x 2 phases, all of them in the trace.
    assert_eq!(emitted.slice_begin, 2 * 200 * 2 * 2);
    eprintln!(
        "{} of {} track events in the trace, {} patches applied",
        report.totals.track_events(),
        emitted.track_events(),
        report.buffer_stat("patches_succeeded")
    );
    assert_eq!(report.totals.track_events(), emitted.track_events());
    assert_eq!(report.totals.slice_begin, emitted.slice_begin);
    // A 64 KiB packet every 40th iteration: 10 per thread, each spread
    // over 17 inline chunks whose size fields were patched, by the
    // service or (the real SDK) by the producer before the chunk went.
    assert_eq!(report.totals.large, 20);
    assert_eq!(report.totals.large_bytes, 20 * u64::from(LARGE_KB) * 1024);
    // Our producer sends a patch for every chunk that went before its
    // packet ended. The real SDK patches a chunk itself while the chunk
    // still waits in its pending CommitData (both services advertise
    // `direct_smb_patching_supported`), so its count depends on whether its
    // IPC thread sent the first chunks before the writer finished the
    // packet: CI has seen 0. The exact large bytes above are the check
    // that every size field was right.
    if cell.producer == ProducerImpl::Ours {
        assert!(report.buffer_stat("patches_succeeded") >= 1);
    }
    assert_eq!(report.buffer_stat("patches_failed"), 0);
    assert_eq!(report.buffer_stat("chunks_overwritten"), 0);
}

/// What the mid-session read of a run with our producer holds: every
/// event of phase 1, none of phase 2.
fn mid_session_flush_complete(outcome: &Outcome) {
    let [mid] = outcome.mid_reads.as_slice() else {
        panic!("one mid-session read expected")
    };
    assert!(mid.flush_ok, "the mid-session flush failed");
    let phase1 = outcome.producers[0].phases[0];
    eprintln!(
        "{} of the {} track events of phase 1 read after the flush",
        mid.report.totals.track_events(),
        phase1.track_events()
    );
    assert_eq!(mid.report.totals.slice_begin, phase1.slice_begin);
    assert_eq!(mid.report.totals.track_events(), phase1.track_events());
    assert_eq!(mid.report.totals.large, phase1.large);
    assert_eq!(mid.report.totals.large_bytes, phase1.large_bytes);
}

fn mid_session_flush(outcome: &Outcome) {
    let [mid] = outcome.mid_reads.as_slice() else {
        panic!("one mid-session read expected")
    };
    assert!(mid.flush_ok, "the mid-session flush failed");
    // What the flush brought: the complete chunks of phase 1 the SDK has
    // sent by then, not the chunks the idle threads are still in (see the
    // module docs), and nothing of phase 2. Usually more than half of
    // phase 1; under load the SDK has been seen to send its complete
    // chunks only after it acknowledged the flush (CI: 2 of 800), and the
    // final read (checked by `run`) held them, so no lower bound is
    // required of it.
    let phase1 = outcome.producers[0].phases[0];
    let read = mid.report.totals.slice_begin;
    assert!(
        read <= phase1.slice_begin,
        "{read} of {} slice begins after the flush",
        phase1.slice_begin
    );
    eprintln!(
        "{read} of the {} slice begins of phase 1 read after the flush",
        phase1.slice_begin
    );
}

#[test]
fn real_producer_over_tcp_to_the_real_service() {
    mid_session_flush(&run(Cell::REAL));
}

/// Before a flush waited for an emulated producer whose data sources have
/// `no_flush`, about 1 run in 4 lost the chunks the SDK's threads committed
/// as they exited, just before the consumer's stop (unmarked: the last
/// chunk of a sequence).
#[test]
fn real_producer_over_tcp_to_our_service() {
    mid_session_flush(&run(Cell::OUR_SERVICE));
}

#[test]
fn real_producer_over_tcp_to_our_service_recorded_by_our_cli() {
    run(Cell::OUR_SERVICE_AND_CLI);
}

#[test]
fn our_producer_over_tcp_to_the_real_service() {
    mid_session_flush_complete(&run(Cell::OUR_PRODUCER));
}

#[test]
fn our_producer_over_tcp_to_our_service() {
    mid_session_flush_complete(&run(Cell::OUR_PRODUCER_AND_SERVICE));
}

#[test]
fn our_producer_over_tcp_to_our_service_recorded_by_our_cli() {
    run(Cell::OURS);
}
