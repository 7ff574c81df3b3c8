//! Custom rules, compiled at config load: the rules of a policy are grouped by target (`path`,
//! `header:user-agent`, `arg:id`, ...) and each group becomes one `RegexSet`, so a request pays
//! one automaton scan per inspected value however many rules there are. The individual regexes
//! are kept only to locate a match for the log excerpt, after the set said there is one.

use std::collections::HashMap;

use gateway_config::model::WafAction;
use gateway_config::{WafRule, WafTarget};
use http::HeaderName;
use regex::bytes::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};

use crate::telemetry::Counter;

/// Compiled size limits: generous, since sets of many `(?i)` alternations grow fast, and this
/// is paid once per config load.
const SIZE_LIMIT: usize = 64 << 20;

/// One custom rule.
#[derive(Debug)]
pub struct Rule {
    /// Id from the config.
    pub id: u32,
    /// `block` or `log`.
    pub action: WafAction,
    /// Counter of its matches (`gateway_waf_matches_total{rule=id}`).
    pub matches: Counter,
    regex: Regex,
}

/// The rules of one target.
#[derive(Debug)]
pub struct RuleSet {
    set: RegexSet,
    rules: Vec<Rule>,
}

impl RuleSet {
    /// Calls `each` with every rule matching `v` (config order) and the match offset; stops
    /// when `each` returns `Break`.
    pub fn for_each_match(
        &self,
        v: &[u8],
        mut each: impl FnMut(&Rule, usize) -> std::ops::ControlFlow<()>,
    ) -> std::ops::ControlFlow<()> {
        if !self.set.is_match(v) {
            return std::ops::ControlFlow::Continue(());
        }
        for i in self.set.matches(v).iter() {
            let rule = &self.rules[i];
            let at = rule.regex.find(v).map_or(0, |m| m.start());
            each(rule, at)?;
        }
        std::ops::ControlFlow::Continue(())
    }

    /// The rules, in config order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }
}

/// Rule sets by exact argument or cookie name. A request looks up every argument and cookie
/// name it has, and policies name a handful: a mask of the names' lengths rejects most lookups
/// with one test, the rest compare a few names (a hash map past [`ByName::LINEAR`]).
#[derive(Debug, Default)]
pub struct ByName {
    sets: Vec<(Box<[u8]>, RuleSet)>,
    /// Bit `min(len, 63)` for each name's length.
    lens: u64,
    index: Option<HashMap<Box<[u8]>, usize>>,
}

impl ByName {
    /// Up to this many names are compared one by one.
    pub const LINEAR: usize = 8;

    fn len_bit(len: usize) -> u64 {
        1 << len.min(63)
    }

    fn insert(&mut self, name: &[u8], set: RuleSet) {
        self.lens |= Self::len_bit(name.len());
        match self.sets.iter().position(|(n, _)| **n == *name) {
            Some(i) => self.sets[i].1 = set,
            None => self.sets.push((name.into(), set)),
        }
        self.index = (self.sets.len() > Self::LINEAR).then(|| {
            self.sets
                .iter()
                .enumerate()
                .map(|(i, (n, _))| (n.clone(), i))
                .collect()
        });
    }

    /// The rules of `name`.
    pub fn get(&self, name: &[u8]) -> Option<&RuleSet> {
        if self.lens & Self::len_bit(name.len()) == 0 {
            return None;
        }
        match &self.index {
            Some(index) => index.get(name).map(|&i| &self.sets[i].1),
            None => self
                .sets
                .iter()
                .find(|(n, _)| **n == *name)
                .map(|(_, set)| set),
        }
    }

    /// Whether `name` has rules.
    pub fn contains_key(&self, name: &[u8]) -> bool {
        self.get(name).is_some()
    }

    /// Whether no name has rules.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// How many names have rules.
    pub fn len(&self) -> usize {
        self.sets.len()
    }
}

/// A policy's custom rules by target.
#[derive(Debug, Default)]
pub struct Rules {
    /// `method`.
    pub method: Option<RuleSet>,
    /// `path` (normalised).
    pub path: Option<RuleSet>,
    /// `query` (decoded).
    pub query: Option<RuleSet>,
    /// `body` (raw bytes).
    pub body: Option<RuleSet>,
    /// `client_ip` (text form).
    pub client_ip: Option<RuleSet>,
    /// `arg:NAME`, by exact name (query, form, multipart and JSON arguments).
    pub args: ByName,
    /// `header:NAME`.
    pub headers: Vec<(HeaderName, RuleSet)>,
    /// `cookie:NAME`, by exact name.
    pub cookies: ByName,
}

