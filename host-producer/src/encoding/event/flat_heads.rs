//! Pre-encoded heads of flat events (the `tracing` layer's instants and
//! slice begins, [`SequenceState::write_flat`]): for a recent trace point,
//! the TrackEvent's type, category id, name id and head annotation (the
//! level), encoded once per sequence and then copied in four word stores,
//! and the ids of the names of its other annotations, checked by address
//! instead of looked up.
//!
//! # Invariants
//!
//! * An entry holds ids interned on its sequence since its reset number
//!   `resets`, and is used only while the sequence's reset count is still
//!   that: a reset clears the interning tables, after which the ids name
//!   nothing.
//! * An entry is used only for an event of its kind from the trace point
//!   (`site`) it was made for. A site is a caller's promise: every event
//!   given that site has the same category, name and head annotation (the
//!   layer's site is its callsite's `Metadata`, which fixes the target,
//!   the name and the level), so one compare of the site stands for
//!   comparing the three (five strings); the entry's bytes are then
//!   exactly what [`put_event_ids`] and [`put_flat_annotation`] write for
//!   them. A
//!   later annotation's pre-encoded start ([`Prefix`]: its tag, a length
//!   byte to fill, its name's id) is used only for the same name at the
//!   same position; a name whose start takes more than a word has no
//!   prefix, and its position is keyed (0, 0), which no string has (a
//!   string's address is never 0).
//! * A site also fixes its fields: the field of a given index (the layer's:
//!   its index in the callsite's field set) always has the same name. So
//!   the streamed encoder ([`SequenceState::write_flat_streamed`]) keeps a
//!   field's pre-encoded start in the entry by the field's index
//!   ([`FlatHead::keep_field_prefix`], once its name's id is looked up)
//!   and later takes it by the index alone, without the name. A new entry
//!   keeps none.
//! * An entry also keeps one field's whole annotation with a literal text
//!   value (the layer's message without arguments: `&'static` text, the
//!   same at every event of its callsite), keyed by the field's index and
//!   the text's address and length, so the same text of the same field
//!   is copied in word stores ([`FlatHead::literal`]); another text or
//!   field replaces it.
//! * An empty entry has kind 0, which no event written here has.

use super::fast::{put_annotation_start, put_arg_value, put_event_ids, put_flat_annotation};
use super::*;

/// Entries (a power of two), direct-mapped by the trace point's site.
const SLOTS: usize = 16;
/// Words of pre-encoded bytes an entry holds.
const WORDS: usize = 4;
/// Annotations after the head whose name ids an entry keeps.
pub(super) const NAMES: usize = 8;

/// A string by address and length.
type StrKey = (usize, usize);

#[inline(always)]
fn key(s: &'static str) -> StrKey {
    (s.as_ptr() as usize, s.len())
}

/// What an entry was made for: an event kind and a trace point's site.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Key {
    kind: u8,
    site: usize,
}

/// The start of a flat debug annotation, pre-encoded: its tag, its
/// one-byte length (0, filled in by [`Prefix::put`]'s caller), and its
/// name's id; `len` 0 if it takes more than a word.
#[derive(Clone, Copy, Default)]
pub(super) struct Prefix {
    word: u64,
    len: usize,
}

impl Prefix {
    /// The prefix of an annotation whose name has the id `iid`.
    fn new(iid: u64) -> Self {
        let mut buf = [0u8; 8 + TARGET_SLACK];
        let mut c = Cursor::new(&mut buf);
        let _ = put_annotation_start(&mut c, iid);
        match c.finish() {
            Some(len) => {
                let mut word = [0u8; 8];
                word.copy_from_slice(&buf[..8]);
                Prefix {
                    word: u64::from_le_bytes(word),
                    len,
                }
            }
            None => Prefix::default(),
        }
    }

    /// Appends the prefix with one word store and returns where the
    /// annotation's body starts (for `end_short` once its value is
    /// written).
    #[inline(always)]
    pub(super) fn put<T: Target>(self, f: &mut Cursor<T>) -> usize {
        let body = f.len() + 2;
        f.word(self.word, self.len);
        body
    }
}

/// Up to [`WORDS`] words of pre-encoded bytes, put with word stores.
#[derive(Clone, Copy, Default)]
pub(super) struct Words {
    words: [u64; WORDS],
    /// Bytes in `words` (1 to 32; 0 in an empty entry).
    len: usize,
    /// Bytes of the last word used (`len` less the whole words before it).
    last: usize,
}

