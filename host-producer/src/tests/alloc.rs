//! Proof that the hot path does not allocate: a counting global allocator
//! (per thread) around thousands of events of every kind, after warm-up.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use shmtrace_abi::layout::PageLayout;

use super::loopback::{serial, Loopback};
use crate::filter::TrackEventConfig;
use crate::runtime::runtime;
use crate::{
    trace_counter, trace_event, trace_instant, track_event, Arg, Category, CounterTrack,
    DebugValue, Flow, Track,
};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to the system allocator; the
// counter is a const-initialized thread-local without destructor, so
// touching it never allocates or re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

static A_CAT: Category = Category::new("alloc.cat");
static A_OFF: Category = Category::new("alloc.off");

fn one_round(i: u64, counter: &CounterTrack<'_>, track: &Track<'_>) {
    let _outer = trace_event!(A_CAT, "outer", "i" => i, "s" => "text");
    {
        let _inner = trace_event!(A_CAT, "inner", "d" => 0.5, "b" => true);
        trace_instant!(A_CAT, "tick", "p" => DebugValue::Pointer(0x1234));
        let flow = [Flow::process_scoped(i)];
        A_CAT.instant("flow_out").flows(&flow).emit();
        A_CAT.instant("flow_in").terminating_flows(&flow).emit();
        let dict = [("k", DebugValue::from(1)), ("v", DebugValue::from("x"))];
        let args = [Arg::new("dict", DebugValue::Dict(&dict))];
        A_CAT.instant("nested").args(&args).track(track).emit();
    }
    trace_counter!(A_CAT, counter, i as i64);
    trace_counter!(A_CAT, counter, i as f64 * 0.5);
    trace_instant!(A_OFF, "disabled", "never" => 1);
}

#[test]
fn hot_path_does_not_allocate() {
    let _s = serial();
    track_event::register_categories(&[&A_CAT, &A_OFF]);
    let lb = Loopback::new(4 << 20, PageLayout::Div1, false);
    let cfg = TrackEventConfig {
        disabled_categories: vec!["alloc.off".into()],
        ..Default::default()
    };
    lb.start_track_event(301, 1, cfg);
    let counter = CounterTrack::new("alloc.counter");
    let track = Track::new(5).with_name("alloc.track");
    // Warm-up: creates the writer, interns every string, emits every
    // descriptor, sizes the commit buffers.
    for i in 0..2000 {
        one_round(i, &counter, &track);
    }
    lb.drain();
    let before = allocations();
    for i in 0..20_000 {
        one_round(i, &counter, &track);
        if i % 500 == 0 {
            // Let the service free chunks (on the pump thread, not counted).
            std::thread::yield_now();
        }
    }
    let after = allocations();
    let dropped = crate::stats().packets_dropped;
    runtime().stop_data_source(301);
    let events: usize = lb.sequences().values().map(|s| s.packets.len()).sum();
    assert!(
        events > 20_000 * 9,
        "the events were really written ({events} packets)"
    );
    assert_eq!(
        after - before,
        0,
        "allocations on the hot path ({dropped} packets dropped)"
    );
    lb.shutdown();
}
