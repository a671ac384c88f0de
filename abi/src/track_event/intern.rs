//! Per-sequence interning of `'static` strings in a fixed-size table.
//!
//! # Invariants
//!
//! * A key is the address, length and kind of a `&'static str`: the bytes
//!   behind an address never change, so equal keys mean equal strings.
//!   Equal strings at different addresses get different ids, which is
//!   legal.
//! * Interned ids count from 1 per kind (event names, categories,
//!   annotation names each have their own id space, as in `InternedData`)
//!   and restart at 1 after every [`InternTable::clear`].
//! * An entry is live only if its generation is the table's: clearing is
//!   one increment, no loop over the table (and so no `memset` in a
//!   firmware image). When the 16-bit generation wraps, every entry is
//!   retired one by one first.
//! * The table never grows. When it is full (or a kind's ids run out) a
//!   string is not interned: the caller writes it inline.
//! * A lookup probes at most `N` slots and never fails otherwise; nothing
//!   here panics.

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
    /// `len << 2 | kind`.
    key: u32,
    iid: u16,
    generation: u16,
}

const EMPTY: Entry = Entry {
    ptr: 0,
    key: 0,
    iid: 0,
    generation: 0,
};

/// An interning table of `N` entries (a power of two) for all three kinds.
pub struct InternTable<const N: usize> {
    entries: [Entry; N],
    /// Generation of live entries; starts at 1, so zeroed entries are dead.
    generation: u16,
    /// Last id handed out, per kind.
    last_iid: [u16; 3],
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
            generation: 1,
            last_iid: [0; 3],
        }
    }

    /// The key of `s`: its address, and its length (a `&'static str` that
    /// is 2^30 bytes long or more is never interned: `None`) and kind.
    #[inline(always)]
    fn key(s: &str, kind: Kind) -> Option<(usize, u32)> {
        let len = s.len();
        if len >> 30 != 0 {
            return None;
        }
        Some((s.as_ptr() as usize, (len as u32) << 2 | kind as u32))
    }

    #[inline(always)]
    fn home(ptr: usize, key: u32) -> usize {
        if Self::BITS == 0 {
            return 0;
        }
        let h = (ptr as u32 ^ key).wrapping_mul(0x9E37_79B9);
        (h >> (32 - Self::BITS)) as usize
    }

    /// The id of `s` if it is interned on this sequence: one probe when it
    /// sits in its home slot, as nearly every string does.
    #[inline(always)]
    pub fn lookup(&self, s: &'static str, kind: Kind) -> Option<u16> {
        let (ptr, key) = Self::key(s, kind)?;
        let home = Self::home(ptr, key);
        let e = self.entries.get(home)?;
        if e.generation == self.generation && e.ptr == ptr && e.key == key {
            return Some(e.iid);
        }
        self.probe(ptr, key, home)
    }

    /// [`Self::lookup`] past the home slot.
    #[inline(never)]
    fn probe(&self, ptr: usize, key: u32, home: usize) -> Option<u16> {
        let mut i = home;
        for _ in 0..N {
            let e = self.entries.get(i)?;
            if e.generation != self.generation {
                return None;
            }
            if e.ptr == ptr && e.key == key {
                return Some(e.iid);
            }
            i = (i + 1) & (N - 1);
        }
        None
    }

    /// The id of `s`, interning it if it is new and there is room.
    pub fn intern(&mut self, s: &'static str, kind: Kind) -> Interned {
        let Some((ptr, key)) = Self::key(s, kind) else {
            return Interned::Full;
        };
        let generation = self.generation;
        let mut i = Self::home(ptr, key);
        for _ in 0..N {
            let Some(e) = self.entries.get_mut(i) else {
                return Interned::Full;
            };
            if e.generation != generation {
                let Some(slot) = self.last_iid.get_mut(kind as usize) else {
                    return Interned::Full;
                };
                let Some(iid) = slot.checked_add(1) else {
                    return Interned::Full;
                };
                *slot = iid;
                *e = Entry {
                    ptr,
                    key,
                    iid,
                    generation,
                };
                return Interned::New(iid);
            }
            if e.ptr == ptr && e.key == key {
                return Interned::Known(e.iid);
            }
            i = (i + 1) & (N - 1);
        }
        Interned::Full
    }

    /// Forgets every string (the sequence's incremental state was cleared).
    pub fn clear(&mut self) {
        self.last_iid = [0; 3];
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.retire_all();
        }
    }

    /// Makes every entry dead before generation numbers repeat.
    #[cold]
    fn retire_all(&mut self) {
        for e in self.entries.iter_mut() {
            e.generation = 0;
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
