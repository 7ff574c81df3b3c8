//! Decoding and normalisation of request input before it is inspected. Attackers hide payloads
//! behind encodings that the application (or the server in front of it) will undo: double
//! percent-encoding, IIS-style `%uXXXX`, overlong UTF-8 (`%c0%ae` for `.`), backslashes as path
//! separators. Every value is decoded the way the most lenient backend would, so the detectors
//! and custom rules see what the application will see.
//!
//! All functions here are pure, total and allocation-free when there is nothing to decode (the
//! common case): they return `Cow::Borrowed`. They never panic, whatever the bytes.

use std::borrow::Cow;

/// Facts noticed while decoding, reported as protocol anomalies by the caller.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DecodeFlags {
    /// A `%` not followed by two hex digits (or `u` and four) in the first pass.
    pub invalid_percent: bool,
    /// `%uXXXX` or overlong UTF-8: encodings no standard client produces.
    pub evasion: bool,
}

impl DecodeFlags {
    fn merge(&mut self, other: DecodeFlags) {
        self.invalid_percent |= other.invalid_percent;
        self.evasion |= other.evasion;
    }
}

/// How many times a value is percent-decoded at most: three undoes double and triple encoding
/// (`%25252e`) without letting a hostile value make us loop.
const MAX_PASSES: usize = 3;

/// Percent-decodes `input` (repeatedly, while valid escapes remain), maps `+` to a space when
/// `plus_as_space` (form and query encoding), decodes `%uXXXX` and folds overlong UTF-8.
pub fn url_decode(input: &[u8], plus_as_space: bool) -> (Cow<'_, [u8]>, DecodeFlags) {
    if input.len() <= SHORT && is_plain(input, plus_as_space) {
        return (Cow::Borrowed(input), DecodeFlags::default());
    }
    let mut flags = DecodeFlags::default();
    let needs_pass = memchr::memchr(b'%', input).is_some()
        || (plus_as_space && memchr::memchr(b'+', input).is_some());
    let mut value: Cow<'_, [u8]> = Cow::Borrowed(input);
    if needs_pass {
        let (once, f) = decode_pass(input, plus_as_space, true);
        flags.merge(f);
        value = Cow::Owned(once);
        for _ in 1..MAX_PASSES {
            if !has_valid_escape(&value) {
                break;
            }
            let (again, f) = decode_pass(&value, false, false);
            flags.merge(f);
            value = Cow::Owned(again);
        }
    }
    let (value, f) = fold_overlong(value);
    flags.merge(f);
    (value, flags)
}

/// Size of the buffer [`url_decode_in`] decodes into: most query and form values are shorter.
pub const INLINE: usize = 128;

/// [`url_decode`], without allocating in the most common case that needs decoding at all: a
/// short query or form value whose only encoding is `+` for a space (`q=running+shoes`), which
/// is decoded into `buf`.
pub fn url_decode_in<'a>(
    input: &'a [u8],
    plus_as_space: bool,
    buf: &'a mut [u8; INLINE],
) -> (Cow<'a, [u8]>, DecodeFlags) {
    if input.len() <= INLINE {
        let found = special(input);
        if found & (PERCENT | OVERLONG_LEAD) == 0 {
            // Nothing but `+` to decode: this is what `url_decode` does then, with no pass to
            // repeat (no `%`) and nothing to fold (no lead byte).
            if !plus_as_space || found & PLUS == 0 {
                return (Cow::Borrowed(input), DecodeFlags::default());
            }
            let out = &mut buf[..input.len()];
            for (o, &b) in out.iter_mut().zip(input) {
                *o = if b == b'+' { b' ' } else { b };
            }
            return (Cow::Borrowed(out), DecodeFlags::default());
        }
    }
    url_decode(input, plus_as_space)
}

/// Up to this length a value is checked for work in one table-driven pass rather than by one
/// `memchr` per kind of byte (most names and values are short).
const SHORT: usize = 64;

