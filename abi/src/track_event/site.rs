//! Call sites: an event's category and name, resolved to their interned ids
//! once per sequence generation instead of at every call.
//!
//! An [`EventSite`] is a `static` naming a slice begin or instant
//! ([`TrackEventWriter::slice_begin_at`], [`TrackEventWriter::instant_at`],
//! or the [`slice_begin!`](crate::slice_begin) and
//! [`instant!`](crate::instant) macros, which declare the `static`). Each
//! writer remembers the ids of the sites it wrote in a [`SiteCache`] of `S`
//! entries, so an event at a known site skips both interning lookups: one
//! load of the site's number, one of the writer's entry, one compare.
//!
//! # Invariants
//!
//! * A site's number is [`EventSite::UNNUMBERED`] until the first
//!   writer that caches the site's ids gives it the next number of a
//!   program-wide counter, from 0 (one atomic increment; one store on the
//!   site). Numbers are
//!   never reused, so two sites never share a cache entry: each is taken
//!   from the counter once, and the counter moves only for a site whose
//!   number reads `UNNUMBERED`, which is once per site unless contexts
//!   race for it;
//!   so it counts at most sites × contexts, never 2^32. A site's number
//!   changes only in such a race (each context stores the number it
//!   took, the last store stays); the entries a writer cached under the
//!   number that lost are never read again (no other site has it), and
//!   the site's next event there caches its ids anew. A number is only an
//!   identity: `Relaxed` suffices (nothing is published through it).
//!   Sites numbered `S` or more are not cached by a writer of `S` entries
//!   (each of their events takes the slow path); a site's number is its
//!   entry's index.
//! * The cache is the writer's own (`&mut`): a site cached for one
//!   sequence is never read for another, whatever the writers sharing it.
//! * An entry is `generation << 16 | name << 8 | category`: the ids of
//!   the site's strings (both below 128, the fast path's range) in the
//!   writer's interning table, and that table's generation when they were
//!   read. It is live only while the table's generation is the same: a
//!   clear (a reset after a loss or a clear request) bumps the generation,
//!   which retires every entry at once. 0 is never live (generations start
//!   at 1). When the table's 7-bit generation wraps, the writer empties the
//!   cache too, so an entry never comes back to life.
//!
//! [`TrackEventWriter::slice_begin_at`]: super::TrackEventWriter::slice_begin_at
//! [`TrackEventWriter::instant_at`]: super::TrackEventWriter::instant_at

use crate::sync::atomic::AtomicU32;
use crate::sync::shared::AtomicU32 as CounterWord;
use crate::sync::Ordering::Relaxed;

/// The number of a site not numbered yet.
const UNNUMBERED: u32 = EventSite::UNNUMBERED;

/// The number the next site gets; never repeats (see the module docs).
static SITES: CounterWord = CounterWord::new(0);

/// An event's category and name at one call site, for the writer's
/// per-site cache of their interned ids (see the [module docs](self)).
/// Meant for a `static`; the [`slice_begin!`](crate::slice_begin) and
/// [`instant!`](crate::instant) macros declare one.
///
/// ```
/// use shmtrace_abi::track_event::EventSite;
/// static READ: EventSite = EventSite::new("io", "read sensor");
/// assert_eq!((READ.category(), READ.name()), ("io", "read sensor"));
/// ```
#[derive(Debug)]
pub struct EventSite {
    category: &'static str,
    name: &'static str,
    /// [`EventSite::UNNUMBERED`] until numbered, then the site's number
    /// (see the module docs).
    number: AtomicU32,
}

impl EventSite {
    /// The number of a site not numbered yet ([`EventSite::number`]).
    pub const UNNUMBERED: u32 = u32::MAX;

    /// The site of events named `name` in `category`.
    #[cfg(not(loom))]
    pub const fn new(category: &'static str, name: &'static str) -> Self {
        Self {
            category,
            name,
            number: AtomicU32::new(UNNUMBERED),
        }
    }

    /// The site of events named `name` in `category` (loom's atomics have
    /// no `const` constructors).
    #[cfg(loom)]
    pub fn new(category: &'static str, name: &'static str) -> Self {
        Self {
            category,
            name,
            number: AtomicU32::new(UNNUMBERED),
        }
    }

    /// The category.
    pub fn category(&self) -> &'static str {
        self.category
    }

    /// The event name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The site's number (from 0, in the order sites were first cached);
    /// [`EventSite::UNNUMBERED`] if it has none yet.
    #[inline(always)]
    pub fn number(&self) -> u32 {
        self.number.load(Relaxed)
    }

    /// The site's number, giving it the next one first if it has none.
    pub fn numbered(&self) -> u32 {
        let n = self.number();
        if n != UNNUMBERED {
            return n;
        }
        let mine = SITES.fetch_add(1, Relaxed);
        self.number.store(mine, Relaxed);
        mine
    }
}

/// The ids a writer resolved per site: `S` entries, for the sites numbered
/// 0..`S` (see the [module docs](self)). 4 × `S` bytes.
#[derive(Debug, Clone)]
pub struct SiteCache<const S: usize> {
    entries: [u32; S],
}

