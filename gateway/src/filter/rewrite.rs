//! The native `rewrite` filter: the path (and the host) the terminal sees. The router matched
//! on the original; the proxy and static files get the rewritten one. The query is kept. A
//! rule that makes no clean origin-form path answers 500 and is counted: garbage never goes
//! upstream.

use std::sync::Arc;

use http::uri::{Authority, PathAndQuery, Uri};
use http::{HeaderValue, StatusCode, request, response};

use super::{FilterFactory, Flow, HttpFilter};
use crate::body::BoxError;
use crate::context::RequestCx;
use crate::error::error_response;
use crate::request::OriginalTarget;
use crate::request::rewrite::PathRule;
use crate::telemetry::{Counter, Registry};
use gateway_config::Rewrite;

/// Factory for the `rewrite` filter.
pub struct RewriteFilterFactory {
    rewriter: Arc<Rewriter>,
}

struct Rewriter {
    path: Option<PathRule>,
    /// The new `Host` and, for requests that carry one, `:authority`.
    host: Option<(HeaderValue, Authority)>,
    /// Rewrites whose path could not be used.
    failures: Counter,
}

impl RewriteFilterFactory {
    /// Compiles a validated rewrite of route `route`.
    pub fn new(route: &str, cfg: &Rewrite, registry: &Registry) -> Result<Self, String> {
        let host = match &cfg.host {
            Some(h) => Some((
                HeaderValue::from_str(h).map_err(|e| format!("host `{h}`: {e}"))?,
                Authority::try_from(h.as_str()).map_err(|e| format!("host `{h}`: {e}"))?,
            )),
            None => None,
        };
        Ok(Self {
            rewriter: Arc::new(Rewriter {
                path: cfg.path.as_ref().map(PathRule::new),
                host,
                failures: registry.counter(
                    "gateway_http_rewrite_failures_total",
                    "Requests answered 500 because a rewrite made no valid path, by route.",
                    &[("route", route)],
                ),
            }),
        })
    }
}

impl FilterFactory for RewriteFilterFactory {
    fn name(&self) -> &'static str {
        "rewrite"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(RewriteFilter(self.rewriter.clone()))
    }

    fn after_response(&self) -> bool {
        false
    }
}

struct RewriteFilter(Arc<Rewriter>);

impl HttpFilter for RewriteFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        Some(Ok(match self.0.apply(req) {
            Ok(()) => Flow::Continue,
            Err(path) => {
                self.0.failures.inc();
                tracing::warn!(route = %cx.route, path, "rewrite made no valid path; answered 500");
                Flow::Respond(error_response(StatusCode::INTERNAL_SERVER_ERROR))
            }
        }))
    }

    /// Nothing to do to the answer; said here, the chain calls no async hook for it.
    fn on_response_headers_sync(
        &mut self,
        _res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        Some(Ok(Flow::Continue))
    }
}

impl Rewriter {
    /// Rewrites `req`; `Err` carries the path a rule made that cannot be sent.
    fn apply(&self, req: &mut request::Parts) -> Result<(), String> {
        let mut target = None;
        if let Some(rule) = &self.path {
            let path = req.uri.path();
            // Bounded for the log: a path may be long.
            let new = rule
                .apply(path)
                .map_err(|bad| bad.0.chars().take(256).collect::<String>())?;
            if new != path {
                let text = match req.uri.query() {
                    Some(q) => format!("{new}?{q}"),
                    None => new.into_owned(),
                };
                target = Some(PathAndQuery::try_from(text).map_err(|e| e.to_string())?);
            }
        }
        let mut authority = None;
        if let Some((value, new)) = &self.host {
            req.headers.insert(http::header::HOST, value.clone());
            authority = req.uri.authority().map(|_| new.clone());
        }
        // The URI is taken apart only when a part of it changes.
        if target.is_none() && authority.is_none() {
            return Ok(());
        }
        if target.is_some() {
            // The upstream gets the rewritten path, not the client's original target.
            req.extensions.remove::<OriginalTarget>();
        }
        let mut uri = std::mem::take(&mut req.uri).into_parts();
        uri.path_and_query = target.or(uri.path_and_query);
        uri.authority = authority.or(uri.authority);
        req.uri = Uri::from_parts(uri).map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewriter(yaml: &str) -> Rewriter {
        let text = format!(
            "routes: [{{ match: {{ path_prefix: /api }}, filters: [ {{ rewrite: {yaml} }} ], \
             respond: {{ body: x }} }}]"
        );
        let cfg = gateway_config::load_str(&text, "t.yaml", std::path::Path::new(".")).unwrap();
        let gateway_config::Filter::Rewrite(rw) = &cfg.routes[0].filters[0] else {
            panic!("not a rewrite");
        };
        let factory = RewriteFilterFactory::new("r", rw, &Registry::default()).unwrap();
        Arc::into_inner(factory.rewriter).unwrap()
    }

    fn parts(uri: &str) -> request::Parts {
        let mut p = http::Request::get(uri).body(()).unwrap().into_parts().0;
        p.headers
            .insert("host", HeaderValue::from_static("a.example"));
        p.extensions
            .insert(OriginalTarget(PathAndQuery::from_static("/api//x")));
        p
    }

    #[test]
    fn the_query_stays_and_the_original_target_goes() {
        let r = rewriter("{ replace_prefix: /v2 }");
        let mut p = parts("/api/x?a=1&b");
        r.apply(&mut p).unwrap();
        assert_eq!(p.uri, "/v2/x?a=1&b");
        assert!(p.extensions.get::<OriginalTarget>().is_none());
        assert_eq!(p.headers["host"], "a.example");
    }

    #[test]
    fn host_sets_host_and_the_authority_when_there_is_one() {
        let r = rewriter("{ host: \"b.internal:8080\" }");
        let mut p = parts("https://a.example/api/x?q");
        r.apply(&mut p).unwrap();
        assert_eq!(p.uri, "https://b.internal:8080/api/x?q");
        assert_eq!(p.headers["host"], "b.internal:8080");
        assert!(
            p.extensions.get::<OriginalTarget>().is_some(),
            "path unchanged"
        );
    }

    #[test]
    fn a_bad_result_is_refused() {
        let r = rewriter(r#"{ path_regex: "^/api/(.*)$", to: "/x/.$1" }"#);
        let mut p = parts("/api/.");
        // `/x/..` is a dot segment: refused.
        let e = r.apply(&mut p);
        assert!(e.is_err(), "{:?}", p.uri);
        assert_eq!(p.uri, "/api/.", "the request is left as it was");
    }
}
