//! Proxied requests on the fast path: a plain `GET` or `HEAD` for a proxy route without
//! filters is rewritten as text ([`crate::proxy::ProxyRoute::rewrite_text`]), forwarded from
//! the connection's own task, and its response written here: the upstream's head rewritten as
//! text, the body relayed frame by frame as it arrives.
//!
//! Neither hyper's server side (its parse into a header map, its dispatch, its response
//! encoding and flush) nor the header maps of both messages are made: they were a large share
//! of a proxied request's cost on the general path. What the general path adds to the
//! response is added the same way: `Server` when the upstream sent none, the listener's HSTS and
//! `Alt-Svc` over the upstream's, `Date` when the upstream sent none, `Connection: close` when
//! the client asked for it. The body goes out with the upstream's `Content-Length`, or chunked
//! when the upstream's was chunked or delimited by its close (with the trailers its `Trailer`
//! field declared, as hyper sends them). A body that breaks midway ends the connection, as
//! hyper's does, so the client sees the truncation.

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use gateway_http1::Framing;
use gateway_http1::date;
use gateway_http1::decode::BodyFraming;
use gateway_http1::fields::push_field;
use gateway_http1::trailers;
use http::StatusCode;
use http_body::Body as _;
use stream_proxy::clock::coarse_unix_secs;
use tokio::io::{AsyncRead, AsyncWrite};

use super::answers::{Answers, WriteAll};
use super::classify::{Plain, facts};
use super::prepared::Observed;
use super::{Ended, Lane, OUT_LIMIT, ReadMore, until_done};
use crate::body::Body;
use crate::generation::Generation;
use crate::proxy::{Answer, Forwarding, ProxyRoute, Replaced, TextRequest};
use crate::server::conn::{ConnWatch, ListenerRuntime};
use crate::server::sendfile::SendFile;

/// A proxied request, rewritten and waiting for its upstream.
pub(super) struct Forwarded {
    proxy: Arc<ProxyRoute>,
    fwd: Forwarding,
    close: bool,
    facts: Option<crate::server::service::RequestFacts>,
    generation: Arc<Generation>,
    index: usize,
    start: Instant,
}

impl Forwarded {
    /// The client asked for the connection to end with this answer.
    pub(super) fn closes(&self) -> bool {
        self.close
    }
}

