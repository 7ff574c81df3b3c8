//! The native `jwt` filter: a request must carry a JSON Web Token signed by a key of the
//! configured key set, for the configured issuer and audiences, within its validity window.
//! A refused request gets 401 with a `WWW-Authenticate: Bearer` challenge (RFC 6750); an
//! accepted one goes on with its verified claims in [`RequestCx::jwt`] (for later filters,
//! Wasm plugins and the access log) and, as configured, in request headers whose client-sent
//! copies are removed first.
//!
//! Keys come from a [`source::KeySource`] shared across routes and reloads. A token whose key is
//! cached is decided in the synchronous hook; one naming an unknown `kid` (or arriving before
//! the first fetch) waits, bounded, for a refetch. Tokens verified once are remembered (by
//! their full text, with their validity window) so a client repeating its token costs a hash
//! lookup, not a signature check, until the key set changes.

mod keys;
mod source;
pub mod testing;
mod token;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gateway_config::{Jwt, JwtAlgorithm, TokenSource};
use http::header::{AUTHORIZATION, COOKIE, HeaderName, HeaderValue, WWW_AUTHENTICATE};
use http::{StatusCode, request, response};
use serde_json::{Map, Value};

use self::keys::KeySet;
use self::source::KeySource;
use self::token::{Reject, Rules, Token, Window};
use super::{FilterFactory, Flow, HttpFilter};
use crate::body::{Body, BoxError};
use crate::context::RequestCx;
use crate::error::error_response;
use crate::telemetry::LogNotes;
use crate::telemetry::{Counter, Registry};

/// How long a request naming an unknown key waits for the key set to be fetched again.
const REFETCH_WAIT: Duration = Duration::from_secs(3);

/// Most verified tokens remembered per filter; the memory is emptied when full.
const CACHE_CAP: usize = 1024;

/// A request's verified claims.
#[derive(Debug)]
pub struct JwtClaims {
    claims: Map<String, Value>,
    payload: Box<str>,
    subject: Option<Arc<str>>,
}

impl JwtClaims {
    /// A claim by name.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.claims.get(name)
    }

    /// All claims.
    pub fn claims(&self) -> &Map<String, Value> {
        &self.claims
    }

    /// The payload as JSON text.
    pub fn payload(&self) -> &str {
        &self.payload
    }

    /// The `sub` claim, when it is a string.
    pub fn subject(&self) -> Option<&Arc<str>> {
        self.subject.as_ref()
    }

    /// A claim as header or property text: a string as it is, other values as JSON.
    pub fn text(&self, name: &str) -> Option<String> {
        match self.claims.get(name)? {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    }
}

/// A verified token, remembered.
struct Verified {
    claims: Arc<JwtClaims>,
    window: Window,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The key set it was verified with: a new set verifies it again.
    keys: Arc<KeySet>,
}

type Hasher = foldhash::fast::RandomState;

/// Factory for the `jwt` filter.
pub struct JwtFilterFactory {
    shared: Arc<Shared>,
}

struct Shared {
    issuer: Option<String>,
    audiences: Vec<String>,
    algorithms: Vec<JwtAlgorithm>,
    from: TokenSource,
    skew: Duration,
    required: bool,
    claims_to_headers: Vec<(String, HeaderName)>,
    source: Arc<KeySource>,
    cache: Mutex<HashMap<Box<str>, Arc<Verified>, Hasher>>,
    /// `Bearer realm="…"`, for a request without a token.
    challenge: HeaderValue,
    /// Refusals by label.
    refused: Vec<(&'static str, Counter)>,
    ok: Counter,
}

impl JwtFilterFactory {
    /// Builds the filter of `route`; `serve` starts (or joins) the key source's fetching.
    pub fn new(cfg: &Jwt, route: &str, registry: &Registry, serve: bool) -> Result<Self, String> {
        let source = if serve {
            KeySource::get_or_start(&cfg.jwks, cfg.refresh, registry)?
        } else {
            Arc::new(KeySource::new(&cfg.jwks, registry))
        };
        Self::with_source(cfg, route, registry, source)
    }

