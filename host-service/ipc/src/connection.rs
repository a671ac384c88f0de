//! A blocking client connection with a background reader thread: what the
//! producer library and the command-line consumer use.
//!
//! ```no_run
//! use shmtrace_ipc::{Client, SocketAddress};
//! use shmtrace_ipc::protos::{producer_port, InitializeConnectionRequest, ProducerPort};
//!
//! let client = Client::connect(&SocketAddress::parse("/tmp/perfetto-producer")?)?;
//! let port = client.bind::<ProducerPort>()?;
//! let reply = port.call::<producer_port::InitializeConnection>(&InitializeConnectionRequest {
//!     producer_name: Some("example".into()),
//!     ..Default::default()
//! })?;
//! # let _ = reply;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Threads: the reader thread owns the receive side (decoder, `recvmsg`) and
//! takes the request-table lock only to match a frame to its request; callers
//! take the send lock to queue and send their frame. The reader never waits
//! for the send lock, so a caller blocked on a full socket cannot stop
//! replies from being read. Each request's replies go to its own queue.
//!
//! # Backpressure
//!
//! The reader waits while the queue it delivers to holds
//! [`REPLY_QUEUE_DEPTH`] replies, so it stops reading the socket and a
//! service flooding a call its caller reads slowly blocks its own sends
//! instead of growing the client's memory and descriptors. This cannot
//! deadlock: the reader waits only while no caller waits — a caller that
//! finds its own queue empty either waits (counted) or returns at once
//! (noted), and either may need a reply the socket holds behind the full
//! queue's, so the reader then delivers past the depth (up to
//! [`REPLY_QUEUE_LIMIT`]) and reads on. A caller waiting on the full queue
//! itself is never the case: it takes a reply instead. So a connection
//! whose only waiting caller reads the flooded call (the producer's
//! command stream) holds at most [`REPLY_QUEUE_DEPTH`] of its replies.
//!
//! # Dropped calls
//!
//! Dropping a call ([`PendingCall`], [`RawCall`]) before its final reply
//! cancels it: its request leaves the request table and its queue goes, with
//! the replies and descriptors it held. The protocol cannot tell the service,
//! so replies to it may go on arriving; the reader reads and drops them like
//! any reply to a request no longer outstanding, never waiting for room for
//! them, so an abandoned call, even a stream the service keeps feeding, holds
//! up no other call. [`Client::discarded_replies`] counts every reply so
//! dropped.
//!
//! Ends: a close by the service is [`ClientError::Disconnected`]; a frame
//! that does not decode, a close in the middle of a frame or a truncated
//! message is [`ClientError::Protocol`], with the reason, for every call
//! outstanding and every later one.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::marker::PhantomData;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use thiserror::Error;

use super::client::{
    BindError, ClientCore, Incoming, Reply, RpcError, ServiceBinding, UnknownMethod,
};
use super::frame::{FrameDecoder, FrameError, FrameTooLarge};
use super::outq::OutQueue;
use super::rpc::{Method, Service};
use super::socket::{self, Received, RecvError, SocketAddress, Stream};
use crate::protos::canonical;
use crate::protos::IpcFrame;

/// Replies one call may have waiting before the reader stops reading the
/// socket (the service's sends then block): deep enough that a caller
/// that keeps up never stalls the reader, shallow enough that a service
/// flooding a call its caller reads slowly costs little memory and at
/// most this many received descriptors.
pub const REPLY_QUEUE_DEPTH: usize = 64;

/// Replies one call may have waiting while its caller does not read it and
/// another caller waits for a reply of its own (the reader must then read
/// on, see the module docs). Past it the call fails with
/// [`ClientError::Overrun`] and its further replies are dropped.
pub const REPLY_QUEUE_LIMIT: usize = 16 * REPLY_QUEUE_DEPTH;

