//! The native `waf` filter: built-in detectors (SQL injection and XSS through libinjection,
//! path traversal, scanners, protocol anomalies, command injection) and custom regex rules,
//! applied to the decoded path, query arguments, headers, cookies and form, multipart and JSON
//! bodies. `block` policies answer `403` with a request id; `detect` policies log and count.
//!
//! Layout: [`policy`] compiles a policy once per generation, [`inspect`] walks a request,
//! [`normalize`] decodes, [`detect`] holds the detectors, [`rules`] the custom rule sets,
//! [`body`] the body parsers and [`log`] the match reports. User guide: `docs/waf.md`.

pub mod body;
pub mod detect;
pub mod inspect;
pub mod log;
pub mod normalize;
pub mod policy;
pub mod rules;

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Response, StatusCode, request, response};

use super::{BodyAccess, FilterFactory, Flow, HttpFilter};
use crate::body::{Body, BoxError};
use crate::context::RequestCx;
use crate::error::GatewayError;
use crate::telemetry::Registry;
use detect::{Hit, ids};
use gateway_config::WafPolicy;
use inspect::{HeadScan, Inspection};
use log::Location;
pub use policy::Policy;

/// The request id header of a refusal.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Factory of the `waf` filter for one route.
#[derive(Debug)]
pub struct WafFilterFactory {
    policy: Arc<Policy>,
}

impl WafFilterFactory {
    /// Compiles `policy`, registering its counters in `registry`.
    pub fn new(policy: &WafPolicy, registry: &Registry) -> Result<Self, String> {
        Ok(Self {
            policy: Arc::new(Policy::compile(policy, registry)?),
        })
    }

    /// The compiled policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }
}

impl FilterFactory for WafFilterFactory {
    fn name(&self) -> &'static str {
        "waf"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(WafFilter::new(self.policy.clone()))
    }

    fn request_body(&self) -> BodyAccess {
        if self.policy.inspects_body {
            BodyAccess::Buffer(self.policy.max_body)
        } else {
            BodyAccess::None
        }
    }

    fn after_response(&self) -> bool {
        false
    }
}

/// The `waf` filter for one request.
pub struct WafFilter {
    policy: Arc<Policy>,
    /// The client is in the allow list: nothing is inspected.
    bypass: bool,
    /// The id in logs and in the 403; taken from a well-formed incoming `x-request-id`.
    request_id: Option<String>,
    /// `Content-Type` of the body, kept for the body phase.
    content_type: Option<HeaderValue>,
    /// Arguments counted so far (query, then body).
    args: usize,
}

impl WafFilter {
    /// A filter for one request.
    pub fn new(policy: Arc<Policy>) -> Self {
        Self {
            policy,
            bypass: false,
            request_id: None,
            content_type: None,
            args: 0,
        }
    }

    /// Runs the head phase for a request of `client` on `route`; returns the refusal, if any.
    pub fn check_head(
        &mut self,
        req: &request::Parts,
        (client, route): (IpAddr, &str),
    ) -> Option<Response<Body>> {
        let policy = self.policy.clone();
        let ip = client;
        if policy.allowed(ip) {
            self.bypass = true;
            return None;
        }
        let scan = HeadScan::new(&req.headers);
        self.request_id = scan.request_id.and_then(incoming_request_id);
        if policy.denied(ip) {
            let mut insp =
                Inspection::new(&policy, (ip, route), &mut self.request_id, &mut self.args);
            let _ = insp.builtin(
                Hit {
                    rule: ids::DENY_LIST,
                    at: 0,
                },
                Location::ClientIp,
                b"",
            );
            return Some(self.forbidden());
        }
        if policy.inspects_body {
            let too_long = scan
                .content_length
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .is_some_and(|n| n > policy.max_body);
            if too_long {
                return Some(GatewayError::BodyTooLarge(policy.max_body).into_response());
            }
            self.content_type = scan.content_type.cloned();
        }
        let mut insp = Inspection::new(&policy, (ip, route), &mut self.request_id, &mut self.args);
        let _ = insp.head(req, &scan);
        insp.blocked.is_some().then(|| self.forbidden())
    }

