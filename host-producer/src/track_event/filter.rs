//! Which categories a `TrackEventConfig` enables: the pure matching rules.
//!
//! The rules are the ones the track-event documentation states (seed 004,
//! "Category configuration"). A category is checked against the config's
//! four lists in this order, and the first step that matches decides:
//!
//! | step | list                 | match   | result   |
//! |------|----------------------|---------|----------|
//! | 1    | `enabled_categories` | exact   | enabled  |
//! | 2    | `enabled_tags`       | exact   | enabled  |
//! | 3    | `disabled_categories`| exact   | disabled |
//! | 4    | `disabled_tags`      | exact   | disabled |
//! | 5    | `enabled_categories` | pattern | enabled  |
//! | 6    | `enabled_tags`       | pattern | enabled  |
//! | 7    | `disabled_categories`| pattern | disabled |
//! | 8    | `disabled_tags`      | pattern | disabled |
//!
//! If no step matches, the category is enabled (the C++ API's default, which
//! this Rust API follows). When the config sets neither `disabled_tags` nor
//! `enabled_tags`, `disabled_tags` acts as `["slow", "debug"]` (as the C++
//! SDK does).
//!
//! # Patterns
//!
//! As upstream: an entry containing `*` is a *pattern* and matches every
//! name that starts with the text before its first `*` (so `"*"` matches
//! everything, `"gfx.*"` everything under `gfx.`; whatever follows the first
//! `*` is ignored, upstream supports only a trailing one). Any other entry,
//! `?` included, is compared exactly. A pattern never takes part in the
//! exact steps, and an exact entry never matches in the pattern steps.
//!
//! # Upstream, checked in the SDK source (perfetto-sdk-sys 1.4.0)
//!
//! * The C API (`IsSingleCategoryEnabled`) uses exactly this order, with
//!   two passes (exact, then pattern), but disables a category nothing
//!   matched and has no default disabled tags.
//! * The C++ API (`TrackEventInternal::IsCategoryEnabled`) enables a
//!   category nothing matched and disables `slow`/`debug` tags when both
//!   tag lists are empty, like this module; but within each pass it checks
//!   enabled categories, disabled categories, disabled tags, then enabled
//!   tags, and it matches a lone `"*"` only in a third pass after every
//!   other pattern. This module keeps the seed's order (the C API's), so a
//!   config relying on those C++-only differences (an enabled tag against
//!   a disabled category or tag of the same pass; `"*"` against a longer
//!   pattern) can decide differently here.

/// The category filter of one tracing session (`TrackEventConfig` fields
/// 1-4).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrackEventConfig {
    /// `disabled_categories` (field 1).
    pub disabled_categories: Vec<String>,
    /// `enabled_categories` (field 2).
    pub enabled_categories: Vec<String>,
    /// `disabled_tags` (field 3). Empty means `["slow", "debug"]` unless
    /// `enabled_tags` is set.
    pub disabled_tags: Vec<String>,
    /// `enabled_tags` (field 4).
    pub enabled_tags: Vec<String>,
}

/// Tags disabled when neither tag list is set.
pub const DEFAULT_DISABLED_TAGS: [&str; 2] = ["slow", "debug"];

/// Which step of the matching order decided (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// 1: exact match in `enabled_categories`.
    ExactEnabledCategory,
    /// 2: exact match in `enabled_tags`.
    ExactEnabledTag,
    /// 3: exact match in `disabled_categories`.
    ExactDisabledCategory,
    /// 4: exact match in `disabled_tags` (or the default slow/debug).
    ExactDisabledTag,
    /// 5: pattern match in `enabled_categories`.
    PatternEnabledCategory,
    /// 6: pattern match in `enabled_tags`.
    PatternEnabledTag,
    /// 7: pattern match in `disabled_categories`.
    PatternDisabledCategory,
    /// 8: pattern match in `disabled_tags`.
    PatternDisabledTag,
    /// Nothing matched: enabled by default.
    Default,
}

impl Step {
    /// Whether a category decided by this step is enabled.
    pub const fn enables(self) -> bool {
        matches!(
            self,
            Step::ExactEnabledCategory
                | Step::ExactEnabledTag
                | Step::PatternEnabledCategory
                | Step::PatternEnabledTag
                | Step::Default
        )
    }
}

/// `true` if `entry` is a pattern rather than an exact name.
fn is_pattern(entry: &str) -> bool {
    entry.contains('*')
}

