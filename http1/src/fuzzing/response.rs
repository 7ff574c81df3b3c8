//! Fuzz checks of the proxy's HTTP/1.1 client reading an upstream's answer: the response head
//! (`httparse` underneath, the framing rules of [`crate::decode`] on top) and the chunked body decoder.
//! Both read from a buffer that grows with each read, so their verdicts must not depend on
//! where the reads split the bytes.

use bytes::BytesMut;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Version, header};
use http_body::Frame;

use crate::decode::{BodyFraming, Chunked, Step, response_head as head_map, response_head_text};
use crate::hop_by_hop::{EndToEnd, Judged};

/// A response head as the decoder gave it, in a form both of its entry points can be compared in.
#[derive(Debug, PartialEq, Eq)]
struct ComparableHead {
    status: StatusCode,
    version: Version,
    framing: BodyFraming,
    keep_alive: bool,
    /// Bytes consumed: the head and any interim responses before it.
    consumed: usize,
    /// `(lower-case name, value)`, in the order received, stably sorted by name.
    fields: Vec<(String, Vec<u8>)>,
}

#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    NeedMore,
    Failed,
    Head(ComparableHead),
}

fn sorted(mut fields: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
}

/// `wire` through [`head_map`], with the header map it built.
fn parse_map(wire: &[u8], method: &Method) -> (Parsed, Option<HeaderMap>) {
    let mut buf = BytesMut::from(wire);
    match head_map(&mut buf, method, 0) {
        Err(_) => (Parsed::Failed, None),
        Ok(None) => {
            assert_eq!(buf.len(), wire.len(), "an incomplete head consumed bytes");
            (Parsed::NeedMore, None)
        }
        Ok(Some(head)) => {
            let parts = head.parts;
            let mut fields = Vec::new();
            for name in parts.headers.keys() {
                for value in parts.headers.get_all(name) {
                    fields.push((name.as_str().to_owned(), value.as_bytes().to_vec()));
                }
            }
            let parsed = ComparableHead {
                status: parts.status,
                version: parts.version,
                framing: head.framing,
                keep_alive: head.keep_alive,
                consumed: wire.len() - buf.len(),
                fields: sorted(fields),
            };
            assert_eq!(&buf[..], &wire[parsed.consumed..], "the body bytes moved");
            (Parsed::Head(parsed), Some(parts.headers))
        }
    }
}

/// `wire` through [`response_head_text`].
fn parse_text(wire: &[u8], method: &Method) -> Parsed {
    let mut buf = BytesMut::from(wire);
    // The header map holds the end-to-end fields, by the rule the raw fields' readers apply.
    let read = |status: StatusCode, fields: &[httparse::Header<'_>]| {
        let mut end_to_end = EndToEnd::of(fields);
        let fields = fields
            .iter()
            .filter_map(|f| match end_to_end.judge(f) {
                Judged::Forward => Some((f.name.to_ascii_lowercase(), f.value.to_vec())),
                Judged::Trailers => Some(("te".to_owned(), b"trailers".to_vec())),
                Judged::Drop => None,
            })
            .collect::<Vec<_>>();
        (status, fields)
    };
    match response_head_text(&mut buf, method, read) {
        Err(_) => Parsed::Failed,
        Ok(None) => Parsed::NeedMore,
        Ok(Some((head, (status, fields)))) => {
            assert_eq!(status, head.status);
            if let BodyFraming::Length(n) = head.framing {
                assert_eq!(head.length, Some(n), "the length that frames the body");
            }
            Parsed::Head(ComparableHead {
                status: head.status,
                version: head.version,
                framing: head.framing,
                keep_alive: head.keep_alive,
                consumed: wire.len() - buf.len(),
                fields: sorted(fields),
            })
        }
    }
}

/// The comma-separated items of every `name` field, trimmed.
fn items(map: &HeaderMap, name: header::HeaderName) -> impl Iterator<Item = &[u8]> {
    map.get_all(name)
        .into_iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
}

/// Whether the fields say a body follows: any `Transfer-Encoding`, or a `Content-Length`
/// other than one agreed `0`.
fn declares_body(map: &HeaderMap) -> bool {
    map.contains_key(header::TRANSFER_ENCODING)
        || (map.contains_key(header::CONTENT_LENGTH)
            && !items(map, header::CONTENT_LENGTH).all(|item| item == b"0"))
}

