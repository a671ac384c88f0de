//! Templates: the constant shape of a small message (its tags, constant
//! values and nesting) as bytes, built at compile time, and the values that
//! vary given with it as [`Args`] when a [`Cursor`] writes it
//! ([`Cursor::template`]). One small loop writes every message so
//! described (the cold packets of a track event sequence: resets,
//! descriptors, interned strings, events written the slow way), where a
//! call per field, in a copy per message, costs several times the bytes on
//! a microcontroller.
//!
//! # Format
//!
//! A template is literal bytes (tags and constant varints, copied as they
//! are) and one-byte ops, `0x80 | kind << 3 | operand`:
//!
//! | op | writes |
//! |---|---|
//! | `VARINT \| i` | the varint of value `i` ([`Args::t`], then [`Args::v`]) |
//! | `FIXED64 \| i` | value `i` as 8 little-endian bytes |
//! | `STRING \| i` | string `i` of [`Args::s`]: its length (varint) and bytes |
//! | `BEGIN \| d` | a 1-byte length to fill, of the nested message (its tag precedes; shorter than 128 bytes) at depth `d` |
//! | `END \| d` | fills the length of the message open at depth `d` |
//! | `SKIP \| b`, `n` | nothing; the `n & 0x7F` template bytes after `n` are left out if bit `b` of [`Args::skip`] is set (clear, if `n` has its top bit set) |
//!
//! # Invariants
//!
//! * No literal byte is an op (0x80..=0xAF): the [`Template`] builder
//!   writes every literal as a varint of a tag or a constant and refuses,
//!   at compile time, one with such a byte (the tags of fields 16..=21,
//!   for instance).
//! * Nesting is at most [`MAX_OPEN`] deep, every `BEGIN` has its `END` and
//!   every skipped range holds whole ops (the builder checks all three).
//!   A value or string beyond the given ones reads 0 or empty; nothing
//!   panics on any template.
//! * A message longer than the target, or a nested one of 128 bytes or
//!   more, fails as the cursor's own writers fail ([`Cursor::finish`]).
//!
//! ```
//! use shmtrace_abi::proto::{Args, Cursor, Template};
//! use shmtrace_abi::trace::{trace_packet, track_event};
//!
//! // timestamp = value 0, track_event { type = value 2, name = string 0 }
//! const EVENT: &[u8] = shmtrace_abi::template!(Template::new()
//!     .uint(trace_packet::TIMESTAMP, 0)
//!     .begin(trace_packet::TRACK_EVENT)
//!     .uint(track_event::TYPE, 2)
//!     .string(track_event::NAME, 0)
//!     .end());
//! let mut buf = [0u8; 64 + 8];
//! let mut c = Cursor::new(&mut buf);
//! let args = Args { skip: 0, t: [100, 0], v: &[3], s: &["io"] };
//! c.template(EVENT, &args);
//! let n = c.finish().unwrap();
//! assert_eq!(&buf[..n], &[0x40, 100, 0x5A, 7, 0x48, 3, 0xBA, 0x01, 2, b'i', b'o']);
//! ```
//!
//! A tag whose bytes would read as an op does not compile:
//!
//! ```compile_fail
//! use shmtrace_abi::proto::Template;
//! // Field 16's tag is 0x80 0x01.
//! const BAD: &[u8] = shmtrace_abi::template!(Template::new().uint(16, 0));
//! ```

use super::cursor::{Cursor, Target};
use super::wire::{tag, WireType};

/// Nested messages open at once, at most.
pub const MAX_OPEN: usize = 4;

const OP: u8 = 0x80;
const VARINT: u8 = 0x80;
const FIXED64: u8 = 0x88;
const STRING: u8 = 0x90;
const BEGIN: u8 = 0x98;
const END: u8 = 0xA0;
const SKIP: u8 = 0xA8;
/// The first byte past the ops.
const OPS_END: u8 = 0xB0;

/// The values a template writes, and which optional ranges to leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Args<'a> {
    /// Bit `b` set: the ranges the template marks with bit `b` are left
    /// out ([`Template::skip_if`]).
    pub skip: u32,
    /// Values 0 and 1 (a packet's time and clock, where it has them).
    pub t: [u64; 2],
    /// Values 2 and up.
    pub v: &'a [u64],
    /// Strings, by index.
    pub s: &'a [&'a str],
}

impl<T: Target> Cursor<T> {
    /// Writes `template` (a [`Template`]'s bytes) with `args`. Out of line
    /// on firmware: one copy for every template.
    #[cfg_attr(target_os = "none", inline(never))]
    pub fn template(&mut self, template: &[u8], args: &Args<'_>) {
        let mut open = [0usize; MAX_OPEN];
        let mut i = 0;
        while let Some(&b) = template.get(i) {
            i += 1;
            if !(OP..OPS_END).contains(&b) {
                self.byte(b);
                continue;
            }
            let at = usize::from(b & 7);
            let v = match at.checked_sub(2) {
                None => args.t[at & 1],
                Some(at) => args.v.get(at).copied().unwrap_or(0),
            };
            match b & !7 {
                VARINT => self.varint(v),
                FIXED64 => self.fixed64(v),
                STRING => self.len_bytes(args.s.get(at).unwrap_or(&"").as_bytes()),
                BEGIN => open[at % MAX_OPEN] = self.begin_short(),
                END => self.end_short_inline(open[at % MAX_OPEN]),
                _ => {
                    // The range's length, and whether it is skipped when
                    // the bit is clear rather than set.
                    let n = template.get(i).copied().unwrap_or(0);
                    i += 1;
                    if (args.skip >> at ^ u32::from(n >> 7)) & 1 != 0 {
                        i += usize::from(n & 0x7F);
                    }
                }
            }
        }
    }
}

