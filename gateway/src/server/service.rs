//! The request entry point shared by every protocol: route lookup, the filter chain and
//! terminal, request metrics, the request's server span (ended with the response body) and
//! the access log. Errors never reach hyper; they are responses by now.

use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use arc_swap::ArcSwap;
use futures_util::future::Either;
use http::{HeaderValue, Request, Response, StatusCode, Version, header};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::body::Body;
use crate::connection::ConnInfo;
use crate::context::RequestCx;
use crate::error::error_response;
use crate::filter::{Started, Tail, with_server};
use crate::generation::{CompiledRoute, Generation};
use crate::router::request_host;
use crate::server::idle::Activity;
use crate::server::policy::{self, ListenerPolicy};
use crate::telemetry::trace::{self, ServerSpan, with_current};
use crate::telemetry::{
    AccessLog, AccessRecord, LogNotes, RequestText, RouteMetrics, Telemetry, protocol_text,
};
use crate::terminal::{BoxedResponse, Terminal};

/// A request's future: the response, when it was ready at once (a synthetic response on a
/// route without filters, a request refused before routing); a terminal's own boxed future
/// with what the rest of the request needs beside it, once every request hook has run
/// ([`Finishing`]); or one boxed future (a filter that waits, a request body the filters
/// read). hyper keeps room for this future in every HTTP/1 connection for the connection's
/// whole life, so it is kept to the size of a response.
pub type Handled = Either<Ready<Response<Body>>, Either<Finishing, BoxedResponse>>;

/// What the connections of one listener share, made once per listener and (re)load: a
/// connection's service points to it rather than holding a copy of each setting, which every
/// open connection would carry for its life.
pub struct ServiceSettings {
    /// The live generation (swapped on reload).
    pub generation: Arc<ArcSwap<Generation>>,
    /// The listener's limits and response headers.
    pub policy: Arc<ListenerPolicy>,
    /// Longest wait for the next bytes of a request body; `None`: no limit.
    pub body_read_timeout: Option<std::time::Duration>,
    /// Metrics and access log.
    pub telemetry: Arc<Telemetry>,
    /// `Alt-Svc` for every response, when the listener also serves HTTP/3.
    pub alt_svc: Option<HeaderValue>,
    /// ACME HTTP-01 answers, on plain listeners.
    pub http01: Option<Arc<crate::certs::challenge::Challenges>>,
}

/// State shared by the requests of one connection; the listener's settings are read through
/// it (`Deref`).
pub struct ConnService {
    /// The listener's settings.
    pub settings: Arc<ServiceSettings>,
    /// Connection facts.
    pub conn: Arc<ConnInfo>,
    /// Idle/header-timeout bookkeeping.
    pub activity: Arc<Activity>,
}

impl std::ops::Deref for ConnService {
    type Target = ServiceSettings;

    fn deref(&self) -> &ServiceSettings {
        &self.settings
    }
}

/// [`ConnService`] as hyper's service. Its future is the request's own ([`Served`]), not a
/// combinator around it: hyper keeps room for that future in every HTTP/1 connection, and a
/// mapping combinator moves its whole state out when it completes.
pub struct HyperService(pub Arc<ConnService>);

impl hyper::service::Service<Request<Incoming>> for HyperService {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Served;

    fn call(&self, req: Request<Incoming>) -> Served {
        Served(self.0.call(req))
    }
}

/// A request's future as hyper takes it: the response, never an error.
pub struct Served(Handled);

impl Future for Served {
    type Output = Result<Response<Body>, std::convert::Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(Ok)
    }
}

/// What the end of a request needs, taken from it before it moves on.
struct RequestEnd {
    start: Instant,
    version: Version,
    head_only: bool,
    /// [`RequestCx::private_head`].
    private_head: bool,
    log: Option<Arc<AccessLog>>,
    // Boxed, as the span: only an access log or a tracer makes them, and inline they would
    // add 260 bytes to every waiting request's boxed future, which is copied whole into its
    // box and touched on every request.
    facts: Option<Box<RequestFacts>>,
    span: Option<Box<ServerSpan>>,
    /// The request's own facts, when a trusted proxy named its client (the connection's
    /// otherwise).
    client: Option<Arc<ConnInfo>>,
    /// Counts the request in flight on the connection until the response head (or until the
    /// request is abandoned).
    _in_flight: Option<InFlight>,
}

