//! `shmtrace serve --attach FILE[@OFFSET]`: each firmware region is read by
//! a `shmtrace bridge --input region:FILE@OFFSET` child of the service,
//! connected to the service's own producer socket, restarted with a
//! backoff whenever it ends.
//!
//! Why a child per region rather than a thread: the producer library holds
//! one service connection per process, so threads would put every region
//! under one producer (one name, one SMB, one writer-id space); and a
//! region's memory can hurt the process that maps it (a file truncated
//! under the mapping faults with SIGBUS), which must cost that region only,
//! never the service or the other regions. A child is also its own line in
//! `top`: the CPU a firmware producer costs is measured per process.
//!
//! A region has one reader: a child whose region another reader holds
//! exits saying so (status 4) and is restarted like any other, so it takes
//! the region over once the other reader is gone.
//!
//! Children stop when the service does: their stdin is a pipe from the
//! service (`--exit-on-stdin-eof`), closed at shutdown or when the service
//! dies; one that does not stop within [`STOP_WAIT`] is killed.

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::input::InputSpec;

/// First wait before restarting a child that ended.
pub const RESTART_MIN: Duration = Duration::from_secs(1);
/// Longest wait between restarts.
pub const RESTART_MAX: Duration = Duration::from_secs(30);
/// A child that ran this long resets the backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// How long a child may take to stop once asked.
pub const STOP_WAIT: Duration = Duration::from_secs(3);
/// How often the supervisor looks at its child.
const WATCH: Duration = Duration::from_millis(50);

/// What to run for one region.
#[derive(Debug, Clone)]
pub struct AttachSpec {
    /// The region file.
    pub path: PathBuf,
    /// The region's offset in it.
    pub offset: u64,
}

impl std::str::FromStr for AttachSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match format!("region:{s}").parse::<InputSpec>() {
            Ok(InputSpec::Region { path, offset }) if offset % 8 == 0 => {
                Ok(AttachSpec { path, offset })
            }
            Ok(InputSpec::Region { offset, .. }) => {
                Err(format!("the region offset {offset:#x} is not 8-aligned"))
            }
            Ok(_) => Err(format!("invalid region {s:?}")),
            Err(e) => Err(e.why.to_string()),
        }
    }
}

impl std::fmt::Display for AttachSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{:#x}", self.path.display(), self.offset)
    }
}

/// How the children run.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// The `shmtrace` binary to run (this one).
    pub program: PathBuf,
    /// The service's producer socket.
    pub socket: String,
    /// The children's log level.
    pub log_level: log::LevelFilter,
    /// The region poll interval (`bridge --poll-interval`), microseconds.
    pub poll_interval_us: u64,
}

/// The supervisors of all attached regions.
pub struct Attachments {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Attachments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachments")
            .field("regions", &self.threads.len())
            .finish()
    }
}

impl Attachments {
    /// Starts one supervised child per region. A region named twice
    /// (the same file, by any path, and offset) is refused
    /// (`InvalidInput`): a region has one reader, the second child would be
    /// refused on every restart.
    pub fn start(specs: &[AttachSpec], options: &AttachOptions) -> io::Result<Self> {
        // A file that does not exist yet is compared by the path given.
        let file =
            |s: &AttachSpec| std::fs::canonicalize(&s.path).unwrap_or_else(|_| s.path.clone());
        for (k, spec) in specs.iter().enumerate() {
            if specs[..k]
                .iter()
                .any(|s| file(s) == file(spec) && s.offset == spec.offset)
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{spec} is given twice (a region has one reader)"),
                ));
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for spec in specs {
            let (spec, options, stop) = (spec.clone(), options.clone(), stop.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("attach {spec}"))
                    .spawn(move || supervise(&spec, &options, &stop))?,
            );
        }
        Ok(Attachments { stop, threads })
    }

    /// Stops every child (their stdin closes; a stubborn one is killed)
    /// and waits for the supervisors.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn spawn(spec: &AttachSpec, options: &AttachOptions) -> io::Result<Child> {
    Command::new(&options.program)
        .arg("bridge")
        .arg("--input")
        .arg(format!("region:{spec}"))
        .arg("--socket")
        .arg(&options.socket)
        .arg("--poll-interval")
        .arg(format!("{}us", options.poll_interval_us))
        .arg("--log-level")
        .arg(options.log_level.to_string())
        .arg("--exit-on-stdin-eof")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
}

