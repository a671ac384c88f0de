//! Encoding that reproduces the real Perfetto's bytes.
//!
//! Any protobuf decoder accepts prost's encoding, so this is not needed for
//! interoperability. It exists so that what this project sends is
//! byte-identical to what Perfetto sends for the same message: golden frames
//! can be compared byte for byte, and traces and configs round-trip unchanged.
//!
//! Perfetto (its `protozero` writer) differs from prost in two ways:
//!
//! * **Field order.** Fields are written in `.proto` declaration order, not
//!   field-number order; unknown fields last.
//! * **Nested message lengths.** A sub-message's length is reserved as 4
//!   bytes before its content is written. When the message is finished and is
//!   at most 127 bytes long *and* its length field and content sit in the same
//!   4096-byte slice of the writer's buffer, the content is moved back and a
//!   1-byte length is used; otherwise the 4 bytes stay, as a zero-padded
//!   ("redundant") varint. A reservation that does not fit in the current
//!   slice starts a new slice. Bytes and string fields use ordinary varints.
//!
//! [`ZeroWriter`] models that writer (slices included); [`encode`] runs
//! prost's encoding through it using the generated [schema](super::schema).
//!
//! One approximation: the content of a [`FieldKind::RawMessage`] field (a
//! config kept as raw bytes) is copied as is, so if it contains sub-messages
//! that would straddle a slice boundary at their position in the enclosing
//! message, Perfetto could size those differently. Only configs larger than
//! 4 KiB can be affected, and the decoded content is identical either way.

use shmtrace_abi::proto::wire::redundant_varint4;
use thiserror::Error;

use super::schema::{FieldKind, MessageSchema, ProtoSchema};
use super::wire::{put_tag, Fields, Value, WireError, WireType};

/// Slice size of Perfetto's heap-buffered message writer.
pub const SLICE_SIZE: usize = 4096;

/// Largest nested message the 4-byte length field can describe.
pub const MAX_NESTED_LEN: usize = (1 << 28) - 1;

/// Sub-messages nested deeper than this are rejected.
pub const MAX_DEPTH: usize = 100;

/// Why a message could not be re-encoded canonically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// The input is not well-formed protobuf.
    #[error("malformed message: {0}")]
    Wire(#[from] WireError),
    /// A sub-message is longer than [`MAX_NESTED_LEN`].
    #[error("nested message longer than {MAX_NESTED_LEN} bytes")]
    NestedTooLong,
    /// Sub-messages nest deeper than [`MAX_DEPTH`].
    #[error("messages nested deeper than {MAX_DEPTH}")]
    TooDeep,
}

/// A model of protozero's heap-buffered writer: appends to a `Vec`, tracking
/// the 4096-byte slices the real writer would use.
#[derive(Debug)]
pub struct ZeroWriter<'a> {
    out: &'a mut Vec<u8>,
    /// Index of the current slice (0: none allocated yet).
    slice: u64,
    /// Bytes used in the current slice.
    pos: usize,
}

/// A reserved length field, returned by [`ZeroWriter::begin_nested`].
#[derive(Debug)]
#[must_use = "a nested message must be ended"]
pub struct Nested {
    at: usize,
    slice: u64,
}

