//! The native `cache` filter: an RFC 9111 shared cache of a route's answers, in front of any
//! terminal. A fresh hit is a local reply (the terminal never runs); a stale object with a
//! validator is revalidated with `If-None-Match` / `If-Modified-Since`, and a 304 refreshes
//! it; a miss is stored as its body streams through the response-body hook. Concurrent misses
//! for one key send one request upstream: the others wait (bounded) for its head and stream
//! its body as it arrives ([`flight`]), or are answered from what it stored. Within
//! `stale-while-revalidate` a stale object is served at once and revalidated in the background (`revalidate.rs`); within `stale-if-error` it stands in for an
//! upstream that fails. Unsafe methods invalidate the URL's object. The objects live in a named
//! store ([`store`]) that outlives config generations, in memory and, when configured, on disk
//! ([`disk`]).

mod answer;
mod control;
pub mod disk;
mod flight;
mod fresh;
mod lookup;
mod metrics;
mod revalidate;
mod serve;
pub mod store;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::header::{
    AGE, CONNECTION, CONTENT_LENGTH, ETAG, HOST, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED,
    SET_COOKIE, TRANSFER_ENCODING,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode, request, response};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{FilterFactory, Flow, HttpFilter};
use crate::body::BoxError;
use crate::context::RequestCx;
use crate::telemetry::LogNotes;
use crate::telemetry::{Counter, Registry};
use crate::terminal::Terminal;
use control::CacheControl;
use fresh::{Defaults, Freshness, NotStored};
use gateway_config::model::CacheSetCookie;
use gateway_config::{CacheFilter as Settings, CacheKeyPart};
use serve::CACHE_STATUS;
use store::{Leader, Object, Payload, Store, Tier};

/// An answer with its outcome for the access log ([`LogNotes::cache`]).
fn with_outcome(mut res: http::Response<crate::body::Body>, outcome: &'static str) -> Flow {
    LogNotes::on(res.extensions_mut()).cache = Some(outcome);
    Flow::Respond(res)
}

/// Reasons an answer was not stored, in the order of [`NotStored`]'s counters.
const NOT_STORED: [NotStored; 6] = [
    NotStored::Forbidden,
    NotStored::Cookie,
    NotStored::Vary,
    NotStored::Uncacheable,
    NotStored::TooLarge,
    NotStored::Truncated,
];

struct Metrics {
    /// By the tier the object was found in: memory, disk.
    hits: [Counter; 2],
    misses: Counter,
    revalidations: Counter,
    coalesced: Counter,
    invalidations: Counter,
    not_stored: [Counter; 6],
    stale_while_revalidate: Counter,
    stale_if_error: Counter,
}

impl Metrics {
    /// Counts a hit on an object found in `tier`.
    fn hit(&self, tier: Tier) {
        self.hits[(tier == Tier::Disk) as usize].inc();
    }
}

struct Shared {
    store: Arc<Store>,
    key: Vec<CacheKeyPart>,
    defaults: Defaults,
    max_object_size: usize,
    coalesce_timeout: Duration,
    /// The route's terminal, for background revalidations.
    terminal: Terminal,
    metrics: Metrics,
}

/// Factory for the `cache` filter.
pub struct CacheFilterFactory {
    shared: Arc<Shared>,
}

impl CacheFilterFactory {
    /// The filter on `store` (from [`store::get_or_insert`]) in front of `terminal`.
    pub fn new(cfg: &Settings, store: Arc<Store>, terminal: Terminal, registry: &Registry) -> Self {
        let name = cfg.settings.store.as_str();
        let counter = |metric: &str, help: &str| registry.counter(metric, help, &[("cache", name)]);
        let not_stored = NOT_STORED.map(|r| {
            registry.counter(
                "gateway_cache_not_stored_total",
                "Answers of cached routes not stored, by cache and reason.",
                &[("cache", name), ("reason", r.label())],
            )
        });
        let stale = |reason| {
            registry.counter(
                "gateway_cache_stale_total",
                "Stale objects served, by cache and reason (while_revalidate, if_error).",
                &[("cache", name), ("reason", reason)],
            )
        };
        Self {
            shared: Arc::new(Shared {
                store,
                key: cfg.key.clone(),
                defaults: Defaults {
                    ttl: cfg.settings.default_ttl.get(),
                    stale_while_revalidate: cfg.settings.stale_while_revalidate.get(),
                    stale_if_error: cfg.settings.stale_if_error.get(),
                    store_without_cookies: cfg.settings.set_cookie == CacheSetCookie::Strip,
                },
                terminal,
                max_object_size: cfg.settings.max_object_size.as_usize(),
                coalesce_timeout: cfg.settings.coalesce_timeout.get(),
                metrics: Metrics {
                    hits: ["memory", "disk"].map(|tier| {
                        registry.counter(
                            "gateway_cache_hits_total",
                            "Requests answered from the cache without asking the upstream, by cache and the tier the object was found in.",
                            &[("cache", name), ("tier", tier)],
                        )
                    }),
                    misses: counter(
                        "gateway_cache_misses_total",
                        "GET and HEAD requests the cache had no usable object for, by cache.",
                    ),
                    revalidations: counter(
                        "gateway_cache_revalidations_total",
                        "Stale objects revalidated with the upstream, by cache.",
                    ),
                    coalesced: counter(
                        "gateway_cache_coalesced_total",
                        "Requests that waited for another request's fetch of the same object, by cache.",
                    ),
                    invalidations: counter(
                        "gateway_cache_invalidations_total",
                        "Objects removed because an unsafe method changed their URL, by cache.",
                    ),
                    not_stored,
                    stale_while_revalidate: stale("while_revalidate"),
                    stale_if_error: stale("if_error"),
                },
            }),
        }
    }
}

