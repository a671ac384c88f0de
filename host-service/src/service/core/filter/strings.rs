//! The string filter: redaction rules for the string fields a filter
//! bytecode marks `FILTER_STRING` (`TraceFilter.string_filter_chain`).
//!
//! Semantics as upstream's `StringFilter`
//! (src/protozero/filtering/string_filter.cc): the rules run in order on
//! each such string; the first that matches decides. A `*_BREAK` rule that
//! matches leaves the string as it is and stops; a `*_REDACT_GROUPS` rule
//! that matches overwrites each non-empty capture group with `P60REDACTED`,
//! cut to the group's length or padded with `-`, and stops. `ATRACE_*`
//! rules only look at atrace strings (`B|pid|payload`, not starting with
//! `E`) whose payload starts with the rule's prefix.
//! `ATRACE_REPEATED_SEARCH_REDACT_GROUPS` redacts every match, searching on
//! after each. A rule applies to the semantic types it lists (none listed:
//! only unspecified, type 0). Rules of `string_filter_chain_v54` replace
//! the earlier rule of the same name, or come last.
//!
//! Patterns are ECMAScript regular expressions upstream (`std::regex`);
//! here they compile with the `regex` crate over bytes, ASCII classes, `.`
//! matching neither `\n` nor `\r`: the same language but for
//! look-around and back-references, which are refused when the session
//! starts (upstream aborts the service on a pattern it cannot compile).

use regex::bytes::{Regex, RegexBuilder};

use crate::protos::trace_config::trace_filter::{StringFilterPolicy, StringFilterRule};

/// What the redaction writes over a group (then `-`).
const REDACTED: &[u8] = b"P60REDACTED";
/// Semantic types a rule can name (upstream's `SemanticTypeMask::kLimit`).
const SEMANTIC_TYPES: usize = 128;
/// Largest compiled size of one pattern: a consumer's rules cannot take
/// more than this much of the service's memory each.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Most rules a filter may have. Each marked string runs through every
/// rule, on the service's one thread; upstream has no limit (a config of
/// 128 KiB could hold ~20,000 rules).
pub const MAX_RULES: usize = 1024;

/// Why a string filter chain is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    /// A rule without a known policy (upstream's wording).
    #[error("Trace filter has invalid string filtering rules")]
    Policy,
    /// A semantic type outside 0..128 (upstream's wording).
    #[error("Trace filter has invalid semantic types in string filtering rules")]
    SemanticType,
    /// More than [`MAX_RULES`] rules.
    #[error(
        "Trace filter has {0} string filtering rules; the shmtrace service takes at most \
         {MAX_RULES}"
    )]
    TooMany(usize),
    /// A pattern that does not compile.
    #[error("Trace filter string rule {rule:?} has a pattern that does not compile: {why}")]
    Pattern {
        /// The rule's name, or its pattern if it has none.
        rule: String,
        /// The compiler's message.
        why: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    MatchRedactGroups,
    AtraceMatchRedactGroups,
    MatchBreak,
    AtraceMatchBreak,
    AtraceRepeatedSearchRedactGroups,
}

#[derive(Debug, Clone)]
struct Rule {
    policy: Policy,
    /// The pattern anchored at both ends (full matches).
    full: Regex,
    /// The pattern as written (searches).
    search: Regex,
    atrace_prefix: Vec<u8>,
    name: String,
    /// Bit `t` set: the rule applies to semantic type `t`.
    types: u128,
}

/// The rules of a trace filter's string filter chains.
#[derive(Debug, Clone, Default)]
pub struct StringFilter {
    rules: Vec<Rule>,
}

