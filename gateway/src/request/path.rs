//! Request path normalization: the one form of a path that routes, filters, plugins and the
//! upstream see, so that `/api/x/../admin`, `/api/./admin`, `/api//admin` and `/api/%61dmin`
//! cannot reach what a route on `/api/admin` was written to catch (RFC 3986 §6.2.2).
//!
//! In order: percent-escapes are checked (a `%` not followed by two hex digits refuses the
//! request); escapes of unreserved characters are decoded and the others' hex digits made upper
//! case; an escaped slash (`%2F`) or backslash (`%5C`), and a raw backslash, are refused, kept
//! as data, or decoded to a separator, as the listener says; runs of slashes are merged when
//! the listener says so; and dot segments are removed (RFC 3986 §5.2.4). The query is not
//! touched. A path that is already normal is returned as it is, without a copy.

use std::borrow::Cow;

use gateway_http1::escape::push_escaped;

/// What a listener does with `%2F`, `%5C` and `\` in a path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EscapedSlashes {
    /// Refuse the request (`400`): a separator in disguise is how a request leaves a prefix.
    #[default]
    Reject,
    /// Keep them as data: `%2F` and `%5C` stay escaped, a raw `\` becomes `%5C`.
    Keep,
    /// Treat them as separators: decoded to `/` before the dot segments are removed.
    Decode,
}

/// How a listener normalizes request paths, fixed at config load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRules {
    /// Merge runs of `/` into one.
    pub merge_slashes: bool,
    /// What `%2F`, `%5C` and `\` do.
    pub escaped_slashes: EscapedSlashes,
}

impl Default for PathRules {
    fn default() -> Self {
        Self {
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Reject,
        }
    }
}

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathRefusal {
    /// A `%` not followed by two hex digits.
    InvalidEscape,
    /// `%2F`, `%5C` or `\` where the listener refuses them.
    EscapedSlash,
}

impl PathRefusal {
    /// The `reason` label of `gateway_http_rejected_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::InvalidEscape => "invalid_path_escape",
            Self::EscapedSlash => "escaped_slash",
        }
    }
}

/// `path` in its normal form under `rules`; borrowed when it already is. A path that does not
/// start with `/` (`*`, or an empty one) is left alone: it names no resource by segments.
pub fn normalize<'a>(path: &'a str, rules: &PathRules) -> Result<Cow<'a, str>, PathRefusal> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') || is_normal(bytes, rules.merge_slashes) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(bytes, rules.escaped_slashes)?;
    let out = remove_dot_segments(&decoded, rules.merge_slashes);
    if out == bytes {
        return Ok(Cow::Borrowed(path));
    }
    // Only ASCII is rewritten (escapes that are not of unreserved characters stay escaped);
    // the bytes of other characters, which `http` lets a path carry as UTF-8, pass as they are.
    Ok(Cow::Owned(
        String::from_utf8(out).expect("rewriting ASCII keeps UTF-8 valid"),
    ))
}

