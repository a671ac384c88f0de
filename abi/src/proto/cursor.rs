//! A cursor that encodes one small message into a fixed-size buffer, for
//! the packet shapes written millions of times (track events).
//!
//! The general [`Encoder`](super::Encoder) handles any message over a
//! scattered chunk stream. Most packets are instead a handful of scalar
//! fields and short strings that fit a small contiguous buffer: a chunk's
//! free payload seen through a [`Window`], or an array. For those a plain
//! cursor with constant tags is several times cheaper, and on
//! microcontrollers it calls no `memcpy`.
//!
//! # Invariants
//!
//! * A [`Target`]'s capacity is a power of two, and every single-byte
//!   write lands at `index % cap` (plus an 8-byte write at any index below
//!   `cap` stays inside the target): an index is in bounds by
//!   construction, so a byte costs a store and an increment, with no bounds
//!   check and no branch. Slices (string contents) are copied only if they
//!   fit; one that does not fit marks the encoding failed.
//! * `len` counts every byte written or skipped. Once it exceeds the
//!   capacity the bytes in the buffer are garbage (single bytes wrapped
//!   around) and [`Cursor::finish`] reports the overflow; the caller then
//!   encodes the message another way. Nothing here panics, and there is no
//!   "failed" flag to test on every write.
//! * The field writers ([`Cursor::uint`], [`Cursor::string`], ...) are
//!   compiled once, out of line, on bare-metal targets (`target_os =
//!   "none"`), where they serve cold paths and code size counts; the hot
//!   paths there store their bytes with [`Cursor::byte`], [`Cursor::word`]
//!   and [`Cursor::varint`], and a track event sequence's cold packets
//!   (sequence starts, descriptors, interning) are templates
//!   ([`Cursor::template`]). Elsewhere the compiler inlines them as it
//!   sees fit.
//! * Nested lengths are reserved as 2 bytes and back-filled as a
//!   *redundant* varint (`0x80 | low7, high7`), the non-minimal form
//!   Perfetto's own encoder uses for nested sizes; every protobuf parser
//!   accepts it. A nested message known to be shorter than 128 bytes gets a
//!   1-byte length instead ([`Cursor::begin_short`]); a longer one then
//!   marks the encoding failed.
//!
//! ```
//! use shmtrace_abi::proto::Cursor;
//! use shmtrace_abi::trace::{trace_packet, track_event};
//!
//! let mut buf = [0u8; 64 + 8];
//! let mut c = Cursor::new(&mut buf);
//! c.uint(trace_packet::TIMESTAMP, 100);
//! let te = c.begin_short_field(trace_packet::TRACK_EVENT);
//! c.uint(track_event::TYPE, track_event::Type::Instant as u64);
//! c.end_short(te);
//! let n = c.finish().unwrap();
//! assert_eq!(&buf[..n], &[0x40, 0x64, 0x5A, 0x02, 0x48, 0x03]);
//! ```

use super::wire::{tag, WireType};
use crate::smb::Window;

/// Bytes a [`Target`] owns past its capacity, so an 8-byte write at any
/// index below the capacity stays inside it.
pub const TARGET_SLACK: usize = 8;

/// A fixed-size buffer a [`Cursor`] writes into.
pub trait Target {
    /// The same target, borrowed from this one ([`Target::reborrow`]).
    type Reborrow<'b>: Target
    where
        Self: 'b;
    /// The same bytes, borrowed for as long as the result lives.
    fn reborrow(&mut self) -> Self::Reborrow<'_>;
    /// Capacity in bytes: a power of two.
    fn cap(&self) -> usize;
    /// Writes `byte` at `index % cap`.
    fn put(&mut self, index: usize, byte: u8);
    /// Writes the 8 little-endian bytes of `word` at `index % cap` (the
    /// buffer has room past `cap` for them).
    fn put_u64(&mut self, index: usize, word: u64);
    /// Writes the 4 little-endian bytes of `word` at `index % cap` (the
    /// buffer has room past `cap` for them).
    fn put_u32(&mut self, index: usize, word: u32);
    /// Copies `src` to `index`; `false` (nothing written) if it does not
    /// fit below `cap`.
    fn put_slice(&mut self, index: usize, src: &[u8]) -> bool;
}

/// The largest power of two `p` with `p + TARGET_SLACK <= n` (0 if none).
const fn array_cap(n: usize) -> usize {
    if n <= TARGET_SLACK {
        0
    } else {
        1 << (usize::BITS - 1 - (n - TARGET_SLACK).leading_zeros())
    }
}

