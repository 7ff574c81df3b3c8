//! Per-request facts every filter and terminal may need: who the client is, which listener and
//! route took the request, when it started, and its place in a trace.

use std::sync::Arc;

use tokio::time::Instant;

use crate::connection::ConnInfo;
use crate::telemetry::trace::TraceCx;

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
    /// The claims of the token a `jwt` filter verified, for later filters, plugins and the
    /// access log.
    pub jwt: Option<Arc<crate::filter::jwt::JwtClaims>>,
    /// The user an authentication filter (`basic_auth`) let in, for later filters and the
    /// access log.
    pub user: Option<Arc<str>>,
    /// The request's path and field values are slices of a copy of its head made for the
    /// request alone (the HTTP/1.1 fast path's), not of a connection's read buffer: keeping them
    /// holds no more than the head, so the proxy need not copy them out
    /// ([`crate::proxy::headers::detach`]).
    pub private_head: bool,
}

impl RequestCx {
    /// A request's context on a plain listener from 127.0.0.1, on route `r`, for unit tests.
    #[cfg(test)]
    pub(crate) fn test() -> Self {
        let addr: std::net::SocketAddr = "127.0.0.1:1".parse().expect("address");
        Self {
            conn: Arc::new(ConnInfo::new(addr, addr, Arc::from("l"), false, None)),
            route: Arc::from("r"),
            start: Instant::now(),
            trace: None,
            request_head: None,
            jwt: None,
            user: None,
            private_head: false,
        }
    }

    /// The client's IP address.
    pub fn client_ip(&self) -> std::net::IpAddr {
        self.conn.client.ip()
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.conn.https { "https" } else { "http" }
    }
}
