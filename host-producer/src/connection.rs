//! The I/O shell: connects to the tracing service's producer socket and
//! feeds the service's commands to the runtime, and the runtime's outbox to
//! the service.
//!
//! Two threads per connection:
//!
//! * the *command* thread (the one [`init`] starts) connects, initializes,
//!   queues the data source registrations, then reads the
//!   `GetAsyncCommand` stream and runs each command (SetupTracing maps the
//!   SMB; Setup/Start/Stop DataSource, Flush and ClearIncrementalState go
//!   to the runtime);
//! * the *sender* thread takes messages out of the outbox in order and
//!   sends them (`RegisterDataSource`, `CommitData`, `RegisterTraceWriter`,
//!   …, all without waiting for replies), and sweeps idle writers
//!   periodically. The command thread never sends, it only reads, so a
//!   service that blocks on its own full socket while ours is full (it
//!   answers our registrations with a burst of commands before reading
//!   on) finds it drained, unless the outbox is over its cap (see below:
//!   only a service that stopped reading ours gets there).
//!
//! When the service is not there the program runs on with tracing off and
//! the command thread retries with a backoff; when the connection drops, all
//! instances stop (tracing off) and it reconnects.
//!
//! # A broken or hostile service
//!
//! Nothing the service sends may take the program down or hang one of its
//! threads; the worst it can cost is its own connection, which is then
//! retried with the backoff (reset only after a connection that ended
//! ordinarily or lasted [`RETRY_MAX`]). What is checked, where:
//!
//! * frames, replies and their decoding (oversized or truncated frames,
//!   replies to requests never made, a stream closed mid-frame, replies
//!   that do not decode): `shmtrace-ipc`, which ends the connection with
//!   the reason (a protocol error, counted below, not an ordinary close) or
//!   drops the frame; a command that is not one of the six known ones is
//!   ignored (a newer service's);
//! * a flood of commands while the command thread is busy (a slow
//!   `on_start`, a flush waiting on writers): `shmtrace-ipc` queues at
//!   most [`REPLY_QUEUE_DEPTH`](shmtrace_ipc::connection::REPLY_QUEUE_DEPTH)
//!   of them (and their descriptors), then stops reading the socket, so
//!   the service's sends block. This cannot stall the producer: the
//!   command thread is the only one that waits for replies, and it waits
//!   only on the command stream it drains;
//! * a handshake that never completes: a watchdog shuts the socket down
//!   after [`Limits::handshake`] (an attempt whose watchdog thread cannot
//!   start fails, counted, instead of running without a time limit);
//! * a service that sends commands and does not read our socket: flush
//!   acks merge into one message, and once the outbox holds
//!   [`BACKLOG_CAP`] messages the command
//!   thread takes no more commands until the sender has sent some (the
//!   IPC client's bounded queue then holds the service back at its sends);
//!   nothing is dropped;
//! * a service that stops reading: a send that has not completed after
//!   [`Limits::send_stall`] ends the connection, and the sender thread is
//!   unblocked by shutting the socket down (so [`Producer::shutdown`]
//!   returns);
//! * the SMB: a second `SetupTracing`, a missing fd (on a UNIX socket,
//!   without shmem emulation), a page size or SMB
//!   size out of range, an fd that is no memfd or a memfd that could shrink
//!   under the mapping (`SIGBUS`) end the connection (`shm`);
//! * data source commands: unknown instance ids are acknowledged and
//!   otherwise ignored, an undecodable config is an empty one, the number
//!   of instances is bounded ([`MAX_INSTANCES`](crate::MAX_INSTANCES)), and
//!   the id lists of Flush and ClearIncrementalState cost time linear in
//!   their length;
//! * our own side: a message too large for one frame (a data source
//!   descriptor over 128 KiB) is not sent, with a warning (the service
//!   would drop the connection on it, and every reconnection would send it
//!   again); a sender that fails otherwise ends the connection instead of
//!   leaving it up with nothing sent.
//!
//! Each such end is logged (a warning when the service is at fault),
//! counted ([`Producer::connection_errors`]) and kept
//! ([`Producer::last_error`]).

pub(crate) mod outbox;
pub(crate) mod proto;

use std::collections::VecDeque;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shmtrace_abi::layout::{PageLayout, PageSize};
use shmtrace_ipc::protos::{
    self as pb, get_async_command_response::Cmd, producer_port, ProducerPort,
};
use shmtrace_ipc::shm::{Adoption, SharedMemory, ShmError};
use shmtrace_ipc::socket::Stream;
use shmtrace_ipc::{Binding, Client, ClientError, PendingCall, SocketAddress};

use crate::connection::outbox::{CommitRequest, Outgoing, BACKLOG_CAP, MAX_CHUNKS_PER_COMMIT};
use crate::connection::proto::{commit_proto, decode_config, descriptor_proto, emulated_parts};
use crate::error::ConnectError;
use crate::runtime::runtime;
use crate::smb::arbiter::{forbid_stalls_on_this_thread, Arbiter, ArbiterCounters};
use crate::track_event::startup::StartupTracing;

/// Size of the private SMB under shmem emulation (`kShmemEmulationSize`).
const EMULATION_SMB_SIZE: usize = 1 << 20;
/// How often idle writers are swept (flushed so they do not pin chunks).
const IDLE_SWEEP_PERIOD: Duration = Duration::from_millis(500);
/// After sending a commit the sender batches the chunks committed within
/// this long (flushes, drains and a filling SMB cut it short).
const COMMIT_BATCH_PERIOD: Duration = Duration::from_micros(500);
/// First retry delay after a failed connection; doubles up to the maximum.
const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long a sender still busy when its connection ends may finish its
/// send before the socket is shut down under it.
const SENDER_GRACE: Duration = Duration::from_millis(100);
/// How often the command thread looks for `Sync` replies while some are
/// outstanding.
const SYNC_POLL: Duration = Duration::from_millis(2);
/// How often waits on the service look at [`Status::stop`].
const STOP_POLL: Duration = Duration::from_millis(20);

/// How long the service may take over what it controls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connect to the end of the handshake: bind, `InitializeConnection`,
    /// `GetAsyncCommand` (the data source registrations follow through the
    /// outbox).
    pub handshake: Duration,
    /// One message to the service (the socket full because the service
    /// stopped reading).
    pub send_stall: Duration,
}

/// The limits of real connections (tests shorten them).
const LIMITS: Limits = Limits {
    handshake: Duration::from_secs(10),
    send_stall: Duration::from_secs(10),
};

