//! The `shmtrace` command-line tool. See `shmtrace --help`, and
//! [`shmtrace_cli`] for what each command does.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use shmtrace_cli::{self as cli, exit, CliError};

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
    /// Show the service's producers (with their machines, behind relays),
    /// data sources, sessions and buffers.
    Query(cli::query::QueryArgs),
    /// Show what a trace file holds (per machine, in a trace of several);
    /// --check tests whether it is sound.
    Inspect(cli::inspect::InspectArgs),
    /// Activate triggers (like `perfetto --trigger`): connect to the
    /// service as a producer and send ActivateTriggers; exits 0 once the
    /// service acknowledged them.
    Trigger(cli::trigger::TriggerArgs),
    /// The whole stack in one command: start a tracing service in this
    /// process on private sockets, run an example app instrumented with
    /// shmtrace-producer, record a few seconds into demo.pftrace, and print
    /// the summary.
    Demo(cli::demo::DemoArgs),
    /// Run the tracing service (what `traced` is to Perfetto).
    ///
    /// Listens on the producer socket (any process may connect) and the
    /// consumer socket (owner only). Sockets: the flags, else
    /// PERFETTO_PRODUCER_SOCK_NAME / PERFETTO_CONSUMER_SOCK_NAME, else
    /// /run/perfetto/traced-{producer,consumer}.sock if /run/perfetto/
    /// exists, else /tmp/perfetto-{producer,consumer}. Stops cleanly on
    /// SIGINT/SIGTERM; logs to stderr. With --attach, also records firmware
    /// regions in shared memory (a `shmtrace bridge` child per region).
    Serve(serve::ServeArgs),
    /// Relay this machine's producers to a tracing service on another
    /// machine (what `traced_relay` is to Perfetto).
    ///
    /// Listens on the producer socket of this machine (a UNIX socket:
    /// --listen, else PERFETTO_PRODUCER_SOCK_NAME, else the default) and
    /// forwards each producer to the central service's producer socket
    /// (--to HOST:PORT or vsock://CID:PORT; `shmtrace serve
    /// --enable-relay-endpoint` or `traced --enable-relay-endpoint`), with
    /// this machine's id and name, and keeps the two machines' clocks
    /// related (SyncClock every 30 s). Nothing is authenticated: see the
    /// README. Stops on SIGINT/SIGTERM.
    Relay(relay::RelayArgs),
    /// Forward a firmware's trace into a tracing service, as a producer.
    ///
    /// Reads what the firmware writes (frames from a serial port, pty, file,
    /// FIFO or TCP; or its region in shared memory), relates its clock to
    /// BOOTTIME, and forwards its chunks to the service's producer socket:
    /// shmtrace serve or Perfetto's traced. Exits 0 when the input ends or on
    /// Ctrl-C (printing what was forwarded and lost), 3 if the service cannot
    /// be reached, 4 if the input cannot be opened, 5 if it fails while read.
    Bridge(cli::bridge::command::BridgeArgs),
    /// Turn a firmware RAM dump or a captured frame stream into a trace file.
    ///
    /// Runs a tracing service inside this process, forwards the recording
    /// through it as the bridge would, and writes OUT.pftrace (patches
    /// applied, losses marked). The firmware clock is taken as BOOTTIME
    /// (shifted by --clock-offset).
    Import(cli::bridge::command::ImportArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let stdout = &mut std::io::stdout().lock();
    let result = match &args.command {
        Command::Record(a) => cli::record::run(a),
        Command::Query(a) => cli::query::run(a, stdout),
        Command::Inspect(a) => cli::inspect::run(a, stdout),
        Command::Trigger(a) => cli::trigger::run(a),
        Command::Demo(a) => cli::demo::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Relay(a) => relay::run(a),
        Command::Bridge(a) => cli::bridge::command::run_bridge(a),
        Command::Import(a) => cli::bridge::command::run_import(a),
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

/// `shmtrace serve`.
mod serve {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use shmtrace_cli::bridge::attach::{AttachOptions, AttachSpec, Attachments};
    use shmtrace_cli::{exit, CliError};
    use shmtrace_service::ipc::SocketAddress;
    use shmtrace_service::service::{daemon, shell};

    /// Flags of `shmtrace serve`.
    #[derive(Debug, clap::Args)]
    pub struct ServeArgs {
        /// Producer socket(s), comma-separated: a path, @name for an
        /// abstract socket, HOST:PORT or `[IPV6]:PORT` for TCP, or
        /// vsock://CID:PORT. TCP and vsock producers get shmem emulation
        /// (their chunks travel in the IPC messages). The protocol has no
        /// authentication: TCP and vsock sockets must be loopback
        /// (127.0.0.1, `[::1]`, vsock CID 1) unless --listen-any is given.
        #[arg(long, value_name = "ADDRESS")]
        producer_socket: Option<String>,
        /// Allow TCP and vsock producer sockets that other machines can
        /// reach (0.0.0.0:PORT, a LAN address, vsock://4294967295:PORT).
        /// Anyone who can connect can then write into this machine's
        /// traces: restrict it with a firewall (see the README).
        #[arg(long)]
        listen_any: bool,
        /// Serve relays of other machines (`shmtrace relay`, Perfetto's
        /// traced_relay) on the producer sockets: their producers' packets
        /// carry the machine's id, and the trace gets each machine's
        /// description and clock exchanges. Relays connect over TCP or
        /// vsock; nothing authenticates them (see the README).
        #[arg(long)]
        enable_relay_endpoint: bool,
        /// Consumer socket (a path, or @name for an abstract socket).
        #[arg(long, value_name = "ADDRESS")]
        consumer_socket: Option<String>,
        /// Also let this group id connect to the consumer socket.
        #[arg(long, value_name = "GID")]
        consumer_group: Option<u32>,
        /// Fork into the background once the sockets accept connections.
        #[arg(long)]
        background: bool,
        /// Stop when stdin reaches end of file (for supervisors and test
        /// harnesses that own the service's stdin).
        #[arg(long)]
        exit_on_stdin_eof: bool,
        /// Print `{"event":"ready"}` on stdout once the sockets accept
        /// connections.
        #[arg(long)]
        notify_ready: bool,
        /// Log level: off, error, warn, info, debug, trace.
        #[arg(long, default_value = "info", value_name = "LEVEL", value_parser = parse_level)]
        log_level: log::LevelFilter,
        /// Record a firmware region in shared memory: FILE is what QEMU's
        /// `-object memory-backend-file,mem-path=FILE,share=on` backs guest
        /// RAM with (or a UIO device), OFFSET where the region starts in it
        /// (bytes, decimal or 0x hex). Repeatable. Each region is read by a
        /// `shmtrace bridge` child connected to this service, restarted if it
        /// ends; a region not initialized yet is waited for.
        #[arg(long, value_name = "FILE[@OFFSET]")]
        attach: Vec<AttachSpec>,
        /// How long an attached region's reader sleeps while its ring is
        /// empty, microseconds.
        #[arg(long, value_name = "US", default_value_t = 1000)]
        attach_poll_us: u64,
        /// The most memory the trace buffers of all sessions may take
        /// together (512mb, 8gb; a bare number is KiB); a session that
        /// would go over it is refused [default: half the machine's RAM].
        #[arg(long, value_name = "SIZE", value_parser = shmtrace_cli::units::parse_size_kb)]
        max_buffer_memory: Option<u32>,
    }

    pub(super) fn parse_level(s: &str) -> Result<log::LevelFilter, String> {
        s.parse()
            .map_err(|_| format!("unknown log level {s:?} (off, error, warn, info, debug, trace)"))
    }

    fn addresses(args: &ServeArgs) -> Result<shell::ShellConfig, CliError> {
        let (default_producers, default_consumer) = shell::default_addresses()?;
        let producer_sockets = match &args.producer_socket {
            Some(list) => list
                .split(',')
                .filter(|s| !s.is_empty())
                .map(SocketAddress::parse)
                .collect::<Result<Vec<_>, _>>()?,
            None => default_producers,
        };
        let consumer_socket = match &args.consumer_socket {
            Some(a) => SocketAddress::parse(a)?,
            None => default_consumer,
        };
        if producer_sockets.is_empty() {
            return Err(CliError::Usage("no producer socket given".into()));
        }
        Ok(shell::ShellConfig {
            producer_sockets,
            consumer_socket,
            consumer_group: args.consumer_group,
            listen_any: args.listen_any,
            relay_endpoint: args.enable_relay_endpoint,
        })
    }

    /// Runs the service until SIGINT or SIGTERM.
    pub fn run(args: &ServeArgs) -> Result<u8, CliError> {
        daemon::init_logging(args.log_level);
        let cfg = addresses(args)?;
        let readiness = if args.background {
            Some(
                daemon::background()
                    .map_err(|e| CliError::Usage(format!("cannot go to the background: {e}")))?,
            )
        } else {
            None
        };
        let failed = |readiness: Option<daemon::Readiness>, e: String| {
            if let Some(r) = readiness {
                r.failed();
            }
            log::error!("{e}");
            Ok(exit::NO_SERVICE)
        };
        let (stop_read, stop_write) = match UnixStream::pair() {
            Ok(p) => p,
            Err(e) => return failed(readiness, format!("cannot create the stop pipe: {e}")),
        };
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let registered = stop_write
                .try_clone()
                .and_then(|w| signal_hook::low_level::pipe::register(signal, w));
            if let Err(e) = registered {
                return failed(readiness, format!("cannot handle signal {signal}: {e}"));
            }
        }
        if args.exit_on_stdin_eof {
            let stop = match stop_write.try_clone() {
                Ok(s) => s,
                Err(e) => return failed(readiness, format!("cannot watch stdin: {e}")),
            };
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
                let mut stop = stop;
                let _ = std::io::Write::write_all(&mut stop, &[0]);
            });
        }
        let shell = match shell::Shell::bind(&cfg) {
            Ok(s) => s,
            Err(e) => {
                let message = match &e {
                    shell::ShellError::Bind { address, source }
                        if address.starts_with("vsock://")
                            && source.kind() == std::io::ErrorKind::AddrNotAvailable =>
                    {
                        format!(
                            "{e} (no vsock transport here serves that CID: vsock://1 needs \
                             the kernel's vsock_loopback, a guest's CID its \
                             virtio-vsock device)"
                        )
                    }
                    _ => e.to_string(),
                };
                let config_error = matches!(
                    e,
                    shell::ShellError::NotLoopback(_) | shell::ShellError::ConsumerNotUnix(_)
                );
                let code = failed(readiness, message);
                return if config_error { Ok(exit::USAGE) } else { code };
            }
        };
        log::info!(
            "listening: producers on {}, consumers on {}",
            cfg.producer_sockets
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            cfg.consumer_socket
        );
        if let Some(r) = readiness {
            r.ready();
        }
        if args.notify_ready {
            println!("{{\"event\":\"ready\"}}");
        }
        let mut service_config = shell::system_service_config();
        if let Some(kb) = args.max_buffer_memory {
            service_config.max_buffer_bytes = u64::from(kb) * 1024;
        }
        let core = shmtrace_service::service::core::TracingService::new(
            service_config,
            Box::new(shmtrace_service::service::env::SystemEnvironment),
        );
        let attachments = if args.attach.is_empty() {
            None
        } else {
            let options = AttachOptions {
                program: std::env::current_exe()
                    .map_err(|e| CliError::Usage(format!("cannot find this program: {e}")))?,
                socket: cfg.producer_sockets[0].to_string(),
                log_level: args.log_level,
                poll_interval_us: args.attach_poll_us,
            };
            Some(
                Attachments::start(&args.attach, &options)
                    .map_err(|e| CliError::Usage(format!("cannot attach: {e}")))?,
            )
        };
        let result = shell.run(core, Some(stop_read.as_fd()));
        if let Some(a) = attachments {
            a.stop();
        }
        match result {
            Ok(()) => Ok(exit::OK),
            Err(e) => {
                log::error!("{e}");
                Ok(exit::NO_SERVICE)
            }
        }
    }
}

