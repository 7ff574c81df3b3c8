//! Terminal `proxy`: the reverse proxy.
//!
//! A request is rewritten once (hop-by-hop headers out, forwarding headers in, `strip_prefix`),
//! then tried on targets chosen by the upstream's balancer. An attempt checks a connection out
//! of the target's pool, sends, and waits for the response head within the upstream's
//! `timeout` (the client's waits while its body goes up do not use it up: [`pace`]). Idempotent
//! requests whose body is empty or was never sent are retried on another target (up to
//! `retries`) after a connect failure, a timeout, a broken response, or a 502, 503 or 504 from
//! the upstream. Outcomes feed the target's passive health by the rule in [`outcome`]. The
//! response body streams back through [`body`], which returns the connection to its pool at the
//! end. When the request is traced, each attempt gets a client span and carries its
//! `traceparent` upstream.
//!
//! Module map: [`upstream`] (per-generation upstreams and their tasks), [`pool`] (keep-alive
//! connections), [`connect`] (TCP, TLS, handshakes), [`h1`] (the HTTP/1.1 client driven in the
//! request's task), [`tls`], [`headers`], [`trailers`] (the fields a trailer never carries),
//! [`body`], [`upgrade`] (WebSocket), [`health`] (active checks), [`outcome`] (what counts
//! against a target), [`pace`] (the client's share of an attempt's time).

mod attempt;
mod body;
mod connect;
pub mod deadline;
mod h1;
pub(crate) mod headers;
mod health;
mod mirror;
mod outcome;
mod pace;
mod pool;
mod split;
mod text;
pub mod tls;
pub(crate) mod trailers;
mod upgrade;
mod upstream;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
pub use text::{Answer, Forwarding, Replaced, TextRequest};

use bytes::Bytes;
use deadline::Deadline;
use futures_util::future::Either;
use http::header::HeaderValue;
use http::uri::{Authority, PathAndQuery};
use http::{Method, Request, Response, StatusCode, Version};
use stream_proxy::upstream::Selection;
use tokio::time::Sleep;

pub use split::{ServedBy, Split, terminal};
pub use upstream::{Upstream, Upstreams};

use self::body::RawBody;
use self::connect::ConnectError;
use self::outcome::{Tries, Turn};
use self::pool::Pool;
use crate::body::Body;
use crate::context::RequestCx;
use crate::error::{GatewayError, error_response};
use crate::request::OriginalTarget;
use crate::telemetry::LogNotes;
use crate::telemetry::trace::TraceCx;
use crate::telemetry::trace::http_spans::Target;

/// Marks an answer the proxy made itself because no target answered (refused, reset, timed
/// out, none healthy), as against one a target sent: a filter calling an upstream
/// (`forward_auth`) tells its service's own `503` from the service being down.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamFailure {
    /// The attempt ran out of the upstream's `timeout`.
    pub timed_out: bool,
}

/// A route's proxy terminal: the upstream (shared by every route naming it) and this route's
/// rewriting settings.
pub struct ProxyRoute {
    upstream: Arc<Upstream>,
    /// Without a trailing slash; `None` when nothing is stripped.
    strip_prefix: Option<Box<str>>,
    preserve_host: bool,
    upgrades: upgrade::AllowedUpgrades,
    /// Whole-response deadline per attempt (the route's, else the upstream's); `None` when 0.
    timeout: Option<Duration>,
    /// Extra attempts (the route's, else the upstream's).
    retries: u32,
    /// Where copies of the requests go, when the route mirrors.
    mirror: Option<Arc<mirror::Mirror>>,
    /// A mirror's route: its failures are counted, not logged one by one (a dead shadow
    /// would log every copy).
    shadow: bool,
}

/// The rewritten request line (method and path) and the authority to send with it (`Host`,
/// `:authority`), shared by the request's attempts.
struct RequestLine {
    method: Method,
    path: PathAndQuery,
    /// Client's `Host` to send upstream (`preserve_host`), HTTP/1.1.
    host: Option<HeaderValue>,
    /// Client's authority to send upstream (`preserve_host`), HTTP/2.
    authority: Option<Authority>,
}

/// A response head received on an attempt, with what its body still holds.
struct Sent {
    response: Response<RawBody>,
    deadline: Deadline,
}

/// Why an attempt failed, and the request's body back when it was never sent (so it can be
/// retried even with a body).
struct Failed {
    error: GatewayError,
    unsent: Option<Body>,
}

