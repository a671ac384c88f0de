//! The interop harness's producer driver, on shmtrace-producer: the same
//! command line, events and JSON-lines protocol as the harness's
//! `real-producer` (the real Perfetto C SDK), so the harness can swap one
//! for the other.
//!
//! ```text
//! interop_producer [--socket PATH] [--threads N] [--iterations N] [--phases P]
//!                  [--large-kb K] [--large-every M] [--iteration-sleep-us U]
//!                  [--shmem-kb S] [--start-timeout-ms T] [--stop-timeout-ms T]
//!                  [--sessions N] [--custom-source NAME] [--fidelity 0|1]
//! ```
//!
//! Each thread runs `iterations` iterations per phase; one iteration emits,
//! on the thread's track: slice "outer" { slice "inner" { instant "tick",
//! instant "flow_out" (starts a flow), instant "flow_in" (terminates it) },
//! and every `large-every` iterations instant "large" with a `large-kb` KiB
//! string } plus one int and one double counter on per-thread counter
//! tracks. Progress: `{"event":"enabled","pid":…}`, per phase
//! `{"event":"phase","phase":p,"threads":n,"emitted":{…}}` (cumulative
//! counts), then `{"event":"stopped"}`. Between phases it waits for a line
//! on stdin. Exit status: 0 ok, 2 usage error, 3 timeout.
//!
//! `--fidelity 1` makes each thread also emit, first in every phase, the
//! events the harness's producer fidelity test compares with the real
//! driver's (see `real_producer.cc`): slice "fidelity" with every
//! annotation type and a nested dict and array, an instant with the dynamic
//! name "dyn.<thread>" and an int argument with the dynamic name
//! "arg.<thread>", slice "on_named" on the named track "fidelity.named" (id
//! 7, child of the process track), slice "on_global" on the named track
//! "fidelity.global" (id 3, no parent), slice "flowing" starting a
//! process-scoped and a global flow that instant "flow_sink" terminates, an
//! int counter on "fidelity.bytes" (bytes, multiplier 1024), the values -7,
//! `i64::MIN` and `i64::MAX` on the thread's "interop.int.t<n>", an incremental
//! int counter on "fidelity.delta" (a count) and a double counter on
//! "fidelity.fps" (unit name "fps", category "interop.counter"). Then,
//! outside that slice, the same as the real driver: events at explicit
//! times (boot time and monotonic, a counter among them, one before the previous event where a
//! session enables the `slow` category "fidelity.earlier"), events on the
//! process track, on the next worker's thread track and on nested named
//! tracks, events in the dynamic categories "interop.dynamic" and
//! "interop.cdyn", a flow from one worker to another across phases, and
//! counters under a named track and under the thread's track.
//!
//! `--custom-source NAME` also registers a custom data source `NAME`: each
//! iteration then writes one packet to each of its instances, with a
//! timestamp and a `for_testing` `TestEvent` (field 900) whose `str` is the
//! instance's `DataSourceConfig.legacy_config` (field 1000; it tells the
//! sessions apart), `seq_value` the iteration and `counter` the thread; the
//! phase reports add `"custom":{"<legacy_config>":packets,…}`. `--sessions
//! N` waits for N sessions (N track_event instances, and N instances of
//! the custom source) before reporting `enabled`, and at the end until
//! all of them stopped.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use shmtrace_producer::{
    track_event, Arg, Category, ChildOrdering, Clock, CounterTrack, CounterUnit, DataSource,
    DataSourceConfig, DataSourceHandler, DebugValue, DynamicCategory, EventName, Flow,
    InstanceArgs, ProcessTrack, ProducerConfig, ThreadTrack, Timestamp, Track,
    TrackEventSessionObserver, MAX_INSTANCES,
};

static CAT_INTEROP: Category =
    Category::new("interop").with_description("Nested slices and instants");
static CAT_FLOW: Category =
    Category::new("interop.flow").with_description("Flow begin and end instants");
static CAT_COUNTER: Category =
    Category::new("interop.counter").with_description("Int and double counters");
static CAT_LARGE: Category =
    Category::new("interop.large").with_description("Instants with huge annotations");
static CAT_EARLIER: Category = Category::new("fidelity.earlier")
    .with_description("An event earlier than the last")
    .with_tags(&["slow"]);

const DRIVER: &str = "interop_producer";

