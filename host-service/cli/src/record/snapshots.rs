//! The snapshots a CLONE_SNAPSHOT session's triggers ask for, taken off the
//! session's loop, as perfetto_cmd takes them on a thread of its own
//! (`OnCloneSnapshotTriggerReceived` and `CloneSessionOnThread`,
//! src/perfetto_cmd/perfetto_cmd.cc: one extra thread, each snapshot a
//! consumer connection of its own, one after the other).
//!
//! A clone waits for the source's flush (up to its `flush_timeout_ms`), so
//! taking it on the loop would hold back Ctrl-C, the session's own stop
//! and the triggers after it. Here the loop only numbers the trigger and
//! hands it to one worker thread; the loop reports each outcome as it
//! comes back.
//!
//! Invariants:
//! - Every trigger handed over gets its number at once (`<output>.<n>`, n
//!   counting the triggers fired, as perfetto_cmd's `snapshot_count_`): a
//!   failed snapshot keeps its number, the next one takes the next.
//! - Every trigger handed over ends as exactly one [`Outcome`], reported
//!   before `record` exits: written, failed (with the reason), or not
//!   taken because the session had ended before the worker came to it
//!   (perfetto_cmd drops those without a word). [`Snapshots::finish`]
//!   waits for the one in progress (bounded by the clone's own timeout)
//!   and reports the rest.
//! - The worker never touches the session's own connection or output file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::Serialize;
use serde_json::json;

use shmtrace_ipc::protos::clone_session_request::Selector;
use shmtrace_ipc::protos::observable_events::CloneTriggerHit;
use shmtrace_ipc::protos::CloneSessionRequest;
use shmtrace_ipc::socket::SocketAddress;

use super::clone::{self, SnapshotError};
use super::progress::{Progress, ProgressMode};
use super::OutputFile;
use crate::consumer::Consumer;

/// A snapshot that was asked for and not written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedSnapshot {
    /// The file it would have been (`<output>.<n>`).
    pub path: String,
    /// The trigger that asked for it.
    pub trigger: String,
    /// Why there is none.
    pub error: String,
}

/// One snapshot for the worker.
#[derive(Debug)]
struct Job {
    path: PathBuf,
    trigger: String,
    request: CloneSessionRequest,
}

/// What became of a [`Job`].
#[derive(Debug)]
enum Outcome {
    /// Written into `path`, with this many packets read (0 if the service
    /// wrote it itself).
    Written {
        path: PathBuf,
        trigger: String,
        packets: u64,
    },
    /// None written.
    Failed(FailedSnapshot),
}

/// The snapshots of one session: numbering, the worker, the outcomes.
#[derive(Debug)]
pub struct Snapshots {
    /// The session's output file, which the snapshots are named after
    /// (`None`: this record writes none, so no snapshot can be named).
    base: Option<PathBuf>,
    /// The consumer socket the worker connects to.
    address: SocketAddress,
    /// Triggers numbered so far: the `n` of the next snapshot.
    fired: u64,
    /// Jobs handed over whose outcome has not come back.
    in_flight: usize,
    /// Set when the session is over: the worker skips the jobs left.
    ended: Arc<AtomicBool>,
    worker: Option<(Sender<Job>, JoinHandle<()>)>,
    outcomes: (Sender<Outcome>, Receiver<Outcome>),
    /// Snapshots written, in the order they completed.
    pub written: Vec<PathBuf>,
    /// Snapshots not written.
    pub failed: Vec<FailedSnapshot>,
}

