//! Validators and conditional requests: ETag and Last-Modified values, the RFC 9110 §13.2.2
//! precondition order (If-Match, If-Unmodified-Since, If-None-Match, If-Modified-Since), and
//! single byte ranges with If-Range. All parsing works on the header bytes without allocating.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderValue};

/// Latest time an HTTP date can show (9999-12-31T23:59:59Z); httpdate panics past it.
const MAX_HTTP_SECS: u64 = 253_402_300_799;

/// The parts of a file's identity that change whenever its content does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Version {
    pub(super) len: u64,
    /// Modification time, seconds since the epoch (may be negative) and nanoseconds.
    pub(super) mtime: i64,
    pub(super) mtime_nsec: i64,
}

impl Version {
    /// A strong ETag: modification time to the nanosecond and length, so an edit within the
    /// same second still changes it. `suffix` names the content coding (`-gz`), because each
    /// coding is a different representation with its own bytes.
    pub(super) fn etag(&self, suffix: Option<&str>) -> HeaderValue {
        let tag = match suffix {
            Some(s) => format!(
                "\"{:x}.{:x}-{:x}-{s}\"",
                self.mtime, self.mtime_nsec, self.len
            ),
            None => format!("\"{:x}.{:x}-{:x}\"", self.mtime, self.mtime_nsec, self.len),
        };
        HeaderValue::try_from(tag).unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
    }

    /// Seconds since the epoch, clamped to what an HTTP date can express.
    pub(super) fn http_secs(&self) -> u64 {
        u64::try_from(self.mtime).unwrap_or(0).min(MAX_HTTP_SECS)
    }

    pub(super) fn last_modified(&self) -> HeaderValue {
        let t = UNIX_EPOCH + Duration::from_secs(self.http_secs());
        HeaderValue::try_from(httpdate::fmt_http_date(t))
            .unwrap_or_else(|_| HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))
    }
}

/// The outcome of the preconditions and the range for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// 200 with the whole representation.
    Full,
    /// 206 with bytes `start..=end`.
    Partial { start: u64, end: u64 },
    /// 304.
    NotModified,
    /// 412.
    PreconditionFailed,
    /// 416.
    Unsatisfiable,
}

/// What the precondition logic needs about the chosen representation.
pub(super) struct Validators<'a> {
    pub(super) etag: &'a HeaderValue,
    /// Last-Modified as seconds since the epoch.
    pub(super) modified: u64,
    /// Length when known and ranges are allowed (identity coding on GET); `None` disables Range.
    pub(super) range_len: Option<u64>,
}

/// Which of the headers that shape a file's answer a request carries, found in one pass over
/// its names. Most requests carry none of them, and looking each one up in the map (hashing
/// its name and probing) costs many times the pass over a request's two or three names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Asked {
    pub(super) accept_encoding: bool,
    pub(super) range: bool,
    /// `If-Match`, `If-None-Match`, `If-Modified-Since`, `If-Unmodified-Since` or `If-Range`.
    pub(super) preconditions: bool,
}

impl Asked {
    pub(super) fn of(headers: &HeaderMap) -> Self {
        let mut asked = Self::default();
        for name in headers.keys() {
            if name == header::ACCEPT_ENCODING {
                asked.accept_encoding = true;
            } else if name == header::RANGE {
                asked.range = true;
            } else if name == header::IF_MATCH
                || name == header::IF_NONE_MATCH
                || name == header::IF_MODIFIED_SINCE
                || name == header::IF_UNMODIFIED_SINCE
                || name == header::IF_RANGE
            {
                asked.preconditions = true;
            }
        }
        asked
    }
}