impl StringFilter {
    /// Compiles `chain` then `chain_v54` (whose named rules replace those
    /// of the same name).
    pub fn new<'a>(
        chain: impl IntoIterator<Item = &'a StringFilterRule>,
        chain_v54: impl IntoIterator<Item = &'a StringFilterRule>,
    ) -> Result<Self, RulesError> {
        let mut filter = Self::default();
        for (i, r) in chain.into_iter().chain(chain_v54).enumerate() {
            if i >= MAX_RULES {
                return Err(RulesError::TooMany(i + 1));
            }
            let rule = compile(r)?;
            match filter
                .rules
                .iter_mut()
                .find(|old| !rule.name.is_empty() && old.name == rule.name)
            {
                Some(old) => *old = rule,
                None => filter.rules.push(rule),
            }
        }
        Ok(filter)
    }

    /// Runs the rules on `s` (a string of semantic type `semantic_type`),
    /// redacting in place.
    pub fn apply(&self, s: &mut [u8], semantic_type: u32) {
        if s.is_empty() {
            return;
        }
        let payload = atrace_payload(s);
        for rule in &self.rules {
            let applies = usize::try_from(semantic_type)
                .ok()
                .filter(|&t| t < SEMANTIC_TYPES)
                .is_none_or(|t| rule.types & (1 << t) != 0);
            if !applies {
                continue;
            }
            let atrace_match = || payload.is_some_and(|p| s[p..].starts_with(&rule.atrace_prefix));
            match rule.policy {
                Policy::MatchBreak => {
                    if rule.full.is_match(s) {
                        return;
                    }
                }
                Policy::AtraceMatchBreak => {
                    if atrace_match() && rule.full.is_match(s) {
                        return;
                    }
                }
                Policy::MatchRedactGroups | Policy::AtraceMatchRedactGroups => {
                    if rule.policy == Policy::AtraceMatchRedactGroups && !atrace_match() {
                        continue;
                    }
                    if let Some(groups) = groups(&rule.full, s, 0) {
                        redact(s, &groups);
                        return;
                    }
                }
                Policy::AtraceRepeatedSearchRedactGroups => {
                    if !atrace_match() {
                        continue;
                    }
                    // Each search starts where the last match ended (one
                    // byte on after an empty match), on the string as
                    // redacted so far.
                    let mut from = 0;
                    let mut any = false;
                    while from <= s.len() {
                        let Some(groups) = groups(&rule.search, s, from) else {
                            break;
                        };
                        let (start, end) = groups[0].unwrap_or((from, from));
                        redact(s, &groups);
                        any = true;
                        from = if start == end { end + 1 } else { end };
                    }
                    if any {
                        return;
                    }
                }
            }
        }
    }
}

/// The spans of `re`'s match in `s[from..]` and of its groups (offsets in
/// `s`; `None` for a group that did not take part).
fn groups(re: &Regex, s: &[u8], from: usize) -> Option<Vec<Option<(usize, usize)>>> {
    let caps = re.captures(s.get(from..)?)?;
    Some(
        caps.iter()
            .map(|m| m.map(|m| (from + m.start(), from + m.end())))
            .collect(),
    )
}

/// Overwrites groups 1.. (not the whole match) that matched something.
fn redact(s: &mut [u8], groups: &[Option<(usize, usize)>]) {
    for &(start, end) in groups.iter().skip(1).flatten() {
        for (i, b) in s[start..end].iter_mut().enumerate() {
            *b = REDACTED.get(i).copied().unwrap_or(b'-');
        }
    }
}

/// Where the payload of an atrace string starts: after the pipe that ends
/// the pid (`B|1024|payload`). `None` for strings starting with `E` (ends
/// carry no payload) and for strings too short to have one.
fn atrace_payload(s: &[u8]) -> Option<usize> {
    if s.len() <= 2 || s[0] == b'E' {
        return None;
    }
    s[2..].iter().position(|&b| b == b'|').map(|p| p + 3)
}

