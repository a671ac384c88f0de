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

/// The protocol state of one client connection.
pub struct HostConnection<R> {
    table: Arc<ServiceTable<R>>,
    decoder: FrameDecoder,
    out: OutQueue,
    peer: Option<PeerCredentials>,
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
                // Only meaningful on non-UNIX transports, which this host does
                // not serve: identities come from SO_PEERCRED.
                Some(Msg::SetPeerIdentity(_)) => {
                    log::debug!("ignoring SetPeerIdentity on a UNIX socket")
                }
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
