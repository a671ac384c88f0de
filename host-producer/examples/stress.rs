//! Emits N track events over T threads as fast as it can, and reports the
//! cost per event.
//!
//! ```text
//! cargo run --release -p shmtrace-producer --example stress -- -n 1000000 -t 4
//!     [--socket PATH] [--shmem-kb KB] [--stall-ms MS] [--start-timeout-s S] [--stop-timeout-s S]
//! ```
//!
//! It connects to the producer socket (`--socket`, else
//! `$PERFETTO_PRODUCER_SOCK_NAME`, else Perfetto's default), waits until a
//! session enables its categories (`stress`, `stress.flow`,
//! `stress.counter`), emits, then waits for the session to stop and prints
//! what it emitted. The SMB size hint defaults to 4 MiB (`--shmem-kb`); when
//! the service cannot keep up, events are dropped and the losses marked in
//! the trace (Perfetto's default), or, with `--stall-ms`, writers wait up to
//! that long for a free chunk first. Each group of 10 events is: slice "outer" (int and
//! string args) { slice "inner" (double and bool args) { instant "tick"
//! (pointer and uint args), instant "flow_out" (starts a flow), instant
//! "flow_in" (terminates it), instant "nested" (a dict arg holding an
//! array) } }, an int counter and a double counter; leftover events are
//! plain instants.
//!
//! Each event is emitted only if its own category is enabled at that
//! moment (a session may enable `stress` but not `stress.flow`); the counts
//! say exactly what was handed to the library, and `skipped_disabled` how
//! many of the N events were not because their category was off.
//!
//! Output: a human summary on stderr and, on stdout, one JSON line
//! `{"event":"done", "pid", "events", "threads", "nested_args",
//! "ns_per_event", "wall_ns_per_event", "packets_dropped", "stats":{…},
//! "emitted":{…}}` whose `emitted` has exactly the keys of the interop
//! checker (`tests/checker/check_trace.py --expect`) and `stats` is the
//! producer's [`stats()`](shmtrace_producer::stats) once emission ended
//! (every loss it counted: what reaches the trace is what was emitted less
//! `packets_dropped`, `orphan_ends_suppressed`, `reentrant_drops` and
//! `writerless_drops`, plus `slice_ends_written_late`, lost ends written
//! after all), then `{"event":"stopped","stats":{…}}` once the session
//! stopped.

use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use shmtrace_producer::track_event::SliceGuard;
use shmtrace_producer::{
    trace_counter, trace_event, track_event, Arg, BufferExhaustedPolicy, Category, CounterTrack,
    DebugValue, Flow, ProducerConfig, ProducerStats,
};

static STRESS: Category =
    Category::new("stress").with_description("Stress test slices and instants");
static STRESS_FLOW: Category = Category::new("stress.flow").with_description("Stress test flows");
static STRESS_COUNTER: Category =
    Category::new("stress.counter").with_description("Stress test counters");