/// An array of `N` bytes is a target of the largest power of two that
/// leaves [`TARGET_SLACK`] bytes after it (an array of 520 bytes has a
/// capacity of 512).
impl<const N: usize> Target for &mut [u8; N] {
    type Reborrow<'b>
        = &'b mut [u8; N]
    where
        Self: 'b;

    #[inline(always)]
    fn reborrow(&mut self) -> &mut [u8; N] {
        self
    }

    #[inline(always)]
    fn cap(&self) -> usize {
        const { array_cap(N) }
    }

    #[inline(always)]
    fn put(&mut self, index: usize, byte: u8) {
        let cap = const { array_cap(N) };
        if let Some(b) = self.get_mut(index & cap.wrapping_sub(1)) {
            *b = byte;
        }
    }

    #[inline(always)]
    fn put_u64(&mut self, index: usize, word: u64) {
        let at = index & const { array_cap(N) }.wrapping_sub(1);
        if let Some(dst) = self.get_mut(at..at + 8) {
            dst.copy_from_slice(&word.to_le_bytes());
        }
    }

    #[inline(always)]
    fn put_u32(&mut self, index: usize, word: u32) {
        let at = index & const { array_cap(N) }.wrapping_sub(1);
        if let Some(dst) = self.get_mut(at..at + 4) {
            dst.copy_from_slice(&word.to_le_bytes());
        }
    }

    #[inline(always)]
    fn put_slice(&mut self, index: usize, src: &[u8]) -> bool {
        let cap = const { array_cap(N) };
        match index.checked_add(src.len()) {
            Some(end) if end <= cap => match self.get_mut(index..end) {
                Some(dst) => {
                    dst.copy_from_slice(src);
                    true
                }
                None => false,
            },
            _ => false,
        }
    }
}

impl Target for Window<'_> {
    type Reborrow<'b>
        = Window<'b>
    where
        Self: 'b;

    #[inline(always)]
    fn reborrow(&mut self) -> Window<'_> {
        Window::reborrow(self)
    }

    #[inline(always)]
    fn cap(&self) -> usize {
        self.len()
    }

    #[inline(always)]
    fn put(&mut self, index: usize, byte: u8) {
        Window::put(self, index, byte);
    }

    #[inline(always)]
    fn put_u64(&mut self, index: usize, word: u64) {
        Window::put_u64(self, index, word);
    }

    #[inline(always)]
    fn put_u32(&mut self, index: usize, word: u32) {
        Window::put_u32(self, index, word);
    }

    #[inline(always)]
    fn put_slice(&mut self, index: usize, src: &[u8]) -> bool {
        Window::put_slice(self, index, src)
    }
}

/// A target that stores nothing: a [`Cursor`] over it measures what it
/// would write (up to 1 MiB).
#[derive(Debug, Clone, Copy, Default)]
pub struct Measure;

impl Target for Measure {
    type Reborrow<'b> = Measure;

    #[inline(always)]
    fn reborrow(&mut self) -> Measure {
        Measure
    }

    #[inline(always)]
    fn cap(&self) -> usize {
        1 << 20
    }

    #[inline(always)]
    fn put(&mut self, _index: usize, _byte: u8) {}

    #[inline(always)]
    fn put_u64(&mut self, _index: usize, _word: u64) {}

    #[inline(always)]
    fn put_u32(&mut self, _index: usize, _word: u32) {}

    #[inline(always)]
    fn put_slice(&mut self, index: usize, src: &[u8]) -> bool {
        index
            .checked_add(src.len())
            .is_some_and(|end| end <= 1 << 20)
    }
}

/// A `len` no encoding reaches by single bytes: a slice did not fit.
const FAILED: usize = usize::MAX / 2;

/// A cursor over a [`Target`], which it owns (a [`Window`], a
/// `&mut [u8; N]`): holding it by value keeps the target's pointer in a
/// register while bytes are stored through it. See the module docs.
pub struct Cursor<T: Target> {
    buf: T,
    /// Bytes written or skipped; past the capacity the encoding failed.
    len: usize,
}

impl<T: Target> Cursor<T> {
    /// A cursor at the start of `buf`.
    #[inline(always)]
    pub fn new(buf: T) -> Self {
        Cursor { buf, len: 0 }
    }

    /// A cursor at index `start` of `buf` (the bytes before it are the
    /// caller's: e.g. a size it fills with [`Cursor::put_at`]).
    #[inline(always)]
    pub fn new_at(buf: T, start: usize) -> Self {
        Cursor { buf, len: start }
    }