    /// Runs the body phase on the whole buffered body; returns the refusal, if any.
    pub fn check_body(&mut self, body: &[u8], client: (IpAddr, &str)) -> Option<Response<Body>> {
        if self.bypass || !self.policy.inspects_body {
            return None;
        }
        let policy = self.policy.clone();
        let content_type = self.content_type.take();
        let content_type = content_type
            .as_ref()
            .map_or(&b""[..], HeaderValue::as_bytes);
        let mut insp = Inspection::new(&policy, client, &mut self.request_id, &mut self.args);
        let _ = insp.body(content_type, body);
        insp.blocked.is_some().then(|| self.forbidden())
    }

    /// `403` naming the request id, in a header and in the body, so a refused user can quote it
    /// and an operator can find the log line.
    fn forbidden(&mut self) -> Response<Body> {
        self.policy.blocked.inc();
        let id = self.request_id.get_or_insert_with(inspect::new_request_id);
        let mut res = Response::new(Body::from(format!("403 Forbidden\nrequest id: {id}\n")));
        *res.status_mut() = StatusCode::FORBIDDEN;
        let headers = res.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Ok(v) = HeaderValue::from_str(id) {
            headers.insert(REQUEST_ID.clone(), v);
        }
        res
    }
}

/// An incoming `x-request-id` (set by a load balancer in front) when it is short and plain
/// enough to repeat in logs and headers.
fn incoming_request_id(v: &HeaderValue) -> Option<String> {
    let v = v.as_bytes();
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    ok.then(|| String::from_utf8_lossy(v).into_owned())
}

