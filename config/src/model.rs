//! The serde form of the YAML file: one struct per section, mirroring the contract in
//! `gateway.example.yaml`. These types are strict about unknown keys and permissive about
//! defaults; cross-references (upstream names, certificates, plugins, WAF policies) are checked
//! later by [`crate::validate`], which turns this form into the runtime [`crate::Config`].

use std::path::PathBuf;

use indexmap::IndexMap;
use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Duration};

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Process-wide settings (drain timeout, worker threads).
    #[serde(default)]
    pub server: ServerSettings,
    /// The admin API; off when absent.
    pub admin: Option<AdminConfig>,
    /// Traces and access logs.
    pub telemetry: Option<TelemetryConfig>,
    /// Named certificate/key pairs.
    #[serde(default)]
    pub certificates: IndexMap<String, CertificateConfig>,
    /// HTTP listeners.
    #[serde(default)]
    pub listeners: Vec<ListenerConfig>,
    /// Named upstream pools.
    #[serde(default)]
    pub upstreams: IndexMap<String, UpstreamConfig>,
    /// Named proxy-wasm plugins.
    #[serde(default)]
    pub plugins: IndexMap<String, PluginConfig>,
    /// Named WAF policies.
    #[serde(default)]
    pub waf: IndexMap<String, WafPolicyConfig>,
    /// Named HTTP response caches, used by the `cache` filter.
    #[serde(default)]
    pub caches: IndexMap<String, CacheStoreConfig>,
    /// HTTP routes, first match wins.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// L4 TCP/UDP streams.
    #[serde(default)]
    pub streams: Vec<StreamConfig>,
    /// State shared with other gateway instances through Redis; everything is local when absent.
    pub cluster: Option<ClusterConfig>,
    /// Routes taken from a Kubernetes cluster's Gateway API objects; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesConfig>,
}

impl RawConfig {
    /// Adds the listeners, certificates, upstreams, routes and streams of `other` (made by the
    /// Kubernetes controller) to this file's own: its routes go first, so that the cluster's
    /// hostnames and paths are matched on its listeners before the file's catch-alls.
    pub fn merge(&mut self, other: &RawConfig) {
        self.listeners.extend(other.listeners.iter().cloned());
        for (name, cert) in &other.certificates {
            self.certificates.insert(name.clone(), cert.clone());
        }
        for (name, upstream) in &other.upstreams {
            self.upstreams.insert(name.clone(), upstream.clone());
        }
        let own = std::mem::take(&mut self.routes);
        self.routes = other.routes.iter().cloned().chain(own).collect();
        self.streams.extend(other.streams.iter().cloned());
    }
}

/// `kubernetes:` the Gateway API controller: which GatewayClasses are served, where their
/// Gateways' listeners are bound and which namespaces are watched.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// A kubeconfig file (its current context is used); the pod's service-account credentials
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// GatewayClasses whose `spec.controllerName` is this are served by this gateway.
    #[serde(default = "default_controller_name")]
    pub controller_name: String,
    /// The address Gateway listeners' ports are bound on.
    #[serde(default = "default_listen_address")]
    pub listen_address: std::net::IpAddr,
    /// Namespaces watched for Gateways, routes, Services, EndpointSlices, ReferenceGrants and
    /// Secrets; all when empty.
    #[serde(default)]
    pub namespaces: Vec<String>,
}

fn default_controller_name() -> String {
    "gateway.dev/controller".into()
}

fn default_listen_address() -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
}

/// `server:` process-wide settings (an extension of the contract).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// How long a shutdown or reload waits for in-flight work before closing connections.
    pub drain_timeout: Duration,
    /// Runtime worker threads; 0 means one per core.
    pub worker_threads: usize,
    /// Value of the `Server` response header; empty means none is sent.
    pub server_header: String,
    /// Reload automatically when the config file changes.
    pub watch_config: bool,
    /// Client connections that make a burst: once at least this many were open and three
    /// quarters of them have closed, the gateway returns its free memory to the kernel. 0 never.
    pub release_memory_after_burst: usize,
    /// The form of the gateway's own log on stderr (not the access log).
    pub log_format: LogFormat,
    /// A directory keeping plugins' compiled code, so a restart or reload of an unchanged
    /// module skips compiling it. Off when absent.
    pub wasm_cache: Option<WasmCacheConfig>,
}

/// `server.wasm_cache`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WasmCacheConfig {
    /// The directory (relative to the config file; created if missing), e.g. systemd's
    /// `CacheDirectory`, `/var/cache/gateway`.
    pub path: PathBuf,
    /// Largest total size of the cached files; the least recently used go first.
    #[serde(default = "WasmCacheConfig::default_max_size")]
    pub max_size: ByteSize,
}

impl WasmCacheConfig {
    fn default_max_size() -> ByteSize {
        ByteSize::mib(512)
    }
}

/// `server.log_format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One human-readable line per event, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, fields and the enclosing spans.
    Json,
}

impl ServerSettings {
    /// `release_memory_after_burst` when the config does not set it.
    pub const DEFAULT_RELEASE_MEMORY_AFTER_BURST: usize = 1024;
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            drain_timeout: Duration::from_secs(30),
            worker_threads: 0,
            server_header: "gateway".into(),
            watch_config: true,
            release_memory_after_burst: Self::DEFAULT_RELEASE_MEMORY_AFTER_BURST,
            log_format: LogFormat::Text,
            wasm_cache: None,
        }
    }
}

