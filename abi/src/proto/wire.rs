//! Protobuf wire-format primitives: tags, varints, zigzag, and the
//! fixed-width "redundant varint" size fields protozero-style encoders
//! back-fill; and the varint decoders every reader of untrusted bytes in the
//! workspace uses ([`read_varint`] over a slice, [`VarintDecoder`] a byte at
//! a time).
//!
//! Everything here is a pure function over integers and small arrays (or a
//! two-word state machine); none of it can panic. Decoding follows the
//! protobuf parsers: at most [`MAX_VARINT_LEN`] bytes, bits past the 64th
//! dropped, non-minimal encodings accepted.

/// Longest encoding of a 64-bit varint.
pub const MAX_VARINT_LEN: usize = 10;

/// Bytes reserved for the size of a nested message or of a packet fragment
/// before its length is known (`kMessageLengthFieldSize`).
pub const SIZE_FIELD_LEN: usize = 4;

/// Largest length a [`SIZE_FIELD_LEN`]-byte redundant varint can express
/// (`2^28 - 1`). The same value, written into a fragment size field, is the
/// drop sentinel (`kPacketSizeDropPacket`).
pub const MAX_MESSAGE_LEN: u32 = 0x0FFF_FFFF;

/// Largest value whose varint takes a single byte (`0x7F`).
pub const MAX_ONE_BYTE_VARINT: u64 = 0x7F;

/// Longest body whose size fits a single byte; nested messages and root
/// fragments up to this length may be compacted to a 1-byte size.
pub const MAX_ONE_BYTE_LEN: u32 = MAX_ONE_BYTE_VARINT as u32;

/// Largest valid protobuf field number (`2^29 - 1`).
pub const MAX_FIELD_NUMBER: u32 = (1 << 29) - 1;

/// Protobuf wire types this encoder emits (groups are never produced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WireType {
    /// Base-128 varint (int32/64, uint32/64, sint32/64, bool, enum).
    Varint = 0,
    /// Little-endian 8 bytes (fixed64, sfixed64, double).
    Fixed64 = 1,
    /// Varint length followed by that many bytes (bytes, string, messages,
    /// packed repeated fields).
    LengthDelimited = 2,
    /// Little-endian 4 bytes (fixed32, sfixed32, float).
    Fixed32 = 5,
}

/// The tag of `field` with wire type `wire_type`: `(field << 3) | wire_type`.
///
/// `field` must be in `1..=MAX_FIELD_NUMBER` for the result to be a valid
/// tag; callers check that (see [`is_valid_field_number`]).
#[inline]
pub const fn tag(field: u32, wire_type: WireType) -> u32 {
    (field << 3) | wire_type as u32
}

/// `true` if `field` is a legal protobuf field number.
#[inline]
pub const fn is_valid_field_number(field: u32) -> bool {
    field.wrapping_sub(1) < MAX_FIELD_NUMBER
}

/// Number of bytes of the minimal varint encoding of `value` (1..=10).
#[inline]
pub const fn varint_len(value: u64) -> usize {
    // ceil(bits / 7) for bits = 64 - leading zeros (>= 1), written as
    // 1 + (bits - 1) / 7: the index of the highest set bit is what the bit
    // scan instruction gives, and a division by 7 of it a multiply and a
    // shift (the ceiling costs a remainder test on top).
    1 + (63 - (value | 1).leading_zeros() as usize) / 7
}

/// The minimal varint encoding of `value`, which must be below 2^28, as the
/// low bytes of a word (little-endian), and how many bytes it takes
/// (1..=4): an encoder stores it with one word store. Bits of `value` at
/// 2^28 and above are dropped.
#[inline(always)]
pub const fn varint_word(value: u32) -> (u32, usize) {
    // The 7-bit groups spread one per byte, with their continuation bits;
    // only as many groups as the value has (short values are the common
    // case: each branch spreads no more than it needs).
    let two = (value & 0x7F) | 0x80 | (value << 1 & 0x7F00);
    if value < 1 << 7 {
        (value, 1)
    } else if value < 1 << 14 {
        (two, 2)
    } else if value < 1 << 21 {
        (two | 0x8000 | (value << 2 & 0x7F_0000), 3)
    } else {
        (varint_groups(value) | 0x80_8080, 4)
    }
}

