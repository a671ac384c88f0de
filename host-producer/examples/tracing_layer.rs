//! A program instrumented with `tracing` (and `log`), recorded through
//! shmtrace-producer's `TracingLayer` (and `TraceLogger`): spans become
//! slices, events instants, fields debug annotations, targets categories.
//!
//! Start a tracing service and a session that enables track events (e.g.
//! `shmtrace serve` and `shmtrace record`), then:
//!
//! ```text
//! PERFETTO_PRODUCER_SOCK_NAME=/tmp/perfetto-producer \
//!     cargo run -p shmtrace-producer --features tracing,log --example tracing_layer
//! ```

use std::time::{Duration, Instant};

use shmtrace_producer::{track_event, ProducerConfig, TracingLayer};
use tracing_subscriber::layer::SubscriberExt as _;

#[tracing::instrument(target = "example::render")]
fn draw_player(number: u32) {
    tracing::info!(target: "example::render", visible = true, "drawn");
}

fn main() {
    shmtrace_producer::init(ProducerConfig::default()).expect("start the producer");
    // Every span and event of every target (each target is a category
    // sessions can enable or disable).
    // `set_global_default`: `SubscriberInitExt::init` with
    // tracing-subscriber's default features would also take the `log`
    // logger (for `tracing-log`), and `logger::init` would then fail.
    let subscriber = tracing_subscriber::registry().with(TracingLayer::new());
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    // `log` records too (the category is the record's target).
    shmtrace_producer::logger::init(log::LevelFilter::Info).expect(
        "no other log logger: SubscriberInitExt::init would install one; use set_global_default",
    );

    // Tracing is off until a session enables track events; the program
    // runs either way.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !track_event::is_enabled() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("tracing: {}", track_event::is_enabled());

    let frame =
        tracing::info_span!(target: "example", "frame", number = 1, fps = tracing::field::Empty);
    {
        let _entered = frame.enter();
        for player in 1..=3 {
            draw_player(player);
        }
        frame.record("fps", 59.9);
    }
    log::warn!(target: "example::net", "slow reply from {}", "10.0.0.1");
    // Hand the data to the service before exiting.
    shmtrace_producer::flush_all();
}
