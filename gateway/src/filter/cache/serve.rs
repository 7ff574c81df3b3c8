//! Answers made from a stored object: the client's own conditions (`If-None-Match`,
//! `If-Modified-Since`, RFC 9110 §13) answered 304, a single byte range (`Range`, with
//! `If-Range`) answered 206 or 416, and `Age` and `Cache-Status` (RFC 9211) on every answer.

use http::header::{
    AGE, CONTENT_LENGTH, CONTENT_RANGE, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE,
    LAST_MODIFIED, RANGE,
};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use tokio::time::Instant;

use super::store::Object;
use crate::body::Body;

pub(super) static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// The client's conditional and range headers, set aside while the gateway asks the upstream
/// with its own.
#[derive(Debug, Default)]
pub(super) struct Conditions {
    if_none_match: Option<HeaderValue>,
    if_modified_since: Option<HeaderValue>,
    range: Option<HeaderValue>,
    if_range: Option<HeaderValue>,
}

impl Conditions {
    /// Removes them from a request.
    pub(super) fn take(h: &mut HeaderMap) -> Self {
        Self {
            if_none_match: h.remove(IF_NONE_MATCH),
            if_modified_since: h.remove(IF_MODIFIED_SINCE),
            range: h.remove(RANGE),
            if_range: h.remove(IF_RANGE),
        }
    }

    /// Copies them from a request (the first value of each, as `HeaderMap::get` gives). One
    /// pass over the request's few fields instead of four hashed lookups: this runs on every
    /// hit.
    pub(super) fn of(h: &HeaderMap) -> Self {
        let mut c = Self::default();
        for (name, value) in h {
            let slot = match *name {
                IF_NONE_MATCH => &mut c.if_none_match,
                IF_MODIFIED_SINCE => &mut c.if_modified_since,
                RANGE => &mut c.range,
                IF_RANGE => &mut c.if_range,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value.clone());
            }
        }
        c
    }

    /// Whether the request makes the upstream's answer conditional.
    pub(super) fn conditional(h: &HeaderMap) -> bool {
        h.contains_key(IF_NONE_MATCH) || h.contains_key(IF_MODIFIED_SINCE)
    }

    /// Whether the client already holds the object's current version.
    fn not_modified(&self, obj: &Object) -> bool {
        if let Some(inm) = &self.if_none_match {
            let Some(etag) = obj.headers.get(ETAG) else {
                return false;
            };
            return inm.as_bytes().trim_ascii() == b"*"
                || tags(inm.as_bytes()).any(|t| weak_eq(t, etag.as_bytes()));
        }
        let (Some(ims), Some(lm)) = (&self.if_modified_since, obj.headers.get(LAST_MODIFIED))
        else {
            return false;
        };
        match (http_date(ims), http_date(lm)) {
            (Some(ims), Some(lm)) => lm <= ims,
            _ => false,
        }
    }

    /// Whether a `Range` applies: no `If-Range`, or one naming the object's current version
    /// (a strong ETag, or its exact `Last-Modified`).
    fn range_applies(&self, obj: &Object) -> bool {
        let Some(ir) = &self.if_range else {
            return true;
        };
        let ir = ir.as_bytes().trim_ascii();
        if ir.starts_with(b"\"") {
            obj.headers
                .get(ETAG)
                .is_some_and(|e| e.as_bytes() == ir && !ir.starts_with(b"W/"))
        } else {
            obj.headers
                .get(LAST_MODIFIED)
                .is_some_and(|lm| lm.as_bytes() == ir)
        }
    }
}

fn http_date(v: &HeaderValue) -> Option<std::time::SystemTime> {
    httpdate::parse_http_date(v.to_str().ok()?).ok()
}

/// The entity tags of an `If-None-Match` list (with their `W/`), however hostile the list.
fn tags(mut s: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        loop {
            s = s.trim_ascii_start();
            let rest = s.strip_prefix(b",");
            if let Some(r) = rest {
                s = r;
                continue;
            }
            break;
        }
        if s.is_empty() {
            return None;
        }
        let start = if s.starts_with(b"W/") { 2 } else { 0 };
        if s.get(start) != Some(&b'"') {
            // Not a tag: skip to the next comma.
            let end = s.iter().position(|b| *b == b',').unwrap_or(s.len());
            s = &s[end..];
            return Some(&b""[..]);
        }
        let close = s[start + 1..].iter().position(|b| *b == b'"');
        let end = close.map_or(s.len(), |c| start + 1 + c + 1);
        let tag = &s[..end];
        s = &s[end..];
        Some(tag)
    })
}

/// Weak comparison (RFC 9110 §8.8.3.2): the opaque tags are equal, `W/` aside.
fn weak_eq(a: &[u8], b: &[u8]) -> bool {
    let opaque = |t: &[u8]| t.strip_prefix(b"W/").unwrap_or(t).to_vec();
    !a.is_empty() && opaque(a) == opaque(b.trim_ascii())
}

