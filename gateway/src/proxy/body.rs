//! The upstream response body on its way to the client. It streams frames (data and trailers)
//! untouched, and around them does the bookkeeping that must wait for the body's end: the
//! HTTP/1.1 connection goes back to the pool only once the body is fully read, the target stays
//! "in flight" for the balancers until then, a reset or truncated body counts as a failure of
//! the target, and the attempt's `timeout` keeps running so a stalled body cannot hang the
//! client.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use stream_proxy::upstream::Selection;
use tokio::time::Sleep;

use super::pool::PooledH1;
use super::upstream::Upstream;
use crate::body::{Body, BoxError};
use crate::error::GatewayError;

/// What an attempt holds until its response body ends.
pub(crate) struct Lease {
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) selection: Selection,
    pub(crate) conn: Option<PooledH1>,
    pub(crate) deadline: Option<Pin<Box<Sleep>>>,
}

impl Lease {
    /// The exchange completed: the connection is reusable.
    fn finish(self) {
        if let Some(conn) = self.conn {
            conn.release();
        }
    }

    /// The exchange broke: the connection is dropped (hyper closes it) and the target charged.
    fn fail(self) {
        self.upstream.targets.report_failure(self.selection.index());
    }
}

/// Wraps an upstream body; a body that is already complete (204, 304, HEAD, empty) releases
/// its lease at once and is passed on without a wrapper.
pub(crate) fn wrap(inner: Incoming, lease: Lease) -> Body {
    if inner.is_end_stream() {
        lease.finish();
        return Body::empty();
    }
    Body::new(UpstreamBody {
        inner,
        lease: Some(lease),
    })
}

struct UpstreamBody {
    inner: Incoming,
    /// `None` once the body ended, failed or timed out.
    lease: Option<Lease>,
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
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
                    lease.fail();
                }
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Pending => {
                let expired = lease
                    .deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if !expired {
                    return Poll::Pending;
                }
                let timeout = lease.upstream.timeout.unwrap_or_default();
                tracing::debug!(upstream = %lease.upstream.name, ?timeout, "upstream response body timed out");
                if let Some(lease) = this.lease.take() {
                    lease.fail();
                }
                Poll::Ready(Some(Err(GatewayError::UpstreamTimeout(timeout).into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.lease.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
