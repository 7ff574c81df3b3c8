//! The proxy's header rules on header maps: hop-by-hop headers removed (RFC 9110 §7.6.1) as a
//! request enters and from an upstream's response, a request's upgrade and authority read, and
//! `Via`. The forwarding fields a request gets on its way up are written once, for both paths,
//! by [`super::text::forward_fields`]; [`field_map`] reads them back into a map for hyper's
//! clients.

use bytes::Bytes;
use gateway_http1::hop_by_hop::{
    self, CONNECTION_BIT, PROXY_AUTH_BITS, TE_BIT, UPGRADE_BIT, connection_tokens, wants_trailers,
};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Uri, Version};
use smallvec::SmallVec;

/// Made once per connection, with its facts; the proxy's text forwarding names it here.
pub(super) use crate::connection::ClientText;

pub(super) const TRAILERS: HeaderValue = HeaderValue::from_static("trailers");
const UPGRADE: HeaderValue = HeaderValue::from_static("upgrade");

/// Removes hop-by-hop headers. With `upgrading`, `Upgrade` stays and `Connection: upgrade` is
/// put back, since the next hop must see both to switch protocols.
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap, upgrading: bool) {
    remove_present(headers, present_hop_by_hop(headers), upgrading);
}

/// Removes the client's hop-by-hop fields as a request enters, before any filter: the fields
/// its `Connection` names, `Connection` itself (put back as `upgrade` when the request asks to
/// switch protocols, with its `Upgrade`), `Keep-Alive`, `Proxy-Connection`, `TE` (but
/// `trailers`), `Transfer-Encoding` (the body is framed again on the way out) and
/// `HTTP2-Settings`. So a field a filter sets reaches the upstream whatever the client's
/// `Connection` lists.
pub(crate) fn strip_on_entry(headers: &mut HeaderMap) {
    // `Proxy-Authorization` and `Proxy-Authenticate` are addressed to this hop: filters and
    // plugins (a proxy-authentication check) see them, and the proxy removes them.
    let present = present_hop_by_hop(headers) & !PROXY_AUTH_BITS;
    if present == 0 {
        return;
    }
    let upgrading = present & UPGRADE_BIT != 0 && wants_upgrade(headers);
    remove_present(headers, present, upgrading);
}

/// The [`hop_by_hop::NAMES`] entries present, as a mask. One pass over the names (no hashing): a
/// removal hashes and probes whether or not the name is there, so only present ones are
/// removed. Most requests carry none; most upstream responses only `Connection: keep-alive`.
fn present_hop_by_hop(headers: &HeaderMap) -> u16 {
    headers
        .keys()
        .fold(0, |mask, name| mask | hop_by_hop::bit(name))
}

