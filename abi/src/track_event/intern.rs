//! Per-sequence interning of `'static` strings in a fixed-size table.
//!
//! # Invariants
//!
//! * A key is the address, length and kind of a `&'static str`: the bytes
//!   behind an address never change, so equal keys mean equal strings.
//!   Equal strings at different addresses get different ids, which is
//!   legal. Strings longer than [`MAX_LEN`] bytes are not interned.
//! * Interned ids count from 1 per kind (event names, categories,
//!   annotation names each have their own id space, as in `InternedData`)
//!   and restart at 1 after every [`InternTable::clear`].
//! * An entry is live only if the generation in its tag is the table's:
//!   clearing is one increment, no loop over the table (and so no `memset`
//!   in a firmware image). Generations are 7 bits (1..=127; 0 is never
//!   live); when they wrap, every entry is retired one by one first.
//! * An entry is 8 bytes on a 32-bit target: the address, and the tag
//!   `len << 25 | kind << 23 | generation << 16 | iid`. A lookup compares
//!   the address, and XORs the tag with the wanted high half (the key's
//!   bits and the generation), which leaves the id when they match: one
//!   compare tests the match and the id's range. A string has two home
//!   slots (hashes of its address and key bits); a lookup tries the first,
//!   then the second, with a multiply and one entry compare each, then
//!   (out of line) the slots after the second until one that is not live.
//!   A new string takes the first free slot of that same sequence, so a
//!   lookup finds it there. Entries never die before a clear, so such a
//!   probe chain never breaks. (Strings whose homes collide may land past
//!   them, where a lookup costs the out-of-line probe: the price of a
//!   placement without moves, which a firmware image pays in bytes once.)
//!   A table of at most [`SCAN_MAX`] entries has no homes: a lookup
//!   compares every entry (a short loop, inline), a new string takes the
//!   first free one. As many compares as the probes' bound, and no hashing
//!   code.
//! * The table never grows. When it is full (or a kind's ids run out) a
//!   string is not interned: the caller writes it inline.
//! * A lookup probes at most `N` slots and never fails otherwise; nothing
//!   here panics.

/// Longest string interned, in bytes.
pub const MAX_LEN: usize = 127;

/// Tables of at most this many entries are scanned, not hashed (see the
/// module docs).
pub const SCAN_MAX: usize = 4;

/// Generations of live entries: 1..=`GENERATIONS`.
const GENERATIONS: u16 = 127;

/// What an interned string names (its `InternedData` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// `event_categories`.
    Category = 0,
    /// `event_names`.
    EventName = 1,
    /// `debug_annotation_names`.
    AnnotationName = 2,
}

impl Kind {
    /// The `InternedData` field this kind's entries go in.
    pub const fn field(self) -> u32 {
        use crate::trace::interned_data as f;
        match self {
            Kind::Category => f::EVENT_CATEGORIES,
            Kind::EventName => f::EVENT_NAMES,
            Kind::AnnotationName => f::DEBUG_ANNOTATION_NAMES,
        }
    }
}

/// The result of [`InternTable::intern`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interned {
    /// Interned earlier on this sequence (since the last clear).
    Known(u16),
    /// Interned now: the packet must carry `(iid, string)` in its
    /// `interned_data`.
    New(u16),
    /// No room: write the string inline.
    Full,
}

/// A string as the table knows it: the string (its address) and its key
/// bits `len << 25 | kind << 23`, or bits no entry matches for a string
/// longer than [`MAX_LEN`]. Cheap to compute where the string is a
/// constant: callers compute the bits there and pass them on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    s: &'static str,
    /// The key bits (23..=31; the rest 0).
    bits: u32,
}

impl Key {
    /// The key of `s` as a `kind`.
    #[inline(always)]
    pub fn new(s: &'static str, kind: Kind) -> Key {
        let len = s.len();
        Key {
            s,
            bits: if len <= MAX_LEN {
                (len as u32) << LEN_SHIFT | (kind as u32) << KIND_SHIFT
            } else {
                NEVER
            },
        }
    }

    /// The key bits (23..=31; the rest 0).
    #[inline(always)]
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// The key of `s` with the bits [`Key::bits`] returned for a key of
    /// `s` (so keys can travel packed in a word).
    #[inline(always)]
    pub(crate) fn from_bits(s: &'static str, bits: u32) -> Key {
        Key { s, bits }
    }

    #[inline(always)]
    fn ptr(&self) -> usize {
        self.s.as_ptr() as usize
    }
}

