//! The validated, runtime form of a configuration. Everything here has been checked: addresses
//! parsed, references resolved to names that exist, regular expressions compiled, paths made
//! absolute. The gateway builds its router, pools and filters from this form.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use indexmap::IndexMap;

use crate::Location;
use crate::locate::SourceMap;
use crate::model::*;

mod jwt;
pub use jwt::{JwksSource, Jwt, JwtAlgorithm, TokenSource};

/// A whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (`<inline>` for strings).
    pub file: String,
    /// Directory relative paths were resolved against.
    pub base_dir: PathBuf,
    /// The YAML text, kept so later stages can locate their own errors.
    pub source: Arc<str>,
    /// Line/column index of `source`.
    pub source_map: Arc<SourceMap>,
    /// The parsed file with paths made absolute (shown by the admin API, secrets redacted).
    pub raw: RawConfig,
    /// Process settings.
    pub server: ServerSettings,
    /// The admin API, when configured.
    pub admin: Option<Admin>,
    /// Telemetry settings.
    pub telemetry: TelemetryConfig,
    /// Certificates, paths absolute.
    pub certificates: IndexMap<String, Certificate>,
    /// HTTP listeners.
    pub listeners: Vec<Listener>,
    /// Upstream pools.
    pub upstreams: IndexMap<String, Upstream>,
    /// Plugins, paths absolute.
    pub plugins: IndexMap<String, Plugin>,
    /// WAF policies.
    pub waf: IndexMap<String, WafPolicy>,
    /// HTTP response caches.
    pub caches: IndexMap<String, CacheStoreConfig>,
    /// Routes in match order.
    pub routes: Vec<Route>,
    /// L4 streams.
    pub streams: Vec<Stream>,
    /// Shared state across instances (`cluster:`), when configured.
    pub cluster: Option<ClusterConfig>,
    /// The Gateway API controller's settings (`kubeconfig` absolute), when configured.
    pub kubernetes: Option<KubernetesConfig>,
}

impl Config {
    /// The location of a key path, for errors found after validation (e.g. an unreadable
    /// certificate found when the gateway loads it).
    pub fn locate(&self, key: &str) -> Location {
        let (line, column) = self.source_map.find(key);
        Location {
            file: self.file.clone(),
            line,
            column,
        }
    }

    /// Refuses a configuration that would serve nothing: no HTTP listener and no stream. Such a
    /// file is almost always a mistake (the wrong file, a section indented under another), and
    /// a gateway started on it would run without answering anything. The command line checks
    /// it on `validate`, `run` and every reload; building a configuration does not, so a test or
    /// a program embedding the gateway may start one with only its admin API.
    pub fn check_serves_something(&self) -> Result<(), crate::ConfigError> {
        // Listeners come from the cluster's Gateways.
        if self.kubernetes.is_some() {
            return Ok(());
        }
        if self.listeners.is_empty() && self.streams.is_empty() {
            return Err(crate::ConfigError::Invalid {
                location: Location {
                    file: self.file.clone(),
                    line: 1,
                    column: 1,
                },
                key: "listeners".into(),
                message: "the configuration serves nothing: it has no `listeners` and no `streams`"
                    .into(),
            });
        }
        Ok(())
    }

    /// Builds a located error for `key`.
    pub fn error(&self, key: impl Into<String>, message: impl Into<String>) -> crate::ConfigError {
        let key = key.into();
        crate::ConfigError::Invalid {
            location: self.locate(&key),
            key,
            message: message.into(),
        }
    }
}

/// The validated `admin:` section.
#[derive(Debug, Clone)]
pub struct Admin {
    /// Listener address (port 0 means "any free port").
    pub addr: SocketAddr,
    /// The bearer token requests must carry (from `token` or `token_file`), when set.
    pub token: Option<AdminToken>,
    /// `origins`, lower-case, in addition to the listener's own address forms.
    pub origins: Vec<AdminOrigin>,
}

/// The admin API's bearer token. Its `Debug` form does not show it, so a logged config does
/// not leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    pub(crate) fn new(token: String) -> Self {
        Self(token)
    }

    /// The token's bytes, to compare a presented one with.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// An entry of `admin.origins`: an authority (`host` or `host:port`, lower-case), and the scheme
/// an `Origin` must have when one was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminOrigin {
    /// `http` or `https`; any scheme when `None`.
    pub scheme: Option<String>,
    /// `host[:port]` as a `Host` header or an origin names it (IPv6 in brackets).
    pub authority: String,
}

/// A validated certificate entry.
#[derive(Debug, Clone)]
pub struct Certificate {
    /// Where the certificate comes from.
    pub source: CertificateSource,
    /// Staple OCSP responses when the certificate names a responder.
    pub ocsp_stapling: bool,
}