impl Lane<'_> {
    /// The request rewritten for `proxy`'s upstream, or `None` when the general path has to
    /// forward it: traces on (their spans and `traceparent` are the general path's), or an
    /// upstream [`ProxyRoute::rewrite_text`] refuses. The caller has checked the route's
    /// filters.
    pub(super) fn rewrite(
        &self,
        req: &Plain<'_>,
        proxy: &Arc<ProxyRoute>,
        generation: &arc_swap::Guard<Arc<Generation>>,
        index: usize,
        start: Instant,
    ) -> Option<Box<Forwarded>> {
        let svc = self.svc;
        if svc.telemetry.tracer.is_on() {
            return None;
        }
        let text = TextRequest {
            head: req.head,
            target: req.target,
            path: req.path,
            host: req.host,
            fields: req.headers,
        };
        let conn = &svc.conn;
        let fwd = proxy.rewrite_text(&text, conn.peer_text(), conn.client.ip())?;
        Some(Box::new(Forwarded {
            proxy: proxy.clone(),
            fwd,
            close: req.close,
            facts: svc.telemetry.access_log.is_on().then(|| {
                let mut facts = facts(req);
                facts.upstream = Some(proxy.upstream_name().clone());
                facts
            }),
            generation: Arc::clone(generation),
            index,
            start,
        }))
    }

    /// Forwards the request and writes its answer to `io` (`out` is empty, and is left empty).
    /// While the upstream is awaited, what the client sends is read into `buf` (a pipelined
    /// request, answered next), so that a client that leaves is noticed and the upstream's
    /// request dropped, as hyper does. `Err` ends the connection: the watchdog's verdict, or a
    /// client or body that failed.
    pub(super) async fn forward<IO>(
        &self,
        job: Forwarded,
        io: &mut IO,
        buf: &mut BytesMut,
        out: &mut Answers,
        watch: &ConnWatch,
        rt: &ListenerRuntime,
    ) -> Result<(), Ended>
    where
        IO: AsyncRead + AsyncWrite + SendFile + Unpin,
    {
        let svc = self.svc;
        svc.activity.request_started(false);
        let replaced = Replaced {
            hsts: svc.policy.hsts.is_some(),
            alt_svc: svc.alt_svc.is_some(),
        };
        let mut client = Client { io, buf };
        let mut exchange = pin!(async {
            let answered = {
                let upstream = job.proxy.forward_text(&job.fwd, replaced, &mut out.text);
                match client.unless_gone(upstream).await {
                    Some(answered) => answered,
                    None => return Err(gone()),
                }
            };
            let route = job.generation.router.route(job.index);
            let server = job.generation.server_header.as_ref();
            let head_only = job.fwd.is_head();
            let observe = || Observed {
                facts: job.facts,
                span: None,
            };
            let answer = match answered {
                Ok(answer) => answer,
                Err(res) => {
                    out.clear();
                    let status = res.status();
                    let bytes = self.push_response(res, (head_only, job.close), server, out);
                    self.record(route, status, bytes, job.start, observe, out);
                    return write(client.io, out).await;
                }
            };
            let framing = self.end_answer_head(&answer, job.close, server, out);
            // As the general path counts it: the declared length, else the body's known size.
            let bytes = answer
                .head
                .length
                .or_else(|| answer.body.size_hint().exact())
                .unwrap_or(0);
            let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
            self.record(route, answer.status, bytes, job.start, observe, out);
            let declared = answer.declared_trailers.as_deref();
            relay(&mut client, out, answer.body, framing, declared).await
        });
        let done = until_done(&mut exchange, watch, rt, true).await;
        svc.activity.request_done();
        self.answered.inc();
        done.map(|_| ())
    }

    /// Ends the head `out` holds (the status line and the upstream's fields as the client sees
    /// them) with the gateway's fields and the body's framing; returns the framing.
    fn end_answer_head(
        &self,
        answer: &Answer,
        close: bool,
        server: Option<&http::HeaderValue>,
        out: &mut Answers,
    ) -> Framing {
        let text = &mut out.text;
        if !answer.has_server
            && let Some(server) = server
        {
            push_field(text, b"server", server.as_bytes());
        }
        text.extend_from_slice(self.listener_lines);
        let head = &answer.head;
        let framing = match head.framing {
            BodyFraming::Length(n) => Framing::Length(n),
            BodyFraming::Chunked | BodyFraming::Close => Framing::Chunked,
            BodyFraming::Empty => Framing::Empty,
        };
        match (framing, head.length) {
            (Framing::Chunked, _) => text.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            // A `HEAD`'s or a 304's declared length goes on; a 204 has none.
            (Framing::Length(n), _) | (Framing::Empty, Some(n))
                if answer.status != StatusCode::NO_CONTENT =>
            {
                push_field(text, b"content-length", n.to_string().as_bytes());
            }
            _ => {}
        }
        if close {
            text.extend_from_slice(b"connection: close\r\n");
        }
        if !answer.has_date {
            date::push_field(text, coarse_unix_secs());
        }
        text.extend_from_slice(b"\r\n");
        framing
    }
}