/// Why a client operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting, sending or receiving failed.
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    /// The connection is closed (by either side).
    #[error("disconnected from the service")]
    Disconnected,
    /// The service broke the protocol; the connection was closed.
    #[error("protocol error from the service: {0}")]
    Protocol(#[from] ProtocolError),
    /// Binding failed.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The service did not announce the method.
    #[error(transparent)]
    UnknownMethod(#[from] UnknownMethod),
    /// The call failed on the service's side.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The request is too large for one frame.
    #[error(transparent)]
    TooLarge(#[from] FrameTooLarge),
    /// The reply could not be decoded as the method's response type.
    #[error("malformed reply: {0}")]
    MalformedReply(#[from] prost::DecodeError),
    /// No reply within the timeout.
    #[error("timed out waiting for a reply")]
    Timeout,
    /// The call's caller left more than [`REPLY_QUEUE_LIMIT`] replies
    /// unread while waiting on another call; the call's later replies were
    /// dropped.
    #[error("more than {REPLY_QUEUE_LIMIT} replies of this call were left unread; the rest were dropped")]
    Overrun,
}

/// How the service broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A frame could not be decoded (too large, not an `IPCFrame`).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The service closed the connection in the middle of a frame.
    #[error("the connection closed in the middle of a frame ({buffered} bytes of it received)")]
    ClosedMidFrame {
        /// Bytes of the unfinished frame that had arrived.
        buffered: usize,
    },
    /// The kernel truncated a received message or its descriptors (the
    /// service attached more than one to a message).
    #[error("received message was truncated (MSG_TRUNC/MSG_CTRUNC)")]
    Truncated,
}

/// Why the connection closed, as every caller is told.
#[derive(Debug, Clone)]
enum CloseReason {
    Closed,
    Protocol(ProtocolError),
    Receive(io::ErrorKind, String),
}

impl CloseReason {
    fn error(&self) -> ClientError {
        match self {
            CloseReason::Closed => ClientError::Disconnected,
            CloseReason::Protocol(e) => ClientError::Protocol(e.clone()),
            CloseReason::Receive(kind, message) => {
                ClientError::Io(io::Error::new(*kind, message.clone()))
            }
        }
    }
}

/// The peer closed the connection: ordinarily, or in the middle of a frame.
fn closed(decoder: &FrameDecoder) -> CloseReason {
    match decoder.buffered() {
        0 => CloseReason::Closed,
        buffered => CloseReason::Protocol(ProtocolError::ClosedMidFrame { buffered }),
    }
}

enum Delivery {
    Bound(Result<ServiceBinding, BindError>),
    Reply(Reply),
}

/// A request's token: the inbox queue its replies go to.
type Token = u64;

struct State {
    core: ClientCore<Token>,
    connected: bool,
}

/// One call's received replies, waiting for its caller.
#[derive(Default)]
struct Queue {
    deliveries: VecDeque<Delivery>,
    /// More than [`REPLY_QUEUE_LIMIT`] were left unread: later ones are
    /// dropped and the caller gets [`ClientError::Overrun`] after these.
    overrun: bool,
    /// Callers blocked on this queue while it was empty (not yet woken).
    waiting: usize,
}

/// Replies on their way from the reader to their callers (see the
/// module's Backpressure: `waiting` counts the callers that wait, `polled`
/// moves on when one found its queue empty).
#[derive(Default)]
struct Inbox {
    queues: HashMap<Token, Queue>,
    next_token: Token,
    /// Replies queued in all queues.
    queued: usize,
    /// Callers blocked on an empty queue (the sum of the queues' own).
    waiting: usize,
    /// Bumped whenever a caller finds its queue empty.
    polled: u64,
    /// The reader waits for room: callers wake it when they take a reply
    /// or find their queue empty (no one else needs waking then, so two
    /// waiting callers never wake each other in turn).
    reader_blocked: bool,
    /// Why the connection closed: callers with empty queues are told.
    closed: Option<CloseReason>,
    /// The client is being dropped: the reader stops waiting for room.
    stopping: bool,
}

impl Inbox {
    fn open(&mut self) -> Token {
        self.next_token += 1;
        self.queues.insert(self.next_token, Queue::default());
        self.next_token
    }
}

struct Shared {
    socket: Stream,
    state: Mutex<State>,
    send: Mutex<OutQueue>,
    inbox: Mutex<Inbox>,
    /// Signalled on every change of `inbox`.
    inbox_changed: Condvar,
    /// Replies received that no caller took (see [`Client::discarded_replies`]).
    discarded: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent in a
    // way that matters more than losing the connection; keep going.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    /// Registers a request (under the state lock) and sends its frame (under
    /// the send lock, held across both so frames leave in id order).
    fn submit(
        &self,
        fd: Option<OwnedFd>,
        build: impl FnOnce(&mut ClientCore<Token>) -> Result<IpcFrame, ClientError>,
    ) -> Result<(), ClientError> {
        if fd.is_some() && !self.socket.passes_fds() {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "this socket cannot carry a file descriptor (not a UNIX socket)",
            )));
        }
        let mut out = lock(&self.send);
        let frame = {
            let mut state = lock(&self.state);
            if !state.connected {
                return Err(self.close_error());
            }
            build(&mut state.core)?
        };
        // On an error the caller drops its call, which cancels the request.
        out.push_frame(&frame, fd)?;
        while !out.is_empty() {
            if let Err(e) = socket::send_queued(&self.socket, &mut out) {
                log::warn!("send failed: {e}; closing the connection");
                let _ = self.socket.shutdown(Shutdown::Both);
                // The reader may know better why (a protocol error).
                return Err(self.close_error());
            }
        }
        Ok(())
    }

    /// Why the connection closed.
    fn close_error(&self) -> ClientError {
        lock(&self.inbox)
            .closed
            .as_ref()
            .map_or(ClientError::Disconnected, CloseReason::error)
    }

    fn reader_loop(&self) {
        let mut decoder = FrameDecoder::new();
        let reason = 'read: loop {
            match socket::recv_into(&self.socket, &mut decoder) {
                Ok(Received::Data(_)) => {}
                // A reset is a close by a peer that left our data unread.
                Ok(Received::Closed) => break closed(&decoder),
                Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
                    break closed(&decoder)
                }
                Ok(Received::WouldBlock) => continue,
                Err(RecvError::Truncated) => break CloseReason::Protocol(ProtocolError::Truncated),
                Err(RecvError::Io(e)) => break CloseReason::Receive(e.kind(), e.to_string()),
            }
            loop {
                let received = match decoder.next_frame() {
                    Ok(Some(received)) => received,
                    Ok(None) => break,
                    Err(e) => break 'read CloseReason::Protocol(e.into()),
                };
                let incoming = lock(&self.state).core.handle_frame(received);
                let delivered = match incoming {
                    Incoming::Bound { token, result } => {
                        self.deliver(token, Delivery::Bound(result))
                    }
                    Incoming::Reply { token, reply, .. } => {
                        self.deliver(token, Delivery::Reply(reply))
                    }
                    // A cancelled or finished request's, or an id never
                    // issued (ignored, as upstream does).
                    Incoming::Stale { .. } | Incoming::Unsolicited { .. } => {
                        self.count_discarded(1);
                        true
                    }
                };
                if !delivered {
                    break 'read CloseReason::Closed;
                }
            }
        };
        match &reason {
            CloseReason::Closed => {}
            CloseReason::Protocol(e) => {
                log::warn!("protocol error from the service: {e}; closing the connection")
            }
            CloseReason::Receive(_, e) => {
                log::warn!("receive failed: {e}; closing the connection")
            }
        }
        self.close(reason);
    }

    /// Hands `delivery` to the caller of `token`, waiting for room while
    /// its queue is full and no caller waits (see [`Inbox`]). `false` if
    /// the client is being dropped.
    fn deliver(&self, token: Token, delivery: Delivery) -> bool {
        let mut inbox = lock(&self.inbox);
        let polled = inbox.polled;
        loop {
            if inbox.stopping {
                return false;
            }
            let (waiting, moved) = (inbox.waiting, inbox.polled != polled);
            // A caller that dropped its call is gone: its replies (and
            // their descriptors) are dropped.
            let Some(queue) = inbox.queues.get_mut(&token) else {
                self.count_discarded(1);
                return true;
            };
            if queue.overrun {
                self.count_discarded(1);
                return true;
            }
            // Callers waiting on this queue are about to take from it.
            let others_wait = waiting > queue.waiting;
            let len = queue.deliveries.len();
            if len < REPLY_QUEUE_DEPTH || ((others_wait || moved) && len < REPLY_QUEUE_LIMIT) {
                queue.deliveries.push_back(delivery);
                inbox.queued += 1;
                break;
            }
            if len >= REPLY_QUEUE_LIMIT {
                log::warn!(
                    "{REPLY_QUEUE_LIMIT} replies of one call left unread; dropping the rest"
                );
                queue.overrun = true;
                self.count_discarded(1);
                break;
            }
            inbox.reader_blocked = true;
            inbox = self
                .inbox_changed
                .wait(inbox)
                .unwrap_or_else(|e| e.into_inner());
            inbox.reader_blocked = false;
        }
        drop(inbox);
        self.inbox_changed.notify_all();
        true
    }

    fn close(&self, reason: CloseReason) {
        let _ = self.socket.shutdown(Shutdown::Both);
        {
            let mut state = lock(&self.state);
            state.connected = false;
            state.core.disconnect();
        }
        lock(&self.inbox).closed = Some(reason);
        self.inbox_changed.notify_all();
    }

    /// The next delivery for `token`, waiting until `deadline` (forever
    /// with `None`).
    fn receive(&self, token: Token, deadline: Option<Instant>) -> Result<Delivery, ClientError> {
        let mut guard = lock(&self.inbox);
        loop {
            let inbox = &mut *guard;
            let Some(queue) = inbox.queues.get_mut(&token) else {
                return Err(ClientError::Disconnected);
            };
            if let Some(delivery) = queue.deliveries.pop_front() {
                inbox.queued -= 1;
                let reader_blocked = inbox.reader_blocked;
                drop(guard);
                if reader_blocked {
                    self.inbox_changed.notify_all();
                }
                return Ok(delivery);
            }
            if queue.overrun {
                return Err(ClientError::Overrun);
            }
            if let Some(reason) = &inbox.closed {
                return Err(reason.error());
            }
            // This caller may need a reply queued behind another call's.
            inbox.polled = inbox.polled.wrapping_add(1);
            if inbox.reader_blocked {
                self.inbox_changed.notify_all();
            }
            let left = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Err(ClientError::Timeout),
                },
            };
            queue.waiting += 1;
            inbox.waiting += 1;
            guard = match left {
                None => self
                    .inbox_changed
                    .wait(guard)
                    .unwrap_or_else(|e| e.into_inner()),
                Some(left) => {
                    self.inbox_changed
                        .wait_timeout(guard, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
            guard.waiting -= 1;
            if let Some(queue) = guard.queues.get_mut(&token) {
                queue.waiting -= 1;
            }
        }
    }

    /// Forgets `token`'s queue (its caller is gone), dropping what it holds.
    fn discard(&self, token: Token) {
        let dropped = {
            let mut inbox = lock(&self.inbox);
            let dropped = inbox.queues.remove(&token);
            if let Some(queue) = &dropped {
                inbox.queued -= queue.deliveries.len();
            }
            dropped
        };
        if let Some(queue) = dropped {
            self.count_discarded(queue.deliveries.len());
            self.inbox_changed.notify_all();
        }
    }

    fn count_discarded(&self, replies: usize) {
        self.discarded.fetch_add(replies as u64, Ordering::Relaxed);
    }
}