/// Whether `name` matches `pattern` the way upstream's SDK matches: the
/// text before the first `*` must be a prefix of `name` (the rest of the
/// pattern is ignored). A pattern without `*` must equal `name`.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        Some((prefix, _)) => name.starts_with(prefix),
        None => pattern == name,
    }
}

#[derive(Clone, Copy)]
enum Phase {
    Exact,
    Pattern,
}

fn list_matches<S: AsRef<str>>(list: &[S], name: &str, phase: Phase) -> bool {
    list.iter().map(AsRef::as_ref).any(|entry| match phase {
        Phase::Exact => !is_pattern(entry) && entry == name,
        Phase::Pattern => is_pattern(entry) && pattern_matches(entry, name),
    })
}

impl TrackEventConfig {
    /// The step deciding a single (non-group) category `name` with `tags`.
    pub fn decide(&self, name: &str, tags: &[&str]) -> Step {
        let any_tag = |list: &[String], phase| tags.iter().any(|t| list_matches(list, t, phase));
        let disabled_tag = |phase| {
            if self.disabled_tags.is_empty() && self.enabled_tags.is_empty() {
                tags.iter()
                    .any(|t| list_matches(&DEFAULT_DISABLED_TAGS, t, phase))
            } else {
                any_tag(&self.disabled_tags, phase)
            }
        };
        let steps = [
            (
                Phase::Exact,
                Step::ExactEnabledCategory,
                Step::ExactEnabledTag,
            ),
            (
                Phase::Pattern,
                Step::PatternEnabledCategory,
                Step::PatternEnabledTag,
            ),
        ];
        for (phase, enabled_category, enabled_tag) in steps {
            if list_matches(&self.enabled_categories, name, phase) {
                return enabled_category;
            }
            if any_tag(&self.enabled_tags, phase) {
                return enabled_tag;
            }
            if list_matches(&self.disabled_categories, name, phase) {
                return match phase {
                    Phase::Exact => Step::ExactDisabledCategory,
                    Phase::Pattern => Step::PatternDisabledCategory,
                };
            }
            if disabled_tag(phase) {
                return match phase {
                    Phase::Exact => Step::ExactDisabledTag,
                    Phase::Pattern => Step::PatternDisabledTag,
                };
            }
        }
        Step::Default
    }

    /// Whether category `name` is enabled. `name` may be a comma-separated
    /// group; `tags_of` returns the tags of a (member) category name.
    pub fn is_enabled<'t>(&self, name: &str, tags_of: impl Fn(&str) -> &'t [&'t str]) -> bool {
        if name.contains(',') {
            group_members(name).any(|m| self.decide(m, tags_of(m)).enables())
        } else {
            self.decide(name, tags_of(name)).enables()
        }
    }
}