/// `admin:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin listener.
    pub bind: String,
    /// Allow a bind address other than loopback. Whoever reaches the port can reload the config
    /// and read it (unless `token` is set), so this is an explicit decision.
    #[serde(default)]
    pub allow_remote: bool,
    /// Bearer token every admin request must carry as `Authorization: Bearer TOKEN`, except
    /// `GET /health` and `GET /ready`; others are answered `401`. At least 16 characters of
    /// `A-Z a-z 0-9 - . _ ~ + /`, optionally ending in `=`. Exclusive with `token_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A file whose contents, without surrounding whitespace, are the token (read at start and
    /// at every reload, so it can be rotated without writing it into the config file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Origins and hosts the admin API accepts besides the listener's own address forms
    /// (`127.0.0.1:PORT`, `localhost:PORT`, `[::1]:PORT`, the bound address): `host:port` or
    /// `http(s)://host[:port]`. Checked against `Host` on every request (DNS rebinding) and
    /// against `Origin` on every request other than `GET` and `HEAD` (cross-site requests).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<String>,
}

/// `telemetry:`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// `service.name` resource attribute.
    pub service_name: Option<String>,
    /// More resource attributes for spans and metrics (`deployment.environment: prod`).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub resource_attributes: IndexMap<String, String>,
    /// OTLP trace export.
    pub traces: Option<TracesConfig>,
    /// OTLP metrics export (the `/metrics` registry, pushed periodically).
    pub metrics: Option<MetricsExportConfig>,
    /// Access log.
    pub access_log: Option<AccessLogConfig>,
}

/// `telemetry.metrics`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsExportConfig {
    /// Collector endpoint; a URL ending in `/v1/metrics` means OTLP/HTTP protobuf, else OTLP/gRPC.
    pub otlp_endpoint: String,
    /// Time between exports.
    #[serde(default = "default_metrics_interval")]
    pub interval: Duration,
    /// Headers sent with every export (a collector's API key).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<String, String>,
}

impl MetricsExportConfig {
    /// `interval` when neither the file nor the environment sets it.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
}

fn default_metrics_interval() -> Duration {
    MetricsExportConfig::DEFAULT_INTERVAL
}

/// `telemetry.traces`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TracesConfig {
    /// Collector endpoint; a URL ending in `/v1/traces` means OTLP/HTTP protobuf, else OTLP/gRPC.
    pub otlp_endpoint: String,
    /// Parent-based sampling ratio for new traces (1.0 when neither the file nor
    /// `OTEL_TRACES_SAMPLER` sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_ratio: Option<f64>,
    /// Headers sent with every export (a collector's API key).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<String, String>,
}

impl TracesConfig {
    /// The sampling ratio in force.
    pub fn ratio(&self) -> f64 {
        self.sample_ratio.unwrap_or(1.0)
    }
}

/// `telemetry.access_log`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AccessLogConfig {
    /// `stdout`, `stderr` or a file path.
    #[serde(default = "stdout")]
    pub path: String,
    /// Line format.
    #[serde(default)]
    pub format: AccessLogFormat,
}

fn stdout() -> String {
    "stdout".into()
}

/// Access log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// The Apache/nginx combined format.
    Combined,
}

/// A named certificate: PEM files (`cert` and `key`), or `acme` to have it issued and renewed.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    /// PEM certificate chain, leaf first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1; RSA, ECDSA or Ed25519).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// Issue and renew the certificate from an ACME CA instead of reading files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<AcmeConfig>,
    /// Staple OCSP responses when the certificate names an OCSP responder (default on).
    #[serde(default = "yes")]
    pub ocsp_stapling: bool,
}

/// `certificates.NAME.acme`: automatic issuance and renewal (RFC 8555).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// DNS names the certificate covers (the first is its subject).
    pub domains: Vec<String>,
    /// Contact address given to the CA (expiry notices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// The CA's directory URL (`https://`).
    pub directory: String,
    /// How the CA checks control of the names.
    #[serde(default)]
    pub challenge: AcmeChallenge,
    /// Directory for the account key, certificate key and certificate (kept across restarts).
    pub storage: PathBuf,
    /// PEM CA bundle trusted for the directory's HTTPS instead of the public roots (test CAs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory_ca: Option<PathBuf>,
    /// Renew when this much validity remains; default: a third of the certificate's lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<Duration>,
}

/// An ACME challenge type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum AcmeChallenge {
    /// Answered on the TLS listener itself (ALPN `acme-tls/1`, port 443 as the CA sees it).
    #[default]
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
    /// Answered on a plain-HTTP listener (`/.well-known/acme-challenge/`, port 80).
    #[serde(rename = "http-01")]
    Http01,
}

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

