//! The native `forward_auth` filter (Traefik's ForwardAuth, nginx's `auth_request`, Envoy's
//! ext_authz over HTTP): each request is first described to an authentication service in a
//! `GET` without a body, as Traefik does (the original method travels in
//! `X-Forwarded-Method`, so the service never has to take a body). A `2xx` lets the request on
//! with the configured headers of the answer copied onto it; any other answer goes to the
//! client as it is (status, headers, body up to [`MAX_DENIAL_BODY`]).
//!
//! The auth request goes through the proxy's own client ([`ProxyRoute`]): a named upstream's
//! pools, balancing, health and TLS, or, for a `url`, an upstream of one target built at config
//! load, so keep-alive connections are reused across requests either way. The proxy adds the
//! usual forwarding fields (`X-Forwarded-For`, `-Proto`, `-Host`, `Forwarded`); this filter adds
//! `X-Forwarded-Method` and `X-Forwarded-Uri`.
//!
//! The filter fails closed: a service that cannot be reached (or has no healthy target) gets
//! the client a `503`, one that does not answer within `timeout` a `504`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, request};
use http_body_util::{BodyExt, Limited};

use super::{FilterFactory, Flow, HttpFilter};
use crate::body::{Body, BoxError};
use crate::context::RequestCx;
use crate::error::error_response;
use crate::proxy::{ProxyRoute, Upstream, UpstreamFailure};
use crate::telemetry::LogNotes;
use crate::telemetry::{Counter, Registry};
use gateway_config::ForwardAuth;

/// The largest denial body passed on; a larger one is dropped (the status and headers still
/// go to the client).
pub const MAX_DENIAL_BODY: usize = 64 * 1024;

static X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
static X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

/// What the service decided, or why it could not: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Denied,
    Unavailable,
    Timeout,
}

impl Outcome {
    const ALL: [Self; 4] = [
        Self::Allowed,
        Self::Denied,
        Self::Unavailable,
        Self::Timeout,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
        }
    }
}

/// `res`, noted for the access log as this filter's refusal for `outcome`.
fn refused(mut res: Response<Body>, outcome: Outcome) -> Response<Body> {
    LogNotes::on(res.extensions_mut()).auth = Some(("forward_auth", outcome.label()));
    res
}

struct Shared {
    service: Arc<ProxyRoute>,
    path: http::uri::PathAndQuery,
    request_headers: Vec<HeaderName>,
    response_headers: Vec<HeaderName>,
    timeout: Duration,
    counters: [Counter; 4],
}

impl Shared {
    fn count(&self, outcome: Outcome) {
        self.counters[outcome as usize].inc();
    }

    /// The auth request for the client's `req`.
    fn auth_request(&self, req: &request::Parts) -> Request<Body> {
        let mut headers = HeaderMap::with_capacity(self.request_headers.len() + 4);
        for name in &self.request_headers {
            for v in req.headers.get_all(name) {
                headers.append(name.clone(), v.clone());
            }
        }
        if let Some(host) = crate::proxy::headers::client_authority(&req.uri, &req.headers) {
            headers.insert(header::HOST, host);
        }
        if let Ok(m) = HeaderValue::from_str(req.method.as_str()) {
            headers.insert(X_FORWARDED_METHOD.clone(), m);
        }
        let target = req.uri.path_and_query().map_or("/", |p| p.as_str());
        if let Ok(uri) = HeaderValue::from_str(target) {
            headers.insert(X_FORWARDED_URI.clone(), uri);
        }
        let mut auth = Request::new(Body::default());
        *auth.method_mut() = Method::GET;
        *auth.uri_mut() = http::Uri::from(self.path.clone());
        *auth.headers_mut() = headers;
        auth
    }

