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
//! replies from being read. Each request's replies go to its own channel.

use std::marker::PhantomData;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;

use super::client::{
    BindError, ClientCore, Incoming, Reply, RpcError, ServiceBinding, UnknownMethod,
};
use super::frame::{FrameDecoder, FrameTooLarge};
use super::outq::OutQueue;
use super::rpc::{Method, Service};
use super::socket::{self, Received, SocketAddress};
use crate::protos::canonical;
use crate::protos::IpcFrame;

/// Why a client operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting or sending failed.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    /// The connection is closed (by either side, or after a protocol error).
    #[error("disconnected from the service")]
    Disconnected,
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
}

enum Delivery {
    Bound(Result<ServiceBinding, BindError>),
    Reply(Reply),
    Disconnected,
}

type Token = Sender<Delivery>;

struct State {
    core: ClientCore<Token>,
    connected: bool,
}

struct Shared {
    socket: UnixStream,
    state: Mutex<State>,
    send: Mutex<OutQueue>,
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
        build: impl FnOnce(&mut ClientCore<Token>) -> Result<(Option<u64>, IpcFrame), ClientError>,
    ) -> Result<(), ClientError> {
        let mut out = lock(&self.send);
        let (request_id, frame) = {
            let mut state = lock(&self.state);
            if !state.connected {
                return Err(ClientError::Disconnected);
            }
            build(&mut state.core)?
        };
        if let Err(e) = out.push_frame(&frame, fd) {
            self.forget(request_id);
            return Err(e.into());
        }
        while !out.is_empty() {
            if let Err(e) = socket::send_queued(&self.socket, &mut out) {
                log::warn!("send failed: {e}; closing the connection");
                let _ = self.socket.shutdown(Shutdown::Both);
                return Err(ClientError::Disconnected);
            }
        }
        Ok(())
    }

    fn forget(&self, request_id: Option<u64>) {
        if let Some(id) = request_id {
            // The caller gets the error directly; nothing will answer this id.
            lock(&self.state).core.cancel(id);
        }
    }

    fn reader_loop(&self) {
        let mut decoder = FrameDecoder::new();
        loop {
            match socket::recv_into(&self.socket, &mut decoder) {
                Ok(Received::Data(_)) => {}
                Ok(Received::Closed) => break,
                Ok(Received::WouldBlock) => continue,
                Err(e) => {
                    log::warn!("receive failed: {e}; closing the connection");
                    break;
                }
            }
            loop {
                let received = match decoder.next_frame() {
                    Ok(Some(received)) => received,
                    Ok(None) => break,
                    Err(e) => {
                        log::warn!("protocol error from the service: {e}; closing the connection");
                        return self.close();
                    }
                };
                let incoming = lock(&self.state).core.handle_frame(received);
                match incoming {
                    Some(Incoming::Bound { token, result }) => {
                        let _ = token.send(Delivery::Bound(result));
                    }
                    Some(Incoming::Reply { token, reply, .. }) => {
                        let _ = token.send(Delivery::Reply(reply));
                    }
                    None => {}
                }
            }
        }
        self.close();
    }

    fn close(&self) {
        let _ = self.socket.shutdown(Shutdown::Both);
        let tokens = {
            let mut state = lock(&self.state);
            state.connected = false;
            state.core.disconnect()
        };
        for token in tokens {
            let _ = token.send(Delivery::Disconnected);
        }
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
    /// Connects to `address`.
    pub fn connect(address: &SocketAddress) -> Result<Self, ClientError> {
        Ok(Self::from_stream(socket::connect(address)?)?)
    }

    /// Uses an already connected (blocking) socket.
    pub fn from_stream(socket: UnixStream) -> std::io::Result<Self> {
        socket.set_nonblocking(false)?;
        let shared = Arc::new(Shared {
            socket,
            state: Mutex::new(State {
                core: ClientCore::new(),
                connected: true,
            }),
            send: Mutex::new(OutQueue::new()),
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
        let (tx, rx) = mpsc::channel();
        self.shared.submit(None, |core| {
            let frame = core.bind(name, tx);
            Ok((frame.request_id, frame))
        })?;
        match rx.recv() {
            Ok(Delivery::Bound(result)) => Ok(result?),
            Ok(_) | Err(_) => Err(ClientError::Disconnected),
        }
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
    shared: &Shared,
    binding: &ServiceBinding,
    method: &str,
    args: Bytes,
    fd: Option<OwnedFd>,
    want_reply: bool,
) -> Result<Option<RawCall>, ClientError> {
    let (tx, rx) = mpsc::channel();
    let token = want_reply.then_some(tx);
    let mut request_id = 0;
    shared.submit(fd, |core| {
        let (id, frame) = core.invoke(binding, method, args, token)?;
        request_id = id;
        Ok((want_reply.then_some(id), frame))
    })?;
    Ok(want_reply.then_some(RawCall {
        request_id,
        rx,
        finished: false,
    }))
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.shared.socket.shutdown(Shutdown::Both);
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
#[derive(Debug)]
pub struct RawCall {
    request_id: u64,
    rx: Receiver<Delivery>,
    finished: bool,
}

impl RawCall {
    /// The request id of the call.
    pub fn request_id(&self) -> u64 {
        self.request_id
    }

    /// The next reply, waiting at most `timeout` (forever with `None`).
    /// `None` once the final reply was returned.
    pub fn next_reply(&mut self, timeout: Option<Duration>) -> Option<Result<Reply, ClientError>> {
        if self.finished {
            return None;
        }
        let delivery = match timeout {
            None => self.rx.recv().map_err(|_| ClientError::Disconnected),
            Some(t) => self.rx.recv_timeout(t).map_err(|e| match e {
                RecvTimeoutError::Timeout => ClientError::Timeout,
                RecvTimeoutError::Disconnected => ClientError::Disconnected,
            }),
        };
        let result = match delivery {
            Ok(Delivery::Reply(reply)) => Ok(reply),
            Ok(Delivery::Bound(_)) | Ok(Delivery::Disconnected) => Err(ClientError::Disconnected),
            Err(e) => Err(e),
        };
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
            Self::Disconnected => f.write_str("Disconnected"),
        }
    }
}

/// The replies of a typed call of `M`, in order.
#[derive(Debug)]
pub struct PendingCall<M> {
    raw: RawCall,
    _method: PhantomData<fn() -> M>,
}

impl<M: Method> PendingCall<M> {
    /// The request id of the call.
    pub fn request_id(&self) -> u64 {
        self.raw.request_id
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
