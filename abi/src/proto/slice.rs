//! Contiguous sinks: [`SliceSink`] over a caller's `&mut [u8]`, and
//! [`SizeCounter`], which only measures.
//!
//! # Size fields in one contiguous buffer
//!
//! Unlike the chunk writer, a contiguous sink can move a body after the fact,
//! so by default it produces canonical protobuf: a nested message reserves
//! one byte for its size and, if the body turns out longer than 127 bytes,
//! the body is moved forward to make room for the minimal varint. The buffer
//! therefore never needs more room than the final encoding, and
//! [`encoded_len`] is exactly the capacity [`encode_to_slice`] needs.
//! [`SliceSink::with_redundant_sizes`] instead writes every nested size as a
//! 4-byte redundant varint, the form a chunk writer uses for messages that
//! span chunks.

use super::encoder::{EncodeError, Encoder, Message, Sink, SMALL_WRITE_LEN};
use super::wire::{put_varint, redundant_varint4, varint_len, MAX_VARINT_LEN, SIZE_FIELD_LEN};

/// A [`Sink`] writing into one contiguous `&mut [u8]`.
///
/// Running out of room never panics: the sink stops writing, remembers the
/// overflow, and [`SliceSink::finish`] reports [`EncodeError::BufferFull`].
/// Bytes of the buffer past the encoded length may be overwritten (scratch
/// space for [`Sink::write_small`]).
pub struct SliceSink<'b> {
    buf: &'b mut [u8],
    pos: usize,
    overflowed: bool,
    redundant: bool,
}

/// Slot of a [`SliceSink`]: offset of the size field, `None` if it did not
/// fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceSlot(Option<usize>);

impl<'b> SliceSink<'b> {
    /// A sink over `buf` producing canonical (minimal) size varints.
    pub fn new(buf: &'b mut [u8]) -> Self {
        Self {
            buf,
            pos: 0,
            overflowed: false,
            redundant: false,
        }
    }

    /// A sink over `buf` that writes every nested size as a 4-byte redundant
    /// varint (`82 80 80 00` for 2), as protozero does for a message whose
    /// size field it cannot compact.
    pub fn with_redundant_sizes(buf: &'b mut [u8]) -> Self {
        Self {
            buf,
            pos: 0,
            overflowed: false,
            redundant: true,
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.pos
    }

    /// `true` if nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    /// The encoded length, or [`EncodeError::BufferFull`] if the buffer was
    /// too small.
    pub fn finish(&self) -> Result<usize, EncodeError> {
        if self.overflowed {
            Err(EncodeError::BufferFull)
        } else {
            Ok(self.pos)
        }
    }

    fn reserved_len(&self) -> usize {
        if self.redundant {
            SIZE_FIELD_LEN
        } else {
            1
        }
    }
}

impl Sink for SliceSink<'_> {
    type Slot = SliceSlot;

    #[inline]
    fn write(&mut self, bytes: &[u8], _open: &mut [SliceSlot]) {
        if self.overflowed {
            return;
        }
        match self.buf.get_mut(self.pos..self.pos + bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                self.pos += bytes.len();
            }
            None => self.overflowed = true,
        }
    }

    #[inline]
    fn write_small(&mut self, buf: &[u8; SMALL_WRITE_LEN], len: usize, open: &mut [SliceSlot]) {
        match self.buf.get_mut(self.pos..self.pos + SMALL_WRITE_LEN) {
            Some(dst) if !self.overflowed => {
                dst.copy_from_slice(buf);
                self.pos += len;
            }
            _ => self.write(buf.get(..len).unwrap_or(buf), open),
        }
    }

    fn reserve_size_field(&mut self, _open: &mut [SliceSlot]) -> SliceSlot {
        let at = self.pos;
        let len = self.reserved_len();
        if self.overflowed || self.buf.len().saturating_sub(at) < len {
            self.overflowed = true;
            return SliceSlot(None);
        }
        self.pos += len;
        SliceSlot(Some(at))
    }

    #[inline]
    fn position(&self) -> u32 {
        self.pos as u32
    }

    fn fill_size_field(&mut self, slot: SliceSlot, size: u32) {
        let Some(at) = slot.0 else { return };
        if self.overflowed {
            return;
        }
        if self.redundant {
            if let Some(dst) = self.buf.get_mut(at..at + SIZE_FIELD_LEN) {
                dst.copy_from_slice(&redundant_varint4(size));
            }
            return;
        }
        let mut varint = [0u8; MAX_VARINT_LEN];
        let n = put_varint(u64::from(size), &mut varint);
        let grow = n - 1;
        if grow > 0 {
            if self.buf.len() - self.pos < grow {
                self.overflowed = true;
                return;
            }
            self.buf.copy_within(at + 1..self.pos, at + n);
            self.pos += grow;
        }
        if let (Some(dst), Some(src)) = (self.buf.get_mut(at..at + n), varint.get(..n)) {
            dst.copy_from_slice(src);
        }
    }
}