    /// Asks the service; the answer with its body read, or the outcome that ends the request.
    async fn ask(
        &self,
        auth: Request<Body>,
        cx: &RequestCx,
    ) -> Result<(http::response::Parts, Option<Bytes>), Outcome> {
        let call = async {
            let res = self.service.forward(auth, cx).await;
            if let Some(failure) = res.extensions().get::<UpstreamFailure>() {
                return Err(if failure.timed_out {
                    Outcome::Timeout
                } else {
                    Outcome::Unavailable
                });
            }
            if res.status().is_informational() {
                // Not a decision, and a `101` passed on would end the client's HTTP.
                return Err(Outcome::Unavailable);
            }
            let (parts, body) = res.into_parts();
            // Read to its end so the connection goes back to its pool; too large a body is
            // dropped, and a body that breaks off leaves the answer's status standing.
            let body = Limited::new(body, MAX_DENIAL_BODY)
                .collect()
                .await
                .ok()
                .map(|b| b.to_bytes());
            Ok((parts, body))
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or(Err(Outcome::Timeout))
    }

    /// The service's refusal as the client gets it.
    fn denial(mut parts: http::response::Parts, body: Option<Bytes>) -> Response<Body> {
        let body = body.unwrap_or_default();
        parts.headers.remove(header::TRANSFER_ENCODING);
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        parts.extensions = http::Extensions::new();
        Response::from_parts(parts, Body::from(body))
    }
}

/// Factory of the `forward_auth` filter for one route.
pub struct ForwardAuthFilterFactory {
    shared: Arc<Shared>,
}

impl ForwardAuthFilterFactory {
    /// Builds the filter on `service`, the upstream it asks.
    pub fn new(
        route: &str,
        cfg: &ForwardAuth,
        service: Arc<Upstream>,
        registry: &Registry,
    ) -> Result<Self, String> {
        let names = |list: &[String]| {
            list.iter()
                .map(|n| HeaderName::from_bytes(n.as_bytes()).map_err(|e| format!("`{n}`: {e}")))
                .collect::<Result<Vec<_>, _>>()
        };
        let mut proxy = gateway_config::model::ProxyConfig::to_upstream(&service.name);
        proxy.preserve_host = false;
        proxy.upgrades = Vec::new();
        Ok(Self {
            shared: Arc::new(Shared {
                service: Arc::new(ProxyRoute::new(&proxy, service)),
                path: http::uri::PathAndQuery::try_from(cfg.path.as_str())
                    .map_err(|e| format!("path: {e}"))?,
                request_headers: names(&cfg.settings.request_headers)?,
                response_headers: names(&cfg.settings.response_headers)?,
                timeout: cfg.settings.timeout.get(),
                counters: Outcome::ALL.map(|o| {
                    registry.counter(
                        "gateway_forward_auth_requests_total",
                        "Requests checked by forward_auth filters, by result.",
                        &[("route", route), ("result", o.label())],
                    )
                }),
            }),
        })
    }
}

impl FilterFactory for ForwardAuthFilterFactory {
    fn name(&self) -> &'static str {
        "forward_auth"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(ForwardAuthFilter {
            shared: self.shared.clone(),
        })
    }

    fn after_response(&self) -> bool {
        false
    }
}

struct ForwardAuthFilter {
    shared: Arc<Shared>,
}

#[async_trait::async_trait]
impl HttpFilter for ForwardAuthFilter {
    /// Nothing to do to the answer; said here, the chain calls no async hook for it.
    fn on_response_headers_sync(
        &mut self,
        _res: &mut http::response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        Some(Ok(Flow::Continue))
    }

    async fn on_request_headers(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        let shared = &self.shared;
        // Whatever the answer, the client's own copies never go on: only the service's may.
        for name in &shared.response_headers {
            req.headers.remove(name);
        }
        let auth = shared.auth_request(req);
        let (parts, body) = match shared.ask(auth, cx).await {
            Ok(answer) => answer,
            Err(outcome) => {
                shared.count(outcome);
                tracing::debug!(route = %cx.route, result = outcome.label(), "forward_auth service failed");
                let status = match outcome {
                    Outcome::Timeout => StatusCode::GATEWAY_TIMEOUT,
                    _ => StatusCode::SERVICE_UNAVAILABLE,
                };
                return Ok(Flow::Respond(refused(error_response(status), outcome)));
            }
        };
        if !parts.status.is_success() {
            shared.count(Outcome::Denied);
            let denial = Shared::denial(parts, body);
            return Ok(Flow::Respond(refused(denial, Outcome::Denied)));
        }
        shared.count(Outcome::Allowed);
        for name in &shared.response_headers {
            for v in parts.headers.get_all(name) {
                req.headers.append(name.clone(), v.clone());
            }
        }
        Ok(Flow::Continue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_keep_status_headers_and_body_with_a_fresh_length() {
        let res = Response::builder()
            .status(401)
            .header("www-authenticate", "Bearer")
            .header("transfer-encoding", "chunked")
            .header("content-length", "999")
            .body(())
            .unwrap();
        let (parts, ()) = res.into_parts();
        let out = Shared::denial(parts, Some(Bytes::from_static(b"login first")));
        assert_eq!(out.status(), 401);
        assert_eq!(out.headers()["www-authenticate"], "Bearer");
        assert_eq!(out.headers()["content-length"], "11");
        assert!(out.headers().get("transfer-encoding").is_none());
    }
}
