//! The native `rate_limit` filter: a token bucket per key (the client IP, or a header value),
//! refilled at `requests / per` and holding `requests + burst` tokens. Over the limit the
//! request gets `429` with `Retry-After`; every answer carries the IETF draft's rate-limit fields:
//! by default the current draft's `RateLimit` and `RateLimit-Policy`, or (`headers: draft-06`)
//! the earlier `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` and `RateLimit-Policy`.
//!
//! The buckets are [`crate::gcra`]'s: one number per key, in a sharded table whose memory stays
//! bounded however many clients there are.
//!
//! Requests without the configured header are limited by client IP (not by a bucket shared by
//! all of them, which one client could drain for every other).
//!
//! Buckets survive a config reload when the route keeps the same name and the filter the same
//! position and settings (see [`crate::gcra::store`]).
//!
//! With `scope: global` the bucket lives in Redis ([`crate::cluster::GlobalLimiter`], the same
//! GCRA in one script) and is shared by every instance of the cluster. When Redis cannot decide
//! (down, or no answer within `cluster.timeout`), `fallback` picks the local bucket (default),
//! no limit, or a 503, and `gateway_rate_limit_fallback_total` counts the decision.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode, request, response};

use super::{FilterFactory, Flow, HttpFilter};
use crate::body::{Body, BoxError};
use crate::cluster::{Cluster, GlobalLimiter};
use crate::connection::client_ip_hash;
use crate::context::RequestCx;
use crate::error::error_response;
use crate::gcra::{Decision, Limiter, store};
use crate::ip_text::push_decimal;
use crate::telemetry::{Counter, Registry};
use gateway_config::RateLimitKey;
use gateway_config::model::{RateLimitConfig, RateLimitFallback, RateLimitHeaders, Scope};

static LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
static POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

// === The filter ===

/// What a bucket is chosen by.
#[derive(Debug, Clone)]
enum KeyBy {
    ClientIp,
    Header(HeaderName),
}

/// Factory of the `rate_limit` filter for one route.
pub struct RateLimitFilterFactory {
    shared: Arc<Shared>,
}

struct Shared {
    limiter: Arc<Limiter>,
    key: KeyBy,
    fields: Fields,
    limited: Counter,
    global: Option<Global>,
}

/// The RateLimit fields of the route's answers, with everything that does not depend on the
/// request made at config load.
enum Fields {
    /// `RateLimit-Policy: "NAME";q=LIMIT;w=SECONDS` and `RateLimit: "NAME";r=LEFT;t=SECONDS`.
    Draft10 {
        policy: HeaderValue,
        /// `"NAME";r=`, the start of every `RateLimit` value.
        prefix: Box<[u8]>,
        /// The `RateLimit` value of a client whose bucket was full (most clients, most of the
        /// time): `LIMIT - 1` left, full again after one token's interval, `full_reset`.
        when_full: HeaderValue,
        full_reset: u64,
    },
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`, `RateLimit-Policy`.
    Draft06 {
        limit: HeaderValue,
        /// `RateLimit-Remaining` of a client whose bucket was full.
        remaining_when_full: HeaderValue,
        policy: HeaderValue,
    },
    None,
}

impl Fields {
    fn new(
        form: RateLimitHeaders,
        route: &str,
        capacity: u64,
        window: u64,
        interval: Duration,
    ) -> Result<Self, String> {
        let invalid = |e: http::header::InvalidHeaderValue| e.to_string();
        Ok(match form {
            RateLimitHeaders::Draft10 => {
                let name = sf_string(route);
                let prefix = format!("{name};r=").into_bytes().into_boxed_slice();
                let policy = format!("{name};q={capacity};w={window}");
                let full_reset = ceil_secs(interval);
                let when_full = format!("{name};r={};t={full_reset}", capacity.saturating_sub(1));
                Fields::Draft10 {
                    policy: interned(policy).map_err(invalid)?,
                    when_full: interned(when_full).map_err(invalid)?,
                    prefix,
                    full_reset,
                }
            }
            RateLimitHeaders::Draft06 => Fields::Draft06 {
                limit: interned(capacity.to_string()).map_err(invalid)?,
                remaining_when_full: interned(capacity.saturating_sub(1).to_string())
                    .map_err(invalid)?,
                policy: interned(format!("{capacity};w={window}")).map_err(invalid)?,
            },
            RateLimitHeaders::None => Fields::None,
        })
    }
}

/// A header value made once and never freed, so that every response shares it without touching
/// a reference count. Equal texts share one copy, so the memory is bounded by the distinct values
/// ever configured, not by the number of reloads.
fn interned(text: String) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
    static TEXTS: Mutex<std::collections::BTreeSet<&'static str>> =
        Mutex::new(std::collections::BTreeSet::new());
    // Validated before it is made static (`from_static` would panic on a bad byte).
    HeaderValue::from_str(&text)?;
    let mut texts = TEXTS.lock().unwrap_or_else(|e| e.into_inner());
    let text = match texts.get(text.as_str()) {
        Some(&known) => known,
        None => {
            let leaked: &'static str = String::leak(text);
            texts.insert(leaked);
            leaked
        }
    };
    Ok(HeaderValue::from_static(text))
}

/// `name` as a structured-field string (RFC 8941 §3.3.3): quoted, with `"` and `\` escaped.
/// A route name with characters a string cannot hold is named `"default"` instead.
fn sf_string(name: &str) -> String {
    if !name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return "\"default\"".into();
    }
    let mut out = String::new();
    crate::ip_text::push_quoted(&mut out, name);
    out
}