/// Each head of an answer in turn, the interim ones (1xx but 101) and then the final one, with
/// every field, hop-by-hop ones included; it stops at the first head not complete.
fn heads(wire: &[u8]) -> Vec<(u16, HeaderMap)> {
    let mut heads = Vec::new();
    let mut at = 0;
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 128];
        let mut res = httparse::Response::new(&mut fields);
        let Ok(httparse::Status::Complete(len)) = res.parse(&wire[at..]) else {
            return heads;
        };
        let code = res.code.unwrap_or(0);
        let mut map = HeaderMap::new();
        for f in res.headers.iter() {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(f.name.as_bytes()),
                HeaderValue::from_bytes(f.value),
            ) {
                map.append(name, value);
            }
        }
        heads.push((code, map));
        if !(100..200).contains(&code) || code == 101 {
            return heads;
        }
        at += len;
    }
}

/// Whether an interim (1xx but 101) answer before the final one declared a body.
fn interim_declared_body(heads: &[(u16, HeaderMap)]) -> bool {
    heads
        .iter()
        .any(|(code, map)| (100..200).contains(code) && *code != 101 && declares_body(map))
}

/// RFC 9112 §6.3 and §9.3 read plainly off the header map: the framing and whether the
/// connection may carry another request, or `None` when the response must fail. Lengths are
/// held to 19 digits (no length a body can have needs more).
fn expected_framing(
    method: &Method,
    status: StatusCode,
    version: Version,
    map: &HeaderMap,
) -> Option<(BodyFraming, bool)> {
    let has = |token: &[u8]| items(map, header::CONNECTION).any(|t| t.eq_ignore_ascii_case(token));
    let mut keep_alive = if version == Version::HTTP_11 {
        !has(b"close")
    } else {
        has(b"keep-alive")
    };
    if status == StatusCode::SWITCHING_PROTOCOLS {
        // Another protocol follows, never a next response.
        return Some((BodyFraming::Empty, false));
    }
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Some((BodyFraming::Empty, keep_alive));
    }
    if map.contains_key(header::TRANSFER_ENCODING) {
        keep_alive &= !map.contains_key(header::CONTENT_LENGTH);
        let codings: Vec<&[u8]> = items(map, header::TRANSFER_ENCODING)
            .filter(|c| !c.is_empty())
            .collect();
        let chunked = codings
            .last()
            .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
        return Some(if chunked && version == Version::HTTP_11 {
            (BodyFraming::Chunked, keep_alive)
        } else {
            (BodyFraming::Close, false)
        });
    }
    let mut length = None;
    for item in items(map, header::CONTENT_LENGTH) {
        if item.is_empty() || item.len() > 19 || !item.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n: u64 = std::str::from_utf8(item).ok()?.parse().ok()?;
        if length.is_some_and(|l| l != n) {
            return None;
        }
        length = Some(n);
    }
    Some(match length {
        None => (BodyFraming::Close, false),
        Some(0) => (BodyFraming::Empty, keep_alive),
        Some(n) => (BodyFraming::Length(n), keep_alive),
    })
}

/// The method the response answers, from a fuzzed byte.
fn method(byte: u8) -> Method {
    match byte & 3 {
        0 => Method::GET,
        1 => Method::HEAD,
        2 => Method::POST,
        _ => Method::DELETE,
    }
}

