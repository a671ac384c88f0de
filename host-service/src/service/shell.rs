//! The I/O shell: one epoll loop that runs the [service core](super::core)
//! on its sockets.
//!
//! The shell owns the sockets and nothing else: it accepts connections
//! (taking the peer's credentials with `SO_PEERCRED`), feeds received bytes
//! to the IPC host ([`HostConnection`]), hands decoded calls to the core,
//! routes the core's replies (and the SMB descriptors they carry) back, and
//! sleeps until the next socket event or core timer. All behaviour is in the
//! core.
//!
//! Sockets: the producer socket(s) are world-connectable (`0666`: any
//! process may trace); the consumer socket is restricted to the owner
//! (`0600`), or owner and one group (`0660`) if a group is configured, and
//! must be a UNIX socket (consumers are trusted by their uid).
//!
//! Producer sockets may also be TCP or vsock. Their producers cannot
//! receive the SMB's descriptor: the core serves them with shmem emulation
//! ([`TracingService::connect_emulated_producer`]), and they have no
//! credentials ([`REMOTE_PEER`]). The protocol has no authentication, so
//! such a socket must be reachable from this machine only (loopback TCP,
//! vsock context id 1) unless [`ShellConfig::listen_any`] says otherwise.
//!
//! Relays: with [`ShellConfig::relay_endpoint`], producer sockets also
//! expose the `RelayPort` service (upstream's `traced
//! --enable-relay-endpoint`), and a TCP or vsock connection's first
//! `SetPeerIdentity` frame says which machine its producer runs on
//! ([`TracingService::set_peer_identity`]; the machine id is derived here,
//! [`machine_id`]).
//!
//! Backpressure: a consumer's `ReadBuffers` stream is produced only while
//! its send queue is short, so a slow reader holds back only itself. A
//! producer that stops reading its socket while the service queues commands
//! for it (upstream disconnects after a 10 ms send timeout) is disconnected
//! once [`MAX_PRODUCER_BACKLOG`] bytes are queued.
//!
//! # Limits on peers
//!
//! A broken or hostile peer costs the service a bounded amount and never
//! stalls the other peers:
//!
//! * Fairness: each readiness event of a connection reads at most one
//!   receive window (at most
//!   [`MAX_FRAME_LEN`](crate::ipc::MAX_FRAME_LEN) bytes) and dispatches the calls in
//!   it; epoll is level-triggered, so the rest waits for the next turn of
//!   the loop, after every other ready connection got its turn. (Upstream's
//!   `HostImpl::OnDataAvailable`, src/ipc/host_impl.cc, reads until the
//!   socket is empty: a peer that writes faster than the service handles
//!   its calls held the loop for as long as it kept writing.) Once the peer
//!   has shut down its end, what it sent is read and handled at once (it
//!   cannot grow), and the replies dropped: the connection then closes.
//!   Likewise a listener's event accepts at most 64 connections.
//! * Replies: while [`THROTTLE_BACKLOG`] bytes or more are queued for a
//!   connection, the service stops reading its calls (the peer's own sends
//!   then block) until it reads its replies. Upstream sends with a timeout
//!   and drops the connection when it expires (`HostImpl::SendFrame`,
//!   src/ipc/host_impl.cc); here a peer that sends calls and never reads the
//!   replies holds at most this backlog plus the replies to one call.
//! * Connections: at most [`ConnectionLimits`] producer and consumer
//!   connections at once, derived from the process's `RLIMIT_NOFILE` (its
//!   soft limit raised first, as the hard one allows), in separate
//!   budgets, so that producers (anyone may connect) cannot take the
//!   consumers' places. A connection over its budget is accepted and
//!   closed at once (the peer reads end of file), with one log line per
//!   burst. If descriptors run out all the same (`EMFILE`, `ENFILE`), the
//!   listeners rest for [`ACCEPT_PAUSE_NS`] instead of waking the loop for
//!   a connection it cannot accept. Upstream has no such limit (the TODO
//!   about connection limits, b/69093705, in src/ipc/host_impl.cc); a
//!   service at its descriptor limit spun on its listening sockets and
//!   logged a line per turn.

use std::collections::HashMap;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::event::epoll;
use rustix::fs::Mode;
use thiserror::Error;

use crate::ipc::frame::invoke_method_reply_frame;
use crate::ipc::host::machine_id;
use crate::ipc::socket::{self, Received, Stream};
use crate::ipc::{Call, HostConnection, Listener, ServiceTable, SocketAddress};
use crate::protos::{
    consumer_port, producer_port, relay_port, ConsumerPort, ProducerPort, RelayPort, SystemInfo,
    Utsname,
};

use super::core::{
    ConnId, Output, RemoteIdentity, ReplyBody, ServiceConfig, TracingService, REMOTE_PEER,
};
use super::env::{trace_file_write_ns, Environment, SystemEnvironment};