const KIND_SHIFT: u32 = 23;
const LEN_SHIFT: u32 = 25;
const GENERATION_SHIFT: u32 = 16;
/// The key bits of a key no entry matches: the kind bits 3, which no
/// [`Kind`] has.
const NEVER: u32 = (MAX_LEN as u32) << LEN_SHIFT | 3 << KIND_SHIFT;
/// The tag's id bits.
const IID_MASK: u32 = (1 << GENERATION_SHIFT) - 1;
/// The tag's key bits.
const KEY_MASK: u32 = !0 << KIND_SHIFT;

#[derive(Clone, Copy)]
struct Entry {
    ptr: usize,
    /// `len << 25 | kind << 23 | generation << 16 | iid`.
    tag: u32,
}

impl Entry {
    #[inline(always)]
    fn generation(&self) -> u32 {
        self.tag >> GENERATION_SHIFT & GENERATIONS_MASK
    }

    /// The id, if this is `key` wanted as `want` (see
    /// [`InternTable::want`]): the tag XOR `want`, which is at most
    /// [`IID_MASK`] exactly then.
    #[inline(always)]
    fn id_of(&self, key: Key, want: u32) -> Option<u32> {
        let x = self.tag ^ want;
        (self.ptr == key.ptr() && x <= IID_MASK).then_some(x)
    }
}

/// Mask of a generation (7 bits).
const GENERATIONS_MASK: u32 = 0x7F;

const EMPTY: Entry = Entry { ptr: 0, tag: 0 };

/// An interning table of `N` entries (a power of two) for all three kinds.
// `repr(C)`, the generation (a new table's only word that is not 0, read
// by every lookup and cached event) 6 bytes in, where its writer keeps it
// within reach of the Cortex-M halfword loads (see `TrackEventWriter`'s
// layout); the entries, a new table's zeros, 4-aligned after it.
#[repr(C)]
pub struct InternTable<const N: usize> {
    /// Last id handed out, per kind.
    last_iid: [u16; 3],
    /// Generation of live entries (1..=127).
    generation: u16,
    entries: [Entry; N],
}

impl<const N: usize> Default for InternTable<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> InternTable<N> {
    const BITS: u32 = {
        assert!(
            N.is_power_of_two() && N <= 1 << 15,
            "N must be a power of two"
        );
        N.trailing_zeros()
    };

    /// An empty table.
    pub const fn new() -> Self {
        let _ = Self::BITS;
        Self {
            entries: [EMPTY; N],
            last_iid: [0; 3],
            generation: 1,
        }
    }

    /// `key`'s tag bits on the current generation (all but the id).
    #[inline(always)]
    fn want(&self, key: Key) -> u32 {
        u32::from(self.generation) << GENERATION_SHIFT | key.bits
    }

    /// The two home slots of `key`: Fibonacci hashing of the address and
    /// the key bits (not the generation, so a string keeps its slots across
    /// clears); the top bits give the first home slot, and the next ones,
    /// made odd, what to XOR it with for the second: two distinct slots in
    /// a table of two or more.
    #[inline(always)]
    fn homes(key: Key) -> [usize; 2] {
        Self::homes_of(key.ptr(), key.bits)
    }

    /// [`Self::homes`] of the key with address `ptr` and bits `bits`.
    #[inline(always)]
    fn homes_of(ptr: usize, bits: u32) -> [usize; 2] {
        let h = (ptr as u32 ^ bits).wrapping_mul(0x9E37_79B9);
        if Self::BITS == 0 {
            [0, 0]
        } else {
            let first = (h >> (32 - Self::BITS)) as usize;
            let step = (h >> (32 - Self::BITS).saturating_sub(Self::BITS)) as usize | 1;
            [first, (first ^ step) & (N - 1)]
        }
    }

    /// The id of `s` if it is interned on this sequence.
    #[inline(always)]
    pub fn lookup(&self, s: &'static str, kind: Kind) -> Option<u16> {
        u16::try_from(self.lookup_word(Key::new(s, kind))).ok()
    }

    /// The id of `key` if it is interned on this sequence, as a word: the
    /// id, or `u32::MAX` if it is not interned (a caller tests several
    /// ids with one compare). Inline: a multiply and one entry compare
    /// when the string sits in its first home slot, one more in its second;
    /// otherwise [`Self::find`]'s out-of-line probe. A table of at most
    /// [`SCAN_MAX`] entries is scanned ([`Self::find`]).
    #[inline(always)]
    pub fn lookup_word(&self, key: Key) -> u32 {
        if N <= SCAN_MAX {
            return self.find(key);
        }
        let want = self.want(key);
        let [first, second] = Self::homes(key);
        let at = |i: usize| self.entries.get(i).and_then(|e| e.id_of(key, want));
        match at(first) {
            Some(iid) => iid,
            None => match at(second) {
                Some(iid) => iid,
                None => self.find(key),
            },
        }
    }

