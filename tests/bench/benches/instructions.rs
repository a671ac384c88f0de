//! The rows of `vs_rust_tracers`, one phase each, for counting instructions
//! per event under callgrind: on a shared machine wall-clock numbers swing
//! twofold from run to run, instruction counts do not.
//!
//! ```text
//! RUSTFLAGS="--cfg rustix_use_libc" CARGO_TARGET_DIR=target/callgrind \
//!     cargo bench -p shmtrace-bench --bench instructions --no-run
//! SHMTRACE_BENCH_SERVICE=path/to/real-service valgrind --tool=callgrind \
//!     --toggle-collect='instructions::phase_layer_event' \
//!     target/callgrind/release/deps/instructions-<hash>
//! callgrind_annotate --inclusive=yes callgrind.out.<pid>
//! ```
//!
//! * Every phase is a function of its own (`phase_*`), run once for
//!   warm-up and once for `$INSTRUCTIONS_N` events (default 20,000):
//!   `--toggle-collect` on one phase counts only it, and its total over
//!   `N + 100` is the cost per event (the loop included).
//! * `--cfg rustix_use_libc`: rustix's own vDSO lookup reads memory
//!   valgrind does not map (bytecodealliance/rustix#1559); through libc the
//!   clock works under valgrind.
//! * Under valgrind the producer's clock finds no usable TSC (its
//!   calibration pairs take too long) and reads `clock_gettime`: about 40
//!   instructions per event more than the TSC path.
//! * Without valgrind it prints each phase's CPU ns per event (a check
//!   that it runs, not a benchmark: see `vs_rust_tracers`).
//!
//! The service and session as for `vs_rust_tracers`.

// Only the service, session and CPU clock helpers: not the timed rounds.
#[allow(dead_code, unused_macros)]
mod common;
mod floor;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use floor::Floor;
use shmtrace_producer::{trace_event, trace_instant, Category, TracingLayer};
use tracing::Dispatch;
use tracing_subscriber::prelude::*;

static RS_ON: Category = Category::new("bench.rs");
static SINK: AtomicBool = AtomicBool::new(false);

/// Events of a warm-up run.
const WARM_UP: u64 = 100;

#[inline(never)]
fn phase_layer_event(n: u64) {
    for i in 0..n {
        tracing::info!(count = i, label = "value", "event");
    }
}

/// A wide event: the event's 2 fields, 9 more and a 43-byte literal
/// message, a packet of more than 127 bytes (its nested lengths do not fit
/// one byte).
#[inline(never)]
fn phase_layer_event_wide(n: u64) {
    for i in 0..n {
        tracing::info!(
            count = i,
            label = "value",
            index = i + 1,
            kind = "wide",
            ok = true,
            total = i * 3,
            unit = "bytes",
            ratio = 0.5,
            seq = i,
            source = "bench",
            delta = -10i64,
            "a literal message of forty-three bytes here"
        );
    }
}

/// An event whose message has an argument: a `Debug` value (the
/// message's `fmt::Arguments`) formatted into the packet.
#[inline(never)]
fn phase_layer_event_fmt(n: u64) {
    for i in 0..n {
        tracing::info!(count = i, label = "value", "event {i}");
    }
}

#[inline(never)]
fn phase_layer_span(n: u64) {
    for _ in 0..n {
        let _g = tracing::info_span!("span").entered();
    }
}

#[inline(never)]
fn phase_layer_span2(n: u64) {
    for i in 0..n {
        let _g = tracing::info_span!("span", count = i, label = "value").entered();
    }
}

// The same three under the bare registry: the base each row is measured
// against (`phase_layer_*` minus `phase_bare_*` is what our layer adds).

#[inline(never)]
fn phase_bare_event(n: u64) {
    for i in 0..n {
        tracing::info!(count = i, label = "value", "event");
    }
}

#[inline(never)]
fn phase_bare_span(n: u64) {
    for _ in 0..n {
        let _g = tracing::info_span!("span").entered();
    }
}

#[inline(never)]
fn phase_bare_span2(n: u64) {
    for i in 0..n {
        let _g = tracing::info_span!("span", count = i, label = "value").entered();
    }
}