impl Snapshots {
    /// No snapshot yet, for a session on `address` whose trace goes into
    /// `base` (if a file).
    pub fn new(address: SocketAddress, base: Option<&Path>) -> Self {
        Snapshots {
            base: base.filter(|b| !super::is_stdout(b)).map(Path::to_path_buf),
            address,
            fired: 0,
            in_flight: 0,
            ended: Arc::new(AtomicBool::new(false)),
            worker: None,
            outcomes: mpsc::channel(),
            written: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// A CLONE_SNAPSHOT trigger fired: numbers it and hands its snapshot
    /// to the worker (started on the first).
    pub fn start(&mut self, hit: CloneTriggerHit, progress: &mut Progress) {
        let trigger = hit.trigger_name.clone().unwrap_or_default();
        let Some(base) = &self.base else {
            progress.warn(&format!(
                "the CLONE_SNAPSHOT trigger {trigger:?} fired, but this record writes no file \
                 of its own to name a snapshot after: none taken"
            ));
            return;
        };
        let path = PathBuf::from(format!("{}.{}", base.display(), self.fired));
        self.fired += 1;
        self.in_flight += 1;
        let request = CloneSessionRequest {
            selector: Some(Selector::SessionId(
                hit.tracing_session_id.unwrap_or(0) as u64
            )),
            clone_trigger_name: hit.trigger_name,
            clone_trigger_producer_name: hit.producer_name,
            clone_trigger_trusted_producer_uid: hit.producer_uid.map(|u| u as i32),
            clone_trigger_boot_time_ns: hit.boot_time_ns,
            clone_trigger_delay_ms: hit.trigger_delay_ms,
            ..Default::default()
        };
        let job = Job {
            path,
            trigger,
            request,
        };
        if self.ended.load(Ordering::Relaxed) {
            let why = "not taken: the trigger came as the session ended".to_owned();
            let _ = self.outcomes.0.send(failed(&job, why));
            return;
        }
        progress.note(&format!(
            "the CLONE_SNAPSHOT trigger {:?} fired: taking a snapshot into {}",
            job.trigger,
            job.path.display()
        ));
        let sent = match self.worker() {
            Ok(jobs) => jobs
                .send(job)
                .map_err(|e| (e.0, "the snapshot thread has gone".to_owned())),
            Err(why) => Err((job, why)),
        };
        if let Err((job, why)) = sent {
            // Reported like any failure, through the outcomes.
            let _ = self.outcomes.0.send(failed(&job, why));
        }
    }

    /// The worker's queue, starting the worker if there is none.
    fn worker(&mut self) -> Result<&Sender<Job>, String> {
        if self.worker.is_none() {
            let (jobs, queue) = mpsc::channel::<Job>();
            let outcomes = self.outcomes.0.clone();
            let ended = Arc::clone(&self.ended);
            let address = self.address.clone();
            let thread = std::thread::Builder::new()
                .name("snapshots".into())
                .spawn(move || {
                    for job in queue {
                        let outcome = if ended.load(Ordering::Relaxed) {
                            failed(
                                &job,
                                "not taken: the session had ended before its turn came".into(),
                            )
                        } else {
                            take(&address, job)
                        };
                        if outcomes.send(outcome).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| format!("cannot start the snapshot thread: {e}"))?;
            self.worker = Some((jobs, thread));
        }
        Ok(&self.worker.as_ref().expect("started above").0)
    }

    /// Reports the outcomes that came back, without waiting.
    pub fn poll(&mut self, progress: &mut Progress) {
        while let Ok(outcome) = self.outcomes.1.try_recv() {
            self.report(outcome, progress);
        }
    }

    /// The session is over: snapshots not begun are not taken (each is
    /// reported so), the one in progress goes on.
    pub fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// The session is over ([`Self::end`]): waits for the snapshot in
    /// progress; reports every outcome not reported yet.
    pub fn finish(&mut self, progress: &mut Progress) {
        self.end();
        self.poll(progress);
        if self.in_flight > 0 {
            progress.note(&format!(
                "waiting for the snapshot being taken ({} snapshot(s) not done; those not \
                 begun are not taken, the session has ended; Ctrl-C again aborts, removing \
                 the incomplete one)",
                self.in_flight
            ));
        }
        if let Some((jobs, thread)) = self.worker.take() {
            drop(jobs);
            // The worker ends once its queue is empty; the clone it waits
            // for is bounded by the clone's own timeout.
            let _ = thread.join();
        }
        while self.in_flight > 0 {
            match self.outcomes.1.try_recv() {
                Ok(outcome) => self.report(outcome, progress),
                // Only if the worker died: what it had is reported so.
                Err(_) => {
                    progress.warn(&format!(
                        "{} snapshot(s) were lost with the snapshot thread",
                        self.in_flight
                    ));
                    break;
                }
            }
        }
    }

    fn report(&mut self, outcome: Outcome, progress: &mut Progress) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match outcome {
            Outcome::Written {
                path,
                trigger,
                packets,
            } => {
                progress.note(&format!(
                    "the CLONE_SNAPSHOT trigger {trigger:?} fired: wrote a snapshot into {} \
                     ({packets} packets)",
                    path.display()
                ));
                progress.event(json!({
                    "event": "snapshot",
                    "trigger": trigger,
                    "path": path.display().to_string(),
                }));
                self.written.push(path);
            }
            Outcome::Failed(f) => {
                progress.warn(&format!(
                    "the CLONE_SNAPSHOT trigger {:?} fired, and no snapshot went into {}: {}",
                    f.trigger, f.path, f.error
                ));
                progress.event(json!({
                    "event": "snapshot_failed",
                    "trigger": f.trigger,
                    "path": f.path,
                    "error": f.error,
                }));
                self.failed.push(f);
            }
        }
    }
}

impl Drop for Snapshots {
    /// A session that failed still lets the snapshot in progress end
    /// before its file is left (and skips the others).
    fn drop(&mut self) {
        self.ended.store(true, Ordering::Relaxed);
        if let Some((jobs, thread)) = self.worker.take() {
            drop(jobs);
            let _ = thread.join();
        }
    }
}

fn failed(job: &Job, error: String) -> Outcome {
    Outcome::Failed(FailedSnapshot {
        path: job.path.display().to_string(),
        trigger: job.trigger.clone(),
        error,
    })
}

/// Takes one snapshot, on a connection of its own (on the worker).
fn take(address: &SocketAddress, job: Job) -> Outcome {
    let output = match OutputFile::open(&job.path) {
        Ok(o) => o,
        Err(e) => return failed(&job, e.to_string()),
    };
    // The worker's own notes ("reading the snapshot") are not shown: the
    // loop reports the outcome.
    let mut quiet = Progress::new(ProgressMode::None);
    let taken = Consumer::connect_to(address.clone())
        .map_err(SnapshotError::Failed)
        .and_then(|c| clone::snapshot(&c, job.request.clone(), &output, &mut quiet));
    match taken {
        Ok(report) => Outcome::Written {
            path: job.path,
            trigger: job.trigger,
            packets: report.packets_written,
        },
        Err(e) => {
            output.discard();
            failed(
                &job,
                match e {
                    SnapshotError::Refused(error) => format!("the service refused: {error}"),
                    SnapshotError::Failed(e) => e.to_string(),
                },
            )
        }
    }
}