/// A request in flight on an HTTP/1 or HTTP/2 connection, for its idle bookkeeping.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

impl ConnService {
    /// Serves one hyper request (HTTP/1.1 or HTTP/2).
    pub fn call(self: &Arc<Self>, req: Request<Incoming>) -> Handled {
        // ACME HTTP-01 answers come before any route: one atomic load while none is pending.
        if let Some(answer) = self
            .http01
            .as_ref()
            .and_then(|c| c.http_answer(req.uri().path()))
        {
            return Either::Left(ready(crate::certs::challenge::http01_response(answer)));
        }
        self.activity
            .request_started(req.version() == http::Version::HTTP_2);
        let in_flight = InFlight(self.activity.clone());
        let limit = self.body_read_timeout;
        let req = req.map(|b| match limit {
            Some(limit) => policy::incoming_with_timeout(b, limit),
            None => Body::incoming(b),
        });
        self.serve(req, Some(in_flight), None, false)
    }

    /// Serves one request of any protocol.
    pub fn handle(self: &Arc<Self>, req: Request<Body>) -> Handled {
        self.serve(req, None, None, false)
    }

    /// Serves one of the HTTP/1.1 fast path's requests, whose head is a copy of its own
    /// ([`RequestCx::private_head`]). `routed`: the route the fast path found from the raw head
    /// (the generation it looked in and the route's index), after checking the URI's length and
    /// that the entry rules leave it as it is ([`crate::request::passes_unchanged`]); without
    /// it, the request is routed here as [`Self::handle`] does.
    pub fn handle_routed(
        self: &Arc<Self>,
        req: Request<Body>,
        routed: Option<(Arc<Generation>, usize)>,
    ) -> Handled {
        self.serve(req, None, routed, true)
    }

    fn serve(
        self: &Arc<Self>,
        mut req: Request<Body>,
        in_flight: Option<InFlight>,
        routed: Option<(Arc<Generation>, usize)>,
        private_head: bool,
    ) -> Handled {
        // Only copy request facts out when an access log will use them.
        let log = self.telemetry.access_log.load_full();
        // Behind a trusted proxy the client is the request's: named before anything records it.
        let client = self.policy.client_of(&self.conn, req.headers());
        let conn = client.as_ref().unwrap_or(&self.conn);
        let end = RequestEnd {
            start: Instant::now(),
            version: req.version(),
            head_only: req.method() == http::Method::HEAD,
            private_head,
            facts: log.as_ref().map(|_| Box::new(RequestFacts::of(&req))),
            log,
            // Without `telemetry.traces` this load is all the tracing a request costs.
            span: self
                .telemetry
                .tracer
                .load_full()
                .map(|t| Box::new(ServerSpan::start(&t, &req, conn))),
            _in_flight: in_flight,
            client,
        };
        let (generation, index) = match routed {
            Some(routed) => {
                self.policy.admit_entered(&mut req);
                routed
            }
            None => {
                let generation = self.generation.load_full();
                match self.route(&generation, &mut req) {
                    Ok(index) => (generation, index),
                    Err(status) => {
                        let server = generation.server_header.as_ref();
                        let mut res = with_server(error_response(status), server);
                        let unrouted = (&Arc::from(""), &generation.unrouted);
                        self.finish(end, &mut res, unrouted, None);
                        return Either::Left(ready(res));
                    }
                }
            }
        };
        let route = generation.router.route(index);
        let server = generation.server_header.as_ref();
        // Native filters answer their head hooks without waiting and a synthetic response is
        // made at once: most requests end here, and the rest continue from the first hook or
        // terminal that waits.
        let cx = || self.request_cx(&end, route);
        let rest = match route.chain.start(&route.terminal, req, cx, server) {
            Started::Done(mut res) => {
                let terminal = Some(&route.terminal);
                self.finish(end, &mut res, (&route.name, &route.metrics), terminal);
                return Either::Left(ready(res));
            }
            // The terminal's future is the request's one allocation: the rest is kept beside
            // it, not boxed around it with a copy of the request's state.
            Started::Terminal(fut, tail) => {
                return Either::Right(Either::Left(Finishing {
                    fut,
                    then: tail.map_or(Then::Server, Then::Filters),
                    end: Some(end),
                    svc: self.clone(),
                    generation,
                    index,
                }));
            }
            Started::Wait(rest) => rest,
        };
        let svc = self.clone();
        Either::Right(Either::Right(Box::pin(async move {
            let route = generation.router.route(index);
            let server = generation.server_header.as_ref();
            let run = rest.resume(&route.chain, &route.terminal, server);
            let mut res = in_trace(&end, run).await;
            let terminal = Some(&route.terminal);
            svc.finish(end, &mut res, (&route.name, &route.metrics), terminal);
            res
        })))
    }

