//! Runs a route's filters around its terminal. Without filters the terminal is called directly
//! (nothing allocated). With filters, the per-request instances and the request context live on
//! the request's future; only when a request-body or response-body stream, which outlives that
//! future, must still call hooks do they move into one shared, uncontended lock. Hooks a filter
//! can answer without waiting (`on_*_headers_sync`) are called directly, without a boxed future.

use std::future::Future;
use std::ops::ControlFlow::Break;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::future::Either;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header, request, response};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use tokio::sync::Mutex;
use wasm_host::state::copy_head;

use super::{BodyAccess, FilterFactory, Flow, HttpFilter};
use crate::body::{Body, BoxError};
use crate::context::RequestCx;
use crate::error::GatewayError;
use crate::telemetry::trace::{self, TraceCx, with_current};
use crate::terminal::{BoxedResponse, Terminal};

/// A route's compiled filter chain.
#[derive(Clone)]
pub struct Chain {
    factories: Arc<[Arc<dyn FilterFactory>]>,
    request_body: Option<BodyAccess>,
    response_body: bool,
    /// Some filter has a hook after the response head (body, trailers, log).
    after_response: bool,
    /// Some filter reads the request head after its header hook ([`RequestCx::request_head`]).
    reads_request_later: bool,
}

/// Filter instances a request keeps without a separate allocation; routes rarely have more.
const INLINE_FILTERS: usize = 3;

struct State {
    filters: smallvec::SmallVec<[Box<dyn HttpFilter>; INLINE_FILTERS]>,
    cx: RequestCx,
    status: StatusCode,
    /// A local reply given by a request-body hook while the terminal streamed the body in
    /// (boxed: it is rare, and this state is part of every filtered request's future).
    local_reply: Option<Box<Response<Body>>>,
    /// The log phase is over, or filters before `log_next` have had it.
    logged: bool,
    log_next: usize,
    /// Filters that saw the request head; only they get the log phase.
    started: usize,
}

impl State {
    /// The response-body hooks of the filters below `below`, in reverse order, as far as they
    /// answer synchronously; where and why they stopped otherwise.
    fn response_body_now(
        &mut self,
        below: usize,
        chunk: &mut Option<Bytes>,
        eos: bool,
    ) -> Result<(), HookStop> {
        for i in (0..below).rev() {
            match self.filters[i].on_response_body_sync(chunk, eos, &mut self.cx) {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(HookStop::Failed(i, e)),
                None => return Err(HookStop::Waits(i)),
            }
        }
        Ok(())
    }

    /// The log phase as far as the filters answer synchronously; `false` when the rest must
    /// be awaited ([`run_log`]).
    fn log_now(&mut self) -> bool {
        while !self.logged && self.log_next < self.started {
            let i = self.log_next;
            if !self.filters[i].on_log_sync(&self.cx, self.status) {
                return false;
            }
            self.log_next = i + 1;
        }
        self.logged = true;
        true
    }
}

/// How far [`Chain::start`] got.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once and consumed at once; boxing would add an allocation per request"
)]
pub enum Started {
    /// The response, with every hook that applies run.
    Done(Response<Body>),
    /// Every request hook has run and the terminal waits: its future, which owns what it
    /// uses, so the caller can hold it without boxing it again. Its response still needs the
    /// `Server` header ([`with_server`]) without filters, or the response hooks
    /// ([`Chain::after_terminal`]) with them.
    Terminal(BoxedResponse, Option<Tail>),
    /// A filter's step waits; the rest runs in [`Pending::resume`].
    Wait(Pending),
}

/// A request stopped at its first step that waits.
pub struct Pending(Stage);

/// The filters' state of a request whose terminal runs ([`Started::Terminal`]), for its
/// response hooks (boxed: it is kept beside the terminal's future, in the space hyper keeps for
/// a request's future on every connection).
pub struct Tail(Box<State>);

enum Stage {
    /// The request-header hooks from `st.started` on, then the body and the terminal.
    Request {
        st: State,
        parts: request::Parts,
        body: Body,
    },
    /// The response-header hooks from filter `next` down to the first.
    Response {
        st: State,
        upto: usize,
        next: usize,
        response: Response<Body>,
    },
}

impl Pending {
    /// Continues the request where [`Chain::start`] stopped, on the same chain and terminal.
    pub fn resume<'a>(
        self,
        chain: &'a Chain,
        terminal: &'a Terminal,
        server: Option<&'a HeaderValue>,
    ) -> impl Future<Output = Response<Body>> + Send + 'a {
        match self.0 {
            Stage::Request { st, parts, body } => {
                Either::Left(chain.run_filters(terminal, st, parts, body, server))
            }
            Stage::Response {
                mut st,
                upto,
                next,
                response,
            } => Either::Right(async move {
                let response = chain.response_headers(&mut st, next + 1, response).await;
                if !chain.after_response {
                    return response;
                }
                chain.with_body_hooks(st, upto, response)
            }),
        }
    }
}

/// Where a synchronous pass over the request-header hooks ended.
enum HeadPass {
    /// Every hook let the request through.
    Through,
    /// Filter `i` answered with a local reply.
    Reply(usize, Response<Body>),
    /// Filter `i` must be awaited.
    Waits(usize),
}

type Shared = Arc<Mutex<State>>;
type HookFuture = Pin<Box<dyn Future<Output = Result<Option<Bytes>, BoxError>> + Send>>;
/// Trailers handed between a body stream and the future that runs their hooks. The shared
/// cell is made when trailers arrive: nearly every body has none, and a response through a
/// filter's hooks then costs one allocation less. A future that takes the trailers is made
/// only after they arrived, so it shares the cell the stream reads them back from.
#[derive(Clone, Default)]
struct TrailerSlot(Option<Arc<std::sync::Mutex<Option<HeaderMap>>>>);

impl TrailerSlot {
    fn take(&self) -> Option<HeaderMap> {
        let cell = self.0.as_ref()?;
        cell.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn put(&mut self, trailers: Option<HeaderMap>) {
        match (&self.0, trailers) {
            (Some(cell), trailers) => *cell.lock().unwrap_or_else(|p| p.into_inner()) = trailers,
            (None, Some(trailers)) => {
                self.0 = Some(Arc::new(std::sync::Mutex::new(Some(trailers))))
            }
            (None, None) => {}
        }
    }

    fn is_empty(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|cell| cell.lock().unwrap_or_else(|p| p.into_inner()).is_none())
    }
}

/// What a body stream's `poll_frame` answers.
type FramePoll = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

/// The start of both hook streams' `poll_frame`: drives the hook future in flight, if any, and
/// hands on what it produced (non-empty data, or its error); once the body is `done`, hands on
/// the trailers, then the end. `Continue`: nothing to hand on, read the next frame.
fn drain_pending(
    pending: &mut Option<HookFuture>,
    done: bool,
    trailers: &TrailerSlot,
    cx: &mut Context<'_>,
) -> std::ops::ControlFlow<FramePoll> {
    use std::ops::ControlFlow::Continue;
    if let Some(fut) = pending.as_mut() {
        let Poll::Ready(out) = fut.as_mut().poll(cx) else {
            return Break(Poll::Pending);
        };
        *pending = None;
        match out {
            Ok(Some(data)) if !data.is_empty() => {
                return Break(Poll::Ready(Some(Ok(Frame::data(data)))));
            }
            Ok(_) => {}
            Err(e) => return Break(Poll::Ready(Some(Err(e)))),
        }
    }
    if done {
        return Break(Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t)))));
    }
    Continue(())
}

/// Runs the trailer hooks: request trailers in filter order (`upto: None`), response trailers
/// in reverse order over the filters that saw the request (`Some(upto)`).
async fn run_trailer_hooks(
    state: &Shared,
    upto: Option<usize>,
    trailers: &mut HeaderMap,
) -> Result<(), BoxError> {
    let mut guard = state.lock().await;
    let st = &mut *guard;
    match upto {
        None => {
            for f in st.filters.iter_mut() {
                f.on_request_trailers(trailers, &mut st.cx).await?;
            }
        }
        Some(upto) => {
            for f in st.filters[..upto].iter_mut().rev() {
                f.on_response_trailers(trailers, &mut st.cx).await?;
            }
        }
    }
    Ok(())
}

