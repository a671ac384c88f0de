//! The workspace's protobuf encoder (`shmtrace_abi::proto`) over a growable
//! `Vec<u8>`, for the std crates' messages of any size (service packets,
//! descriptors, configs).
//!
//! [`VecSink`] appends to a caller's vector and writes canonical protobuf,
//! byte for byte what [`SliceSink::new`](shmtrace_abi::proto::SliceSink::new)
//! writes given room: a nested message reserves one byte for its size; if
//! the body turns out longer than 127 bytes, the body moves forward to make
//! room for the minimal varint. Nothing here panics; the vector only grows.

use shmtrace_abi::proto::wire::{put_varint, MAX_VARINT_LEN};
use shmtrace_abi::proto::{EncodeError, Encoder, Message, Sink, SMALL_WRITE_LEN};

/// A [`Sink`] appending to a `Vec<u8>`.
#[derive(Debug)]
pub struct VecSink<'v> {
    out: &'v mut Vec<u8>,
    /// Length of `out` when the sink was made: positions count from here.
    base: usize,
}

impl<'v> VecSink<'v> {
    /// A sink appending to `out` (whatever `out` holds already stays).
    pub fn new(out: &'v mut Vec<u8>) -> Self {
        let base = out.len();
        Self { out, base }
    }

    /// Bytes appended so far.
    pub fn len(&self) -> usize {
        self.out.len() - self.base
    }

    /// `true` if nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Slot of a [`VecSink`]: the index in the vector of the 1-byte size
/// reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VecSlot(usize);

impl Sink for VecSink<'_> {
    type Slot = VecSlot;

    #[inline]
    fn write(&mut self, bytes: &[u8], _open: &mut [VecSlot]) {
        self.out.extend_from_slice(bytes);
    }

    #[inline]
    fn write_small(&mut self, buf: &[u8; SMALL_WRITE_LEN], len: usize, _open: &mut [VecSlot]) {
        self.out.extend_from_slice(buf.get(..len).unwrap_or(buf));
    }

    fn reserve_size_field(&mut self, _open: &mut [VecSlot]) -> VecSlot {
        self.out.push(0);
        VecSlot(self.out.len() - 1)
    }

    #[inline]
    fn position(&self) -> u32 {
        self.len() as u32
    }

    fn fill_size_field(&mut self, slot: VecSlot, size: u32) {
        let mut varint = [0u8; MAX_VARINT_LEN];
        let n = put_varint(u64::from(size), &mut varint);
        let (at, bytes) = (slot.0, varint.get(..n).unwrap_or(&[]));
        match (self.out.get_mut(at), bytes) {
            (Some(reserved), &[b]) => *reserved = b,
            // Grow the 1-byte reservation: the body moves forward.
            (Some(_), _) => drop(self.out.splice(at..=at, bytes.iter().copied())),
            (None, _) => {}
        }
    }
}

/// Appends the message `f` writes to `out`.
///
/// Errors: the first error latched while encoding (invalid field number,
/// nesting too deep, a field longer than the 4-byte size limit); the bytes
/// appended are then incomplete (the offending field or message is left
/// out).
pub fn encode_to_vec(
    out: &mut Vec<u8>,
    f: impl FnOnce(&mut Message<'_, VecSink<'_>>),
) -> Result<(), EncodeError> {
    let mut enc = Encoder::new(VecSink::new(out));
    f(&mut enc.root());
    enc.close_all();
    match enc.error() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shmtrace_abi::proto::encode_to_slice;

    /// A message with nested messages of any size, written the same way
    /// into any sink.
    fn write<S: Sink>(m: &mut Message<'_, S>, sizes: &[(u32, usize)]) {
        m.uint64(8, 100);
        for &(field, len) in sizes {
            m.nested(field, |n| {
                n.int32(1, -1);
                n.bytes(2, &vec![0xA5; len]);
                n.nested(3, |inner| inner.string(4, "x"));
            });
        }
        m.string(23, "end");
    }

    #[test]
    fn appends_canonical_protobuf() {
        let mut out = vec![0xEE];
        encode_to_vec(&mut out, |m| {
            m.uint64(8, 100);
            m.nested(11, |t| t.uint32(9, 1));
        })
        .unwrap();
        assert_eq!(out, [0xEE, 0x40, 0x64, 0x5A, 0x02, 0x48, 0x01]);
        // A body of 200 bytes gets a 2-byte size.
        let mut out = Vec::new();
        encode_to_vec(&mut out, |m| m.nested(1, |n| n.bytes(2, &[7; 197]))).unwrap();
        assert_eq!(&out[..5], &[0x0A, 0xC8, 0x01, 0x12, 0xC5]);
        assert_eq!(out.len(), 3 + 200);
    }

    #[test]
    fn errors_are_reported() {
        let mut out = Vec::new();
        let e = encode_to_vec(&mut out, |m| m.uint64(0, 1));
        assert_eq!(e, Err(EncodeError::InvalidFieldNumber(0)));
        assert!(out.is_empty());
    }

    proptest! {
        #[test]
        fn writes_what_the_slice_sink_writes(
            sizes in prop::collection::vec((1u32..20, 0usize..20_000), 0..5),
        ) {
            let mut vec = Vec::new();
            encode_to_vec(&mut vec, |m| write(m, &sizes)).unwrap();
            let mut buf = vec![0u8; 128 * 1024];
            let n = encode_to_slice(&mut buf, |m| write(m, &sizes)).unwrap();
            prop_assert_eq!(&vec[..], &buf[..n]);
        }
    }
}
