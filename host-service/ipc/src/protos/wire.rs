//! A checked reader for the protobuf wire format, for bytes that may come from
//! a hostile peer.
//!
//! [`Fields`] walks the top-level fields of one serialized message and yields
//! each as a [`RawField`]: its number, its value and the exact bytes it
//! occupies (tag included), so a caller can copy fields verbatim, reorder them
//! or replace some without re-encoding the others.
//!
//! Varints are decoded (and [`put_varint`] encodes them) with the
//! workspace's one implementation, `shmtrace_abi::proto::wire`.
//!
//! Invariants: the reader never panics and never reads outside the input; a
//! malformed input yields one [`WireError`] and then the iterator ends. Groups
//! (wire types 3/4) are skipped as a unit, with their nesting depth bounded by
//! [`MAX_GROUP_DEPTH`].

use shmtrace_abi::proto::wire::{self, VarintError, MAX_VARINT_LEN};
use thiserror::Error;

/// How deep nested groups may be before the input is rejected (prost's own
/// recursion limit is 100; groups are obsolete, real inputs have none).
pub const MAX_GROUP_DEPTH: usize = 64;

/// Protobuf wire types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireType {
    /// 0: base-128 varint.
    Varint,
    /// 1: 8 bytes little endian.
    Fixed64,
    /// 2: varint length, then that many bytes.
    LengthDelimited,
    /// 3: a group, up to the matching end-group tag.
    StartGroup,
    /// 5: 4 bytes little endian.
    Fixed32,
}

impl WireType {
    fn from_tag(tag: u64) -> Result<Self, WireError> {
        match tag & 7 {
            0 => Ok(Self::Varint),
            1 => Ok(Self::Fixed64),
            2 => Ok(Self::LengthDelimited),
            3 => Ok(Self::StartGroup),
            4 => Err(WireError::UnexpectedEndGroup),
            5 => Ok(Self::Fixed32),
            other => Err(WireError::InvalidWireType(other as u8)),
        }
    }
}

/// Why bytes are not a well-formed protobuf message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input ends inside a field.
    #[error("message truncated inside a field")]
    Truncated,
    /// A varint is longer than 10 bytes.
    #[error("varint longer than 10 bytes")]
    VarintTooLong,
    /// Wire type 6 or 7.
    #[error("invalid wire type {0}")]
    InvalidWireType(u8),
    /// A tag with field number 0 or above 2^29-1.
    #[error("invalid field number")]
    InvalidFieldNumber,
    /// An end-group tag without a matching start.
    #[error("end-group tag without a start-group")]
    UnexpectedEndGroup,
    /// Groups nested deeper than [`MAX_GROUP_DEPTH`].
    #[error("groups nested deeper than {MAX_GROUP_DEPTH}")]
    GroupTooDeep,
}

/// The value of one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2: the payload, without its length prefix.
    LengthDelimited(&'a [u8]),
    /// Wire type 3: the group's content, without its start and end tags.
    Group(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

/// One field of a message as it appears in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawField<'a> {
    /// The field number (1 ..= 2^29-1).
    pub number: u32,
    /// The decoded value.
    pub value: Value<'a>,
    /// The whole field: tag, length prefix (if any) and payload.
    pub bytes: &'a [u8],
}

impl RawField<'_> {
    /// The wire type of the field.
    pub fn wire_type(&self) -> WireType {
        match self.value {
            Value::Varint(_) => WireType::Varint,
            Value::Fixed64(_) => WireType::Fixed64,
            Value::LengthDelimited(_) => WireType::LengthDelimited,
            Value::Group(_) => WireType::StartGroup,
            Value::Fixed32(_) => WireType::Fixed32,
        }
    }
}

