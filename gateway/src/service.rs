//! The request entry point shared by every protocol: route lookup, the filter chain and
//! terminal, request metrics, the request's server span (ended with the response body) and
//! the access log. Errors never reach hyper; they are responses by now.

use std::convert::Infallible;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::body::Body;
use crate::context::{ConnInfo, RequestCx};
use crate::error::error_response;
use crate::filter::with_server;
use crate::generation::Generation;
use crate::router::request_host;
use crate::server::idle::Activity;
use crate::server::policy::ListenerPolicy;
use crate::telemetry::trace::context::hex;
use crate::telemetry::trace::{self, OpenSpan, ServerSpan, TraceCx};
use crate::telemetry::{AccessRecord, RouteMetrics, Telemetry, protocol_text};

/// State shared by the requests of one connection.
pub struct ConnService {
    /// The live generation (swapped on reload).
    pub generation: Arc<ArcSwap<Generation>>,
    /// Connection facts.
    pub conn: Arc<ConnInfo>,
    /// Idle/header-timeout bookkeeping.
    pub activity: Arc<Activity>,
    /// The listener's limits and response headers.
    pub policy: Arc<ListenerPolicy>,
    /// Longest wait for the next bytes of a request body; `None`: no limit.
    pub body_read_timeout: Option<std::time::Duration>,
    /// Metrics and access log.
    pub telemetry: Arc<Telemetry>,
}

impl ConnService {
    /// Serves one hyper request (HTTP/1.1 or HTTP/2).
    pub async fn call(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        self.activity
            .request_started(req.version() == http::Version::HTTP_2);
        let limit = self.body_read_timeout;
        let res = self
            .handle(req.map(|b| match limit {
                Some(limit) => Body::incoming_with_timeout(b, limit),
                None => Body::incoming(b),
            }))
            .await;
        self.activity.request_done();
        Ok(res)
    }

    /// Serves one request of any protocol.
    pub async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let start = Instant::now();
        let generation = self.generation.load_full();
        let version = req.version();
        let head_only = req.method() == http::Method::HEAD;
        // Only copy request facts out when an access log will use them.
        let log = self.telemetry.access_log.load_full();
        let facts = log.as_ref().map(|_| RequestFacts::of(&req));
        // Without `telemetry.traces` this load is all the tracing a request costs.
        let span = self
            .telemetry
            .tracer
            .load()
            .as_ref()
            .map(|t| ServerSpan::start(t, &req, &self.conn));
        let trace_cx = span.as_ref().map(|s| s.context().clone());

        // Each arm builds its future in place: one held in a local and then moved into the
        // scope would be stored twice in this future, which hyper keeps per HTTP/1 connection.
        let (mut res, route_name, metrics) = match trace_cx {
            // The trace is also the task's current one, for work started without a context.
            Some(cx) => {
                let inner = Some(cx.clone());
                trace::scope(cx, self.dispatch(&generation, req, start, inner)).await
            }
            None => self.dispatch(&generation, req, start, None).await,
        };
        self.policy.decorate(&mut res);
        metrics.record(version, res.status(), start.elapsed());
        // A recorded span stays open until the response body has been sent.
        let open = span.and_then(|s| s.end_head(res.status(), &route_name));
        if let (Some(log), Some(facts)) = (log, facts) {
            let mut record = facts.into_record(&self.conn, version, &res, start, route_name);
            record.trace_id = open
                .as_ref()
                .and_then(OpenSpan::trace_id)
                .map(|id| hex(&id));
            log.log(record);
        }
        match open {
            Some(open) => {
                let status = res.status();
                let no_body = head_only
                    || status.is_informational()
                    || status == StatusCode::NO_CONTENT
                    || status == StatusCode::NOT_MODIFIED;
                res.map(|body| open.attach(body, no_body))
            }
            None => res,
        }
    }

    async fn dispatch<'g>(
        &self,
        generation: &'g Generation,
        req: Request<Body>,
        start: Instant,
        trace: Option<TraceCx>,
    ) -> (Response<Body>, Arc<str>, &'g RouteMetrics) {
        let server = generation.server_header.as_ref();
        let unrouted = |status| {
            (
                with_server(error_response(status), server),
                Arc::from(""),
                &generation.unrouted,
            )
        };
        let req = match self.policy.admit(req) {
            Ok(req) => req,
            Err(status) => return unrouted(status),
        };
        let uri = req.uri();
        let Some(listener) = generation.listener_index(&self.conn.listener) else {
            return unrouted(StatusCode::NOT_FOUND);
        };
        let host = request_host(uri, req.headers());
        let Some(route) =
            generation
                .router
                .find(listener, req.method(), host, uri.path(), req.headers())
        else {
            return unrouted(StatusCode::NOT_FOUND);
        };
        let cx = RequestCx {
            conn: self.conn.clone(),
            route: route.name.clone(),
            start,
            trace,
        };
        let res = route.chain.run(&route.terminal, req, cx, server).await;
        (res, route.name.clone(), &route.metrics)
    }
}

/// What the access log needs from the request, copied before the request moves on.
struct RequestFacts {
    time: std::time::SystemTime,
    method: http::Method,
    target: String,
    host: String,
    user_agent: String,
    referer: String,
}

impl RequestFacts {
    fn of(req: &Request<Body>) -> Self {
        let header = |name| {
            req.headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default()
        };
        Self {
            time: std::time::SystemTime::now(),
            method: req.method().clone(),
            target: req
                .uri()
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            host: request_host(req.uri(), req.headers()).to_owned(),
            user_agent: header(header::USER_AGENT),
            referer: header(header::REFERER),
        }
    }

    fn into_record(
        self,
        conn: &ConnInfo,
        version: http::Version,
        res: &Response<Body>,
        start: Instant,
        route: Arc<str>,
    ) -> AccessRecord {
        let bytes = res
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .or_else(|| http_body::Body::size_hint(res.body()).exact())
            .unwrap_or(0);
        AccessRecord {
            time: self.time,
            client: conn.client.ip(),
            method: self.method,
            target: self.target,
            protocol: protocol_text(version),
            status: res.status().as_u16(),
            bytes,
            duration: start.elapsed(),
            route,
            host: self.host,
            user_agent: self.user_agent,
            referer: self.referer,
            trace_id: None,
        }
    }
}