/// Input: a byte choosing the request's method (bits 0-1) and a split point (the rest), then
/// the upstream's bytes. Both entry points agree; every value was a valid `HeaderValue` (they
/// are made without a second check); the framing is RFC 9112's, read plainly off the header map;
/// a prefix of the bytes asks for more, or fails where the whole fails, and a head complete in a
/// prefix is the whole's.
pub fn response_head(data: &[u8]) {
    let [control, wire @ ..] = data else {
        return;
    };
    let method = method(*control);
    let (whole, map) = parse_map(wire, &method);
    assert_eq!(
        parse_text(wire, &method),
        whole,
        "the two entry points differ"
    );
    if let (Parsed::Head(head), Some(map)) = (&whole, &map) {
        for value in map.values() {
            assert!(
                HeaderValue::from_bytes(value.as_bytes()).is_ok(),
                "a value HeaderValue refuses: {value:?}"
            );
        }
        for (name, value) in map {
            let kept_te = *name == header::TE && value == "trailers";
            assert!(
                crate::hop_by_hop::bit(name) == 0 || kept_te,
                "a hop-by-hop field in the map: {name}: {value:?}"
            );
        }
        let heads = heads(wire);
        let all = heads.last().map(|(_, map)| map.clone()).unwrap_or_default();
        let expected = expected_framing(&method, head.status, head.version, &all).map(
            |(framing, keep_alive)| {
                // A 1xx or 204 that declares a body, or an interim answer that did, leaves a
                // connection no later request may use (response-queue poisoning).
                let bare = head.status.is_informational() || head.status == StatusCode::NO_CONTENT;
                let refused = (bare && declares_body(&all)) || interim_declared_body(&heads);
                (framing, keep_alive && !refused)
            },
        );
        assert_eq!(
            expected,
            Some((head.framing, head.keep_alive)),
            "framing of a {} to {method}",
            head.status
        );
    }
    let split = usize::from(*control >> 2) * wire.len() / 63;
    let mut prefixes = vec![split.min(wire.len())];
    if let Parsed::Head(head) = &whole {
        prefixes.extend([head.consumed - 1, head.consumed]);
    }
    for k in prefixes {
        let (part, _) = parse_map(&wire[..k], &method);
        match (&whole, &part) {
            (_, Parsed::NeedMore) => {
                if let Parsed::Head(head) = &whole {
                    assert!(k < head.consumed, "a complete head asks for more at {k}");
                }
            }
            (Parsed::Failed, Parsed::Failed) => {}
            (Parsed::Head(_), Parsed::Head(_)) => assert_eq!(part, whole, "prefix of {k}"),
            _ => panic!("{k} bytes gave {part:?}, all of them {whole:?}"),
        }
    }
}

/// What the body decoder made of an upstream's chunked body.
#[derive(Debug, PartialEq, Eq)]
struct Body {
    data: Vec<u8>,
    /// `(lower-case name, value)` of the trailers, when a trailer frame came.
    trailers: Option<Vec<(String, Vec<u8>)>>,
    end: End,
}

#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The body ended; these bytes followed it.
    Done(Vec<u8>),
    /// All the bytes were read and the body goes on.
    Truncated,
    Failed,
}

/// Decodes `wire` as the response body does ([`Chunked::next`] over a buffer that grows by
/// `piece` bytes whenever the decoder needs more).
fn decode(wire: &[u8], piece: usize) -> Body {
    let mut state = Chunked::Size;
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut body = Body {
        data: Vec::new(),
        trailers: None,
        end: End::Truncated,
    };
    let rest = |buf: &BytesMut, fed: usize| [&buf[..], &wire[fed..]].concat();
    loop {
        match state.next(&mut buf) {
            Err(_) => {
                body.end = End::Failed;
                return body;
            }
            Ok(Step::NeedMore) if fed == wire.len() => return body,
            Ok(Step::NeedMore) => {
                let end = (fed + piece).min(wire.len());
                buf.extend_from_slice(&wire[fed..end]);
                fed = end;
            }
            Ok(Step::End) => {
                body.end = End::Done(rest(&buf, fed));
                return body;
            }
            Ok(Step::Frame(frame)) => {
                assert!(body.trailers.is_none(), "a frame after the trailers");
                frame_into(frame, &mut body);
                if state == Chunked::Done {
                    body.end = End::Done(rest(&buf, fed));
                    return body;
                }
            }
        }
    }
}

fn frame_into(frame: Frame<bytes::Bytes>, body: &mut Body) {
    match frame.into_data() {
        Ok(data) => {
            assert!(!data.is_empty(), "an empty data frame");
            body.data.extend_from_slice(&data);
        }
        Err(frame) => {
            let trailers = frame.into_trailers().expect("data or trailers");
            let mut fields = Vec::new();
            for name in trailers.keys() {
                for value in trailers.get_all(name) {
                    fields.push((name.as_str().to_owned(), value.as_bytes().to_vec()));
                }
            }
            body.trailers = Some(fields);
        }
    }
}

/// Input: a byte setting the read size (1 to 256 bytes), then the upstream's body bytes. The
/// data, trailers and end are the same in one read and in reads of that size; the data is never
/// longer than the bytes it came from.
pub fn response_chunked(data: &[u8]) {
    let [size, wire @ ..] = data else {
        return;
    };
    let whole = decode(wire, wire.len().max(1));
    assert!(whole.data.len() <= wire.len(), "the data grew");
    if let End::Done(rest) = &whole.end {
        assert!(wire.ends_with(rest));
    }
    let pieces = decode(wire, 1 + usize::from(*size));
    assert_eq!(
        pieces,
        whole,
        "in reads of {} bytes",
        1 + usize::from(*size)
    );
}