impl Default for Chain {
    /// No filters.
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Chain {
    /// Builds a chain from factories, in request order.
    pub fn new(factories: Vec<Arc<dyn FilterFactory>>) -> Self {
        let request_body = factories
            .iter()
            .map(|f| f.request_body())
            .fold(None, |acc, b| match (acc, b) {
                (acc, BodyAccess::None) => acc,
                (Some(BodyAccess::Buffer(a)), BodyAccess::Buffer(b)) => {
                    Some(BodyAccess::Buffer(a.min(b)))
                }
                (Some(BodyAccess::Buffer(a)), _) => Some(BodyAccess::Buffer(a)),
                (_, b) => Some(b),
            });
        let response_body = factories.iter().any(|f| f.response_body());
        let after_response = response_body || factories.iter().any(|f| f.after_response());
        let reads_request_later = factories.iter().any(|f| f.reads_request_later());
        Self {
            factories: factories.into(),
            request_body,
            response_body,
            after_response,
            reads_request_later,
        }
    }

    /// Keeps the request head for the filters that read it later, when nothing else needs it
    /// any more (the terminal only looked at it, or never got it).
    fn keep_head(&self, st: &mut State, parts: request::Parts) {
        if self.reads_request_later {
            st.cx.request_head = Some(Arc::new(parts));
        }
    }

    /// Keeps a copy of the request head for the filters that read it later, before the body
    /// hooks or the terminal, which takes the head itself (once per request).
    fn keep_head_copy(&self, st: &mut State, parts: &request::Parts) {
        if self.reads_request_later && st.cx.request_head.is_none() {
            st.cx.request_head = Some(Arc::new(copy_head(parts)));
        }
    }

    /// Whether the chain has no filters.
    pub fn is_empty(&self) -> bool {
        self.factories.is_empty()
    }

    /// A request's filter instances and context, before any hook ran.
    fn fresh_state(&self, cx: RequestCx) -> State {
        State {
            filters: self.factories.iter().map(|f| f.create()).collect(),
            cx,
            status: StatusCode::OK,
            local_reply: None,
            logged: false,
            log_next: 0,
            started: 0,
        }
    }

    /// Runs the request through the filters and the terminal. `server` is the `Server` header
    /// every response starts with, before response filters run (so they may remove it).
    pub fn run<'a>(
        &'a self,
        terminal: &'a Terminal,
        req: Request<Body>,
        cx: RequestCx,
        server: Option<&'a HeaderValue>,
    ) -> impl Future<Output = Response<Body>> + Send + 'a {
        match self.start(terminal, req, || cx, server) {
            Started::Done(res) => Either::Left(std::future::ready(res)),
            Started::Terminal(fut, tail) => Either::Right(Either::Left(async move {
                let res = fut.await;
                let Some(tail) = tail else {
                    return with_server(res, server);
                };
                match self.after_terminal(tail, res, server) {
                    Ok(res) => res,
                    Err(rest) => rest.resume(self, terminal, server).await,
                }
            })),
            Started::Wait(rest) => {
                Either::Right(Either::Right(rest.resume(self, terminal, server)))
            }
        }
    }

    /// Runs a request as far as it goes without waiting: the head hooks that answer
    /// synchronously (every native filter's), and a terminal that answers at once (`respond`
    /// to a bodiless request). Most requests on native filters finish here and make no future
    /// at all; the rest continue from the first step that waits ([`Pending::resume`]). Without
    /// filters the terminal is called directly.
    /// `cx` is made only when something will use it (a synthetic response on a route without
    /// filters does not).
    pub fn start(
        &self,
        terminal: &Terminal,
        req: Request<Body>,
        cx: impl FnOnce() -> RequestCx,
        server: Option<&HeaderValue>,
    ) -> Started {
        if self.factories.is_empty() {
            // Nothing to run but the terminal: no filter state, no parts taken apart.
            let mut req = req;
            if let Some(res) = terminal.respond_alone(&mut req, server) {
                return Started::Done(res);
            }
            let cx = cx();
            return match with_current(cx.trace.as_ref(), || terminal.handle(req, &cx)) {
                Either::Left(res) => Started::Done(with_server(res.into_inner(), server)),
                Either::Right(fut) => Started::Terminal(fut, None),
            };
        }
        // The state stays with the request unless a body stream that outlives the chain needs
        // the hooks: then, and only then, it moves behind a shared lock.
        let mut st = self.fresh_state(cx());
        // The synchronous hooks run outside the request's trace scope (which wraps only its
        // future): they get the trace here, for the work they start.
        let trace = st.cx.trace.clone();
        let (mut parts, body) = req.into_parts();
        let pass = with_current(trace.as_ref(), || {
            self.request_headers_now(&mut st, &mut parts)
        });
        let (upto, response) = match pass {
            // The asynchronous pass starts again at the filter that waits.
            HeadPass::Waits(_) => {
                return Started::Wait(Pending(Stage::Request { st, parts, body }));
            }
            HeadPass::Reply(i, reply) => {
                self.keep_head(&mut st, parts);
                (i, reply)
            }
            HeadPass::Through => {
                // A request without a body (most GETs) has no body hooks to run.
                let body_needs_hooks = match self.request_body {
                    None | Some(BodyAccess::None) => false,
                    Some(BodyAccess::Buffer(_) | BodyAccess::Stream) => !body.is_end_stream(),
                };
                if body_needs_hooks {
                    return Started::Wait(Pending(Stage::Request { st, parts, body }));
                }
                if let Some(res) = terminal.respond_now(&mut parts, &body, self.reads_request_later)
                {
                    self.keep_head(&mut st, parts);
                    (self.factories.len(), res)
                } else {
                    // The terminal is started here, and its future comes back with the
                    // filters' state rather than inside a future of the chain's.
                    self.keep_head_copy(&mut st, &parts);
                    let req = Request::from_parts(parts, body);
                    match with_current(trace.as_ref(), || terminal.handle(req, &st.cx)) {
                        Either::Left(res) => (self.factories.len(), res.into_inner()),
                        Either::Right(fut) => {
                            return Started::Terminal(fut, Some(Tail(Box::new(st))));
                        }
                    }
                }
            }
        };
        match self.response_now(st, upto, response, server, trace.as_ref()) {
            Ok(res) => Started::Done(res),
            Err(rest) => Started::Wait(rest),
        }
    }

    /// The response hooks for the terminal's response of a [`Started::Terminal`] with filters,
    /// as far as they answer synchronously: the response, or the rest to resume when a hook
    /// must be awaited.
    #[expect(
        clippy::result_large_err,
        reason = "returned once and matched at once, as `Started`; the rest is rarely made"
    )]
    pub fn after_terminal(
        &self,
        tail: Tail,
        response: Response<Body>,
        server: Option<&HeaderValue>,
    ) -> Result<Response<Body>, Pending> {
        let st = *tail.0;
        let trace = st.cx.trace.clone();
        self.response_now(st, self.factories.len(), response, server, trace.as_ref())
    }

    /// The response-header hooks from filter `upto` down, as far as they answer synchronously,
    /// then the body hooks; `Err` when one must be awaited.
    #[expect(
        clippy::result_large_err,
        reason = "returned once and matched at once, as `Started`; the rest is rarely made"
    )]
    fn response_now(
        &self,
        mut st: State,
        upto: usize,
        response: Response<Body>,
        server: Option<&HeaderValue>,
        trace: Option<&TraceCx>,
    ) -> Result<Response<Body>, Pending> {
        let (mut rparts, mut rbody) = with_server(response, server).into_parts();
        let waits = with_current(trace, || {
            self.response_headers_now(&mut st, &mut rparts, &mut rbody, upto)
        });
        if let Some(next) = waits {
            let response = Response::from_parts(rparts, rbody);
            return Err(Pending(Stage::Response {
                st,
                upto,
                next,
                response,
            }));
        }
        st.status = rparts.status;
        let response = Response::from_parts(rparts, rbody);
        if !self.after_response {
            return Ok(response);
        }
        Ok(self.with_body_hooks(st, upto, response))
    }

    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would store its arguments twice (see `run`)"
    )]
    fn run_filters<'a>(
        &'a self,
        terminal: &'a Terminal,
        mut st: State,
        mut parts: request::Parts,
        body: Body,
        server: Option<&'a HeaderValue>,
    ) -> impl Future<Output = Response<Body>> + Send + 'a {
        async move {
            let all = self.factories.len();
            // Request headers, in order. A local reply goes back through the filters before
            // it. The rare paths (a buffered or streamed request body) are boxed so that their
            // state does not enlarge, and is not copied with, every request's future.
            let mut upto = all;
            let response = 'answer: {
                if let Some((i, reply)) = self.request_headers(&mut st, &mut parts).await {
                    upto = i;
                    self.keep_head(&mut st, parts);
                    break 'answer reply;
                }
                // Body hooks may read the head too: kept before they run.
                if !body.is_end_stream() {
                    self.keep_head_copy(&mut st, &parts);
                }
                let body = match self.request_body {
                    None | Some(BodyAccess::None) => body,
                    // A request without a body (most GETs) skips the buffering and the hooks.
                    Some(BodyAccess::Buffer(_) | BodyAccess::Stream) if body.is_end_stream() => {
                        body
                    }
                    Some(BodyAccess::Buffer(limit)) => {
                        match Box::pin(self.buffer_request_body(&mut st, body, limit)).await {
                            Ok(body) => body,
                            Err(reply) => break 'answer reply,
                        }
                    }
                    Some(BodyAccess::Stream) => {
                        let streaming = self.run_streaming(st, parts, body, terminal, server);
                        return Box::pin(streaming).await;
                    }
                };
                self.keep_head_copy(&mut st, &parts);
                terminal
                    .handle(Request::from_parts(parts, body), &st.cx)
                    .await
            };
            let response = with_server(response, server);
            let response = self.response_headers(&mut st, upto, response).await;
            if !self.after_response {
                return response;
            }
            self.with_body_hooks(st, upto, response)
        }
    }

    /// The terminal reads the request body through the filters' body hooks as it goes, so the
    /// hooks (inside the body stream) and this function share the state.
    async fn run_streaming(
        &self,
        st: State,
        parts: request::Parts,
        body: Body,
        terminal: &Terminal,
        server: Option<&HeaderValue>,
    ) -> Response<Body> {
        let terminal_cx = st.cx.clone();
        let state: Shared = Arc::new(Mutex::new(st));
        let body = Body::new(RequestBodyHooks {
            inner: body,
            state: state.clone(),
            pending: None,
            done: false,
            trailers: TrailerSlot::default(),
        });
        let response = terminal
            .handle(Request::from_parts(parts, body), &terminal_cx)
            .await;
        let all = self.factories.len();
        let mut guard = state.lock().await;
        let response = guard.local_reply.take().map_or(response, |r| *r);
        let response = self
            .response_headers(&mut guard, all, with_server(response, server))
            .await;
        drop(guard);
        self.body_hooks_on(state, terminal_cx.trace, all, response)
    }

    /// Runs the request-header hooks in order from `st.started`; a local reply comes back with
    /// the index of the filter that gave it (the filters after it never see the request).
    async fn request_headers(
        &self,
        st: &mut State,
        parts: &mut request::Parts,
    ) -> Option<(usize, Response<Body>)> {
        loop {
            let i = match self.request_headers_now(st, parts) {
                HeadPass::Through => return None,
                HeadPass::Reply(i, reply) => return Some((i, reply)),
                HeadPass::Waits(i) => i,
            };
            st.started = i + 1;
            let flow = st.filters[i].on_request_headers(parts, &mut st.cx).await;
            if let Some(reply) = self.decide(flow, i) {
                return Some((i, reply));
            }
        }
    }

    /// The request-header hooks from `st.started` on, as far as they answer synchronously.
    fn request_headers_now(&self, st: &mut State, parts: &mut request::Parts) -> HeadPass {
        for i in st.started..st.filters.len() {
            st.started = i + 1;
            let Some(flow) = st.filters[i].on_request_headers_sync(parts, &mut st.cx) else {
                // Not started yet: its async hook comes next (a `None` answer has no side
                // effects, so a later pass may ask it again).
                st.started = i;
                return HeadPass::Waits(i);
            };
            if let Some(reply) = self.decide(flow, i) {
                return HeadPass::Reply(i, reply);
            }
        }
        HeadPass::Through
    }

    /// The response-header hooks of the filters below `below`, in reverse order, as far as
    /// they answer synchronously; `Some(i)` when filter `i` must be awaited. A local reply
    /// replaces the response for the filters after it.
    fn response_headers_now(
        &self,
        st: &mut State,
        parts: &mut response::Parts,
        body: &mut Body,
        below: usize,
    ) -> Option<usize> {
        for i in (0..below).rev() {
            let Some(flow) = st.filters[i].on_response_headers_sync(parts, &mut st.cx) else {
                return Some(i);
            };
            if let Some(reply) = self.decide(flow, i) {
                (*parts, *body) = reply.into_parts();
            }
        }
        None
    }

    fn decide(&self, flow: Result<Flow, BoxError>, i: usize) -> Option<Response<Body>> {
        match flow {
            Ok(Flow::Continue) => None,
            Ok(Flow::Respond(resp)) => Some(resp),
            Err(source) => {
                let err = GatewayError::Filter {
                    filter: self.factories[i].name(),
                    source,
                };
                tracing::warn!(error = %err, cause = ?std::error::Error::source(&err), "request failed in a filter");
                Some(err.into_response())
            }
        }
    }

    async fn buffer_request_body(
        &self,
        st: &mut State,
        mut body: Body,
        limit: u64,
    ) -> Result<Body, Response<Body>> {
        let mut buf = BytesMut::new();
        let mut trailers: Option<HeaderMap> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| GatewayError::RequestBody(e).into_response())?;
            match frame.into_data() {
                Ok(data) => {
                    if (buf.len() + data.len()) as u64 > limit {
                        return Err(GatewayError::BodyTooLarge(limit).into_response());
                    }
                    buf.extend_from_slice(&data);
                }
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        let mut chunk = Some(buf.freeze());
        for i in 0..st.filters.len() {
            let flow = st.filters[i]
                .on_request_body(&mut chunk, true, &mut st.cx)
                .await;
            if let Some(resp) = self.decide(flow, i) {
                return Err(resp);
            }
        }
        if let Some(t) = trailers.as_mut() {
            for i in 0..st.filters.len() {
                let r = st.filters[i].on_request_trailers(t, &mut st.cx).await;
                if let Some(resp) = self.decide(r.map(|()| Flow::Continue), i) {
                    return Err(resp);
                }
            }
        }
        let data = chunk.unwrap_or_default();
        Ok(match trailers {
            None => Body::full(data),
            Some(t) => Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
                [Ok::<_, BoxError>(Frame::data(data)), Ok(Frame::trailers(t))],
            ))),
        })
    }

    /// Runs the response-header hooks in reverse order over the filters that saw the request.
    /// A local reply from one of them replaces the response for the filters before it.
    fn response_headers<'a>(
        &'a self,
        st: &'a mut State,
        upto: usize,
        response: Response<Body>,
    ) -> impl Future<Output = Response<Body>> + Send + 'a {
        let (mut parts, mut body) = response.into_parts();
        async move {
            let mut below = upto;
            while let Some(i) = self.response_headers_now(st, &mut parts, &mut body, below) {
                let flow = st.filters[i]
                    .on_response_headers(&mut parts, &mut st.cx)
                    .await;
                if let Some(reply) = self.decide(flow, i) {
                    (parts, body) = reply.into_parts();
                }
                below = i;
            }
            st.status = parts.status;
            Response::from_parts(parts, body)
        }
    }

    /// Wraps the body in the stream that runs the response-body, trailer and log hooks.
    fn with_body_hooks(&self, st: State, upto: usize, response: Response<Body>) -> Response<Body> {
        let trace = st.cx.trace.clone();
        self.body_hooks_on(Arc::new(Mutex::new(st)), trace, upto, response)
    }

    /// [`Chain::with_body_hooks`] on state already shared (with a request body stream).
    fn body_hooks_on(
        &self,
        state: Shared,
        trace: Option<TraceCx>,
        upto: usize,
        response: Response<Body>,
    ) -> Response<Body> {
        let (mut parts, mut body) = response.into_parts();
        let trailers = TrailerSlot::default();
        let (mut hooks, mut pending, mut finished) = (self.response_body, None, false);
        if hooks {
            match self.whole_body_now(&state, trace.as_ref(), upto, &mut parts, &mut body) {
                WholeBody::Streams => {}
                WholeBody::Done => hooks = false,
                WholeBody::Rest(chunk, below) => {
                    let rest = finish_later(state.clone(), upto, below, chunk, trailers.clone());
                    pending = Some(Box::pin(trace::scope_some(trace.clone(), rest)) as HookFuture);
                    finished = true;
                }
            }
        }
        let body = Body::new(ResponseBodyHooks {
            inner: body,
            state,
            trace,
            upto,
            hooks,
            pending,
            trailers,
            finished,
        });
        Response::from_parts(parts, body)
    }

    /// A body already whole in memory (a synthetic answer, a cached file, a small upstream
    /// answer that came with its head) goes through the response-body hooks before the head
    /// goes out, as one chunk that ends the stream, which is how Envoy hands a complete body to
    /// its filters. The head then carries the length the hooks left (`Content-Length`, not
    /// chunked encoding), each hook runs once instead of twice (the chunk, then the end), and a
    /// hook that fails gives an error response instead of a body cut off after a good head.
    fn whole_body_now(
        &self,
        state: &Shared,
        trace: Option<&TraceCx>,
        upto: usize,
        parts: &mut response::Parts,
        body: &mut Body,
    ) -> WholeBody {
        let Some(whole) = body.as_full() else {
            return WholeBody::Streams;
        };
        // Nothing else holds the state once the head is done, unless a request body is still
        // being read; then the body streams as any other.
        let Ok(mut guard) = state.try_lock() else {
            return WholeBody::Streams;
        };
        let st = &mut *guard;
        let mut chunk = Some(whole.clone());
        match with_current(trace, || st.response_body_now(upto, &mut chunk, true)) {
            Ok(()) => {
                let len = chunk.as_ref().map_or(0, Bytes::len);
                *body = chunk.map_or_else(Body::empty, Body::full);
                // The hooks may have changed the length; a stale one would break the framing.
                if let Some(stated) = parts.headers.get_mut(header::CONTENT_LENGTH)
                    && stated.to_str().ok().and_then(|s| s.parse().ok()) != Some(len)
                {
                    *stated = HeaderValue::from(len);
                }
                WholeBody::Done
            }
            Err(HookStop::Failed(i, source)) => {
                if let Some(reply) = self.decide(Err(source), i) {
                    (*parts, *body) = reply.into_parts();
                }
                st.status = parts.status;
                WholeBody::Done
            }
            // No hook has run yet: the body streams, and this one is awaited there.
            Err(HookStop::Waits(i)) if i + 1 == upto => WholeBody::Streams,
            Err(HookStop::Waits(i)) => {
                *body = Body::empty();
                WholeBody::Rest(chunk, i + 1)
            }
        }
    }
}

