//! The native `cache` filter: an RFC 9111 shared cache of a route's answers, in front of any
//! terminal. A fresh hit is a local reply (the terminal never runs); a stale object with a
//! validator is revalidated with `If-None-Match` / `If-Modified-Since`, and a 304 refreshes
//! it; a miss is stored as its body streams through the response-body hook. Concurrent misses
//! for one key send one request upstream: the others wait (bounded) for it and are answered
//! from what it stored. Unsafe methods invalidate the URL's object. The objects live in a named
//! store ([`store`]) that outlives config generations.

mod control;
mod fresh;
mod serve;
pub mod store;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::header::{
    AGE, CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, ETAG, HOST, IF_MODIFIED_SINCE, IF_NONE_MATCH,
    IF_RANGE, LAST_MODIFIED, RANGE, TRANSFER_ENCODING,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode, request, response};
use tokio::time::Instant;

use super::{FilterFactory, Flow, HttpFilter};
use crate::body::BoxError;
use crate::context::RequestCx;
use crate::telemetry::{Counter, Registry};
use control::CacheControl;
use fresh::{Freshness, NotStored};
use gateway_config::{CacheFilter as Settings, CacheKeyPart};
use serve::{CACHE_STATUS, Conditions};
use store::{Fetch, Leader, Object, Store};

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
    hits: Counter,
    misses: Counter,
    revalidations: Counter,
    coalesced: Counter,
    invalidations: Counter,
    not_stored: [Counter; 6],
}

struct Shared {
    store: Arc<Store>,
    key: Vec<CacheKeyPart>,
    default_ttl: Duration,
    max_object_size: usize,
    coalesce_timeout: Duration,
    metrics: Metrics,
}

/// Factory for the `cache` filter.
pub struct CacheFilterFactory {
    shared: Arc<Shared>,
}

