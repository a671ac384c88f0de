//! RPC service definitions: method tables and typed requests.
//!
//! `build.rs` implements these traits for every `service` of the `.proto`
//! files ([`ProducerPort`](crate::protos::ProducerPort),
//! [`ConsumerPort`](crate::protos::ConsumerPort)). Method ids are the 1-based
//! position in [`Service::METHODS`], which is the declaration order — what the
//! real Perfetto host announces in `BindServiceReply`.

use bytes::Bytes;
use thiserror::Error;

use crate::protos::schema::ProtoSchema;

/// One method of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodDescriptor {
    /// 1-based declaration index: the id the host announces.
    pub id: u32,
    /// Method name, as announced and looked up by clients.
    pub name: &'static str,
    /// Fully qualified request message name.
    pub request_type: &'static str,
    /// Fully qualified response message name.
    pub response_type: &'static str,
    /// Whether the method replies with a stream (`has_more` replies).
    pub server_streaming: bool,
}

/// An RPC service: its name and method table.
pub trait Service: 'static {
    /// The name clients bind to, e.g. `"ProducerPort"`.
    const NAME: &'static str;
    /// Methods in declaration order (`METHODS[i].id == i + 1`).
    const METHODS: &'static [MethodDescriptor];
    /// A decoded request of any method of this service.
    type Request: ServiceRequest;

    /// The method with id `id`, if any.
    fn method(id: u32) -> Option<&'static MethodDescriptor> {
        let index = usize::try_from(id).ok()?.checked_sub(1)?;
        Self::METHODS.get(index)
    }
}

/// One method of a service, as a type: lets a client call it with typed
/// request and response messages.
pub trait Method {
    /// The service the method belongs to.
    type Service: Service;
    /// Request message.
    type Request: ProtoSchema;
    /// Response message.
    type Response: ProtoSchema;
    /// 1-based declaration index.
    const ID: u32;
    /// Method name.
    const NAME: &'static str;
    /// Whether the method replies with a stream.
    const SERVER_STREAMING: bool;
}

/// The decoded request of some method of a service.
pub trait ServiceRequest: Sized {
    /// Decodes the `args_proto` of an `InvokeMethod` for method `method_id`.
    fn decode(method_id: u32, args: Bytes) -> Result<Self, RequestDecodeError>;
    /// The method this request is for.
    fn method(&self) -> &'static MethodDescriptor;
    /// The request serialized as `args_proto` (canonical encoding).
    fn encode_args(&self) -> Bytes;
}

/// Why an `InvokeMethod` could not be turned into a request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestDecodeError {
    /// No method with this id.
    #[error("no method with id {0}")]
    UnknownMethod(u32),
    /// The arguments are not a valid request message.
    #[error("malformed request arguments: {0}")]
    Malformed(#[from] prost::DecodeError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protos::{
        consumer_port, producer_port, ConsumerPort, InitializeConnectionRequest, ProducerPort,
    };
    use prost::Message;

    #[test]
    fn method_tables_match_perfetto_v59() {
        let names: Vec<&str> = ProducerPort::METHODS.iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            [
                "InitializeConnection",
                "RegisterDataSource",
                "UnregisterDataSource",
                "CommitData",
                "GetAsyncCommand",
                "RegisterTraceWriter",
                "UnregisterTraceWriter",
                "NotifyDataSourceStarted",
                "NotifyDataSourceStopped",
                "ActivateTriggers",
                "Sync",
                "UpdateDataSource",
                "AttachV2RingBuffer",
                "DrainV2RingBuffer"
            ]
        );
        let names: Vec<&str> = ConsumerPort::METHODS.iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            [
                "EnableTracing",
                "DisableTracing",
                "ReadBuffers",
                "FreeBuffers",
                "Flush",
                "StartTracing",
                "ChangeTraceConfig",
                "Detach",
                "Attach",
                "GetTraceStats",
                "ObserveEvents",
                "QueryServiceState",
                "QueryCapabilities",
                "SaveTraceForBugreport",
                "CloneSession"
            ]
        );
        for (i, m) in ProducerPort::METHODS
            .iter()
            .chain(ConsumerPort::METHODS)
            .enumerate()
        {
            let index = if i < ProducerPort::METHODS.len() {
                i
            } else {
                i - ProducerPort::METHODS.len()
            };
            assert_eq!(m.id as usize, index + 1);
        }
        let streaming: Vec<&str> = ProducerPort::METHODS
            .iter()
            .chain(ConsumerPort::METHODS)
            .filter(|m| m.server_streaming)
            .map(|m| m.name)
            .collect();
        assert_eq!(
            streaming,
            [
                "GetAsyncCommand",
                "ReadBuffers",
                "ObserveEvents",
                "QueryServiceState"
            ]
        );
        assert_eq!(
            ProducerPort::method(4).unwrap().request_type,
            "perfetto.protos.CommitDataRequest"
        );
        assert!(ProducerPort::method(0).is_none() && ProducerPort::method(15).is_none());
        assert_eq!(<producer_port::GetAsyncCommand as Method>::ID, 5);
        const { assert!(<consumer_port::ReadBuffers as Method>::SERVER_STREAMING) };
    }

    #[test]
    fn requests_decode_by_method_id() {
        let req = InitializeConnectionRequest {
            producer_name: Some("p".into()),
            ..Default::default()
        };
        let decoded = producer_port::Request::decode(1, req.encode_to_vec().into()).unwrap();
        assert_eq!(decoded, producer_port::Request::InitializeConnection(req));
        assert_eq!(decoded.method().name, "InitializeConnection");
        assert_eq!(
            producer_port::Request::decode(99, Bytes::new()),
            Err(RequestDecodeError::UnknownMethod(99))
        );
        assert!(matches!(
            producer_port::Request::decode(1, Bytes::from_static(b"\x1a\x05")),
            Err(RequestDecodeError::Malformed(_))
        ));
    }
}