/// Why a synchronous pass over the response-body hooks stopped.
enum HookStop {
    /// Filter `i`'s hook failed.
    Failed(usize, BoxError),
    /// Filter `i`'s hook must be awaited.
    Waits(usize),
}

/// How [`Chain::whole_body_now`] left a response's body.
enum WholeBody {
    /// Not whole in memory (or its first hook waits): the hooks run as it streams.
    Streams,
    /// Every hook ran; the body is what they left.
    Done,
    /// The hooks below this index still have to be awaited, on what the others left.
    Rest(Option<Bytes>, usize),
}

/// Adds the `Server` header unless the terminal set its own.
pub fn with_server(mut res: Response<Body>, server: Option<&HeaderValue>) -> Response<Body> {
    if let Some(server) = server {
        res.headers_mut()
            .entry(header::SERVER)
            .or_insert_with(|| server.clone());
    }
    res
}

/// Runs the response-body hooks of the filters below `below` (awaiting each), in reverse order.
async fn run_response_body_hooks(
    state: Shared,
    below: usize,
    mut chunk: Option<Bytes>,
    eos: bool,
) -> Result<Option<Bytes>, BoxError> {
    let mut guard = state.lock().await;
    let st = &mut *guard;
    for f in st.filters[..below].iter_mut().rev() {
        f.on_response_body(&mut chunk, eos, &mut st.cx).await?;
    }
    Ok(chunk)
}

