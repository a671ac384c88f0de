//! The relay's own connection to the central service's `RelayPort`
//! (upstream's `RelayClient`, src/traced_relay/relay_service.cc): announce
//! this machine (`SetPeerIdentity`), describe it (`InitRelay`), then
//! exchange clocks: a `SyncClock` PING, its answer, an UPDATE, its answer,
//! and again after [`SYNC_INTERVAL`]. Each request carries this machine's
//! clocks as read just before sending; the service reads its own on
//! receipt. Trace processors take a PING and the UPDATE after it as one
//! round (four readings) when the two are less than 30 s apart.
//!
//! Blocking, on a thread of its own, with the IPC client's sans-IO core.
//! Any failure (no service, a refusal, a close, no answer within
//! [`REPLY_TIMEOUT`]) drops the connection and retries after 1 s, doubling
//! up to 30 s; a connection that got as far as exchanging clocks retries
//! after 1 s again.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;

use shmtrace_ipc::client::{BindError, Incoming, RpcError, UnknownMethod};
use shmtrace_ipc::frame::{set_peer_identity_frame, FrameError, FrameTooLarge};
use shmtrace_ipc::protos::sync_clock_request::{Clock, Phase};
use shmtrace_ipc::protos::{canonical, InitRelayRequest, IpcFrame, SyncClockRequest, SystemInfo};
use shmtrace_ipc::socket::{self, Received, RecvError, Stream};
use shmtrace_ipc::{
    ClientCore, FrameDecoder, OutQueue, PeerIdentity, ServiceBinding, SocketAddress,
};
use shmtrace_service::service::env::{Environment, SystemEnvironment};
use shmtrace_service::service::shell::system_service_config;

/// Time between two rounds of clock exchanges (upstream's 30 s).
pub const SYNC_INTERVAL: Duration = Duration::from_secs(30);

