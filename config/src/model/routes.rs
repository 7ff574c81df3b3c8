//! `routes:`: a route's match and the single-key map naming each of its filters.

use super::*;

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