    fn request_cx(&self, end: &RequestEnd, route: &CompiledRoute) -> RequestCx {
        RequestCx {
            conn: end.client.as_ref().unwrap_or(&self.conn).clone(),
            route: route.name.clone(),
            start: end.start,
            trace: end.span.as_ref().map(|s| s.context().clone()),
            request_head: None,
            jwt: None,
            user: None,
            private_head: end.private_head,
        }
    }

    /// The route for a request, by index into the generation's router, or the status that
    /// refuses it (limits, no listener, no route).
    fn route(&self, generation: &Generation, req: &mut Request<Body>) -> Result<usize, StatusCode> {
        self.policy.admit(req)?;
        let listener = generation
            .listener_index(&self.conn.listener)
            .ok_or(StatusCode::NOT_FOUND)?;
        let uri = req.uri();
        let host = if generation.router.matches_hosts() {
            request_host(uri, req.headers())
        } else {
            ""
        };
        generation
            .router
            .find_index_query(
                listener,
                req.method(),
                host,
                uri.path(),
                uri.query(),
                req.headers(),
            )
            .ok_or(StatusCode::NOT_FOUND)
    }

    /// Adds the listener's fields to a response: HSTS and `Alt-Svc` (over any the response has).
    pub fn decorate(&self, res: &mut Response<Body>) {
        self.policy.decorate(res);
        if let Some(v) = &self.alt_svc {
            res.headers_mut().insert(header::ALT_SVC, v.clone());
        }
    }

    /// The end of every request: listener headers, metrics, the span's head, the access log.
    /// (The response by reference: it is a few hundred bytes, copied on every move.)
    fn finish(
        &self,
        end: RequestEnd,
        res: &mut Response<Body>,
        (route_name, metrics): (&Arc<str>, &RouteMetrics),
        terminal: Option<&Terminal>,
    ) {
        self.decorate(res);
        if res.status() == StatusCode::SWITCHING_PROTOCOLS {
            // The connection stops being HTTP/1 once this goes out: its framing checks stop.
            self.activity.switch_protocols();
        }
        metrics.record(end.version, res.status(), end.start.elapsed());
        // A recorded span stays open until the response body has been sent.
        let open = end
            .span
            .and_then(|s| (*s).end_head(res.status(), route_name));
        if let (Some(log), Some(mut facts)) = (end.log, end.facts) {
            facts.upstream = terminal.and_then(|t| t.served_by(res));
            facts.notes = res.extensions_mut().remove::<LogNotes>().map(Box::new);
            let record = (*facts).into_record(
                end.client.as_ref().unwrap_or(&self.conn),
                end.version,
                res.status(),
                body_bytes(res),
                end.start.elapsed(),
                route_name.clone(),
            );
            log.log_traced(record, open.as_ref());
        }
        if let Some(open) = open {
            let status = res.status();
            let no_body = end.head_only
                || status.is_informational()
                || status == StatusCode::NO_CONTENT
                || status == StatusCode::NOT_MODIFIED;
            let body = std::mem::take(res.body_mut());
            *res.body_mut() = open.attach(body, no_body);
        }
    }
}

/// A request whose terminal waits after every request hook has run (`Started::Terminal`): the
/// terminal's boxed future, then the response hooks and the end of the request. A named
/// future, not an `async` block, so that it needs no box of its own.
pub struct Finishing {
    fut: BoxedResponse,
    /// What `fut`'s response goes through before the end of the request.
    then: Then,
    /// Taken when the response is ready.
    end: Option<RequestEnd>,
    svc: Arc<ConnService>,
    generation: Arc<Generation>,
    index: usize,
}

