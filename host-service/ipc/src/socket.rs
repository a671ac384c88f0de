//! The thin socket shell: addresses, listening, connecting, and moving bytes
//! and file descriptors between a socket and the sans-IO
//! [`FrameDecoder`] / [`OutQueue`].
//!
//! Everything is `SOCK_CLOEXEC` / `MSG_CMSG_CLOEXEC`. The functions work on
//! blocking and non-blocking sockets alike: [`recv_into`] and
//! [`send_queued`] report `WouldBlock` as "nothing more for now".
//!
//! Families (Perfetto's socket names, `GetSockFamily` in
//! src/base/unix_socket.cc): a filesystem path or `@abstract` name is a
//! UNIX socket; `host:port` and `[v6]:port` are TCP; `vsock://cid:port` is
//! vsock. Only UNIX sockets carry file descriptors: a producer on TCP or
//! vsock gets shmem emulation ([`SocketAddress::passes_fds`]). TCP and vsock
//! carry no peer credentials either, and the protocol has no
//! authentication: [`SocketAddress::is_loopback`] tells the service whether
//! a listening address is reachable from other machines.
//!
//! File descriptor rules (Perfetto's): at most one fd per `recvmsg` is kept,
//! extra ones in the same message are closed; a truncated control or data
//! message closes every fd it carried and fails the read. On the send side an
//! fd goes with the first `sendmsg` of its frame (see [`OutQueue`]).
// `unsafe` here: getsockopt(SO_PEERCRED) through libc (one call, see
// `peer_credentials`), and the vsock address handed to rustix (`VsockAddr`).
#![allow(unsafe_code)]

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use rustix::net::{
    self, addr::SocketAddrArg, sockopt, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage,
    RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix,
    SocketFlags, SocketType,
};
use thiserror::Error;

use super::frame::FrameDecoder;
use super::outq::OutQueue;

/// Environment variable overriding the producer socket (on the service side
/// it may list several sockets, comma-separated).
pub const PRODUCER_SOCKET_ENV: &str = "PERFETTO_PRODUCER_SOCK_NAME";

/// Environment variable overriding the consumer socket.
pub const CONSUMER_SOCKET_ENV: &str = "PERFETTO_CONSUMER_SOCK_NAME";

/// Directory used for the default sockets when it exists and is searchable.
const RUN_DIR: &str = "/run/perfetto/";

/// Longest socket name, as Perfetto accepts it (`sun_path` minus the NUL).
pub const MAX_NAME_LEN: usize = 106;

/// The vsock prefix of a socket name.
const VSOCK_PREFIX: &str = "vsock://";

/// The vsock context id of this machine seen from itself
/// (`VMADDR_CID_LOCAL`): the vsock "loopback".
pub const VSOCK_CID_LOCAL: u32 = 1;

/// Where a tracing service listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SocketAddress {
    /// A socket file.
    Path(PathBuf),
    /// An abstract socket name (without the leading `@`/NUL).
    Abstract(Vec<u8>),
    /// A TCP address, `host:port` (`[v6]:port` for IPv6 literals). The host
    /// is resolved when binding or connecting.
    Tcp {
        /// A host name or IP literal (without brackets).
        host: String,
        /// The port.
        port: u16,
    },
    /// A vsock address, `vsock://cid:port`.
    Vsock {
        /// The context id (`4294967295` = any).
        cid: u32,
        /// The port.
        port: u32,
    },
}

/// The kind of socket an address names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// UNIX (path or abstract): carries descriptors and credentials.
    Unix,
    /// TCP over IPv4 or IPv6.
    Tcp,
    /// vsock (virtual machines and their host).
    Vsock,
}

/// An address this implementation cannot use.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AddressError {
    /// The empty string.
    #[error("empty socket name")]
    Empty,
    /// A name longer than [`MAX_NAME_LEN`].
    #[error("socket name {0:?} is longer than {MAX_NAME_LEN} bytes")]
    TooLong(String),
    /// A `host:port` whose port is not in 0..=65535 or whose host is empty.
    #[error("TCP socket {0:?}: expected host:port or [ipv6]:port with a port in 0..=65535")]
    Tcp(String),
    /// A `vsock://` name that is not `vsock://cid:port` with two unsigned
    /// 32-bit numbers.
    #[error("vsock socket {0:?}: expected vsock://CID:PORT")]
    Vsock(String),
}

