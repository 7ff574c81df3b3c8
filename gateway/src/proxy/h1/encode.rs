//! The request head as HTTP/1.1 bytes, and how its body is framed (RFC 9112 §6).
//!
//! The head is written into the connection's reusable buffer in one pass: request line, the
//! request's fields (`Host` among them, set by the proxy), then the framing field this module
//! chose. The proxy's own requests carry only what differs between their attempts (`Host`, a
//! trace's fields) and lend the fields it rewrote once ([`Shared`]), so a request that may be
//! retried is not copied for each attempt. `Content-Length` and `Transfer-Encoding` from the
//! request are never copied: the framing is decided here from what the body reports, so a
//! field and the bytes sent can never disagree (a smuggling vector between the gateway and the
//! upstream).

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request};
use http_body::Body as _;

use crate::body::Body;

/// How the request body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body bytes follow the head.
    Empty,
    /// Exactly this many bytes follow.
    Length(u64),
    /// Chunked transfer coding, trailers allowed.
    Chunked,
}

/// Bodies up to this size that are already in memory go out in the same write as the head.
pub(crate) const INLINE_BODY_MAX: usize = 16 * 1024;

/// The fields a request's attempts share, lent to each attempt's head rather than copied into
/// its request, so a request that may be retried does not clone its whole header map for every
/// attempt in case the attempt fails and the next one needs it.
#[derive(Clone, Copy)]
pub(crate) struct Shared<'a> {
    /// `Host` for the attempt's target.
    pub(crate) host: &'a HeaderValue,
    /// The request's fields as the proxy rewrote them. A `Host` among them is the client's and
    /// is not sent, nor is a field the attempt's own request sets (a trace's `traceparent`).
    pub(crate) fields: &'a HeaderMap,
}

