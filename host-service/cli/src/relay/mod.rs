//! `shmtrace relay`: the producer socket of a machine whose producers are
//! traced by a tracing service on another machine (upstream's
//! `traced_relay`, src/traced_relay/).
//!
//! The relay listens on a UNIX socket where this machine's producers
//! expect the service, and forwards each producer connection to the
//! central service's producer socket (TCP or vsock): [`forward`] opens a
//! connection of its own to the central service per producer, sends a
//! `SetPeerIdentity` frame first (the producer's pid and uid, this
//! machine's id hint and name) and then copies bytes both ways, frames
//! untouched. The central service sees a TCP or vsock producer and answers
//! `use_shmem_emulation`: the producer keeps its own buffer and sends its
//! chunks inline in its commits, though it is on a UNIX socket. Descriptors
//! a producer attaches (its own SMB) do not cross the relay; the service
//! would not take them over TCP anyway. This is what upstream's relay
//! does.
//!
//! Beside the producers, [`clock`] keeps one connection of its own to the
//! central service's `RelayPort`: `InitRelay` with this machine's
//! `SystemInfo`, then clock exchanges (`SyncClock`, a PING and an UPDATE
//! every [`clock::SYNC_INTERVAL`]) from which the trace processor maps
//! this machine's timestamps onto the central machine's clocks. It
//! reconnects (after 1 s, doubling up to 30 s) when the service goes away.
//!
//! Nothing is authenticated: the central service believes what the relay
//! says, and anyone who can reach its socket can say the same. The relay's
//! own socket is a UNIX socket (this machine only).

pub mod clock;
pub mod forward;

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};
use thiserror::Error;

use shmtrace_ipc::socket::{self, Family};
use shmtrace_ipc::{Listener, PeerIdentity, SocketAddress};

/// Where the relay listens and forwards to, and what it says about its
/// machine.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The local producer socket (UNIX).
    pub listen: SocketAddress,
    /// The central service's producer socket (TCP or vsock: a service
    /// takes a peer's machine identity on those only, as upstream's).
    pub central: SocketAddress,
    /// What identifies this machine (upstream: the kernel's boot id).
    pub machine_id_hint: String,
    /// This machine's name (data sources' `machine_name_filter`).
    pub machine_name: String,
    /// Time between two clock exchanges.
    pub sync_interval: Duration,
}

/// Why the relay cannot run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The local socket must be a UNIX socket.
    #[error(
        "the relay listens for this machine's producers on a UNIX socket (a path or @name), not {0}"
    )]
    NotUnix(String),
    /// The central socket must be TCP or vsock: a service ignores the
    /// `SetPeerIdentity` of a UNIX socket's peer (upstream's
    /// `HostImpl::OnSetPeerIdentity`, src/ipc/host_impl.cc) and refuses its
    /// `RelayPort` calls, so its producers would pass for the central
    /// machine's own.
    #[error(
        "the relay forwards to the central service's TCP or vsock producer socket \
         (HOST:PORT, [IPV6]:PORT or vsock://CID:PORT), not {0}: a service takes no machine \
         identity over a UNIX socket"
    )]
    CentralUnix(String),
    /// The local socket could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: String,
        /// Why.
        source: io::Error,
    },
    /// Waiting for connections failed.
    #[error("waiting for producers failed: {0}")]
    Poll(io::Error),
}

/// This machine's id hint as upstream's relay takes it: the kernel's boot
/// id (`/proc/sys/kernel/random/boot_id`); empty if unreadable (the
/// central service then uses the relay's address).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_default()
}

/// A bound relay, ready to run.
#[derive(Debug)]
pub struct Relay {
    cfg: RelayConfig,
    listener: Listener,
}

impl Relay {
    /// Binds the local socket (mode 0666: any process of this machine may
    /// trace, as with the service's producer socket).
    pub fn bind(cfg: RelayConfig) -> Result<Self, RelayError> {
        if cfg.listen.family() != Family::Unix {
            return Err(RelayError::NotUnix(cfg.listen.to_string()));
        }
        if cfg.central.family() == Family::Unix {
            return Err(RelayError::CentralUnix(cfg.central.to_string()));
        }
        let err = |source: io::Error| RelayError::Listen {
            address: cfg.listen.to_string(),
            source,
        };
        let listener = Listener::bind(&cfg.listen).map_err(err)?;
        if let SocketAddress::Path(path) = &cfg.listen {
            rustix::fs::chmod(path, rustix::fs::Mode::from_raw_mode(0o666))
                .map_err(|e| err(e.into()))?;
        }
        listener.set_nonblocking(true).map_err(err)?;
        Ok(Self { cfg, listener })
    }

    /// Forwards producers and keeps the clocks in sync until `stop` becomes
    /// readable. The socket file is removed on the way out; connections
    /// being forwarded end with the process.
    pub fn run(self, stop: BorrowedFd<'_>) -> Result<(), RelayError> {
        let identity = |pid: i32, uid: u32| PeerIdentity {
            pid,
            uid: uid as i32,
            machine_id_hint: self.cfg.machine_id_hint.clone(),
            machine_name: self.cfg.machine_name.clone(),
        };
        clock::spawn(
            self.cfg.central.clone(),
            identity(
                rustix::process::getpid().as_raw_nonzero().get(),
                rustix::process::geteuid().as_raw(),
            ),
            self.cfg.sync_interval,
        );
        let result = loop {
            let mut fds = [
                PollFd::new(&self.listener, PollFlags::IN),
                PollFd::new(&stop, PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => break Err(RelayError::Poll(e.into())),
            }
            if !fds[1].revents().is_empty() {
                log::info!("stopping");
                break Ok(());
            }
            loop {
                let local = match self.listener.accept() {
                    Ok(s) => s,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        log::warn!("accept on {} failed: {e}", self.cfg.listen);
                        break;
                    }
                };
                let (pid, uid) = match socket::peer_credentials(local.as_fd()) {
                    Ok(c) => (c.pid, c.uid),
                    Err(e) => {
                        log::warn!("SO_PEERCRED failed, dropping the connection: {e}");
                        continue;
                    }
                };
                forward::spawn(local, self.cfg.central.clone(), identity(pid, uid));
            }
        };
        if let Err(e) = self.listener.remove_socket_file() {
            log::warn!("cannot remove the socket file {}: {e}", self.cfg.listen);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_listens_on_unix_sockets_only() {
        let cfg = |listen: &str| RelayConfig {
            listen: SocketAddress::parse(listen).unwrap(),
            central: SocketAddress::parse("127.0.0.1:1").unwrap(),
            machine_id_hint: String::new(),
            machine_name: String::new(),
            sync_interval: Duration::from_secs(30),
        };
        for other in ["127.0.0.1:0", "vsock://1:1"] {
            let err = Relay::bind(cfg(other)).unwrap_err();
            assert!(matches!(err, RelayError::NotUnix(_)), "{other}: {err}");
        }
        let name = format!("@shmtrace-relay-test-{}", std::process::id());
        let relay = Relay::bind(cfg(&name)).unwrap();
        // A second relay on the same name finds it taken.
        assert!(matches!(
            Relay::bind(cfg(&name)),
            Err(RelayError::Listen { .. })
        ));
        drop(relay);
    }
}