fn default_protocols() -> Vec<HttpProtocol> {
    vec![HttpProtocol::Http1, HttpProtocol::Http2]
}
fn default_max_header_size() -> ByteSize {
    ByteSize::kib(64)
}
fn default_max_uri_length() -> ByteSize {
    ByteSize::kib(8)
}
fn default_header_read_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_body_read_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_write_timeout() -> Duration {
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

/// One entry of `upstreams:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Target addresses, each `host:port` or `{address, weight}`.
    pub targets: Vec<TargetConfig>,
    /// Balancing algorithm.
    #[serde(default)]
    pub balance: Balance,
    /// Key for `consistent_hash`.
    pub hash_on: Option<String>,
    /// Protocol spoken to the targets.
    #[serde(default)]
    pub protocol: UpstreamProtocol,
    /// TLS to the targets.
    pub tls: Option<UpstreamTlsConfig>,
    /// Time allowed to connect (and handshake).
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: Duration,
    /// Time allowed for the whole response; waits for the client's request body do not use
    /// it up.
    #[serde(default = "default_upstream_timeout")]
    pub timeout: Duration,
    /// Extra attempts on another target for idempotent requests.
    #[serde(default)]
    pub retries: u32,
    /// Re-resolve host-name targets this often, off the request path; resolved once at load
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolve_every: Option<Duration>,
    /// Health checking; passive checks always run, and never eject the last selectable
    /// target.
    #[serde(default)]
    pub health_check: HealthCheckConfig,
    /// Connection pool settings.
    #[serde(default)]
    pub pool: PoolConfig,
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_upstream_timeout() -> Duration {
    Duration::from_secs(30)
}

/// A target written as a plain address or with a weight.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum TargetConfig {
    /// `127.0.0.1:9001`.
    Address(String),
    /// `{ address: 127.0.0.1:9003, weight: 3 }`.
    Weighted {
        /// `host:port`.
        address: String,
        /// Relative weight (default 1).
        #[serde(default = "one_u32")]
        weight: u32,
    },
}

fn one_u32() -> u32 {
    1
}

/// Balancing algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Smooth weighted round robin.
    #[default]
    RoundRobin,
    /// Fewest requests in flight.
    LeastRequests,
    /// Power of two random choices.
    Random,
    /// Consistent hashing on `hash_on`.
    ConsistentHash,
}

/// Protocol spoken to an upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 (over TLS when `tls` is set).
    #[default]
    Http1,
    /// HTTP/2 over TLS (ALPN h2).
    Http2,
    /// Cleartext HTTP/2 with prior knowledge.
    H2c,
}

/// `upstreams.*.tls`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// SNI and the name verified in the target's certificate.
    pub server_name: Option<String>,
    /// PEM CA bundle to verify targets with; the system's web roots when absent.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS.
    pub cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS.
    pub key: Option<PathBuf>,
    /// Skip verification (testing only).
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// `upstreams.*.health_check`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckConfig {
    /// Path for active checks; no active checks when absent.
    pub path: Option<String>,
    /// Time between active checks.
    pub interval: Duration,
    /// Time allowed for one active check.
    pub timeout: Duration,
    /// Consecutive failures before a target is ejected.
    pub unhealthy_after: u32,
    /// Consecutive successes (active) before an ejected target returns.
    pub healthy_after: u32,
    /// How long a passively ejected target stays out before it is tried again.
    pub eject_for: Duration,
    /// What passive checks count as a target's failure besides connect failures, resets,
    /// broken answers and answers not in time.
    pub passive: PassiveHealthConfig,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        Self {
            path: None,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            unhealthy_after: 2,
            healthy_after: 2,
            eject_for: Duration::from_secs(10),
            passive: PassiveHealthConfig::default(),
        }
    }
}

/// `upstreams.*.health_check.passive`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PassiveHealthConfig {
    /// Statuses (`500`–`599`) that count as the target's failure when the target itself answers
    /// with them. None by default: a backend's 5xx usually answers one URL, which clients
    /// choose, so it says nothing about the target as a whole.
    pub statuses: Vec<u16>,
}

/// `upstreams.*.pool`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Idle keep-alive connections kept per target.
    pub max_idle_per_target: usize,
    /// Idle connections are closed after this long.
    pub idle_timeout: Duration,
    /// Cap on connections per target; 0 means unlimited. Requests wait for a free one.
    pub max_connections_per_target: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_idle_per_target: 256,
            idle_timeout: Duration::from_secs(90),
            max_connections_per_target: 0,
        }
    }
}

/// One entry of `plugins:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// Path of the .wasm module.
    pub wasm: PathBuf,
    /// Handed to the plugin as JSON at configure time.
    #[schemars(with = "Option<serde_json::Value>")]
    pub config: Option<serde_yaml::Value>,
    /// Handed to the plugin as VM configuration at start.
    #[schemars(with = "Option<serde_json::Value>")]
    pub vm_config: Option<serde_yaml::Value>,
    /// Per-call limits.
    #[serde(default)]
    pub limits: PluginLimits,
    /// Where the plugin's shared data and shared queues live.
    #[serde(default)]
    pub shared_data: SharedDataConfig,
}

/// `plugins.*.limits`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PluginLimits {
    /// Linear memory cap per VM.
    pub memory: ByteSize,
    /// CPU time per guest call.
    pub time: Duration,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self {
            memory: ByteSize::mib(64),
            time: Duration::from_millis(100),
        }
    }
}

/// One entry of `waf:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WafPolicyConfig {
    /// `block` or `detect`.
    #[serde(default)]
    pub mode: WafMode,
    /// Built-in detectors.
    #[serde(default)]
    pub detect: Vec<WafDetector>,
    /// Largest inspected request body; larger ones get 413.
    #[serde(default = "default_waf_max_body")]
    pub max_body: ByteSize,
    /// Custom rules.
    #[serde(default)]
    pub rules: Vec<WafRuleConfig>,
    /// Client networks that bypass the policy.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub allow: Vec<IpNet>,
    /// Client networks always refused.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub deny: Vec<IpNet>,
}

