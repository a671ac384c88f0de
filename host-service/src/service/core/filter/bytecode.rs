//! The filter bytecode: which fields of which message a trace filter keeps.
//!
//! The format is upstream's (`FilterBytecodeParser`,
//! src/protozero/filtering/filter_bytecode_parser.cc, and the opcodes of
//! filter_bytecode_common.h), as Perfetto's `proto_filter` tool writes it:
//! a packed sequence of varint words, each `field_id << 3 | opcode`, some
//! followed by an argument word, and a final checksum word, the low 32
//! bits of the 64-bit FNV-1a hash of the other words' little-endian bytes.
//! Messages are numbered in the order their `END_OF_MESSAGE` comes; message
//! 0 is the root (`perfetto.protos.Trace`).
//!
//! An overlay (`bytecode_overlay_v54`) adds or upgrades fields: triples
//! `message, field_id << 3 | opcode, argument` sorted by message and field,
//! then a checksum; an overlay entry for a field the base names replaces
//! its rule.
//!
//! The bytecode comes from a consumer: everything is checked, nothing it
//! says can panic or make the tables larger than the bytecode itself
//! (at most 128 words per message, plus three per field past 127).

/// A field's rule word (upstream's "field state"): bit 31 set if the field
/// is kept; below it, [`SIMPLE`], a string to filter ([`FILTER_STRING`], or
/// `FILTER_STRING_TYPED | semantic type`), or the index of the message to
/// filter a nested field with.
type Rule = u32;
const ALLOWED: Rule = 1 << 31;
/// A field kept as it is.
const SIMPLE: u32 = 0x7fff_ffff;
/// A string field kept after the string filter ran on it.
const FILTER_STRING: u32 = 0x7fff_fffe;
/// The lowest string-filter rule: `FILTER_STRING_TYPED | semantic type`.
const FILTER_STRING_TYPED: u32 = 0x7fff_0000;
const SEMANTIC_TYPE_MASK: u32 = 0xffff;
/// Fields below this are looked up directly; the others in ranges.
const DIRECT_LIMIT: u32 = 128;

/// Opcodes (the low 3 bits of a word).
mod opcode {
    pub const END_OF_MESSAGE: u32 = 0;
    pub const SIMPLE_FIELD: u32 = 1;
    pub const SIMPLE_FIELD_RANGE: u32 = 2;
    pub const NESTED_FIELD: u32 = 3;
    pub const FILTER_STRING: u32 = 4;
    pub const FILTER_STRING_WITH_TYPE: u32 = 5;
}

/// What a filter does with one field of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Dropped.
    Dropped,
    /// Kept as it is (a number, string or bytes).
    Simple,
    /// A string, kept after the string filter ran on it with this semantic
    /// type (0: unspecified).
    FilterString(u32),
    /// A message, filtered field by field with message index `.0`.
    Nested(u32),
}

/// Why a bytecode does not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BytecodeError {
    /// Empty, a malformed varint, or no checksum word.
    #[error("the {0} is empty or not a sequence of varints")]
    Malformed(&'static str),
    /// The checksum word does not match.
    #[error("the {what}'s checksum is {actual:#x}, its words hash to {expected:#x}")]
    Checksum {
        /// Bytecode or overlay.
        what: &'static str,
        /// The checksum word.
        actual: u32,
        /// The words' hash.
        expected: u32,
    },
    /// An opcode that does not exist, or a field id 0.
    #[error("word {0} has an invalid opcode or field id 0")]
    BadWord(usize),
    /// A field or range whose argument word is missing.
    #[error("word {0} lacks its argument")]
    Unterminated(usize),
    /// Two ranges of one message overlap, or come out of order.
    #[error("message {0} has overlapping field ranges")]
    Overlap(u32),
    /// The last message is not ended.
    #[error("the last word is not END_OF_MESSAGE")]
    NoEnd,
    /// A nested field names a message that does not exist.
    #[error("a nested field names message {0}, past the last one")]
    NoSuchMessage(u32),
    /// An overlay is not triples, not sorted, uses an opcode overlays do not
    /// allow, or names messages the bytecode does not have.
    #[error("the overlay is invalid: {0}")]
    Overlay(&'static str),
}

/// One message's rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Message {
    /// Rules of fields `0..direct.len()` (0: dropped).
    direct: Vec<Rule>,
    /// Rules of field ranges `[start, end)`, sorted and disjoint.
    ranges: Vec<(u32, u32, Rule)>,
}