/// A [`Sink`] that stores nothing and counts the bytes [`SliceSink::new`]
/// would produce. Use it to size a buffer before encoding.
#[derive(Debug, Default, Clone, Copy)]
pub struct SizeCounter {
    pos: u64,
}

impl SizeCounter {
    /// A counter at zero.
    pub const fn new() -> Self {
        Self { pos: 0 }
    }

    /// Bytes counted so far.
    pub fn len(&self) -> u64 {
        self.pos
    }

    /// `true` if nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }
}

/// Slot of a [`SizeCounter`] (it needs no location).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountedSlot;

impl Sink for SizeCounter {
    type Slot = CountedSlot;

    #[inline]
    fn write(&mut self, bytes: &[u8], _open: &mut [CountedSlot]) {
        self.pos += bytes.len() as u64;
    }

    fn reserve_size_field(&mut self, _open: &mut [CountedSlot]) -> CountedSlot {
        self.pos += 1;
        CountedSlot
    }

    #[inline]
    fn position(&self) -> u32 {
        self.pos as u32
    }

    fn fill_size_field(&mut self, _slot: CountedSlot, size: u32) {
        self.pos += varint_len(u64::from(size)) as u64 - 1;
    }
}

/// Encodes one message body into `buf` with `f` and returns its length.
///
/// Errors: [`EncodeError::BufferFull`] if `buf` is too small, or the first
/// error latched while encoding (invalid field number, nesting too deep,
/// message too long).
pub fn encode_to_slice(
    buf: &mut [u8],
    f: impl FnOnce(&mut Message<'_, SliceSink<'_>>),
) -> Result<usize, EncodeError> {
    let mut enc = Encoder::new(SliceSink::new(buf));
    f(&mut enc.root());
    enc.close_all();
    let len = enc.sink().finish()?;
    match enc.error() {
        Some(e) => Err(e),
        None => Ok(len),
    }
}

