//! The smallest track event program: one category, a scoped slice with a
//! debug annotation, an instant, recorded from the first line of `main`.
//!
//! Start a tracing service and a session that enables track events (e.g.
//! `shmtrace serve` and `shmtrace record`), then:
//!
//! ```text
//! PERFETTO_PRODUCER_SOCK_NAME=/tmp/perfetto-producer cargo run -p shmtrace-producer --example hello
//! ```
//!
//! Its events are kept in a local buffer until the session takes them
//! (startup tracing), and it waits at most 2 s for the service and a
//! session before it exits.

use std::time::Duration;

use shmtrace_producer::{
    trace_event, trace_instant, track_event, Category, ProducerConfig, StartupTracing,
};

static RENDERING: Category =
    Category::new("rendering").with_description("Events from the graphics subsystem");

fn draw_player(number: u32) {
    let _slice = trace_event!(RENDERING, "DrawPlayer", "player_number" => number);
    trace_instant!(RENDERING, "PlayerDrawn");
}

fn main() {
    // Events are recorded from here on: until a session reaches the app
    // they wait in a local buffer (1 MiB, 10 s at most).
    let config = ProducerConfig {
        startup_tracing: Some(StartupTracing::default()),
        ..ProducerConfig::default()
    };
    let producer = shmtrace_producer::init(config).expect("start the producer");
    track_event::register_categories(&[&RENDERING]);
    for player in 1..=3 {
        draw_player(player);
    }
    // Up to 2 s for the service and a running session to take them; the
    // program runs on either way.
    println!("{}", producer.wait_for_session(Duration::from_secs(2)));
    // Hand the data to the service before exiting.
    shmtrace_producer::flush_all();
}