/// `PREFIX{remaining};t={reset}`, written without a format machine (this runs for every
/// request of a client whose bucket is not full).
fn draft10_value(prefix: &[u8], remaining: u64, reset: u64) -> HeaderValue {
    let mut out = Vec::with_capacity(prefix.len() + 24);
    out.extend_from_slice(prefix);
    push_decimal(&mut out, remaining);
    out.extend_from_slice(b";t=");
    push_decimal(&mut out, reset);
    // The prefix was checked at config load and the rest is digits, `;`, `t` and `=`.
    HeaderValue::from_maybe_shared(bytes::Bytes::from(out))
        .unwrap_or_else(|_| HeaderValue::from_static("\"default\";r=0"))
}

/// A `scope: global` limit: the shared bucket and what to do without it.
struct Global {
    limiter: GlobalLimiter,
    fallback: RateLimitFallback,
    fallbacks: Counter,
}

impl RateLimitFilterFactory {
    /// Builds the filter at position `index` of route `route`, reusing the buckets of the
    /// previous generation when nothing about it changed.
    pub fn new(
        route: &str,
        index: usize,
        settings: &RateLimitConfig,
        key: &RateLimitKey,
        registry: &Arc<Registry>,
        cluster: Option<&Arc<Cluster>>,
    ) -> Result<Self, String> {
        let per = settings.per.get();
        let identity = format!(
            "{}/{:?}/{}/{:?}",
            settings.requests, per, settings.burst, key
        );
        let limiter = store::get_or_insert(registry, (route.to_owned(), index, identity), || {
            Limiter::new(settings.requests, per, settings.burst)
        });
        let key = match key {
            RateLimitKey::ClientIp => KeyBy::ClientIp,
            RateLimitKey::Header(name) => KeyBy::Header(
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("key header: {e}"))?,
            ),
        };
        let window = ceil_secs(per).max(1);
        let global = match (settings.scope, cluster) {
            (Scope::Global, Some(c)) => Some(Global {
                limiter: c.limiter(route, index, settings.requests, per, settings.burst),
                fallback: settings.fallback,
                fallbacks: registry.counter(
                    "gateway_rate_limit_fallback_total",
                    "Global rate-limit decisions Redis could not make (the fallback decided), by route.",
                    &[("route", route)],
                ),
            }),
            (Scope::Global, None) => return Err("`scope: global` needs `cluster:`".into()),
            (Scope::Local, _) => None,
        };
        let fields = Fields::new(
            settings.headers,
            route,
            limiter.capacity(),
            window,
            limiter.interval(),
        )?;
        Ok(Self {
            shared: Arc::new(Shared {
                fields,
                limiter,
                key,
                limited: registry.counter(
                    "gateway_rate_limited_total",
                    "Requests refused with 429 by a rate_limit filter, by route.",
                    &[("route", route)],
                ),
                global,
            }),
        })
    }
}

impl FilterFactory for RateLimitFilterFactory {
    fn name(&self) -> &'static str {
        "rate_limit"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(RateLimitFilter {
            shared: self.shared.clone(),
            decision: None,
        })
    }

    fn after_response(&self) -> bool {
        false
    }
}

struct RateLimitFilter {
    shared: Arc<Shared>,
    decision: Option<Decision>,
}

/// Numbers below this have a header value made once per process.
const SMALL_NUMBERS: u64 = 1024;

