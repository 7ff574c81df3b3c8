//! Path traversal and local file inclusion: `..` path segments (after decoding, with `\` and
//! Tomcat's `..;` as separators), names of files only an attacker asks for (`/etc/passwd`,
//! `win.ini`, `/.git/`) and PHP stream wrappers used for file inclusion (`php://filter`), in any
//! letter case and with either slash.

use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use super::{Hit, feat, ids};

const FILES: &[&str] = &[
    "/etc/passwd",
    "/etc/shadow",
    "/etc/group",
    "/etc/hosts",
    "/etc/issue",
    "/etc/sudoers",
    "/proc/self/",
    "/proc/version",
    "/.ssh/",
    "win.ini",
    "boot.ini",
    "system.ini",
    "/windows/system32",
    "/.htaccess",
    "/.htpasswd",
    "/.git/",
    "/.svn/",
    "/.env",
    "/wp-config.php",
    "/.aws/credentials",
    "php://",
    "phar://",
    "expect://",
];

/// Each name with `/` and with `\\`.
fn patterns() -> impl Iterator<Item = String> {
    FILES
        .iter()
        .flat_map(|f| [f.to_string(), f.replace('/', "\\")])
}

fn files() -> Option<&'static AhoCorasick> {
    static AC: OnceLock<Option<AhoCorasick>> = OnceLock::new();
    AC.get_or_init(|| {
        AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::LeftmostFirst)
            .build(patterns())
            .ok()
    })
    .as_ref()
}

/// Bytes that anchor the pre-check: every file name contains one (they are not letters, so
/// letter case does not change them).
fn is_anchor(b: u8) -> bool {
    matches!(b, b'/' | b'\\' | b'.' | b':')
}

/// The pre-check of [`files`]: for each name, the two bytes (lowercased) after its first anchor
/// byte that has two bytes after it. A value containing a name contains that anchor followed by
/// those two bytes, so a value where no anchor is followed by a listed pair contains no name;
/// paths such as `/api/search` are proven clean by this alone, without a call to the
/// automaton, which costs far more.
fn anchor_pairs() -> &'static [[u8; 2]] {
    static PAIRS: OnceLock<Vec<[u8; 2]>> = OnceLock::new();
    PAIRS.get_or_init(|| {
        let mut pairs: Vec<[u8; 2]> = patterns()
            .map(|p| {
                let p = p.to_ascii_lowercase().into_bytes();
                let k = (0..p.len().saturating_sub(2))
                    .find(|&k| is_anchor(p[k]))
                    .expect("every file name has an anchor byte with two bytes after it");
                [p[k + 1], p[k + 2]]
            })
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        pairs
    })
}

/// Whether some file name of [`FILES`] may occur in `v` (no false negatives).
fn may_name_a_file(v: &[u8]) -> bool {
    let pairs = anchor_pairs();
    v.windows(3).any(|w| {
        is_anchor(w[0]) && pairs.contains(&[w[1].to_ascii_lowercase(), w[2].to_ascii_lowercase()])
    })
}

/// Looks for traversal in a decoded value or normalised path (`f` = [`super::features`]).
pub fn detect(v: &[u8], f: u32, _is_path: bool) -> Option<Hit> {
    if f & feat::DOT != 0
        && let Some(at) = dot_dot_segment(v)
    {
        return Some(Hit::new(ids::TRAVERSAL, at));
    }
    if f & (feat::SEP | feat::DOT) != 0
        && may_name_a_file(v)
        && let Some(m) = files().and_then(|ac| ac.find(v))
    {
        return Some(Hit::new(ids::SENSITIVE_FILE, m.start()));
    }
    None
}

fn is_sep(b: u8) -> bool {
    b == b'/' || b == b'\\'
}

/// The offset of a path segment made of two or more dots next to a separator (`../`, `/..`,
/// `....//`, `..;/`). A lone `...` in prose has no separator and does not count.
fn dot_dot_segment(v: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(p) = memchr::memmem::find(&v[from..], b"..") {
        let start = from + p;
        let mut end = start;
        while end < v.len() && v[end] == b'.' {
            end += 1;
        }
        let before = start.checked_sub(1).map(|i| v[i]);
        let after = v.get(end).copied();
        let sep_before = before.is_some_and(is_sep);
        let sep_after = after.is_some_and(|b| is_sep(b) || b == b';');
        if (before.is_none() || sep_before)
            && (after.is_none() || sep_after)
            && (sep_before || sep_after)
        {
            return Some(start);
        }
        from = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::features;
    use super::*;

    fn hit(v: &str) -> Option<u32> {
        detect(v.as_bytes(), features(v.as_bytes()), false).map(|h| h.rule)
    }

    #[test]
    fn detects_traversal() {
        for v in [
            "../../etc/x",
            "..\\..\\boot",
            "/static/../../x",
            "....//....//x",
            "/..;/admin",
            "a/..",
        ] {
            assert_eq!(hit(v), Some(ids::TRAVERSAL), "{v}");
        }
        for v in [
            "/ETC/PASSWD",
            "c:\\Windows\\win.ini",
            "file:///etc/shadow",
            "/.git/config",
            "/.env",
        ] {
            assert_eq!(hit(v), Some(ids::SENSITIVE_FILE), "{v}");
        }
    }

    #[test]
    fn the_pre_check_never_hides_a_file_name() {
        // Every name, in both separator forms and any case, alone and inside a longer value.
        for p in patterns() {
            for v in [
                p.clone(),
                p.to_ascii_uppercase(),
                format!("x{p}y"),
                format!("../..{p}"),
            ] {
                assert!(may_name_a_file(v.as_bytes()), "{v}");
                assert!(hit(&v).is_some(), "{v}");
            }
        }
        // Everyday paths need no automaton.
        for v in ["/waf/search", "/api/v1/users/42", "/static/app.js", "a.b"] {
            assert!(!may_name_a_file(v.as_bytes()), "{v}");
        }
    }

    #[test]
    fn passes_dots_in_text() {
        for v in [
            "wait...",
            "...",
            "version 1.2.3",
            "a..b",
            "see you soon..",
            "/api/v1.2/users",
            "~/.config",
        ] {
            assert_eq!(hit(v), None, "{v}");
        }
    }
}
