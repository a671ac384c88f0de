//! A long-running program: emits a heartbeat slice every 10 ms for as long
//! as it runs, and reports on stdout (JSON lines) when the connection to
//! the service and tracing go up or down. Start and stop services and
//! sessions around it: it keeps running with tracing off while there is no
//! service, and reconnects when one comes back.
//!
//! ```text
//! PERFETTO_PRODUCER_SOCK_NAME=/tmp/perfetto-producer cargo run -p shmtrace-producer --example heartbeat -- [--seconds N]
//! ```

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shmtrace_producer::{
    trace_event, track_event, Category, InstanceArgs, ProducerConfig, TrackEventSessionObserver,
};

static HEARTBEAT: Category = Category::new("heartbeat").with_description("One slice every 10 ms");

/// Prints session starts and stops as they happen.
struct Observer;

impl TrackEventSessionObserver for Observer {
    fn on_start(&self, args: &InstanceArgs<'_>) {
        line(&format!(
            "{{\"event\":\"session_start\",\"instance\":{},\"tracing_session_id\":{}}}",
            args.instance_id, args.config.tracing_session_id
        ));
    }
    fn on_stop(&self, args: &InstanceArgs<'_>) {
        line(&format!(
            "{{\"event\":\"session_stop\",\"instance\":{}}}",
            args.instance_id
        ));
    }
}

fn line(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}");
    let _ = out.flush();
}

fn main() {
    let seconds: u64 = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    let producer = shmtrace_producer::init(ProducerConfig {
        name: "heartbeat".into(),
        ..Default::default()
    })
    .expect("start the producer");
    track_event::register_categories(&[&HEARTBEAT]);
    track_event::add_session_observer(Arc::new(Observer));
    let end = Instant::now().checked_add(Duration::from_secs(seconds));
    let mut connected = false;
    let mut beats: u64 = 0;
    while end.is_none_or(|e| Instant::now() < e) {
        if producer.is_connected() != connected {
            connected = !connected;
            line(&format!(
                "{{\"event\":\"{}\",\"connections\":{}}}",
                if connected {
                    "connected"
                } else {
                    "disconnected"
                },
                producer.connections()
            ));
        }
        if HEARTBEAT.is_enabled() {
            let _beat = trace_event!(HEARTBEAT, "beat", "n" => beats);
            beats += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    line(&format!("{{\"event\":\"exit\",\"beats\":{beats}}}"));
}