impl<const S: usize> Default for SiteCache<S> {
    fn default() -> Self {
        Self::new()
    }
}

/// The entry bits above the ids.
const GENERATION_SHIFT: u32 = 16;

impl<const S: usize> SiteCache<S> {
    /// An empty cache.
    pub const fn new() -> Self {
        Self { entries: [0; S] }
    }

    /// The ids cached for the site numbered `number` in interning
    /// generation `generation`, if any: `name << 8 | category`.
    #[inline(always)]
    pub fn get(&self, number: u32, generation: u16) -> Option<u32> {
        // `UNNUMBERED` is past every entry.
        let e = self.entries.get(number as usize)?;
        let ids = e ^ u32::from(generation) << GENERATION_SHIFT;
        (ids < 1 << GENERATION_SHIFT).then_some(ids)
    }

    /// Caches the ids `category` and `name` (both in 1..=127; others, and
    /// 0 for a string written inline, are not cached) of the site numbered
    /// `number` in generation `generation` (1..=127, an interning table's:
    /// an entry put in another is never live for a table's).
    pub fn put(&mut self, number: u32, generation: u16, category: u32, name: u32) {
        // Each in 1..=127 (0 wraps around to u32::MAX).
        if category.wrapping_sub(1).max(name.wrapping_sub(1)) >= 0x7F {
            return;
        }
        if let Some(e) = self.entries.get_mut(number as usize) {
            *e = u32::from(generation) << GENERATION_SHIFT | name << 8 | category;
        }
    }

    /// Forgets every entry (the generations are about to repeat).
    pub fn clear(&mut self) {
        for e in self.entries.iter_mut() {
            *e = 0;
        }
    }
}

/// Begins a slice at a call site: declares the site's `static`
/// [`EventSite`] and calls
/// [`TrackEventWriter::slice_begin_at`](crate::track_event::TrackEventWriter::slice_begin_at)
/// on the writer; whether the begin was written.
///
/// ```ignore
/// shmtrace_abi::slice_begin!(writer, "io", "read sensor");
/// ```
#[macro_export]
macro_rules! slice_begin {
    ($writer:expr, $category:expr, $name:expr $(,)?) => {{
        static SITE: $crate::track_event::EventSite =
            $crate::track_event::EventSite::new($category, $name);
        $writer.slice_begin_at(&SITE)
    }};
}

/// An instant event at a call site: declares the site's `static`
/// [`EventSite`] and calls
/// [`TrackEventWriter::instant_at`](crate::track_event::TrackEventWriter::instant_at)
/// on the writer; whether it was written.
#[macro_export]
macro_rules! instant {
    ($writer:expr, $category:expr, $name:expr $(,)?) => {{
        static SITE: $crate::track_event::EventSite =
            $crate::track_event::EventSite::new($category, $name);
        $writer.instant_at(&SITE)
    }};
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn sites_get_distinct_numbers_once() {
        static A: EventSite = EventSite::new("c", "a");
        static B: EventSite = EventSite::new("c", "b");
        assert_eq!(A.number(), UNNUMBERED);
        let a = A.numbered();
        let b = B.numbered();
        assert!(a != UNNUMBERED && b != UNNUMBERED && a != b, "{a} {b}");
        assert_eq!((A.numbered(), B.numbered()), (a, b));
    }

    #[test]
    fn an_entry_lives_for_its_generation_only() {
        let mut c = SiteCache::<2>::new();
        assert_eq!(c.get(1, 1), None);
        c.put(1, 1, 3, 0x7F);
        assert_eq!(c.get(1, 1), Some(0x7F << 8 | 3));
        assert_eq!(c.get(1, 2), None);
        assert_eq!(c.get(0, 1), None);
        // Unnumbered and out-of-range sites are never cached.
        c.put(UNNUMBERED, 1, 1, 1);
        c.put(2, 1, 1, 1);
        assert_eq!((c.get(UNNUMBERED, 1), c.get(2, 1)), (None, None));
        // Ids the fast path cannot write are not cached, nor 0 (a string
        // written inline).
        c.put(0, 1, 0x80, 1);
        assert_eq!(c.get(0, 1), None);
        c.put(0, 1, 1, 0);
        assert_eq!(c.get(0, 1), None);
        c.clear();
        assert_eq!(c.get(1, 1), None);
    }

    #[test]
    fn every_pair_of_ids_below_128_is_cached() {
        let mut c = SiteCache::<1>::new();
        // The edges and a few between under miri (safe code: it only
        // slows it).
        let ids: std::vec::Vec<u32> = if cfg!(miri) {
            std::vec![0, 1, 2, 0x3f, 0x40, 0x7e, 0x7f, 0x80]
        } else {
            (0..=0x80).collect()
        };
        for &category in &ids {
            for &name in &ids {
                c.clear();
                c.put(0, 1, category, name);
                let cacheable = (1..0x80).contains(&category) && (1..0x80).contains(&name);
                let want = cacheable.then_some(name << 8 | category);
                assert_eq!(c.get(0, 1), want, "category {category}, name {name}");
            }
        }
    }
}