/// How the producer connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerConfig {
    /// `producer_name` (sessions can filter on it, and size its shared
    /// memory in `TraceConfig.producers`); by default the process's
    /// `argv[0]`, as Perfetto's SDK names it.
    pub name: String,
    /// Socket name, in any of Perfetto's forms: a path, `@abstract`,
    /// `host:port`, `[v6]:port` or `vsock://cid:port` (the last three
    /// with shmem emulation: the README's *Over TCP and vsock*); `None` =
    /// `$PERFETTO_PRODUCER_SOCK_NAME` or the upstream default
    /// (`/run/perfetto/traced-producer.sock`, else `/tmp/perfetto-producer`).
    pub socket: Option<String>,
    /// SMB size hint in bytes (0 = service default, 256 KiB upstream).
    pub shmem_size_hint_bytes: u32,
    /// SMB page size hint in bytes (0 = service default, 4 KiB).
    pub shmem_page_size_hint_bytes: u32,
    /// How pages are split into chunks (`Div1` like Perfetto; `Div4` gives
    /// 4x the chunks, which helps many-threaded programs with small SMBs).
    pub page_layout: PageLayout,
    /// Whether the service may scrape the shared memory: copy into the
    /// trace the finished packets of chunks still being written when the
    /// producer disconnects, a flush completes or a session stops, so that
    /// what a program wrote just before it crashed or was killed still
    /// reaches the trace. `true` (the default) asks for it as Perfetto's
    /// SDK does (`InitializeConnectionRequest.smb_scraping_mode` =
    /// `SMB_SCRAPING_ENABLED`); `false` asks for `SMB_SCRAPING_DISABLED`,
    /// as `traced_probes` does. A service that finds the producer's chunks
    /// out of reach (shared memory emulation, on transports that cannot
    /// pass memory) scrapes nothing: there our flush handling commits every
    /// writer's chunk instead.
    pub smb_scraping: bool,
    /// Record track events from [`init`] on, before a session reaches the
    /// program: they wait in a local buffer for the first session that
    /// starts track events ([`StartupTracing`]). `None` (the default):
    /// events are recorded only once a session has started.
    pub startup_tracing: Option<StartupTracing>,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            name: default_producer_name(),
            socket: None,
            shmem_size_hint_bytes: 0,
            shmem_page_size_hint_bytes: 0,
            page_layout: PageLayout::Div1,
            smb_scraping: true,
            startup_tracing: None,
        }
    }
}

/// The producer name Perfetto's SDK gives a Linux process: its whole
/// `argv[0]` as the kernel keeps it (`/proc/self/cmdline`: `./app` for a
/// program started as `./app`), so a session's `producer_name_filter` or
/// `TraceConfig.producers` written for it addresses this producer too.
/// Elsewhere `argv[0]`; non-UTF-8 bytes are replaced, never a panic.
fn default_producer_name() -> String {
    let name = crate::track_event::track::command_name();
    if !name.is_empty() {
        return name.to_string();
    }
    std::env::args_os()
        .next()
        .map(|a| a.to_string_lossy().into_owned())
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "shmtrace-producer".into())
}

/// State of the connection to the service, for [`Producer`].
pub(crate) struct Status {
    connected: Mutex<bool>,
    changed: Condvar,
    pub connections: AtomicU64,
    pub stop: AtomicBool,
    /// Connections the service broke (not [ordinary](ConnectError::is_ordinary) ends).
    pub errors: AtomicU64,
    /// Why the last connection ended or could not start.
    last_error: Mutex<Option<Arc<ConnectError>>>,
    /// `Sync` calls sent and not answered yet, oldest first, each with
    /// the registration generation it follows.
    syncs: Mutex<VecDeque<(u64, PendingCall<producer_port::Sync>)>>,
    /// The registration generation the service confirmed on this
    /// connection (0: none yet).
    synced: AtomicU64,
}

impl Status {
    pub(crate) fn new() -> Self {
        Status {
            connected: Mutex::new(false),
            changed: Condvar::new(),
            connections: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            last_error: Mutex::new(None),
            syncs: Mutex::new(VecDeque::new()),
            synced: AtomicU64::new(0),
        }
    }

    fn syncs(
        &self,
    ) -> std::sync::MutexGuard<'_, VecDeque<(u64, PendingCall<producer_port::Sync>)>> {
        self.syncs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The service confirmed registration generation `generation`.
    fn set_synced(&self, generation: u64) {
        let _c = self.connected.lock().unwrap_or_else(|e| e.into_inner());
        self.synced.fetch_max(generation, Ordering::AcqRel);
        self.changed.notify_all();
    }

