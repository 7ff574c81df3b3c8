//! Builds the terminal's responses from precomputed header values, so the cached path only
//! clones reference-counted values into a map sized up front.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use super::encoding::Encoding;
use crate::body::Body;
use crate::error::error_response;
use gateway_http1::fields::push_field;

/// The header values of one chosen representation.
#[derive(Clone, Copy)]
pub(super) struct Representation<'a> {
    pub(super) content_type: &'a HeaderValue,
    pub(super) last_modified: &'a HeaderValue,
    pub(super) etag: &'a HeaderValue,
    pub(super) vary: bool,
    pub(super) encoding: Option<Encoding>,
    pub(super) cache_control: Option<&'a HeaderValue>,
}

/// Enough room for every header a file response carries (and the server's own after it), so
/// the map never grows.
pub(super) const HEADERS: usize = 10;

impl Representation<'_> {
    /// Validators and caching headers: what a 304 carries too (RFC 9110 §15.4.5).
    fn validators(&self, h: &mut HeaderMap) {
        h.insert(header::ETAG, self.etag.clone());
        h.insert(header::LAST_MODIFIED, self.last_modified.clone());
        if let Some(cc) = self.cache_control {
            h.insert(header::CACHE_CONTROL, cc.clone());
        }
        if self.vary {
            h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        }
    }

    fn representation(&self, h: &mut HeaderMap) {
        self.validators(h);
        h.insert(header::CONTENT_TYPE, self.content_type.clone());
        h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        if let Some(e) = self.encoding {
            h.insert(header::CONTENT_ENCODING, e.header_value());
        }
    }
}

fn with_headers(status: StatusCode, body: Body, headers: HeaderMap) -> Response<Body> {
    let mut res = Response::new(body);
    *res.status_mut() = status;
    *res.headers_mut() = headers;
    res
}

/// 200. `content_length` is `None` for bodies compressed on the fly (length unknown).
pub(super) fn ok(
    mut h: HeaderMap,
    rep: &Representation<'_>,
    body: Body,
    content_length: Option<HeaderValue>,
) -> Response<Body> {
    rep.representation(&mut h);
    if let Some(len) = content_length {
        h.insert(header::CONTENT_LENGTH, len);
    }
    with_headers(StatusCode::OK, body, h)
}

/// The headers of a 200 for one cached representation, made when the file is cached: a hit copies
/// the map ([`ok_cached`]: two allocations and a reference count per value) instead of inserting
/// each header into one, which hashes the name and probes for every header. The first entry is a
/// slot for `Server`, which the copy fills or removes without a lookup or a grown map.
pub(super) fn ok_headers(rep: &Representation<'_>, content_length: HeaderValue) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(HEADERS);
    h.insert(header::SERVER, HeaderValue::from_static(""));
    rep.representation(&mut h);
    h.insert(header::CONTENT_LENGTH, content_length);
    // A copy keeps only the entries in use; the map built holds room for more, which every
    // cached representation would keep for its life.
    h.clone()
}

/// The header lines of a cached representation's 200 as hyper writes them (`name: value`, CRLF,
/// in the map's order), without the `Server` slot: what the HTTP/1.1 fast path sends after its
/// status line and `Server`.
pub(super) fn wire_lines(ok_headers: &HeaderMap) -> bytes::Bytes {
    let mut out = Vec::with_capacity(ok_headers.len() * 40);
    for (name, value) in ok_headers {
        if name != header::SERVER {
            push_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    out.into()
}

/// The header lines of every answer with a representation's bytes (200 and 206), without its
/// length, as hyper writes them: those [`ok`] and [`partial`] insert first, in their order.
pub(super) fn representation_lines(rep: &Representation<'_>) -> Vec<u8> {
    let mut h = HeaderMap::with_capacity(HEADERS);
    rep.representation(&mut h);
    // Room for the length and range lines the answers add.
    let mut out = Vec::with_capacity(h.len() * 40 + 64);
    for (name, value) in &h {
        push_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    out
}

/// 200 for a cached representation, from its [`ok_headers`], with the server's `Server` header
/// or none.
pub(super) fn ok_cached(
    template: &HeaderMap,
    server: Option<&HeaderValue>,
    body: Body,
) -> Response<Body> {
    let mut h = template.clone();
    match server {
        Some(server) => {
            // The slot is first in the map's order (not a documented guarantee, so checked:
            // were it elsewhere, the insert below finds and replaces it).
            if let Some((name, slot)) = h.iter_mut().next()
                && name == header::SERVER
            {
                *slot = server.clone();
            } else {
                h.insert(header::SERVER, server.clone());
            }
        }
        None => {
            h.remove(header::SERVER);
        }
    }
    with_headers(StatusCode::OK, body, h)
}

/// 206 for bytes `start..=end` of `len`.
pub(super) fn partial(
    mut h: HeaderMap,
    rep: &Representation<'_>,
    body: Body,
    start: u64,
    end: u64,
    len: u64,
) -> Response<Body> {
    rep.representation(&mut h);
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start + 1));
    let range = format!("bytes {start}-{end}/{len}");
    if let Ok(v) = HeaderValue::try_from(range) {
        h.insert(header::CONTENT_RANGE, v);
    }
    with_headers(StatusCode::PARTIAL_CONTENT, body, h)
}

/// The header lines of a representation's 304 as hyper writes them (its validators, as
/// [`not_modified`] inserts them): what the HTTP/1.1 fast path sends after its status line,
/// before `Server`.
pub(super) fn not_modified_lines(rep: &Representation<'_>) -> bytes::Bytes {
    let mut h = HeaderMap::with_capacity(HEADERS);
    rep.validators(&mut h);
    let mut out = Vec::with_capacity(h.len() * 40);
    for (name, value) in &h {
        push_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    out.into()
}

/// 304.
pub(super) fn not_modified(mut h: HeaderMap, rep: &Representation<'_>) -> Response<Body> {
    rep.validators(&mut h);
    with_headers(StatusCode::NOT_MODIFIED, Body::empty(), h)
}

/// 416 with the representation's length, so the client can retry sensibly.
pub(super) fn unsatisfiable(len: u64) -> Response<Body> {
    let mut res = error_response(StatusCode::RANGE_NOT_SATISFIABLE);
    if let Ok(v) = HeaderValue::try_from(format!("bytes */{len}")) {
        res.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    res
}

/// 405 for anything but GET and HEAD.
pub(super) fn method_not_allowed() -> Response<Body> {
    let mut res = error_response(StatusCode::METHOD_NOT_ALLOWED);
    res.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    res
}

/// 301 to the directory's slash form.
pub(super) fn redirect(location: String) -> Response<Body> {
    let Ok(location) = HeaderValue::try_from(location) else {
        return error_response(StatusCode::NOT_FOUND);
    };
    let mut res = error_response(StatusCode::MOVED_PERMANENTLY);
    res.headers_mut().insert(header::LOCATION, location);
    res
}
