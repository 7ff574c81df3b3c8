//! Whether an answer may be stored (RFC 9111 §3) and for how long it is fresh (§4.2): the
//! decision made on the answer's head, before its body streams into the store.

use std::time::{Duration, SystemTime};

use http::header::{AGE, AUTHORIZATION, DATE, EXPIRES, LAST_MODIFIED, SET_COOKIE, VARY};
use http::{HeaderMap, HeaderName, StatusCode};

use super::control::CacheControl;

/// Why an answer is not stored (the `reason` label of a counter, and Cache-Status' `detail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotStored {
    /// `no-store` (answer or request), `private`, or an `Authorization` request the answer
    /// does not open to everyone.
    Forbidden,
    /// `Set-Cookie` on the answer.
    Cookie,
    /// `Vary: *`, or a `Vary` naming something that is not a header.
    Vary,
    /// No freshness stated and none given by `default_ttl`, or a status never stored.
    Uncacheable,
    /// Larger than `max_object_size`.
    TooLarge,
    /// The body ended before its `Content-Length`, or failed.
    Truncated,
}

impl NotStored {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Forbidden => "forbidden",
            Self::Cookie => "set_cookie",
            Self::Vary => "vary",
            Self::Uncacheable => "uncacheable",
            Self::TooLarge => "too_large",
            Self::Truncated => "truncated",
        }
    }
}

/// How a storable answer ages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Freshness {
    /// How long it is fresh, from its origin.
    pub lifetime: Duration,
    /// Its age when it arrived (`Age`, or the time since its `Date`, whichever is larger).
    pub initial_age: Duration,
    /// Never served without asking the upstream (`no-cache`).
    pub always_revalidate: bool,
    /// How long past `lifetime` it is served while revalidated in the background.
    pub stale_while_revalidate: Duration,
    /// How long past `lifetime` it is served when the upstream fails.
    pub stale_if_error: Duration,
    /// The request headers its variants are chosen by, lowercase.
    pub vary: Vec<HeaderName>,
}

/// Status codes a cache may give a heuristic freshness (RFC 9110 §15.1).
fn heuristic_status(s: StatusCode) -> bool {
    matches!(
        s.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// The filter's settings for answers that state nothing, and whether an answer's cookies keep
/// it out of the cache.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Defaults {
    pub(super) ttl: Duration,
    pub(super) stale_while_revalidate: Duration,
    pub(super) stale_if_error: Duration,
    /// `set_cookie: strip`: an answer with `Set-Cookie` is stored, without it
    /// ([`super::stored_head`] never keeps the field).
    pub(super) store_without_cookies: bool,
}

/// Decides on an answer to a GET. `req` is the request as the client sent it.
pub(super) fn decide(
    req: &HeaderMap,
    req_cc: &CacheControl,
    status: StatusCode,
    res: &HeaderMap,
    defaults: &Defaults,
    now: SystemTime,
) -> Result<Freshness, NotStored> {
    let default_ttl = defaults.ttl;
    if status.is_informational() || matches!(status.as_u16(), 206 | 304) {
        return Err(NotStored::Uncacheable);
    }
    let cc = CacheControl::parse(res.get_all(http::header::CACHE_CONTROL));
    if cc.no_store || req_cc.no_store || cc.private {
        return Err(NotStored::Forbidden);
    }
    if req.contains_key(AUTHORIZATION)
        && !(cc.public || cc.s_maxage.is_some() || cc.must_revalidate)
    {
        return Err(NotStored::Forbidden);
    }
    if res.contains_key(SET_COOKIE) && !defaults.store_without_cookies {
        return Err(NotStored::Cookie);
    }
    let vary = vary_names(res).ok_or(NotStored::Vary)?;
    let date = date(res, DATE);
    let explicit = cc
        .s_maxage
        .or(cc.max_age)
        .map(Duration::from_secs)
        .or_else(|| {
            let expires = res.get(EXPIRES)?;
            // An invalid date (`0` is common) means already expired.
            let expires = expires
                .to_str()
                .ok()
                .and_then(|v| httpdate::parse_http_date(v).ok());
            let base = date.unwrap_or(now);
            Some(
                expires
                    .and_then(|e| e.duration_since(base).ok())
                    .unwrap_or_default(),
            )
        });
    let lifetime = match explicit {
        Some(l) => l,
        None if !default_ttl.is_zero() && heuristic_status(status) => default_ttl,
        None if cc.no_cache => Duration::ZERO,
        None => return Err(NotStored::Uncacheable),
    };
    let validator = res.contains_key(http::header::ETAG) || res.contains_key(LAST_MODIFIED);
    if lifetime.is_zero() && !validator {
        // Stale at once and nothing to revalidate it with: it could never be served.
        return Err(NotStored::Uncacheable);
    }
    let age = res
        .get(AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::ZERO, |s| Duration::from_secs(s.min(1 << 31)));
    let apparent = date
        .and_then(|d| now.duration_since(d).ok())
        .unwrap_or_default();
    // Stale answers are never served for one that must be revalidated.
    let stale = |own: Option<u64>, default: Duration| {
        if cc.must_revalidate || cc.no_cache {
            Duration::ZERO
        } else {
            own.map_or(default, Duration::from_secs)
        }
    };
    Ok(Freshness {
        lifetime,
        initial_age: age.max(apparent),
        always_revalidate: cc.no_cache,
        stale_while_revalidate: stale(cc.stale_while_revalidate, defaults.stale_while_revalidate),
        stale_if_error: stale(cc.stale_if_error, defaults.stale_if_error),
        vary,
    })
}

fn date(h: &HeaderMap, name: HeaderName) -> Option<SystemTime> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
}