/// `n` as a header value; small ones (every `RateLimit-Reset` of a window up to 17 minutes, and
/// `RateLimit-Remaining` of most limits) are static and cost no allocation.
fn number(n: u64) -> HeaderValue {
    static SMALL: std::sync::OnceLock<Box<[HeaderValue]>> = std::sync::OnceLock::new();
    if n >= SMALL_NUMBERS {
        return HeaderValue::from(n);
    }
    let small = SMALL.get_or_init(|| {
        (0..SMALL_NUMBERS)
            .map(|i| HeaderValue::from_static(String::leak(i.to_string())))
            .collect()
    });
    small[n as usize].clone()
}

/// Whole seconds, rounded up (a client told 0 would retry at once).
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl Shared {
    /// The bucket of a request: its key header value's, or its client address's (`client_key`)
    /// when the header is absent or the limit is keyed by client address.
    fn key(&self, req: &request::Parts, client_key: impl FnOnce() -> u64) -> u64 {
        let value = match &self.key {
            KeyBy::Header(name) => req.headers.get(name).map(HeaderValue::as_bytes),
            KeyBy::ClientIp => None,
        };
        value.map_or_else(client_key, |v| self.limiter.value_key(v))
    }

    /// The bucket's name in Redis: the client IP as text, or a digest of the header value (so
    /// API keys are not stored in the clear).
    fn global_key(&self, req: &request::Parts, client: IpAddr) -> String {
        use sha2::Digest as _;
        if let KeyBy::Header(name) = &self.key
            && let Some(v) = req.headers.get(name)
        {
            let digest = sha2::Sha256::digest(v.as_bytes());
            return format!("h:{}", crate::telemetry::trace::context::hex(&digest[..16]));
        }
        let ip = match client {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(client, IpAddr::V4),
            v4 => v4,
        };
        format!("ip:{ip}")
    }

    /// The decision for a request; `None` lets it through without RateLimit headers
    /// (`fallback: allow` while Redis is unreachable), `Err` is the response refusing it.
    async fn decide(
        &self,
        req: &request::Parts,
        cx: &RequestCx,
    ) -> Result<Option<Decision>, Response<Body>> {
        let local = || {
            let key = self.key(req, || cx.conn.client_hash());
            self.limiter.check_arrived(key, cx.start)
        };
        let Some(g) = &self.global else {
            return Ok(Some(local()));
        };
        if let Some(d) = g.limiter.check(&self.global_key(req, cx.client_ip())).await {
            return Ok(Some(d));
        }
        g.fallbacks.inc();
        match g.fallback {
            RateLimitFallback::Local => Ok(Some(local())),
            RateLimitFallback::Allow => Ok(None),
            RateLimitFallback::Deny => {
                let mut res = error_response(StatusCode::SERVICE_UNAVAILABLE);
                res.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from(1u32));
                Err(res)
            }
        }
    }

    /// Sets the RateLimit fields of an answer given decision `d`.
    fn add_headers(&self, headers: &mut HeaderMap, d: &Decision) {
        let mut f = |name: &HeaderName, value: HeaderValue| {
            headers.insert(name.clone(), value);
        };
        let full = d.remaining + 1 == self.limiter.capacity();
        match &self.fields {
            Fields::Draft10 {
                policy,
                prefix,
                when_full,
                full_reset,
            } => {
                let reset = ceil_secs(d.reset);
                let now = if full && reset == *full_reset {
                    when_full.clone()
                } else {
                    draft10_value(prefix, d.remaining, reset)
                };
                f(&RATELIMIT, now);
                f(&POLICY, policy.clone());
            }
            Fields::Draft06 {
                limit,
                remaining_when_full,
                policy,
            } => {
                f(&LIMIT, limit.clone());
                let remaining = if full {
                    remaining_when_full.clone()
                } else {
                    number(d.remaining)
                };
                f(&REMAINING, remaining);
                f(&RESET, number(ceil_secs(d.reset)));
                f(&POLICY, policy.clone());
            }
            Fields::None => {}
        }
    }

    fn too_many(&self, d: &Decision) -> Response<Body> {
        self.limited.inc();
        let mut res = error_response(StatusCode::TOO_MANY_REQUESTS);
        let headers = res.headers_mut();
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from(ceil_secs(d.retry_after).max(1)),
        );
        self.add_headers(headers, d);
        res
    }
}

impl RateLimitFilter {
    /// Lets the request through (keeping the decision for the response headers) or refuses it.
    fn apply(&mut self, d: Decision) -> Flow {
        if !d.allowed {
            return Flow::Respond(self.shared.too_many(&d));
        }
        self.decision = Some(d);
        Flow::Continue
    }
}