impl<'a> ZeroWriter<'a> {
    /// A writer at the start of a fresh heap buffer, appending to `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Self {
            out,
            slice: 0,
            pos: SLICE_SIZE,
        }
    }

    /// Appends bytes (they may span slices).
    pub fn write(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
        let mut left = bytes.len();
        while left > 0 {
            if self.pos == SLICE_SIZE {
                self.new_slice();
            }
            let n = left.min(SLICE_SIZE - self.pos);
            self.pos += n;
            left -= n;
        }
    }

    /// Appends a tag.
    pub fn write_tag(&mut self, number: u32, wire_type: WireType) {
        let mut tag = Vec::with_capacity(5);
        put_tag(&mut tag, number, wire_type);
        self.write(&tag);
    }

    fn new_slice(&mut self) {
        self.slice += 1;
        self.pos = 0;
    }

    /// Reserves the 4-byte length field of a sub-message whose tag was just
    /// written. The reservation never spans slices.
    pub fn begin_nested(&mut self) -> Nested {
        if SLICE_SIZE - self.pos < 4 {
            self.new_slice();
        }
        let at = self.out.len();
        self.out.extend_from_slice(&[0; 4]);
        self.pos += 4;
        Nested {
            at,
            slice: self.slice,
        }
    }

    /// Writes the length of the sub-message started by `nested`: one byte if
    /// it is short and did not leave its slice, else a 4-byte redundant varint.
    pub fn end_nested(&mut self, nested: Nested) -> Result<(), CanonicalError> {
        let start = nested.at + 4;
        let len = self.out.len().saturating_sub(start);
        if len <= 127 && nested.slice == self.slice {
            if let Some(b) = self.out.get_mut(nested.at) {
                *b = len as u8;
            }
            self.out.drain(nested.at + 1..start);
            self.pos -= 3;
            return Ok(());
        }
        if len > MAX_NESTED_LEN {
            return Err(CanonicalError::NestedTooLong);
        }
        let field = redundant_varint4(len as u32);
        if let Some(dst) = self.out.get_mut(nested.at..start) {
            dst.copy_from_slice(&field);
        }
        Ok(())
    }

    /// Writes the serialized message `bytes` (of type `schema`) canonically.
    pub fn write_message(
        &mut self,
        schema: &MessageSchema,
        bytes: &[u8],
    ) -> Result<(), CanonicalError> {
        self.write_message_at(schema, bytes, 0)
    }

    fn write_message_at(
        &mut self,
        schema: &MessageSchema,
        bytes: &[u8],
        depth: usize,
    ) -> Result<(), CanonicalError> {
        if depth > MAX_DEPTH {
            return Err(CanonicalError::TooDeep);
        }
        let mut fields = Vec::new();
        for field in Fields::new(bytes) {
            let field = field?;
            let decl = schema.field(field.number);
            let order = decl.map_or(usize::MAX, |(index, _)| index);
            fields.push((order, decl.map(|(_, f)| f.kind), field));
        }
        // Stable: repeated fields and unknown fields keep their relative order.
        fields.sort_by_key(|&(order, _, _)| order);
        for (_, kind, field) in fields {
            match (kind, field.value) {
                (Some(FieldKind::Message(sub)), Value::LengthDelimited(payload)) => {
                    self.write_tag(field.number, WireType::LengthDelimited);
                    let nested = self.begin_nested();
                    self.write_message_at(sub, payload, depth + 1)?;
                    self.end_nested(nested)?;
                }
                (Some(FieldKind::RawMessage), Value::LengthDelimited(payload)) => {
                    self.write_tag(field.number, WireType::LengthDelimited);
                    let nested = self.begin_nested();
                    self.write(payload);
                    self.end_nested(nested)?;
                }
                _ => self.write(field.bytes),
            }
        }
        Ok(())
    }
}