/// The low 28 bits of `value` as four 7-bit groups, one per byte, without
/// continuation bits: the bytes of a 4-byte varint (of a value below 2^28)
/// before its continuation bits, or the first four of a longer one (a
/// negative int64's). Bits of `value` at 2^28 and above are dropped.
#[inline(always)]
pub const fn varint_groups(value: u32) -> u32 {
    (value & 0x7F) | (value << 1 & 0x7F00) | (value << 2 & 0x7F_0000) | (value << 3 & 0x7F00_0000)
}

/// The minimal varint encoding of `value` (any `u64`), little-endian, in
/// two words: bytes 0-7 and bytes 8-9, the bytes past the varint's last 0
/// (it takes [`varint_len`] bytes). An encoder stores the low word's first
/// `min(len, 8)` bytes, then, for a varint of 9 or 10 bytes, the high
/// word's first `len - 8`: two stores at most, where [`put_varint`] stores
/// a byte at a time.
///
/// No loop: the seven-bit groups of bits 0-55 are spread one per byte by
/// three shift-and-mask steps (28, 14, then 7 bits apart), every byte
/// before the varint's last gets its continuation bit, and bits 56-63 go
/// to bytes 8 and 9. Out of line and cold: encoders come here for values
/// above 32 bits (a negative `int64`, a uuid), which are rare.
#[cold]
#[inline(never)]
pub const fn varint_words(value: u64) -> (u64, u16) {
    let n = varint_len(value);
    // Bits 0-55, seven to a byte.
    let x = value & ((1 << 56) - 1);
    let x = (x & 0x0FFF_FFFF) | (x & 0x00FF_FFFF_F000_0000) << 4;
    let x = (x & 0x0000_3FFF_0000_3FFF) | (x & 0x0FFF_C000_0FFF_C000) << 2;
    let x = (x & 0x007F_007F_007F_007F) | (x & 0x3F80_3F80_3F80_3F80) << 1;
    // Continuation bits on the bytes before the last (of the first 8).
    let more = match n {
        9.. => 0x8080_8080_8080_8080,
        n => 0x8080_8080_8080_8080u64 >> 8 >> (8 * (8 - n)),
    };
    // Bits 56-62 in byte 8, with its continuation bit if byte 9 follows
    // (bit 63, the tenth byte's only one).
    let high = (value >> 56) as u16;
    let high = (high & 0x7F) | (high & 0x80) << 1 | if n == 10 { 0x80 } else { 0 };
    (x | more, high)
}

/// Writes the minimal varint encoding of `value` at the start of `out` and
/// returns its length.
#[inline]
pub fn put_varint(value: u64, out: &mut [u8; MAX_VARINT_LEN]) -> usize {
    let mut v = value;
    let mut i = 0;
    for slot in out.iter_mut() {
        i += 1;
        if v < 0x80 {
            *slot = v as u8;
            break;
        }
        *slot = (v as u8) | 0x80;
        v >>= 7;
    }
    i
}

/// ZigZag-maps a signed 32-bit value (sint32) so small magnitudes encode short.
#[inline]
pub const fn zigzag32(value: i32) -> u32 {
    ((value << 1) ^ (value >> 31)) as u32
}

/// ZigZag-maps a signed 64-bit value (sint64).
#[inline]
pub const fn zigzag64(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// Encodes `value` (at most [`MAX_MESSAGE_LEN`]; higher bits are dropped) as
/// a [`SIZE_FIELD_LEN`]-byte redundant varint: the continuation bit is set on
/// the first three bytes whatever the value, so 5 is `85 80 80 00` and 0 is
/// `80 80 80 00`. The first byte is therefore never zero, which is how a
/// writer tells a filled patch from a pending one.
#[inline]
pub const fn redundant_varint4(value: u32) -> [u8; SIZE_FIELD_LEN] {
    [
        (value as u8 & 0x7F) | 0x80,
        ((value >> 7) as u8 & 0x7F) | 0x80,
        ((value >> 14) as u8 & 0x7F) | 0x80,
        (value >> 21) as u8 & 0x7F,
    ]
}

/// The drop sentinel as it appears in a fragment size field: `FF FF FF 7F`.
pub const DROP_SENTINEL_BYTES: [u8; SIZE_FIELD_LEN] = redundant_varint4(MAX_MESSAGE_LEN);

/// Why a varint could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarintError {
    /// The input ended inside the varint.
    Truncated,
    /// Every byte allowed had its continuation bit set.
    TooLong,
}