/// Removes the hop-by-hop fields of `present` (see [`remove_hop_by_hop`]).
fn remove_present(headers: &mut HeaderMap, present: u16, upgrading: bool) {
    if present == 0 {
        if upgrading {
            headers.insert(header::CONNECTION, UPGRADE);
        }
        return;
    }
    if present & CONNECTION_BIT != 0 {
        for name in named_by_connection(headers) {
            headers.remove(name);
        }
        headers.remove(header::CONNECTION);
    }
    let handled_apart = CONNECTION_BIT | TE_BIT | UPGRADE_BIT;
    for (i, name) in hop_by_hop::NAMES.iter().enumerate() {
        if present & !handled_apart & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if present & TE_BIT != 0
        && let Some(te) = headers.remove(header::TE)
        && wants_trailers(te.as_bytes())
    {
        headers.insert(header::TE, TRAILERS);
    }
    if upgrading {
        headers.insert(header::CONNECTION, UPGRADE);
    } else if present & UPGRADE_BIT != 0 {
        headers.remove(header::UPGRADE);
    }
}

/// The fields present that `Connection` names as this hop's only. Names in [`hop_by_hop::NAMES`] are
/// left out: `remove_hop_by_hop` handles those itself (each removed once, `TE` judged on its
/// value, `Upgrade` kept when switching protocols). The present names are matched against the
/// tokens rather than each token made a `HeaderName` and looked up: `keep-alive`, the token most
/// upstreams send, is not one of http's standard names and would be allocated, and a lookup
/// hashes whether or not the field is there.
fn named_by_connection(headers: &HeaderMap) -> SmallVec<[HeaderName; 2]> {
    let values = headers.get_all(header::CONNECTION).into_iter();
    let tokens: SmallVec<[&[u8]; 4]> = connection_tokens(values.map(HeaderValue::as_bytes))
        .filter(|token| hop_by_hop::token_bit(token) == 0)
        .collect();
    if tokens.is_empty() {
        return SmallVec::new();
    }
    headers
        .keys()
        .filter(|name| {
            hop_by_hop::bit(name) == 0
                && tokens
                    .iter()
                    .any(|t| t.eq_ignore_ascii_case(name.as_str().as_bytes()))
        })
        .cloned()
        .collect()
}

/// Whether a request asks to switch protocols (`Connection: upgrade` plus `Upgrade`).
pub(crate) fn wants_upgrade(headers: &HeaderMap) -> bool {
    // Only values that are visible ASCII count, as `HeaderValue::to_str` takes them.
    let values = headers.get_all(header::CONNECTION).into_iter();
    let visible = values.filter(|v| v.to_str().is_ok());
    headers.contains_key(header::UPGRADE)
        && connection_tokens(visible.map(HeaderValue::as_bytes))
            .any(|token| token.eq_ignore_ascii_case(b"upgrade"))
}

/// The authority the client addressed: the URI's (HTTP/2, absolute-form) or `Host`.
pub(crate) fn client_authority(uri: &Uri, headers: &HeaderMap) -> Option<HeaderValue> {
    match uri.authority() {
        Some(a) => HeaderValue::from_str(a.as_str()).ok(),
        None => headers.get(header::HOST).cloned(),
    }
}

/// `Via` values by the version of the hop they describe.
pub(crate) fn via(version: Version) -> HeaderValue {
    HeaderValue::from_static(match version {
        Version::HTTP_09 => "0.9 gateway",
        Version::HTTP_10 => "1.0 gateway",
        Version::HTTP_2 => "2 gateway",
        Version::HTTP_3 => "3 gateway",
        _ => "1.1 gateway",
    })
}

/// Header fields a route's filters or the proxy may add to a request or response (the
/// upstream's `Host`, a filter's own fields, `Via` on a response): the room a map read from a
/// head is given, since `HeaderMap::insert` makes room before it looks for the name, so even
/// replacing a field grows a full map.
pub(crate) const ADDED_FIELDS_ROOM: usize = 8;

/// Moves the request's path and `Host` out of the client connection's read buffer into one
/// allocation of their own. hyper hands them out as slices of that buffer, and while any slice
/// lives, hyper's next read on the connection (it reads during every request, to notice a client
/// that goes away) cannot reuse the buffer and allocates a new 8 KiB one. The proxy keeps the
/// request line until the upstream answers (it may be sent again); the fields are already a
/// copy ([`super::text::forward_map`]).
pub(crate) fn detach(path: &mut PathAndQuery, host: &mut Option<HeaderValue>) {
    let len = path.as_str().len() + host.as_ref().map_or(0, HeaderValue::len);
    let mut copy = Vec::with_capacity(len);
    copy.extend_from_slice(path.as_str().as_bytes());
    if let Some(h) = host {
        copy.extend_from_slice(h.as_bytes());
    }
    let copy = Bytes::from(copy);
    let path_len = path.as_str().len();
    // The path has no unchecked constructor; should its check fail, the original stays.
    if let Ok(p) = PathAndQuery::from_maybe_shared(copy.slice(..path_len)) {
        *path = p;
    }
    if let Some(h) = host
        && let Ok(mut own) = HeaderValue::from_maybe_shared(copy.slice(path_len..))
    {
        own.set_sensitive(h.is_sensitive());
        *h = own;
    }
}

/// The field lines [`super::text::forward_fields`] wrote, as a header map for hyper's clients,
/// with the `Content-Length` the client declared (hyper frames a body by it).
pub(crate) fn field_map(lines: &Bytes, declared_length: Option<u64>) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(lines.iter().filter(|&&b| b == b'\n').count() + 2);
    for line in lines.split_inclusive(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = lines.slice_ref(line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) = (
            gateway_http1::fields::name(&line[..colon]),
            HeaderValue::from_maybe_shared(value),
        ) {
            map.append(name, value);
        }
    }
    if let Some(n) = declared_length {
        map.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    /// A general-path request's fields as its upstream gets them: written by the one rule
    /// ([`super::super::text::forward_map`]) and read back as hyper's clients get them.
    fn forwarded(
        fields: &HeaderMap,
        host: Option<&str>,
        client: &ClientText,
        version: Version,
        upgrading: bool,
    ) -> HeaderMap {
        let via = via(version);
        let hop = super::super::text::Hop {
            host: host.map(str::as_bytes),
            upgrading,
            via: via.as_bytes(),
        };
        field_map(&super::super::text::forward_map(fields, &hop, client), None)
    }

    fn client() -> ClientText {
        ClientText::new("192.0.2.7".parse().unwrap(), false)
    }

    #[test]
    fn detached_path_and_host_are_equal_and_no_longer_share_the_read_buffer() {
        // A stand-in for hyper's read buffer: the head's bytes, with the path and host sliced
        // from it.
        let buffer = Bytes::from_static(b"/a/b?c=1 example.com");
        let mut path = PathAndQuery::from_maybe_shared(buffer.slice(0..8)).unwrap();
        let mut secret = HeaderValue::from_maybe_shared(buffer.slice(9..20)).unwrap();
        secret.set_sensitive(true);
        let mut host = Some(secret);
        let before = (path.clone(), host.clone());

        detach(&mut path, &mut host);

        assert_eq!((&path, &host), (&before.0, &before.1));
        assert!(host.as_ref().unwrap().is_sensitive());
        let inside = |p: *const u8| buffer.as_ptr_range().contains(&p);
        assert!(!inside(path.as_str().as_ptr()));
        assert!(!inside(host.as_ref().unwrap().as_bytes().as_ptr()));
    }

    #[test]
    fn the_forwarded_fields_read_back_as_a_map_with_the_declared_length() {
        let lines =
            Bytes::from_static(b"accept: */*\r\nx-one: 1\r\nx-one: 2\r\nvia: 1.1 gateway\r\n");
        let map = field_map(&lines, Some(5));
        let ones: Vec<_> = map.get_all("x-one").iter().collect();
        assert_eq!(ones, ["1", "2"]);
        assert_eq!(map["accept"], "*/*");
        assert_eq!(map["via"], "1.1 gateway");
        assert_eq!(map["content-length"], "5");
        assert_eq!(map.len(), 5);
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = map(&[
            ("connection", "close, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic eA=="),
            ("te", "gzip"),
            ("x-kept", "1"),
            ("connection", "x-other"),
            ("x-other", "1"),
        ]);
        remove_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn connection_tokens_match_names_in_any_case_and_spacing() {
        let mut h = map(&[
            ("connection", " Keep-Alive ,X-Secret,, close"),
            ("x-secret", "1"),
            ("x-secretive", "kept: a name is matched whole"),
            ("keep-alive", "timeout=5"),
            ("close", "named by the token"),
        ]);
        remove_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-secretive"));
    }

    #[test]
    fn te_trailers_survives() {
        let mut h = map(&[("te", "trailers, deflate;q=0.5")]);
        remove_hop_by_hop(&mut h, false);
        assert_eq!(h["te"], "trailers");
    }

    #[test]
    fn upgrade_is_kept_when_upgrading() {
        let mut h = map(&[
            ("connection", "Upgrade, x-hop"),
            ("upgrade", "websocket"),
            ("x-hop", "1"),
        ]);
        assert!(wants_upgrade(&h));
        remove_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert!(!h.contains_key("x-hop"));
    }

    #[test]
    fn forwarding_headers_append_and_set() {
        let h = map(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "claimed.example"),
            ("forwarded", "for=10.0.0.1"),
            ("host", "api.example.com:8080"),
            ("expect", "100-continue"),
            ("content-length", "5"),
            ("accept", "*/*"),
        ]);
        let h = forwarded(
            &h,
            Some("api.example.com:8080"),
            &client(),
            Version::HTTP_11,
            false,
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 192.0.2.7");
        assert_eq!(
            h["x-forwarded-proto"], "http",
            "a client cannot claim https"
        );
        assert_eq!(h["x-forwarded-host"], "api.example.com:8080");
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.1, for=192.0.2.7;proto=http;host=\"api.example.com:8080\""
        );
        assert_eq!(h["via"], "1.1 gateway");
        assert_eq!(h["accept"], "*/*");
        // Each attempt writes its `Host` and its body's framing; the gateway answers `Expect`.
        for gone in ["host", "expect", "content-length"] {
            assert!(!h.contains_key(gone), "{gone}");
        }
        assert_eq!(h.len(), 6, "{h:?}");
    }

    #[test]
    fn forwarded_quotes_ipv6_and_escapes_host() {
        let client = ClientText::new("2001:db8::1".parse().unwrap(), true);
        let h = forwarded(
            &HeaderMap::new(),
            Some("a\";by=evil"),
            &client,
            Version::HTTP_2,
            false,
        );
        assert_eq!(
            h["forwarded"],
            "for=\"[2001:db8::1]\";proto=https;host=\"a\\\";by=evil\""
        );
        assert_eq!(h["x-forwarded-for"], "2001:db8::1", "unbracketed, unquoted");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["via"], "2 gateway");
    }

    #[test]
    fn a_forwarded_request_loses_its_hop_by_hop_fields_but_an_upgrade() {
        let h = map(&[
            ("connection", "Upgrade, x-hop"),
            ("upgrade", "websocket"),
            ("x-hop", "1"),
            ("te", "trailers"),
            ("keep-alive", "timeout=5"),
        ]);
        let up = forwarded(&h, None, &client(), Version::HTTP_11, true);
        assert_eq!(up["upgrade"], "websocket");
        assert_eq!(up["connection"], "upgrade");
        assert_eq!(up["te"], "trailers");
        assert!(!up.contains_key("x-hop") && !up.contains_key("keep-alive"));
        let plain = forwarded(&h, None, &client(), Version::HTTP_11, false);
        for gone in ["upgrade", "connection", "x-hop", "keep-alive"] {
            assert!(!plain.contains_key(gone), "{gone}");
        }
        assert_eq!(plain["te"], "trailers");
    }
}