/// Bytes queued for a producer beyond which it is disconnected.
pub const MAX_PRODUCER_BACKLOG: usize = 8 * 1024 * 1024;
/// A consumer's `ReadBuffers` stream is refilled while less than this is
/// queued for it.
pub const READ_WINDOW: usize = 512 * 1024;
/// While this many bytes or more are queued for a connection, its calls
/// are not read (above a full [`READ_WINDOW`] and one reply, so that a
/// `ReadBuffers` stream alone never holds back its consumer's calls).
pub const THROTTLE_BACKLOG: usize = 2 * READ_WINDOW;
/// Descriptors kept out of the connection budgets: listeners, epoll,
/// standard streams, trace files, bridge children.
const RESERVED_FDS: u64 = 64;
/// Descriptors budgeted per connection: its socket and the SMB of a
/// producer or the trace file of a consumer.
const FDS_PER_CONNECTION: u64 = 2;
/// Most producer connections at once, whatever the descriptor limit.
pub const MAX_PRODUCER_CONNECTIONS: usize = 1024;
/// Most consumer connections at once, whatever the descriptor limit.
pub const MAX_CONSUMER_CONNECTIONS: usize = 64;
/// How long the listeners rest after `accept` ran out of descriptors.
pub const ACCEPT_PAUSE_NS: u64 = 100_000_000;
/// Most connections one readiness event of a listener accepts.
const ACCEPTS_PER_EVENT: usize = 64;

const TOKEN_STOP: u64 = 0;
const TOKEN_LISTENER: u64 = 1;
const TOKEN_CONN: u64 = 1 << 32;

/// Why the shell could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ShellError {
    /// A socket could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: String,
        /// Why.
        source: io::Error,
    },
    /// A TCP or vsock producer socket that other machines could reach,
    /// without [`ShellConfig::listen_any`].
    #[error(
        "{0} is reachable from other machines and the tracing protocol has no \
         authentication: listen on a loopback address (127.0.0.1:PORT, [::1]:PORT, \
         vsock://1:PORT) or allow it explicitly (shmtrace serve --listen-any)"
    )]
    NotLoopback(String),
    /// A consumer socket that is not a UNIX socket.
    #[error("the consumer socket must be a UNIX socket (a path or @name), not {0}")]
    ConsumerNotUnix(String),
    /// A system call of the event loop failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
}

fn os(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShellError {
    move |e| ShellError::Os {
        what,
        source: e.into(),
    }
}

/// A turn of the loop (one `epoll_wait`'s events, the timers, the
/// writes) that takes longer than this is logged.
const SLOW_TURN_NS: u64 = 50_000_000;

/// The start of a turn of the loop: wall time and this thread's CPU time,
/// so that a slow turn says whether the service worked that long or was
/// kept off the CPU (by the scheduler or a blocking call).
struct Turn {
    wall: u64,
    cpu: u64,
    file_writes: u64,
}

impl Turn {
    fn start(clock: &SystemEnvironment) -> Self {
        Self {
            wall: clock.now(),
            cpu: thread_cpu_ns(),
            file_writes: trace_file_write_ns(),
        }
    }

    fn finish(self, clock: &SystemEnvironment, events: usize) {
        let wall = clock.now().saturating_sub(self.wall);
        if wall > SLOW_TURN_NS {
            let cpu = thread_cpu_ns().saturating_sub(self.cpu);
            let file_writes = trace_file_write_ns().saturating_sub(self.file_writes);
            log::warn!(
                "slow turn of the service loop: {:.1} ms, {:.1} ms of it on the CPU, \
                 {:.1} ms in trace-file writes, {events} event(s)",
                wall as f64 / 1e6,
                cpu as f64 / 1e6,
                file_writes as f64 / 1e6,
            );
        }
    }
}

/// This thread's CPU time.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// Where the service listens.
#[derive(Debug, Clone)]
pub struct ShellConfig {
    /// Producer sockets (upstream accepts a comma-separated list).
    pub producer_sockets: Vec<SocketAddress>,
    /// The consumer socket.
    pub consumer_socket: SocketAddress,
    /// A group that may also connect to the consumer socket.
    pub consumer_group: Option<u32>,
    /// Allow TCP and vsock producer sockets that other machines can reach
    /// (anyone who can connect may then trace into this machine's sessions).
    pub listen_any: bool,
    /// Expose the `RelayPort` service on the producer sockets, for relays
    /// of other machines.
    pub relay_endpoint: bool,
}

/// How many connections of each side the shell keeps open at once (see
/// the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Producer connections (all producer sockets together).
    pub producers: usize,
    /// Consumer connections.
    pub consumers: usize,
}

impl ConnectionLimits {
    /// The limits for a process that may open `nofile` descriptors: after
    /// 64 kept for listeners, epoll, trace files and bridge children, two
    /// descriptors per connection, an eighth of them for consumers (at most
    /// [`MAX_CONSUMER_CONNECTIONS`]), the rest for producers (at most
    /// [`MAX_PRODUCER_CONNECTIONS`]); at least one each.
    pub fn for_fd_limit(nofile: u64) -> Self {
        let connections = nofile.saturating_sub(RESERVED_FDS) / FDS_PER_CONNECTION;
        let consumers = (connections / 8).clamp(1, MAX_CONSUMER_CONNECTIONS as u64);
        let producers =
            (connections.saturating_sub(consumers)).clamp(1, MAX_PRODUCER_CONNECTIONS as u64);
        Self {
            producers: producers as usize,
            consumers: consumers as usize,
        }
    }

