//! Proof that the hot path does not allocate: a counting global allocator
//! (per thread) around thousands of events of every kind, in two concurrent
//! track_event sessions plus a custom data source, after warm-up.
// `unsafe` here: a counting global allocator over the system one.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use shmtrace_abi::layout::PageLayout;
use shmtrace_abi::trace::trace_packet;

use super::loopback::{serial, Loopback};
use crate::runtime::runtime;
use crate::track_event::filter::TrackEventConfig;
use crate::{
    trace_counter, trace_event, trace_instant, track_event, Arg, Category, CounterTrack,
    DataSource, DataSourceConfig, DebugValue, DynamicCategory, EventName, Flow, Track,
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

pub(super) fn allocations() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

static A_CAT: Category = Category::new("alloc.cat");
static A_OFF: Category = Category::new("alloc.off");

/// What one round uses besides statics: made once, before the warm-up.
struct Fixture {
    counter: CounterTrack<'static>,
    track: Track<'static>,
    dynamic: DynamicCategory,
    /// Names built at run time (not `'static`): written inline.
    names: Vec<String>,
    custom: DataSource,
}

fn one_round(i: u64, f: &Fixture) {
    let _outer = trace_event!(A_CAT, "outer", "i" => i, "s" => "text");
    {
        let _inner = trace_event!(A_CAT, "inner", "d" => 0.5, "b" => true);
        trace_instant!(A_CAT, "tick", "p" => DebugValue::Pointer(0x1234));
        let flow = [Flow::process_scoped(i)];
        A_CAT.instant("flow_out").flows(&flow).emit();
        A_CAT.instant("flow_in").terminating_flows(&flow).emit();
        let dict = [("k", DebugValue::from(1)), ("v", DebugValue::from("x"))];
        let args = [Arg::new("dict", DebugValue::Dict(&dict))];
        A_CAT.instant("nested").args(&args).track(&f.track).emit();
    }
    trace_counter!(A_CAT, &f.counter, i as i64);
    trace_counter!(A_CAT, &f.counter, i as f64 * 0.5);
    trace_instant!(A_OFF, "disabled", "never" => 1);
    // Dynamic name, dynamic category.
    let name = f.names[i as usize % f.names.len()].as_str();
    A_CAT.instant(EventName::Dynamic(name)).emit();
    trace_instant!(f.dynamic, "in_dynamic", "i" => i);
    // Extra TrackEvent fields from a callback (log_message-like field and
    // an argument added by hand).
    A_CAT.instant("with").emit_with(|ctx| {
        ctx.event().uint64(ALLOC_TEST_FIELD, i);
        ctx.add_arg(&Arg::new("extra", DebugValue::from(i)));
    });
    // A custom data source: one raw TracePacket per instance.
    f.custom.trace(|ctx| {
        ctx.packet(|p| {
            p.uint64(trace_packet::TIMESTAMP, i);
            p.bytes(trace_packet::FOR_TESTING, b"payload");
        });
    });
}

/// An unused TrackEvent field number (readers skip it).
const ALLOC_TEST_FIELD: u32 = 9999;

/// Rounds measured after the warm-up.
const ROUNDS: u64 = 10_000;

#[test]
fn hot_path_does_not_allocate() {
    let _s = serial();
    track_event::register_categories(&[&A_CAT, &A_OFF]);
    let custom = DataSource::register("alloc.custom", crate::NoopHandler).unwrap();
    let lb = Loopback::new(8 << 20, PageLayout::Div1, false);
    // Two concurrent track_event sessions (buffers 1 and 2) and one of the
    // custom data source (buffer 3).
    for (id, buffer) in [(301, 1), (302, 2)] {
        let cfg = TrackEventConfig {
            disabled_categories: vec!["alloc.off".into()],
            ..Default::default()
        };
        lb.start_track_event(id, buffer, cfg);
    }
    let config = DataSourceConfig {
        name: "alloc.custom".into(),
        target_buffer: 3,
        ..Default::default()
    };
    assert!(runtime().setup_data_source(303, config));
    runtime().start_data_source(303);
    let f = Fixture {
        counter: CounterTrack::new("alloc.counter"),
        track: Track::new(5).with_name("alloc.track"),
        dynamic: DynamicCategory::new("alloc.dynamic"),
        names: (0..4).map(|n| format!("dyn-name-{n}")).collect(),
        custom,
    };
    assert!(f.dynamic.is_enabled() && f.custom.is_enabled());
    // Warm-up: creates the writers, interns every string, emits every
    // descriptor, sizes the commit buffers.
    for i in 0..2000 {
        one_round(i, &f);
    }
    lb.drain();
    let before = allocations();
    for i in 0..ROUNDS {
        one_round(i, &f);
        if i % 250 == 0 {
            // Let the service free chunks (on the pump thread, not counted).
            std::thread::yield_now();
        }
    }
    let after = allocations();
    let dropped = crate::stats().packets_dropped;
    for id in [301, 302, 303] {
        runtime().stop_data_source(id);
    }
    // Packets per target buffer: each session got every kind of event.
    let seqs = lb.sequences();
    let targets = lb.received().chunk_targets.clone();
    let mut per_buffer = [0usize; 4];
    for (writer, seq) in &seqs {
        per_buffer[targets[writer] as usize] += seq.packets.len();
    }
    assert!(
        per_buffer[1] > (ROUNDS * 12) as usize && per_buffer[2] > (ROUNDS * 12) as usize,
        "both track_event sessions were written: {per_buffer:?} ({dropped} dropped)"
    );
    assert!(
        per_buffer[3] > ROUNDS as usize,
        "the custom data source was written: {per_buffer:?}"
    );
    assert_eq!(
        after - before,
        0,
        "allocations on the hot path ({dropped} packets dropped)"
    );
    lb.shutdown();
}
