//! Facts about the connection a request arrived on ([`ConnInfo`]), and what is derived from them
//! once per connection: the client address's keyed hash (per-client tables key on it) and the
//! peer's text in the forwarding headers ([`ClientText`]). Behind a trusted proxy the client is
//! per request ([`ConnInfo::for_client`]). Below telemetry, the request context and the proxy,
//! which all read them.

use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock, OnceLock};

use http::HeaderValue;

const HTTP: HeaderValue = HeaderValue::from_static("http");
const HTTPS: HeaderValue = HeaderValue::from_static("https");

/// Facts about the connection a request arrived on, shared by its requests; or, for a request
/// whose trusted forwarding fields name another client, those facts with that client
/// ([`ConnInfo::for_client`]).
#[derive(Debug)]
pub struct ConnInfo {
    /// The client: the peer, unless a trusted proxy's forwarding fields named another
    /// (`listeners[].trusted_proxies`).
    pub client: SocketAddr,
    /// The connection's peer (after PROXY protocol, when the listener accepts it).
    pub peer: SocketAddr,
    /// The local address the connection was accepted on.
    pub local: SocketAddr,
    /// Listener name.
    pub listener: Arc<str>,
    /// Whether the connection is TLS (or QUIC).
    pub tls: bool,
    /// Whether the client used HTTPS: the connection's own TLS, or what a trusted proxy's
    /// `X-Forwarded-Proto` reports (a load balancer that ended the client's TLS).
    pub https: bool,
    /// TLS server name the client asked for, if any.
    pub sni: Option<Arc<str>>,
    /// [`client_ip_hash`] of `client`, made when first asked for.
    client_hash: ClientHash,
    /// `peer` as the proxy's forwarding headers write it (the hop the gateway appends), made
    /// when first asked for. Behind a pointer: only proxied requests ask for it, and the
    /// connection's facts live as long as the connection.
    peer_text: OnceLock<Arc<ClientText>>,
    /// What a Wasm plugin reads about the connection and the route (its properties), made for
    /// the connection's first request that runs a plugin and shared by the later ones on the
    /// same route.
    pub(crate) plugin_facts: OnceLock<Arc<wasm_host::StreamInfo>>,
}

/// A connection's [`client_ip_hash`], made at most once: per-client tables (the rate limiter's
/// buckets) key on it, and the requests of a keep-alive connection need not hash the same
/// address again.
#[derive(Debug, Default)]
pub struct ClientHash(OnceLock<u64>);

impl ConnInfo {
    /// A connection's facts; what is derived from them is made when first asked for.
    pub fn new(
        client: SocketAddr,
        local: SocketAddr,
        listener: Arc<str>,
        tls: bool,
        sni: Option<Arc<str>>,
    ) -> Self {
        Self {
            client,
            peer: client,
            local,
            listener,
            tls,
            https: tls,
            sni,
            client_hash: ClientHash::default(),
            peer_text: OnceLock::new(),
            plugin_facts: OnceLock::new(),
        }
    }

    /// The facts of one request whose trusted forwarding fields name `client`: the same
    /// connection, peer and forwarding text, with what is derived from the client made anew.
    pub fn for_client(&self, client: SocketAddr) -> Self {
        self.via_proxy(client, self.https)
    }

    /// The facts of one request whose trusted forwarding fields name `client` and say the
    /// client used HTTPS (`https`) or not: [`ConnInfo::for_client`], the forwarding text made
    /// anew when the scheme differs from the connection's.
    pub fn via_proxy(&self, client: SocketAddr, https: bool) -> Self {
        let peer_text = if https == self.https {
            OnceLock::from(Arc::clone(self.shared_peer_text()))
        } else {
            OnceLock::new()
        };
        Self {
            client,
            peer: self.peer,
            local: self.local,
            listener: self.listener.clone(),
            tls: self.tls,
            https,
            sni: self.sni.clone(),
            client_hash: ClientHash::default(),
            peer_text,
            plugin_facts: OnceLock::new(),
        }
    }

    /// The keyed hash of the client's IP address.
    pub fn client_hash(&self) -> u64 {
        *self
            .client_hash
            .0
            .get_or_init(|| client_ip_hash(self.client.ip()))
    }

    /// The peer's address as the forwarding headers write it: each hop appends the address
    /// it received the request from, so behind a trusted proxy the chain it sent is kept and
    /// the proxy's own address added.
    pub fn peer_text(&self) -> &ClientText {
        self.shared_peer_text()
    }

