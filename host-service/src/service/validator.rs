//! The packet stream validator: which producer packets the service accepts.
//!
//! A producer packet is returned to consumers only if its top-level fields
//! are well-formed and it does not set a field only the service may write
//! (Perfetto's `PacketStreamValidator`,
//! src/tracing/service/packet_stream_validator.cc). Validation streams over
//! the packet's slices (a packet that spanned chunks arrives in pieces), so
//! no packet is ever copied to be checked. Nested content is not inspected.
//!
//! The check is what makes the trusted appendix ([`super::trusted`]) sound:
//! the appendix relies on "last value wins", so the producer must not be
//! able to write the trusted fields itself, and a truncated packet — whose
//! dangling field would swallow the appendix — must be rejected.

use shmtrace_abi::proto::wire::{VarintDecoder, MAX_FIELD_NUMBER, MAX_MESSAGE_LEN};
use shmtrace_abi::trace::trace_packet as tp;
use thiserror::Error;

/// Top-level `TracePacket` fields only the service may write.
pub const RESERVED_FIELDS: [u32; 12] = [
    tp::TRUSTED_UID,
    tp::TRUSTED_PACKET_SEQUENCE_ID,
    tp::TRACE_CONFIG,
    tp::TRACE_STATS,
    tp::SYNCHRONIZATION_MARKER,
    tp::COMPRESSED_PACKETS,
    tp::SERVICE_EVENT,
    tp::TRUSTED_PID,
    tp::MACHINE_ID,
    tp::TRACE_PROVENANCE,
    tp::PROTOVMS,
    tp::ZSTD_COMPRESSED_PACKETS,
];

/// Longest length-delimited field accepted (`2^28 - 1`).
pub const MAX_FIELD_LEN: u64 = MAX_MESSAGE_LEN as u64;

/// Why a producer packet was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum InvalidPacket {
    /// The packet sets a field reserved for the service.
    #[error("packet sets field {0}, which only the service may write")]
    ReservedField(u32),
    /// A wire type other than varint, fixed64, length-delimited, fixed32.
    #[error("field {field} has wire type {wire_type}, not allowed at the top level")]
    InvalidWireType {
        /// Field number.
        field: u32,
        /// Wire type.
        wire_type: u8,
    },
    /// Field number 0 or above `2^29 - 1`.
    #[error("invalid field number")]
    InvalidFieldNumber,
    /// A varint longer than 10 bytes.
    #[error("varint longer than 10 bytes")]
    VarintTooLong,
    /// A length-delimited field longer than [`MAX_FIELD_LEN`].
    #[error("field {field} is {len} bytes long (limit {MAX_FIELD_LEN})")]
    FieldTooLong {
        /// Field number.
        field: u32,
        /// Declared length.
        len: u64,
    },
    /// The packet ends inside a field.
    #[error("packet truncated inside a field")]
    Truncated,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Reading a tag varint.
    Tag,
    /// Skipping a varint value.
    Varint,
    /// Reading the length varint of field `field`.
    Length { field: u32 },
    /// Skipping `n` more bytes.
    Skip { n: u64 },
}

/// A streaming validator: [`feed`](Self::feed) the slices of one packet,
/// then [`finish`](Self::finish).
#[derive(Debug, Clone)]
pub struct PacketValidator {
    state: State,
    varint: VarintDecoder,
    error: Option<InvalidPacket>,
}

impl Default for PacketValidator {
    fn default() -> Self {
        Self::new()
    }
}

impl PacketValidator {
    /// A validator at the start of a packet.
    pub fn new() -> Self {
        Self {
            state: State::Tag,
            varint: VarintDecoder::new(),
            error: None,
        }
    }

    /// Consumes the next slice of the packet.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while self.error.is_none() && !bytes.is_empty() {
            match self.state {
                State::Skip { n } => {
                    let take = n.min(bytes.len() as u64);
                    bytes = &bytes[take as usize..];
                    let left = n - take;
                    self.state = if left == 0 {
                        State::Tag
                    } else {
                        State::Skip { n: left }
                    };
                }
                State::Tag | State::Varint | State::Length { .. } => {
                    let b = bytes[0];
                    bytes = &bytes[1..];
                    if let Some(value) = self.push_varint_byte(b) {
                        self.on_varint(value);
                    }
                }
            }
        }
    }

    /// Adds one byte to the varint being read; the value once complete.
    fn push_varint_byte(&mut self, b: u8) -> Option<u64> {
        match self.varint.push(b) {
            Ok(value) => value,
            // A tenth byte that still continues: too long, whatever
            // follows.
            Err(_) => {
                self.error = Some(InvalidPacket::VarintTooLong);
                None
            }
        }
    }

    fn on_varint(&mut self, value: u64) {
        match self.state {
            State::Tag => {
                let field = value >> 3;
                if field == 0 || field > u64::from(MAX_FIELD_NUMBER) {
                    self.error = Some(InvalidPacket::InvalidFieldNumber);
                    return;
                }
                let field = field as u32;
                if RESERVED_FIELDS.contains(&field) {
                    self.error = Some(InvalidPacket::ReservedField(field));
                    return;
                }
                self.state = match value & 7 {
                    0 => State::Varint,
                    1 => State::Skip { n: 8 },
                    2 => State::Length { field },
                    5 => State::Skip { n: 4 },
                    other => {
                        self.error = Some(InvalidPacket::InvalidWireType {
                            field,
                            wire_type: other as u8,
                        });
                        return;
                    }
                };
            }
            State::Varint => self.state = State::Tag,
            State::Length { field } => {
                if value > MAX_FIELD_LEN {
                    self.error = Some(InvalidPacket::FieldTooLong { field, len: value });
                    return;
                }
                self.state = if value == 0 {
                    State::Tag
                } else {
                    State::Skip { n: value }
                };
            }
            State::Skip { .. } => {}
        }
    }

    /// The verdict, once every slice was fed.
    pub fn finish(self) -> Result<(), InvalidPacket> {
        if let Some(e) = self.error {
            return Err(e);
        }
        match self.state {
            State::Tag if self.varint.is_empty() => Ok(()),
            _ => Err(InvalidPacket::Truncated),
        }
    }
}

