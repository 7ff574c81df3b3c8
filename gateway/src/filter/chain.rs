//! Runs a route's filters around its terminal. Without filters the terminal is called directly
//! (nothing allocated). With filters, the per-request instances and the request context live in
//! one shared, uncontended lock so that the request-body and response-body streams, which outlive
//! this function, can still call the hooks.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use tokio::sync::Mutex;

use super::{BodyAccess, FilterFactory, Flow, HttpFilter};
use crate::body::{Body, BoxError};
use crate::context::RequestCx;
use crate::error::GatewayError;
use crate::terminal::Terminal;

/// A route's compiled filter chain.
#[derive(Clone, Default)]
pub struct Chain {
    factories: Arc<[Arc<dyn FilterFactory>]>,
    request_body: Option<BodyAccess>,
    response_body: bool,
}

struct State {
    filters: Vec<Box<dyn HttpFilter>>,
    cx: RequestCx,
    status: StatusCode,
    local_reply: Option<Response<Body>>,
    logged: bool,
}

type Shared = Arc<Mutex<State>>;
type HookFuture = Pin<Box<dyn Future<Output = Result<Option<Bytes>, BoxError>> + Send>>;

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
        Self {
            factories: factories.into(),
            request_body,
            response_body,
        }
    }

    /// Whether the chain has no filters.
    pub fn is_empty(&self) -> bool {
        self.factories.is_empty()
    }

    /// Runs the request through the filters and the terminal. `server` is the `Server` header
    /// every response starts with, before response filters run (so they may remove it).
    pub async fn run(
        &self,
        terminal: &Terminal,
        req: Request<Body>,
        cx: RequestCx,
        server: Option<&HeaderValue>,
    ) -> Response<Body> {
        if self.factories.is_empty() {
            return with_server(terminal.handle(req, &cx).await, server);
        }
        let filters = self.factories.iter().map(|f| f.create()).collect();
        let terminal_cx = cx.clone();
        let state: Shared = Arc::new(Mutex::new(State {
            filters,
            cx,
            status: StatusCode::OK,
            local_reply: None,
            logged: false,
        }));
        let (mut parts, body) = req.into_parts();

        // Request headers, in order. A local reply goes back through the filters before it.
        {
            let mut guard = state.lock().await;
            let st = &mut *guard;
            for i in 0..st.filters.len() {
                let flow = st.filters[i]
                    .on_request_headers(&mut parts, &mut st.cx)
                    .await;
                match self.decide(flow, i) {
                    None => {}
                    Some(resp) => {
                        drop(guard);
                        return self
                            .response_phase(state, i, with_server(resp, server))
                            .await;
                    }
                }
            }
        }

        let body = match self.request_body {
            None | Some(BodyAccess::None) => body,
            Some(BodyAccess::Buffer(limit)) => {
                match self.buffer_request_body(&state, body, limit).await {
                    Ok(body) => body,
                    Err(resp) => {
                        let resp = with_server(resp, server);
                        return self.response_phase(state, self.factories.len(), resp).await;
                    }
                }
            }
            Some(BodyAccess::Stream) => Body::new(RequestBodyHooks {
                inner: body,
                state: state.clone(),
                pending: None,
                done: false,
            }),
        };

        let response = terminal
            .handle(Request::from_parts(parts, body), &terminal_cx)
            .await;
        let response = match state.lock().await.local_reply.take() {
            Some(reply) => reply,
            None => response,
        };
        let response = with_server(response, server);
        self.response_phase(state, self.factories.len(), response)
            .await
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
        state: &Shared,
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
        let mut guard = state.lock().await;
        let st = &mut *guard;
        for i in 0..st.filters.len() {
            let flow = st.filters[i]
                .on_request_body(&mut chunk, true, &mut st.cx)
                .await;
            if let Some(resp) = self.decide(flow, i) {
                return Err(resp);
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

    async fn response_phase(
        &self,
        state: Shared,
        upto: usize,
        response: Response<Body>,
    ) -> Response<Body> {
        let (mut parts, mut body) = response.into_parts();
        {
            let mut guard = state.lock().await;
            let st = &mut *guard;
            for i in (0..upto).rev() {
                let flow = st.filters[i]
                    .on_response_headers(&mut parts, &mut st.cx)
                    .await;
                if let Some(reply) = self.decide(flow, i) {
                    let (p, b) = reply.into_parts();
                    parts = p;
                    body = b;
                }
            }
            st.status = parts.status;
        }
        let body = Body::new(ResponseBodyHooks {
            inner: body,
            state,
            upto,
            hooks: self.response_body,
            pending: None,
            trailers: None,
            finished: false,
        });
        Response::from_parts(parts, body)
    }
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

async fn run_response_body_hooks(
    state: Shared,
    upto: usize,
    mut chunk: Option<Bytes>,
    eos: bool,
) -> Result<Option<Bytes>, BoxError> {
    let mut guard = state.lock().await;
    let st = &mut *guard;
    for f in st.filters[..upto].iter_mut().rev() {
        f.on_response_body(&mut chunk, eos, &mut st.cx).await?;
    }
    Ok(chunk)
}

async fn run_log(state: Shared) {
    let mut guard = state.lock().await;
    let st = &mut *guard;
    if st.logged {
        return;
    }
    st.logged = true;
    let status = st.status;
    for f in st.filters.iter_mut() {
        f.on_log(&st.cx, status).await;
    }
}

/// Passes response data through the filters' body hooks, then runs the log phase.
struct ResponseBodyHooks {
    inner: Body,
    state: Shared,
    upto: usize,
    hooks: bool,
    pending: Option<HookFuture>,
    trailers: Option<HeaderMap>,
    finished: bool,
}

impl HttpBody for ResponseBodyHooks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(fut) = this.pending.as_mut() {
                let out = std::task::ready!(fut.as_mut().poll(cx));
                this.pending = None;
                match out {
                    Ok(Some(data)) if !data.is_empty() => {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Ok(_) => {}
                    Err(e) => return Poll::Ready(Some(Err(e))),
                }
            }
            if this.finished {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if this.hooks => {
                        this.pending = Some(Box::pin(run_response_body_hooks(
                            this.state.clone(),
                            this.upto,
                            Some(data),
                            false,
                        )));
                    }
                    Ok(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Err(frame) => {
                        // Trailers end the body: the end-of-stream hooks run before they go out.
                        this.trailers = frame.into_trailers().ok();
                        this.finish();
                    }
                },
                Some(Err(e)) => {
                    this.finished = true;
                    tokio::spawn(run_log(this.state.clone()));
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.finish(),
            }
        }
    }
}

impl ResponseBodyHooks {
    fn finish(&mut self) {
        self.finished = true;
        let (state, upto, hooks) = (self.state.clone(), self.upto, self.hooks);
        self.pending = Some(Box::pin(async move {
            let tail = if hooks {
                run_response_body_hooks(state.clone(), upto, None, true).await?
            } else {
                None
            };
            run_log(state).await;
            Ok(tail)
        }));
    }
}

impl Drop for ResponseBodyHooks {
    fn drop(&mut self) {
        // The client went away (or the body was never polled): the log phase still runs.
        if !self.finished || self.pending.is_some() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(run_log(self.state.clone()));
            }
        }
    }
}

/// Passes request data through the filters' body hooks as the terminal reads it.
struct RequestBodyHooks {
    inner: Body,
    state: Shared,
    pending: Option<HookFuture>,
    done: bool,
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
            st.local_reply = Some(reply);
            return Err("request ended by a filter's local reply".into());
        }
    }
    Ok(chunk)
}

impl HttpBody for RequestBodyHooks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(fut) = this.pending.as_mut() {
                let out = std::task::ready!(fut.as_mut().poll(cx));
                this.pending = None;
                match out {
                    Ok(Some(data)) if !data.is_empty() => {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Ok(_) => {}
                    Err(e) => return Poll::Ready(Some(Err(e))),
                }
            }
            if this.done {
                return Poll::Ready(None);
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
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
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