    fn shared_peer_text(&self) -> &Arc<ClientText> {
        self.peer_text.get_or_init(|| {
            Arc::new(ClientText::with_scheme(
                self.peer.ip(),
                self.tls,
                self.https,
            ))
        })
    }
}

/// A keyed SipHash of a client address (an IPv4-mapped IPv6 address counts as its IPv4
/// address), with a key drawn once per process: a client cannot aim at another's hash.
pub fn client_ip_hash(ip: IpAddr) -> u64 {
    static KEY: LazyLock<std::collections::hash_map::RandomState> =
        LazyLock::new(std::collections::hash_map::RandomState::new);
    let v6 = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    KEY.hash_one(u128::from(v6))
}

/// A connection's client address as the forwarding headers write it, made once per connection
/// (the requests of a keep-alive connection reuse it): formatting the address, and checking the
/// values made from it, were most of what the forwarding headers cost a proxied request.
#[derive(Debug, Clone)]
pub struct ClientText {
    /// The address alone: the element `X-Forwarded-For` gets.
    pub(crate) ip: HeaderValue,
    /// `for=ADDRESS;proto=SCHEME`: the element `Forwarded` gets, before its host.
    pub(crate) element: Box<str>,
    /// `X-Forwarded-Proto`: the scheme the client connected with.
    pub(crate) proto: HeaderValue,
}

impl ClientText {
    /// The text of a hop whose client used the hop's own scheme.
    #[cfg(test)]
    pub(crate) fn new(client: IpAddr, tls: bool) -> Self {
        Self::with_scheme(client, tls, tls)
    }

    /// The text of a hop (`tls`: whether the request reached the gateway over TLS) whose
    /// client used HTTPS (`https`) or not: `Forwarded` describes the hop (`proto=` of the
    /// request the gateway got), `X-Forwarded-Proto` the client's scheme, which a trusted proxy
    /// may have reported. Made once per connection, so each text is built at its final size: a
    /// `String` grown and then shrunk into a `Box<str>` reallocated, and a `HeaderValue` made
    /// from a `String` with room to spare allocated a second block for the `Bytes`' shared
    /// header.
    pub(crate) fn with_scheme(client: IpAddr, tls: bool, https: bool) -> Self {
        let mut buf = [0u8; 48];
        // ASCII digits, dots, colons and hex letters: always UTF-8, and a valid field value.
        let ip = std::str::from_utf8(crate::ip_text::ip_text(client, &mut buf)).unwrap_or_default();
        let (open, close) = match client {
            IpAddr::V4(_) => ("for=", ""),
            IpAddr::V6(_) => ("for=\"[", "]\""),
        };
        let proto = if tls { ";proto=https" } else { ";proto=http" };
        let mut element = String::with_capacity(open.len() + ip.len() + close.len() + proto.len());
        for part in [open, ip, close, proto] {
            element.push_str(part);
        }
        Self {
            ip: HeaderValue::from_str(ip).unwrap_or(HeaderValue::from_static("unknown")),
            element: element.into_boxed_str(),
            proto: if https { HTTPS } else { HTTP },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_client_keeps_the_peer_for_the_forwarding_headers() {
        let peer: SocketAddr = "10.0.0.1:40000".parse().unwrap();
        let conn = ConnInfo::new(peer, "10.0.0.2:80".parse().unwrap(), "l".into(), true, None);
        let client: SocketAddr = "[2001:db8::7]:0".parse().unwrap();
        let req = conn.for_client(client);
        assert_eq!((req.client, req.peer), (client, peer));
        assert_eq!(req.peer_text().ip, "10.0.0.1");
        assert_eq!(&*req.peer_text().element, "for=10.0.0.1;proto=https");
        // A load balancer that ended the client's TLS and says so: `X-Forwarded-Proto` carries
        // the client's scheme, `Forwarded` still the hop's.
        let plain = ConnInfo::new(
            peer,
            "10.0.0.2:80".parse().unwrap(),
            "l".into(),
            false,
            None,
        );
        let req = plain.via_proxy(client, true);
        assert_eq!(req.peer_text().proto, "https");
        assert_eq!(&*req.peer_text().element, "for=10.0.0.1;proto=http");
        assert!(req.https && !req.tls);
        assert_eq!(req.client_hash(), client_ip_hash(client.ip()));
        assert_ne!(req.client_hash(), conn.client_hash());
    }
}