impl Message {
    fn set(&mut self, field: u32, rule: u32) {
        let rule = ALLOWED | rule;
        if field < DIRECT_LIMIT {
            let i = field as usize;
            if self.direct.len() <= i {
                self.direct.resize(i + 1, 0);
            }
            self.direct[i] = rule;
        } else {
            self.ranges.push((field, field.saturating_add(1), rule));
        }
    }
}

/// A loaded bytecode: per message, per field, a [`Field`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bytecode {
    messages: Vec<Message>,
}

/// An overlay entry: in message `message`, field `field` gets `rule`.
#[derive(Debug, Clone, Copy)]
struct OverlayEntry {
    message: u32,
    field: u32,
    rule: u32,
}

impl Bytecode {
    /// Loads `bytecode` (with `overlay` applied when it is not empty).
    pub fn load(bytecode: &[u8], overlay: &[u8]) -> Result<Self, BytecodeError> {
        let words = checked_words(bytecode, "bytecode")?;
        let overlay = if overlay.is_empty() {
            Vec::new()
        } else {
            overlay_entries(&checked_words(overlay, "overlay")?)?
        };
        let mut messages = Vec::new();
        let mut current = Message::default();
        let mut pending = overlay.iter().peekable();
        let mut max_nested = 0u32;
        let mut ended = true;
        let mut i = 0;
        while i < words.len() {
            let word = words[i];
            let (op, field) = (word & 7, word >> 3);
            ended = op == opcode::END_OF_MESSAGE;
            if field == 0 && !ended {
                return Err(BytecodeError::BadWord(i));
            }
            let index = messages.len() as u32;
            let mut argument = || {
                i += 1;
                words
                    .get(i)
                    .copied()
                    .ok_or(BytecodeError::Unterminated(i - 1))
            };
            match op {
                opcode::END_OF_MESSAGE => {
                    // The overlay's remaining entries for this message.
                    while let Some(e) = pending.next_if(|e| e.message <= index) {
                        current.set(e.field, e.rule);
                    }
                    let ranges = &current.ranges;
                    if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
                        return Err(BytecodeError::Overlap(index));
                    }
                    messages.push(std::mem::take(&mut current));
                }
                opcode::SIMPLE_FIELD_RANGE => {
                    let end = field.wrapping_add(argument()?);
                    let direct_end = end.min(DIRECT_LIMIT);
                    for id in field..direct_end {
                        current.set(id, SIMPLE);
                    }
                    let start = field.max(direct_end);
                    if start < end {
                        current.ranges.push((start, end, ALLOWED | SIMPLE));
                    }
                }
                opcode::SIMPLE_FIELD
                | opcode::NESTED_FIELD
                | opcode::FILTER_STRING
                | opcode::FILTER_STRING_WITH_TYPE => {
                    let mut rule = match op {
                        opcode::SIMPLE_FIELD => SIMPLE,
                        opcode::FILTER_STRING => FILTER_STRING,
                        opcode::FILTER_STRING_WITH_TYPE => {
                            FILTER_STRING_TYPED | (argument()? & SEMANTIC_TYPE_MASK)
                        }
                        _ => {
                            let nested = argument()?;
                            max_nested = max_nested.max(nested);
                            nested
                        }
                    };
                    // Overlay entries up to this field: earlier ones are
                    // new fields, this field's replaces its rule.
                    while let Some(e) = pending
                        .next_if(|e| e.message < index || (e.message == index && e.field <= field))
                    {
                        if e.message == index && e.field == field {
                            rule = e.rule;
                        } else {
                            current.set(e.field, e.rule);
                        }
                    }
                    current.set(field, rule);
                }
                _ => return Err(BytecodeError::BadWord(i)),
            }
            i += 1;
        }
        if !ended {
            return Err(BytecodeError::NoEnd);
        }
        if pending.next().is_some() {
            return Err(BytecodeError::Overlay(
                "it names messages the bytecode does not have",
            ));
        }
        if max_nested > 0 && max_nested as usize >= messages.len() {
            return Err(BytecodeError::NoSuchMessage(max_nested));
        }
        Ok(Self { messages })
    }

    /// What message `message` does with field `field`.
    pub fn query(&self, message: u32, field: u32) -> Field {
        let Some(m) = self.messages.get(message as usize) else {
            return Field::Dropped;
        };
        let rule = match m.direct.get(field as usize) {
            Some(&rule) => rule,
            None => m
                .ranges
                .iter()
                .find(|&&(start, end, _)| (start..end).contains(&field))
                .map_or(0, |&(_, _, rule)| rule),
        };
        if rule & ALLOWED == 0 {
            return Field::Dropped;
        }
        match rule & !ALLOWED {
            SIMPLE => Field::Simple,
            FILTER_STRING => Field::FilterString(0),
            r if r >= FILTER_STRING_TYPED => Field::FilterString(r & SEMANTIC_TYPE_MASK),
            nested => Field::Nested(nested),
        }
    }

    /// The message index of the nested field `field` of message 0 (the
    /// root), if the bytecode keeps it as a message: the service filters
    /// `TracePacket`s, so it starts from `Trace.packet`.
    pub fn nested_root(&self, field: u32) -> Option<u32> {
        match self.query(0, field) {
            Field::Nested(m) => Some(m),
            _ => None,
        }
    }
}

