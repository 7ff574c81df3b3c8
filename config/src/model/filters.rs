//! The native filters' settings (`caches:` too): cache, forward_auth, basic_auth, rewrite,
//! rate_limit, headers, cors, compress, jwt.

use super::*;

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

pub(super) fn default_cache_key() -> Vec<String> {
    ["method", "host", "path", "query"]
        .map(String::from)
        .to_vec()
}

pub(super) fn default_cache_max_object_size() -> ByteSize {
    ByteSize::mib(8)
}

pub(super) fn default_cache_coalesce_timeout() -> Duration {
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

pub(super) fn default_forward_auth_timeout() -> Duration {
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

pub(super) fn default_basic_auth_cache() -> Duration {
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

pub(super) fn client_ip() -> String {
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

pub(super) fn default_cors_methods() -> Vec<String> {
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

pub(super) fn default_compress_filter_min_size() -> ByteSize {
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

pub(super) fn default_jwt_algorithms() -> Vec<String> {
    [
        "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
    ]
    .map(String::from)
    .to_vec()
}

pub(super) fn default_jwt_from() -> String {
    "bearer".into()
}

pub(super) fn default_clock_skew() -> Duration {
    Duration::from_secs(60)
}

pub(super) fn default_jwks_refresh() -> Duration {
    Duration::from_secs(600)
}