#[derive(Default, Clone, Copy, Debug)]
struct Counts {
    slice_begin: u64,
    slice_end: u64,
    instant: u64,
    counter_int: u64,
    counter_double: u64,
    flow_begin: u64,
    flow_end: u64,
    arg_int: u64,
    arg_uint: u64,
    arg_double: u64,
    arg_bool: u64,
    arg_string: u64,
    arg_pointer: u64,
    arg_nested: u64,
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
        self.arg_int += o.arg_int;
        self.arg_uint += o.arg_uint;
        self.arg_double += o.arg_double;
        self.arg_bool += o.arg_bool;
        self.arg_string += o.arg_string;
        self.arg_pointer += o.arg_pointer;
        self.arg_nested += o.arg_nested;
        self.skipped_disabled += o.skipped_disabled;
    }

    fn events(&self) -> u64 {
        self.slice_begin + self.slice_end + self.instant + self.counter_int + self.counter_double
    }

    fn json(&self) -> String {
        format!(
            "{{\"slice_begin\":{},\"slice_end\":{},\"instant\":{},\"counter_int\":{},\"counter_double\":{},\
             \"flow_begin\":{},\"flow_end\":{},\"large\":0,\"large_bytes\":0,\"arg_int\":{},\"arg_uint\":{},\
             \"arg_double\":{},\"arg_bool\":{},\"arg_string\":{},\"arg_pointer\":{},\
             \"skipped_disabled\":{}}}",
            self.slice_begin,
            self.slice_end,
            self.instant,
            self.counter_int,
            self.counter_double,
            self.flow_begin,
            self.flow_end,
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

impl Counts {
    /// Whether `category` is enabled for the next event; if not, the event
    /// is counted as skipped. Each event is checked against its own
    /// category, so a session that enables only some of them gets exactly
    /// the counts of what it enabled.
    fn on(&mut self, category: &Category) -> bool {
        let on = category.is_enabled();
        if !on {
            self.skipped_disabled += 1;
        }
        on
    }

    /// Counts the end of a scoped slice whose guard is about to drop: it is
    /// written if its begin was and the category is still enabled.
    fn end(&mut self, begun: bool) {
        if begun && STRESS.is_enabled() {
            self.slice_end += 1;
        } else {
            self.skipped_disabled += 1;
        }
    }
}

/// One thread's share: `events` events, in groups of 10.
fn emit(index: usize, events: u64) -> (Counts, Duration) {
    let mut c = Counts::default();
    let label = format!("thread-{index}");
    let int_name = format!("stress.int.t{index}");
    let double_name = format!("stress.double.t{index}");
    let int_track = CounterTrack::new(&int_name);
    let double_track = CounterTrack::new(&double_name);
    let pointee = 0u64;
    let start = Instant::now();
    let groups = events / 10;
    for g in 0..groups {
        let outer_begun = c.on(&STRESS);
        let outer = if outer_begun {
            c.slice_begin += 1;
            c.arg_int += 1;
            c.arg_string += 1;
            trace_event!(STRESS, "outer", "i" => g as i64, "label" => label.as_str())
        } else {
            SliceGuard::disabled()
        };
        let inner_begun = c.on(&STRESS);
        let inner = if inner_begun {
            c.slice_begin += 1;
            c.arg_double += 1;
            c.arg_bool += 1;
            trace_event!(STRESS, "inner", "ratio" => g as f64 / 3.0, "even" => g % 2 == 0)
        } else {
            SliceGuard::disabled()
        };

        if c.on(&STRESS) {
            let tick = [
                Arg::new("ptr", DebugValue::pointer(&pointee)),
                Arg::new("big", u64::MAX - g),
            ];
            STRESS.instant("tick").args(&tick).emit();
            c.instant += 1;
            c.arg_pointer += 1;
            c.arg_uint += 1;
        }

        let flow = [Flow::process_scoped(((index as u64) << 40) | g)];
        if c.on(&STRESS_FLOW) {
            STRESS_FLOW.instant("flow_out").flows(&flow).emit();
            c.instant += 1;
            c.flow_begin += 1;
        }
        if c.on(&STRESS_FLOW) {
            STRESS_FLOW
                .instant("flow_in")
                .terminating_flows(&flow)
                .emit();
            c.instant += 1;
            c.flow_end += 1;
        }

        if c.on(&STRESS) {
            let items = [
                DebugValue::from(1),
                DebugValue::from(2.5),
                DebugValue::from("three"),
            ];
            let dict = [
                ("count", DebugValue::from(g)),
                ("items", DebugValue::Array(&items)),
            ];
            let nested = [Arg::new("dict", DebugValue::Dict(&dict))];
            STRESS.instant("nested").args(&nested).emit();
            c.instant += 1;
            c.arg_nested += 1;
        }

        c.end(inner_begun);
        drop(inner);
        c.end(outer_begun);
        drop(outer);

        if c.on(&STRESS_COUNTER) {
            trace_counter!(STRESS_COUNTER, &int_track, g as i64);
            c.counter_int += 1;
        }
        if c.on(&STRESS_COUNTER) {
            trace_counter!(STRESS_COUNTER, &double_track, g as f64 * 0.25);
            c.counter_double += 1;
        }
    }
    for _ in 0..events % 10 {
        if c.on(&STRESS) {
            STRESS.instant("tick").emit();
            c.instant += 1;
        }
    }
    (c, start.elapsed())
}

struct Options {
    events: u64,
    threads: usize,
    socket: Option<String>,
    shmem_kb: u32,
    stall: Option<Duration>,
    start_timeout: Duration,
    stop_timeout: Duration,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        events: 1_000_000,
        threads: 1,
        socket: None,
        shmem_kb: 4096,
        stall: None,
        start_timeout: Duration::from_secs(60),
        stop_timeout: Duration::from_secs(60),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        let num = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{a}: not a number: {v:?}"))
        };
        match a.as_str() {
            "-n" | "--events" => o.events = num(value()?)?,
            "-t" | "--threads" => o.threads = num(value()?)? as usize,
            "--socket" => o.socket = Some(value()?),
            "--shmem-kb" => o.shmem_kb = num(value()?)? as u32,
            "--stall-ms" => o.stall = Some(Duration::from_millis(num(value()?)?)),
            "--start-timeout-s" => o.start_timeout = Duration::from_secs(num(value()?)?),
            "--stop-timeout-s" => o.stop_timeout = Duration::from_secs(num(value()?)?),
            "-h" | "--help" => {
                return Err(
                    "usage: stress -n EVENTS -t THREADS [--socket PATH] [--shmem-kb KB] [--stall-ms MS] \
                            [--start-timeout-s S] [--stop-timeout-s S]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if o.threads == 0 || o.threads > 4096 {
        return Err("-t must be 1..=4096".into());
    }
    Ok(o)
}

/// The producer's counters as a JSON object.
fn stats_json(s: &ProducerStats) -> String {
    format!(
        "{{\"chunks_committed\":{},\"chunks_lost\":{},\"acquire_failures\":{},\"stalls\":{},\
         \"stalls_given_up\":{},\"chunks_reclaimed\":{},\"packets_dropped\":{},\
         \"orphan_ends_suppressed\":{},\"slice_ends_written_late\":{},\"reentrant_drops\":{},\
         \"writerless_drops\":{}}}",
        s.chunks_committed,
        s.chunks_lost,
        s.acquire_failures,
        s.stalls,
        s.stalls_given_up,
        s.chunks_reclaimed,
        s.packets_dropped,
        s.orphan_ends_suppressed,
        s.slice_ends_written_late,
        s.reentrant_drops,
        s.writerless_drops
    )
}

fn wait_until(want: bool, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while STRESS.is_enabled() != want {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("stress: {e}");
            return ExitCode::from(2);
        }
    };
    let config = ProducerConfig {
        name: "stress".into(),
        socket: o.socket.clone(),
        shmem_size_hint_bytes: o.shmem_kb * 1024,
        ..Default::default()
    };
    let producer = match shmtrace_producer::init(config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("stress: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(limit) = o.stall {
        track_event::set_buffer_exhausted_policy(BufferExhaustedPolicy::StallThenDrop(limit));
    }
    track_event::register_categories(&[&STRESS, &STRESS_FLOW, &STRESS_COUNTER]);
    eprintln!("stress: waiting for a session enabling category \"stress\"");
    if !wait_until(true, o.start_timeout) {
        eprintln!(
            "stress: no session enabled \"stress\" within {:?} (connected: {})",
            o.start_timeout,
            producer.is_connected()
        );
        return ExitCode::from(3);
    }

    let barrier = Arc::new(Barrier::new(o.threads + 1));
    let per_thread = o.events / o.threads as u64;
    let extra = o.events % o.threads as u64;
    let handles: Vec<_> = (0..o.threads)
        .map(|i| {
            let barrier = barrier.clone();
            let n = per_thread + u64::from((i as u64) < extra);
            std::thread::Builder::new()
                .name(format!("stress-{i}"))
                .spawn(move || {
                    barrier.wait();
                    emit(i, n)
                })
        })
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("cannot spawn threads: {e}"));
    barrier.wait();
    let wall = Instant::now();
    let mut total = Counts::default();
    let mut busy = Duration::ZERO;
    for h in handles {
        let (c, elapsed) = h.join().unwrap_or_default();
        total.add(&c);
        busy += elapsed;
    }
    let wall = wall.elapsed();
    let events = total.events().max(1);
    let ns_per_event = busy.as_nanos() as f64 / events as f64;
    let wall_ns_per_event = wall.as_nanos() as f64 / events as f64;
    let stats_after_emit = shmtrace_producer::stats();
    eprintln!(
        "stress: {} events over {} threads in {:.3} s: {:.1} ns/event per thread, {:.1} ns/event wall \
         ({:.2} M events/s); {} skipped (category off), {} dropped (SMB full), {} slice ends \
         suppressed (their begin dropped), {} chunks",
        total.events(),
        o.threads,
        wall.as_secs_f64(),
        ns_per_event,
        wall_ns_per_event,
        events as f64 / wall.as_secs_f64() / 1e6,
        total.skipped_disabled,
        stats_after_emit.packets_dropped,
        stats_after_emit.orphan_ends_suppressed,
        stats_after_emit.chunks_committed
    );
    println!(
        "{{\"event\":\"done\",\"pid\":{},\"events\":{},\"threads\":{},\"nested_args\":{},\"ns_per_event\":{:.1},\
         \"wall_ns_per_event\":{:.1},\"packets_dropped\":{},\"stats\":{},\"emitted\":{}}}",
        std::process::id(),
        total.events(),
        o.threads,
        total.arg_nested,
        ns_per_event,
        wall_ns_per_event,
        stats_after_emit.packets_dropped,
        stats_json(&stats_after_emit),
        total.json()
    );
    eprintln!("stress: waiting for the session to stop");
    if !wait_until(false, o.stop_timeout) {
        eprintln!(
            "stress: the session did not stop within {:?}",
            o.stop_timeout
        );
        return ExitCode::from(3);
    }
    println!(
        "{{\"event\":\"stopped\",\"stats\":{}}}",
        stats_json(&shmtrace_producer::stats())
    );
    ExitCode::SUCCESS
}