    /// Descriptors the largest limits need: [`MAX_PRODUCER_CONNECTIONS`]
    /// and [`MAX_CONSUMER_CONNECTIONS`] with the reserve.
    pub const FULL_FD_LIMIT: u64 = RESERVED_FDS
        + FDS_PER_CONNECTION * (MAX_PRODUCER_CONNECTIONS + MAX_CONSUMER_CONNECTIONS) as u64;

    /// The limits for this process's `RLIMIT_NOFILE`, having first raised
    /// its soft limit, if lower, towards [`Self::FULL_FD_LIMIT`] as far as
    /// the hard limit allows (the shell polls with epoll, so no `select`
    /// bound applies; a usual soft limit of 1024 would allow only 420
    /// producers).
    pub fn for_this_process() -> Self {
        use rustix::process::{getrlimit, setrlimit, Resource};
        let limit = getrlimit(Resource::Nofile);
        let soft = limit.current.unwrap_or(u64::MAX);
        let hard = limit.maximum.unwrap_or(u64::MAX);
        let wanted = Self::FULL_FD_LIMIT.min(hard);
        if soft >= wanted {
            return Self::for_fd_limit(soft);
        }
        let raised = rustix::process::Rlimit {
            current: Some(wanted),
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => Self::for_fd_limit(wanted),
            Err(e) => {
                log::warn!("cannot raise RLIMIT_NOFILE from {soft} to {wanted}: {e}");
                Self::for_fd_limit(soft)
            }
        }
    }

    fn of(&self, side: Side) -> usize {
        match side {
            Side::Producer => self.producers,
            Side::Consumer => self.consumers,
        }
    }
}

/// Connections of one side: how many are open, and how many were refused
/// since the last one was accepted (for one log line per burst).
#[derive(Debug, Default, Clone, Copy)]
struct SideCount {
    open: usize,
    refused: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Producer,
    Consumer,
}

/// A call on a producer socket: to the producer port, or (relays) to the
/// relay port.
enum ProducerSide {
    Producer(producer_port::Request),
    /// Boxed: `InitRelay` carries a whole `SystemInfo`.
    Relay(Box<relay_port::Request>),
}

enum Host {
    Producer(HostConnection<ProducerSide>),
    Consumer(HostConnection<consumer_port::Request>),
}

impl Host {
    fn out(&mut self) -> &mut crate::ipc::OutQueue {
        match self {
            Host::Producer(h) => h.out(),
            Host::Consumer(h) => h.out(),
        }
    }

    fn decoder(&mut self) -> &mut crate::ipc::FrameDecoder {
        match self {
            Host::Producer(h) => h.decoder(),
            Host::Consumer(h) => h.decoder(),
        }
    }
}

struct Conn {
    socket: Stream,
    host: Host,
    side: Side,
    /// The peer's address without port (TCP), for the machine id of a
    /// relayed peer that gives no hint.
    peer_host: Option<String>,
    /// Its calls are not read: [`THROTTLE_BACKLOG`] bytes are queued.
    throttled: bool,
    /// The epoll interest registered for it.
    interest: epoll::EventFlags,
}

impl Conn {
    /// The epoll interest it needs: readability unless throttled,
    /// writability while something is queued, and always the peer's
    /// shutdown.
    fn wanted_interest(&mut self) -> epoll::EventFlags {
        let mut flags = epoll::EventFlags::RDHUP;
        if !self.throttled {
            flags |= epoll::EventFlags::IN;
        }
        if !self.host.out().is_empty() {
            flags |= epoll::EventFlags::OUT;
        }
        flags
    }
}

/// The bound sockets, ready to run.
pub struct Shell {
    listeners: Vec<(Listener, Side)>,
    epoll: OwnedFd,
    conns: HashMap<ConnId, Conn>,
    producer_table: Arc<ServiceTable<ProducerSide>>,
    consumer_table: Arc<ServiceTable<consumer_port::Request>>,
    limits: ConnectionLimits,
    producers: SideCount,
    consumers: SideCount,
    /// The listeners rest (out of descriptors) until this time.
    accept_paused_until: Option<u64>,
    /// `accept` ran out of descriptors and has not accepted since (one log
    /// line per shortage).
    out_of_fds: bool,
}

impl std::fmt::Debug for Shell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shell")
            .field(
                "listeners",
                &self
                    .listeners
                    .iter()
                    .map(|(l, _)| l.address().to_string())
                    .collect::<Vec<_>>(),
            )
            .field("connections", &self.conns.len())
            .field("limits", &self.limits)
            .finish()
    }
}

