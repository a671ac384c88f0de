//! The example app that `shmtrace demo` traces: a small game loop that
//! renders frames on its main thread and hands jobs to two worker threads,
//! instrumented with `shmtrace-producer` exactly as a user's app is
//! (categories, scoped slices with arguments, instants, counters, flows).
//!
//! [`App::stop`] quiesces it: the main loop finishes its frame, the workers
//! finish every job already handed to them, so every slice is closed and
//! every flow reaches its end before the session stops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shmtrace_producer::{
    trace_counter, trace_event, trace_instant, Arg, Category, CounterTrack, CounterUnit, Flow,
};

/// The main loop: frames, update and render.
pub static FRAME: Category =
    Category::new("frame").with_description("The main loop: update and render");
/// Jobs handed to worker threads, linked to their submission by flows.
pub static JOBS: Category = Category::new("jobs").with_description("Work handed to worker threads");
/// Counters: frame time, queue depth, memory.
pub static METRICS: Category =
    Category::new("metrics").with_description("Frame time, queue depth, memory");

/// Every category of the app.
pub static CATEGORIES: [&Category; 3] = [&FRAME, &JOBS, &METRICS];

/// Frame period (60 frames a second).
const FRAME_PERIOD: Duration = Duration::from_micros(16_667);
/// Worker threads.
pub const WORKERS: usize = 2;
const JOB_KINDS: [&str; 3] = ["physics", "audio", "pathfinding"];

/// What the app did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppStats {
    /// Frames rendered.
    pub frames: u64,
    /// Jobs run by the workers.
    pub jobs: u64,
}

struct Job {
    id: u64,
    kind: &'static str,
    cost: Duration,
}

/// The running app.
#[derive(Debug)]
pub struct App {
    stop: Arc<AtomicBool>,
    main: Option<JoinHandle<u64>>,
    workers: Vec<JoinHandle<u64>>,
}

/// Busy work of about `d` (a sleep would leave nothing to see in the
/// slices' thread-time; this is a demo of what a loaded thread looks like).
fn work(d: Duration) {
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < d {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
}

impl App {
    /// Starts the main loop and the workers.
    pub fn start() -> std::io::Result<App> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::new();
        for n in 0..WORKERS {
            let rx = Arc::clone(&rx);
            workers.push(
                std::thread::Builder::new()
                    .name(format!("demo-worker-{n}"))
                    .spawn(move || worker(&rx))?,
            );
        }
        let main = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("demo-main".into())
                .spawn(move || main_loop(&stop, tx))?
        };
        Ok(App {
            stop,
            main: Some(main),
            workers,
        })
    }

    /// Stops the app once its current frame and every queued job are done.
    pub fn stop(mut self) -> AppStats {
        self.stop.store(true, Ordering::Relaxed);
        let frames = self.main.take().map_or(0, |m| m.join().unwrap_or(0));
        // The main loop dropped its sender: the workers drain and return.
        let jobs = self.workers.drain(..).map(|w| w.join().unwrap_or(0)).sum();
        AppStats { frames, jobs }
    }
}

fn main_loop(stop: &AtomicBool, jobs: Sender<Job>) -> u64 {
    let frame_time = CounterTrack::new("frame time").with_unit_name("ms");
    let queue_depth = CounterTrack::new("queued jobs");
    let heap = CounterTrack::new("heap").with_unit(CounterUnit::SizeBytes);
    let mut next_job = 0u64;
    let mut queued = 0i64;
    let mut frame = 0u64;
    // Whole frames only: start once the session has enabled tracing.
    while !FRAME.is_enabled() && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(1));
    }
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        {
            let _frame = trace_event!(FRAME, "frame", "number" => frame);
            {
                let _update = trace_event!(FRAME, "update", "entities" => 100 + frame % 50);
                work(Duration::from_micros(1500 + (frame % 7) * 150));
                // Every other frame hands out a few jobs.
                if frame % 2 == 0 {
                    for k in 0..(1 + frame % 3) {
                        let id = next_job;
                        next_job += 1;
                        let kind = JOB_KINDS[(id % 3) as usize];
                        let flow = [Flow::process_scoped(id)];
                        let args = [Arg::new("job", id), Arg::new("kind", kind)];
                        JOBS.instant("submit job").flows(&flow).args(&args).emit();
                        let cost = Duration::from_micros(800 + 400 * k);
                        if jobs.send(Job { id, kind, cost }).is_ok() {
                            queued += 1;
                        }
                    }
                }
            }
            {
                let _render = trace_event!(FRAME, "render");
                {
                    let _draw = trace_event!(FRAME, "draw", "objects" => 120 + frame % 40, "wireframe" => false);
                    work(Duration::from_micros(2500 + (frame % 5) * 300));
                }
                trace_instant!(FRAME, "present", "vsync" => true);
            }
        }
        let elapsed = start.elapsed();
        trace_counter!(METRICS, &frame_time, elapsed.as_secs_f64() * 1000.0);
        // Jobs finished since the last frame are not tracked per frame; an
        // estimate is enough for the counter.
        queued = (queued - 2).max(0);
        trace_counter!(METRICS, &queue_depth, queued);
        trace_counter!(
            METRICS,
            &heap,
            48 * 1024 * 1024 + (frame % 120) as i64 * 4096
        );
        frame += 1;
        if let Some(rest) = FRAME_PERIOD.checked_sub(elapsed) {
            std::thread::sleep(rest);
        }
    }
    frame
}

fn worker(jobs: &Mutex<Receiver<Job>>) -> u64 {
    let mut done = 0;
    loop {
        let job = {
            let Ok(rx) = jobs.lock() else { return done };
            rx.recv_timeout(Duration::from_millis(50))
        };
        match job {
            Ok(job) => {
                let flow = [Flow::process_scoped(job.id)];
                let args = [Arg::new("job", job.id), Arg::new("kind", job.kind)];
                let _slice = JOBS
                    .slice("run job")
                    .terminating_flows(&flow)
                    .args(&args)
                    .scoped();
                work(job.cost);
                done += 1;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return done,
        }
    }
}
