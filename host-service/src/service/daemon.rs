//! Process plumbing for `shmtrace serve`: running in the background and
//! logging to stderr.
// `unsafe` here: fork() for --background.
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

/// The child's side of [`background`]: tells the waiting parent whether the
/// service started.
#[derive(Debug)]
pub struct Readiness(UnixStream);

impl Readiness {
    /// The service is listening: the parent exits with status 0.
    pub fn ready(mut self) {
        let _ = self.0.write_all(&[0]);
    }

    /// The service failed to start: the parent exits with status 1.
    pub fn failed(mut self) {
        let _ = self.0.write_all(&[1]);
    }
}

/// Forks into the background, like `traced --background`.
///
/// The parent waits until the child reports through [`Readiness`] (so that
/// when the command returns the sockets accept connections), then exits with
/// the child's verdict; it never returns. The child starts a new session,
/// points stdin and stdout to `/dev/null` (stderr stays: logs go there) and
/// returns its [`Readiness`].
///
/// Must be called before any thread is spawned.
pub fn background() -> std::io::Result<Readiness> {
    let (mut parent_end, child_end) = UnixStream::pair()?;
    // SAFETY: the process is single-threaded at this point (documented
    // precondition), so the child is a complete copy with no lock held by a
    // vanished thread; both sides only continue in ordinary Rust code.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            drop(parent_end);
            rustix::process::setsid().map_err(std::io::Error::from)?;
            let null = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")?;
            rustix::stdio::dup2_stdin(&null).map_err(std::io::Error::from)?;
            rustix::stdio::dup2_stdout(&null).map_err(std::io::Error::from)?;
            Ok(Readiness(child_end))
        }
        _ => {
            drop(child_end);
            let mut verdict = [1u8];
            let status = match parent_end.read_exact(&mut verdict) {
                Ok(()) if verdict[0] == 0 => 0,
                _ => 1,
            };
            std::process::exit(status);
        }
    }
}

/// A `log` backend that writes `shmtrace: LEVEL message` lines to stderr.
#[derive(Debug)]
pub struct StderrLogger {
    level: log::LevelFilter,
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            // One `write` per line: the service's attach children share its
            // stderr, and a line written piecewise interleaves with theirs
            // (a pipe keeps writes of up to PIPE_BUF bytes whole).
            let line = format!("shmtrace: {:<5} {}\n", record.level(), record.args());
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }

    fn flush(&self) {}
}

/// Installs [`StderrLogger`] at `level` (the first call wins).
pub fn init_logging(level: log::LevelFilter) {
    let logger: &'static StderrLogger = Box::leak(Box::new(StderrLogger { level }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}