    /// Logs, counts and keeps why a connection ended or could not start.
    fn record(&self, address: &SocketAddress, error: ConnectError) {
        match &error {
            ConnectError::Unreachable { .. } => {
                log::debug!("shmtrace-producer: {error}")
            }
            e if e.is_ordinary() => {
                log::info!("shmtrace-producer: disconnected from {address}: {error}")
            }
            _ => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                log::warn!("shmtrace-producer: dropped the connection to {address}: {error}");
            }
        }
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(error));
    }

    pub(crate) fn is_connected(&self) -> bool {
        *self.connected.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn last_error(&self) -> Option<Arc<ConnectError>> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The process's producer: connects in the background, see [`init`].
pub struct Producer {
    status: Arc<Status>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

static PRODUCER: OnceLock<Producer> = OnceLock::new();

/// Starts the producer (once per process): a background thread connects to
/// the service, and keeps reconnecting. Returns immediately; tracing is off
/// until a session enables something, unless
/// [`ProducerConfig::startup_tracing`] records from here on.
/// [`Producer::wait_for_session`] waits for the service and a session.
pub fn init(config: ProducerConfig) -> Result<&'static Producer, ConnectError> {
    let address = match &config.socket {
        Some(s) => s.clone(),
        None => shmtrace_ipc::socket::producer_socket_name(),
    };
    let address = SocketAddress::parse(&address).map_err(ConnectError::Address)?;
    let mut started = false;
    let mut startup = Ok(());
    let producer = PRODUCER.get_or_init(|| {
        started = true;
        if let Some(cfg) = &config.startup_tracing {
            startup = crate::track_event::startup::begin(
                crate::track_event::data_source::track_event_type(),
                cfg,
                config.page_layout,
            );
        }
        let status = Arc::new(Status::new());
        let thread = {
            let status = status.clone();
            std::thread::Builder::new()
                .name("shmtrace-producer".into())
                .spawn(move || connection_loop(&config, &address, &status))
                .ok()
        };
        Producer {
            status,
            thread: Mutex::new(thread),
        }
    });
    if !started {
        return Err(ConnectError::AlreadyInitialized);
    }
    startup?;
    if producer
        .thread
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_none()
    {
        return Err(ConnectError::Thread);
    }
    Ok(producer)
}

impl Producer {
    /// The producer started by [`init`], if any.
    pub fn get() -> Option<&'static Producer> {
        PRODUCER.get()
    }

    /// Whether the service connection is up.
    pub fn is_connected(&self) -> bool {
        self.status.is_connected()
    }

    /// Waits until connected; `false` on timeout. The data source
    /// registrations are then queued first in the outbox but may not have
    /// reached the service yet: wait for a session to enable a category
    /// (e.g. [`Category::is_enabled`](crate::Category::is_enabled)) to know
    /// the service saw them.
    pub fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut c = self
            .status
            .connected
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while !*c {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            c = self
                .status
                .changed
                .wait_timeout(c, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }

    /// Waits, at most `timeout`, until the producer is connected and every
    /// session running in the service has started this program's data
    /// sources, and says what it found. The service confirms it handled
    /// every data source this program registered, and sent the commands
    /// that prompted, with a `Sync` round trip after the registrations; as
    /// soon as it did, the answer is [`SessionWait::Started`] (with the
    /// instances started) or [`SessionWait::NoSession`]; without that
    /// confirmation, what stood at the timeout (started instances count
    /// then too).
    ///
    /// Call it after registering categories and data sources, so that
    /// events emitted next reach a session already recording (with
    /// [`ProducerConfig::startup_tracing`], events emitted before it are
    /// kept for that session too).
    pub fn wait_for_session(&self, timeout: Duration) -> SessionWait {
        let deadline = Instant::now() + timeout;
        let mut connected = self
            .status
            .connected
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        loop {
            let confirmed = *connected
                && self.status.synced.load(Ordering::Acquire) >= runtime().registrations();
            let instances = runtime().started_instances();
            let left = deadline.saturating_duration_since(Instant::now());
            if confirmed || left.is_zero() {
                return match (instances, confirmed, *connected) {
                    (0, true, _) => SessionWait::NoSession,
                    (0, false, true) => SessionWait::Unconfirmed,
                    (0, false, false) => SessionWait::NotConnected {
                        reason: self.status.last_error(),
                    },
                    (instances, ..) => SessionWait::Started { instances },
                };
            }
            // Starts are not signalled here: look again every few ms.
            connected = self
                .status
                .changed
                .wait_timeout(connected, left.min(Duration::from_millis(5)))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Number of successful connections so far (reconnects included).
    pub fn connections(&self) -> u64 {
        self.status.connections.load(Ordering::Relaxed)
    }

    /// Number of connections dropped because the service broke the
    /// protocol or sent something unusable (an SMB that could shrink, a
    /// malformed reply, a handshake that never completed, …; see
    /// [`ConnectError::is_ordinary`]). Each was retried.
    pub fn connection_errors(&self) -> u64 {
        self.status.errors.load(Ordering::Relaxed)
    }

    /// Why the last connection ended or could not start, if one did.
    pub fn last_error(&self) -> Option<Arc<ConnectError>> {
        self.status.last_error()
    }

    /// Disconnects for good: every session's data is flushed to the
    /// service first, then tracing is off for the rest of the process.
    pub fn shutdown(&self) {
        flush_all();
        self.status.stop.store(true, Ordering::Release);
        runtime().outbox().kick();
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// What [`Producer::wait_for_session`] found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SessionWait {
    /// Connected, and sessions started this many data source instances of
    /// this program: its events are being recorded.
    Started {
        /// Data source instances started (one per session and data
        /// source).
        instances: usize,
    },
    /// Connected; the service handled every data source this program
    /// registered, and no session started any (none is running, or the
    /// running ones do not ask for them, or wait for a trigger).
    NoSession,
    /// Connected, but the service did not confirm the registrations in
    /// time (a busy service, or one that does not answer `Sync`).
    Unconfirmed,
    /// Not connected: no service at the socket yet, or it failed.
    NotConnected {
        /// Why the last connection attempt failed or ended, if one did.
        reason: Option<Arc<ConnectError>>,
    },
}

impl SessionWait {
    /// Whether a session started this program's data sources.
    pub fn is_started(&self) -> bool {
        matches!(self, SessionWait::Started { .. })
    }
}

impl std::fmt::Display for SessionWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionWait::Started { instances } => {
                write!(f, "tracing: {instances} data source instance(s) started")
            }
            SessionWait::NoSession => write!(f, "connected, no session is tracing this program"),
            SessionWait::Unconfirmed => {
                write!(f, "connected, the service did not confirm in time")
            }
            SessionWait::NotConnected { reason: Some(e) } => write!(f, "not connected: {e}"),
            SessionWait::NotConnected { reason: None } => write!(f, "not connected"),
        }
    }
}

/// Hands every writer's current chunk to the service now (e.g. before the
/// program exits), waiting up to a second for the messages to leave (and
/// before that, up to two for a startup trace being handed over).
pub fn flush_all() {
    runtime().flush(&[], 0);
    runtime().outbox().drain_wait(Duration::from_secs(1));
}

/// Activates the triggers `names` in the service: every tracing session
/// that lists one of them in its `trigger_config` reacts as configured
/// (a `START_TRACING` session starts, a `STOP_TRACING` one stops, a
/// `CLONE_SNAPSHOT` one is cloned), and the session's trace records a
/// `trigger` packet naming the trigger and this producer
/// ([`ProducerConfig::name`]). Perfetto's SDK calls this
/// `Tracing::ActivateTriggers` (`PerfettoProducerActivateTriggers` in its
/// C API).
///
/// Fire and forget: when connected, one `ActivateTriggers` message with
/// every name leaves through the producer's outbox, after everything the
/// program sent before (its last chunks included), and the service sends
/// no reply. When not connected (the service is not up yet, the
/// connection is being retried, or [`init`] was not called yet), the
/// triggers are kept for `ttl` and sent as soon as a connection opens;
/// those whose `ttl` ran out by then are dropped and counted
/// ([`ProducerStats::triggers_expired`](crate::ProducerStats::triggers_expired)).
/// At most [`MAX_PENDING_TRIGGERS`](crate::MAX_PENDING_TRIGGERS) triggers wait; more are dropped and
/// counted
/// ([`ProducerStats::triggers_dropped`](crate::ProducerStats::triggers_dropped)).
/// Empty names are ignored.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
///
/// use shmtrace_producer::ProducerConfig;
///
/// shmtrace_producer::init(ProducerConfig::default()).expect("start the producer");
/// // Something worth a trace happened: end the sessions waiting for it,
/// // even if the service connection is only coming up within 5 s.
/// shmtrace_producer::activate_triggers(&["jank_detected"], Duration::from_secs(5));
/// ```
pub fn activate_triggers(names: &[&str], ttl: Duration) {
    runtime().activate_triggers(names, ttl);
}

fn set_connected(status: &Status, up: bool) {
    let mut connected = status.connected.lock().unwrap_or_else(|e| e.into_inner());
    *connected = up;
    if !up {
        status.synced.store(0, Ordering::Release);
    }
    drop(connected);
    if !up {
        status.syncs().clear();
    }
    status.changed.notify_all();
}

fn connection_loop(config: &ProducerConfig, address: &SocketAddress, status: &Arc<Status>) {
    run_connections(config, address, status, LIMITS);
}

/// Connects, runs the connection, and reconnects after a backoff, until
/// `status.stop`.
pub(crate) fn run_connections(
    config: &ProducerConfig,
    address: &SocketAddress,
    status: &Arc<Status>,
    limits: Limits,
) {
    forbid_stalls_on_this_thread();
    let mut delay = RETRY_MIN;
    while !status.stop.load(Ordering::Acquire) {
        let started = Instant::now();
        let (connected, result) = connect_once(config, address, status, limits);
        runtime().disconnected();
        let ordinary = result
            .as_ref()
            .map_or_else(ConnectError::is_ordinary, |()| true);
        if connected && (ordinary || started.elapsed() >= RETRY_MAX) {
            // A service that breaks every connection at once backs off
            // like an absent one; a healthy one that restarts does not.
            delay = RETRY_MIN;
        }
        match result {
            // Whatever ended a connection the producer shut down itself.
            Err(_) if status.stop.load(Ordering::Acquire) => {}
            Err(e) => status.record(address, e),
            Ok(()) => {}
        }
        let until = Instant::now() + delay;
        while Instant::now() < until && !status.stop.load(Ordering::Acquire) {
            std::thread::sleep(STOP_POLL.min(until - Instant::now()));
        }
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// Opens one connection and runs it until it ends: whether it opened, and
/// `Ok` if it ended because the producer shut down.
fn connect_once(
    config: &ProducerConfig,
    address: &SocketAddress,
    status: &Arc<Status>,
    limits: Limits,
) -> (bool, Result<(), ConnectError>) {
    let session = match Session::open(config, address, limits, status) {
        Ok(session) => session,
        Err(e) => return (false, Err(e)),
    };
    status.connections.fetch_add(1, Ordering::Relaxed);
    set_connected(status, true);
    let result = session.run(config, status, limits);
    set_connected(status, false);
    (true, result)
}

/// Watchdog threads the next connection attempts fail to start (tests
/// only: a thread that cannot be spawned cannot be provoked otherwise).
#[cfg(test)]
pub(crate) static FAIL_WATCHDOG_SPAWNS: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(0);

/// Shuts a socket down unless disarmed in time, or at once when the
/// producer shuts down: every call blocked on a service that does not
/// answer then fails as disconnected.
struct Watchdog {
    disarm: mpsc::Sender<()>,
    thread: JoinHandle<bool>,
}

impl Watchdog {
    /// Arms it for `socket`. A connection attempt whose watchdog cannot
    /// start fails ([`ConnectError::Thread`]) rather than run a handshake
    /// with no time limit.
    fn arm(socket: &Stream, after: Duration, status: &Arc<Status>) -> Result<Self, ConnectError> {
        let (disarm, disarmed) = mpsc::channel::<()>();
        let status = status.clone();
        let socket = socket
            .try_clone()
            .map_err(|e| ConnectError::Ipc(e.into()))?;
        #[cfg(test)]
        if FAIL_WATCHDOG_SPAWNS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ConnectError::Thread);
        }
        let thread = std::thread::Builder::new()
            .name("shmtrace-producer-watchdog".into())
            .spawn(move || {
                let deadline = Instant::now() + after;
                let fired = loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || status.stop.load(Ordering::Acquire) {
                        break true;
                    }
                    match disarmed.recv_timeout(left.min(STOP_POLL)) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => break false,
                    }
                };
                if fired {
                    let _ = socket.shutdown(Shutdown::Both);
                }
                fired
            })
            .map_err(|e| {
                log::warn!("shmtrace-producer: cannot start the handshake's watchdog: {e}");
                ConnectError::Thread
            })?;
        Ok(Watchdog { disarm, thread })
    }

    /// Disarms it; `true` if it had fired.
    fn disarm(self) -> bool {
        let _ = self.disarm.send(());
        self.thread.join().unwrap_or(false)
    }
}

