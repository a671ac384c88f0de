//! The interop matrix: which implementation plays the service, the
//! producer(s) and the consumer ([`Cell`]), and what they do ([`Scenario`]).
//!
//! [`run`] plays one scenario in one cell, in a private temporary directory
//! (sockets, config, traces, logs), and checks the resulting trace with the
//! shared checker. The choreography:
//!
//! 1. start the service, wait until it listens;
//! 2. start the producers (they connect and wait for a session), then the
//!    consumer (it enables tracing from the scenario's TraceConfig);
//! 3. for each phase, wait until every producer reports what it emitted;
//!    between phases optionally flush and read mid-session, or sample the
//!    size of the write_into_file output; then let the producers go on;
//! 4. stop the session (consumer command, or the config's duration; or
//!    first kill the producers, see [`Stop::AfterKillingProducers`]), wait
//!    for the trace and for every process to exit cleanly;
//! 5. check the trace against what the producers reported.
//!
//! Every process is owned by a guard that kills it when dropped, so a failing
//! or panicking test leaves nothing running.
//!
//! # Driver protocol
//!
//! Each role is a process that reports progress as JSON lines on stdout
//! (`{"event": ...}`; `{"event":"error","message":...}` aborts the run) and
//! takes commands on stdin. An `Ours` variant of [`ServiceImpl`],
//! [`ProducerImpl`] or [`ConsumerImpl`] must speak the same protocol (or be
//! wrapped by an adapter that does); the real drivers in `interop/*.cc`
//! document it in full.
//!
//! * service: `--producer-socket P --consumer-socket C --exit-on-stdin-eof`;
//!   reports `ready` once both sockets listen.
//! * producer: socket in `PERFETTO_PRODUCER_SOCK_NAME`; `--threads`,
//!   `--iterations`, `--phases`, `--large-kb`, `--large-every`,
//!   `--iteration-sleep-us`, `--shmem-kb`, and only where a scenario asks
//!   for them (only our driver has them) `--sessions N` (wait for N
//!   sessions) and `--custom-source NAME` (also write `for_testing`
//!   packets from a custom data source, see [`crate::test_events`], and
//!   report them per session as `"custom"` in `phase`); reports `enabled` (with its `pid`),
//!   then `phase` (cumulative `emitted` [`EventCounts`]) after each phase and
//!   waits for a stdin line before the next, then `stopped` when the session
//!   has stopped.
//! * consumer: `--socket C --config FILE --out FILE [--write-into-file]
//!   --timeout-ms N`; reports `connected`; stdin commands `flush` (reports
//!   `flush` with `ok`), `read PATH` (reports `read`), `stop` (flush, disable,
//!   read); reports `done` once the trace is in `--out`.
//!
//! [`ConsumerImpl::OurCli`] is `shmtrace record` itself, as a person runs
//! it: `--progress json` makes it report `connected` and `done` (with its
//! summary) the same way, and `stop` becomes Ctrl-C (SIGINT). It has no
//! mid-session reads, so scenarios that flush and read between phases do not
//! apply to it.
//!
//! Every run also judges the whole trace with `shmtrace inspect --check`
//! (see [`shmtrace_binary`]), so the CLI's checker is held against the real
//! Perfetto's traces as well as ours.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checker::{self, EventCounts, Expectation, Loss, ProducerExpectation, TraceReport};
use crate::config::{self, FillPolicy, IncrementalStateConfig, TraceConfig, TrackEventConfig};
use crate::error::{HarnessError, Result};
use crate::netns::{MachineNetwork, TcpConnection};
use crate::process::{self, ChildProcess};
use crate::test_events::{self, TestEvents};

/// How long a process may take to start and connect.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one emission phase may take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long stopping, reading and exiting may take, unless the scenario
/// says otherwise ([`Scenario::stop_timeout`]).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// The track_event categories the producer drivers register.
const CATEGORIES: [&str; 2] = ["interop", "interop.*"];
/// The name of our producer driver's custom data source
/// ([`ProducerSpec::custom_source`]).
pub const CUSTOM_SOURCE: &str = "shmtrace.interop.custom";

/// Paths of the real-Perfetto driver binaries (built by this package).
#[derive(Debug, Clone)]
pub struct RealBinaries {
    /// `real-service`.
    pub service: PathBuf,
    /// `real-producer`.
    pub producer: PathBuf,
    /// `real-consumer`.
    pub consumer: PathBuf,
}

/// The [`RealBinaries`] of this package; usable from integration tests,
/// where cargo provides `CARGO_BIN_EXE_*`.
#[macro_export]
macro_rules! real_binaries {
    () => {
        $crate::scenario::RealBinaries {
            service: env!("CARGO_BIN_EXE_real-service").into(),
            producer: env!("CARGO_BIN_EXE_real-producer").into(),
            consumer: env!("CARGO_BIN_EXE_real-consumer").into(),
        }
    };
}

/// Who plays the tracing service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceImpl {
    /// The real Perfetto service (`real-service`).
    Real,
    /// Our service: `shmtrace serve --notify-ready`, the binary users run
    /// (see [`shmtrace_binary`]).
    Ours,
}

/// Who plays the producers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerImpl {
    /// The real Perfetto SDK (`real-producer`).
    Real,
    /// shmtrace-producer: its `interop_producer` example (see
    /// [`our_producer_binary`]), a twin of `real-producer`.
    Ours,
}

/// Who plays the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerImpl {
    /// The real Perfetto consumer client (`real-consumer`).
    Real,
    /// `shmtrace record` (see [`shmtrace_binary`]).
    OurCli,
}

/// One cell of the interop matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    /// The service.
    pub service: ServiceImpl,
    /// The producers.
    pub producer: ProducerImpl,
    /// The consumer.
    pub consumer: ConsumerImpl,
}

impl Cell {
    /// Real producer -> real service <- real consumer: the reference cell.
    pub const REAL: Cell = Cell::new(ServiceImpl::Real, ProducerImpl::Real, ConsumerImpl::Real);

    /// Our producer -> real service <- real consumer: cell (b).
    pub const OUR_PRODUCER: Cell =
        Cell::new(ServiceImpl::Real, ProducerImpl::Ours, ConsumerImpl::Real);

    /// Real producer -> real service <- `shmtrace record`: cell (c).
    pub const REAL_WITH_OUR_CLI: Cell =
        Cell::new(ServiceImpl::Real, ProducerImpl::Real, ConsumerImpl::OurCli);

    /// Real producer -> our service <- real consumer: cell (a).
    pub const OUR_SERVICE: Cell =
        Cell::new(ServiceImpl::Ours, ProducerImpl::Real, ConsumerImpl::Real);

    /// Our producer -> our service <- real consumer: cell (e).
    pub const OUR_PRODUCER_AND_SERVICE: Cell =
        Cell::new(ServiceImpl::Ours, ProducerImpl::Ours, ConsumerImpl::Real);

    /// Real producer -> our service <- `shmtrace record`: cell (f).
    pub const OUR_SERVICE_AND_CLI: Cell =
        Cell::new(ServiceImpl::Ours, ProducerImpl::Real, ConsumerImpl::OurCli);

    /// Our producer -> our service <- `shmtrace record`: cell (d), no real
    /// Perfetto anywhere but in the checker's protos.
    pub const OURS: Cell = Cell::new(ServiceImpl::Ours, ProducerImpl::Ours, ConsumerImpl::OurCli);

    /// The cell of these three roles.
    pub const fn new(service: ServiceImpl, producer: ProducerImpl, consumer: ConsumerImpl) -> Self {
        Cell {
            service,
            producer,
            consumer,
        }
    }

    /// Whether the consumer can flush and read while the session runs
    /// ([`BetweenPhases::FlushAndRead`]): the real consumer can, `shmtrace
    /// record` cannot (it reads once, when the session ends).
    pub fn reads_mid_session(&self) -> bool {
        self.consumer == ConsumerImpl::Real
    }

    /// A short name ("real-ours-cli": service, producer, consumer), for
    /// temporary directories and messages.
    pub fn name(&self) -> String {
        let who = |ours: bool| if ours { "ours" } else { "real" };
        format!(
            "{}-{}-{}",
            who(self.service == ServiceImpl::Ours),
            who(self.producer == ProducerImpl::Ours),
            match self.consumer {
                ConsumerImpl::Real => "real",
                ConsumerImpl::OurCli => "cli",
            }
        )
    }
}

/// The `shmtrace` binary: `$SHMTRACE_BIN`, else `shmtrace` in the cargo
/// target directory this test binary was built in (`target/<profile>/`),
/// which `cargo test --workspace` builds before running any test.
pub fn shmtrace_binary() -> Result<PathBuf> {
    built_binary(
        "SHMTRACE_BIN",
        Path::new("shmtrace"),
        "the shmtrace binary",
        "cargo build -p shmtrace-cli --bin shmtrace",
    )
}

/// Our producer driver (`host-producer/examples/interop_producer.rs`):
/// `$SHMTRACE_INTEROP_PRODUCER`, else `examples/interop_producer` in the cargo
/// target directory this test binary was built in, which `cargo test
/// --workspace` builds (it builds every package's examples).
pub fn our_producer_binary() -> Result<PathBuf> {
    built_binary(
        "SHMTRACE_INTEROP_PRODUCER",
        Path::new("examples/interop_producer"),
        "our producer driver",
        "cargo build -p shmtrace-producer --example interop_producer",
    )
}

