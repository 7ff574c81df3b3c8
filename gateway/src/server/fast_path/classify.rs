//! Reads a parsed request head for the fast path: whether it takes the request at all
//! ([`classify`]; the rest is hyper's), what its answers read of it ([`Plain`]), and what the
//! access log records of it ([`facts`]).

use gateway_http1::fields::field_text;
use http::Method;

use crate::router::strip_port;
use crate::server::service::RequestFacts;
use crate::static_files::Revalidation;
use crate::telemetry::{RequestText, first_line};

/// The largest request target hyper's URI parser takes.
const MAX_TARGET: usize = u16::MAX as usize - 1;

/// A request the fast path may answer, as read from its head.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plain<'b> {
    pub(super) head: bool,
    /// Only the service can answer it ([`general`]): a method other than `GET` and `HEAD`, or a
    /// field the prepared answers read once (`Host`, `Accept-Encoding`, `Range` and the
    /// revalidation's) given twice.
    pub(super) general: bool,
    /// The request target (path and query).
    pub(super) target: &'b str,
    /// The target's path, without the query.
    pub(super) path: &'b str,
    pub(super) host: Option<&'b [u8]>,
    pub(super) accept_encoding: Option<&'b [u8]>,
    /// Every header line, for the access log (read only when it is on, so that a request
    /// does not pay for what it may not need).
    pub(super) headers: &'b [httparse::Header<'b>],
    /// A precondition other than the revalidation's (`If-Match`, `If-Unmodified-Since`,
    /// `If-Range`): the general path answers it.
    pub(super) conditional: bool,
    /// One `If-None-Match` and one `If-Modified-Since` at most: a cached or kept file's 304 is
    /// answered here.
    pub(super) revalidation: Revalidation<'b>,
    /// The one `Range` value: a cached file or a large file kept open answers it here (its 206).
    pub(super) range: Option<&'b [u8]>,
    /// `Connection: close`: the connection ends with this answer.
    pub(super) close: bool,
}

/// Request-target bytes the fast path takes: visible ASCII except the characters hyper's URI
/// parser refuses or treats specially (`#` starts a fragment) and a few it takes that no
/// well-behaved client sends unencoded. A target with any other byte goes to hyper.
const fn target_byte_table() -> [bool; 256] {
    let mut t = [false; 256];
    let mut b = 0x21;
    while b < 0x7f {
        t[b] = !matches!(
            b as u8,
            b'"' | b'#' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}'
        );
        b += 1;
    }
    t
}

static TARGET_BYTES: [bool; 256] = target_byte_table();

/// The length of `target`'s path (up to its query) when every byte of it is one the fast path
/// takes; `None` otherwise.
fn plain_target(target: &str) -> Option<usize> {
    let bytes = target.as_bytes();
    if bytes.first() != Some(&b'/') || bytes.len() > MAX_TARGET {
        return None;
    }
    let mut path = bytes.len();
    for (i, &b) in bytes.iter().enumerate() {
        if !TARGET_BYTES[b as usize] {
            return None;
        }
        if b == b'?' && path == bytes.len() {
            path = i;
        }
    }
    Some(path)
}

/// Reads a parsed request's line and headers; `None` when hyper should have it.
pub(super) fn classify<'a, 'b: 'a>(req: &'a httparse::Request<'_, 'b>) -> Option<Plain<'a>> {
    if req.version != Some(1) {
        return None;
    }
    let (head, general) = match req.method? {
        "GET" => (false, false),
        "HEAD" => (true, false),
        _ => (false, true),
    };
    let target = req.path?;
    // The path ends at an ASCII byte, so slicing there is on a character boundary.
    let path = &target[..plain_target(target)?];
    let mut plain = Plain {
        head,
        general,
        target,
        path,
        headers: req.headers,
        ..Plain::default()
    };
    let mut connection_lines = 0;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        // By length first: one comparison for most headers a client sends.
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        match name.len() {
            // A second `Host` or `Accept-Encoding` is the service's; any `Connection` but
            // `keep-alive` or `close` is hyper's.
            4 if is(b"host") && plain.host.replace(h.value).is_some() => plain.general = true,
            15 if is(b"accept-encoding") && plain.accept_encoding.replace(h.value).is_some() => {
                plain.general = true;
            }
            10 if is(b"connection") => {
                connection_lines += 1;
                if h.value.eq_ignore_ascii_case(b"close") {
                    plain.close = true;
                } else if !h.value.eq_ignore_ascii_case(b"keep-alive") {
                    return None;
                }
            }
            // A body, or a request hyper treats specially.
            14 if is(b"content-length") => return None,
            17 if is(b"transfer-encoding") => return None,
            6 if is(b"expect") => return None,
            7 if is(b"upgrade") => return None,
            // A second `Range` is the service's (which reads the first).
            5 if is(b"range") && plain.range.replace(h.value).is_some() => plain.general = true,
            8 if is(b"if-match") || is(b"if-range") => plain.conditional = true,
            // A second line of either is the service's (which reads them all).
            13 if is(b"if-none-match")
                && plain.revalidation.if_none_match.replace(h.value).is_some() =>
            {
                plain.general = true;
            }
            17 if is(b"if-modified-since")
                && plain
                    .revalidation
                    .if_modified_since
                    .replace(h.value)
                    .is_some() =>
            {
                plain.general = true;
            }
            19 if is(b"if-unmodified-since") => plain.conditional = true,
            _ => {}
        }
    }
    // hyper reads `Connection` lines in order and a later `keep-alive` can undo a `close`:
    // with a `close` among several, the connection is hyper's to keep or end.
    if plain.close && connection_lines > 1 {
        return None;
    }
    Some(plain)
}

