//! The response body through the filters' hooks: a body whole in memory goes through them
//! before the head goes out; any other streams through [`ResponseBodyHooks`]. Either way the
//! trailer hooks and the log phase follow.

use std::ops::ControlFlow::Break;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, header, response};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use tokio::sync::Mutex;

use super::hook_stream::{FramePoll, HookFuture, TrailerSlot, drain_pending, run_trailer_hooks};
use super::log::{log_soon, run_log};
use super::{Chain, Shared, State};
use crate::body::{Body, BoxError};
use crate::filter::ReadToEnd;
use crate::telemetry::trace::{self, TraceCx, with_current};

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
}

impl Chain {
    /// Wraps the body in the stream that runs the response-body, trailer and log hooks.
    pub(super) fn with_body_hooks(
        &self,
        st: State,
        upto: usize,
        response: Response<Body>,
    ) -> Response<Body> {
        let trace = st.cx.trace.clone();
        self.body_hooks_on(Arc::new(Mutex::new(st)), trace, upto, response)
    }

    /// [`Chain::with_body_hooks`] on state already shared (with a request body stream).
    pub(super) fn body_hooks_on(
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
        let streams = hooks || pending.is_some();
        let mut body = Body::new(ResponseBodyHooks {
            inner: body,
            state,
            trace,
            upto,
            hooks,
            pending,
            trailers,
            finished,
        });
        if let Some(read_on) = parts.extensions.remove::<ReadToEnd>()
            && streams
        {
            body = read_to_end(body, read_on);
        }
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

/// `body` read by a task of its own, to its end or, once the client's side is dropped, while
/// `read_on` says so; the client's side is fed through a channel of a few frames, so the body
/// is read no faster than the client takes it while the client is there.
fn read_to_end(body: Body, read_on: ReadToEnd) -> Body {
    let length = body.size_hint();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(READ_AHEAD);
    tokio::spawn(async move {
        let mut body = std::pin::pin!(body);
        let mut client = Some(tx);
        while let Some(frame) = body.frame().await {
            if let Some(tx) = &client
                && tx.send(frame).await.is_err()
            {
                client = None;
            }
            if client.is_none() && !read_on.still() {
                break;
            }
        }
    });
    let mut rx = rx;
    Body::from_frames(
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)),
        length,
    )
}

/// Frames [`read_to_end`]'s task may read ahead of the client.
const READ_AHEAD: usize = 4;

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

/// Most of a body the hooks still see once the client has gone: Envoy's default buffer limit
/// per connection, past which it would have stopped reading the upstream anyway.
const AFTER_CLIENT_LEFT: usize = 1 << 20;

/// How long the hooks wait for each next piece of the body once the client has gone: bytes
/// the upstream had already sent are in by then; later ones Envoy would not see either.
const ARRIVED_GRACE: Duration = Duration::from_millis(20);

/// The client went away mid-body. Envoy runs its filters' body callbacks as the upstream's
/// bytes arrive, whether or not the client reads them, so what the upstream had already sent
/// still goes through the hooks (with the end of the body, when that came too), then the log
/// phase runs. What has not arrived is not waited for: Envoy resets the stream when the
/// client goes.
async fn drain_arrived(mut inner: Body, state: Shared, upto: usize) {
    let mut seen = 0;
    while seen <= AFTER_CLIENT_LEFT {
        let (chunk, eos) = match tokio::time::timeout(ARRIVED_GRACE, inner.frame()).await {
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => (Some(data), inner.is_end_stream()),
                Err(_) => (None, true),
            },
            Ok(None) => (None, true),
            Ok(Some(Err(_))) | Err(_) => break,
        };
        seen += chunk.as_ref().map_or(0, Bytes::len);
        let hooks = run_response_body_hooks(state.clone(), upto, chunk, eos).await;
        if eos || hooks.is_err() {
            break;
        }
    }
    run_log(state).await;
}

impl Drop for ResponseBodyHooks {
    fn drop(&mut self) {
        if self.hooks
            && !self.finished
            && self.pending.is_none()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let inner = std::mem::take(&mut self.inner);
            let rest = drain_arrived(inner, self.state.clone(), self.upto);
            handle.spawn(trace::scope_some(self.trace.clone(), rest));
            return;
        }
        // The client went away (or the body was never polled): the log phase still runs.
        if !self.finished || self.pending.is_some() {
            log_soon(&self.state, self.trace.as_ref());
        }
    }
}
