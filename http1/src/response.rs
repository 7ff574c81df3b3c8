//! A response head written by the server as hyper's HTTP/1.1 server encodes it, so that a
//! response the gateway encodes itself (the fast path's answers through the service) reaches
//! the client exactly as one hyper wrote: the status line, the response's fields in order, the
//! framing field chosen from what the body says of its length, `Connection`, `Trailer` and
//! `Date`.
//!
//! hyper's rules: `Connection` and `Trailer` values are joined into one line each (`Trailer`
//! only where a chunked body may follow); the body's length decides the framing over a
//! `Content-Length` field (a field beside an empty body is dropped, except for `HEAD`); with no
//! length written, a body of unknown length goes chunked, an empty one gets
//! `Content-Length: 0` (not for `HEAD`, 1xx, 204 and 304), a known one its length (also for
//! `HEAD`); `HEAD`, 1xx, 204 and 304 never carry a body; `Date` is added when the response has
//! none.

use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRAILER, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, StatusCode};

use crate::fields::push_field;
use crate::{BodyLength, Framing, date};

/// The request a response answers, as far as its head depends on it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Answering {
    /// The request's method is `HEAD`: no body follows, whatever the head says.
    pub head_only: bool,
    /// The client asked for the connection to end with this response.
    pub close: bool,
}

/// What [`push_head`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// How the body follows the head.
    pub framing: Framing,
    /// The connection ends with this response: the client asked for it, or the response's own
    /// `Connection` says `close`.
    pub closes: bool,
    /// The response's `Trailer` values, comma-joined, when a body that may carry trailers
    /// follows: only the trailers they name are sent ([`crate::trailers::is_declared`]).
    pub trailers: Option<Vec<u8>>,
}

/// Appends the head of a response with `status` and `headers` to `out`; `body` is what its
/// body says of its length, `now` the current second since the Unix epoch (for `Date`; 0 asks
/// the system clock, [`date::push_field`]).
pub fn push_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    body: BodyLength,
    to: Answering,
    now: u64,
) -> Written {
    let head_only = to.head_only;
    let bodiless_status = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let no_body = head_only || bodiless_status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut framing = None;
    // The fields that frame the body or end the connection are written after the others.
    for (name, value) in headers {
        let framing_field = [CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION, TRAILER].contains(name);
        if !framing_field {
            push_field(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    if let Some(value) = headers.get(CONTENT_LENGTH) {
        let declared = value.to_str().ok().and_then(|v| v.parse::<u64>().ok());
        match (body, declared) {
            (BodyLength::Known(n), _) => framing = Some(Framing::Length(n)),
            (BodyLength::Unknown, Some(n)) => framing = Some(Framing::Length(n)),
            (BodyLength::Empty, _) if head_only => framing = Some(Framing::Empty),
            _ => {}
        }
        if framing.is_some() {
            push_field(out, b"content-length", value.as_bytes());
        }
    }
    if framing.is_none()
        && !no_body
        && let Some(mut codings) = joined(headers, &TRANSFER_ENCODING)
    {
        let last = codings.rsplit(|&b| b == b',').next().unwrap_or_default();
        if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            codings.extend_from_slice(b", chunked");
        }
        push_field(out, b"transfer-encoding", &codings);
        framing = Some(Framing::Chunked);
    }
    let mut says_close = false;
    if let Some(connection) = joined(headers, &CONNECTION) {
        says_close = connection
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        push_field(out, b"connection", &connection);
    }
    let trailers = if no_body {
        None
    } else {
        joined(headers, &TRAILER)
    };
    if let Some(declared) = &trailers {
        push_field(out, b"trailer", declared);
    }
    let framing = match framing {
        Some(framing) => framing,
        None => match body {
            BodyLength::Unknown if no_body => Framing::Empty,
            BodyLength::Unknown => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
            BodyLength::Empty | BodyLength::Known(0) => {
                if !head_only && !bodiless_status {
                    out.extend_from_slice(b"content-length: 0\r\n");
                }
                Framing::Empty
            }
            BodyLength::Known(n) => {
                if !bodiless_status {
                    push_field(out, b"content-length", n.to_string().as_bytes());
                }
                Framing::Length(n)
            }
        },
    };
    let framing = if no_body { Framing::Empty } else { framing };
    if to.close && !says_close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if !headers.contains_key(DATE) {
        date::push_field(out, now);
    }
    out.extend_from_slice(b"\r\n");
    Written {
        framing,
        closes: to.close || says_close,
        trailers,
    }
}

/// The values of `name`'s fields joined with `, `, as hyper writes a repeated `Connection`,
/// `Transfer-Encoding` or `Trailer`.
fn joined(headers: &HeaderMap, name: &HeaderName) -> Option<Vec<u8>> {
    let mut all = headers.get_all(name).iter();
    let first = all.next()?;
    let mut line = first.as_bytes().to_vec();
    for more in all {
        line.extend_from_slice(b", ");
        line.extend_from_slice(more.as_bytes());
    }
    Some(line)
}

#[cfg(test)]
mod tests;
