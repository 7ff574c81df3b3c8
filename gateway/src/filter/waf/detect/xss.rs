//! Cross-site scripting: libinjection's HTML5 tokenizer run in every context a value can be
//! reflected into (text, unquoted and quoted attribute values), plus what it leaves out: script
//! URIs (`javascript:` in an `href`) and entity-encoded markup for applications that decode
//! entities before output.

use super::{Hit, feat, ids};
use crate::filter::waf::normalize::html_entity_decode;

/// Whether the value needs the (expensive) checks: libinjection needs `<` or `=` to find a tag
/// or an attribute, a script URI needs `:`, entities need `&`.
pub fn may_match(f: u32) -> bool {
    f & (feat::LT | feat::EQ | feat::COLON | feat::AMP) != 0
}

/// The full check on a decoded value (`f` = [`super::features`] of `v`).
pub fn detect(v: &[u8], f: u32) -> Option<Hit> {
    if let Some(h) = detect_plain(v, f) {
        return Some(h);
    }
    if f & feat::AMP != 0 {
        let decoded = html_entity_decode(v)?;
        return detect_plain(&decoded, super::features(&decoded)).map(|h| Hit::new(h.rule, 0));
    }
    None
}

fn detect_plain(v: &[u8], f: u32) -> Option<Hit> {
    if f & (feat::LT | feat::EQ) != 0 && libinjection(v) {
        let at = memchr::memchr(b'<', v).unwrap_or(0);
        return Some(Hit::new(ids::XSS, at));
    }
    if f & feat::COLON != 0 && script_uri(v) {
        return Some(Hit::new(ids::XSS_URI, 0));
    }
    None
}

fn libinjection(v: &[u8]) -> bool {
    super::guarded(|| libinjectionrs::detect_xss(v).is_injection())
}

/// A value that is a script-bearing URI: `javascript:`/`vbscript:` followed by code, or an HTML
/// or SVG `data:` URI. Browsers ignore whitespace and control characters inside the scheme
/// (`java\tscript:`), so they are skipped here too. Only a value that *starts* with the scheme
/// counts: "learn javascript: a guide" is prose.
fn script_uri(v: &[u8]) -> bool {
    let mut scheme = [0u8; 12];
    let mut n = 0;
    let mut rest = None;
    for (i, &b) in v.iter().enumerate() {
        if b <= b' ' || b == 0x7F {
            continue;
        }
        if b == b':' {
            rest = Some(&v[i + 1..]);
            break;
        }
        if n == scheme.len() || !b.is_ascii_alphabetic() {
            return false;
        }
        scheme[n] = b.to_ascii_lowercase();
        n += 1;
    }
    let Some(rest) = rest else {
        return false;
    };
    match &scheme[..n] {
        b"javascript" | b"vbscript" | b"livescript" => {
            rest.iter().any(|b| matches!(b, b'(' | b'`' | b'=')) || rest.starts_with(b"//")
        }
        b"data" => {
            let r = rest.trim_ascii_start();
            let r = &r[..r.len().min(13)];
            r.eq_ignore_ascii_case(b"text/html")
                || r.len() >= 9 && r[..9].eq_ignore_ascii_case(b"text/html")
                || r.eq_ignore_ascii_case(b"image/svg+xml")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::features;
    use super::*;

    fn hit(v: &str) -> Option<u32> {
        let f = features(v.as_bytes());
        if !may_match(f) {
            return None;
        }
        detect(v.as_bytes(), f).map(|h| h.rule)
    }

    #[test]
    fn detects_markup_and_uris() {
        for v in [
            "<script>alert(1)</script>",
            "<img src=x onerror=alert(1)>",
            "\"><svg/onload=alert(1)>",
            "' onmouseover='alert(1)",
            "<iframe src=javascript:alert(1)>",
            "<body onload=alert(1)>",
            "&lt;script&gt;alert(1)&lt;/script&gt;",
        ] {
            assert_eq!(hit(v), Some(ids::XSS), "{v}");
        }
        for v in [
            "javascript:alert(1)",
            " JaVa\tScRiPt:alert`1`",
            "data:text/html;base64,PHNjcmlwdD4=",
            "javascript&colon;alert(1)",
            "vbscript:msgbox(1)",
        ] {
            assert_eq!(hit(v), Some(ids::XSS_URI), "{v}");
        }
    }

    #[test]
    fn passes_text() {
        for v in [
            "x < y and y > z",
            "a=b",
            "Learn javascript: the good parts",
            "12:30",
            "https://example.com/a?b=c",
            "Tom &amp; Jerry",
            "I <3 cats",
            "2 < 3",
            "data: none",
        ] {
            assert_eq!(hit(v), None, "{v}");
        }
    }
}
