//! Thread and process names in the track descriptors a trace carries.
//!
//! A thread track is named by the thread's kernel name (`comm`, which
//! `std::thread::Builder::name` sets, truncated by the kernel to 15 bytes),
//! as upstream's C SDK does, unless [`ThreadTrack::set_current_name`]
//! overrides it; the process track by the first command-line word unless
//! [`crate::set_process_name`] overrides it.

use prost::Message as _;
use shmtrace_abi::layout::PageLayout;

use super::loopback::{serial, Loopback};
use crate::runtime::runtime;
use crate::test_schema as ts;
use crate::track_event::filter::TrackEventConfig;
use crate::{trace_instant, track_event, Category, ThreadTrack};

static N_CAT: Category = Category::new("names.cat");

/// The track descriptors of each sequence, in order.
fn descriptors(lb: &Loopback) -> Vec<Vec<ts::TrackDescriptor>> {
    lb.sequences()
        .values()
        .map(|s| {
            s.packets
                .iter()
                .filter_map(|b| {
                    ts::TracePacket::decode(&b[..])
                        .expect("valid TracePacket")
                        .track_descriptor
                })
                .collect()
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
    // A name set for the trace: any length, from the next reset on.
    let (set, before, after) = std::thread::Builder::new()
        .name("kernel-name".into())
        .spawn(|| {
            trace_instant!(N_CAT, "as_kernel_named");
            ThreadTrack::set_current_name("renamed-for-the-trace-only");
            trace_instant!(N_CAT, "same_sequence_no_reset");
            let before = crate::sys::with_thread_name(|n| n.map(str::to_owned));
            runtime().clear_incremental_state(&[501]);
            trace_instant!(N_CAT, "after_reset");
            let kernel = rustix::thread::name().unwrap();
            (
                crate::sys::current_tid(),
                before,
                kernel.to_string_lossy().into_owned(),
            )
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(before.as_deref(), Some("renamed-for-the-trace-only"));
    assert_eq!(after, "kernel-name", "the kernel's name is left alone");
    trace_instant!(N_CAT, "before_rename");
    let me = crate::sys::current_tid();

    // Renaming the process shows on each sequence's next reset.
    crate::set_process_name("p-renamed");
    runtime().clear_incremental_state(&[501]);
    trace_instant!(N_CAT, "after_rename");
    runtime().stop_data_source(501);

    let sequences = descriptors(&lb);
    let descs: Vec<_> = sequences.iter().flatten().cloned().collect();
    assert_eq!(thread_name(&descs, w1).as_deref(), Some("w1"));
    let named: Vec<_> = descs
        .iter()
        .filter_map(|d| d.thread.as_ref())
        .filter(|t| t.tid == Some(set))
        .map(|t| t.thread_name.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(
        named,
        ["kernel-name", "renamed-for-the-trace-only"],
        "described at the start and again after the reset"
    );
    assert_eq!(
        thread_name(&descs, long).as_deref(),
        Some("a-very-long-thr"),
        "the kernel keeps 15 bytes"
    );
    // This thread keeps its kernel name (libtest names it after the test).
    let mine = rustix::thread::name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(thread_name(&descs, me), Some(mine));

    // The main thread's sequence: described with the default name, then
    // with the new one after the reset.
    let main = sequences
        .iter()
        .find(|s| {
            s.iter()
                .any(|d| d.thread.as_ref().and_then(|t| t.tid) == Some(me))
        })
        .expect("the main thread's sequence");
    let processes: Vec<_> = main.iter().filter_map(|d| d.process.as_ref()).collect();
    let argv0 = std::env::args().next().unwrap();
    let names: Vec<_> = processes
        .iter()
        .map(|p| p.process_name.as_deref())
        .collect();
    assert_eq!(names, [Some(argv0.as_str()), Some("p-renamed")]);
    assert!(processes
        .iter()
        .all(|p| p.pid == Some(crate::current_pid())));
    lb.shutdown();
}
