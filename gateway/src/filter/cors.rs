//! The native `cors` filter: the CORS protocol of the Fetch standard, answered at the gateway.
//! A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) gets a 204 here
//! and never reaches the terminal: with the CORS headers when its origin and method are
//! allowed, without any otherwise (the browser then refuses the request), which is Envoy's
//! answer with `forward_not_matching_preflights: false`. Other requests go on; the answer
//! (from the terminal, or a later filter's local reply such as a 401) gets
//! `Access-Control-Allow-Origin` and the rest when the origin is allowed. Every answer of the
//! route carries `Vary: Origin` unless `*` is the policy, since it then does not depend on
//! the origin. Origins are matched by patterns compiled at load and every header value is
//! built then.

use std::sync::Arc;

use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, HeaderMap, HeaderValue, ORIGIN,
    VARY,
};
use http::{Method, Response, StatusCode, request, response};

use super::{FilterFactory, Flow, HttpFilter};
use crate::body::{Body, BoxError};
use crate::context::RequestCx;
use crate::telemetry::LogNotes;
use crate::telemetry::{Counter, Registry};
use gateway_config::cors::{Origin, OriginPattern};
use gateway_config::model::CorsConfig;

/// The policy compiled from config.
struct Policy {
    origins: Vec<OriginPattern>,
    /// The exact entries of `origins` as browsers serialize an origin (lowercase scheme and
    /// host, the port only when written): an `Origin` equal to one of them is allowed without
    /// being parsed.
    exact: Vec<Box<[u8]>>,
    /// `*` is allowed (never with credentials): answers say `*`, not the origin.
    star: bool,
    methods: Vec<String>,
    any_method: bool,
    allow_methods: Option<HeaderValue>,
    any_header: bool,
    allow_headers: Option<HeaderValue>,
    expose_headers: Option<HeaderValue>,
    max_age: Option<HeaderValue>,
    credentials: bool,
    preflights_allowed: Counter,
    preflights_denied: Counter,
    denied: Counter,
}

/// Factory for the `cors` filter.
pub struct CorsFilterFactory {
    policy: Arc<Policy>,
}

impl CorsFilterFactory {
    /// Compiles the policy of the filter on route `route`.
    pub fn new(route: &str, cfg: &CorsConfig, registry: &Registry) -> Result<Self, String> {
        let origins = cfg
            .allow_origins
            .iter()
            .map(|o| OriginPattern::parse(o))
            .collect::<Result<Vec<_>, _>>()?;
        let star = origins.contains(&OriginPattern::Any);
        let exact = origins
            .iter()
            .filter_map(|p| match p {
                OriginPattern::Exact { scheme, host, port } => Some(
                    match port {
                        Some(port) => format!("{scheme}://{host}:{port}"),
                        None => format!("{scheme}://{host}"),
                    }
                    .into_bytes()
                    .into_boxed_slice(),
                ),
                _ => None,
            })
            .collect();
        if star && cfg.allow_credentials {
            return Err("`*` cannot be used with credentials".into());
        }
        let methods: Vec<String> = cfg
            .allow_methods
            .iter()
            .map(|m| m.to_ascii_uppercase())
            .collect();
        let any_method = methods.iter().any(|m| m == "*");
        let headers: Vec<String> = cfg
            .allow_headers
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let any_header = headers.iter().any(|h| h == "*");
        let preflights = |result| {
            registry.counter(
                "gateway_cors_preflights_total",
                "CORS preflights answered by the gateway, by route and result (allowed, denied).",
                &[("route", route), ("result", result)],
            )
        };
        Ok(Self {
            policy: Arc::new(Policy {
                origins,
                exact,
                star,
                allow_methods: (!any_method).then(|| list(&methods)).transpose()?.flatten(),
                methods,
                any_method,
                allow_headers: (!any_header).then(|| list(&headers)).transpose()?.flatten(),
                any_header,
                expose_headers: list(&cfg.expose_headers)?,
                max_age: cfg.max_age.map(|d| HeaderValue::from(d.get().as_secs())),
                credentials: cfg.allow_credentials,
                preflights_allowed: preflights("allowed"),
                preflights_denied: preflights("denied"),
                denied: registry.counter(
                    "gateway_cors_denied_total",
                    "Requests (not preflights) whose Origin the cors filter does not allow, by route.",
                    &[("route", route)],
                ),
            }),
        })
    }
}