/// `shmtrace relay`.
mod relay {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use shmtrace_cli::relay::{boot_id, clock, Relay, RelayConfig, RelayError};
    use shmtrace_cli::{exit, CliError};
    use shmtrace_service::ipc::{socket, SocketAddress};
    use shmtrace_service::service::{daemon, shell};

    /// Flags of `shmtrace relay`.
    #[derive(Debug, clap::Args)]
    pub struct RelayArgs {
        /// The central tracing service's producer socket: HOST:PORT,
        /// `[IPV6]:PORT` or vsock://CID:PORT.
        #[arg(long, value_name = "ADDRESS")]
        to: String,
        /// This machine's producer socket, where its producers connect (a
        /// path, or @name for an abstract socket) [default:
        /// PERFETTO_PRODUCER_SOCK_NAME, else Perfetto's default].
        #[arg(long, value_name = "ADDRESS")]
        listen: Option<String>,
        /// What identifies this machine to the central service, which
        /// derives the machine id from it [default: the kernel's boot id,
        /// with --machine-name appended when that is given, so relays of
        /// several named guests on one host are told apart]. Relays of
        /// different machines must give different hints.
        #[arg(long, value_name = "TEXT")]
        machine_id_hint: Option<String>,
        /// This machine's name, which data sources' machine_name_filter
        /// matches [default: PERFETTO_MACHINE_NAME, else `uname -s`].
        #[arg(long, value_name = "NAME")]
        machine_name: Option<String>,
        /// Seconds between two clock exchanges with the central service.
        #[arg(long, value_name = "S", default_value_t = clock::SYNC_INTERVAL.as_secs())]
        sync_interval: u64,
        /// Stop when stdin reaches end of file.
        #[arg(long)]
        exit_on_stdin_eof: bool,
        /// Print `{"event":"ready"}` on stdout once the socket accepts
        /// connections.
        #[arg(long)]
        notify_ready: bool,
        /// Log level: off, error, warn, info, debug, trace.
        #[arg(long, default_value = "info", value_name = "LEVEL", value_parser = super::serve::parse_level)]
        log_level: log::LevelFilter,
    }