fn default_waf_max_body() -> ByteSize {
    ByteSize::mib(1)
}

/// WAF mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WafMode {
    /// Matches are answered with 403.
    #[default]
    Block,
    /// Matches are logged and counted only.
    Detect,
}

/// A built-in WAF detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WafDetector {
    /// SQL injection.
    Sqli,
    /// Cross-site scripting.
    Xss,
    /// `../` and friends.
    PathTraversal,
    /// Known scanner user agents.
    Scanner,
    /// Protocol anomalies.
    Protocol,
    /// Shell command injection.
    CommandInjection,
}

/// A custom WAF rule.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WafRuleConfig {
    /// Rule id, reported on a match.
    pub id: u32,
    /// Where to look: method, path, query, arg:NAME, header:NAME, cookie:NAME, body, client_ip.
    #[serde(rename = "where")]
    pub location: String,
    /// Regular expression.
    #[serde(rename = "match")]
    pub pattern: String,
    /// What to do on a match.
    #[serde(default)]
    pub action: WafAction,
}

/// A WAF rule's action.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WafAction {
    /// Refuse the request (in block mode).
    #[default]
    Block,
    /// Only log the match.
    Log,
}

/// One entry of `routes:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Name reported in logs, metrics and traces.
    pub name: Option<String>,
    /// Listener names; all HTTP listeners when absent.
    pub listeners: Option<Vec<String>>,
    /// Match conditions; all must hold.
    #[serde(rename = "match", default)]
    pub matcher: RouteMatchConfig,
    /// Filters, in order (each a single-key map such as `- waf: strict`).
    #[serde(default, with = "serde_yaml::with::singleton_map_recursive")]
    #[schemars(with = "Vec<FilterConfig>")]
    pub filters: Vec<FilterConfig>,
    /// Terminal: reverse proxy.
    pub proxy: Option<ProxyConfig>,
    /// Terminal: synthetic response.
    pub respond: Option<RespondConfig>,
    /// Terminal: static files.
    #[serde(rename = "static")]
    pub static_files: Option<StaticConfig>,
    /// Terminal: a redirect.
    pub redirect: Option<RedirectConfig>,
}

/// `routes[].match`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteMatchConfig {
    /// Exact host or `*.example.com`.
    pub host: Option<String>,
    /// Exact path.
    pub path: Option<String>,
    /// Path prefix, on segment boundaries as written.
    pub path_prefix: Option<String>,
    /// Regular expression on the path.
    pub path_regex: Option<String>,
    /// Allowed methods.
    pub methods: Option<Vec<String>>,
    /// Required header values (exact).
    #[serde(default)]
    pub headers: IndexMap<String, String>,
    /// Required query parameters: each name present with exactly this value, as sent (not
    /// percent-decoded).
    #[serde(default)]
    pub query: IndexMap<String, String>,
    /// Required headers whose value matches a regular expression (a search: anchor it with
    /// `^...$` to match a whole value); any one of a repeated header's values may match.
    #[serde(default)]
    pub header_regex: IndexMap<String, String>,
    /// Required query parameters whose value, as sent, matches a regular expression (a search,
    /// as for `header_regex`).
    #[serde(default)]
    pub query_regex: IndexMap<String, String>,
}

/// An entry of `routes[].filters`: a single-key map naming the filter.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[allow(
    clippy::large_enum_variant,
    reason = "built once per config load; boxing would buy nothing"
)]
pub enum FilterConfig {
    /// A WAF policy by name.
    Waf(String),
    /// Token-bucket rate limit.
    RateLimit(RateLimitConfig),
    /// A proxy-wasm plugin by name.
    Plugin(String),
    /// Header edits.
    Headers(HeadersFilterConfig),
    /// Cross-origin resource sharing: preflights answered, CORS headers on answers.
    Cors(CorsConfig),
    /// Compression of the route's answers.
    Compress(CompressConfig),
    /// JSON Web Token authentication.
    Jwt(JwtConfig),
    /// HTTP Basic authentication against an htpasswd file.
    BasicAuth(BasicAuthConfig),
    /// Asks an authentication service about each request (Traefik's ForwardAuth, nginx's
    /// `auth_request`).
    ForwardAuth(ForwardAuthConfig),
    /// Path and host rewrite, for the terminal (the route matched on the original).
    Rewrite(RewriteConfig),
    /// An RFC 9111 shared cache of the route's answers.
    Cache(CacheFilterConfig),
}

/// One entry of `caches:`: where a cache keeps its objects.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheStoreConfig {
    /// The memory tier's bound, counting objects' bodies, heads and keys; the least recently
    /// used objects are evicted beyond it.
    pub memory: ByteSize,
    /// A disk tier behind the memory one: objects are also written to files there, read back
    /// on a memory miss, and kept across restarts. Off when absent.
    #[serde(default)]
    pub disk: Option<CacheDiskConfig>,
}

/// `caches.NAME.disk`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheDiskConfig {
    /// The directory of the object files (relative to the config file; created if missing).
    /// One cache per directory.
    pub path: PathBuf,
    /// The bound on the files' total size; the least recently used objects are removed
    /// beyond it.
    pub size: ByteSize,
}