impl SocketAddress {
    /// Parses a socket name with Perfetto's rules: `@name` is abstract,
    /// `vsock://…` is vsock, a name ending in `:<integer>` is TCP, anything
    /// else is a filesystem path.
    pub fn parse(name: &str) -> Result<Self, AddressError> {
        if name.is_empty() {
            return Err(AddressError::Empty);
        }
        if name.len() > MAX_NAME_LEN {
            return Err(AddressError::TooLong(name.to_owned()));
        }
        if let Some(abstract_name) = name.strip_prefix('@') {
            return Ok(Self::Abstract(abstract_name.as_bytes().to_vec()));
        }
        if let Some(rest) = name.strip_prefix(VSOCK_PREFIX) {
            let bad = || AddressError::Vsock(name.to_owned());
            let (cid, port) = rest.split_once(':').ok_or_else(bad)?;
            return Ok(Self::Vsock {
                cid: cid.parse().map_err(|_| bad())?,
                port: port.parse().map_err(|_| bad())?,
            });
        }
        if let Some((host, port)) = name.rsplit_once(':') {
            // Upstream's test: whatever follows the last colon reads as a
            // 32-bit integer.
            if port.parse::<i32>().is_ok() {
                let bad = || AddressError::Tcp(name.to_owned());
                let port = port.parse::<u16>().map_err(|_| bad())?;
                let host = match host.strip_prefix('[') {
                    Some(v6) => v6.strip_suffix(']').ok_or_else(bad)?,
                    None => host,
                };
                if host.is_empty() {
                    return Err(bad());
                }
                return Ok(Self::Tcp {
                    host: host.to_owned(),
                    port,
                });
            }
        }
        Ok(Self::Path(PathBuf::from(name)))
    }

    /// The kind of socket.
    pub fn family(&self) -> Family {
        match self {
            Self::Path(_) | Self::Abstract(_) => Family::Unix,
            Self::Tcp { .. } => Family::Tcp,
            Self::Vsock { .. } => Family::Vsock,
        }
    }

    /// Whether connections on this address can carry file descriptors
    /// (UNIX sockets only); producers on other addresses need shmem
    /// emulation.
    pub fn passes_fds(&self) -> bool {
        self.family() == Family::Unix
    }

    /// Whether only this machine can reach the address: UNIX sockets, TCP
    /// hosts that resolve to loopback addresses only, vsock context id
    /// [`VSOCK_CID_LOCAL`]. A host that does not resolve is not loopback.
    pub fn is_loopback(&self) -> bool {
        match self {
            Self::Path(_) | Self::Abstract(_) => true,
            Self::Tcp { .. } => self
                .resolve()
                .is_ok_and(|a| !a.is_empty() && a.iter().all(|a| a.ip().is_loopback())),
            Self::Vsock { cid, .. } => *cid == VSOCK_CID_LOCAL,
        }
    }

    /// The socket addresses a TCP address resolves to.
    fn resolve(&self) -> io::Result<Vec<SocketAddr>> {
        match self {
            Self::Tcp { host, port } => Ok((host.as_str(), *port).to_socket_addrs()?.collect()),
            _ => Err(io::Error::other("not a TCP address")),
        }
    }

    fn to_sockaddr(&self) -> io::Result<SocketAddrUnix> {
        Ok(match self {
            Self::Path(path) => SocketAddrUnix::new(path.as_path())?,
            Self::Abstract(name) => SocketAddrUnix::new_abstract_name(name)?,
            Self::Tcp { .. } | Self::Vsock { .. } => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{self} is not a UNIX socket"),
                ))
            }
        })
    }
}

impl fmt::Display for SocketAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path(path) => write!(f, "{}", path.display()),
            Self::Abstract(name) => write!(f, "@{}", String::from_utf8_lossy(name)),
            Self::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Self::Tcp { host, port } => write!(f, "{host}:{port}"),
            Self::Vsock { cid, port } => write!(f, "{VSOCK_PREFIX}{cid}:{port}"),
        }
    }
}

/// A vsock address for rustix (which has no vsock address type).
#[derive(Debug, Clone, Copy)]
struct VsockAddr {
    cid: u32,
    port: u32,
}

