//! A response as the client reads it (the proxy's upstream HTTP/1.1 responses): the head
//! parsed from the connection's buffer (interim 1xx responses skipped), the body's framing
//! decided by RFC 9112 §6.3, and the chunked coding decoded with its trailers (less the fields
//! no trailer may carry, [`crate::trailers`]). Header values are slices of the received bytes,
//! not copies.
//!
//! Anything ambiguous fails the response rather than guessing: conflicting `Content-Length`
//! values, a malformed chunk, a head larger than [`MAX_HEAD`]. The caller answers 502 and the
//! connection is not reused. A 1xx or 204 that declares a body it must not have is passed on
//! bodiless, and its connection is not reused either: bytes it meant as a body would be read as
//! the next request's answer (response-queue poisoning).

use std::io;
use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version, response};
use http_body::Frame;

use crate::hop_by_hop::{EndToEnd, Judged};

/// Largest response head accepted, together with the interim responses before it; and the
/// largest trailer section.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a response head, as the hyper client was configured before.
const MAX_FIELDS: usize = 128;
/// Longest chunk-size line (the size and any extensions).
const MAX_CHUNK_LINE: usize = 4096;

/// How the response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body (HEAD, 204, 304, or `Content-Length: 0`).
    Empty,
    /// This many bytes.
    Length(u64),
    /// The chunked coding.
    Chunked,
    /// Everything until the upstream closes the connection.
    Close,
}

