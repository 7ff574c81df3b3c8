//! Per-request facts every filter and terminal may need: who the client is, which listener and
//! route took the request, when it started, and its place in a trace.

use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock, OnceLock};

use tokio::time::Instant;

use crate::proxy::ClientText;
use crate::telemetry::trace::TraceCx;

/// Facts about the connection a request arrived on, shared by its requests.
#[derive(Debug)]
pub struct ConnInfo {
    /// The client (after PROXY protocol, when the listener accepts it).
    pub client: SocketAddr,
    /// The local address the connection was accepted on.
    pub local: SocketAddr,
    /// Listener name.
    pub listener: Arc<str>,
    /// Whether the connection is TLS (or QUIC).
    pub tls: bool,
    /// TLS server name the client asked for, if any.
    pub sni: Option<Arc<str>>,
    /// [`client_ip_hash`] of `client`, made when first asked for.
    client_hash: ClientHash,
    /// `client` as the proxy's forwarding headers write it, made when first asked for.
    client_text: OnceLock<ClientText>,
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
            local,
            listener,
            tls,
            sni,
            client_hash: ClientHash::default(),
            client_text: OnceLock::new(),
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

    /// The client's address as the forwarding headers write it.
    pub fn client_text(&self) -> &ClientText {
        self.client_text
            .get_or_init(|| ClientText::new(self.client.ip(), self.tls))
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

/// The per-request context handed to filters and terminals (cheap to clone).
#[derive(Debug, Clone)]
pub struct RequestCx {
    /// The connection.
    pub conn: Arc<ConnInfo>,
    /// Name of the matched route.
    pub route: Arc<str>,
    /// When the request arrived.
    pub start: Instant,
    /// The request's trace (its server span), when tracing is configured: the proxy starts
    /// its attempts' spans under it and sends its `traceparent` upstream.
    pub trace: Option<TraceCx>,
    /// The request's head as the terminal got it, for filters that read it after the
    /// request-header phase (a Wasm plugin's later callbacks). The chain sets it only when
    /// one of the route's filters asks ([`crate::filter::FilterFactory::reads_request_later`]):
    /// moved in when the terminal only looks at the head, copied when the terminal takes it.
    pub request_head: Option<Arc<http::request::Parts>>,
}

impl RequestCx {
    /// The client's IP address.
    pub fn client_ip(&self) -> std::net::IpAddr {
        self.conn.client.ip()
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.conn.tls { "https" } else { "http" }
    }
}