fn bind(address: &SocketAddress, mode: u32, group: Option<u32>) -> Result<Listener, ShellError> {
    let err = |source: io::Error| ShellError::Bind {
        address: address.to_string(),
        source,
    };
    let listener = Listener::bind(address).map_err(err)?;
    if !address.passes_fds() {
        log::warn!(
            "listening for producers on {address}: they get shmem emulation; the protocol \
             has no authentication{}",
            if address.is_loopback() {
                ""
            } else {
                ", and other machines can reach this socket"
            }
        );
    }
    if let SocketAddress::Path(path) = address {
        if let Some(gid) = group {
            rustix::fs::chown(path, None, Some(rustix::fs::Gid::from_raw(gid)))
                .map_err(|e| err(e.into()))?;
        }
        rustix::fs::chmod(path, Mode::from_raw_mode(mode)).map_err(|e| err(e.into()))?;
    }
    listener.set_nonblocking(true).map_err(err)?;
    Ok(listener)
}

impl Shell {
    /// Binds the sockets (replacing stale socket files; a live one, where
    /// another service listens, is an error).
    pub fn bind(cfg: &ShellConfig) -> Result<Self, ShellError> {
        if !cfg.consumer_socket.passes_fds() {
            return Err(ShellError::ConsumerNotUnix(cfg.consumer_socket.to_string()));
        }
        if !cfg.listen_any {
            if let Some(a) = cfg.producer_sockets.iter().find(|a| !a.is_loopback()) {
                return Err(ShellError::NotLoopback(a.to_string()));
            }
        }
        let mut listeners = Vec::new();
        for a in &cfg.producer_sockets {
            listeners.push((bind(a, 0o666, None)?, Side::Producer));
        }
        let consumer_mode = if cfg.consumer_group.is_some() {
            0o660
        } else {
            0o600
        };
        listeners.push((
            bind(&cfg.consumer_socket, consumer_mode, cfg.consumer_group)?,
            Side::Consumer,
        ));
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(os("epoll_create"))?;
        for (i, (l, _)) in listeners.iter().enumerate() {
            epoll::add(
                &epoll,
                l,
                epoll::EventData::new_u64(TOKEN_LISTENER + i as u64),
                epoll::EventFlags::IN,
            )
            .map_err(os("epoll_ctl"))?;
        }
        Ok(Self {
            listeners,
            epoll,
            conns: HashMap::new(),
            producer_table: Arc::new(if cfg.relay_endpoint {
                ServiceTable::new()
                    .expose::<ProducerPort>(ProducerSide::Producer)
                    .expose::<RelayPort>(|r| ProducerSide::Relay(Box::new(r)))
            } else {
                ServiceTable::new().expose::<ProducerPort>(ProducerSide::Producer)
            }),
            consumer_table: Arc::new(ServiceTable::from(ConsumerPort)),
            limits: ConnectionLimits::for_this_process(),
            producers: SideCount::default(),
            consumers: SideCount::default(),
            accept_paused_until: None,
            out_of_fds: false,
        })
    }

    /// Replaces the connection limits (by default
    /// [`ConnectionLimits::for_this_process`]).
    pub fn with_connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    fn count(&mut self, side: Side) -> &mut SideCount {
        match side {
            Side::Producer => &mut self.producers,
            Side::Consumer => &mut self.consumers,
        }
    }

