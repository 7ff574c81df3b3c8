//! Turns a request path into a safe, normalised key relative to the root, before the file
//! system is touched. The path is percent-decoded exactly once; anything that could climb out
//! of the root (`..`, encoded slashes, backslashes, NUL) or is not clean UTF-8 is rejected here,
//! and symlinks are checked later against the canonical root (see `resolve.rs`).

use std::borrow::Cow;

use http::StatusCode;

/// A validated request path.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ReqPath<'a> {
    /// `/`-separated decoded segments, starting with `/`, no empty, `.` or `..` segment; ends
    /// with `/` when the request names a directory. Borrowed from the URI when it needed no
    /// change, so a cache hit does not allocate.
    pub(super) key: Cow<'a, str>,
}

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PathError {
    /// Malformed or an escape attempt: 400.
    Invalid,
    /// A hidden (dot) file or directory: 404, as if it did not exist.
    Hidden,
}

impl PathError {
    pub(super) fn status(self) -> StatusCode {
        match self {
            Self::Invalid => StatusCode::BAD_REQUEST,
            Self::Hidden => StatusCode::NOT_FOUND,
        }
    }
}

/// Validates and normalises `raw` (the URI path, still percent-encoded).
pub(super) fn normalize(raw: &str) -> Result<ReqPath<'_>, PathError> {
    if !raw.starts_with('/') {
        // `*` (OPTIONS) or anything else that is not an origin-form path.
        return Err(PathError::Invalid);
    }
    if is_clean(raw) {
        return Ok(ReqPath {
            key: Cow::Borrowed(raw),
        });
    }
    Ok(ReqPath {
        key: Cow::Owned(rebuild(raw)?),
    })
}

/// The key of a path the fast path did not take: each segment decoded and checked, empty ones
/// dropped.
fn rebuild(raw: &str) -> Result<String, PathError> {
    let mut key = String::with_capacity(raw.len());
    let mut seg = Vec::new();
    for raw_seg in raw.split('/') {
        decode_segment(raw_seg, &mut seg)?;
        let s = std::str::from_utf8(&seg).map_err(|_| PathError::Invalid)?;
        check_segment(s)?;
        if !s.is_empty() {
            key.push('/');
            key.push_str(s);
        }
    }
    if key.is_empty() || raw.ends_with('/') {
        key.push('/');
    }
    Ok(key)
}

/// The fast path: a plain ASCII path that decoding and normalising would leave unchanged. One
/// pass over the bytes, cheaper than splitting the path into segments: every segment after the
/// leading `/` is non-empty (no `//`) and does not start with a dot; the last may be empty (a
/// trailing slash). Each byte is classed by a table and judged by the class of the byte before
/// it, without a branch, which costs less per byte than testing its range or branching on the
/// classes.
fn is_clean(raw: &str) -> bool {
    let mut prev = PLAIN;
    let mut refused = 0;
    for &c in raw.as_bytes() {
        let class = CLASS[usize::from(c)];
        refused |= REFUSED_PAIRS.wrapping_shr(u32::from(prev << 2 | class)) & 1;
        prev = class;
    }
    refused == 0
}

/// Byte classes of [`is_clean`].
const REFUSED: u8 = 0;
const PLAIN: u8 = 1;
const SLASH: u8 = 2;
/// `.`: plain, except first in a segment.
const DOT: u8 = 3;

/// Bit `prev << 2 | class` is set when a byte of `class` after one of `prev` is refused: a
/// refused byte anywhere, and after a `/` also a `/` (an empty segment) or a `.` (a dot
/// segment or a hidden name). A mask rather than a table: no bounds check in the loop.
const REFUSED_PAIRS: u16 = {
    let mut pairs = 0;
    let mut prev = 0;
    while prev < 4 {
        pairs |= 1 << (prev << 2 | REFUSED);
        prev += 1;
    }
    pairs | 1 << (SLASH << 2 | SLASH) | 1 << (SLASH << 2 | DOT)
};

const CLASS: [u8; 256] = {
    let mut class = [REFUSED; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        // Visible ASCII; `%` (to decode) and `\` (a separator elsewhere) take the slow path.
        if b.is_ascii_graphic() && b != b'%' && b != b'\\' {
            class[c] = match b {
                b'/' => SLASH,
                b'.' => DOT,
                _ => PLAIN,
            };
        }
        c += 1;
    }
    class
};

