//! An upstream HTTP/1.1 response body, read straight off the connection by whoever polls it
//! (hyper's server side, writing to the client): no driver task and no channel in between.
//! Data frames are slices of the connection's read buffer. When the body ends cleanly and
//! the upstream allows it, the connection goes back to its pool at once; dropping the body
//! early (the client went away) drops the connection, so the upstream sees the cancellation.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::H1Conn;
use crate::proxy::pool::Pool;
use gateway_http1::decode::{BodyFraming, Chunked, Step};

/// Reads for bodies of unknown or large remaining size ask for this much room: large enough
/// that a bulk transfer costs few system calls, and each read's bytes go out as one frame.
const BULK_READ: usize = 64 * 1024;
/// Room for a read expected to be small (the rest of a short body).
const SMALL_READ: usize = 8 * 1024;

enum State {
    Length(u64),
    Chunked(Chunked),
    Close,
    Done,
}

/// The response body; `Send`, polled by the client's connection.
pub(crate) struct ResponseBody {
    /// `None` once the body ended (the connection released or closed).
    conn: Option<H1Conn>,
    pool: Arc<Pool>,
    state: State,
    /// The upstream allows another request and the whole request was sent.
    reusable: bool,
}

impl ResponseBody {
    pub(super) fn new(conn: H1Conn, pool: Arc<Pool>, framing: BodyFraming, reusable: bool) -> Self {
        let state = match framing {
            BodyFraming::Empty => State::Done,
            BodyFraming::Length(n) => State::Length(n),
            BodyFraming::Chunked => State::Chunked(Chunked::Size),
            BodyFraming::Close => State::Close,
        };
        let mut body = Self {
            conn: Some(conn),
            pool,
            state,
            reusable,
        };
        if matches!(body.state, State::Done) {
            body.finish();
        }
        body
    }

    /// The body is complete: the connection goes back to the pool when it may carry another
    /// request, and the pool keeps it only if nothing follows the response
    /// ([`Pool::release_h1`]).
    fn finish(&mut self) {
        self.state = State::Done;
        if let Some(conn) = self.conn.take()
            && self.reusable
        {
            self.pool.release_h1(conn);
        }
    }

    /// Decodes the next frame from what is buffered; `None` when more bytes are needed.
    fn decode(&mut self) -> io::Result<Option<Option<Frame<Bytes>>>> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(Some(None));
        };
        let buf = &mut conn.rbuf;
        match &mut self.state {
            State::Done => Ok(Some(None)),
            State::Length(left) => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                let data = buf.split_to(n).freeze();
                *left -= n as u64;
                if *left == 0 {
                    self.finish();
                }
                Ok(Some(Some(Frame::data(data))))
            }
            State::Chunked(chunked) => match chunked.next(buf)? {
                Step::NeedMore => Ok(None),
                Step::End => {
                    self.finish();
                    Ok(Some(None))
                }
                Step::Frame(frame) => {
                    // The body's end is often in the same read as its last data: `next` has
                    // noticed it, so the client's side finishes the response without another
                    // poll.
                    if *chunked == Chunked::Done {
                        self.finish();
                    }
                    Ok(Some(Some(frame)))
                }
            },
            State::Close if buf.is_empty() => Ok(None),
            State::Close => Ok(Some(Some(Frame::data(buf.split().freeze())))),
        }
    }

    fn fail(&mut self, e: io::Error) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.state = State::Done;
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }
}

impl HttpBody for ResponseBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            match this.decode() {
                Ok(Some(frame)) => return Poll::Ready(frame.map(Ok)),
                Ok(None) => {}
                Err(e) => return this.fail(e),
            }
            let room = match this.state {
                State::Length(left) if left < SMALL_READ as u64 => SMALL_READ,
                _ => BULK_READ,
            };
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(conn.io.poll_fill(cx, &mut conn.rbuf, room)) {
                Ok(0) if matches!(this.state, State::Close) => {
                    // The upstream's close is this body's end; the connection is spent.
                    this.state = State::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    return this.fail(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "upstream closed the connection before the response body ended",
                    ));
                }
                Ok(_) => {}
                Err(e) => return this.fail(e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Done => SizeHint::with_exact(0),
            State::Length(n) => SizeHint::with_exact(n),
            State::Chunked(_) | State::Close => SizeHint::default(),
        }
    }
}