/// shmtrace-producer's example `name` (`host-producer/examples/<name>.rs`):
/// `$SHMTRACE_EXAMPLE_<NAME>` (upper case), else `examples/<name>` in the
/// cargo target directory this test binary was built in, which `cargo test
/// --workspace` builds.
pub fn producer_example(name: &str) -> Result<PathBuf> {
    built_binary(
        &format!("SHMTRACE_EXAMPLE_{}", name.to_uppercase()),
        &Path::new("examples").join(name),
        &format!("shmtrace-producer's example {name}"),
        &format!("cargo build -p shmtrace-producer --example {name}"),
    )
}

/// The program `name` (a path relative to this program's directory, e.g.
/// `real-producer` or `examples/heartbeat`), built next to the running
/// benchmark program.
pub fn sibling_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(|source| HarnessError::Io {
        action: "locate the running program",
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let path = exe.parent().unwrap_or(Path::new("/")).join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::Scenario(format!(
            "{} is not built (see the program's docs for the build command)",
            path.display()
        )))
    }
}

/// `$env_var` if set, else `relative` under the cargo target directory this
/// test binary was built in; `what` and `build` name it and the command
/// that builds it in the error.
pub fn built_binary(env_var: &str, relative: &Path, what: &str, build: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(env_var) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|source| HarnessError::Io {
        action: "locate the running test binary",
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    // <target>/<profile>/deps/<test binary> or <target>/<profile>/<binary>.
    let candidates = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(relative))
        .collect::<Vec<_>>();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            HarnessError::Scenario(format!(
                "{what} is not built (looked for {}); run `{build}` (or `cargo test \
                 --workspace`, which builds it), or set {env_var}",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// What `shmtrace inspect --check` said about a trace.
#[derive(Debug, Clone)]
pub struct InspectVerdict {
    /// Whether the check passed.
    pub ok: bool,
    /// Its analysis (`--json`).
    pub analysis: Value,
}

/// Runs `shmtrace inspect --check --json` on `traces` (successive reads of
/// one session, in order).
pub fn inspect(traces: &[PathBuf]) -> Result<InspectVerdict> {
    let mut args: Vec<OsString> = ["inspect", "--check", "--json"].map(OsString::from).into();
    args.extend(traces.iter().map(OsString::from));
    let run = CliRun::new("shmtrace inspect", args)?;
    let analysis: Value = serde_json::from_slice(&run.output.stdout)
        .map_err(|e| run.error(format!("printed no analysis: {e}")))?;
    match run.output.status.code() {
        Some(0) => Ok(InspectVerdict { ok: true, analysis }),
        Some(1) => Ok(InspectVerdict {
            ok: false,
            analysis,
        }),
        _ => Err(run.error(format!("failed: {}", run.output.status))),
    }
}

/// Runs `shmtrace inspect --check --json` on `trace` and panics with its
/// problems unless the check passes: the analysis.
pub fn inspect_passes(trace: &Path) -> Value {
    let verdict = inspect(&[trace.to_path_buf()]).expect("shmtrace inspect runs");
    assert!(
        verdict.ok,
        "inspect --check {}: {}",
        trace.display(),
        verdict.analysis["problems"]
    );
    verdict.analysis
}

/// One finished run of the `shmtrace` CLI.
struct CliRun {
    /// Which command it was ("shmtrace inspect"), for errors.
    name: &'static str,
    /// What it printed and how it exited.
    output: Output,
}

impl CliRun {
    /// Runs `shmtrace` (see [`shmtrace_binary`]) with `args` to its end;
    /// `name` says which command it is.
    fn new(name: &'static str, args: Vec<OsString>) -> Result<Self> {
        let program = shmtrace_binary()?;
        let output = Command::new(&program)
            .args(args)
            .output()
            .map_err(|source| HarnessError::Spawn {
                name: name.into(),
                program,
                source,
            })?;
        Ok(CliRun { name, output })
    }

    /// An error about this run, quoting its stderr.
    fn error(&self, message: String) -> HarnessError {
        HarnessError::Driver {
            name: self.name.into(),
            message,
            stderr_tail: String::from_utf8_lossy(&self.output.stderr).into_owned(),
        }
    }
}

/// What one producer process emits (see `interop/real_producer.cc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerSpec {
    /// Emitting threads (one trace writer, i.e. one sequence, each).
    pub threads: u32,
    /// Iterations per thread per phase.
    pub iterations: u32,
    /// Phases; the scenario's between-phase action runs between them.
    pub phases: u32,
    /// Size of the huge annotation, KiB (0 = none).
    pub large_kb: u32,
    /// Emit the huge annotation every this many iterations.
    pub large_every: u32,
    /// Pause after each iteration, µs.
    pub iteration_sleep_us: u32,
    /// Shared memory size hint, KiB (0 = the SDK default).
    pub shmem_kb: u32,
    /// Concurrent sessions to wait for before emitting (every producer of
    /// a scenario has the same); the scenario runs this many consumers.
    pub sessions: u32,
    /// Also register the custom data source [`CUSTOM_SOURCE`] and write
    /// one packet per iteration to each of its instances (only our
    /// driver can).
    pub custom_source: bool,
    /// Also emit, once per thread per phase, the event features the
    /// producer fidelity test compares (`--fidelity`: every annotation
    /// type, a dynamic name, a named track with a parent, a counter track
    /// with a unit; see `interop/real_producer.cc`).
    pub fidelity: bool,
    /// The producer process's `argv[0]` (default: the driver binary's
    /// path). Both SDKs name their producer after it (the real one after
    /// the whole string, ours after its file name), so a session's
    /// `TraceConfig.producers` can address the producer by this name.
    pub process_name: Option<&'static str>,
    /// The "machine" it runs on, under [`ProducerSocket::Relayed`]: it
    /// connects to that machine's relay.
    pub machine: u32,
    /// Who plays this producer, if not the cell's producer (a relayed
    /// machine runs both SDKs side by side).
    pub implementation: Option<ProducerImpl>,
}

impl ProducerSpec {
    /// Track events one thread emits per iteration (2 slices, begin and
    /// end each, 3 instants and 2 counter values), without the huge
    /// annotation's and the fidelity events.
    pub const TRACK_EVENTS_PER_ITERATION: u64 = 9;
}

impl Default for ProducerSpec {
    fn default() -> Self {
        ProducerSpec {
            threads: 1,
            iterations: 100,
            phases: 1,
            large_kb: 0,
            large_every: 10,
            iteration_sleep_us: 0,
            shmem_kb: 0,
            sessions: 1,
            custom_source: false,
            fidelity: false,
            process_name: None,
            machine: 0,
            implementation: None,
        }
    }
}

/// How the session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The consumer flushes and disables once every producer is done.
    ByConsumer,
    /// The service ends it after `TraceConfig.duration_ms`.
    ByDuration {
        /// The duration.
        duration_ms: u32,
    },
    /// The producers crash mid-session: after their last phase they are
    /// killed with SIGKILL while their threads idle (alive, holding the
    /// chunks they wrote into, none flushed: the drivers are started with
    /// one phase more than the scenario plays, and wait for the line that
    /// would start it). Before the kill the consumer reads the session
    /// (no flush) until a track event of every thread is in it, so that the
    /// service knows every writer, as it must to scrape the writer's
    /// chunks: each thread must fill a chunk, and the consumer must read
    /// mid-session. Once the service has seen them go (`shmtrace query`,
    /// which listed their pids before, lists none of them), the consumer flushes and disables as in
    /// [`Stop::ByConsumer`]. What they wrote is in the trace only as far as
    /// the service got it: committed, or scraped from their shared memory
    /// (upstream scrapes a producer's SMB when it disconnects:
    /// `TracingServiceImpl::ScrapeSharedMemoryBuffers`,
    /// src/tracing/service/tracing_service_impl.cc).
    AfterKillingProducers,
}

/// What happens between two producer phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BetweenPhases {
    /// Nothing.
    Nothing,
    /// The consumer flushes, then reads the buffers into a separate file.
    FlushAndRead,
    /// Record the size of the write_into_file output as soon as it has
    /// grown past the previous sample (the service drains the buffer into
    /// it every `file_write_period_ms`), or after `grow_within` if it does
    /// not (the scenario's assertions then show the sizes). Also done after
    /// the last phase, before the stop.
    SampleFileSize {
        /// The longest to wait for the file to grow.
        grow_within: Duration,
    },
    /// The consumer flushes (no read: a `write_into_file` session is read
    /// by the service), then the size of the output is sampled as in
    /// [`BetweenPhases::SampleFileSize`] (not after the last phase). The
    /// flush makes the service scrape the chunks the producers' threads
    /// hold open between phases, and the sample waits for the next periodic
    /// write, which reads those scraped copies into the file.
    FlushAndSampleFileSize {
        /// The longest to wait for the file to grow.
        grow_within: Duration,
    },
}

