//! The client side, sans-IO: request ids, the table of requests awaiting a
//! reply, service bindings, and the matching of replies to requests.
//!
//! [`ClientCore`] builds the frames to send ([`ClientCore::bind`],
//! [`ClientCore::invoke`]) and consumes received frames
//! ([`ClientCore::handle_frame`]), returning what each reply means for the
//! request it answers. Each outstanding request carries a caller-chosen
//! token `T` (a channel, a callback id, …) that comes back with its replies.
//!
//! Rules (Perfetto's client): request ids start at 1 and are shared by binds
//! and invocations; methods are invoked by name, resolved through the
//! binding's method table; a method the host did not list is an error for
//! the caller and nothing is sent; a reply with `has_more` keeps the request
//! registered; replies to unknown request ids are ignored. Unlike upstream,
//! a `RequestError` or a reply of the wrong kind fails the request instead of
//! leaving it pending forever.
//!
//! A request leaves the table with its final reply, or when its caller gives
//! up on it ([`ClientCore::cancel`]: the protocol has no cancel message, so
//! the host may go on answering it). Replies to ids that are not in the
//! table are ignored, as upstream does, but reported for counting: as
//! [`Incoming::Stale`] if this client issued the id (the request finished or
//! was cancelled), as [`Incoming::Unsolicited`] if it never did. Ids are
//! never reused, so telling the two apart needs no memory of past requests.

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use bytes::Bytes;
use thiserror::Error;

use super::frame::{bind_service_frame, invoke_method_frame, ReceivedFrame};
use crate::protos::ipc_frame::Msg;
use crate::protos::IpcFrame;

/// A bound service: its id on this connection and its method table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceBinding {
    name: String,
    service_id: u32,
    methods: HashMap<String, u32>,
}

impl ServiceBinding {
    /// The service name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The id the host assigned to the service.
    pub fn service_id(&self) -> u32 {
        self.service_id
    }

    /// The method id for `method`, if the host announced it.
    pub fn method_id(&self, method: &str) -> Option<u32> {
        self.methods.get(method).copied()
    }
}

/// Why a bind failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BindError {
    /// The host does not expose the service.
    #[error("the service does not expose {0:?}")]
    UnknownService(String),
    /// The host answered with a `RequestError`.
    #[error("the service refused to bind {service:?}: {error}")]
    RequestError {
        /// Service name.
        service: String,
        /// The host's message.
        error: String,
    },
    /// The host answered with something that is not a `BindServiceReply`.
    #[error("unexpected reply to BindService({0:?})")]
    UnexpectedReply(String),
}

/// Why a call failed on the host's side.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The host replied `success = false` (unknown method, bad arguments,
    /// or the service rejected the call).
    #[error("{0} was rejected by the service")]
    Rejected(String),
    /// The host answered with a `RequestError`.
    #[error("{method} failed: {error}")]
    RequestError {
        /// Method name.
        method: String,
        /// The host's message.
        error: String,
    },
    /// The host answered with something that is not an `InvokeMethodReply`.
    #[error("unexpected reply to {0}")]
    UnexpectedReply(String),
}

/// A method that cannot be invoked: the binding has no such method.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("service {service:?} has no method {method:?}")]
pub struct UnknownMethod {
    /// Service name.
    pub service: String,
    /// Method name.
    pub method: String,
}

/// One reply to an invocation.
#[derive(Debug)]
pub struct Reply {
    /// The serialized response, or why the call failed.
    pub result: Result<Bytes, RpcError>,
    /// More replies follow (streaming methods).
    pub has_more: bool,
    /// A descriptor that came with the reply.
    pub fd: Option<OwnedFd>,
}

