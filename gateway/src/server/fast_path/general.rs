//! Every other body-less request: served through the one request path every protocol shares
//! ([`ConnService::handle`]: the entry rules, the router, the route's filter chain and its
//! terminal), with the response written here.
//!
//! A request the fast path's own answers do not take (a route with filters, a proxy route the
//! text forward does not take, a static file's precondition, no matching route, a request the
//! entry rules refuse or change) but that carries no body and asks for nothing hyper alone
//! does (`Expect`, `Upgrade`) is not handed to hyper: its head becomes an `http::Request` (the
//! header values sharing one copy of the head's bytes), the service answers it exactly as it
//! answers an HTTP/2 or HTTP/3 request, and the response is encoded as hyper encodes it
//! ([`gateway_http1::response`]), its body relayed here. A response whose own `Connection` says
//! `close` ends the connection too.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Buf, Bytes, BytesMut};
use gateway_http1::Framing;
use gateway_http1::response::{self, Answering};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use stream_proxy::clock::coarse_unix_secs;
use tokio::io::{AsyncRead, AsyncWrite};

use super::answers::Answers;
use super::forward::{Client, gone, relay};
use super::{Ended, Lane, MAX_HEADERS, until_done};
use crate::body::Body;
use crate::generation::Generation;
use crate::server::conn::{ConnWatch, ListenerRuntime};
use crate::server::sendfile::SendFile;

/// A body-less request for the service, read off the fast path's buffer.
pub(super) struct General {
    req: Request<Body>,
    /// The client asked for the connection to end with this answer.
    close: bool,
    /// The generation the fast path routed the request in and the route's index, when it did.
    routed: Option<(Arc<Generation>, usize)>,
}

impl General {
    /// The request in `parsed`, whose head is `head` (the bytes `parsed` was read from, up to
    /// the end of its head); `None` when its method, target or a field is one the `http` types
    /// refuse (hyper answers it).
    pub(super) fn read(
        parsed: &httparse::Request<'_, '_>,
        head: &[u8],
        close: bool,
        routed: Option<(Arc<Generation>, usize)>,
    ) -> Option<Box<Self>> {
        let method = Method::from_bytes(parsed.method?.as_bytes()).ok()?;
        let bytes = Bytes::copy_from_slice(head);
        let share = |part: &[u8]| {
            let start = part.as_ptr() as usize - head.as_ptr() as usize;
            bytes.slice(start..start + part.len())
        };
        let uri = Uri::from_maybe_shared(share(parsed.path?.as_bytes())).ok()?;
        // Room for the fields a route's filters add, so that they do not grow the map.
        let room = parsed.headers.len() + crate::proxy::headers::ADDED_FIELDS_ROOM;
        let mut headers = HeaderMap::with_capacity(room);
        for field in parsed.headers.iter() {
            let name = gateway_http1::fields::name(field.name.as_bytes()).ok()?;
            let value = HeaderValue::from_maybe_shared(share(field.value)).ok()?;
            headers.append(name, value);
        }
        let mut req = Request::new(Body::empty());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        Some(Box::new(Self { req, close, routed }))
    }

    /// The request whose head is the first `len` bytes of `buf`, taken off it.
    pub(super) fn at_front(
        buf: &mut BytesMut,
        len: usize,
        close: bool,
        routed: Option<(Arc<Generation>, usize)>,
    ) -> Option<Box<Self>> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut fields);
        let job = match parsed.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(n)) if n == len => {
                Self::read(&parsed, &buf[..len], close, routed)
            }
            _ => None,
        }?;
        buf.advance(len);
        Some(job)
    }
}

impl Lane<'_> {
    /// Serves `job` through the service and writes its answer to `io` (`out` is empty, and is
    /// left empty). While the answer is awaited, what the client sends is read into `buf`, so
    /// that a client that leaves is noticed and the request dropped, as hyper does. `Ok(true)`:
    /// the response ends the connection. `Err` ends the connection: the watchdog's verdict, or a
    /// client or body that failed.
    pub(super) async fn serve_general<IO>(
        &self,
        job: Box<General>,
        io: &mut IO,
        buf: &mut BytesMut,
        out: &mut Answers,
        watch: &ConnWatch,
        rt: &ListenerRuntime,
    ) -> Result<bool, Ended>
    where
        IO: AsyncRead + AsyncWrite + SendFile + Unpin,
    {
        let svc = self.svc;
        svc.activity.request_started(false);
        let head_only = job.req.method() == Method::HEAD;
        let mut client = Client { io, buf };
        // Set by the response as well; an atomic only because the connection's future is `Send`.
        let closes = AtomicBool::new(job.close);
        let mut exchange = pin!(async {
            let General { req, routed, .. } = *job;
            let answered = client.unless_gone(svc.handle_routed(req, routed)).await;
            let res = answered.ok_or_else(gone)?;
            let (framing, declared) = push_head(&res, head_only, &closes, out);
            let body = res.into_body();
            relay(&mut client, out, body, framing, declared.as_deref()).await
        });
        let done = until_done(&mut exchange, watch, rt, true).await;
        svc.activity.request_done();
        self.answered.inc();
        self.through_chain.inc();
        done.map(|_| closes.load(Ordering::Relaxed))
    }
}

/// Appends `res`'s head to `out` as hyper's HTTP/1.1 server encodes it
/// ([`response::push_head`]), to a `HEAD` (`head_only`) or another method; `close` is whether
/// the connection ends with it, set when the response says so. Returns the body's framing and
/// the trailers the response declares.
fn push_head(
    res: &Response<Body>,
    head_only: bool,
    close: &AtomicBool,
    out: &mut Answers,
) -> (Framing, Option<Vec<u8>>) {
    let to = Answering {
        head_only,
        close: close.load(Ordering::Relaxed),
    };
    let length = res.body().length();
    let now = coarse_unix_secs();
    let written = response::push_head(&mut out.text, res.status(), res.headers(), length, to, now);
    if written.closes {
        close.store(true, Ordering::Relaxed);
    }
    (written.framing, written.trailers)
}
