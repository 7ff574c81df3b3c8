//! HTTP spans with the OpenTelemetry semantic conventions (HTTP server and client spans,
//! stable since semconv 1.23): a [`ServerSpan`] per request, started in `ConnService::handle`
//! for every protocol (or by the HTTP/1.1 fast path from the raw head, with the same
//! attributes), and a [`ClientSpan`] per upstream attempt, started by the proxy. Both
//! get their status from the response head and stay open (an [`OpenSpan`]) until the body
//! has been sent or read.
//!
//! An unsampled request costs a header parse and two random ids: it records nothing, and its
//! upstream requests carry the trace on with the `sampled` flag clear.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::USER_AGENT;
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Version};

use super::context::{SpanContext, extract, extract_lines, inject, new_span_id};
use super::open::OpenSpan;
use super::span::{self, Kind, Parent, SpanData, Status, Value, port_of};
use super::{TraceCx, Tracer};
use crate::body::Body;
use crate::connection::ConnInfo;
use crate::error::GatewayError;
use crate::telemetry::first_line;

/// A span's attributes.
pub type Attributes = Vec<(&'static str, Value)>;

/// The span of one request, from its head to the end of its response body.
pub struct ServerSpan {
    cx: TraceCx,
    start: Duration,
    /// Request attributes; empty (never allocated) when the span is not recorded.
    attributes: Attributes,
}

/// What a recorded server span notes of its request, however the request was read.
struct Noted {
    method: Method,
    path: PathAndQuery,
    /// `server.address`: the target's authority, else the `Host` header.
    address: Option<Value>,
    /// The port in that authority or header; the listener's otherwise.
    port: Option<u16>,
    version: Version,
    user_agent: Option<HeaderValue>,
}

impl ServerSpan {
    /// Continues the request's trace or starts one, and notes the request's attributes when
    /// the span is recorded.
    pub fn start(tracer: &Arc<Tracer>, req: &Request<Body>, conn: &ConnInfo) -> Self {
        let cx = tracer.begin(extract(req.headers()));
        Self::begun(cx, conn, || {
            let host = req.headers().get(http::header::HOST);
            let (address, port) = match (req.uri().authority(), host) {
                (Some(authority), _) => {
                    (Some(Value::Host(authority.clone())), authority.port_u16())
                }
                (None, Some(h)) => (Some(Value::HostHeader(h.clone())), port_of(h.as_bytes())),
                (None, None) => (None, None),
            };
            Noted {
                method: req.method().clone(),
                path: req
                    .uri()
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| PathAndQuery::from_static("/")),
                address,
                port,
                version: req.version(),
                user_agent: req.headers().get(USER_AGENT).cloned(),
            }
        })
    }

    /// [`ServerSpan::start`] for an HTTP/1.1 `GET` or `HEAD` (`head`) read off the wire by the
    /// fast path: its origin-form `target` and its header lines. The same attributes, read as
    /// a header map reads them (the first `Host` and `User-Agent`).
    pub fn start_h1(
        tracer: &Arc<Tracer>,
        head: bool,
        target: &str,
        lines: &[httparse::Header<'_>],
        conn: &ConnInfo,
    ) -> Self {
        let cx = tracer.begin(extract_lines(lines.iter().map(|h| (h.name, h.value))));
        Self::begun(cx, conn, || {
            let first = |name| HeaderValue::from_bytes(first_line(lines, name)?).ok();
            let host = first("host");
            Noted {
                method: if head { Method::HEAD } else { Method::GET },
                path: PathAndQuery::try_from(target)
                    .unwrap_or_else(|_| PathAndQuery::from_static("/")),
                port: host.as_ref().and_then(|h| port_of(h.as_bytes())),
                address: host.map(Value::HostHeader),
                version: Version::HTTP_11,
                user_agent: first("user-agent"),
            }
        })
    }

    /// The span of a request in `cx`, with the attributes `note` reads when it is recorded.
    fn begun(cx: TraceCx, conn: &ConnInfo, note: impl FnOnce() -> Noted) -> Self {
        if !cx.sampled() {
            return Self {
                cx,
                start: Duration::ZERO,
                attributes: Vec::new(),
            };
        }
        let noted = note();
        let mut a = Vec::with_capacity(13);
        push_method(&mut a, &noted.method);
        a.push(("url.path", Value::Path(noted.path)));
        a.push((
            "url.scheme",
            Value::Static(if conn.https { "https" } else { "http" }),
        ));
        if let Some(address) = noted.address {
            a.push(("server.address", address));
        }
        let port = noted.port.unwrap_or_else(|| conn.local.port());
        a.push(("server.port", Value::Int(i64::from(port))));
        a.push(("client.address", Value::Ip(conn.client.ip())));
        a.push((
            "network.protocol.version",
            Value::Static(protocol_version(noted.version)),
        ));
        if let Some(ua) = noted.user_agent {
            a.push(("user_agent.original", Value::Header(ua)));
        }
        a.push(("gateway.listener", Value::Shared(conn.listener.clone())));
        Self {
            cx,
            start: span::now(),
            attributes: a,
        }
    }

    /// The context handed to filters and terminals.
    pub fn context(&self) -> &TraceCx {
        &self.cx
    }

    /// Notes the response status and the matched route ("" when none matched). A recorded
    /// span is returned open, to be ended with the response body ([`OpenSpan::attach`]).
    pub fn end_head(self, status: StatusCode, route: &Arc<str>) -> Option<OpenSpan> {
        if !self.cx.sampled() {
            return None;
        }
        let Self {
            cx,
            start,
            attributes: mut a,
        } = self;
        let method = a.first().map_or(Value::Static("HTTP"), |(_, m)| match m {
            Value::Static("_OTHER") => Value::Static("HTTP"),
            m => m.clone(),
        });
        let route = (!route.is_empty()).then(|| Value::Shared(route.clone()));
        if let Some(r) = &route {
            a.push(("http.route", r.clone()));
        }
        a.push((
            "http.response.status_code",
            Value::Int(i64::from(status.as_u16())),
        ));
        // Server spans fail on 5xx only: a 4xx is the client's error, not the gateway's.
        let status = if status.is_server_error() {
            a.push(("error.type", Value::Owned(status.as_str().into())));
            Status::Error("".into())
        } else {
            Status::Unset
        };
        let data = SpanData {
            trace_id: cx.span.trace_id,
            span_id: cx.span.span_id,
            parent: cx.parent,
            trace_state: cx.state,
            name: (method, route),
            kind: Kind::Server,
            start,
            end: start,
            attributes: a,
            status,
        };
        Some(OpenSpan::new(cx.tracer, data))
    }
}

/// Where an upstream attempt goes.
pub struct Target<'a> {
    /// The upstream's name in the config.
    pub upstream: &'a Arc<str>,
    /// The target's configured `host:port`.
    pub authority: &'a Authority,
    /// Its resolved address.
    pub addr: SocketAddr,
}