/// A comma-separated header value; `None` for an empty list.
fn list<S: AsRef<str>>(items: &[S]) -> Result<Option<HeaderValue>, String> {
    if items.is_empty() {
        return Ok(None);
    }
    let joined = items
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(", ");
    HeaderValue::from_str(&joined)
        .map(Some)
        .map_err(|e| format!("`{joined}`: {e}"))
}

const SAFELISTED_METHODS: [&str; 3] = ["GET", "HEAD", "POST"];
const VARY_ORIGIN: HeaderValue = HeaderValue::from_static("Origin");
const VARY_PREFLIGHT: HeaderValue =
    HeaderValue::from_static("Access-Control-Request-Method, Access-Control-Request-Headers");
const TRUE: HeaderValue = HeaderValue::from_static("true");
const STAR: HeaderValue = HeaderValue::from_static("*");

impl Policy {
    fn allows(&self, origin: &HeaderValue) -> bool {
        if self.star || self.exact.iter().any(|e| **e == *origin.as_bytes()) {
            return true;
        }
        let Some(origin) = origin.to_str().ok().and_then(Origin::parse) else {
            return false;
        };
        self.origins.iter().any(|p| p.matches(&origin))
    }

    /// Whether a preflight may ask for `method`, a single token (it may be echoed).
    fn allows_method(&self, method: &HeaderValue) -> bool {
        let Ok(m) = method.to_str() else {
            return false;
        };
        !m.contains(',')
            && is_token_list(m.as_bytes())
            && (self.any_method
                || SAFELISTED_METHODS.contains(&m)
                || self.methods.iter().any(|c| c == m))
    }

    /// `Access-Control-Allow-Origin` for an allowed origin.
    fn allow_origin(&self, origin: &HeaderValue) -> HeaderValue {
        if self.star { STAR } else { origin.clone() }
    }

    /// The headers every allowed answer carries.
    fn decorate(&self, h: &mut HeaderMap, origin: &HeaderValue) {
        h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, self.allow_origin(origin));
        if self.credentials {
            h.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE);
        }
    }

    /// The answer to a preflight.
    fn preflight(
        &self,
        req: &request::Parts,
        origin: &HeaderValue,
        method: &HeaderValue,
    ) -> Response<Body> {
        let mut res = Response::new(Body::empty());
        *res.status_mut() = StatusCode::NO_CONTENT;
        LogNotes::on(res.extensions_mut()).cors = Some("preflight");
        let h = res.headers_mut();
        if !self.star {
            h.append(VARY, VARY_ORIGIN);
        }
        if !(self.allows(origin) && self.allows_method(method)) {
            self.preflights_denied.inc();
            return res;
        }
        self.preflights_allowed.inc();
        self.decorate(h, origin);
        if self.any_method || self.any_header {
            h.append(VARY, VARY_PREFLIGHT);
        }
        match &self.allow_methods {
            Some(v) => h.insert(ACCESS_CONTROL_ALLOW_METHODS, v.clone()),
            None => h.insert(ACCESS_CONTROL_ALLOW_METHODS, method.clone()),
        };
        let asked = req.headers.get(ACCESS_CONTROL_REQUEST_HEADERS);
        if let Some(v) = &self.allow_headers {
            h.insert(ACCESS_CONTROL_ALLOW_HEADERS, v.clone());
        } else if self.any_header
            && let Some(asked) = asked.filter(|v| is_token_list(v.as_bytes()))
        {
            // `*` would not cover `Authorization` (Fetch), nor anything with credentials: the
            // list asked for is echoed instead.
            h.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
        }
        if let Some(v) = &self.max_age {
            h.insert(ACCESS_CONTROL_MAX_AGE, v.clone());
        }
        res
    }
}

