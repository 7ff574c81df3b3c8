//! The process-wide sections: Kubernetes as a config source, `server`, `admin`, `telemetry`
//! (metrics, traces, access log) and `certificates` (files or ACME).

use super::*;

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

pub(super) fn default_controller_name() -> String {
    "gateway.dev/controller".into()
}

pub(super) fn default_listen_address() -> std::net::IpAddr {
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

pub(super) fn default_metrics_interval() -> Duration {
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

pub(super) fn stdout() -> String {
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
