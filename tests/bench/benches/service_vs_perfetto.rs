//! Our tracing service (`shmtrace serve`) vs the real Perfetto service
//! (the harness's `real-service`, built from the same vendored amalgamation
//! as the C SDK), in one run, on the same machine, under the same
//! workload: the CPU each spends per million track events, its peak
//! memory, and the events each trace kept.
//!
//! ```text
//! cargo build --release -p shmtrace-cli --bin shmtrace \
//!     -p shmtrace-tests --bin real-service --bin real-producer \
//!     -p shmtrace-producer --example interop_producer
//! cargo bench -p shmtrace-bench --bench service_vs_perfetto
//! ```
//!
//! The programs are found in the cargo target directory the benchmark was
//! built in (`release/` for `cargo bench`), or at
//! `$SHMTRACE_BENCH_SERVICE` (`real-service`),
//! `$SHMTRACE_BENCH_REAL_PRODUCER` (`real-producer`), `$SHMTRACE_BIN`
//! (`shmtrace`) and `$SHMTRACE_INTEROP_PRODUCER` (`interop_producer`);
//! without them it says what to build and exits. Build them in release:
//! the real Perfetto is only optimized there.
//!
//! A run (shmtrace-tests' `workload::run`): the service on private
//! sockets; `shmtrace record` (the same consumer for both) records one
//! session into a 256 MiB ring buffer, which holds every event; one
//! producer driver with a 32 MiB shared memory buffer (upstream's largest)
//! writes `$SHMTRACE_BENCH_EVENTS` track events (default 1,000,008) from 2
//! threads as fast as they go (9 events per iteration: 2 nested slices
//! and 3 instants with debug annotations, a flow, 2 counters); then the
//! session stops and the trace is read out. The service's CPU (all its
//! threads, to the nanosecond, from `/proc/PID/task/*/schedstat`) counts from
//! when it is ready until the consumer has the whole trace: taking the
//! chunks, the stop, the flush and the read-out. Its peak RSS is `VmHWM`
//! then (it includes the pages of the producer's shared memory the service
//! touched). Every run's trace must hold every emitted event, or the row
//! says how many it lost.
//!
//! Both producer drivers play the workload: the real Perfetto SDK
//! (`real-producer`) and ours (`interop_producer`, its twin). Each round
//! runs both services under both producers, the service order alternating
//! from pair to pair; `$SHMTRACE_BENCH_ROUNDS` rounds (default 3). Printed:
//! every run, then per producer min / median / max of each service's CPU
//! per million events and of the paired ratio ours / real (each pair's
//! ratio; the median of ratios, not the ratio of medians), and of peak RSS.
//! Nothing is asserted.

// Only `test_mode` is used here.
#[allow(dead_code, unused_macros)]
mod common;

use std::path::{Path, PathBuf};

use shmtrace_tests::scenario::{
    built_binary, shmtrace_binary, ConsumerImpl, ProducerImpl, ProducerSpec, RealBinaries,
    ServiceImpl,
};
use shmtrace_tests::workload::{self, Run, Workload};

/// Producer threads.
const THREADS: u32 = 2;
/// The producers' shared memory buffer, KiB: upstream's largest
/// (`kMaxShmSize` in src/tracing/service/tracing_service_impl.cc).
const SMB_KB: u32 = 32 * 1024;
/// The session's ring buffer, KiB: holds 1 M events several times over.
const BUFFER_KB: u32 = 256 * 1024;

