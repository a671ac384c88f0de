//! A byte writer for the producer's most common packet shape.
//!
//! Almost every track event is a TracePacket with a timestamp, sequence
//! flags, one TrackEvent (a few varints, maybe short strings and flat debug
//! annotations) and sometimes a little `interned_data`. The general encoder
//! (`shmtrace_abi::proto`) handles any message over a scattered chunk
//! stream; for this one shape, written into a small contiguous buffer with
//! constant tags, a plain cursor is several times cheaper. The packet is
//! written straight into the current chunk (a [`Window`] of its free
//! payload) or, when that is not available, into a scratch array that is
//! then copied into the trace writer in one piece.
//!
//! # Invariants
//!
//! * The [`Target`] is a fixed-size buffer whose length is a power of two,
//!   and every single-byte write lands at `len % CAP`: the index is in
//!   bounds by construction, so a byte costs a store and an increment (no
//!   bounds check, no branch). Slices (string contents) are copied only if
//!   they fit; one that does not fit marks the encoding failed.
//! * `len` counts every byte written or skipped. Once it exceeds the
//!   capacity the bytes in the buffer are garbage (single bytes wrapped
//!   around) and [`FastBuf::finish`] reports the overflow; the caller then
//!   encodes the event another way. Nothing here panics, and there is no
//!   "failed" flag to test on every write.
//! * Nested lengths are reserved as 2 bytes and back-filled as a *redundant*
//!   varint (`0x80 | low7, high7`), the same non-minimal form Perfetto's own
//!   encoder uses for nested sizes; every protobuf parser accepts it. A
//!   nested message known to be shorter than 128 bytes gets a 1-byte length
//!   instead ([`FastBuf::begin_short`]).

use shmtrace_abi::smb::{Window, WINDOW_LEN, WINDOW_SLACK};

/// Capacity of the scratch array (a power of two: see the module docs).
pub(crate) const FAST_CAP: usize = 512;

/// The scratch array: [`FAST_CAP`] bytes and room for an 8-byte write at
/// any index below it.
pub(crate) type Scratch = [u8; FAST_CAP + WINDOW_SLACK];

/// A `len` no encoding reaches by single bytes: a slice did not fit.
const FAILED: usize = usize::MAX / 2;

/// A fixed-size buffer a [`FastBuf`] writes into.
pub(crate) trait Target {
    /// Capacity in bytes: a power of two.
    const CAP: usize;
    /// Writes `byte` at `index % CAP`.
    fn put(&mut self, index: usize, byte: u8);
    /// Writes the 8 little-endian bytes of `word` at `index % CAP` (the
    /// buffer has room past `CAP` for them).
    fn put_u64(&mut self, index: usize, word: u64);
    /// Copies `src` to `index`; `false` (nothing written) if it does not
    /// fit.
    fn put_slice(&mut self, index: usize, src: &[u8]) -> bool;
}

impl Target for Scratch {
    const CAP: usize = FAST_CAP;

    #[inline(always)]
    fn put(&mut self, index: usize, byte: u8) {
        self[index & (FAST_CAP - 1)] = byte;
    }

    #[inline(always)]
    fn put_u64(&mut self, index: usize, word: u64) {
        let at = index & (FAST_CAP - 1);
        if let Some(dst) = self.get_mut(at..at + 8) {
            dst.copy_from_slice(&word.to_le_bytes());
        }
    }

    #[inline(always)]
    fn put_slice(&mut self, index: usize, src: &[u8]) -> bool {
        match self.get_mut(index..index.wrapping_add(src.len())) {
            Some(dst) => {
                dst.copy_from_slice(src);
                true
            }
            None => false,
        }
    }
}

impl Target for Window<'_> {
    const CAP: usize = WINDOW_LEN;

    #[inline(always)]
    fn put(&mut self, index: usize, byte: u8) {
        Window::put(self, index, byte);
    }

    #[inline(always)]
    fn put_u64(&mut self, index: usize, word: u64) {
        Window::put_u64(self, index, word);
    }

    #[inline(always)]
    fn put_slice(&mut self, index: usize, src: &[u8]) -> bool {
        Window::put_slice(self, index, src)
    }
}

/// A cursor over a [`Target`]. See the module docs.
pub(crate) struct FastBuf<'b, T: Target> {
    buf: &'b mut T,
    /// Bytes written or skipped; past `T::CAP` the encoding failed.
    len: usize,
}

