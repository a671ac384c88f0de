//! The harness's error type.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while running an interop scenario.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A file or directory operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What the harness was doing.
        action: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A driver process could not be started.
    #[error("cannot start {name} ({}): {source}", program.display())]
    Spawn {
        /// The role of the process ("service", "producer 1", ...).
        name: String,
        /// The executable.
        program: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A driver process misbehaved: reported an error, exited early, said
    /// something unexpected.
    #[error("{name}: {message}\n--- last lines of its stderr ---\n{stderr_tail}")]
    Driver {
        /// The role of the process.
        name: String,
        /// What went wrong.
        message: String,
        /// The end of its stderr log, for diagnosis.
        stderr_tail: String,
    },
    /// A driver process did not report in time.
    #[error(
        "{name}: no {what} within {timeout:?} (meanwhile it reported: {seen})\n\
         --- last lines of its stderr ---\n{stderr_tail}"
    )]
    Timeout {
        /// The role of the process.
        name: String,
        /// The event that was awaited.
        what: String,
        /// How long the harness waited.
        timeout: Duration,
        /// The events it reported while the harness waited (skipped), or
        /// "nothing": where it got stuck.
        seen: String,
        /// The end of its stderr log, for diagnosis.
        stderr_tail: String,
    },
    /// python3 or the official Perfetto protos are missing.
    #[error(
        "the trace checker needs python3 with the PyPI `perfetto` and `protobuf` packages \
         ({detail}); run `bash .ci/run` or `pip install perfetto protobuf`"
    )]
    CheckerEnvironment {
        /// What exactly failed.
        detail: String,
    },
    /// The checker could not run or could not be understood.
    #[error("trace checker failed to run: {0}")]
    Checker(String),
    /// A scenario run failed; its work directory (sockets, config, traces,
    /// logs) is kept for diagnosis.
    #[error("{source}\n(the run's traces and logs are kept in {})", dir.display())]
    Kept {
        /// The kept directory.
        dir: PathBuf,
        /// What failed.
        source: Box<HarnessError>,
    },
    /// A scenario is inconsistent (e.g. a flush between phases with one phase).
    #[error("invalid scenario: {0}")]
    Scenario(String),
}

/// Result alias for the harness.
pub type Result<T, E = HarnessError> = std::result::Result<T, E>;