/// The client's request, rewritten once for all its attempts.
struct Rewritten {
    line: RequestLine,
    /// The fields as the upstream gets them, as field lines ([`text::forward_fields`]): lent to
    /// every attempt on the proxy's own HTTP/1.1 client ([`h1::Shared`]), read into a header
    /// map for each attempt on hyper's clients (HTTP/2, a protocol switch).
    fields: Bytes,
    /// The `Content-Length` the client declared, for a body of unknown length.
    declared_length: Option<u64>,
    /// Taken by an attempt; back when the attempt failed without sending it.
    body: Option<Body>,
    /// The client's waits while the body goes up (for the attempts' deadlines) and its
    /// failure; `None` when the body cannot keep the gateway waiting.
    pace: Option<Arc<pace::Pace>>,
    /// The targets tried, in the balancer's order (the request's key for it), and the retries.
    tries: Tries<(Sent, Selection)>,
    body_empty: bool,
    upgrading: bool,
    websocket_over_h2: bool,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
}

impl ProxyRoute {
    /// Builds the terminal for one route.
    pub fn new(cfg: &gateway_config::model::ProxyConfig, upstream: Arc<Upstream>) -> Self {
        let strip_prefix = cfg
            .strip_prefix
            .as_deref()
            .map(|p| p.trim_end_matches('/'))
            .filter(|p| !p.is_empty())
            .map(Box::from);
        let timeout = cfg
            .timeout
            .map_or(upstream.timeout, |t| Some(t.get()).filter(|t| !t.is_zero()));
        Self {
            retries: cfg.retries.unwrap_or(upstream.retries),
            timeout,
            upstream,
            strip_prefix,
            preserve_host: cfg.preserve_host,
            upgrades: upgrade::AllowedUpgrades::new(&cfg.upgrades),
            mirror: None,
            shadow: false,
        }
    }

    /// The route with copies of its requests sent to `mirror`.
    fn mirrored(mut self, mirror: Option<Arc<mirror::Mirror>>) -> Self {
        self.mirror = mirror;
        self
    }

    /// Whether the route copies requests to a mirror (the fast path leaves such routes to the
    /// general path, which tees bodies).
    pub fn mirrors(&self) -> bool {
        self.mirror.is_some()
    }

    /// How many other targets a request may try after its first: the route's `retries` for
    /// an idempotent method, none for another or for a protocol switch.
    fn retries_for(&self, method: &Method, upgrading: bool) -> usize {
        if is_idempotent(method) && !upgrading {
            self.retries as usize
        } else {
            0
        }
    }

    /// The name of the upstream the route forwards to.
    pub fn upstream_name(&self) -> &Arc<str> {
        &self.upstream.name
    }

