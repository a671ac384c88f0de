//! Test helpers shared by the `ipc_*` tests: a blocking host loop.

#![allow(dead_code)]

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use shmtrace_ipc::host::{Call, HostConnection, HostError, ServiceTable};
use shmtrace_ipc::socket::{self, Received, RecvError};

/// How a served connection ended.
#[derive(Debug)]
pub enum End {
    /// The client closed the connection.
    Closed,
    /// The host closed it because of a protocol error.
    Protocol(HostError),
    /// A socket error.
    Recv(RecvError),
}

/// Serves one connection on a thread: every call goes to `handler`, which
/// answers through the connection. Replies are flushed after each read.
pub fn serve<R, F>(stream: UnixStream, table: ServiceTable<R>, mut handler: F) -> JoinHandle<End>
where
    R: Send + 'static,
    F: FnMut(&mut HostConnection<R>, Call<R>) + Send + 'static,
{
    std::thread::spawn(move || {
        let peer = socket::peer_credentials(&stream).ok();
        let mut conn = HostConnection::new(Arc::new(table), peer);
        loop {
            match socket::recv_into(&stream, conn.decoder()) {
                Ok(Received::Data(_)) => {}
                Ok(Received::Closed) => return End::Closed,
                Ok(Received::WouldBlock) => continue,
                Err(e) => return End::Recv(e),
            }
            loop {
                match conn.poll_call() {
                    Ok(Some(call)) => handler(&mut conn, call),
                    Ok(None) => break,
                    Err(e) => return End::Protocol(e),
                }
            }
            if socket::send_queued(&stream, conn.out()).is_err() {
                return End::Closed;
            }
        }
    })
}

/// A memfd holding `content`.
pub fn memfd(content: &[u8]) -> OwnedFd {
    memfd_named("shmtrace-test", content)
}

/// A memfd named `name` holding `content`.
pub fn memfd_named(name: &str, content: &[u8]) -> OwnedFd {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let mut file = std::fs::File::from(fd);
    file.write_all(content).unwrap();
    file.into()
}

/// Descriptors of this process open on a memfd named `name`.
pub fn memfds_named(name: &str) -> usize {
    let target = format!("/memfd:{name} ");
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|link| {
            // A memfd's link reads "/memfd:NAME (deleted)".
            format!("{} ", link.to_string_lossy()).starts_with(&target)
        })
        .count()
}

/// What a received descriptor holds (it must be close-on-exec).
pub fn read_fd(fd: OwnedFd) -> Vec<u8> {
    let flags = rustix::io::fcntl_getfd(&fd).unwrap();
    assert!(
        flags.contains(rustix::io::FdFlags::CLOEXEC),
        "received fds are close-on-exec"
    );
    let mut file = std::fs::File::from(fd);
    file.seek(SeekFrom::Start(0)).unwrap();
    let mut out = Vec::new();
    file.read_to_end(&mut out).unwrap();
    out
}