    /// [`Self::lookup_word`] without the inline probes: every slot, in
    /// order, in a table of at most [`SCAN_MAX`] entries (inline: a short
    /// loop); else, out of line (`probe`), the home slots, then the slots
    /// after the second up to the first dead one.
    #[inline(always)]
    pub fn find(&self, key: Key) -> u32 {
        if N <= SCAN_MAX {
            let want = self.want(key);
            return self
                .entries
                .iter()
                .find_map(|e| e.id_of(key, want))
                .unwrap_or(u32::MAX);
        }
        self.probe(key)
    }

    /// [`Self::find`] in a hashed table.
    #[inline(never)]
    fn probe(&self, key: Key) -> u32 {
        let want = self.want(key);
        let [first, second] = Self::homes(key);
        let mut i = first;
        for step in 0..N + 1 {
            let Some(e) = self.entries.get(i) else {
                break;
            };
            if let Some(iid) = e.id_of(key, want) {
                return iid;
            }
            if step > 1 && e.generation() != u32::from(self.generation) {
                break;
            }
            i = if step == 0 { second } else { (i + 1) & (N - 1) };
        }
        u32::MAX
    }

    /// The id of `s`, interning it if it is new and there is room: in its
    /// first free home slot, or else the first free slot after its second
    /// home (where a lookup's probe finds it); in a table of at most
    /// [`SCAN_MAX`] entries, its first free slot.
    pub fn intern(&mut self, s: &'static str, kind: Kind) -> Interned {
        if s.len() > MAX_LEN {
            return Interned::Full;
        }
        let key = Key::new(s, kind);
        if let Ok(iid) = u16::try_from(self.find(key)) {
            return Interned::Known(iid);
        }
        let generation = u32::from(self.generation);
        let tag = self.want(key);
        let Some(last) = self.last_iid.get_mut(kind as usize) else {
            return Interned::Full;
        };
        let Some(iid) = last.checked_add(1) else {
            return Interned::Full;
        };
        if N <= SCAN_MAX {
            // A scanned table: the first free slot, found by the same scan
            // that tells a full table.
            let Some(slot) = self
                .entries
                .iter_mut()
                .find(|slot| slot.generation() != generation)
            else {
                return Interned::Full;
            };
            *last = iid;
            *slot = Entry {
                ptr: key.ptr(),
                tag: tag | u32::from(iid),
            };
            return Interned::New(iid);
        }
        if self.entries.iter().all(|e| e.generation() == generation) {
            return Interned::Full;
        }
        *last = iid;
        self.place(Entry {
            ptr: key.ptr(),
            tag: tag | u32::from(iid),
        });
        Interned::New(iid)
    }

    /// Puts the new entry `e` of a hashed table (more than [`SCAN_MAX`]
    /// entries) in the first free slot where [`Self::find`] looks for it:
    /// its first home, its second, then the slots after the second; the
    /// table has a free slot.
    fn place(&mut self, e: Entry) {
        let generation = u32::from(self.generation);
        let [first, second] = Self::homes_of(e.ptr, e.tag & KEY_MASK);
        let mut i = first;
        for step in 0..N + 1 {
            let Some(slot) = self.entries.get_mut(i) else {
                return;
            };
            if slot.generation() != generation {
                *slot = e;
                return;
            }
            i = if step == 0 { second } else { (i + 1) & (N - 1) };
        }
    }

    /// The generation of live entries (1..=127): it changes with every
    /// [`InternTable::clear`], and comes back to 1 only after every entry
    /// was retired.
    #[inline(always)]
    pub fn generation(&self) -> u16 {
        self.generation
    }

    /// Forgets every string (the sequence's incremental state was cleared).
    pub fn clear(&mut self) {
        self.last_iid = [0; 3];
        self.generation += 1;
        if self.generation > GENERATIONS {
            self.retire_all();
        }
    }

