//! A custom data source: registered under its own name, gets its config
//! when a session sets it up, and writes arbitrary TracePackets from any
//! thread.
//!
//! Enable it with a TraceConfig data source named `com.example.counters`.
//! Each packet carries a timestamp and a `for_testing` `TestEvent` (field
//! 900: `str` = the worker's name, `seq_value` = a counter);
//! the serialized `DataSourceConfig` the session sent is available too.
//!
//! ```text
//! PERFETTO_PRODUCER_SOCK_NAME=/tmp/perfetto-producer cargo run -p shmtrace-producer --example custom_data_source
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use shmtrace_producer::{
    DataSource, DataSourceHandler, InstanceArgs, ProducerConfig, SetupArgs, Timestamp,
};

const WORKERS: [&str; 2] = ["worker 0", "worker 1"];

struct Handler {
    started: AtomicU64,
}

impl DataSourceHandler for Handler {
    fn on_setup(&self, args: &SetupArgs<'_>) {
        println!(
            "setup: instance {} (slot {}), buffer {}, {} config bytes",
            args.instance_id,
            args.instance_index,
            args.config.target_buffer,
            args.config.raw.len()
        );
    }
    fn on_start(&self, args: &InstanceArgs<'_>) {
        self.started.fetch_add(1, Ordering::Relaxed);
        println!("start: instance {}", args.instance_id);
    }
    fn on_stop(&self, args: &InstanceArgs<'_>) {
        println!("stop: instance {}", args.instance_id);
    }
}

fn main() {
    shmtrace_producer::init(ProducerConfig::default()).expect("start the producer");
    let source = DataSource::register(
        "com.example.counters",
        Handler {
            started: AtomicU64::new(0),
        },
    )
    .expect("register the data source");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !source.is_enabled() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let workers: Vec<_> = (0..2u8)
        .map(|w| {
            let source = source.clone();
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    source.trace(|ctx| {
                        if ctx.take_incremental_state_cleared() {
                            // Re-emit whatever later packets depend on here.
                        }
                        ctx.packet(|p| {
                            p.uint64(8, Timestamp::now().ns); // timestamp
                            p.nested(900, |test_event| {
                                test_event.string(1, WORKERS[usize::from(w)]); // str
                                test_event.uint32(2, i as u32); // seq_value
                            });
                        });
                    });
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    shmtrace_producer::flush_all();
}