/// Decodes the varint at the start of `buf`: `(value, bytes read)`.
///
/// A varint is at most [`MAX_VARINT_LEN`] bytes; the tenth byte contributes
/// its lowest bit only.
#[inline]
pub fn read_varint(buf: &[u8]) -> Result<(u64, usize), VarintError> {
    read_varint_max(buf, MAX_VARINT_LEN)
}

/// [`read_varint`] for a varint of at most `max_len` bytes (itself at most
/// [`MAX_VARINT_LEN`]): [`VarintError::TooLong`] when its first `max_len`
/// bytes all continue, [`VarintError::Truncated`] when `buf` ends before.
/// E.g. a fragment size is at most [`SIZE_FIELD_LEN`] bytes.
#[inline]
pub fn read_varint_max(buf: &[u8], max_len: usize) -> Result<(u64, usize), VarintError> {
    let max_len = max_len.min(MAX_VARINT_LEN);
    let mut value = 0u64;
    for (i, &b) in buf.iter().take(max_len).enumerate() {
        // i < 10: the shift is at most 63, bits past the 64th fall off.
        value |= u64::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    Err(if buf.len() >= max_len {
        VarintError::TooLong
    } else {
        VarintError::Truncated
    })
}

/// A varint decoder fed one byte at a time, for input that arrives in
/// pieces (a packet in several slices, a file read as a stream). Same rules
/// as [`read_varint`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VarintDecoder {
    value: u64,
    /// Bytes of the varint seen so far (0..MAX_VARINT_LEN).
    len: u8,
}

impl VarintDecoder {
    /// A decoder at the start of a varint.
    pub const fn new() -> Self {
        Self { value: 0, len: 0 }
    }

    /// Adds the next byte: `Ok(Some(value))` when it ends the varint (the
    /// decoder is then ready for the next one), `Ok(None)` when more bytes
    /// follow, [`VarintError::TooLong`] when it is a tenth byte that still
    /// continues (the decoder starts over).
    #[inline]
    pub fn push(&mut self, byte: u8) -> Result<Option<u64>, VarintError> {
        // len < 10: the shift is at most 63, bits past the 64th fall off.
        self.value |= u64::from(byte & 0x7F) << (7 * u32::from(self.len));
        self.len += 1;
        if byte & 0x80 == 0 {
            let value = self.value;
            *self = Self::new();
            return Ok(Some(value));
        }
        if usize::from(self.len) == MAX_VARINT_LEN {
            *self = Self::new();
            return Err(VarintError::TooLong);
        }
        Ok(None)
    }

    /// `true` between varints (no byte of an unfinished one pending).
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_word_is_the_varint() {
        for v in [
            0u32,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            (1 << 21) - 1,
            1 << 21,
            (1 << 28) - 1,
        ] {
            let (word, n) = varint_word(v);
            let mut want = [0u8; MAX_VARINT_LEN];
            let len = put_varint(u64::from(v), &mut want);
            assert_eq!(n, len, "{v}");
            assert_eq!(&word.to_le_bytes()[..n], &want[..len], "{v}");
            if n < 4 {
                assert_eq!(word >> (8 * n), 0, "{v}: bytes past the varint");
            }
        }
    }

    fn enc(v: u64) -> std::vec::Vec<u8> {
        let mut b = [0u8; MAX_VARINT_LEN];
        let n = put_varint(v, &mut b);
        b[..n].to_vec()
    }

    /// [`varint_words`]'s two words as ten bytes.
    fn words(v: u64) -> [u8; MAX_VARINT_LEN] {
        let (low, high) = varint_words(v);
        let mut b = [0u8; MAX_VARINT_LEN];
        b[..8].copy_from_slice(&low.to_le_bytes());
        b[8..].copy_from_slice(&high.to_le_bytes());
        b
    }