/// Where a certificate comes from.
#[derive(Debug, Clone)]
pub enum CertificateSource {
    /// PEM files (absolute paths).
    Files {
        /// Chain, leaf first.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// Issued and renewed by ACME (paths absolute, domains lower-case).
    Acme(AcmeConfig),
}

/// A validated HTTP listener.
#[derive(Debug, Clone)]
pub struct Listener {
    /// Name.
    pub name: String,
    /// Bound address (port 0 means "any free port").
    pub addr: SocketAddr,
    /// Serves HTTP/1.x.
    pub http1: bool,
    /// Serves HTTP/2.
    pub http2: bool,
    /// Serves HTTP/3 (TLS is then present).
    pub http3: bool,
    /// TLS settings.
    pub tls: Option<ListenerTlsConfig>,
    /// `trusted_proxies`, a bare address as its /32 or /128.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Everything else, as written.
    pub settings: ListenerConfig,
}

/// A validated upstream pool.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Name.
    pub name: String,
    /// Targets.
    pub targets: Vec<Target>,
    /// Consistent-hash key.
    pub hash_on: Option<HashKey>,
    /// Everything else, as written (paths absolute).
    pub settings: UpstreamConfig,
}

/// One upstream target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// As written (`host:port`), used as the authority and in metrics.
    pub authority: String,
    /// The host: an IP address, or a name the gateway resolves when it loads the config (and
    /// every `resolve_every`). Validation never looks a name up, so a config can be checked
    /// before its backends exist.
    pub host: String,
    /// The port.
    pub port: u16,
    /// The address when the host is an IP address; `None` for a name.
    pub addr: Option<SocketAddr>,
    /// Relative weight, at least 1.
    pub weight: u32,
}

/// What a consistent hash is computed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The client's IP address.
    ClientIp,
    /// The request path.
    Path,
    /// A request header (lowercase name).
    Header(String),
    /// A cookie by name.
    Cookie(String),
}

/// A validated plugin.
#[derive(Debug, Clone)]
pub struct Plugin {
    /// Name.
    pub name: String,
    /// Absolute path of the module.
    pub wasm: PathBuf,
    /// Plugin configuration as JSON bytes (empty when none).
    pub config_json: Vec<u8>,
    /// VM configuration as JSON bytes (empty when none).
    pub vm_config_json: Vec<u8>,
    /// Per-call limits.
    pub limits: PluginLimits,
}

/// A validated WAF policy.
#[derive(Debug, Clone)]
pub struct WafPolicy {
    /// Name.
    pub name: String,
    /// Custom rules with parsed locations (patterns known to compile).
    pub rules: Vec<WafRule>,
    /// Everything else, as written.
    pub settings: WafPolicyConfig,
}

/// A custom WAF rule.
#[derive(Debug, Clone)]
pub struct WafRule {
    /// Id.
    pub id: u32,
    /// Where to look.
    pub target: WafTarget,
    /// The pattern (compiles).
    pub pattern: String,
    /// What to do.
    pub action: WafAction,
}

/// The part of a request a WAF rule inspects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WafTarget {
    /// The method.
    Method,
    /// The decoded path.
    Path,
    /// The decoded query string.
    Query,
    /// A query or form argument.
    Arg(String),
    /// A header (lowercase).
    Header(String),
    /// A cookie.
    Cookie(String),
    /// The body.
    Body,
    /// The client address.
    ClientIp,
}

/// A validated route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Name (`route-N` when not given).
    pub name: String,
    /// Indices into [`Config::listeners`].
    pub listeners: Vec<usize>,
    /// Host condition.
    pub host: HostMatch,
    /// Path condition.
    pub path: PathMatch,
    /// Allowed methods, uppercase; empty means any.
    pub methods: Vec<String>,
    /// Required headers (lowercase name, exact value).
    pub headers: Vec<(String, String)>,
    /// Required query parameters (name and value exact, as sent).
    pub query: Vec<(String, String)>,
    /// Required headers (lowercase name) with a value the expression finds a match in.
    pub header_regex: Vec<(String, regex::Regex)>,
    /// Required query parameters with a value (as sent) the expression finds a match in.
    pub query_regex: Vec<(String, regex::Regex)>,
    /// Filters in order.
    pub filters: Vec<Filter>,
    /// Terminal action.
    pub action: RouteAction,
}

/// Host condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// Any host.
    Any,
    /// Exactly this host (lowercase, no port).
    Exact(String),
    /// Any host ending in this suffix, which starts with a dot (`*.example.com` → `.example.com`).
    Suffix(String),
}

/// Path condition.
#[derive(Debug, Clone)]
pub enum PathMatch {
    /// Any path.
    Any,
    /// Exactly this path.
    Exact(String),
    /// Paths starting with this prefix.
    Prefix(String),
    /// Paths the expression matches.
    Regex(regex::Regex),
}