    /// Runs `core` until `stop` becomes readable (or forever without one).
    /// Socket files are removed on the way out.
    pub fn run(
        mut self,
        mut core: TracingService,
        stop: Option<BorrowedFd<'_>>,
    ) -> Result<(), ShellError> {
        if let Some(stop) = stop {
            epoll::add(
                &self.epoll,
                stop,
                epoll::EventData::new_u64(TOKEN_STOP),
                epoll::EventFlags::IN,
            )
            .map_err(os("epoll_ctl"))?;
        }
        let clock = SystemEnvironment;
        let mut events = Vec::with_capacity(256);
        let result = loop {
            let deadline = match (core.poll_timeout(), self.accept_paused_until) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let timeout = deadline.map(|deadline| {
                let ns = deadline.saturating_sub(clock.now());
                rustix::time::Timespec {
                    tv_sec: (ns / 1_000_000_000) as i64,
                    tv_nsec: (ns % 1_000_000_000) as i64,
                }
            });
            events.clear();
            match epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                timeout.as_ref(),
            ) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    break Err(ShellError::Os {
                        what: "epoll_wait",
                        source: e.into(),
                    })
                }
            }
            let turn = Turn::start(&clock);
            let mut stopping = false;
            for ev in &events {
                let token = ev.data.u64();
                if token == TOKEN_STOP {
                    stopping = true;
                } else if token >= TOKEN_CONN {
                    self.on_conn_event(&mut core, ConnId(token - TOKEN_CONN), ev.flags);
                } else {
                    self.accept(&mut core, (token - TOKEN_LISTENER) as usize);
                }
            }
            if stopping {
                log::info!("stopping");
                break Ok(());
            }
            if self
                .accept_paused_until
                .is_some_and(|until| clock.now() >= until)
            {
                self.resume_accepting();
            }
            core.on_timeout();
            self.flush_outputs(&mut core);
            turn.finish(&clock, events.len());
        };
        for (l, _) in &self.listeners {
            if let Err(e) = l.remove_socket_file() {
                log::warn!("cannot remove the socket file {}: {e}", l.address());
            }
        }
        result
    }

    fn accept(&mut self, core: &mut TracingService, index: usize) {
        let Some(&(_, side)) = self.listeners.get(index) else {
            return;
        };
        // Level-triggered: what is left waits for the next turn, after the
        // connections that are ready (a flood of connections that are
        // closed at once must not hold the loop).
        for _ in 0..ACCEPTS_PER_EVENT {
            let Some((listener, _)) = self.listeners.get(index) else {
                return;
            };
            let socket = match listener.accept_stream() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    self.pause_accepting(&e);
                    return;
                }
                Err(e) => {
                    log::warn!("accept on {} failed: {e}", listener.address());
                    return;
                }
            };
            if std::mem::take(&mut self.out_of_fds) {
                log::info!("accepting connections again");
            }
            let limit = self.limits.of(side);
            let count = self.count(side);
            if count.open >= limit {
                // Accepted only to be closed: the peer reads end of file
                // rather than waiting in the listen queue.
                count.refused += 1;
                if count.refused == 1 {
                    log::warn!(
                        "refusing {side:?} connections: {limit} are open, the most this \
                         service keeps (RLIMIT_NOFILE {}); closing new ones until one closes",
                        rustix::process::getrlimit(rustix::process::Resource::Nofile)
                            .current
                            .map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
                    );
                }
                continue;
            }
            if count.refused > 0 {
                log::info!(
                    "accepting {side:?} connections again ({} refused)",
                    count.refused
                );
                count.refused = 0;
            }
            let creds = match socket.peer_credentials() {
                Some(Ok(c)) => c,
                Some(Err(e)) => {
                    log::warn!("SO_PEERCRED failed, dropping the connection: {e}");
                    continue;
                }
                None => REMOTE_PEER,
            };
            let emulated = !socket.passes_fds();
            if let Err(e) = socket.set_nonblocking(true) {
                log::warn!("cannot make a connection non-blocking: {e}");
                continue;
            }
            let (conn, host) = match side {
                Side::Producer if emulated => (
                    core.connect_emulated_producer(creds),
                    Host::Producer(HostConnection::remote(self.producer_table.clone())),
                ),
                Side::Producer => (
                    core.connect_producer(creds),
                    Host::Producer(HostConnection::new(
                        self.producer_table.clone(),
                        Some(creds),
                    )),
                ),
                Side::Consumer => (
                    core.connect_consumer(creds),
                    Host::Consumer(HostConnection::new(
                        self.consumer_table.clone(),
                        Some(creds),
                    )),
                ),
            };
            let token = epoll::EventData::new_u64(TOKEN_CONN + conn.0);
            let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
            if let Err(e) = epoll::add(&self.epoll, &socket, token, flags) {
                log::warn!("epoll_ctl failed for a new connection: {e}");
                core.disconnect(conn);
                continue;
            }
            log::debug!(
                "connection {} ({:?}) from pid {} uid {}",
                conn.0,
                socket.family(),
                creds.pid,
                creds.uid
            );
            let peer_host = socket.peer_host();
            self.count(side).open += 1;
            self.conns.insert(
                conn,
                Conn {
                    socket,
                    host,
                    side,
                    throttled: false,
                    interest: flags,
                    peer_host,
                },
            );
        }
    }

    /// `accept` ran out of descriptors: the listeners rest for
    /// [`ACCEPT_PAUSE_NS`] (or until a connection closes) rather than wake
    /// the loop again at once for a connection that cannot be accepted.
    fn pause_accepting(&mut self, e: &io::Error) {
        if self.accept_paused_until.is_some() {
            return;
        }
        if !self.out_of_fds {
            self.out_of_fds = true;
            log::warn!(
                "cannot accept connections: {e}; retrying every {} ms and when a \
                 connection closes",
                ACCEPT_PAUSE_NS / 1_000_000
            );
        }
        self.set_listener_interest(epoll::EventFlags::empty());
        self.accept_paused_until = Some(SystemEnvironment.now() + ACCEPT_PAUSE_NS);
    }

    fn resume_accepting(&mut self) {
        if self.accept_paused_until.take().is_none() {
            return;
        }
        self.set_listener_interest(epoll::EventFlags::IN);
    }

    /// Registers `flags` as every listener's epoll interest.
    fn set_listener_interest(&self, flags: epoll::EventFlags) {
        for (i, (l, _)) in self.listeners.iter().enumerate() {
            let token = epoll::EventData::new_u64(TOKEN_LISTENER + i as u64);
            if let Err(e) = epoll::modify(&self.epoll, l, token, flags) {
                log::error!("cannot set the epoll interest of {}: {e}", l.address());
            }
        }
    }

    fn on_conn_event(&mut self, core: &mut TracingService, conn: ConnId, flags: epoll::EventFlags) {
        let hangup = epoll::EventFlags::HUP | epoll::EventFlags::RDHUP | epoll::EventFlags::ERR;
        if flags.intersects(epoll::EventFlags::IN | hangup) {
            self.receive(core, conn, flags.intersects(hangup));
        }
        if flags.contains(epoll::EventFlags::OUT) {
            self.send(core, conn);
        }
    }

    /// Dispatches the calls already received, then receives once (one
    /// receive window) and dispatches what arrived. Once the peer has shut
    /// down its end (`hangup`), everything it sent is read and handled now,
    /// throttled or not: it can send no more, and nobody reads the replies.
    fn receive(&mut self, core: &mut TracingService, conn: ConnId, hangup: bool) {
        if !self.dispatch(core, conn, hangup) {
            return;
        }
        loop {
            let Some(c) = self.conns.get_mut(&conn) else {
                return;
            };
            if c.throttled && !hangup {
                return;
            }
            let received = socket::recv_into(&c.socket, c.host.decoder());
            let closed = match received {
                Ok(Received::Data(_)) => false,
                Ok(Received::WouldBlock) => return,
                Ok(Received::Closed) => true,
                Err(e) => {
                    log::info!("connection {}: {e}", conn.0);
                    true
                }
            };
            // Dispatch whatever complete frames arrived (also before a close).
            if !self.dispatch(core, conn, hangup) {
                return;
            }
            if closed {
                self.close(core, conn);
                return;
            }
            if !hangup {
                // Level-triggered: the rest of what it sent is read on the
                // next turn, after the other ready connections.
                return;
            }
        }
    }

    /// Dispatches the complete calls received, until none is left or the
    /// connection's replies reach [`THROTTLE_BACKLOG`] (then it stops
    /// reading it; `ignore_backlog`: the peer is gone, dispatch them all
    /// and drop their replies).
    /// Whether the connection is still open.
    fn dispatch(&mut self, core: &mut TracingService, conn: ConnId, ignore_backlog: bool) -> bool {
        loop {
            let Some(c) = self.conns.get_mut(&conn) else {
                return false;
            };
            let backlog = c.host.out().len();
            if backlog >= THROTTLE_BACKLOG && !ignore_backlog {
                if !c.throttled {
                    c.throttled = true;
                    log::debug!(
                        "connection {}: {backlog} bytes of replies queued, not reading its calls \
                         until it reads them",
                        conn.0
                    );
                    self.update_interest(conn);
                }
                return true;
            }
            let dispatched = match &mut c.host {
                Host::Producer(h) => h.poll_call().map(|call| {
                    if let Some(identity) = h.take_peer_identity() {
                        let peer_host = c.peer_host.as_deref().unwrap_or("");
                        core.set_peer_identity(
                            conn,
                            RemoteIdentity {
                                pid: identity.pid,
                                uid: identity.uid as u32,
                                machine_id: machine_id(&identity.machine_id_hint, peer_host),
                                machine_name: identity.machine_name,
                            },
                        );
                    }
                    call.map(|call| dispatch_producer_side(core, conn, call))
                }),
                Host::Consumer(h) => h
                    .poll_call()
                    .map(|call| call.map(|call| core.on_consumer_call(conn, call))),
            };
            match dispatched {
                Ok(Some(())) => {
                    self.route_outputs(core);
                    if ignore_backlog {
                        // The peer is gone and the connection closes once
                        // its calls are handled: its replies would never be
                        // sent, and must not pile up meanwhile.
                        if let Some(c) = self.conns.get_mut(&conn) {
                            *c.host.out() = crate::ipc::OutQueue::new();
                        }
                    }
                }
                Ok(None) => return true,
                Err(e) => {
                    log::info!("connection {}: {e}; closing it", conn.0);
                    self.close(core, conn);
                    return false;
                }
            }
        }
    }

    /// Registers the epoll interest the connection needs now.
    fn update_interest(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let wanted = c.wanted_interest();
        if wanted == c.interest {
            return;
        }
        let token = epoll::EventData::new_u64(TOKEN_CONN + conn.0);
        match epoll::modify(&self.epoll, &c.socket, token, wanted) {
            Ok(()) => c.interest = wanted,
            Err(e) => log::error!("connection {}: epoll_ctl failed: {e}", conn.0),
        }
    }

    fn close(&mut self, core: &mut TracingService, conn: ConnId) {
        if let Some(c) = self.conns.remove(&conn) {
            let _ = epoll::delete(&self.epoll, &c.socket);
            let count = self.count(c.side);
            count.open = count.open.saturating_sub(1);
            log::debug!("connection {} closed", conn.0);
            // A descriptor was freed: try accepting again.
            self.resume_accepting();
        }
        core.disconnect(conn);
    }

    /// Moves the core's outputs into the connections' send queues.
    fn route_outputs(&mut self, core: &mut TracingService) {
        while let Some(o) = core.poll_output() {
            self.route(core, o);
        }
    }

    fn route(&mut self, core: &mut TracingService, o: Output) {
        match o {
            Output::Reply {
                conn,
                to,
                body,
                has_more,
                fd,
            } => {
                let Some(c) = self.conns.get_mut(&conn) else {
                    return;
                };
                let body = match body {
                    ReplyBody::Ok(b) => Ok(b),
                    ReplyBody::Err => Err(()),
                };
                let frame = invoke_method_reply_frame(to.request_id(), body, has_more);
                // The core sends descriptors only to producers on UNIX
                // sockets; a descriptor for another stream is dropped here
                // rather than failing the send.
                let fd = fd.filter(|_| c.socket.passes_fds());
                if let Err(e) = c.host.out().push_frame(&frame, fd) {
                    log::error!("connection {}: dropping a reply: {e}", conn.0);
                }
            }
            Output::Disconnect { conn, reason } => {
                log::info!("disconnecting connection {}: {reason}", conn.0);
                self.close(core, conn);
            }
        }
    }

    /// Routes the core's outputs, refills `ReadBuffers` streams while their
    /// connections have room, and sends, until nothing more can move now.
    fn flush_outputs(&mut self, core: &mut TracingService) {
        loop {
            self.route_outputs(core);
            let mut produced = false;
            for conn in core.pending_reads() {
                loop {
                    let room = self
                        .conns
                        .get_mut(&conn)
                        .is_some_and(|c| c.host.out().len() < READ_WINDOW);
                    if !room {
                        break;
                    }
                    match core.poll_read_reply(conn) {
                        Some(o) => {
                            self.route(core, o);
                            produced = true;
                        }
                        None => break,
                    }
                }
            }
            let pending: Vec<ConnId> = self
                .conns
                .iter_mut()
                .filter_map(|(&id, c)| (!c.host.out().is_empty()).then_some(id))
                .collect();
            for conn in pending {
                produced |= self.send(core, conn);
            }
            if !produced {
                return;
            }
        }
    }

    /// Sends what is queued; asks for writability if the socket is full.
    /// A connection whose backlog fell below [`THROTTLE_BACKLOG`] is read
    /// again, starting with the calls already received: whether any was
    /// dispatched (its replies are queued, to send).
    fn send(&mut self, core: &mut TracingService, conn: ConnId) -> bool {
        let Some(c) = self.conns.get_mut(&conn) else {
            return false;
        };
        if let Err(e) = socket::send_queued(&c.socket, c.host.out()) {
            log::info!("connection {}: send failed: {e}", conn.0);
            self.close(core, conn);
            return false;
        }
        let backlog = c.host.out().len();
        if c.side == Side::Producer && backlog > MAX_PRODUCER_BACKLOG {
            log::warn!(
                "connection {}: producer is not reading its socket ({backlog} bytes queued)",
                conn.0
            );
            self.close(core, conn);
            return false;
        }
        let mut dispatched = false;
        if c.throttled && backlog < THROTTLE_BACKLOG {
            c.throttled = false;
            let buffered = c.host.decoder().buffered();
            if buffered > 0 {
                self.dispatch(core, conn, false);
                dispatched = true;
            }
        }
        self.update_interest(conn);
        dispatched
    }
}

