//! Error types.

use std::io;
use std::time::Duration;

use shmtrace_ipc::shm::ShmError;
use shmtrace_ipc::ClientError;
use thiserror::Error;

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
    /// The service's SMB could not be used: not a memfd, one that could
    /// shrink, or not a valid SMB of the page size it announced.
    #[error(transparent)]
    Smb(#[from] ShmError),
    /// The service sent a second `SetupTracing` on one connection (it sets
    /// up one SMB per producer; upstream's producer aborts on this).
    #[error("the service sent SetupTracing twice on one connection")]
    SetupTracingTwice,
    /// No service listens at the socket (the usual case when tracing is
    /// not in use): retried in the background.
    #[error(
        "cannot connect to the tracing service at {address}: {source} (is it running? the \
         socket comes from ProducerConfig::socket, else PERFETTO_PRODUCER_SOCK_NAME)"
    )]
    Unreachable {
        /// The producer socket tried.
        address: String,
        /// Why the connection failed.
        #[source]
        source: io::Error,
    },
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
    StartupBuffer(#[source] ShmError),
}

impl ConnectError {
    /// `true` for the ordinary ways a connection ends or cannot start (no
    /// service, the service closed it); `false` when the service broke the
    /// protocol or sent something unusable (logged as a warning).
    pub fn is_ordinary(&self) -> bool {
        matches!(
            self,
            ConnectError::Unreachable { .. }
                | ConnectError::CommandStreamEnded
                | ConnectError::Ipc(ClientError::Disconnected)
        )
    }
}
