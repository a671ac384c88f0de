//! Thread and process names in the track descriptors a trace carries.
//!
//! A thread track is named by the thread's kernel name (`comm`, which
//! `std::thread::Builder::name` sets, truncated by the kernel to 15 bytes),
//! as upstream's C SDK does; the process track by the first command-line
//! word unless [`crate::set_process_name`] overrides it.

use prost::Message as _;
use shmtrace_abi::layout::PageLayout;

use super::loopback::{serial, Loopback};
use crate::filter::TrackEventConfig;
use crate::runtime::runtime;
use crate::test_schema as ts;
use crate::{trace_instant, track_event, Category};

static N_CAT: Category = Category::new("names.cat");

/// Every track descriptor of every sequence, in order.
fn descriptors(lb: &Loopback) -> Vec<ts::TrackDescriptor> {
    lb.sequences()
        .values()
        .flat_map(|s| &s.packets)
        .filter_map(|b| {
            ts::TracePacket::decode(&b[..])
                .expect("valid TracePacket")
                .track_descriptor
        })
        .collect()
}

/// The thread name the descriptor of thread `tid` carries (all of them
/// must agree).
fn thread_name(descs: &[ts::TrackDescriptor], tid: i64) -> Option<String> {
    let names: Vec<_> = descs
        .iter()
        .filter_map(|d| d.thread.as_ref())
        .filter(|t| t.tid == Some(tid))
        .map(|t| t.thread_name.clone())
        .collect();
    assert!(!names.is_empty(), "thread {tid} was described");
    assert!(names.windows(2).all(|w| w[0] == w[1]), "{names:?}");
    names[0].clone()
}

/// Emits one event on a new thread called `name`; returns its tid.
fn on_named_thread(name: &str) -> i64 {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(|| {
            trace_instant!(N_CAT, "named");
            crate::sys::current_tid()
        })
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn thread_and_process_names_reach_the_trace() {
    let _s = serial();
    track_event::register_categories(&[&N_CAT]);
    let lb = Loopback::new(256 * 1024, PageLayout::Div1, false);
    let cfg = TrackEventConfig {
        enabled_categories: vec!["names.cat".into()],
        disabled_categories: vec!["*".into()],
        ..Default::default()
    };
    lb.start_track_event(501, 1, cfg);

    let w1 = on_named_thread("w1");
    let long = on_named_thread("a-very-long-thread-name");
    trace_instant!(N_CAT, "before_rename");
    let me = crate::sys::current_tid();

    // Renaming the process shows on each sequence's next reset.
    crate::set_process_name("p-renamed");
    runtime().clear_incremental_state(&[501]);
    trace_instant!(N_CAT, "after_rename");
    runtime().stop_data_source(501);

    let descs = descriptors(&lb);
    assert_eq!(thread_name(&descs, w1).as_deref(), Some("w1"));
    assert_eq!(
        thread_name(&descs, long).as_deref(),
        Some("a-very-long-thr"),
        "the kernel keeps 15 bytes"
    );
    // The test harness names its threads after the test.
    let mine: String = std::thread::current()
        .name()
        .expect("libtest names test threads")
        .chars()
        .take(15)
        .collect();
    assert_eq!(thread_name(&descs, me), Some(mine));

    let processes: Vec<_> = descs.iter().filter_map(|d| d.process.as_ref()).collect();
    let first = processes.first().expect("process described");
    let argv0 = std::env::args().next().unwrap();
    assert_eq!(first.process_name.as_deref(), Some(argv0.as_str()));
    let last = processes.last().unwrap();
    assert_eq!(last.process_name.as_deref(), Some("p-renamed"));
    assert_eq!(last.pid, Some(crate::current_pid()));
    lb.shutdown();
}