/// `cache:` filter settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheFilterConfig {
    /// The cache (a name under `caches:`).
    pub store: String,
    /// What tells objects apart: `method`, `scheme`, `host`, `path`, `query`, `header:NAME`.
    #[serde(default = "default_cache_key")]
    pub key: Vec<String>,
    /// Freshness given to answers that state none (no `max-age`, `s-maxage` or `Expires`)
    /// and whose status is cacheable by default; `0s` stores only answers that state theirs.
    #[serde(default)]
    pub default_ttl: Duration,
    /// Larger answers go through without being stored.
    #[serde(default = "default_cache_max_object_size")]
    pub max_object_size: ByteSize,
    /// How long a request waits for another one fetching the same object before it goes to
    /// the upstream itself.
    #[serde(default = "default_cache_coalesce_timeout")]
    pub coalesce_timeout: Duration,
    /// How long past its freshness an object is still served at once while it is revalidated
    /// in the background, when the answer has no `stale-while-revalidate` of its own.
    #[serde(default)]
    pub stale_while_revalidate: Duration,
    /// How long past its freshness an object is served when the upstream fails (no answer,
    /// or 500, 502, 503, 504), when the answer has no `stale-if-error` of its own.
    #[serde(default)]
    pub stale_if_error: Duration,
    /// What becomes of an answer carrying `Set-Cookie`: `no_store` passes it on without
    /// storing it; `strip` stores it without its `Set-Cookie` fields (the client whose request
    /// fetched it still gets them, later hits get none).
    #[serde(default)]
    pub set_cookie: CacheSetCookie,
}

/// `cache.set_cookie`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CacheSetCookie {
    /// Answers with `Set-Cookie` are not stored.
    #[default]
    NoStore,
    /// Answers with `Set-Cookie` are stored without those fields.
    Strip,
}

fn default_cache_key() -> Vec<String> {
    ["method", "host", "path", "query"]
        .map(String::from)
        .to_vec()
}

fn default_cache_max_object_size() -> ByteSize {
    ByteSize::mib(8)
}

fn default_cache_coalesce_timeout() -> Duration {
    Duration::from_secs(5)
}

/// `forward_auth:` filter settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForwardAuthConfig {
    /// The service's URL (`http://` or `https://`); or `upstream` and `path`.
    pub url: Option<String>,
    /// An upstream by name (its pools, balancing, health checks and TLS).
    pub upstream: Option<String>,
    /// The path (and query) asked of `upstream`; default `/`.
    pub path: Option<String>,
    /// Client request headers copied onto the auth request.
    #[serde(default)]
    pub request_headers: Vec<String>,
    /// Headers of a 2xx auth answer copied onto the request going on; the client's own
    /// copies are always removed.
    #[serde(default)]
    pub response_headers: Vec<String>,
    /// The whole auth call (answer and body); past it the client gets 504.
    #[serde(default = "default_forward_auth_timeout")]
    pub timeout: Duration,
}

fn default_forward_auth_timeout() -> Duration {
    Duration::from_secs(5)
}

/// `basic_auth:` filter settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthConfig {
    /// The realm named in `WWW-Authenticate`.
    pub realm: String,
    /// The htpasswd file (bcrypt or SHA-crypt entries), relative to the config file; watched
    /// and reloaded when it changes.
    pub htpasswd: PathBuf,
    /// Keep the client's `Authorization` header on the request going on (default: removed, so
    /// the password never reaches the upstream).
    #[serde(default)]
    pub forward_authorization: bool,
    /// A request header set to the authenticated user name (the client's own copy is always
    /// removed).
    pub user_header: Option<String>,
    /// How long a successful check is remembered, so that a logged-in user does not pay the
    /// hash on every request; `0s` turns the cache off.
    #[serde(default = "default_basic_auth_cache")]
    pub cache: Duration,
    /// Password checks running at once; beyond, requests get 503. Default: twice the CPUs.
    pub max_concurrent_checks: Option<usize>,
}

fn default_basic_auth_cache() -> Duration {
    Duration::from_secs(300)
}

/// `rewrite:` filter settings: at most one of `path`, `replace_prefix`, `path_regex`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewriteConfig {
    /// The whole path replaced by this one (the query is kept).
    pub path: Option<String>,
    /// The part of the path the route's `match.path_prefix` matched, replaced by this.
    pub replace_prefix: Option<String>,
    /// A regular expression on the path; the path becomes `to` when it matches.
    pub path_regex: Option<String>,
    /// The new path for `path_regex`, with `$1`..`$9` for its groups and `$$` for `$`.
    pub to: Option<String>,
    /// The `Host` (and HTTP/2 or HTTP/3 `:authority`) the terminal sees, `name[:port]`.
    pub host: Option<String>,
}

/// `rate_limit:` filter settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Requests allowed per `per`.
    pub requests: u64,
    /// The window the rate is expressed in.
    pub per: Duration,
    /// Extra requests allowed in a burst.
    #[serde(default)]
    pub burst: u64,
    /// `client_ip` or `header:NAME`.
    #[serde(default = "client_ip")]
    pub key: String,
    /// `local` (each instance counts alone) or `global` (counted across instances; needs
    /// `cluster:`).
    #[serde(default)]
    pub scope: Scope,
    /// What a `global` limit does while Redis cannot be reached.
    #[serde(default)]
    pub fallback: RateLimitFallback,
    /// Which RateLimit header fields the route's answers carry.
    #[serde(default)]
    pub headers: RateLimitHeaders,
}

fn client_ip() -> String {
    "client_ip".into()
}

