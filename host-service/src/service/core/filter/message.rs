//! Filtering one message: the fields its bytecode keeps, re-encoded.
//!
//! The output is upstream's byte for byte (`MessageFilter`,
//! src/protozero/filtering/message_filter.cc, whose tokenizer is
//! message_tokenizer.h):
//!
//! * a kept number field is written with a minimal tag and, for varints, a
//!   minimal varint;
//! * a kept string or bytes field, or a kept message field of length 0, is
//!   copied after a minimal tag and length (strings to filter then go
//!   through the [`StringFilter`]);
//! * a kept message field is filtered recursively; its length keeps the
//!   width of the input's length, written as a redundant varint;
//! * a field with id 0 is no field: a number is skipped, and the bytes
//!   after a length are read as the next fields;
//! * a field with an id past protobuf's 2^29 - 1 is dropped (upstream
//!   keeps the id's low 32 bits and may write a wrapped tag);
//! * malformed input — a varint of more than 10 bytes, wire types 3, 4, 6
//!   and 7, a length past its message's end or over 2^28 - 1, a field cut
//!   by its message's end, an empty message — fails the whole message.
//!
//! The input comes from producers: nesting depth costs heap (one frame per
//! open message), never stack, and the output is never longer than the
//! input.

use shmtrace_abi::proto::wire::{read_varint, varint_len, MAX_FIELD_NUMBER, MAX_MESSAGE_LEN};

use super::bytecode::{Bytecode, Field};
use super::strings::StringFilter;
use crate::protos::wire::put_varint;

/// Why a message could not be filtered (it is dropped whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed message at byte {0}")]
pub struct Malformed(pub usize);

/// A message being filtered: where it ends in the input, which bytecode
/// message it is, where its length goes in the output and how wide it is.
struct Frame {
    end: usize,
    message: u32,
    len_at: usize,
    len_width: usize,
}

/// Filters the message `input` (bytecode message `root`), appending the
/// result to `out`; on error, what `out` got is not a message
/// ([`TraceFilter::filter`](super::TraceFilter::filter) empties it).
pub fn filter(
    bytecode: &Bytecode,
    strings: &StringFilter,
    root: u32,
    input: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), Malformed> {
    if input.is_empty() {
        return Err(Malformed(0));
    }
    let mut stack = vec![Frame {
        end: input.len(),
        message: root,
        len_at: 0,
        len_width: 0,
    }];
    let mut pos = 0;
    while let Some(frame) = stack.last() {
        if pos == frame.end {
            // The message ends: its length is what was written for it.
            if let Some(f) = stack.pop().filter(|f| f.len_width > 0) {
                let written = out.len() - f.len_at - f.len_width;
                put_redundant_varint(&mut out[f.len_at..f.len_at + f.len_width], written);
            }
            continue;
        }
        let (end, message) = (frame.end, frame.message);
        let varint = |at: usize| match read_varint(&input[at..end]) {
            Ok((v, n)) => Ok((v, at + n)),
            Err(_) => Err(Malformed(at)),
        };
        let start = pos;
        let (key, next) = varint(pos)?;
        pos = next;
        // Field ids past 2^29 - 1 are not protobuf's: dropped (upstream
        // keeps 32 bits of them and writes a tag that wraps).
        let field = u32::try_from(key >> 3).unwrap_or(u32::MAX);
        let kept = if field == 0 || field > MAX_FIELD_NUMBER {
            Field::Dropped
        } else {
            bytecode.query(message, field)
        };
        match key & 7 {
            0 => {
                let (value, next) = varint(pos)?;
                pos = next;
                if kept == Field::Simple {
                    put_tag(out, field, 0);
                    put_varint(out, value);
                }
            }
            wire @ (1 | 5) => {
                let width = if wire == 1 { 8 } else { 4 };
                let bytes = input.get(pos..pos + width).filter(|_| pos + width <= end);
                let bytes = bytes.ok_or(Malformed(start))?;
                pos += width;
                if kept == Field::Simple {
                    put_tag(out, field, wire as u32);
                    out.extend_from_slice(bytes);
                }
            }
            2 => {
                let (len, next) = varint(pos)?;
                pos = next;
                if len > u64::from(MAX_MESSAGE_LEN) {
                    return Err(Malformed(start));
                }
                if field == 0 {
                    // Not a field: what follows is read as fields.
                    continue;
                }
                let len = len as usize;
                if len > end - pos {
                    return Err(Malformed(start));
                }
                match kept {
                    Field::Nested(nested) if len > 0 => {
                        put_tag(out, field, 2);
                        let len_at = out.len();
                        put_varint(out, len as u64);
                        stack.push(Frame {
                            end: pos + len,
                            message: nested,
                            len_at,
                            len_width: varint_len(len as u64),
                        });
                    }
                    Field::Dropped => pos += len,
                    _ => {
                        put_tag(out, field, 2);
                        put_varint(out, len as u64);
                        let at = out.len();
                        out.extend_from_slice(&input[pos..pos + len]);
                        if let Field::FilterString(semantic_type) = kept {
                            strings.apply(&mut out[at..], semantic_type);
                        }
                        pos += len;
                    }
                }
            }
            _ => return Err(Malformed(start)),
        }
    }
    Ok(())
}