// SAFETY: `with_sockaddr` passes `f` a pointer to a fully initialized
// `sockaddr_vm` on its own stack, live for the whole call, and exactly its
// size; the pointer is only read during the call (rustix's contract for
// this trait).
unsafe impl SocketAddrArg for VsockAddr {
    unsafe fn with_sockaddr<R>(
        &self,
        f: impl FnOnce(*const net::addr::SocketAddrOpaque, net::addr::SocketAddrLen) -> R,
    ) -> R {
        // SAFETY: `sockaddr_vm` is plain old data: all zeroes is a valid
        // value (and zero is what the reserved and flag fields must be).
        let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
        addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
        addr.svm_cid = self.cid;
        addr.svm_port = self.port;
        f(
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_vm>() as net::addr::SocketAddrLen,
        )
    }
}

fn default_socket(env: &str, run_name: &str, tmp_name: &str) -> String {
    if let Some(name) = std::env::var_os(env) {
        return name.to_string_lossy().into_owned();
    }
    let use_run = rustix::fs::access(RUN_DIR, rustix::fs::Access::EXEC_OK).is_ok();
    if use_run {
        format!("{RUN_DIR}{run_name}")
    } else {
        tmp_name.to_owned()
    }
}

/// The producer socket name clients connect to: `$PERFETTO_PRODUCER_SOCK_NAME`,
/// else `/run/perfetto/traced-producer.sock` if `/run/perfetto/` is
/// searchable, else `/tmp/perfetto-producer`.
pub fn producer_socket_name() -> String {
    default_socket(
        PRODUCER_SOCKET_ENV,
        "traced-producer.sock",
        "/tmp/perfetto-producer",
    )
}

/// The consumer socket name: `$PERFETTO_CONSUMER_SOCK_NAME`, else
/// `/run/perfetto/traced-consumer.sock` if `/run/perfetto/` is searchable,
/// else `/tmp/perfetto-consumer`.
pub fn consumer_socket_name() -> String {
    default_socket(
        CONSUMER_SOCKET_ENV,
        "traced-consumer.sock",
        "/tmp/perfetto-consumer",
    )
}