    /// The machine id hint without `--machine-id-hint`: the boot id, and
    /// the machine's name if one was given (two relays on one kernel, e.g.
    /// for containers, otherwise share the id, and the service takes them
    /// for one machine).
    fn default_machine_id_hint(boot_id: String, machine_name: Option<&str>) -> String {
        match machine_name {
            Some(name) => format!("{boot_id}/{name}"),
            None => boot_id,
        }
    }

    /// Runs the relay until SIGINT or SIGTERM.
    pub fn run(args: &RelayArgs) -> Result<u8, CliError> {
        daemon::init_logging(args.log_level);
        let listen = match &args.listen {
            Some(a) => SocketAddress::parse(a)?,
            None => SocketAddress::parse(&socket::producer_socket_name())?,
        };
        let cfg = RelayConfig {
            listen,
            central: SocketAddress::parse(&args.to)?,
            machine_id_hint: args.machine_id_hint.clone().unwrap_or_else(|| {
                default_machine_id_hint(boot_id(), args.machine_name.as_deref())
            }),
            machine_name: args
                .machine_name
                .clone()
                .unwrap_or_else(shell::machine_name),
            sync_interval: Duration::from_secs(args.sync_interval.max(1)),
        };
        let (stop_read, stop_write) = UnixStream::pair()
            .map_err(|e| CliError::Usage(format!("cannot create the stop pipe: {e}")))?;
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            stop_write
                .try_clone()
                .and_then(|w| signal_hook::low_level::pipe::register(signal, w))
                .map_err(|e| CliError::Usage(format!("cannot handle signal {signal}: {e}")))?;
        }
        if args.exit_on_stdin_eof {
            let mut stop = stop_write
                .try_clone()
                .map_err(|e| CliError::Usage(format!("cannot watch stdin: {e}")))?;
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
                let _ = std::io::Write::write_all(&mut stop, &[0]);
            });
        }
        let relay = match Relay::bind(cfg.clone()) {
            Ok(r) => r,
            // A TCP or vsock --listen, or a UNIX --to, is a usage error,
            // as serve's non-UNIX consumer socket is.
            Err(e @ (RelayError::NotUnix(_) | RelayError::CentralUnix(_))) => {
                log::error!("{e}");
                return Ok(exit::USAGE);
            }
            Err(e) => {
                log::error!("{e}");
                return Ok(exit::NO_SERVICE);
            }
        };
        log::info!(
            "relaying producers on {} to {} as machine {:?} (id hint {:?})",
            cfg.listen,
            cfg.central,
            cfg.machine_name,
            cfg.machine_id_hint
        );
        if args.notify_ready {
            println!("{{\"event\":\"ready\"}}");
        }
        match relay.run(stop_read.as_fd()) {
            Ok(()) => Ok(exit::OK),
            Err(e) => {
                log::error!("{e}");
                Ok(exit::NO_SERVICE)
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::default_machine_id_hint;

        #[test]
        fn named_relays_on_one_kernel_get_different_hints() {
            let boot = || "b0".to_string();
            assert_eq!(default_machine_id_hint(boot(), None), "b0");
            assert_ne!(
                default_machine_id_hint(boot(), Some("vm-1")),
                default_machine_id_hint(boot(), Some("vm-2"))
            );
        }
    }
}