/// The longest the relay waits for one answer of the central service.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// First retry delay, and the longest.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Why a `RelayPort` session ended.
#[derive(Debug, Error)]
enum SyncError {
    #[error("cannot connect to {address}: {source}")]
    Connect { address: String, source: io::Error },
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    #[error("receive failed: {0}")]
    Recv(#[from] RecvError),
    #[error("the service closed the connection")]
    Closed,
    #[error("malformed frame from the service: {0}")]
    Frame(#[from] FrameError),
    #[error(transparent)]
    TooLarge(#[from] FrameTooLarge),
    #[error("{0} (shmtrace serve exposes it with --enable-relay-endpoint)")]
    Bind(#[from] BindError),
    #[error(transparent)]
    UnknownMethod(#[from] UnknownMethod),
    #[error("the service refused {method}: {source}")]
    Refused {
        method: &'static str,
        source: RpcError,
    },
}

/// Starts the clock thread for `central`: it runs until the process ends.
pub fn spawn(central: SocketAddress, identity: PeerIdentity, interval: Duration) {
    let spawned = std::thread::Builder::new()
        .name("relay-clock".into())
        .spawn(move || {
            let mut delay = RETRY_MIN;
            loop {
                let mut synced = false;
                let e = sync_forever(&central, &identity, interval, &mut synced).unwrap_err();
                if synced {
                    delay = RETRY_MIN;
                }
                log::warn!(
                    "clock sync with {central}: {e}; retrying in {} s",
                    delay.as_secs()
                );
                std::thread::sleep(delay);
                delay = (delay * 2).min(RETRY_MAX);
            }
        });
    if let Err(e) = spawned {
        log::error!("cannot start the clock sync thread: {e}");
    }
}

/// One connection: returns only on failure. `synced` is set once a round
/// of clock exchanges completed.
fn sync_forever(
    central: &SocketAddress,
    identity: &PeerIdentity,
    interval: Duration,
    synced: &mut bool,
) -> Result<(), SyncError> {
    let stream = socket::connect_stream(central).map_err(|source| SyncError::Connect {
        address: central.to_string(),
        source,
    })?;
    rustix::net::sockopt::set_socket_timeout(
        &stream,
        rustix::net::sockopt::Timeout::Recv,
        Some(REPLY_TIMEOUT),
    )
    .map_err(io::Error::from)?;
    let mut conn = Conn {
        stream,
        core: ClientCore::new(),
        decoder: FrameDecoder::new(),
    };
    conn.send(&set_peer_identity_frame(identity))?;
    let frame = conn.core.bind("RelayPort", ());
    conn.send(&frame)?;
    let binding = match conn.next()? {
        Incoming::Bound { result, .. } => result?,
        _ => return Err(SyncError::Closed),
    };
    let init = InitRelayRequest {
        system_info: Some(machine_system_info(identity)),
    };
    conn.call(&binding, "InitRelay", canonical::encode(&init))?;
    log::info!("connected to {central}'s relay port");
    let env = SystemEnvironment;
    loop {
        for phase in [Phase::Ping, Phase::Update] {
            let request = SyncClockRequest {
                phase: Some(phase as i32),
                clocks: env
                    .clock_snapshot()
                    .into_iter()
                    .map(|(id, ts)| Clock {
                        clock_id: Some(id),
                        timestamp: Some(ts),
                    })
                    .collect(),
            };
            conn.call(&binding, "SyncClock", canonical::encode(&request))?;
        }
        *synced = true;
        std::thread::sleep(interval);
    }
}

/// This machine's `SystemInfo` for `InitRelay`, named: `machine_name`
/// (field 17, upstream's protos/perfetto/common/system_info.proto) is the
/// label a trace processor gives the machine (and `shmtrace inspect`
/// shows); the central service writes the description into its traces
/// as it came. Upstream's relay (src/traced_relay/relay_service.cc) sends
/// no name, so its machines are "machine <id>" there.
fn machine_system_info(identity: &PeerIdentity) -> SystemInfo {
    let mut info = system_service_config().system_info;
    info.machine_name = Some(identity.machine_name.clone()).filter(|n| !n.is_empty());
    info
}

struct Conn {
    stream: Stream,
    core: ClientCore<()>,
    decoder: FrameDecoder,
}

impl Conn {
    fn send(&self, frame: &IpcFrame) -> Result<(), SyncError> {
        let mut out = OutQueue::new();
        out.push_frame(frame, None)?;
        while !out.is_empty() {
            socket::send_queued(&self.stream, &mut out)?;
        }
        Ok(())
    }

    /// The next frame that answers a request.
    fn next(&mut self) -> Result<Incoming<()>, SyncError> {
        loop {
            if let Some(received) = self.decoder.next_frame()? {
                match self.core.handle_frame(received) {
                    Incoming::Stale { .. } | Incoming::Unsolicited { .. } => continue,
                    answer => return Ok(answer),
                }
            }
            match socket::recv_into(&self.stream, &mut self.decoder)? {
                Received::Data(_) => {}
                Received::Closed => return Err(SyncError::Closed),
                Received::WouldBlock => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer").into())
                }
            }
        }
    }

    /// Calls `method` and waits for its answer.
    fn call(
        &mut self,
        binding: &ServiceBinding,
        method: &'static str,
        args: Vec<u8>,
    ) -> Result<(), SyncError> {
        let (_, frame) = self
            .core
            .invoke(binding, method, Bytes::from(args), Some(()))?;
        self.send(&frame)?;
        match self.next()? {
            Incoming::Reply { reply, .. } => reply
                .result
                .map(drop)
                .map_err(|source| SyncError::Refused { method, source }),
            _ => Err(SyncError::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The description names the machine as the relay was told to, and
    /// an unnamed relay's names none (rather than an empty name).
    #[test]
    fn the_machine_description_carries_its_name() {
        let identity = |name: &str| PeerIdentity {
            pid: 0,
            uid: 0,
            machine_id_hint: "hint".into(),
            machine_name: name.into(),
        };
        let named = machine_system_info(&identity("vm-1"));
        assert_eq!(named.machine_name.as_deref(), Some("vm-1"));
        assert!(named.utsname.is_some_and(|u| u.sysname.is_some()));
        assert_eq!(machine_system_info(&identity("")).machine_name, None);
    }
}