/// Percent-decodes one segment into `out`. An encoded `/` would let one segment become two
/// after decoding (the classic `..%2f..` escape), so it is refused rather than decoded.
fn decode_segment(raw: &str, out: &mut Vec<u8>) -> Result<(), PathError> {
    out.clear();
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hi = b.get(i + 1).and_then(|c| hex(*c));
            let lo = b.get(i + 2).and_then(|c| hex(*c));
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err(PathError::Invalid);
            };
            let c = hi << 4 | lo;
            if c == b'/' {
                return Err(PathError::Invalid);
            }
            out.push(c);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(())
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Rules for one decoded segment.
fn check_segment(s: &str) -> Result<(), PathError> {
    // Control characters (NUL truncates C paths; others have no business in a file name) and
    // backslashes (a separator on Windows, and on some network file systems) are refused.
    if s.chars().any(|c| c.is_control() || c == '\\') {
        return Err(PathError::Invalid);
    }
    // Dot segments are resolved by clients before sending (RFC 3986 §5.2.4); one that
    // arrives is either a bug or an attack, so it is not resolved here.
    if s == "." || s == ".." {
        return Err(PathError::Invalid);
    }
    // Hidden files (`.git`, `.env`, `.htpasswd`) are never served; `.well-known` (RFC 8615)
    // is the one public dot directory.
    if s.starts_with('.') && s != ".well-known" {
        return Err(PathError::Hidden);
    }
    Ok(())
}