/// Writes the head in `out` and then the body, frame by frame: a frame already there joins the
/// bytes before it in one write, and the bytes gathered go out whenever the next frame has not
/// come yet (or they reach [`OUT_LIMIT`]). Of the trailers, only those the head `declared` in
/// its `Trailer` field go out, as hyper sends them on the general path (the fields no trailer
/// may carry were dropped as the upstream's were read).
pub(super) async fn relay<IO>(
    client: &mut Client<'_, IO>,
    out: &mut Answers,
    mut body: Body,
    framing: Framing,
    declared: Option<&[u8]>,
) -> std::io::Result<usize>
where
    IO: AsyncRead + AsyncWrite + SendFile + Unpin,
{
    if framing == Framing::Empty {
        return write(client.io, out).await;
    }
    let chunked = framing == Framing::Chunked;
    loop {
        let frame = match poll_now(&mut body) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                write(client.io, out).await?;
                let next = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
                client.unless_gone(next).await.ok_or_else(gone)?
            }
        };
        let Some(frame) = frame else {
            if chunked {
                out.text.extend_from_slice(b"0\r\n\r\n");
            }
            return write(client.io, out).await;
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                // What came before the break goes out, as the general path sends it: the
                // client sees a body cut short (its length unmet, or no last chunk), and the
                // connection ends.
                write(client.io, out).await?;
                return Err(std::io::Error::other(error));
            }
        };
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) => push_data(out, &data, chunked),
            Err(frame) => {
                // Trailers end the body; only the chunked coding can carry them.
                if chunked {
                    out.text.extend_from_slice(b"0\r\n");
                    if let (Some(trailers), Some(declared)) = (frame.trailers_ref(), declared) {
                        for (name, value) in trailers {
                            let name = name.as_str().as_bytes();
                            if trailers::is_declared(declared, name) {
                                push_field(&mut out.text, name, value.as_bytes());
                            }
                        }
                    }
                    out.text.extend_from_slice(b"\r\n");
                }
                return write(client.io, out).await;
            }
        }
        if out.len() >= OUT_LIMIT {
            write(client.io, out).await?;
        }
    }
}

/// The client's side while its request is forwarded.
pub(super) struct Client<'a, IO> {
    pub(super) io: &'a mut IO,
    /// The connection's read buffer: what the client sends meanwhile is kept for later.
    pub(super) buf: &'a mut BytesMut,
}

impl<IO: AsyncRead + Unpin> Client<'_, IO> {
    /// `work`'s output, or `None` when the client closed the connection (or it failed) first.
    pub(super) async fn unless_gone<F: Future>(&mut self, work: F) -> Option<F::Output> {
        let mut work = pin!(work);
        poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            self.poll_gone(cx).map(|()| None)
        })
        .await
    }

    /// Reads what the client sent; ready when it has closed the connection (or it failed).
    /// Once a byte of the next request is in the buffer, nothing more is read until that
    /// request's turn, as hyper does: a client may pipeline a request and then close its
    /// sending side, and the framing checks end the stream after a request they refuse (whose
    /// stand-in hyper answers with its 400), and neither is a client that left.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.buf.is_empty() {
            return Poll::Pending;
        }
        let mut read = ReadMore {
            io: &mut *self.io,
            buf: &mut *self.buf,
        };
        match Pin::new(&mut read).poll(cx) {
            Poll::Ready(Ok(0) | Err(_)) => Poll::Ready(()),
            Poll::Ready(Ok(_)) | Poll::Pending => Poll::Pending,
        }
    }
}

/// The error that ends a forwarded request whose client left.
pub(super) fn gone() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the client closed the connection before its answer",
    )
}

/// Appends one data frame, as a chunk when `chunked`.
fn push_data(out: &mut Answers, data: &Bytes, chunked: bool) {
    if chunked {
        out.text
            .extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        out.push_body(data, None);
        out.text.extend_from_slice(b"\r\n");
    } else {
        out.push_body(data, None);
    }
}

/// The body's next frame if it is there already.
fn poll_now(
    body: &mut Body,
) -> Poll<Option<Result<http_body::Frame<Bytes>, crate::body::BoxError>>> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    Pin::new(body).poll_frame(&mut cx)
}

/// Writes what `out` holds and empties it.
async fn write<IO>(io: &mut IO, out: &mut Answers) -> std::io::Result<usize>
where
    IO: AsyncWrite + SendFile + Unpin,
{
    if out.is_empty() {
        return Ok(0);
    }
    let n = WriteAll {
        io,
        answers: out,
        written: 0,
        done: false,
    }
    .await?;
    out.clear();
    Ok(n)
}