    fn with_source(
        cfg: &Jwt,
        route: &str,
        registry: &Registry,
        source: Arc<KeySource>,
    ) -> Result<Self, String> {
        let counter = |result| {
            registry.counter(
                "gateway_jwt_requests_total",
                "Requests checked by a jwt filter, by route and result.",
                &[("route", route), ("result", result)],
            )
        };
        let challenge = HeaderValue::from_str(&format!("Bearer realm=\"{}\"", cfg.realm))
            .map_err(|e| format!("realm: {e}"))?;
        let refused = Reject::LABELS
            .iter()
            .map(|&label| (label, counter(label)))
            .collect();
        let claims_to_headers = cfg
            .claims_to_headers
            .iter()
            .map(|(claim, header)| {
                HeaderName::from_bytes(header.as_bytes())
                    .map(|h| (claim.clone(), h))
                    .map_err(|e| format!("header `{header}`: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            shared: Arc::new(Shared {
                issuer: cfg.issuer.clone(),
                audiences: cfg.audiences.clone(),
                algorithms: cfg.algorithms.clone(),
                from: cfg.from.clone(),
                skew: cfg.clock_skew,
                required: cfg.required,
                claims_to_headers,
                source,
                cache: Mutex::new(HashMap::default()),
                challenge,
                refused,
                ok: counter("ok"),
            }),
        })
    }
}

impl FilterFactory for JwtFilterFactory {
    fn name(&self) -> &'static str {
        "jwt"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(JwtFilter {
            shared: self.shared.clone(),
        })
    }

    fn after_response(&self) -> bool {
        false
    }
}

struct JwtFilter {
    shared: Arc<Shared>,
}

/// What the synchronous check decided.
enum Outcome {
    /// Accepted (or let through without a token when not required).
    Pass(Option<Arc<Verified>>),
    /// Refused.
    Refuse(Reject),
    /// The key set may not have the token's key yet: wait for a refetch, then decide.
    Refetch,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Shared {
    /// Checks the request's token; `may_wait` allows [`Outcome::Refetch`].
    fn check(&self, req: &request::Parts, may_wait: bool) -> Outcome {
        let token = match find_token(req, &self.from) {
            Some(t) => t,
            None if self.required => return Outcome::Refuse(Reject::Missing),
            None => {
                self.count(Reject::Missing);
                return Outcome::Pass(None);
            }
        };
        let now = now();
        if let Some(v) = self.cached(&token) {
            return match v.window.check(now, self.skew) {
                Ok(()) => Outcome::Pass(Some(v)),
                Err(r) => Outcome::Refuse(r),
            };
        }
        match self.verify(&token, now) {
            Ok(v) => Outcome::Pass(Some(v)),
            Err(Reject::UnknownKey | Reject::KeysUnavailable) if may_wait => Outcome::Refetch,
            Err(r) => Outcome::Refuse(r),
        }
    }

    fn cached(&self, token: &str) -> Option<Arc<Verified>> {
        let v = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()?;
        let current = self.source.keys()?;
        Arc::ptr_eq(&current, &v.keys).then_some(v)
    }

    fn verify(&self, text: &str, now: f64) -> Result<Arc<Verified>, Reject> {
        let token = Token::parse(text, &self.algorithms)?;
        let keys = self.source.keys().ok_or(Reject::KeysUnavailable)?;
        token.verify(&keys)?;
        let claims = token.claims()?;
        let rules = Rules {
            issuer: self.issuer.as_deref(),
            audiences: &self.audiences,
            skew: self.skew,
        };
        let window = rules.check(&claims, now)?;
        let payload = serde_json::to_string(&claims).unwrap_or_default().into();
        let subject = claims.get("sub").and_then(Value::as_str).map(Arc::from);
        let claims = Arc::new(JwtClaims {
            claims,
            payload,
            subject,
        });
        let headers = self
            .claims_to_headers
            .iter()
            .filter_map(|(claim, name)| {
                let text = claims.text(claim)?;
                // A claim that is no valid header value (a line break...) sets no header.
                HeaderValue::from_str(&text).ok().map(|v| (name.clone(), v))
            })
            .collect();
        let verified = Arc::new(Verified {
            claims,
            window,
            headers,
            keys,
        });
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_CAP {
            cache.clear();
        }
        cache.insert(text.into(), verified.clone());
        Ok(verified)
    }

    /// Applies a decision to the request: headers set from claims (client copies removed
    /// first), or the 401.
    fn finish(&self, outcome: Outcome, req: &mut request::Parts, cx: &mut RequestCx) -> Flow {
        match outcome {
            Outcome::Pass(verified) => {
                for (_, name) in &self.claims_to_headers {
                    req.headers.remove(name);
                }
                if let Some(v) = verified {
                    self.ok.inc();
                    for (name, value) in &v.headers {
                        req.headers.insert(name.clone(), value.clone());
                    }
                    cx.jwt = Some(v.claims.clone());
                }
                Flow::Continue
            }
            Outcome::Refuse(reject) => Flow::Respond(self.refuse(reject)),
            Outcome::Refetch => Flow::Respond(self.refuse(Reject::UnknownKey)),
        }
    }

    fn count(&self, reject: Reject) {
        let label = reject.label();
        if let Some((_, c)) = self.refused.iter().find(|(l, _)| *l == label) {
            c.inc();
        }
    }

    fn refuse(&self, reject: Reject) -> http::Response<Body> {
        self.count(reject);
        let mut res = error_response(StatusCode::UNAUTHORIZED);
        // RFC 6750 §3.1: a request without a token gets the bare challenge, no error code.
        let challenge = if reject == Reject::Missing {
            self.challenge.clone()
        } else {
            let text = format!(
                "{}, error=\"invalid_token\", error_description=\"{}\"",
                self.challenge.to_str().unwrap_or("Bearer"),
                reject.description()
            );
            HeaderValue::from_str(&text).unwrap_or_else(|_| self.challenge.clone())
        };
        res.headers_mut().insert(WWW_AUTHENTICATE, challenge);
        LogNotes::on(res.extensions_mut()).auth = Some(("jwt", reject.label()));
        res
    }
}

/// The token where `from` says, if there is one.
fn find_token<'a>(
    req: &'a request::Parts,
    from: &TokenSource,
) -> Option<std::borrow::Cow<'a, str>> {
    let bearer = |v: &'a str| -> &'a str {
        match v.split_once(' ') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
            _ => v.trim(),
        }
    };
    let token = match from {
        TokenSource::Bearer => {
            let v = req.headers.get(AUTHORIZATION)?.to_str().ok()?;
            let (scheme, rest) = v.split_once(' ')?;
            // Another scheme (Basic...) carries no bearer token.
            if !scheme.eq_ignore_ascii_case("bearer") {
                return None;
            }
            rest.trim()
        }
        TokenSource::Header(name) => bearer(req.headers.get(name.as_str())?.to_str().ok()?),
        TokenSource::Cookie(name) => req
            .headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                (k == name).then(|| v.trim_matches('"'))
            })?,
        TokenSource::Query(name) => {
            let value = req.uri.query()?.split('&').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                (k == name).then_some(v)
            })?;
            if value.contains('%') {
                return percent_decode(value)
                    .filter(|t| !t.is_empty())
                    .map(std::borrow::Cow::Owned);
            }
            value
        }
    };
    (!token.is_empty()).then_some(std::borrow::Cow::Borrowed(token))
}