/// Bits of [`SPECIAL`]: `%`, `+`, and a lead byte that may start an overlong sequence.
const PERCENT: u8 = 1;
const PLUS: u8 = 2;
const OVERLONG_LEAD: u8 = 4;

static SPECIAL: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'%' as usize] = PERCENT;
    t[b'+' as usize] = PLUS;
    t[0xC0] = OVERLONG_LEAD;
    t[0xC1] = OVERLONG_LEAD;
    t[0xE0] = OVERLONG_LEAD;
    t[0xF0] = OVERLONG_LEAD;
    t
};

/// Whether [`url_decode`] has nothing to do on `v`: no `%`, no `+` (when it is a space) and no
/// byte that can start an overlong sequence.
fn is_plain(v: &[u8], plus_as_space: bool) -> bool {
    let found = special(v);
    let mask = PERCENT | OVERLONG_LEAD | if plus_as_space { PLUS } else { 0 };
    found & mask == 0
}

/// The union of the [`SPECIAL`] bits of `v`.
fn special(v: &[u8]) -> u8 {
    v.iter().fold(0, |acc, b| acc | SPECIAL[*b as usize])
}

/// Normalises a request path for inspection and `path` rules: decoded as [`url_decode`] (`+`
/// stays), backslashes become slashes, repeated slashes and `/./` segments collapse. `..` is kept
/// (it is what the traversal detector looks for).
pub fn normalize_path(raw: &[u8]) -> (Cow<'_, [u8]>, DecodeFlags) {
    let (decoded, flags) = url_decode(raw, false);
    if !needs_path_cleanup(&decoded) {
        return (decoded, flags);
    }
    let mut out = Vec::with_capacity(decoded.len());
    let mut i = 0;
    while i < decoded.len() {
        let b = if decoded[i] == b'\\' {
            b'/'
        } else {
            decoded[i]
        };
        if b == b'/' {
            // Skip runs of separators and `./` segments after a separator.
            if out.last() == Some(&b'/') {
                i += 1;
                continue;
            }
            out.push(b'/');
            i += 1;
            while i < decoded.len() && decoded[i] == b'.' && is_sep_or_end(&decoded, i + 1) {
                i += 1;
                if i < decoded.len() {
                    i += 1;
                }
            }
            continue;
        }
        out.push(b);
        i += 1;
    }
    (Cow::Owned(out), flags)
}

fn is_sep_or_end(v: &[u8], i: usize) -> bool {
    i >= v.len() || v[i] == b'/' || v[i] == b'\\'
}