/// When the sender's current send started, to tell a service that stopped
/// reading.
struct SendClock {
    epoch: Instant,
    /// Milliseconds since `epoch` plus one when the send started; 0 when
    /// not sending.
    since: AtomicU64,
}

impl SendClock {
    fn new() -> Self {
        SendClock {
            epoch: Instant::now(),
            since: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    fn start(&self) {
        self.since.store(self.now(), Ordering::Relaxed);
    }

    fn done(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    /// How long the send in progress has been going, if one is.
    fn busy_for(&self) -> Option<Duration> {
        let since = self.since.load(Ordering::Relaxed);
        (since != 0).then(|| Duration::from_millis(self.now().saturating_sub(since)))
    }
}

/// One connection.
struct Session {
    _client: Client,
    /// The client's socket, to shut it down under a blocked sender.
    socket: Stream,
    port: Binding<ProducerPort>,
    commands: shmtrace_ipc::PendingCall<producer_port::GetAsyncCommand>,
    emulation: bool,
    /// `SetupTracing` was handled (the service sends it once).
    smb_set_up: bool,
}

impl Session {
    fn open(
        config: &ProducerConfig,
        address: &SocketAddress,
        limits: Limits,
        status: &Arc<Status>,
    ) -> Result<Self, ConnectError> {
        let stream = shmtrace_ipc::socket::connect_stream(address).map_err(|source| {
            ConnectError::Unreachable {
                address: address.to_string(),
                source,
            }
        })?;
        // A socket that cannot carry the SMB's descriptor (TCP, vsock) means
        // shmem emulation, whatever the service answers.
        let passes_fds = stream.passes_fds();
        let socket = stream
            .try_clone()
            .map_err(|e| ConnectError::Ipc(e.into()))?;
        let client = Client::from_stream(stream).map_err(|e| ConnectError::Ipc(e.into()))?;
        let watchdog = Watchdog::arm(&socket, limits.handshake, status)?;
        let handshake = Self::handshake(&client, config);
        if watchdog.disarm() {
            return Err(ConnectError::HandshakeTimeout(limits.handshake));
        }
        let (port, commands, emulation) = handshake.map_err(ConnectError::Ipc)?;
        let emulation = emulation || !passes_fds;
        Ok(Session {
            _client: client,
            socket,
            port,
            commands,
            emulation,
            smb_set_up: false,
        })
    }

    /// Binds, initializes, starts the command stream and queues the data
    /// source registrations: the port, the stream, and whether the service
    /// asked for shmem emulation.
    #[allow(clippy::type_complexity)]
    fn handshake(
        client: &Client,
        config: &ProducerConfig,
    ) -> Result<
        (
            Binding<ProducerPort>,
            shmtrace_ipc::PendingCall<producer_port::GetAsyncCommand>,
            bool,
        ),
        ClientError,
    > {
        let port = client.bind::<ProducerPort>()?;
        let reply =
            port.call::<producer_port::InitializeConnection>(&initialize_request(config))?;
        let emulation = reply.use_shmem_emulation.unwrap_or(false);
        let commands =
            port.start::<producer_port::GetAsyncCommand>(&pb::GetAsyncCommandRequest {}, None)?;
        // The registrations go through the outbox: the sender sends them
        // while this thread reads the commands they prompt.
        runtime().connect();
        Ok((port, commands, emulation))
    }

    /// Runs until the connection ends: `Ok` if the producer shut down,
    /// else why it ended.
    fn run(
        mut self,
        config: &ProducerConfig,
        status: &Arc<Status>,
        limits: Limits,
    ) -> Result<(), ConnectError> {
        let stop_sender = Arc::new(AtomicBool::new(false));
        let current = Arc::new(Mutex::new(None::<Arc<Arbiter>>));
        let clock = Arc::new(SendClock::new());
        let sender = {
            let (port, stop, status, current, clock) = (
                self.port.clone(),
                stop_sender.clone(),
                status.clone(),
                current.clone(),
                clock.clone(),
            );
            std::thread::Builder::new()
                .name("shmtrace-producer-tx".into())
                .spawn(move || sender_loop(&port, &stop, &status, &current, &clock))
        };
        let Ok(sender) = sender else {
            return Err(ConnectError::Thread);
        };
        let mut sender = Some(sender);
        let result = loop {
            if status.stop.load(Ordering::Acquire) {
                break Ok(());
            }
            if clock.busy_for().is_some_and(|t| t >= limits.send_stall) {
                break Err(ConnectError::SendStalled(limits.send_stall));
            }
            if sender.as_ref().is_some_and(JoinHandle::is_finished) {
                // It stops only when asked to, or when a send failed.
                let error = match sender.take().map(JoinHandle::join) {
                    Some(Ok(Err(e))) => e,
                    _ => ClientError::Disconnected,
                };
                break Err(ConnectError::Ipc(error));
            }
            if let Err(e) = self.confirm_syncs(config, status, &current) {
                break Err(e);
            }
            // A service that sends commands without reading our socket is
            // held back (see BACKLOG_CAP) until the sender catches up.
            if !runtime()
                .outbox()
                .wait_below(BACKLOG_CAP, Duration::from_millis(200))
            {
                continue;
            }
            // Look at unanswered Syncs often.
            let wait = if status.syncs().is_empty() {
                Duration::from_millis(200)
            } else {
                SYNC_POLL
            };
            match self.commands.next(Some(wait)) {
                None => break Err(ConnectError::CommandStreamEnded),
                Some(Err(ClientError::Timeout)) => continue,
                Some(Err(e)) => break Err(ConnectError::Ipc(e)),
                Some(Ok(reply)) => {
                    if let Err(e) = self.take(reply, config, &current) {
                        break Err(e);
                    }
                }
            }
        };
        // Tracing off first, so writers stop producing; the sender drains
        // what it can, then stops. A sender blocked on a service that
        // stopped reading is unblocked by shutting the socket down.
        runtime().disconnected();
        stop_sender.store(true, Ordering::Release);
        runtime().outbox().kick();
        if let Some(sender) = sender {
            let deadline = Instant::now() + SENDER_GRACE;
            while !sender.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            if !sender.is_finished() {
                let _ = self.socket.shutdown(Shutdown::Both);
            }
            let _ = sender.join();
        }
        result
    }

    /// Runs one reply of the command stream.
    fn take(
        &mut self,
        reply: shmtrace_ipc::Response<pb::GetAsyncCommandResponse>,
        config: &ProducerConfig,
        current: &Mutex<Option<Arc<Arbiter>>>,
    ) -> Result<(), ConnectError> {
        if let Some(cmd) = reply.message.cmd {
            self.handle(cmd, reply.fd, config, current)?;
        }
        if !reply.has_more {
            return Err(ConnectError::CommandStreamEnded);
        }
        Ok(())
    }

    /// Takes the replies of answered `Sync` calls, oldest first. The
    /// service answers one after the registrations before it and the
    /// commands they prompted, which the IPC client then has already
    /// queued on the command stream: they run first, then the generation
    /// counts as confirmed. A `Sync` the service rejects confirms nothing.
    fn confirm_syncs(
        &mut self,
        config: &ProducerConfig,
        status: &Status,
        current: &Mutex<Option<Arc<Arbiter>>>,
    ) -> Result<(), ConnectError> {
        loop {
            let mut syncs = status.syncs();
            let Some((generation, call)) = syncs.front_mut() else {
                return Ok(());
            };
            let generation = *generation;
            let answer = call.next(Some(Duration::ZERO));
            if matches!(answer, Some(Err(ClientError::Timeout))) {
                return Ok(());
            }
            syncs.pop_front();
            drop(syncs);
            if !matches!(answer, Some(Ok(_))) {
                continue;
            }
            loop {
                match self.commands.next(Some(Duration::ZERO)) {
                    None => return Err(ConnectError::CommandStreamEnded),
                    Some(Err(ClientError::Timeout)) => break,
                    Some(Err(e)) => return Err(ConnectError::Ipc(e)),
                    Some(Ok(reply)) => self.take(reply, config, current)?,
                }
            }
            status.set_synced(generation);
        }
    }

    fn handle(
        &mut self,
        cmd: Cmd,
        fd: Option<OwnedFd>,
        config: &ProducerConfig,
        current: &Mutex<Option<Arc<Arbiter>>>,
    ) -> Result<(), ConnectError> {
        let rt = runtime();
        match cmd {
            Cmd::SetupTracing(s) => {
                if std::mem::replace(&mut self.smb_set_up, true) {
                    return Err(ConnectError::SetupTracingTwice);
                }
                let kb = s.shared_buffer_page_size_kb.unwrap_or(4);
                let page = usize::try_from(kb).map_or(usize::MAX, |kb| kb.saturating_mul(1024));
                let page = PageSize::new(page).map_err(ShmError::from)?;
                let shm = match (fd, self.emulation) {
                    (Some(fd), false) => SharedMemory::adopt(fd, page, Adoption::ByProducer)?,
                    (_, true) => SharedMemory::heap(EMULATION_SMB_SIZE, page)?,
                    (None, false) => return Err(ConnectError::NoSmb),
                };
                let arbiter = rt.setup_smb(shm, self.emulation, config.page_layout);
                *current.lock().unwrap_or_else(|e| e.into_inner()) = Some(arbiter);
            }
            Cmd::SetupDataSource(s) => {
                let id = s.new_instance_id.unwrap_or(0);
                let cfg = decode_config(s.config.as_ref());
                if !rt.setup_data_source(id, cfg) {
                    log::warn!("shmtrace-producer: cannot set up data source instance {id}");
                }
            }
            Cmd::StartDataSource(s) => {
                let id = s.new_instance_id.unwrap_or(0);
                // Services older than Android Q send no SetupDataSource.
                rt.setup_data_source(id, decode_config(s.config.as_ref()));
                rt.start_data_source(id);
            }
            Cmd::StopDataSource(s) => rt.stop_data_source(s.instance_id.unwrap_or(0)),
            Cmd::Flush(f) => rt.flush(&f.data_source_ids, f.request_id.unwrap_or(0)),
            Cmd::ClearIncrementalState(c) => rt.clear_incremental_state(&c.data_source_ids),
        }
        Ok(())
    }
}

fn nonzero(v: u32) -> Option<u32> {
    (v != 0).then_some(v)
}

/// The `InitializeConnectionRequest` that opens a connection.
fn initialize_request(config: &ProducerConfig) -> pb::InitializeConnectionRequest {
    use pb::initialize_connection_request::ProducerSmbScrapingMode as Scraping;
    let scraping = if config.smb_scraping {
        Scraping::SmbScrapingEnabled
    } else {
        Scraping::SmbScrapingDisabled
    };
    pb::InitializeConnectionRequest {
        shared_memory_page_size_hint_bytes: nonzero(config.shmem_page_size_hint_bytes),
        shared_memory_size_hint_bytes: nonzero(config.shmem_size_hint_bytes),
        producer_name: Some(config.name.clone()),
        smb_scraping_mode: Some(scraping as i32),
        sdk_version: Some(concat!("shmtrace-producer ", env!("CARGO_PKG_VERSION")).into()),
        ..Default::default()
    }
}

fn sender_loop(
    port: &Binding<ProducerPort>,
    stop: &AtomicBool,
    status: &Status,
    current: &Mutex<Option<Arc<Arbiter>>>,
    clock: &SendClock,
) -> Result<(), ClientError> {
    forbid_stalls_on_this_thread();
    let outbox = runtime().outbox().clone();
    let mut last_sweep = Instant::now();
    while !stop.load(Ordering::Acquire) && !status.stop.load(Ordering::Acquire) {
        if let Some(msg) = outbox.next_timeout(Duration::from_millis(100)) {
            let arbiter = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let commit = matches!(msg, Outgoing::Commit(_));
            clock.start();
            let result = send(port, msg, arbiter.as_deref(), status);
            clock.done();
            outbox.sent();
            match result.or_else(skip_too_large) {
                Ok(()) => {}
                Err(e) => {
                    log::debug!("shmtrace-producer: send failed: {e}");
                    return Err(e);
                }
            }
            if commit {
                // Let the next chunks accumulate instead of each waking us.
                outbox.linger(COMMIT_BATCH_PERIOD);
            }
        }
        if last_sweep.elapsed() >= IDLE_SWEEP_PERIOD {
            runtime().sweep_idle();
            last_sweep = Instant::now();
        }
    }
    Ok(())
}

/// A message too large for one IPC frame is not sent (the service would
/// drop the connection on it, and a reconnection would send it again):
/// logged, and the connection goes on without it. Other send errors stand.
fn skip_too_large(e: ClientError) -> Result<(), ClientError> {
    match e {
        ClientError::TooLarge(e) => {
            log::warn!("shmtrace-producer: a message to the service was not sent: {e}");
            Ok(())
        }
        e => Err(e),
    }
}

fn send(
    port: &Binding<ProducerPort>,
    msg: Outgoing,
    arbiter: Option<&Arbiter>,
    status: &Status,
) -> Result<(), ClientError> {
    match msg {
        Outgoing::Commit(mut req) => {
            if let Some(a) = arbiter {
                a.materialize(&mut req.chunks_to_move);
            }
            let result = match arbiter {
                Some(a) if a.is_emulated() => send_split(port, &req, a.counters),
                _ => send_commit(port, &req),
            };
            runtime().outbox().recycle(req);
            if let Some(a) = arbiter {
                a.commit_sent();
            }
            result
        }
        Outgoing::RegisterTraceWriter {
            writer_id,
            target_buffer,
        } => port.send::<producer_port::RegisterTraceWriter>(
            &pb::RegisterTraceWriterRequest {
                trace_writer_id: Some(writer_id),
                target_buffer: Some(target_buffer),
            },
            None,
        ),
        Outgoing::UnregisterTraceWriter { writer_id } => port
            .send::<producer_port::UnregisterTraceWriter>(
                &pb::UnregisterTraceWriterRequest {
                    trace_writer_id: Some(writer_id),
                },
                None,
            ),
        Outgoing::DataSourceStarted { instance_id } => port
            .send::<producer_port::NotifyDataSourceStarted>(
                &pb::NotifyDataSourceStartedRequest {
                    data_source_id: Some(instance_id),
                },
                None,
            ),
        Outgoing::DataSourceStopped { instance_id } => port
            .send::<producer_port::NotifyDataSourceStopped>(
                &pb::NotifyDataSourceStoppedRequest {
                    data_source_id: Some(instance_id),
                },
                None,
            ),
        Outgoing::RegisterDataSource(d) => port.send::<producer_port::RegisterDataSource>(
            &pb::RegisterDataSourceRequest {
                data_source_descriptor: Some(descriptor_proto(&d)),
            },
            None,
        ),
        Outgoing::UpdateDataSource(d) => port.send::<producer_port::UpdateDataSource>(
            &pb::UpdateDataSourceRequest {
                data_source_descriptor: Some(descriptor_proto(&d)),
            },
            None,
        ),
        Outgoing::ActivateTriggers(trigger_names) => port.send::<producer_port::ActivateTriggers>(
            &pb::ActivateTriggersRequest { trigger_names },
            None,
        ),
        Outgoing::Sync(generation) => {
            // The command thread takes the reply (`Session::confirm_syncs`).
            let call = port.start::<producer_port::Sync>(&pb::SyncRequest {}, None)?;
            status.syncs().push_back((generation, call));
            Ok(())
        }
    }
}

fn send_commit(port: &Binding<ProducerPort>, req: &CommitRequest) -> Result<(), ClientError> {
    if req.chunks_to_move.len() <= MAX_CHUNKS_PER_COMMIT
        && req.chunks_to_patch.len() <= MAX_CHUNKS_PER_COMMIT
    {
        return port.send::<producer_port::CommitData>(
            &commit_proto(
                &req.chunks_to_move,
                &req.chunks_to_patch,
                req.flush_request_id,
            ),
            None,
        );
    }
    for part in req.split(MAX_CHUNKS_PER_COMMIT) {
        port.send::<producer_port::CommitData>(
            &commit_proto(
                &part.chunks_to_move,
                &part.chunks_to_patch,
                part.flush_request_id,
            ),
            None,
        )?;
    }
    Ok(())
}

/// Sends a request under SMB emulation, in parts ([`emulated_parts`]). A
/// part the IPC layer refuses as too large for a frame is dropped and its
/// chunks counted
/// ([`ProducerStats::emulated_chunks_dropped`](crate::ProducerStats::emulated_chunks_dropped));
/// its flush ack, if it had one, goes on its own, and the other parts
/// still go. Not expected: a part over the limit can only be one item
/// whose own estimate is (the split puts such an item alone), and our
/// chunks are at most a page.
fn send_split(
    port: &Binding<ProducerPort>,
    req: &CommitRequest,
    counters: &ArbiterCounters,
) -> Result<(), ClientError> {
    for part in emulated_parts(req) {
        match port.send::<producer_port::CommitData>(&part, None) {
            Ok(()) => {}
            Err(ClientError::TooLarge(e)) => {
                log::warn!(
                    "shmtrace-producer: dropped a commit of {} chunks: {e}",
                    part.chunks_to_move.len(),
                );
                counters
                    .emulated_chunks_dropped
                    .fetch_add(part.chunks_to_move.len() as u64, Ordering::Relaxed);
                if let Some(id) = part.flush_request_id {
                    port.send::<producer_port::CommitData>(&commit_proto(&[], &[], id), None)?;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::outbox::{ChunkToMove, ChunkToPatch, DescriptorInfo};
    use crate::connection::proto::MAX_EMULATED_COMMIT_BYTES;
    use crate::data_source::DataSourceConfig;
    use bytes::Bytes;

    /// The default producer name is the whole first word of the command
    /// line, as Perfetto's SDK takes it (cargo starts tests by their full
    /// path, which a file name alone would not match).
    #[test]
    fn the_default_name_is_the_whole_argv0() {
        let cmdline = std::fs::read("/proc/self/cmdline").unwrap();
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap();
        assert!(argv0.contains(&b'/'), "{argv0:?}");
        assert_eq!(ProducerConfig::default().name.as_bytes(), argv0);
    }

    /// The producer asks for scraping as the SDK's system backend does
    /// (field 4 = SMB_SCRAPING_ENABLED), unless told not to (DISABLED).
    #[test]
    fn the_producer_asks_for_scraping_unless_told_not_to() {
        use prost::Message;
        let config = ProducerConfig {
            name: "p".into(),
            ..ProducerConfig::default()
        };
        // producer_name (3) = "p", smb_scraping_mode (4) = 1.
        let asks = initialize_request(&config).encode_to_vec();
        assert_eq!(asks[..5], [0x1A, 1, b'p', 0x20, 1], "{asks:x?}");
        let config = ProducerConfig {
            smb_scraping: false,
            ..config
        };
        let declines = initialize_request(&config).encode_to_vec();
        assert_eq!(declines[..5], [0x1A, 1, b'p', 0x20, 2], "{declines:x?}");
    }

    #[test]
    fn descriptors_carry_our_fields_and_the_extra_ones() {
        // gpu_counter_descriptor (5) = "gpu", name (1) = "spoof".
        let extra = vec![
            0x2A, 3, b'g', b'p', b'u', 0x0A, 5, b's', b'p', b'o', b'o', b'f',
        ];
        let d = DescriptorInfo {
            name: "real".into(),
            id: 9,
            no_flush: true,
            track_event_descriptor: None,
            extra_fields: extra,
        };
        let p = descriptor_proto(&d);
        assert_eq!(
            p.name.as_deref(),
            Some("real"),
            "the name cannot be overridden"
        );
        assert_eq!(p.id, Some(9));
        assert_eq!(p.gpu_counter_descriptor.as_deref(), Some(&b"gpu"[..]));
        assert_eq!(
            (p.will_notify_on_start, p.will_notify_on_stop),
            (Some(true), Some(true))
        );
        assert_eq!(
            (p.handles_incremental_state_clear, p.no_flush),
            (Some(true), Some(true))
        );
        let bad = DescriptorInfo {
            extra_fields: vec![0xFF],
            ..d
        };
        assert_eq!(descriptor_proto(&bad).gpu_counter_descriptor, None);
    }

    fn chunk(i: u32, len: usize) -> ChunkToMove {
        ChunkToMove {
            page: i,
            chunk: 0,
            target_buffer: 1,
            data: Some(vec![i as u8; len]),
        }
    }

    fn patch(i: u32, n: usize) -> ChunkToPatch {
        let entry = crate::connection::outbox::PatchEntry {
            offset: i,
            data: i.to_le_bytes(),
        };
        ChunkToPatch {
            target_buffer: 1,
            writer_id: 1,
            chunk_id: i,
            patches: std::iter::repeat_n(entry, n).collect(),
            has_more_patches: false,
        }
    }

    /// Checks every promise of [`emulated_parts`] on `req`; returns the
    /// parts.
    fn check_parts(req: &CommitRequest) -> Vec<pb::CommitDataRequest> {
        use prost::Message as _;
        let parts = emulated_parts(req);
        assert!(!parts.is_empty());
        for (n, p) in parts.iter().enumerate() {
            assert!(
                p.encoded_len() <= MAX_EMULATED_COMMIT_BYTES,
                "part {n} encodes to {} bytes",
                p.encoded_len()
            );
            assert!(
                !p.chunks_to_move.is_empty() || !p.chunks_to_patch.is_empty() || n == 0,
                "part {n} is empty"
            );
            let flush =
                (n == parts.len() - 1 && req.flush_request_id != 0).then_some(req.flush_request_id);
            assert_eq!(p.flush_request_id, flush, "flush id on part {n}");
        }
        // Every chunk once, in order, with its bytes; then every patch
        // group, in order, and none before the last chunk's part.
        let moved: Vec<_> = parts.iter().flat_map(|p| &p.chunks_to_move).collect();
        assert_eq!(moved.len(), req.chunks_to_move.len());
        for (m, c) in moved.iter().zip(&req.chunks_to_move) {
            assert_eq!(m.data.as_deref(), c.data.as_deref());
            assert_eq!(m.target_buffer, Some(c.target_buffer));
        }
        let patched: Vec<_> = parts.iter().flat_map(|p| &p.chunks_to_patch).collect();
        let ids: Vec<_> = patched.iter().map(|p| p.chunk_id.unwrap()).collect();
        let want: Vec<_> = req.chunks_to_patch.iter().map(|p| p.chunk_id).collect();
        assert_eq!(ids, want);
        let last_move = parts.iter().rposition(|p| !p.chunks_to_move.is_empty());
        let first_patch = parts.iter().position(|p| !p.chunks_to_patch.is_empty());
        if let (Some(m), Some(p)) = (last_move, first_patch) {
            assert!(p >= m, "patches in part {p} before chunks in part {m}");
        }
        parts
    }

    #[test]
    fn emulated_commits_split_under_the_frame_limit_with_the_ack_last() {
        // 100 chunks of 4 KiB (~400 KiB) and a few patch groups: several
        // parts; the patches fit with the last chunks and ride there.
        let req = CommitRequest {
            chunks_to_move: (0..100).map(|i| chunk(i, 4096)).collect(),
            chunks_to_patch: (0..3).map(|i| patch(i, 4)).collect(),
            flush_request_id: 77,
        };
        let parts = check_parts(&req);
        assert_eq!(parts.len(), 4, "~400 KiB in parts of < 127.5 KiB");
        for p in &parts[..parts.len() - 1] {
            assert!(
                p.chunks_to_patch.is_empty(),
                "patches only on the last part"
            );
        }
        assert_eq!(parts.last().unwrap().chunks_to_patch.len(), 3);

        // A small request travels whole.
        let small = CommitRequest {
            chunks_to_move: vec![chunk(1, 4096)],
            chunks_to_patch: vec![patch(1, 2)],
            flush_request_id: 5,
        };
        let parts = check_parts(&small);
        assert_eq!(parts.len(), 1);
        assert_eq!(
            (
                parts[0].chunks_to_move.len(),
                parts[0].chunks_to_patch.len()
            ),
            (1, 1)
        );

        // A bare flush ack; and 64 KiB chunks: two would not fit a frame, so
        // one per part.
        assert_eq!(
            check_parts(&CommitRequest {
                flush_request_id: 9,
                ..Default::default()
            })
            .len(),
            1
        );
        let big = CommitRequest {
            chunks_to_move: (0..5).map(|i| chunk(i, 65536)).collect(),
            ..Default::default()
        };
        assert_eq!(check_parts(&big).len(), 5);
    }

    #[test]
    fn emulated_patches_too_many_for_one_message_go_in_trailing_parts() {
        // Upstream splits the patches as well (a flush patching every chunk
        // of a large SMB would not fit one frame): 8000 groups of 32
        // patches (~4.6 MiB estimated) after 40 chunks.
        let req = CommitRequest {
            chunks_to_move: (0..40).map(|i| chunk(i, 2048)).collect(),
            chunks_to_patch: (0..8000).map(|i| patch(i, 32)).collect(),
            flush_request_id: 3,
        };
        let parts = check_parts(&req);
        assert!(parts.len() > 30, "{} parts", parts.len());
        assert!(parts[1..].iter().all(|p| p.chunks_to_move.is_empty()));
    }

    /// A fake service end over a socket pair: decodes every frame (a frame
    /// over the IPC limit is a protocol error, as in the real service) and
    /// returns the CommitData requests, or why it stopped early.
    fn fake_service(
        stream: std::os::unix::net::UnixStream,
    ) -> std::thread::JoinHandle<Result<Vec<pb::CommitDataRequest>, String>> {
        use shmtrace_ipc::host::{HostConnection, ServiceTable};
        use shmtrace_ipc::socket::{recv_into, send_queued, Received};
        std::thread::spawn(move || {
            let table = std::sync::Arc::new(ServiceTable::from(ProducerPort));
            let mut conn = HostConnection::<producer_port::Request>::new(table, None);
            let mut commits = Vec::new();
            loop {
                match recv_into(&stream, conn.decoder()) {
                    Ok(Received::Data(_)) | Ok(Received::WouldBlock) => {}
                    Ok(Received::Closed) => return Ok(commits),
                    Err(e) => return Err(format!("recv: {e}")),
                }
                while let Some(call) = conn.poll_call().map_err(|e| format!("{e}"))? {
                    if let producer_port::Request::CommitData(c) = call.request {
                        commits.push(c);
                    }
                }
                send_queued(&stream, conn.out()).map_err(|e| format!("send: {e}"))?;
            }
        })
    }

    /// A client bound to [`fake_service`]'s producer port.
    #[allow(clippy::type_complexity)]
    fn connected_to_fake_service() -> (
        Client,
        Binding<ProducerPort>,
        std::thread::JoinHandle<Result<Vec<pb::CommitDataRequest>, String>>,
    ) {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let service = fake_service(theirs);
        let client = Client::from_stream(ours).unwrap();
        let port = client.bind::<ProducerPort>().unwrap();
        (client, port, service)
    }

    #[test]
    fn emulated_commits_cross_a_real_socket_in_frames_the_service_accepts() {
        let (client, port, service) = connected_to_fake_service();
        let shm = SharedMemory::heap(EMULATION_SMB_SIZE, PageSize::DEFAULT).unwrap();
        let outbox = Arc::new(crate::connection::outbox::Outbox::new());
        let arbiter = Arbiter::new(shm, true, PageLayout::Div1, outbox);
        assert!(arbiter.is_emulated());
        // ~600 KiB of chunk bytes: one request would be ~5 frames too big.
        let req = CommitRequest {
            chunks_to_move: (0..150).map(|i| chunk(i, 4096)).collect(),
            chunks_to_patch: (0..3).map(|i| patch(i, 4)).collect(),
            flush_request_id: 42,
        };
        send(&port, Outgoing::Commit(req), Some(&arbiter), &Status::new()).expect("sent");
        drop(port);
        drop(client);
        let commits = service.join().unwrap().expect("every frame accepted");
        assert!(commits.len() >= 5, "{} commits", commits.len());
        let chunks: usize = commits.iter().map(|c| c.chunks_to_move.len()).sum();
        assert_eq!(chunks, 150);
        assert!(commits.iter().flat_map(|c| &c.chunks_to_move).all(|m| m
            .data
            .as_ref()
            .map(|d| d.len())
            == Some(4096)
            && m.page.is_none()));
        let acks: Vec<_> = commits.iter().map(|c| c.flush_request_id).collect();
        assert_eq!(acks.last(), Some(&Some(42)));
        assert!(acks[..acks.len() - 1].iter().all(Option::is_none));
        assert_eq!(commits.last().unwrap().chunks_to_patch.len(), 3);
    }

    #[test]
    fn an_emulated_part_over_the_frame_limit_is_dropped_and_counted_and_the_rest_goes() {
        let (client, port, service) = connected_to_fake_service();
        let counters = ArbiterCounters::default();
        // A chunk no frame can hold (not one our buffer can make: its
        // chunks are at most a page) between two that fit; then one with
        // the flush ack.
        let req = CommitRequest {
            chunks_to_move: vec![chunk(0, 4096), chunk(1, 200_000), chunk(2, 4096)],
            chunks_to_patch: vec![patch(7, 2)],
            flush_request_id: 11,
        };
        send_split(&port, &req, &counters).expect("the other parts are sent");
        let req = CommitRequest {
            chunks_to_move: vec![chunk(3, 4096), chunk(4, 200_000)],
            flush_request_id: 12,
            ..Default::default()
        };
        send_split(&port, &req, &counters).expect("the other parts are sent");
        drop(port);
        drop(client);
        let commits = service.join().unwrap().expect("every frame accepted");
        let summary: Vec<_> = commits
            .iter()
            .map(|c| {
                (
                    c.chunks_to_move
                        .iter()
                        .map(|m| m.data.as_ref().map_or(0, |d| d[0]))
                        .collect::<Vec<_>>(),
                    c.chunks_to_patch
                        .iter()
                        .map(|p| p.chunk_id.unwrap())
                        .collect::<Vec<_>>(),
                    c.flush_request_id,
                )
            })
            .collect();
        // Chunks 1 and 4 dropped; the ack that rode with chunk 4 sent alone.
        assert_eq!(
            summary,
            [
                (vec![0], vec![], None),
                (vec![2], vec![7], Some(11)),
                (vec![3], vec![], None),
                (vec![], vec![], Some(12)),
            ]
        );
        assert_eq!(counters.emulated_chunks_dropped.load(Ordering::Relaxed), 2);
    }

    proptest::proptest! {
        #[test]
        fn emulated_split_keeps_every_promise(
            sizes in proptest::collection::vec(0usize..=65536, 0..40),
            patches in proptest::collection::vec(0usize..=32, 0..400),
            flush in 0u64..3,
        ) {
            let req = CommitRequest {
                chunks_to_move: sizes.iter().enumerate().map(|(i, &n)| chunk(i as u32, n)).collect(),
                chunks_to_patch: patches.iter().enumerate().map(|(i, &n)| patch(i as u32, n)).collect(),
                flush_request_id: flush,
            };
            check_parts(&req);
        }
    }

    proptest::proptest! {
        /// Whatever bytes the service sends as a config: no panic, the
        /// raw bytes kept for the data source, and what does decode is
        /// what the runtime sees; its category filter can be evaluated.
        #[test]
        fn configs_from_any_bytes_decode_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            track_event in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            use prost::Message as _;
            // Also as a track_event_config (field 113) behind a valid name.
            let mut nested = vec![0x0A, 1, b'x', 0x8A, 0x07, track_event.len() as u8];
            nested.extend_from_slice(&track_event);
            for raw in [Bytes::from(bytes), Bytes::from(nested)] {
                let c = decode_config(Some(&raw));
                proptest::prop_assert_eq!(&c.raw[..], &raw[..]);
                if let Ok(parsed) = pb::DataSourceConfig::decode(raw.clone()) {
                    proptest::prop_assert_eq!(c.name, parsed.name.unwrap_or_default());
                    proptest::prop_assert_eq!(c.target_buffer, parsed.target_buffer.unwrap_or(0));
                    proptest::prop_assert_eq!(
                        c.track_event_config.is_some(),
                        parsed.track_event_config.is_some()
                    );
                }
                if let Some(f) = c.track_event_config {
                    let _ = f.decide("x", &["slow"]);
                    let _ = f.is_enabled("a,b", |_| &[]);
                }
            }
        }
    }

    #[test]
    fn configs_decode_the_fields_the_runtime_uses() {
        // DataSourceConfig { name: "track_event", target_buffer: 3,
        // tracing_session_id: 7, buffer_exhausted_policy: STALL_THEN_DROP,
        // track_event_config { enabled_categories: "a" } }
        let raw = Bytes::from_static(&[
            0x0A, 11, b't', b'r', b'a', b'c', b'k', b'_', b'e', b'v', b'e', b'n', b't', 0x10, 3,
            0x20, 7, 0x48, 3, 0x8A, 0x07, 3, 0x12, 1, b'a',
        ]);
        let c = decode_config(Some(&raw));
        assert_eq!(c.name, "track_event");
        assert_eq!((c.target_buffer, c.tracing_session_id), (3, 7));
        assert_eq!(c.stall_when_exhausted, Some(true));
        assert_eq!(c.track_event_config.unwrap().enabled_categories, ["a"]);
        assert_eq!(c.raw, &raw[..]);
        assert_eq!(decode_config(None), DataSourceConfig::default());
    }
}
