//! The HTTP filter chain's contract. A route holds filter *factories* built once per config
//! generation; each request gets fresh filter *instances* that own their per-request state.
//! Every hook is async (awaiting is how a filter pauses) and returns a [`Flow`]: continue, or
//! end the request with a response of the filter's own (a local reply).
//!
//! Phase order is drawn in `docs/phases.md`: request headers → request body → terminal →
//! response headers (reverse order) → response body (reverse order) → log.

pub mod basic_auth;
pub mod cache;
mod chain;
pub mod compress;
pub mod cors;
pub mod forward_auth;
mod headers;
pub mod jwt;
pub mod rate_limit;
mod rewrite;
pub mod waf;

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, request, response};

pub use basic_auth::BasicAuthFilterFactory;
pub use cache::CacheFilterFactory;
pub use chain::{Chain, Pending, Started, Tail, with_server};
pub use compress::CompressFilterFactory;
pub use cors::CorsFilterFactory;
pub use forward_auth::ForwardAuthFilterFactory;
pub use headers::HeadersFilterFactory;
pub use jwt::JwtFilterFactory;
pub use rate_limit::RateLimitFilterFactory;
pub use rewrite::RewriteFilterFactory;
pub use waf::WafFilterFactory;

use crate::body::{Body, BoxError};
use crate::context::RequestCx;

/// What a hook decided.
#[must_use]
pub enum Flow {
    /// Pass the request (or response) on.
    Continue,
    /// End the request with this response. From a response phase, the response replaces the
    /// upstream's when headers have not been sent yet.
    Respond(Response<Body>),
}

/// Put in a response's extensions by a response-header hook: the response's body is to be
/// read to its end, through the filters' body hooks, even when the client goes away first,
/// for as long as the check says so (checked after each piece once the client has gone). The
/// `cache` filter asks it for an answer that requests coalesced on its fetch are streaming.
/// The body is then read by a task of its own and handed to the client through a channel.
#[derive(Clone)]
pub struct ReadToEnd(Arc<dyn Fn() -> bool + Send + Sync>);

impl ReadToEnd {
    /// Read on while `check` answers `true`.
    pub fn as_long_as(check: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(check))
    }

    /// Whether the body is still to be read with no client to send it to.
    pub(crate) fn still(&self) -> bool {
        (self.0)()
    }
}

/// How much of the request body a filter needs to see before the terminal starts. A request
/// that has no body (its head ended the stream, as for most GETs) calls no body hook at all,
/// as in Envoy, where a headers-only request never reaches `decodeData`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BodyAccess {
    /// The filter has no request-body hook.
    None,
    /// Chunks are passed through the hook as the terminal reads them.
    Stream,
    /// The whole body (up to the limit, 413 beyond) is read and passed through the hook, with
    /// `eos = true`, before the terminal starts.
    Buffer(u64),
}

/// Builds one filter instance per request; created once per config generation.
pub trait FilterFactory: Send + Sync + 'static {
    /// Name used in logs and errors.
    fn name(&self) -> &'static str;
    /// A fresh instance for one request.
    fn create(&self) -> Box<dyn HttpFilter>;
    /// The request-body access the instances need.
    fn request_body(&self) -> BodyAccess {
        BodyAccess::None
    }
    /// Whether instances have a response-body hook.
    fn response_body(&self) -> bool {
        false
    }
    /// Whether instances do anything once the response head has gone: a response-body,
    /// response-trailer or log hook. When no filter of a chain does, the response body is
    /// handed on as it is, without the stream that runs those hooks. True unless a factory
    /// knows its instances have none of them.
    fn after_response(&self) -> bool {
        true
    }
    /// Whether instances read the request's head after its header hook (in body, response,
    /// trailer or log hooks): the chain then keeps it for them in
    /// [`RequestCx::request_head`](crate::context::RequestCx::request_head).
    fn reads_request_later(&self) -> bool {
        false
    }
}

/// One filter's view of one request.
///
/// The head, response-body and log hooks come in two forms. The chain first calls the `_sync`
/// one; a filter that does not wait there (every native filter, and a Wasm plugin that does not
/// pause) answers with `Some` (`true` for the log), which spares a boxed future per hook and
/// request. `None` (`false`), the default, sends the chain on to the async hook. A filter may
/// start work in a `_sync` hook that answers `None` and finish it in the async hook, but the
/// chain may ask the `_sync` hook again before the async one runs: it must then answer `None`
/// again without doing anything.
#[async_trait::async_trait]
pub trait HttpFilter: Send {
    /// The request head arrived, for a filter that can decide without waiting; `None` defers
    /// to [`HttpFilter::on_request_headers`].
    fn on_request_headers_sync(
        &mut self,
        _req: &mut request::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        None
    }

    /// The response head is about to be sent, for a filter that can decide without waiting;
    /// `None` defers to [`HttpFilter::on_response_headers`].
    fn on_response_headers_sync(
        &mut self,
        _res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        None
    }

    /// The request head arrived. The default runs the `_sync` hook.
    async fn on_request_headers(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        self.on_request_headers_sync(req, cx)
            .unwrap_or(Ok(Flow::Continue))
    }

    /// A request body chunk (`eos` on the last call). The filter may replace, take (to buffer
    /// and emit later) or append to the chunk.
    async fn on_request_body(
        &mut self,
        _chunk: &mut Option<Bytes>,
        _eos: bool,
        _cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        Ok(Flow::Continue)
    }

    /// The response head is about to be sent. The default runs the `_sync` hook.
    async fn on_response_headers(
        &mut self,
        res: &mut response::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        self.on_response_headers_sync(res, cx)
            .unwrap_or(Ok(Flow::Continue))
    }

    /// A response body chunk, for a filter that can handle it without waiting; `None` defers
    /// to [`HttpFilter::on_response_body`].
    fn on_response_body_sync(
        &mut self,
        _chunk: &mut Option<Bytes>,
        _eos: bool,
        _cx: &mut RequestCx,
    ) -> Option<Result<(), BoxError>> {
        None
    }

    /// A response body chunk (`eos` on the last call, whose chunk may start as `None`). The
    /// default runs the `_sync` hook.
    async fn on_response_body(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        self.on_response_body_sync(chunk, eos, cx).unwrap_or(Ok(()))
    }

    /// Request trailers, after the last body chunk (only when the request has trailers and
    /// the chain passes the body through hooks). The filter may change them.
    async fn on_request_trailers(
        &mut self,
        _trailers: &mut http::HeaderMap,
        _cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        Ok(())
    }

    /// Response trailers, before they are sent (after the end-of-stream body hook).
    async fn on_response_trailers(
        &mut self,
        _trailers: &mut http::HeaderMap,
        _cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        Ok(())
    }

    /// The exchange is over, for a filter that logs without waiting; `false` defers to
    /// [`HttpFilter::on_log`].
    fn on_log_sync(&mut self, _cx: &RequestCx, _status: http::StatusCode) -> bool {
        false
    }

    /// The exchange is over (completed, failed or abandoned by the client). The default runs
    /// the `_sync` hook.
    async fn on_log(&mut self, cx: &RequestCx, status: http::StatusCode) {
        self.on_log_sync(cx, status);
    }
}