/// A connection to a tracing service socket.
pub struct Client {
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("socket", &self.shared.socket)
            .finish()
    }
}

impl Client {
    /// Connects to `address`, of any family ([`socket::connect_stream`]).
    pub fn connect(address: &SocketAddress) -> Result<Self, ClientError> {
        Ok(Self::from_stream(socket::connect_stream(address)?)?)
    }

    /// Uses an already connected socket (made blocking), of any family:
    /// a [`Stream`] or a [`UnixStream`](std::os::unix::net::UnixStream).
    /// Only UNIX sockets carry file
    /// descriptors ([`Stream::passes_fds`]); on others a request sent with
    /// one fails ([`ClientError::Io`], `InvalidInput`) and the connection
    /// stays up.
    pub fn from_stream(socket: impl Into<Stream>) -> std::io::Result<Self> {
        let socket = socket.into();
        socket.set_nonblocking(false)?;
        let shared = Arc::new(Shared {
            socket,
            state: Mutex::new(State {
                core: ClientCore::new(),
                connected: true,
            }),
            send: Mutex::new(OutQueue::new()),
            inbox: Mutex::new(Inbox::default()),
            inbox_changed: Condvar::new(),
            discarded: AtomicU64::new(0),
        });
        let reader_shared = Arc::clone(&shared);
        let reader = std::thread::Builder::new()
            .name("shmtrace-ipc-reader".into())
            .spawn(move || reader_shared.reader_loop())?;
        Ok(Self {
            shared,
            reader: Some(reader),
        })
    }