/// Evaluates the conditional headers in RFC 9110 order, then `Range`. `preconditions`: whether
/// the request carries any ([`Asked`]); without them and without a range to serve the answer is
/// the whole representation, known without a lookup.
pub(super) fn plan(headers: &HeaderMap, preconditions: bool, v: &Validators<'_>) -> Plan {
    if !preconditions && v.range_len.is_none() {
        return Plan::Full;
    }
    let etag = v.etag.as_bytes();
    if headers.contains_key(header::IF_MATCH) {
        if !any_tag_matches(headers, header::IF_MATCH, etag, false) {
            return Plan::PreconditionFailed;
        }
    } else if let Some(t) = date(headers, header::IF_UNMODIFIED_SINCE)
        && v.modified > t
    {
        return Plan::PreconditionFailed;
    }
    if headers.contains_key(header::IF_NONE_MATCH) {
        if any_tag_matches(headers, header::IF_NONE_MATCH, etag, true) {
            return Plan::NotModified;
        }
    } else if let Some(t) = date(headers, header::IF_MODIFIED_SINCE)
        && v.modified <= t
    {
        return Plan::NotModified;
    }
    let (Some(len), Some(range)) = (v.range_len, headers.get(header::RANGE)) else {
        return Plan::Full;
    };
    if let Some(if_range) = headers.get(header::IF_RANGE)
        && !if_range_holds(if_range, etag, v.modified)
    {
        return Plan::Full;
    }
    match parse_range(range.as_bytes(), len) {
        RangeSpec::Ignore => Plan::Full,
        RangeSpec::Unsatisfiable => Plan::Unsatisfiable,
        RangeSpec::Bytes(start, end) => Plan::Partial { start, end },
    }
}

/// An HTTP date header as seconds since the epoch; unparsable dates are ignored (RFC 9110).
fn date(headers: &HeaderMap, name: header::HeaderName) -> Option<u64> {
    http_secs(headers.get(name)?.as_bytes())
}

/// An HTTP date's raw value as seconds since the epoch (text as `HeaderValue::to_str` takes it).
fn http_secs(value: &[u8]) -> Option<u64> {
    let t = httpdate::parse_http_date(gateway_http1::fields::field_text(value)?).ok()?;
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// A revalidation as the HTTP/1.1 fast path reads it from a `GET` or `HEAD` whose only
/// preconditions are one `If-None-Match` and one `If-Modified-Since` line at most (any other
/// request is the general path's): their raw values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Revalidation<'a> {
    pub if_none_match: Option<&'a [u8]>,
    pub if_modified_since: Option<&'a [u8]>,
}

impl Revalidation<'_> {
    /// Whether the request carries either header.
    pub fn is_asked(&self) -> bool {
        self.if_none_match.is_some() || self.if_modified_since.is_some()
    }

    /// Whether the representation with these validators is answered 304, as [`plan`] decides
    /// for such a request: `If-None-Match` (weak comparison) when present, else
    /// `If-Modified-Since`.
    pub(super) fn not_modified(&self, etag: &HeaderValue, modified: u64) -> bool {
        match (self.if_none_match, self.if_modified_since) {
            (Some(tags), _) => tag_list_matches(tags, etag.as_bytes(), true),
            (None, Some(date)) => http_secs(date).is_some_and(|t| modified <= t),
            (None, None) => false,
        }
    }
}

/// Whether any entity tag in any `name` header matches `ours` (`*` matches anything, as the
/// file exists). Weak comparison ignores `W/`; strong comparison never matches a weak tag.
fn any_tag_matches(headers: &HeaderMap, name: header::HeaderName, ours: &[u8], weak: bool) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| tag_list_matches(v.as_bytes(), ours, weak))
}

fn tag_list_matches(mut list: &[u8], ours: &[u8], weak: bool) -> bool {
    loop {
        list = trim_start(list, b" \t,");
        if list.is_empty() {
            return false;
        }
        if list[0] == b'*' {
            return true;
        }
        let is_weak = list.starts_with(b"W/");
        if is_weak {
            list = &list[2..];
        }
        // An opaque tag is `"..."`; a malformed list stops here without a match.
        if list.first() != Some(&b'"') {
            return false;
        }
        let Some(close) = list[1..].iter().position(|&c| c == b'"') else {
            return false;
        };
        let tag = &list[..close + 2];
        if tag == ours && (weak || !is_weak) {
            return true;
        }
        list = &list[close + 2..];
    }
}

fn trim_start<'a>(mut s: &'a [u8], set: &[u8]) -> &'a [u8] {
    while let Some((first, rest)) = s.split_first() {
        if !set.contains(first) {
            break;
        }
        s = rest;
    }
    s
}

/// `If-Range`: an entity tag must match strongly, a date must equal Last-Modified exactly.
fn if_range_holds(v: &HeaderValue, etag: &[u8], modified: u64) -> bool {
    let b = v.as_bytes();
    if b.starts_with(b"\"") || b.starts_with(b"W/") {
        return b == etag;
    }
    v.to_str()
        .ok()
        .and_then(|s| httpdate::parse_http_date(s).ok())
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .is_some_and(|d| d.as_secs() == modified)
}