/// The span of one upstream attempt; not recorded when the request's span is not.
pub struct ClientSpan {
    /// Boxed: the proxy's request future carries a `ClientSpan` across each attempt, traced
    /// or not, and a recording inline would add its size to every proxied request's state.
    recording: Option<Box<Recording>>,
}

struct Recording {
    tracer: Arc<Tracer>,
    span: SpanContext,
    parent: SpanContext,
    state: Option<HeaderValue>,
    start: Duration,
    attributes: Attributes,
}

impl TraceCx {
    /// Starts the span of an upstream attempt and puts its `traceparent` (and the carried
    /// `tracestate`) into the attempt's headers, replacing the client's.
    pub fn start_client(
        &self,
        method: &Method,
        target: Target<'_>,
        resend_count: usize,
        headers: &mut HeaderMap,
    ) -> ClientSpan {
        if !self.sampled() {
            inject(headers, &self.span, self.state.as_ref());
            return ClientSpan { recording: None };
        }
        let span = SpanContext {
            span_id: new_span_id(),
            ..self.span
        };
        inject(headers, &span, self.state.as_ref());
        let mut a = Vec::with_capacity(9);
        push_method(&mut a, method);
        a.push(("server.address", Value::Host(target.authority.clone())));
        a.push(("server.port", Value::Int(i64::from(target.addr.port()))));
        a.push(("network.peer.address", Value::Ip(target.addr.ip())));
        a.push(("gateway.upstream", Value::Shared(target.upstream.clone())));
        if resend_count > 0 {
            a.push(("http.request.resend_count", Value::Int(resend_count as i64)));
        }
        ClientSpan {
            recording: Some(Box::new(Recording {
                tracer: self.tracer.clone(),
                span,
                parent: self.span,
                state: self.state.clone(),
                start: span::now(),
                attributes: a,
            })),
        }
    }
}

impl ClientSpan {
    /// Ends the attempt with the upstream's status; `retried` when the gateway tried another
    /// target after it (a 502, 503 or 504), whose response is dropped.
    pub fn end_response(self, status: StatusCode, retried: bool) {
        if let Some(r) = self.recording {
            let (r, outcome) = (*r).response(status, retried);
            r.finish(outcome);
        }
    }

    /// Notes the upstream's response head; a recorded span is returned open, to be ended when
    /// the upstream's body has been read.
    pub fn end_head(self, status: StatusCode) -> Option<OpenSpan> {
        let (r, outcome) = (*self.recording?).response(status, false);
        let tracer = r.tracer.clone();
        Some(OpenSpan::new(tracer, r.into_data(outcome)))
    }

