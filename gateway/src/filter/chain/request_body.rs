//! The request body through the filters' hooks as the terminal reads it (a filter streams the
//! request body, `BodyAccess::Stream`). A local reply from a hook ends the body with an error;
//! the chain then answers with the reply. So does a hook that fails: the answer is the filter
//! failure's (500), as from any other hook, not the terminal's for a broken body.

use std::ops::ControlFlow::Break;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body as HttpBody;

use super::hook_stream::{FramePoll, HookFuture, TrailerSlot, drain_pending, run_trailer_hooks};
use super::{Chain, Shared};
use crate::body::{Body, BoxError};

/// Passes request data through the filters' body hooks as the terminal reads it.
pub(super) struct RequestBodyHooks {
    inner: Body,
    state: Shared,
    /// Turns a hook's failure into the answer.
    chain: Chain,
    pending: Option<HookFuture>,
    done: bool,
    /// Request trailers, emitted once their hooks ran.
    trailers: TrailerSlot,
}

impl RequestBodyHooks {
    /// `inner` through the hooks of the filters in `state`.
    pub(super) fn new(inner: Body, state: Shared, chain: Chain) -> Self {
        Self {
            inner,
            state,
            chain,
            pending: None,
            done: false,
            trailers: TrailerSlot::default(),
        }
    }
}

async fn run_request_body_hooks(
    state: Shared,
    chain: Chain,
    mut chunk: Option<Bytes>,
    eos: bool,
) -> Result<Option<Bytes>, BoxError> {
    let mut guard = state.lock().await;
    let st = &mut *guard;
    for i in 0..st.filters.len() {
        let flow = st.filters[i]
            .on_request_body(&mut chunk, eos, &mut st.cx)
            .await;
        if let Some(reply) = chain.decide(flow, i) {
            st.local_reply = Some(Box::new(reply));
            return Err("request ended by a filter".into());
        }
    }
    Ok(chunk)
}

impl HttpBody for RequestBodyHooks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let this = &mut *self;
        loop {
            if let Break(out) = drain_pending(&mut this.pending, this.done, &this.trailers, cx) {
                return out;
            }
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let eos = this.inner.is_end_stream();
                        this.done = eos;
                        this.pending = Some(Box::pin(run_request_body_hooks(
                            this.state.clone(),
                            this.chain.clone(),
                            Some(data),
                            eos,
                        )));
                    }
                    Err(frame) => match frame.into_trailers() {
                        // Trailers end the body: the end-of-stream body hooks, then the
                        // trailer hooks, run before they go on.
                        Ok(t) => {
                            this.done = true;
                            this.trailers.put(Some(t));
                            let (state, mut slot) = (this.state.clone(), this.trailers.clone());
                            let chain = this.chain.clone();
                            this.pending = Some(Box::pin(async move {
                                let tail = run_request_body_hooks(state.clone(), chain, None, true)
                                    .await?;
                                if let Some(mut t) = slot.take() {
                                    run_trailer_hooks(&state, None, &mut t).await?;
                                    slot.put(Some(t));
                                }
                                Ok(tail)
                            }));
                        }
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    },
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    this.pending = Some(Box::pin(run_request_body_hooks(
                        this.state.clone(),
                        this.chain.clone(),
                        None,
                        true,
                    )));
                }
            }
        }
    }
}