/// A tag: `field << 3 | wire` (`field` is at most 2^29 - 1).
fn put_tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(out, u64::from(field) << 3 | u64::from(wire));
}

/// Writes `value` into `slot` as a varint exactly `slot.len()` bytes wide.
fn put_redundant_varint(slot: &mut [u8], mut value: usize) {
    let last = slot.len() - 1;
    for (i, b) in slot.iter_mut().enumerate() {
        *b = (value & 0x7f) as u8 | if i < last { 0x80 } else { 0 };
        value >>= 7;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{encode, filter_string as string, nested, simple, END as EOM};
    use super::*;

    /// Message 0 (the root here): 1 simple, 2 nested (1), 3 string to
    /// filter. Message 1: 1 simple, 5 nested (1, recursive).
    fn trace_filter() -> super::super::TraceFilter {
        let words = [
            simple(1),
            nested(2),
            1,
            string(3),
            EOM,
            simple(1),
            nested(5),
            1,
            EOM,
        ];
        super::super::TraceFilter {
            bytecode: Bytecode::load(&encode(&words), &[]).unwrap(),
            strings: StringFilter::default(),
            root: 0,
        }
    }

    fn run(input: &[u8]) -> Result<Vec<u8>, Malformed> {
        let mut out = vec![0xEE];
        trace_filter().filter(input, &mut out).map(|()| out)
    }

    #[test]
    fn kept_fields_are_reencoded_and_dropped_ones_vanish() {
        let input = [
            0x08, 0x96, 0x01, // 1: varint 150
            0x20, 0x05, // 4: dropped varint
            0x29, 1, 2, 3, 4, 5, 6, 7, 8, // 5: dropped fixed64
            0x1a, 0x02, b'h', b'i', // 3: string
            0x12, 0x08, // 2: message of 8 bytes
            0x08, 0x01, // 1: kept
            0x10, 0x02, // 2: dropped
            0x2a, 0x02, 0x08, 0x07, // 5: nested, 1 kept
        ];
        let out = run(&input).unwrap();
        assert_eq!(
            out,
            [
                0x08, 0x96, 0x01, 0x1a, 0x02, b'h', b'i', 0x12, 0x06, 0x08, 0x01, 0x2a, 0x02, 0x08,
                0x07,
            ]
        );
    }

    #[test]
    fn redundant_encodings_are_normalized_but_length_widths_kept() {
        // Field 1 as a 3-byte varint 1 with a 2-byte tag; a 130-byte
        // message whose output is 2 bytes keeps a 2-byte length.
        let mut input = vec![0x88, 0x00, 0x81, 0x80, 0x00, 0x12, 0x82, 0x01, 0x08, 0x01];
        input.extend(std::iter::repeat_n([0x10, 0x00], 64).flatten());
        let out = run(&input).unwrap();
        assert_eq!(out, [0x08, 0x01, 0x12, 0x82, 0x00, 0x08, 0x01]);
    }

    #[test]
    fn field_zero_is_skipped_and_its_length_ignored() {
        // A varint field 0, then a length-delimited field 0 whose 2
        // "payload" bytes are field 1.
        let out = run(&[0x00, 0x05, 0x02, 0x02, 0x08, 0x09]).unwrap();
        assert_eq!(out, [0x08, 0x09]);
    }

    #[test]
    fn empty_kept_messages_are_copied() {
        assert_eq!(run(&[0x12, 0x00]).unwrap(), [0x12, 0x00]);
    }

    #[test]
    fn malformed_input_fails_whole_and_leaves_nothing() {
        for bad in [
            &[][..],
            &[0x08],                         // varint cut
            &[0x08, 0x80],                   // varint cut
            &[0x0b],                         // wire type 3
            &[0x0f, 0x00],                   // wire type 7
            &[0x0d, 1, 2],                   // fixed32 cut
            &[0x1a, 0x05, b'a'],             // string past the end
            &[0x12, 0x02, 0x08, 0x80, 0x08], // varint across a message end
            &[0x12, 0x01, 0x0d, 0, 0, 0, 0], // fixed32 across a message end
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
        ] {
            let mut out = vec![1, 2, 3];
            let r = trace_filter().filter(bad, &mut out);
            assert!(r.is_err(), "{bad:02x?}");
            assert!(out.is_empty());
        }
        // A 10-byte varint is fine.
        let ten = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(run(&ten[..]).unwrap(), ten);
    }

    #[test]
    fn deep_nesting_uses_no_stack() {
        // 100,000 nested field-5 messages inside field 2.
        // Headers from the innermost message out: each holds what the
        // headers inside it and the innermost field take.
        let depth = 100_000;
        let mut headers = Vec::with_capacity(depth + 1);
        let mut content = 2usize;
        for level in 0..=depth {
            let mut h = vec![if level == depth { 0x12 } else { 0x2a }];
            put_varint(&mut h, content as u64);
            content += h.len();
            headers.push(h);
        }
        let mut input: Vec<u8> = headers.into_iter().rev().flatten().collect();
        input.extend_from_slice(&[0x08, 0x01]);
        let out = run(&input).unwrap();
        assert_eq!(out, input);
    }
}
