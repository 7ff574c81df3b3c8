//! Runs a route's filters around its terminal. Without filters the terminal is called directly
//! (nothing allocated). With filters, the per-request instances and the request context live on
//! the request's future; only when a request-body or response-body stream, which outlives that
//! future, must still call hooks do they move into one shared, uncontended lock. Hooks a filter
//! can answer without waiting (`on_*_headers_sync`) are called directly, without a boxed future.
//!
//! This file holds the chain, its construction and a request's filter state. The parts of a run:
//! `request_side` (the request side, up to the terminal), `response_head` (the response-header
//! hooks after it), `response_body` and `request_body` (the streams that run the body hooks),
//! `hook_stream` (what those two streams share: the hook in flight, the trailers) and `log` (the
//! log phase).

mod hook_stream;
mod log;
mod request_body;
mod request_side;
mod response_body;
mod response_head;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;

use futures_util::future::Either;
use http::{HeaderValue, Response, StatusCode, header, request};
use tokio::sync::Mutex;
use wasm_host::state::copy_head;

use super::{BodyAccess, FilterFactory, Flow, HttpFilter};
use crate::body::{Body, BoxError};
use crate::context::RequestCx;
use crate::error::GatewayError;
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

/// A request's filter instances and context, and how far its phases got.
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

/// A request's filter state once a body stream that outlives the request's future needs it.
type Shared = Arc<Mutex<State>>;

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