/// One interop scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name, used for the temporary directory.
    pub name: &'static str,
    /// Trace buffer size, KiB.
    pub buffer_kb: u32,
    /// Trace buffer fill policy.
    pub fill_policy: FillPolicy,
    /// One entry per producer process.
    pub producers: Vec<ProducerSpec>,
    /// How the session ends.
    pub stop: Stop,
    /// `incremental_state_config.clear_period_ms`, if any.
    pub clear_period_ms: Option<u32>,
    /// Stream into a file (write_into_file with the consumer's fd), with this
    /// drain period in ms.
    pub write_into_file_period_ms: Option<u32>,
    /// Between-phase action.
    pub between_phases: BetweenPhases,
    /// Whether data may be lost.
    pub loss: Loss,
    /// Copy the (first session's) trace here before the run's directory
    /// goes away.
    pub keep_trace: Option<PathBuf>,
    /// The track_event category filter, instead of enabling every category
    /// of the drivers. Events of disabled categories are missing from the
    /// trace while the drivers still count them: a scenario with a filter
    /// judges the trace by other means than the checker's counts.
    pub track_event_config: Option<TrackEventConfig>,
    /// How long the stop (flush, disable, the final read into the trace
    /// file) and each mid-session flush and read may take; longer for a
    /// big trace, which debug builds of the service and the consumer read
    /// at a few MB per CPU-second each.
    pub stop_timeout: Duration,
    /// `TraceConfig.producers`: per-producer shared memory sizes, by
    /// producer name (see [`ProducerSpec::process_name`]).
    pub producer_configs: Vec<config::ProducerConfig>,
    /// The kind of producer socket the service listens on.
    pub producer_socket: ProducerSocket,
    /// Under [`ProducerSocket::Relayed`]: whether the machines share this
    /// machine's clocks or each has clocks of its own.
    pub machine_clocks: MachineClocks,
    /// Under [`ProducerSocket::Relayed`]: whether the machines reach the
    /// central service on this machine's loopback or each over a network
    /// link of its own.
    pub machine_networks: MachineNetworks,
    /// Ask the service to deflate the trace
    /// (`compression_type: COMPRESSION_TYPE_DEFLATE`).
    pub deflate: bool,
    /// `TraceConfig.trace_filter`.
    pub trace_filter: Option<config::TraceFilter>,
}

/// The producer socket of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProducerSocket {
    /// A UNIX socket in the run's directory: the producers get an SMB.
    #[default]
    Unix,
    /// TCP on `127.0.0.1` (a port free when the run starts): the producers
    /// cannot receive a descriptor and get shmem emulation, and their
    /// packets carry no `trusted_pid` (the service does not know it), so
    /// the checker counts all producers' events together.
    Tcp,
    /// Relayed machines on this one: the service listens on TCP with the
    /// relay endpoint (on `127.0.0.1`, or per [`Scenario::machine_networks`]
    /// on each machine's link), and each "machine" (the
    /// producers' [`ProducerSpec::machine`]) has a `shmtrace relay` with a
    /// socket directory of its own, machine name and id hint `machine-N`,
    /// forwarding its producers to the service. Their packets carry the
    /// machine's id and the pids the relay took from their UNIX
    /// connections; the session traces all machines.
    Relayed,
}

/// The name (and machine id hint) of relayed machine `index`.
pub fn machine_name(index: u32) -> String {
    format!("machine-{index}")
}

/// The clocks of relayed machines ([`Scenario::machine_clocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MachineClocks {
    /// Every machine reads this machine's clocks.
    #[default]
    Shared,
    /// Machine `N`'s relay and producers run in a Linux time namespace of
    /// their own (`unshare --time`), where `CLOCK_BOOTTIME` reads
    /// [`machine_boottime_offset`]`(N)` and `CLOCK_MONOTONIC`
    /// [`machine_monotonic_offset`]`(N)` ahead of this machine's: the
    /// machines' clocks differ by hours, as separate machines' do. Fails
    /// the run if this kernel or user cannot ([`probe_time_namespaces`]).
    OwnTimeNamespaces,
}

/// How far relayed machine `index`'s `CLOCK_BOOTTIME` runs ahead of this
/// machine's under [`MachineClocks::OwnTimeNamespaces`]: hours, a
/// different number for each machine.
pub fn machine_boottime_offset(index: u32) -> Duration {
    Duration::from_secs(3600 * u64::from(index + 1) + 17)
}

/// How far relayed machine `index`'s `CLOCK_MONOTONIC` runs ahead of this
/// machine's under [`MachineClocks::OwnTimeNamespaces`]: not the BOOTTIME
/// offset, so a conversion that mixes up the two clocks shows.
pub fn machine_monotonic_offset(index: u32) -> Duration {
    Duration::from_secs(7200 * u64::from(index + 1) + 1234)
}

/// The networks of relayed machines ([`Scenario::machine_networks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MachineNetworks {
    /// Every machine reaches the central service on `127.0.0.1`.
    #[default]
    Loopback,
    /// Machine `N`'s relay and producers run in a Linux network namespace
    /// of their own, linked to this one by a veth pair on a /30 of its own
    /// ([`MachineNetwork`]); the central service listens on this side of
    /// every link, and each relay connects to its own link's address. Fails
    /// the run if this machine cannot make them.
    OwnNamespaces,
}

/// Where a relayed machine's programs run: with which clocks, in which
/// network namespace (`None`: this one).
#[derive(Debug, Clone, Copy)]
pub struct MachineEnv<'a> {
    /// The machine's clocks.
    pub clocks: MachineClocks,
    /// The machine's network namespace.
    pub network: Option<&'a MachineNetwork>,
}

impl MachineEnv<'_> {
    /// This machine's clocks and network.
    pub const HOST: Self = MachineEnv {
        clocks: MachineClocks::Shared,
        network: None,
    };
}

/// `command` as it runs on relayed machine `index` in `env`: as is, under
/// `unshare --time` with the machine's offsets, and under `ip netns exec`
/// in its network namespace. Neither forks: unshare puts the program in the
/// new time namespace as it executes it (the kernel moves a process into
/// the time namespace of its children when it executes a program, since
/// Linux 6.0), and ip enters the network namespace and then executes it, so
/// the process spawned is the program itself and its pid is the program's.
fn on_machine(command: Command, index: u32, env: MachineEnv) -> Command {
    let command = match env.clocks {
        MachineClocks::Shared => command,
        MachineClocks::OwnTimeNamespaces => {
            let mut unshare = Command::new("unshare");
            unshare
                .arg("--time")
                .arg(format!(
                    "--boottime={}",
                    machine_boottime_offset(index).as_secs()
                ))
                .arg(format!(
                    "--monotonic={}",
                    machine_monotonic_offset(index).as_secs()
                ))
                .arg("--");
            process::wrapped(unshare, &command)
        }
    };
    match env.network {
        Some(network) => network.wrap(command),
        None => command,
    }
}

/// This machine's `CLOCK_BOOTTIME`, ns: the central service's clock, which
/// the harness shares.
pub fn boottime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Whether a program started as [`MachineClocks::OwnTimeNamespaces`]
/// starts it reads the shifted clocks: `unshare --time` runs `cat
/// /proc/uptime` (uptime is BOOTTIME) for machine 0, which must read
/// [`machine_boottime_offset`]`(0)` more than this process does. An error
/// says why not (no time namespaces in this kernel, no right to make one,
/// no `unshare`, or a kernel older than 6.0 that leaves the program
/// outside the namespace).
pub fn probe_time_namespaces() -> Result<()> {
    let uptime = |text: &str| -> Option<f64> { text.split_whitespace().next()?.parse().ok() };
    let before = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    let mut cat = Command::new("cat");
    cat.arg("/proc/uptime");
    let env = MachineEnv {
        clocks: MachineClocks::OwnTimeNamespaces,
        network: None,
    };
    let mut command = on_machine(cat, 0, env);
    let output = command.output().map_err(|source| HarnessError::Spawn {
        name: "unshare --time (probe)".into(),
        program: PathBuf::from("unshare"),
        source,
    })?;
    let inside = String::from_utf8_lossy(&output.stdout);
    let shift = uptime(&inside).zip(uptime(&before)).map(|(i, b)| i - b);
    let expected = machine_boottime_offset(0).as_secs_f64();
    match shift {
        Some(shift) if output.status.success() && (shift - expected).abs() < 60.0 => Ok(()),
        _ => Err(HarnessError::Scenario(format!(
            "relayed machines need clocks of their own (Linux time namespaces: `unshare \
             --time`, root or CAP_SYS_ADMIN, Linux 6.0 or later), and this machine cannot \
             give them: unshare exited {}, its program read uptime {:?} where this process \
             read {:?} (expected {expected} s more); stderr: {}",
            output.status,
            inside.trim(),
            before.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))),
    }
}

impl Scenario {
    /// A scenario with one 4 MiB ring buffer, the given producers, stopped
    /// by the consumer, no loss allowed.
    pub fn new(name: &'static str, producers: Vec<ProducerSpec>) -> Self {
        Scenario {
            name,
            buffer_kb: 4096,
            fill_policy: FillPolicy::RingBuffer,
            producers,
            stop: Stop::ByConsumer,
            clear_period_ms: None,
            write_into_file_period_ms: None,
            between_phases: BetweenPhases::Nothing,
            loss: Loss::None,
            keep_trace: None,
            track_event_config: None,
            stop_timeout: STOP_TIMEOUT,
            producer_configs: Vec::new(),
            producer_socket: ProducerSocket::Unix,
            machine_clocks: MachineClocks::Shared,
            machine_networks: MachineNetworks::Loopback,
            deflate: false,
            trace_filter: None,
        }
    }

    /// The longest the harness waits, in all, for the session to end: the
    /// consumer driver's own timeout, so that the harness's deadlines,
    /// which say what was late, come first.
    fn deadline(&self) -> Duration {
        let phases = self.producers.first().map_or(1, |p| p.phases);
        let duration = match self.stop {
            Stop::ByConsumer | Stop::AfterKillingProducers => Duration::ZERO,
            Stop::ByDuration { duration_ms } => Duration::from_millis(duration_ms.into()),
        };
        // Every producer's start, then per phase its emission and a flush
        // and a read, then the stop.
        START_TIMEOUT * (self.producers.len() as u32)
            + (PHASE_TIMEOUT + 2 * self.stop_timeout) * phases
            + self.stop_timeout
            + duration
    }