/// A single `bytes=` range of a body of `len` bytes: `Some(Ok((first, last)))`,
/// `Some(Err(()))` when unsatisfiable, `None` when it is not one range this answers (several
/// ranges, another unit, bad syntax: the whole body is sent, as RFC 9110 §14.2 allows).
fn byte_range(v: &HeaderValue, len: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = v.to_str().ok()?.trim().strip_prefix("bytes=")?.trim();
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let num = |s: &str| -> Option<u64> {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())).then(|| s.parse().ok())?
    };
    if a.trim().is_empty() {
        let n = num(b)?;
        if n == 0 || len == 0 {
            return Some(Err(()));
        }
        return Some(Ok((len.saturating_sub(n), len - 1)));
    }
    let first = num(a)?;
    let last = if b.trim().is_empty() {
        u64::MAX
    } else {
        num(b)?
    };
    if last < first {
        return None;
    }
    if first >= len {
        return Some(Err(()));
    }
    Some(Ok((first, last.min(len - 1))))
}

/// The answer to a GET (or HEAD, `head`) from `obj`, with `status` as its Cache-Status.
pub(super) fn answer(
    obj: &Object,
    now: Instant,
    head: bool,
    cond: &Conditions,
    status: HeaderValue,
) -> Response<Body> {
    let mut headers = obj.headers.clone();
    headers.insert(AGE, HeaderValue::from(obj.age(now).as_secs()));
    headers.insert(CACHE_STATUS.clone(), status);
    let len = obj.body.len();
    let mut code = obj.status;
    // The bytes sent: `first..end` of the body.
    let mut part = (0, len);
    if obj.status == StatusCode::OK {
        if cond.not_modified(obj) {
            code = StatusCode::NOT_MODIFIED;
            part = (0, 0);
        } else if let Some(r) = cond.range.as_ref().filter(|_| cond.range_applies(obj)) {
            match byte_range(r, len) {
                Some(Ok((first, last))) => {
                    code = StatusCode::PARTIAL_CONTENT;
                    part = (first, last + 1);
                    let cr = format!("bytes {first}-{last}/{len}");
                    headers.insert(CONTENT_RANGE, HeaderValue::from_str(&cr).expect("digits"));
                }
                Some(Err(())) => {
                    code = StatusCode::RANGE_NOT_SATISFIABLE;
                    part = (0, 0);
                    let cr = format!("bytes */{len}");
                    headers.insert(CONTENT_RANGE, HeaderValue::from_str(&cr).expect("digits"));
                }
                None => {}
            }
        }
    }
    if code != StatusCode::NOT_MODIFIED {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(part.1 - part.0));
    }
    let mut res = Response::new(if head || part.0 == part.1 {
        Body::default()
    } else {
        obj.body.slice(part.0, part.1)
    });
    *res.status_mut() = code;
    *res.headers_mut() = headers;
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_are_the_first_value_of_each_field() {
        let mut h = HeaderMap::new();
        h.insert(http::header::HOST, HeaderValue::from_static("a"));
        h.append(IF_NONE_MATCH, HeaderValue::from_static("\"1\""));
        h.append(IF_NONE_MATCH, HeaderValue::from_static("\"2\""));
        h.insert(RANGE, HeaderValue::from_static("bytes=0-1"));
        let c = Conditions::of(&h);
        assert_eq!(c.if_none_match, h.get(IF_NONE_MATCH).cloned());
        assert_eq!(c.if_none_match.unwrap(), "\"1\"");
        assert_eq!(c.range, h.get(RANGE).cloned());
        assert_eq!((c.if_modified_since, c.if_range), (None, None));
    }

    #[test]
    fn ranges() {
        let v = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(byte_range(&v("bytes=0-9"), 100), Some(Ok((0, 9))));
        assert_eq!(byte_range(&v("bytes=90-"), 100), Some(Ok((90, 99))));
        assert_eq!(byte_range(&v("bytes=-10"), 100), Some(Ok((90, 99))));
        assert_eq!(byte_range(&v("bytes=-1000"), 100), Some(Ok((0, 99))));
        assert_eq!(byte_range(&v("bytes=50-1000"), 100), Some(Ok((50, 99))));
        assert_eq!(byte_range(&v("bytes=100-"), 100), Some(Err(())));
        assert_eq!(byte_range(&v("bytes=-0"), 100), Some(Err(())));
        assert_eq!(byte_range(&v("bytes=0-1,5-6"), 100), None);
        assert_eq!(byte_range(&v("items=0-1"), 100), None);
        assert_eq!(byte_range(&v("bytes=9-1"), 100), None);
        assert_eq!(byte_range(&v("bytes=a-b"), 100), None);
        assert_eq!(byte_range(&v("bytes=99999999999999999999999-"), 100), None);
    }

    #[test]
    fn entity_tags() {
        let list: Vec<&[u8]> = tags(b" \"a\", W/\"b\" ,junk, \"c,d\",\"open").collect();
        assert_eq!(
            list,
            [&b"\"a\""[..], b"W/\"b\"", b"", b"\"c,d\"", b"\"open"]
        );
        assert!(weak_eq(b"W/\"b\"", b"\"b\""));
        assert!(!weak_eq(b"", b""));
        assert_eq!(tags(b",,, ,").count(), 0);
    }
}
