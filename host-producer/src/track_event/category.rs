//! Track event categories: static ones declared with [`Category::new`],
//! dynamic ones created at run time with
//! [`DynamicCategory::new`](crate::DynamicCategory::new), and the registry
//! that advertises them and enables them per session.
//!
//! # Invariants
//!
//! * A category's `enabled` word holds one bit per data source instance
//!   slot (at most [`MAX_INSTANCES`]) whose config enables it. It is written
//!   only by the registry (under its lock) when a session starts or stops or
//!   a category is registered while sessions run; trace points only load it
//!   with `Relaxed` ordering. A stale read only means one event more or less
//!   at a session edge; the writer path re-checks the instance itself.
//! * Registered categories live for the rest of the program: static ones are
//!   `'static` by construction, dynamic ones are leaked once per distinct
//!   name (bounded by the names the program uses).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::track_event::filter::{group_members, TrackEventConfig};

/// Most concurrent sessions (data source instances) per data source, as in
/// Perfetto.
pub const MAX_INSTANCES: usize = 8;

/// A track event category.
///
/// Declare categories as statics and register them once with
/// [`register_categories`](crate::track_event::register_categories):
///
/// ```
/// use shmtrace_producer::Category;
/// static RENDERING: Category =
///     Category::new("rendering").with_description("Events from the graphics subsystem");
/// static GFX_DEBUG: Category = Category::new("rendering.debug").with_tags(&["debug"]);
/// assert!(!RENDERING.is_enabled()); // no session yet
/// ```
///
/// A name with commas (`"rendering,benchmark"`) is a group: it is enabled
/// when any member is, and events carry every member as a category.
pub struct Category {
    name: &'static str,
    group: bool,
    description: &'static str,
    tags: &'static [&'static str],
    enabled: AtomicU8,
}

impl Category {
    /// A category called `name`, without description or tags.
    pub const fn new(name: &'static str) -> Self {
        Category {
            name,
            group: contains_comma(name),
            description: "",
            tags: &[],
            enabled: AtomicU8::new(0),
        }
    }

    /// Sets the description advertised in the `TrackEventDescriptor`.
    pub const fn with_description(self, description: &'static str) -> Self {
        Category {
            description,
            ..self
        }
    }

    /// Sets the tags (`"slow"` and `"debug"` are disabled unless a session
    /// asks for them).
    pub const fn with_tags(self, tags: &'static [&'static str]) -> Self {
        Category { tags, ..self }
    }

    /// The name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The description (may be empty).
    pub fn description(&self) -> &'static str {
        self.description
    }

    /// The tags.
    pub fn tags(&self) -> &'static [&'static str] {
        self.tags
    }

    /// `true` if this is a comma-separated group of categories.
    pub fn is_group(&self) -> bool {
        self.group
    }

    /// The member names of a group (see [`group_members`]).
    pub(crate) fn members(&self) -> impl Iterator<Item = &'static str> {
        group_members(self.name)
    }

    /// Whether any running session enables this category: one relaxed load.
    #[inline(always)]
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed) != 0
    }

    /// Bit `i` is set if instance slot `i` enables this category.
    #[inline(always)]
    pub fn enabled_instances(&self) -> u8 {
        self.enabled.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    fn set_instance(&self, slot: usize, on: bool) {
        let bit = 1u8 << slot;
        if on {
            self.enabled.fetch_or(bit, Ordering::Relaxed);
        } else {
            self.enabled.fetch_and(!bit, Ordering::Relaxed);
        }
    }
}

const fn contains_comma(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b',' {
            return true;
        }
        i += 1;
    }
    false
}

impl fmt::Debug for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Category")
            .field("name", &self.name)
            .field("tags", &self.tags)
            .field("enabled_instances", &self.enabled_instances())
            .finish()
    }
}

/// Dynamic categories named with this prefix get the `slow` tag (disabled
/// unless a session asks for them), as in the C++ SDK's
/// `Category::FromDynamicCategory`; static ones set their tags themselves.
const LEGACY_SLOW_PREFIX: &str = "disabled-by-default-";

/// The filters of the running track event instances, by slot.
type ActiveFilters = [Option<TrackEventConfig>; MAX_INSTANCES];

/// All registered categories and the filters of running sessions.
pub(crate) struct Registry {
    inner: Mutex<RegistryInner>,
}

struct RegistryInner {
    statics: Vec<&'static Category>,
    dynamics: HashMap<&'static str, &'static Category>,
    active: ActiveFilters,
}

pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        inner: Mutex::new(RegistryInner {
            statics: Vec::new(),
            dynamics: HashMap::new(),
            active: Default::default(),
        }),
    })
}

