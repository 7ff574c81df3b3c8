//! Spans that end with a body rather than with a response head: a request's server span ends
//! once the response body has been sent, and an upstream attempt's client span once the
//! upstream's body has been read, so their durations cover the whole exchange.
//!
//! [`OpenSpan`] holds a recorded span whose head is known (status, attributes). It is finished
//! by whoever sees the body end: [`SpanBody`] around the response the client gets, the proxy's
//! upstream body for a client span. Dropped unfinished, the body was abandoned (the client
//! went away): the span is recorded then, with `gateway.client_gone`. Only recorded spans are
//! ever opened, so an untraced or unsampled request has no wrapper and no extra work.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::Tracer;
use super::context::TraceId;
use super::span::{self, SpanData, Status, Value};
use crate::body::{Body, BoxError};

/// A recorded span waiting for the end of its body.
pub struct OpenSpan {
    /// `None` once recorded. Boxed: the proxy's futures hold an `Option<OpenSpan>` in several
    /// states, and inline the span data would add a quarter KiB to each of them, traced or not.
    open: Option<Box<(Arc<Tracer>, SpanData)>>,
}

impl OpenSpan {
    pub(super) fn new(tracer: Arc<Tracer>, data: SpanData) -> Self {
        Self {
            open: Some(Box::new((tracer, data))),
        }
    }

    /// The span's trace.
    pub fn trace_id(&self) -> Option<TraceId> {
        self.open.as_ref().map(|open| open.1.trace_id)
    }

    /// The body was sent (or read) to its end: the span ends now.
    pub fn finish(mut self) {
        self.record(|_| {});
    }

    /// The body failed midway (`error_type` says how): the span ends now, failed.
    pub fn fail(mut self, error_type: &'static str) {
        self.record(|d| {
            d.attributes.push(("error.type", Value::Static(error_type)));
            d.status = Status::Error("the response body failed".into());
        });
    }

    /// `body` as the client gets it: the span ends when the body has been sent (or at once
    /// when there is none to send: `no_body` for HEAD, 1xx, 204 and 304).
    pub fn attach(self, body: Body, no_body: bool) -> Body {
        if no_body || http_body::Body::is_end_stream(&body) {
            self.finish();
            return body;
        }
        Body::new(SpanBody {
            inner: body,
            span: Some(self),
        })
    }

    fn record(&mut self, edit: impl FnOnce(&mut SpanData)) {
        if let Some(open) = self.open.take() {
            let (tracer, mut data) = *open;
            edit(&mut data);
            data.end = span::now();
            tracer.record(data);
        }
    }
}

impl Drop for OpenSpan {
    fn drop(&mut self) {
        self.record(|d| {
            d.attributes
                .push(("gateway.client_gone", Value::Bool(true)))
        });
    }
}

/// A response body that ends its server span when the last frame has gone out.
struct SpanBody {
    inner: Body,
    span: Option<OpenSpan>,
}

impl HttpBody for SpanBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        // Servers stop polling a body that reports its end after a frame, so that is its end
        // too, not only `None`.
        let ended = match &frame {
            None => Some(None),
            Some(Ok(_)) => this.inner.is_end_stream().then_some(None),
            Some(Err(_)) => Some(Some("response_body_error")),
        };
        if let Some(error) = ended
            && let Some(span) = this.span.take()
        {
            match error {
                None => span.finish(),
                Some(error_type) => span.fail(error_type),
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for SpanBody {
    fn drop(&mut self) {
        // A server may drop a body without polling it once it reports its end; that body was
        // complete. Anything else left here was abandoned (the span's own drop says so).
        if self.inner.is_end_stream()
            && let Some(span) = self.span.take()
        {
            span.finish();
        }
    }
}