impl<'b, T: Target> FastBuf<'b, T> {
    #[inline(always)]
    pub(crate) fn new(buf: &'b mut T) -> Self {
        FastBuf { buf, len: 0 }
    }

    /// Bytes written, or `None` if the buffer was too small.
    #[inline(always)]
    pub(crate) fn finish(&self) -> Option<usize> {
        (self.len <= T::CAP).then_some(self.len)
    }

    /// Appends raw bytes (string contents).
    #[inline(always)]
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        if self.buf.put_slice(self.len, bytes) {
            self.len += bytes.len();
        } else {
            self.len = FAILED;
        }
    }

    /// Appends one byte.
    #[inline(always)]
    pub(crate) fn byte(&mut self, b: u8) {
        self.buf.put(self.len, b);
        self.len += 1;
    }

    /// Appends the low `n` (at most 8) bytes of `word`, little-endian, with
    /// one 8-byte store (constant runs of tags and small values).
    #[inline(always)]
    pub(crate) fn word(&mut self, word: u64, n: usize) {
        self.buf.put_u64(self.len, word);
        self.len += n;
    }

    /// Appends two bytes (a two-byte tag, or a tag and a small value).
    #[inline(always)]
    pub(crate) fn byte2(&mut self, b: [u8; 2]) {
        self.byte(b[0]);
        self.byte(b[1]);
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
        for b in v.to_le_bytes() {
            self.byte(b);
        }
    }

    /// Appends a length-delimited string/bytes field body: `len` varint then
    /// the bytes (the tag was written by the caller).
    #[inline(always)]
    pub(crate) fn len_bytes(&mut self, bytes: &[u8]) {
        self.varint(bytes.len() as u64);
        self.bytes(bytes);
    }

    /// Reserves a 1-byte length for a nested message shorter than 128
    /// bytes and returns where the body starts (see [`FastBuf::end_short`]).
    #[inline(always)]
    pub(crate) fn begin_short(&mut self) -> usize {
        self.len += 1;
        self.len
    }

    /// Back-fills the 1-byte length of the nested message whose body
    /// started at `start`; a body of 128 bytes or more marks the encoding
    /// failed.
    #[inline(always)]
    pub(crate) fn end_short(&mut self, start: usize) {
        let size = self.len.wrapping_sub(start);
        self.buf.put(start.wrapping_sub(1), size as u8);
        if size > 0x7F {
            self.len = FAILED;
        }
    }

    /// Reserves a 2-byte length for a nested message and returns where the
    /// body starts.
    #[inline(always)]
    pub(crate) fn begin_nested(&mut self) -> usize {
        self.len += 2;
        self.len
    }

    /// Back-fills the length of the nested message whose body started at
    /// `start`. A body longer than a 2-byte varint can say is longer than
    /// the buffer, so [`FastBuf::finish`] reports it.
    #[inline(always)]
    pub(crate) fn end_nested(&mut self, start: usize) {
        let size = self.len.wrapping_sub(start);
        self.buf
            .put(start.wrapping_sub(2), (size as u8 & 0x7F) | 0x80);
        self.buf.put(start.wrapping_sub(1), (size >> 7) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_nesting() {
        let mut b = [0u8; FAST_CAP + WINDOW_SLACK];
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
        let mut b = [0u8; FAST_CAP + WINDOW_SLACK];
        // A slice that does not fit.
        let mut f = FastBuf::new(&mut b);
        f.bytes(&[7u8; FAST_CAP - 2]);
        f.bytes(b"abc");
        f.byte(1);
        assert_eq!(f.finish(), None);
        // Single bytes past the end wrap around harmlessly.
        let mut f = FastBuf::new(&mut b);
        for _ in 0..FAST_CAP / 8 {
            f.varint(u64::MAX);
        }
        let at = f.begin_nested();
        f.end_nested(at);
        assert_eq!(f.finish(), None);
        // Exactly full is fine.
        let mut f = FastBuf::new(&mut b);
        f.bytes(&[7u8; FAST_CAP - 1]);
        f.byte(9);
        assert_eq!(f.finish(), Some(FAST_CAP));
        assert_eq!(b[FAST_CAP - 1], 9);
    }
}