    /// The TraceConfig the consumer sends (the first one, when the
    /// scenario has several sessions).
    pub fn trace_config(&self) -> TraceConfig {
        self.session_config(0)
    }

    /// Concurrent sessions (consumers), as the producers expect them.
    pub fn sessions(&self) -> u32 {
        self.producers.first().map_or(1, |p| p.sessions)
    }

    /// The TraceConfig of session `index` (from 0): track_event, and the
    /// custom data source tagged with [`session_label`]`(index)` if the
    /// producers write it.
    pub fn session_config(&self, index: u32) -> TraceConfig {
        let mut config = TraceConfig::track_event(self.buffer_kb, self.fill_policy, &CATEGORIES);
        if let Some(filter) = &self.track_event_config {
            for source in &mut config.data_sources {
                if let Some(c) = &mut source.config {
                    c.track_event_config = Some(filter.clone());
                }
            }
        }
        if self.producers.iter().any(|p| p.custom_source) {
            config.data_sources.push(config::DataSource {
                config: Some(config::DataSourceConfig {
                    name: Some(CUSTOM_SOURCE.into()),
                    target_buffer: Some(0),
                    track_event_config: None,
                    legacy_config: Some(session_label(index)),
                }),
            });
        }
        if let Stop::ByDuration { duration_ms } = self.stop {
            config.duration_ms = Some(duration_ms);
        }
        config.producers.clone_from(&self.producer_configs);
        config.incremental_state_config = self.clear_period_ms.map(|ms| IncrementalStateConfig {
            clear_period_ms: Some(ms),
        });
        if let Some(period) = self.write_into_file_period_ms {
            config.write_into_file = Some(true);
            config.file_write_period_ms = Some(period);
        }
        if self.producer_socket == ProducerSocket::Relayed {
            config.trace_all_machines = Some(true);
        }
        if self.deflate {
            config.compression_type = Some(1);
        }
        config.trace_filter.clone_from(&self.trace_filter);
        config
    }

    fn phases(&self) -> Result<u32> {
        let first = self
            .producers
            .first()
            .ok_or_else(|| HarnessError::Scenario("no producers".into()))?;
        for (what, value) in [
            ("phases", (|p| p.phases) as fn(&ProducerSpec) -> u32),
            ("sessions", |p| p.sessions),
        ] {
            let first = value(first);
            if self
                .producers
                .iter()
                .any(|p| value(p) != first || first == 0)
            {
                return Err(HarnessError::Scenario(format!(
                    "all producers need the same, non-zero number of {what}"
                )));
            }
        }
        if first.sessions > 1 && self.between_phases != BetweenPhases::Nothing {
            return Err(HarnessError::Scenario(
                "between-phase actions need a single session".into(),
            ));
        }
        if self.between_phases == BetweenPhases::FlushAndRead
            && self.write_into_file_period_ms.is_some()
        {
            return Err(HarnessError::Scenario(
                "write_into_file sessions cannot be read mid-session".into(),
            ));
        }
        Ok(first.phases)
    }
}

/// The label of session `index` (from 0): its custom data source's
/// `legacy_config`, which our driver writes into each packet.
pub fn session_label(index: u32) -> String {
    format!("session-{}", index + 1)
}

/// What one producer process reported.
#[derive(Debug, Clone)]
pub struct ProducerRun {
    /// Its pid (its packets' `trusted_pid`, where the service knows it).
    pub pid: u32,
    /// Whether its packets carry `trusted_pid` (not over TCP, see
    /// [`ProducerSocket::Tcp`]).
    pub trusted_pid: bool,
    /// Cumulative counts after each phase.
    pub phases: Vec<EventCounts>,
    /// Packets its custom data source wrote, per session label, by the
    /// end ([`ProducerSpec::custom_source`]).
    pub custom: BTreeMap<String, u64>,
    /// [`Stop::AfterKillingProducers`]: from the moment the harness let its
    /// last phase start (sent it "next"; with one phase, started the
    /// process) to its SIGKILL. Its threads wrote nothing before that
    /// moment, so this bounds from above how long they idled before the
    /// kill, however late the harness got to see its phase report (on a
    /// starved machine, hundreds of milliseconds late).
    pub killed_after: Option<Duration>,
    /// This machine's `CLOCK_BOOTTIME` (the service's clock: see
    /// [`boottime_ns`]) just before the harness started it, ns: it
    /// emitted nothing before.
    pub started_ns: u64,
    /// The same clock when its last phase report arrived, ns: it had
    /// emitted everything it reported by then.
    pub reported_ns: u64,
}

impl ProducerRun {
    /// Everything it emitted.
    pub fn emitted(&self) -> EventCounts {
        self.phases.last().copied().unwrap_or_default()
    }
}

/// A mid-session flush and read.
#[derive(Debug, Clone)]
pub struct MidRead {
    /// Whether the flush succeeded.
    pub flush_ok: bool,
    /// The checker's report on all reads so far, against the producers'
    /// counts at that point.
    pub report: TraceReport,
}

/// The result of a scenario run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The checker's report on the whole trace.
    pub report: TraceReport,
    /// Per producer, what it emitted.
    pub producers: Vec<ProducerRun>,
    /// Mid-session reads (BetweenPhases::FlushAndRead).
    pub mid_reads: Vec<MidRead>,
    /// Sizes of the write_into_file output sampled while the session ran.
    pub file_sizes: Vec<u64>,
    /// Size of the final trace file.
    pub trace_bytes: u64,
    /// `shmtrace inspect --check` on the whole trace (all reads); a failed
    /// check fails [`run`].
    pub inspect: InspectVerdict,
    /// What `shmtrace record` reported when done (its summary), in the
    /// [`ConsumerImpl::OurCli`] cells.
    pub cli_summary: Option<Value>,
    /// Every session, the first included (its `report`, `inspect`,
    /// `trace_bytes` and `cli_summary` are also the fields above).
    pub sessions: Vec<SessionTrace>,
    /// The run's directory, deleted with the last clone of the outcome,
    /// or kept if the thread is panicking then (see [`RunDir`]).
    run_dir: Arc<RunDir>,
    /// Under a TCP producer socket: the established connections to the
    /// service's port (in this network namespace) once every producer had
    /// started its data source.
    pub central_connections: Vec<TcpConnection>,
    /// Under [`MachineNetworks::OwnNamespaces`]: each relayed machine's
    /// link.
    pub machine_links: BTreeMap<u32, MachineLink>,
    /// Under [`ProducerSocket::Relayed`]: the central service's state
    /// (`shmtrace query --json`) once every producer had started its data
    /// source, with each producer's machine.
    pub service_state: Option<Value>,
}

/// A relayed machine's network namespace and its link to the central
/// service ([`MachineNetworks::OwnNamespaces`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineLink {
    /// The namespace's name (`ip netns`).
    pub namespace: String,
    /// This side of the link, where the central service listens for the
    /// machine.
    pub central: Ipv4Addr,
    /// The machine's side: its address.
    pub own: Ipv4Addr,
}

