//! A route's terminal: proxy (split, mirror), redirect, respond and static files.

use super::*;

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

pub(super) fn hundred() -> f64 {
    100.0
}

pub(super) fn default_mirror_in_flight() -> usize {
    1000
}

pub(super) fn default_upgrades() -> Vec<String> {
    vec!["websocket".into()]
}

pub(super) fn yes() -> bool {
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

pub(super) fn found_status() -> u16 {
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

pub(super) fn ok_status() -> u16 {
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

pub(super) fn default_index() -> Vec<String> {
    vec!["index.html".into()]
}
pub(super) fn default_compress() -> Vec<ContentEncoding> {
    vec![
        ContentEncoding::Zstd,
        ContentEncoding::Br,
        ContentEncoding::Gzip,
    ]
}
pub(super) fn default_compress_min_size() -> ByteSize {
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
