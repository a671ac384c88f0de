//! Per-sequence interning: small open-addressing tables that map static
//! strings (by address) to interned ids, and track uuids to "descriptor
//! already emitted on this sequence".
//!
//! # Invariants
//!
//! * Interned ids start at 1 in every table and after every [`clear`]
//!   (`iid` 0 means "unset" in Perfetto's protos).
//! * Keys are the address and length of a `&'static str`: the bytes behind
//!   them never change, so equal keys always mean equal strings. Equal
//!   strings at different addresses get different ids, which is legal.
//! * Tables grow by doubling while below [`MAX_ENTRIES`]; after warm-up a
//!   lookup neither allocates nor hashes more than a multiply and a shift.
//!   A full table reports [`Lookup::Full`] and the caller writes the string
//!   inline instead.
//!
//! [`clear`]: StrInterner::clear

/// Most entries one table holds before it stops interning new keys.
pub const MAX_ENTRIES: usize = 1 << 16;

const INITIAL_SLOTS: usize = 64;

/// Result of interning one string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Already emitted on this sequence under this id.
    Known(u64),
    /// New: the caller must emit `(iid, string)` in this packet's
    /// `interned_data`.
    New(u64),
    /// The table is full: write the string inline.
    Full,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    key_ptr: usize,
    key_len: usize,
    /// 0 = empty slot.
    value: u64,
}

