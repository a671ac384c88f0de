//! The smallest track event program: one category, a scoped slice with a
//! debug annotation, an instant.
//!
//! Start a tracing service and a session that enables track events (e.g.
//! `perfetto` with a `track_event` data source), then:
//!
//! ```text
//! PERFETTO_PRODUCER_SOCK_NAME=/tmp/perfetto-producer cargo run -p shmtrace-producer --example hello
//! ```

use std::time::Duration;

use shmtrace_producer::{trace_event, trace_instant, track_event, Category, ProducerConfig};

static RENDERING: Category =
    Category::new("rendering").with_description("Events from the graphics subsystem");

fn draw_player(number: u32) {
    let _slice = trace_event!(RENDERING, "DrawPlayer", "player_number" => number);
    trace_instant!(RENDERING, "PlayerDrawn");
}

fn main() {
    let producer = shmtrace_producer::init(ProducerConfig::default()).expect("start the producer");
    track_event::register_categories(&[&RENDERING]);
    // Tracing is off until a session enables the category; the program runs
    // either way.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !RENDERING.is_enabled() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "connected: {}, tracing: {}",
        producer.is_connected(),
        RENDERING.is_enabled()
    );
    for player in 1..=3 {
        draw_player(player);
    }
    // Hand the data to the service before exiting.
    shmtrace_producer::flush_all();
}