/// Started and not yet stopped track_event instances.
static TRACK_EVENT_INSTANCES: AtomicUsize = AtomicUsize::new(0);
/// Started and not yet stopped instances of the custom data source.
static CUSTOM_INSTANCES: AtomicUsize = AtomicUsize::new(0);

/// Keeps an instance count up to date.
struct InstanceCounter(&'static AtomicUsize);

impl TrackEventSessionObserver for InstanceCounter {
    fn on_start(&self, _: &InstanceArgs<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn on_stop(&self, _: &InstanceArgs<'_>) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl DataSourceHandler for InstanceCounter {
    fn on_start(&self, _: &InstanceArgs<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn on_stop(&self, _: &InstanceArgs<'_>) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The fields of `DataSourceConfig` the custom source reads.
#[derive(Clone, PartialEq, prost::Message)]
struct CustomConfig {
    /// `legacy_config` (field 1000): the session's label.
    #[prost(string, optional, tag = "1000")]
    legacy_config: Option<String>,
}

/// The label of a custom-source instance: its config's `legacy_config`.
fn session_label(config: &DataSourceConfig) -> String {
    <CustomConfig as prost::Message>::decode(config.raw.as_slice())
        .ok()
        .and_then(|c| c.legacy_config)
        .unwrap_or_default()
}

/// Packets written per session label.
type CustomCounts = BTreeMap<String, u64>;

fn custom_json(counts: &CustomCounts) -> String {
    let fields: Vec<String> = counts
        .iter()
        .map(|(label, n)| format!("{label:?}:{n}"))
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// One iteration's packet on every instance of the custom source.
fn write_custom(
    source: &DataSource,
    labels: &mut [Option<String>; MAX_INSTANCES],
    counts: &mut CustomCounts,
    thread: usize,
    iteration: u64,
) {
    source.trace(|ctx| {
        let label = labels[ctx.instance_index()]
            .get_or_insert_with(|| session_label(ctx.config()))
            .clone();
        let written = ctx.packet(|p| {
            p.uint64(8, Timestamp::now().ns); // timestamp
            p.nested(900, |test_event| {
                test_event.string(1, &label); // str
                test_event.uint32(2, iteration as u32); // seq_value
                test_event.uint64(3, thread as u64); // counter
            });
        });
        if written {
            *counts.entry(label).or_default() += 1;
        }
    });
}

#[derive(Default, Clone, Copy)]
struct Counts {
    slice_begin: u64,
    slice_end: u64,
    instant: u64,
    counter_int: u64,
    counter_double: u64,
    flow_begin: u64,
    flow_end: u64,
    large: u64,
    large_bytes: u64,
    arg_int: u64,
    arg_uint: u64,
    arg_double: u64,
    arg_bool: u64,
    arg_string: u64,
    arg_pointer: u64,
    skipped_disabled: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.slice_begin += o.slice_begin;
        self.slice_end += o.slice_end;
        self.instant += o.instant;
        self.counter_int += o.counter_int;
        self.counter_double += o.counter_double;
        self.flow_begin += o.flow_begin;
        self.flow_end += o.flow_end;
        self.large += o.large;
        self.large_bytes += o.large_bytes;
        self.arg_int += o.arg_int;
        self.arg_uint += o.arg_uint;
        self.arg_double += o.arg_double;
        self.arg_bool += o.arg_bool;
        self.arg_string += o.arg_string;
        self.arg_pointer += o.arg_pointer;
        self.skipped_disabled += o.skipped_disabled;
    }

    fn json(&self) -> String {
        format!(
            "{{\"slice_begin\":{},\"slice_end\":{},\"instant\":{},\"counter_int\":{},\"counter_double\":{},\
             \"flow_begin\":{},\"flow_end\":{},\"large\":{},\"large_bytes\":{},\"arg_int\":{},\"arg_uint\":{},\
             \"arg_double\":{},\"arg_bool\":{},\"arg_string\":{},\"arg_pointer\":{},\"skipped_disabled\":{}}}",
            self.slice_begin,
            self.slice_end,
            self.instant,
            self.counter_int,
            self.counter_double,
            self.flow_begin,
            self.flow_end,
            self.large,
            self.large_bytes,
            self.arg_int,
            self.arg_uint,
            self.arg_double,
            self.arg_bool,
            self.arg_string,
            self.arg_pointer,
            self.skipped_disabled
        )
    }
}

#[derive(Clone, Copy)]
struct Options {
    threads: u64,
    iterations: u64,
    phases: u64,
    large_kb: u64,
    large_every: u64,
    iteration_sleep_us: u64,
    fidelity: bool,
}

#[derive(Default)]
struct GateState {
    released_phase: u64,
    done: usize,
    exit: bool,
    counts: Vec<(Counts, CustomCounts)>,
    tids: Vec<i64>,
}

/// Hands phases to the workers and collects their counts.
struct PhaseGate {
    state: Mutex<GateState>,
    cv: Condvar,
}

impl PhaseGate {
    fn new(workers: usize) -> Self {
        PhaseGate {
            state: Mutex::new(GateState {
                counts: vec![Default::default(); workers],
                tids: vec![0; workers],
                ..Default::default()
            }),
            cv: Condvar::new(),
        }
    }

    fn wait_for_phase(&self, phase: u64) -> bool {
        let mut s = self.state.lock().unwrap();
        while s.released_phase < phase && !s.exit {
            s = self.cv.wait(s).unwrap();
        }
        s.released_phase >= phase
    }

    fn phase_done(&self, worker: usize, counts: Counts, custom: &CustomCounts) {
        let mut s = self.state.lock().unwrap();
        s.counts[worker] = (counts, custom.clone());
        s.done += 1;
        self.cv.notify_all();
    }

    fn run_phase(&self, phase: u64) -> (Counts, CustomCounts) {
        let mut s = self.state.lock().unwrap();
        s.done = 0;
        s.released_phase = phase;
        self.cv.notify_all();
        while s.done < s.counts.len() {
            s = self.cv.wait(s).unwrap();
        }
        let mut total = Counts::default();
        let mut custom = CustomCounts::new();
        for (counts, packets) in &s.counts {
            total.add(counts);
            for (label, n) in packets {
                *custom.entry(label.clone()).or_default() += n;
            }
        }
        (total, custom)
    }

    fn release_exit(&self) {
        self.state.lock().unwrap().exit = true;
        self.cv.notify_all();
    }

    /// Records worker `worker`'s thread id.
    fn set_tid(&self, worker: usize, tid: i64) {
        self.state.lock().unwrap().tids[worker] = tid;
    }

    /// Worker `worker`'s thread id, once it has run a phase (0 before).
    fn tid(&self, worker: usize) -> i64 {
        self.state.lock().unwrap().tids[worker]
    }
}

/// The `--fidelity` events (see the module docs).
fn emit_fidelity(index: usize, phase: u64, pointee: &u32, counts: &mut Counts) {
    let dict = [("x", DebugValue::Int(1)), ("label", DebugValue::Str("hi"))];
    let array = [DebugValue::Double(1.5), DebugValue::Bool(true)];
    let args = [
        Arg::new("b_true", true),
        Arg::new("b_false", false),
        Arg::new("i_neg", -5i64),
        Arg::new("i_min", i64::MIN),
        Arg::new("u_max", u64::MAX),
        Arg::new("d_frac", 0.25),
        Arg::new("d_neg", -1.5e300),
        Arg::new("s_text", "text"),
        Arg::new("s_empty", ""),
        Arg::new("p", DebugValue::pointer(pointee)),
        Arg::new("dict", DebugValue::Dict(&dict)),
        Arg::new("arr", DebugValue::Array(&array)),
    ];
    CAT_INTEROP.slice("fidelity").args(&args).emit();
    counts.slice_begin += 1;
    counts.arg_bool += 2;
    counts.arg_int += 2;
    counts.arg_uint += 1;
    counts.arg_double += 2;
    counts.arg_string += 2;
    counts.arg_pointer += 1;

    let dyn_name = format!("dyn.{index}");
    let dyn_arg = format!("arg.{index}");
    let dyn_args = [Arg::dynamic(&dyn_arg, 7i64)];
    CAT_INTEROP
        .instant(EventName::Dynamic(&dyn_name))
        .args(&dyn_args)
        .emit();
    counts.instant += 1;
    counts.arg_int += 1;

    let process = ProcessTrack::current();
    let named = Track::named_child_of(&process, "fidelity.named", 7);
    CAT_INTEROP.slice("on_named").track(&named).emit();
    CAT_INTEROP.end().track(&named).emit();
    counts.slice_begin += 1;
    counts.slice_end += 1;
    let global = Track::named_child_of(&Track::global(0), "fidelity.global", 3);
    CAT_INTEROP.slice("on_global").track(&global).emit();
    CAT_INTEROP.end().track(&global).emit();
    counts.slice_begin += 1;
    counts.slice_end += 1;

    // Unique per thread and phase, apart from the script's flows.
    let flow_id = (0xF1D0 << 32) | ((index as u64) << 16) | phase;
    let flows = [Flow::process_scoped(flow_id), Flow::global(flow_id)];
    CAT_FLOW.slice("flowing").flows(&flows).emit();
    CAT_FLOW.end().emit();
    CAT_FLOW
        .instant("flow_sink")
        .terminating_flows(&flows)
        .emit();
    counts.slice_begin += 1;
    counts.slice_end += 1;
    counts.instant += 1;
    counts.flow_begin += 2;
    counts.flow_end += 2;

    let bytes = CounterTrack::child_of(&process, "fidelity.bytes")
        .with_unit(CounterUnit::SizeBytes)
        .with_multiplier(1024);
    CAT_COUNTER.counter(&bytes, 3i64).emit();
    counts.counter_int += 1;
    // Negative and extreme values on the counter track the matrix's script
    // already described.
    let int_name = format!("interop.int.t{index}");
    let int_track = CounterTrack::child_of(&process, &int_name);
    for v in [-7, i64::MIN, i64::MAX] {
        CAT_COUNTER.counter(&int_track, v).emit();
        counts.counter_int += 1;
    }
    let delta = CounterTrack::child_of(&process, "fidelity.delta")
        .with_unit(CounterUnit::Count)
        .with_incremental(true);
    CAT_COUNTER.counter(&delta, 1i64).emit();
    counts.counter_int += 1;
    let fps = CounterTrack::child_of(&process, "fidelity.fps")
        .with_unit_name("fps")
        .with_category(&CAT_COUNTER);
    CAT_COUNTER.counter(&fps, 59.5).emit();
    counts.counter_double += 1;

    CAT_INTEROP.end().emit();
    counts.slice_end += 1;
}

/// `CLOCK_MONOTONIC` now, ns.
fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Events at explicit times (see the module docs). The time base `b` is
/// our own "now" (boot time), read together with `CLOCK_MONOTONIC`: read
/// again while the boot-time reads around the monotonic one lie more than
/// 20 us apart, so the monotonic event's offset from `b` is known to 20 us.
fn emit_explicit_times(counts: &mut Counts) {
    let (b, mono) = loop {
        let b = Timestamp::now().ns;
        let mono = monotonic_ns();
        if Timestamp::now().ns - b <= 20_000 {
            break (b, mono);
        }
    };
    let base = [Arg::new("time_base_ns", b)];
    let at = |offset| Timestamp::boottime(b + offset);
    CAT_INTEROP
        .instant("ts.base")
        .timestamp(at(0))
        .args(&base)
        .emit();
    CAT_INTEROP
        .slice("ts.slice")
        .timestamp(at(3000))
        .args(&base)
        .emit();
    // On a counter track this sequence has not described yet.
    let timed = CounterTrack::new("fidelity.timed");
    CAT_COUNTER
        .counter(&timed, 7i64)
        .timestamp(at(4000))
        .args(&base)
        .emit();
    CAT_INTEROP.end().timestamp(at(5000)).args(&base).emit();
    // Before the previous event on this thread, where a session enables it.
    if CAT_EARLIER.is_enabled() {
        CAT_EARLIER
            .instant("ts.earlier")
            .timestamp(at(1000))
            .args(&base)
            .emit();
        counts.instant += 1;
        counts.arg_uint += 1;
    }
    CAT_INTEROP
        .instant("ts.mono")
        .timestamp(Timestamp {
            clock: Clock::Monotonic,
            ns: mono + 2_000_000,
        })
        .args(&base)
        .emit();
    counts.instant += 2;
    counts.slice_begin += 1;
    counts.slice_end += 1;
    counts.counter_int += 1;
    counts.arg_uint += 5;
    // The events after these run later than all of them (on the sequence's
    // clock), so that "ts.earlier" is the only step back in time.
    while Timestamp::now().ns <= b + 5000 {}
}

/// Tracks, dynamic categories, cross-thread flows and counters the rest of
/// the `--fidelity` script leaves out (see the module docs). `peer_tid` is
/// the next worker (`peer`)'s thread id, 0 in the first phase.
fn emit_fidelity_tracks(index: usize, peer: usize, phase: u64, peer_tid: i64, counts: &mut Counts) {
    let process = ProcessTrack::current();
    CAT_INTEROP.slice("on_process").track(&process).emit();
    CAT_INTEROP.end().track(&process).emit();
    counts.slice_begin += 1;
    counts.slice_end += 1;
    if peer_tid != 0 {
        let peer_track = ThreadTrack::for_thread(peer_tid);
        CAT_INTEROP.instant("on_peer").track(&peer_track).emit();
        counts.instant += 1;
    }
    let outer = Track::named_child_of(&process, "fidelity.outer", 1)
        .with_child_ordering(ChildOrdering::Explicit);
    let inner = Track::named_child_of(&outer, "fidelity.inner", 2).with_sibling_order_rank(5);
    CAT_INTEROP.slice("on_inner").track(&inner).emit();
    CAT_INTEROP.end().track(&inner).emit();
    counts.slice_begin += 1;
    counts.slice_end += 1;
    let root = Track::named_child_of(&Track::global(0), "fidelity.root", 4);
    let leaf = Track::named_child_of(&root, "fidelity.leaf", 3);
    CAT_INTEROP.instant("on_leaf").track(&leaf).emit();
    counts.instant += 1;

    DynamicCategory::new("interop.dynamic")
        .category()
        .instant("dyncat.instant")
        .emit();
    let cdyn = DynamicCategory::new("interop.cdyn").category();
    cdyn.slice("dyncat.slice").emit();
    cdyn.end().emit();
    counts.instant += 1;
    counts.slice_begin += 1;
    counts.slice_end += 1;

    // A flow begun in an odd phase ends on another thread in the following
    // phase: the one whose next worker began it.
    const CROSS: u64 = 0xC805 << 32;
    if phase % 2 == 1 {
        let flow = [Flow::process_scoped(CROSS | (index as u64) << 16 | phase)];
        CAT_FLOW.instant("xflow_out").flows(&flow).emit();
        counts.flow_begin += 1;
    } else {
        let flow = [Flow::process_scoped(
            CROSS | (peer as u64) << 16 | (phase - 1),
        )];
        CAT_FLOW.instant("xflow_in").terminating_flows(&flow).emit();
        counts.flow_end += 1;
    }
    counts.instant += 1;

    let latency = CounterTrack::child_of(&outer, "fidelity.latency")
        .with_unit(CounterUnit::TimeNs)
        .with_multiplier(1000);
    CAT_COUNTER.counter(&latency, 2.5).emit();
    counts.counter_double += 1;
    let thread_counter = CounterTrack::child_of(&ThreadTrack::current(), "fidelity.thread_counter");
    CAT_COUNTER.counter(&thread_counter, 42i64).emit();
    counts.counter_int += 1;
}

fn worker(index: usize, opt: Options, gate: &PhaseGate, custom: Option<&DataSource>) {
    let mut counts = Counts::default();
    let mut custom_counts = CustomCounts::new();
    let mut labels: [Option<String>; MAX_INSTANCES] = Default::default();
    let thread_label = format!("worker-{index}");
    let int_name = format!("interop.int.t{index}");
    let double_name = format!("interop.double.t{index}");
    let process = ProcessTrack::current();
    let int_track = CounterTrack::child_of(&process, &int_name);
    let double_track = CounterTrack::child_of(&process, &double_name);
    let blob: String = (0..opt.large_kb as usize * 1024)
        .map(|i| (b'a' + ((i * 7 + index) % 26) as u8) as char)
        .collect();
    let pointee = 0u32;
    let mut iteration: u64 = 0;
    let peer = (index + 1) % opt.threads as usize;
    let mut phase = 1;
    while gate.wait_for_phase(phase) {
        gate.set_tid(
            index,
            rustix::thread::gettid().as_raw_nonzero().get().into(),
        );
        if opt.fidelity && CAT_INTEROP.is_enabled() {
            emit_fidelity(index, phase, &pointee, &mut counts);
            emit_explicit_times(&mut counts);
            let peer_tid = if phase > 1 { gate.tid(peer) } else { 0 };
            emit_fidelity_tracks(index, peer, phase, peer_tid, &mut counts);
        }
        for _ in 0..opt.iterations {
            if !CAT_INTEROP.is_enabled() {
                counts.skipped_disabled += 1;
                iteration += 1;
                continue;
            }
            let iter = iteration as i64;
            let outer_args = [
                shmtrace_producer::Arg::new("iter", iter),
                shmtrace_producer::Arg::new("thread", thread_label.as_str()),
            ];
            CAT_INTEROP.slice("outer").args(&outer_args).emit();
            counts.slice_begin += 1;
            counts.arg_int += 1;
            counts.arg_string += 1;

            let inner_args = [
                shmtrace_producer::Arg::new("ratio", iter as f64 / 4.0),
                shmtrace_producer::Arg::new("even", iter % 2 == 0),
                shmtrace_producer::Arg::new("big", 0xFFFF_FFFF_0000_0000u64 + iteration),
            ];
            CAT_INTEROP.slice("inner").args(&inner_args).emit();
            counts.slice_begin += 1;
            counts.arg_double += 1;
            counts.arg_bool += 1;
            counts.arg_uint += 1;

            let ptr_args = [shmtrace_producer::Arg::new(
                "ptr",
                DebugValue::pointer(&pointee),
            )];
            CAT_INTEROP.instant("tick").args(&ptr_args).emit();
            counts.instant += 1;
            counts.arg_pointer += 1;

            let flow = [Flow::process_scoped(((index as u64) << 32) | iteration)];
            CAT_FLOW.instant("flow_out").flows(&flow).emit();
            counts.instant += 1;
            counts.flow_begin += 1;
            CAT_FLOW.instant("flow_in").terminating_flows(&flow).emit();
            counts.instant += 1;
            counts.flow_end += 1;

            if opt.large_kb > 0 && opt.large_every > 0 && iteration % opt.large_every == 0 {
                let large_args = [shmtrace_producer::Arg::new("blob", blob.as_str())];
                CAT_LARGE.instant("large").args(&large_args).emit();
                counts.instant += 1;
                counts.large += 1;
                counts.large_bytes += blob.len() as u64;
                counts.arg_string += 1;
            }

            CAT_INTEROP.end().emit();
            counts.slice_end += 1;
            CAT_INTEROP.end().emit();
            counts.slice_end += 1;

            CAT_COUNTER.counter(&int_track, iter * 3).emit();
            counts.counter_int += 1;
            CAT_COUNTER.counter(&double_track, iter as f64 * 0.5).emit();
            counts.counter_double += 1;

            if let Some(source) = custom {
                write_custom(source, &mut labels, &mut custom_counts, index, iteration);
            }

            if opt.iteration_sleep_us > 0 {
                std::thread::sleep(Duration::from_micros(opt.iteration_sleep_us));
            }
            iteration += 1;
        }
        gate.phase_done(index, counts, &custom_counts);
        phase += 1;
    }
}

fn emit_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn fail(message: &str, status: u8) -> ExitCode {
    let escaped = message.replace('\\', "\\\\").replace('"', "\\\"");
    eprintln!("{DRIVER}: error: {message}");
    emit_line(&format!(
        "{{\"event\":\"error\",\"message\":\"{escaped}\"}}"
    ));
    ExitCode::from(status)
}

/// Waits until the categories are enabled (`want_enabled`) by `sessions`
/// sessions, with `custom` instances of the custom source if there is one;
/// or, with `!want_enabled`, until every session stopped.
fn wait_until(want_enabled: bool, sessions: usize, custom: bool, timeout: Duration) -> bool {
    let ready = || {
        let custom_instances = CUSTOM_INSTANCES.load(Ordering::SeqCst);
        if want_enabled {
            CAT_INTEROP.is_enabled()
                && TRACK_EVENT_INSTANCES.load(Ordering::SeqCst) >= sessions
                && (!custom || custom_instances >= sessions)
        } else {
            !CAT_INTEROP.is_enabled() && custom_instances == 0
        }
    };
    let deadline = Instant::now() + timeout;
    while !ready() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

struct Flags {
    values: Vec<(String, String)>,
}

impl Flags {
    fn parse() -> Result<Self, String> {
        const KNOWN: [&str; 13] = [
            "socket",
            "threads",
            "iterations",
            "phases",
            "large-kb",
            "large-every",
            "iteration-sleep-us",
            "shmem-kb",
            "start-timeout-ms",
            "stop-timeout-ms",
            "sessions",
            "custom-source",
            "fidelity",
        ];
        let mut values = Vec::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let Some(name) = arg.strip_prefix("--") else {
                return Err(format!("unexpected argument {arg:?}"));
            };
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None => (
                    name.to_string(),
                    args.next()
                        .ok_or_else(|| format!("--{name} needs a value"))?,
                ),
            };
            if !KNOWN.contains(&name.as_str()) {
                return Err(format!("unknown flag --{name}"));
            }
            values.push((name, value));
        }
        Ok(Flags { values })
    }

    fn str(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn u64(&self, name: &str, default: u64) -> Result<u64, String> {
        self.str(name).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("--{name}: not a number: {v:?}"))
        })
    }
}

fn run() -> Result<ExitCode, String> {
    let flags = Flags::parse()?;
    let opt = Options {
        threads: flags.u64("threads", 1)?,
        iterations: flags.u64("iterations", 100)?,
        phases: flags.u64("phases", 1)?,
        large_kb: flags.u64("large-kb", 0)?,
        large_every: flags.u64("large-every", 10)?,
        iteration_sleep_us: flags.u64("iteration-sleep-us", 0)?,
        fidelity: flags.u64("fidelity", 0)? != 0,
    };
    let shmem_kb = flags.u64("shmem-kb", 0)?;
    let start_timeout = Duration::from_millis(flags.u64("start-timeout-ms", 30000)?);
    let stop_timeout = Duration::from_millis(flags.u64("stop-timeout-ms", 30000)?);
    if opt.threads == 0 || opt.threads > 64 || opt.phases == 0 {
        return Err("--threads must be 1..64 and --phases >= 1".into());
    }
    let sessions = flags.u64("sessions", 1)? as usize;
    if sessions == 0 || sessions > MAX_INSTANCES {
        return Err(format!("--sessions must be 1..={MAX_INSTANCES}"));
    }
    if shmem_kb % 4 != 0 {
        return Err("--shmem-kb must be a multiple of 4".into());
    }
    let socket = flags
        .str("socket")
        .map(str::to_owned)
        .or_else(|| std::env::var("PERFETTO_PRODUCER_SOCK_NAME").ok())
        .ok_or("--socket or PERFETTO_PRODUCER_SOCK_NAME needed")?;

    shmtrace_producer::init(ProducerConfig {
        socket: Some(socket),
        shmem_size_hint_bytes: (shmem_kb * 1024) as u32,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    track_event::add_session_observer(Arc::new(InstanceCounter(&TRACK_EVENT_INSTANCES)));
    track_event::register_categories(&[
        &CAT_INTEROP,
        &CAT_FLOW,
        &CAT_COUNTER,
        &CAT_LARGE,
        &CAT_EARLIER,
    ]);
    let custom = flags
        .str("custom-source")
        .map(|name| DataSource::register(name, InstanceCounter(&CUSTOM_INSTANCES)))
        .transpose()
        .map_err(|e| e.to_string())?;

    if !wait_until(true, sessions, custom.is_some(), start_timeout) {
        return Ok(fail(
            &format!(
                "{sessions} session(s) did not enable the categories{} within {} ms",
                if custom.is_some() {
                    " and the custom data source"
                } else {
                    ""
                },
                start_timeout.as_millis()
            ),
            3,
        ));
    }
    emit_line(&format!(
        "{{\"event\":\"enabled\",\"pid\":{}}}",
        std::process::id()
    ));

    let gate = Arc::new(PhaseGate::new(opt.threads as usize));
    let workers: Vec<_> = (0..opt.threads as usize)
        .map(|i| {
            let gate = gate.clone();
            let custom = custom.clone();
            std::thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || worker(i, opt, &gate, custom.as_ref()))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let stdin = std::io::stdin();
    for phase in 1..=opt.phases {
        if phase > 1 {
            // Wait for the harness to say "next"; at end of input the
            // remaining phases run back to back.
            let mut line = String::new();
            let _ = stdin.lock().read_line(&mut line);
        }
        let (total, packets) = gate.run_phase(phase);
        let custom_field = if custom.is_some() {
            format!(",\"custom\":{}", custom_json(&packets))
        } else {
            String::new()
        };
        emit_line(&format!(
            "{{\"event\":\"phase\",\"phase\":{phase},\"threads\":{},\"emitted\":{}{custom_field}}}",
            opt.threads,
            total.json()
        ));
    }
    gate.release_exit();
    for w in workers {
        let _ = w.join();
    }
    if !wait_until(false, sessions, custom.is_some(), stop_timeout) {
        return Ok(fail(
            &format!(
                "the session did not stop within {} ms",
                stop_timeout.as_millis()
            ),
            3,
        ));
    }
    emit_line("{\"event\":\"stopped\"}");
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => fail(&e, 2),
    }
}