    /// The two words hold [`put_varint`]'s bytes and zeros past them, at
    /// every length's edges (0, 2^7 - 1, 2^7, ..., 2^63, `u64::MAX`) and
    /// at every bit; usable in constants.
    #[test]
    fn varint_words_are_the_varint() {
        let mut values = std::vec![0u64, u64::MAX, -10i64 as u64];
        for k in 1..=9 {
            values.extend([(1u64 << (7 * k)) - 1, 1u64 << (7 * k)]);
        }
        for shift in 0..64 {
            let bit = 1u64 << shift;
            values.extend([bit - 1, bit, !bit, 0x5555_5555_5555_5555 >> shift]);
        }
        for v in values {
            let mut want = [0u8; MAX_VARINT_LEN];
            put_varint(v, &mut want);
            assert_eq!(words(v), want, "{v:#x}");
        }
        const LOW: (u64, u16) = varint_words(300);
        assert_eq!(LOW, (0x02AC, 0));
        const MAX: (u64, u16) = varint_words(u64::MAX);
        assert_eq!(MAX, (u64::MAX, 0x01FF));
    }

    #[test]
    fn varints_match_the_protobuf_spec() {
        assert_eq!(enc(0), [0x00]);
        assert_eq!(enc(1), [0x01]);
        assert_eq!(enc(127), [0x7F]);
        assert_eq!(enc(128), [0x80, 0x01]);
        assert_eq!(enc(150), [0x96, 0x01]);
        assert_eq!(enc(300), [0xAC, 0x02]);
        assert_eq!(
            enc(u64::MAX),
            [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]
        );
        // int32 -1 is sign-extended to 64 bits: ten bytes.
        assert_eq!(enc(-1i64 as u64).len(), 10);
    }

    #[test]
    fn one_byte_varints_end_at_their_maximum() {
        assert_eq!(varint_len(MAX_ONE_BYTE_VARINT), 1);
        assert_eq!(varint_len(MAX_ONE_BYTE_VARINT + 1), 2);
        assert_eq!(u64::from(MAX_ONE_BYTE_LEN), MAX_ONE_BYTE_VARINT);
    }

