//! Per-request facts every filter and terminal may need: who the client is, which listener and
//! route took the request, when it started, and its place in a trace.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::time::Instant;

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