/// Validates a packet given as slices.
pub fn validate<'a>(slices: impl IntoIterator<Item = &'a [u8]>) -> Result<(), InvalidPacket> {
    let mut v = PacketValidator::new();
    for s in slices {
        v.feed(s);
    }
    v.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shmtrace_abi::proto::wire::{put_varint, tag, WireType, MAX_VARINT_LEN};

    #[test]
    fn accepts_producer_fields() {
        // timestamp=100, track_event{...}, sequence_flags=2, a fixed64 and a
        // fixed32 field, previous_packet_dropped=257, for_testing{}.
        let pkt = [
            0x40, 0x64, 0x5A, 0x02, 0x08, 0x01, 0x68, 0x02, 0x09, 1, 2, 3, 4, 5, 6, 7, 8, 0x15, 1,
            2, 3, 4, 0xD0, 0x02, 0x81, 0x02, 0xA2, 0x38, 0x00,
        ];
        assert_eq!(validate([&pkt[..]]), Ok(()));
        // Any split into slices gives the same verdict.
        for cut in 0..pkt.len() {
            assert_eq!(validate([&pkt[..cut], &pkt[cut..]]), Ok(()), "cut at {cut}");
        }
        assert_eq!(validate([]), Ok(()));
    }

    #[test]
    fn rejects_every_reserved_field() {
        for field in RESERVED_FIELDS {
            let mut t = [0u8; MAX_VARINT_LEN];
            let n = put_varint(u64::from(tag(field, WireType::Varint)), &mut t);
            let pkt = [&t[..n], &[0x00]].concat();
            assert_eq!(
                validate([&pkt[..]]),
                Err(InvalidPacket::ReservedField(field))
            );
        }
        // trigger (46) and previous_packet_dropped (42) are not reserved.
        assert_eq!(
            validate([&[0xF2, 0x02, 0x00, 0xD0, 0x02, 0x01][..]]),
            Ok(())
        );
    }

    #[test]
    fn rejects_malformed_packets() {
        // Group start (wire type 3) and wire types 6/7.
        assert_eq!(
            validate([&[0x0B][..]]),
            Err(InvalidPacket::InvalidWireType {
                field: 1,
                wire_type: 3
            })
        );
        assert_eq!(
            validate([&[0x0E][..]]),
            Err(InvalidPacket::InvalidWireType {
                field: 1,
                wire_type: 6
            })
        );
        // Field number 0.
        assert_eq!(
            validate([&[0x00][..]]),
            Err(InvalidPacket::InvalidFieldNumber)
        );
        // 11-byte varint.
        let long = [
            0x40, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01,
        ];
        assert_eq!(validate([&long[..]]), Err(InvalidPacket::VarintTooLong));
        // Ten continuing bytes are too long even when the input ends there;
        // a 10-byte varint is fine.
        assert_eq!(validate([&long[..11]]), Err(InvalidPacket::VarintTooLong));
        let ten = [
            0x40, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01,
        ];
        assert_eq!(validate([&ten[..]]), Ok(()));
        // Length 2^28.
        assert_eq!(
            validate([&[0x5A, 0x80, 0x80, 0x80, 0x80, 0x01][..]]),
            Err(InvalidPacket::FieldTooLong {
                field: 11,
                len: 1 << 28
            })
        );
        // Truncated: inside a length-delimited field, a varint, a fixed64,
        // a tag.
        assert_eq!(
            validate([&[0x5A, 0x05, 1, 2][..]]),
            Err(InvalidPacket::Truncated)
        );
        assert_eq!(validate([&[0x40, 0x80][..]]), Err(InvalidPacket::Truncated));
        assert_eq!(validate([&[0x09, 1, 2][..]]), Err(InvalidPacket::Truncated));
        assert_eq!(
            validate([&[0x40, 0x01, 0xD0][..]]),
            Err(InvalidPacket::Truncated)
        );
    }

    proptest! {
        #[test]
        fn slicing_never_changes_the_verdict(bytes in prop::collection::vec(any::<u8>(), 0..64), cuts in prop::collection::vec(0..64usize, 0..4)) {
            let whole = validate([&bytes[..]]);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut slices = Vec::new();
            let mut prev = 0;
            for c in cuts {
                slices.push(&bytes[prev..c]);
                prev = c;
            }
            slices.push(&bytes[prev..]);
            prop_assert_eq!(validate(slices), whole);
        }
    }
}