// The event and the span under the floor layer (`floor/mod.rs`): the least
// a layer recording them adds (`phase_floor_*` minus `phase_bare_*`).

#[inline(never)]
fn phase_floor_event(n: u64) {
    for i in 0..n {
        tracing::info!(count = i, label = "value", "event");
    }
}

#[inline(never)]
fn phase_floor_span(n: u64) {
    for _ in 0..n {
        let _g = tracing::info_span!("span").entered();
    }
}

/// What the layer writes for an event, through the native API.
#[inline(never)]
fn phase_native_instant(n: u64) {
    for i in 0..n {
        trace_instant!(
            RS_ON,
            "event",
            "level" => "INFO",
            "message" => "event",
            "count" => i,
            "label" => "value"
        );
    }
}

/// What the layer writes for the wide event, through the native API.
#[inline(never)]
fn phase_native_instant_wide(n: u64) {
    for i in 0..n {
        trace_instant!(
            RS_ON,
            "event",
            "level" => "INFO",
            "message" => "a literal message of forty-three bytes here",
            "count" => i,
            "label" => "value",
            "index" => i + 1,
            "kind" => "wide",
            "ok" => true,
            "total" => i * 3,
            "unit" => "bytes",
            "ratio" => 0.5,
            "seq" => i,
            "source" => "bench",
            "delta" => -10i64
        );
    }
}

/// A native scoped slice (begin + end).
#[inline(never)]
fn phase_native_slice(n: u64) {
    for _ in 0..n {
        let _g = trace_event!(RS_ON, "span");
        SINK.store(true, Ordering::Relaxed);
    }
}

/// Runs `phase` for warm-up, then for `n` events, and prints its CPU ns
/// per event.
fn run(name: &str, n: u64, dispatch: Option<&Dispatch>, phase: fn(u64)) {
    let timed = || {
        phase(WARM_UP);
        // Let the service drain the buffer in between.
        std::thread::sleep(Duration::from_millis(100));
        let start = common::cpu_ns();
        phase(n);
        (common::cpu_ns() - start) as f64 / n as f64
    };
    let ns = match dispatch {
        Some(d) => tracing::dispatcher::with_default(d, timed),
        None => timed(),
    };
    println!("{name:<20} {ns:>8.1} ns");
}

fn main() {
    if common::test_mode() {
        return;
    }
    let n = std::env::var("INSTRUCTIONS_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let Some(_service) = common::start_service("instructions") else {
        return;
    };
    // The C SDK only starts the session (its consumer).
    common::init_c_sdk(32 * 1024);
    // Valgrind is slow to connect.
    common::start_producer(
        "instructions",
        32 * 1024,
        &[&RS_ON],
        Duration::from_secs(60),
    );
    // "instructions": the target of this file's events.
    let session = common::start_session(&["bench.rs", "instructions"]);
    common::wait_until("the session did not enable our category", || {
        RS_ON.is_enabled()
    });
    let ours = Dispatch::new(tracing_subscriber::registry().with(TracingLayer::new()));
    let bare = Dispatch::new(tracing_subscriber::registry());
    run("layer event", n, Some(&ours), phase_layer_event);
    run("layer event wide", n, Some(&ours), phase_layer_event_wide);
    run("layer event fmt", n, Some(&ours), phase_layer_event_fmt);
    run("layer span", n, Some(&ours), phase_layer_span);
    run("layer span2", n, Some(&ours), phase_layer_span2);
    run("bare event", n, Some(&bare), phase_bare_event);
    run("bare span", n, Some(&bare), phase_bare_span);
    run("bare span2", n, Some(&bare), phase_bare_span2);
    let floor = Dispatch::new(tracing_subscriber::registry().with(Floor));
    run("floor event", n, Some(&floor), phase_floor_event);
    run("floor span", n, Some(&floor), phase_floor_span);
    run("native instant", n, None, phase_native_instant);
    run("native instant wide", n, None, phase_native_instant_wide);
    run("native slice", n, None, phase_native_slice);
    common::stop_session(session);
    let stats = shmtrace_producer::stats();
    println!(
        "{n} events per phase; our producer: {} packets dropped, {} chunks committed",
        stats.packets_dropped, stats.chunks_committed
    );
}