/// Runs the response-body hooks here when every one answers synchronously (the state is not
/// locked elsewhere: nothing else runs hooks while the response body streams); `Err` hands
/// back the chunk with the filter count whose hooks are left for [`run_response_body_hooks`].
fn response_body_now(
    state: &Shared,
    upto: usize,
    mut chunk: Option<Bytes>,
    eos: bool,
) -> Result<Result<Option<Bytes>, BoxError>, (Option<Bytes>, usize)> {
    let Ok(mut guard) = state.try_lock() else {
        return Err((chunk, upto));
    };
    match guard.response_body_now(upto, &mut chunk, eos) {
        Ok(()) => Ok(Ok(chunk)),
        Err(HookStop::Failed(_, e)) => Ok(Err(e)),
        Err(HookStop::Waits(i)) => Err((chunk, i + 1)),
    }
}

/// Runs the log phase (once) for the filters that saw the request, awaiting those that wait.
async fn run_log(state: Shared) {
    let mut guard = state.lock().await;
    let st = &mut *guard;
    if st.log_now() {
        return;
    }
    let status = st.status;
    for f in st.filters[st.log_next..st.started].iter_mut() {
        f.on_log(&st.cx, status).await;
    }
    st.logged = true;
}

/// The log phase without a task when every filter logs synchronously; otherwise a task
/// finishes it. Either way under the request's trace.
fn log_soon(state: &Shared, trace: Option<&TraceCx>) {
    if let Ok(mut guard) = state.try_lock()
        && with_current(trace, || guard.log_now())
    {
        return;
    }
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(trace::scope_some(trace.cloned(), run_log(state.clone())));
    }
}

/// Passes response data through the filters' body hooks, then runs the log phase.
struct ResponseBodyHooks {
    inner: Body,
    state: Shared,
    /// The request's trace: the hooks run while hyper polls the body, outside its scope.
    trace: Option<TraceCx>,
    upto: usize,
    hooks: bool,
    pending: Option<HookFuture>,
    /// Trailers on their way out: filled when they arrive, changed by the trailer hooks.
    trailers: TrailerSlot,
    finished: bool,
}

