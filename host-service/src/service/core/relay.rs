//! Relayed machines: the central side of upstream's relay protocol.
//!
//! A relay (upstream's `traced_relay`, `shmtrace relay`) runs on another
//! machine, listens there as the producer socket, and forwards each of its
//! producers over a connection of its own to a producer socket of this
//! service (TCP or vsock), after announcing the producer's identity and
//! machine with `SetPeerIdentity`: [`TracingService::set_peer_identity`]
//! records it, and the producer's packets then carry its `machine_id`.
//! The relay also opens one connection of its own on which it calls the
//! `RelayPort` service ([`TracingService::on_relay_call`]):
//!
//! * `InitRelay` gives the machine's `SystemInfo`, written into traces as a
//!   `system_info` packet with that machine id;
//! * `SyncClock` gives the relay's clock readings; the service reads its own
//!   on receipt and keeps the last [`MAX_SYNCED_CLOCKS`] pairs, written into
//!   traces as a `remote_clock_sync` packet with that machine id, from which
//!   a trace processor computes the machine's clock offsets and maps its
//!   timestamps onto this machine's clocks.
//!
//! Upstream: src/tracing/ipc/service/relay_ipc_service.cc,
//! `RelayEndpointImpl` in src/tracing/service/tracing_service_endpoints_impl.cc,
//! `MaybeEmitRemoteSystemInfo` and `MaybeEmitRemoteClockSync` in
//! src/tracing/service/tracing_service_impl.cc. Where this differs: each
//! machine's packets are written once per session at the first read after
//! the service has them (upstream: at the first read only, so a machine
//! whose relay connects later is never described), and relay calls on a
//! connection without an identity, which would describe this machine as
//! a remote one, are refused.
//!
//! Trust: a relay says what it likes about its machine and its producers
//! (there is no authentication; see the shell's docs). What it sends is
//! bounded: at most [`MAX_CLOCKS_PER_SYNC`] clocks per `SyncClock`, a
//! relay that sends more loses its connection.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::{ConnId, Endpoint, Machine, PeerFault, TracingService};
use crate::ipc::Call;
use crate::protos::relay_port::Request;
use crate::protos::{InitRelayResponse, SyncClockResponse, SystemInfo};

/// `SyncClock` exchanges kept per relay (upstream keeps 5: two rounds of a
/// PING and an UPDATE, and the newest PING).
pub const MAX_SYNCED_CLOCKS: usize = 5;

/// Most clocks one `SyncClock` may carry (upstream's relay sends 6 or 7:
/// the builtin clocks, and the TSC on x86-64).
pub const MAX_CLOCKS_PER_SYNC: usize = 16;

/// A relayed peer's identity, as its relay announced it and the shell
/// turned it into a machine id ([`crate::ipc::host::machine_id`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteIdentity {
    /// Its pid on its machine.
    pub pid: i32,
    /// Its uid on its machine.
    pub uid: u32,
    /// Its machine's id (never 0).
    pub machine_id: u32,
    /// Its machine's name.
    pub machine_name: String,
}

/// One clock exchange: the relay's readings and the service's, taken when
/// the relay's arrived. `(clock id, timestamp)` each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncedClocks {
    /// The relay's clocks.
    pub client: Vec<(u32, u64)>,
    /// This service's clocks.
    pub host: Vec<(u32, u64)>,
}

/// What a relay told the service.
#[derive(Debug, Default)]
pub struct RelayClient {
    /// Its machine.
    pub machine_id: u32,
    /// Its machine's description (`InitRelay`).
    pub system_info: Option<SystemInfo>,
    /// The last clock exchanges, oldest first.
    pub synced: VecDeque<SyncedClocks>,
}

/// What a session has yet to write about one relayed machine.
#[derive(Debug)]
pub struct MachineDue<'a> {
    /// Its id.
    pub machine: u32,
    /// Its description, not yet written.
    pub info: Option<&'a SystemInfo>,
    /// Its clock exchanges, not yet written.
    pub clocks: Option<&'a VecDeque<SyncedClocks>>,
}

