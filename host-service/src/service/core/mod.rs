//! The service core, sans-IO: the tracing service's whole behaviour, with
//! no sockets, no threads and no clock of its own.
//!
//! Like `quinn-proto`, it is driven from outside:
//!
//! * connections come and go ([`TracingService::connect_producer`],
//!   [`TracingService::connect_consumer`], [`TracingService::disconnect`]);
//! * decoded calls arrive ([`TracingService::on_producer_call`],
//!   [`TracingService::on_consumer_call`]);
//! * time passes: [`TracingService::poll_timeout`] says when the next timer
//!   is due and [`TracingService::on_timeout`] fires what is due, reading the
//!   time from the [`Environment`];
//! * what must be sent comes out of [`TracingService::poll_output`]
//!   (replies, stream items with file descriptors, connections to close),
//!   and ReadBuffers streams are pulled reply by reply with
//!   [`TracingService::poll_read_reply`], so a consumer that reads slowly
//!   holds back only its own stream.
//!
//! The I/O shell ([`super::shell`]) and the simulation tests drive it the
//! same way. The core makes no system call: clocks, randomness, the
//! producers' shared memory buffers (memfds created or adopted, mapped) and
//! the files of `write_into_file` sessions all come from its
//! [`Environment`]; descriptors pass through it as opaque [`OwnedFd`]
//! handles. `host-service/tests/sans_io_core.rs` checks that no file of
//! this module names an OS crate or call (`std::fs`, `rustix`, `libc`,
//! `std::os` other than `OwnedFd`, ...).
//!
//! # Trust
//!
//! Producers and consumers are untrusted. Identities (uid, pid) come from
//! the connection's peer credentials; producer ids, buffer ids and packet
//! sequence ids are assigned here. Malformed or hostile input costs the peer
//! its request or, where upstream would abort (a `PERFETTO_CHECK` on what a
//! producer wrote into its SMB), its connection
//! ([`Output::Disconnect`]) — never the service or another peer's data.

mod clone;
mod commit;
mod compress;
mod consumer;
mod error;
pub(crate) mod filter;
mod packets;
mod producer;
mod readback;
mod reconfigure;
mod relay;
mod session;
mod timers;
mod triggers;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::OwnedFd;

use bytes::Bytes;

use crate::ipc::{PeerCredentials, PendingReply};
use crate::protos::{self, SystemInfo};

use super::buffer::TraceBuffer;
use super::env::{Environment, Nanos};

use consumer::ConsumerConn;
use producer::Producer;
use session::Session;
use timers::Timers;

pub use clone::BUGREPORT_SESSION_ID;
pub use commit::MAX_EMULATED_CHUNK;
pub use error::{CloneError, CommitError, ConfigError, PeerFault};
pub use readback::READ_REPLY_LIMIT;
pub use relay::{RemoteIdentity, MAX_CLOCKS_PER_SYNC, MAX_SYNCED_CLOCKS};

/// A connection, as the core knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// The identity of a peer on a TCP or vsock connection, which has no
/// kernel-checked credentials: uid 0 and an unknown pid (0), as upstream
/// reports such peers (`HostImpl::ClientConnection::GetPosixPeerUid`,
/// src/ipc/host_impl.cc).
pub const REMOTE_PEER: PeerCredentials = PeerCredentials {
    pid: 0,
    uid: 0,
    gid: 0,
};

/// Producer id (assigned per producer connection, 1..=65535).
pub type ProducerId = u16;
/// Global trace buffer id (1..=65535).
pub type BufferId = u16;
/// Tracing session id.
pub type SessionId = u64;

/// Settings of the service.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The service's own uid: lockdown mode admits only producers of this
    /// uid, and service packets carry it as `trusted_uid`.
    pub uid: u32,
    /// What the `system_info` packet says about this machine.
    pub system_info: SystemInfo,
    /// This machine's name, which data sources' `machine_name_filter`
    /// matches for producers of this machine (upstream:
    /// `$PERFETTO_MACHINE_NAME`, else the kernel's name, `uname -s`).
    pub machine_name: String,
    /// Version string (`tracing_service_version`).
    pub version: String,
    /// The most bytes the trace buffers of all sessions may take together:
    /// a session that would go over it is refused, saying so.
    pub max_buffer_bytes: u64,
}

/// [`ServiceConfig::max_buffer_bytes`] of [`ServiceConfig::new`]: 4 GiB.
pub const DEFAULT_MAX_BUFFER_BYTES: u64 = 4 << 30;

impl ServiceConfig {
    /// A config for tests and embedding: uid 0, minimal system info.
    pub fn new(uid: u32) -> Self {
        let version = version_string();
        Self {
            uid,
            system_info: SystemInfo {
                tracing_service_version: Some(version.clone()),
                ..SystemInfo::default()
            },
            version,
            machine_name: String::new(),
            max_buffer_bytes: DEFAULT_MAX_BUFFER_BYTES,
        }
    }
}

