//! The protocol messages, generated from `host-service/proto/` (package
//! `perfetto.protos`, upstream's names and field numbers).
//!
//! * Every message of the socket protocol: [`IpcFrame`], the request and
//!   reply of every `ProducerPort` and `ConsumerPort` method, and what they
//!   carry ([`TraceConfig`], [`DataSourceConfig`], [`DataSourceDescriptor`],
//!   [`CommitDataRequest`], [`TraceStats`], [`TracingServiceState`], …), plus
//!   the [`TracePacket`] fields the service writes.
//! * The services themselves: [`ProducerPort`] and [`ConsumerPort`] implement
//!   [`Service`](crate::rpc::Service) with their method tables, and the
//!   modules [`producer_port`] / [`consumer_port`] hold one marker type per
//!   method and a `Request` enum of decoded requests.
//!
//! Configs are raw bytes where they cross the service: a serialized
//! `TraceConfig` in [`EnableTracingRequest`], a serialized
//! `DataSourceConfig` in [`trace_config::DataSource`] and in the
//! `SetupDataSource` / `StartDataSource` commands. The wire format is the
//! same as a sub-message, and nothing the consumer wrote is lost on the way
//! (see [`ds_config`]). [`to_raw`] and [`from_raw`] convert.
//!
//! To send bytes identical to Perfetto's, encode with [`canonical::encode`]
//! (the IPC layer does); `prost::Message::encode` is equally valid protobuf.

#![allow(missing_docs)]

pub mod canonical;
pub mod ds_config;
pub mod schema;
pub mod vec_sink;
pub mod wire;

use bytes::Bytes;

use schema::ProtoSchema;

// prost's output: documented by the comments of the .proto files.
#[allow(clippy::all, clippy::pedantic)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}
pub use generated::*;

/// The `FileDescriptorSet` of every `.proto` file under `proto/`, for
/// run-time reflection (text-format configs, trace decoding with
/// `prost-reflect`).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

/// Serializes `msg` for a raw-bytes config field (canonical encoding).
pub fn to_raw<M: ProtoSchema>(msg: &M) -> Bytes {
    canonical::encode(msg).into()
}

/// Decodes a raw-bytes config field; an absent field is the default message.
pub fn from_raw<M: ProtoSchema>(raw: Option<&Bytes>) -> Result<M, prost::DecodeError> {
    match raw {
        Some(bytes) => M::decode(bytes.clone()),
        None => Ok(M::default()),
    }
}
