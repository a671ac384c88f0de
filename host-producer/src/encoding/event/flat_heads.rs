//! Pre-encoded heads of flat events (the `tracing` layer's instants and
//! slice begins, [`SequenceState::write_flat`] and
//! [`SequenceState::write_flat_streamed`]): for a recent trace point, the
//! TrackEvent's type, category id, name id and head annotation (the
//! level), encoded once per sequence and then copied in word stores, and
//! the pre-encoded starts of its other annotations.
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
//!   them.
//! * A site also fixes its fields: the field of a given index (the layer's:
//!   its index in the callsite's field set) always has the same name. So
//!   the encoders keep a field's pre-encoded start ([`Prefix`]: its tag,
//!   its length byte, its name's id) in the entry by the field's index
//!   ([`FlatHead::keep_field_prefix`], once its name's id is looked up)
//!   and later take it by the index alone, without the name. A new entry
//!   keeps none; a name whose start takes more than 7 bytes has none.
//! * An entry also keeps one field's whole annotation with a literal text
//!   value (the layer's message without arguments: `&'static` text, the
//!   same at every event of its callsite), keyed by the field's index and
//!   the text's address and length, so the same text of the same field
//!   is copied in word stores ([`FlatHead::literal`]); another text or
//!   field replaces it. The last such annotation too long to keep is
//!   remembered too, so that it is not tried again at every event.
//! * An entry also notes whether its trace point's last event was too
//!   long to be written in place ([`FlatHead::set_long`]), so that the
//!   next one goes into the scratch buffer at once: a hint, which changes
//!   the work and never the bytes.
//! * An empty entry has kind 0, which no event written here has.

use super::fast::{
    put_annotation_start, put_arg_value, put_event_ids, put_flat_annotation, put_varint,
    TAG_DEBUG_ANNOTATIONS,
};
use super::*;

/// Entries (a power of two), direct-mapped by the trace point's site.
const SLOTS: usize = 16;
/// Words of pre-encoded bytes an entry holds.
const WORDS: usize = 4;
/// Fields (the first, by index) whose annotations' starts an entry keeps:
/// as many as a `tracing` callsite declares at most.
pub(super) const FIELDS: usize = 32;

/// A string by address and length.
type StrKey = (usize, usize);

#[inline(always)]
fn key(s: &'static str) -> StrKey {
    (s.as_ptr() as usize, s.len())
}

/// What an entry was made for: an event kind and a trace point's site.
/// The kind's top bit ([`LONG`]) marks the trace point's last event too
/// long to be written in place, so that the in-place encoder's lookup
/// (for the kind alone) misses it at no cost of its own.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Key {
    kind: u8,
    site: usize,
}

/// The bit of [`Key::kind`] marking a trace point whose last event was
/// too long to be written in place.
const LONG: u8 = 0x80;

/// The start of a flat debug annotation, pre-encoded in one word: its
/// tag, its one-byte length, and its name's id, the length holding the
/// bytes of the body the prefix has (the name's tag and id); the word's top
/// byte holds the prefix's length (at most 7 bytes: a name id below 2^28).
/// A word of 0: none (a name whose start takes more than 7 bytes).
#[derive(Clone, Copy, Default)]
pub(super) struct Prefix(u64);

impl Prefix {
    /// The prefix of an annotation whose name has the id `iid`.
    fn new(iid: u64) -> Self {
        let mut buf = [0u8; 8 + TARGET_SLACK];
        let mut c = Cursor::new(&mut buf);
        let body = put_annotation_start(&mut c, iid);
        match c.finish() {
            Some(len) if len < 8 => {
                let mut word = [0u8; 8];
                word.copy_from_slice(&buf[..8]);
                word[body - 1] = (len - body) as u8;
                word[7] = len as u8;
                Prefix(u64::from_le_bytes(word))
            }
            _ => Prefix::default(),
        }
    }

    /// Whether this is a prefix (not none).
    #[inline(always)]
    fn is_some(self) -> bool {
        self.0 != 0
    }

    /// Bytes of the prefix.
    #[inline(always)]
    fn len(self) -> usize {
        (self.0 >> 56) as usize
    }

    /// Appends the prefix with one word store and returns where the
    /// annotation's body starts (for `end_short` once its value is
    /// written: the length stored here counts the name's bytes alone).
    #[inline(always)]
    pub(super) fn put<T: Target>(self, f: &mut Cursor<T>) -> usize {
        let body = f.len() + 2;
        f.word(self.0, self.len());
        body
    }

    /// Appends the prefix of an annotation whose value (its tag
    /// included) takes `value` bytes, its length complete, with one word
    /// store: nothing to back-fill.
    #[inline(always)]
    pub(super) fn put_sized<T: Target>(self, f: &mut Cursor<T>, value: usize) {
        f.word(self.0 + ((value as u64) << 8), self.len());
    }