/// The header names of `Vary`, lowercase and sorted; `None` for `*` or a name that is not one.
fn vary_names(res: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for line in res.get_all(VARY) {
        let line = line.to_str().ok()?;
        for name in line.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return None;
            }
            names.push(HeaderName::from_bytes(name.as_bytes()).ok()?);
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    fn run(
        req: &[(&str, &str)],
        status: u16,
        res: &[(&str, &str)],
    ) -> Result<Freshness, NotStored> {
        let req = headers(req);
        let cc = CacheControl::parse(req.get_all(http::header::CACHE_CONTROL));
        let now = httpdate::parse_http_date("Mon, 07 Dec 2026 02:00:00 GMT").unwrap();
        let defaults = Defaults {
            stale_if_error: Duration::from_secs(9),
            ..Defaults::default()
        };
        decide(
            &req,
            &cc,
            StatusCode::from_u16(status).unwrap(),
            &headers(res),
            &defaults,
            now,
        )
    }

    #[test]
    fn freshness_sources_in_order() {
        let f = run(&[], 200, &[("cache-control", "max-age=10, s-maxage=20")]).unwrap();
        assert_eq!(f.lifetime, Duration::from_secs(20));
        let f = run(
            &[],
            200,
            &[
                ("date", "Mon, 07 Dec 2026 01:59:00 GMT"),
                ("expires", "Mon, 07 Dec 2026 02:09:00 GMT"),
                ("age", "30"),
            ],
        )
        .unwrap();
        assert_eq!(f.lifetime, Duration::from_secs(600));
        assert_eq!(f.initial_age, Duration::from_secs(60));
        assert_eq!(
            run(&[], 200, &[("expires", "0")]),
            Err(NotStored::Uncacheable)
        );
        let f = run(&[], 200, &[("expires", "0"), ("etag", "\"a\"")]).unwrap();
        assert_eq!(f.lifetime, Duration::ZERO);
        assert_eq!(run(&[], 200, &[]), Err(NotStored::Uncacheable));
        let f = run(
            &[],
            200,
            &[("cache-control", "max-age=1, stale-while-revalidate=5")],
        )
        .unwrap();
        assert_eq!(f.stale_while_revalidate, Duration::from_secs(5));
        assert_eq!(
            f.stale_if_error,
            Duration::from_secs(9),
            "the filter's default"
        );
        let f = run(
            &[],
            200,
            &[(
                "cache-control",
                "max-age=1, must-revalidate, stale-if-error=5",
            )],
        )
        .unwrap();
        assert_eq!(f.stale_if_error, Duration::ZERO);
    }

    #[test]
    fn what_is_never_stored() {
        let ok = [("cache-control", "max-age=60")];
        assert_eq!(run(&[], 206, &ok), Err(NotStored::Uncacheable));
        assert_eq!(
            run(&[("cache-control", "no-store")], 200, &ok),
            Err(NotStored::Forbidden)
        );
        assert_eq!(
            run(&[], 200, &[("cache-control", "private, max-age=60")]),
            Err(NotStored::Forbidden)
        );
        assert_eq!(
            run(&[("authorization", "Bearer x")], 200, &ok),
            Err(NotStored::Forbidden)
        );
        assert!(
            run(
                &[("authorization", "Bearer x")],
                200,
                &[("cache-control", "public, max-age=5")]
            )
            .is_ok()
        );
        assert_eq!(
            run(&[], 200, &[ok[0], ("set-cookie", "a=b")]),
            Err(NotStored::Cookie)
        );
        let strip = Defaults {
            store_without_cookies: true,
            ..Defaults::default()
        };
        let res = headers(&[ok[0], ("set-cookie", "a=b")]);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let cc = CacheControl::default();
        assert!(decide(&HeaderMap::new(), &cc, StatusCode::OK, &res, &strip, now).is_ok());
        assert_eq!(
            run(&[], 200, &[ok[0], ("vary", "accept, *")]),
            Err(NotStored::Vary)
        );
        let f = run(
            &[],
            200,
            &[
                ok[0],
                ("vary", "Accept-Encoding, accept"),
                ("vary", "accept"),
            ],
        )
        .unwrap();
        assert_eq!(f.vary, ["accept", "accept-encoding"]);
    }
}
