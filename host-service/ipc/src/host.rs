//! The host side (the service end of a socket), sans-IO.
//!
//! A [`ServiceTable`] lists the services exposed on one socket; service ids
//! are 1, 2, … in the order they were added, as Perfetto assigns them. Each
//! accepted connection gets a [`HostConnection`], which is fed received bytes
//! and turns them into [`Call`]s, answering on its own everything that is not
//! a call: `BindService` (method table, or an empty reply for an unknown
//! name), invocations it cannot dispatch (unknown service or method id,
//! undecodable arguments: `success = false`, as upstream, even with
//! `drop_reply`), and frames that are not requests (`RequestError`).
//!
//! A call is answered through its [`PendingReply`], which can be kept as long
//! as needed (deferred replies, streams): [`HostConnection::reply`] with
//! `has_more` for stream items, [`HostConnection::resolve`] and
//! [`HostConnection::reject`] to finish. With `drop_reply` nothing is sent.
//! Replies are queued in the connection's [`OutQueue`]; the socket shell
//! drains it.
//!
//! A connection over a transport without kernel-checked credentials (TCP,
//! vsock; [`HostConnection::remote`]) honours the first `SetPeerIdentity`
//! frame: a relay forwarding a producer of another machine says who that
//! producer is and which machine it runs on. The identity is a claim, as
//! upstream takes it (`HostImpl::OnSetPeerIdentity`, src/ipc/host_impl.cc):
//! whoever can connect can claim any. On a UNIX socket the frame is
//! ignored; there the kernel says who the peer is.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use bytes::Bytes;
use thiserror::Error;

use super::frame::{
    bind_service_reply_frame, invalid_invocation_frame, invoke_method_reply_frame,
    request_error_frame, FrameDecoder, FrameError, FrameTooLarge,
};
use super::outq::OutQueue;
use super::rpc::{MethodDescriptor, RequestDecodeError, Service, ServiceRequest};
use super::socket::PeerCredentials;
use crate::protos::canonical;
use crate::protos::ipc_frame::Msg;
use crate::protos::schema::ProtoSchema;
use crate::protos::IpcFrame;

type DecodeFn<R> = Box<dyn Fn(u32, Bytes) -> Result<R, RequestDecodeError> + Send + Sync>;

struct Exposed<R> {
    name: &'static str,
    methods: &'static [MethodDescriptor],
    decode: DecodeFn<R>,
}

/// The services exposed on one socket, shared by its connections.
///
/// `R` is the type of a decoded request of any of them (for a single service
/// `S`, simply `S::Request`).
pub struct ServiceTable<R> {
    services: Vec<Exposed<R>>,
}

impl<R> std::fmt::Debug for ServiceTable<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.services.iter().map(|s| s.name))
            .finish()
    }
}

impl<R: 'static> ServiceTable<R> {
    /// A table with no services.
    pub fn new() -> Self {
        Self {
            services: Vec::new(),
        }
    }

    /// Exposes service `S` with the next service id; its requests are
    /// converted to `R` by `wrap`.
    pub fn expose<S: Service>(mut self, wrap: fn(S::Request) -> R) -> Self {
        self.services.push(Exposed {
            name: S::NAME,
            methods: S::METHODS,
            decode: Box::new(move |method_id, args| S::Request::decode(method_id, args).map(wrap)),
        });
        self
    }

    fn by_name(&self, name: &str) -> Option<(u32, &Exposed<R>)> {
        let index = self.services.iter().position(|s| s.name == name)?;
        Some((u32::try_from(index + 1).ok()?, self.services.get(index)?))
    }

    fn by_id(&self, id: u32) -> Option<&Exposed<R>> {
        self.services.get(usize::try_from(id).ok()?.checked_sub(1)?)
    }
}

impl<R: 'static> Default for ServiceTable<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Service> From<S> for ServiceTable<S::Request> {
    /// A table exposing only `S` (service id 1).
    fn from(_: S) -> Self {
        ServiceTable::new().expose::<S>(|r| r)
    }
}

/// How to answer one call. Plain data: keep it for deferred replies and
/// streams; it is only meaningful on the connection the call came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingReply {
    request_id: u64,
    drop_reply: bool,
}

impl PendingReply {
    /// The handle for request `request_id` (for code that drives a service
    /// core without a socket: simulations and tests).
    pub fn new(request_id: u64, drop_reply: bool) -> Self {
        Self {
            request_id,
            drop_reply,
        }
    }

