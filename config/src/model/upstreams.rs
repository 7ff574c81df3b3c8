//! `upstreams:`: targets, balancing, the protocol and TLS spoken to them, health checks and
//! the connection pool.

use super::*;

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

pub(super) fn default_connect_timeout() -> Duration {
    Duration::from_secs(2)
}
pub(super) fn default_upstream_timeout() -> Duration {
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

pub(super) fn one_u32() -> u32 {
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