fn compile(r: &StringFilterRule) -> Result<Rule, RulesError> {
    let policy = match r.policy.and_then(|p| StringFilterPolicy::try_from(p).ok()) {
        Some(StringFilterPolicy::SfpMatchRedactGroups) => Policy::MatchRedactGroups,
        Some(StringFilterPolicy::SfpAtraceMatchRedactGroups) => Policy::AtraceMatchRedactGroups,
        Some(StringFilterPolicy::SfpMatchBreak) => Policy::MatchBreak,
        Some(StringFilterPolicy::SfpAtraceMatchBreak) => Policy::AtraceMatchBreak,
        Some(StringFilterPolicy::SfpAtraceRepeatedSearchRedactGroups) => {
            Policy::AtraceRepeatedSearchRedactGroups
        }
        Some(StringFilterPolicy::SfpUnspecified) | None => return Err(RulesError::Policy),
    };
    let mut types = 0u128;
    for &t in &r.semantic_type {
        let t = usize::try_from(t)
            .ok()
            .filter(|&t| t < SEMANTIC_TYPES)
            .ok_or(RulesError::SemanticType)?;
        types |= 1 << t;
    }
    if r.semantic_type.is_empty() {
        types = 1;
    }
    let pattern = r.regex_pattern.as_deref().unwrap_or("");
    let name = r.name.clone().unwrap_or_default();
    let build = |p: &str| {
        RegexBuilder::new(p)
            .unicode(false)
            .crlf(true)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| RulesError::Pattern {
                rule: if name.is_empty() {
                    pattern.to_owned()
                } else {
                    name.clone()
                },
                why: e.to_string(),
            })
    };
    // Compiled alone first, so that the anchored form cannot read a
    // pattern such as `a)|(b` as valid.
    let search = build(pattern)?;
    let full = build(&format!("^(?:{pattern})$"))?;
    Ok(Rule {
        policy,
        full,
        search,
        atrace_prefix: r
            .atrace_payload_starts_with
            .clone()
            .unwrap_or_default()
            .into_bytes(),
        name,
        types,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(policy: StringFilterPolicy, pattern: &str, prefix: &str) -> StringFilterRule {
        StringFilterRule {
            policy: Some(policy as i32),
            regex_pattern: Some(pattern.to_owned()),
            atrace_payload_starts_with: Some(prefix.to_owned()),
            ..Default::default()
        }
    }

    fn run(filter: &StringFilter, s: &str, semantic_type: u32) -> String {
        let mut b = s.as_bytes().to_vec();
        filter.apply(&mut b, semantic_type);
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn redact_groups_pads_and_cuts_the_marker() {
        let f = StringFilter::new(
            &[rule(
                StringFilterPolicy::SfpMatchRedactGroups,
                r"foo:(\w+) bar:(\d*)(x)?",
                "",
            )],
            &[],
        )
        .unwrap();
        assert_eq!(
            run(&f, "foo:abcdefghijklmno bar:123", 0),
            "foo:P60REDACTED---- bar:P60"
        );
        // Not a full match: untouched.
        assert_eq!(run(&f, "xfoo:a bar:1", 0), "xfoo:a bar:1");
        // Only semantic type 0 by default.
        assert_eq!(run(&f, "foo:abc bar:1", 3), "foo:abc bar:1");
    }

    #[test]
    fn the_first_matching_rule_decides_and_break_keeps_the_string() {
        let f = StringFilter::new(
            &[
                rule(StringFilterPolicy::SfpMatchBreak, r"keep.*", ""),
                rule(StringFilterPolicy::SfpMatchRedactGroups, r"(.*)", ""),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(run(&f, "keep me", 0), "keep me");
        assert_eq!(run(&f, "secret", 0), "P60RED");
    }

    #[test]
    fn atrace_rules_need_the_payload_prefix() {
        let f = StringFilter::new(
            &[rule(
                StringFilterPolicy::SfpAtraceMatchRedactGroups,
                r"B\|\d+\|query: (.*)",
                "query",
            )],
            &[],
        )
        .unwrap();
        assert_eq!(run(&f, "B|42|query: select", 0), "B|42|query: P60RED");
        assert_eq!(run(&f, "B|42|other: select", 0), "B|42|other: select");
        assert_eq!(run(&f, "E|42|query: select", 0), "E|42|query: select");
    }

    #[test]
    fn repeated_search_redacts_every_match() {
        let f = StringFilter::new(
            &[rule(
                StringFilterPolicy::SfpAtraceRepeatedSearchRedactGroups,
                r"id=(\d+)",
                "",
            )],
            &[],
        )
        .unwrap();
        assert_eq!(
            run(&f, "C|7|id=123 and id=4567", 0),
            "C|7|id=P60 and id=P60R"
        );
    }

    #[test]
    fn v54_rules_replace_by_name_and_types_select_rules() {
        let mut a = rule(StringFilterPolicy::SfpMatchRedactGroups, r"(a+)", "");
        a.name = Some("r".into());
        let mut b = rule(StringFilterPolicy::SfpMatchRedactGroups, r"(b+)", "");
        b.name = Some("r".into());
        b.semantic_type = vec![0, 5];
        let f = StringFilter::new(&[a], &[b]).unwrap();
        assert_eq!(run(&f, "aaa", 0), "aaa");
        assert_eq!(run(&f, "bbb", 5), "P60");
        assert_eq!(run(&f, "bbb", 6), "bbb");
    }

    #[test]
    fn bad_rules_are_refused() {
        let bad_policy = StringFilterRule::default();
        assert_eq!(
            StringFilter::new(&[bad_policy], &[]).unwrap_err(),
            RulesError::Policy
        );
        let mut bad_type = rule(StringFilterPolicy::SfpMatchBreak, "x", "");
        bad_type.semantic_type = vec![128];
        assert_eq!(
            StringFilter::new(&[bad_type], &[]).unwrap_err(),
            RulesError::SemanticType
        );
        let many = vec![rule(StringFilterPolicy::SfpMatchBreak, "x", ""); MAX_RULES + 1];
        assert_eq!(
            StringFilter::new(&many, &[]).unwrap_err(),
            RulesError::TooMany(MAX_RULES + 1)
        );
        assert!(StringFilter::new(&many[1..], &[]).is_ok());
        for p in ["a)|(b", "(?=x)", r"(a)\1", "(unclosed"] {
            let err = StringFilter::new(&[rule(StringFilterPolicy::SfpMatchBreak, p, "")], &[])
                .unwrap_err();
            assert!(matches!(err, RulesError::Pattern { .. }), "{p}: {err}");
        }
    }
}