/// A parsed `Range` header against a representation of `len` bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum RangeSpec {
    /// Not a single byte range we understand (other unit, bad syntax, several ranges):
    /// answered with the full representation, as RFC 9110 §14.2 allows.
    Ignore,
    /// No byte of the range exists: 416.
    Unsatisfiable,
    /// `start..=end`, clamped to the representation.
    Bytes(u64, u64),
}

pub(super) fn parse_range(value: &[u8], len: u64) -> RangeSpec {
    let v = trim(value);
    let Some(unit_end) = v.iter().position(|&c| c == b'=') else {
        return RangeSpec::Ignore;
    };
    if !trim(&v[..unit_end]).eq_ignore_ascii_case(b"bytes") {
        return RangeSpec::Ignore;
    }
    let spec = trim(&v[unit_end + 1..]);
    if spec.contains(&b',') {
        return RangeSpec::Ignore;
    }
    let Some(dash) = spec.iter().position(|&c| c == b'-') else {
        return RangeSpec::Ignore;
    };
    let (first, last) = (trim(&spec[..dash]), trim(&spec[dash + 1..]));
    match (digits(first), digits(last)) {
        // `-N`: the last N bytes.
        (None, Some(n)) if first.is_empty() => {
            if n == 0 || len == 0 {
                RangeSpec::Unsatisfiable
            } else {
                RangeSpec::Bytes(len.saturating_sub(n), len - 1)
            }
        }
        // `A-`: from A to the end.
        (Some(a), None) if last.is_empty() => bytes_from(a, u64::MAX, len),
        // `A-B`.
        (Some(a), Some(b)) if a <= b => bytes_from(a, b, len),
        _ => RangeSpec::Ignore,
    }
}

fn bytes_from(start: u64, end: u64, len: u64) -> RangeSpec {
    if start >= len {
        RangeSpec::Unsatisfiable
    } else {
        RangeSpec::Bytes(start, end.min(len - 1))
    }
}

/// Decimal digits; values too large for u64 saturate (they are past any file's end anyway).
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0u64, |n, &d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