impl Words {
    /// The first `len` bytes of `buf` (at most `WORDS * 8`), if `len` is.
    fn new(buf: &[u8; WORDS * 8 + TARGET_SLACK], len: Option<usize>) -> Option<Self> {
        let len = len.filter(|&n| n <= WORDS * 8)?;
        let mut words = [0u64; WORDS];
        for (w, bytes) in words.iter_mut().zip(buf.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(bytes);
            *w = u64::from_le_bytes(b);
        }
        Some(Words {
            words,
            len,
            last: len - (len.max(1) - 1) / 8 * 8,
        })
    }

    /// Appends the bytes.
    #[inline(always)]
    pub(super) fn put<T: Target>(&self, f: &mut Cursor<T>) {
        // Whole words, then the last one's bytes (`last`, worked out when
        // the entry was made): no count kept per word.
        let [a, b, c, d] = self.words;
        let last = self.last;
        match self.len {
            0..=8 => f.word(a, last),
            9..=16 => {
                f.word(a, 8);
                f.word(b, last);
            }
            17..=24 => {
                f.word(a, 8);
                f.word(b, 8);
                f.word(c, last);
            }
            _ => {
                f.word(a, 8);
                f.word(b, 8);
                f.word(c, 8);
                f.word(d, last);
            }
        }
    }
}

/// A field's whole annotation with a literal text value (a `tracing`
/// event's message without arguments), pre-encoded.
#[derive(Clone, Copy)]
struct Literal {
    /// The field's index.
    index: usize,
    /// The text, by address and length.
    text: StrKey,
    bytes: Words,
}

impl Default for Literal {
    fn default() -> Self {
        Literal {
            // No field's.
            index: usize::MAX,
            text: (0, 0),
            bytes: Words::default(),
        }
    }
}

/// One trace point's pre-encoded head.
#[derive(Clone, Copy, Default)]
pub(super) struct FlatHead {
    key: Key,
    resets: u64,
    /// The TrackEvent's type, category id and name id, and the head
    /// annotation.
    head: Words,
    names: [(StrKey, Prefix); NAMES],
    /// Pre-encoded starts by field index (`len` 0: none kept).
    fields: [Prefix; NAMES],
    /// The last literal annotation kept.
    literal: Literal,
}

impl FlatHead {
    /// Appends the pre-encoded bytes: the TrackEvent's type, category id
    /// and name id, and the head annotation.
    #[inline(always)]
    pub(super) fn put<T: Target>(&self, f: &mut Cursor<T>) {
        self.head.put(f);
    }

    /// The pre-encoded start of annotation `i` after the head, if it is
    /// named `name`, as the one this entry saw there.
    #[inline(always)]
    pub(super) fn prefix(&self, i: usize, name: &'static str) -> Option<Prefix> {
        let &(k, prefix) = self.names.get(i)?;
        // (A name without a prefix is keyed (0, 0), which no name is.)
        (k == key(name)).then_some(prefix)
    }

    /// Whether this is the entry of an event of `kind` from the trace
    /// point `site`, on a sequence reset `resets` times.
    #[inline(always)]
    fn is(&self, kind: u8, site: usize, resets: u64) -> bool {
        self.key == (Key { kind, site }) && self.resets == resets
    }

    /// The pre-encoded start of the annotation of the trace point's field
    /// `index`, if kept.
    #[inline(always)]
    pub(super) fn field_prefix(&self, index: usize) -> Option<Prefix> {
        let prefix = *self.fields.get(index)?;
        (prefix.len != 0).then_some(prefix)
    }

    /// Keeps the pre-encoded start of the annotation of the trace point's
    /// field `index`, whose name has the id `iid` (interned since the
    /// entry's reset), and returns it; `None` if it has none (an index
    /// past those kept, a start longer than a word).
    pub(super) fn keep_field_prefix(&mut self, index: usize, iid: u64) -> Option<Prefix> {
        let slot = self.fields.get_mut(index)?;
        *slot = Prefix::new(iid);
        (slot.len != 0).then_some(*slot)
    }

    /// The pre-encoded annotation of the trace point's field `index` with
    /// the literal text `text` (the same text: the same address and
    /// length), if kept.
    #[inline(always)]
    pub(super) fn literal(&self, index: usize, text: &'static str) -> Option<&Words> {
        let l = &self.literal;
        (l.index == index && l.text == key(text)).then_some(&l.bytes)
    }