/// A query value with its `%XX` escapes decoded, when the result is UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[async_trait::async_trait]
impl HttpFilter for JwtFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        match self.shared.check(req, true) {
            Outcome::Refetch => None,
            outcome => Some(Ok(self.shared.finish(outcome, req, cx))),
        }
    }

    async fn on_request_headers(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        let outcome = match self.shared.check(req, true) {
            Outcome::Refetch => {
                self.shared.source.refetched(REFETCH_WAIT).await;
                self.shared.check(req, false)
            }
            outcome => outcome,
        };
        Ok(self.shared.finish(outcome, req, cx))
    }

    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        if let Some(sub) = cx.jwt.as_ref().and_then(|c| c.subject()) {
            LogNotes::on(&mut res.extensions).user = Some(sub.clone());
        }
        Some(Ok(Flow::Continue))
    }
}

/// Untrusted bytes through every parser of the filter, as a token (decoded, verified against a
/// fixed key set, its claims checked) and as a key set: none may panic. The `jwt` fuzz target.
#[cfg(any(test, feature = "fuzzing"))]
pub fn check_untrusted(data: &[u8]) {
    static KEYS: std::sync::OnceLock<KeySet> = std::sync::OnceLock::new();
    let keys = KEYS.get_or_init(|| {
        let key = testing::SigningKey::generate(JwtAlgorithm::Es256, "k");
        KeySet::parse(testing::jwks(&[&key]).as_bytes()).expect("a key set")
    });
    let _ = KeySet::parse(data);
    let text = String::from_utf8_lossy(data);
    if let Ok(token) = Token::parse(&text, &JwtAlgorithm::ALL) {
        let _ = token.verify(keys);
        if let Ok(claims) = token.claims() {
            let audiences = ["a".to_owned()];
            let rules = Rules {
                issuer: Some("i"),
                audiences: &audiences,
                skew: Duration::from_secs(60),
            };
            let _ = rules.check(&claims, 1.0e9);
        }
    }
}

#[cfg(test)]
mod tests;