/// What a terminal's response goes through in [`Finishing`].
enum Then {
    /// A route without filters: the `Server` header.
    Server,
    /// The filters' response hooks.
    Filters(Tail),
    /// Nothing more: `fut` is the rest of the chain, resumed where a response hook waited.
    Nothing,
}

impl Future for Finishing {
    type Output = Response<Body>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response<Body>> {
        let this = &mut *self;
        loop {
            let trace = this.end.as_ref().and_then(|h| h.span.as_deref());
            let res = ready!(with_current(trace.map(ServerSpan::context), || this
                .fut
                .as_mut()
                .poll(cx)));
            let route = this.generation.router.route(this.index);
            let server = this.generation.server_header.as_ref();
            let mut res = match std::mem::replace(&mut this.then, Then::Nothing) {
                Then::Server => with_server(res, server),
                Then::Nothing => res,
                Then::Filters(tail) => match route.chain.after_terminal(tail, res, server) {
                    Ok(res) => res,
                    Err(rest) => {
                        // A response hook waits (rare: native filters answer at once). The
                        // rest is a future of its own, owning the generation it runs on.
                        let generation = this.generation.clone();
                        let index = this.index;
                        this.fut = Box::pin(async move {
                            let route = generation.router.route(index);
                            let server = generation.server_header.as_ref();
                            rest.resume(&route.chain, &route.terminal, server).await
                        });
                        continue;
                    }
                },
            };
            let end = this
                .end
                .take()
                .expect("`Finishing` polled after it finished");
            let terminal = Some(&route.terminal);
            this.svc
                .finish(end, &mut res, (&route.name, &route.metrics), terminal);
            return Poll::Ready(res);
        }
    }
}

/// Runs `fut` with the request's trace as the task's current one, for work started without a
/// context; without a trace, `fut` itself.
/// (A plain function: an `async fn` would store `fut` twice.)
fn in_trace<F: Future>(end: &RequestEnd, fut: F) -> impl Future<Output = F::Output> {
    trace::scope_some(end.span.as_ref().map(|s| s.context().clone()), fut)
}

/// What the access log needs from the request, copied before the request moves on (here from
/// hyper's request; the HTTP/1.1 fast path makes them from the raw head).
pub(crate) struct RequestFacts {
    pub(crate) time: std::time::SystemTime,
    pub(crate) method: http::Method,
    pub(crate) text: RequestText,
    /// The upstream the request was proxied to, once known.
    pub(crate) upstream: Option<Arc<str>>,
    /// What the route's filters and terminal said about it, once known.
    pub(crate) notes: Option<Box<LogNotes>>,
}

impl RequestFacts {
    fn of(req: &Request<Body>) -> Self {
        let header = |name| req.headers().get(name).map_or(&[][..], |v| v.as_bytes());
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let host = request_host(req.uri(), req.headers());
        Self {
            time: std::time::SystemTime::now(),
            method: req.method().clone(),
            text: RequestText::new(
                target,
                host,
                header(header::USER_AGENT),
                header(header::REFERER),
            ),
            upstream: None,
            notes: None,
        }
    }

    /// The record of the request, answered with `status` and `bytes` of body.
    pub(crate) fn into_record(
        self,
        conn: &ConnInfo,
        version: http::Version,
        status: StatusCode,
        bytes: u64,
        duration: std::time::Duration,
        route: Arc<str>,
    ) -> AccessRecord {
        AccessRecord {
            time: self.time,
            client: conn.client.ip(),
            method: self.method,
            request: self.text,
            protocol: protocol_text(version),
            status: status.as_u16(),
            bytes,
            duration,
            route,
            upstream: self.upstream,
            trace_id: None,
            notes: self.notes,
        }
    }
}

/// A response's body length for the access log: its `Content-Length` (also on `HEAD`), else
/// the body's exact size, else 0 (streamed).
fn body_bytes(res: &Response<Body>) -> u64 {
    res.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .or_else(|| http_body::Body::size_hint(res.body()).exact())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hyper keeps room for the service's future in every HTTP/1 connection: it must stay a
    /// response beside a pointer, not grow back to kilobytes of inline request state.
    #[test]
    fn the_future_hyper_keeps_per_connection_stays_small() {
        let size = std::mem::size_of::<Handled>();
        assert!(
            size <= std::mem::size_of::<Response<Body>>() + 16,
            "service future is {size} bytes"
        );
    }
}
