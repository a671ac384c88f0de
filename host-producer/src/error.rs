//! Error types.

use std::io;
use std::time::Duration;

use shmtrace_abi::smb::SmbError;
use shmtrace_ipc::ClientError;
use thiserror::Error;

/// The shared memory buffer the service offered could not be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SmbSetupError {
    /// The page size is not a multiple of 4096 in 4096..=65536.
    #[error("invalid SMB page size {0} bytes")]
    BadPageSize(usize),
    /// The size is zero, not a multiple of the page size, or above 32 MiB.
    #[error("invalid SMB size {0} bytes")]
    BadSize(usize),
    /// The SMB fd has no seals to read: it is not a memfd (a pipe, a
    /// directory, a file on disk, …), so nothing stops the service from
    /// shrinking it under the mapping.
    #[error("the SMB fd is not a sealable memfd: {0}")]
    NotMemfd(#[source] io::Error),
    /// The SMB memfd is not sealed against shrinking and cannot be sealed
    /// (created without `MFD_ALLOW_SEALING`, or `F_SEAL_SEAL` is set):
    /// the service could shrink it under the mapping, and a write past the
    /// new end would kill the program with `SIGBUS`.
    #[error("the SMB memfd is not sealed against shrinking and cannot be sealed: {0}")]
    NotSealed(#[source] io::Error),
    /// `fstat` on the SMB fd failed.
    #[error("cannot stat the SMB fd: {0}")]
    Stat(#[source] io::Error),
    /// `mmap` of the SMB fd failed.
    #[error("cannot map the SMB: {0}")]
    Map(#[source] io::Error),
    /// Private SMB memory could not be allocated.
    #[error("cannot allocate {0} bytes of SMB memory")]
    OutOfMemory(usize),
    /// The mapping does not form a valid SMB.
    #[error("invalid SMB geometry: {0}")]
    Geometry(SmbError),
}

/// A data source could not be registered.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// Data source names must not be empty.
    #[error("a data source name must not be empty")]
    EmptyName,
    /// A data source with this name is already registered by this process.
    #[error("data source {0:?} is already registered")]
    AlreadyRegistered(String),
}

/// The producer could not be started or lost its connection.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The socket name cannot be used.
    #[error("invalid producer socket name: {0}")]
    Address(#[source] shmtrace_ipc::socket::AddressError),
    /// [`init`](crate::init) was already called in this process.
    #[error("the producer is already initialized")]
    AlreadyInitialized,
    /// The background thread could not be started.
    #[error("cannot start the producer thread")]
    Thread,
    /// The service set up tracing without sending the SMB fd (and without
    /// asking for shmem emulation).
    #[error("the service sent SetupTracing without a shared memory buffer")]
    NoSmb,
    /// The service's SMB could not be used.
    #[error(transparent)]
    Smb(#[from] SmbSetupError),
    /// The service sent a second `SetupTracing` on one connection (it sets
    /// up one SMB per producer; upstream's producer aborts on this).
    #[error("the service sent SetupTracing twice on one connection")]
    SetupTracingTwice,
    /// No service listens at the socket (the usual case when tracing is
    /// not in use): retried in the background.
    #[error("cannot connect: {0}")]
    Unreachable(#[source] io::Error),
    /// The service accepted the connection but did not complete the
    /// handshake (bind, `InitializeConnection`, `GetAsyncCommand`) in time.
    #[error("the service did not complete the handshake within {0:?}")]
    HandshakeTimeout(Duration),
    /// The service stopped reading: one message to it was still not
    /// accepted by the socket after this long (upstream's service gives
    /// its own sends 10 s too).
    #[error("the service stopped reading: a message to it was not sent within {0:?}")]
    SendStalled(Duration),
    /// The service ended the `GetAsyncCommand` stream.
    #[error("the service ended the command stream")]
    CommandStreamEnded,
    /// The connection failed: closed by the service
    /// ([`ClientError::Disconnected`], ordinary), or the service broke the
    /// protocol (a malformed frame or a close mid-frame:
    /// [`ClientError::Protocol`]; a reply that does not decode, a rejected
    /// call).
    #[error("connection to the service failed: {0}")]
    Ipc(#[source] ClientError),
    /// The buffer of [`StartupTracing`](crate::StartupTracing) could not
    /// be made.
    #[error("cannot make the startup tracing buffer: {0}")]
    StartupBuffer(#[source] SmbSetupError),
}

impl ConnectError {
    /// `true` for the ordinary ways a connection ends or cannot start (no
    /// service, the service closed it); `false` when the service broke the
    /// protocol or sent something unusable (logged as a warning).
    pub fn is_ordinary(&self) -> bool {
        matches!(
            self,
            ConnectError::Unreachable(_)
                | ConnectError::CommandStreamEnded
                | ConnectError::Ipc(ClientError::Disconnected)
        )
    }
}
