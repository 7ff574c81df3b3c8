//! A finished span as it waits in the export queue. Built on the request path, so it holds
//! what the request already has (static strings, `Arc<str>` route names, reference-counted
//! header and URI bytes, addresses) and leaves the formatting (hex, IP text, lossy UTF-8,
//! stripping ports) to the exporter task: a recorded span costs its attribute vector and
//! nothing else.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use http::uri::{Authority, PathAndQuery};

use super::context::{SpanId, TraceId};

/// What a span describes, as OTLP's `SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Work the gateway serves (a request, a connection).
    Server,
    /// Work the gateway asks of another service (an upstream attempt).
    Client,
    /// Work inside the gateway that groups other spans (a plugin's HTTP call).
    Internal,
}

/// An attribute value; text is made at export time.
#[derive(Debug, Clone)]
pub enum Value {
    /// Static text.
    Static(&'static str),
    /// Shared text (route and stream names).
    Shared(Arc<str>),
    /// Owned text.
    Owned(Box<str>),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// An IP address, as text.
    Ip(IpAddr),
    /// A header value, as lossy UTF-8.
    Header(HeaderValue),
    /// The path of a request target (the query is left out: it often carries credentials).
    Path(PathAndQuery),
    /// The host of an authority.
    Host(Authority),
    /// The host of a `Host` header (port stripped).
    HostHeader(HeaderValue),
}

impl Value {
    /// The text or integer this stands for.
    pub fn resolve(&self) -> Resolved<'_> {
        match self {
            Self::Static(s) => Resolved::Str(std::borrow::Cow::Borrowed(s)),
            Self::Shared(s) => Resolved::Str(std::borrow::Cow::Borrowed(s)),
            Self::Owned(s) => Resolved::Str(std::borrow::Cow::Borrowed(s)),
            Self::Int(i) => Resolved::Int(*i),
            Self::Bool(b) => Resolved::Bool(*b),
            Self::Ip(ip) => Resolved::Str(ip.to_string().into()),
            Self::Header(v) => Resolved::Str(String::from_utf8_lossy(v.as_bytes())),
            Self::Path(p) => Resolved::Str(std::borrow::Cow::Borrowed(p.path())),
            Self::Host(a) => Resolved::Str(std::borrow::Cow::Borrowed(a.host())),
            Self::HostHeader(v) => {
                let text = String::from_utf8_lossy(v.as_bytes());
                Resolved::Str(strip_port(&text).to_owned().into())
            }
        }
    }
}

/// A resolved attribute value.
#[derive(Debug, PartialEq)]
pub enum Resolved<'a> {
    /// Text.
    Str(std::borrow::Cow<'a, str>),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

/// How a span ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Status {
    /// Nothing to report (OTLP's `UNSET`: success as far as the gateway can tell).
    #[default]
    Unset,
    /// Failed, with a short description.
    Error(Box<str>),
}

/// Where a span's trace came from, for OTLP's span flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parent {
    /// A root span.
    None,
    /// A parent in this process (a client span under the request's server span).
    Local(SpanId),
    /// A parent named by an incoming `traceparent`.
    Remote(SpanId),
}

/// A finished, sampled span.
#[derive(Debug, Clone)]
pub struct SpanData {
    /// The trace.
    pub trace_id: TraceId,
    /// This span.
    pub span_id: SpanId,
    /// Its parent.
    pub parent: Parent,
    /// `tracestate` carried with the trace.
    pub trace_state: Option<HeaderValue>,
    /// Name: the two parts are joined by a space at export (`GET users`), so building a span
    /// formats nothing.
    pub name: (Value, Option<Value>),
    /// Kind.
    pub kind: Kind,
    /// Start, since the Unix epoch.
    pub start: Duration,
    /// End, since the Unix epoch.
    pub end: Duration,
    /// Attributes.
    pub attributes: Vec<(&'static str, Value)>,
    /// Outcome.
    pub status: Status,
}

/// Now, since the Unix epoch (zero if the clock is before it).
pub fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// The host part of `host[:port]` or `[v6]:port`.
pub fn strip_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority
            .find(']')
            .map_or(authority, |end| &authority[..=end]);
    }
    match authority.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

/// The port of `host:port` (`None` without one).
pub fn port_of(authority: &[u8]) -> Option<u16> {
    let colon = authority.iter().rposition(|b| *b == b':')?;
    if authority[colon..].contains(&b']') {
        return None;
    }
    std::str::from_utf8(&authority[colon + 1..])
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_resolve_lazily() {
        let path = Value::Path(PathAndQuery::from_static("/a/b?token=secret"));
        assert_eq!(path.resolve(), Resolved::Str("/a/b".into()));
        let host = Value::HostHeader(HeaderValue::from_static("example.com:8080"));
        assert_eq!(host.resolve(), Resolved::Str("example.com".into()));
        let v6 = Value::HostHeader(HeaderValue::from_static("[::1]:8080"));
        assert_eq!(v6.resolve(), Resolved::Str("[::1]".into()));
        let ip = Value::Ip(IpAddr::from([127, 0, 0, 1]));
        assert_eq!(ip.resolve(), Resolved::Str("127.0.0.1".into()));
    }

    #[test]
    fn ports() {
        assert_eq!(port_of(b"example.com:8080"), Some(8080));
        assert_eq!(port_of(b"example.com"), None);
        assert_eq!(port_of(b"[::1]"), None);
        assert_eq!(port_of(b"[::1]:443"), Some(443));
    }
}