impl FilterFactory for CacheFilterFactory {
    fn name(&self) -> &'static str {
        "cache"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(CacheFilter {
            shared: self.shared.clone(),
            step: Step::Pass("method"),
            leader: None,
            waiting: None,
            fill: None,
            flight: None,
        })
    }

    fn response_body(&self) -> bool {
        true
    }
}

/// What a request does with the cache.
enum Step {
    /// Not served from the cache nor stored: Cache-Status `fwd=` this.
    Pass(&'static str),
    /// An unsafe method: the URL's object goes when the answer is a success.
    Invalidate(String),
    /// Asks the upstream, to store its answer; with the stale object being revalidated.
    Fetch(Box<Fetching>),
}

struct Fetching {
    primary: String,
    /// The request's headers as the client sent them (variants, `Authorization`).
    request: HeaderMap,
    request_cc: CacheControl,
    path: String,
    head: bool,
    /// `miss`, `stale` (revalidating `stale`) or `request` (the client asked not to be
    /// served from the cache).
    fwd: &'static str,
    /// The object being revalidated.
    stale: Option<Arc<Object>>,
    /// The object served instead of an upstream failure (`stale-if-error`).
    fallback: Option<Arc<Object>>,
}

/// A GET or HEAD as looked up in the store.
struct Lookup {
    primary: String,
    request_cc: CacheControl,
    head: bool,
    /// The client asked not to be served from the cache (`no-cache`, `max-age=0`).
    bypass: bool,
    /// It waited for another request's fetch.
    coalesced: bool,
    /// Where the object was found.
    tier: Tier,
}

impl Lookup {
    /// The fetch of this request (`req` as the client sent it).
    fn fetching(&self, req: &request::Parts, fwd: &'static str) -> Box<Fetching> {
        Box::new(Fetching {
            primary: self.primary.clone(),
            request: req.headers.clone(),
            request_cc: self.request_cc.clone(),
            path: req.uri.path().to_owned(),
            head: self.head,
            fwd,
            stale: None,
            fallback: None,
        })
    }
}

/// What a request waits for before it is decided.
enum Pending {
    /// Another request's fetch of its object.
    Fetch(watch::Receiver<Option<Arc<flight::Flight>>>, Lookup),
    /// Its object, read from the disk tier.
    Disk(Lookup),
}

/// An answer streaming into the store.
struct Fill {
    fetching: Box<Fetching>,
    status: StatusCode,
    headers: HeaderMap,
    freshness: Freshness,
    /// The body so far, while it may go to memory.
    body: BytesMut,
    /// Body bytes received.
    received: u64,
    /// Past this many bytes it is too large for the memory tier.
    memory_bound: u64,
    /// Where the body goes once it is too large for memory.
    disk: Option<disk::DiskFill>,
    expected: Option<u64>,
}

struct CacheFilter {
    shared: Arc<Shared>,
    step: Step,
    /// Held while this request fetches an object others may wait for.
    leader: Option<Leader>,
    /// Set while this request must wait: for another one's fetch of its object, or for its
    /// object to be read from disk.
    waiting: Option<Box<Pending>>,
    fill: Option<Fill>,
    /// The body as the requests coalesced on this one's fetch read it, while they may.
    flight: Option<flight::FlightWriter>,
}

impl Shared {
    /// The primary key of a request (`HEAD` counts as `GET`).
    fn primary(&self, req: &request::Parts, cx: &RequestCx) -> String {
        let mut k = String::with_capacity(64);
        for part in &self.key {
            match part {
                CacheKeyPart::Method => k.push_str(match req.method {
                    Method::HEAD => "GET",
                    ref m => m.as_str(),
                }),
                CacheKeyPart::Scheme => k.push_str(cx.scheme()),
                CacheKeyPart::Host => {
                    let host = req
                        .uri
                        .authority()
                        .map(|a| a.as_str())
                        .or_else(|| req.headers.get(HOST).and_then(|h| h.to_str().ok()));
                    let from = k.len();
                    k.push_str(host.unwrap_or(""));
                    k[from..].make_ascii_lowercase();
                }
                CacheKeyPart::Path => k.push_str(req.uri.path()),
                CacheKeyPart::Query => k.push_str(req.uri.query().unwrap_or("")),
                CacheKeyPart::Header(name) => {
                    for v in req.headers.get_all(name.as_str()) {
                        k.push_str(&String::from_utf8_lossy(v.as_bytes()));
                        k.push(',');
                    }
                }
            }
            k.push('\n');
        }
        k
    }

