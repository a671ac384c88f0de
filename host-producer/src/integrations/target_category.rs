//! The category of a `tracing` or `log` target: a [`DynamicCategory`]
//! named after the target, found without a lock on the hot path.
//!
//! # Invariants
//!
//! * A slot is written once ([`OnceLock`]) with the target string's address
//!   and length and its category; a reader that finds a slot set reads all
//!   three (the `OnceLock` publishes them with release/acquire ordering).
//! * A hit is confirmed by comparing the category's name with the target,
//!   so a target string that reuses another's address (a `log` target built
//!   at run time) never gets the wrong category; except for a `'static`
//!   target ([`category_static`]: a `tracing` callsite's), whose address
//!   no other string can ever have.
//! * Past [`PROBES`] occupied slots, or with the table full, the lookup
//!   falls back to [`DynamicCategory::new`] (the category registry's lock
//!   and hash map): correct, only slower. Targets are a program's module
//!   paths, so the table rarely fills.

use std::sync::OnceLock;

use crate::{Category, DynamicCategory};

/// Slots in the table (a power of two).
const SLOTS: usize = 1024;
/// Slots looked at before falling back.
const PROBES: usize = 8;

type Slot = OnceLock<(usize, usize, &'static Category)>;

static TABLE: [Slot; SLOTS] = [const { OnceLock::new() }; SLOTS];

/// The category of `target`, created (and advertised) on first use.
#[cfg_attr(not(feature = "log"), allow(dead_code))]
#[inline]
pub(crate) fn category(target: &str) -> &'static Category {
    lookup::<true>(target)
}

/// [`category`] for a target that lives as long as the program (its
/// address identifies it).
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
#[inline]
pub(crate) fn category_static(target: &'static str) -> &'static Category {
    lookup::<false>(target)
}

/// Finds `target`'s category; `VERIFY`: compare the names of a hit.
#[inline(always)]
fn lookup<const VERIFY: bool>(target: &str) -> &'static Category {
    let key = (target.as_ptr() as usize, target.len());
    // Fibonacci hashing of the address: string literals are aligned
    // arbitrarily, so every bit counts.
    let start = (key.0 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros());
    for i in 0..PROBES {
        let slot = &TABLE[(start as usize + i) % SLOTS];
        match slot.get() {
            Some(&(ptr, len, cat)) if (ptr, len) == key && (!VERIFY || cat.name() == target) => {
                return cat
            }
            Some(_) => continue,
            None => return insert(slot, key, target),
        }
    }
    DynamicCategory::new(target).category()
}

#[cold]
#[inline(never)]
fn insert(slot: &Slot, key: (usize, usize), target: &str) -> &'static Category {
    let cat = DynamicCategory::new(target).category();
    // Another thread may have taken the slot meanwhile: then the category
    // is found by the next lookup's probing, or by the fallback.
    let _ = slot.set((key.0, key.1, cat));
    cat
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_maps_to_its_dynamic_category() {
        let a = category("target_category::a");
        assert_eq!(a.name(), "target_category::a");
        assert!(std::ptr::eq(a, category("target_category::a")));
        assert!(std::ptr::eq(
            a,
            DynamicCategory::new("target_category::a").category()
        ));
        // The same text at another address: the same category.
        let owned = String::from("target_category::a");
        assert!(std::ptr::eq(a, category(&owned)));
        assert!(std::ptr::eq(a, category_static("target_category::a")));
        // Another text at an address seen before: not the first category.
        let mut reused = String::from("target_category::b");
        let b = category(&reused);
        reused.replace_range(.., "target_category::c");
        let c = category(&reused);
        assert_eq!(b.name(), "target_category::b");
        assert_eq!(c.name(), "target_category::c");
    }
}