/// What a received frame means for the request it answers.
#[derive(Debug)]
pub enum Incoming<T> {
    /// The answer to [`ClientCore::bind`].
    Bound {
        /// The request's token.
        token: T,
        /// The binding, or why there is none.
        result: Result<ServiceBinding, BindError>,
    },
    /// A reply to [`ClientCore::invoke`]. The request stays registered
    /// while `reply.has_more` (and `token` is a clone).
    Reply {
        /// The request id.
        request_id: u64,
        /// The request's token.
        token: T,
        /// The reply.
        reply: Reply,
    },
    /// A frame for a request this client issued that is no longer
    /// outstanding: it had its final reply, or was cancelled. Ignored (its
    /// descriptor, if any, is closed).
    Stale {
        /// The request id.
        request_id: u64,
    },
    /// A frame for a request id this client never issued (0, or past the
    /// last id). Ignored like upstream does (its descriptor, if any, is
    /// closed).
    Unsolicited {
        /// The request id.
        request_id: u64,
    },
}

#[derive(Debug)]
enum Pending<T> {
    Bind { service: String, token: T },
    Invoke { method: String, token: T },
}

/// Request bookkeeping of one client connection.
#[derive(Debug)]
pub struct ClientCore<T> {
    last_request_id: u64,
    pending: HashMap<u64, Pending<T>>,
}

impl<T> Default for ClientCore<T> {
    fn default() -> Self {
        Self {
            last_request_id: 0,
            pending: HashMap::new(),
        }
    }
}

