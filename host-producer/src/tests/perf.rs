//! Quick in-process timing of the hot path (no IPC; the loopback pump
//! drains chunks). Ignored by default: `cargo test --release -p
//! shmtrace-producer --lib hot_path_timing -- --ignored --nocapture`. The
//! real benchmark (against the C SDK, through a service) is in `benches/`.

use shmtrace_abi::layout::PageLayout;

use super::loopback::{serial, Loopback};
use crate::runtime::runtime;
use crate::track_event::filter::TrackEventConfig;
use crate::{trace_counter, trace_event, trace_instant, track_event, Category, CounterTrack};

static P_ON: Category = Category::new("perf.on");
static P_OFF: Category = Category::new("perf.off");

/// CPU time of the calling thread (not disturbed by other processes).
fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Median over 7 rounds of `n` calls; the SMB is emptied between rounds
/// (outside the timed part), so no other thread runs meanwhile. With
/// `SHMTRACE_PERF_ONLY` set, only the rows whose label contains it run (to
/// profile one kind of event); with `SHMTRACE_PERF_ROUNDS` set, each
/// round's time is printed too (the machine's fast and slow phases show).
fn time(lb: &Loopback, label: &str, n: u64, mut f: impl FnMut(u64)) {
    if std::env::var("SHMTRACE_PERF_ONLY").is_ok_and(|only| !label.contains(&only)) {
        return;
    }
    let mut samples: Vec<f64> = (0..7)
        .map(|_| {
            runtime().flush(&[], 0);
            lb.discard();
            let start = cpu_ns();
            for i in 0..n {
                f(i);
            }
            (cpu_ns() - start) as f64 / n as f64
        })
        .collect();
    if std::env::var_os("SHMTRACE_PERF_ROUNDS").is_some() {
        eprintln!(
            "{label}: {:?}",
            samples
                .iter()
                .map(|x| (x * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        );
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    eprintln!(
        "{label:<40} {:8.1} ns/event (min {:.1})",
        samples[3], samples[0]
    );
}

#[test]
#[ignore = "timing, run by hand"]
fn hot_path_timing() {
    let _s = serial();
    track_event::register_categories(&[&P_ON, &P_OFF]);
    // `SHMTRACE_PERF_SMB` (bytes): a buffer too small for a round times
    // the cost of dropping (the loopback does not drain while timing).
    let smb_bytes = std::env::var("SHMTRACE_PERF_SMB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32 << 20);
    let lb = Loopback::manual(smb_bytes, PageLayout::Div1);
    let cfg = TrackEventConfig {
        disabled_categories: vec!["perf.off".into()],
        ..Default::default()
    };
    lb.start_track_event(401, 1, cfg);
    let counter = CounterTrack::new("perf.counter");
    // Fewer iterations for instruction counting under valgrind.
    let n = std::env::var("SHMTRACE_PERF_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    for _ in 0..2 {
        time(&lb, "Timestamp::now()", n, |_| {
            std::hint::black_box(crate::Timestamp::now());
        });
        time(&lb, "disabled instant", n, |_| trace_instant!(P_OFF, "x"));
        time(&lb, "scoped slice (2 events)", n, |_| {
            let _g = trace_event!(P_ON, "slice");
        });
        time(&lb, "slice + 2 args (2 events)", n, |i| {
            let _g = trace_event!(P_ON, "slice", "a" => i, "b" => "str");
        });
        time(&lb, "counter", n, |i| {
            trace_counter!(P_ON, &counter, i as i64)
        });
        time(&lb, "instant", n, |_| trace_instant!(P_ON, "i"));
    }
    runtime().stop_data_source(401);
    lb.shutdown();
}