/// The host a route's `host` condition sees: the `Host` header without its port, `""` when
/// absent or not visible ASCII (as `router::request_host` reads it from a header map).
pub(super) fn host_of(value: Option<&[u8]>) -> &str {
    value.and_then(field_text).map_or("", strip_port)
}

/// What the access log records of a request answered here: what the general path copies from
/// hyper's request (`service::RequestFacts::of`), read from the raw head.
pub(super) fn facts(req: &Plain<'_>) -> RequestFacts {
    // The first of each, as a header map's `get` reads it.
    let first = |name| first_line(req.headers, name).unwrap_or_default();
    RequestFacts {
        time: std::time::SystemTime::now(),
        method: if req.head { Method::HEAD } else { Method::GET },
        text: RequestText::new(
            req.target,
            host_of(req.host),
            first("user-agent"),
            first("referer"),
        ),
        upstream: None,
        notes: None,
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;
    use crate::server::fast_path::MAX_HEADERS;

    fn parse(head: &[u8], f: impl FnOnce(Option<Plain<'_>>)) {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        assert!(matches!(
            req.parse(head),
            Ok(httparse::Status::Complete(n)) if n == head.len()
        ));
        f(classify(&req));
    }

    #[test]
    fn plain_requests_are_read_and_the_rest_left_to_hyper() {
        parse(
            b"GET /a/b?x=1 HTTP/1.1\r\nhOsT: example.com:8080\r\nAccept-Encoding: gzip\r\nConnection: Keep-Alive\r\nIf-None-Match: \"x\"\r\n\r\n",
            |p| {
                let p = p.expect("plain");
                assert_eq!((p.head, p.target, p.path), (false, "/a/b?x=1", "/a/b"));
                assert_eq!(p.host, Some(&b"example.com:8080"[..]));
                assert_eq!(p.accept_encoding, Some(&b"gzip"[..]));
                assert_eq!(p.revalidation.if_none_match, Some(&b"\"x\""[..]));
                assert!(!p.conditional);
            },
        );
        parse(b"HEAD / HTTP/1.1\r\n\r\n", |p| {
            let p = p.expect("plain");
            assert!(p.head && !p.conditional && p.host.is_none() && !p.close);
        });
        for close in ["Connection: close", "connection: Close"] {
            let head = format!("GET / HTTP/1.1\r\nHost: a\r\n{close}\r\n\r\n");
            parse(head.as_bytes(), |p| assert!(p.expect("plain").close));
        }
        parse(
            b"GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: keep-alive\r\n\r\n",
            |p| assert!(!p.expect("plain").close),
        );
        for head in [
            &b"GET / HTTP/1.0\r\n\r\n"[..],
            b"GET http://a/ HTTP/1.1\r\n\r\n",
            b"GET * HTTP/1.1\r\n\r\n",
            b"GET /a{b} HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            b"GET / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: close, x\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\n\r\n",
        ] {
            parse(head, |p| {
                assert!(p.is_none(), "{:?}", String::from_utf8_lossy(head));
            });
        }
        // Only the service answers these: another method, or a field read once given twice.
        for head in [
            &b"POST / HTTP/1.1\r\n\r\n"[..],
            b"DELETE /a HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nAccept-Encoding: gzip\r\nAccept-Encoding: br\r\n\r\n",
            b"GET / HTTP/1.1\r\nRange: bytes=0-1\r\nRange: bytes=2-3\r\n\r\n",
            b"GET / HTTP/1.1\r\nIf-None-Match: \"a\"\r\nif-none-match: \"b\"\r\n\r\n",
            b"GET / HTTP/1.1\r\nIf-Modified-Since: x\r\nIf-Modified-Since: y\r\n\r\n",
        ] {
            parse(head, |p| {
                let p = p.unwrap_or_else(|| panic!("{:?}", String::from_utf8_lossy(head)));
                assert!(p.general, "{:?}", String::from_utf8_lossy(head));
            });
        }
        // A revalidation's two headers are read for a cached file's 304.
        parse(
            b"HEAD / HTTP/1.1\r\nif-modified-since: d\r\nIF-NONE-MATCH: *\r\n\r\n",
            |p| {
                let p = p.expect("plain");
                let r = p.revalidation;
                assert_eq!(
                    (r.if_none_match, r.if_modified_since),
                    (Some(&b"*"[..]), Some(&b"d"[..]))
                );
                assert!(!p.conditional);
            },
        );
        // A range alone is read for the fast path's 206; with `If-Range` it is a precondition's.
        parse(b"GET / HTTP/1.1\r\nrange: bytes=0-1\r\n\r\n", |p| {
            let p = p.expect("plain");
            assert_eq!((p.range, p.conditional), (Some(&b"bytes=0-1"[..]), false));
        });
        for conditional in [
            "Range: bytes=0-1\r\nIf-Range: \"x\"",
            "If-Match: *",
            "if-range: x",
            "If-Unmodified-Since: x",
        ] {
            let head = format!("GET / HTTP/1.1\r\n{conditional}\r\n\r\n");
            parse(head.as_bytes(), |p| assert!(p.expect("plain").conditional));
        }
    }

    #[test]
    fn the_access_log_facts_are_the_first_of_each_header_and_the_host_without_its_port() {
        parse(
            b"HEAD /a?b HTTP/1.1\r\nuser-agent: one\r\nHost: h:81\r\nUser-Agent: two\r\nREFERER: r\xff\r\n\r\n",
            |p| {
                let f = facts(&p.expect("plain"));
                assert_eq!(f.method, Method::HEAD);
                let t = &f.text;
                assert_eq!(
                    (t.target(), t.host(), t.user_agent(), t.referer()),
                    ("/a?b", "h", "one", "r\u{fffd}")
                );
            },
        );
        parse(b"GET / HTTP/1.1\r\n\r\n", |p| {
            let f = facts(&p.expect("plain"));
            let t = &f.text;
            assert_eq!((t.host(), t.user_agent(), t.referer()), ("", "", ""));
        });
    }

    #[test]
    fn every_target_taken_is_one_hyper_takes_with_the_same_path() {
        // Each byte alone and between others, in the path and in the query.
        for b in 0..=255u8 {
            let byte = [b];
            let Ok(text) = std::str::from_utf8(&byte) else {
                continue;
            };
            for target in [format!("/{text}"), format!("/a{text}b?c{text}d")] {
                let Some(path_len) = plain_target(&target) else {
                    continue;
                };
                let uri: http::Uri = target
                    .parse()
                    .unwrap_or_else(|e| panic!("{target:?} taken here, refused by http: {e}"));
                let path = target.split_once('?').map_or(&target[..], |(p, _)| p);
                assert_eq!(&target[..path_len], path, "{target:?}");
                assert_eq!(uri.path(), path, "{target:?}");
                assert_eq!(uri.path_and_query().map(|p| p.as_str()), Some(&target[..]));
            }
        }
        // What a client sends every day is taken.
        assert_eq!(plain_target("/static/app.3f9a.js?v=1&x=%20y?z"), Some(19));
        assert_eq!(plain_target("/a/b;c=d/e~f!g$h'i(j)k*l+m,n:o@p"), Some(32));
        assert_eq!(plain_target("/a b"), None);
        assert_eq!(plain_target("/a#frag"), None);
        assert_eq!(plain_target("a/b"), None);
    }

    #[test]
    fn the_host_is_read_as_the_router_reads_it() {
        assert_eq!(host_of(None), "");
        assert_eq!(host_of(Some(b"Example.com:8080")), "Example.com");
        assert_eq!(host_of(Some(b"[::1]:443")), "[::1]");
        assert_eq!(host_of(Some(b"a\xffb")), "");
        // The same as `router::request_host` over a header map with that value.
        for value in [&b"h.example:1"[..], b"h.example", b"[::1]", b"h:x"] {
            let mut map = HeaderMap::new();
            map.insert(
                http::header::HOST,
                http::HeaderValue::from_bytes(value).expect("value"),
            );
            let uri: http::Uri = "/".parse().expect("uri");
            assert_eq!(
                host_of(Some(value)),
                crate::router::request_host(&uri, &map)
            );
        }
    }
}
