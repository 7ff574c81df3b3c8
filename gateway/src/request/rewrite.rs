//! A path rule of the `rewrite` filter and the `redirect` terminal, compiled at config load:
//! a whole new path, the route's matched prefix replaced, or a regular expression's template.
//! What a rule makes is checked before anyone sees it: an origin-form path with no dot
//! segments, or nothing.

use std::borrow::Cow;

use gateway_config::PathRewrite;

/// A compiled path rule.
#[derive(Debug)]
pub enum PathRule {
    /// The whole path.
    Replace(Box<str>),
    /// The route's `path_prefix` replaced by `with` ([`crate::router::replace_prefix`]).
    ReplacePrefix {
        /// The route's prefix, without a trailing `/`.
        prefix: Box<str>,
        /// Its replacement, without a trailing `/`.
        with: Box<str>,
    },
    /// The expression's template, when it matches.
    Regex {
        /// The expression.
        regex: regex::Regex,
        /// The template, split into text and group numbers at load.
        to: Box<[Piece]>,
    },
}

/// A piece of a `to` template.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text as written (`$$` already made `$`).
    Text(Box<str>),
    /// The text of a capture group (empty when the group took no part in the match).
    Group(usize),
}

/// A path a rule made that cannot be sent (kept for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPath(pub String);

impl PathRule {
    /// Compiles a validated rule.
    pub fn new(rule: &PathRewrite) -> Self {
        match rule {
            PathRewrite::Replace(p) => Self::Replace(p.as_str().into()),
            PathRewrite::ReplacePrefix { prefix, with } => Self::ReplacePrefix {
                prefix: prefix.trim_end_matches('/').into(),
                with: with.trim_end_matches('/').into(),
            },
            PathRewrite::Regex { regex, to } => Self::Regex {
                regex: regex.clone(),
                to: template(to),
            },
        }
    }

    /// The new path for `path`: borrowed when the rule leaves it as it is (a prefix or an
    /// expression that does not match), `Err` when what it makes is not a path to send.
    pub fn apply<'p>(&self, path: &'p str) -> Result<Cow<'p, str>, InvalidPath> {
        let made = match self {
            Self::Replace(p) => p.to_string(),
            Self::ReplacePrefix { prefix, with } => {
                match crate::router::replace_bare_prefix(prefix, with, path) {
                    Some(p) => p,
                    None => return Ok(path.into()),
                }
            }
            Self::Regex { regex, to } => {
                let Some(caps) = regex.captures(path) else {
                    return Ok(path.into());
                };
                let mut out = String::with_capacity(path.len() + 16);
                for piece in to.iter() {
                    match piece {
                        Piece::Text(t) => out.push_str(t),
                        Piece::Group(i) => out.push_str(caps.get(*i).map_or("", |m| m.as_str())),
                    }
                }
                out
            }
        };
        if is_safe_path(&made) {
            Ok(made.into())
        } else {
            Err(InvalidPath(made))
        }
    }
}

/// `to` split at its `$N` references (validation checked them).
fn template(to: &str) -> Box<[Piece]> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = to.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek().copied()) {
            ('$', Some('$')) => {
                chars.next();
                text.push('$');
            }
            ('$', Some(d @ '1'..='9')) => {
                chars.next();
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text).into()));
                }
                pieces.push(Piece::Group(d as usize - '0' as usize));
            }
            _ => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text.into()));
    }
    pieces.into()
}

/// An origin-form path (RFC 3986 characters and escapes, `/` first) without `.` or `..`
/// segments: a capture can put dots next to a template's text, and the entry rules that
/// removed dot segments ran before.
pub fn is_safe_path(path: &str) -> bool {
    gateway_config::is_origin_path(path.as_bytes())
        && !path.split('/').any(|s| s == "." || s == "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regex(re: &str, to: &str) -> PathRule {
        PathRule::new(&PathRewrite::Regex {
            regex: regex::Regex::new(re).unwrap(),
            to: to.into(),
        })
    }

    #[test]
    fn templates_split_at_groups() {
        assert_eq!(
            &*template("/v2/$1/x$$y$2"),
            &[
                Piece::Text("/v2/".into()),
                Piece::Group(1),
                Piece::Text("/x$y".into()),
                Piece::Group(2)
            ]
        );
    }

    #[test]
    fn a_regex_rule_substitutes_groups_and_leaves_other_paths() {
        let r = regex("^/orders/([0-9]+)(/.*)?$", "/v2/orders/$1$2");
        assert_eq!(r.apply("/orders/42").unwrap(), "/v2/orders/42");
        assert_eq!(r.apply("/orders/42/items").unwrap(), "/v2/orders/42/items");
        assert!(matches!(
            r.apply("/orders/x").unwrap(),
            Cow::Borrowed("/orders/x")
        ));
    }

    #[test]
    fn a_rule_that_makes_no_clean_path_fails() {
        let r = regex("^/a(.*)$", "/b/.$1");
        assert_eq!(r.apply("/a./x"), Err(InvalidPath("/b/../x".into())));
        let r = regex("^/a/(.*)$", "/$1");
        assert_eq!(r.apply("/a/"), Ok("/".into()));
        assert!(r.apply("/a/x%zz").is_err());
        let r = regex("^(.*)$", "$1");
        assert_eq!(r.apply("/x"), Ok("/x".into()));
        let r = regex("^/(.*)$", "$1");
        assert!(r.apply("/x").is_err(), "not origin-form");
    }

    #[test]
    fn prefix_and_whole_path_rules() {
        let r = PathRule::new(&PathRewrite::ReplacePrefix {
            prefix: "/api".into(),
            with: "/v2".into(),
        });
        assert_eq!(r.apply("/api/users").unwrap(), "/v2/users");
        let r = PathRule::new(&PathRewrite::Replace("/fixed".into()));
        assert_eq!(r.apply("/anything").unwrap(), "/fixed");
    }
}