    /// The client's request id.
    pub fn request_id(&self) -> u64 {
        self.request_id
    }

    /// Whether the client asked for no reply.
    pub fn drop_reply(&self) -> bool {
        self.drop_reply
    }
}

/// A decoded method call.
#[derive(Debug)]
pub struct Call<R> {
    /// The decoded request.
    pub request: R,
    /// The service id the client invoked.
    pub service_id: u32,
    /// The method invoked.
    pub method: &'static MethodDescriptor,
    /// How to answer.
    pub reply: PendingReply,
    /// A descriptor the client attached to this call's frame.
    pub fd: Option<OwnedFd>,
}

impl<R> Call<R> {
    /// The request, and the same call carrying `request` instead (to hand
    /// a call decoded as a socket's combined request type to the handler
    /// of one service).
    pub fn replace<S>(self, request: S) -> (R, Call<S>) {
        let call = Call {
            request,
            service_id: self.service_id,
            method: self.method,
            reply: self.reply,
            fd: self.fd,
        };
        (self.request, call)
    }
}

impl<R: ServiceRequest> Call<R> {
    /// The call a client's `InvokeMethod` for `request` (request id
    /// `request_id`, a reply wanted) on service `service_id` decodes to, for
    /// code that drives a service core without a socket: simulations,
    /// fuzzing, benchmarks.
    pub fn new(request: R, service_id: u32, request_id: u64, fd: Option<OwnedFd>) -> Self {
        let method = request.method();
        Call {
            request,
            service_id,
            method,
            reply: PendingReply::new(request_id, false),
            fd,
        }
    }
}

/// Why a connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum HostError {
    /// The byte stream is not a valid frame sequence.
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// What a relay says about the producer (or relay) it forwards, in a
/// `SetPeerIdentity` frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The peer's pid on its machine (0 if not given).
    pub pid: i32,
    /// The peer's uid on its machine.
    pub uid: i32,
    /// What identifies the peer's machine (upstream's relay sends the boot
    /// id); empty: the service uses the connection's address.
    pub machine_id_hint: String,
    /// The machine's name, as data sources' `machine_name_filter` matches it.
    pub machine_name: String,
}

/// The machine id a service assigns to a relayed peer: the low 32 bits of
/// the 64-bit FNV-1a hash of `hint`, or, if `hint` is empty, of the peer's
/// address without its port (`peer_host`); 0, which stands for the
/// service's own machine, becomes 1 (upstream's `GenerateMachineID`,
/// src/ipc/host_impl.cc).
pub fn machine_id(hint: &str, peer_host: &str) -> u32 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let key = if hint.is_empty() { peer_host } else { hint };
    let hash = key.bytes().fold(FNV_OFFSET, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
    });
    match hash as u32 {
        0 => 1,
        id => id,
    }
}

/// Whether and how a connection takes a `SetPeerIdentity`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum IdentityState {
    /// A UNIX socket: ignored.
    Kernel,
    /// A remote transport that has not said yet.
    Awaiting,
    /// Received, not yet taken by the shell.
    Received(PeerIdentity),
    /// Taken; later ones are ignored.
    Taken,
}

/// The protocol state of one client connection.
pub struct HostConnection<R> {
    table: Arc<ServiceTable<R>>,
    decoder: FrameDecoder,
    out: OutQueue,
    peer: Option<PeerCredentials>,
    identity: IdentityState,
}

impl<R> std::fmt::Debug for HostConnection<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostConnection")
            .field("services", &self.table)
            .field("buffered_in", &self.decoder.buffered())
            .field("queued_out", &self.out.len())
            .field("peer", &self.peer)
            .finish()
    }
}

