//! Child processes of a scenario: spawned with piped stdin/stdout and stderr
//! in a log file, read as JSON event lines, and killed when dropped — also
//! when a test panics — so no test leaves a process behind.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{HarnessError, Result};

/// Creates a FIFO at `path` (mode 0600): a one-way stream from one child
/// to another (a firmware's UART into a bridge).
pub fn make_fifo(path: &Path) -> std::io::Result<()> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .map_err(std::io::Error::from)
}

/// How much of a child's stderr log an error message quotes.
const STDERR_TAIL_BYTES: u64 = 4096;

/// A running driver process. Dropping it kills the process and reaps it.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Value>,
    stderr_log: PathBuf,
}

impl ChildProcess {
    /// Starts `command` as the process called `name`; its stderr goes to
    /// `<log_dir>/<name>.stderr`.
    pub fn spawn(name: &str, mut command: Command, log_dir: &Path) -> Result<Self> {
        let stderr_log = log_dir.join(format!("{}.stderr", name.replace(' ', "-")));
        let stderr = File::create(&stderr_log).map_err(|source| HarnessError::Io {
            action: "create",
            path: stderr_log.clone(),
            source,
        })?;
        let program = PathBuf::from(command.get_program());
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|source| HarnessError::Spawn {
                name: name.into(),
                program,
                source,
            })?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| HarnessError::Scenario("stdout not piped".into()))?;
        let (sender, events) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Non-JSON lines (none expected) become strings so they show
                // up in errors instead of vanishing.
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                if sender.send(value).is_err() {
                    break;
                }
            }
        });
        Ok(ChildProcess {
            name: name.into(),
            child,
            stdin,
            events,
            stderr_log,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The role name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for the next event line whose `"event"` is `event`, skipping
    /// other events. An `"error"` event, the end of stdout or the timeout
    /// fail.
    pub fn expect_event(&mut self, event: &str, timeout: Duration) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut skipped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(value) => match value.get("event").and_then(Value::as_str) {
                    Some(e) if e == event => return Ok(value),
                    Some("error") => {
                        let message = value.get("message").and_then(Value::as_str).unwrap_or("?");
                        return Err(self.driver_error(format!("reported an error: {message}")));
                    }
                    Some(other) => skipped.push(other.to_string()),
                    None => {
                        return Err(self.driver_error(format!("unexpected output line {value}")))
                    }
                },
                Err(RecvTimeoutError::Timeout) => {
                    return Err(HarnessError::Timeout {
                        name: self.name.clone(),
                        what: format!("\"{event}\" event"),
                        timeout,
                        seen: seen(&skipped),
                        stderr_tail: self.stderr_tail(),
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    return Err(self.driver_error(format!(
                        "exited ({}) before reporting \"{event}\"",
                        status.map_or("unknown status".into(), |s| s.to_string())
                    )));
                }
            }
        }
    }

    /// The event lines the process has printed so far and no
    /// [`expect_event`](Self::expect_event) has consumed, without waiting.
    pub fn pending_events(&mut self) -> Vec<Value> {
        self.events.try_iter().collect()
    }

    /// Whether the process is still running (it has not exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Writes one command line to the process's stdin.
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        let name = self.name.clone();
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| HarnessError::Scenario(format!("{name}: stdin already closed")))?;
        let written = stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush());
        written.map_err(|e| self.driver_error(format!("cannot write to stdin: {e}")))
    }

    /// Closes stdin (the drivers read end of input as "stop").
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the process to exit and requires status 0.
    pub fn expect_success(&mut self, timeout: Duration) -> Result<()> {
        let status = self.wait(timeout)?;
        if status.success() {
            Ok(())
        } else {
            Err(self.driver_error(format!("exited with {status}")))
        }
    }

    /// Waits for the process to exit by itself: its exit status.
    pub fn expect_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.wait(timeout)
    }

    /// Kills the process with SIGKILL, as a crash or the OOM killer would
    /// (no handler runs, nothing is flushed), and reaps it: its exit
    /// status, which says whether it had already exited by itself.
    pub fn kill(&mut self, timeout: Duration) -> Result<ExitStatus> {
        if let Err(e) = self.child.kill() {
            return Err(self.driver_error(format!("cannot send SIGKILL: {e}")));
        }
        self.wait(timeout)
    }

    fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                Ok(None) => {
                    let pending: Vec<String> = self
                        .pending_events()
                        .iter()
                        .map(|e| e.get("event").and_then(Value::as_str).unwrap_or("?").into())
                        .collect();
                    return Err(HarnessError::Timeout {
                        name: self.name.clone(),
                        what: "exit".into(),
                        timeout,
                        seen: seen(&pending),
                        stderr_tail: self.stderr_tail(),
                    });
                }
                Err(e) => return Err(self.driver_error(format!("cannot wait: {e}"))),
            }
        }
    }

    fn driver_error(&self, message: String) -> HarnessError {
        HarnessError::Driver {
            name: self.name.clone(),
            message,
            stderr_tail: self.stderr_tail(),
        }
    }

    /// Whether the process's stderr, all of it, holds `needle`.
    pub fn stderr_contains(&self, needle: &str) -> bool {
        std::fs::read(&self.stderr_log)
            .is_ok_and(|log| String::from_utf8_lossy(&log).contains(needle))
    }

    /// The last few KiB of the process's stderr.
    pub fn stderr_tail(&self) -> String {
        let Ok(mut file) = File::open(&self.stderr_log) else {
            return "(no stderr log)".into();
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(len.saturating_sub(STDERR_TAIL_BYTES)));
        let mut tail = Vec::new();
        let _ = file.read_to_end(&mut tail);
        String::from_utf8_lossy(&tail).into_owned()
    }
}