fn dispatch_producer_side(core: &mut TracingService, conn: ConnId, call: Call<ProducerSide>) {
    match call.replace(()) {
        (ProducerSide::Producer(request), call) => {
            core.on_producer_call(conn, call.replace(request).1)
        }
        (ProducerSide::Relay(request), call) => core.on_relay_call(conn, call.replace(*request).1),
    }
}

/// This machine's name, as upstream names it: `$PERFETTO_MACHINE_NAME`,
/// else the kernel's name (`uname -s`).
pub fn machine_name() -> String {
    std::env::var("PERFETTO_MACHINE_NAME").unwrap_or_else(|_| {
        rustix::system::uname()
            .sysname()
            .to_string_lossy()
            .into_owned()
    })
}

/// The [`ServiceConfig`] of this process: its uid, what `system_info` says
/// about the machine, and trace buffers of at most half its RAM in all.
pub fn system_service_config() -> ServiceConfig {
    let mut cfg = ServiceConfig::new(rustix::process::getuid().as_raw());
    let uts = rustix::system::uname();
    let text = |s: &std::ffi::CStr| Some(s.to_string_lossy().into_owned());
    let info = rustix::system::sysinfo();
    let ram = info.totalram as u64 * u64::from(info.mem_unit);
    cfg.system_info = SystemInfo {
        utsname: Some(Utsname {
            sysname: text(uts.sysname()),
            version: text(uts.version()),
            release: text(uts.release()),
            machine: text(uts.machine()),
        }),
        tracing_service_version: Some(cfg.version.clone()),
        page_size: Some(rustix::param::page_size() as u32),
        num_cpus: std::thread::available_parallelism()
            .ok()
            .map(|n| n.get() as u32),
        system_ram_bytes: Some(ram),
        ..SystemInfo::default()
    };
    cfg.max_buffer_bytes = ram / 2;
    cfg.machine_name = machine_name();
    cfg
}

