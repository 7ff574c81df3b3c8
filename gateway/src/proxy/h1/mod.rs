//! The proxy's own HTTP/1.1 client, driven in the request's task.
//!
//! hyper's client runs every upstream connection as a task of its own: each request crosses a
//! channel to that task, its response comes back through a oneshot, and the response body
//! through another channel, with a wake-up of the other task at every step. Here the request's
//! task writes the head, reads the response head, and the client's connection reads the body
//! straight off the upstream socket ([`body`]), as nginx does. A pooled connection is plain
//! bytes ([`H1Conn`]): a socket and its buffers, with nobody polling it while idle.
//!
//! Protocol switches (WebSocket) still go through hyper's client: [`H1Conn::into_io`] hands
//! the socket over for that one exchange.
//!
//! A request whose body is not sent with its head is uploaded while the response head is
//! awaited, so an upstream that answers early (a 413, a redirect) is heard; the rest of the
//! upload is then abandoned and the connection not reused.

mod body;
mod encode;
mod io;

use std::future::{Future, poll_fn};
use std::io::{Error, ErrorKind, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use gateway_http1::decode::{self, BareResponseHead};
use gateway_http1::request;
use http::{Method, Request, Response, StatusCode};
use http_body::Body as _;
use tokio::io::AsyncWrite;

pub(crate) use self::body::ResponseBody;
use self::encode::Framing;
pub(crate) use self::encode::Shared;
pub(crate) use self::io::{Idle, Io};
use super::headers::ADDED_FIELDS_ROOM;
use super::pool::{Discard, OpenConn, Pool};
use crate::body::{Body, BoxError};

/// The most write buffer an idle connection keeps between requests.
const WBUF_KEEP: usize = 4096;

/// An upstream HTTP/1.1 connection, idle in a pool or carrying one exchange.
pub(crate) struct H1Conn {
    io: Io,
    /// Bytes received and not yet parsed; empty between exchanges.
    rbuf: BytesMut,
    /// The request head being written, kept to reuse its allocation.
    wbuf: Vec<u8>,
    /// Counts the connection as open in its pool until dropped.
    _open: OpenConn,
}

/// Why an exchange failed.
pub(crate) struct Failure {
    pub(crate) error: FailureKind,
    /// The request, when none of its body was consumed: it can go to another connection.
    pub(crate) unsent: Option<Request<Body>>,
    /// The connection was closed by the peer before it took the request: sending the request
    /// again on another connection cannot run it twice.
    pub(crate) stale: bool,
}

/// Why a fast-path exchange ([`H1Conn::exchange_text`]) failed.
pub(crate) struct TextFailure {
    pub(crate) error: Error,
    /// The connection was closed by the peer before it took the request: the request can go
    /// to another connection.
    pub(crate) stale: bool,
}

/// Whether `e`, on a `reused` connection that received nothing (`rbuf` empty), is the
/// keep-alive race: the upstream closed the idle connection as the request went out, so the
/// request may go again on another (when it is safe to repeat).
fn keep_alive_race(reused: bool, rbuf: &BytesMut, e: &Error) -> bool {
    reused
        && rbuf.is_empty()
        && matches!(
            e.kind(),
            ErrorKind::UnexpectedEof
                | ErrorKind::ConnectionReset
                | ErrorKind::BrokenPipe
                | ErrorKind::ConnectionAborted
        )
}

/// Whose fault a failure is.
pub(crate) enum FailureKind {
    /// The upstream: refused, reset, closed, or sent something that is not HTTP/1.1.
    Upstream(Error),
    /// The client's request body failed while it was being uploaded.
    RequestBody(BoxError),
}

impl H1Conn {
    pub(crate) fn new(io: Io, open: OpenConn) -> Self {
        Self {
            io,
            rbuf: BytesMut::new(),
            wbuf: Vec::new(),
            _open: open,
        }
    }

    /// Lets go of the read buffer's memory (the next exchange reserves it again). Only for a
    /// connection between exchanges, whose buffer holds nothing.
    pub(crate) fn shed_read_buffer(&mut self) {
        debug_assert!(self.rbuf.is_empty());
        self.rbuf = BytesMut::new();
    }

    /// The read buffer's capacity, for tests of the pool's memory.
    #[cfg(test)]
    pub(crate) fn read_capacity(&self) -> usize {
        self.rbuf.capacity()
    }

    /// Reserves the read buffer as an exchange does, for tests of the pool's memory.
    #[cfg(test)]
    pub(crate) fn reserve_read_buffer_for_test(&mut self, room: usize) {
        self.rbuf.reserve(room);
    }

    /// What a connection between exchanges says of itself ([`Io::probe_idle`]); a byte still
    /// in the read buffer after a complete answer is one nobody asked for.
    pub(crate) fn probe_idle(&mut self) -> Idle {
        if !self.rbuf.is_empty() {
            return Idle::Unexpected;
        }
        self.io.probe_idle(&mut self.rbuf)
    }

    /// The socket, for an exchange hyper's client drives (a protocol switch), and the guard
    /// that counts it open.
    pub(crate) fn into_io(self) -> (Io, OpenConn) {
        (self.io, self._open)
    }

    /// Sends `req` and reads the response head: `req` with its `Host` set, or with only the
    /// attempt's own fields and the rest in `shared`. The connection is consumed: it lives on in
    /// the response body and returns to `pool` when that ends.
    ///
    /// The head is written into the connection's buffer before the future is made, so the
    /// future does not hold `shared`. A plain function returning a block rather than an
    /// `async fn`, which would keep the connection and the request twice in its state.
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async fn` would keep its arguments twice in its state"
    )]
    pub(crate) fn send<'a>(
        mut self,
        mut req: Request<Body>,
        shared: Option<Shared<'_>>,
        pool: &'a Arc<Pool>,
        reused: bool,
    ) -> impl Future<Output = Result<Response<ResponseBody>, Failure>> + Send + use<'a> {
        let encoded = encode::head(&req, shared, &mut self.wbuf);
        async move {
            let fail = |error: Error, req: Request<Body>, stale: bool| Failure {
                error: FailureKind::Upstream(error),
                unsent: Some(req),
                stale,
            };
            let mut upload = if encoded.inlined || encoded.framing == Framing::Empty {
                None
            } else {
                Some(Upload::new(encoded.framing == Framing::Chunked))
            };
            if let Some(up) = upload.as_mut() {
                // One look at the body before the head goes out: a frame already at hand travels
                // in the head's write, and a body that fails at once (a filter rejecting it) fails
                // before the upstream has seen anything of the request. A body still to come
                // (a client waiting for `100 Continue`, a paused filter) does not hold the head.
                let first =
                    poll_fn(|cx| Poll::Ready(Pin::new(req.body_mut()).poll_frame(cx))).await;
                match first {
                    Poll::Ready(Some(Err(e))) => {
                        return Err(Failure {
                            error: FailureKind::RequestBody(e),
                            unsent: None,
                            stale: false,
                        });
                    }
                    Poll::Ready(Some(Ok(frame))) => up.accept(frame),
                    Poll::Ready(None) => up.end(None),
                    Poll::Pending => {}
                }
                up.move_small_into(&mut self.wbuf);
            }
            let written = write_all(&mut self.io, &self.wbuf).await;
            if self.wbuf.capacity() > WBUF_KEEP {
                // A large head or inlined body is not kept by an idle connection.
                self.wbuf = Vec::new();
            }
            if let Err(e) = written {
                // A reused connection the peer closed while it sat idle fails here or at the first
                // read; nothing of the request was processed, but a body frame already taken
                // cannot be put back.
                let touched = upload.as_ref().is_some_and(|u| u.touched);
                return Err(Failure {
                    error: FailureKind::Upstream(e),
                    unsent: (!touched).then_some(req),
                    stale: reused && !touched,
                });
            }
            let method = req.method().clone();
            // An upload the upstream stops taking (it answered early and closed) is abandoned, and
            // its error reported only if no response follows.
            let mut upload_failed: Option<Error> = None;
            let exchange = poll_fn(|cx| {
                if let Some(up) = upload.as_mut()
                    && !up.done
                    && upload_failed.is_none()
                {
                    match up.poll_send(cx, &mut self.io, req.body_mut()) {
                        Poll::Ready(Err(UploadError::Io(e))) => upload_failed = Some(e),
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        _ => {}
                    }
                }
                self.poll_head(cx, &method)
            })
            .await;
            let body_touched = upload.as_ref().is_some_and(|u| u.touched);
            let head = match exchange {
                Ok(head) => head,
                Err(UploadError::Body(e)) => {
                    return Err(Failure {
                        error: FailureKind::RequestBody(e),
                        unsent: None,
                        stale: false,
                    });
                }
                Err(UploadError::Io(e)) if body_touched => {
                    let e = upload_failed.unwrap_or(e);
                    return Err(Failure {
                        error: FailureKind::Upstream(e),
                        unsent: None,
                        stale: false,
                    });
                }
                Err(UploadError::Io(e)) => {
                    // Closed with nothing received: on a reused connection that is the keep-alive
                    // race (the upstream closed it as the request went out), and only a request
                    // that is safe to repeat is sent again, since the upstream may have seen it.
                    let stale =
                        keep_alive_race(reused, &self.rbuf, &e) && super::is_idempotent(&method);
                    return Err(fail(e, req, stale));
                }
            };
            if head.bodiless_framed {
                pool.discarded(Discard::BodilessFramed);
            }
            let sent_whole = upload.as_ref().is_none_or(|u| u.done);
            let reusable = head.keep_alive && sent_whole;
            let body = ResponseBody::new(self, pool.clone(), head.framing, reusable);
            Ok(Response::from_parts(head.parts, body))
        }
    }

    /// The fast path's exchange ([`crate::proxy::ProxyRoute::forward_text`]): a `GET` or
    /// `HEAD` (`head_only`) without a body, whose head `write_head` writes into the
    /// connection's buffer, and the response head read without a header map: `read` gets its
    /// status and fields while they are slices of the read buffer. The connection lives on in
    /// the response body and returns to `pool` when that ends.
    pub(crate) fn exchange_text<'a, R>(
        mut self,
        write_head: impl FnOnce(&mut Vec<u8>),
        head_only: bool,
        pool: &'a Arc<Pool>,
        reused: bool,
        read: impl FnOnce(StatusCode, &[httparse::Header<'_>]) -> R + Send + 'a,
    ) -> impl Future<Output = Result<(BareResponseHead, R, ResponseBody), TextFailure>> + Send + 'a
    where
        R: Send + 'a,
    {
        self.wbuf.clear();
        write_head(&mut self.wbuf);
        async move {
            // On a reused connection a failed write, or a close with nothing received, is the
            // keep-alive race ([`keep_alive_race`]), and the request (safe to repeat: it has no
            // body and is a `GET` or `HEAD`) can go again.
            if let Err(error) = write_all(&mut self.io, &self.wbuf).await {
                let stale = reused;
                return Err(TextFailure { error, stale });
            }
            if self.wbuf.capacity() > WBUF_KEEP {
                self.wbuf = Vec::new();
            }
            let method = if head_only { Method::HEAD } else { Method::GET };
            let mut read = Some(read);
            let head = poll_fn(|cx| {
                loop {
                    if !self.rbuf.is_empty() {
                        // `read` runs once, on the final head, when that head is complete.
                        let mut taken = None;
                        let parsed =
                            decode::response_head_text(&mut self.rbuf, &method, |s, f| {
                                taken = read.take().map(|read| read(s, f));
                            })?;
                        if let (Some((head, ())), Some(out)) = (parsed, taken) {
                            return Poll::Ready(Ok((head, out)));
                        }
                    }
                    let n = ready!(self.io.poll_fill(cx, &mut self.rbuf, 8 * 1024))?;
                    if n == 0 {
                        return Poll::Ready(Err(Error::new(
                            ErrorKind::UnexpectedEof,
                            "upstream closed the connection before a response",
                        )));
                    }
                }
            })
            .await;
            match head {
                Ok((head, out)) => {
                    if head.bodiless_framed {
                        pool.discarded(Discard::BodilessFramed);
                    }
                    let body = ResponseBody::new(self, pool.clone(), head.framing, head.keep_alive);
                    Ok((head, out, body))
                }
                Err(error) => {
                    let stale = keep_alive_race(reused, &self.rbuf, &error);
                    Err(TextFailure { error, stale })
                }
            }
        }
    }

    /// Reads until a final response head is parsed.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
    ) -> Poll<Result<decode::ResponseHead, UploadError>> {
        loop {
            if !self.rbuf.is_empty()
                && let Some(head) =
                    // Room beyond the upstream's fields: the proxy adds its own to the response,
                    // and hyper keeps the sent response's map (emptied) for the client's next
                    // request, to which the proxy adds the forwarding fields. Without it that
                    // map grows, a rehash, per request.
                    decode::response_head(&mut self.rbuf, method, ADDED_FIELDS_ROOM)
                            .map_err(UploadError::Io)?
            {
                return Poll::Ready(Ok(head));
            }
            let n =
                ready!(self.io.poll_fill(cx, &mut self.rbuf, 8 * 1024)).map_err(UploadError::Io)?;
            if n == 0 {
                return Poll::Ready(Err(UploadError::Io(Error::new(
                    ErrorKind::UnexpectedEof,
                    "upstream closed the connection before a response",
                ))));
            }
        }
    }
}

enum UploadError {
    Io(Error),
    Body(BoxError),
}

/// A request body on its way up, frame by frame: each frame is written whole before the next
/// is read, so an upstream that reads slowly slows the client's upload, and memory stays at
/// one frame.
struct Upload {
    chunked: bool,
    /// Bytes of the current frame not yet written (a chunk's size line, data, CRLF).
    out: [Bytes; 3],
    done: bool,
    /// A frame was taken from the body: the request can no longer be sent elsewhere.
    touched: bool,
    ended: bool,
}

impl Upload {
    fn new(chunked: bool) -> Self {
        Self {
            chunked,
            out: Default::default(),
            done: false,
            touched: false,
            ended: false,
        }
    }

    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut Io,
        body: &mut Body,
    ) -> Poll<Result<(), UploadError>> {
        loop {
            if self.out.iter().any(|b| !b.is_empty()) {
                let slices = self.out.each_ref().map(|b| IoSlice::new(b));
                let n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices))
                    .map_err(UploadError::Io)?;
                if n == 0 {
                    return Poll::Ready(Err(UploadError::Io(ErrorKind::WriteZero.into())));
                }
                advance(&mut self.out, n);
                continue;
            }
            if self.ended {
                ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(UploadError::Io)?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut *body).poll_frame(cx)) {
                None => self.end(None),
                Some(Err(e)) => return Poll::Ready(Err(UploadError::Body(e))),
                Some(Ok(frame)) => self.accept(frame),
            }
        }
    }

    /// Queues one frame of the body for writing.
    fn accept(&mut self, frame: http_body::Frame<Bytes>) {
        self.touched = true;
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) if self.chunked => {
                self.out = [
                    request::chunk_size(data.len()),
                    data,
                    Bytes::from_static(b"\r\n"),
                ];
            }
            Ok(data) => self.out[0] = data,
            // Trailers end the body; without chunked coding they cannot be sent.
            Err(frame) => self.end(frame.trailers_ref()),
        }
    }

    /// The body ended (with `trailers`, if any).
    fn end(&mut self, trailers: Option<&http::HeaderMap>) {
        self.ended = true;
        if self.chunked {
            self.out[0] = request::last_chunk(trailers);
        }
    }

    /// Moves a small queued frame into `head`, so the head and the frame leave in one write.
    fn move_small_into(&mut self, head: &mut Vec<u8>) {
        let queued: usize = self.out.iter().map(Bytes::len).sum();
        if queued == 0 || queued > encode::INLINE_BODY_MAX {
            return;
        }
        for b in &mut self.out {
            head.extend_from_slice(b);
            *b = Bytes::new();
        }
    }
}

/// Drops the first `n` bytes of the queued buffers.
fn advance(out: &mut [Bytes; 3], mut n: usize) {
    for b in out.iter_mut() {
        let take = n.min(b.len());
        b.advance(take);
        n -= take;
    }
}

async fn write_all(io: &mut Io, mut data: &[u8]) -> std::io::Result<()> {
    poll_fn(|cx| {
        while !data.is_empty() {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, data))?;
            if n == 0 {
                return Poll::Ready(Err(ErrorKind::WriteZero.into()));
            }
            data = &data[n..];
        }
        Pin::new(&mut *io).poll_flush(cx)
    })
    .await
}