/// `headers:` filter settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeadersFilterConfig {
    /// Request headers set (replacing any value).
    #[serde(default)]
    pub request_set: IndexMap<String, String>,
    /// Request headers appended.
    #[serde(default)]
    pub request_add: IndexMap<String, String>,
    /// Request headers removed.
    #[serde(default)]
    pub request_remove: Vec<String>,
    /// Response headers set.
    #[serde(default)]
    pub response_set: IndexMap<String, String>,
    /// Response headers appended.
    #[serde(default)]
    pub response_add: IndexMap<String, String>,
    /// Response headers removed.
    #[serde(default)]
    pub response_remove: Vec<String>,
}

/// `cors:` filter settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CorsConfig {
    /// Origins allowed: exact (`https://app.example.com`), `*`, or a subdomain wildcard
    /// (`https://*.example.com`).
    pub allow_origins: Vec<String>,
    /// Methods a preflight may ask for (`*`: any). GET, HEAD and POST are always allowed, as
    /// in the Fetch standard.
    #[serde(default = "default_cors_methods")]
    pub allow_methods: Vec<String>,
    /// Request headers a preflight may ask for (`*`: the ones asked for).
    #[serde(default)]
    pub allow_headers: Vec<String>,
    /// Response headers the browser lets scripts read.
    #[serde(default)]
    pub expose_headers: Vec<String>,
    /// Whether requests with cookies or HTTP authentication are allowed.
    #[serde(default)]
    pub allow_credentials: bool,
    /// How long a browser may cache a preflight's answer.
    pub max_age: Option<Duration>,
}

fn default_cors_methods() -> Vec<String> {
    ["GET", "HEAD", "POST"].map(String::from).to_vec()
}

/// `compress:` filter settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompressConfig {
    /// Codings offered, in the server's order of preference (used when the client's weights tie).
    #[serde(default = "default_compress")]
    pub algorithms: Vec<ContentEncoding>,
    /// Answers stating a smaller `Content-Length` are sent as they are.
    #[serde(default = "default_compress_filter_min_size")]
    pub min_size: ByteSize,
    /// Media types compressed: `type/subtype`, `type/*` or `*`. Default: text and the usual
    /// text-like application, font and image types.
    pub types: Option<Vec<String>>,
    /// Compression levels per coding.
    #[serde(default)]
    pub level: CompressLevels,
}

fn default_compress_filter_min_size() -> ByteSize {
    ByteSize(1024)
}

/// `compress.level`: a level per coding; the defaults favour speed, as a proxy should.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CompressLevels {
    /// gzip, 1-9.
    pub gzip: u32,
    /// Brotli, 0-11.
    pub br: u32,
    /// Zstandard, 1-19.
    pub zstd: u32,
}

impl Default for CompressLevels {
    fn default() -> Self {
        Self {
            gzip: 5,
            br: 4,
            zstd: 3,
        }
    }
}

/// `jwt:` filter settings: who may sign (`jwks`, `algorithms`), for whom (`issuer`,
/// `audiences`), where the token is (`from`) and what the upstream learns (`claims_to_headers`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The `iss` a token must carry; not checked when absent.
    pub issuer: Option<String>,
    /// Accepted `aud` values (a token's must name one); not checked when empty.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Where the verification keys come from.
    pub jwks: JwksConfig,
    /// Signature algorithms accepted (default: every supported one).
    #[serde(default = "default_jwt_algorithms")]
    pub algorithms: Vec<String>,
    /// Where the token is: `bearer` (`Authorization: Bearer`, the default), `header:NAME`,
    /// `cookie:NAME` or `query:NAME`.
    #[serde(default = "default_jwt_from")]
    pub from: String,
    /// Request headers set from verified claims (claim name to header name).
    #[serde(default)]
    pub claims_to_headers: IndexMap<String, String>,
    /// Leeway on `exp`, `nbf` and `iat`.
    #[serde(default = "default_clock_skew")]
    pub clock_skew: Duration,
    /// Whether a request without a token is refused (a bad token always is).
    #[serde(default = "yes")]
    pub required: bool,
    /// The realm named in `WWW-Authenticate` (default: the route's name).
    pub realm: Option<String>,
}

/// `jwt.jwks`: a JSON Web Key Set from a URL or a file, refreshed on a period.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JwksConfig {
    /// An `http://` or `https://` URL serving the set.
    pub url: Option<String>,
    /// A file holding the set.
    pub file: Option<PathBuf>,
    /// How often the set is fetched again.
    #[serde(default = "default_jwks_refresh")]
    pub refresh: Duration,
}

fn default_jwt_algorithms() -> Vec<String> {
    [
        "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
    ]
    .map(String::from)
    .to_vec()
}

fn default_jwt_from() -> String {
    "bearer".into()
}

fn default_clock_skew() -> Duration {
    Duration::from_secs(60)
}

fn default_jwks_refresh() -> Duration {
    Duration::from_secs(600)
}

/// `routes[].proxy`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Upstream name; exactly one of `upstream` and `split` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Upstreams chosen per request by weight (canary, blue-green), instead of `upstream`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<SplitConfig>,
    /// Copies of the requests sent, fire-and-forget, to another upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<MirrorConfig>,
    /// Time allowed for the whole response on this route, instead of the upstream's `timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Extra attempts on this route, instead of the upstream's `retries` (same rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// Prefix removed from the path before forwarding.
    pub strip_prefix: Option<String>,
    /// Forward the client's Host header (default) or the target's address.
    #[serde(default = "yes")]
    pub preserve_host: bool,
    /// Protocols a client may switch to through this route (`Upgrade` tokens, `name` or
    /// `name/version`, case-insensitive; a name without a version allows every version). A
    /// request asking for any other is forwarded as an ordinary request, without `Upgrade`.
    /// Default `[websocket]`; `[]` allows none.
    #[serde(default = "default_upgrades")]
    pub upgrades: Vec<String>,
}

