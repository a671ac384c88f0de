//! Span callsites by number, so that a span's state can name its callsite
//! (metadata and category) in one atomic word.
//!
//! # Invariants
//!
//! * A slot is written once ([`OnceLock`]) with a callsite's metadata and
//!   its target's category; the metadata's address identifies the callsite
//!   (each callsite's metadata is a distinct `static`).
//! * Past [`PROBES`] occupied slots the callsite has no number, and
//!   [`number`] says so: its spans keep their metadata by value instead.

use std::sync::OnceLock;

use tracing_core::Metadata;

use crate::integrations::target_category;
use crate::Category;

/// Slots in the table (a power of two).
const SLOTS: usize = 1024;
/// Slots looked at before giving up.
const PROBES: usize = 8;

/// A span callsite the layer has seen.
pub(super) struct Callsite {
    pub(super) meta: &'static Metadata<'static>,
    /// Its target's category.
    pub(super) category: &'static Category,
}

static TABLE: [OnceLock<Callsite>; SLOTS] = [const { OnceLock::new() }; SLOTS];

/// The number of `meta`'s callsite (given on first use) and the callsite,
/// or `None` if the table has no room for it.
#[inline]
pub(super) fn number(meta: &'static Metadata<'static>) -> Option<(u32, &'static Callsite)> {
    let key = meta as *const Metadata<'static> as usize;
    // Fibonacci hashing of the address (statics are aligned, low bits 0).
    let start = (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros());
    for i in 0..PROBES {
        let n = (start as usize + i) % SLOTS;
        let slot = &TABLE[n];
        let cs = slot.get_or_init(|| Callsite {
            meta,
            category: target_category::category_static(meta.target()),
        });
        if std::ptr::eq(cs.meta, meta) {
            return Some((n as u32, cs));
        }
    }
    None
}

/// Callsite number `n`.
#[inline]
pub(super) fn get(n: u32) -> Option<&'static Callsite> {
    TABLE.get(n as usize)?.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callsite_keeps_its_number() {
        // (Spans of an enabled subscriber have metadata.)
        let (a, b) = tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            (
                tracing::info_span!(target: "callsites::a", "a"),
                tracing::info_span!(target: "callsites::b", "b"),
            )
        });
        let (ma, mb) = (a.metadata().unwrap(), b.metadata().unwrap());
        let (na, a_cs) = number(ma).unwrap();
        let (nb, _) = number(mb).unwrap();
        assert_ne!(na, nb);
        assert_eq!(number(ma).map(|(n, _)| n), Some(na));
        let cs = get(na).unwrap();
        assert!(std::ptr::eq(cs, a_cs));
        assert!(std::ptr::eq(cs.meta, ma));
        assert_eq!(cs.category.name(), "callsites::a");
        assert_eq!(get(nb).unwrap().category.name(), "callsites::b");
    }
}