impl RegistryInner {
    fn tags_of(&self, name: &str) -> &'static [&'static str] {
        self.statics
            .iter()
            .chain(self.dynamics.values())
            .find(|c| c.name == name)
            .map_or(&[], |c| c.tags)
    }

    /// Sets every bit of `cat` from the active filters, in one store (only
    /// the registry writes these words, under its lock): a trace point sees
    /// the old bits or the new ones, never a mix.
    fn apply(&self, cat: &Category) {
        let mut mask = 0u8;
        for (slot, filter) in self.active.iter().enumerate() {
            if filter
                .as_ref()
                .is_some_and(|f| f.is_enabled(cat.name, |m| self.tags_of(m)))
            {
                mask |= 1 << slot;
            }
        }
        cat.enabled.store(mask, Ordering::Relaxed);
    }

    fn all(&self) -> impl Iterator<Item = &'static Category> + '_ {
        self.statics
            .iter()
            .copied()
            .chain(self.dynamics.values().copied())
    }
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, RegistryInner> {
        // A panic while holding the lock cannot leave the data inconsistent
        // (every update is a single push/insert or bit flip).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers static categories (idempotent per category).
    pub(crate) fn register(&self, cats: &[&'static Category]) -> bool {
        let mut inner = self.lock();
        let mut changed = false;
        for &cat in cats {
            if !inner.statics.iter().any(|c| std::ptr::eq(*c, cat)) {
                inner.statics.push(cat);
                changed = true;
            }
        }
        if changed {
            // Member tags may have changed for groups: recompute everything.
            for c in inner.all().collect::<Vec<_>>() {
                inner.apply(c);
            }
            drop(inner);
            enabled_set_changed();
        }
        changed
    }

    /// The category `name`: a static one of that name, else the dynamic
    /// one (made on first use).
    pub(crate) fn dynamic(&self, name: &str) -> &'static Category {
        let mut inner = self.lock();
        if let Some(c) = inner.statics.iter().find(|c| c.name == name) {
            return c;
        }
        if let Some(c) = inner.dynamics.get(name) {
            return c;
        }
        let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
        let mut cat = Category::new(name);
        if !cat.group && name.starts_with(LEGACY_SLOW_PREFIX) {
            cat = cat.with_tags(&["slow"]);
        }
        let cat: &'static Category = Box::leak(Box::new(cat));
        inner.apply(cat);
        inner.dynamics.insert(name, cat);
        cat
    }

    /// Installs (or, with `None`, removes) the filter of instance `slot` and
    /// updates every category's bit for it.
    pub(crate) fn set_filter(&self, slot: usize, filter: Option<TrackEventConfig>) {
        let mut inner = self.lock();
        if let Some(f) = inner.active.get_mut(slot) {
            *f = filter;
        }
        for c in inner.all().collect::<Vec<_>>() {
            inner.apply(c);
        }
        drop(inner);
        enabled_set_changed();
    }

    /// Moves the instance in slot `from` to slot `to` with `filter`: each
    /// category's bits change in one store (see `apply`), so an event
    /// goes to one of the two instances, never both.
    pub(crate) fn move_filter(&self, from: usize, to: usize, filter: TrackEventConfig) {
        let mut inner = self.lock();
        if let Some(f) = inner.active.get_mut(from) {
            *f = None;
        }
        if let Some(f) = inner.active.get_mut(to) {
            *f = Some(filter);
        }
        for c in inner.all().collect::<Vec<_>>() {
            inner.apply(c);
        }
    }

    /// The categories that the instance in slot `slot` has enabled and
    /// `filter` does not enable (none: `filter` covers the instance).
    pub(crate) fn not_covered(&self, slot: usize, filter: &TrackEventConfig) -> Vec<&'static str> {
        let inner = self.lock();
        let missing = inner
            .all()
            .filter(|c| c.enabled_instances() & (1 << slot) != 0)
            .filter(|c| !filter.is_enabled(c.name, |m| inner.tags_of(m)))
            .map(|c| c.name)
            .collect();
        missing
    }

    /// The static categories (name, description, tags) to advertise.
    pub(crate) fn advertised(&self) -> Vec<&'static Category> {
        self.lock().statics.clone()
    }
}

/// Called when category enablement may have changed ([`on_enabled_set_changed`]).
static ON_ENABLED_SET_CHANGED: OnceLock<fn()> = OnceLock::new();

/// Has `f` called whenever category enablement may have changed (with no
/// lock held): what caches it (the `tracing` layer's callsite interest)
/// installs it, before any session can enable a category. One observer;
/// later calls are ignored.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) fn on_enabled_set_changed(f: fn()) {
    let _ = ON_ENABLED_SET_CHANGED.set(f);
}

fn enabled_set_changed() {
    if let Some(f) = ON_ENABLED_SET_CHANGED.get() {
        f();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DynamicCategory;

    #[test]
    fn builder_and_group() {
        static C: Category = Category::new("a,b")
            .with_description("d")
            .with_tags(&["slow"]);
        assert_eq!(C.name(), "a,b");
        assert_eq!(C.description(), "d");
        assert_eq!(C.tags(), &["slow"]);
        assert!(C.is_group());
        assert!(!C.is_enabled());
        C.set_instance(3, true);
        assert_eq!(C.enabled_instances(), 0b1000);
        C.set_instance(3, false);
        assert!(!C.is_enabled());
    }

    #[test]
    fn disabled_by_default_dynamic_categories_are_slow() {
        let slow = DynamicCategory::new("disabled-by-default-cat.test");
        assert_eq!(slow.category().tags(), &["slow"]);
        let plain = DynamicCategory::new("cat.test.plain");
        assert!(plain.category().tags().is_empty());
        let group = DynamicCategory::new("disabled-by-default-cat.g1,cat.g2");
        assert!(group.category().tags().is_empty(), "groups carry no tags");

        let tags_of = |c: DynamicCategory| move |_: &str| c.category().tags();
        let default = TrackEventConfig::default();
        assert!(!default.is_enabled(slow.name(), tags_of(slow)));
        assert!(default.is_enabled(plain.name(), tags_of(plain)));
        let asked = TrackEventConfig {
            enabled_tags: vec!["slow".into()],
            ..Default::default()
        };
        assert!(asked.is_enabled(slow.name(), tags_of(slow)));
    }
}