    /// Runs `f` on a cursor at the same position over the same bytes,
    /// borrowed from this one, and takes its position back. Called on a
    /// cursor behind a reference, `f`'s cursor is a local whose address
    /// nothing takes (if `f` inlines): its buffer and position stay in
    /// registers, where each store through the referenced cursor, which
    /// might alias it, reloads them.
    #[inline(always)]
    pub fn local<R>(&mut self, f: impl FnOnce(&mut Cursor<T::Reborrow<'_>>) -> R) -> R {
        let mut c = Cursor {
            buf: self.buf.reborrow(),
            len: self.len,
        };
        let r = f(&mut c);
        self.len = c.len;
        r
    }

    /// Stores `byte` at `index` (modulo the capacity) without moving the
    /// cursor: back-filling a size reserved before the cursor started.
    #[inline(always)]
    pub fn put_at(&mut self, index: usize, byte: u8) {
        self.buf.put(index, byte);
    }

    /// Bytes written, or `None` if the buffer was too small.
    #[inline(always)]
    pub fn finish(&self) -> Option<usize> {
        (self.len <= self.buf.cap()).then_some(self.len)
    }

    /// Bytes written or skipped so far (beyond the capacity: failed).
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` before the first byte.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends raw bytes (string contents, pre-encoded fields).
    #[inline(always)]
    pub fn bytes(&mut self, bytes: &[u8]) {
        if self.buf.put_slice(self.len, bytes) {
            self.len += bytes.len();
        } else {
            self.len = FAILED;
        }
    }

    /// Appends one byte.
    #[inline(always)]
    pub fn byte(&mut self, b: u8) {
        self.buf.put(self.len, b);
        self.len += 1;
    }

    /// Appends two bytes (a two-byte tag, or a tag and a small value).
    #[inline(always)]
    pub fn byte2(&mut self, b: [u8; 2]) {
        self.byte(b[0]);
        self.byte(b[1]);
    }

    /// Appends the low `n` (at most 8) bytes of `word`, little-endian, with
    /// one 8-byte store (constant runs of tags and small values).
    #[inline(always)]
    pub fn word(&mut self, word: u64, n: usize) {
        self.buf.put_u64(self.len, word);
        self.len += n;
    }

    /// Appends the low `n` (at most 4) bytes of `word`, little-endian, with
    /// one 4-byte store.
    #[inline(always)]
    pub fn word32(&mut self, word: u32, n: usize) {
        self.buf.put_u32(self.len, word);
        self.len += n;
    }

    /// Stores `word`, little-endian, with one 8-byte store `k` bytes past
    /// the end, appending nothing: for words [`Self::skip`] then covers
    /// (a later store overwrites the bytes an earlier one wrote past its
    /// own).
    #[inline(always)]
    pub fn word_at(&mut self, k: usize, word: u64) {
        self.buf.put_u64(self.len + k, word);
    }

    /// [`Self::word_at`] with one 4-byte store.
    #[inline(always)]
    pub fn word32_at(&mut self, k: usize, word: u32) {
        self.buf.put_u32(self.len + k, word);
    }

    /// Appends the `n` bytes [`Self::word_at`] stored.
    #[inline(always)]
    pub fn skip(&mut self, n: usize) {
        self.len += n;
    }

    /// Appends a varint. Values that fit 32 bits (nearly all: ids, sizes,
    /// time deltas) take a loop over 32-bit words, which 32-bit machines
    /// run much cheaper than a 64-bit one. On firmware, where only the
    /// cold encoders (the templates of resets, descriptors, interned data)
    /// come here, every varint and tag goes through the one out-of-line
    /// function that writes any varint (`varint64`): one copy in the
    /// image, not one per caller.
    #[inline(always)]
    pub fn varint(&mut self, v: u64) {
        if cfg!(target_os = "none") {
            self.varint64(v);
            return;
        }
        match u32::try_from(v) {
            Ok(v) => self.varint32(v),
            Err(_) => self.varint64(v),
        }
    }

    /// Any varint, one loop. On a host, [`Cursor::varint`]'s rare path (5
    /// to 10 bytes); on firmware, every varint and tag of the cold packets
    /// (one small loop in the image, not two).
    #[cfg_attr(not(target_os = "none"), cold)]
    #[inline(never)]
    fn varint64(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    /// Appends a varint that fits 32 bits.
    #[inline(always)]
    pub fn varint32(&mut self, mut v: u32) {
        while v >= 0x80 {
            self.byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    /// Appends 8 little-endian bytes (fixed64, double), with one 8-byte
    /// store.
    #[inline(always)]
    pub fn fixed64(&mut self, v: u64) {
        self.word(v, 8);
    }

    /// Appends the tag of `field` with `wire_type` (constant-folded when
    /// both are constants; on firmware a call of the out-of-line varint).
    #[cfg_attr(target_os = "none", inline(always))]
    pub fn tag(&mut self, field: u32, wire_type: WireType) {
        if cfg!(target_os = "none") {
            self.varint64(u64::from(tag(field, wire_type)));
            return;
        }
        self.varint32(tag(field, wire_type));
    }

    /// A varint field (uint32/64, enums).
    #[cfg_attr(target_os = "none", inline(never))]
    pub fn uint(&mut self, field: u32, v: u64) {
        self.tag(field, WireType::Varint);
        self.varint(v);
    }

    /// An int32/int64 field (negative values take ten bytes, as protobuf
    /// sign-extends them).
    pub fn int(&mut self, field: u32, v: i64) {
        self.uint(field, v as u64);
    }

    /// A bool field.
    #[inline]
    pub fn boolean(&mut self, field: u32, v: bool) {
        self.uint(field, u64::from(v));
    }

    /// A double field (its bits as a fixed64 field: no floating-point
    /// register in the out-of-line code on firmware).
    #[inline(always)]
    pub fn double(&mut self, field: u32, v: f64) {
        self.fixed64_field(field, v.to_bits());
    }

    /// A fixed64 field.
    #[cfg_attr(target_os = "none", inline(never))]
    pub fn fixed64_field(&mut self, field: u32, v: u64) {
        self.tag(field, WireType::Fixed64);
        self.fixed64(v);
    }

    /// A string or bytes field.
    #[cfg_attr(target_os = "none", inline(never))]
    pub fn len_bytes_field(&mut self, field: u32, bytes: &[u8]) {
        self.tag(field, WireType::LengthDelimited);
        self.len_bytes(bytes);
    }

    /// A string field.
    pub fn string(&mut self, field: u32, s: &str) {
        self.len_bytes_field(field, s.as_bytes());
    }

    /// Appends a length-delimited body: `len` varint, then the bytes (the
    /// tag was written by the caller).
    pub fn len_bytes(&mut self, bytes: &[u8]) {
        self.varint(bytes.len() as u64);
        self.bytes(bytes);
    }

    /// Reserves a 1-byte length for a nested message shorter than 128
    /// bytes and returns where the body starts (see [`Cursor::end_short`]).
    #[inline(always)]
    pub fn begin_short(&mut self) -> usize {
        self.len += 1;
        self.len
    }

    /// Writes the tag of a nested message `field` shorter than 128 bytes
    /// and reserves its 1-byte length ([`Cursor::begin_short`]).
    #[cfg_attr(target_os = "none", inline(never))]
    pub fn begin_short_field(&mut self, field: u32) -> usize {
        self.tag(field, WireType::LengthDelimited);
        self.begin_short()
    }

    /// Back-fills the 1-byte length of the nested message whose body
    /// started at `start`; a body of 128 bytes or more marks the encoding
    /// failed. (Out of line on firmware: the cold paths close many
    /// messages, and a call is a third of the bytes.)
    #[cfg_attr(target_os = "none", inline(never))]
    #[cfg_attr(not(target_os = "none"), inline(always))]
    pub fn end_short(&mut self, start: usize) {
        self.end_short_inline(start);
    }

    /// [`Cursor::end_short`], inline.
    #[inline(always)]
    pub(crate) fn end_short_inline(&mut self, start: usize) {
        let size = self.len.wrapping_sub(start);
        self.buf.put(start.wrapping_sub(1), size as u8);
        if size > 0x7F {
            self.len = FAILED;
        }
    }

    /// Reserves a 2-byte length for a nested message and returns where the
    /// body starts.
    #[inline(always)]
    pub fn begin_nested(&mut self) -> usize {
        self.len += 2;
        self.len
    }

    /// Writes the tag of a nested message `field` and reserves its 2-byte
    /// length ([`Cursor::begin_nested`]).
    pub fn begin_nested_field(&mut self, field: u32) -> usize {
        self.tag(field, WireType::LengthDelimited);
        self.begin_nested()
    }

    /// Writes the tag of a nested message `field` and reserves its length:
    /// 1 byte if `SHORT` (the message must stay under 128 bytes), else 2.
    /// Close it with [`Cursor::end_message`] of the same `SHORT`.
    #[inline]
    pub fn begin_message<const SHORT: bool>(&mut self, field: u32) -> usize {
        if SHORT {
            self.begin_short_field(field)
        } else {
            self.begin_nested_field(field)
        }
    }

    /// Back-fills the length of a message opened with
    /// [`Cursor::begin_message`].
    #[inline]
    pub fn end_message<const SHORT: bool>(&mut self, start: usize) {
        if SHORT {
            self.end_short(start)
        } else {
            self.end_nested(start)
        }
    }

    /// Back-fills the length of the nested message whose body started at
    /// `start`. A body longer than a 2-byte varint can say is longer than
    /// any target, so [`Cursor::finish`] reports it.
    #[inline(always)]
    pub fn end_nested(&mut self, start: usize) {
        let size = self.len.wrapping_sub(start);
        self.buf
            .put(start.wrapping_sub(2), (size as u8 & 0x7F) | 0x80);
        self.buf.put(start.wrapping_sub(1), (size >> 7) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::wire::{put_varint, MAX_VARINT_LEN};

    #[test]
    fn varints_and_nesting() {
        let mut b = [0u8; 512 + TARGET_SLACK];
        let mut f = Cursor::new(&mut b);
        f.byte(0x40);
        f.varint(300);
        let at = f.begin_nested();
        f.varint(1);
        f.end_nested(at);
        let n = f.finish().unwrap();
        assert_eq!(&b[..n], &[0x40, 0xAC, 0x02, 0x81, 0x00, 0x01]);
    }

    #[test]
    fn the_firmware_varint_path_writes_every_varint() {
        // Every length from 1 to 10 bytes, at both edges.
        let mut values = std::vec![0, u64::MAX];
        for bits in (7..64).step_by(7) {
            values.extend([(1u64 << bits) - 1, 1 << bits]);
        }
        for v in values {
            let mut want = [0u8; MAX_VARINT_LEN];
            let n = put_varint(v, &mut want);
            // Firmware's path for any value, and the host's.
            let (mut a, mut b) = ([0u8; 16 + TARGET_SLACK], [0u8; 16 + TARGET_SLACK]);
            let mut firmware = Cursor::new(&mut a);
            firmware.varint64(v);
            assert_eq!(firmware.finish(), Some(n), "{v:#x}");
            let mut host = Cursor::new(&mut b);
            host.varint(v);
            assert_eq!(host.finish(), Some(n), "{v:#x}");
            assert_eq!((&a[..n], &b[..n]), (&want[..n], &want[..n]), "{v:#x}");
        }
    }

    #[test]
    fn array_capacity_leaves_the_slack() {
        fn cap<const N: usize>(mut a: [u8; N]) -> usize {
            Target::cap(&(&mut a))
        }
        assert_eq!(cap([0u8; 520]), 512);
        assert_eq!(cap([0u8; 519]), 256);
        assert_eq!(cap([0u8; 136]), 128);
        assert_eq!(cap([0u8; 8]), 0);
    }

    #[test]
    fn field_writers_match_the_wire_format() {
        let mut b = [0u8; 64 + TARGET_SLACK];
        let mut c = Cursor::new(&mut b);
        c.uint(8, 1);
        c.int(4, -1);
        c.boolean(3, true);
        c.double(5, 1.0);
        c.fixed64_field(47, 2);
        c.string(23, "ab");
        let n = c.finish().unwrap();
        let mut want = std::vec![0x40, 0x01, 0x20];
        want.extend([0xFF; 9]);
        want.extend([0x01, 0x18, 0x01, 0x29, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F]);
        want.extend([0xF9, 0x02, 2, 0, 0, 0, 0, 0, 0, 0]);
        want.extend([0xBA, 0x01, 0x02, b'a', b'b']);
        assert_eq!(&b[..n], &want[..]);
    }

    #[test]
    fn overflow_is_reported_not_panicked() {
        let mut b = [0u8; 512 + TARGET_SLACK];
        // A slice that does not fit.
        let mut f = Cursor::new(&mut b);
        f.bytes(&[7u8; 512 - 2]);
        f.bytes(b"abc");
        f.byte(1);
        assert_eq!(f.finish(), None);
        // Single bytes past the end wrap around harmlessly.
        let mut f = Cursor::new(&mut b);
        for _ in 0..512 / 8 {
            f.varint(u64::MAX);
        }
        let at = f.begin_nested();
        f.end_nested(at);
        assert_eq!(f.finish(), None);
        // Exactly full is fine.
        let mut f = Cursor::new(&mut b);
        f.bytes(&[7u8; 512 - 1]);
        f.byte(9);
        assert_eq!(f.finish(), Some(512));
        assert_eq!(b[511], 9);
        // A short message over 127 bytes fails.
        let mut f = Cursor::new(&mut b);
        let s = f.begin_short();
        f.bytes(&[1u8; 128]);
        f.end_short(s);
        assert_eq!(f.finish(), None);
    }
}