    /// Makes every entry dead before generation numbers repeat.
    #[cold]
    fn retire_all(&mut self) {
        for e in self.entries.iter_mut() {
            e.tag = 0;
        }
        self.generation = 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_count_per_kind_and_restart_after_clear() {
        let mut t = InternTable::<8>::new();
        assert_eq!(t.intern("a", Kind::EventName), Interned::New(1));
        assert_eq!(t.intern("b", Kind::EventName), Interned::New(2));
        assert_eq!(t.intern("a", Kind::Category), Interned::New(1));
        assert_eq!(t.intern("a", Kind::EventName), Interned::Known(1));
        assert_eq!(t.lookup("b", Kind::EventName), Some(2));
        assert_eq!(t.lookup("b", Kind::Category), None);
        t.clear();
        assert_eq!(t.lookup("a", Kind::EventName), None);
        assert_eq!(t.intern("b", Kind::EventName), Interned::New(1));
    }

    #[test]
    fn a_full_table_interns_nothing_more() {
        static NAMES: [&str; 5] = ["n0", "n1", "n2", "n3", "n4"];
        let mut t = InternTable::<4>::new();
        for (i, n) in NAMES[..4].iter().enumerate() {
            assert_eq!(t.intern(n, Kind::EventName), Interned::New(i as u16 + 1));
        }
        assert_eq!(t.intern(NAMES[4], Kind::EventName), Interned::Full);
        for (i, n) in NAMES[..4].iter().enumerate() {
            assert_eq!(t.lookup(n, Kind::EventName), Some(i as u16 + 1));
        }
        // A clear frees every slot at once (this table is scanned: the new
        // strings take the old generation's slots in order).
        t.clear();
        for (i, n) in NAMES[1..].iter().enumerate() {
            assert_eq!(t.intern(n, Kind::EventName), Interned::New(i as u16 + 1));
        }
        assert_eq!(t.intern(NAMES[0], Kind::EventName), Interned::Full);
        assert_eq!(t.lookup(NAMES[4], Kind::EventName), Some(4));
    }

    #[test]
    #[cfg_attr(miri, ignore = "65,538 clears of safe code: two minutes under miri")]
    fn generations_wrap_without_resurrecting_entries() {
        let mut t = InternTable::<2>::new();
        assert_eq!(t.intern("x", Kind::EventName), Interned::New(1));
        for _ in 0..u16::MAX as usize + 3 {
            t.clear();
            assert_eq!(t.lookup("x", Kind::EventName), None);
        }
        assert_eq!(t.intern("y", Kind::EventName), Interned::New(1));
    }

    #[test]
    fn a_string_has_two_distinct_homes() {
        fn check<const N: usize>() {
            // 256 addresses under miri (safe code: it only slows it).
            let addresses = if cfg!(miri) { 256 } else { 4096 };
            for ptr in (0..addresses).map(|i| 0x2000_0000 + i * 3) {
                for bits in [0, Key::new("x", Kind::Category).bits(), NEVER] {
                    let [a, b] = InternTable::<N>::homes_of(ptr, bits);
                    assert!(a < N && b < N && a != b, "{N}: {ptr:#x} {bits:#x}: {a} {b}");
                }
            }
        }
        // Tables of at most SCAN_MAX entries have no homes.
        check::<8>();
        check::<16>();
        check::<1024>();
        assert_eq!(InternTable::<1>::homes_of(0x2000_0000, 0), [0, 0]);
    }

    #[test]
    fn every_string_is_found_whatever_moved_it() {
        // 64 one-byte strings at 64 addresses: their homes collide in
        // every pattern the small tables allow.
        static TEXT: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/";
        fn fill<const N: usize>(offset: usize) {
            let mut t = InternTable::<N>::new();
            let strings: std::vec::Vec<&'static str> =
                (0..N).map(|i| &TEXT[(offset + i) % 64..][..1]).collect();
            for (i, s) in strings.iter().enumerate() {
                assert_eq!(t.intern(s, Kind::EventName), Interned::New(i as u16 + 1));
                for (j, earlier) in strings[..=i].iter().enumerate() {
                    assert_eq!(t.lookup(earlier, Kind::EventName), Some(j as u16 + 1));
                    assert_eq!(t.lookup(earlier, Kind::Category), None);
                }
            }
            assert_eq!(
                t.intern(&TEXT[(offset + N) % 64..][..1], Kind::EventName),
                Interned::Full
            );
            t.clear();
            assert!(strings
                .iter()
                .all(|s| t.lookup(s, Kind::EventName).is_none()));
        }
        // Every fourth offset under miri (safe code: it only slows it).
        let step = if cfg!(miri) { 4 } else { 1 };
        for offset in (0..64).step_by(step) {
            fill::<1>(offset);
            fill::<2>(offset);
            fill::<4>(offset);
            fill::<8>(offset);
            fill::<16>(offset);
        }
    }

    #[test]
    fn distinct_strings_with_equal_text_get_distinct_ids() {
        // A static of its own: the same text at another address (and no
        // leaked allocation for miri to report).
        static OTHER: [u8; 4] = *b"same";
        let a: &'static str = "same";
        let b: &'static str = core::str::from_utf8(&OTHER).unwrap();
        assert_ne!(a.as_ptr(), b.as_ptr());
        let mut t = InternTable::<8>::new();
        assert_eq!(t.intern(a, Kind::EventName), Interned::New(1));
        assert_eq!(t.intern(b, Kind::EventName), Interned::New(2));
    }
}
