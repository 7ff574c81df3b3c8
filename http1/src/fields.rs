//! Field lines as the gateway writes and reads them raw, without an `http::HeaderMap`: the
//! writer every hand-made head uses (requests to upstreams, responses of the fast path, static
//! files, fixed responses), the rule for reading a raw value as text, and the reader of a raw
//! name into `http`'s `HeaderName`.

use http::HeaderName;
use http::header::{self, InvalidHeaderName};

/// Appends one field line as hyper writes it: `name: value` and CRLF.
pub fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A raw field value as text when `http::HeaderValue::to_str` would take it (visible ASCII and
/// tab), without making a `HeaderValue`: the one place the readers of raw values (the fast
/// path's `Host`, the static files' `Accept-Encoding`, the proxy's forwarded host) apply that
/// rule.
pub fn field_text(value: &[u8]) -> Option<&str> {
    if !value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return None;
    }
    std::str::from_utf8(value).ok()
}

/// The names looked up by [`name`] before `HeaderName::from_bytes`: those most requests and
/// answers carry, each as it is usually written and in lowercase (HTTP/2's form).
const COMMON: [(&[u8], &[u8], HeaderName); 20] = [
    (b"Host", b"host", header::HOST),
    (b"Date", b"date", header::DATE),
    (b"Server", b"server", header::SERVER),
    (b"Content-Type", b"content-type", header::CONTENT_TYPE),
    (b"Content-Length", b"content-length", header::CONTENT_LENGTH),
    (b"Connection", b"connection", header::CONNECTION),
    (b"Accept", b"accept", header::ACCEPT),
    (b"User-Agent", b"user-agent", header::USER_AGENT),
    (
        b"Accept-Encoding",
        b"accept-encoding",
        header::ACCEPT_ENCODING,
    ),
    (
        b"Accept-Language",
        b"accept-language",
        header::ACCEPT_LANGUAGE,
    ),
    (b"Cache-Control", b"cache-control", header::CACHE_CONTROL),
    (b"ETag", b"etag", header::ETAG),
    (b"Last-Modified", b"last-modified", header::LAST_MODIFIED),
    (
        b"Transfer-Encoding",
        b"transfer-encoding",
        header::TRANSFER_ENCODING,
    ),
    (b"Authorization", b"authorization", header::AUTHORIZATION),
    (b"Origin", b"origin", header::ORIGIN),
    (b"Vary", b"vary", header::VARY),
    (b"Accept-Ranges", b"accept-ranges", header::ACCEPT_RANGES),
    (b"Location", b"location", header::LOCATION),
    (b"Cookie", b"cookie", header::COOKIE),
];

/// A raw field name as `http` names it. The common names, written as usual, are found by a
/// comparison of their bytes; any other goes through `HeaderName::from_bytes`, whose lowercasing
/// copy and table search cost a request or answer head several times what the comparison does.
pub fn name(raw: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    for (usual, lower, known) in &COMMON {
        if raw.len() == usual.len() && (raw == *usual || raw == *lower) {
            return Ok(known.clone());
        }
    }
    HeaderName::from_bytes(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_what_header_name_from_bytes_makes() {
        for (usual, lower, known) in &COMMON {
            assert_eq!(HeaderName::from_bytes(usual).unwrap(), *known);
            assert_eq!(name(usual).unwrap(), *known);
            assert_eq!(name(lower).unwrap(), *known);
            let shouted = usual.to_ascii_uppercase();
            assert_eq!(name(&shouted).unwrap(), *known);
        }
        for raw in [
            &b"X-Debug"[..],
            b"x-powered-by",
            b"If-None-Match",
            b"Hostx",
            b"Dat",
        ] {
            assert_eq!(
                name(raw).unwrap(),
                HeaderName::from_bytes(raw).unwrap(),
                "{raw:?}"
            );
        }
        for bad in [&b""[..], b"Ho st", b"Host:", b"\xff"] {
            assert!(name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_field_is_name_colon_space_value_crlf() {
        let mut out = Vec::new();
        push_field(&mut out, b"content-length", b"5");
        push_field(&mut out, b"x-empty", b"");
        assert_eq!(out, b"content-length: 5\r\nx-empty: \r\n");
    }

    #[test]
    fn text_is_what_header_value_to_str_takes() {
        for value in [
            &b"a b\tc"[..],
            b"",
            b"\x7f",
            b"caf\xc3\xa9",
            b"\x01",
            b"\x80",
        ] {
            let by_http = http::HeaderValue::from_bytes(value)
                .ok()
                .and_then(|v| v.to_str().ok().map(str::to_owned));
            assert_eq!(field_text(value).map(str::to_owned), by_http, "{value:?}");
        }
    }
}
