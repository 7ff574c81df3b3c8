//! What the request-body and response-body hook streams share: the hook future in flight, the
//! trailers handed between a stream and the hooks, and the trailer hooks.

use std::future::Future;
use std::ops::ControlFlow::Break;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;

use super::Shared;
use crate::body::BoxError;

pub(super) type HookFuture = Pin<Box<dyn Future<Output = Result<Option<Bytes>, BoxError>> + Send>>;
/// Trailers handed between a body stream and the future that runs their hooks. The shared
/// cell is made when trailers arrive: nearly every body has none, and a response through a
/// filter's hooks then costs one allocation less. A future that takes the trailers is made
/// only after they arrived, so it shares the cell the stream reads them back from.
#[derive(Clone, Default)]
pub(super) struct TrailerSlot(Option<Arc<std::sync::Mutex<Option<HeaderMap>>>>);

impl TrailerSlot {
    pub(super) fn take(&self) -> Option<HeaderMap> {
        let cell = self.0.as_ref()?;
        cell.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    pub(super) fn put(&mut self, trailers: Option<HeaderMap>) {
        match (&self.0, trailers) {
            (Some(cell), trailers) => *cell.lock().unwrap_or_else(|p| p.into_inner()) = trailers,
            (None, Some(trailers)) => {
                self.0 = Some(Arc::new(std::sync::Mutex::new(Some(trailers))))
            }
            (None, None) => {}
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|cell| cell.lock().unwrap_or_else(|p| p.into_inner()).is_none())
    }
}

/// What a body stream's `poll_frame` answers.
pub(super) type FramePoll = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

/// The start of both hook streams' `poll_frame`: drives the hook future in flight, if any, and
/// hands on what it produced (non-empty data, or its error); once the body is `done`, hands on
/// the trailers, then the end. `Continue`: nothing to hand on, read the next frame.
pub(super) fn drain_pending(
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
pub(super) async fn run_trailer_hooks(
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