/// The version of Perfetto whose service this one implements (its ABI,
/// protocols and behaviour).
const PERFETTO_VERSION: &str = "v59.0";

/// `tracing_service_version`: `Perfetto v59.0 (shmtrace <version>)`. The
/// form is upstream's (`Perfetto <version> (<revision>)`): readers parse
/// the major version after `Perfetto v` to learn what the service does.
/// Perfetto's trace processor, for one, flags `write_into_file` traces
/// without `flush_period_ms` (`config_write_into_file_no_flush`) unless the
/// service is v54 or newer, which flush before their periodic writes, as
/// this one does.
fn version_string() -> String {
    format!(
        "Perfetto {PERFETTO_VERSION} (shmtrace {})",
        env!("CARGO_PKG_VERSION")
    )
}

/// The body of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyBody {
    /// Success, with the serialized response message.
    Ok(Bytes),
    /// Failure (`success = false`; also ends a stream).
    Err,
}

/// Something the shell must do.
#[derive(Debug)]
pub enum Output {
    /// Send a reply to a call (an item of a stream if `has_more`).
    Reply {
        /// Connection.
        conn: ConnId,
        /// The call answered.
        to: PendingReply,
        /// What to send.
        body: ReplyBody,
        /// More replies follow (streams).
        has_more: bool,
        /// A descriptor to attach (the SMB on `SetupTracing`).
        fd: Option<OwnedFd>,
    },
    /// Close a connection whose peer broke the protocol.
    Disconnect {
        /// Connection.
        conn: ConnId,
        /// Why, for the log.
        reason: PeerFault,
    },
}

/// Service-wide counters (the service-level fields of `TraceStats`).
#[derive(Debug, Default, Clone, Copy)]
struct ServiceStats {
    producers_seen: u64,
    data_sources_seen: u64,
    chunks_discarded: u64,
    patches_discarded: u64,
}

/// The machine a producer runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Machine {
    /// 0 for this machine; a relayed machine's id otherwise.
    pub id: u32,
    /// Its name (`machine_name_filter`).
    pub name: String,
}

enum Endpoint {
    Producer {
        creds: PeerCredentials,
        id: Option<ProducerId>,
        /// Its transport cannot pass descriptors: shmem emulation.
        emulated: bool,
        /// Its machine: this one, unless a relay said otherwise
        /// ([`TracingService::set_peer_identity`]).
        machine: Machine,
    },
    Consumer(ConsumerConn),
}

/// The tracing service. See the module docs.
pub struct TracingService {
    cfg: ServiceConfig,
    env: Box<dyn Environment>,
    conns: HashMap<ConnId, Endpoint>,
    next_conn: u64,
    producers: BTreeMap<ProducerId, Producer>,
    last_producer_id: ProducerId,
    sessions: BTreeMap<SessionId, Session>,
    last_session_id: SessionId,
    buffers: HashMap<BufferId, (SessionId, TraceBuffer)>,
    last_buffer_id: BufferId,
    last_instance_id: u64,
    last_flush_id: u64,
    last_clone_id: u64,
    lockdown: bool,
    timers: Timers,
    out: VecDeque<Output>,
    stats: ServiceStats,
    /// Scratch space for one chunk copied out of an SMB.
    chunk_copy: Vec<u8>,
    /// Matched triggers of the last 24 hours (`max_per_24_h`).
    trigger_history: triggers::TriggerHistory,
    /// Relays (connections that called `RelayPort`), by connection.
    relays: BTreeMap<ConnId, relay::RelayClient>,
}

impl std::fmt::Debug for TracingService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracingService")
            .field("connections", &self.conns.len())
            .field("producers", &self.producers.len())
            .field("sessions", &self.sessions.len())
            .field("buffers", &self.buffers.len())
            .finish_non_exhaustive()
    }
}

impl TracingService {
    /// A service with no connections.
    pub fn new(cfg: ServiceConfig, env: Box<dyn Environment>) -> Self {
        Self {
            cfg,
            env,
            conns: HashMap::new(),
            next_conn: 1,
            producers: BTreeMap::new(),
            last_producer_id: 0,
            sessions: BTreeMap::new(),
            last_session_id: 0,
            buffers: HashMap::new(),
            last_buffer_id: 0,
            last_instance_id: 0,
            last_flush_id: 0,
            last_clone_id: 0,
            lockdown: false,
            timers: Timers::default(),
            out: VecDeque::new(),
            stats: ServiceStats::default(),
            chunk_copy: vec![0; shmtrace_abi::layout::MAX_PAGE_SIZE],
            trigger_history: triggers::TriggerHistory::default(),
            relays: BTreeMap::new(),
        }
    }