impl<R: 'static> HostConnection<R> {
    /// A new connection exposing `table`, from a peer with credentials `peer`
    /// (`SO_PEERCRED`, see [`socket::peer_credentials`](super::socket::peer_credentials)).
    pub fn new(table: Arc<ServiceTable<R>>, peer: Option<PeerCredentials>) -> Self {
        Self {
            table,
            decoder: FrameDecoder::new(),
            out: OutQueue::new(),
            peer,
            identity: IdentityState::Kernel,
        }
    }

    /// A new connection over a transport without peer credentials (TCP,
    /// vsock): it takes the first `SetPeerIdentity` frame (see
    /// [`take_peer_identity`](Self::take_peer_identity)).
    pub fn remote(table: Arc<ServiceTable<R>>) -> Self {
        Self {
            identity: IdentityState::Awaiting,
            ..Self::new(table, None)
        }
    }

    /// The identity a `SetPeerIdentity` frame announced, once: the frames
    /// before the call [`poll_call`](Self::poll_call) just returned (or
    /// before it ran out of frames) included it. Take it before handling
    /// that call, so that the call is handled as coming from that peer.
    pub fn take_peer_identity(&mut self) -> Option<PeerIdentity> {
        match std::mem::replace(&mut self.identity, IdentityState::Taken) {
            IdentityState::Received(identity) => Some(identity),
            other => {
                self.identity = other;
                None
            }
        }
    }

    /// The peer's credentials, if known.
    pub fn peer(&self) -> Option<PeerCredentials> {
        self.peer
    }

    /// The frame decoder (receive into it, see [`FrameDecoder::recv_buf`]).
    pub fn decoder(&mut self) -> &mut FrameDecoder {
        &mut self.decoder
    }

    /// The queue of outgoing bytes (drain it into the socket).
    pub fn out(&mut self) -> &mut OutQueue {
        &mut self.out
    }

    /// The next call, after handling every frame before it that the host
    /// answers itself. `Ok(None)`: more bytes are needed. An error is fatal:
    /// log it and close the connection.
    pub fn poll_call(&mut self) -> Result<Option<Call<R>>, HostError> {
        loop {
            let received = match self.decoder.next_frame() {
                Ok(Some(received)) => received,
                Ok(None) => return Ok(None),
                Err(e) => {
                    let pid = self.peer.map_or(0, |p| p.pid);
                    log::warn!("closing the connection of pid {pid}: {e}");
                    return Err(e.into());
                }
            };
            let request_id = received.frame.request_id.unwrap_or(0);
            match received.frame.msg {
                Some(Msg::MsgBindService(bind)) => {
                    let name = bind.service_name.unwrap_or_default();
                    let bound = self.table.by_name(&name).map(|(id, s)| (id, s.methods));
                    if bound.is_none() {
                        log::info!("client bound unknown service {name:?}");
                    }
                    self.queue(&bind_service_reply_frame(request_id, bound), None);
                }
                Some(Msg::MsgInvokeMethod(invoke)) => {
                    let service_id = invoke.service_id.unwrap_or(0);
                    let method_id = invoke.method_id.unwrap_or(0);
                    let args = invoke.args_proto.unwrap_or_default();
                    let decoded = self
                        .table
                        .by_id(service_id)
                        .ok_or(RequestDecodeError::UnknownMethod(method_id))
                        .and_then(|s| {
                            let method = method_id
                                .checked_sub(1)
                                .and_then(|i| s.methods.get(i as usize))
                                .ok_or(RequestDecodeError::UnknownMethod(method_id))?;
                            Ok((method, (s.decode)(method_id, args)?))
                        });
                    match decoded {
                        Ok((method, request)) => {
                            return Ok(Some(Call {
                                request,
                                service_id,
                                method,
                                reply: PendingReply {
                                    request_id,
                                    drop_reply: invoke.drop_reply.unwrap_or(false),
                                },
                                fd: received.fd,
                            }));
                        }
                        Err(e) => {
                            log::info!("rejecting invocation of service {service_id} method {method_id}: {e}");
                            self.queue(&invalid_invocation_frame(request_id), None);
                        }
                    }
                }
                Some(Msg::SetPeerIdentity(announced)) => match self.identity {
                    IdentityState::Awaiting => {
                        self.identity = IdentityState::Received(PeerIdentity {
                            pid: announced.pid.unwrap_or(0),
                            uid: announced.uid.unwrap_or(0),
                            machine_id_hint: announced.machine_id_hint.unwrap_or_default(),
                            machine_name: announced.machine_name.unwrap_or_default(),
                        });
                    }
                    IdentityState::Kernel => {
                        log::debug!("ignoring SetPeerIdentity on a UNIX socket")
                    }
                    IdentityState::Received(_) | IdentityState::Taken => {
                        log::debug!("ignoring a second SetPeerIdentity")
                    }
                },
                _ => self.queue(&request_error_frame(request_id, "unknown request"), None),
            }
        }
    }

    /// Sends one reply to `to`: `Ok(msg)` succeeds, `Err(())` rejects;
    /// `has_more` keeps a stream open. `fd` rides along (Perfetto's
    /// SetupTracing carries the shared memory this way).
    pub fn reply<M: ProtoSchema>(
        &mut self,
        to: &PendingReply,
        reply: Result<&M, ()>,
        has_more: bool,
        fd: Option<OwnedFd>,
    ) -> Result<(), FrameTooLarge> {
        if to.drop_reply {
            return Ok(());
        }
        let reply = reply.map(|m| Bytes::from(canonical::encode(m)));
        self.out.push_frame(
            &invoke_method_reply_frame(to.request_id, reply, has_more),
            fd,
        )
    }

    /// Sends the final successful reply to `to`.
    pub fn resolve<M: ProtoSchema>(
        &mut self,
        to: PendingReply,
        msg: &M,
    ) -> Result<(), FrameTooLarge> {
        self.reply(&to, Ok(msg), false, None)
    }

    /// Fails the call (or ends a stream with a failure).
    pub fn reject(&mut self, to: PendingReply) {
        if !to.drop_reply {
            self.queue(
                &invoke_method_reply_frame(to.request_id, Err(()), false),
                None,
            );
        }
    }

    fn queue(&mut self, frame: &IpcFrame, fd: Option<OwnedFd>) {
        // The host's own frames are tiny; a failure here would be a bug.
        if let Err(e) = self.out.push_frame(frame, fd) {
            log::error!("dropping an oversized host frame: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{bind_service_frame, encode_frame, set_peer_identity_frame};
    use crate::protos::ProducerPort;

    #[test]
    fn machine_ids_are_fnv1a_of_the_hint_or_the_peer() {
        // FNV-1a 64 test vectors: "" is the offset basis, "a" 0xaf63dc4c8601ec8c.
        assert_eq!(machine_id("", ""), 0x8422_2325);
        assert_eq!(machine_id("a", "10.0.0.1"), 0x8601_ec8c);
        assert_eq!(machine_id("", "a"), 0x8601_ec8c);
        assert_ne!(machine_id("boot-1", ""), machine_id("boot-2", ""));
    }

    fn bytes(frames: &[IpcFrame]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            encode_frame(f, &mut out).unwrap();
        }
        out
    }

    fn identity(hint: &str) -> PeerIdentity {
        PeerIdentity {
            pid: 42,
            uid: 1000,
            machine_id_hint: hint.into(),
            machine_name: "vm".into(),
        }
    }

    #[test]
    fn a_remote_connection_takes_the_first_identity_only() {
        let table = Arc::new(ServiceTable::from(ProducerPort));
        let mut host = HostConnection::remote(table);
        let input = bytes(&[
            set_peer_identity_frame(&identity("first")),
            set_peer_identity_frame(&identity("second")),
            bind_service_frame(1, "ProducerPort"),
        ]);
        host.decoder().push(&input, None);
        assert!(host.poll_call().unwrap().is_none());
        assert_eq!(host.take_peer_identity(), Some(identity("first")));
        assert_eq!(host.take_peer_identity(), None);
        // The bind was answered, the identities were not.
        assert!(!host.out().is_empty());
        host.decoder()
            .push(&bytes(&[set_peer_identity_frame(&identity("third"))]), None);
        assert!(host.poll_call().unwrap().is_none());
        assert_eq!(host.take_peer_identity(), None);
    }

    #[test]
    fn the_fuzz_entry_takes_identities_and_relay_calls() {
        use crate::frame::invoke_method_frame;
        use crate::protos::SyncClockRequest;
        // Two identities, then a SyncClock on the relay port (service 3 of
        // the fuzz entry's host): decoded, re-encoded, one identity taken.
        let args = Bytes::from(canonical::encode(&SyncClockRequest::default()));
        let mut input = vec![60];
        input.extend(bytes(&[
            set_peer_identity_frame(&identity("a")),
            set_peer_identity_frame(&identity("b")),
            bind_service_frame(1, "RelayPort"),
            invoke_method_frame(2, 3, 2, args, false),
        ]));
        crate::fuzzing::ipc_frame(&input);
    }

    #[test]
    fn a_unix_connection_ignores_identities() {
        let table = Arc::new(ServiceTable::from(ProducerPort));
        let mut host = HostConnection::new(table, None);
        host.decoder()
            .push(&bytes(&[set_peer_identity_frame(&identity("x"))]), None);
        assert!(host.poll_call().unwrap().is_none());
        assert_eq!(host.take_peer_identity(), None);
        assert!(host.out().is_empty(), "no reply to an identity");
    }
}
