//! The consumer end of the socket, as the CLI commands use it: connect and
//! bind `ConsumerPort` with clear errors, and the calls that need a timeout
//! or more than one reply.

use std::os::fd::OwnedFd;
use std::time::Duration;

use prost::Message as _;

use super::CliError;
use shmtrace_ipc::protos::{
    consumer_port, ConsumerPort, GetTraceStatsRequest, QueryServiceStateRequest, TraceStats,
    TracingServiceState,
};
use shmtrace_ipc::rpc::{Method, Service};
use shmtrace_ipc::socket::{consumer_socket_name, SocketAddress};
use shmtrace_ipc::{Binding, Client, ClientError, PendingCall, Response};

/// How long a plain request may take before the service is declared stuck.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to a tracing service's consumer socket.
#[derive(Debug)]
pub struct Consumer {
    // Declared before `client`: dropped first, while the connection lives.
    port: Binding<ConsumerPort>,
    client: Client,
    address: SocketAddress,
}

impl Consumer {
    /// Connects to `socket`, or to the default consumer socket
    /// (`$PERFETTO_CONSUMER_SOCK_NAME`, `/run/perfetto/traced-consumer.sock`,
    /// `/tmp/perfetto-consumer`), and binds `ConsumerPort`.
    pub fn connect(socket: Option<&str>) -> Result<Self, CliError> {
        let name = socket.map_or_else(consumer_socket_name, str::to_owned);
        Self::connect_to(SocketAddress::parse(&name)?)
    }

    /// Another connection to the same service (a consumer has one session
    /// at most: a clone of the session needs a connection of its own).
    pub fn another(&self) -> Result<Self, CliError> {
        Self::connect_to(self.address.clone())
    }

    /// Connects to the consumer socket at `address` and binds `ConsumerPort`.
    pub(crate) fn connect_to(address: SocketAddress) -> Result<Self, CliError> {
        let (client, port) = bind::<ConsumerPort>(&address, |address, source| CliError::Connect {
            address,
            source,
        })?;
        Ok(Consumer {
            port,
            client,
            address,
        })
    }

    /// The service's process id, if the kernel can tell it (a UNIX socket
    /// whose peer is in a pid namespace this process sees).
    pub fn service_pid(&self) -> Option<i32> {
        match self.client.peer_credentials() {
            Some(Ok(cred)) if cred.pid > 0 => Some(cred.pid),
            _ => None,
        }
    }

    /// The address connected to.
    pub fn address(&self) -> &SocketAddress {
        &self.address
    }

    /// The bound service.
    pub fn port(&self) -> &Binding<ConsumerPort> {
        &self.port
    }

    /// Starts a call of `M`.
    pub fn start<M: Method<Service = ConsumerPort>>(
        &self,
        what: &'static str,
        request: &M::Request,
        fd: Option<OwnedFd>,
    ) -> Result<PendingCall<M>, CliError> {
        self.port
            .start::<M>(request, fd)
            .map_err(|source| CliError::Ipc { what, source })
    }

    /// Calls `M` and waits at most `timeout` for the reply.
    pub fn call<M: Method<Service = ConsumerPort>>(
        &self,
        what: &'static str,
        request: &M::Request,
        timeout: Duration,
    ) -> Result<M::Response, CliError> {
        let mut call = self.start::<M>(what, request, None)?;
        next(&mut call, Some(timeout))
            .map(|r| r.message)
            .map_err(|source| CliError::Ipc { what, source })
    }

    /// The whole service state (the replies of the stream merged).
    pub fn service_state(&self, sessions_only: bool) -> Result<TracingServiceState, CliError> {
        const WHAT: &str = "QueryServiceState";
        let request = QueryServiceStateRequest {
            sessions_only: Some(sessions_only),
        };
        let mut call = self.start::<consumer_port::QueryServiceState>(WHAT, &request, None)?;
        let mut state = TracingServiceState::default();
        loop {
            let reply = next(&mut call, Some(CALL_TIMEOUT))
                .map_err(|source| CliError::Ipc { what: WHAT, source })?;
            if let Some(part) = reply.message.service_state {
                // Parts concatenate: merging their encodings is exactly that.
                state
                    .merge(part.encode_to_vec().as_slice())
                    .map_err(|e| CliError::Ipc {
                        what: WHAT,
                        source: ClientError::MalformedReply(e),
                    })?;
            }
            if !reply.has_more {
                return Ok(state);
            }
        }
    }

    /// The statistics of this consumer's session; `None` if the service
    /// has none for it (not started, or already freed).
    pub fn trace_stats(&self) -> Result<Option<TraceStats>, CliError> {
        match self.call::<consumer_port::GetTraceStats>(
            "GetTraceStats",
            &GetTraceStatsRequest {},
            CALL_TIMEOUT,
        ) {
            Ok(reply) => Ok(reply.trace_stats),
            Err(CliError::Ipc {
                source: ClientError::Rpc(_),
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Connects to `address` and binds `S`; a failure becomes the error
/// `error` makes of the address and its cause.
pub fn bind<S: Service>(
    address: &SocketAddress,
    error: impl Fn(String, ClientError) -> CliError,
) -> Result<(Client, Binding<S>), CliError> {
    let client = Client::connect(address).map_err(|e| error(address.to_string(), e))?;
    let port = client
        .bind::<S>()
        .map_err(|e| error(address.to_string(), e))?;
    Ok((client, port))
}

/// The next reply of `call`; the end of the replies is a disconnection.
pub fn next<M: Method>(
    call: &mut PendingCall<M>,
    timeout: Option<Duration>,
) -> Result<Response<M::Response>, ClientError> {
    call.next(timeout).unwrap_or(Err(ClientError::Disconnected))
}