/// Runs one region's child until `stop`, restarting it with a backoff.
fn supervise(spec: &AttachSpec, options: &AttachOptions, stop: &AtomicBool) {
    let mut backoff = RESTART_MIN;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let mut child = match spawn(spec, options) {
            Ok(c) => c,
            Err(e) => {
                log::error!("attach {spec}: cannot start its bridge: {e}");
                if !sleep_unless(stop, backoff) {
                    return;
                }
                backoff = (backoff * 2).min(RESTART_MAX);
                continue;
            }
        };
        log::info!("attach {spec}: bridge started (pid {})", child.id());
        let status = watch(&mut child, stop);
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if started.elapsed() >= HEALTHY_RUN {
            backoff = RESTART_MIN;
        }
        log::warn!(
            "attach {spec}: its bridge ended ({}); restarting in {} s",
            status.map_or_else(|e| e.to_string(), |s| s.to_string()),
            backoff.as_secs_f32()
        );
        if !sleep_unless(stop, backoff) {
            return;
        }
        backoff = (backoff * 2).min(RESTART_MAX);
    }
}

/// Waits for `child` to end, or for `stop` (then closes its stdin and
/// gives it [`STOP_WAIT`] before killing it).
fn watch(child: &mut Child, stop: &AtomicBool) -> io::Result<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if stop.load(Ordering::Relaxed) {
            drop(child.stdin.take());
            let deadline = Instant::now() + STOP_WAIT;
            while Instant::now() < deadline {
                if let Some(status) = child.try_wait()? {
                    return Ok(status);
                }
                std::thread::sleep(WATCH);
            }
            child.kill()?;
            return child.wait();
        }
        std::thread::sleep(WATCH);
    }
}

/// Sleeps `d` unless `stop` is set first; `false` if stopped.
fn sleep_unless(stop: &AtomicBool, d: Duration) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(WATCH.min(deadline - Instant::now()));
    }
    !stop.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_specs_parse_or_say_why_not() {
        let ok: AttachSpec = "/dev/shm/ram@0x100".parse().unwrap();
        assert_eq!((ok.path.to_str(), ok.offset), (Some("/dev/shm/ram"), 0x100));
        assert_eq!(ok.to_string(), "/dev/shm/ram@0x100");
        let plain: AttachSpec = "ram.bin".parse().unwrap();
        assert_eq!(plain.offset, 0);
        assert!("ram@4"
            .parse::<AttachSpec>()
            .unwrap_err()
            .contains("8-aligned"));
        assert!("ram@x".parse::<AttachSpec>().is_err());
        assert!("".parse::<AttachSpec>().is_err());
    }

    #[test]
    fn a_region_attached_twice_is_refused_before_any_child_starts() {
        let specs: Vec<AttachSpec> = ["ram@0x100", "ram@0", "ram@256"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let options = AttachOptions {
            program: PathBuf::from("/nonexistent/shmtrace"),
            socket: "p.sock".into(),
            log_level: log::LevelFilter::Off,
            poll_interval_us: 1000,
        };
        let e = Attachments::start(&specs, &options).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            e.to_string(),
            "ram@0x100 is given twice (a region has one reader)"
        );
        // The same file by another path.
        let dir = std::env::temp_dir();
        let file = dir.join(format!("shmtrace-attach-twice-{}", std::process::id()));
        std::fs::write(&file, b"").unwrap();
        let name = file.file_name().unwrap().to_string_lossy();
        let specs: Vec<AttachSpec> = [
            format!("{}@0", file.display()),
            format!("{}/./{name}@0", dir.display()),
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let e = Attachments::start(&specs, &options).unwrap_err();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