/// What to write for the relayed machines a session has not yet seen
/// described or synced: per machine, its `system_info` and clock
/// exchanges (the first relay of each machine, in connection order, as
/// upstream picks it).
pub fn machines_due<'a>(
    relays: &'a BTreeMap<ConnId, RelayClient>,
    described: &BTreeSet<u32>,
    synced: &BTreeSet<u32>,
) -> Vec<MachineDue<'a>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for r in relays.values() {
        if !seen.insert(r.machine_id) {
            continue;
        }
        let info = r
            .system_info
            .as_ref()
            .filter(|_| !described.contains(&r.machine_id));
        let clocks = Some(&r.synced).filter(|c| !c.is_empty() && !synced.contains(&r.machine_id));
        if info.is_some() || clocks.is_some() {
            out.push(MachineDue {
                machine: r.machine_id,
                info,
                clocks,
            });
        }
    }
    out
}

impl TracingService {
    /// A relay announced who the peer of the producer-socket connection
    /// `conn` is. Taken before the connection's first producer call
    /// (afterwards, or on a consumer connection, it is ignored: the
    /// producer keeps the identity it was admitted with).
    pub fn set_peer_identity(&mut self, conn: ConnId, identity: RemoteIdentity) {
        match self.conns.get_mut(&conn) {
            Some(Endpoint::Producer {
                creds,
                id: None,
                machine,
                ..
            }) if !self.relays.contains_key(&conn) => {
                log::debug!(
                    "connection {}: relayed peer pid {} uid {} of machine {} {:?}",
                    conn.0,
                    identity.pid,
                    identity.uid,
                    identity.machine_id,
                    identity.machine_name
                );
                creds.pid = identity.pid;
                creds.uid = identity.uid;
                *machine = Machine {
                    id: identity.machine_id,
                    name: identity.machine_name,
                };
            }
            _ => log::info!(
                "connection {}: ignoring a peer identity after its first call",
                conn.0
            ),
        }
    }

    /// Dispatches one `RelayPort` call (the service exposes it on producer
    /// sockets only when asked to: `shmtrace serve --enable-relay-endpoint`).
    pub fn on_relay_call(&mut self, conn: ConnId, call: Call<Request>) {
        let machine_id = match self.conns.get(&conn) {
            Some(Endpoint::Producer {
                id: None, machine, ..
            }) => machine.id,
            _ => {
                log::info!("connection {}: RelayPort call on a producer", conn.0);
                self.reject(conn, &call.reply);
                return;
            }
        };
        if machine_id == 0 {
            log::info!(
                "connection {}: RelayPort call without a peer identity (SetPeerIdentity)",
                conn.0
            );
            self.reject(conn, &call.reply);
            return;
        }
        match call.request {
            Request::InitRelay(req) => {
                self.reply(conn, &call.reply, &InitRelayResponse {}, false);
                let relay = self.relay_client(conn, machine_id);
                relay.system_info = req.system_info;
            }
            Request::SyncClock(req) => {
                // Read as close to the relay's as possible: first.
                let host = self.env.clock_snapshot();
                if req.clocks.len() > MAX_CLOCKS_PER_SYNC {
                    self.disconnect_peer(
                        conn,
                        PeerFault::TooManyClocks {
                            clocks: req.clocks.len(),
                        },
                    );
                    return;
                }
                self.reply(conn, &call.reply, &SyncClockResponse {}, false);
                let client = req
                    .clocks
                    .iter()
                    .map(|c| (c.clock_id.unwrap_or(0), c.timestamp.unwrap_or(0)))
                    .collect();
                let relay = self.relay_client(conn, machine_id);
                if relay.synced.len() == MAX_SYNCED_CLOCKS {
                    relay.synced.pop_front();
                }
                relay.synced.push_back(SyncedClocks { client, host });
            }
        }
    }

    fn relay_client(&mut self, conn: ConnId, machine_id: u32) -> &mut RelayClient {
        self.relays.entry(conn).or_insert_with(|| {
            log::info!("relay of machine {machine_id} on connection {}", conn.0);
            RelayClient {
                machine_id,
                ..RelayClient::default()
            }
        })
    }
}
