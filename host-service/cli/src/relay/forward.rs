//! One producer, forwarded: a connection to the central service of its
//! own, announced with `SetPeerIdentity`, then bytes copied both ways until
//! either side closes (upstream's `SocketRelayHandler`,
//! src/traced_relay/socket_relay_handler.cc).
//!
//! The frames are not parsed: the relay neither checks nor changes what
//! the producer and the service say, and a producer's attached descriptors
//! are dropped (plain reads do not take them). When one side closes or
//! fails, both connections are shut down, so the other side sees the close
//! too.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{RecvFlags, SendFlags, Shutdown};

use shmtrace_ipc::frame::{encode_frame, set_peer_identity_frame};
use shmtrace_ipc::socket;
use shmtrace_ipc::{PeerIdentity, SocketAddress};

/// Bytes read at once.
const COPY_BUF: usize = 64 * 1024;

/// Forwards `local` (a producer's connection to the relay) to `central`
/// on threads of its own; returns at once. Failures are logged and close
/// the producer's connection.
pub fn spawn(local: UnixStream, central: SocketAddress, identity: PeerIdentity) {
    let pid = identity.pid;
    let spawned = std::thread::Builder::new()
        .name("relay-producer".into())
        .spawn(move || {
            if let Err(e) = forward(OwnedFd::from(local), &central, &identity) {
                log::info!("producer pid {pid}: {e}");
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start forwarding producer pid {pid}: {e}");
    }
}

/// Connects to `central`, announces `identity`, and copies until either
/// side closes.
fn forward(local: OwnedFd, central: &SocketAddress, identity: &PeerIdentity) -> io::Result<()> {
    let central = match socket::connect_stream(central) {
        Ok(stream) => OwnedFd::from(stream),
        Err(e) => {
            // Not an ordinary end: every producer of this machine is cut
            // off from tracing while it lasts.
            let _ = rustix::net::shutdown(&local, Shutdown::Both);
            log::warn!(
                "producer pid {}: cannot connect to the central service at {central}: {e}",
                identity.pid
            );
            return Ok(());
        }
    };
    log::debug!(
        "forwarding producer pid {} uid {}",
        identity.pid,
        identity.uid
    );
    let mut hello = Vec::new();
    encode_frame(&set_peer_identity_frame(identity), &mut hello).map_err(io::Error::other)?;
    send_all(&central, &hello)?;
    let (back_from, back_to) = (central.try_clone()?, local.try_clone()?);
    let back = std::thread::Builder::new()
        .name("relay-service".into())
        .spawn(move || copy(&back_from, &back_to))?;
    let there = copy(&local, &central);
    let back = back.join().unwrap_or(Ok(()));
    there.and(back)
}

/// Copies from `from` to `to` until `from` closes or either fails, then
/// shuts both down (waking the copy the other way).
fn copy(from: &OwnedFd, to: &OwnedFd) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_BUF];
    let result = loop {
        let n = match rustix::net::recv(from, &mut buf[..], RecvFlags::empty()) {
            Ok((0, _)) => break Ok(()),
            Ok((n, _)) => n,
            Err(rustix::io::Errno::INTR) => continue,
            // A reset is a close by a peer that left data unread.
            Err(rustix::io::Errno::CONNRESET) => break Ok(()),
            Err(e) => break Err(e.into()),
        };
        if let Err(e) = send_all(to, &buf[..n]) {
            break Err(e);
        }
    };
    for fd in [from, to] {
        let _ = rustix::net::shutdown(fd, Shutdown::Both);
    }
    result
}

fn send_all(to: impl AsFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(&to, bytes, SendFlags::NOSIGNAL) {
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use shmtrace_ipc::protos::ipc_frame::Msg;
    use shmtrace_ipc::FrameDecoder;

    #[test]
    fn a_producer_is_announced_then_forwarded_byte_for_byte_both_ways() {
        let central = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = central.local_addr().unwrap().port();
        let (mut producer, relay_side) = UnixStream::pair().unwrap();
        let identity = PeerIdentity {
            pid: 4242,
            uid: 1000,
            machine_id_hint: "boot-id".into(),
            machine_name: "vm-1".into(),
        };
        let address = SocketAddress::parse(&format!("127.0.0.1:{port}")).unwrap();
        spawn(relay_side, address, identity.clone());
        let (mut service, _) = central.accept().unwrap();

        // The producer's bytes, whatever they are, follow the identity.
        producer.write_all(b"not even a frame").unwrap();
        let mut hello = Vec::new();
        encode_frame(&set_peer_identity_frame(&identity), &mut hello).unwrap();
        let mut got = vec![0; hello.len() + 16];
        service.read_exact(&mut got).unwrap();
        assert_eq!(&got[..hello.len()], &hello[..]);
        assert_eq!(&got[hello.len()..], b"not even a frame");
        let mut decoder = FrameDecoder::new();
        decoder.push(&got[..hello.len()], None);
        let frame = decoder.next_frame().unwrap().unwrap().frame;
        assert_eq!(frame.request_id, Some(0));
        let Some(Msg::SetPeerIdentity(sent)) = frame.msg else {
            panic!("{frame:?}")
        };
        assert_eq!(
            (
                sent.pid,
                sent.uid,
                sent.machine_id_hint.as_deref(),
                sent.machine_name.as_deref()
            ),
            (Some(4242), Some(1000), Some("boot-id"), Some("vm-1"))
        );

        // And the service's come back untouched.
        service.write_all(b"reply").unwrap();
        let mut back = [0; 5];
        producer.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"reply");

        // The service closing closes the producer's connection too.
        drop(service);
        let mut rest = Vec::new();
        producer.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn a_producer_whose_service_is_gone_is_closed() {
        // A port nothing listens on (bound, then released).
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (mut producer, relay_side) = UnixStream::pair().unwrap();
        let address = SocketAddress::parse(&format!("127.0.0.1:{port}")).unwrap();
        spawn(relay_side, address, PeerIdentity::default());
        let mut rest = Vec::new();
        producer.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }
}
