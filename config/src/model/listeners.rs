//! `listeners:`: protocols, limits and timeouts, path normalization, HTTP/2 and HTTP/3
//! settings, and the listener's TLS.

use super::*;

/// An HTTP protocol a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HttpProtocol {
    /// HTTP/1.1 (and 1.0).
    Http1,
    /// HTTP/2: ALPN `h2` over TLS, prior-knowledge h2c in cleartext.
    Http2,
    /// HTTP/3 over QUIC (TLS required).
    Http3,
}

/// One entry of `listeners:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Unique name, referenced by routes.
    pub name: String,
    /// `ip:port`.
    pub bind: String,
    /// Protocols served; default `[http1, http2]`.
    #[serde(default = "default_protocols")]
    pub protocols: Vec<HttpProtocol>,
    /// TLS; cleartext when absent.
    pub tls: Option<ListenerTlsConfig>,
    /// Largest request head (request line plus headers) accepted; beyond it, 431.
    #[serde(default = "default_max_header_size")]
    pub max_header_size: ByteSize,
    /// Longest URI accepted; beyond it, 414.
    #[serde(default = "default_max_uri_length")]
    pub max_uri_length: ByteSize,
    /// Largest request body accepted on this listener (413 beyond it); 0 means unlimited.
    #[serde(default)]
    pub max_body_size: ByteSize,
    /// Time allowed for a request head to arrive once its first byte has been read.
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout: Duration,
    /// A connection with no request in flight and no traffic for this long is closed.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: Duration,
    /// Longest wait for the next bytes of a request body the gateway is reading; beyond it the
    /// request gets 408 and the connection closes. 0 turns it off.
    #[serde(default = "default_body_read_timeout")]
    pub body_read_timeout: Duration,
    /// Longest a connection may refuse every byte the gateway has to send (a client that stopped
    /// reading); it is then closed. 0 turns it off.
    #[serde(default = "default_write_timeout")]
    pub write_timeout: Duration,
    /// Cap on concurrent connections; 0 means unlimited.
    #[serde(default)]
    pub max_connections: usize,
    /// Expect a PROXY protocol v1/v2 header from a front load balancer.
    #[serde(default)]
    pub accept_proxy_protocol: bool,
    /// Peers (CIDRs, or bare addresses) whose `X-Forwarded-For` / `Forwarded` name the client.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Plain HTTP/1.1 `GET`/`HEAD` requests for a fixed response or a cached static file are
    /// answered without the general HTTP/1 machinery (see docs/architecture.md); `false`
    /// sends every request through it.
    #[serde(default = "yes")]
    pub http1_fast_path: bool,
    /// Accept only request targets within RFC 3986: `"`, `<`, `>`, `` ` ``, `{`, `}`, `|`, `^`
    /// and `\` are refused with 400 instead of being taken (the first four percent-encoded) as
    /// nginx takes them.
    #[serde(default)]
    pub strict_uri: bool,
    /// How request paths are normalized before routing (dot segments, escapes, slashes).
    #[serde(default)]
    pub path_normalization: PathNormalization,
    /// HTTP/2 settings.
    #[serde(default)]
    pub http2: Http2Settings,
    /// HTTP/3 (QUIC) settings; used when `protocols` includes `http3`.
    #[serde(default)]
    pub http3: Http3Settings,
}

/// `listeners[].path_normalization`: the one form of a request's path that routes, filters,
/// plugins and (by default) the upstream see. Dot segments are always removed and escapes of
/// unreserved characters always decoded.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PathNormalization {
    /// Merge runs of `/` into one (`/a//b` is `/a/b`).
    pub merge_slashes: bool,
    /// What `%2F`, `%5C` and a raw `\` in a path do.
    pub escaped_slashes: EscapedSlashesAction,
    /// Which path the upstream is sent.
    pub forward: PathForward,
}

impl Default for PathNormalization {
    fn default() -> Self {
        Self {
            merge_slashes: true,
            escaped_slashes: EscapedSlashesAction::Reject,
            forward: PathForward::Normalized,
        }
    }
}

/// `path_normalization.escaped_slashes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EscapedSlashesAction {
    /// Refuse the request with `400`.
    #[default]
    Reject,
    /// Keep them as data, never as a separator (a raw `\` is sent as `%5C`).
    Keep,
    /// Decode them to `/`, a separator, before dot segments are removed.
    Decode,
}