    /// Keeps the annotation of the trace point's field `index`, which
    /// starts with `prefix` (its kept start), with the literal text
    /// `text`, in place of the one kept before, and returns it; `None` if
    /// it takes more than [`WORDS`] words.
    pub(super) fn keep_literal(
        &mut self,
        index: usize,
        prefix: Prefix,
        text: &'static str,
    ) -> Option<&Words> {
        let mut buf = [0u8; WORDS * 8 + TARGET_SLACK];
        let mut c = Cursor::new(&mut buf);
        let a = prefix.put(&mut c);
        put_arg_value(&mut c, encode::ArgValue::Str(text));
        c.end_short(a);
        let len = c.finish();
        let bytes = Words::new(&buf, len)?;
        self.literal = Literal {
            index,
            text: key(text),
            bytes,
        };
        Some(&self.literal.bytes)
    }
}

/// A sequence's pre-encoded heads (see the module docs).
pub(super) struct FlatHeads {
    slots: Box<[FlatHead; SLOTS]>,
}

impl FlatHeads {
    pub(super) fn new() -> Self {
        FlatHeads {
            slots: Box::new([FlatHead::default(); SLOTS]),
        }
    }

    #[inline(always)]
    fn slot(site: usize) -> usize {
        ((site as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize & (SLOTS - 1)
    }

    /// The entry for an event of `kind` from the trace point `site`, on a
    /// sequence reset `resets` times.
    #[inline(always)]
    pub(super) fn get(&self, kind: u8, site: usize, resets: u64) -> Option<&FlatHead> {
        let e = &self.slots[Self::slot(site)];
        e.is(kind, site, resets).then_some(e)
    }

    /// [`FlatHeads::get`], to keep field prefixes in.
    #[inline(always)]
    pub(super) fn get_mut(&mut self, kind: u8, site: usize, resets: u64) -> Option<&mut FlatHead> {
        let e = &mut self.slots[Self::slot(site)];
        e.is(kind, site, resets).then_some(e)
    }

    /// Makes the entry of an event (as [`FlatHeads::get`] takes it) whose
    /// category, name and head annotation name have the ids `cat`, `iid`
    /// and `head_iid`, whose head annotation's value is `head`, and whose
    /// later annotations' names have the ids of `names`; nothing if its
    /// head does not fit an entry.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert(
        &mut self,
        kind: u8,
        site: usize,
        iid: u64,
        (head, head_iid): (&'static str, u64),
        cat: u64,
        names: &[(&'static str, u64)],
        resets: u64,
    ) {
        let mut buf = [0u8; WORDS * 8 + TARGET_SLACK];
        let mut c = Cursor::new(&mut buf);
        put_event_ids(&mut c, kind, cat, iid);
        put_flat_annotation(&mut c, head_iid, encode::ArgValue::Str(head));
        let len = c.finish();
        let Some(head) = Words::new(&buf, len) else {
            return;
        };
        let mut keyed = [((0, 0), Prefix::default()); NAMES];
        for (out, &(n, id)) in keyed.iter_mut().zip(names) {
            let prefix = Prefix::new(id);
            if prefix.len != 0 {
                *out = (key(n), prefix);
            }
        }
        self.slots[Self::slot(site)] = FlatHead {
            key: Key { kind, site },
            resets,
            head,
            names: keyed,
            fields: [Prefix::default(); NAMES],
            literal: Literal::default(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Head values of every length from 0 to 31 bytes.
    const TEXT: &str = "0123456789abcdefghijklmnopqrstuv";

    #[test]
    fn a_head_of_any_length_is_put_as_encoded() {
        let mut heads = FlatHeads::new();
        // Ids of one and two bytes: heads of 9 to 32 bytes.
        for (cat, iid, head_iid) in [(1, 2, 3), (300, 400, 500)] {
            for n in 0..=TEXT.len() {
                let value = &TEXT[..n];
                let mut want = [0u8; 64 + TARGET_SLACK];
                let mut c = Cursor::new(&mut want);
                put_event_ids(&mut c, EventType::Instant as u8, cat, iid);
                put_flat_annotation(&mut c, head_iid, encode::ArgValue::Str(value));
                let want_len = c.finish().unwrap();
                // A site of its own for each head.
                let site = n + 1;
                heads.insert(
                    EventType::Instant as u8,
                    site,
                    iid,
                    (value, head_iid),
                    cat,
                    &[],
                    0,
                );
                let entry = heads.get(EventType::Instant as u8, site, 0);
                let Some(entry) = entry else {
                    assert!(want_len > WORDS * 8, "a head of {want_len} B fits");
                    continue;
                };
                let mut got = [0xAAu8; 64 + TARGET_SLACK];
                let mut c = Cursor::new(&mut got);
                c.byte(0x55);
                entry.put(&mut c);
                assert_eq!(c.finish(), Some(1 + want_len), "{n} B value");
                assert_eq!(got[1..=want_len], want[..want_len], "{n} B value");
            }
        }
    }
}