/// The producer sockets a service listens on: [`producer_socket_name`] split
/// at commas.
pub fn producer_socket_names_for_service() -> Vec<String> {
    producer_socket_name()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Credentials of the process at the other end of a UNIX socket, as the
/// kernel recorded them at `connect` time (`SO_PEERCRED`): unforgeable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// The peer credentials of a connected UNIX socket.
///
/// The pid is 0 when the peer lives in a pid namespace this process cannot
/// see. (`rustix::net::sockopt::socket_peercred` is not used because it
/// stores the pid in a non-zero type.)
pub fn peer_credentials(socket: impl AsFd) -> io::Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let size = std::mem::size_of::<libc::ucred>();
    let mut len = size as libc::socklen_t;
    // SAFETY: `cred` is a live, writable `ucred` and `len` holds its size:
    // getsockopt(SO_PEERCRED) writes at most `len` bytes of a `ucred` there
    // and updates `len`. The descriptor is borrowed for the whole call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size {
        return Err(io::Error::other("SO_PEERCRED returned a short ucred"));
    }
    Ok(PeerCredentials {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// A listening socket.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    address: SocketAddress,
    /// The socket file's device and inode, as bound (path addresses only):
    /// [`Listener::remove_socket_file`] removes the file only while it is
    /// still this one.
    file_id: Option<(u64, u64)>,
}

impl Listener {
    /// Binds and listens on `address`. A stale socket file at that path is
    /// removed first (other kinds of files are left alone and make this fail).
    ///
    /// A socket file that a live listener answers on is not stale: binding
    /// fails with [`io::ErrorKind::AddrInUse`] and the file stays.
    ///
    /// A TCP address binds the first address its host resolves to
    /// (`SO_REUSEADDR`, as upstream); port 0 picks a free port (see
    /// [`local_port`](Self::local_port)). Whether the address may be
    /// reachable from other machines is the caller's decision
    /// ([`SocketAddress::is_loopback`]).
    pub fn bind(address: &SocketAddress) -> io::Result<Self> {
        let fd = match address {
            SocketAddress::Path(path) => {
                remove_stale_socket(address, path)?;
                let fd = stream_socket(AddressFamily::UNIX)?;
                net::bind(&fd, &address.to_sockaddr()?)?;
                fd
            }
            SocketAddress::Abstract(_) => {
                let fd = stream_socket(AddressFamily::UNIX)?;
                net::bind(&fd, &address.to_sockaddr()?)?;
                fd
            }
            SocketAddress::Tcp { .. } => {
                let addr = first_address(address)?;
                let fd = stream_socket(inet_family(&addr))?;
                sockopt::set_socket_reuseaddr(&fd, true)?;
                net::bind(&fd, &addr)?;
                fd
            }
            &SocketAddress::Vsock { cid, port } => {
                let fd = stream_socket(AddressFamily::VSOCK)?;
                net::bind(&fd, &VsockAddr { cid, port })?;
                fd
            }
        };
        net::listen(&fd, 1024)?;
        let file_id = match address {
            SocketAddress::Path(path) => Some(file_id(&std::fs::symlink_metadata(path)?)),
            _ => None,
        };
        Ok(Self {
            fd,
            address: address.clone(),
            file_id,
        })
    }

    /// The port a TCP listener is bound to (the one picked for port 0).
    pub fn local_port(&self) -> io::Result<u16> {
        let addr = net::getsockname(&self.fd)?;
        let addr = SocketAddr::try_from(addr).map_err(io::Error::from)?;
        Ok(addr.port())
    }

    /// Removes the socket file this listener bound, unless it is gone or
    /// is no longer this listener's (another process replaced it).
    pub fn remove_socket_file(&self) -> io::Result<()> {
        let (SocketAddress::Path(path), Some(id)) = (&self.address, self.file_id) else {
            return Ok(());
        };
        match std::fs::symlink_metadata(path) {
            Ok(meta) if file_id(&meta) == id => std::fs::remove_file(path),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The address this listener is bound to.
    pub fn address(&self) -> &SocketAddress {
        &self.address
    }

    /// Accepts one connection of a UNIX listener (blocking, unless the
    /// listener was made non-blocking with
    /// [`set_nonblocking`](Self::set_nonblocking)). Use
    /// [`accept_stream`](Self::accept_stream) for listeners of any family.
    pub fn accept(&self) -> io::Result<UnixStream> {
        if !self.address.passes_fds() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{} is not a UNIX socket", self.address),
            ));
        }
        let fd = net::accept_with(&self.fd, SocketFlags::CLOEXEC)?;
        Ok(UnixStream::from(fd))
    }

    /// Accepts one connection, of whatever family the listener has.
    pub fn accept_stream(&self) -> io::Result<Stream> {
        let fd = net::accept_with(&self.fd, SocketFlags::CLOEXEC)?;
        Stream::new(fd, self.address.family())
    }

    /// Makes [`accept`](Self::accept) return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        rustix::io::ioctl_fionbio(&self.fd, nonblocking)?;
        Ok(())
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A file's device and inode.
fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Removes the socket file at `path` if nobody listens on it any more (a
/// connect is refused). A live one is an error: its service would lose its
/// clients, and its exit would remove the file of ours.
fn remove_stale_socket(address: &SocketAddress, path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match connect(address) {
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "a live service is listening on this socket (stop it, or choose other sockets)",
            )),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::CONNREFUSED.raw_os_error()) => {
                std::fs::remove_file(path)
            }
            Err(e) => Err(e),
        },
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Connects to the UNIX socket `address` (blocking connect, close-on-exec
/// socket). Use [`connect_stream`] for addresses of any family.
pub fn connect(address: &SocketAddress) -> io::Result<UnixStream> {
    let sockaddr = address.to_sockaddr()?;
    let fd = stream_socket(AddressFamily::UNIX)?;
    net::connect(&fd, &sockaddr)?;
    Ok(UnixStream::from(fd))
}

/// Connects to `address`, of any family (blocking connect, close-on-exec
/// socket). A TCP host is tried at each address it resolves to, in order.
pub fn connect_stream(address: &SocketAddress) -> io::Result<Stream> {
    let fd = match address {
        SocketAddress::Path(_) | SocketAddress::Abstract(_) => OwnedFd::from(connect(address)?),
        SocketAddress::Tcp { .. } => {
            let mut last = io::Error::new(
                io::ErrorKind::NotFound,
                format!("{address} resolves to no address"),
            );
            let mut connected = None;
            for addr in address.resolve()? {
                let fd = stream_socket(inet_family(&addr))?;
                match net::connect(&fd, &addr) {
                    Ok(()) => {
                        connected = Some(fd);
                        break;
                    }
                    Err(e) => last = e.into(),
                }
            }
            connected.ok_or(last)?
        }
        &SocketAddress::Vsock { cid, port } => {
            let fd = stream_socket(AddressFamily::VSOCK)?;
            net::connect(&fd, &VsockAddr { cid, port })?;
            fd
        }
    };
    Stream::new(fd, address.family())
}

/// A connected stream socket of any [`Family`].
///
/// TCP streams have `TCP_NODELAY` set: the protocol is request/reply, and
/// small frames must not wait for the peer's delayed acknowledgements.
#[derive(Debug)]
pub struct Stream {
    fd: OwnedFd,
    family: Family,
}

impl Stream {
    fn new(fd: OwnedFd, family: Family) -> io::Result<Self> {
        if family == Family::Tcp {
            sockopt::set_tcp_nodelay(&fd, true)?;
        }
        Ok(Self { fd, family })
    }

    /// The kind of socket.
    pub fn family(&self) -> Family {
        self.family
    }

    /// Whether file descriptors can travel on it (UNIX sockets).
    pub fn passes_fds(&self) -> bool {
        self.family == Family::Unix
    }

    /// The peer's credentials (UNIX sockets; `None` for other families,
    /// whose peers have none the kernel vouches for).
    pub fn peer_credentials(&self) -> Option<io::Result<PeerCredentials>> {
        self.passes_fds().then(|| peer_credentials(&self.fd))
    }

    /// Makes reads and writes return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        rustix::io::ioctl_fionbio(&self.fd, nonblocking)?;
        Ok(())
    }

    /// The peer's host, without its port: an IPv4 address as `a.b.c.d`, an
    /// IPv6 one in brackets. `None` for UNIX and vsock streams (and if the
    /// kernel no longer knows the peer).
    pub fn peer_host(&self) -> Option<String> {
        if self.family != Family::Tcp {
            return None;
        }
        match SocketAddr::try_from(net::getpeername(&self.fd).ok()??).ok()? {
            SocketAddr::V4(a) => Some(a.ip().to_string()),
            SocketAddr::V6(a) => Some(format!("[{}]", a.ip())),
        }
    }

    /// Shuts down reading, writing or both: a thread blocked on the socket
    /// wakes up (its call fails or sees the end of the stream).
    pub fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        let how = match how {
            std::net::Shutdown::Read => net::Shutdown::Read,
            std::net::Shutdown::Write => net::Shutdown::Write,
            std::net::Shutdown::Both => net::Shutdown::Both,
        };
        Ok(net::shutdown(&self.fd, how)?)
    }

    /// A second handle on the same socket (a duplicated, close-on-exec
    /// descriptor), e.g. to shut it down from another thread.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            fd: self.fd.try_clone()?,
            family: self.family,
        })
    }
}