/// The category names of a comma-separated group, trimmed, empty ones
/// skipped (`"a, b,,c"` is `a`, `b`, `c`).
pub(crate) fn group_members(names: &str) -> impl Iterator<Item = &str> {
    names.split(',').map(str::trim).filter(|m| !m.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn cfg(ec: &[&str], dc: &[&str], et: &[&str], dt: &[&str]) -> TrackEventConfig {
        TrackEventConfig {
            enabled_categories: v(ec),
            disabled_categories: v(dc),
            enabled_tags: v(et),
            disabled_tags: v(dt),
        }
    }

    #[test]
    fn patterns_match_like_upstream() {
        assert!(pattern_matches("*", ""));
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("foo*", "foo"));
        assert!(pattern_matches("foo*", "foo.bar"));
        assert!(!pattern_matches("foo*", "fo"));
        // Only the text before the first `*` counts.
        assert!(pattern_matches("*.debug", "gfx.other"));
        assert!(pattern_matches("a*c", "aXXbYY"));
        // `?` is an ordinary character.
        assert!(!pattern_matches("f?o", "foo"));
        assert!(pattern_matches("f?o", "f?o"));
        assert!(!is_pattern("f?o"));
        assert!(pattern_matches("**", "x"));
    }

    /// One row: config, category (name, tags), expected deciding step.
    struct Row {
        config: TrackEventConfig,
        name: &'static str,
        tags: &'static [&'static str],
        step: Step,
    }

    fn table() -> Vec<Row> {
        use Step::*;
        let row = |config, name, tags, step| Row {
            config,
            name,
            tags,
            step,
        };
        vec![
            // Empty config: everything but slow/debug is on.
            row(cfg(&[], &[], &[], &[]), "rendering", &[], Default),
            row(
                cfg(&[], &[], &[], &[]),
                "gfx.slow",
                &["slow"],
                ExactDisabledTag,
            ),
            row(
                cfg(&[], &[], &[], &[]),
                "gfx.debug",
                &["debug", "x"],
                ExactDisabledTag,
            ),
            // 1 beats 2..8.
            row(
                cfg(&["foo"], &["foo"], &[], &["t"]),
                "foo",
                &["t"],
                ExactEnabledCategory,
            ),
            // 2 beats 3: an exact enabled tag wins over an exact disabled category.
            row(
                cfg(&[], &["foo"], &["t"], &[]),
                "foo",
                &["t"],
                ExactEnabledTag,
            ),
            // 3 beats 4 (both disable) and 5.
            row(
                cfg(&["f*"], &["foo"], &[], &[]),
                "foo",
                &[],
                ExactDisabledCategory,
            ),
            // 4 (default tags) beats 5: enabled_categories=["*"] keeps slow off.
            row(
                cfg(&["*"], &[], &[], &[]),
                "heavy",
                &["slow"],
                ExactDisabledTag,
            ),
            row(
                cfg(&["*"], &[], &[], &[]),
                "light",
                &[],
                PatternEnabledCategory,
            ),
            // Explicit disabled_tags replace the default.
            row(
                cfg(&["*"], &[], &[], &["other"]),
                "heavy",
                &["slow"],
                PatternEnabledCategory,
            ),
            // 5 beats 6..8.
            row(
                cfg(&["ren*"], &["*"], &[], &["*"]),
                "rendering",
                &["t"],
                PatternEnabledCategory,
            ),
            // 6 beats 7.
            row(
                cfg(&[], &["*"], &["t*"], &[]),
                "x",
                &["tag"],
                PatternEnabledTag,
            ),
            // 7 beats 8 (both disable) and the default.
            row(
                cfg(&[], &["x*"], &[], &[]),
                "xyz",
                &[],
                PatternDisabledCategory,
            ),
            // 8.
            row(
                cfg(&[], &[], &[], &["sl*"]),
                "xyz",
                &["slow"],
                PatternDisabledTag,
            ),
            // Seed table: "enable just specific categories".
            row(
                cfg(&["foo", "bar"], &["*"], &[], &[]),
                "bar",
                &[],
                ExactEnabledCategory,
            ),
            row(
                cfg(&["foo", "bar"], &["*"], &[], &[]),
                "baz2",
                &[],
                PatternDisabledCategory,
            ),
            // Seed table: "enable specific tags".
            row(
                cfg(&[], &[], &["foo", "bar"], &["*"]),
                "c1",
                &["foo"],
                ExactEnabledTag,
            ),
            row(
                cfg(&[], &[], &["foo", "bar"], &["*"]),
                "c2",
                &["zzz"],
                PatternDisabledTag,
            ),
            // A pattern never matches in the exact steps, an exact entry never
            // in the pattern steps.
            row(
                cfg(&["foo*"], &[], &[], &[]),
                "foo*",
                &[],
                PatternEnabledCategory,
            ),
            row(cfg(&[], &["foo"], &[], &[]), "foobar", &[], Default),
            // Default tags apply per tag, exact only.
            row(cfg(&[], &[], &[], &[]), "c", &["slowish"], Default),
            // Setting enabled_tags drops the default disabled tags (C++ SDK).
            row(cfg(&[], &[], &["other"], &[]), "s", &["slow"], Default),
            // `?` is no wildcard; an inner `*` ends the pattern.
            row(cfg(&["f?o"], &[], &[], &[]), "foo", &[], Default),
            row(
                cfg(&[], &["gfx*.debug"], &[], &[]),
                "gfx.main",
                &[],
                PatternDisabledCategory,
            ),
        ]
    }

    #[test]
    fn matching_order_table() {
        for (i, r) in table().into_iter().enumerate() {
            assert_eq!(
                r.config.decide(r.name, r.tags),
                r.step,
                "row {i}: {} {:?}",
                r.name,
                r.tags
            );
        }
    }

    #[test]
    fn groups_enable_if_any_member_does() {
        let c = cfg(&["b"], &["*"], &[], &[]);
        let no_tags = |_: &str| -> &'static [&'static str] { &[] };
        assert!(c.is_enabled("a,b", no_tags));
        assert!(!c.is_enabled("a,c", no_tags));
        // Member tags come from the lookup.
        let c = cfg(&[], &[], &[], &[]);
        let tags = |m: &str| -> &'static [&'static str] {
            if m == "s" {
                &["slow"]
            } else {
                &[]
            }
        };
        assert!(!c.is_enabled("s", tags));
        assert!(c.is_enabled("s,t", tags));
        assert!(!c.is_enabled("s, s", tags));
    }
}