    /// [`Prefix::put_sized`] for a value of any size: a body of 128 bytes
    /// or more takes its length as a varint (the prefix's tag, the
    /// varint, then the prefix's name bytes).
    #[inline(always)]
    pub(super) fn put_any_sized<T: Target>(self, f: &mut Cursor<T>, value: usize) {
        let name = self.len() - 2;
        let body = name + value;
        if body <= shmtrace_abi::proto::wire::MAX_ONE_BYTE_LEN as usize {
            return self.put_sized(f, value);
        }
        f.byte(TAG_DEBUG_ANNOTATIONS);
        put_varint(f, body as u64);
        f.word(self.0 >> 16, name);
    }
}

/// Words of pre-encoded bytes a literal annotation is kept in (64
/// bytes: a message of up to about 58; [`Words::put_long`] puts 8).
const LITERAL_WORDS: usize = 8;
// `Words::put_long` writes a literal's words as eight named ones.
const _: () = assert!(LITERAL_WORDS == 8 && WORDS == 4);

/// Up to `N` words of pre-encoded bytes, put with word stores.
#[derive(Clone, Copy)]
pub(super) struct Words<const N: usize = WORDS> {
    words: [u64; N],
    /// Bytes in `words` (1 to `8 * N`; 0 in an empty entry).
    len: usize,
    /// Bytes of the last word used (`len` less the whole words before it).
    last: usize,
}

impl<const N: usize> Default for Words<N> {
    fn default() -> Self {
        Words {
            words: [0; N],
            len: 0,
            last: 0,
        }
    }
}