    /// `stale` refreshed by a 304's head (its fields replace the stored ones of the same name,
    /// RFC 9111 §3.2), stored again when it still may be, removed otherwise.
    fn refresh(&self, stale: &Object, head: &HeaderMap, f: &Fetching, now: SystemTime) -> Object {
        let mut headers = stale.headers.clone();
        let update = stored_head(head);
        for name in update.keys() {
            headers.remove(name);
        }
        for (name, value) in &update {
            headers.append(name, value.clone());
        }
        let decided = fresh::decide(
            &f.request,
            &f.request_cc,
            stale.status,
            &headers,
            &self.defaults,
            now,
        );
        let never = Freshness {
            lifetime: Duration::ZERO,
            initial_age: Duration::ZERO,
            always_revalidate: true,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
            vary: stale.vary.clone(),
        };
        let fresh = decided.as_ref().unwrap_or(&never);
        let obj = object(stale.status, headers, stale.body.clone(), &f.path, fresh);
        match decided {
            Ok(_) => {
                let again = object(
                    obj.status,
                    obj.headers.clone(),
                    obj.body.clone(),
                    &f.path,
                    fresh,
                );
                self.store.put(&f.primary, &f.request, again);
            }
            Err(r) => {
                self.store.remove(&f.primary);
                self.not_stored(r);
            }
        }
        obj
    }