/// A comma-separated list of header names (what `Access-Control-Request-Headers` holds).
fn is_token_list(v: &[u8]) -> bool {
    v.split(|&b| b == b',').all(|item| {
        let item = item.trim_ascii();
        !item.is_empty()
            && item
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
    })
}

impl FilterFactory for CorsFilterFactory {
    fn name(&self) -> &'static str {
        "cors"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(CorsFilter {
            policy: self.policy.clone(),
            origin: None,
            denied: false,
        })
    }

    fn after_response(&self) -> bool {
        false
    }
}

struct CorsFilter {
    policy: Arc<Policy>,
    /// The request's origin, when allowed.
    origin: Option<HeaderValue>,
    /// The request's origin is one the policy does not allow.
    denied: bool,
}

impl HttpFilter for CorsFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        let Some(origin) = req.headers.get(ORIGIN) else {
            return Some(Ok(Flow::Continue));
        };
        if req.method == Method::OPTIONS
            && let Some(method) = req.headers.get(ACCESS_CONTROL_REQUEST_METHOD)
        {
            let reply = self.policy.preflight(req, origin, method);
            return Some(Ok(Flow::Respond(reply)));
        }
        if self.policy.allows(origin) {
            self.origin = Some(origin.clone());
        } else {
            self.policy.denied.inc();
            self.denied = true;
        }
        Some(Ok(Flow::Continue))
    }

    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        if self.denied {
            LogNotes::on(&mut res.extensions).cors = Some("denied");
        }
        let h = &mut res.headers;
        if let Some(origin) = &self.origin {
            self.policy.decorate(h, origin);
            if let Some(v) = &self.policy.expose_headers {
                h.insert(ACCESS_CONTROL_EXPOSE_HEADERS, v.clone());
            }
        }
        if !self.policy.star && !varies_on(h, "origin") {
            h.append(VARY, VARY_ORIGIN);
        }
        Some(Ok(Flow::Continue))
    }
}