    /// The credentials of the process at the other end (the service), as
    /// the kernel recorded them at `connect`; `None` on a socket that is not
    /// a UNIX one ([`Stream::peer_credentials`]).
    pub fn peer_credentials(&self) -> Option<std::io::Result<socket::PeerCredentials>> {
        self.shared.socket.peer_credentials()
    }

    /// Binds service `S` (blocking until the service answers).
    pub fn bind<S: Service>(&self) -> Result<Binding<S>, ClientError> {
        let binding = self.bind_by_name(S::NAME)?;
        Ok(Binding {
            shared: Arc::clone(&self.shared),
            binding: Arc::new(binding),
            _service: PhantomData,
        })
    }

    /// Binds a service by name (blocking until the service answers).
    pub fn bind_by_name(&self, name: &str) -> Result<ServiceBinding, ClientError> {
        let mut call = Call::open(&self.shared);
        let token = call.token;
        self.shared.submit(None, |core| {
            let frame = core.bind(name, token);
            call.request_id = frame.request_id.unwrap_or(0);
            Ok(frame)
        })?;
        match self.shared.receive(call.token, None)? {
            Delivery::Bound(result) => Ok(result?),
            Delivery::Reply(_) => Err(ClientError::Disconnected),
        }
    }

    /// Replies received and not yet taken by their callers (at most
    /// [`REPLY_QUEUE_DEPTH`] per call while no caller waits on another).
    pub fn queued_replies(&self) -> usize {
        lock(&self.shared.inbox).queued
    }

