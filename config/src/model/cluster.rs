//! `cluster:` (state shared through Redis) and what its users choose: a rate limit's scope,
//! its fallback and headers, a plugin's shared data.

use super::*;

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

pub(super) fn default_cluster_prefix() -> String {
    "gw".into()
}
pub(super) fn default_cluster_timeout() -> Duration {
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