impl ProxyConfig {
    /// A proxy to one upstream, every other setting at its default.
    pub fn to_upstream(name: &str) -> Self {
        Self {
            upstream: Some(name.to_owned()),
            split: Vec::new(),
            mirror: None,
            timeout: None,
            retries: None,
            strip_prefix: None,
            preserve_host: true,
            upgrades: default_upgrades(),
        }
    }

    /// The upstreams requests go to, with their weights: `upstream` alone (weight 1), or the
    /// `split` entries that name one (not those answering a `status`).
    pub fn backends(&self) -> Vec<(&str, u32)> {
        match &self.upstream {
            Some(u) => vec![(u.as_str(), 1)],
            None => self
                .split
                .iter()
                .filter_map(|s| Some((s.upstream.as_deref()?, s.weight)))
                .collect(),
        }
    }
}

/// An entry of `routes[].proxy.split`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SplitConfig {
    /// Upstream name; exactly one of `upstream` and `status` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Answer this share with this status (400 to 599) instead of forwarding it: fault
    /// injection, and the Kubernetes controller's 500 for backends that do not resolve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Relative share of the requests; 0 sends none (a standby for blue-green).
    pub weight: u32,
}

/// `routes[].proxy.mirror`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MirrorConfig {
    /// Upstream the copies go to.
    pub upstream: String,
    /// Share of the requests copied, 0 to 100.
    #[serde(default = "hundred")]
    pub percent: f64,
    /// Copies in flight at most; a request over it is not copied (counted as dropped).
    #[serde(default = "default_mirror_in_flight")]
    pub max_in_flight: usize,
}

fn hundred() -> f64 {
    100.0
}

fn default_mirror_in_flight() -> usize {
    1000
}

fn default_upgrades() -> Vec<String> {
    vec!["websocket".into()]
}

fn yes() -> bool {
    true
}

/// `routes[].redirect`: parts not given are kept from the request.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedirectConfig {
    /// `http` or `https`.
    pub scheme: Option<String>,
    /// Host name or address, without a port.
    pub host: Option<String>,
    /// Port; the default port of the scheme is left out of `Location`.
    pub port: Option<u16>,
    /// The whole path replaced by this one.
    pub path: Option<String>,
    /// The part of the path the route's `match.path_prefix` matched, replaced by this.
    pub replace_prefix: Option<String>,
    /// Drop the request's query string.
    #[serde(default)]
    pub strip_query: bool,
    /// 301, 302, 303, 307 or 308 (default 302).
    #[serde(default = "found_status")]
    pub status: u16,
}

fn found_status() -> u16 {
    302
}

/// `routes[].respond`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RespondConfig {
    /// Status code (default 200).
    #[serde(default = "ok_status")]
    pub status: u16,
    /// Body text.
    #[serde(default)]
    pub body: String,
    /// Response headers.
    #[serde(default)]
    pub headers: IndexMap<String, String>,
}

fn ok_status() -> u16 {
    200
}

/// `routes[].static`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    /// Directory served.
    pub root: PathBuf,
    /// Index file names tried for a directory.
    #[serde(default = "default_index")]
    pub index: Vec<String>,
    /// Precompressed siblings looked for (`file.br`, `file.gz`, `file.zst`).
    #[serde(default)]
    pub precompressed: Vec<ContentEncoding>,
    /// Encodings applied on the fly to compressible types without a sibling.
    #[serde(default = "default_compress")]
    pub compress: Vec<ContentEncoding>,
    /// Files smaller than this are not compressed on the fly.
    #[serde(default = "default_compress_min_size")]
    pub compress_min_size: ByteSize,
    /// In-memory cache of small files.
    #[serde(default)]
    pub cache: StaticCacheConfig,
    /// `Cache-Control` header value sent with files.
    pub cache_control: Option<String>,
}

fn default_index() -> Vec<String> {
    vec!["index.html".into()]
}
fn default_compress() -> Vec<ContentEncoding> {
    vec![
        ContentEncoding::Zstd,
        ContentEncoding::Br,
        ContentEncoding::Gzip,
    ]
}
fn default_compress_min_size() -> ByteSize {
    ByteSize(256)
}

/// `routes[].static.cache`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StaticCacheConfig {
    /// Files up to this size are cached in memory.
    pub max_file_size: ByteSize,
    /// Total bytes the cache may hold.
    pub max_total_size: ByteSize,
    /// How long a cached entry is trusted before its mtime and size are checked again.
    pub revalidate_after: Duration,
    /// Files larger than `max_file_size` kept open, so that later requests for them are
    /// answered without looking them up again (0: none).
    pub max_open_files: usize,
}

impl Default for StaticCacheConfig {
    fn default() -> Self {
        Self {
            max_file_size: ByteSize::kib(256),
            max_total_size: ByteSize::mib(64),
            revalidate_after: Duration::from_secs(1),
            max_open_files: 1000,
        }
    }
}