fn trim(s: &[u8]) -> &[u8] {
    s.trim_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETAG: &str = "\"abc.1-10\"";
    const T: u64 = 1_700_000_000;

    fn date_str(secs: u64) -> String {
        httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs))
    }

    /// The fast path's revalidation decides as `plan` does for the requests it takes.
    #[test]
    fn revalidation_answers_as_the_plan_does() {
        let etag = HeaderValue::from_static(ETAG);
        let (same, later, earlier) = (date_str(T), date_str(T + 60), date_str(T - 60));
        let weak = format!("W/{ETAG}");
        let listed = format!("\"x\", {ETAG}");
        let cases: Vec<(Option<&str>, Option<&str>)> = vec![
            (Some(ETAG), None),
            (Some(&weak), None),
            (Some(&listed), None),
            (Some("*"), None),
            (Some("\"other\""), None),
            (Some("garbage"), None),
            (None, Some(&same)),
            (None, Some(&later)),
            (None, Some(&earlier)),
            (None, Some("not a date")),
            // If-None-Match decides when both are there.
            (Some("\"other\""), Some(&later)),
            (Some(ETAG), Some(&earlier)),
            (None, None),
        ];
        for (inm, ims) in cases {
            let mut pairs = Vec::new();
            pairs.extend(inm.map(|v| ("if-none-match", v)));
            pairs.extend(ims.map(|v| ("if-modified-since", v)));
            let planned = run(&pairs, None) == Plan::NotModified;
            let revalidation = Revalidation {
                if_none_match: inm.map(str::as_bytes),
                if_modified_since: ims.map(str::as_bytes),
            };
            assert_eq!(revalidation.is_asked(), !pairs.is_empty());
            assert_eq!(
                revalidation.not_modified(&etag, T),
                planned,
                "{inm:?} {ims:?}"
            );
        }
    }

    fn run(pairs: &[(&str, &str)], range_len: Option<u64>) -> Plan {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let etag = HeaderValue::from_static(ETAG);
        plan(
            &h,
            Asked::of(&h).preconditions,
            &Validators {
                etag: &etag,
                modified: T,
                range_len,
            },
        )
    }

    #[test]
    fn one_pass_finds_every_header_that_shapes_the_answer() {
        let of = |names: &[&str]| {
            let mut h = HeaderMap::new();
            for n in names {
                h.append(
                    header::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_static("x"),
                );
            }
            Asked::of(&h)
        };
        assert_eq!(of(&[]), Asked::default());
        assert_eq!(
            of(&["host", "user-agent", "x-if-match", "ranges"]),
            Asked::default()
        );
        for name in [
            "if-match",
            "If-None-Match",
            "if-modified-since",
            "if-unmodified-since",
            "if-range",
        ] {
            let asked = of(&["host", name]);
            assert!(asked.preconditions, "{name}");
            assert!(!asked.range && !asked.accept_encoding, "{name}");
        }
        let asked = of(&["accept-encoding", "accept-encoding", "range", "accept"]);
        assert!(asked.accept_encoding && asked.range && !asked.preconditions);
    }

    #[test]
    fn version_headers() {
        let v = Version {
            len: 16,
            mtime: 0x10,
            mtime_nsec: 5,
        };
        assert_eq!(v.etag(None), "\"10.5-10\"");
        assert_eq!(v.etag(Some("br")), "\"10.5-10-br\"");
        assert_eq!(v.last_modified(), "Thu, 01 Jan 1970 00:00:16 GMT");
        // Out-of-range times must not panic (httpdate would).
        let old = Version { mtime: -5, ..v };
        assert_eq!(old.last_modified(), "Thu, 01 Jan 1970 00:00:00 GMT");
        let future = Version {
            mtime: i64::MAX,
            ..v
        };
        assert_eq!(future.last_modified(), "Fri, 31 Dec 9999 23:59:59 GMT");
    }

    #[test]
    fn if_none_match() {
        assert_eq!(run(&[("if-none-match", ETAG)], None), Plan::NotModified);
        assert_eq!(
            run(&[("if-none-match", "W/\"abc.1-10\"")], None),
            Plan::NotModified
        );
        assert_eq!(
            run(&[("if-none-match", "\"x\", \"abc.1-10\"")], None),
            Plan::NotModified
        );
        assert_eq!(run(&[("if-none-match", "*")], None), Plan::NotModified);
        assert_eq!(
            run(&[("if-none-match", "\"x\""), ("if-none-match", ETAG)], None),
            Plan::NotModified
        );
        assert_eq!(
            run(&[("if-none-match", "\"abc.1-10-gz\"")], None),
            Plan::Full
        );
        assert_eq!(run(&[("if-none-match", "abc.1-10")], None), Plan::Full);
        assert_eq!(
            run(&[("if-none-match", "\"unterminated")], None),
            Plan::Full
        );
        assert_eq!(run(&[("if-none-match", "")], None), Plan::Full);
        // If-None-Match wins over If-Modified-Since.
        assert_eq!(
            run(
                &[
                    ("if-none-match", "\"x\""),
                    ("if-modified-since", &date_str(T))
                ],
                None
            ),
            Plan::Full
        );
    }

    #[test]
    fn if_modified_since() {
        assert_eq!(
            run(&[("if-modified-since", &date_str(T))], None),
            Plan::NotModified
        );
        assert_eq!(
            run(&[("if-modified-since", &date_str(T + 60))], None),
            Plan::NotModified
        );
        assert_eq!(
            run(&[("if-modified-since", &date_str(T - 1))], None),
            Plan::Full
        );
        assert_eq!(run(&[("if-modified-since", "yesterday")], None), Plan::Full);
    }

    #[test]
    fn if_match_and_unmodified_since() {
        assert_eq!(run(&[("if-match", ETAG)], None), Plan::Full);
        assert_eq!(run(&[("if-match", "*")], None), Plan::Full);
        assert_eq!(
            run(&[("if-match", "\"other\"")], None),
            Plan::PreconditionFailed
        );
        // Strong comparison: a weak tag never satisfies If-Match.
        assert_eq!(
            run(&[("if-match", "W/\"abc.1-10\"")], None),
            Plan::PreconditionFailed
        );
        assert_eq!(
            run(&[("if-unmodified-since", &date_str(T))], None),
            Plan::Full
        );
        assert_eq!(
            run(&[("if-unmodified-since", &date_str(T - 1))], None),
            Plan::PreconditionFailed
        );
    }

    #[test]
    fn ranges() {
        use RangeSpec::*;
        let p = |s: &str, len| parse_range(s.as_bytes(), len);
        assert_eq!(p("bytes=0-9", 100), Bytes(0, 9));
        assert_eq!(p("bytes=90-", 100), Bytes(90, 99));
        assert_eq!(p("bytes=90-1000", 100), Bytes(90, 99));
        assert_eq!(p("bytes=-10", 100), Bytes(90, 99));
        assert_eq!(p("bytes=-1000", 100), Bytes(0, 99));
        assert_eq!(p("Bytes = 5 - 5 ", 100), Bytes(5, 5));
        assert_eq!(p("bytes=99999999999999999999999-", 100), Unsatisfiable);
        assert_eq!(p("bytes=0-99999999999999999999999", 100), Bytes(0, 99));
        assert_eq!(p("bytes=100-", 100), Unsatisfiable);
        assert_eq!(p("bytes=100-200", 100), Unsatisfiable);
        assert_eq!(p("bytes=-0", 100), Unsatisfiable);
        assert_eq!(p("bytes=0-", 0), Unsatisfiable);
        assert_eq!(p("bytes=-5", 0), Unsatisfiable);
        assert_eq!(p("bytes=5-1", 100), Ignore);
        assert_eq!(p("bytes=0-1,5-6", 100), Ignore);
        assert_eq!(p("bytes=-", 100), Ignore);
        assert_eq!(p("bytes=a-b", 100), Ignore);
        assert_eq!(p("bytes=+1-2", 100), Ignore);
        assert_eq!(p("bytes=1", 100), Ignore);
        assert_eq!(p("items=0-1", 100), Ignore);
        assert_eq!(p("", 100), Ignore);
        assert_eq!(p("bytes=--1", 100), Ignore);
    }

    #[test]
    fn arbitrary_ranges_stay_in_bounds() {
        let parts: &[&[u8]] = &[
            b"bytes",
            b"=",
            b"-",
            b"0",
            b"9",
            b"18446744073709551616",
            b",",
            b" ",
            b"x",
            b"\xff",
        ];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut v = Vec::new();
            for _ in 0..(x % 7) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.extend_from_slice(parts[(x % parts.len() as u64) as usize]);
            }
            let len = x % 50;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if let RangeSpec::Bytes(s, e) = parse_range(&v, len) {
                assert!(s <= e && e < len, "{v:?} len {len}: {s}-{e}");
            }
            let _ = tag_list_matches(&v, b"\"a\"", true);
        }
    }

    #[test]
    fn range_in_plan() {
        assert_eq!(
            run(&[("range", "bytes=0-3")], Some(10)),
            Plan::Partial { start: 0, end: 3 }
        );
        assert_eq!(run(&[("range", "bytes=0-3")], None), Plan::Full);
        assert_eq!(
            run(&[("range", "bytes=20-")], Some(10)),
            Plan::Unsatisfiable
        );
        // If-Range: strong tag or exact date keeps the range; anything else gets 200.
        assert_eq!(
            run(&[("range", "bytes=0-3"), ("if-range", ETAG)], Some(10)),
            Plan::Partial { start: 0, end: 3 }
        );
        assert_eq!(
            run(&[("range", "bytes=0-3"), ("if-range", "\"old\"")], Some(10)),
            Plan::Full
        );
        assert_eq!(
            run(
                &[("range", "bytes=0-3"), ("if-range", "W/\"abc.1-10\"")],
                Some(10)
            ),
            Plan::Full
        );
        assert_eq!(
            run(
                &[("range", "bytes=0-3"), ("if-range", &date_str(T))],
                Some(10)
            ),
            Plan::Partial { start: 0, end: 3 }
        );
        assert_eq!(
            run(
                &[("range", "bytes=0-3"), ("if-range", &date_str(T + 1))],
                Some(10)
            ),
            Plan::Full
        );
        assert_eq!(
            run(&[("range", "bytes=0-3"), ("if-range", "junk")], Some(10)),
            Plan::Full
        );
        // A matching If-None-Match answers 304 before the range is looked at.
        assert_eq!(
            run(&[("range", "bytes=0-3"), ("if-none-match", ETAG)], Some(10)),
            Plan::NotModified
        );
    }
}