/// The `Location` for a directory requested without its trailing slash: the normalised key,
/// re-encoded, plus `/` and the query. Built from the key (never the raw URI), so it always
/// starts with exactly one `/` and cannot become a protocol-relative `//host` redirect.
pub(super) fn dir_location(key: &str, query: Option<&str>) -> String {
    let mut out = String::with_capacity(key.len() + 2 + query.map_or(0, |q| q.len() + 1));
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789ABCDEF"[usize::from(b & 15)]));
        }
    }
    if !out.ends_with('/') {
        out.push('/');
    }
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(raw: &str) -> Result<String, PathError> {
        normalize(raw).map(|p| p.key.into_owned())
    }

    #[test]
    fn clean_paths_are_borrowed() {
        for p in [
            "/",
            "/a",
            "/a/b.txt",
            "/a/b/",
            "/.well-known/x",
            "/a-b_c~d;e=f",
        ] {
            let r = normalize(p).unwrap();
            // `.well-known` is allowed but takes the slow path; the rest borrow.
            if !p.contains(".well-known") {
                assert!(matches!(r.key, Cow::Borrowed(_)), "{p}");
            }
            assert_eq!(r.key, p);
        }
    }

    /// The fast path takes a path only when the full one would return it unchanged, and takes
    /// every plain path the full one leaves unchanged (but `.well-known`, too long to appear
    /// here): all paths of up to six bytes over the bytes that matter (slash, dot, percent,
    /// backslash, space, a letter, a digit).
    /// Every byte, at the start of a segment and inside one, against the rule the table encodes.
    #[test]
    fn the_byte_table_classes_every_byte() {
        for c in 0..=255u8 {
            let plain = c.is_ascii_graphic() && c != b'%' && c != b'\\';
            let mut raw = *b"/x/a?";
            raw[4] = c;
            let inside = std::str::from_utf8(&raw).is_ok_and(is_clean);
            assert_eq!(inside, plain, "byte {c:#04x} inside a segment");
            let mut raw = *b"/x/?";
            raw[3] = c;
            let first = std::str::from_utf8(&raw).is_ok_and(is_clean);
            assert_eq!(
                first,
                plain && c != b'/' && c != b'.',
                "byte {c:#04x} first"
            );
        }
    }

    #[test]
    fn the_fast_path_agrees_with_the_full_one() {
        const BYTES: &[u8] = b"/.%\\ a1";
        let mut paths = vec![b"/".to_vec()];
        let mut next = paths.clone();
        for _ in 1..6 {
            next = next
                .iter()
                .flat_map(|p| {
                    BYTES.iter().map(move |&b| {
                        let mut q = p.clone();
                        q.push(b);
                        q
                    })
                })
                .collect();
            paths.extend(next.iter().cloned());
        }
        let mut clean = 0;
        for p in &paths {
            let p = std::str::from_utf8(p).unwrap();
            if is_clean(p) {
                clean += 1;
                assert_eq!(rebuild(p), Ok(p.to_owned()), "the fast path took {p:?}");
                continue;
            }
            // A plain path the fast path refused is one the full path changes or refuses.
            let plain = p
                .bytes()
                .all(|c| c.is_ascii_graphic() && c != b'%' && c != b'\\');
            if plain && let Ok(r) = normalize(p) {
                assert_ne!(r.key, p, "the fast path refused {p:?}");
            }
        }
        assert!(clean > 400, "{clean} clean paths of {}", paths.len());
    }

    #[test]
    fn decoding_and_normalising() {
        assert_eq!(key("/a%20b.txt").unwrap(), "/a b.txt");
        assert_eq!(key("//a///b//").unwrap(), "/a/b/");
        assert_eq!(key("/%41").unwrap(), "/A");
        assert_eq!(key("/caf%C3%A9").unwrap(), "/café");
        // Decoded once: `%2541` is the literal `%41`, not `A`.
        assert_eq!(key("/%2541").unwrap(), "/%41");
        assert_eq!(key("/%252e%252e/").unwrap(), "/%2e%2e/");
        assert_eq!(key("/").unwrap(), "/");
        assert_eq!(key("//").unwrap(), "/");
        assert_eq!(key("/%41/").unwrap(), "/A/");
    }

    #[test]
    fn traversal_forms_are_refused() {
        for p in [
            "/..",
            "/../etc/passwd",
            "/a/../../etc/passwd",
            "/a/..",
            "/./a",
            "/a/./b",
            "/%2e%2e/etc/passwd",
            "/%2E%2E/etc/passwd",
            "/.%2e/etc/passwd",
            "/%2e./etc/passwd",
            "/a%2f..%2f..%2fetc%2fpasswd",
            "/a%2F..%2F..%2Fetc",
            "/..%2f",
            "/..%5c..%5cetc%5cpasswd",
            "/..\\..\\etc\\passwd",
            "/a\\b",
            "/%5c",
            "/%00",
            "/index.html%00.txt",
            "/a%0a",
            "/a%7f",
            "/a%c0%ae%c0%ae/",
            "/%ff",
            "/%",
            "/%2",
            "/%zz",
            "/%%32%65",
            "*",
            "",
            "a/b",
        ] {
            assert_eq!(key(p), Err(PathError::Invalid), "{p:?}");
        }
    }

    #[test]
    fn hidden_files_are_not_found() {
        for p in [
            "/.git/config",
            "/.env",
            "/a/.htpasswd",
            "/%2egit/HEAD",
            "/.well-known/.x",
        ] {
            assert_eq!(key(p), Err(PathError::Hidden), "{p}");
        }
        assert_eq!(
            key("/.well-known/acme-challenge/t").unwrap(),
            "/.well-known/acme-challenge/t"
        );
        assert_eq!(key("/a.b/c.d").unwrap(), "/a.b/c.d");
    }

    #[test]
    fn arbitrary_input_never_panics_or_escapes() {
        let alphabet: &[&str] = &[
            "/",
            "//",
            ".",
            "..",
            "%",
            "%2e",
            "%2E",
            "%2f",
            "%5c",
            "%00",
            "%c3%a9",
            "%ff",
            "%zz",
            "a",
            "b.txt",
            "\\",
            ".well-known",
            "%25",
            "~",
            "%0",
            " ",
        ];
        let mut x = 0x853c_49e6_748f_ea9bu64;
        for _ in 0..20_000 {
            let mut raw = String::new();
            for _ in 0..(x % 8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                raw.push_str(alphabet[(x % alphabet.len() as u64) as usize]);
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if let Ok(p) = normalize(&raw) {
                let k = &p.key;
                assert!(k.starts_with('/'), "{raw:?} -> {k:?}");
                assert!(
                    !k.contains("//") && !k.contains('\\') && !k.contains('\0'),
                    "{raw:?}"
                );
                assert!(
                    k.split('/').all(|s| s != ".." && s != "."),
                    "{raw:?} -> {k:?}"
                );
                assert_eq!(dir_location(k, None).matches("//").count(), 0, "{raw:?}");
            }
        }
    }

    #[test]
    fn locations() {
        assert_eq!(dir_location("/docs", None), "/docs/");
        assert_eq!(dir_location("/a b/é", Some("x=1")), "/a%20b/%C3%A9/?x=1");
        // `//evil.com` normalises to `/evil.com`: a relative redirect, never off-site.
        let k = key("//evil.com").unwrap();
        assert_eq!(dir_location(&k, None), "/evil.com/");
    }
}
