//! Bodies over HTTP/3 request streams: the request body as an `http_body` stream (data, then
//! trailers), and writing a gateway response (head, streamed data, trailers, FIN).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h3::error::Code;
use h3::server::RequestStream;
use http::{HeaderMap, Response, header};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;

use super::quic;
use crate::body::{Body, BoxError};

type Recv = RequestStream<quic::RecvStream, Bytes>;
type Send = RequestStream<quic::SendStream<Bytes>, Bytes>;

/// The receiving half of a request stream as a body.
pub(super) struct RequestBody {
    stream: Recv,
    state: State,
    /// A frame read ahead by [`RequestBody::new`].
    ready: Option<Result<Frame<Bytes>, BoxError>>,
}

#[derive(PartialEq, Eq)]
enum State {
    Data,
    Trailers,
    Done,
}

impl RequestBody {
    /// Wraps `stream`. HTTP/3 has no end-of-stream flag on the head, so one non-blocking read
    /// tells whether the FIN came with it: a bodiless GET then reports `is_end_stream`, which
    /// lets the proxy send it upstream without a chunked body and keep retries possible.
    pub(super) fn new(stream: Recv) -> Self {
        let mut body = Self {
            stream,
            state: State::Data,
            ready: None,
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(Some(frame)) = body.poll_stream(&mut cx) {
            body.ready = Some(frame);
        }
        body
    }

    fn poll_stream(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            match self.state {
                State::Data => match ready!(self.stream.poll_recv_data(cx)) {
                    Ok(Some(mut buf)) => {
                        if buf.has_remaining() {
                            let data = buf.copy_to_bytes(buf.remaining());
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                    }
                    Ok(None) => self.state = State::Trailers,
                    Err(e) => {
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                },
                State::Trailers => {
                    let res = ready!(self.stream.poll_recv_trailers(cx));
                    self.state = State::Done;
                    return Poll::Ready(match res {
                        Ok(Some(t)) => Some(Ok(Frame::trailers(t))),
                        Ok(None) => None,
                        Err(e) => Some(Err(e.into())),
                    });
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.ready.take() {
            return Poll::Ready(Some(frame));
        }
        this.poll_stream(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ready.is_none() && self.state == State::Done
    }
}

/// Headers that describe an HTTP/1 connection and are malformed in HTTP/3 (RFC 9114 §4.2).
const CONNECTION_HEADERS: [header::HeaderName; 4] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HeaderName::from_static("keep-alive"),
];

fn strip_connection_headers(headers: &mut HeaderMap) {
    for name in &CONNECTION_HEADERS {
        if headers.contains_key(name) {
            headers.remove(name);
        }
    }
}

/// Sends `res` on `stream`: the head, then (unless `head_only`) the body as it is produced,
/// trailers if any, and the FIN, which completes once the client has acknowledged everything.
/// A body that fails midway resets the stream so the client cannot take it for complete.
pub(super) async fn send_response(
    stream: &mut Send,
    res: Response<Body>,
    head_only: bool,
) -> Result<(), h3::error::StreamError> {
    let (mut parts, mut body) = res.into_parts();
    strip_connection_headers(&mut parts.headers);
    let no_body =
        head_only || parts.status.is_informational() || parts.status == 204 || parts.status == 304;
    stream
        .send_response(Response::from_parts(parts, ()))
        .await?;
    if !no_body {
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!(error = %e, "response body failed; resetting the stream");
                    stream.stop_stream(Code::H3_INTERNAL_ERROR);
                    return Ok(());
                }
            };
            match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => stream.send_data(data).await?,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        stream.send_trailers(trailers).await?;
                        break;
                    }
                }
            }
        }
    }
    stream.finish().await
}