/// The encoded length of the message `f` writes (what [`encode_to_slice`]
/// would return given enough room), without storing it.
pub fn encoded_len(f: impl FnOnce(&mut Message<'_, SizeCounter>)) -> u64 {
    let mut enc = Encoder::new(SizeCounter::new());
    f(&mut enc.root());
    enc.into_sink().len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::MAX_DEPTH;
    use std::vec::Vec;

    fn encode(f: impl FnOnce(&mut Message<'_, SliceSink<'_>>)) -> Vec<u8> {
        let mut buf = [0u8; 512];
        let n = encode_to_slice(&mut buf, f).expect("encodes");
        buf[..n].to_vec()
    }

    fn encode_redundant(f: impl FnOnce(&mut Message<'_, SliceSink<'_>>)) -> Vec<u8> {
        let mut buf = [0u8; 512];
        let mut enc = Encoder::new(SliceSink::with_redundant_sizes(&mut buf));
        f(&mut enc.root());
        let n = enc.into_sink().finish().expect("fits");
        buf[..n].to_vec()
    }

    #[test]
    fn timestamp_packets_match_appendix_b() {
        assert_eq!(encode(|p| p.uint64(8, 100)), [0x40, 0x64]);
        assert_eq!(encode(|p| p.uint64(8, 101)), [0x40, 0x65]);
    }

    #[test]
    fn scalar_encodings() {
        assert_eq!(
            encode(|m| m.int32(1, -1)),
            [0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]
        );
        assert_eq!(
            encode(|m| m.int64(1, -2)),
            [0x08, 0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]
        );
        assert_eq!(encode(|m| m.sint32(1, -1)), [0x08, 0x01]);
        assert_eq!(encode(|m| m.sint64(1, -64)), [0x08, 0x7F]);
        assert_eq!(encode(|m| m.bool(2, true)), [0x10, 0x01]);
        assert_eq!(encode(|m| m.enumeration(9, 3)), [0x48, 0x03]);
        assert_eq!(encode(|m| m.uint32(13, 2)), [0x68, 0x02]);
        assert_eq!(encode(|m| m.fixed32(1, 0x0403_0201)), [0x0D, 1, 2, 3, 4]);
        assert_eq!(
            encode(|m| m.sfixed32(1, -1)),
            [0x0D, 0xFF, 0xFF, 0xFF, 0xFF]
        );
        assert_eq!(
            encode(|m| m.fixed64(47, 1)),
            [0xF9, 0x02, 1, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            encode(|m| m.sfixed64(1, -2)),
            [0x09, 0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]
        );
        assert_eq!(
            encode(|m| m.double(5, 1.0)),
            [0x29, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F]
        );
        assert_eq!(encode(|m| m.float(1, 1.0)), [0x0D, 0, 0, 0x80, 0x3F]);
        assert_eq!(encode(|m| m.string(2, "hi")), [0x12, 0x02, b'h', b'i']);
        assert_eq!(encode(|m| m.bytes(36, &[])), [0xA2, 0x02, 0x00]);
        // Field 87 (first_packet_on_sequence) needs a two-byte tag.
        assert_eq!(encode(|m| m.bool(87, true)), [0xB8, 0x05, 0x01]);
        // previous_packet_dropped = 257.
        assert_eq!(encode(|m| m.uint32(42, 257)), [0xD0, 0x02, 0x81, 0x02]);
    }

    #[test]
    fn packed_fields() {
        assert_eq!(
            encode(|m| m.packed_uint64(3, &[1, 300])),
            [0x1A, 0x03, 0x01, 0xAC, 0x02]
        );
        assert_eq!(encode(|m| m.packed_uint32(4, &[])), [0x22, 0x00]);
        assert_eq!(encode(|m| m.packed_int64(5, &[-1])).len(), 2 + 10);
    }

    #[test]
    fn small_nested_messages_are_compacted() {
        // TracePacket{track_event{type=SLICE_BEGIN}}
        assert_eq!(
            encode(|p| p.nested(11, |te| te.uint32(9, 1))),
            [0x5A, 0x02, 0x48, 0x01]
        );
        // Two levels, plus a field after the nested one.
        let bytes = encode(|p| {
            p.uint64(8, 100);
            p.nested(11, |te| {
                te.nested(4, |da| {
                    da.uint64(1, 7);
                    da.int64(4, 42);
                });
                te.uint64(10, 5);
            });
            p.uint32(13, 2);
        });
        assert_eq!(
            bytes,
            [0x40, 0x64, 0x5A, 0x08, 0x22, 0x04, 0x08, 0x07, 0x20, 0x2A, 0x50, 0x05, 0x68, 0x02]
        );
    }

    #[test]
    fn nested_sizes_are_redundant_varints_without_compaction() {
        let bytes = encode_redundant(|p| p.nested(11, |te| te.uint32(9, 1)));
        assert_eq!(bytes, [0x5A, 0x82, 0x80, 0x80, 0x00, 0x48, 0x01]);
        // An empty nested message: size 0 is `80 80 80 00`, never a zero byte.
        let bytes = encode_redundant(|p| drop(p.begin_nested(11)));
        assert_eq!(bytes, [0x5A, 0x80, 0x80, 0x80, 0x00]);
        // Two levels: the outer size covers the inner 4-byte size.
        let bytes = encode_redundant(|p| p.nested(1, |a| a.nested(2, |b| b.uint32(3, 1))));
        assert_eq!(
            bytes,
            [0x0A, 0x87, 0x80, 0x80, 0x00, 0x12, 0x82, 0x80, 0x80, 0x00, 0x18, 0x01]
        );
    }

    #[test]
    fn large_nested_message_gets_a_minimal_varint_size() {
        let blob = [0xABu8; 130];
        let bytes = encode(|p| p.nested(11, |m| m.bytes(6, &blob)));
        // body = tag(1) + len varint(2) + 130 = 133 -> 85 01.
        assert_eq!(&bytes[..6], &[0x5A, 0x85, 0x01, 0x32, 0x82, 0x01]);
        assert_eq!(&bytes[6..], &blob[..]);
        // Redundant mode: 85 81 80 00.
        let bytes = encode_redundant(|p| p.nested(11, |m| m.bytes(6, &blob)));
        assert_eq!(
            &bytes[..8],
            &[0x5A, 0x85, 0x81, 0x80, 0x00, 0x32, 0x82, 0x01]
        );
        assert_eq!(bytes.len(), 5 + 133);
        // 127 bytes of body fit a 1-byte size; 128 need two.
        let b125 = [0u8; 125];
        assert_eq!(
            encode(|p| p.nested(1, |m| m.bytes(2, &b125)))[..2],
            [0x0A, 127]
        );
        let b126 = [0u8; 126];
        assert_eq!(
            encode(|p| p.nested(1, |m| m.bytes(2, &b126)))[..3],
            [0x0A, 0x80, 0x01]
        );
        // A body past 16 KiB takes a 3-byte size and everything shifts intact.
        let big = std::vec![0x5Au8; 20_000];
        let bytes = {
            let mut buf = std::vec![0u8; 20_010];
            let n = encode_to_slice(&mut buf, |p| p.nested(1, |m| m.bytes(2, &big))).unwrap();
            buf.truncate(n);
            buf
        };
        // body = 1 + 3 + 20000 = 20004 = 0x4E24 -> A4 9C 01.
        assert_eq!(&bytes[..7], &[0x0A, 0xA4, 0x9C, 0x01, 0x12, 0xA0, 0x9C]);
        assert_eq!(bytes.len(), 4 + 20_004);
        assert!(bytes[8..].iter().all(|&b| b == 0x5A));
    }

    #[test]
    fn parent_size_accounts_for_compacted_children() {
        // Outer body: inner compacted (tag 1 + size 1 + 2 body) + 100-byte blob
        // field (1 + 1 + 100) = 106 -> itself compacted.
        let blob = [1u8; 100];
        let bytes = encode(|p| {
            p.nested(1, |outer| {
                outer.nested(2, |inner| inner.uint32(1, 1));
                outer.bytes(3, &blob);
            })
        });
        assert_eq!(&bytes[..6], &[0x0A, 106, 0x12, 0x02, 0x08, 0x01]);
        assert_eq!(bytes.len(), 2 + 106);
    }

    #[test]
    fn forgotten_child_is_closed_before_the_parent_writes() {
        let bytes = encode(|p| {
            let child = p.begin_nested(11);
            core::mem::forget(child);
            p.uint32(13, 2);
        });
        // The child is closed empty, then the parent's field follows it.
        assert_eq!(bytes, [0x5A, 0x00, 0x68, 0x02]);
    }

    #[test]
    fn nesting_past_max_depth_drops_the_subtree_and_reports_it() {
        fn nest(m: &mut Message<'_, SliceSink<'_>>, levels: usize) {
            if levels == 0 {
                m.uint32(1, 9);
                return;
            }
            m.nested(1, |c| nest(c, levels - 1));
        }
        let mut buf = [0u8; 256];
        let mut enc = Encoder::new(SliceSink::new(&mut buf));
        nest(&mut enc.root(), MAX_DEPTH + 3);
        enc.root().uint32(2, 5);
        assert_eq!(enc.dropped_messages(), 1);
        assert_eq!(enc.error(), Some(EncodeError::NestingTooDeep));
        let n = enc.into_sink().finish().expect("fits");
        // MAX_DEPTH empty-bodied chains: 0A <size> ... with the innermost
        // (depth MAX_DEPTH) message empty, then field 2.
        let mut expected = Vec::new();
        for level in 0..MAX_DEPTH {
            expected.push(0x0A);
            expected.push((2 * (MAX_DEPTH - 1 - level)) as u8);
        }
        expected.extend_from_slice(&[0x10, 0x05]);
        assert_eq!(&buf[..n], &expected[..]);
        // And the public helper reports the error.
        let mut buf = [0u8; 256];
        assert_eq!(
            encode_to_slice(&mut buf, |m| nest(m, MAX_DEPTH + 1)),
            Err(EncodeError::NestingTooDeep)
        );
    }

    #[test]
    fn invalid_field_numbers_are_skipped_and_reported() {
        let mut buf = [0u8; 16];
        assert_eq!(
            encode_to_slice(&mut buf, |m| {
                m.uint32(0, 1);
                m.uint32(1, 1);
            }),
            Err(EncodeError::InvalidFieldNumber(0))
        );
        let mut enc = Encoder::new(SliceSink::new(&mut buf));
        enc.root().uint32(1 << 29, 1);
        enc.root().nested(0, |m| m.uint32(1, 1));
        enc.root().uint32(1, 1);
        assert_eq!(enc.error(), Some(EncodeError::InvalidFieldNumber(1 << 29)));
        assert_eq!(enc.into_sink().finish(), Ok(2));
        assert_eq!(&buf[..2], &[0x08, 0x01]);
    }

    #[test]
    fn full_buffer_is_an_error_not_a_panic() {
        // The exact final length always suffices; one byte less never does.
        for len in 0..12 {
            let mut buf = std::vec![0u8; len];
            let r = encode_to_slice(&mut buf, |p| {
                p.uint64(8, 100);
                p.nested(11, |te| te.string(23, "name"));
            });
            if len >= 11 {
                assert_eq!(r, Ok(11), "len {len}");
            } else {
                assert_eq!(r, Err(EncodeError::BufferFull), "len {len}");
            }
        }
    }

    #[test]
    fn message_too_long_is_detected() {
        /// A sink whose position can jump, to simulate a 256 MiB body.
        struct Jumpy(u32);
        impl Sink for Jumpy {
            type Slot = ();
            fn write(&mut self, bytes: &[u8], _: &mut [()]) {
                self.0 = self.0.wrapping_add(bytes.len() as u32);
            }
            fn reserve_size_field(&mut self, _: &mut [()]) {
                self.0 += 4;
            }
            fn position(&self) -> u32 {
                self.0
            }
            fn fill_size_field(&mut self, _: (), size: u32) {
                assert!(size <= MAX_MESSAGE_LEN_FOR_TEST);
            }
        }
        const MAX_MESSAGE_LEN_FOR_TEST: u32 = crate::proto::wire::MAX_MESSAGE_LEN;
        let mut enc = Encoder::new(Jumpy(0));
        {
            let mut root = enc.root();
            let _child = root.begin_nested(1);
        }
        assert_eq!(enc.error(), None);
        {
            let mut root = enc.root();
            let mut child = root.begin_nested(1);
            child.uint32(1, 1);
            drop(child);
        }
        let mut enc2 = Encoder::new(Jumpy(0));
        {
            let mut root = enc2.root();
            let mut child = root.begin_nested(1);
            child.raw(&[]);
        }
        assert_eq!(enc2.error(), None);
        // Now a body over the limit.
        let mut enc3 = Encoder::new(Jumpy(0));
        {
            let mut root = enc3.root();
            let child = root.begin_nested(1);
            core::mem::forget(child);
        }
        enc3.sink_and_slots().0 .0 += MAX_MESSAGE_LEN_FOR_TEST + 1;
        enc3.close_all();
        assert_eq!(
            enc3.error(),
            Some(EncodeError::MessageTooLong(
                u64::from(MAX_MESSAGE_LEN_FOR_TEST) + 1
            ))
        );
    }

    #[test]
    fn size_counter_agrees_with_slice_sink() {
        fn write<S: Sink>(p: &mut Message<'_, S>) {
            let blob = [7u8; 200];
            p.uint64(8, 1 << 40);
            p.nested(11, |te| {
                te.nested(4, |da| da.string(10, "x"));
                te.bytes(6, &blob);
                te.nested(5, |_| ());
            });
            p.double(1, 0.5);
        }
        let mut buf = [0u8; 512];
        let n = encode_to_slice(&mut buf, |p| {
            write(p);
        })
        .expect("fits");
        assert_eq!(
            encoded_len(|p| {
                write(p);
            }),
            n as u64
        );
    }
}