/// A template under construction (at compile time: `const` items), up to
/// `N` bytes. Its methods append fields; [`template!`](crate::template)
/// turns the result into a `&'static [u8]` of its exact length.
#[derive(Debug, Clone, Copy)]
pub struct Template<const N: usize = 96> {
    bytes: [u8; N],
    len: usize,
    open: usize,
    /// Where each open skipped range starts, and the nesting depth there.
    skips: [(usize, usize); MAX_OPEN],
    open_skips: usize,
}

impl<const N: usize> Default for Template<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Template<N> {
    /// An empty template.
    pub const fn new() -> Self {
        Self {
            bytes: [0; N],
            len: 0,
            open: 0,
            skips: [(0, 0); MAX_OPEN],
            open_skips: 0,
        }
    }

    const fn byte(mut self, b: u8) -> Self {
        assert!(self.len < N, "template too long");
        self.bytes[self.len] = b;
        self.len += 1;
        self
    }

    const fn op(self, kind: u8, operand: usize) -> Self {
        assert!(operand < 8);
        self.byte(kind | operand as u8)
    }

    /// A literal varint (a tag or a constant).
    const fn literal(mut self, mut v: u64) -> Self {
        while v >= 0x80 {
            self = self.literal_byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.literal_byte(v as u8)
    }

    const fn literal_byte(self, b: u8) -> Self {
        assert!(b < OP || b >= OPS_END, "a literal byte is an op");
        self.byte(b)
    }

    /// The tag of `field` with `wire_type`.
    pub const fn tag(self, field: u32, wire_type: WireType) -> Self {
        self.literal(tag(field, wire_type) as u64)
    }

    /// A varint field `field` of value `slot`.
    pub const fn uint(self, field: u32, slot: usize) -> Self {
        self.tag(field, WireType::Varint).op(VARINT, slot)
    }

    /// A varint field `field` of the constant `value`.
    pub const fn constant(self, field: u32, value: u64) -> Self {
        self.tag(field, WireType::Varint).literal(value)
    }

    /// A fixed64 field `field` of value `slot`.
    pub const fn fixed64(self, field: u32, slot: usize) -> Self {
        self.tag(field, WireType::Fixed64).op(FIXED64, slot)
    }

    /// A string field `field` of string `slot`.
    pub const fn string(self, field: u32, slot: usize) -> Self {
        self.tag(field, WireType::LengthDelimited).op(STRING, slot)
    }

    /// Opens the nested message `field` (shorter than 128 bytes).
    pub const fn begin(self, field: u32) -> Self {
        self.tag(field, WireType::LengthDelimited).begin_body()
    }

    /// Opens a nested message whose tag is the varint of value `slot`.
    pub const fn begin_slot(self, slot: usize) -> Self {
        self.op(VARINT, slot).begin_body()
    }

    const fn begin_body(mut self) -> Self {
        assert!(self.open < MAX_OPEN, "templates nest at most MAX_OPEN deep");
        self = self.op(BEGIN, self.open);
        self.open += 1;
        self
    }

    /// Closes the innermost nested message.
    pub const fn end(mut self) -> Self {
        assert!(self.open > 0, "end without begin");
        self.open -= 1;
        self.op(END, self.open)
    }

    /// Starts a range left out when the bit `mask` (one of the low 8) of
    /// [`Args::skip`] is set; [`Template::end_skip`] ends it.
    pub const fn skip_if(self, mask: u32) -> Self {
        self.skip(mask, 0)
    }

    /// Starts a range left out when the bit `mask` (one of the low 8) of
    /// [`Args::skip`] is clear; [`Template::end_skip`] ends it.
    pub const fn skip_unless(self, mask: u32) -> Self {
        self.skip(mask, 0x80)
    }

    const fn skip(mut self, mask: u32, unless: u8) -> Self {
        assert!(
            mask.is_power_of_two() && mask < 0x100,
            "one of the low 8 bits"
        );
        assert!(self.open_skips < MAX_OPEN);
        self = self.op(SKIP, mask.trailing_zeros() as usize).byte(unless);
        self.skips[self.open_skips] = (self.len, self.open);
        self.open_skips += 1;
        self
    }

    /// Ends the innermost range [`Template::skip_if`] started.
    pub const fn end_skip(mut self) -> Self {
        assert!(self.open_skips > 0, "end_skip without skip_if");
        self.open_skips -= 1;
        let (start, open) = self.skips[self.open_skips];
        assert!(
            open == self.open,
            "a skipped range opens and closes the same messages"
        );
        let n = self.len - start;
        assert!(n < 0x80, "a skipped range is at most 127 bytes");
        self.bytes[start - 1] |= n as u8;
        self
    }

    /// Its length.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its bytes, in an array of exactly its length `M` (what
    /// [`template!`](crate::template) makes a `&'static [u8]` of).
    pub const fn array<const M: usize>(&self) -> [u8; M] {
        assert!(M == self.len);
        assert!(
            self.open == 0 && self.open_skips == 0,
            "a message or skipped range is open"
        );
        let mut out = [0u8; M];
        let mut i = 0;
        while i < M {
            out[i] = self.bytes[i];
            i += 1;
        }
        out
    }
}

/// The `&'static [u8]` of a [`Template`] expression, exactly its length,
/// built at compile time.
#[macro_export]
macro_rules! template {
    ($t:expr) => {{
        const T: $crate::proto::template::Template = $t;
        const A: [u8; T.len()] = T.array();
        &A
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::TARGET_SLACK;
    use std::vec::Vec;

    fn bytes(t: &[u8], args: &Args<'_>) -> Vec<u8> {
        let mut b = [0u8; 128 + TARGET_SLACK];
        let mut c = Cursor::new(&mut b);
        c.template(t, args);
        let n = c.finish().unwrap();
        b[..n].to_vec()
    }

    const T: &[u8] = crate::template!(Template::new()
        .uint(8, 0)
        .skip_if(1)
        .uint(58, 1)
        .end_skip()
        .begin(11)
        .constant(9, 2)
        .skip_if(2)
        .string(22, 0)
        .end_skip()
        .skip_unless(8)
        .fixed64(44, 2)
        .end_skip()
        .end()
        .begin_slot(3)
        .string(2, 1)
        .end());

    #[test]
    fn templates_write_the_cursor_s_fields() {
        // Bits 0 and 1 leave a field out, bit 3 puts one in.
        for skip in 0..16 {
            let v = [
                0x0102_0304_0506_0708,
                u64::from(tag(12, WireType::LengthDelimited)),
            ];
            let args = Args {
                skip,
                t: [300, 65],
                v: &v,
                s: &["cat", "name"],
            };
            let got = bytes(T, &args);
            let mut b = [0u8; 128 + TARGET_SLACK];
            let mut c = Cursor::new(&mut b);
            c.uint(8, 300);
            if skip & 1 == 0 {
                c.uint(58, 65);
            }
            let te = c.begin_short_field(11);
            c.uint(9, 2);
            if skip & 2 == 0 {
                c.string(22, "cat");
            }
            if skip & 8 != 0 {
                c.fixed64_field(44, 0x0102_0304_0506_0708);
            }
            c.end_short(te);
            let d = c.begin_short_field(12);
            c.string(2, "name");
            c.end_short(d);
            let n = c.finish().unwrap();
            assert_eq!(got, b[..n], "skip {skip:#b}");
        }
    }

    #[test]
    fn missing_values_and_malformed_templates_do_not_panic() {
        // Values and strings beyond the given ones read 0 and "".
        let args = Args {
            skip: 0,
            t: [0; 2],
            v: &[],
            s: &[],
        };
        let mut b = [0u8; 128 + TARGET_SLACK];
        let mut c = Cursor::new(&mut b);
        c.uint(8, 0);
        c.uint(58, 0);
        let te = c.begin_short_field(11);
        c.uint(9, 2);
        c.string(22, "");
        c.end_short(te);
        c.byte(0);
        let d = c.begin_short();
        c.string(2, "");
        c.end_short(d);
        let n = c.finish().unwrap();
        assert_eq!(bytes(T, &args), b[..n]);
        // Truncated skips, an END without a BEGIN, nesting too deep: some
        // bytes, never a panic.
        let args = Args {
            skip: !0,
            t: [1; 2],
            v: &[1],
            s: &["a"],
        };
        for t in [
            &[SKIP][..],
            &[END, END],
            &[SKIP, 200, 1],
            &[VARINT | 7, FIXED64 | 7, STRING | 7],
            &[BEGIN, BEGIN, BEGIN, BEGIN, BEGIN, END],
        ] {
            let mut b = [0u8; 64 + TARGET_SLACK];
            let mut c = Cursor::new(&mut b);
            c.template(t, &args);
            assert!(c.len() <= 64, "{t:x?}");
        }
    }

    #[test]
    fn a_nested_message_of_128_bytes_fails() {
        const LONG: &[u8] = crate::template!(Template::new().begin(1).string(2, 0).end());
        let s = [b'x'; 126];
        let s = core::str::from_utf8(&s).unwrap();
        let mut b = [0u8; 256 + TARGET_SLACK];
        let mut c = Cursor::new(&mut b);
        c.template(
            LONG,
            &Args {
                skip: 0,
                t: [0; 2],
                v: &[],
                s: &[s],
            },
        );
        assert_eq!(c.finish(), None);
    }
}
