//! Error types.

use std::io;

use shmtrace_abi::smb::SmbError;
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
}