#[async_trait::async_trait]
impl HttpFilter for RateLimitFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        // Local buckets decide at once; the Redis round trip takes the async hook.
        let shared = &self.shared;
        if shared.global.is_some() {
            return None;
        }
        let key = shared.key(req, || cx.conn.client_hash());
        let d = shared.limiter.check_arrived(key, cx.start);
        Some(Ok(self.apply(d)))
    }

    async fn on_request_headers(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        if let Some(flow) = self.on_request_headers_sync(req, cx) {
            return flow;
        }
        // Boxed: the Redis round trip's state would otherwise sit in every request's future.
        let d = match Box::pin(self.shared.decide(req, cx)).await {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(Flow::Continue),
            Err(refused) => return Ok(Flow::Respond(refused)),
        };
        Ok(self.apply(d))
    }

    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        if let Some(d) = &self.decision {
            self.shared.add_headers(&mut res.headers, d);
        }
        Some(Ok(Flow::Continue))
    }
}

/// The decision for a request of `client` (benchmarks and tests call it without a chain).
pub fn decide(factory: &RateLimitFilterFactory, req: &request::Parts, client: IpAddr) -> Decision {
    let s = &factory.shared;
    s.limiter.check(s.key(req, || client_ip_hash(client)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_as_header_values() {
        for n in [0, 1, 9, 10, 999, SMALL_NUMBERS - 1, SMALL_NUMBERS, 1 << 40] {
            assert_eq!(number(n), HeaderValue::from(n));
        }
    }

    #[test]
    fn policy_names_are_structured_field_strings() {
        assert_eq!(sf_string("api"), "\"api\"");
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("café"), "\"default\"");
    }

    #[test]
    fn interned_values_are_shared_and_checked() {
        let a = interned("\"x\";q=5;w=1".to_owned()).unwrap();
        let b = interned("\"x\";q=5;w=1".to_owned()).unwrap();
        assert_eq!(a, "\"x\";q=5;w=1");
        assert!(
            std::ptr::eq(a.as_bytes(), b.as_bytes()),
            "one copy per text"
        );
        assert!(interned("bad\nvalue".to_owned()).is_err());
    }

    #[test]
    fn draft10_values_match_formatting() {
        for (r, t) in [(0, 0), (7, 1), (999_999, 60), (u64::MAX, u64::MAX)] {
            let v = draft10_value(b"\"api\";r=", r, t);
            assert_eq!(v.to_str().unwrap(), format!("\"api\";r={r};t={t}"));
        }
    }

    /// The fields a response gets, for each `headers:` form, from a full bucket, a used one and
    /// a refusal.
    #[test]
    fn each_form_writes_its_fields() {
        let fields = |form| {
            let shared = Shared {
                limiter: Arc::new(Limiter::new(3, Duration::from_secs(2), 0)),
                key: KeyBy::ClientIp,
                fields: Fields::new(form, "api", 3, 2, Duration::from_millis(666)).unwrap(),
                limited: Registry::new().counter("t", "t", &[]),
                global: None,
            };
            let k = shared.limiter.value_key(b"k");
            (0..4)
                .map(|_| {
                    let mut h = HeaderMap::new();
                    shared.add_headers(&mut h, &shared.limiter.check_at(k, 0));
                    let mut v: Vec<String> = h
                        .iter()
                        .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                        .collect();
                    v.sort();
                    v.join(", ")
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            fields(RateLimitHeaders::Draft10),
            [
                r#"ratelimit-policy: "api";q=3;w=2, ratelimit: "api";r=2;t=1"#,
                r#"ratelimit-policy: "api";q=3;w=2, ratelimit: "api";r=1;t=2"#,
                r#"ratelimit-policy: "api";q=3;w=2, ratelimit: "api";r=0;t=2"#,
                r#"ratelimit-policy: "api";q=3;w=2, ratelimit: "api";r=0;t=2"#,
            ]
        );
        assert_eq!(
            fields(RateLimitHeaders::Draft06),
            [
                "ratelimit-limit: 3, ratelimit-policy: 3;w=2, ratelimit-remaining: 2, ratelimit-reset: 1",
                "ratelimit-limit: 3, ratelimit-policy: 3;w=2, ratelimit-remaining: 1, ratelimit-reset: 2",
                "ratelimit-limit: 3, ratelimit-policy: 3;w=2, ratelimit-remaining: 0, ratelimit-reset: 2",
                "ratelimit-limit: 3, ratelimit-policy: 3;w=2, ratelimit-remaining: 0, ratelimit-reset: 2",
            ]
        );
        assert_eq!(fields(RateLimitHeaders::None), ["", "", "", ""]);
    }
}