/// The FNV-1a offset basis and prime (64-bit).
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The checksum of `words`: the low 32 bits of the FNV-1a hash of their
/// little-endian bytes.
pub fn checksum(words: &[u32]) -> u32 {
    let mut h = FNV_OFFSET;
    for b in words.iter().flat_map(|w| w.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h as u32
}

/// The words of `bytes` (varints, each cut to 32 bits), checksum checked
/// and removed.
fn checked_words(bytes: &[u8], what: &'static str) -> Result<Vec<u32>, BytecodeError> {
    let mut words = Vec::with_capacity(bytes.len().min(1 << 16));
    let mut rest = bytes;
    while !rest.is_empty() {
        let (v, n) = shmtrace_abi::proto::wire::read_varint(rest)
            .map_err(|_| BytecodeError::Malformed(what))?;
        words.push(v as u32);
        rest = &rest[n..];
    }
    let actual = words.pop().ok_or(BytecodeError::Malformed(what))?;
    let expected = checksum(&words);
    if actual != expected {
        return Err(BytecodeError::Checksum {
            what,
            actual,
            expected,
        });
    }
    Ok(words)
}

/// The overlay's entries, checked.
fn overlay_entries(words: &[u32]) -> Result<Vec<OverlayEntry>, BytecodeError> {
    if words.len() % 3 != 0 {
        return Err(BytecodeError::Overlay("its words are not triples"));
    }
    let mut entries: Vec<OverlayEntry> = Vec::with_capacity(words.len() / 3);
    for t in words.chunks_exact(3) {
        let rule = match t[1] & 7 {
            opcode::SIMPLE_FIELD => SIMPLE,
            opcode::FILTER_STRING => FILTER_STRING,
            opcode::FILTER_STRING_WITH_TYPE => FILTER_STRING_TYPED | (t[2] & SEMANTIC_TYPE_MASK),
            _ => return Err(BytecodeError::Overlay(
                "an entry's opcode is not SIMPLE_FIELD, FILTER_STRING or FILTER_STRING_WITH_TYPE",
            )),
        };
        let e = OverlayEntry {
            message: t[0],
            field: t[1] >> 3,
            rule,
        };
        if entries
            .last()
            .is_some_and(|p| (e.message, e.field) <= (p.message, p.field))
        {
            return Err(BytecodeError::Overlay("its entries are not sorted"));
        }
        entries.push(e);
    }
    Ok(entries)
}

/// Writes bytecode: `words` as varints, then their checksum, as
/// Perfetto's `proto_filter` writes it (the fuzzer and tests build filters
/// with it).
pub fn encode(words: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    for &w in words.iter().chain(&[checksum(words)]) {
        crate::protos::wire::put_varint(&mut out, u64::from(w));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testing::{filter_string, nested, simple, END as EOM};
    use super::*;

    #[test]
    fn fields_ranges_nested_and_strings_load_and_answer() {
        // Message 0: 1 simple, 2 nested (message 1), 3..=5 and 126..=130
        // ranges, 200 string. Message 1: 1 string with semantic type 7.
        let words = [
            simple(1),
            nested(2),
            1,
            3 << 3 | opcode::SIMPLE_FIELD_RANGE,
            3,
            126 << 3 | opcode::SIMPLE_FIELD_RANGE,
            5,
            filter_string(200),
            EOM,
            1 << 3 | opcode::FILTER_STRING_WITH_TYPE,
            7,
            EOM,
        ];
        let b = Bytecode::load(&encode(&words), &[]).unwrap();
        assert_eq!(b.query(0, 1), Field::Simple);
        assert_eq!(b.query(0, 2), Field::Nested(1));
        for f in [3, 4, 5, 126, 127, 128, 129, 130] {
            assert_eq!(b.query(0, f), Field::Simple, "field {f}");
        }
        for f in [0, 6, 125, 131, 199, 201, u32::MAX] {
            assert_eq!(b.query(0, f), Field::Dropped, "field {f}");
        }
        assert_eq!(b.query(0, 200), Field::FilterString(0));
        assert_eq!(b.query(1, 1), Field::FilterString(7));
        assert_eq!(b.query(2, 1), Field::Dropped);
        assert_eq!(b.nested_root(2), Some(1));
        assert_eq!(b.nested_root(1), None);
    }

    #[test]
    fn an_overlay_upgrades_and_adds_fields() {
        let words = [simple(1), simple(2), EOM, simple(1), EOM];
        let overlay = encode(&[
            0,
            filter_string(2),
            0,
            0,
            300 << 3 | opcode::SIMPLE_FIELD,
            0,
            1,
            5 << 3 | opcode::FILTER_STRING_WITH_TYPE,
            3,
        ]);
        let b = Bytecode::load(&encode(&words), &overlay).unwrap();
        assert_eq!(b.query(0, 1), Field::Simple);
        assert_eq!(b.query(0, 2), Field::FilterString(0));
        assert_eq!(b.query(0, 300), Field::Simple);
        assert_eq!(b.query(1, 1), Field::Simple);
        assert_eq!(b.query(1, 5), Field::FilterString(3));
    }

    #[test]
    fn bad_bytecode_is_refused_with_its_reason() {
        let good = encode(&[simple(1), EOM]);
        let mut bad_sum = good.clone();
        *bad_sum.last_mut().unwrap() ^= 1;
        assert!(matches!(
            Bytecode::load(&bad_sum, &[]),
            Err(BytecodeError::Checksum { .. })
        ));
        assert_eq!(
            Bytecode::load(&[], &[]),
            Err(BytecodeError::Malformed("bytecode"))
        );
        assert_eq!(
            Bytecode::load(&[0x80], &[]),
            Err(BytecodeError::Malformed("bytecode"))
        );
        assert_eq!(
            Bytecode::load(&encode(&[opcode::SIMPLE_FIELD, EOM]), &[]),
            Err(BytecodeError::BadWord(0))
        );
        assert_eq!(
            Bytecode::load(&encode(&[simple(1), 1 << 3 | 6, EOM]), &[]),
            Err(BytecodeError::BadWord(1))
        );
        assert_eq!(
            Bytecode::load(&encode(&[nested(1)]), &[]),
            Err(BytecodeError::Unterminated(0))
        );
        assert_eq!(
            Bytecode::load(&encode(&[simple(1)]), &[]),
            Err(BytecodeError::NoEnd)
        );
        assert_eq!(
            Bytecode::load(&encode(&[nested(1), 5, EOM]), &[]),
            Err(BytecodeError::NoSuchMessage(5))
        );
        assert_eq!(
            Bytecode::load(&encode(&[simple(300), simple(200), EOM]), &[]),
            Err(BytecodeError::Overlap(0))
        );
        let unsorted = encode(&[0, simple(2), 0, 0, simple(1), 0]);
        assert!(matches!(
            Bytecode::load(&good, &unsorted),
            Err(BytecodeError::Overlay(_))
        ));
        let unused = encode(&[4, simple(2), 0]);
        assert!(matches!(
            Bytecode::load(&good, &unused),
            Err(BytecodeError::Overlay(_))
        ));
        let nested_overlay = encode(&[0, nested(2), 0]);
        assert!(matches!(
            Bytecode::load(&good, &nested_overlay),
            Err(BytecodeError::Overlay(_))
        ));
    }

    #[test]
    fn the_checksum_is_fnv1a_over_little_endian_words() {
        // FNV-1a 64 of no bytes is the offset basis.
        assert_eq!(checksum(&[]), FNV_OFFSET as u32);
        // One word 1: bytes 01 00 00 00.
        let mut h = FNV_OFFSET;
        for b in [1u8, 0, 0, 0] {
            h = (h ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
        assert_eq!(checksum(&[1]), h as u32);
    }
}