/// The events a process reported while the harness waited for something
/// else, for a timeout's message.
fn seen(events: &[String]) -> String {
    if events.is_empty() {
        "nothing".into()
    } else {
        events.join(", ")
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.stdin = None;
        if let Ok(None) = self.child.try_wait() {
            // Already-exited children make kill fail harmlessly.
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// CPU time (user + system) of a process so far, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 here.
    let hz = rustix::param::clock_ticks_per_second() as f64;
    (ticks(11) + ticks(12)) / hz
}

/// CPU time of the live threads of process `pid` so far, in seconds, to
/// the nanosecond: the sum of each thread's run time (the first field of
/// `/proc/PID/task/TID/schedstat`). Unlike [`cpu_seconds`] (clock ticks,
/// 10 ms) it does not count threads that have exited.
pub fn live_threads_cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// The peak resident set of process `pid`, KiB (`VmHWM` in
/// `/proc/PID/status`); 0 if it cannot be read.
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status_field(&status, "VmHWM:")
}

/// The number after `name` (e.g. `"VmRSS:"`, a size in KiB, or
/// `"Threads:"`) in the text of a `/proc/PID/status`; 0 if it is missing.
pub fn status_field(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `command` run by `wrapper` (a program and its leading arguments, such
/// as `unshare --time --`): `wrapper` followed by `command`'s program and
/// arguments, with `command`'s environment changes and working directory.
pub fn wrapped(mut wrapper: Command, command: &Command) -> Command {
    wrapper.arg(command.get_program()).args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => wrapper.env(key, value),
            None => wrapper.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        wrapper.current_dir(dir);
    }
    wrapper
}

#[cfg(test)]
mod tests {
    use super::status_field;

    #[test]
    fn status_fields_are_read_by_name() {
        let status = "Name:\tshmtrace\nVmHWM:\t   55312 kB\nVmRSS:\t   41000 kB\nThreads:\t3\n";
        assert_eq!(status_field(status, "VmHWM:"), 55_312);
        assert_eq!(status_field(status, "VmRSS:"), 41_000);
        assert_eq!(status_field(status, "Threads:"), 3);
        assert_eq!(status_field(status, "VmSwap:"), 0);
    }
}
