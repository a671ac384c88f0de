//! Chunk turnaround with a small shared memory buffer (issue 18 item 2),
//! printed as numbers, asserted nowhere: the real service and `shmtrace
//! serve` in turn, each with the same workload of the real SDK producer
//! writing as fast as it can into Perfetto's default 256 KiB SMB (64 chunks
//! of 4 KiB). The SDK drops what it writes while no chunk is free, so the
//! events a trace keeps measure how soon the service frees the chunks the
//! producer commits. Per pair: the events each service kept, the CPU it
//! spent, and the ratio ours / real; then the totals.
//!
//! ```text
//! cargo build --release -p shmtrace-cli --bin shmtrace -p shmtrace-tests --bin real-service --bin real-producer --bin real-consumer --bin smb-bench
//! target/release/smb-bench [--pairs N] [--events N] [--threads N] [--shmem-kb K]
//! ```
//!
//! Defaults: 3 pairs, 1,000,000 events from 2 threads, the SDK's default
//! SMB (`--shmem-kb 0`), a 128 MiB ring buffer that holds them all. The
//! order of the two services alternates from pair to pair. Uses the
//! binaries next to itself (build them all in the same profile: the real
//! Perfetto is only optimized in release builds).

use shmtrace_tests::scenario::{
    sibling_binary, ConsumerImpl, ProducerImpl, ProducerSpec, RealBinaries, ServiceImpl,
};
use shmtrace_tests::workload::{self, Workload};

const EVENTS_PER_ITERATION: u64 = ProducerSpec::TRACK_EVENTS_PER_ITERATION;

/// Command-line arguments.
#[derive(Debug, clap::Parser)]
#[command(
    about = "The real service and ours in pairs under the same real SDK workload: events kept, CPU, the ratio (see the module docs)"
)]
struct Args {
    /// Pairs of runs (real, then ours).
    #[arg(long, default_value_t = 3)]
    pairs: u64,
    /// Track events per run.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Producer threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    threads: u64,
    /// The producer's SMB size, KiB (0: the SDK's default).
    #[arg(long = "shmem-kb", default_value_t = 0)]
    shmem_kb: u64,
}

fn main() {
    let Args {
        pairs,
        events,
        threads,
        shmem_kb,
    } = clap::Parser::parse();
    let iterations = events.div_ceil(EVENTS_PER_ITERATION * threads);
    let spec = ProducerSpec {
        threads: threads as u32,
        iterations: iterations as u32,
        shmem_kb: shmem_kb as u32,
        ..Default::default()
    };
    let find = |name: &str| sibling_binary(name).unwrap_or_else(|e| panic!("{e}"));
    find("shmtrace");
    let bins = RealBinaries {
        service: find("real-service"),
        producer: find("real-producer"),
        consumer: find("real-consumer"),
    };
    let workload = Workload {
        producer: ProducerImpl::Real,
        spec,
        consumer: ConsumerImpl::Real,
        buffer_kb: 128 * 1024,
    };
    println!(
        "smb bench: {} events per run ({threads} real SDK threads x {iterations} iterations), \
         SMB {}, {pairs} pairs",
        iterations * threads * EVENTS_PER_ITERATION,
        if shmem_kb == 0 {
            "the SDK default (256 KiB)".to_string()
        } else {
            format!("{shmem_kb} KiB")
        }
    );
    let mut totals = [0u64; 2];
    for pair in 0..pairs {
        let order = if pair % 2 == 0 {
            [ServiceImpl::Real, ServiceImpl::Ours]
        } else {
            [ServiceImpl::Ours, ServiceImpl::Real]
        };
        let mut kept = [0u64; 2];
        for service in order {
            let run = workload::run(&bins, service, &workload).unwrap_or_else(|e| panic!("{e}"));
            let slot = usize::from(service == ServiceImpl::Ours);
            kept[slot] = run.kept;
            totals[slot] += run.kept;
            println!(
                "  pair {} {:<5} kept {:>9} of {} events ({:.1}%), service CPU {:.2} s, \
                 producer {:.2} s",
                pair + 1,
                if slot == 1 { "ours" } else { "real" },
                run.kept,
                run.emitted,
                100.0 * run.kept as f64 / run.emitted.max(1) as f64,
                run.service_cpu_startup + run.service_cpu(),
                run.producer_wall.as_secs_f64(),
            );
        }
        println!(
            "  pair {} ratio ours/real {:.3}",
            pair + 1,
            kept[1] as f64 / kept[0].max(1) as f64
        );
    }
    println!(
        "total: real kept {}, ours kept {}, ratio ours/real {:.3}",
        totals[0],
        totals[1],
        totals[1] as f64 / totals[0].max(1) as f64
    );
}