fn main() {
    if common::test_mode() {
        return;
    }
    let Some(bins) = binaries() else {
        return;
    };
    let events = env_u64("SHMTRACE_BENCH_EVENTS", 1_000_008);
    let rounds = env_u64("SHMTRACE_BENCH_ROUNDS", 3).max(1);
    let per_iteration = ProducerSpec::TRACK_EVENTS_PER_ITERATION * u64::from(THREADS);
    let iterations = u32::try_from(events.div_ceil(per_iteration)).expect("too many events");
    let spec = ProducerSpec {
        threads: THREADS,
        iterations,
        shmem_kb: SMB_KB,
        ..Default::default()
    };
    println!(
        "service_vs_perfetto: {} track events per run ({THREADS} threads x {iterations} \
         iterations), SMB {} MiB, ring buffer {} MiB, consumer shmtrace record, {rounds} rounds",
        u64::from(iterations) * per_iteration,
        SMB_KB / 1024,
        BUFFER_KB / 1024
    );

    let producers = [
        (ProducerImpl::Real, "the real SDK (real-producer)"),
        (ProducerImpl::Ours, "ours (interop_producer)"),
    ];
    // runs[producer][round] = [real, ours]
    let mut runs: Vec<Vec<[Run; 2]>> = vec![Vec::new(); producers.len()];
    let mut pair = 0;
    for round in 0..rounds {
        for (p, &(producer, name)) in producers.iter().enumerate() {
            let work = Workload {
                producer,
                spec,
                consumer: ConsumerImpl::OurCli,
                buffer_kb: BUFFER_KB,
            };
            let order = if pair % 2 == 0 {
                [ServiceImpl::Real, ServiceImpl::Ours]
            } else {
                [ServiceImpl::Ours, ServiceImpl::Real]
            };
            pair += 1;
            let mut both = [None, None];
            for service in order {
                let run = workload::run(&bins, service, &work).unwrap_or_else(|e| panic!("{e}"));
                let slot = usize::from(service == ServiceImpl::Ours);
                print_run(round, name, slot, &run);
                both[slot] = Some(run);
            }
            runs[p].push(both.map(|r| r.expect("both services ran")));
        }
    }

    for (p, &(_, name)) in producers.iter().enumerate() {
        let rows = &runs[p];
        println!("\nproducer {name}, {} rounds:", rows.len());
        println!("{:<36} {:>9} {:>9} {:>9}", "", "min", "median", "max");
        let row = |label: &str, values: Vec<f64>, digits: usize| {
            let [min, median, max] = spread(values);
            println!("{label:<36} {min:>9.digits$} {median:>9.digits$} {max:>9.digits$}");
        };
        let measures: [Measure; 2] = [
            ("CPU s / M events", "CPU", cpu_per_million, 3),
            ("peak RSS, MiB", "peak RSS", mib, 1),
        ];
        for (what, short, measure, digits) in measures {
            let of = |slot: usize| rows.iter().map(|r| measure(&r[slot])).collect();
            row(&format!("real service {what}"), of(0), digits);
            row(&format!("our service {what}"), of(1), digits);
            let ratios = rows.iter().map(|r| measure(&r[1]) / measure(&r[0]));
            row(
                &format!("{short} ours / real (paired)"),
                ratios.collect(),
                3,
            );
        }
        let lost = |slot: usize| -> u64 {
            rows.iter()
                .map(|r| r[slot].emitted.saturating_sub(r[slot].kept))
                .sum()
        };
        println!(
            "events lost: real service {}, ours {} (of {} each)",
            lost(0),
            lost(1),
            rows.iter().map(|r| r[0].emitted).sum::<u64>()
        );
    }
}

/// A summary row's measure: what it is, its short name (in the ratio's
/// row), its value for one run, and the decimals shown.
type Measure = (&'static str, &'static str, fn(&Run) -> f64, usize);

/// The programs the runs start, or `None` (said why) if one is not built.
fn binaries() -> Option<RealBinaries> {
    let build = "cargo build --release -p shmtrace-cli --bin shmtrace -p shmtrace-tests --bin \
                 real-service --bin real-producer -p shmtrace-producer --example interop_producer";
    let found = [
        built_binary(
            "SHMTRACE_BENCH_SERVICE",
            Path::new("real-service"),
            "the real service",
            build,
        ),
        built_binary(
            "SHMTRACE_BENCH_REAL_PRODUCER",
            Path::new("real-producer"),
            "the real SDK producer",
            build,
        ),
        shmtrace_binary(),
        shmtrace_tests::scenario::our_producer_binary(),
    ];
    let mut paths = Vec::new();
    for f in found {
        match f {
            Ok(path) => paths.push(path),
            Err(e) => {
                println!("service_vs_perfetto: skipped: {e}");
                return None;
            }
        }
    }
    let service: PathBuf = paths.swap_remove(0);
    Some(RealBinaries {
        // `shmtrace record` records: the real consumer is not started.
        consumer: service.with_file_name("real-consumer"),
        producer: paths.swap_remove(0),
        service,
    })
}

fn print_run(round: u64, producer: &str, slot: usize, run: &Run) {
    let lost = run.emitted.saturating_sub(run.kept);
    println!(
        "  round {} producer {producer:<30} service {:<4}: kept {}/{}{} in {:.2} s, service \
         CPU {:.3} s (writing {:.3} + reading {:.3}) = {:.3} s/M events, peak RSS {:.1} MiB",
        round + 1,
        if slot == 1 { "ours" } else { "real" },
        run.kept,
        run.emitted,
        if lost > 0 {
            format!(" (LOST {lost})")
        } else {
            String::new()
        },
        run.producer_wall.as_secs_f64(),
        run.service_cpu(),
        run.service_cpu_writing,
        run.service_cpu_reading,
        cpu_per_million(run),
        mib(run),
    );
}

/// Service CPU seconds per million emitted events.
fn cpu_per_million(run: &Run) -> f64 {
    run.service_cpu() * 1e6 / run.emitted.max(1) as f64
}

fn mib(run: &Run) -> f64 {
    run.service_peak_rss_kib as f64 / 1024.0
}

/// Min, median (the lower of the middle two of an even count) and max.
fn spread(mut values: Vec<f64>) -> [f64; 3] {
    values.sort_by(f64::total_cmp);
    [
        values[0],
        values[(values.len() - 1) / 2],
        values[values.len() - 1],
    ]
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