/// The addresses from the `PERFETTO_*_SOCK_NAME` variables, else upstream's
/// defaults.
pub fn default_addresses() -> Result<(Vec<SocketAddress>, SocketAddress), socket::AddressError> {
    let producers = socket::producer_socket_names_for_service()
        .iter()
        .map(|n| SocketAddress::parse(n))
        .collect::<Result<_, _>>()?;
    Ok((
        producers,
        SocketAddress::parse(&socket::consumer_socket_name())?,
    ))
}

/// Starts a shell for `core` and returns once it stops: convenience for
/// embedding and tests.
pub fn serve(cfg: &ShellConfig, stop: Option<BorrowedFd<'_>>) -> Result<(), ShellError> {
    let shell = Shell::bind(cfg)?;
    let core = TracingService::new(system_service_config(), Box::new(SystemEnvironment));
    shell.run(core, stop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::frame::{bind_service_frame, encode_frame, invoke_method_frame};
    use crate::ipc::MAX_FRAME_LEN;
    use std::io::Write;

    #[test]
    fn connection_limits_follow_the_descriptor_limit() {
        // 1024 (a common soft limit): 480 connections, 60 of them consumers.
        assert_eq!(
            ConnectionLimits::for_fd_limit(1024),
            ConnectionLimits {
                producers: 420,
                consumers: 60
            }
        );
        assert_eq!(
            ConnectionLimits::for_fd_limit(1 << 20),
            ConnectionLimits {
                producers: MAX_PRODUCER_CONNECTIONS,
                consumers: MAX_CONSUMER_CONNECTIONS
            }
        );
        assert_eq!(
            ConnectionLimits::for_fd_limit(10),
            ConnectionLimits {
                producers: 1,
                consumers: 1
            }
        );
    }

    #[test]
    fn the_service_raises_a_low_soft_descriptor_limit() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        // The limit is the process's: lowering it here would cap the
        // descriptors of every test running alongside. Run in a child.
        const CHILD: &str = "SHMTRACE_RLIMIT_TEST_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let (_crate, module) = module_path!().split_once("::").unwrap();
            let name = format!("{module}::the_service_raises_a_low_soft_descriptor_limit");
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &name, "--test-threads", "1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        let before = getrlimit(Resource::Nofile);
        let hard = before.maximum.unwrap_or(u64::MAX);
        let low = Rlimit {
            current: Some(hard.min(1024)),
            maximum: before.maximum,
        };
        setrlimit(Resource::Nofile, low).unwrap();
        let limits = ConnectionLimits::for_this_process();
        let raised = getrlimit(Resource::Nofile).current;
        // As far as the hard limit allows.
        let expected = ConnectionLimits::FULL_FD_LIMIT.min(hard);
        assert_eq!(raised, Some(expected));
        assert_eq!(limits, ConnectionLimits::for_fd_limit(expected));
        if hard >= ConnectionLimits::FULL_FD_LIMIT {
            assert_eq!(
                limits,
                ConnectionLimits {
                    producers: MAX_PRODUCER_CONNECTIONS,
                    consumers: MAX_CONSUMER_CONNECTIONS
                }
            );
        }
    }

    #[test]
    fn a_flooding_connection_is_read_a_window_at_a_time_and_not_answered_once_gone() {
        let id = format!("shmtrace-shell-unit-{}", std::process::id());
        let cfg = ShellConfig {
            producer_sockets: vec![SocketAddress::parse(&format!("@{id}-p")).unwrap()],
            consumer_socket: SocketAddress::parse(&format!("@{id}-c")).unwrap(),
            consumer_group: None,
            listen_any: false,
            relay_endpoint: false,
        };
        let mut shell = Shell::bind(&cfg).unwrap();
        let mut core = TracingService::new(
            crate::service::core::ServiceConfig::new(0),
            Box::new(SystemEnvironment),
        );
        let SocketAddress::Abstract(name) = &cfg.consumer_socket else {
            unreachable!()
        };
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
        let mut client = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        // Fill the socket with QueryCapabilities calls (method 13).
        let mut calls = Vec::new();
        encode_frame(&bind_service_frame(1, "ConsumerPort"), &mut calls).unwrap();
        let mut call = Vec::new();
        encode_frame(
            &invoke_method_frame(2, 1, 13, bytes::Bytes::new(), false),
            &mut call,
        )
        .unwrap();
        calls.extend(call.repeat(50_000));
        client.set_nonblocking(true).unwrap();
        let mut sent = 0;
        while let Ok(n) = client.write(&calls[sent..]) {
            sent += n;
        }
        assert!(sent > MAX_FRAME_LEN, "only {sent} bytes fit the socket");
        let consumer_listener = shell.listeners.len() - 1;
        shell.accept(&mut core, consumer_listener);
        let conn = *shell.conns.keys().next().expect("accepted");
        shell.receive(&mut core, conn, false);
        // One receive window at most: the rest waits for the next event
        // (it used to be read until the socket was empty).
        let c = shell.conns.get_mut(&conn).expect("open");
        let replies = c.host.out().len();
        assert!(replies > 0, "the calls of the window were answered");
        let mut peek = [0u8; 1];
        let left = rustix::net::recv(&c.socket, &mut peek, rustix::net::RecvFlags::PEEK);
        assert_eq!(
            left.map(|(n, _)| n),
            Ok(1),
            "the rest is still in the socket"
        );
        // Once the peer has hung up, its calls are still handled, but
        // their replies, which would never be sent, are dropped: nothing
        // holds them back any more (the throttle is off).
        socket::recv_into(&c.socket, c.host.decoder()).expect("the next window");
        assert!(shell.dispatch(&mut core, conn, true), "still open");
        let c = shell.conns.get_mut(&conn).expect("open");
        assert_eq!(c.host.out().len(), 0, "replies queued for a peer gone");
    }
}
