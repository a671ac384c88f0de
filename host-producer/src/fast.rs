//! A byte writer for the producer's most common packet shape.
//!
//! Almost every track event is a TracePacket with a timestamp, sequence
//! flags, one TrackEvent (a few varints, maybe short strings and flat debug
//! annotations) and sometimes a little `interned_data`. The general encoder
//! (`shmtrace_abi::proto`) handles any message over a scattered chunk
//! stream; for this one shape, written into a small contiguous buffer with
//! constant tags, a plain cursor is several times cheaper. The result is
//! then copied into the trace writer in one piece.
//!
//! # Invariants
//!
//! * Every write is bounds-checked with one comparison: a write that does
//!   not fit is skipped but still counted in `len`, so once `len` exceeds
//!   the buffer [`FastBuf::finish`] reports the overflow (the caller then
//!   encodes the event with the general encoder instead). Nothing here
//!   panics, and there is no "failed" flag to test on every write.
//! * Nested lengths are reserved as 2 bytes and back-filled as a *redundant*
//!   varint (`0x80 | low7, high7`), the same non-minimal form Perfetto's own
//!   encoder uses for nested sizes; every protobuf parser accepts it. A body
//!   longer than 16383 bytes cannot be expressed and fails the buffer.

/// A cursor over a caller's buffer. See the module docs.
pub(crate) struct FastBuf<'b> {
    buf: &'b mut [u8],
    /// Bytes written or skipped; past `buf.len()` the encoding failed.
    len: usize,
}

/// Largest body a 2-byte redundant varint length can describe.
const MAX_LEN2: usize = (1 << 14) - 1;

/// A `len` no buffer reaches: the encoding failed.
const FAILED: usize = usize::MAX / 2;

impl<'b> FastBuf<'b> {
    pub(crate) fn new(buf: &'b mut [u8]) -> Self {
        FastBuf { buf, len: 0 }
    }

    /// Bytes written, or `None` if the buffer was too small.
    #[inline(always)]
    pub(crate) fn finish(&self) -> Option<usize> {
        (self.len <= self.buf.len()).then_some(self.len)
    }

    /// Appends raw bytes (a tag, a constant prefix, string contents).
    #[inline(always)]
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        let end = self.len.saturating_add(bytes.len());
        if let Some(dst) = self.buf.get_mut(self.len..end) {
            dst.copy_from_slice(bytes);
        }
        self.len = end;
    }

    /// Appends one byte.
    #[inline(always)]
    pub(crate) fn byte(&mut self, b: u8) {
        if let Some(dst) = self.buf.get_mut(self.len) {
            *dst = b;
        }
        self.len = self.len.saturating_add(1);
    }

    /// Appends a varint.
    #[inline(always)]
    pub(crate) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    /// Appends 8 little-endian bytes (fixed64, double).
    #[inline(always)]
    pub(crate) fn fixed64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    /// Appends a length-delimited string/bytes field body: `len` varint then
    /// the bytes (the tag was written by the caller).
    #[inline(always)]
    pub(crate) fn len_bytes(&mut self, bytes: &[u8]) {
        self.varint(bytes.len() as u64);
        self.bytes(bytes);
    }

    /// Reserves a 2-byte length for a nested message and returns where the
    /// body starts.
    #[inline(always)]
    pub(crate) fn begin_nested(&mut self) -> usize {
        self.bytes(&[0, 0]);
        self.len
    }

    /// Back-fills the length of the nested message whose body started at
    /// `start`.
    #[inline(always)]
    pub(crate) fn end_nested(&mut self, start: usize) {
        let size = self.len.wrapping_sub(start);
        if size > MAX_LEN2 {
            self.len = FAILED;
            return;
        }
        if let Some(dst) = self.buf.get_mut(start.wrapping_sub(2)..start) {
            dst[0] = (size as u8 & 0x7F) | 0x80;
            dst[1] = (size >> 7) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_nesting() {
        let mut b = [0u8; 64];
        let mut f = FastBuf::new(&mut b);
        f.byte(0x40);
        f.varint(300);
        let at = f.begin_nested();
        f.varint(1);
        f.end_nested(at);
        let n = f.finish().unwrap();
        assert_eq!(&b[..n], &[0x40, 0xAC, 0x02, 0x81, 0x00, 0x01]);
    }

    #[test]
    fn overflow_is_reported_not_panicked() {
        let mut b = [0u8; 4];
        let mut f = FastBuf::new(&mut b);
        f.bytes(b"abc");
        f.bytes(b"de");
        assert_eq!(f.finish(), None);
        let mut b = [0u8; 5];
        let mut f = FastBuf::new(&mut b);
        f.varint(u64::MAX);
        assert_eq!(f.finish(), None);
    }

    #[test]
    fn nested_too_long() {
        let mut b = vec![0u8; 20000];
        let mut f = FastBuf::new(&mut b);
        let at = f.begin_nested();
        f.bytes(&[1u8; MAX_LEN2 + 1]);
        f.end_nested(at);
        assert_eq!(f.finish(), None);
    }
}
