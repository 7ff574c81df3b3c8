//! The response-header hooks after the terminal (or a local reply), in reverse order over the
//! filters that saw the request, as far as they answer synchronously and then awaited; the body
//! hooks follow ([`super::response_body`]).

use std::future::Future;

use http::{HeaderValue, Response, response};

use super::{Chain, Pending, Stage, State, Tail, with_server};
use crate::body::Body;
use crate::telemetry::trace::{TraceCx, with_current};

impl Chain {
    /// The response hooks for the terminal's response of a [`Started::Terminal`] with filters,
    /// as far as they answer synchronously: the response, or the rest to resume when a hook
    /// must be awaited.
    #[expect(
        clippy::result_large_err,
        reason = "returned once and matched at once, as `Started`; the rest is rarely made"
    )]
    pub fn after_terminal(
        &self,
        tail: Tail,
        response: Response<Body>,
        server: Option<&HeaderValue>,
    ) -> Result<Response<Body>, Pending> {
        let st = *tail.0;
        let trace = st.cx.trace.clone();
        self.response_now(st, self.factories.len(), response, server, trace.as_ref())
    }

    /// The response-header hooks from filter `upto` down, as far as they answer synchronously,
    /// then the body hooks; `Err` when one must be awaited.
    #[expect(
        clippy::result_large_err,
        reason = "returned once and matched at once, as `Started`; the rest is rarely made"
    )]
    pub(super) fn response_now(
        &self,
        mut st: State,
        upto: usize,
        response: Response<Body>,
        server: Option<&HeaderValue>,
        trace: Option<&TraceCx>,
    ) -> Result<Response<Body>, Pending> {
        let (mut rparts, mut rbody) = with_server(response, server).into_parts();
        let waits = with_current(trace, || {
            self.response_headers_now(&mut st, &mut rparts, &mut rbody, upto)
        });
        if let Some(next) = waits {
            let response = Response::from_parts(rparts, rbody);
            return Err(Pending(Stage::Response {
                st,
                upto,
                next,
                response,
            }));
        }
        st.status = rparts.status;
        let response = Response::from_parts(rparts, rbody);
        if !self.after_response {
            return Ok(response);
        }
        Ok(self.with_body_hooks(st, upto, response))
    }

    /// The response-header hooks of the filters below `below`, in reverse order, as far as
    /// they answer synchronously; `Some(i)` when filter `i` must be awaited. A local reply
    /// replaces the response for the filters after it.
    fn response_headers_now(
        &self,
        st: &mut State,
        parts: &mut response::Parts,
        body: &mut Body,
        below: usize,
    ) -> Option<usize> {
        for i in (0..below).rev() {
            let Some(flow) = st.filters[i].on_response_headers_sync(parts, &mut st.cx) else {
                return Some(i);
            };
            if let Some(reply) = self.decide(flow, i) {
                (*parts, *body) = reply.into_parts();
            }
        }
        None
    }

    /// Runs the response-header hooks in reverse order over the filters that saw the request.
    /// A local reply from one of them replaces the response for the filters before it.
    pub(super) fn response_headers<'a>(
        &'a self,
        st: &'a mut State,
        upto: usize,
        response: Response<Body>,
    ) -> impl Future<Output = Response<Body>> + Send + 'a {
        let (mut parts, mut body) = response.into_parts();
        async move {
            let mut below = upto;
            while let Some(i) = self.response_headers_now(st, &mut parts, &mut body, below) {
                let flow = st.filters[i]
                    .on_response_headers(&mut parts, &mut st.cx)
                    .await;
                if let Some(reply) = self.decide(flow, i) {
                    (parts, body) = reply.into_parts();
                }
                below = i;
            }
            st.status = parts.status;
            Response::from_parts(parts, body)
        }
    }
}