/// `path_normalization.forward`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PathForward {
    /// The normalized path.
    #[default]
    Normalized,
    /// The path as the client wrote it (routing still uses the normalized one).
    Original,
}

pub(super) fn default_protocols() -> Vec<HttpProtocol> {
    vec![HttpProtocol::Http1, HttpProtocol::Http2]
}
pub(super) fn default_max_header_size() -> ByteSize {
    ByteSize::kib(64)
}
pub(super) fn default_max_uri_length() -> ByteSize {
    ByteSize::kib(8)
}
pub(super) fn default_header_read_timeout() -> Duration {
    Duration::from_secs(10)
}
pub(super) fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}
pub(super) fn default_body_read_timeout() -> Duration {
    Duration::from_secs(30)
}
pub(super) fn default_write_timeout() -> Duration {
    Duration::from_secs(60)
}

/// Per-listener HTTP/2 settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Http2Settings {
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: u32,
    /// Initial stream flow-control window.
    pub initial_stream_window: ByteSize,
    /// Initial connection flow-control window.
    pub initial_connection_window: ByteSize,
}

impl Default for Http2Settings {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 256,
            initial_stream_window: ByteSize::kib(1024),
            initial_connection_window: ByteSize::mib(4),
        }
    }
}

/// Per-listener HTTP/3 (QUIC) settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Http3Settings {
    /// Concurrent request streams (bidirectional) a client may open on one connection.
    pub max_concurrent_streams: u32,
    /// Flow-control window of each request stream (how much of a request body may be in flight).
    pub stream_receive_window: ByteSize,
    /// Flow-control window of the whole connection (all request bodies together).
    pub connection_receive_window: ByteSize,
    /// A connection that receives no packet for this long is closed; default: the listener's
    /// `idle_timeout`.
    pub idle_timeout: Option<Duration>,
    /// Cap on concurrent QUIC connections (new ones are refused); default: the listener's
    /// `max_connections`; 0 means unlimited.
    pub max_connections: Option<usize>,
    /// Congestion controller of each connection.
    pub congestion_control: CongestionControl,
    /// Accept 0-RTT early data from resuming clients; only GET, HEAD and OPTIONS are served from
    /// it, other methods get 425 Too Early.
    pub enable_0rtt: bool,
}

impl Default for Http3Settings {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 128,
            stream_receive_window: ByteSize::mib(1),
            connection_receive_window: ByteSize::mib(4),
            idle_timeout: None,
            max_connections: None,
            congestion_control: CongestionControl::Cubic,
            enable_0rtt: false,
        }
    }
}

/// A QUIC congestion controller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CongestionControl {
    /// CUBIC (RFC 9438), the usual TCP default.
    #[default]
    Cubic,
    /// BBR (model-based; quinn's implementation is experimental).
    Bbr,
    /// NewReno (RFC 9002's reference controller).
    NewReno,
}

/// `listeners[].tls`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsConfig {
    /// Names from `certificates:`; SNI picks among them.
    pub certificates: Vec<String>,
    /// Lowest TLS version accepted: `1.2` (default) or `1.3`.
    #[serde(default)]
    pub min_version: TlsVersion,
    /// PEM CA bundle: when set, clients must present a certificate signed by it (mTLS).
    pub client_ca: Option<PathBuf>,
    /// Send `Strict-Transport-Security` on every response of this listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hsts: Option<HstsConfig>,
}

/// `listeners[].tls.hsts`: HTTP Strict Transport Security (RFC 6797).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HstsConfig {
    /// How long browsers remember to use HTTPS only (`max-age`).
    pub max_age: Duration,
    /// The policy covers subdomains too (`includeSubDomains`).
    pub include_subdomains: bool,
    /// Ask to be put on browsers' preload lists (`preload`; needs `include_subdomains` and a
    /// `max_age` of at least 365d).
    pub preload: bool,
}

impl Default for HstsConfig {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(365 * 24 * 3600),
            include_subdomains: false,
            preload: false,
        }
    }
}

/// A TLS protocol version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum TlsVersion {
    /// TLS 1.2.
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3.
    #[serde(rename = "1.3")]
    Tls13,
}