/// Re-encodes the serialized message `bytes` of type `schema` the way
/// Perfetto would, appending to `out`. Unknown fields are kept, last.
///
/// Fields of one number keep their relative order, so "last value wins" and
/// sub-message merging mean the same after re-encoding. The exception is
/// input that sets several members of one `oneof` (which a protobuf encoder
/// never produces): the member that ends up last may change.
pub fn reencode_into(
    schema: &MessageSchema,
    bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CanonicalError> {
    let mark = out.len();
    let result = ZeroWriter::new(out).write_message(schema, bytes);
    if result.is_err() {
        out.truncate(mark);
    }
    result
}

/// Encodes `msg` exactly as Perfetto would, appending to `out`.
///
/// Cannot fail for a message built in memory; should the canonical pass ever
/// reject prost's output, prost's own (equally valid) encoding is appended.
pub fn encode_into<M: ProtoSchema>(msg: &M, out: &mut Vec<u8>) {
    let plain = msg.encode_to_vec();
    if let Err(e) = reencode_into(M::schema(), &plain, out) {
        log::warn!(
            "canonical encoding of {} failed ({e}); sending prost's encoding",
            M::schema().name
        );
        out.extend_from_slice(&plain);
    }
}

/// Encodes `msg` exactly as Perfetto would.
pub fn encode<M: ProtoSchema>(msg: &M) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(msg, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protos::{
        read_buffers_response::Slice, DataSourceConfig, InitializeConnectionRequest,
        ReadBuffersResponse, TraceConfig,
    };
    use prost::Message;

    #[test]
    fn fields_come_out_in_declaration_order() {
        let req = InitializeConnectionRequest {
            producer_name: Some("p".into()),
            sdk_version: Some("v".into()),
            shm_key_windows: Some("k".into()),
            ..Default::default()
        };
        // prost: 3, 7, 8. Perfetto declares sdk_version (8) before shm_key_windows (7).
        assert_eq!(req.encode_to_vec(), b"\x1a\x01p\x3a\x01k\x42\x01v");
        assert_eq!(encode(&req), b"\x1a\x01p\x42\x01v\x3a\x01k");
        assert_eq!(
            InitializeConnectionRequest::decode(&*encode(&req)).unwrap(),
            req
        );
    }

    #[test]
    fn short_nested_messages_get_one_byte_long_ones_four() {
        let short = ReadBuffersResponse {
            slices: vec![Slice {
                data: Some(vec![7; 10].into()),
                last_slice_for_packet: Some(true),
            }],
        };
        assert_eq!(encode(&short)[..2], [0x12, 14]);
        let long = ReadBuffersResponse {
            slices: vec![Slice {
                data: Some(vec![7; 200].into()),
                last_slice_for_packet: Some(true),
            }],
        };
        let bytes = encode(&long);
        // (tag, 2-byte length, 200 bytes) + bool = 205 = 0x4d | 1 << 7.
        assert_eq!(bytes[..5], [0x12, 0xcd, 0x81, 0x80, 0x00]);
        assert_eq!(ReadBuffersResponse::decode(&*bytes).unwrap(), long);
    }

    #[test]
    fn a_short_message_straddling_a_slice_keeps_four_bytes() {
        // The first entry takes bytes 0..4090 of the first 4096-byte slice (tag,
        // 4-byte length, 4085 bytes of content). The second entry's length
        // field fits at 4091..4095, but its 12 bytes of content cross into the
        // next slice, so it is not compacted.
        let msg = ReadBuffersResponse {
            slices: vec![
                Slice {
                    data: Some(vec![1; 4080].into()),
                    last_slice_for_packet: Some(false),
                },
                Slice {
                    data: Some(vec![2; 8].into()),
                    last_slice_for_packet: Some(true),
                },
            ],
        };
        let bytes = encode(&msg);
        let second = 1 + 4 + (1 + 2 + 4080 + 2);
        assert_eq!(bytes[second..second + 5], [0x12, 0x8c, 0x80, 0x80, 0x00]);
        assert_eq!(ReadBuffersResponse::decode(&*bytes).unwrap(), msg);
    }

    #[test]
    fn a_reservation_that_does_not_fit_starts_a_new_slice() {
        let mut out = Vec::new();
        let mut w = ZeroWriter::new(&mut out);
        w.write(&[0; SLICE_SIZE - 2]);
        w.write(&[0x0a]);
        let nested = w.begin_nested();
        w.write(&[1, 2, 3]);
        w.end_nested(nested).unwrap();
        // The length field moved to the next slice with its content: compacted.
        assert_eq!(out[SLICE_SIZE - 1..], [3, 1, 2, 3]);
    }

    #[test]
    fn raw_message_fields_are_copied_verbatim() {
        // Field 9999 is unknown to DataSourceConfig; the raw bytes survive.
        let raw: &[u8] = b"\x0a\x01x\xf8\xf0\x04\x05";
        let ds = crate::protos::trace_config::DataSource {
            config: Some(bytes::Bytes::from_static(raw)),
            ..Default::default()
        };
        let cfg = TraceConfig {
            data_sources: vec![ds],
            ..Default::default()
        };
        let bytes = encode(&cfg);
        assert_eq!(bytes, b"\x12\x09\x0a\x07\x0a\x01x\xf8\xf0\x04\x05");
        let _ = DataSourceConfig::decode(raw).unwrap();
    }

    #[test]
    fn unknown_fields_of_raw_input_go_last_in_order() {
        let schema = DataSourceConfig::schema();
        // 9999: 1, 3: 5, 9998: 2, 1: "a".
        let input = b"\xf8\xf0\x04\x01\x18\x05\xf0\xf0\x04\x02\x0a\x01a";
        let mut out = Vec::new();
        reencode_into(schema, input, &mut out).unwrap();
        assert_eq!(out, b"\x0a\x01a\x18\x05\xf8\xf0\x04\x01\xf0\xf0\x04\x02");
        let mut bad = vec![1, 2];
        assert!(reencode_into(schema, b"\x0a\x05", &mut bad).is_err());
        assert_eq!(bad, [1, 2]);
    }

    #[test]
    fn redundant_varints() {
        assert_eq!(redundant_varint4(5), [0x85, 0x80, 0x80, 0x00]);
        assert_eq!(redundant_varint4(300), [0xac, 0x82, 0x80, 0x00]);
        assert_eq!(
            redundant_varint4(MAX_NESTED_LEN as u32),
            [0xff, 0xff, 0xff, 0x7f]
        );
    }
}