    /// Requests awaiting a reply: binds and calls sent and neither answered
    /// finally nor dropped by their callers.
    pub fn pending_requests(&self) -> usize {
        lock(&self.shared.state).core.pending()
    }

    /// Replies received that no caller took, each dropped with its
    /// descriptor: those of calls dropped before their final reply (queued
    /// then, or arriving later), those past a call's
    /// [`ClientError::Overrun`], and any to a request already answered
    /// finally or never issued.
    pub fn discarded_replies(&self) -> u64 {
        self.shared.discarded.load(Ordering::Relaxed)
    }

    /// Invokes `method` of `binding` with serialized `args` (and `fd`).
    /// Returns the pending call, or `None` with `want_reply == false`.
    pub fn invoke_raw(
        &self,
        binding: &ServiceBinding,
        method: &str,
        args: Bytes,
        fd: Option<OwnedFd>,
        want_reply: bool,
    ) -> Result<Option<RawCall>, ClientError> {
        invoke(&self.shared, binding, method, args, fd, want_reply)
    }
}

fn invoke(
    shared: &Arc<Shared>,
    binding: &ServiceBinding,
    method: &str,
    args: Bytes,
    fd: Option<OwnedFd>,
    want_reply: bool,
) -> Result<Option<RawCall>, ClientError> {
    let mut call = want_reply.then(|| Call::open(shared));
    let token = call.as_ref().map(|c| c.token);
    shared.submit(fd, |core| {
        let (id, frame) = core.invoke(binding, method, args, token)?;
        if let Some(call) = &mut call {
            call.request_id = id;
        }
        Ok(frame)
    })?;
    Ok(call.map(|call| RawCall {
        call,
        finished: false,
    }))
}

/// A caller's request and inbox queue, cancelled and discarded with it.
struct Call {
    shared: Arc<Shared>,
    token: Token,
    /// The request, once registered (ids start at 1; 0 is none).
    request_id: u64,
}

impl Call {
    fn open(shared: &Arc<Shared>) -> Self {
        Call {
            shared: Arc::clone(shared),
            token: lock(&shared.inbox).open(),
            request_id: 0,
        }
    }
}

impl Drop for Call {
    /// Cancels the request (a no-op once it had its final reply): its later
    /// replies are stale, read and discarded, and its entry does not
    /// outlive the caller.
    fn drop(&mut self) {
        lock(&self.shared.state).core.cancel(self.request_id);
        self.shared.discard(self.token);
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.shared.socket.shutdown(Shutdown::Both);
        // The reader may be waiting for a caller to make room.
        lock(&self.shared.inbox).stopping = true;
        self.shared.inbox_changed.notify_all();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// A bound service with typed calls. Cheap to clone; usable from any thread.
pub struct Binding<S> {
    shared: Arc<Shared>,
    binding: Arc<ServiceBinding>,
    _service: PhantomData<fn() -> S>,
}

impl<S> Clone for Binding<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            binding: Arc::clone(&self.binding),
            _service: PhantomData,
        }
    }
}

impl<S> std::fmt::Debug for Binding<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Binding").field(&self.binding).finish()
    }
}