/// Iterator over the top-level fields of a serialized message.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    /// Starts reading `buf`, which should hold exactly one message.
    pub fn new(buf: &'a [u8]) -> Self {
        Self {
            buf,
            pos: 0,
            failed: false,
        }
    }

    fn read_field(&mut self) -> Result<RawField<'a>, WireError> {
        let start = self.pos;
        let tag = read_varint(self.buf, &mut self.pos)?;
        let number = field_number(tag)?;
        let value = match WireType::from_tag(tag)? {
            WireType::Varint => Value::Varint(read_varint(self.buf, &mut self.pos)?),
            WireType::Fixed64 => {
                let b = take(self.buf, &mut self.pos, 8)?;
                Value::Fixed64(u64::from_le_bytes(
                    b.try_into().map_err(|_| WireError::Truncated)?,
                ))
            }
            WireType::Fixed32 => {
                let b = take(self.buf, &mut self.pos, 4)?;
                Value::Fixed32(u32::from_le_bytes(
                    b.try_into().map_err(|_| WireError::Truncated)?,
                ))
            }
            WireType::LengthDelimited => {
                let len = read_varint(self.buf, &mut self.pos)?;
                let len = usize::try_from(len).map_err(|_| WireError::Truncated)?;
                Value::LengthDelimited(take(self.buf, &mut self.pos, len)?)
            }
            WireType::StartGroup => {
                let content_start = self.pos;
                let content_end = skip_group(self.buf, &mut self.pos, number)?;
                Value::Group(
                    self.buf
                        .get(content_start..content_end)
                        .ok_or(WireError::Truncated)?,
                )
            }
        };
        let bytes = self.buf.get(start..self.pos).ok_or(WireError::Truncated)?;
        Ok(RawField {
            number,
            value,
            bytes,
        })
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<RawField<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        let field = self.read_field();
        self.failed = field.is_err();
        Some(field)
    }
}

fn field_number(tag: u64) -> Result<u32, WireError> {
    match u32::try_from(tag >> 3) {
        Ok(n) if (1..=0x1FFF_FFFF).contains(&n) => Ok(n),
        _ => Err(WireError::InvalidFieldNumber),
    }
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, len: usize) -> Result<&'a [u8], WireError> {
    let end = pos.checked_add(len).ok_or(WireError::Truncated)?;
    let out = buf.get(*pos..end).ok_or(WireError::Truncated)?;
    *pos = end;
    Ok(out)
}

/// Reads one varint at `*pos`, advancing `pos`.
pub fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, WireError> {
    let (value, len) = wire::read_varint(buf.get(*pos..).unwrap_or(&[])).map_err(|e| match e {
        VarintError::Truncated => WireError::Truncated,
        VarintError::TooLong => WireError::VarintTooLong,
    })?;
    *pos += len;
    Ok(value)
}

/// Skips the content of a group whose start tag (for `number`) was just read.
/// Returns the offset where the content ends (the start of the end tag).
fn skip_group(buf: &[u8], pos: &mut usize, number: u32) -> Result<usize, WireError> {
    // Field numbers of the open groups, innermost last.
    let mut open = [0u32; MAX_GROUP_DEPTH];
    let mut depth = 1;
    open[0] = number;
    loop {
        let tag_start = *pos;
        let tag = read_varint(buf, pos)?;
        let n = field_number(tag)?;
        match tag & 7 {
            0 => {
                read_varint(buf, pos)?;
            }
            1 => {
                take(buf, pos, 8)?;
            }
            2 => {
                let len = read_varint(buf, pos)?;
                take(
                    buf,
                    pos,
                    usize::try_from(len).map_err(|_| WireError::Truncated)?,
                )?;
            }
            3 => {
                let slot = open.get_mut(depth).ok_or(WireError::GroupTooDeep)?;
                *slot = n;
                depth += 1;
            }
            4 => {
                depth -= 1;
                if open.get(depth) != Some(&n) {
                    return Err(WireError::UnexpectedEndGroup);
                }
                if depth == 0 {
                    return Ok(tag_start);
                }
            }
            5 => {
                take(buf, pos, 4)?;
            }
            other => return Err(WireError::InvalidWireType(other as u8)),
        }
    }
}