impl From<UnixStream> for Stream {
    fn from(s: UnixStream) -> Self {
        Self {
            fd: OwnedFd::from(s),
            family: Family::Unix,
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<Stream> for OwnedFd {
    fn from(s: Stream) -> Self {
        s.fd
    }
}

/// A close-on-exec stream socket of `family`.
fn stream_socket(family: AddressFamily) -> io::Result<OwnedFd> {
    Ok(net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

fn inet_family(addr: &SocketAddr) -> AddressFamily {
    match addr {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    }
}

/// The first address a TCP address resolves to.
fn first_address(address: &SocketAddress) -> io::Result<SocketAddr> {
    address.resolve()?.into_iter().next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{address} resolves to no address"),
        )
    })
}

/// A connected pair of close-on-exec stream sockets.
pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
    let (a, b) = net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    Ok((UnixStream::from(a), UnixStream::from(b)))
}

/// What one [`recv_into`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Bytes were added to the decoder.
    Data(usize),
    /// The peer closed the connection.
    Closed,
    /// Nothing to read now (non-blocking socket).
    WouldBlock,
}

/// Why a receive failed.
#[derive(Debug, Error)]
pub enum RecvError {
    /// The socket reported an error.
    #[error("recvmsg failed: {0}")]
    Io(#[from] io::Error),
    /// The kernel truncated the message or its control data (too many fds,
    /// or an fd the receiver is not allowed to use); its fds were closed.
    #[error("received message was truncated (MSG_TRUNC/MSG_CTRUNC)")]
    Truncated,
}

/// One `recvmsg` into `decoder`, keeping at most one received fd.
pub fn recv_into(socket: impl AsFd, decoder: &mut FrameDecoder) -> Result<Received, RecvError> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let buf = decoder.recv_buf();
    if buf.is_empty() {
        return Err(RecvError::Io(io::Error::other(
            "frame decoder not drained before receiving",
        )));
    }
    let msg = loop {
        match net::recvmsg(
            &socket,
            &mut [IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(msg) => break msg,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => return Ok(Received::WouldBlock),
            Err(e) => return Err(RecvError::Io(e.into())),
        }
    };
    if msg
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
    {
        // Dropping `control` closes whatever fds did arrive.
        return Err(RecvError::Truncated);
    }
    let mut fd = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for received in fds {
                if fd.is_none() {
                    fd = Some(received);
                } else {
                    log::warn!("closing an extra file descriptor received in one message");
                }
            }
        }
    }
    if msg.bytes == 0 {
        return Ok(Received::Closed);
    }
    decoder.commit(msg.bytes, fd);
    Ok(Received::Data(msg.bytes))
}