impl HttpBody for ResponseBodyHooks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let this = &mut *self;
        loop {
            if let Break(out) = drain_pending(&mut this.pending, this.finished, &this.trailers, cx)
            {
                return out;
            }
            let ended = match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    // The last chunk (the body says nothing follows) goes through the hooks
                    // with the end of the stream, as on the request side, instead of being
                    // followed by a call with nothing.
                    Ok(data) if this.hooks && this.inner.is_end_stream() => this.finish(Some(data)),
                    Ok(data) if this.hooks => {
                        let now = with_current(this.trace.as_ref(), || {
                            response_body_now(&this.state, this.upto, Some(data), false)
                        });
                        match now {
                            Ok(Ok(Some(data))) if !data.is_empty() => {
                                return Poll::Ready(Some(Ok(Frame::data(data))));
                            }
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => return Poll::Ready(Some(Err(e))),
                            Err((chunk, below)) => {
                                this.pending = Some(Box::pin(trace::scope_some(
                                    this.trace.clone(),
                                    run_response_body_hooks(
                                        this.state.clone(),
                                        below,
                                        chunk,
                                        false,
                                    ),
                                )));
                            }
                        }
                        continue;
                    }
                    Ok(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Err(frame) => {
                        // Trailers end the body: the end-of-stream hooks run before they go out.
                        this.trailers.put(frame.into_trailers().ok());
                        this.finish(None)
                    }
                },
                Some(Err(e)) => {
                    this.finished = true;
                    log_soon(&this.state, this.trace.as_ref());
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.finish(None),
            };
            match ended {
                Some(Ok(Some(data))) if !data.is_empty() => {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                // Done here, or left to `pending`: the next turn hands on what is left.
                Some(Ok(_)) | None => {}
            }
        }
    }

    /// Without body hooks the data passes unchanged, so the inner body's size still holds:
    /// hyper then sends `Content-Length` instead of chunked encoding.
    fn size_hint(&self) -> http_body::SizeHint {
        if self.hooks {
            http_body::SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

impl ResponseBodyHooks {
    /// The end of the body: the end-of-stream body hooks (on `last`, the body's last chunk
    /// when it came with the end), the trailer hooks, the log phase. `Some` when they all ran
    /// here (no hook waited and there are no trailers): the tail the end-of-stream hooks
    /// produced, or their error. `None`: they continue in `pending`.
    fn finish(&mut self, last: Option<Bytes>) -> Option<Result<Option<Bytes>, BoxError>> {
        self.finished = true;
        let trace = self.trace.as_ref();
        let no_trailers = self.trailers.is_empty();
        let (tail, below) = if self.hooks {
            match with_current(trace, || {
                response_body_now(&self.state, self.upto, last, true)
            }) {
                Ok(Ok(tail)) => (tail, 0),
                Ok(Err(e)) => {
                    log_soon(&self.state, trace);
                    return Some(Err(e));
                }
                Err((chunk, below)) => (chunk, below),
            }
        } else {
            (last, 0)
        };
        if below == 0 && no_trailers {
            log_soon(&self.state, trace);
            return Some(Ok(tail));
        }
        // Something waits: the rest runs in `pending`.
        let (state, slot) = (self.state.clone(), self.trailers.clone());
        self.pending = Some(Box::pin(trace::scope_some(
            self.trace.clone(),
            finish_later(state, self.upto, below, tail, slot),
        )));
        None
    }
}

/// The end of a response body when some hook waits: the end-of-stream body hooks of the
/// filters below `below`, the trailer hooks, then the log phase, which runs even when a hook
/// failed (as it does when every hook answers synchronously).
async fn finish_later(
    state: Shared,
    upto: usize,
    below: usize,
    tail: Option<Bytes>,
    mut trailers: TrailerSlot,
) -> Result<Option<Bytes>, BoxError> {
    let out = async {
        let tail = if below > 0 {
            run_response_body_hooks(state.clone(), below, tail, true).await?
        } else {
            tail
        };
        if let Some(mut t) = trailers.take() {
            run_trailer_hooks(&state, Some(upto), &mut t).await?;
            trailers.put(Some(t));
        }
        Ok(tail)
    }
    .await;
    run_log(state).await;
    out
}

impl Drop for ResponseBodyHooks {
    fn drop(&mut self) {
        // The client went away (or the body was never polled): the log phase still runs.
        if !self.finished || self.pending.is_some() {
            log_soon(&self.state, self.trace.as_ref());
        }
    }
}

/// Passes request data through the filters' body hooks as the terminal reads it.
struct RequestBodyHooks {
    inner: Body,
    state: Shared,
    pending: Option<HookFuture>,
    done: bool,
    /// Request trailers, emitted once their hooks ran.
    trailers: TrailerSlot,
}

async fn run_request_body_hooks(
    state: Shared,
    mut chunk: Option<Bytes>,
    eos: bool,
) -> Result<Option<Bytes>, BoxError> {
    let mut guard = state.lock().await;
    let st = &mut *guard;
    for f in st.filters.iter_mut() {
        if let Flow::Respond(reply) = f.on_request_body(&mut chunk, eos, &mut st.cx).await? {
            st.local_reply = Some(Box::new(reply));
            return Err("request ended by a filter's local reply".into());
        }
    }
    Ok(chunk)
}

impl HttpBody for RequestBodyHooks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let this = &mut *self;
        loop {
            if let Break(out) = drain_pending(&mut this.pending, this.done, &this.trailers, cx) {
                return out;
            }
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let eos = this.inner.is_end_stream();
                        this.done = eos;
                        this.pending = Some(Box::pin(run_request_body_hooks(
                            this.state.clone(),
                            Some(data),
                            eos,
                        )));
                    }
                    Err(frame) => match frame.into_trailers() {
                        // Trailers end the body: the end-of-stream body hooks, then the
                        // trailer hooks, run before they go on.
                        Ok(t) => {
                            this.done = true;
                            this.trailers.put(Some(t));
                            let (state, mut slot) = (this.state.clone(), this.trailers.clone());
                            this.pending = Some(Box::pin(async move {
                                let tail =
                                    run_request_body_hooks(state.clone(), None, true).await?;
                                if let Some(mut t) = slot.take() {
                                    run_trailer_hooks(&state, None, &mut t).await?;
                                    slot.put(Some(t));
                                }
                                Ok(tail)
                            }));
                        }
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    },
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    this.pending = Some(Box::pin(run_request_body_hooks(
                        this.state.clone(),
                        None,
                        true,
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The chain's contract: order of phases, local replies, body hooks, the log phase.

    use std::net::SocketAddr;
    use std::sync::Mutex as StdMutex;

    use http::{request, response};

    use super::*;
    use crate::connection::ConnInfo;
    use crate::terminal::Respond;

    type Journal = Arc<StdMutex<Vec<String>>>;

    /// A test filter's entry in the journal: `name:what`.
    fn note(journal: &Journal, name: &str, what: &str) {
        journal.lock().unwrap().push(format!("{name}:{what}"));
    }

    /// How a test filter notes a request body chunk in the journal.
    fn body_entry(chunk: &Option<Bytes>, eos: bool) -> String {
        format!("req_body:{}:{eos}", chunk.as_ref().map_or(0, |c| c.len()))
    }

    struct Recorder {
        name: &'static str,
        journal: Journal,
        reply_on_request: bool,
        body: BodyAccess,
        upper_response_body: bool,
    }

    impl FilterFactory for Recorder {
        fn name(&self) -> &'static str {
            self.name
        }
        fn create(&self) -> Box<dyn HttpFilter> {
            Box::new(RecorderFilter {
                name: self.name,
                journal: self.journal.clone(),
                reply_on_request: self.reply_on_request,
                upper: self.upper_response_body,
            })
        }
        fn request_body(&self) -> BodyAccess {
            self.body
        }
        fn response_body(&self) -> bool {
            self.upper_response_body
        }
    }

    struct RecorderFilter {
        name: &'static str,
        journal: Journal,
        reply_on_request: bool,
        upper: bool,
    }

    impl RecorderFilter {
        fn note(&self, what: &str) {
            note(&self.journal, self.name, what);
        }
    }

    #[async_trait::async_trait]
    impl HttpFilter for RecorderFilter {
        async fn on_request_headers(
            &mut self,
            req: &mut request::Parts,
            _cx: &mut RequestCx,
        ) -> Result<Flow, BoxError> {
            self.note("req");
            req.headers
                .append("x-seen", HeaderValue::from_static(self.name));
            if self.reply_on_request {
                return Ok(Flow::Respond(Response::new(Body::from("local reply"))));
            }
            Ok(Flow::Continue)
        }
        async fn on_request_body(
            &mut self,
            chunk: &mut Option<Bytes>,
            eos: bool,
            _cx: &mut RequestCx,
        ) -> Result<Flow, BoxError> {
            self.note(&body_entry(chunk, eos));
            Ok(Flow::Continue)
        }
        async fn on_response_headers(
            &mut self,
            res: &mut response::Parts,
            _cx: &mut RequestCx,
        ) -> Result<Flow, BoxError> {
            self.note("res");
            res.headers
                .append("x-res", HeaderValue::from_static(self.name));
            Ok(Flow::Continue)
        }
        async fn on_response_body(
            &mut self,
            chunk: &mut Option<Bytes>,
            eos: bool,
            _cx: &mut RequestCx,
        ) -> Result<(), BoxError> {
            if self.upper {
                if let Some(c) = chunk.take() {
                    *chunk = Some(Bytes::from(c.to_ascii_uppercase()));
                }
                if eos {
                    let mut tail = chunk.take().map(|c| c.to_vec()).unwrap_or_default();
                    tail.extend_from_slice(b"!");
                    *chunk = Some(Bytes::from(tail));
                }
            }
            Ok(())
        }
        async fn on_log(&mut self, _cx: &RequestCx, status: StatusCode) {
            self.note(&format!("log:{}", status.as_u16()));
        }
    }

    fn cx() -> RequestCx {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        RequestCx {
            conn: Arc::new(ConnInfo::new(addr, addr, Arc::from("l"), false, None)),
            route: Arc::from("r"),
            start: tokio::time::Instant::now(),
            trace: None,
            request_head: None,
        }
    }

    fn respond(body: &str) -> Terminal {
        let cfg: gateway_config::model::RespondConfig =
            serde_yaml::from_str(&format!("{{ body: \"{body}\" }}")).unwrap();
        Terminal::Respond(Arc::new(Respond::new(&cfg, true, false).unwrap()))
    }

    fn recorder(name: &'static str, journal: &Journal) -> Recorder {
        Recorder {
            name,
            journal: journal.clone(),
            reply_on_request: false,
            body: BodyAccess::None,
            upper_response_body: false,
        }
    }

    async fn body_text(res: Response<Body>) -> String {
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn request_in_order_response_in_reverse_log_once() {
        let journal: Journal = Arc::default();
        let chain = Chain::new(vec![
            Arc::new(recorder("a", &journal)),
            Arc::new(recorder("b", &journal)),
        ]);
        let res = chain
            .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
            .await;
        let order: Vec<_> = res
            .headers()
            .get_all("x-res")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(order, ["b", "a"]);
        assert_eq!(body_text(res).await, "ok");
        tokio::task::yield_now().await;
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:req", "b:req", "b:res", "a:res", "a:log:200", "b:log:200"]
        );
    }

    #[tokio::test]
    async fn local_reply_skips_the_rest_and_the_terminal() {
        let journal: Journal = Arc::default();
        let mut b = recorder("b", &journal);
        b.reply_on_request = true;
        let chain = Chain::new(vec![
            Arc::new(recorder("a", &journal)),
            Arc::new(b),
            Arc::new(recorder("c", &journal)),
        ]);
        let res = chain
            .run(
                &respond("terminal"),
                Request::new(Body::empty()),
                cx(),
                None,
            )
            .await;
        assert_eq!(
            res.headers().get_all("x-res").iter().count(),
            1,
            "only `a` sees the reply"
        );
        assert_eq!(body_text(res).await, "local reply");
        let j = journal.lock().unwrap().clone();
        assert!(!j.iter().any(|e| e.starts_with("c:")), "{j:?}");
    }

    #[tokio::test]
    async fn buffered_request_body_is_seen_whole_and_limited() {
        let journal: Journal = Arc::default();
        let mut a = recorder("a", &journal);
        a.body = BodyAccess::Buffer(8);
        let chain = Chain::new(vec![Arc::new(a)]);
        let req = Request::new(Body::from("12345"));
        let res = chain.run(&respond("ok"), req, cx(), None).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(
            journal
                .lock()
                .unwrap()
                .contains(&"a:req_body:5:true".to_owned())
        );
        let res = chain
            .run(
                &respond("ok"),
                Request::new(Body::from("123456789")),
                cx(),
                None,
            )
            .await;
        assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn response_body_hooks_rewrite_and_append_at_eos() {
        let journal: Journal = Arc::default();
        let mut a = recorder("a", &journal);
        a.upper_response_body = true;
        let chain = Chain::new(vec![Arc::new(a)]);
        let res = chain
            .run(&respond("hello"), Request::new(Body::empty()), cx(), None)
            .await;
        assert_eq!(body_text(res).await, "HELLO!");
    }

    #[tokio::test]
    async fn server_header_is_added_before_response_filters() {
        let chain = Chain::default();
        let server = HeaderValue::from_static("gw");
        let res = chain
            .run(
                &respond("x"),
                Request::new(Body::empty()),
                cx(),
                Some(&server),
            )
            .await;
        assert_eq!(res.headers()[header::SERVER], "gw");
    }

    /// A synchronous request hook's answer: a local reply with `body`, or on to the next.
    fn reply_or_continue(reply: bool, body: &'static str) -> Option<Result<Flow, BoxError>> {
        Some(Ok(if reply {
            Flow::Respond(Response::new(Body::from(body)))
        } else {
            Flow::Continue
        }))
    }

    /// A filter whose response hook removes the `Server` header, noting what it found.
    #[derive(Clone)]
    struct ServerRemover {
        journal: Journal,
        reply: bool,
    }

    impl FilterFactory for ServerRemover {
        fn name(&self) -> &'static str {
            "server-remover"
        }
        fn create(&self) -> Box<dyn HttpFilter> {
            Box::new(self.clone())
        }
    }

    #[async_trait::async_trait]
    impl HttpFilter for ServerRemover {
        fn on_request_headers_sync(
            &mut self,
            _req: &mut request::Parts,
            _cx: &mut RequestCx,
        ) -> Option<Result<Flow, BoxError>> {
            reply_or_continue(self.reply, "local")
        }
        fn on_response_headers_sync(
            &mut self,
            res: &mut response::Parts,
            _cx: &mut RequestCx,
        ) -> Option<Result<Flow, BoxError>> {
            let found = res.headers.get_all(header::SERVER).iter();
            let found: Vec<_> = found.map(|v| v.to_str().unwrap().to_owned()).collect();
            self.journal.lock().unwrap().push(found.join(","));
            res.headers.remove(header::SERVER);
            Some(Ok(Flow::Continue))
        }
    }

    #[tokio::test]
    async fn response_filters_see_one_server_header_whoever_answered() {
        let journal: Journal = Arc::default();
        let server = HeaderValue::from_static("gw");
        let own: gateway_config::model::RespondConfig =
            serde_yaml::from_str("{ body: x, headers: { server: own } }").unwrap();
        let own = Terminal::Respond(Arc::new(Respond::new(&own, true, false).unwrap()));
        for (terminal, reply, seen) in [
            // The terminal's response gets it before the response hooks run.
            (respond("x"), false, "gw"),
            // The route's own `Server` header is kept.
            (own, false, "own"),
            // So does a later filter's local reply.
            (respond("x"), true, "gw"),
        ] {
            let filter = |reply| {
                let journal = journal.clone();
                Arc::new(ServerRemover { journal, reply }) as Arc<dyn FilterFactory>
            };
            let chain = Chain::new(vec![filter(false), filter(reply)]);
            let res = chain
                .run(&terminal, Request::new(Body::empty()), cx(), Some(&server))
                .await;
            // The filter nearer the terminal removed it (unless it replied): the other saw none.
            let expected = if reply { vec![seen] } else { vec![seen, ""] };
            assert_eq!(std::mem::take(&mut *journal.lock().unwrap()), expected);
            assert!(!res.headers().contains_key(header::SERVER), "{res:?}");
        }
    }

    /// A filter whose request hook answers synchronously (optionally with a local reply) and
    /// whose response hook does too unless `sync_response` is false.
    #[derive(Clone)]
    struct SyncStep {
        name: &'static str,
        journal: Journal,
        reply: bool,
        sync_response: bool,
        body: BodyAccess,
    }

    impl SyncStep {
        fn new(name: &'static str, journal: &Journal) -> Self {
            Self {
                name,
                journal: journal.clone(),
                reply: false,
                sync_response: true,
                body: BodyAccess::None,
            }
        }

        fn note(&self, what: &str) {
            note(&self.journal, self.name, what);
        }
    }

    impl FilterFactory for SyncStep {
        fn name(&self) -> &'static str {
            self.name
        }
        fn create(&self) -> Box<dyn HttpFilter> {
            Box::new(self.clone())
        }
        fn request_body(&self) -> BodyAccess {
            self.body
        }
        fn after_response(&self) -> bool {
            false
        }
    }

    #[async_trait::async_trait]
    impl HttpFilter for SyncStep {
        fn on_request_headers_sync(
            &mut self,
            req: &mut request::Parts,
            _cx: &mut RequestCx,
        ) -> Option<Result<Flow, BoxError>> {
            self.note("req");
            req.headers
                .append("x-seen", HeaderValue::from_static(self.name));
            reply_or_continue(self.reply, "sync reply")
        }
        fn on_response_headers_sync(
            &mut self,
            res: &mut response::Parts,
            _cx: &mut RequestCx,
        ) -> Option<Result<Flow, BoxError>> {
            if !self.sync_response {
                return None;
            }
            self.note("res");
            res.headers
                .append("x-res", HeaderValue::from_static(self.name));
            Some(Ok(Flow::Continue))
        }
        async fn on_response_headers(
            &mut self,
            res: &mut response::Parts,
            cx: &mut RequestCx,
        ) -> Result<Flow, BoxError> {
            if let Some(flow) = self.on_response_headers_sync(res, cx) {
                return flow;
            }
            self.note("res-async");
            res.headers
                .append("x-res", HeaderValue::from_static(self.name));
            Ok(Flow::Continue)
        }
        async fn on_request_body(
            &mut self,
            chunk: &mut Option<Bytes>,
            eos: bool,
            _cx: &mut RequestCx,
        ) -> Result<Flow, BoxError> {
            self.note(&body_entry(chunk, eos));
            Ok(Flow::Continue)
        }
    }

    fn x_res(res: &Response<Body>) -> Vec<String> {
        res.headers()
            .get_all("x-res")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    #[tokio::test]
    async fn synchronous_filters_and_terminal_finish_without_a_future() {
        let journal: Journal = Arc::default();
        let chain = Chain::new(vec![
            Arc::new(SyncStep::new("a", &journal)),
            Arc::new(SyncStep::new("b", &journal)),
        ]);
        let Started::Done(res) = chain.start(&respond("ok"), Request::new(Body::empty()), cx, None)
        else {
            panic!("every step here answers at once");
        };
        assert_eq!(x_res(&res), ["b", "a"]);
        assert_eq!(body_text(res).await, "ok");
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:req", "b:req", "b:res", "a:res"]
        );
    }

    #[tokio::test]
    async fn a_waiting_request_hook_resumes_where_the_synchronous_pass_stopped() {
        let journal: Journal = Arc::default();
        let chain = Chain::new(vec![
            Arc::new(SyncStep::new("a", &journal)),
            Arc::new(recorder("b", &journal)),
            Arc::new(SyncStep::new("c", &journal)),
        ]);
        let terminal = respond("ok");
        let Started::Wait(rest) = chain.start(&terminal, Request::new(Body::empty()), cx, None)
        else {
            panic!("`b` waits");
        };
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:req"],
            "nothing after `b` ran yet"
        );
        let res = rest.resume(&chain, &terminal, None).await;
        assert_eq!(x_res(&res), ["c", "b", "a"]);
        assert_eq!(body_text(res).await, "ok");
        tokio::task::yield_now().await;
        assert_eq!(
            *journal.lock().unwrap(),
            [
                "a:req",
                "b:req",
                "c:req",
                "c:res",
                "b:res",
                "a:res",
                "b:log:200"
            ],
            "each hook once, in order"
        );
    }

    #[tokio::test]
    async fn a_waiting_response_hook_resumes_below_the_synchronous_ones() {
        let journal: Journal = Arc::default();
        let mut a = SyncStep::new("a", &journal);
        a.sync_response = false;
        let chain = Chain::new(vec![Arc::new(a), Arc::new(SyncStep::new("b", &journal))]);
        let terminal = respond("ok");
        let Started::Wait(rest) = chain.start(&terminal, Request::new(Body::empty()), cx, None)
        else {
            panic!("`a`'s response hook waits");
        };
        let res = rest.resume(&chain, &terminal, None).await;
        assert_eq!(x_res(&res), ["b", "a"]);
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:req", "b:req", "b:res", "a:res-async"]
        );
    }

    #[tokio::test]
    async fn a_synchronous_local_reply_skips_the_rest_and_the_terminal() {
        let journal: Journal = Arc::default();
        let mut b = SyncStep::new("b", &journal);
        b.reply = true;
        let chain = Chain::new(vec![
            Arc::new(SyncStep::new("a", &journal)),
            Arc::new(b),
            Arc::new(SyncStep::new("c", &journal)),
        ]);
        let res = chain
            .run(
                &respond("terminal"),
                Request::new(Body::empty()),
                cx(),
                None,
            )
            .await;
        assert_eq!(x_res(&res), ["a"], "only `a` sees the reply");
        assert_eq!(body_text(res).await, "sync reply");
        assert_eq!(*journal.lock().unwrap(), ["a:req", "b:req", "a:res"]);
    }

    /// Without filters, a terminal that waits hands back its own future, for the caller to hold
    /// without boxing it again; the `Server` header is the caller's to add.
    #[tokio::test]
    async fn without_filters_a_waiting_terminal_hands_back_its_own_future() {
        let chain = Chain::new(Vec::new());
        let terminal = respond("ok");
        let server = HeaderValue::from_static("gw");
        let bodiless = chain.start(&terminal, Request::new(Body::empty()), cx, Some(&server));
        let Started::Done(res) = bodiless else {
            panic!("a synthetic response to a bodiless request is made at once");
        };
        assert_eq!(res.headers()[header::SERVER], "gw");
        // With a body to read first, the terminal waits.
        let req = Request::new(Body::from("payload"));
        let Started::Terminal(fut, None) = chain.start(&terminal, req, cx, Some(&server)) else {
            panic!("the terminal's own future, and no filters' state");
        };
        let res = fut.await;
        assert!(!res.headers().contains_key(header::SERVER));
        assert_eq!(body_text(res).await, "ok");
    }

    /// With filters whose request hooks answer at once, a terminal that waits hands back its
    /// own future too, with the filters' state for the response hooks: synchronous ones run in
    /// `after_terminal`, and one that waits leaves the rest to resume.
    #[tokio::test]
    async fn with_synchronous_filters_a_waiting_terminal_hands_back_its_own_future() {
        let journal: Journal = Arc::default();
        let chain = Chain::new(vec![
            Arc::new(SyncStep::new("a", &journal)),
            Arc::new(SyncStep::new("b", &journal)),
        ]);
        let terminal = respond("ok");
        let server = HeaderValue::from_static("gw");
        let req = Request::new(Body::from("payload"));
        let Started::Terminal(fut, Some(tail)) = chain.start(&terminal, req, cx, Some(&server))
        else {
            panic!("the terminal's own future, with the filters' state");
        };
        assert_eq!(*journal.lock().unwrap(), ["a:req", "b:req"]);
        let res = fut.await;
        assert!(x_res(&res).is_empty(), "no response hook has run yet");
        let Ok(res) = chain.after_terminal(tail, res, Some(&server)) else {
            panic!("both response hooks answer at once");
        };
        assert_eq!(x_res(&res), ["b", "a"]);
        assert_eq!(res.headers()[header::SERVER], "gw");
        assert_eq!(body_text(res).await, "ok");
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:req", "b:req", "b:res", "a:res"]
        );

        // The first filter's response hook waits: the rest resumes from it.
        journal.lock().unwrap().clear();
        let mut a = SyncStep::new("a", &journal);
        a.sync_response = false;
        let chain = Chain::new(vec![Arc::new(a), Arc::new(SyncStep::new("b", &journal))]);
        let req = Request::new(Body::from("payload"));
        let Started::Terminal(fut, Some(tail)) = chain.start(&terminal, req, cx, None) else {
            panic!("the terminal's own future, with the filters' state");
        };
        let Err(rest) = chain.after_terminal(tail, fut.await, None) else {
            panic!("`a`'s response hook waits");
        };
        let res = rest.resume(&chain, &terminal, None).await;
        assert_eq!(x_res(&res), ["b", "a"]);
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:req", "b:req", "b:res", "a:res-async"]
        );
    }

    #[tokio::test]
    async fn a_request_body_the_filters_read_waits_for_the_asynchronous_pass() {
        let journal: Journal = Arc::default();
        let mut a = SyncStep::new("a", &journal);
        a.body = BodyAccess::Buffer(1024);
        let chain = Chain::new(vec![Arc::new(a)]);
        let terminal = respond("ok");
        // Without a body the synchronous pass goes all the way.
        let bodiless = chain.start(&terminal, Request::new(Body::empty()), cx, None);
        assert!(matches!(bodiless, Started::Done(_)));
        journal.lock().unwrap().clear();
        let req = Request::new(Body::from("payload"));
        let Started::Wait(rest) = chain.start(&terminal, req, cx, None) else {
            panic!("the body must be read first");
        };
        let res = rest.resume(&chain, &terminal, None).await;
        assert_eq!(body_text(res).await, "ok");
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:req", "a:req_body:7:true", "a:res"],
            "the head hook ran once"
        );
    }

    #[tokio::test]
    async fn a_bodiless_request_calls_no_streamed_body_hook() {
        let journal: Journal = Arc::default();
        let mut a = SyncStep::new("a", &journal);
        a.body = BodyAccess::Stream;
        let chain = Chain::new(vec![Arc::new(a)]);
        let terminal = respond("ok");
        let bodiless = chain.start(&terminal, Request::new(Body::empty()), cx, None);
        assert!(matches!(bodiless, Started::Done(_)));
        assert_eq!(*journal.lock().unwrap(), ["a:req", "a:res"]);
        journal.lock().unwrap().clear();
        let req = Request::new(Body::from("payload"));
        let Started::Wait(rest) = chain.start(&terminal, req, cx, None) else {
            panic!("the body goes through the hook");
        };
        let res = rest.resume(&chain, &terminal, None).await;
        assert_eq!(body_text(res).await, "ok");
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:req", "a:req_body:7:true", "a:res"]
        );
    }

    /// A filter with response-body and log hooks, answered synchronously unless `sync` is
    /// false. At the end of the body it appends its name.
    #[derive(Clone)]
    struct BodyStep {
        name: &'static str,
        journal: Journal,
        sync: bool,
        /// The body hook fails at the end of the body.
        fail: bool,
        /// The response-head hook states the body's length as the terminal made it.
        states_length: bool,
    }

    impl BodyStep {
        fn new(name: &'static str, journal: &Journal, sync: bool) -> Self {
            Self {
                name,
                journal: journal.clone(),
                sync,
                fail: false,
                states_length: false,
            }
        }

        fn body(&self, chunk: &mut Option<Bytes>, eos: bool, what: &str) {
            note(&self.journal, self.name, &format!("{what}:{eos}"));
            if eos {
                let mut tail = chunk.take().map(|c| c.to_vec()).unwrap_or_default();
                tail.extend_from_slice(self.name.as_bytes());
                *chunk = Some(Bytes::from(tail));
            }
        }
    }

    impl FilterFactory for BodyStep {
        fn name(&self) -> &'static str {
            self.name
        }
        fn create(&self) -> Box<dyn HttpFilter> {
            Box::new(self.clone())
        }
        fn response_body(&self) -> bool {
            true
        }
    }

    #[async_trait::async_trait]
    impl HttpFilter for BodyStep {
        fn on_request_headers_sync(
            &mut self,
            _req: &mut request::Parts,
            _cx: &mut RequestCx,
        ) -> Option<Result<Flow, BoxError>> {
            Some(Ok(Flow::Continue))
        }
        fn on_response_headers_sync(
            &mut self,
            res: &mut response::Parts,
            _cx: &mut RequestCx,
        ) -> Option<Result<Flow, BoxError>> {
            if self.states_length {
                res.headers
                    .insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
            }
            Some(Ok(Flow::Continue))
        }
        fn on_response_body_sync(
            &mut self,
            chunk: &mut Option<Bytes>,
            eos: bool,
            _cx: &mut RequestCx,
        ) -> Option<Result<(), BoxError>> {
            if !self.sync {
                return None;
            }
            self.body(chunk, eos, "body");
            if self.fail && eos {
                return Some(Err("the body hook failed".into()));
            }
            Some(Ok(()))
        }
        async fn on_response_body(
            &mut self,
            chunk: &mut Option<Bytes>,
            eos: bool,
            cx: &mut RequestCx,
        ) -> Result<(), BoxError> {
            if let Some(r) = self.on_response_body_sync(chunk, eos, cx) {
                return r;
            }
            self.body(chunk, eos, "body-async");
            if self.fail && eos {
                return Err("the body hook failed".into());
            }
            Ok(())
        }
        fn on_log_sync(&mut self, _cx: &RequestCx, status: StatusCode) -> bool {
            if !self.sync {
                return false;
            }
            note(
                &self.journal,
                self.name,
                &format!("log:{}", status.as_u16()),
            );
            true
        }
        async fn on_log(&mut self, cx: &RequestCx, status: StatusCode) {
            if !self.on_log_sync(cx, status) {
                note(&self.journal, self.name, "log-async");
            }
        }
    }

    #[tokio::test]
    async fn synchronous_body_and_log_hooks_run_in_the_body_stream_itself() {
        let journal: Journal = Arc::default();
        let chain = Chain::new(vec![
            Arc::new(BodyStep::new("a", &journal, true)),
            Arc::new(BodyStep::new("b", &journal, true)),
        ]);
        let Started::Done(res) = chain.start(&respond("ok"), Request::new(Body::empty()), cx, None)
        else {
            panic!("every hook answers synchronously");
        };
        // The body was whole before the head went out: the hooks ran on it then, once each
        // and with the end of the stream, so the response states its final length.
        assert_eq!(res.body().size_hint().exact(), Some(4));
        assert_eq!(
            *journal.lock().unwrap(),
            ["b:body:true", "a:body:true"],
            "body hooks in reverse order, before the head went out"
        );
        assert_eq!(body_text(res).await, "okba");
        // Then the log phase in filter order, before the body's end was handed on.
        assert_eq!(
            *journal.lock().unwrap(),
            ["b:body:true", "a:body:true", "a:log:200", "b:log:200"]
        );
    }

    /// A streamed body (not whole in memory when the head goes out) goes through the hooks
    /// chunk by chunk, then once more at its end, and out without a stated length.
    #[tokio::test]
    async fn a_streamed_body_goes_through_the_hooks_as_it_comes() {
        let journal: Journal = Arc::default();
        let chain = Chain::new(vec![Arc::new(BodyStep::new("a", &journal, true))]);
        let (parts, ()) = Response::new(()).into_parts();
        let streamed = Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            [Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"ok")))],
        )));
        let mut st = chain.fresh_state(cx());
        st.started = 1;
        let res = chain.with_body_hooks(st, 1, Response::from_parts(parts, streamed));
        assert_eq!(res.body().size_hint().exact(), None);
        assert_eq!(body_text(res).await, "oka");
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:body:false", "a:body:true", "a:log:200"]
        );
    }

    /// A streamed body whose last chunk says nothing follows hands that chunk to the hooks
    /// with the end of the stream, synchronously or awaited: no call with nothing after it.
    #[tokio::test]
    async fn a_streamed_body_that_knows_its_end_ends_on_its_last_chunk() {
        for (waits, expected, journaled) in [
            (false, "oka", &["a:body:true", "a:log:200"][..]),
            (
                true,
                "okba",
                &[
                    "b:body-async:true",
                    "a:body:true",
                    "a:log:200",
                    "b:log-async",
                ][..],
            ),
        ] {
            let journal: Journal = Arc::default();
            let mut factories: Vec<Arc<dyn FilterFactory>> =
                vec![Arc::new(BodyStep::new("a", &journal, true))];
            if waits {
                factories.push(Arc::new(BodyStep::new("b", &journal, false)));
            }
            let chain = Chain::new(factories);
            let mut st = chain.fresh_state(cx());
            st.started = chain.factories.len();
            // One buffer, but boxed: not a body the chain sees whole before the head.
            let body = Body::new(http_body_util::Full::new(Bytes::from_static(b"ok")));
            let (parts, ()) = Response::new(()).into_parts();
            let upto = chain.factories.len();
            let res = chain.with_body_hooks(st, upto, Response::from_parts(parts, body));
            assert_eq!(res.body().size_hint().exact(), None);
            assert_eq!(body_text(res).await, expected);
            assert_eq!(*journal.lock().unwrap(), journaled, "waits: {waits}");
        }
    }

    /// A synchronous hook runs on the whole body before the head goes out; one that waits
    /// below it gets what it left, in the body stream.
    #[tokio::test]
    async fn a_waiting_body_hook_below_a_synchronous_one_gets_the_rest_in_the_stream() {
        let journal: Journal = Arc::default();
        let chain = Chain::new(vec![
            Arc::new(BodyStep::new("a", &journal, false)),
            Arc::new(BodyStep::new("b", &journal, true)),
        ]);
        let res = chain
            .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
            .await;
        assert_eq!(res.body().size_hint().exact(), None, "length not known yet");
        assert_eq!(body_text(res).await, "okba");
        assert_eq!(
            *journal.lock().unwrap(),
            [
                "b:body:true",
                "a:body-async:true",
                "a:log-async",
                "b:log:200"
            ]
        );
    }

    /// A hook that fails on a whole body turns the response into an error response (its head
    /// has not gone out), and the log phase sees that status.
    #[tokio::test]
    async fn a_failing_hook_on_a_whole_body_gives_an_error_response() {
        let journal: Journal = Arc::default();
        let mut b = BodyStep::new("b", &journal, true);
        b.fail = true;
        let chain = Chain::new(vec![
            Arc::new(BodyStep::new("a", &journal, true)),
            Arc::new(b),
        ]);
        let res = chain
            .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
            .await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body_text(res).await.starts_with("500"));
        assert_eq!(
            *journal.lock().unwrap(),
            ["b:body:true", "a:log:500", "b:log:500"],
            "the hooks below the failed one do not run"
        );
    }

    /// A hook that waits and fails at the end of a streamed body ends the body with its
    /// error; the log phase still runs.
    #[tokio::test]
    async fn a_waiting_hook_that_fails_at_the_end_still_leaves_the_log_phase() {
        let journal: Journal = Arc::default();
        let mut a = BodyStep::new("a", &journal, false);
        a.fail = true;
        let chain = Chain::new(vec![Arc::new(a)]);
        let res = chain
            .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
            .await;
        assert!(res.into_body().collect().await.is_err());
        assert_eq!(
            *journal.lock().unwrap(),
            ["a:body-async:true", "a:log-async"]
        );
    }

    /// A `Content-Length` the response states is corrected when the hooks change the length.
    #[tokio::test]
    async fn a_stated_length_follows_what_the_hooks_left() {
        let journal: Journal = Arc::default();
        let mut a = BodyStep::new("a", &journal, true);
        a.states_length = true;
        let chain = Chain::new(vec![Arc::new(a)]);
        let res = chain
            .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
            .await;
        assert_eq!(res.headers()[header::CONTENT_LENGTH], "3");
        assert_eq!(body_text(res).await, "oka");
    }

    #[tokio::test]
    async fn a_body_or_log_hook_that_waits_hands_the_rest_to_the_asynchronous_pass() {
        let journal: Journal = Arc::default();
        let chain = Chain::new(vec![
            Arc::new(BodyStep::new("a", &journal, true)),
            Arc::new(BodyStep::new("b", &journal, false)),
        ]);
        let res = chain
            .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
            .await;
        assert_eq!(body_text(res).await, "okba");
        // The first hook waits, so the body streams; its one chunk is its last, so it goes
        // through the hooks with the end of the stream.
        assert_eq!(
            *journal.lock().unwrap(),
            [
                "b:body-async:true",
                "a:body:true",
                "a:log:200",
                "b:log-async"
            ]
        );
    }

    #[tokio::test]
    async fn an_abandoned_response_body_still_gets_the_log_phase() {
        let journal: Journal = Arc::default();
        let chain = Chain::new(vec![Arc::new(BodyStep::new("a", &journal, true))]);
        let res = chain
            .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
            .await;
        drop(res);
        // The whole body went through the hook before the head was handed on; synchronous
        // log hooks run in the body's drop, not in a task spawned for them (this test's
        // runtime has one thread, and the test has not yielded to other tasks).
        assert_eq!(*journal.lock().unwrap(), ["a:body:true", "a:log:200"]);
    }

    /// Marks the trailers it sees, both ways.
    struct TrailerTag(&'static str);

    impl FilterFactory for TrailerTag {
        fn name(&self) -> &'static str {
            self.0
        }
        fn create(&self) -> Box<dyn HttpFilter> {
            Box::new(TrailerTag(self.0))
        }
        fn after_response(&self) -> bool {
            true
        }
    }

    impl TrailerTag {
        fn tag(&self, trailers: &mut HeaderMap) -> Result<(), BoxError> {
            trailers.append("x-seen-by", HeaderValue::from_static(self.0));
            Ok(())
        }
    }

    #[async_trait::async_trait]
    impl HttpFilter for TrailerTag {
        async fn on_request_trailers(
            &mut self,
            trailers: &mut HeaderMap,
            _cx: &mut RequestCx,
        ) -> Result<(), BoxError> {
            self.tag(trailers)
        }
        async fn on_response_trailers(
            &mut self,
            trailers: &mut HeaderMap,
            _cx: &mut RequestCx,
        ) -> Result<(), BoxError> {
            self.tag(trailers)
        }
    }

    /// A body of one chunk, then trailers `x-sum: 1` when `with_trailers`.
    fn body_with_trailers(with_trailers: bool) -> Body {
        let mut frames = vec![Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"ok")))];
        if with_trailers {
            let mut t = HeaderMap::new();
            t.insert("x-sum", HeaderValue::from_static("1"));
            frames.push(Ok(Frame::trailers(t)));
        }
        Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )))
    }

    fn seen_by(trailers: Option<&HeaderMap>) -> Vec<String> {
        let Some(t) = trailers else {
            return vec!["none".into()];
        };
        let mut out = vec![format!("x-sum={}", t["x-sum"].to_str().unwrap())];
        out.extend(
            t.get_all("x-seen-by")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned()),
        );
        out
    }

    /// Response trailers go through the trailer hooks in reverse order, after the body, and a
    /// body without trailers ends without any.
    #[tokio::test]
    async fn response_trailers_go_through_the_hooks_after_the_body() {
        for (with_trailers, expected) in [(true, &["x-sum=1", "b", "a"][..]), (false, &["none"])] {
            let chain = Chain::new(vec![Arc::new(TrailerTag("a")), Arc::new(TrailerTag("b"))]);
            let mut st = chain.fresh_state(cx());
            st.started = 2;
            let body = body_with_trailers(with_trailers);
            let res = chain.with_body_hooks(st, 2, Response::new(body));
            let collected = res.into_body().collect().await.unwrap();
            assert_eq!(seen_by(collected.trailers()), expected);
            assert_eq!(collected.to_bytes(), "ok");
        }
    }

    /// Request trailers go through the trailer hooks in filter order once the body is read.
    #[tokio::test]
    async fn request_trailers_go_through_the_hooks_after_the_body() {
        for (with_trailers, expected) in [(true, &["x-sum=1", "a", "b"][..]), (false, &["none"])] {
            let chain = Chain::new(vec![Arc::new(TrailerTag("a")), Arc::new(TrailerTag("b"))]);
            let body = Body::new(RequestBodyHooks {
                inner: body_with_trailers(with_trailers),
                state: Arc::new(Mutex::new(chain.fresh_state(cx()))),
                pending: None,
                done: false,
                trailers: TrailerSlot::default(),
            });
            let collected = body.collect().await.unwrap();
            assert_eq!(seen_by(collected.trailers()), expected);
            assert_eq!(collected.to_bytes(), "ok");
        }
    }
}
