//! Header rewriting between client and upstream: hop-by-hop headers removed in both directions
//! (RFC 9110 §7.6.1), the forwarding headers added on the way up (`X-Forwarded-For` and
//! `Forwarded` appended to; `X-Forwarded-Proto` and `X-Forwarded-Host` set, since the gateway
//! is the edge and a client must not be able to claim `https`), and `Via` both ways.

use bytes::Bytes;
use gateway_http1::hop_by_hop::{self, CONNECTION_BIT, PROXY_AUTH_BITS, TE_BIT, UPGRADE_BIT};
use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Uri, Version};
use smallvec::SmallVec;

/// Made once per connection, with its facts; the proxy's text forwarding names it here.
pub(super) use crate::connection::ClientText;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

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

/// Whether a `TE` value names `trailers`: the one value that means something end to end (gRPC
/// needs it), so the one kept of a removed `TE`.
pub(super) fn wants_trailers(te: &[u8]) -> bool {
    std::str::from_utf8(te).is_ok_and(|v| {
        v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
            && v.split(',').any(|t| {
                t.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case("trailers")
            })
    })
}

/// The fields present that `Connection` names as this hop's only. Names in [`hop_by_hop::NAMES`] are
/// left out: `remove_hop_by_hop` handles those itself (each removed once, `TE` judged on its
/// value, `Upgrade` kept when switching protocols). The present names are matched against the
/// tokens rather than each token made a `HeaderName` and looked up: `keep-alive`, the token most
/// upstreams send, is not one of http's standard names and would be allocated, and a lookup
/// hashes whether or not the field is there.
fn named_by_connection(headers: &HeaderMap) -> SmallVec<[HeaderName; 2]> {
    let mut tokens: SmallVec<[&[u8]; 4]> = SmallVec::new();
    for value in headers.get_all(header::CONNECTION) {
        for token in value.as_bytes().split(|&b| b == b',') {
            let token = token.trim_ascii();
            if !token.is_empty() && hop_by_hop::token_bit(token) == 0 {
                tokens.push(token);
            }
        }
    }
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
    headers.contains_key(header::UPGRADE)
        && headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|s| {
                s.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
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

/// Header fields the proxy may add to a request or response it forwards (`X-Forwarded-*`,
/// `Forwarded`, `Via`, the upstream's `Host`, and a few a route's filters set). `Host` counts
/// although the client sent one: `HeaderMap::insert` makes room before it looks for the name,
/// so even replacing it grows a full map.
pub(crate) const FORWARDING_ROOM: usize = 8;

/// Adds the forwarding headers for a request from `client` (its address and scheme) that
/// arrived with `version`, addressed to `host`.
pub(crate) fn add_forwarding(
    headers: &mut HeaderMap,
    client: &ClientText,
    host: Option<&HeaderValue>,
    version: Version,
) {
    // The first request of a connection comes in a map hyper sized to its fields, full; each
    // field added would grow it, a rehash and two reallocations each (three per request on
    // short connections). Later requests reuse a map with room, where this does nothing.
    headers.reserve(FORWARDING_ROOM);
    // One probe per header: a request usually carries neither, and then the connection's
    // value goes in as it is.
    match headers.entry(&X_FORWARDED_FOR) {
        Entry::Vacant(e) => {
            e.insert(client.ip.clone());
        }
        Entry::Occupied(mut e) => {
            let mut xff = list_to_append_to(e.iter(), 48);
            xff.push_str(client.ip.to_str().unwrap_or_default());
            if let Ok(v) = HeaderValue::try_from(xff) {
                e.insert(v);
            }
        }
    }

    let host_text = host.and_then(|h| h.to_str().ok());
    let forwarded = |mut list: String| {
        list.push_str(&client.element);
        if let Some(host) = host_text {
            list.push_str(";host=");
            crate::ip_text::push_quoted(&mut list, host);
        }
        // Visible ASCII throughout: the prior values and the host passed `to_str`, the host is
        // quoted with its quotes and backslashes escaped, and the element is the connection's.
        HeaderValue::try_from(list).ok()
    };
    match headers.entry(header::FORWARDED) {
        Entry::Vacant(e) => {
            let value = match host {
                Some(h) => client.forwarded_to(h, || forwarded(String::with_capacity(64))),
                None => forwarded(String::with_capacity(64)),
            };
            if let Some(v) = value {
                e.insert(v);
            }
        }
        Entry::Occupied(mut e) => {
            if let Some(v) = forwarded(list_to_append_to(e.iter(), 128)) {
                e.insert(v);
            }
        }
    }

    headers.insert(&X_FORWARDED_PROTO, client.proto.clone());
    match host {
        Some(h) => headers.insert(&X_FORWARDED_HOST, h.clone()),
        None => headers.remove(&X_FORWARDED_HOST),
    };
    headers.append(header::VIA, via(version));
}

/// The values a request brought for a list the gateway appends to, each followed by `, `
/// (values that are not visible ASCII are dropped).
fn list_to_append_to<'a>(values: impl Iterator<Item = &'a HeaderValue>, room: usize) -> String {
    let mut list = String::with_capacity(room);
    for v in values {
        if let Ok(v) = v.to_str() {
            list.push_str(v);
            list.push_str(", ");
        }
    }
    list
}

/// Moves the request's path and field values out of the client connection's read buffer into
/// one allocation of their own. hyper hands them out as slices of that buffer, and while any
/// slice lives, hyper's next read on the connection (it reads during every request, to notice a
/// client that goes away) cannot reuse the buffer and allocates a new 8 KiB one. The proxy keeps
/// the request until the upstream answers (it may be sent again), so without this every proxied
/// request cost an 8 KiB allocation and its release.
pub(crate) fn detach(
    path: &mut PathAndQuery,
    host: &mut Option<HeaderValue>,
    headers: &mut HeaderMap,
) {
    let len = path.as_str().len()
        + host.as_ref().map_or(0, HeaderValue::len)
        + headers.values().map(HeaderValue::len).sum::<usize>();
    let mut copy = Vec::with_capacity(len);
    copy.extend_from_slice(path.as_str().as_bytes());
    if let Some(h) = host {
        copy.extend_from_slice(h.as_bytes());
    }
    // The same iterator as the replacing pass below, so the two walk the values in one order.
    for v in headers.values_mut() {
        copy.extend_from_slice(v.as_bytes());
    }
    let copy = Bytes::from(copy);
    let mut at = 0;
    let mut next = |n: usize| {
        at += n;
        copy.slice(at - n..at)
    };
    // The path has no unchecked constructor; should its check fail, the original stays.
    if let Ok(p) = PathAndQuery::from_maybe_shared(next(path.as_str().len())) {
        *path = p;
    }
    let mut detach_value = |v: &mut HeaderValue| {
        let mut own = copy_of_value(next(v.len()));
        own.set_sensitive(v.is_sensitive());
        *v = own;
    };
    if let Some(h) = host {
        detach_value(h);
    }
    headers.values_mut().for_each(detach_value);
}

/// A field value made from `bytes` without checking them again.
#[allow(
    unsafe_code,
    reason = "the checked constructor re-reads every byte, which cost more than the copy saves"
)]
fn copy_of_value(bytes: Bytes) -> HeaderValue {
    // SAFETY: `detach` passes only byte-for-byte copies of `HeaderValue`s, which were checked
    // when they were made; a copy of valid field-value bytes is a valid field value.
    unsafe { HeaderValue::from_maybe_shared_unchecked(bytes) }
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

    #[test]
    fn detached_values_are_equal_and_no_longer_share_the_read_buffer() {
        // A stand-in for hyper's read buffer: the head's bytes, with the path and the values
        // sliced from it.
        let buffer = Bytes::from_static(b"/a/b?c=1 example.com text/html one two");
        let slice = |from: usize, to: usize| buffer.slice(from..to);
        let mut path = PathAndQuery::from_maybe_shared(slice(0, 8)).unwrap();
        let mut host = Some(HeaderValue::from_maybe_shared(slice(9, 20)).unwrap());
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_maybe_shared(slice(21, 30)).unwrap(),
        );
        let mut secret = HeaderValue::from_maybe_shared(slice(31, 34)).unwrap();
        secret.set_sensitive(true);
        headers.append(header::COOKIE, secret);
        headers.append(
            header::COOKIE,
            HeaderValue::from_maybe_shared(slice(35, 38)).unwrap(),
        );
        headers.insert(header::VIA, HeaderValue::from_static("1.1 gateway"));
        let before = (path.clone(), host.clone(), headers.clone());

        detach(&mut path, &mut host, &mut headers);

        assert_eq!((&path, &host, &headers), (&before.0, &before.1, &before.2));
        let cookies: Vec<_> = headers.get_all(header::COOKIE).iter().collect();
        assert_eq!(cookies, ["one", "two"]);
        assert!(cookies[0].is_sensitive() && !cookies[1].is_sensitive());
        // Nothing points into the old buffer any more.
        let inside = |p: *const u8| buffer.as_ptr_range().contains(&p);
        assert!(!inside(path.as_str().as_ptr()));
        assert!(!inside(host.as_ref().unwrap().as_bytes().as_ptr()));
        assert!(headers.values().all(|v| !inside(v.as_bytes().as_ptr())));
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
        let mut h = map(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=10.0.0.1"),
        ]);
        let host = HeaderValue::from_static("api.example.com:8080");
        add_forwarding(
            &mut h,
            &ClientText::new("192.0.2.7".parse().unwrap(), false),
            Some(&host),
            Version::HTTP_11,
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
    }

    #[test]
    fn forwarded_quotes_ipv6_and_escapes_host() {
        let mut h = HeaderMap::new();
        let host = HeaderValue::from_static("a\";by=evil");
        add_forwarding(
            &mut h,
            &ClientText::new("2001:db8::1".parse().unwrap(), true),
            Some(&host),
            Version::HTTP_2,
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
    fn a_connections_requests_get_forwarded_for_the_host_each_names() {
        let client = ClientText::new("192.0.2.7".parse().unwrap(), false);
        let forwarded = |host: Option<&'static str>, own: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(own) = own {
                h.insert(header::FORWARDED, HeaderValue::from_static(own));
            }
            let host = host.map(HeaderValue::from_static);
            add_forwarding(&mut h, &client, host.as_ref(), Version::HTTP_11);
            h[header::FORWARDED].to_str().unwrap().to_owned()
        };
        let a = "for=192.0.2.7;proto=http;host=\"a.example\"";
        let b = "for=192.0.2.7;proto=http;host=\"b.example\"";
        assert_eq!(forwarded(Some("a.example"), None), a);
        assert_eq!(
            forwarded(Some("a.example"), None),
            a,
            "kept for the connection"
        );
        assert_eq!(forwarded(Some("b.example"), None), b, "another host");
        assert_eq!(forwarded(None, None), "for=192.0.2.7;proto=http");
        assert_eq!(
            forwarded(Some("a.example"), Some("for=10.0.0.1")),
            format!("for=10.0.0.1, {a}"),
            "a request's own is appended to"
        );
        assert_eq!(forwarded(Some("a.example"), None), a);
    }
}
