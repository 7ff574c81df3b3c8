//! A request as the client writes it (the proxy's upstream HTTP/1.1 requests): the head, how
//! its body is framed (RFC 9112 §6), and the chunked coding's size lines and last chunk.
//!
//! The head is written in one pass: request line, the request's fields (`Host` among them, set
//! by the proxy), then the framing field chosen here. The proxy's own requests carry only what
//! differs between their attempts (a trace's fields) and lend `Host` and the fields it rewrote
//! once, as text ([`Shared`]), so a request that may be retried is not copied for each attempt.
//! `Content-Length` and `Transfer-Encoding` from the request are never copied: the framing is
//! decided from what the body reports, so a field and the bytes sent can never disagree (a
//! smuggling vector between the gateway and the upstream).

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Method, Uri};

use crate::fields::push_field;
use crate::{BodyLength, Framing};

/// The fields a request's attempts share, lent to each attempt's head rather than copied into
/// its request, so a request that may be retried does not copy its fields for every attempt in
/// case the attempt fails and the next one needs it.
#[derive(Clone, Copy)]
pub struct Shared<'a> {
    /// `Host` for the attempt's target.
    pub host: &'a [u8],
    /// The request's fields as the proxy rewrote them, as field lines (`name: value` and CRLF
    /// each), without `Host` and the framing fields. A line whose name the attempt's own request
    /// sets (a trace's `traceparent`) is not sent.
    pub fields: &'a [u8],
    /// The `Content-Length` the request's sender declared ([`declared_length`]).
    pub declared_length: Option<u64>,
}

/// Appends the head of a request with `method`, `uri` (its path and query are sent) and its
/// own fields `own` to `out`, its body framed as `framing` ([`framing`]). With `shared`, `Host`
/// and the shared fields follow the request's own.
pub fn push_head(
    out: &mut Vec<u8>,
    method: &Method,
    uri: &Uri,
    own: &HeaderMap,
    shared: Option<Shared<'_>>,
    framing: Framing,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(if path.is_empty() {
        b"/"
    } else {
        path.as_bytes()
    });
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(s) = shared {
        push_field(out, b"host", s.host);
    }
    for (name, value) in own {
        if matches!(*name, header::CONTENT_LENGTH | header::TRANSFER_ENCODING) {
            continue;
        }
        push_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if let Some(s) = shared {
        if own.is_empty() {
            out.extend_from_slice(s.fields);
        } else {
            for line in s.fields.split_inclusive(|&b| b == b'\n') {
                let name = line.split(|&b| b == b':').next().unwrap_or_default();
                let set_by_own = std::str::from_utf8(name).is_ok_and(|n| own.contains_key(n));
                if !set_by_own {
                    out.extend_from_slice(line);
                }
            }
        }
    }
    match framing {
        Framing::Empty if needs_zero_length(method) => {
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
}

/// The `Content-Length` a request's sender declared in `fields`, when it is a number.
pub fn declared_length(fields: &HeaderMap) -> Option<u64> {
    fields
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// How a request body that says `body` of its length goes on the wire; `declared` is the
/// length its sender declared ([`declared_length`]).
pub fn framing(method: &Method, body: BodyLength, declared: Option<u64>) -> Framing {
    match body {
        BodyLength::Empty | BodyLength::Known(0) => return Framing::Empty,
        BodyLength::Known(n) => return Framing::Length(n),
        BodyLength::Unknown => {}
    }
    // A body of unknown length whose sender declared one (hyper checks an incoming body against
    // its own Content-Length, so the two agree).
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

/// A data chunk's size line.
pub fn chunk_size(len: usize) -> Bytes {
    Bytes::from(format!("{len:x}\r\n"))
}

/// The last chunk and the trailer section, without the fields a trailer must not carry
/// ([`crate::trailers`]).
pub fn last_chunk(trailers: Option<&HeaderMap>) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        if crate::trailers::is_forbidden(name.as_str().as_bytes()) {
            continue;
        }
        push_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn the_bodys_length_frames_it_and_a_declared_one_only_when_it_has_none() {
        let mut fields = HeaderMap::new();
        fields.insert("content-length", HeaderValue::from_static("5"));
        let declared = declared_length(&fields);
        assert_eq!(declared, Some(5));
        let none = declared_length(&HeaderMap::new());
        let get = Method::GET;
        assert_eq!(framing(&get, BodyLength::Empty, declared), Framing::Empty);
        assert_eq!(
            framing(&get, BodyLength::Known(0), declared),
            Framing::Empty
        );
        assert_eq!(
            framing(&get, BodyLength::Known(3), declared),
            Framing::Length(3)
        );
        assert_eq!(
            framing(&get, BodyLength::Unknown, declared),
            Framing::Length(5)
        );
        assert_eq!(framing(&get, BodyLength::Unknown, none), Framing::Chunked);
        assert_eq!(
            framing(&Method::HEAD, BodyLength::Unknown, none),
            Framing::Empty
        );
    }

    #[test]
    fn an_empty_target_is_sent_as_slash() {
        let mut out = Vec::new();
        let uri = Uri::from_static("http://up.example");
        push_head(
            &mut out,
            &Method::GET,
            &uri,
            &HeaderMap::new(),
            None,
            Framing::Empty,
        );
        assert_eq!(out, b"GET / HTTP/1.1\r\n\r\n");
    }
}