/// Sends as much of `queue` as the socket takes (`MSG_NOSIGNAL`). Returns
/// the number of bytes sent; the queue is empty unless the socket is
/// non-blocking and full (then wait for it to become writable).
pub fn send_queued(socket: impl AsFd, queue: &mut OutQueue) -> io::Result<usize> {
    let mut total = 0;
    while let Some(segment) = queue.next_send() {
        match send_with_fd(&socket, segment.bytes, segment.fd) {
            Ok(sent) => {
                queue.advance(sent);
                total += sent;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// One `sendmsg` of `bytes` (`MSG_NOSIGNAL`), with `fd` attached
/// (`SCM_RIGHTS`) if given: the number of bytes sent.
pub fn send_with_fd(
    socket: impl AsFd,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<usize> {
    let fds;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("control buffer too small for one fd"));
        }
    }
    Ok(net::sendmsg(
        &socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses_like_perfetto() {
        assert_eq!(
            SocketAddress::parse("/tmp/perfetto-producer"),
            Ok(SocketAddress::Path("/tmp/perfetto-producer".into()))
        );
        assert_eq!(
            SocketAddress::parse("@traced"),
            Ok(SocketAddress::Abstract(b"traced".to_vec()))
        );
        assert_eq!(SocketAddress::parse(""), Err(AddressError::Empty));
        assert_eq!(
            SocketAddress::parse("127.0.0.1:32278"),
            Ok(SocketAddress::Tcp {
                host: "127.0.0.1".into(),
                port: 32278
            })
        );
        assert_eq!(
            SocketAddress::parse("[::1]:80"),
            Ok(SocketAddress::Tcp {
                host: "::1".into(),
                port: 80
            })
        );
        assert_eq!(
            SocketAddress::parse("vsock://2:1234"),
            Ok(SocketAddress::Vsock { cid: 2, port: 1234 })
        );
        // Upstream reads these as TCP or vsock names; their numbers are out
        // of range.
        for bad in ["h:65536", "h:-1", ":80", "[::1:80"] {
            assert!(
                matches!(SocketAddress::parse(bad), Err(AddressError::Tcp(_))),
                "{bad}"
            );
        }
        for bad in ["vsock://2", "vsock://x:1", "vsock://2:-1"] {
            assert!(
                matches!(SocketAddress::parse(bad), Err(AddressError::Vsock(_))),
                "{bad}"
            );
        }
        for name in ["@x", "/a/b", "127.0.0.1:9", "[::1]:9", "vsock://3:9"] {
            assert_eq!(SocketAddress::parse(name).unwrap().to_string(), name);
        }
        assert!(SocketAddress::parse("127.0.0.1:1").unwrap().is_loopback());
        assert!(SocketAddress::parse("[::1]:1").unwrap().is_loopback());
        assert!(SocketAddress::parse("localhost:1").unwrap().is_loopback());
        assert!(!SocketAddress::parse("0.0.0.0:1").unwrap().is_loopback());
        assert!(!SocketAddress::parse("[::]:1").unwrap().is_loopback());
        assert!(!SocketAddress::parse("vsock://4294967295:1")
            .unwrap()
            .is_loopback());
        assert!(SocketAddress::parse("vsock://1:1").unwrap().is_loopback());
        assert!(!SocketAddress::parse("127.0.0.1:1").unwrap().passes_fds());
        // A colon without a number is just part of a path.
        assert!(matches!(
            SocketAddress::parse("/tmp/a:b"),
            Ok(SocketAddress::Path(_))
        ));
        assert!(matches!(
            SocketAddress::parse(&"x".repeat(107)),
            Err(AddressError::TooLong(_))
        ));
    }

    #[test]
    fn listens_and_connects_over_tcp_v4_and_v6() {
        for host in ["127.0.0.1", "[::1]"] {
            let any_port = SocketAddress::parse(&format!("{host}:0")).unwrap();
            let listener = match Listener::bind(&any_port) {
                Ok(l) => l,
                // A kernel without IPv6.
                Err(e) if host.starts_with('[') => {
                    eprintln!("skipping {host}: {e}");
                    continue;
                }
                Err(e) => panic!("{host}: {e}"),
            };
            let port = listener.local_port().unwrap();
            assert_ne!(port, 0);
            let addr = SocketAddress::parse(&format!("{host}:{port}")).unwrap();
            let client = connect_stream(&addr).unwrap();
            assert_eq!(client.family(), Family::Tcp);
            assert!(!client.passes_fds());
            let server = listener.accept_stream().unwrap();
            assert!(server.peer_credentials().is_none());
            assert_eq!(server.peer_host().as_deref(), Some(host));
            assert!(listener.accept().is_err(), "UnixStream only from UNIX");
            assert!(connect(&addr).is_err(), "connect is UNIX only");
            // Bytes go both ways through the frame machinery.
            let mut queue = OutQueue::default();
            queue
                .push_frame(&crate::protos::IpcFrame::default(), None)
                .unwrap();
            let sent = send_queued(&client, &mut queue).unwrap();
            assert!(sent > 0);
            let mut decoder = FrameDecoder::new();
            assert_eq!(
                recv_into(&server, &mut decoder).unwrap(),
                Received::Data(sent)
            );
        }
    }

    #[test]
    fn vsock_listens_where_the_kernel_has_vsock() {
        // Binding vsock's "any" context id needs only the vsock module;
        // connecting to ourselves would need vsock_loopback, which
        // machines without a hypervisor transport often lack.
        let addr = SocketAddress::parse("vsock://4294967295:0").unwrap();
        match Listener::bind(&addr) {
            Ok(l) => assert_eq!(l.address(), &addr),
            Err(e) => eprintln!("no vsock here: {e}"),
        }
    }

    #[test]
    fn peer_credentials_are_our_own_on_a_pair() {
        let (a, _b) = pair().unwrap();
        let cred = peer_credentials(&a).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(cred.uid, rustix::process::getuid().as_raw());
    }

    #[test]
    fn listens_and_connects_on_abstract_and_path_sockets() {
        let name = format!("@shmtrace-test-{}", std::process::id());
        let addr = SocketAddress::parse(&name).unwrap();
        let listener = Listener::bind(&addr).unwrap();
        let _client = connect(&addr).unwrap();
        let server = listener.accept().unwrap();
        assert_eq!(
            peer_credentials(&server).unwrap().pid,
            std::process::id() as i32
        );

        let dir = std::env::temp_dir().join(format!("shmtrace-sock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let addr = SocketAddress::Path(dir.join("s"));
        drop(Listener::bind(&addr).unwrap());
        // The stale socket file left behind is replaced.
        let listener = Listener::bind(&addr).unwrap();
        let _client = connect(&addr).unwrap();
        listener.accept().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_live_socket_is_not_taken_over_and_only_its_owner_removes_it() {
        let dir = std::env::temp_dir().join(format!("shmtrace-live-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let addr = SocketAddress::Path(dir.join("s"));
        let first = Listener::bind(&addr).unwrap();
        let err = Listener::bind(&addr).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(err.to_string().contains("live service"), "{err}");
        // The first listener still answers on its file.
        let _client = connect(&addr).unwrap();
        first.accept().unwrap();

        // Once the first is gone its file is stale: a second takes the path,
        // and the first's clean-up leaves the second's file alone.
        let stale = first;
        std::fs::remove_file(dir.join("s")).unwrap();
        let second = Listener::bind(&addr).unwrap();
        stale.remove_socket_file().unwrap();
        assert!(dir.join("s").exists());
        let _client = connect(&addr).unwrap();
        second.accept().unwrap();
        second.remove_socket_file().unwrap();
        assert!(!dir.join("s").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