    /// A producer connected (to a UNIX producer socket).
    pub fn connect_producer(&mut self, creds: PeerCredentials) -> ConnId {
        self.insert_producer(creds, false)
    }

    /// A producer connected over a transport that cannot pass file
    /// descriptors (TCP, vsock): it gets shmem emulation. The service
    /// creates no SMB for it; it keeps its own buffer, sends chunk bytes
    /// inline in `CommitDataRequest.ChunksToMove.data` and scrapes itself
    /// on flush. `creds` are what the shell knows of it: such peers have
    /// no kernel-checked identity ([`REMOTE_PEER`] is upstream's choice).
    /// Lockdown mode refuses them.
    pub fn connect_emulated_producer(&mut self, creds: PeerCredentials) -> ConnId {
        self.insert_producer(creds, true)
    }

    fn insert_producer(&mut self, creds: PeerCredentials, emulated: bool) -> ConnId {
        let conn = self.new_conn();
        let machine = Machine {
            id: 0,
            name: self.cfg.machine_name.clone(),
        };
        self.conns.insert(
            conn,
            Endpoint::Producer {
                creds,
                id: None,
                emulated,
                machine,
            },
        );
        conn
    }

    /// A consumer connected (to the consumer socket).
    pub fn connect_consumer(&mut self, creds: PeerCredentials) -> ConnId {
        let conn = self.new_conn();
        self.conns
            .insert(conn, Endpoint::Consumer(ConsumerConn::new(creds)));
        conn
    }

    fn new_conn(&mut self) -> ConnId {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        conn
    }

    /// A connection closed (or was closed by the shell after
    /// [`Output::Disconnect`]). Pending outputs for it are dropped.
    pub fn disconnect(&mut self, conn: ConnId) {
        self.relays.remove(&conn);
        match self.conns.remove(&conn) {
            Some(Endpoint::Producer { id: Some(id), .. }) => self.producer_gone(id),
            Some(Endpoint::Consumer(c)) => {
                self.drop_clones_of(conn);
                self.consumer_gone(conn, c);
            }
            _ => {}
        }
        self.out.retain(|o| match o {
            Output::Reply { conn: c, .. } | Output::Disconnect { conn: c, .. } => *c != conn,
        });
    }

    /// The next thing to send.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When [`on_timeout`](Self::on_timeout) must next be called (on the
    /// [`Environment`]'s boot clock; a deadline already past means now), or
    /// `None` while no timer is armed.
    ///
    /// Every call that takes `&mut self` may arm, move or disarm timers: a
    /// call from a peer starts a session or a flush, a disconnect ends
    /// them, `on_timeout` re-arms periodic timers, and so on. So, as with
    /// quinn-proto's `poll_timeout`, ask again after every such call and
    /// before waiting; a deadline read earlier may be stale (too late, or a
    /// timer that no longer exists, which `on_timeout` then ignores). The
    /// shell asks once per turn of its loop, after it has handled every
    /// event and drained [`poll_output`](Self::poll_output).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.timers.next_deadline()
    }

    /// Fires every timer that is due.
    pub fn on_timeout(&mut self) {
        let now = self.env.now();
        while let Some(timer) = self.timers.pop_due(now) {
            self.fire(timer);
        }
    }

    /// Now, from the environment.
    fn now(&self) -> Nanos {
        self.env.now()
    }

    fn reply<M: protos::schema::ProtoSchema>(
        &mut self,
        conn: ConnId,
        to: &PendingReply,
        msg: &M,
        has_more: bool,
    ) {
        self.reply_with_fd(conn, to, msg, has_more, None);
    }

    fn reply_with_fd<M: protos::schema::ProtoSchema>(
        &mut self,
        conn: ConnId,
        to: &PendingReply,
        msg: &M,
        has_more: bool,
        fd: Option<OwnedFd>,
    ) {
        if to.drop_reply() {
            return;
        }
        let body = ReplyBody::Ok(protos::to_raw(msg));
        self.out.push_back(Output::Reply {
            conn,
            to: to.clone(),
            body,
            has_more,
            fd,
        });
    }

    fn reject(&mut self, conn: ConnId, to: &PendingReply) {
        if to.drop_reply() {
            return;
        }
        self.out.push_back(Output::Reply {
            conn,
            to: to.clone(),
            body: ReplyBody::Err,
            has_more: false,
            fd: None,
        });
    }

    fn disconnect_peer(&mut self, conn: ConnId, reason: PeerFault) {
        log::warn!("closing connection {}: {reason}", conn.0);
        self.out.push_back(Output::Disconnect { conn, reason });
    }
}