impl<const N: usize> Words<N> {
    /// The first `len` bytes of `buf` (at most `N * 8`; `buf` has as
    /// many), if `len` is.
    fn new(buf: &[u8], len: Option<usize>) -> Option<Self> {
        let len = len.filter(|&n| n <= N * 8)?;
        let mut words = [0u64; N];
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

    /// [`Words::put`] for more than [`WORDS`] words, of
    /// [`LITERAL_WORDS`] (the only `N` that calls it): the first four
    /// whole, then the rest as `put` does (out of line, so that the common
    /// case stays a few stores that call nothing).
    #[inline(never)]
    fn put_long<T: Target>(&self, f: &mut Cursor<T>) {
        let &[a, b, c, d, e, g, h, i] = &self.words[..] else {
            return;
        };
        f.word(a, 8);
        f.word(b, 8);
        f.word(c, 8);
        f.word(d, 8);
        let last = self.last;
        match self.len {
            ..=40 => f.word(e, last),
            41..=48 => {
                f.word(e, 8);
                f.word(g, last);
            }
            49..=56 => {
                f.word(e, 8);
                f.word(g, 8);
                f.word(h, last);
            }
            _ => {
                f.word(e, 8);
                f.word(g, 8);
                f.word(h, 8);
                f.word(i, last);
            }
        }
    }

    /// Appends the bytes.
    #[inline(always)]
    pub(super) fn put<T: Target>(&self, f: &mut Cursor<T>) {
        // Whole words, then the last one's bytes (`last`, worked out when
        // the entry was made): no count kept per word. (Past four words,
        // which only a literal has, out of line.)
        let (a, b, c, d) = (self.words[0], self.words[1], self.words[2], self.words[3]);
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
            n if N == LITERAL_WORDS && n > WORDS * 8 => self.put_long(f),
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
    bytes: Words<LITERAL_WORDS>,
}

/// No field's literal.
const NO_LITERAL: (usize, StrKey) = (usize::MAX, (0, 0));

impl Default for Literal {
    fn default() -> Self {
        Literal {
            index: NO_LITERAL.0,
            text: NO_LITERAL.1,
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
    /// Pre-encoded starts by field index (none: not kept).
    fields: [Prefix; FIELDS],
    /// The last literal annotation kept.
    literal: Literal,
    /// The last literal annotation too long to keep (field index, text):
    /// not tried again.
    long_literal: (usize, StrKey),
}

impl FlatHead {
    /// Appends the pre-encoded bytes: the TrackEvent's type, category id
    /// and name id, and the head annotation.
    #[inline(always)]
    pub(super) fn put<T: Target>(&self, f: &mut Cursor<T>) {
        self.head.put(f);
    }

    /// Notes whether the trace point's last event took a packet too long
    /// to be written in place (more than 127 bytes): then
    /// [`FlatHeads::get_short_mut`] misses the entry, so that the next
    /// event is encoded into the scratch buffer at once.
    #[inline(always)]
    pub(super) fn set_long(&mut self, long: bool) {
        self.key.kind = self.key.kind & !LONG | if long { LONG } else { 0 };
    }

    /// Whether this is the entry of an event of `kind` from the trace
    /// point `site`, on a sequence reset `resets` times, its last event
    /// too long to be written in place (`kind` with [`LONG`]) or not.
    #[inline(always)]
    fn is(&self, kind: u8, site: usize, resets: u64) -> bool {
        self.key == (Key { kind, site }) && self.resets == resets
    }

    /// The pre-encoded start of the annotation of the trace point's field
    /// `index`, if kept.
    #[inline(always)]
    pub(super) fn field_prefix(&self, index: usize) -> Option<Prefix> {
        let prefix = *self.fields.get(index)?;
        prefix.is_some().then_some(prefix)
    }

    /// Keeps the pre-encoded start of the annotation of the trace point's
    /// field `index`, whose name has the id `iid` (interned since the
    /// entry's reset), and returns it; `None` if it has none (an index
    /// past those kept, a start longer than a word).
    pub(super) fn keep_field_prefix(&mut self, index: usize, iid: u64) -> Option<Prefix> {
        let slot = self.fields.get_mut(index)?;
        *slot = Prefix::new(iid);
        slot.is_some().then_some(*slot)
    }

    /// The pre-encoded annotation of the trace point's field `index` with
    /// the literal text `text` (the same text: the same address and
    /// length), if kept.
    #[inline(always)]
    pub(super) fn literal(
        &self,
        index: usize,
        text: &'static str,
    ) -> Option<&Words<LITERAL_WORDS>> {
        let l = &self.literal;
        (l.index == index && l.text == key(text)).then_some(&l.bytes)
    }

    /// Whether the annotation of the trace point's field `index` with the
    /// literal text `text` was the last found too long to keep.
    #[inline(always)]
    pub(super) fn is_long_literal(&self, index: usize, text: &'static str) -> bool {
        self.long_literal == (index, key(text))
    }

    /// Keeps the annotation of the trace point's field `index`, which
    /// starts with `prefix` (its kept start), with the literal text
    /// `text`, in place of the one kept before, and returns it; `None` if
    /// it takes more than [`LITERAL_WORDS`] words (then remembered as too long).
    pub(super) fn keep_literal(
        &mut self,
        index: usize,
        prefix: Prefix,
        text: &'static str,
    ) -> Option<&Words<LITERAL_WORDS>> {
        let mut buf = [0u8; LITERAL_WORDS * 8 + TARGET_SLACK];
        let mut c = Cursor::new(&mut buf);
        let a = prefix.put(&mut c);
        put_arg_value(&mut c, encode::ArgValue::Str(text));
        c.end_short(a);
        let len = c.finish();
        let Some(bytes) = Words::new(&buf, len) else {
            self.long_literal = (index, key(text));
            return None;
        };
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
    /// sequence reset `resets` times (mutable: field prefixes are kept in
    /// it).
    #[inline(always)]
    pub(super) fn get_mut(&mut self, kind: u8, site: usize, resets: u64) -> Option<&mut FlatHead> {
        let e = &mut self.slots[Self::slot(site)];
        (e.is(kind, site, resets) || e.is(kind | LONG, site, resets)).then_some(e)
    }

    /// [`FlatHeads::get_mut`] for a trace point whose last event was not
    /// too long to be written in place (see [`FlatHead::set_long`]).
    #[inline(always)]
    pub(super) fn get_short_mut(
        &mut self,
        kind: u8,
        site: usize,
        resets: u64,
    ) -> Option<&mut FlatHead> {
        let e = &mut self.slots[Self::slot(site)];
        e.is(kind, site, resets).then_some(e)
    }

    /// Makes the entry of an event (as [`FlatHeads::get_mut`] takes it) whose
    /// category, name and head annotation name have the ids `cat`, `iid`
    /// and `head_iid`, and whose head annotation's value is `head`;
    /// nothing if its head does not fit an entry.
    pub(super) fn insert(
        &mut self,
        kind: u8,
        site: usize,
        iid: u64,
        (head, head_iid): (&'static str, u64),
        cat: u64,
        resets: u64,
    ) -> Option<&mut FlatHead> {
        let mut buf = [0u8; WORDS * 8 + TARGET_SLACK];
        let mut c = Cursor::new(&mut buf);
        put_event_ids(&mut c, kind, cat, iid);
        put_flat_annotation(&mut c, head_iid, encode::ArgValue::Str(head));
        let len = c.finish();
        let head = Words::new(&buf, len)?;
        let slot = &mut self.slots[Self::slot(site)];
        *slot = FlatHead {
            key: Key { kind, site },
            resets,
            head,
            fields: [Prefix::default(); FIELDS],
            literal: Literal::default(),
            long_literal: NO_LITERAL,
        };
        Some(slot)
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
                    0,
                );
                let entry = heads.get_mut(EventType::Instant as u8, site, 0);
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