/// A content coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContentEncoding {
    /// Brotli (`.br`).
    Br,
    /// gzip (`.gz`).
    Gzip,
    /// Zstandard (`.zst`).
    Zstd,
}

/// One entry of `streams:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// Unique name.
    pub name: String,
    /// `ip:port`.
    pub bind: String,
    /// `tcp` or `udp`.
    pub protocol: StreamProtocol,
    /// Upstream (the fallback when `sni_routes` are set).
    pub upstream: Option<String>,
    /// Server name → upstream, from the TLS ClientHello.
    #[serde(default)]
    pub sni_routes: IndexMap<String, String>,
    /// What to do when no SNI route matches and there is no `upstream`, or the stream is not TLS.
    #[serde(default)]
    pub sni_fallback: SniFallback,
    /// PROXY protocol header sent to the upstream.
    #[serde(default)]
    pub proxy_protocol: ProxyProtocolVersion,
    /// Expect a PROXY protocol header from the client side.
    #[serde(default)]
    pub accept_proxy_protocol: bool,
    /// Connection (TCP) or session (UDP) idle timeout.
    #[serde(default = "default_stream_idle")]
    pub idle_timeout: Duration,
    /// Cap on concurrent connections (TCP) or sessions (UDP); 0 means unlimited.
    #[serde(default)]
    pub max_connections: usize,
    /// Time allowed for the client's PROXY protocol header (`accept_proxy_protocol`) and TLS
    /// ClientHello (`sni_routes`) to arrive.
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout: Duration,
    /// Relay TCP bytes with splice(2) (Linux, no filter inspecting data) instead of copying
    /// them through userspace buffers.
    #[serde(default = "yes")]
    pub zero_copy: bool,
    /// Stream filters, in order (each a single-key map such as `- allow: [...]`).
    #[serde(default, with = "serde_yaml::with::singleton_map_recursive")]
    #[schemars(with = "Vec<StreamFilterConfig>")]
    pub filters: Vec<StreamFilterConfig>,
}

fn default_stream_idle() -> Duration {
    Duration::from_secs(600)
}

/// L4 protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamProtocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// Behaviour when SNI routing finds nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SniFallback {
    /// Use `upstream`, or close when there is none.
    #[default]
    Upstream,
    /// Close the connection.
    Close,
}

/// PROXY protocol version sent upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocolVersion {
    /// No header.
    #[default]
    None,
    /// Text header.
    V1,
    /// Binary header.
    V2,
}

/// An entry of `streams[].filters`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StreamFilterConfig {
    /// Only these client networks are accepted.
    Allow(#[schemars(with = "Vec<String>")] Vec<IpNet>),
    /// These client networks are refused.
    Deny(#[schemars(with = "Vec<String>")] Vec<IpNet>),
    /// A proxy-wasm network filter by name.
    Plugin(String),
    /// New connections per client address.
    ConnectionRate(ConnectionRateConfig),
}

/// `connection_rate:` stream filter.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectionRateConfig {
    /// Connections allowed per `per` and client address.
    pub connections: u64,
    /// Window.
    pub per: Duration,
    /// Extra connections allowed in a burst.
    #[serde(default)]
    pub burst: u64,
}

/// `cluster:`: state shared by several gateway instances through one Redis server (global rate
/// limits, plugin shared data, passive health). Without it every instance keeps its own.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Redis URL: `redis://[user:password@]host:port[/db]`.
    pub redis: String,
    /// Prefix of every key and channel the gateway uses, so fleets can share one server.
    #[serde(default = "default_cluster_prefix")]
    pub prefix: String,
    /// Longest wait for one Redis answer on the request path before falling back.
    #[serde(default = "default_cluster_timeout")]
    pub timeout: Duration,
    /// Publish passive ejections and apply the ones other instances publish.
    #[serde(default)]
    pub share_health: bool,
}

fn default_cluster_prefix() -> String {
    "gw".into()
}
fn default_cluster_timeout() -> Duration {
    Duration::from_millis(50)
}

/// Where a rate limit or a plugin's shared data is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// In this process.
    #[default]
    Local,
    /// In Redis, shared by every instance with the same `cluster` settings.
    Global,
}

/// What a `global` rate limit does while Redis is unreachable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RateLimitFallback {
    /// Fail open to the instance's own limiter (each instance allows the full limit).
    #[default]
    Local,
    /// Fail open: no limit at all.
    Allow,
    /// Fail closed: refuse with 503.
    Deny,
}

/// The RateLimit header fields a `rate_limit` filter adds to its route's answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum RateLimitHeaders {
    /// The current IETF draft (draft-ietf-httpapi-ratelimit-headers-10): `RateLimit` and
    /// `RateLimit-Policy`, structured fields naming the policy.
    #[default]
    #[serde(rename = "draft-10")]
    Draft10,
    /// The earlier drafts' separate fields (draft-06): `RateLimit-Limit`,
    /// `RateLimit-Remaining`, `RateLimit-Reset` and `RateLimit-Policy`, as many existing clients
    /// read them.
    #[serde(rename = "draft-06")]
    Draft06,
    /// No RateLimit fields; a `429` still carries `Retry-After`.
    #[serde(rename = "none")]
    None,
}

/// `plugins.*.shared_data`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SharedDataConfig {
    /// `local` (this process) or `global` (Redis; needs `cluster:`).
    #[serde(default)]
    pub scope: Scope,
}
