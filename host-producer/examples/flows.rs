//! Flows: arrows linking events on different threads, and custom tracks
//! (an async "request" track with a name, grouped under a parent with an
//! explicit child order).
//!
//! ```text
//! PERFETTO_PRODUCER_SOCK_NAME=/tmp/perfetto-producer cargo run -p shmtrace-producer --example flows
//! ```

use std::time::Duration;

use shmtrace_producer::{
    trace_event, track_event, Category, ChildOrdering, Flow, ProcessTrack, ProducerConfig, Track,
};

static WORK: Category = Category::new("work").with_description("Requests and their processing");

fn main() {
    shmtrace_producer::init(ProducerConfig::default()).expect("start the producer");
    track_event::register_categories(&[&WORK]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !WORK.is_enabled() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }

    let requests = Track::named_child_of(&ProcessTrack::current(), "Requests", 0)
        .with_child_ordering(ChildOrdering::Explicit);
    let handles: Vec<_> = (0..4u64)
        .map(|id| {
            let flow = [Flow::process_scoped(id)];
            // Phase 1 on this thread, starting the flow.
            {
                let _s = trace_event!(WORK, "Receive", "request" => id);
                WORK.instant("Queued").flows(&flow).emit();
            }
            std::thread::spawn(move || {
                // Phase 2 on a worker thread, ending the flow.
                let _s = trace_event!(WORK, "Process", "request" => id);
                WORK.instant("Dequeued").terminating_flows(&flow).emit();
                // The request's whole life on its own named track.
                let names = ["request 0", "request 1", "request 2", "request 3"];
                let track = Track::named_child_of(&requests, names[id as usize], id)
                    .with_sibling_order_rank(-(id as i32));
                WORK.slice("Lifetime").track(&track).emit();
                std::thread::sleep(Duration::from_millis(2));
                WORK.end().track(&track).emit();
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    shmtrace_producer::flush_all();
}