#[async_trait::async_trait]
impl HttpFilter for WafFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        Some(Ok(
            match self.check_head(req, (cx.client_ip(), &cx.route)) {
                Some(res) => Flow::Respond(res),
                None => Flow::Continue,
            },
        ))
    }

    fn on_response_headers_sync(
        &mut self,
        _res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        // Nothing to check on the way out; answering here keeps the request synchronous.
        Some(Ok(Flow::Continue))
    }

    async fn on_request_body(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        // With `BodyAccess::Buffer` the chain hands over the whole body in one call.
        if !eos {
            return Ok(Flow::Continue);
        }
        let body = chunk.as_deref().unwrap_or_default();
        Ok(match self.check_body(body, (cx.client_ip(), &cx.route)) {
            Some(res) => Flow::Respond(res),
            None => Flow::Continue,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use gateway_config::load_str;

    const CLIENT: (IpAddr, &str) = (IpAddr::V4(Ipv4Addr::LOCALHOST), "r");

    fn factory(policy: &str) -> WafFilterFactory {
        let yaml = format!(
            "waf:\n  p: {policy}\nroutes:\n  - match: {{ path_prefix: / }}\n    respond: {{ body: ok }}\nlisteners:\n  - name: l\n    bind: 127.0.0.1:0\n"
        );
        let config = load_str(&yaml, "t.yaml", std::path::Path::new(".")).expect("config");
        WafFilterFactory::new(&config.waf["p"], &Registry::new()).expect("policy")
    }

    fn head(f: &WafFilterFactory, req: http::Request<()>) -> Option<Response<Body>> {
        let (parts, ()) = req.into_parts();
        WafFilter::new(f.policy().clone()).check_head(&parts, CLIENT)
    }

    #[test]
    fn content_length_with_transfer_encoding_is_refused() {
        let f = factory("{ detect: [protocol] }");
        let req = http::Request::post("/x")
            .header("content-length", "4")
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap();
        let res = head(&f, req).expect("refused");
        assert_eq!(res.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            f.policy().builtin_counter(ids::CL_AND_TE).map(|c| c.get()),
            Some(1)
        );
    }

    #[test]
    fn refusal_names_the_request_id() {
        let f = factory("{ detect: [sqli] }");
        let res = head(
            &f,
            http::Request::get("/x?q=1%27%20or%201%3D1--")
                .body(())
                .unwrap(),
        )
        .unwrap();
        let id = res.headers()[&REQUEST_ID].to_str().unwrap().to_owned();
        assert_eq!(id.len(), 32);
        assert_eq!(f.policy().blocked.get(), 1);
        assert!(head(&f, http::Request::get("/x?q=shoes").body(()).unwrap()).is_none());
    }

    #[test]
    fn detect_mode_counts_without_refusing() {
        let f = factory("{ mode: detect, detect: [xss] }");
        assert!(
            head(
                &f,
                http::Request::get("/x?q=%3Cscript%3Ealert(1)%3C/script%3E")
                    .body(())
                    .unwrap()
            )
            .is_none()
        );
        assert_eq!(
            f.policy().builtin_counter(ids::XSS).map(|c| c.get()),
            Some(1)
        );
        assert_eq!(f.policy().blocked.get(), 0);
    }

    #[test]
    fn bodies_are_buffered_only_when_inspected() {
        assert_eq!(
            factory("{ detect: [scanner] }").request_body(),
            BodyAccess::None
        );
        assert_eq!(
            factory("{ detect: [sqli], max_body: 2KiB }").request_body(),
            BodyAccess::Buffer(2048)
        );
        let f = factory("{ rules: [ { id: 1, where: body, match: x } ] }");
        assert_eq!(f.request_body(), BodyAccess::Buffer(1 << 20));
    }

    #[test]
    fn declared_oversized_bodies_get_413_before_reading() {
        let f = factory("{ detect: [sqli], max_body: 10B }");
        let req = http::Request::post("/x")
            .header("content-length", "11")
            .body(())
            .unwrap();
        assert_eq!(
            head(&f, req).unwrap().status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[test]
    fn remembered_verdicts_never_skip_a_check() {
        // Every part of a benign request is remembered after the first one; the same request
        // then passes again, and any changed byte is inspected afresh.
        let f = factory(
            "{ detect: [sqli, xss, path_traversal, scanner, protocol, command_injection], \
             rules: [ { id: 1, where: \"arg:page\", match: \"[^0-9]\" }, \
                      { id: 2, where: \"cookie:session\", match: \"admin\" }, \
                      { id: 3, where: path, match: \"^/admin\" } ] }",
        );
        let get = |uri: &str, cookie: &str| {
            http::Request::get(uri)
                .header("user-agent", "Mozilla/5.0 (X11; Linux x86_64; rv:128.0)")
                .header("cookie", cookie)
                .body(())
                .unwrap()
        };
        let benign = "/search?q=running+shoes&page=2";
        for _ in 0..3 {
            assert!(head(&f, get(benign, "session=3f2a9c; theme=dark")).is_none());
        }
        for (uri, cookie) in [
            (
                "/search?q=running+shoes&page=2x",
                "session=3f2a9c; theme=dark",
            ),
            (
                "/search?q=1%27+or+%271%27%3D%271&page=2",
                "session=3f2a9c; theme=dark",
            ),
            (
                "/search?q=running+shoes&page=2",
                "session=3f2a9cadmin; theme=dark",
            ),
            (
                "/search?q=running+shoes&page=2",
                "session=3f2a9c; theme=<script>alert(1)</script>",
            ),
            (
                "/admin?q=running+shoes&page=2",
                "session=3f2a9c; theme=dark",
            ),
            (
                "/search/../../etc/passwd?page=2",
                "session=3f2a9c; theme=dark",
            ),
        ] {
            for _ in 0..2 {
                assert!(head(&f, get(uri, cookie)).is_some(), "{uri} {cookie}");
            }
        }
        // Another policy remembers its own verdicts: what passed `f` is still checked by `g`.
        let g = factory("{ rules: [ { id: 9, where: \"arg:page\", match: \"2\" } ] }");
        assert!(head(&g, get(benign, "session=3f2a9c; theme=dark")).is_some());
    }

    #[test]
    fn a_remembered_query_still_counts_its_arguments() {
        // The body phase counts on from the query's arguments, also when the query's verdict
        // came from the cache.
        let f = factory("{ detect: [protocol] }");
        let query: String = (0..200).map(|i| format!("a{i}=1&")).collect();
        let body: String = (0..60).map(|i| format!("b{i}=1&")).collect();
        for _ in 0..3 {
            let (parts, ()) = http::Request::post(format!("/x?{query}"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(())
                .unwrap()
                .into_parts();
            let mut filter = WafFilter::new(f.policy().clone());
            assert!(filter.check_head(&parts, CLIENT).is_none());
            assert!(filter.check_body(body.as_bytes(), CLIENT).is_some());
        }
    }

    #[test]
    fn too_many_headers_and_arguments() {
        let f = factory("{ detect: [protocol] }");
        let mut req = http::Request::get("/x");
        for i in 0..=inspect::MAX_HEADERS {
            req = req.header(format!("x-{i}"), "v");
        }
        assert!(head(&f, req.body(()).unwrap()).is_some());
        let query: String = (0..=inspect::MAX_ARGS)
            .map(|i| format!("a{i}=1&"))
            .collect();
        assert!(
            head(
                &f,
                http::Request::get(format!("/x?{query}")).body(()).unwrap()
            )
            .is_some()
        );
    }
}
