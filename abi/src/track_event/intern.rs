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
//! * An entry is live only if the generation in its key is the table's:
//!   clearing is one increment, no loop over the table (and so no `memset`
//!   in a firmware image). Generations are 7 bits (1..=127; 0 is never
//!   live); when they wrap, every entry is retired one by one first.
//! * An entry is 8 bytes on a 32-bit target (address, 16-bit key, 16-bit
//!   id). A string has two home slots (two-choice hashing: it goes into
//!   the first that is free); a lookup that finds it there, as nearly
//!   every one does, is a multiply and one or two entry compares. Strings
//!   that found both taken go into the first free slot after the second
//!   home, where a lookup probes for them out of line.
//! * The table never grows. When it is full (or a kind's ids run out) a
//!   string is not interned: the caller writes it inline.
//! * A lookup probes at most `N` slots and never fails otherwise; nothing
//!   here panics.

/// Longest string interned, in bytes.
pub const MAX_LEN: usize = 127;

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

#[derive(Clone, Copy)]
struct Entry {
    ptr: usize,
    /// `generation << 9 | len << 2 | kind`.
    key: u16,
    iid: u16,
}

const EMPTY: Entry = Entry {
    ptr: 0,
    key: 0,
    iid: 0,
};

/// An interning table of `N` entries (a power of two) for all three kinds.
pub struct InternTable<const N: usize> {
    entries: [Entry; N],
    /// Last id handed out, per kind.
    last_iid: [u16; 3],
    /// Generation of live entries (1..=127).
    generation: u16,
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

    /// The key of `s` on the current generation, and its two home slots;
    /// `None` if `s` is too long to intern.
    #[inline(always)]
    fn key(&self, s: &str, kind: Kind) -> Option<(usize, u16, [usize; 2])> {
        let len = s.len();
        if len > MAX_LEN {
            return None;
        }
        let ptr = s.as_ptr() as usize;
        let id = (len as u16) << 2 | kind as u16;
        // Fibonacci hashing of address, length and kind (not the
        // generation, so a string keeps its slots across clears): the top
        // bits give the first home slot, the next ones the second.
        let h = (ptr as u32 ^ u32::from(id)).wrapping_mul(0x9E37_79B9);
        let homes = if Self::BITS == 0 {
            [0, 0]
        } else {
            [
                (h >> (32 - Self::BITS)) as usize,
                (h >> (32 - Self::BITS).saturating_sub(Self::BITS)) as usize & (N - 1),
            ]
        };
        Some((ptr, self.generation << 9 | id, homes))
    }

    /// The id of `s` if it is interned on this sequence: one or two probes
    /// when it sits in one of its two home slots, as nearly every string
    /// does.
    #[inline(always)]
    pub fn lookup(&self, s: &'static str, kind: Kind) -> Option<u16> {
        u16::try_from(self.lookup_word(s, kind)).ok()
    }

    /// [`Self::lookup`] as a word: the id, or `u32::MAX` if `s` is not
    /// interned (a caller tests several ids with one compare).
    #[inline(always)]
    pub fn lookup_word(&self, s: &'static str, kind: Kind) -> u32 {
        let Some((ptr, key, [first, second])) = self.key(s, kind) else {
            return u32::MAX;
        };
        let hit = |home: usize| match self.entries.get(home) {
            Some(e) if e.ptr == ptr && e.key == key => Some(u32::from(e.iid)),
            _ => None,
        };
        if let Some(iid) = hit(first) {
            return iid;
        }
        if let Some(iid) = hit(second) {
            return iid;
        }
        self.probe(ptr, key, second).map_or(u32::MAX, u32::from)
    }

    /// [`Self::lookup`] past the home slots: the slots after the second,
    /// up to the first dead one.
    #[inline(never)]
    fn probe(&self, ptr: usize, key: u16, home: usize) -> Option<u16> {
        let mut i = home;
        for _ in 0..N {
            i = (i + 1) & (N - 1);
            let e = self.entries.get(i)?;
            if e.key >> 9 != self.generation {
                return None;
            }
            if e.ptr == ptr && e.key == key {
                return Some(e.iid);
            }
        }
        None
    }

    /// The id of `s`, interning it if it is new and there is room: in the
    /// first of its home slots that is free, else in the first free slot
    /// after the second.
    pub fn intern(&mut self, s: &'static str, kind: Kind) -> Interned {
        let Some((ptr, key, homes)) = self.key(s, kind) else {
            return Interned::Full;
        };
        let generation = self.generation;
        let mut i = homes[0];
        for step in 0..N + 1 {
            let Some(e) = self.entries.get_mut(i) else {
                return Interned::Full;
            };
            if e.key >> 9 != generation {
                let Some(slot) = self.last_iid.get_mut(kind as usize) else {
                    return Interned::Full;
                };
                let Some(iid) = slot.checked_add(1) else {
                    return Interned::Full;
                };
                *slot = iid;
                *e = Entry { ptr, key, iid };
                return Interned::New(iid);
            }
            if e.ptr == ptr && e.key == key {
                return Interned::Known(e.iid);
            }
            i = if step == 0 {
                homes[1]
            } else {
                (i + 1) & (N - 1)
            };
        }
        Interned::Full
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
            e.key = 0;
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
    }

    #[test]
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
    fn distinct_strings_with_equal_text_get_distinct_ids() {
        let a: &'static str = "same";
        let owned = std::string::String::from("same");
        let b: &'static str = std::boxed::Box::leak(owned.into_boxed_str());
        let mut t = InternTable::<8>::new();
        assert_eq!(t.intern(a, Kind::EventName), Interned::New(1));
        assert_eq!(t.intern(b, Kind::EventName), Interned::New(2));
    }
}