#[inline]
fn hash(a: usize, b: usize) -> u64 {
    ((a as u64) ^ (b as u64).rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Open-addressing map from a two-word key to a non-zero value.
struct Table {
    slots: Vec<Slot>,
    len: usize,
}

impl Table {
    fn new() -> Self {
        Table {
            slots: Vec::new(),
            len: 0,
        }
    }

    #[inline]
    fn index(&self, a: usize, b: usize) -> usize {
        let bits = self.slots.len().trailing_zeros();
        (hash(a, b) >> (64 - bits)) as usize
    }

    /// The value for the key, or the slot where it would go.
    #[inline]
    fn find(&self, a: usize, b: usize) -> Result<u64, usize> {
        let mask = self.slots.len() - 1;
        let mut i = self.index(a, b);
        loop {
            let s = self.slots[i];
            if s.value == 0 {
                return Err(i);
            }
            if s.key_ptr == a && s.key_len == b {
                return Ok(s.value);
            }
            i = (i + 1) & mask;
        }
    }

    /// Looks the key up; inserts `make()` if absent and there is room.
    /// Returns `(value, inserted)`, or `None` when full.
    #[inline]
    fn get_or_insert(
        &mut self,
        a: usize,
        b: usize,
        make: impl FnOnce() -> u64,
    ) -> Option<(u64, bool)> {
        if self.slots.is_empty() {
            self.slots = vec![Slot::default(); INITIAL_SLOTS];
        }
        match self.find(a, b) {
            Ok(v) => Some((v, false)),
            Err(mut i) => {
                if self.len >= MAX_ENTRIES {
                    return None;
                }
                if (self.len + 1) * 2 > self.slots.len() {
                    self.grow();
                    i = self.find(a, b).err()?;
                }
                let value = make();
                self.slots[i] = Slot {
                    key_ptr: a,
                    key_len: b,
                    value,
                };
                self.len += 1;
                Some((value, true))
            }
        }
    }

    #[cold]
    fn grow(&mut self) {
        let doubled = vec![Slot::default(); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        for s in old.into_iter().filter(|s| s.value != 0) {
            if let Err(i) = self.find(s.key_ptr, s.key_len) {
                self.slots[i] = s;
            }
        }
    }

    fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = Slot::default());
        self.len = 0;
    }
}

/// Slots of a [`StrInterner`]'s direct-mapped front cache.
const CACHE_SLOTS: usize = 64;

/// A front-cache entry: a string's address and length, and its id (an
/// empty entry has address 0, which no string has).
#[derive(Clone, Copy, Default)]
struct CacheEntry {
    ptr: usize,
    len: usize,
    iid: u64,
}

/// Interning table for one kind of string (event names, categories, debug
/// annotation names) on one sequence. A cache of recent strings in front
/// of the table answers the common case (a trace point seen before) with
/// one multiply and two compares. It is two-way: a string lives in its
/// slot or in the slot's neighbour (`slot ^ 1`), where the string it
/// displaced from its slot moves, so two strings sharing a slot (an
/// event's annotation names, say) do not evict each other on every use.
pub struct StrInterner {
    table: Table,
    next_iid: u64,
    cache: [CacheEntry; CACHE_SLOTS],
}

/// The front-cache slot of `s`.
#[inline(always)]
pub(crate) fn cache_slot(s: &str) -> usize {
    ((s.as_ptr() as usize as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize
        & (CACHE_SLOTS - 1)
}

impl Default for StrInterner {
    fn default() -> Self {
        Self::new()
    }
}

impl StrInterner {
    /// An empty table; the first id handed out is 1.
    pub fn new() -> Self {
        StrInterner {
            table: Table::new(),
            next_iid: 1,
            cache: [CacheEntry::default(); CACHE_SLOTS],
        }
    }

    /// The id of `s` if the front cache knows it (then it is interned).
    #[inline(always)]
    pub fn cached(&self, s: &'static str) -> Option<u64> {
        let slot = cache_slot(s);
        let is = |e: CacheEntry| e.ptr == s.as_ptr() as usize && e.len == s.len();
        let e = self.cache[slot];
        if is(e) {
            return Some(e.iid);
        }
        let e = self.cache[slot ^ 1];
        is(e).then_some(e.iid)
    }

    /// Puts `s` in its front-cache slot, moving the string there to the
    /// neighbouring slot.
    fn cache(&mut self, s: &'static str, iid: u64) {
        let slot = cache_slot(s);
        let displaced = self.cache[slot];
        if displaced.ptr != 0 {
            self.cache[slot ^ 1] = displaced;
        }
        self.cache[slot] = CacheEntry {
            ptr: s.as_ptr() as usize,
            len: s.len(),
            iid,
        };
    }

    /// The id of `s` on this sequence.
    #[inline]
    pub fn intern(&mut self, s: &'static str) -> Lookup {
        if let Some(iid) = self.cached(s) {
            return Lookup::Known(iid);
        }
        let next = &mut self.next_iid;
        let found = self.table.get_or_insert(s.as_ptr() as usize, s.len(), || {
            let iid = *next;
            *next += 1;
            iid
        });
        match found {
            Some((iid, inserted)) => {
                self.cache(s, iid);
                if inserted {
                    Lookup::New(iid)
                } else {
                    Lookup::Known(iid)
                }
            }
            None => Lookup::Full,
        }
    }

    /// The id of `s` if it is already interned; never inserts. The
    /// front-cache hit is inlined.
    #[inline(always)]
    pub fn lookup(&self, s: &'static str) -> Option<u64> {
        match self.cached(s) {
            Some(iid) => Some(iid),
            None => self.lookup_table(s),
        }
    }

    /// [`StrInterner::lookup`] past the front cache.
    #[inline(never)]
    fn lookup_table(&self, s: &'static str) -> Option<u64> {
        if self.table.slots.is_empty() {
            return None;
        }
        self.table.find(s.as_ptr() as usize, s.len()).ok()
    }

    /// Forgets everything (incremental state cleared); ids restart at 1.
    pub fn clear(&mut self) {
        self.table.clear();
        self.next_iid = 1;
        self.cache = [CacheEntry::default(); CACHE_SLOTS];
    }

    /// Number of interned strings.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len
    }

    /// `true` if nothing is interned.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.table.len == 0
    }
}

/// Set of track uuids whose descriptor was emitted on this sequence, with
/// the most recently confirmed uuid cached in front (a counter or custom
/// track used repeatedly costs one compare).
pub struct TrackSet {
    table: Table,
    /// A uuid known to be in the set, if `recent_valid`.
    recent: u64,
    recent_valid: bool,
    /// `recent` as a varint, little-endian: bytes 0-7 and 8-9.
    recent_varint: (u64, u16),
}

impl Default for TrackSet {
    fn default() -> Self {
        Self::new()
    }
}

impl TrackSet {
    /// An empty set.
    pub fn new() -> Self {
        TrackSet {
            table: Table::new(),
            recent: 0,
            recent_valid: false,
            recent_varint: (0, 0),
        }
    }

    /// Adds `uuid`; `true` if it was not in the set (or the set is full, in
    /// which case the descriptor is simply emitted again).
    #[inline]
    pub fn insert(&mut self, uuid: u64) -> bool {
        if self.recent_valid && self.recent == uuid {
            return false;
        }
        // Split the uuid into two words so 32-bit targets keep all bits.
        let (a, b) = (uuid as usize, (uuid >> 32) as usize);
        let found = self.table.get_or_insert(a, b, || 1);
        // Cache only what the table holds (a full table adds nothing).
        self.recent = uuid;
        self.recent_valid = found.is_some();
        self.recent_varint = shmtrace_abi::proto::wire::varint_words(uuid);
        found.is_none_or(|(_, inserted)| inserted)
    }

    /// Whether `uuid` is the most recently added (or confirmed) member: a
    /// check that changes nothing.
    #[inline]
    pub fn is_recent(&self, uuid: u64) -> bool {
        self.recent_valid && self.recent == uuid
    }

    /// The most recent member's uuid as a varint (see
    /// [`TrackSet::is_recent`]): bytes 0-7 and 8-9, little-endian.
    #[inline]
    pub fn recent_varint(&self) -> (u64, u16) {
        self.recent_varint
    }

    /// Empties the set.
    pub fn clear(&mut self) {
        self.table.clear();
        self.recent_valid = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_start_at_one_and_are_stable() {
        let mut t = StrInterner::new();
        assert_eq!(t.intern("a"), Lookup::New(1));
        assert_eq!(t.intern("b"), Lookup::New(2));
        assert_eq!(t.intern("a"), Lookup::Known(1));
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.intern("b"), Lookup::New(1));
        assert_eq!(t.intern("a"), Lookup::New(2));
    }

    #[test]
    fn grows_and_keeps_every_key() {
        let names: Vec<&'static str> = (0..5000)
            .map(|i| &*Box::leak(format!("name{i}").into_boxed_str()))
            .collect();
        let mut t = StrInterner::new();
        for (i, n) in names.iter().enumerate() {
            assert_eq!(t.intern(n), Lookup::New(i as u64 + 1));
        }
        for (i, n) in names.iter().enumerate() {
            assert_eq!(t.intern(n), Lookup::Known(i as u64 + 1));
        }
        assert_eq!(t.len(), 5000);
    }

    #[test]
    fn full_table_refuses_new_keys() {
        let mut t = StrInterner::new();
        let big: &'static str = Box::leak("x".repeat(MAX_ENTRIES + 1).into_boxed_str());
        for i in 0..MAX_ENTRIES {
            assert!(matches!(t.intern(&big[i..i + 1]), Lookup::New(_)));
        }
        assert_eq!(t.intern(&big[MAX_ENTRIES..]), Lookup::Full);
        assert_eq!(t.intern(&big[0..1]), Lookup::Known(1));
    }

    #[test]
    fn cache_collisions_and_substrings_keep_ids_exact() {
        // Many strings share cache slots; substrings share addresses.
        let base: &'static str = Box::leak("abcdefghij".repeat(40).into_boxed_str());
        let keys: Vec<&'static str> = (0..200)
            .map(|i| &base[i % 100..i % 100 + 1 + i / 100])
            .collect();
        let mut t = StrInterner::new();
        let ids: Vec<u64> = keys
            .iter()
            .map(|k| match t.intern(k) {
                Lookup::New(i) => i,
                other => panic!("{other:?}"),
            })
            .collect();
        for _ in 0..3 {
            for (k, id) in keys.iter().zip(&ids) {
                assert_eq!(t.intern(k), Lookup::Known(*id));
                assert_eq!(t.lookup(k), Some(*id));
            }
        }
        t.clear();
        assert_eq!(t.cached(keys[0]), None);
        assert_eq!(t.intern(keys[5]), Lookup::New(1));
    }

    #[test]
    fn two_strings_sharing_a_cache_slot_both_stay_cached() {
        let mut by_slot: std::collections::HashMap<usize, &'static str> = Default::default();
        let (a, b) = loop {
            let s: &'static str = Box::leak(format!("s{}", by_slot.len()).into_boxed_str());
            if let Some(&other) = by_slot.get(&cache_slot(s)) {
                break (other, s);
            }
            by_slot.insert(cache_slot(s), s);
        };
        let mut t = StrInterner::new();
        let ia = t.intern(a);
        let ib = t.intern(b);
        assert_eq!((ia, ib), (Lookup::New(1), Lookup::New(2)));
        assert_eq!((t.cached(a), t.cached(b)), (Some(1), Some(2)));
        // A third one displaces the older of the two.
        let c = loop {
            let s: &'static str = Box::leak(format!("s{}", by_slot.len()).into_boxed_str());
            by_slot.insert(usize::MAX - by_slot.len(), s);
            if cache_slot(s) == cache_slot(a) {
                break s;
            }
        };
        assert_eq!(t.intern(c), Lookup::New(3));
        assert_eq!(
            (t.cached(a), t.cached(b), t.cached(c)),
            (None, Some(2), Some(3))
        );
        assert_eq!(t.lookup(a), Some(1));
    }

    #[test]
    fn track_set() {
        let mut s = TrackSet::new();
        assert!(s.insert(7));
        assert!(!s.insert(7));
        assert!(!s.insert(7));
        assert!(s.insert(8));
        assert!(!s.insert(7));
        assert!(!s.insert(8));
        s.clear();
        assert!(s.insert(8), "the front cache is cleared too");
        assert!(s.insert(7));
        assert!(s.insert(7 | (1 << 40)));
        s.clear();
        assert!(s.insert(7));
    }
}