/// A final response head.
pub struct ResponseHead {
    /// Status, version and fields.
    pub parts: response::Parts,
    /// How the body follows.
    pub framing: BodyFraming,
    /// The upstream lets the connection carry another request after this response, and the
    /// head gives no reason to distrust it.
    pub keep_alive: bool,
    /// The connection would have been kept but for a 1xx or 204 that declared a body.
    pub bodiless_framed: bool,
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Parses a final response head from the front of `buf`, consuming it (and any interim 1xx
/// responses before it), for a request with `method`. `Ok(None)`: more bytes are needed. The
/// header map holds the response's end-to-end fields ([`EndToEnd`]: the hop-by-hop ones have
/// done their part once the framing is decided) and has `room` slots beyond them, for those the
/// caller adds.
pub fn response_head(
    buf: &mut BytesMut,
    method: &Method,
    room: usize,
) -> io::Result<Option<ResponseHead>> {
    let base = buf.as_ptr() as usize;
    let parsed = final_head(buf, |status, version, parsed, interim_framed| {
        // Names are made now (standard ones are static, others allocate); values become
        // slices of the head's bytes once the parser's borrow of `buf` ends.
        let mut spans: smallvec::SmallVec<[(HeaderName, usize, usize, Judged); 24]> =
            smallvec::SmallVec::new();
        let mut end_to_end = EndToEnd::of(parsed);
        for f in parsed {
            let name = crate::fields::name(f.name.as_bytes())
                .map_err(|_| invalid("invalid response header name"))?;
            let start = f.value.as_ptr() as usize - base;
            spans.push((name, start, start + f.value.len(), end_to_end.judge(f)));
        }
        Ok((status, version, spans, interim_framed))
    })?;
    let Some(Found {
        read: (status, version, mut spans, interim_framed),
        skipped,
        len,
    }) = parsed
    else {
        return Ok(None);
    };
    buf.advance(skipped);
    let bytes = buf.split_to(len).freeze();
    let mut headers = HeaderMap::with_capacity(spans.len() + room);
    let mut fields = FramingFields::default();
    // Drained in place: iterating the `SmallVec` by value would first copy its whole inline
    // array into the iterator. Offsets are from where `buf` began, before the
    // interim responses were consumed.
    for (name, start, end, judged) in spans.drain(..) {
        let value = bytes.slice(start - skipped..end - skipped);
        fields.note(name.as_str().as_bytes(), &value);
        match judged {
            Judged::Forward => {
                headers.append(name, value_parsed_by_httparse(value));
            }
            Judged::Trailers => {
                headers.append(name, HeaderValue::from_static("trailers"));
            }
            Judged::Drop => {}
        }
    }
    let decided = framing(&fields, status, version, method, interim_framed)?;
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    Ok(Some(ResponseHead {
        parts,
        framing: decided.framing,
        keep_alive: decided.keep_alive,
        bodiless_framed: decided.bodiless_framed,
    }))
}

/// A final response head without its fields ([`response_head_text`] hands them to the caller
/// as slices of the buffer instead of making a header map).
#[derive(Debug, Clone, Copy)]
pub struct BareResponseHead {
    /// The final response's status.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// How the body follows.
    pub framing: BodyFraming,
    /// As [`ResponseHead::keep_alive`].
    pub keep_alive: bool,
    /// As [`ResponseHead::bodiless_framed`].
    pub bodiless_framed: bool,
    /// The length `Content-Length` declared when it frames the body (or would have: a `HEAD`
    /// response's, a 304's).
    pub length: Option<u64>,
}

/// Parses a final response head from the front of `buf` as [`response_head`] does, without
/// making a header map: `read` gets the status and the fields while they are slices of `buf`
/// (the proxy's fast path writes the client's head from them), and the head is consumed after.
pub fn response_head_text<R>(
    buf: &mut BytesMut,
    method: &Method,
    read: impl FnOnce(StatusCode, &[httparse::Header<'_>]) -> R,
) -> io::Result<Option<(BareResponseHead, R)>> {
    let parsed = final_head(buf, |status, version, parsed, interim_framed| {
        let mut fields = FramingFields::default();
        for f in parsed {
            fields.note(f.name.as_bytes(), f.value);
        }
        let decided = framing(&fields, status, version, method, interim_framed)?;
        let head = BareResponseHead {
            status,
            version,
            framing: decided.framing,
            keep_alive: decided.keep_alive,
            bodiless_framed: decided.bodiless_framed,
            length: fields.length.filter(|_| !fields.transfer_encoding),
        };
        Ok((head, read(status, parsed)))
    })?;
    Ok(parsed.map(|found| {
        buf.advance(found.skipped + found.len);
        found.read
    }))
}

/// A final head found by [`final_head`].
struct Found<R> {
    /// What `read` made of it.
    read: R,
    /// The length of the interim responses before it.
    skipped: usize,
    /// Its own length.
    len: usize,
}

/// Finds the final response head at the front of `buf`, past any interim 1xx responses, and
/// hands its status, version and fields to `read` while they are slices of `buf`, with whether
/// an interim response declared a body. `buf` is left as it was, so a head still incomplete is
/// parsed again from the start next time.
///
/// The interim responses count towards [`MAX_HEAD`] with the head: they stay in `buf` until
/// the final head is complete, so an upstream sending them without end is refused rather than
/// buffered. The limit holds for the bytes as a whole, wherever the reads split them.
fn final_head<R>(
    buf: &BytesMut,
    read: impl FnOnce(StatusCode, Version, &[httparse::Header<'_>], bool) -> io::Result<R>,
) -> io::Result<Option<Found<R>>> {
    let mut skipped = 0;
    let mut interim_framed = false;
    loop {
        let rest = &buf[skipped..];
        // Left uninitialised: the parser writes the fields it finds, so filling every slot
        // with an empty field first would be stores wasted on every response.
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
        let mut parsed = httparse::Response::new(&mut []);
        let config = httparse::ParserConfig::default();
        let len = match config.parse_response_with_uninit_headers(&mut parsed, rest, &mut fields) {
            Ok(httparse::Status::Complete(len)) if skipped + len > MAX_HEAD => {
                return Err(invalid("response head too large"));
            }
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(invalid("response head too large"));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(invalid("too many response header fields"));
            }
            Err(_) => return Err(invalid("malformed response head")),
        };
        let code = parsed.code.unwrap_or(0);
        let status = StatusCode::from_u16(code).map_err(|_| invalid("invalid status code"))?;
        if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
            // 100 Continue, 103 Early Hints: the final response follows on the same connection.
            let mut fields = FramingFields::default();
            for f in &*parsed.headers {
                fields.note(f.name.as_bytes(), f.value);
            }
            interim_framed |= fields.declares_body();
            skipped += len;
            continue;
        }
        let version = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        return Ok(Some(Found {
            read: read(status, version, parsed.headers, interim_framed)?,
            skipped,
            len,
        }));
    }
}

/// A field value as httparse delimited it.
#[allow(
    unsafe_code,
    reason = "the checked constructor re-reads every byte httparse has just checked"
)]
fn value_parsed_by_httparse(bytes: Bytes) -> HeaderValue {
    // SAFETY: httparse accepts in a value exactly the bytes `HeaderValue` allows (HTAB, SP,
    // visible ASCII and 0x80-0xFF; not DEL or other controls), and it trims the whitespace
    // around it; obsolete line folding is refused (the parser's default), so no CR or LF can
    // be inside. hyper builds its own values the same way.
    unsafe { HeaderValue::from_maybe_shared_unchecked(bytes) }
}

/// What the fields that frame the body said, noted while the map is built so that deciding
/// the framing needs no lookups in it.
#[derive(Default)]
struct FramingFields {
    /// Some `Transfer-Encoding` field was present.
    transfer_encoding: bool,
    /// The last coding named across the `Transfer-Encoding` fields is `chunked`.
    chunked_last: bool,
    /// Some `Content-Length` field was present.
    content_length: bool,
    /// The length the `Content-Length` fields agree on.
    length: Option<u64>,
    /// The first thing wrong with the `Content-Length` fields; it fails the response only if
    /// no `Transfer-Encoding` overrides them.
    length_error: Option<&'static str>,
    /// `Connection` named `close`.
    close: bool,
    /// `Connection` named `keep-alive`.
    keep_alive: bool,
}

impl FramingFields {
    /// A body is declared: `Transfer-Encoding`, or a `Content-Length` other than a plain 0.
    fn declares_body(&self) -> bool {
        self.transfer_encoding || (self.content_length && self.length != Some(0))
    }

    /// Takes one field into account, in the order the fields came (`name` in any case).
    fn note(&mut self, name: &[u8], value: &[u8]) {
        let items = || value.split(|&b| b == b',').map(<[u8]>::trim_ascii);
        // By length first: most fields are none of the three.
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        match name.len() {
            14 if is(b"content-length") => {
                self.content_length = true;
                for item in items() {
                    match parse_decimal(item) {
                        None => _ = self.length_error.get_or_insert("invalid Content-Length"),
                        Some(n) if self.length.is_some_and(|l| l != n) => {
                            _ = self
                                .length_error
                                .get_or_insert("conflicting Content-Length values");
                        }
                        Some(n) => self.length = Some(n),
                    }
                }
            }
            17 if is(b"transfer-encoding") => {
                self.transfer_encoding = true;
                if let Some(last) = items().rfind(|c| !c.is_empty()) {
                    self.chunked_last = last.eq_ignore_ascii_case(b"chunked");
                }
            }
            10 if is(b"connection") => {
                for token in items() {
                    self.close |= token.eq_ignore_ascii_case(b"close");
                    self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
            _ => {}
        }
    }
}

/// What [`framing`] decided of a final head.
struct Decided {
    framing: BodyFraming,
    keep_alive: bool,
    bodiless_framed: bool,
}

/// The body's framing and whether the connection may carry another request ([`body_framing`]),
/// less the trust a status without a body loses when its head declares one: RFC 9112 §6.1 and
/// §6.2 forbid `Transfer-Encoding` and `Content-Length` on a 1xx or a 204 (a zero length is let
/// pass: it declares no body), so an upstream that sends them, on the final head or an interim
/// one before it, may write bytes after the head that the next request would read as its
/// answer. A `HEAD`'s or a 304's fields describe the `GET` representation and are allowed.
fn framing(
    fields: &FramingFields,
    status: StatusCode,
    version: Version,
    method: &Method,
    interim_framed: bool,
) -> io::Result<Decided> {
    let (framing, keep_alive) = body_framing(fields, status, version, method)?;
    let must_be_bare = status.is_informational() || status == StatusCode::NO_CONTENT;
    let refused = interim_framed || (must_be_bare && fields.declares_body());
    Ok(Decided {
        framing,
        keep_alive: keep_alive && !refused,
        bodiless_framed: keep_alive && refused,
    })
}

/// RFC 9112 §6.3, in its order, and whether the connection stays open (§9.3): HTTP/1.1 stays
/// open unless `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`.
fn body_framing(
    fields: &FramingFields,
    status: StatusCode,
    version: Version,
    method: &Method,
) -> io::Result<(BodyFraming, bool)> {
    let mut keep_alive = if version == Version::HTTP_11 {
        !fields.close
    } else {
        fields.keep_alive
    };
    if status == StatusCode::SWITCHING_PROTOCOLS {
        // What follows is another protocol (the proxy's own client never asks for one, so the
        // switch is refused), never a next response: the connection is not used again.
        return Ok((BodyFraming::Empty, false));
    }
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((BodyFraming::Empty, keep_alive));
    }
    if fields.transfer_encoding {
        // Transfer-Encoding overrides Content-Length; a message with both may be an attempt
        // to smuggle, so the connection is not trusted for another request.
        if fields.content_length {
            keep_alive = false;
        }
        if version == Version::HTTP_11 && fields.chunked_last {
            return Ok((BodyFraming::Chunked, keep_alive));
        }
        return Ok((BodyFraming::Close, false));
    }
    if let Some(what) = fields.length_error {
        // Built here, not where the fault was noted: the error is an allocation.
        return Err(invalid(what));
    }
    Ok(match fields.length {
        Some(0) => (BodyFraming::Empty, keep_alive),
        Some(n) => (BodyFraming::Length(n), keep_alive),
        None => (BodyFraming::Close, false),
    })
}

/// Digits only (no sign, no spaces), at most 19 of them so the value fits.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Where a chunked body's decoding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunked {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk's data, with this many bytes left.
    Data(u64),
    /// After a chunk's data, expecting its CRLF.
    DataEnd,
    /// After the last chunk: the trailer section (possibly empty).
    Trailers,
    /// The body is complete.
    Done,
}

/// One step of chunked decoding.
#[derive(Debug)]
pub enum Step {
    /// Data, or the trailers (less the fields no trailer carries), which end the body.
    Frame(Frame<Bytes>),
    /// The buffer holds no complete next element.
    NeedMore,
    /// The body ended (after its trailers, if any were sent as a frame before).
    End,
}

impl Chunked {
    /// Decodes the next frame from `buf`.
    pub fn step(&mut self, buf: &mut BytesMut) -> io::Result<Step> {
        loop {
            match *self {
                Chunked::Size => {
                    let Some(eol) = memchr::memmem::find(buf, b"\r\n") else {
                        // The shortest the line can still turn out to be: a final CR may be
                        // the start of its CRLF.
                        let least = buf.len() - usize::from(buf.ends_with(b"\r"));
                        if least > MAX_CHUNK_LINE {
                            return Err(invalid("chunk-size line too long"));
                        }
                        return Ok(Step::NeedMore);
                    };
                    let size = chunk_size(&buf[..eol])?;
                    buf.advance(eol + 2);
                    *self = if size == 0 {
                        Chunked::Trailers
                    } else {
                        Chunked::Data(size)
                    };
                }
                Chunked::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Step::NeedMore);
                    }
                    let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let data = buf.split_to(n).freeze();
                    let left = left - n as u64;
                    *self = if left == 0 {
                        Chunked::DataEnd
                    } else {
                        Chunked::Data(left)
                    };
                    return Ok(Step::Frame(Frame::data(data)));
                }
                Chunked::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Step::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(invalid("chunk data not followed by CRLF"));
                    }
                    buf.advance(2);
                    *self = Chunked::Size;
                }
                Chunked::Trailers => {
                    if buf.starts_with(b"\r\n") {
                        buf.advance(2);
                        *self = Chunked::Done;
                        return Ok(Step::End);
                    }
                    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
                    let (len, trailers) = match httparse::parse_headers(buf, &mut fields) {
                        Ok(httparse::Status::Complete((len, _))) if len > MAX_HEAD => {
                            return Err(invalid("trailer section too large"));
                        }
                        Ok(httparse::Status::Complete((len, parsed))) => {
                            let mut map = HeaderMap::with_capacity(parsed.len());
                            for f in parsed {
                                if crate::trailers::is_forbidden(f.name.as_bytes()) {
                                    continue;
                                }
                                let name = crate::fields::name(f.name.as_bytes())
                                    .map_err(|_| invalid("invalid trailer name"))?;
                                let value = HeaderValue::from_bytes(f.value)
                                    .map_err(|_| invalid("invalid trailer value"))?;
                                map.append(name, value);
                            }
                            (len, map)
                        }
                        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                            return Err(invalid("trailer section too large"));
                        }
                        Ok(httparse::Status::Partial) => return Ok(Step::NeedMore),
                        Err(_) => return Err(invalid("malformed trailer section")),
                    };
                    buf.advance(len);
                    *self = Chunked::Done;
                    return Ok(Step::Frame(Frame::trailers(trailers)));
                }
                Chunked::Done => return Ok(Step::End),
            }
        }
    }

    /// The next step of a body being read: [`Chunked::step`], then, after a frame,
    /// [`Chunked::settle`], so a body whose end is already buffered reports it with its last
    /// frame. A fault `settle` finds is left where it is (it consumes nothing it cannot
    /// decode): the next call meets it again and reports it, after this frame's data went out.
    pub fn next(&mut self, buf: &mut BytesMut) -> io::Result<Step> {
        let step = self.step(buf)?;
        if matches!(step, Step::Frame(_)) {
            // A fault here is reported by the next call.
            let _ = self.settle(buf);
        }
        Ok(step)
    }

    /// Consumes what needs no frame to be produced (a chunk's CRLF, the last chunk, an empty
    /// trailer section), so that a body whose end is already buffered reports it at once.
    pub fn settle(&mut self, buf: &mut BytesMut) -> io::Result<()> {
        if *self == Chunked::DataEnd {
            if buf.len() < 2 {
                return Ok(());
            }
            if &buf[..2] != b"\r\n" {
                return Err(invalid("chunk data not followed by CRLF"));
            }
            buf.advance(2);
            *self = Chunked::Size;
        }
        if *self == Chunked::Size {
            let Some(eol) = memchr::memmem::find(buf, b"\r\n") else {
                return Ok(());
            };
            if chunk_size(&buf[..eol])? != 0 {
                // A data chunk: the next `step` produces it.
                return Ok(());
            }
            buf.advance(eol + 2);
            *self = Chunked::Trailers;
        }
        if *self == Chunked::Trailers && buf.starts_with(b"\r\n") {
            buf.advance(2);
            *self = Chunked::Done;
        }
        Ok(())
    }
}

/// The hex size of a chunk-size line, extensions (`;name=value`) ignored.
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    if line.len() > MAX_CHUNK_LINE {
        return Err(invalid("chunk-size line too long"));
    }
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if digits == 0 || digits > 16 {
        return Err(invalid("invalid chunk size"));
    }
    let rest = line[digits..].trim_ascii_start();
    if !(rest.is_empty() || rest.starts_with(b";")) || rest.contains(&b'\n') {
        return Err(invalid("invalid chunk size"));
    }
    Ok(line[..digits].iter().fold(0u64, |n, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => d - b'A' + 10,
        };
        (n << 4) | u64::from(v)
    }))
}

#[cfg(test)]
mod tests;