impl Rules {
    /// Compiles `rules`; `counter(id, action)` registers each rule's match counter.
    pub fn compile(
        rules: &[WafRule],
        mut counter: impl FnMut(u32, WafAction) -> Counter,
    ) -> Result<Self, String> {
        let mut groups: Vec<(&WafTarget, Vec<&WafRule>)> = Vec::new();
        for r in rules {
            match groups.iter_mut().find(|(t, _)| **t == r.target) {
                Some((_, g)) => g.push(r),
                None => groups.push((&r.target, vec![r])),
            }
        }
        let mut out = Rules::default();
        for (target, group) in groups {
            let set = compile_set(&group, &mut counter)?;
            match target {
                WafTarget::Method => out.method = Some(set),
                WafTarget::Path => out.path = Some(set),
                WafTarget::Query => out.query = Some(set),
                WafTarget::Body => out.body = Some(set),
                WafTarget::ClientIp => out.client_ip = Some(set),
                WafTarget::Arg(n) => {
                    out.args.insert(n.as_bytes(), set);
                }
                WafTarget::Cookie(n) => {
                    out.cookies.insert(n.as_bytes(), set);
                }
                WafTarget::Header(n) => {
                    let name = HeaderName::from_bytes(n.as_bytes())
                        .map_err(|e| format!("header `{n}`: {e}"))?;
                    out.headers.push((name, set));
                }
            }
        }
        Ok(out)
    }

    /// The rules of header `name`.
    pub fn header(&self, name: &HeaderName) -> Option<&RuleSet> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, set)| set)
    }

    /// Whether any rule looks at request bodies (`body` or `arg:NAME`, which covers form, JSON
    /// and multipart fields).
    pub fn inspect_body(&self) -> bool {
        self.body.is_some() || !self.args.is_empty()
    }
}

fn compile_set(
    group: &[&WafRule],
    counter: &mut impl FnMut(u32, WafAction) -> Counter,
) -> Result<RuleSet, String> {
    let set = RegexSetBuilder::new(group.iter().map(|r| &r.pattern))
        .size_limit(SIZE_LIMIT)
        .dfa_size_limit(SIZE_LIMIT)
        .build()
        .map_err(|e| {
            format!(
                "rules {:?}: {e}",
                group.iter().map(|r| r.id).collect::<Vec<_>>()
            )
        })?;
    let rules = group
        .iter()
        .map(|r| {
            let regex = RegexBuilder::new(&r.pattern)
                .size_limit(SIZE_LIMIT)
                .build()
                .map_err(|e| format!("rule {}: {e}", r.id))?;
            Ok(Rule {
                id: r.id,
                action: r.action,
                matches: counter(r.id, r.action),
                regex,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(RuleSet { set, rules })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(id: u32, target: WafTarget, pattern: &str) -> WafRule {
        WafRule {
            id,
            target,
            pattern: pattern.into(),
            action: WafAction::Block,
        }
    }

    #[test]
    fn groups_by_target_and_reports_matches_in_order() {
        let rules = Rules::compile(
            &[
                rule(1, WafTarget::Path, "^/admin"),
                rule(2, WafTarget::Header("user-agent".into()), "(?i)curl"),
                rule(3, WafTarget::Path, "\\.php$"),
                rule(4, WafTarget::Arg("id".into()), "[^0-9]"),
            ],
            |_, _| Counter::default(),
        )
        .unwrap();
        let path = rules.path.as_ref().unwrap();
        assert_eq!(path.rules().len(), 2);
        let mut seen = Vec::new();
        let _ = path.for_each_match(b"/admin/x.php", |r, at| {
            seen.push((r.id, at));
            std::ops::ControlFlow::Continue(())
        });
        assert_eq!(seen, [(1, 0), (3, 8)]);
        assert_eq!(rules.headers.len(), 1);
        assert!(rules.args.contains_key(&b"id"[..]));
        assert!(!rules.args.contains_key(&b"ix"[..]));
        assert!(!rules.args.contains_key(&b"idx"[..]));
        assert!(rules.inspect_body());
    }

    #[test]
    fn names_are_found_by_exact_match_small_or_large() {
        for n in [3, ByName::LINEAR + 5] {
            let list: Vec<WafRule> = (0..n)
                .map(|i| rule(i as u32, WafTarget::Cookie(format!("c{i}")), "x"))
                .collect();
            let rules = Rules::compile(&list, |_, _| Counter::default()).unwrap();
            assert_eq!(rules.cookies.len(), n);
            for i in 0..n {
                let set = rules.cookies.get(format!("c{i}").as_bytes()).unwrap();
                assert_eq!(set.rules()[0].id, i as u32);
            }
            assert!(rules.cookies.get(b"c").is_none());
            assert!(rules.cookies.get(b"C0").is_none());
            assert!(rules.cookies.get(format!("c{n}").as_bytes()).is_none());
        }
    }

    #[test]
    fn stops_on_break() {
        let rules = Rules::compile(
            &[
                rule(1, WafTarget::Query, "a"),
                rule(2, WafTarget::Query, "b"),
            ],
            |_, _| Counter::default(),
        )
        .unwrap();
        let mut n = 0;
        let _ = rules.query.as_ref().unwrap().for_each_match(b"ab", |_, _| {
            n += 1;
            std::ops::ControlFlow::Break(())
        });
        assert_eq!(n, 1);
    }
}
