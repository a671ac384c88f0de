//! The `shmtrace` command-line tool: record a trace, query a service,
//! inspect a trace file. Each command works against the shmtrace service
//! and the real Perfetto service alike (through the consumer socket), and
//! mirrors Perfetto's `perfetto` command where that helps muscle memory.
//!
//! * [`record`]: a consumer that runs one tracing session and writes the
//!   trace file, with a live progress line and a summary.
//! * [`query`]: the service's producers, data sources, sessions and buffers.
//! * [`inspect`]: what a trace file holds, and `--check` for whether it is
//!   sound.
//! * [`trigger`]: activates triggers as a producer, like
//!   `perfetto --trigger`.
//! * [`config`]: trace configs from text format, binary or quick flags.
//! * [`bridge`]: a firmware's chunks, forwarded as a producer into any
//!   Perfetto service.
//! * [`local`]: a tracing service inside this process, on private sockets.
//! * [`relay`]: this machine's producer socket, forwarded to a tracing
//!   service on another machine (Perfetto's `traced_relay`).
//! * [`demo`]: the whole stack in one command — an in-process service on
//!   private sockets, an example app, a recorded `demo.pftrace`.
//!
//! The binary (`src/main.rs`) only parses arguments and maps [`CliError`]s
//! to messages and [exit] statuses.
//!
//! This is a package of its own (`shmtrace-cli`, at `host-service/cli/`) so
//! that the service library (`shmtrace-service`) depends neither on the
//! producer library (`shmtrace demo`'s example app) nor on the crates only
//! the commands need (clap, serde, prost-reflect, ...).

#![warn(missing_docs)]

pub mod bridge;
pub mod config;
pub mod consumer;
pub mod demo;
pub mod inspect;
pub mod local;
pub mod query;
pub mod record;
pub mod relay;
pub mod schema;
pub mod trace_file;
pub mod trigger;
pub mod units;

use std::path::PathBuf;

use thiserror::Error;

use shmtrace_ipc::socket::AddressError;
use shmtrace_ipc::ClientError;

/// Exit statuses of `shmtrace`.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// `inspect --check` found problems.
    pub const CHECK_FAILED: u8 = 1;
    /// Bad arguments or an unusable config (clap uses it for usage errors).
    pub const USAGE: u8 = 2;
    /// The tracing service cannot be reached.
    pub const NO_SERVICE: u8 = 3;
    /// A file cannot be read or written.
    pub const IO: u8 = 4;
    /// The service refused or aborted the session, or broke the protocol.
    pub const SESSION: u8 = 5;
    /// A file given as a trace is none: empty, a directory, or no packet
    /// where it starts.
    pub const NOT_A_TRACE: u8 = 6;
    /// Stopped by a second Ctrl-C, without writing the trace.
    pub const ABORTED: u8 = 130;
}

/// Why a command failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CliError {
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// The config cannot be used.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The socket name is not usable.
    #[error("invalid socket address: {0}")]
    Address(#[from] AddressError),
    /// The service is not there.
    #[error(
        "cannot connect to the tracing service at {address}: {source}\n{}",
        hint(.source, "consumer", "CONSUMER")
    )]
    Connect {
        /// The address tried.
        address: String,
        /// Why it failed.
        source: ClientError,
    },
    /// The service's producer socket is not there.
    #[error(
        "cannot connect to the tracing service's producer socket at {address}: {source}\n{}",
        hint(.source, "producer", "PRODUCER")
    )]
    ConnectProducer {
        /// The address tried.
        address: String,
        /// Why it failed.
        source: ClientError,
    },
    /// Talking to the service failed.
    #[error("{what}: {source}")]
    Ipc {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: ClientError,
    },
    /// The service refused or ended the session with an error.
    #[error("the service {0}")]
    Session(String),
    /// A file operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (`open`, `create`, `write`, ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The output file is one a running session writes its trace into
    /// (`write_into_file`): a snapshot written there would overwrite it.
    #[error(
        "{} is the file a running session writes its trace into ({how}): a snapshot \
         written there would overwrite that trace, so it was left alone; clone into \
         another file (-o)",
        path.display()
    )]
    LiveOutput {
        /// The file.
        path: PathBuf,
        /// How that is known.
        how: String,
    },
    /// A file given as a trace is none.
    #[error("{} is not a Perfetto trace: {reason}", path.display())]
    NotATrace {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        reason: String,
    },
    /// `demo` could not bring up its service or example app.
    #[error("demo: {0}")]
    Demo(String),
    /// The bridge's producer cannot reach the service.
    #[error(
        "cannot connect to the tracing service's producer socket at {address}: {detail}\n\
         Is the service running (`shmtrace serve`, or Perfetto's `traced`)? \
         Pass --socket, or set PERFETTO_PRODUCER_SOCK_NAME."
    )]
    ProducerUnreachable {
        /// The address tried.
        address: String,
        /// Why it failed.
        detail: String,
    },
    /// The firmware input failed, or the bridge could not start.
    #[error("bridge: {0}")]
    Bridge(String),
    /// Writing to the terminal or a pipe failed.
    #[error("output error: {0}")]
    Output(#[from] std::io::Error),
}

/// What to try when connecting to the service's `kind` socket
/// (`consumer`, `producer`; `KIND` as in `PERFETTO_KIND_SOCK_NAME`) failed
/// with `source`: a socket where a service listens but does not offer the
/// port asked for is its other socket (or another service's).
fn hint(source: &ClientError, kind: &str, kind_upper: &str) -> String {
    let unlike = if kind == "consumer" {
        "producer"
    } else {
        "consumer"
    };
    match source {
        ClientError::Bind(shmtrace_ipc::client::BindError::UnknownService(_)) => format!(
            "A service listens there, but not for {kind}s: is it its {unlike} socket? \
             Pass the {kind} socket with --socket, or set PERFETTO_{kind_upper}_SOCK_NAME."
        ),
        _ => format!(
            "Is the service running (`shmtrace serve`, or Perfetto's `traced`)? \
             Pass --socket, or set PERFETTO_{kind_upper}_SOCK_NAME."
        ),
    }
}

impl CliError {
    /// The exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::Config(_) | Self::Address(_) | Self::LiveOutput { .. } => {
                exit::USAGE
            }
            Self::Connect { .. }
            | Self::ConnectProducer { .. }
            | Self::ProducerUnreachable { .. } => exit::NO_SERVICE,
            Self::Io { .. } | Self::Output(_) => exit::IO,
            Self::NotATrace { .. } => exit::NOT_A_TRACE,
            Self::Ipc { .. } | Self::Session(_) | Self::Demo(_) | Self::Bridge(_) => exit::SESSION,
        }
    }
}