    fn not_stored(&self, r: NotStored) {
        if let Some(i) = NOT_STORED.iter().position(|x| *x == r) {
            self.metrics.not_stored[i].inc();
        }
    }
}

/// A stored object made of an answer.
fn object(
    status: StatusCode,
    headers: HeaderMap,
    body: Payload,
    path: &str,
    fresh: &Freshness,
) -> Object {
    Object {
        status,
        headers,
        body,
        path: path.to_owned(),
        stored: Instant::now(),
        initial_age: fresh.initial_age,
        lifetime: fresh.lifetime,
        always_revalidate: fresh.always_revalidate,
        stale_while_revalidate: fresh.stale_while_revalidate,
        stale_if_error: fresh.stale_if_error,
        vary: fresh.vary.clone(),
    }
}

/// The conditional header that revalidates `obj`: its ETag, else its Last-Modified.
fn validator(obj: &Object) -> Option<(http::HeaderName, HeaderValue)> {
    if let Some(e) = obj.headers.get(ETAG) {
        return Some((IF_NONE_MATCH, e.clone()));
    }
    let m = obj.headers.get(LAST_MODIFIED)?;
    Some((IF_MODIFIED_SINCE, m.clone()))
}

/// The stored form of an answer's head: without what is set when it is served, what belongs
/// to one connection, and `Set-Cookie` (one client's cookie must never reach another, not even
/// through a 304 that refreshes a stored object). The values are copied into one block they
/// are slices of: a parsed value may be a slice of the connection's read buffer, which a stored
/// object would otherwise keep alive whole, and a block per value would cost an allocation
/// (and its shared count) each.
fn stored_head(h: &HeaderMap) -> HeaderMap {
    let kept = |name: &http::HeaderName| {
        !(matches!(
            *name,
            AGE | CONTENT_LENGTH | TRANSFER_ENCODING | CONNECTION | SET_COOKIE
        ) || name == CACHE_STATUS)
    };
    let (mut fields, mut len) = (0, 0);
    for (name, value) in h {
        if kept(name) {
            fields += 1;
            len += value.len();
        }
    }
    let mut block = Vec::with_capacity(len);
    for (name, value) in h {
        if kept(name) {
            block.extend_from_slice(value.as_bytes());
        }
    }
    let block = Bytes::from(block);
    let mut out = HeaderMap::with_capacity(fields);
    let mut at = 0;
    for (name, value) in h {
        if !kept(name) {
            continue;
        }
        let piece = block.slice(at..at + value.len());
        at += value.len();
        let mut copy = HeaderValue::from_maybe_shared(piece).unwrap_or_else(|_| value.clone());
        copy.set_sensitive(value.is_sensitive());
        out.append(name.clone(), copy);
    }
    out
}

fn set_status(h: &mut HeaderMap, status: &str) {
    if let Ok(v) = HeaderValue::from_str(status) {
        h.insert(CACHE_STATUS.clone(), v);
    }
}

/// The Cache-Status of a hit on an object fresh for `lifetime` and `age` old: `ttl` is what is
/// left of its freshness (negative when stale). Written by hand into the value's own buffer: a
/// hit is the cache's hot path.
fn hit_status(lifetime: Duration, age: Duration, detail: Option<&str>) -> HeaderValue {
    let left = lifetime.as_secs() as i64 - age.as_secs() as i64;
    let mut text = Vec::with_capacity(64);
    text.extend_from_slice(b"gateway; hit; ttl=");
    if left < 0 {
        text.push(b'-');
    }
    crate::ip_text::push_decimal(&mut text, left.unsigned_abs());
    if let Some(d) = detail {
        text.extend_from_slice(b"; detail=");
        text.extend_from_slice(d.as_bytes());
    }
    HeaderValue::from_maybe_shared(Bytes::from(text))
        .unwrap_or_else(|_| HeaderValue::from_static("gateway; hit"))
}

/// Untrusted bytes through every parser of the filter, as `Cache-Control`, `Expires`, `Age`,
/// `Vary`, `If-None-Match`, `If-Modified-Since`, `Range` and `If-Range` of a request and of an
/// answer, and the answer made from them: none may panic. The `cache_control` fuzz target.
#[cfg(any(test, feature = "fuzzing"))]
pub fn check_untrusted(data: &[u8]) {
    let Ok(v) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut h = HeaderMap::new();
    for name in [
        http::header::CACHE_CONTROL,
        http::header::EXPIRES,
        http::header::DATE,
        AGE,
        http::header::VARY,
        ETAG,
        LAST_MODIFIED,
        IF_NONE_MATCH,
        IF_MODIFIED_SINCE,
        http::header::RANGE,
        http::header::IF_RANGE,
    ] {
        h.insert(name, v.clone());
    }
    let cc = CacheControl::parse([&v]);
    let defaults = Defaults::default();
    let now = SystemTime::now();
    if let Ok(fresh) = fresh::decide(&h, &cc, StatusCode::OK, &h, &defaults, now) {
        let obj = object(
            StatusCode::OK,
            h.clone(),
            Payload::Memory(Bytes::from_static(b"0123456789")),
            "/",
            &fresh,
        );
        let _ = serve::answer(
            &obj,
            Instant::now(),
            false,
            &serve::Conditions::of(&h),
            HeaderValue::from_static("gateway; hit"),
        );
        let _ = store::variant(&obj.vary, &h);
    }
}

#[async_trait::async_trait]
impl HttpFilter for CacheFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        self.request_now(req, cx).map(Ok)
    }

    async fn on_request_headers(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        Ok(self.request(req, cx).await)
    }

    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        Some(Ok(self.response(res)))
    }

    fn on_response_body_sync(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        _cx: &mut RequestCx,
    ) -> Option<Result<(), BoxError>> {
        self.body(chunk.as_ref(), eos);
        Some(Ok(()))
    }

    fn on_log_sync(&mut self, _cx: &RequestCx, _status: StatusCode) -> bool {
        // A body that failed or was abandoned midway never reached its end.
        if self.fill.take().is_some() {
            self.shared.not_stored(NotStored::Truncated);
        }
        self.flight = None;
        self.leader = None;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_head_keeps_no_cookie_and_nothing_of_one_connection() {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("set-cookie", "id=1"),
            ("set-cookie", "b=2"),
            ("age", "3"),
            ("content-length", "9"),
            ("connection", "keep-alive"),
            ("etag", "\"e\""),
            ("vary", "accept"),
        ] {
            h.append(
                http::HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let stored = stored_head(&h);
        let names: Vec<_> = stored.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["etag", "vary"]);
    }
}
