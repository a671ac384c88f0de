//! Counters: integer and floating-point samples on counter tracks, with a
//! unit and a multiplier, and explicit timestamps.
//!
//! ```text
//! PERFETTO_PRODUCER_SOCK_NAME=/tmp/perfetto-producer cargo run -p shmtrace-producer --example counters
//! ```

use std::time::Duration;

use shmtrace_producer::{
    trace_counter, track_event, Category, CounterTrack, CounterUnit, ProducerConfig, Timestamp,
};

static METRICS: Category = Category::new("metrics").with_description("Process metrics");

fn main() {
    shmtrace_producer::init(ProducerConfig::default()).expect("start the producer");
    track_event::register_categories(&[&METRICS]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !METRICS.is_enabled() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }

    // Samples in KiB, shown in bytes.
    let memory = CounterTrack::new("Memory")
        .with_unit(CounterUnit::SizeBytes)
        .with_multiplier(1024);
    let fps = CounterTrack::new("Framerate").with_unit_name("fps");
    for frame in 0..60i64 {
        trace_counter!(METRICS, &memory, 4096 + frame * 16);
        trace_counter!(METRICS, &fps, 59.0 + (frame % 3) as f64 * 0.5);
        std::thread::sleep(Duration::from_millis(5));
    }
    // A counter named inline, on the process track.
    trace_counter!(METRICS, "frames", 60);
    // An explicit timestamp: the time the value was measured, taken before
    // the (possibly slow) measurement finished. Timestamps earlier than
    // the sequence's previous event are legal too, but readers then have
    // to sort.
    let measured_at = Timestamp::now();
    let value = 12.5;
    METRICS.counter(&fps, value).timestamp(measured_at).emit();

    shmtrace_producer::flush_all();
}