/// Appends `value` as a minimal varint.
pub fn put_varint(out: &mut Vec<u8>, value: u64) {
    let mut varint = [0u8; MAX_VARINT_LEN];
    let n = wire::put_varint(value, &mut varint);
    out.extend_from_slice(varint.get(..n).unwrap_or(&varint));
}

/// Appends the tag of field `number` with wire type `wire_type`.
pub fn put_tag(out: &mut Vec<u8>, number: u32, wire_type: WireType) {
    let wt = match wire_type {
        WireType::Varint => 0,
        WireType::Fixed64 => 1,
        WireType::LengthDelimited => 2,
        WireType::StartGroup => 3,
        WireType::Fixed32 => 5,
    };
    put_varint(out, (u64::from(number) << 3) | wt);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(buf: &[u8]) -> Result<Vec<RawField<'_>>, WireError> {
        Fields::new(buf).collect()
    }

    #[test]
    fn reads_every_wire_type_with_exact_spans() {
        // 1: varint 150, 2: "hi", 3: fixed32 1, 4: fixed64 2, 5: group{6: 7}.
        let buf = [
            0x08, 0x96, 0x01, 0x12, 0x02, b'h', b'i', 0x1d, 1, 0, 0, 0, 0x21, 2, 0, 0, 0, 0, 0, 0,
            0, 0x2b, 0x30, 0x07, 0x2c,
        ];
        let f = collect(&buf).unwrap();
        assert_eq!(f.len(), 5);
        assert_eq!((f[0].number, f[0].value), (1, Value::Varint(150)));
        assert_eq!(f[0].bytes, &buf[0..3]);
        assert_eq!(f[1].value, Value::LengthDelimited(b"hi"));
        assert_eq!(f[1].bytes, &buf[3..7]);
        assert_eq!(f[2].value, Value::Fixed32(1));
        assert_eq!(f[3].value, Value::Fixed64(2));
        assert_eq!(f[4].value, Value::Group(&[0x30, 0x07]));
        assert_eq!(f[4].bytes, &buf[21..25]);
        assert_eq!(f[4].wire_type(), WireType::StartGroup);
    }

    #[test]
    fn rejects_malformed_input() {
        assert_eq!(collect(&[0x08]), Err(WireError::Truncated));
        assert_eq!(collect(&[0x12, 0x05, 1]), Err(WireError::Truncated));
        assert_eq!(collect(&[0x0e, 0]), Err(WireError::InvalidWireType(6)));
        assert_eq!(collect(&[0x00]), Err(WireError::InvalidFieldNumber));
        assert_eq!(collect(&[0x0c]), Err(WireError::UnexpectedEndGroup));
        assert_eq!(collect(&[0x0b, 0x14]), Err(WireError::UnexpectedEndGroup));
        assert_eq!(
            collect(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(WireError::VarintTooLong)
        );
        let deep: Vec<u8> = std::iter::repeat_n(0x0b, MAX_GROUP_DEPTH + 1).collect();
        assert_eq!(collect(&deep), Err(WireError::GroupTooDeep));
        // A huge length does not overflow.
        assert_eq!(
            collect(&[0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn iteration_stops_after_an_error() {
        let mut it = Fields::new(&[0x08, 0x01, 0x0e]);
        assert!(it.next().unwrap().is_ok());
        assert!(it.next().unwrap().is_err());
        assert!(it.next().is_none());
    }

    #[test]
    fn writes_minimal_varints_and_tags() {
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        put_tag(&mut out, 113, WireType::LengthDelimited);
        assert_eq!(out, [0xac, 0x02, 0x8a, 0x07]);
        let mut pos = 0;
        assert_eq!(read_varint(&out, &mut pos), Ok(300));
    }
}