/// Whether `path` needs no work: no `%`, no `\`, no dot segment, and no empty segment when
/// slashes are merged. One pass; the fast path asks this of every request.
fn is_normal(path: &[u8], merge_slashes: bool) -> bool {
    let mut i = 0;
    while i < path.len() {
        match path[i] {
            b'%' | b'\\' => return false,
            b'/' => {
                let rest = &path[i + 1..];
                match rest {
                    [b'/', ..] if merge_slashes => return false,
                    [b'.'] | [b'.', b'/', ..] | [b'.', b'.'] | [b'.', b'.', b'/', ..] => {
                        return false;
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        i += 1;
    }
    true
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Checks and rewrites the escapes (and raw backslashes) of `path`.
fn decode(path: &[u8], slashes: EscapedSlashes) -> Result<Vec<u8>, PathRefusal> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'\\' {
            match slashes {
                EscapedSlashes::Reject => return Err(PathRefusal::EscapedSlash),
                EscapedSlashes::Keep => push_escaped(&mut out, b'\\'),
                EscapedSlashes::Decode => out.push(b'/'),
            }
            i += 1;
            continue;
        }
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            path.get(i + 1).copied().and_then(hex_value),
            path.get(i + 2).copied().and_then(hex_value),
        ) else {
            return Err(PathRefusal::InvalidEscape);
        };
        let value = hi << 4 | lo;
        if is_unreserved(value) {
            out.push(value);
        } else if matches!(value, b'/' | b'\\') && slashes != EscapedSlashes::Keep {
            if slashes == EscapedSlashes::Reject {
                return Err(PathRefusal::EscapedSlash);
            }
            out.push(b'/');
        } else {
            push_escaped(&mut out, value);
        }
        i += 3;
    }
    Ok(out)
}

/// RFC 3986 §5.2.4 over the segments of an absolute path, merging empty segments when asked.
/// A path ending in a dot segment ends with `/` (`/a/b/..` is `/a/`).
fn remove_dot_segments(path: &[u8], merge_slashes: bool) -> Vec<u8> {
    // Each kept segment's start in `out`, so `..` can drop the last one.
    let mut out: Vec<u8> = Vec::with_capacity(path.len());
    let mut starts: Vec<usize> = Vec::new();
    let segments = path[1..].split(|&b| b == b'/');
    let count = segments.clone().count();
    for (n, segment) in segments.enumerate() {
        let last = n + 1 == count;
        match segment {
            b"." | b".." => {
                if segment == b".."
                    && let Some(start) = starts.pop()
                {
                    out.truncate(start);
                }
                if last {
                    out.push(b'/');
                }
            }
            b"" if merge_slashes && !last => {}
            _ => {
                starts.push(out.len());
                out.push(b'/');
                out.extend_from_slice(segment);
            }
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(path: &str) -> Result<String, PathRefusal> {
        normalize(path, &PathRules::default()).map(Cow::into_owned)
    }

    #[test]
    fn the_probes_of_a_prefix_escape_all_become_the_path_they_name() {
        for probe in [
            "/api/x/../admin",
            "/api/./admin",
            "/api//admin",
            "/api/%61dmin",
            "/api/x/%2e%2e/admin",
            "/api/x/%2E./admin",
            "/api/.%2e/api/admin",
            "//api///admin",
        ] {
            assert_eq!(norm(probe).as_deref(), Ok("/api/admin"), "{probe}");
        }
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for path in [
            "/",
            "/a/b",
            "/a/b/",
            "/a.b/c..d/.e",
            "/a%20b",
            "/%C3%A9",
            "*",
            "",
        ] {
            assert!(
                matches!(normalize(path, &PathRules::default()), Ok(Cow::Borrowed(p)) if p == path),
                "{path}"
            );
        }
    }

    #[test]
    fn dot_segments_follow_rfc_3986() {
        let cases = [
            ("/a/b/c/./../../g", "/a/g"),
            ("/mid/content=5/../6", "/mid/6"),
            ("/..", "/"),
            ("/../..", "/"),
            ("/a/..", "/"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/./", "/a/"),
            ("/./", "/"),
            ("/a//", "/a/"),
        ];
        for (path, want) in cases {
            assert_eq!(norm(path).as_deref(), Ok(want), "{path}");
        }
    }

    #[test]
    fn escapes_are_decoded_only_for_unreserved_characters() {
        assert_eq!(norm("/%7euser/%41%2d%5f").as_deref(), Ok("/~user/A-_"));
        assert_eq!(norm("/a%3fb%2a").as_deref(), Ok("/a%3Fb%2A"));
        assert_eq!(norm("/%e9").as_deref(), Ok("/%E9"));
        assert_eq!(norm("/a%"), Err(PathRefusal::InvalidEscape));
        assert_eq!(norm("/a%4"), Err(PathRefusal::InvalidEscape));
        assert_eq!(norm("/a%zz"), Err(PathRefusal::InvalidEscape));
    }

    #[test]
    fn escaped_slashes_and_backslashes_follow_the_listener() {
        for probe in [
            "/api%2Fadmin",
            "/api%2fadmin",
            "/api%5Cadmin",
            "/api\\admin",
        ] {
            assert_eq!(norm(probe), Err(PathRefusal::EscapedSlash), "{probe}");
        }
        let keep = PathRules {
            escaped_slashes: EscapedSlashes::Keep,
            ..PathRules::default()
        };
        let keep = |p| normalize(p, &keep).map(Cow::into_owned);
        assert_eq!(keep("/x/..%2Fadmin").as_deref(), Ok("/x/..%2Fadmin"));
        assert_eq!(keep("/a\\b").as_deref(), Ok("/a%5Cb"));
        let decode = PathRules {
            escaped_slashes: EscapedSlashes::Decode,
            ..PathRules::default()
        };
        let decode = |p| normalize(p, &decode).map(Cow::into_owned);
        assert_eq!(decode("/api/x/..%2Fadmin").as_deref(), Ok("/api/admin"));
        assert_eq!(decode("/api\\x\\..\\admin").as_deref(), Ok("/api/admin"));
    }

    #[test]
    fn slashes_are_kept_when_not_merged() {
        let rules = PathRules {
            merge_slashes: false,
            ..PathRules::default()
        };
        assert!(matches!(normalize("/a//b", &rules), Ok(Cow::Borrowed(_))));
        assert_eq!(
            normalize("/a//b/../c", &rules)
                .map(Cow::into_owned)
                .as_deref(),
            Ok("/a//c")
        );
    }

    #[test]
    fn normalizing_twice_changes_nothing() {
        let inputs = [
            "/a/%2e/%2E%2e/b//c/./d/..",
            "/%41%42/../%7e/",
            "/.././..//x/%20/",
            "/a/b/c/../../../../..",
        ];
        for input in inputs {
            let once = norm(input).unwrap();
            assert!(
                matches!(
                    normalize(&once, &PathRules::default()),
                    Ok(Cow::Borrowed(_))
                ),
                "{input} -> {once}"
            );
        }
    }
}