impl CacheFilterFactory {
    /// The filter on `store` (from [`store::get_or_insert`]).
    pub fn new(cfg: &Settings, store: Arc<Store>, registry: &Registry) -> Self {
        let name = cfg.settings.store.as_str();
        let counter = |metric: &str, help: &str| registry.counter(metric, help, &[("cache", name)]);
        let not_stored = NOT_STORED.map(|r| {
            registry.counter(
                "gateway_cache_not_stored_total",
                "Answers of cached routes not stored, by cache and reason.",
                &[("cache", name), ("reason", r.label())],
            )
        });
        Self {
            shared: Arc::new(Shared {
                store,
                key: cfg.key.clone(),
                default_ttl: cfg.settings.default_ttl.get(),
                max_object_size: cfg.settings.max_object_size.as_usize(),
                coalesce_timeout: cfg.settings.coalesce_timeout.get(),
                metrics: Metrics {
                    hits: counter(
                        "gateway_cache_hits_total",
                        "Requests answered from the cache without asking the upstream, by cache.",
                    ),
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
            fill: None,
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
    /// `miss` or `request` (the client asked not to be served from the cache).
    fwd: &'static str,
    stale: Option<Arc<Object>>,
    /// The client's conditions, when the gateway put its own on the request.
    conditions: Conditions,
}

/// An answer streaming into the store.
struct Fill {
    fetching: Box<Fetching>,
    status: StatusCode,
    headers: HeaderMap,
    freshness: Freshness,
    body: BytesMut,
    expected: Option<u64>,
}

struct CacheFilter {
    shared: Arc<Shared>,
    step: Step,
    /// Held while this request fetches an object others may wait for.
    leader: Option<Leader>,
    fill: Option<Fill>,
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
                    for c in host.unwrap_or("").chars() {
                        k.push(c.to_ascii_lowercase());
                    }
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

    fn not_stored(&self, r: NotStored) {
        if let Some(i) = NOT_STORED.iter().position(|x| *x == r) {
            self.metrics.not_stored[i].inc();
        }
    }
}

/// The stored form of an answer's head: without what is set when it is served and what
/// belongs to one connection.
fn stored_head(h: &HeaderMap) -> HeaderMap {
    let mut h = h.clone();
    for name in [AGE, CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION] {
        h.remove(name);
    }
    h.remove(&CACHE_STATUS);
    h
}

fn set_status(h: &mut HeaderMap, status: &str) {
    if let Ok(v) = HeaderValue::from_str(status) {
        h.insert(CACHE_STATUS.clone(), v);
    }
}

/// The Cache-Status of a hit: `ttl` is what is left of its freshness (negative when stale).
fn hit_status(obj: &Object, now: Instant, detail: Option<&str>) -> String {
    let left = obj.lifetime.as_secs() as i64 - obj.age(now).as_secs() as i64;
    let mut s = format!("gateway; hit; ttl={left}");
    if let Some(d) = detail {
        let _ = write!(s, "; detail={d}");
    }
    s
}

impl CacheFilter {
    async fn request(&mut self, req: &mut request::Parts, cx: &RequestCx) -> Flow {
        let head = match req.method {
            Method::GET => false,
            Method::HEAD => true,
            Method::OPTIONS | Method::TRACE => return Flow::Continue,
            _ => {
                let method = std::mem::replace(&mut req.method, Method::GET);
                self.step = Step::Invalidate(self.shared.primary(req, cx));
                req.method = method;
                return Flow::Continue;
            }
        };
        let shared = self.shared.clone();
        let request_cc = CacheControl::parse(req.headers.get_all(CACHE_CONTROL));
        if request_cc.no_store {
            self.step = Step::Pass("request");
            return Flow::Continue;
        }
        let bypass = request_cc.no_cache || request_cc.max_age == Some(0);
        let primary = shared.primary(req, cx);
        let mut cached = (!bypass)
            .then(|| shared.store.get(&primary, &req.headers))
            .flatten();
        let mut coalesced = false;
        if cached.is_none() && !bypass && !head && !Conditions::conditional(&req.headers) {
            match shared.store.fetch(&primary) {
                Fetch::Lead(l) => self.leader = Some(l),
                Fetch::Wait(mut done) => {
                    shared.metrics.coalesced.inc();
                    // Ends when the leader's fetch does (its sender goes), or at the bound.
                    let _ = tokio::time::timeout(shared.coalesce_timeout, done.changed()).await;
                    cached = shared.store.get(&primary, &req.headers);
                    coalesced = true;
                    if let (None, Fetch::Lead(l)) = (&cached, shared.store.fetch(&primary)) {
                        self.leader = Some(l);
                    }
                }
            }
        }
        let now = Instant::now();
        let mut fetching = Box::new(Fetching {
            primary,
            request: req.headers.clone(),
            request_cc,
            path: req.uri.path().to_owned(),
            head,
            fwd: if bypass { "request" } else { "miss" },
            stale: None,
            conditions: Conditions::default(),
        });
        if let Some(obj) = cached {
            if obj.fresh(now) {
                shared.metrics.hits.inc();
                let status = hit_status(&obj, now, coalesced.then_some("coalesced"));
                let cond = Conditions::of(&req.headers);
                return Flow::Respond(serve::answer(&obj, now, head, &cond, &status));
            }
            let etag = obj.headers.get(ETAG).cloned();
            let modified = obj.headers.get(LAST_MODIFIED).cloned();
            if etag.is_some() || modified.is_some() {
                shared.metrics.revalidations.inc();
                fetching.conditions = Conditions::take(&mut req.headers);
                if let Some(e) = etag {
                    req.headers.insert(IF_NONE_MATCH, e);
                } else if let Some(m) = modified {
                    req.headers.insert(IF_MODIFIED_SINCE, m);
                }
                fetching.fwd = "stale";
                fetching.stale = Some(obj);
                self.step = Step::Fetch(fetching);
                return Flow::Continue;
            }
        }
        shared.metrics.misses.inc();
        if !head {
            // The whole object is fetched and stored; a later range is answered from it.
            req.headers.remove(RANGE);
            req.headers.remove(IF_RANGE);
        }
        self.step = Step::Fetch(fetching);
        Flow::Continue
    }

    fn response(&mut self, res: &mut response::Parts) -> Flow {
        let shared = self.shared.clone();
        match std::mem::replace(&mut self.step, Step::Pass("method")) {
            Step::Pass(fwd) => set_status(&mut res.headers, &format!("gateway; fwd={fwd}")),
            Step::Invalidate(primary) => {
                if res.status.is_success() || res.status.is_redirection() {
                    let n = shared.store.remove(&primary);
                    shared.metrics.invalidations.add(n as u64);
                }
                set_status(&mut res.headers, "gateway; fwd=method");
            }
            Step::Fetch(f) => return self.fetched(f, res),
        }
        Flow::Continue
    }

    /// The upstream's answer to a fetch: a 304 refreshes the stale object and answers from
    /// it; a storable answer starts filling the store.
    fn fetched(&mut self, f: Box<Fetching>, res: &mut response::Parts) -> Flow {
        let shared = self.shared.clone();
        let now_sys = SystemTime::now();
        if let (Some(stale), StatusCode::NOT_MODIFIED) = (&f.stale, res.status) {
            // The 304's fields replace the stored ones of the same name (RFC 9111 §3.2).
            let mut headers = stale.headers.clone();
            let fresh_head = stored_head(&res.headers);
            for name in fresh_head.keys() {
                headers.remove(name);
            }
            for (name, value) in &fresh_head {
                headers.append(name, value.clone());
            }
            let status = "gateway; fwd=stale; fwd-status=304";
            let decided = fresh::decide(
                &f.request,
                &f.request_cc,
                stale.status,
                &headers,
                shared.default_ttl,
                now_sys,
            );
            let obj = Object {
                status: stale.status,
                headers,
                body: stale.body.clone(),
                path: f.path.clone(),
                stored: Instant::now(),
                initial_age: decided.as_ref().map_or(Duration::ZERO, |d| d.initial_age),
                lifetime: decided.as_ref().map_or(Duration::ZERO, |d| d.lifetime),
                always_revalidate: decided.as_ref().map_or(true, |d| d.always_revalidate),
                vary: decided
                    .as_ref()
                    .map_or_else(|_| stale.vary.clone(), |d| d.vary.clone()),
            };
            let reply = serve::answer(&obj, Instant::now(), f.head, &f.conditions, status);
            match decided {
                Ok(_) => {
                    shared.store.put(&f.primary, &f.request, obj);
                }
                Err(r) => {
                    shared.store.remove(&f.primary);
                    shared.not_stored(r);
                }
            }
            return Flow::Respond(reply);
        }
        let fwd = f.fwd;
        let with_status = |extra: &str| {
            if fwd == "stale" {
                format!(
                    "gateway; fwd=stale; fwd-status={}{extra}",
                    res.status.as_u16()
                )
            } else {
                format!("gateway; fwd={fwd}{extra}")
            }
        };
        if f.head || f.request.contains_key(RANGE) && res.status == StatusCode::PARTIAL_CONTENT {
            set_status(&mut res.headers, &with_status(""));
            self.leader = None;
            return Flow::Continue;
        }
        let decided = fresh::decide(
            &f.request,
            &f.request_cc,
            res.status,
            &res.headers,
            shared.default_ttl,
            now_sys,
        )
        .and_then(|fr| {
            let declared = res
                .headers
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > shared.max_object_size as u64) {
                return Err(NotStored::TooLarge);
            }
            Ok((fr, declared))
        });
        match decided {
            Ok((freshness, expected)) => {
                let status = with_status("; stored");
                res.headers
                    .insert(AGE, HeaderValue::from(freshness.initial_age.as_secs()));
                self.fill = Some(Fill {
                    status: res.status,
                    headers: stored_head(&res.headers),
                    fetching: f,
                    freshness,
                    body: BytesMut::new(),
                    expected,
                });
                set_status(&mut res.headers, &status);
            }
            Err(r) => {
                shared.not_stored(r);
                let status = with_status(&format!("; detail={}", r.label()));
                set_status(&mut res.headers, &status);
                self.leader = None;
            }
        }
        Flow::Continue
    }

    fn body(&mut self, chunk: Option<&Bytes>, eos: bool) {
        let Some(fill) = self.fill.as_mut() else {
            return;
        };
        if let Some(c) = chunk {
            if fill.body.len() + c.len() > self.shared.max_object_size {
                self.fill = None;
                self.leader = None;
                self.shared.not_stored(NotStored::TooLarge);
                return;
            }
            fill.body.extend_from_slice(c);
        }
        if !eos {
            return;
        }
        let Some(fill) = self.fill.take() else { return };
        if fill.expected.is_some_and(|n| n != fill.body.len() as u64) {
            self.shared.not_stored(NotStored::Truncated);
        } else {
            let f = fill.fetching;
            let obj = Object {
                status: fill.status,
                headers: fill.headers,
                body: fill.body.freeze(),
                path: f.path,
                stored: Instant::now(),
                initial_age: fill.freshness.initial_age,
                lifetime: fill.freshness.lifetime,
                always_revalidate: fill.freshness.always_revalidate,
                vary: fill.freshness.vary,
            };
            if !self.shared.store.put(&f.primary, &f.request, obj) {
                self.shared.not_stored(NotStored::TooLarge);
            }
        }
        self.leader = None;
    }
}

#[async_trait::async_trait]
impl HttpFilter for CacheFilter {
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
        self.leader = None;
        true
    }
}
