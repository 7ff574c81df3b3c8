//! The request head as HTTP/1.1 bytes ([`gateway_http1::request`]), with a small body that is
//! already in memory sent in the same write.

use bytes::Bytes;
pub(crate) use gateway_http1::Framing;
pub(crate) use gateway_http1::request::Shared;
use gateway_http1::request::{self, push_head};
use http::Request;

use crate::body::Body;

/// Bodies up to this size that are already in memory go out in the same write as the head.
pub(crate) const INLINE_BODY_MAX: usize = 16 * 1024;

/// Writes `req`'s head into `out` (cleared first) and returns the body's framing. A body that is
/// one buffer of at most [`INLINE_BODY_MAX`] bytes is appended after the head and reported as
/// `inlined`, so a request fails over to another connection with its body untouched. With
/// `shared`, `Host` and the shared fields follow the request's own.
pub(crate) fn head(req: &Request<Body>, shared: Option<Shared<'_>>, out: &mut Vec<u8>) -> Encoded {
    out.clear();
    let declared = match shared {
        Some(s) => s.declared_length,
        None => request::declared_length(req.headers()),
    };
    let framing = request::framing(req.method(), req.body().length(), declared);
    push_head(out, req.method(), req.uri(), req.headers(), shared, framing);
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

/// The body's single buffer, when it is one already in memory.
fn full_body(body: &Body) -> Option<&Bytes> {
    body.as_full()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_http1::request::{chunk_size, last_chunk};
    use http::{HeaderMap, HeaderValue};

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
    fn shared_fields_follow_the_attempts_own_and_lose_what_it_sets() {
        let fields = b"traceparent: 00-client\r\nx-one: 1\r\nx-one: 2\r\n";
        let shared = Shared {
            host: b"up.example",
            fields,
            declared_length: Some(5),
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

        // A body of unknown length takes the length its sender declared.
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
