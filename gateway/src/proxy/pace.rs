//! The client's share of an attempt's time. The upstream's `timeout` measures the target, but
//! while a request body is on its way up the gateway also waits for the client's next bytes, and
//! that wait is the client's (the listener's `body_read_timeout` bounds it, with a `408`). So the
//! attempt's deadline does not pass while the upload waits for the client, and once the client
//! has sent more after a wait, the target has a whole `timeout` from then. A slow upload is thus
//! never a `504` counted against a healthy target.
//!
//! The request body is wrapped ([`paced`]) to note those waits; the attempt's deadline
//! ([`super::until_paced`]) looks at them only when it fires, so an upload that never keeps the
//! gateway waiting costs nothing more. Bodies already whole (or empty) are not wrapped: they never
//! wait for the client.
//!
//! The wrapper also keeps the body's own failure (a stall past `body_read_timeout`, a reset, a
//! size limit) for the attempt: hyper's HTTP/2 client reports a request whose body failed only
//! as the stream it reset, which would read as the target's failure.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;

use crate::body::{Body, BoxError};

/// The waits for the client's body during one request's upload, shared by its body (which may
/// be polled on another task: hyper's HTTP/2 client sends it from its own) and its attempts.
#[derive(Debug)]
pub(crate) struct Pace {
    base: Instant,
    timeout: Duration,
    /// The upload is waiting for the client's body now.
    waiting: AtomicBool,
    /// When the last wait ended, in nanoseconds after `base` (0: no wait has ended).
    resumed: AtomicU64,
    /// The body's failure, once it failed.
    failed: Mutex<Option<ClientBodyError>>,
}

impl Pace {
    fn new(timeout: Duration) -> Self {
        Self {
            base: Instant::now(),
            timeout,
            waiting: AtomicBool::new(false),
            resumed: AtomicU64::new(0),
            failed: Mutex::new(None),
        }
    }

    /// The client's body failure, when the body failed: the attempt's error in place of the
    /// one its HTTP client reports.
    pub(crate) fn body_error(&self) -> Option<BoxError> {
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.clone().map(|e| Box::new(e) as BoxError)
    }

    /// Asked when an attempt's deadline passes at `now`: the later deadline the client's waits
    /// earn the target, or `None` when the attempt has timed out. While the client is waited
    /// for, the answer is one more `timeout` from now (looked at again then, by which time the
    /// wait has usually ended and moved the deadline to its end plus `timeout`).
    pub(crate) fn postpone(&self, now: Instant) -> Option<Instant> {
        if self.waiting.load(Relaxed) {
            return Some(now + self.timeout);
        }
        match self.resumed.load(Relaxed) {
            0 => None,
            nanos => {
                let at = self.base + Duration::from_nanos(nanos) + self.timeout;
                (at > now).then_some(at)
            }
        }
    }

    fn wait_begins(&self) {
        // Load first: a body that stays pending is polled again and again.
        if !self.waiting.load(Relaxed) {
            self.waiting.store(true, Relaxed);
        }
    }

    fn wait_ends(&self) {
        if self.waiting.load(Relaxed) {
            let nanos = self.base.elapsed().as_nanos().max(1);
            self.resumed
                .store(u64::try_from(nanos).unwrap_or(u64::MAX), Relaxed);
            self.waiting.store(false, Relaxed);
        }
    }
}

/// `body`, wrapped to note its waits for the client and its failure when it may keep the
/// gateway waiting (`empty` says it is already known to be empty), and those notes for the
/// attempts, whose deadlines `timeout` (none: `None`) sets; `body` as it is, and `None`, when it
/// cannot wait.
pub(crate) fn paced(
    body: Body,
    empty: bool,
    timeout: Option<Duration>,
) -> (Body, Option<Arc<Pace>>) {
    if empty || body.as_full().is_some() {
        return (body, None);
    }
    // Without a timeout `postpone` is never asked.
    let pace = Arc::new(Pace::new(timeout.unwrap_or_default()));
    let body = Body::new(Paced {
        inner: body,
        pace: pace.clone(),
    });
    (body, Some(pace))
}

/// A request body that notes on its [`Pace`] when it keeps its reader waiting.
struct Paced {
    inner: Body,
    pace: Arc<Pace>,
}

impl HttpBody for Paced {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                this.pace.wait_begins();
                Poll::Pending
            }
            Poll::Ready(Some(Err(e))) => {
                this.pace.wait_ends();
                let shared = ClientBodyError(Arc::from(e));
                *this.pace.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(shared.clone());
                Poll::Ready(Some(Err(Box::new(shared))))
            }
            ready => {
                this.pace.wait_ends();
                ready
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body's failure, held by both its reader and the attempt. Its source is the body's
/// own error, so the status it gets (`408`, `413`, `400`) is the one the original would get.
#[derive(Debug, Clone)]
struct ClientBodyError(Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body failed: {}", self.0)
    }
}

impl std::error::Error for ClientBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_the_client_moves_the_deadline_to_its_end_plus_the_timeout() {
        let second = Duration::from_secs(1);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let stream = http_body_util::StreamBody::new(stream_of(rx));
        let (mut body, pace) = paced(Body::new(stream), false, Some(second));
        let pace = pace.expect("a streamed body is paced");
        let start = Instant::now();
        assert_eq!(
            pace.postpone(start + second),
            None,
            "no wait: the deadline stands"
        );

        // The client keeps the upload waiting: however late the deadline is looked at, it is
        // put off.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        let late = Instant::now() + Duration::from_secs(3600);
        assert_eq!(pace.postpone(late), Some(late + second));

        // It sends: the target has a whole timeout from then, and no more.
        let before = Instant::now();
        tx.try_send(Ok(Frame::data(Bytes::from_static(b"x"))))
            .unwrap();
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        let after = Instant::now();
        let at = pace
            .postpone(after)
            .expect("a whole timeout from the wait's end");
        assert!(
            at >= before + second && at <= after + second,
            "{:?} after the wait ended",
            at - before
        );
        assert_eq!(pace.postpone(after + second), None, "then it is up");
    }

    #[test]
    fn whole_bodies_are_not_paced() {
        let timeout = Some(Duration::from_secs(1));
        assert!(paced(Body::full("abc"), false, timeout).1.is_none());
        assert!(paced(Body::empty(), true, timeout).1.is_none());
    }

    #[test]
    fn a_failed_body_is_kept_for_the_attempt_with_its_status() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let stream = http_body_util::StreamBody::new(stream_of(rx));
        let (mut body, pace) = paced(Body::new(stream), false, None);
        let pace = pace.expect("paced without a timeout too");
        assert!(pace.body_error().is_none());
        let stalled = crate::error::GatewayError::BodyReadTimeout(Duration::from_secs(1));
        tx.try_send(Err(Box::new(stalled))).unwrap();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let Poll::Ready(Some(Err(read))) = Pin::new(&mut body).poll_frame(&mut cx) else {
            panic!("the failure reaches the reader");
        };
        for e in [read, pace.body_error().expect("kept for the attempt")] {
            let status = crate::error::GatewayError::RequestBody(e).status();
            assert_eq!(status, http::StatusCode::REQUEST_TIMEOUT);
        }
    }

    /// A stream of what `rx` receives.
    fn stream_of<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send + 'static {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
