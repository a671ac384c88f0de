//! shmtrace-producer side by side with the Rust tracers, in one run: the
//! same workload, on the same machine, interleaved round by round.
//!
//! ```text
//! SHMTRACE_BENCH_SERVICE=path/to/real-service cargo bench -p shmtrace-bench --bench vs_rust_tracers
//! ```
//!
//! (The service as for `vs_perfetto`: `$SHMTRACE_BENCH_SERVICE`, or one
//! already listening on `$PERFETTO_PRODUCER_SOCK_NAME` /
//! `$PERFETTO_CONSUMER_SOCK_NAME`; without either it says so and exits.
//! With `$SHMTRACE_BENCH_TRACE` set, the session's trace is written to
//! that file, so `shmtrace inspect` can show that our spans and events
//! were recorded.)
//!
//! Two tables; every cell is the median CPU ns of several rounds, nothing
//! is asserted:
//!
//! * **Native APIs, one span or zone** (begin + end, static name): our
//!   scoped slice (`trace_event!`), recorded through the service by a
//!   session enabling its category; `tracy-client`'s `span!` (recorded in
//!   Tracy's memory queue: no profiler is connected); `fastrace`'s
//!   `LocalSpan` under a root span, collected and handed to a reporter
//!   that discards them (a root per 1,000 spans, its cost included:
//!   fastrace keeps at most 10,240 local spans per root). Ratios: ours /
//!   each.
//! * **`tracing` layers**, each over its own `tracing_subscriber::registry()`
//!   (a `Dispatch` set as the thread's default while it runs): span
//!   enter+exit, a span with 2 fields, an event with 2 fields, for the bare
//!   registry and with our `TracingLayer` (recorded through the service:
//!   the session enables this file's target), `tracing-tracy`,
//!   `tracing-chrome` (JSON into a file) and `tracing-perfetto` (protobuf
//!   into a file, fields as debug annotations). The registry's own span
//!   bookkeeping is a floor no layer gets under, so each layer is also
//!   shown by what it adds over the bare registry in the same run, and
//!   ours by that share over the cheapest other layer's. The `floor` layer
//!   (`floor/mod.rs`) only reads a clock on span enter and exit and per
//!   event and visits the fields, as every layer recording them must: its
//!   share is the least any layer's can be.
//! * **The same events, native**: what our layer writes for each row (a
//!   slice with its `level` annotation and fields, an instant with level,
//!   message and fields), written through our native API: the floor under
//!   our layer's added cost, the rest being its bookkeeping.

#[macro_use]
mod common;
mod floor;

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use fastrace::collector::{Config, Reporter, SpanContext};
use fastrace::local::LocalSpan;
use fastrace::prelude::{Span, SpanRecord};
use floor::Floor;
use shmtrace_producer::{trace_event, trace_instant, Category, TracingLayer};
use tracing::Dispatch;
use tracing_subscriber::prelude::*;

static RS_ON: Category = Category::new("bench.rs");

/// Shared memory buffer our producer asks for: large enough not to drop.
const SMB_KB: u32 = 32 * 1024;
/// fastrace local spans per root span.
const SPANS_PER_ROOT: u64 = 1_000;

/// A fastrace reporter that drops what it is handed (the spans were
/// collected: that is the work measured).
struct Discard;

impl Reporter for Discard {
    fn report(&mut self, spans: Vec<SpanRecord>) {
        drop(spans);
    }
}

/// Index of the [`Floor`] layer in [`layers`]' list (after the bare
/// registry).
const FLOOR: usize = 1;
/// Index of our layer in [`layers`]' list (the other layers follow it).
const OURS: usize = 2;