/// A validated route filter.
#[derive(Debug, Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "built once per config load; boxing would buy nothing"
)]
pub enum Filter {
    /// WAF policy by name (exists).
    Waf(String),
    /// Rate limit.
    RateLimit {
        /// Settings.
        settings: RateLimitConfig,
        /// Parsed key.
        key: RateLimitKey,
    },
    /// Plugin by name (exists).
    Plugin(String),
    /// Header edits (names and values valid).
    Headers(HeadersFilterConfig),
    /// CORS (origins parse as [`crate::cors::OriginPattern`]s; methods and header names are
    /// tokens; no `*` origin with credentials).
    Cors(CorsConfig),
    /// Compression (codings listed once, types well formed, levels in range).
    Compress(CompressConfig),
    /// JWT authentication.
    Jwt(Jwt),
    /// Basic authentication (`htpasswd` resolved against the config file's directory and
    /// present, `realm` and `user_header` valid).
    BasicAuth(BasicAuthConfig),
    /// Forward authentication.
    ForwardAuth(ForwardAuth),
    /// Path and host rewrite.
    Rewrite(Rewrite),
    /// Response cache (its store exists, its key parts are known).
    Cache(CacheFilter),
}

/// A validated `cache` filter.
#[derive(Debug, Clone)]
pub struct CacheFilter {
    /// Settings as written.
    pub settings: CacheFilterConfig,
    /// The key's parts, parsed.
    pub key: Vec<CacheKeyPart>,
}

/// One part of a cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheKeyPart {
    /// The method (`HEAD` counts as `GET`: a HEAD is answered from the GET's object).
    Method,
    /// `http` or `https`.
    Scheme,
    /// The host the client asked for.
    Host,
    /// The path.
    Path,
    /// The query string.
    Query,
    /// A request header's value (lowercase name).
    Header(String),
}

/// A validated `forward_auth` filter.
#[derive(Debug, Clone)]
pub struct ForwardAuth {
    /// Settings as written, header names lowercased.
    pub settings: ForwardAuthConfig,
    /// Where the auth request goes.
    pub service: AuthService,
    /// The path and query asked.
    pub path: String,
}

/// The service a `forward_auth` filter asks.
#[derive(Debug, Clone)]
pub enum AuthService {
    /// An upstream of `upstreams:` (exists).
    Upstream(String),
    /// The host of a `url`, as an upstream of its own (one target, resolved at load, TLS for
    /// `https`, no retries).
    Url(Box<Upstream>),
}

/// A validated `rewrite` filter: one path rule at most, and the host.
#[derive(Debug, Clone)]
pub struct Rewrite {
    /// The new path, when the path changes.
    pub path: Option<PathRewrite>,
    /// The new `Host` (a valid `name[:port]`).
    pub host: Option<String>,
}

/// How a `rewrite` or `redirect` changes the path.
#[derive(Debug, Clone)]
pub enum PathRewrite {
    /// The whole path replaced (starts with `/`).
    Replace(String),
    /// The route's matched prefix (`match.path_prefix`, as written) replaced by `with`.
    ReplacePrefix {
        /// The route's `match.path_prefix`.
        prefix: String,
        /// What replaces it.
        with: String,
    },
    /// When the expression matches, the path becomes `to` with its groups substituted.
    Regex {
        /// The expression.
        regex: regex::Regex,
        /// The template (`$1`..`$9` name groups the expression has; `$$` is `$`).
        to: String,
    },
}

/// A validated `redirect` terminal.
#[derive(Debug, Clone)]
pub struct Redirect {
    /// `http` or `https`, when it changes.
    pub scheme: Option<String>,
    /// The host (lower-case, without port), when it changes.
    pub host: Option<String>,
    /// The port, when given.
    pub port: Option<u16>,
    /// The new path, when the path changes (never `Regex`).
    pub path: Option<PathRewrite>,
    /// Drop the query.
    pub strip_query: bool,
    /// One of 301, 302, 303, 307, 308.
    pub status: u16,
}

/// What a rate limit counts by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitKey {
    /// Client IP.
    ClientIp,
    /// A header value (lowercase name).
    Header(String),
}

/// A route's terminal.
#[derive(Debug, Clone)]
pub enum RouteAction {
    /// Reverse proxy.
    Proxy(ProxyConfig),
    /// Synthetic response.
    Respond(RespondConfig),
    /// Static files (root absolute and a directory).
    Static(StaticConfig),
    /// A redirect.
    Redirect(Redirect),
}

/// A validated L4 stream.
#[derive(Debug, Clone)]
pub struct Stream {
    /// Name.
    pub name: String,
    /// Bound address.
    pub addr: SocketAddr,
    /// Filters.
    pub filters: Vec<StreamFilterConfig>,
    /// Everything else, as written (references checked).
    pub settings: StreamConfig,
}

/// Re-exported so users of the runtime form need not name the model module.
pub use crate::model::{StreamFilterConfig as StreamFilter, TlsVersion as MinTlsVersion};
