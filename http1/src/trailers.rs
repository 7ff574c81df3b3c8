//! The fields a trailer section never carries through the gateway, in either direction, and
//! which trailers a `Trailer` field declares.
//!
//! RFC 9110 §6.5.1: fields that frame the message, route it, modify the request, control the
//! response, authenticate, or describe the content are read before the content, so they cannot
//! be trailers. A recipient that merges trailers into the header section (many frameworks do)
//! would otherwise trust a `Host`, `Authorization` or `X-Forwarded-For` that no route, filter or
//! forwarding rule of the gateway ever saw, or re-frame the message by a `Content-Length` that
//! arrived after its body. Such fields are dropped, the rest pass: request trailers on their
//! way to the upstream, response trailers on their way to the client, on the fast path and the
//! general path alike.
//!
//! The set holds every field hyper's HTTP/1.1 encoder refuses in a trailer, so a response's
//! trailers reach an HTTP/1.1 client the same whichever path wrote them.

use http::header::{HeaderMap, HeaderName};

/// Fields dropped from trailers besides the hop-by-hop set ([`crate::hop_by_hop`], which
/// covers `Connection`, `TE`, `Transfer-Encoding`, `Upgrade`, `Keep-Alive`, `Proxy-*`).
const NOT_TRAILERS: [&str; 28] = [
    // Framing and content format.
    "content-length",
    "trailer",
    "content-type",
    "content-encoding",
    "content-range",
    // Routing, and the forwarding fields the gateway itself sets in the header section.
    "host",
    "max-forwards",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "via",
    // Request modifiers.
    "expect",
    "range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    // Response controls.
    "cache-control",
    "expires",
    "age",
    "vary",
    "location",
    // Authentication and state.
    "authorization",
    "www-authenticate",
    "cookie",
    "set-cookie",
];

/// Whether a trailer field named `name` (in any case) is dropped rather than forwarded.
pub fn is_forbidden(name: &[u8]) -> bool {
    crate::hop_by_hop::token_bit(name) != 0
        || NOT_TRAILERS
            .iter()
            .any(|known| name.eq_ignore_ascii_case(known.as_bytes()))
}

/// Removes the fields a trailer section must not carry; returns how many went.
pub fn strip(trailers: &mut HeaderMap) -> usize {
    let forbidden = |name: &&HeaderName| is_forbidden(name.as_str().as_bytes());
    if !trailers.keys().any(|n| forbidden(&n)) {
        return 0;
    }
    let names: smallvec::SmallVec<[HeaderName; 4]> =
        trailers.keys().filter(forbidden).cloned().collect();
    let before = trailers.len();
    for name in names {
        trailers.remove(name);
    }
    before - trailers.len()
}

/// Whether `name` is among the names of a `Trailer` field's values (`declared`, comma-joined).
/// Toward an HTTP/1.1 client only declared trailers are sent: hyper's encoder sends no other on
/// the general path, and the fast path does the same.
pub fn is_declared(declared: &[u8], name: &[u8]) -> bool {
    declared
        .split(|&b| b == b',')
        .any(|item| item.trim_ascii().eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn framing_routing_and_hop_by_hop_fields_go_and_the_rest_stay() {
        let mut t = HeaderMap::new();
        for name in [
            "content-length",
            "transfer-encoding",
            "host",
            "connection",
            "keep-alive",
            "te",
            "trailer",
            "authorization",
            "x-forwarded-for",
        ] {
            t.append(HeaderName::from_static(name), HeaderValue::from_static("x"));
        }
        t.append("x-checksum", HeaderValue::from_static("abc"));
        t.append("grpc-status", HeaderValue::from_static("0"));
        t.append("grpc-message", HeaderValue::from_static("ok"));
        assert_eq!(strip(&mut t), 9);
        let mut left: Vec<&str> = t.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["grpc-message", "grpc-status", "x-checksum"]);
        assert!(is_forbidden(b"Content-Length") && is_forbidden(b"PROXY-AUTHORIZATION"));
        assert!(!is_forbidden(b"server-timing") && !is_forbidden(b"content-digest"));
    }

    #[test]
    fn a_trailer_is_declared_by_any_of_the_listed_names_in_any_case() {
        let declared = b"X-Checksum , grpc-status,Server-Timing";
        assert!(is_declared(declared, b"x-checksum"));
        assert!(is_declared(declared, b"server-timing"));
        assert!(!is_declared(declared, b"x-check"));
        assert!(!is_declared(b"", b"x-checksum"));
    }

    #[test]
    fn every_field_hypers_encoder_refuses_is_in_the_set() {
        for name in [
            "authorization",
            "cache-control",
            "content-encoding",
            "content-length",
            "content-range",
            "content-type",
            "host",
            "max-forwards",
            "set-cookie",
            "trailer",
            "transfer-encoding",
            "te",
        ] {
            assert!(is_forbidden(name.as_bytes()), "{name}");
        }
    }
}
