//! The request side of a chain's run: the request-header hooks, the request body (buffered for
//! the filters, or streamed through their hooks), then the terminal. [`Chain::start`] goes as
//! far as it can without waiting; [`Chain::run`] and [`Pending::resume`] await the rest.

use std::future::Future;
use std::sync::Arc;

use bytes::BytesMut;
use futures_util::future::Either;
use http::{HeaderMap, HeaderValue, Request, Response, request};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use tokio::sync::Mutex;

use super::request_body::RequestBodyHooks;
use super::{Chain, Pending, Shared, Stage, Started, State, Tail, with_server};
use crate::body::{Body, BoxError};
use crate::context::RequestCx;
use crate::error::GatewayError;
use crate::filter::{BodyAccess, Flow};
use crate::telemetry::trace::with_current;
use crate::terminal::Terminal;

/// Where a synchronous pass over the request-header hooks ended.
enum HeadPass {
    /// Every hook let the request through.
    Through,
    /// Filter `i` answered with a local reply.
    Reply(usize, Response<Body>),
    /// Filter `i` must be awaited.
    Waits(usize),
}

impl Chain {
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

    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would store its arguments twice (see `run`)"
    )]
    pub(super) fn run_filters<'a>(
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
        let body = Body::new(RequestBodyHooks::new(body, state.clone(), self.clone()));
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
}
