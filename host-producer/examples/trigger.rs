//! Activates the triggers named on the command line, as
//! `perfetto --trigger` or `shmtrace trigger` do, but from a program using
//! the producer library: sessions whose `trigger_config` lists one of them
//! start, stop or are cloned, and their traces record a `trigger` packet
//! naming it and this producer.
//!
//! Start a tracing service and a session that waits for a trigger (e.g.
//! `host-service/cli/tests/data/stop_on_trigger.txtpb`, trigger `go`), then:
//!
//! ```text
//! PERFETTO_PRODUCER_SOCK_NAME=/tmp/perfetto-producer cargo run -p shmtrace-producer --example trigger -- go
//! ```
//!
//! The triggers are activated before the connection is up: the producer
//! keeps them (for 10 s) and sends them once it connects.

use std::time::Duration;

use shmtrace_producer::ProducerConfig;

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        eprintln!("usage: trigger NAME...");
        std::process::exit(2);
    }
    let producer = shmtrace_producer::init(ProducerConfig::default()).expect("start the producer");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    shmtrace_producer::activate_triggers(&names, Duration::from_secs(10));
    if !producer.wait_connected(Duration::from_secs(10)) {
        eprintln!("trigger: no tracing service to connect to");
        std::process::exit(1);
    }
    // Wait until the triggers have left (they need no reply), then go.
    producer.shutdown();
    let lost = shmtrace_producer::stats();
    if lost.triggers_expired + lost.triggers_dropped > 0 {
        eprintln!("trigger: some triggers were not sent");
        std::process::exit(1);
    }
    println!("activated: {}", names.join(" "));
}