/// Whether `shmtrace inspect --check`'s only objection to a session's
/// trace is what the real Perfetto SDK writes when it drops the first
/// packets of a thread's sequence while its shared memory buffer is full: a
/// first packet without `first_packet_on_sequence`, and no statistic of the
/// loss (upstream counts SDK-side drops nowhere). inspect is right that the
/// loss is unrecorded, but a scenario that allows loss cannot ask the real
/// SDK for more. Exactly: the producers are the real SDK, the scenario
/// allows loss, every problem is such a lost start, and inspect and the
/// official-schema checker count the same number of lost starts.
fn only_real_sdk_lost_starts(cell: Cell, scenario: &Scenario, session: &SessionTrace) -> bool {
    let analysis = &session.inspect.analysis;
    let Some(counts) = analysis["problem_counts"].as_object() else {
        return false;
    };
    let unmarked = counts.get("unmarked_loss").and_then(Value::as_u64);
    let lost_starts = analysis["loss"]["sequences_start_lost"].as_u64();
    let checker_lost_starts = session
        .report
        .sequences
        .iter()
        .filter(|s| s.start_lost)
        .count() as u64;
    cell.producer == ProducerImpl::Real
        && scenario.loss == Loss::Allowed
        && counts.len() == 1
        && unmarked.is_some_and(|n| n > 0)
        && unmarked == lost_starts
        && lost_starts == Some(checker_lost_starts)
        && analysis["problems"].as_array().is_some_and(|problems| {
            problems.iter().all(|p| {
                p["kind"] == "unmarked_loss"
                    && p["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("lacks first_packet_on_sequence"))
            })
        })
}

/// The trace of one session and what the judges said of it.
#[derive(Debug, Clone)]
pub struct SessionTrace {
    /// The checker's report on it, against everything the producers
    /// emitted.
    pub report: TraceReport,
    /// `shmtrace inspect --check` on it (a failed check fails [`run`]).
    pub inspect: InspectVerdict,
    /// Its size.
    pub trace_bytes: u64,
    /// `shmtrace record`'s summary, in the [`ConsumerImpl::OurCli`] cells.
    pub cli_summary: Option<Value>,
    /// Its custom data source packets.
    pub test_events: TestEvents,
}

impl Outcome {
    /// What all producers emitted together.
    pub fn emitted(&self) -> EventCounts {
        let mut total = EventCounts::default();
        for p in &self.producers {
            total += p.emitted();
        }
        total
    }
}

/// The private directory of one run: sockets, config, traces, logs.
struct WorkDir {
    dir: tempfile::TempDir,
}

impl WorkDir {
    fn new(name: &str) -> Result<Self> {
        // Unix socket paths are limited to 107 bytes: prefer a short base.
        let base = std::env::temp_dir();
        let base = if base.as_os_str().len() > 60 {
            PathBuf::from("/tmp")
        } else {
            base
        };
        let dir = tempfile::Builder::new()
            .prefix(&format!("shmtrace-{name}-"))
            .tempdir_in(&base)
            .map_err(|source| HarnessError::Io {
                action: "create a temporary directory in",
                path: base,
                source,
            })?;
        Ok(WorkDir { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A run's directory after the run: kept, and named on stderr, if it is
/// dropped while the thread panics, so that a test's failed assertion on
/// the outcome (the checker's verdict, a count) leaves the trace, the
/// checker's reports and the processes' logs for a look; always kept
/// under `SHMTRACE_KEEP_RUNS`.
#[derive(Debug, Default)]
struct RunDir(Option<tempfile::TempDir>);

impl Drop for RunDir {
    fn drop(&mut self) {
        if thread::panicking() || std::env::var_os("SHMTRACE_KEEP_RUNS").is_some() {
            if let Some(dir) = self.0.take() {
                eprintln!("kept {}", dir.keep().display());
            }
        }
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|source| HarnessError::Io {
        action: "write",
        path: path.into(),
        source,
    })
}

fn file_size(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|source| HarnessError::Io {
            action: "stat",
            path: path.into(),
            source,
        })
}

/// The size of the file at `path` as soon as it exceeds `previous` (polled
/// every 10 ms), or after `within`, whatever it is then.
fn size_once_grown(path: &Path, previous: u64, within: Duration) -> Result<u64> {
    let deadline = Instant::now() + within;
    loop {
        let size = file_size(path)?;
        if size > previous || Instant::now() >= deadline {
            return Ok(size);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn u32_field(event: &Value, field: &str, who: &ChildProcess) -> Result<u32> {
    event
        .get(field)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| HarnessError::Driver {
            name: who.name().into(),
            message: format!("event {event} lacks a numeric \"{field}\""),
            stderr_tail: who.stderr_tail(),
        })
}

fn emitted_field(event: &Value, who: &ChildProcess) -> Result<EventCounts> {
    event
        .get("emitted")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or_else(|| HarnessError::Driver {
            name: who.name().into(),
            message: format!("event {event} lacks \"emitted\" counts"),
            stderr_tail: who.stderr_tail(),
        })
}

/// Starts of a process on a TCP port tried, each with a port picked anew
/// (see `with_free_port`).
const TCP_START_ATTEMPTS: u32 = 3;

/// Starts something with `start` on a free TCP port ([`free_tcp_port`]),
/// which it returns with what `start` returned; a failed start is tried
/// again with a new port (another process may have taken the port between
/// its pick and the bind), up to `TCP_START_ATTEMPTS` (3) times. `what`
/// names it in the log line of a retry.
pub fn with_free_port<T>(what: &str, mut start: impl FnMut(u16) -> Result<T>) -> Result<(T, u16)> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let port = free_tcp_port()?;
        match start(port) {
            Ok(started) => return Ok((started, port)),
            Err(e) if attempts < TCP_START_ATTEMPTS => {
                eprintln!("{what}'s start failed; again with a new port: {e}");
            }
            Err(e) => return Err(e),
        }
    }
}

/// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick
/// for port 0; another process could take it before ours binds it, which
/// our process's start then reports: [`with_free_port`] tries again).
pub fn free_tcp_port() -> Result<u16> {
    let io = |source| HarnessError::Io {
        action: "picking a free TCP port on",
        path: PathBuf::from("127.0.0.1"),
        source,
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
    Ok(listener.local_addr().map_err(io)?.port())
}

/// Starts the service `which`, listening on `producer_socket` and
/// `consumer_socket`, and waits until it reports `ready`. Its stderr goes to
/// `log_dir`.
pub fn start_service(
    which: ServiceImpl,
    bins: &RealBinaries,
    log_dir: &Path,
    producer_socket: &Path,
    consumer_socket: &Path,
) -> Result<ChildProcess> {
    start_service_with(
        which,
        bins,
        log_dir,
        producer_socket,
        consumer_socket,
        false,
        false,
    )
}

/// [`start_service`], also exposing the relay port on the producer socket
/// if `relay_endpoint` (`--enable-relay-endpoint`, either service), and
/// listening on TCP addresses other than loopback if `listen_any` (ours
/// refuses them without `--listen-any`; the real one takes any). A
/// producer socket may be a comma-separated list: both services listen on
/// each.
pub fn start_service_with(
    which: ServiceImpl,
    bins: &RealBinaries,
    log_dir: &Path,
    producer_socket: &Path,
    consumer_socket: &Path,
    relay_endpoint: bool,
    listen_any: bool,
) -> Result<ChildProcess> {
    let mut command = match which {
        ServiceImpl::Real => Command::new(&bins.service),
        ServiceImpl::Ours => {
            let mut command = Command::new(shmtrace_binary()?);
            command.args(["serve", "--notify-ready", "--log-level", "warn"]);
            command
        }
    };
    command
        .arg("--producer-socket")
        .arg(producer_socket)
        .arg("--consumer-socket")
        .arg(consumer_socket)
        // Our end of its stdin closes when we die, however we die.
        .arg("--exit-on-stdin-eof");
    if relay_endpoint {
        command.arg("--enable-relay-endpoint");
    }
    if listen_any && which == ServiceImpl::Ours {
        command.arg("--listen-any");
    }
    let mut service = ChildProcess::spawn("service", command, log_dir)?;
    service.expect_event("ready", START_TIMEOUT)?;
    Ok(service)
}

/// Starts `shmtrace relay` for relayed machine `index` in `env`:
/// listening on `listen`, forwarding to `central`, named
/// [`machine_name`]`(index)`, and waits until it reports `ready`. Its
/// stderr goes to `log_dir`.
pub fn start_relay(
    log_dir: &Path,
    index: u32,
    env: MachineEnv,
    listen: &Path,
    central: &Path,
) -> Result<ChildProcess> {
    let name = machine_name(index);
    let mut command = Command::new(shmtrace_binary()?);
    command
        .args(["relay", "--notify-ready", "--log-level", "warn", "--listen"])
        .arg(listen)
        .arg("--to")
        .arg(central)
        .args(["--machine-id-hint", &name, "--machine-name", &name])
        .arg("--exit-on-stdin-eof");
    let command = on_machine(command, index, env);
    let mut relay = ChildProcess::spawn(&format!("relay {name}"), command, log_dir)?;
    relay.expect_event("ready", START_TIMEOUT)?;
    Ok(relay)
}

/// Starts producer number `index` (from 0) of implementation `which`,
/// emitting `spec`, connected to `producer_socket`. It reports `enabled`
/// once a session starts its data source. Its stderr goes to `log_dir`.
pub fn start_producer(
    which: ProducerImpl,
    bins: &RealBinaries,
    log_dir: &Path,
    index: usize,
    spec: &ProducerSpec,
    producer_socket: &Path,
) -> Result<ChildProcess> {
    start_producer_on(
        which,
        bins,
        log_dir,
        index,
        spec,
        producer_socket,
        MachineEnv::HOST,
    )
}

/// [`start_producer`] on its relayed machine ([`ProducerSpec::machine`]),
/// in the machine's `env`.
pub fn start_producer_on(
    which: ProducerImpl,
    bins: &RealBinaries,
    log_dir: &Path,
    index: usize,
    spec: &ProducerSpec,
    producer_socket: &Path,
    env: MachineEnv,
) -> Result<ChildProcess> {
    if spec.process_name.is_some() && (env.clocks != MachineClocks::Shared || env.network.is_some())
    {
        return Err(HarnessError::Scenario(
            "a producer's process name cannot pass through unshare or ip netns exec".into(),
        ));
    }
    let mut command = match which {
        ProducerImpl::Real => Command::new(&bins.producer),
        ProducerImpl::Ours => Command::new(our_producer_binary()?),
    };
    if let Some(name) = spec.process_name {
        std::os::unix::process::CommandExt::arg0(&mut command, name);
    }
    command
        .env("PERFETTO_PRODUCER_SOCK_NAME", producer_socket)
        .arg(format!("--threads={}", spec.threads))
        .arg(format!("--iterations={}", spec.iterations))
        .arg(format!("--phases={}", spec.phases))
        .arg(format!("--large-kb={}", spec.large_kb))
        .arg(format!("--large-every={}", spec.large_every))
        .arg(format!("--iteration-sleep-us={}", spec.iteration_sleep_us))
        .arg(format!("--shmem-kb={}", spec.shmem_kb));
    if spec.sessions != 1 {
        command.arg(format!("--sessions={}", spec.sessions));
    }
    if spec.custom_source {
        command.arg(format!("--custom-source={CUSTOM_SOURCE}"));
    }
    if spec.fidelity {
        command.arg("--fidelity=1");
    }
    let command = on_machine(command, spec.machine, env);
    ChildProcess::spawn(&format!("producer {}", index + 1), command, log_dir)
}

/// Starts consumer number `index` (from 0) of implementation `which`,
/// recording the TraceConfig in `config` into `out` (see the driver
/// protocol in the module docs), streamed into the file if `scenario`
/// writes into a file; the real consumer gives up after the scenario's
/// whole deadline. Its stderr goes to `log_dir`.
#[allow(clippy::too_many_arguments)]
pub fn start_consumer(
    which: ConsumerImpl,
    bins: &RealBinaries,
    log_dir: &Path,
    index: usize,
    consumer_socket: &Path,
    config: &Path,
    out: &Path,
    scenario: &Scenario,
) -> Result<ChildProcess> {
    let write_into_file = scenario.write_into_file_period_ms.is_some();
    let name = match index {
        0 => "consumer".to_string(),
        n => format!("consumer {}", n + 1),
    };
    let mut command = match which {
        ConsumerImpl::Real => Command::new(&bins.consumer),
        ConsumerImpl::OurCli => {
            let mut command = Command::new(shmtrace_binary()?);
            command
                .args(["record", "--progress", "json", "--socket"])
                .arg(consumer_socket)
                .arg("-c")
                .arg(config)
                .arg("-o")
                .arg(out);
            if write_into_file {
                command.arg("--write-into-file");
            }
            return ChildProcess::spawn(&format!("{name} (shmtrace record)"), command, log_dir);
        }
    };
    command
        .arg("--socket")
        .arg(consumer_socket)
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(out);
    if write_into_file {
        command.arg("--write-into-file");
    }
    command.arg(format!("--timeout-ms={}", scenario.deadline().as_millis()));
    ChildProcess::spawn(&name, command, log_dir)
}

/// Before the kill of [`Stop::AfterKillingProducers`]: reads the session
/// (no flush) until every thread of every producer (`threads`: pid and
/// emitting threads) has a track event in the service's buffer. Then the
/// service knows every writer: a producer registers a writer
/// (`RegisterTraceWriter`) before it commits the writer's first chunk, and
/// the service scrapes only the chunks of writers it knows, so a producer
/// killed before that registration went out loses the writer's chunks,
/// scraped or not (both SDKs send it from another thread than the one
/// that writes). Each thread must fill a chunk. Returns the reads: they
/// hold the start of the trace.
fn read_until_every_writer_committed(
    dir: &WorkDir,
    consumer: &mut ChildProcess,
    threads: &[(u32, u32)],
) -> Result<Vec<PathBuf>> {
    let deadline = Instant::now() + STOP_TIMEOUT;
    let mut reads = Vec::new();
    let mut seen: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    loop {
        let path = dir.path(&format!("settle-{}.pftrace", reads.len() + 1));
        consumer.send_line(&format!("read {}", path.display()))?;
        consumer.expect_event("read", STOP_TIMEOUT)?;
        for (pid, sequences) in crate::trace_file::track_event_sequences(&path)? {
            seen.entry(pid).or_default().extend(sequences);
        }
        reads.push(path);
        let waiting: Vec<_> = threads
            .iter()
            .filter(|(pid, threads)| seen.get(pid).map_or(0, |s| s.len()) < *threads as usize)
            .collect();
        if waiting.is_empty() {
            return Ok(reads);
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::Timeout {
                name: consumer.name().into(),
                what: "a track event of every thread in the buffer".into(),
                timeout: STOP_TIMEOUT,
                seen: format!("track event sequences per pid {seen:?}, expected {threads:?}"),
                stderr_tail: consumer.stderr_tail(),
            });
        }
        // Short: the producers' threads idle from their last phase report
        // on, and the kill should come well within our producer's idle
        // sweep period (see `killed_after`); each read is a round trip.
        thread::sleep(Duration::from_millis(2));
    }
}

/// Before the kill of [`Stop::AfterKillingProducers`]: waits until the
/// service lists every producer's pid (`shmtrace query`), so that the wait
/// for their disconnection in [`kill_producers`] cannot pass at once for a
/// service that reports no pid (0) or never listed them.
fn await_listed(producers: &[ChildProcess], consumer_socket: &Path) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let state = query(consumer_socket)?;
        let listed: BTreeSet<u64> = state["producers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["pid"].as_u64())
            .collect();
        let unlisted: Vec<u32> = producers
            .iter()
            .map(ChildProcess::pid)
            .filter(|pid| !listed.contains(&u64::from(*pid)))
            .collect();
        if unlisted.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::Timeout {
                name: "service".into(),
                what: format!("the producers' pids {unlisted:?} in its producer list"),
                timeout: START_TIMEOUT,
                seen: format!("{state}"),
                stderr_tail: String::new(),
            });
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Kills every producer with SIGKILL ([`Stop::AfterKillingProducers`]),
/// then waits until the service has seen them go: `shmtrace query` (its
/// producer list, which listed them before: [`await_listed`]) shows none
/// of their pids. Returns when each was sent its SIGKILL.
fn kill_producers(producers: &mut [ChildProcess], consumer_socket: &Path) -> Result<Vec<Instant>> {
    /// The signal number of SIGKILL.
    const SIGKILL: i32 = 9;
    let pids: Vec<u64> = producers.iter().map(|p| p.pid().into()).collect();
    let mut killed_at = Vec::new();
    for producer in producers.iter_mut() {
        killed_at.push(Instant::now());
        let status = producer.kill(STOP_TIMEOUT)?;
        if std::os::unix::process::ExitStatusExt::signal(&status) != Some(SIGKILL) {
            return Err(HarnessError::Driver {
                name: producer.name().into(),
                message: format!("exited by itself ({status}) before it was killed"),
                stderr_tail: producer.stderr_tail(),
            });
        }
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        let state = query(consumer_socket)?;
        let connected: Vec<&Value> = state["producers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["pid"].as_u64().is_some_and(|pid| pids.contains(&pid)))
            .collect();
        if connected.is_empty() {
            return Ok(killed_at);
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::Timeout {
                name: "service".into(),
                what: "the killed producers' disconnection".into(),
                timeout: STOP_TIMEOUT,
                seen: format!("still connected: {connected:?}"),
                stderr_tail: String::new(),
            });
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Ctrl-C for a process (SIGINT, through the shell's `kill`).
pub fn interrupt(process: &ChildProcess) -> Result<()> {
    let status = Command::new("sh")
        .args(["-c", &format!("kill -INT {}", process.pid())])
        .status()
        .map_err(|source| HarnessError::Spawn {
            name: "kill".into(),
            program: PathBuf::from("sh"),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(HarnessError::Driver {
            name: process.name().into(),
            message: format!("cannot send SIGINT: kill exited with {status}"),
            stderr_tail: process.stderr_tail(),
        })
    }
}

fn expectation(
    producers: &[ProducerRun],
    phase: usize,
    loss: Loss,
    whole_session: bool,
) -> Expectation {
    Expectation {
        producers: producers
            .iter()
            .map(|p| ProducerExpectation {
                pid: p.trusted_pid.then_some(p.pid),
                emitted: p.phases[phase],
            })
            .collect(),
        loss,
        require_trace_stats: whole_session,
        require_service_packets: true,
        remote_producers: producers.iter().any(|p| !p.trusted_pid),
    }
}

/// The checker's reports on each mid-session read (with what the producers
/// had emitted by then) and on the whole trace (`all_reads`).
fn check_reads(
    dir: &WorkDir,
    runs: &[ProducerRun],
    loss: Loss,
    mid_paths: &[PathBuf],
    mid_flushes: &[bool],
    all_reads: &[PathBuf],
) -> Result<(Vec<MidRead>, TraceReport)> {
    let mut mid_reads = Vec::new();
    for (index, &flush_ok) in mid_flushes.iter().enumerate() {
        let expect = expectation(runs, index, loss, false);
        let report = checker::check(
            &mid_paths[..=index],
            &expect,
            dir.dir.path(),
            &format!("read-{}", index + 1),
        )?;
        mid_reads.push(MidRead { flush_ok, report });
    }
    let phases = runs.first().map_or(0, |r| r.phases.len());
    let expect = expectation(runs, phases.saturating_sub(1), loss, true);
    let report = checker::check(all_reads, &expect, dir.dir.path(), "trace")?;
    Ok((mid_reads, report))
}

/// Plays `scenario` in `cell` and checks the trace. Errors are harness or
/// process failures; the trace's own verdict is in `Outcome::report`.
pub fn run(cell: Cell, bins: &RealBinaries, scenario: &Scenario) -> Result<Outcome> {
    checker::ensure_environment()?;
    let phases = scenario.phases()?;
    if !cell.reads_mid_session() && scenario.between_phases == BetweenPhases::FlushAndRead {
        return Err(HarnessError::Scenario(
            "shmtrace record has no mid-session reads (flush-and-read between phases)".into(),
        ));
    }
    if !cell.reads_mid_session()
        && matches!(
            scenario.between_phases,
            BetweenPhases::FlushAndSampleFileSize { .. }
        )
    {
        return Err(HarnessError::Scenario(
            "shmtrace record has no mid-session flushes (flush between phases)".into(),
        ));
    }
    if !cell.reads_mid_session() && scenario.stop == Stop::AfterKillingProducers {
        return Err(HarnessError::Scenario(
            "shmtrace record has no mid-session reads (killing the producers waits for \
             their writers in the buffer)"
                .into(),
        ));
    }
    // Fail early, before any process starts, if the CLI is not built.
    shmtrace_binary()?;
    let dir = WorkDir::new(&format!("{}-{}", scenario.name, cell.name()))?;
    match run_in(&dir, cell, bins, scenario, phases) {
        Ok(mut outcome) => {
            outcome.run_dir = Arc::new(RunDir(Some(dir.dir)));
            Ok(outcome)
        }
        // Every process of the run is gone by now (dropped in `run_in`).
        Err(source) => Err(HarnessError::Kept {
            dir: dir.dir.keep(),
            source: Box::new(source),
        }),
    }
}

fn run_in(
    dir: &WorkDir,
    cell: Cell,
    bins: &RealBinaries,
    scenario: &Scenario,
    phases: u32,
) -> Result<Outcome> {
    let relayed = scenario.producer_socket == ProducerSocket::Relayed;
    let clocks = if relayed {
        scenario.machine_clocks
    } else {
        MachineClocks::Shared
    };
    if clocks == MachineClocks::OwnTimeNamespaces {
        probe_time_namespaces()?;
    }
    // Relayed machines with networks of their own: a namespace and link
    // each, made before every process of the run and (dropped last)
    // deleted after.
    let mut networks = BTreeMap::new();
    if relayed && scenario.machine_networks == MachineNetworks::OwnNamespaces {
        let machines: BTreeSet<u32> = scenario.producers.iter().map(|p| p.machine).collect();
        for machine in machines {
            networks.insert(machine, MachineNetwork::create()?);
        }
    }
    // Where machine `machine` finds the central service: this side of its
    // link, or loopback.
    let central_socket = |machine, port| match networks.get(&machine) {
        Some(network) => PathBuf::from(format!("{}:{port}", network.central_address())),
        None => PathBuf::from(format!("127.0.0.1:{port}")),
    };
    let socket_for = |port| match port {
        None => dir.path("producer.sock"),
        Some(port) if !networks.is_empty() => {
            let sockets: Vec<String> = networks
                .keys()
                .map(|&machine| central_socket(machine, port).display().to_string())
                .collect();
            PathBuf::from(sockets.join(","))
        }
        Some(port) => PathBuf::from(format!("127.0.0.1:{port}")),
    };
    let consumer_socket = dir.path("consumer.sock");
    // Session 1 writes trace.pftrace, session n > 1 trace-<n>.pftrace.
    let sessions = scenario.sessions();
    let mut trace_paths = Vec::new();
    for index in 0..sessions {
        let suffix = if index == 0 {
            String::new()
        } else {
            format!("-{}", index + 1)
        };
        let config_path = dir.path(&format!("config{suffix}.pb"));
        write_file(
            &config_path,
            &config::encode(&scenario.session_config(index)),
        )?;
        trace_paths.push((config_path, dir.path(&format!("trace{suffix}.pftrace"))));
    }
    let trace_path = trace_paths[0].1.clone();

    // A TCP port is free when picked, but another process may take it
    // before the service binds it (then the service exits at start): a
    // start is tried again with a new port, a few times.
    let start = |port: Option<u16>| {
        let producer_socket = socket_for(port);
        start_service_with(
            cell.service,
            bins,
            dir.dir.path(),
            &producer_socket,
            &consumer_socket,
            relayed,
            !networks.is_empty(),
        )
        .map(|service| (service, producer_socket))
    };
    let (mut service, port, producer_socket) = match scenario.producer_socket {
        ProducerSocket::Unix => {
            let (service, producer_socket) = start(None)?;
            (service, None, producer_socket)
        }
        ProducerSocket::Tcp | ProducerSocket::Relayed => {
            let ((service, producer_socket), port) =
                with_free_port("the service", |port| start(Some(port)))?;
            (service, Some(port), producer_socket)
        }
    };
    // Relayed machines: one relay each, in a directory of its own.
    let mut relays = Vec::new();
    let mut machine_sockets = BTreeMap::new();
    if let Some(port) = port.filter(|_| relayed) {
        for spec in &scenario.producers {
            if machine_sockets.contains_key(&spec.machine) {
                continue;
            }
            let machine_dir = dir.path(&machine_name(spec.machine));
            std::fs::create_dir_all(&machine_dir).map_err(|source| HarnessError::Io {
                action: "creating",
                path: machine_dir.clone(),
                source,
            })?;
            let listen = machine_dir.join("producer.sock");
            let env = MachineEnv {
                clocks,
                network: networks.get(&spec.machine),
            };
            let central = central_socket(spec.machine, port);
            relays.push(start_relay(
                dir.dir.path(),
                spec.machine,
                env,
                &listen,
                &central,
            )?);
            machine_sockets.insert(spec.machine, listen);
        }
    }

    let mut producers = Vec::new();
    let killed = scenario.stop == Stop::AfterKillingProducers;
    // When the harness let each producer's current phase start.
    let mut phase_starts = Vec::new();
    // This machine's BOOTTIME just before each producer started.
    let mut started_ns = Vec::new();
    for (index, spec) in scenario.producers.iter().enumerate() {
        // Producers to be killed get a phase more than they play, so that
        // after the last one their threads wait, alive, for the next.
        let spec = ProducerSpec {
            phases: spec.phases + u32::from(killed),
            ..*spec
        };
        phase_starts.push(Instant::now());
        started_ns.push(boottime_ns());
        let socket = machine_sockets
            .get(&spec.machine)
            .unwrap_or(&producer_socket);
        producers.push(start_producer_on(
            spec.implementation.unwrap_or(cell.producer),
            bins,
            dir.dir.path(),
            index,
            &spec,
            socket,
            MachineEnv {
                clocks,
                network: networks.get(&spec.machine),
            },
        )?);
    }
    let mut consumers = Vec::new();
    for (index, (config_path, out)) in trace_paths.iter().enumerate() {
        let mut consumer = start_consumer(
            cell.consumer,
            bins,
            dir.dir.path(),
            index,
            &consumer_socket,
            config_path,
            out,
            scenario,
        )?;
        consumer.expect_event("connected", START_TIMEOUT)?;
        consumers.push(consumer);
    }

    let mut runs = Vec::new();
    for (producer, &started_ns) in producers.iter_mut().zip(&started_ns) {
        let enabled = producer.expect_event("enabled", START_TIMEOUT)?;
        runs.push(ProducerRun {
            started_ns,
            reported_ns: 0,
            pid: u32_field(&enabled, "pid", producer)?,
            // The relay tells the service its producers' pids.
            trusted_pid: scenario.producer_socket != ProducerSocket::Tcp,
            phases: Vec::new(),
            custom: BTreeMap::new(),
            killed_after: None,
        });
    }
    // Every producer's connection to the service is up (it has been told
    // to start its data source), and under a relay so is its machine's.
    let central_connections = match port {
        Some(port) => crate::netns::connections_to(port)?,
        None => Vec::new(),
    };
    // Every producer is connected: what the service says of them (the
    // consumer socket is a UNIX one: no connection to the port counted
    // above).
    let service_state = if relayed {
        Some(query(&consumer_socket)?)
    } else {
        None
    };
    if killed {
        await_listed(&producers, &consumer_socket)?;
    }

    let mut mid_paths = Vec::new();
    let mut mid_flushes = Vec::new();
    let mut file_sizes = Vec::new();
    for phase in 1..=phases {
        for (producer, run) in producers.iter_mut().zip(&mut runs) {
            let event = producer.expect_event("phase", PHASE_TIMEOUT)?;
            run.reported_ns = boottime_ns();
            run.phases.push(emitted_field(&event, producer)?);
            if let Some(custom) = event.get("custom") {
                run.custom =
                    serde_json::from_value(custom.clone()).map_err(|e| HarnessError::Driver {
                        name: producer.name().into(),
                        message: format!("bad \"custom\" counts in {event}: {e}"),
                        stderr_tail: producer.stderr_tail(),
                    })?;
            }
        }
        let last = phase == phases;
        // Between-phase actions have one session (checked by `phases()`).
        let consumer = &mut consumers[0];
        match scenario.between_phases {
            BetweenPhases::FlushAndRead if !last => {
                consumer.send_line("flush")?;
                let flush = consumer.expect_event("flush", scenario.stop_timeout)?;
                mid_flushes.push(flush.get("ok").and_then(Value::as_bool) == Some(true));
                let path = dir.path(&format!("read-{phase}.pftrace"));
                consumer.send_line(&format!("read {}", path.display()))?;
                consumer.expect_event("read", scenario.stop_timeout)?;
                mid_paths.push(path);
            }
            BetweenPhases::SampleFileSize { grow_within } => {
                let previous = file_sizes.last().copied().unwrap_or(0);
                file_sizes.push(size_once_grown(&trace_path, previous, grow_within)?);
            }
            BetweenPhases::FlushAndSampleFileSize { grow_within } if !last => {
                let previous = file_size(&trace_path)?;
                consumer.send_line("flush")?;
                let flush = consumer.expect_event("flush", scenario.stop_timeout)?;
                if flush.get("ok").and_then(Value::as_bool) != Some(true) {
                    return Err(HarnessError::Driver {
                        name: consumer.name().into(),
                        message: format!("the flush between phases failed: {flush}"),
                        stderr_tail: consumer.stderr_tail(),
                    });
                }
                file_sizes.push(size_once_grown(&trace_path, previous, grow_within)?);
            }
            _ => {}
        }
        if !last {
            for (producer, started) in producers.iter_mut().zip(&mut phase_starts) {
                *started = Instant::now();
                producer.send_line("next")?;
            }
        }
    }

    let mut settle_reads = Vec::new();
    if killed {
        let threads: Vec<(u32, u32)> = runs
            .iter()
            .zip(&scenario.producers)
            .map(|(run, spec)| (run.pid, spec.threads))
            .collect();
        settle_reads = read_until_every_writer_committed(dir, &mut consumers[0], &threads)?;
        let killed_at = kill_producers(&mut producers, &consumer_socket)?;
        for ((run, started), killed_at) in runs.iter_mut().zip(&phase_starts).zip(killed_at) {
            run.killed_after = Some(killed_at.saturating_duration_since(*started));
        }
    }
    let mut stop_timeout = scenario.stop_timeout;
    for consumer in &mut consumers {
        match scenario.stop {
            // `run` rejects AfterKillingProducers with `shmtrace record`.
            Stop::ByConsumer if cell.consumer == ConsumerImpl::OurCli => interrupt(consumer)?,
            Stop::ByConsumer | Stop::AfterKillingProducers => consumer.send_line("stop")?,
            Stop::ByDuration { duration_ms } => {
                stop_timeout = scenario.stop_timeout + Duration::from_millis(duration_ms.into());
            }
        }
    }
    let mut cli_summaries = Vec::new();
    for consumer in &mut consumers {
        let done = consumer.expect_event("done", stop_timeout)?;
        cli_summaries.push(done.get("summary").cloned());
        consumer.close_stdin();
        consumer.expect_success(scenario.stop_timeout)?;
    }
    for producer in producers.iter_mut().filter(|_| !killed) {
        producer.expect_event("stopped", STOP_TIMEOUT)?;
        producer.expect_success(STOP_TIMEOUT)?;
    }
    // The service outlives the session cleanly: it exits 0 at the end of
    // its stdin (ours would report a panic or a failed loop as non-zero).
    service.close_stdin();
    service.expect_success(STOP_TIMEOUT)?;
    // So do the relays, once their producers are gone.
    for relay in &mut relays {
        relay.close_stdin();
        relay.expect_success(STOP_TIMEOUT)?;
    }
    if scenario.loss == Loss::None {
        // Counts are exact only if every iteration ran inside the session.
        for (producer, run) in producers.iter().zip(&runs) {
            let skipped = run.emitted().skipped_disabled;
            if skipped > 0 {
                return Err(HarnessError::Driver {
                    name: producer.name().into(),
                    message: format!(
                        "skipped {skipped} iterations while the session was not enabled"
                    ),
                    stderr_tail: producer.stderr_tail(),
                });
            }
        }
    }

    let mut all_reads = mid_paths.clone();
    all_reads.extend(settle_reads);
    all_reads.push(trace_path.clone());
    // The two judges of the trace run side by side (each is one busy core
    // on a big trace).
    let (mid_reads, report, inspected) = thread::scope(|scope| {
        let inspect = scope.spawn(|| inspect(&all_reads));
        let checked = check_reads(
            dir,
            &runs,
            scenario.loss,
            &mid_paths,
            &mid_flushes,
            &all_reads,
        );
        let inspect = inspect
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        checked.and_then(|(mid_reads, report)| Ok((mid_reads, report, inspect?)))
    })?;
    let mut sessions = vec![SessionTrace {
        report: report.clone(),
        inspect: inspected.clone(),
        trace_bytes: file_size(&trace_path)?,
        cli_summary: cli_summaries[0].clone(),
        test_events: test_events::read(&trace_path)?,
    }];
    for (index, (_, path)) in trace_paths.iter().enumerate().skip(1) {
        let expect = expectation(&runs, runs[0].phases.len() - 1, scenario.loss, true);
        let paths = std::slice::from_ref(path);
        let (report, inspect) = thread::scope(|scope| {
            let inspect = scope.spawn(|| inspect(paths));
            let report = checker::check(
                paths,
                &expect,
                dir.dir.path(),
                &format!("trace-{}", index + 1),
            );
            let inspect = inspect
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            report.and_then(|report| Ok((report, inspect?)))
        })?;
        sessions.push(SessionTrace {
            report,
            inspect,
            trace_bytes: file_size(path)?,
            cli_summary: cli_summaries[index].clone(),
            test_events: test_events::read(path)?,
        });
    }
    for (index, session) in sessions.iter().enumerate() {
        if !session.inspect.ok && !only_real_sdk_lost_starts(cell, scenario, session) {
            return Err(HarnessError::Driver {
                name: "shmtrace inspect --check".into(),
                message: format!(
                    "rejects the trace of session {} of scenario {}: {}",
                    index + 1,
                    scenario.name,
                    session.inspect.analysis["problems"]
                ),
                stderr_tail: String::new(),
            });
        }
    }
    if let Some(keep) = &scenario.keep_trace {
        std::fs::copy(&trace_path, keep).map_err(|source| HarnessError::Io {
            action: "copy the trace to",
            path: keep.clone(),
            source,
        })?;
    }
    Ok(Outcome {
        report,
        producers: runs,
        mid_reads,
        file_sizes,
        trace_bytes: sessions[0].trace_bytes,
        inspect: inspected,
        cli_summary: cli_summaries[0].clone(),
        sessions,
        run_dir: Arc::default(),
        central_connections,
        machine_links: networks
            .iter()
            .map(|(&machine, network)| {
                let link = MachineLink {
                    namespace: network.namespace().to_owned(),
                    central: network.central_address(),
                    own: network.machine_address(),
                };
                (machine, link)
            })
            .collect(),
        service_state,
    })
}

/// `shmtrace query [--json] --socket S`: its output (a test helper:
/// panics when the command fails).
pub fn query_output(socket: &Path, json: bool) -> String {
    let mut command = Command::new(shmtrace_binary().unwrap());
    command.arg("query");
    if json {
        command.arg("--json");
    }
    let out = command
        .arg("--socket")
        .arg(socket)
        .output()
        .expect("run shmtrace query");
    assert!(
        out.status.success(),
        "shmtrace query: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// `shmtrace query --json --socket S`, parsed (a test helper, like
/// [`query_output`]).
pub fn query_json(socket: &Path) -> Value {
    query(socket).unwrap_or_else(|e| panic!("{e}"))
}

/// `shmtrace query --json --socket S`, parsed: the service's state
/// (producers, data sources, sessions), from either service.
pub fn query(socket: &Path) -> Result<Value> {
    let mut args: Vec<OsString> = ["query", "--json", "--socket"].map(OsString::from).into();
    args.push(socket.into());
    let run = CliRun::new("shmtrace query", args)?;
    if !run.output.status.success() {
        return Err(run.error(format!("failed: {}", run.output.status)));
    }
    serde_json::from_slice(&run.output.stdout)
        .map_err(|e| run.error(format!("printed no state: {e}")))
}

/// Queries until `ready` holds of the state (the service learns of a
/// producer or a session asynchronously), at most 20 s.
pub fn query_until(socket: &Path, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = query_json(socket);
        if ready(&state) {
            return state;
        }
        assert!(Instant::now() < deadline, "{what} never showed: {state}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session whose inspect found `problems` and whose checker counted
    /// `checker_lost` lost starts.
    fn session(problems: &[(&str, &str)], lost_starts: u64, checker_lost: usize) -> SessionTrace {
        let mut counts = serde_json::Map::new();
        for (kind, _) in problems {
            let n = counts.get(*kind).and_then(Value::as_u64).unwrap_or(0);
            counts.insert((*kind).into(), (n + 1).into());
        }
        let sequences: Vec<Value> = (0..checker_lost + 1)
            .map(|i| {
                serde_json::json!({
                    "id": i, "pids": [1], "packets": 3, "track_events": 2, "cleared": 1,
                    "loss_marks": 0, "start_lost": i < checker_lost, "skipped_incremental": 0,
                })
            })
            .collect();
        SessionTrace {
            report: serde_json::from_value(serde_json::json!({
                "ok": true, "violations": [], "sequences": sequences,
            }))
            .expect("a report"),
            inspect: InspectVerdict {
                ok: problems.is_empty(),
                analysis: serde_json::json!({
                    "problem_counts": counts,
                    "problems": problems
                        .iter()
                        .map(|(kind, message)| serde_json::json!({"kind": kind, "message": message}))
                        .collect::<Vec<_>>(),
                    "loss": {"sequences_start_lost": lost_starts},
                }),
            },
            trace_bytes: 0,
            cli_summary: None,
            test_events: TestEvents::default(),
        }
    }

    const LOST_START: (&str, &str) = (
        "unmarked_loss",
        "sequence 4 (pid [1]): its first packet lacks first_packet_on_sequence, so its start \
         is missing, and no statistic records a loss",
    );

    #[test]
    fn only_the_real_sdks_unrecorded_lost_starts_are_tolerated() {
        let allowed = Scenario {
            loss: Loss::Allowed,
            ..Scenario::new("s", vec![])
        };
        let two = [LOST_START, LOST_START];
        assert!(only_real_sdk_lost_starts(
            Cell::REAL,
            &allowed,
            &session(&two, 2, 2)
        ));
        // Our producer must mark what it drops.
        assert!(!only_real_sdk_lost_starts(
            Cell::OURS,
            &allowed,
            &session(&two, 2, 2)
        ));
        // A scenario that allows no loss.
        let strict = Scenario::new("s", vec![]);
        assert!(!only_real_sdk_lost_starts(
            Cell::REAL,
            &strict,
            &session(&two, 2, 2)
        ));
        // The judges disagree on how many starts were lost.
        assert!(!only_real_sdk_lost_starts(
            Cell::REAL,
            &allowed,
            &session(&two, 2, 1)
        ));
        assert!(!only_real_sdk_lost_starts(
            Cell::REAL,
            &allowed,
            &session(&two, 3, 3)
        ));
        // Any other problem.
        let other = [LOST_START, ("nesting", "SLICE_END with nothing open")];
        assert!(!only_real_sdk_lost_starts(
            Cell::REAL,
            &allowed,
            &session(&other, 1, 1)
        ));
        let other_loss = [("unmarked_loss", "skipped packets nothing records")];
        assert!(!only_real_sdk_lost_starts(
            Cell::REAL,
            &allowed,
            &session(&other_loss, 1, 1)
        ));
        // No problem at all is not this case (inspect passed anyway).
        assert!(!only_real_sdk_lost_starts(
            Cell::REAL,
            &allowed,
            &session(&[], 0, 0)
        ));
    }
}