    /// Ends the attempt with the error that ended it (connect, timeout, broken response).
    pub fn end_error(self, error: &GatewayError, retried: bool) {
        let Some(mut r) = self.recording else { return };
        let kind = match error {
            GatewayError::UpstreamConnect { .. } => "connect_error",
            GatewayError::UpstreamTimeout(_) => "timeout",
            GatewayError::UpstreamFailed { .. } => "response_error",
            GatewayError::RequestBody(_) => "request_body_error",
            _ => "_OTHER",
        };
        r.attributes.push(("error.type", Value::Static(kind)));
        let mut message = error.to_string();
        if let Some(source) = std::error::Error::source(error) {
            message.push_str(": ");
            message.push_str(&source.to_string());
        }
        if retried {
            message.push_str("; retried on another target");
        }
        r.finish(Status::Error(message.into()));
    }
}

impl Recording {
    /// Notes the upstream's status; returns the outcome it makes.
    fn response(mut self, status: StatusCode, retried: bool) -> (Self, Status) {
        self.attributes.push((
            "http.response.status_code",
            Value::Int(i64::from(status.as_u16())),
        ));
        // Client spans fail on 4xx too (semantic conventions): the call did not do its job.
        let outcome = if status.is_client_error() || status.is_server_error() || retried {
            self.attributes
                .push(("error.type", Value::Owned(status.as_str().into())));
            let message = if retried {
                "retried on another target"
            } else {
                ""
            };
            Status::Error(message.into())
        } else {
            Status::Unset
        };
        (self, outcome)
    }

    fn finish(self, status: Status) {
        let tracer = self.tracer.clone();
        let mut data = self.into_data(status);
        data.end = span::now();
        tracer.record(data);
    }

    /// The span as queued (its end still to be set).
    fn into_data(self, status: Status) -> SpanData {
        let method = self
            .attributes
            .first()
            .map_or(Value::Static("HTTP"), |(_, m)| match m {
                Value::Static("_OTHER") => Value::Static("HTTP"),
                m => m.clone(),
            });
        SpanData {
            trace_id: self.span.trace_id,
            span_id: self.span.span_id,
            parent: Parent::Local(self.parent.span_id),
            trace_state: self.state,
            name: (method, None),
            kind: Kind::Client,
            start: self.start,
            end: self.start,
            attributes: self.attributes,
            status,
        }
    }
}

/// A span the gateway opens around work it does for a trace, such as a plugin's HTTP call:
/// the proxy's attempts become its children. A child of the request's span when there is one,
/// else the root of a new trace.
pub struct InternalSpan {
    cx: TraceCx,
    start: Duration,
    name: &'static str,
    attributes: Attributes,
}

impl InternalSpan {
    /// Starts the span `name` under `parent` (or a new trace on `tracer`).
    pub fn start(
        tracer: &Arc<Tracer>,
        parent: Option<&TraceCx>,
        name: &'static str,
        attributes: Attributes,
    ) -> Self {
        let cx = match parent {
            Some(p) => TraceCx {
                tracer: p.tracer.clone(),
                span: SpanContext {
                    span_id: new_span_id(),
                    ..p.span
                },
                parent: Parent::Local(p.span.span_id),
                state: p.state.clone(),
            },
            None => tracer.root(),
        };
        Self {
            cx,
            start: span::now(),
            name,
            attributes,
        }
    }

    /// The context its children start under.
    pub fn context(&self) -> &TraceCx {
        &self.cx
    }

    /// Ends the span, failed when `error` says why.
    pub fn end(self, error: Option<String>) {
        if !self.cx.sampled() {
            return;
        }
        self.cx.tracer.record(SpanData {
            trace_id: self.cx.span.trace_id,
            span_id: self.cx.span.span_id,
            parent: self.cx.parent,
            trace_state: self.cx.state,
            name: (Value::Static(self.name), None),
            kind: Kind::Internal,
            start: self.start,
            end: span::now(),
            attributes: self.attributes,
            status: error.map_or(Status::Unset, |e| Status::Error(e.into())),
        });
    }
}

/// `http.request.method` (first, so the span name can reuse it): the method when it is one
/// of the standard ones, else `_OTHER` with the original in `http.request.method_original`.
fn push_method(a: &mut Attributes, m: &Method) {
    let known = match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "_OTHER",
    };
    a.push(("http.request.method", Value::Static(known)));
    if known == "_OTHER" {
        a.push((
            "http.request.method_original",
            Value::Owned(m.as_str().into()),
        ));
    }
}

fn protocol_version(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}
