//! The upstream response body on its way to the client. It streams frames (data and trailers)
//! untouched but for the fields no trailer may carry ([`super::trailers`]), and around them does
//! the bookkeeping that must wait for the body's end (an HTTP/1.1 connection goes back to its
//! pool from [`super::h1::ResponseBody`] itself): the target stays "in flight" for the balancers
//! until then, a reset or truncated body counts as a failure of the target, the attempt's
//! `timeout` keeps running so a stalled body cannot hang the client, and the attempt's client
//! span (when recorded) ends with the body.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use stream_proxy::upstream::Selection;

use super::h1::ResponseBody;
use super::upstream::Upstream;
use crate::body::{Body, BoxError};
use crate::error::GatewayError;
use crate::telemetry::trace::OpenSpan;

/// What an attempt holds until its response body ends.
pub(crate) struct Lease {
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) selection: Selection,
    pub(crate) deadline: super::deadline::Deadline,
    /// The route's deadline for the whole response (for the error that reports it).
    pub(crate) timeout: Option<std::time::Duration>,
    /// The attempt's client span, ended with the body (dropped unfinished when the client
    /// goes away first).
    pub(crate) span: Option<OpenSpan>,
}

impl Lease {
    /// The exchange completed.
    fn finish(self) {
        super::deadline::give_back(self.deadline);
        if let Some(span) = self.span {
            span.finish();
        }
    }

    /// The exchange broke (`error_type`: `response_error` or `timeout`): the target is
    /// charged (the body that failed drops, and closes, its connection).
    fn fail(self, error_type: &'static str) {
        self.upstream
            .targets
            .report_failure_on(self.selection.state());
        if let Some(span) = self.span {
            span.fail(error_type);
        }
    }
}

/// Wraps an upstream body. The first frame is awaited for one scheduling round: a small
/// response usually arrives with its head, and handing hyper the complete body lets it write
/// head and body in one syscall (and release the upstream connection at once) instead of
/// flushing the head alone and waking again for the body. A body that turns out complete is
/// passed on without a wrapper. `Err` when the body failed before anything was sent.
///
/// The first look happens here, without waiting: most bodies are decided by it, and the
/// request's future then holds no future for this at all, rather than one copied into its
/// state on every proxied request. Only a body whose first frame is not there yet gets the
/// boxed [`WrapLater`], which yields once and looks again.
pub(crate) fn wrap(mut inner: RawBody, lease: Lease) -> Result<Result<Body, BoxError>, WrapLater> {
    if inner.is_end_stream() {
        lease.finish();
        return Ok(Ok(Body::empty()));
    }
    // A poll with a waker that does nothing: when the frame is there it is taken and no waker
    // is kept; when it is not, the noop waker this leaves with the body's source is replaced
    // by the task's own when `WrapLater` polls again, and the yield before that wakes the task
    // whatever happens meanwhile. So no wake-up can be lost.
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match Pin::new(&mut inner).poll_frame(&mut cx) {
        Poll::Ready(first) => Ok(settle(inner, lease, Some(first))),
        Poll::Pending => Err(WrapLater(Box::pin(async move {
            tokio::task::yield_now().await;
            let first = poll_now(&mut inner).await;
            settle(inner, lease, first)
        }))),
    }
}

/// The rest of [`wrap`] for a body whose first frame was not there at once. Boxed here, though
/// the caller boxes its own future around it on this rare path: unboxed, this future would make
/// every `wrap` result as large, and the common answer would be copied at that size.
pub(crate) struct WrapLater(Pin<Box<dyn Future<Output = Result<Body, BoxError>> + Send>>);

impl Future for WrapLater {
    type Output = Result<Body, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

/// The wrapped body, given what the first look found: `None` when nothing had come yet.
fn settle(
    inner: RawBody,
    lease: Lease,
    first: Option<Option<Result<Frame<Bytes>, BoxError>>>,
) -> Result<Body, BoxError> {
    let first = match first {
        None => None,
        Some(None) => {
            lease.finish();
            return Ok(Body::empty());
        }
        Some(Some(Err(e))) => {
            lease.fail("response_error");
            return Err(e);
        }
        Some(Some(Ok(frame))) if inner.is_end_stream() => {
            lease.finish();
            return Ok(match frame.into_data() {
                Ok(data) => Body::full(data),
                Err(frame) => Body::new(UpstreamBody {
                    inner,
                    lease: None,
                    first: Some(frame),
                }),
            });
        }
        Some(Some(Ok(frame))) => Some(frame),
    };
    Ok(Body::new(UpstreamBody {
        inner,
        lease: Some(lease),
        first,
    }))
}

/// An upstream's response body as its client produced it.
pub(crate) enum RawBody {
    /// From hyper's client (HTTP/2, protocol switches).
    Hyper(hyper::body::Incoming),
    /// From the proxy's own HTTP/1.1 client.
    H1(ResponseBody),
}

impl HttpBody for RawBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RawBody::Hyper(b) => {
                // The proxy's own client drops them as it reads the trailer section.
                let mut frame = ready!(Pin::new(b).poll_frame(cx));
                if let Some(Ok(f)) = &mut frame
                    && let Some(trailers) = f.trailers_mut()
                {
                    gateway_http1::trailers::strip(trailers);
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            RawBody::H1(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RawBody::Hyper(b) => b.is_end_stream(),
            RawBody::H1(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RawBody::Hyper(b) => b.size_hint(),
            RawBody::H1(b) => b.size_hint(),
        }
    }
}

/// Polls once: `None` when not ready yet.
async fn poll_now(inner: &mut RawBody) -> Option<Option<Result<Frame<Bytes>, BoxError>>> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(frame) => Some(frame),
            Poll::Pending => None,
        })
    })
    .await
}

struct UpstreamBody {
    inner: RawBody,
    /// `None` once the body ended, failed or timed out.
    lease: Option<Lease>,
    /// A frame read ahead by [`wrap`], sent first.
    first: Option<Frame<Bytes>>,
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some(lease) = this.lease.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // hyper stops polling a body that reports its end, so release here rather than
                // waiting for a `None` that may never be asked for.
                if this.inner.is_end_stream()
                    && let Some(lease) = this.lease.take()
                {
                    lease.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                if let Some(lease) = this.lease.take() {
                    lease.finish();
                }
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::debug!(upstream = %lease.upstream.name, error = %e, "upstream response body failed");
                if let Some(lease) = this.lease.take() {
                    lease.fail("response_error");
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => {
                let expired = lease
                    .deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if !expired {
                    return Poll::Pending;
                }
                let timeout = lease.timeout.unwrap_or_default();
                tracing::debug!(upstream = %lease.upstream.name, ?timeout, "upstream response body timed out");
                if let Some(lease) = this.lease.take() {
                    lease.fail("timeout");
                }
                Poll::Ready(Some(Err(GatewayError::UpstreamTimeout(timeout).into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && (self.lease.is_none() || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        // The read-ahead frame counts too: hyper frames the response by this hint.
        let inner = self.inner.size_hint();
        let ahead = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + ahead);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + ahead);
        }
        hint
    }
}