/// A `\`, `//`, `/./` or a trailing `/.`, found in one pass: paths are short, so one walk costs
/// less than a search for each pattern.
fn needs_path_cleanup(v: &[u8]) -> bool {
    let mut prev = 0u8;
    for (i, &b) in v.iter().enumerate() {
        let dot_segment = b == b'.' && v.get(i + 1).is_none_or(|&n| n == b'/');
        if b == b'\\' || (prev == b'/' && (b == b'/' || dot_segment)) {
            return true;
        }
        prev = b;
    }
    false
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn hex2(v: &[u8], i: usize) -> Option<u8> {
    Some(hex(*v.get(i)?)? << 4 | hex(*v.get(i + 1)?)?)
}

fn hex4(v: &[u8], i: usize) -> Option<u32> {
    let mut cp = 0u32;
    for k in 0..4 {
        cp = cp << 4 | u32::from(hex(*v.get(i + k)?)?);
    }
    Some(cp)
}

fn has_valid_escape(v: &[u8]) -> bool {
    memchr::memchr_iter(b'%', v).any(|i| {
        hex2(v, i + 1).is_some()
            || (matches!(v.get(i + 1), Some(b'u' | b'U')) && hex4(v, i + 2).is_some())
    })
}

fn decode_pass(v: &[u8], plus_as_space: bool, first: bool) -> (Vec<u8>, DecodeFlags) {
    let mut flags = DecodeFlags::default();
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        match v[i] {
            b'%' => {
                if let Some(b) = hex2(v, i + 1) {
                    out.push(b);
                    i += 3;
                } else if let (Some(b'u' | b'U'), Some(cp)) = (v.get(i + 1), hex4(v, i + 2)) {
                    flags.evasion = true;
                    push_code_point(&mut out, fullwidth_to_ascii(cp));
                    i += 6;
                } else {
                    // A literal `%` after the first pass is data ("100% sure"), not an anomaly.
                    flags.invalid_percent |= first;
                    out.push(b'%');
                    i += 1;
                }
            }
            b'+' if plus_as_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    (out, flags)
}

/// IIS decodes `%uFF0E` (fullwidth full stop) to `.`: fold the fullwidth ASCII block.
fn fullwidth_to_ascii(cp: u32) -> u32 {
    if (0xFF01..=0xFF5E).contains(&cp) {
        cp - 0xFEE0
    } else {
        cp
    }
}

fn push_code_point(out: &mut Vec<u8>, cp: u32) {
    // Surrogates from `%uD800` are not characters; keep them visible as U+FFFD.
    let c = char::from_u32(cp).unwrap_or(char::REPLACEMENT_CHARACTER);
    let mut buf = [0u8; 4];
    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
}

/// Replaces overlong UTF-8 sequences (`C0 AE` for `.`, `E0 80 AF` for `/`) by the shortest form
/// of the same code point, as lenient decoders do.
pub fn fold_overlong(v: Cow<'_, [u8]>) -> (Cow<'_, [u8]>, DecodeFlags) {
    if !has_overlong(&v) {
        return (v, DecodeFlags::default());
    }
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        match overlong_at(&v, i) {
            Some((cp, len)) => {
                push_code_point(&mut out, cp);
                i += len;
            }
            None => {
                out.push(v[i]);
                i += 1;
            }
        }
    }
    (
        Cow::Owned(out),
        DecodeFlags {
            evasion: true,
            invalid_percent: false,
        },
    )
}

fn has_overlong(v: &[u8]) -> bool {
    memchr::memchr3_iter(0xC0, 0xC1, 0xE0, v)
        .chain(memchr::memchr_iter(0xF0, v))
        .any(|i| overlong_at(v, i).is_some())
}

fn cont(v: &[u8], i: usize) -> Option<u32> {
    let b = *v.get(i)?;
    (b & 0xC0 == 0x80).then_some(u32::from(b & 0x3F))
}

/// The code point and length of an overlong sequence starting at `i`, if there is one.
fn overlong_at(v: &[u8], i: usize) -> Option<(u32, usize)> {
    match v[i] {
        0xC0 | 0xC1 => Some((u32::from(v[i] & 0x1F) << 6 | cont(v, i + 1)?, 2)),
        0xE0 if v.get(i + 1).is_some_and(|b| *b < 0xA0) => {
            Some((cont(v, i + 1)? << 6 | cont(v, i + 2)?, 3))
        }
        0xF0 if v.get(i + 1).is_some_and(|b| *b < 0x90) => Some((
            cont(v, i + 1)? << 12 | cont(v, i + 2)? << 6 | cont(v, i + 3)?,
            4,
        )),
        _ => None,
    }
}

/// Decodes HTML character references (`&lt;`, `&#60;`, `&#x3c;`, with or without the `;`) for
/// the XSS detector: applications that decode entities before output turn them into markup.
pub fn html_entity_decode(v: &[u8]) -> Option<Vec<u8>> {
    memchr::memchr(b'&', v)?;
    let mut out = Vec::with_capacity(v.len());
    let mut changed = false;
    let mut i = 0;
    while i < v.len() {
        if v[i] == b'&'
            && let Some((cp, len)) = entity_at(v, i)
        {
            push_code_point(&mut out, cp);
            i += len;
            changed = true;
            continue;
        }
        out.push(v[i]);
        i += 1;
    }
    changed.then_some(out)
}

const NAMED: [(&[u8], u32); 12] = [
    (b"lt", 0x3C),
    (b"gt", 0x3E),
    (b"quot", 0x22),
    (b"apos", 0x27),
    (b"amp", 0x26),
    (b"colon", 0x3A),
    (b"lpar", 0x28),
    (b"rpar", 0x29),
    (b"sol", 0x2F),
    (b"tab", 0x09),
    (b"newline", 0x0A),
    (b"equals", 0x3D),
];

fn entity_at(v: &[u8], i: usize) -> Option<(u32, usize)> {
    let rest = v.get(i + 1..)?;
    if rest.first() == Some(&b'#') {
        let (radix, start) = match rest.get(1) {
            Some(b'x' | b'X') => (16, 2),
            _ => (10, 1),
        };
        let digits = rest[start..]
            .iter()
            .take(8)
            .take_while(|b| (**b as char).is_digit(radix))
            .count();
        if digits == 0 {
            return None;
        }
        let text = std::str::from_utf8(&rest[start..start + digits]).ok()?;
        let cp = u32::from_str_radix(text, radix).ok()?;
        let semi = usize::from(rest.get(start + digits) == Some(&b';'));
        return Some((cp, 1 + start + digits + semi));
    }
    NAMED.iter().find_map(|(name, cp)| {
        let n = name.len();
        let word = rest.get(..n)?;
        word.eq_ignore_ascii_case(name).then(|| {
            let semi = usize::from(rest.get(n) == Some(&b';'));
            (*cp, 1 + n + semi)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> String {
        String::from_utf8_lossy(&url_decode(s.as_bytes(), true).0).into_owned()
    }

    #[test]
    fn plain_values_are_borrowed() {
        let (v, f) = url_decode(b"page", true);
        assert!(matches!(v, Cow::Borrowed(_)));
        assert_eq!(f, DecodeFlags::default());
        assert!(matches!(
            normalize_path(b"/api/v1/users").0,
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn short_and_long_values_decode_alike() {
        for v in [
            &b"a+b"[..],
            b"a%20b",
            b"plain",
            &[0xC0, 0xAE],
            &[0xE0, 0x80, 0xAE],
            &[0xF0, 0x80, 0x80, 0xAF],
            b"caf\xc3\xa9",
        ] {
            let mut long = v.to_vec();
            long.resize(SHORT + 1, b'x');
            for plus in [false, true] {
                let (short, f) = url_decode(v, plus);
                let (l, lf) = url_decode(&long, plus);
                assert_eq!(f, lf, "{v:?}");
                assert_eq!(&l[..short.len()], &*short, "{v:?}");
            }
        }
        assert!(matches!(url_decode(b"a+b", false).0, Cow::Borrowed(_)));
        assert_eq!(&*url_decode(b"a+b", true).0, b"a b");
    }

    #[test]
    fn decoding_in_a_buffer_agrees_with_url_decode() {
        for v in [
            &b"running+shoes"[..],
            b"a+b+%2B",
            b"plain",
            b"",
            b"+",
            b"%zz+x",
            &[b'+'; INLINE],
            &[b'+'; INLINE + 1],
            &[0xC0, 0xAE, b'+'],
            b"caf\xc3\xa9+x",
        ] {
            for plus in [false, true] {
                let (a, af) = url_decode(v, plus);
                let mut buf = [0; INLINE];
                let (b, bf) = url_decode_in(v, plus, &mut buf);
                assert_eq!(&*a, &*b, "{v:?}");
                assert_eq!(af, bf, "{v:?}");
            }
        }
    }

    #[test]
    fn path_cleanup_is_found_in_one_pass() {
        let slow = |v: &[u8]| {
            memchr::memchr(b'\\', v).is_some()
                || memchr::memmem::find(v, b"//").is_some()
                || memchr::memmem::find(v, b"/./").is_some()
                || v.ends_with(b"/.")
        };
        let alphabet = [b'/', b'.', b'\\', b'a'];
        for n in 0..=6u32 {
            for code in 0..4usize.pow(n) {
                let v: Vec<u8> = (0..n).map(|k| alphabet[code / 4usize.pow(k) % 4]).collect();
                assert_eq!(needs_path_cleanup(&v), slow(&v), "{v:?}");
            }
        }
    }

    #[test]
    fn single_double_and_triple_encoding() {
        assert_eq!(dec("a%20b+c"), "a b c");
        assert_eq!(dec("%2e%2e%2f"), "../");
        assert_eq!(dec("%252e%252e%252f"), "../");
        assert_eq!(dec("%25252e%25252e"), "..");
        assert_eq!(dec("%2E%2e%2F"), "../", "hex digits in any case");
    }

    #[test]
    fn percent_u_and_fullwidth() {
        let (v, f) = url_decode(b"%u002e%u002E%u2215", false);
        assert_eq!(String::from_utf8_lossy(&v), "..\u{2215}");
        assert!(f.evasion);
        assert_eq!(dec("%uff0e%uff0e%uff0f"), "../");
        assert_eq!(dec("%uD800"), "\u{FFFD}");
    }

    #[test]
    fn overlong_utf8_folds_to_ascii() {
        let (v, f) = url_decode(b"%c0%ae%c0%ae%c0%af", false);
        assert_eq!(&*v, b"../");
        assert!(f.evasion);
        assert_eq!(&*url_decode(b"%e0%80%ae", false).0, b".");
        assert_eq!(&*url_decode(b"%f0%80%80%af", false).0, b"/");
        // Raw (not percent-encoded) overlong bytes fold too.
        assert_eq!(&*url_decode(&[0xC0, 0xAE, b'x'], false).0, b".x");
        // Valid multi-byte UTF-8 is untouched.
        assert_eq!(dec("caf%C3%A9"), "café");
    }

    #[test]
    fn invalid_percent_is_flagged_only_in_the_first_pass() {
        assert!(url_decode(b"100%", true).1.invalid_percent);
        assert!(url_decode(b"%zz", true).1.invalid_percent);
        assert!(!url_decode(b"100%25 sure", true).1.invalid_percent);
        assert_eq!(dec("100%25 sure"), "100% sure");
    }

    #[test]
    fn path_cleanup() {
        let p = |s: &str| String::from_utf8_lossy(&normalize_path(s.as_bytes()).0).into_owned();
        assert_eq!(p("/a//b/./c/"), "/a/b/c/");
        assert_eq!(p("/a\\..\\b"), "/a/../b");
        assert_eq!(p("/%2e/admin"), "/admin");
        assert_eq!(p("//admin/."), "/admin/");
        assert_eq!(p("/a+b"), "/a+b");
    }

    #[test]
    fn entities() {
        let d = |s: &str| html_entity_decode(s.as_bytes()).map(|v| String::from_utf8(v).unwrap());
        assert_eq!(d("&lt;script&gt;").as_deref(), Some("<script>"));
        assert_eq!(d("&#60;&#x3C;&#x3c").as_deref(), Some("<<<"));
        assert_eq!(d("javascript&colon;x").as_deref(), Some("javascript:x"));
        assert_eq!(d("Tom &amp Jerry").as_deref(), Some("Tom & Jerry"));
        assert_eq!(d("a & b"), None);
        // Not a character: replaced, never a panic.
        assert!(d("&#99999999999;").unwrap().starts_with('\u{FFFD}'));
    }

    #[test]
    fn hostile_bytes_never_panic() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 24) as usize;
            let v: Vec<u8> = (0..len)
                .map(|k| {
                    let b = (seed >> (k % 8 * 8)) as u8;
                    [
                        b'%', b'u', b'.', b'/', b'\\', 0xC0, 0xE0, 0xF0, b'&', b'#', b,
                    ][(b % 11) as usize]
                })
                .collect();
            let _ = url_decode(&v, true);
            let _ = normalize_path(&v);
            let _ = html_entity_decode(&v);
        }
    }
}