/// Whether the answer's `Vary` already names `field` (or `*`).
pub(super) fn varies_on(h: &HeaderMap, field: &str) -> bool {
    h.get_all(VARY).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .any(|f| f == b"*" || f.eq_ignore_ascii_case(field.as_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_config::units::Duration;

    fn factory(origins: &[&str], credentials: bool) -> CorsFilterFactory {
        let cfg = CorsConfig {
            allow_origins: origins.iter().map(|s| s.to_string()).collect(),
            allow_methods: vec!["GET".into(), "put".into()],
            allow_headers: vec!["Authorization".into(), "content-type".into()],
            expose_headers: vec!["x-request-id".into()],
            allow_credentials: credentials,
            max_age: Some(Duration::from_secs(600)),
        };
        CorsFilterFactory::new("r", &cfg, &Registry::new()).unwrap()
    }

    #[test]
    fn exact_origins_compared_as_sent_agree_with_the_parsed_comparison() {
        let f = factory(
            &[
                "https://App.Example.com",
                "http://localhost:8080",
                "https://*.example.org",
            ],
            true,
        );
        let policy = &f.policy;
        assert_eq!(policy.exact.len(), 2);
        for origin in [
            "https://app.example.com",
            "HTTPS://APP.EXAMPLE.COM",
            "https://app.example.com:443",
            "https://app.example.com/",
            "https://app.example.com.evil.net",
            "http://localhost:8080",
            "http://localhost",
            "http://localhost:80800",
            "https://a.example.org",
            "https://example.org",
            "null",
            "",
        ] {
            let parsed =
                Origin::parse(origin).is_some_and(|o| policy.origins.iter().any(|p| p.matches(&o)));
            let value = HeaderValue::from_str(origin).unwrap();
            assert_eq!(policy.allows(&value), parsed, "{origin}");
        }
    }

    fn preflight(f: &CorsFilterFactory, origin: &str, method: &str) -> Response<Body> {
        let (req, ()) = http::Request::options("/")
            .header(ORIGIN, origin)
            .header(ACCESS_CONTROL_REQUEST_METHOD, method)
            .body(())
            .unwrap()
            .into_parts();
        let o = HeaderValue::from_str(origin).unwrap();
        let m = HeaderValue::from_str(method).unwrap();
        f.policy.preflight(&req, &o, &m)
    }

    #[test]
    fn allowed_preflight_carries_the_policy() {
        let f = factory(&["https://app.example.com"], true);
        let res = preflight(&f, "https://app.example.com", "PUT");
        let h = res.headers();
        assert_eq!(res.status(), 204);
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example.com");
        assert_eq!(h[ACCESS_CONTROL_ALLOW_METHODS], "GET, PUT");
        assert_eq!(
            h[ACCESS_CONTROL_ALLOW_HEADERS],
            "authorization, content-type"
        );
        assert_eq!(h[ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        assert_eq!(h[ACCESS_CONTROL_MAX_AGE], "600");
        assert_eq!(h[VARY], "Origin");
        assert_eq!(f.policy.preflights_allowed.get(), 1);
    }

    #[test]
    fn denied_preflight_has_no_cors_headers() {
        let f = factory(&["https://app.example.com"], false);
        for (origin, method) in [
            ("https://app.example.com.evil.com", "GET"),
            ("null", "GET"),
            ("https://app.example.com", "DELETE"),
        ] {
            let res = preflight(&f, origin, method);
            assert_eq!(res.status(), 204);
            assert!(
                res.headers()
                    .keys()
                    .all(|k| !k.as_str().starts_with("access-control-")),
                "{origin} {method}"
            );
        }
        let policy = CorsConfig {
            allow_methods: vec!["*".into()],
            ..star_config()
        };
        let any = CorsFilterFactory::new("r", &policy, &Registry::new()).unwrap();
        for bad in ["GET, PUT", "", "P UT"] {
            assert!(
                !any.policy
                    .allows_method(&HeaderValue::from_str(bad).unwrap()),
                "{bad}"
            );
        }
        assert!(any.policy.allows_method(&HeaderValue::from_static("PATCH")));
        assert_eq!(f.policy.preflights_denied.get(), 3);
        // Safelisted methods pass whatever the list says, as in the Fetch standard.
        let res = preflight(&f, "https://app.example.com", "POST");
        assert!(res.headers().contains_key(ACCESS_CONTROL_ALLOW_ORIGIN));
    }

    fn star_config() -> CorsConfig {
        CorsConfig {
            allow_origins: vec!["*".into()],
            allow_methods: vec![],
            allow_headers: vec![],
            expose_headers: vec![],
            allow_credentials: false,
            max_age: None,
        }
    }

    #[test]
    fn star_answers_star_without_vary() {
        let f = factory(&["*"], false);
        let res = preflight(&f, "https://any.example", "PUT");
        assert_eq!(res.headers()[ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert!(!res.headers().contains_key(VARY));
        let credentials = CorsConfig {
            allow_credentials: true,
            ..star_config()
        };
        assert!(CorsFilterFactory::new("r", &credentials, &Registry::new()).is_err());
    }

    #[test]
    fn vary_is_found_in_lists() {
        let mut h = HeaderMap::new();
        h.append(VARY, HeaderValue::from_static("Accept-Encoding, origin"));
        assert!(varies_on(&h, "origin"));
        assert!(!varies_on(&h, "cookie"));
        h.append(VARY, HeaderValue::from_static("*"));
        assert!(varies_on(&h, "cookie"));
    }

    #[test]
    fn request_header_lists() {
        assert!(is_token_list(b"authorization, x-custom"));
        assert!(!is_token_list(b"authorization,,x"));
        assert!(!is_token_list(b"a b"));
        assert!(!is_token_list(b"a\xff"));
    }
}
