//! # shmtrace-ipc
//!
//! Perfetto's socket protocol and protocol messages, byte-compatible with the
//! real Perfetto (v59): the library part of `host-service/` that producers
//! (`shmtrace-producer`), consumers (the `shmtrace` CLI) and the tracing
//! service (`shmtrace-service`) all share. It is its own crate so that a
//! producer never compiles service internals and the `shmtrace` binary can
//! depend on the producer library (for `shmtrace demo`) without a cycle.
//!
//! * [`protos`] — the protocol messages (`perfetto.protos`, upstream's names
//!   and field numbers), compiled from `proto/` at build time with `protox`
//!   and `prost-build` (no system `protoc` needed), and the canonical encoder
//!   that reproduces the real Perfetto's bytes.
//!
//! The IPC layer proper:
//!
//! Layers, bottom up:
//!
//! * [`frame`]: length-prefixed framing. [`FrameDecoder`] decodes partial and
//!   coalesced reads incrementally and binds received fds to frames;
//!   [`encode_frame`](frame::encode_frame) writes Perfetto-identical bytes.
//! * [`outq`]: the send queue, which cuts the byte stream so that an fd rides
//!   on the first `sendmsg` of its frame.
//! * [`rpc`]: service and method descriptions (implemented for
//!   [`ProducerPort`](crate::protos::ProducerPort) and
//!   [`ConsumerPort`](crate::protos::ConsumerPort) by the build script).
//! * [`host`] and [`client`]: the two ends of the RPC protocol, sans-IO —
//!   they turn frames into calls or replies and back, with no sockets, so the
//!   service core can drive them from its own event loop and tests and the
//!   fuzzer can drive them from byte arrays.
//! * [`socket`]: the thin shell — addresses (`PERFETTO_*_SOCK_NAME`, paths,
//!   `@abstract`), listen/accept/connect, `recvmsg`/`sendmsg` with
//!   `SCM_RIGHTS`, `SO_PEERCRED`.
//! * [`connection`]: a ready-made blocking [`Client`] with a reader thread.
//!
//! Beside the socket, the memory both ends share:
//!
//! * [`shm`]: the shared memory buffer (SMB) of a connection — the service
//!   creates and seals a memfd, the producer adopts the fd it receives
//!   (or uses private memory under shmem emulation) — and the
//!   [`Smb`](shmtrace_abi::smb::Smb) view every access goes through.
//!
//! Nothing here panics on input from the peer: every malformation is an
//! error for that connection only.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod client;
pub mod connection;
pub mod frame;
pub mod host;
pub mod outq;
pub mod protos;
pub mod rpc;
pub mod shm;
pub mod socket;

pub use client::{ClientCore, ServiceBinding};
pub use connection::{Binding, Client, ClientError, PendingCall, ProtocolError, Response};
pub use frame::{FrameDecoder, FrameError, MAX_FRAME_LEN};
pub use host::{Call, HostConnection, PeerIdentity, PendingReply, ServiceTable};
pub use outq::OutQueue;
pub use shm::{Adoption, SharedMemory, ShmError};
pub use socket::{Listener, PeerCredentials, SocketAddress};

#[doc(hidden)]
pub mod fuzzing;
