//! The IPC layer: Perfetto's socket protocol, byte-compatible with the real
//! Perfetto (v59).
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
//! Nothing here panics on input from the peer: every malformation is an
//! error for that connection only.

pub mod client;
pub mod connection;
pub mod frame;
pub mod host;
pub mod outq;
pub mod rpc;
pub mod socket;

pub use client::{ClientCore, ServiceBinding};
pub use connection::{Binding, Client, ClientError, PendingCall, Response};
pub use frame::{FrameDecoder, FrameError, MAX_FRAME_LEN};
pub use host::{Call, HostConnection, PendingReply, ServiceTable};
pub use outq::OutQueue;
pub use socket::{Listener, PeerCredentials, SocketAddress};
