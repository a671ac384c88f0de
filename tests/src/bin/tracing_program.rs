//! A program traced with `tracing` and `log` through shmtrace-producer's
//! `TracingLayer` and `TraceLogger`, for `tests/tracing_layer.rs`.
//!
//! It connects to `$PERFETTO_PRODUCER_SOCK_NAME`, waits (up to 30 s) for a
//! session to enable track events, reports `{"event":"enabled"}` on stdout,
//! runs the workload below once, flushes, reports `{"event":"done"}`, and
//! exits once the session stopped (or after 30 s).
//!
//! The workload (each item's target in parentheses; the test's session
//! disables `noisy`):
//!
//! * span `root` (in `app`) with a field of every type (`int` -5, `uint` 7,
//!   `flag` true, `ratio` 0.25, `text` "hello", `debug` `Some(3)`) and an
//!   empty field `pending`, entered on the main thread; inside it:
//!   * span `query` (in `app::db`) (`table` "users"), and in it the event
//!     `info!(rows = 3, "query done")` (in `app::db`);
//!   * the event `warn!(code = 42, ok = false)` (in `app`);
//!   * the event `trace!(n = 1)` (in `noisy`) and the span `hidden` (in `noisy`),
//!     entered and exited;
//!   * span `task` (in `app`) (`id` 1), made to follow `root`;
//!   * `root.record("pending", 99)`;
//!   * spans `a` and `b` (in `app`), entered in that order and exited out of
//!     order (`a` first);
//!   * `log::info!` (in `app::log`) "plain literal", `log::warn!` (in `app::log`)
//!     "formatted 5", `log::info!` (in `noisy`) "filtered".
//! * `task` instruments a future that logs `info!(step)` (in `app`) three times
//!   with a yield between: polled on the main thread, then on thread
//!   `poll-b`, then `poll-c`, then the main thread again, which completes
//!   it and drops it (closing `task`).
//! * Then, on the main thread, three wide events (in `app`), packets of
//!   more than 127 bytes: [`wide`]'s 11 fields (one a text of 150 bytes)
//!   and a 43-byte literal message, `i` 0, 1, 2.

use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use shmtrace_producer::{track_event, ProducerConfig, TracingLayer};
use tracing::Instrument as _;
use tracing_subscriber::layer::SubscriberExt as _;

const TIMEOUT: Duration = Duration::from_secs(30);

fn report(event: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{{\"event\":\"{event}\"}}");
    let _ = out.flush();
}

/// Pending once, then ready.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

async fn task_body() {
    for step in 0..3u64 {
        tracing::info!(target: "app", step);
        YieldOnce(false).await;
    }
}

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

fn poll(task: &mut Task) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    task.as_mut().poll(&mut cx).is_ready()
}

fn poll_on(name: &str, mut task: Task) -> Task {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            assert!(!poll(&mut task), "the task is not done yet");
            task
        })
        .expect("spawn")
        .join()
        .expect("the polling thread")
}

/// The text of the wide events' `body` field.
const BODY: &str = "a text of one hundred and fifty bytes, longer than a one-byte length can say, \
                    written by the wide events of the tracing program: ...................**";

/// The wide event (see the module docs), its fields' values made of `i`.
fn wide(i: u64) {
    tracing::info!(
        target: "app",
        i,
        big = 1u64 << 40,
        neg = -10i64,
        flag = true,
        ratio = 0.5f64,
        text = "wide",
        unit = "bytes",
        source = "tracing-program",
        dbg = ?[1u8, 2, 3],
        body = BODY,
        seq = i * 3,
        "a literal message of forty-three bytes here"
    );
}

fn workload() {
    let root = tracing::info_span!(
        target: "app",
        "root",
        int = -5i64,
        uint = 7u64,
        flag = true,
        ratio = 0.25f64,
        text = "hello",
        debug = ?Some(3),
        pending = tracing::field::Empty,
    )
    .entered();
    {
        let _query = tracing::info_span!(target: "app::db", "query", table = "users").entered();
        tracing::info!(target: "app::db", rows = 3u64, "query done");
    }
    tracing::warn!(target: "app", code = 42i64, ok = false);
    tracing::trace!(target: "noisy", n = 1u64);
    drop(tracing::info_span!(target: "noisy", "hidden").entered());
    let task_span = tracing::info_span!(target: "app", "task", id = 1u64);
    task_span.follows_from(root.id());
    root.record("pending", 99u64);
    let a = tracing::info_span!(target: "app", "a").entered();
    let b = tracing::info_span!(target: "app", "b").entered();
    drop(a);
    drop(b);
    log::info!(target: "app::log", "plain literal");
    log::warn!(target: "app::log", "formatted {}", 5);
    log::info!(target: "noisy", "filtered");
    drop(root);

    let mut task: Task = Box::pin(task_body().instrument(task_span));
    assert!(!poll(&mut task));
    let task = poll_on("poll-b", task);
    let mut task = poll_on("poll-c", task);
    assert!(poll(&mut task), "the task is done after its fourth poll");
    drop(task);
    for i in 0..3 {
        wide(i);
    }
}

fn main() {
    shmtrace_producer::init(ProducerConfig::default()).expect("start the producer");
    // `set_global_default`, not `.init()`: with tracing-subscriber's
    // `tracing-log` feature (another workspace package enables it), `init`
    // also installs a `log` logger, and ours must be the one.
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(TracingLayer::new()),
    )
    .expect("install the subscriber");
    shmtrace_producer::logger::init(log::LevelFilter::Trace).expect("install the logger");
    let deadline = Instant::now() + TIMEOUT;
    while !track_event::is_enabled() {
        assert!(Instant::now() < deadline, "no session enabled track events");
        std::thread::sleep(Duration::from_millis(10));
    }
    report("enabled");
    workload();
    shmtrace_producer::flush_all();
    report("done");
    let deadline = Instant::now() + TIMEOUT;
    while track_event::is_enabled() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}