    #[test]
    fn varint_len_agrees_with_put_varint() {
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, (1u64 << shift) + 1] {
                assert_eq!(varint_len(v), enc(v).len(), "value {v}");
            }
        }
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(u64::MAX), 10);
    }

    #[test]
    fn zigzag_matches_the_protobuf_spec() {
        assert_eq!(zigzag32(0), 0);
        assert_eq!(zigzag32(-1), 1);
        assert_eq!(zigzag32(1), 2);
        assert_eq!(zigzag32(-2), 3);
        assert_eq!(zigzag32(i32::MAX), 0xFFFF_FFFE);
        assert_eq!(zigzag32(i32::MIN), 0xFFFF_FFFF);
        assert_eq!(zigzag64(-1), 1);
        assert_eq!(zigzag64(i64::MIN), u64::MAX);
    }

    #[test]
    fn redundant_varints_match_the_facts_sheet() {
        assert_eq!(redundant_varint4(5), [0x85, 0x80, 0x80, 0x00]);
        assert_eq!(redundant_varint4(0), [0x80, 0x80, 0x80, 0x00]);
        assert_eq!(redundant_varint4(300), [0xAC, 0x82, 0x80, 0x00]);
        assert_eq!(DROP_SENTINEL_BYTES, [0xFF, 0xFF, 0xFF, 0x7F]);
    }

    #[test]
    fn tags_and_field_numbers() {
        assert_eq!(tag(8, WireType::Varint), 0x40);
        assert_eq!(tag(11, WireType::LengthDelimited), 0x5A);
        assert_eq!(tag(1, WireType::Fixed64), 0x09);
        assert_eq!(tag(1, WireType::Fixed32), 0x0D);
        assert!(!is_valid_field_number(0));
        assert!(is_valid_field_number(1));
        assert!(is_valid_field_number(MAX_FIELD_NUMBER));
        assert!(!is_valid_field_number(MAX_FIELD_NUMBER + 1));
    }

    #[test]
    fn decoders_read_what_put_varint_writes() {
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, (1u64 << shift) + 1] {
                let bytes = enc(v);
                assert_eq!(read_varint(&bytes), Ok((v, bytes.len())), "value {v}");
                // Bytes after the varint are not read.
                let mut more = bytes.clone();
                more.extend([0xFF, 0x01]);
                assert_eq!(read_varint(&more), Ok((v, bytes.len())));
                let mut d = VarintDecoder::new();
                let (last, head) = bytes.split_last().unwrap();
                for &b in head {
                    assert_eq!(d.push(b), Ok(None));
                    assert!(!d.is_empty());
                }
                assert_eq!(d.push(*last), Ok(Some(v)));
                assert!(d.is_empty());
            }
        }
        // Non-minimal forms decode (a 4-byte redundant size).
        assert_eq!(read_varint(&redundant_varint4(5)), Ok((5, 4)));
    }

    #[test]
    fn decoders_reject_truncated_and_overlong_varints() {
        assert_eq!(read_varint(&[]), Err(VarintError::Truncated));
        assert_eq!(read_varint(&[0x80, 0x80]), Err(VarintError::Truncated));
        let ten = [0xFF; 10];
        assert_eq!(read_varint(&ten), Err(VarintError::TooLong));
        assert_eq!(read_varint(&ten[..9]), Err(VarintError::Truncated));
        // A tenth byte that ends the varint is fine; its high bits are lost.
        let mut max = [0xFF; 10];
        max[9] = 0x7F;
        assert_eq!(read_varint(&max), Ok((u64::MAX, 10)));
        // A bound below ten bytes.
        assert_eq!(
            read_varint_max(&[0x80, 0x80, 0x80, 0x80, 0x00], 4),
            Err(VarintError::TooLong)
        );
        assert_eq!(
            read_varint_max(&[0x80, 0x80, 0x80], 4),
            Err(VarintError::Truncated)
        );
        assert_eq!(read_varint_max(&[0x85, 0x80, 0x80, 0x00], 4), Ok((5, 4)));
        assert_eq!(read_varint_max(&[0x05], 0), Err(VarintError::TooLong));
        // The streaming decoder fails at the tenth continuing byte and
        // starts over.
        let mut d = VarintDecoder::new();
        for _ in 0..9 {
            assert_eq!(d.push(0xFF), Ok(None));
        }
        assert_eq!(d.push(0x80), Err(VarintError::TooLong));
        assert!(d.is_empty());
        assert_eq!(d.push(0x07), Ok(Some(7)));
        let mut d = VarintDecoder::new();
        for &b in &max[..9] {
            assert_eq!(d.push(b), Ok(None));
        }
        assert_eq!(d.push(max[9]), Ok(Some(u64::MAX)));
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: if cfg!(miri) { 8 } else { 256 },
            failure_persistence: None,
            ..Default::default()
        })]

        /// [`varint_words`] writes [`put_varint`]'s bytes (and zeros past
        /// them) for values of every width.
        #[test]
        fn varint_words_match_put_varint(bits in 0u32..=64, seed in proptest::num::u64::ANY) {
            let v = match bits {
                0 => 0,
                64 => seed | 1 << 63,
                b => (seed & ((1u64 << b) - 1)) | 1 << (b - 1),
            };
            let mut want = [0u8; MAX_VARINT_LEN];
            put_varint(v, &mut want);
            proptest::prop_assert_eq!(words(v), want, "{:#x}", v);
        }

        /// Both decoders agree on any input, and a value decoded from
        /// fewer than ten bytes re-encodes to those bytes when they were
        /// minimal.
        #[test]
        fn slice_and_streaming_decoders_agree(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..14)) {
            let mut d = VarintDecoder::new();
            let mut streamed = Err(VarintError::Truncated);
            for (i, &b) in bytes.iter().enumerate() {
                match d.push(b) {
                    Ok(None) => continue,
                    Ok(Some(v)) => streamed = Ok((v, i + 1)),
                    Err(e) => streamed = Err(e),
                }
                break;
            }
            proptest::prop_assert_eq!(read_varint(&bytes), streamed);
            if let Ok((v, n)) = streamed {
                let again = enc(v);
                if n < MAX_VARINT_LEN && again.len() == n {
                    proptest::prop_assert_eq!(&again[..], &bytes[..n]);
                }
            }
        }
    }
}
