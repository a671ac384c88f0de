//! The `shmtrace` command-line tool. See `shmtrace --help`, and
//! [`shmtrace_service::cli`] for what each command does.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use shmtrace_service::cli::{self, exit, CliError};

/// A Perfetto-compatible tracing stack: record traces, query a tracing
/// service, inspect trace files. Works with the shmtrace service and the
/// real Perfetto service alike.
#[derive(Debug, Parser)]
#[command(name = "shmtrace", version, propagate_version = true)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Record a trace: run one tracing session and write the trace file.
    ///
    /// Either a config (-c FILE, text format with --txt) or the quick flags
    /// (-t, -b, --app-categories, --fill). Ctrl-C stops the session and
    /// keeps the data.
    Record(cli::record::RecordArgs),
    /// Show the service's producers, data sources, sessions and buffers.
    Query(cli::query::QueryArgs),
    /// Show what a trace file holds; --check tests whether it is sound.
    Inspect(cli::inspect::InspectArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let stdout = &mut std::io::stdout().lock();
    let result = match &args.command {
        Command::Record(a) => cli::record::run(a),
        Command::Query(a) => cli::query::run(a, stdout),
        Command::Inspect(a) => cli::inspect::run(a, stdout),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::from(exit::OK)
        }
        Err(e) => {
            eprintln!("shmtrace: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