/// Writes `req`'s head into `out` (cleared first) and returns the body's framing. A body that is
/// one buffer of at most [`INLINE_BODY_MAX`] bytes is appended after the head and reported as
/// `inlined`, so a request fails over to another connection with its body untouched. With
/// `shared`, `Host` and the shared fields follow the request's own.
pub(crate) fn head(req: &Request<Body>, shared: Option<Shared<'_>>, out: &mut Vec<u8>) -> Encoded {
    out.clear();
    let declared = shared.map_or(req.headers(), |s| s.fields);
    let framing = framing(req.method(), req.body(), declared);
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(if path.is_empty() {
        b"/"
    } else {
        path.as_bytes()
    });
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(s) = shared {
        field(out, b"host", s.host.as_bytes());
    }
    let own = req.headers();
    for (name, value) in own {
        if matches!(*name, header::CONTENT_LENGTH | header::TRANSFER_ENCODING) {
            continue;
        }
        field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if let Some(s) = shared {
        for (name, value) in s.fields {
            if matches!(
                *name,
                header::CONTENT_LENGTH | header::TRANSFER_ENCODING | header::HOST
            ) || (!own.is_empty() && own.contains_key(name))
            {
                continue;
            }
            field(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    match framing {
        Framing::Empty if needs_zero_length(req.method()) => {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        Framing::Empty => {}
        Framing::Length(n) => {
            use std::io::Write as _;
            // Writing into a Vec cannot fail.
            let _ = write!(out, "content-length: {n}\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
    let inlined = match (framing, full_body(req.body())) {
        (Framing::Length(n), Some(b)) if b.len() as u64 == n && b.len() <= INLINE_BODY_MAX => {
            out.extend_from_slice(b);
            true
        }
        _ => false,
    };
    Encoded { framing, inlined }
}

/// What [`head`] decided.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Encoded {
    pub(crate) framing: Framing,
    /// The whole body is already in the head's bytes.
    pub(crate) inlined: bool,
}

fn framing(method: &Method, body: &Body, headers: &HeaderMap) -> Framing {
    if body.is_end_stream() {
        return Framing::Empty;
    }
    if let Some(n) = body.size_hint().exact() {
        return if n == 0 {
            Framing::Empty
        } else {
            Framing::Length(n)
        };
    }
    // A body of unknown length whose sender declared one (hyper checks an incoming body against
    // its own Content-Length, so the two agree).
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
        None if *method == Method::HEAD => Framing::Empty,
        None => Framing::Chunked,
    }
}

/// Methods whose empty body is still announced, as clients do (RFC 9110 §8.6: a request
/// "SHOULD" carry a length when the method defines a meaning for content).
fn needs_zero_length(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// The body's single buffer, when it is one already in memory.
fn full_body(body: &Body) -> Option<&Bytes> {
    body.as_full()
}

/// One `name: value` line.
pub(crate) fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A data chunk's size line.
pub(crate) fn chunk_size(len: usize) -> Bytes {
    Bytes::from(format!("{len:x}\r\n"))
}

/// The last chunk and the trailer section, without the fields a trailer must not carry
/// ([`crate::proxy::trailers`]).
pub(crate) fn last_chunk(trailers: Option<&HeaderMap>) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        if crate::proxy::trailers::is_forbidden(name.as_str().as_bytes()) {
            continue;
        }
        field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn encode(req: &Request<Body>) -> (String, Encoded) {
        let mut out = Vec::new();
        let e = head(req, None, &mut out);
        (String::from_utf8(out).unwrap(), e)
    }

    #[test]
    fn a_get_has_no_framing_fields() {
        let req = Request::builder()
            .uri("/a/b?c=d")
            .header("host", "up.example")
            .header("x-one", "1")
            .header("x-one", "2")
            .body(Body::empty())
            .unwrap();
        let (text, e) = encode(&req);
        assert_eq!(
            text,
            "GET /a/b?c=d HTTP/1.1\r\nhost: up.example\r\nx-one: 1\r\nx-one: 2\r\n\r\n"
        );
        assert_eq!(e.framing, Framing::Empty);
    }

    #[test]
    fn shared_fields_follow_the_attempts_own_and_lose_what_it_replaces() {
        let mut fields = HeaderMap::new();
        fields.insert("host", HeaderValue::from_static("client.example"));
        fields.insert("traceparent", HeaderValue::from_static("00-client"));
        fields.append("x-one", HeaderValue::from_static("1"));
        fields.append("x-one", HeaderValue::from_static("2"));
        fields.insert("content-length", HeaderValue::from_static("5"));
        fields.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        let host = HeaderValue::from_static("up.example");
        let shared = Shared {
            host: &host,
            fields: &fields,
        };
        let mut out = Vec::new();

        // Untraced: the attempt's request has no fields of its own.
        let req = Request::post("/p").body(Body::full("hello")).unwrap();
        let e = head(&req, Some(shared), &mut out);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "POST /p HTTP/1.1\r\nhost: up.example\r\ntraceparent: 00-client\r\n\
             x-one: 1\r\nx-one: 2\r\ncontent-length: 5\r\n\r\nhello"
        );
        assert_eq!((e.framing, e.inlined), (Framing::Length(5), true));

        // Traced: the attempt's `traceparent` replaces the client's.
        let req = Request::get("/g")
            .header("traceparent", "00-ours")
            .body(Body::empty())
            .unwrap();
        head(&req, Some(shared), &mut out);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /g HTTP/1.1\r\nhost: up.example\r\ntraceparent: 00-ours\r\n\
             x-one: 1\r\nx-one: 2\r\n\r\n"
        );

        // A body of unknown length takes its declared length from the shared fields.
        let frames = futures_util::stream::iter([Ok::<_, crate::body::BoxError>(
            http_body::Frame::data(Bytes::from_static(b"hello")),
        )]);
        let req = Request::put("/s")
            .body(Body::new(http_body_util::StreamBody::new(frames)))
            .unwrap();
        assert_eq!(
            head(&req, Some(shared), &mut out).framing,
            Framing::Length(5)
        );
    }

    #[test]
    fn a_small_full_body_is_sent_with_the_head_and_its_length_is_the_bodys() {
        let req = Request::builder()
            .method("POST")
            .uri("/p")
            .header("host", "up.example")
            // A stale or hostile declared length is not copied: the body decides.
            .header("content-length", "999")
            .header("transfer-encoding", "chunked")
            .body(Body::full("hello"))
            .unwrap();
        let (text, e) = encode(&req);
        assert_eq!(
            text,
            "POST /p HTTP/1.1\r\nhost: up.example\r\ncontent-length: 5\r\n\r\nhello"
        );
        assert!(e.inlined);
        assert_eq!(e.framing, Framing::Length(5));
    }

    #[test]
    fn an_empty_post_says_so_and_a_large_body_is_not_inlined() {
        let post = Request::post("/p").body(Body::empty()).unwrap();
        assert!(encode(&post).0.ends_with("content-length: 0\r\n\r\n"));
        let big = Request::post("/p")
            .body(Body::full(vec![b'x'; INLINE_BODY_MAX + 1]))
            .unwrap();
        let (text, e) = encode(&big);
        assert!(!e.inlined);
        assert!(text.ends_with(&format!("content-length: {}\r\n\r\n", INLINE_BODY_MAX + 1)));
    }

    #[test]
    fn a_streaming_body_of_unknown_length_is_chunked_with_its_trailers() {
        let frames = futures_util::stream::iter([Ok::<_, crate::body::BoxError>(
            http_body::Frame::data(Bytes::from_static(b"x")),
        )]);
        let body = http_body_util::StreamBody::new(frames);
        let req = Request::put("/s").body(Body::new(body)).unwrap();
        let (text, e) = encode(&req);
        assert!(
            text.ends_with("transfer-encoding: chunked\r\n\r\n"),
            "{text}"
        );
        assert_eq!(e.framing, Framing::Chunked);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        // Fields no trailer carries are not written.
        trailers.insert("host", HeaderValue::from_static("elsewhere.example"));
        trailers.insert("content-length", HeaderValue::from_static("1"));
        assert_eq!(
            &last_chunk(Some(&trailers))[..],
            b"0\r\ngrpc-status: 0\r\n\r\n"
        );
        assert_eq!(&chunk_size(255)[..], b"ff\r\n");
    }
}
