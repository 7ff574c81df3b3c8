//! Protocol switches carried through the proxy: an HTTP/1.1 `Upgrade` to a protocol the route
//! allows (`proxy.upgrades`, WebSocket by default) and a WebSocket over HTTP/2 extended CONNECT
//! (RFC 8441), which is forwarded to the HTTP/1.1 upstream as an ordinary WebSocket upgrade.
//! Once both sides have switched, the bytes are copied both ways until either side closes.
//! A tunnel is outside routing, filters and the WAF from then on, so a protocol the route does
//! not allow is never asked of the upstream: the request is forwarded without `Upgrade`.

use http::header::{self, HeaderValue};
use http::{Method, StatusCode, request, response};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::body::Lease;
use crate::body::Body;

const WEBSOCKET: HeaderValue = HeaderValue::from_static("websocket");
const UPGRADE: HeaderValue = HeaderValue::from_static("upgrade");

/// The protocols a route lets a client switch to (`proxy.upgrades`, lower-case, checked at
/// config load).
pub(crate) struct AllowedUpgrades(Box<[Box<str>]>);

impl AllowedUpgrades {
    pub(crate) fn new(protocols: &[String]) -> Self {
        Self(protocols.iter().map(|p| Box::from(p.as_str())).collect())
    }

    /// Whether `protocol` (`name` or `name/version`) is allowed: listed as it is, or its name
    /// listed without a version.
    pub(crate) fn allows(&self, protocol: &str) -> bool {
        let name = protocol.split_once('/').map_or(protocol, |(name, _)| name);
        self.0.iter().any(|allowed| {
            allowed.eq_ignore_ascii_case(protocol)
                || (!allowed.contains('/') && allowed.eq_ignore_ascii_case(name))
        })
    }

    /// Whether every protocol the request's `Upgrade` fields offer is allowed (and there is
    /// one). The client may offer several, and the upstream picks any of them.
    pub(crate) fn allow_all_offered(&self, headers: &http::HeaderMap) -> bool {
        let mut offered = false;
        for value in headers.get_all(header::UPGRADE) {
            let Ok(value) = value.to_str() else {
                return false;
            };
            for protocol in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                if !self.allows(protocol) {
                    return false;
                }
                offered = true;
            }
        }
        offered
    }
}

/// Whether a request is an extended CONNECT for WebSocket.
pub(crate) fn is_websocket_connect<B>(req: &http::Request<B>) -> bool {
    req.method() == Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// Rewrites an extended CONNECT into the HTTP/1.1 WebSocket handshake (RFC 8441 §5): a GET
/// with `Upgrade`, `Connection` and a fresh `Sec-WebSocket-Key` (HTTP/2 clients send none).
pub(crate) fn connect_to_http1(parts: &mut request::Parts) {
    parts.method = Method::GET;
    parts.version = http::Version::HTTP_11;
    let h = &mut parts.headers;
    h.insert(header::UPGRADE, WEBSOCKET);
    h.insert(header::CONNECTION, UPGRADE);
    if let Ok(key) = HeaderValue::from_str(&base64_16(rand::random())) {
        h.insert(header::SEC_WEBSOCKET_KEY, key);
    }
    h.entry(header::SEC_WEBSOCKET_VERSION)
        .or_insert(HeaderValue::from_static("13"));
}

/// Answers the client with the upstream's switch and splices the two connections in a task of
/// their own. The lease (the target's in-flight count) lasts as long as the tunnel.
pub(crate) fn tunnel(
    mut parts: response::Parts,
    client: OnUpgrade,
    upstream: OnUpgrade,
    lease: Lease,
    websocket_over_h2: bool,
) -> http::Response<Body> {
    tokio::spawn(async move {
        let (client, upstream) = tokio::join!(client, upstream);
        match (client, upstream) {
            (Ok(c), Ok(u)) => {
                let (mut c, mut u) = (TokioIo::new(c), TokioIo::new(u));
                match tokio::io::copy_bidirectional(&mut c, &mut u).await {
                    Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
                    Err(e) => {
                        tracing::debug!(error = %e, "upgraded connection ended with an error")
                    }
                }
            }
            (c, u) => tracing::debug!(
                client = c.err().map(|e| e.to_string()),
                upstream = u.err().map(|e| e.to_string()),
                "protocol switch abandoned"
            ),
        }
        drop(lease);
    });
    super::headers::remove_hop_by_hop(&mut parts.headers, !websocket_over_h2);
    if websocket_over_h2 {
        // Over HTTP/2 the switch is a 200 to the CONNECT, without the HTTP/1.1 handshake fields.
        parts.status = StatusCode::OK;
        parts.headers.remove(header::SEC_WEBSOCKET_ACCEPT);
        parts.headers.remove(header::UPGRADE);
    }
    parts
        .headers
        .append(header::VIA, super::headers::via(parts.version));
    parts.version = http::Version::HTTP_11;
    http::Response::from_parts(parts, Body::empty())
}

/// Standard base64 of 16 bytes (24 characters with padding), enough for a WebSocket key.
fn base64_16(bytes: [u8; 16]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(24);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_upgrades_match_names_and_versions() {
        let allowed = AllowedUpgrades::new(&["websocket".into(), "foo/2".into()]);
        for yes in ["websocket", "WebSocket", "websocket/13", "foo/2", "FOO/2"] {
            assert!(allowed.allows(yes), "{yes}");
        }
        for no in ["h2c", "foo", "foo/1", "websockets", "tls/1.0"] {
            assert!(!allowed.allows(no), "{no}");
        }
        let offered = |values: &[&str]| {
            let mut h = http::HeaderMap::new();
            for v in values {
                h.append(header::UPGRADE, HeaderValue::from_str(v).unwrap());
            }
            allowed.allow_all_offered(&h)
        };
        assert!(offered(&["websocket"]));
        assert!(offered(&["websocket, foo/2"]));
        assert!(!offered(&["websocket, h2c"]));
        assert!(!offered(&["websocket", "h2c"]));
        assert!(!offered(&[""]));
        assert!(!offered(&[]));
        assert!(!AllowedUpgrades::new(&[]).allow_all_offered(&{
            let mut h = http::HeaderMap::new();
            h.insert(header::UPGRADE, WEBSOCKET);
            h
        }));
    }

    #[test]
    fn base64_of_the_rfc_6455_sample_nonce() {
        // RFC 6455 §1.3: the nonce "the sample nonce" encodes as dGhlIHNhbXBsZSBub25jZQ==.
        assert_eq!(base64_16(*b"the sample nonce"), "dGhlIHNhbXBsZSBub25jZQ==");
    }
}