impl<S: Service> Binding<S> {
    /// The binding (service id, method table).
    pub fn binding(&self) -> &ServiceBinding {
        &self.binding
    }

    /// Starts a call of `M` and returns its pending replies.
    pub fn start<M: Method<Service = S>>(
        &self,
        request: &M::Request,
        fd: Option<OwnedFd>,
    ) -> Result<PendingCall<M>, ClientError> {
        let args = Bytes::from(canonical::encode(request));
        let raw = invoke(&self.shared, &self.binding, M::NAME, args, fd, true)?
            .ok_or(ClientError::Disconnected)?;
        Ok(PendingCall {
            raw,
            _method: PhantomData,
        })
    }

    /// Calls `M` and waits for its (first) reply.
    pub fn call<M: Method<Service = S>>(
        &self,
        request: &M::Request,
    ) -> Result<M::Response, ClientError> {
        Ok(self.start::<M>(request, None)?.wait()?.message)
    }

    /// Calls `M` without asking for a reply (`drop_reply`).
    pub fn send<M: Method<Service = S>>(
        &self,
        request: &M::Request,
        fd: Option<OwnedFd>,
    ) -> Result<(), ClientError> {
        let args = Bytes::from(canonical::encode(request));
        invoke(&self.shared, &self.binding, M::NAME, args, fd, false)?;
        Ok(())
    }
}

/// One decoded reply of a typed call.
#[derive(Debug)]
pub struct Response<T> {
    /// The response message.
    pub message: T,
    /// More replies follow.
    pub has_more: bool,
    /// A descriptor that came with the reply.
    pub fd: Option<OwnedFd>,
}

/// The replies of an untyped call, in order.
///
/// Dropping it before its final reply cancels the call (see the module's
/// Dropped calls).
pub struct RawCall {
    call: Call,
    finished: bool,
}

impl std::fmt::Debug for RawCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawCall")
            .field("request_id", &self.call.request_id)
            .field("finished", &self.finished)
            .finish()
    }
}

impl RawCall {
    /// The request id of the call.
    pub fn request_id(&self) -> u64 {
        self.call.request_id
    }

    /// The next reply, waiting at most `timeout` (forever with `None`).
    /// `None` once the final reply was returned.
    pub fn next_reply(&mut self, timeout: Option<Duration>) -> Option<Result<Reply, ClientError>> {
        if self.finished {
            return None;
        }
        let deadline = timeout.map(|t| Instant::now().checked_add(t));
        let result = match deadline {
            // Too far to represent: forever.
            Some(None) | None => self.call.shared.receive(self.call.token, None),
            Some(Some(deadline)) => self.call.shared.receive(self.call.token, Some(deadline)),
        }
        .and_then(|delivery| match delivery {
            Delivery::Reply(reply) => Ok(reply),
            Delivery::Bound(_) => Err(ClientError::Disconnected),
        });
        self.finished = match &result {
            Ok(reply) => !reply.has_more || reply.result.is_err(),
            Err(ClientError::Timeout) => false,
            Err(_) => true,
        };
        Some(result)
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bound(r) => f.debug_tuple("Bound").field(r).finish(),
            Self::Reply(r) => f.debug_tuple("Reply").field(r).finish(),
        }
    }
}

/// The replies of a typed call of `M`, in order.
///
/// Dropping it before its final reply cancels the call (see the module's
/// Dropped calls).
#[derive(Debug)]
pub struct PendingCall<M> {
    raw: RawCall,
    _method: PhantomData<fn() -> M>,
}

impl<M: Method> PendingCall<M> {
    /// The request id of the call.
    pub fn request_id(&self) -> u64 {
        self.raw.request_id()
    }

    /// The next reply, waiting at most `timeout` (forever with `None`).
    /// `None` once the final reply was returned.
    pub fn next(
        &mut self,
        timeout: Option<Duration>,
    ) -> Option<Result<Response<M::Response>, ClientError>> {
        let reply = self.raw.next_reply(timeout)?;
        Some(reply.and_then(|reply| {
            let payload = reply.result?;
            Ok(Response {
                message: <M::Response as prost::Message>::decode(payload)?,
                has_more: reply.has_more,
                fd: reply.fd,
            })
        }))
    }

    /// Waits for the first reply.
    pub fn wait(mut self) -> Result<Response<M::Response>, ClientError> {
        self.next(None).unwrap_or(Err(ClientError::Disconnected))
    }
}