/// The `tracing` subscribers compared: the bare registry first, then
/// the [`Floor`] layer, ours ([`OURS`]) and the other layers, each over a registry of
/// its own. The files the writing layers write into live in `dir`; the
/// guard flushes tracing-chrome's at the end.
fn layers(dir: &std::path::Path) -> ([(&'static str, Dispatch); 6], impl Drop) {
    let (chrome, chrome_guard) = tracing_chrome::ChromeLayerBuilder::new()
        .file(dir.join("chrome.json"))
        .include_args(true)
        .build();
    let perfetto_file = File::create(dir.join("tracing-perfetto.pftrace")).expect("a trace file");
    let perfetto = tracing_perfetto::PerfettoLayer::new(Mutex::new(perfetto_file))
        .with_debug_annotations(true);
    (
        [
            ("registry", Dispatch::new(tracing_subscriber::registry())),
            (
                "floor",
                Dispatch::new(tracing_subscriber::registry().with(Floor)),
            ),
            (
                "shmtrace",
                Dispatch::new(tracing_subscriber::registry().with(TracingLayer::new())),
            ),
            (
                "tracing-tracy",
                Dispatch::new(
                    tracing_subscriber::registry().with(tracing_tracy::TracyLayer::default()),
                ),
            ),
            (
                "tracing-chrome",
                Dispatch::new(tracing_subscriber::registry().with(chrome)),
            ),
            (
                "tracing-perfetto",
                Dispatch::new(tracing_subscriber::registry().with(perfetto)),
            ),
        ],
        chrome_guard,
    )
}

/// A [`common::Sampler`] running `$body` with `$dispatch` as the thread's
/// default subscriber.
macro_rules! layer_sampler {
    ($dispatch:expr, |$i:ident| $body:expr) => {{
        let dispatch = $dispatch;
        Box::new(move || {
            tracing::dispatcher::with_default(dispatch, || {
                let start = common::cpu_ns();
                for $i in 0..common::ITERATIONS {
                    $body;
                }
                (common::cpu_ns() - start) as f64 / common::ITERATIONS as f64
            })
        }) as common::Sampler<'_>
    }};
}

fn main() {
    if common::test_mode() {
        return;
    }
    let Some(_service) = common::start_service("vs_rust_tracers") else {
        return;
    };
    // The C SDK only starts the session (its consumer).
    common::init_c_sdk(SMB_KB);
    common::start_producer(
        "vs_rust_tracers",
        SMB_KB,
        &[&RS_ON],
        Duration::from_secs(10),
    );
    // "vs_rust_tracers": the target (module path) of this file's `tracing`
    // spans and events, which our layer maps to a category.
    let session = common::start_session(&["bench.rs", "vs_rust_tracers"]);
    common::wait_until("the session did not enable our category", || {
        RS_ON.is_enabled()
    });
    let _tracy = tracy_client::Client::start();
    fastrace::set_reporter(Discard, Config::default());

    let sink = AtomicBool::new(false);
    let [ours, tracy, fast] = common::measure([
        sampler!(|_i| {
            let _g = trace_event!(RS_ON, "span");
            sink.store(true, Ordering::Relaxed);
        }),
        sampler!(|_i| {
            let _z = tracy_client::span!("span");
            sink.store(true, Ordering::Relaxed);
        }),
        Box::new(|| {
            let start = common::cpu_ns();
            for _ in 0..common::ITERATIONS / SPANS_PER_ROOT {
                let root = Span::root("root", SpanContext::random());
                let _parent = root.set_local_parent();
                for _ in 0..SPANS_PER_ROOT {
                    let _s = LocalSpan::enter_with_local_parent("span");
                    sink.store(true, Ordering::Relaxed);
                }
            }
            (common::cpu_ns() - start) as f64 / common::ITERATIONS as f64
        }) as common::Sampler<'_>,
    ]);
    fastrace::flush();
    // What our layer writes per row, written through the native API: its
    // floor (the layer adds its bookkeeping to this).
    let [floor_span, floor_span2, floor_event] = common::measure([
        sampler!(|_i| {
            let _g = trace_event!(RS_ON, "span", "level" => "INFO");
            sink.store(true, Ordering::Relaxed);
        }),
        sampler!(|i| {
            let _g =
                trace_event!(RS_ON, "span", "level" => "INFO", "count" => i, "label" => "value");
            sink.store(true, Ordering::Relaxed);
        }),
        sampler!(|i| trace_instant!(
            RS_ON,
            "event",
            "level" => "INFO",
            "message" => "event",
            "count" => i,
            "label" => "value"
        )),
    ]);

    let dir = std::env::temp_dir().join(format!("shmtrace-bench-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the layers' files");
    let (subscribers, guard) = layers(&dir);
    let rows: [(&str, Vec<f64>); 3] = [
        (
            "span enter+exit",
            common::measure(subscribers.each_ref().map(|(_, d)| {
                layer_sampler!(d, |_i| {
                    let _g = tracing::info_span!("span").entered();
                })
            }))
            .to_vec(),
        ),
        (
            "span, 2 fields",
            common::measure(subscribers.each_ref().map(|(_, d)| {
                layer_sampler!(d, |i| {
                    let _g = tracing::info_span!("span", count = i, label = "value").entered();
                })
            }))
            .to_vec(),
        ),
        (
            "event, 2 fields",
            common::measure(subscribers.each_ref().map(|(_, d)| {
                layer_sampler!(d, |i| tracing::info!(count = i, label = "value", "event"))
            }))
            .to_vec(),
        ),
    ];
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
    common::stop_session(session);
    let stats = shmtrace_producer::stats();

    println!();
    println!(
        "{:<28} {:>10} {:>13} {:>10} {:>13} {:>15}",
        "ns per span (median)",
        "shmtrace",
        "tracy-client",
        "fastrace",
        "ours/tracy",
        "ours/fastrace"
    );
    println!(
        "{:<28} {ours:>10.2} {tracy:>13.2} {fast:>10.2} {:>13.3} {:>15.3}",
        "scoped slice / zone / span",
        ours / tracy,
        ours / fast
    );

    println!();
    println!(
        "{:<28} {:>17} {:>17} {:>17}",
        "the same events, native", "span enter+exit", "span, 2 fields", "event, 2 fields"
    );
    println!(
        "{:<28} {floor_span:>17.2} {floor_span2:>17.2} {floor_event:>17.2}",
        "ns (median)"
    );

    println!();
    print!("{:<28}", "tracing, ns (median)");
    for (name, _) in &subscribers {
        print!(" {name:>17}");
    }
    println!();
    for (label, cells) in &rows {
        print!("{label:<28}");
        for ns in cells {
            print!(" {ns:>17.2}");
        }
        println!();
    }
    println!();
    print!("{:<28}", "added over the registry, ns");
    for (name, _) in &subscribers[1..] {
        print!(" {name:>17}");
    }
    println!();
    for (label, cells) in &rows {
        print!("{label:<28}");
        for ns in &cells[1..] {
            print!(" {:>17.2}", ns - cells[0]);
        }
        println!();
    }
    println!();
    println!(
        "{:<28} {:>17} {:>17}",
        "added / cheapest other added", "ours (goal <=0.25)", "floor"
    );
    for (label, cells) in &rows {
        let added = |i: usize| cells[i] - cells[0];
        let cheapest = (OURS + 1..cells.len())
            .map(added)
            .fold(f64::INFINITY, f64::min);
        println!(
            "{label:<28} {:>17.3} {:>17.3}",
            added(OURS) / cheapest,
            added(FLOOR) / cheapest
        );
    }
    println!(
        "\n{} iterations x {} rounds per cell; shared memory buffer {SMB_KB} KiB; our producer: \
         {} packets dropped, {} chunks committed",
        common::ITERATIONS,
        common::ROUNDS,
        stats.packets_dropped,
        stats.chunks_committed
    );
}