impl<T: Clone> ClientCore<T> {
    /// No requests yet; the first gets id 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests awaiting a reply.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn next_id(&mut self) -> u64 {
        self.last_request_id += 1;
        self.last_request_id
    }

    /// A `BindService` frame for `service`; `token` comes back with the answer.
    pub fn bind(&mut self, service: &str, token: T) -> IpcFrame {
        let id = self.next_id();
        self.pending.insert(
            id,
            Pending::Bind {
                service: service.to_owned(),
                token,
            },
        );
        bind_service_frame(id, service)
    }

    /// An `InvokeMethod` frame calling `method` of `binding` with the
    /// serialized request `args`. With `reply: None` the host sends no reply
    /// (`drop_reply`); otherwise the token comes back with every reply.
    pub fn invoke(
        &mut self,
        binding: &ServiceBinding,
        method: &str,
        args: Bytes,
        reply: Option<T>,
    ) -> Result<(u64, IpcFrame), UnknownMethod> {
        let method_id = binding.method_id(method).ok_or_else(|| UnknownMethod {
            service: binding.name.clone(),
            method: method.to_owned(),
        })?;
        let id = self.next_id();
        let drop_reply = reply.is_none();
        if let Some(token) = reply {
            self.pending.insert(
                id,
                Pending::Invoke {
                    method: format!("{}.{method}", binding.name),
                    token,
                },
            );
        }
        Ok((
            id,
            invoke_method_frame(id, binding.service_id, method_id, args, drop_reply),
        ))
    }

    /// Matches a received frame to its request. Frames that answer nothing
    /// outstanding are [`Incoming::Stale`] or [`Incoming::Unsolicited`].
    pub fn handle_frame(&mut self, received: ReceivedFrame) -> Incoming<T> {
        let request_id = received.frame.request_id.unwrap_or(0);
        let Some(pending) = self.pending.remove(&request_id) else {
            return if request_id == 0 || request_id > self.last_request_id {
                log::debug!("dropping a frame for request id {request_id}, never issued");
                Incoming::Unsolicited { request_id }
            } else {
                log::debug!("dropping a frame for request id {request_id}, no longer outstanding");
                Incoming::Stale { request_id }
            };
        };
        match (pending, received.frame.msg) {
            (Pending::Bind { service, token }, Some(Msg::MsgBindServiceReply(reply))) => {
                let result = if reply.success.unwrap_or(false) {
                    Ok(ServiceBinding {
                        name: service,
                        service_id: reply.service_id.unwrap_or(0),
                        methods: reply
                            .methods
                            .into_iter()
                            .filter_map(|m| match (m.name, m.id) {
                                (Some(name), Some(id)) if !name.is_empty() && id > 0 => {
                                    Some((name, id))
                                }
                                _ => None,
                            })
                            .collect(),
                    })
                } else {
                    Err(BindError::UnknownService(service))
                };
                Incoming::Bound { token, result }
            }
            (Pending::Bind { service, token }, Some(Msg::MsgRequestError(e))) => Incoming::Bound {
                token,
                result: Err(BindError::RequestError {
                    service,
                    error: e.error.unwrap_or_default(),
                }),
            },
            (Pending::Bind { service, token }, _) => Incoming::Bound {
                token,
                result: Err(BindError::UnexpectedReply(service)),
            },
            (Pending::Invoke { method, token }, Some(Msg::MsgInvokeMethodReply(reply))) => {
                let has_more = reply.has_more.unwrap_or(false);
                let result = if reply.success.unwrap_or(false) {
                    Ok(reply.reply_proto.unwrap_or_default())
                } else {
                    Err(RpcError::Rejected(method.clone()))
                };
                if has_more {
                    let token = token.clone();
                    self.pending
                        .insert(request_id, Pending::Invoke { method, token });
                }
                Incoming::Reply {
                    request_id,
                    token,
                    reply: Reply {
                        result,
                        has_more,
                        fd: received.fd,
                    },
                }
            }
            (Pending::Invoke { method, token }, msg) => {
                let error = match msg {
                    Some(Msg::MsgRequestError(e)) => RpcError::RequestError {
                        method,
                        error: e.error.unwrap_or_default(),
                    },
                    _ => RpcError::UnexpectedReply(method),
                };
                Incoming::Reply {
                    request_id,
                    token,
                    reply: Reply {
                        result: Err(error),
                        has_more: false,
                        fd: received.fd,
                    },
                }
            }
        }
    }

    /// Forgets request `request_id`: its frame could not be sent, or its
    /// caller gave up on it. Later replies to it are [`Incoming::Stale`].
    /// Returns its token, if it was outstanding.
    pub fn cancel(&mut self, request_id: u64) -> Option<T> {
        self.pending.remove(&request_id).map(|p| match p {
            Pending::Bind { token, .. } | Pending::Invoke { token, .. } => token,
        })
    }

    /// Forgets every outstanding request (the connection is gone) and
    /// returns their tokens, so their callers can be told.
    pub fn disconnect(&mut self) -> Vec<T> {
        self.pending
            .drain()
            .map(|(_, p)| match p {
                Pending::Bind { token, .. } | Pending::Invoke { token, .. } => token,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{bind_service_reply_frame, invoke_method_reply_frame, request_error_frame};
    use crate::protos::ProducerPort;
    use crate::rpc::Service;

    fn received(frame: IpcFrame) -> ReceivedFrame {
        ReceivedFrame { frame, fd: None }
    }

    fn bound(core: &mut ClientCore<u32>) -> ServiceBinding {
        let id = core.bind("ProducerPort", 0).request_id.unwrap();
        match core.handle_frame(received(bind_service_reply_frame(
            id,
            Some((7, ProducerPort::METHODS)),
        ))) {
            Incoming::Bound { result: Ok(b), .. } => b,
            other => panic!("{other:?}"),
        }
    }

    /// A core with a bound service and a stream started with `token`.
    fn streaming(token: u32) -> (ClientCore<u32>, ServiceBinding, u64) {
        let mut core = ClientCore::new();
        let b = bound(&mut core);
        let (id, _) = core
            .invoke(&b, "GetAsyncCommand", Bytes::new(), Some(token))
            .unwrap();
        (core, b, id)
    }

    #[test]
    fn binds_and_invokes_by_name() {
        let mut core = ClientCore::new();
        let b = bound(&mut core);
        assert_eq!((b.service_id(), b.method_id("CommitData")), (7, Some(4)));
        let (id, frame) = core
            .invoke(&b, "GetAsyncCommand", Bytes::new(), Some(5))
            .unwrap();
        assert_eq!(id, 2);
        match frame.msg {
            Some(Msg::MsgInvokeMethod(m)) => {
                assert_eq!(
                    (m.service_id, m.method_id, m.drop_reply),
                    (Some(7), Some(5), Some(false))
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            core.invoke(&b, "NoSuchMethod", Bytes::new(), Some(1)),
            Err(UnknownMethod {
                service: "ProducerPort".into(),
                method: "NoSuchMethod".into()
            })
        );
        let (id, _) = core.invoke(&b, "CommitData", Bytes::new(), None).unwrap();
        assert_eq!(id, 3);
        assert_eq!(core.pending(), 1, "drop_reply calls are not tracked");
    }

    #[test]
    fn streams_stay_registered_until_the_last_reply() {
        let (mut core, _, id) = streaming(9);
        for has_more in [true, true, false] {
            let frame = invoke_method_reply_frame(id, Ok(Bytes::from_static(b"x")), has_more);
            match core.handle_frame(received(frame)) {
                Incoming::Reply {
                    token: 9, reply, ..
                } => {
                    assert_eq!(reply.result.unwrap(), Bytes::from_static(b"x"));
                    assert_eq!(reply.has_more, has_more);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(core.pending(), 0);
        let late = invoke_method_reply_frame(id, Ok(Bytes::new()), false);
        assert!(
            matches!(
                core.handle_frame(received(late)),
                Incoming::Stale { request_id } if request_id == id
            ),
            "replies to finished requests are dropped"
        );
    }

    #[test]
    fn failures_reach_the_caller() {
        let mut core = ClientCore::new();
        core.bind("Nope", 1);
        assert!(matches!(
            core.handle_frame(received(bind_service_reply_frame(1, None))),
            Incoming::Bound {
                result: Err(BindError::UnknownService(_)),
                ..
            }
        ));
        let b = bound(&mut core);
        let (id, _) = core.invoke(&b, "Sync", Bytes::new(), Some(2)).unwrap();
        match core.handle_frame(received(invoke_method_reply_frame(id, Err(()), false))) {
            Incoming::Reply { reply, .. } => {
                assert_eq!(
                    reply.result,
                    Err(RpcError::Rejected("ProducerPort.Sync".into()))
                )
            }
            other => panic!("{other:?}"),
        }
        let (id, _) = core.invoke(&b, "Sync", Bytes::new(), Some(3)).unwrap();
        match core.handle_frame(received(request_error_frame(id, "boom"))) {
            Incoming::Reply { reply, .. } => {
                assert!(matches!(reply.result, Err(RpcError::RequestError { .. })))
            }
            other => panic!("{other:?}"),
        }
        let (_, _) = core.invoke(&b, "Sync", Bytes::new(), Some(4)).unwrap();
        assert_eq!(core.disconnect(), [4]);
    }

    #[test]
    fn cancelled_requests_are_stale_and_ids_never_issued_unsolicited() {
        let (mut core, b, id) = streaming(9);
        assert_eq!(core.cancel(id), Some(9));
        assert_eq!(core.pending(), 0);
        for has_more in [true, false, true] {
            let frame = invoke_method_reply_frame(id, Ok(Bytes::new()), has_more);
            let incoming = core.handle_frame(received(frame));
            assert!(
                matches!(incoming, Incoming::Stale { request_id } if request_id == id),
                "a cancelled request stays cancelled: {incoming:?}"
            );
        }
        assert_eq!(core.pending(), 0);
        for never in [0, id + 1, u64::MAX] {
            let frame = invoke_method_reply_frame(never, Ok(Bytes::new()), false);
            let incoming = core.handle_frame(received(frame));
            assert!(
                matches!(incoming, Incoming::Unsolicited { request_id } if request_id == never),
                "id {never}: {incoming:?}"
            );
        }
        // Unaffected: the next request gets the next id, and its reply.
        let (next, _) = core.invoke(&b, "Sync", Bytes::new(), Some(3)).unwrap();
        assert_eq!(next, id + 1);
        let frame = invoke_method_reply_frame(next, Ok(Bytes::new()), false);
        assert!(matches!(
            core.handle_frame(received(frame)),
            Incoming::Reply { token: 3, .. }
        ));
    }
}