    /// Forwards one request; every failure becomes a response here.
    ///
    /// The request is rewritten before the future is made, so the future holds the rewritten
    /// parts only, not the client's request beside them: its state is copied whole when the
    /// request's future is boxed, and every byte of it is a cache line to touch on every
    /// proxied request.
    ///
    /// The future owns what it uses (the route, the request's trace), so the service can keep
    /// it as the request's only box rather than box it again inside its own future.
    pub fn forward(
        self: &Arc<Self>,
        req: Request<Body>,
        cx: &RequestCx,
    ) -> impl Future<Output = Response<Body>> + Send + 'static {
        match self.rewrite(req, cx) {
            Ok((rewritten, mirrored)) => {
                // Boxed: inline, a trace would grow every proxied request's future, traced or
                // not.
                let trace = cx.trace.clone().map(Box::new);
                let answer = self.clone().try_targets(rewritten, trace);
                Either::Right(match mirrored {
                    None => Either::Left(answer),
                    // Boxed: inline, it would double every proxied request's future.
                    Some(note) => Either::Right(Box::pin(async move {
                        let mut res = answer.await;
                        LogNotes::on(res.extensions_mut()).mirror = Some(note);
                        res
                    })),
                })
            }
            Err(refused) => Either::Left(std::future::ready(error_response(refused))),
        }
    }

    /// The request as every attempt sends it, or the status that refuses it.
    /// With it, what the access log says of the route's mirror ([`mirror::Mirror::select`]).
    fn rewrite(
        &self,
        mut req: Request<Body>,
        cx: &RequestCx,
    ) -> Result<(Rewritten, Option<&'static str>), StatusCode> {
        let up = &self.upstream;
        let websocket_over_h2 = upgrade::is_websocket_connect(&req);
        if req.method() == Method::CONNECT
            && !(websocket_over_h2 && self.upgrades.allows("websocket"))
        {
            // Not a forward proxy: plain CONNECT tunnels are not offered, nor WebSocket ones
            // where the route does not allow WebSocket.
            return Err(StatusCode::METHOD_NOT_ALLOWED);
        }
        let h2 = up.connector.is_h2();
        if websocket_over_h2 && h2 {
            // WebSocket to an HTTP/2 upstream would need extended CONNECT upstream too.
            return Err(StatusCode::NOT_IMPLEMENTED);
        }
        // A switch to a protocol the route does not allow is not asked of the upstream: the
        // request goes on as an ordinary one, its `Upgrade` and `Connection` removed below.
        let upgrading = !h2
            && (websocket_over_h2
                || (req.version() <= Version::HTTP_11
                    && headers::wants_upgrade(req.headers())
                    && self.upgrades.allow_all_offered(req.headers())));
        let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut req));

        let (mut parts, body) = req.into_parts();
        let key = up.hash_key(&parts, cx);
        let client_host = headers::client_authority(&parts.uri, &parts.headers);
        let via = headers::via(parts.version);
        if websocket_over_h2 {
            upgrade::connect_to_http1(&mut parts);
        }
        let declared_length = gateway_http1::request::declared_length(&parts.headers);
        let fields = text::forward_map(
            &parts.headers,
            &text::Hop {
                host: client_host.as_ref().map(HeaderValue::as_bytes),
                upgrading,
                via: via.as_bytes(),
            },
            cx.conn.peer_text(),
        );
        let line = RequestLine {
            // The listener may forward the target as the client wrote it; routing and the
            // filters saw the normalized one.
            path: self.upstream_path(
                parts
                    .extensions
                    .get::<OriginalTarget>()
                    .map(|o| &o.0)
                    .or(parts.uri.path_and_query()),
            ),
            authority: (self.preserve_host && h2)
                .then(|| parts.uri.authority().cloned())
                .flatten()
                .or_else(|| {
                    let h = client_host.as_ref().filter(|_| self.preserve_host && h2)?;
                    Authority::try_from(h.as_bytes()).ok()
                }),
            host: client_host.filter(|_| self.preserve_host && !h2),
            method: parts.method,
        };
        let tries = Tries::new(key, self.retries_for(&line.method, upgrading));
        let body_empty = http_body::Body::is_end_stream(&body);
        // hyper's clients (HTTP/2, a protocol switch) write whatever trailers they are given;
        // the proxy's own HTTP/1.1 client leaves the forbidden ones out as it writes them.
        let body = if (h2 || upgrading) && !body_empty {
            trailers::stripped(body)
        } else {
            body
        };
        // A copy's body is teed from the client's as it goes up, before the pacing that
        // the copy gets again on its own side.
        let (body, copy, mirrored) = match &self.mirror {
            Some(m) if !upgrading => m.select(body, body_empty),
            _ => (body, None, None),
        };
        let (body, pace) = pace::paced(body, body_empty, self.timeout);
        let mut line = line;
        if !cx.private_head {
            headers::detach(&mut line.path, &mut line.host);
        }
        if let (Some(m), Some(copy)) = (&self.mirror, copy) {
            m.send(copy, &line, &fields, declared_length, body_empty);
        }
        let rewritten = Rewritten {
            line,
            fields,
            declared_length,
            body: Some(body),
            pace,
            tries,
            body_empty,
            upgrading,
            websocket_over_h2,
            client_upgrade,
        };
        Ok((rewritten, mirrored))
    }

    /// Tries the upstream's targets in the balancer's order until one answers or the retries
    /// run out. A plain function returning a block rather than an `async fn`, which would keep
    /// `req` twice in its state (the argument, then the local it is moved into).
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async fn` would keep its arguments twice in its state"
    )]
    fn try_targets(
        self: Arc<Self>,
        mut req: Rewritten,
        trace: Option<Box<TraceCx>>,
    ) -> impl Future<Output = Response<Body>> + Send + 'static {
        async move {
            let up = &self.upstream;
            // Hyper's clients take a request of their own; the proxy's HTTP/1.1 client writes
            // the rewritten fields from where they are.
            let lends = !req.upgrading && !up.connector.is_h2();
            // The loop ends with the response made from the chosen attempt's, or (when the
            // body's first frame was not there yet) a boxed future of it, awaited after the loop
            // so that the state kept across that await holds none of the loop's locals.
            let responding = loop {
                let selection = match req.tries.next(up) {
                    Turn::Try(selection) => selection,
                    Turn::End(Ok((sent, selection))) => {
                        break self.respond(sent, selection, None, &mut req);
                    }
                    Turn::End(Err(error)) => return self.fail(error),
                };
                let index = selection.index();
                let Some(pool) = Upstream::pool(&selection) else {
                    return self.fail(GatewayError::NoHealthyTarget(up.name.to_string()));
                };
                let span;
                // The request is made and moved into the attempt in this block, so the state
                // kept across the attempt does not hold it a second time.
                let attempt = {
                    let body = req.body.take().unwrap_or_default();
                    let (mut attempt_req, shared) = if lends {
                        let shared = h1::Shared {
                            host: req
                                .line
                                .host
                                .as_ref()
                                .unwrap_or(&pool.endpoint.host)
                                .as_bytes(),
                            fields: &req.fields,
                            declared_length: req.declared_length,
                        };
                        (self.request(&req.line, None, body, pool), Some(shared))
                    } else {
                        let fields = headers::field_map(&req.fields, req.declared_length);
                        (self.request(&req.line, Some(fields), body, pool), None)
                    };
                    span = trace.as_ref().map(|t| {
                        let target = Target {
                            upstream: &up.name,
                            authority: &pool.endpoint.authority,
                            addr: pool.endpoint.addr,
                        };
                        t.start_client(
                            &req.line.method,
                            target,
                            req.tries.retried(),
                            attempt_req.headers_mut(),
                        )
                    });
                    self.attempt(
                        pool,
                        attempt_req,
                        shared,
                        req.upgrading,
                        req.pace.as_deref(),
                    )
                };
                match attempt.await {
                    Ok(sent) => {
                        let status = sent.response.status();
                        if req.tries.answered(up, &selection, status, req.body_empty) {
                            if let Some(span) = span {
                                span.end_response(status, true);
                            }
                            req.tries.retry(up, index, Ok((sent, selection)));
                            continue;
                        }
                        // The span ends with the upstream's body.
                        let span = span.and_then(|s| s.end_head(status));
                        break self.respond(sent, selection, span, &mut req);
                    }
                    Err(Failed { error, unsent }) => {
                        if let Some(unsent) = unsent {
                            req.body = Some(unsent);
                        }
                        let resendable = req.body_empty || req.body.is_some();
                        let retry = req.tries.failed(up, &selection, &error, resendable);
                        if let Some(span) = span {
                            span.end_error(&error, retry);
                        }
                        if !retry {
                            return self.fail(error);
                        }
                        req.tries.retry(up, index, Err(error));
                    }
                }
            };
            match responding {
                Either::Left(response) => response,
                Either::Right(later) => later.await,
            }
        }
    }

    fn fail(&self, error: GatewayError) -> Response<Body> {
        let timed_out = matches!(error, GatewayError::UpstreamTimeout(_));
        let cause = std::error::Error::source(&error);
        match &error {
            // Every request while all targets are out would log this; the ejections that led
            // here were logged once each.
            GatewayError::NoHealthyTarget(_) => {
                tracing::debug!(upstream = %self.upstream.name, error = %error, "proxying failed")
            }
            _ if self.shadow => {
                tracing::debug!(upstream = %self.upstream.name, error = %error, cause = ?cause, "mirrored copy failed")
            }
            _ => {
                tracing::warn!(upstream = %self.upstream.name, error = %error, cause = ?cause, "proxying failed")
            }
        }
        let mut res = error.into_response();
        res.extensions_mut().insert(UpstreamFailure { timed_out });
        res
    }

    /// The path and query sent upstream, with `strip_prefix` removed at a segment boundary
    /// (`/api` strips `/api` and `/api/x`, not `/apix`).
    fn upstream_path(&self, target: Option<&PathAndQuery>) -> PathAndQuery {
        let Some(target) = target else {
            return PathAndQuery::from_static("/");
        };
        match self.upstream_target(target.as_str(), target.path()) {
            std::borrow::Cow::Borrowed(_) => target.clone(),
            std::borrow::Cow::Owned(s) => {
                PathAndQuery::try_from(s).unwrap_or_else(|_| target.clone())
            }
        }
    }

    /// The target (path and query) sent upstream, as text: `target` with `strip_prefix`
    /// removed from its `path` at a segment boundary, borrowed when nothing is removed. The
    /// fast path calls it on the raw target, [`Self::upstream_path`] on the parsed one.
    fn upstream_target<'t>(&self, target: &'t str, path: &str) -> std::borrow::Cow<'t, str> {
        let Some(prefix) = &self.strip_prefix else {
            return target.into();
        };
        match crate::router::replace_prefix(prefix, "", path) {
            Some(mut rest) => {
                rest.push_str(&target[path.len()..]);
                rest.into()
            }
            None => target.into(),
        }
    }
}

fn connect_error(pool: &Pool, e: ConnectError) -> GatewayError {
    match e {
        ConnectError::Timeout(d) => GatewayError::UpstreamTimeout(d),
        e => GatewayError::UpstreamConnect {
            addr: pool.endpoint.addr.to_string(),
            source: e.into(),
        },
    }
}

/// Runs `f` until the deadline, if there is one; `None` when the deadline came first.
///
/// A future type rather than an `async fn`: an `async fn` keeps `f` twice in its state (the
/// argument, then the future it awaits), and the proxy's request future, which holds this one,
/// is copied whole when it is boxed.
fn until<F: Future>(deadline: &mut Deadline, f: F) -> Until<'_, F> {
    until_paced(deadline, None, f)
}

/// [`until`] for sending a request whose body may keep the gateway waiting for the client:
/// when the deadline passes, `pace` may put it off ([`pace::Pace::postpone`]).
fn until_paced<'a, F: Future>(
    deadline: &'a mut Deadline,
    pace: Option<&'a pace::Pace>,
    f: F,
) -> Until<'a, F> {
    Until {
        inner: f,
        deadline: deadline.as_mut().map(Pin::as_mut),
        pace,
    }
}

pin_project_lite::pin_project! {
    /// See [`until`].
    struct Until<'a, F> {
        #[pin]
        inner: F,
        deadline: Option<Pin<&'a mut Sleep>>,
        pace: Option<&'a pace::Pace>,
    }
}

impl<F: Future> Future for Until<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The work first: an answer that is ready as the deadline passes still counts.
        if let Poll::Ready(out) = this.inner.poll(cx) {
            return Poll::Ready(Some(out));
        }
        let Some(d) = this.deadline else {
            return Poll::Pending;
        };
        loop {
            std::task::ready!(d.as_mut().poll(cx));
            match this
                .pace
                .and_then(|p| p.postpone(tokio::time::Instant::now()))
            {
                // Polled again at once, so the timer is registered for its new time.
                Some(later) => d.as_mut().reset(later),
                None => return Poll::Ready(None),
            }
        }
    }
}

/// Methods RFC 9110 defines as idempotent.
pub(crate) fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

#[cfg(test)]
mod tests {
    /// Every await in `forward` keeps these in its state, and that state is moved whole when the
    /// request's future is boxed: a span or a request inline would add hundreds of bytes to
    /// every proxied request's copies, traced or not.
    #[test]
    fn the_state_an_attempt_carries_stays_small() {
        use std::mem::size_of;
        assert_eq!(size_of::<crate::telemetry::trace::OpenSpan>(), 8);
        let lease = size_of::<super::body::Lease>();
        assert!(lease <= 96, "Lease is {lease} bytes");
        let failed = size_of::<super::Failed>();
        assert!(failed <= 136, "Failed is {failed} bytes");
    }

    // The size of the future a function returns, without calling it (by its arity).
    fn size3<A, B, C, R>(_: impl FnOnce(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// A proxied request's future is boxed whole, and at 1,000 connections every byte of it is
    /// a cache miss: it stays within the allocator's 1,536-byte size class, which an `async fn`
    /// keeping its arguments twice, or the loop keeping an attempt's request and outcome beside
    /// the attempt, would overrun.
    #[test]
    fn a_proxied_request_future_stays_small() {
        let forward = size3(super::ProxyRoute::forward);
        assert!(forward <= 1536, "the proxy's future is {forward} bytes");
    }
}
