//! Every other body-less request: served through the one request path every protocol shares
//! ([`ConnService::handle`]: the entry rules, the router, the route's filter chain and its
//! terminal), with the response written here.
//!
//! A request the fast path's own answers do not take (a route with filters, a proxy route the
//! text forward does not take, a static file's precondition, no matching route, a request the
//! entry rules refuse or change) but that carries no body and asks for nothing hyper alone
//! does (`Expect`, `Upgrade`) is not handed to hyper: its head becomes an `http::Request` (the
//! header values sharing one copy of the head's bytes), the service answers it exactly as it
//! answers an HTTP/2 or HTTP/3 request, and the response is encoded here as hyper encodes it:
//! the status line, the fields of the response in order, `Content-Length` when the body's
//! length is known (declared, or the body's exact size) and the chunked coding otherwise
//! (trailers only those the response's `Trailer` field declares), no body for `HEAD`, 204 and
//! 304, `Date` when the response has none, and `Connection: close` when the client asked for
//! it. A response whose own `Connection` says `close` ends the connection too.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRAILER, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite};

use super::answers::Answers;
use super::forward::{Client, Framing, gone, relay};
use super::{Ended, Lane, MAX_HEADERS, http_date, push_line, until_done};
use crate::body::Body;
use crate::server::conn::{ConnWatch, ListenerRuntime};
use crate::server::sendfile::SendFile;

/// A body-less request for the service, read off the fast path's buffer.
pub(super) struct General {
    req: Request<Body>,
    /// The client asked for the connection to end with this answer.
    close: bool,
}

impl General {
    /// The request in `parsed`, whose head is `head` (the bytes `parsed` was read from, up to
    /// the end of its head); `None` when its method, target or a field is one the `http` types
    /// refuse (hyper answers it).
    pub(super) fn read(
        parsed: &httparse::Request<'_, '_>,
        head: &[u8],
        close: bool,
    ) -> Option<Box<Self>> {
        let method = Method::from_bytes(parsed.method?.as_bytes()).ok()?;
        let bytes = Bytes::copy_from_slice(head);
        let share = |part: &[u8]| {
            let start = part.as_ptr() as usize - head.as_ptr() as usize;
            bytes.slice(start..start + part.len())
        };
        let uri = Uri::from_maybe_shared(share(parsed.path?.as_bytes())).ok()?;
        let mut headers = HeaderMap::with_capacity(parsed.headers.len());
        for field in parsed.headers.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
            let value = HeaderValue::from_maybe_shared(share(field.value)).ok()?;
            headers.append(name, value);
        }
        let mut req = Request::new(Body::empty());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        Some(Box::new(Self { req, close }))
    }

    /// The request whose head is the first `len` bytes of `buf`, taken off it.
    pub(super) fn at_front(buf: &mut BytesMut, len: usize, close: bool) -> Option<Box<Self>> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut fields);
        let job = match parsed.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(n)) if n == len => {
                Self::read(&parsed, &buf[..len], close)
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
        job: General,
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
            let answered = client.unless_gone(svc.handle(job.req)).await;
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

/// Appends `res`'s head to `out` as hyper's HTTP/1.1 server encodes it, to a `HEAD`
/// (`head_only`) or another method; `close` is whether the connection ends with it, set when
/// the response says so. Returns the body's framing and the trailers the response declares.
///
/// hyper's rules, kept here so that both paths answer alike: `Connection` and `Trailer` values
/// are joined into one line each (`Trailer` only where a chunked body may follow); the body's
/// length decides the framing over a `Content-Length` field (a field beside an empty body is
/// dropped, except for `HEAD`); with no length written, a body of unknown length goes chunked,
/// an empty one gets `Content-Length: 0` (not for `HEAD`, 1xx, 204 and 304), a known one its
/// length (also for `HEAD`); `HEAD`, 1xx, 204 and 304 never carry a body.
fn push_head(
    res: &Response<Body>,
    head_only: bool,
    close: &AtomicBool,
    out: &mut Answers,
) -> (Framing, Option<Vec<u8>>) {
    let status = res.status();
    let no_body = head_only
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let may_have_length = !(status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED);
    let body = res.body();
    let body_length = if body.is_end_stream() {
        BodyLength::Empty
    } else {
        body.size_hint()
            .exact()
            .map_or(BodyLength::Unknown, BodyLength::Known)
    };
    let text = &mut out.text;
    text.extend_from_slice(b"HTTP/1.1 ");
    text.extend_from_slice(status.as_str().as_bytes());
    text.push(b' ');
    text.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    text.extend_from_slice(b"\r\n");
    let headers = res.headers();
    let mut framing = None;
    // The fields that frame the body or end the connection are written after the others.
    for (name, value) in headers {
        let framing_field = [CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION, TRAILER].contains(name);
        if !framing_field {
            push_line(text, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    if let Some(value) = headers.get(CONTENT_LENGTH) {
        let declared = value.to_str().ok().and_then(|v| v.parse::<u64>().ok());
        match (body_length, declared) {
            (BodyLength::Known(n), _) => framing = Some(Framing::Length(n)),
            (BodyLength::Unknown, Some(n)) => framing = Some(Framing::Length(n)),
            (BodyLength::Empty, _) if head_only => framing = Some(Framing::Empty),
            _ => {}
        }
        if framing.is_some() {
            push_line(text, b"content-length", value.as_bytes());
        }
    }
    let joined = |name| {
        let mut all = headers.get_all(name).iter();
        let first = all.next()?;
        let mut line = first.as_bytes().to_vec();
        for more in all {
            line.extend_from_slice(b", ");
            line.extend_from_slice(more.as_bytes());
        }
        Some(line)
    };
    if framing.is_none()
        && !no_body
        && let Some(mut codings) = joined(TRANSFER_ENCODING)
    {
        let last = codings.rsplit(|&b| b == b',').next().unwrap_or_default();
        if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            codings.extend_from_slice(b", chunked");
        }
        push_line(text, b"transfer-encoding", &codings);
        framing = Some(Framing::Chunked);
    }
    let mut says_close = false;
    if let Some(connection) = joined(CONNECTION) {
        says_close = connection
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        push_line(text, b"connection", &connection);
    }
    let declared = if no_body { None } else { joined(TRAILER) };
    if let Some(declared) = &declared {
        push_line(text, b"trailer", declared);
    }
    let framing = match framing {
        Some(framing) => framing,
        None => match body_length {
            BodyLength::Unknown if no_body => Framing::Empty,
            BodyLength::Unknown => {
                text.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
            BodyLength::Empty | BodyLength::Known(0) => {
                if !head_only && may_have_length {
                    text.extend_from_slice(b"content-length: 0\r\n");
                }
                Framing::Empty
            }
            BodyLength::Known(n) => {
                if may_have_length {
                    push_line(text, b"content-length", n.to_string().as_bytes());
                }
                Framing::Length(n)
            }
        },
    };
    let framing = if no_body { Framing::Empty } else { framing };
    if close.load(Ordering::Relaxed) && !says_close {
        text.extend_from_slice(b"connection: close\r\n");
    }
    if says_close {
        close.store(true, Ordering::Relaxed);
    }
    if !headers.contains_key(DATE) {
        http_date::push_line(text);
    }
    text.extend_from_slice(b"\r\n");
    (framing, declared)
}

/// What the response body says of its length, as hyper's encoder reads it.
#[derive(Clone, Copy)]
enum BodyLength {
    /// The body has ended already.
    Empty,
    Known(u64),
    Unknown,
}
