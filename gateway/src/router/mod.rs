//! Routes compiled into a matcher once per config generation. Matching is first-match-wins in
//! file order, per listener; each route's conditions are checked cheapest first (query, method,
//! host, path, headers; exact values before regular expressions) and nothing is allocated per
//! lookup.
//!
//! A listener's routes are indexed by the first path segment each one requires (`/static` and
//! `/static/` both require `static`), so a lookup checks only the routes that could match the
//! request's path: those of its first segment and those that match any path (no path
//! condition, a regex), merged in file order when the config is loaded. A linear scan pays for
//! every route before the match; a lookup costs about as much as checking a few routes however
//! long the table, so the first routes of a table are found a little slower than by the scan
//! and every later one faster. Routes that share their first
//! segment are still checked one by one, and a table whose routes all share one is not indexed.

mod segments;

use std::collections::HashMap;

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method};

use segments::SegmentTable;

use gateway_config::{HostMatch, PathMatch};

/// One route's compiled conditions.
#[derive(Debug, Clone)]
pub struct Matcher {
    host: HostMatch,
    path: PathMatch,
    methods: Vec<Method>,
    headers: Vec<(HeaderName, HeaderValue)>,
    query: Vec<(String, String)>,
    header_regex: Vec<(HeaderName, regex::Regex)>,
    query_regex: Vec<(String, regex::Regex)>,
}

impl Matcher {
    /// Compiles validated conditions.
    pub fn new(route: &gateway_config::Route) -> Result<Self, String> {
        let methods = route
            .methods
            .iter()
            .map(|m| Method::from_bytes(m.as_bytes()).map_err(|e| format!("method `{m}`: {e}")))
            .collect::<Result<_, _>>()?;
        let headers = route
            .headers
            .iter()
            .map(|(k, v)| {
                Ok((
                    HeaderName::from_bytes(k.as_bytes())
                        .map_err(|e| format!("header `{k}`: {e}"))?,
                    HeaderValue::from_str(v).map_err(|e| format!("header `{k}`: {e}"))?,
                ))
            })
            .collect::<Result<_, String>>()?;
        let header_regex = route
            .header_regex
            .iter()
            .map(|(k, re)| {
                let name = HeaderName::from_bytes(k.as_bytes())
                    .map_err(|e| format!("header `{k}`: {e}"))?;
                Ok((name, re.clone()))
            })
            .collect::<Result<_, String>>()?;
        Ok(Self {
            host: route.host.clone(),
            path: route.path.clone(),
            methods,
            headers,
            query: route.query.clone(),
            header_regex,
            query_regex: route.query_regex.clone(),
        })
    }

    /// The first path segment every path this route matches begins with (`static` for both
    /// `/static` and `/static/css/`, empty for `/` exactly), or `None` when the route can
    /// match paths with different first segments (no path condition, a regex, the prefix `/`).
    fn first_segment(&self) -> Option<&[u8]> {
        let required = match &self.path {
            PathMatch::Exact(p) => p.as_str(),
            // A prefix matches on segment boundaries, so unless the prefix is `/` itself the
            // path's first segment is the prefix's (`/static` matches `/static` and
            // `/static/...`, never `/staticx`).
            PathMatch::Prefix(p) if p != "/" => p.as_str(),
            PathMatch::Prefix(_) | PathMatch::Any | PathMatch::Regex(_) => return None,
        };
        // A path always starts with `/`; a condition that does not is left to the scan.
        required
            .starts_with('/')
            .then(|| segments::first_segment(required.as_bytes()))
    }

    /// Whether a request with these facts matches. `host` has no port.
    pub fn matches(&self, method: &Method, host: &str, path: &str, headers: &HeaderMap) -> bool {
        self.matches_query(method, host, path, None, headers)
    }

    /// [`Matcher::matches`] with the request's query string (without `?`), for routes that
    /// require query parameters; without one, such routes never match.
    pub fn matches_query(
        &self,
        method: &Method,
        host: &str,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> bool {
        let query = query.unwrap_or("");
        if !query_has_all(&self.query, query) || !query_matches_all(&self.query_regex, query) {
            return false;
        }
        if !self.methods.is_empty() && !self.methods.contains(method) {
            return false;
        }
        let host_ok = match &self.host {
            HostMatch::Any => true,
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Suffix(s) => {
                host.len() > s.len()
                    && host.as_bytes()[host.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes())
            }
        };
        if !host_ok {
            return false;
        }
        let path_ok = match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => prefix_matches(p, path),
            PathMatch::Regex(re) => re.is_match(path),
        };
        path_ok
            && self
                .headers
                .iter()
                .all(|(name, value)| headers.get_all(name).iter().any(|v| v == value))
            && self.header_regex.iter().all(|(name, re)| {
                headers
                    .get_all(name)
                    .iter()
                    .any(|v| v.to_str().is_ok_and(|v| re.is_match(v)))
            })
    }

    /// Whether the route needs the request's header fields or query to decide.
    fn reads_headers_or_query(&self) -> bool {
        !(self.headers.is_empty()
            && self.query.is_empty()
            && self.header_regex.is_empty()
            && self.query_regex.is_empty())
    }
}

/// Whether each `(name, expression)` finds a match in the value of one of the query's
/// `name=value` pairs.
fn query_matches_all(wanted: &[(String, regex::Regex)], query: &str) -> bool {
    wanted
        .iter()
        .all(|(name, re)| query_has(query, name, |v| re.is_match(v)))
}

/// Whether every `(name, value)` is among the query's `name=value` pairs.
fn query_has_all(wanted: &[(String, String)], query: &str) -> bool {
    wanted
        .iter()
        .all(|(name, value)| query_has(query, name, |v| v == value))
}

/// Whether one of the query's `name=value` pairs (as sent; a bare name has the value ``) is
/// for `name` with a value `accepts` takes.
fn query_has(query: &str, name: &str, accepts: impl Fn(&str) -> bool) -> bool {
    query.split('&').any(|pair| {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        n == name && accepts(v)
    })
}

/// A prefix matches on segment boundaries: `/users` matches `/users` and `/users/7` but not
/// `/usersx`; a prefix ending in `/` matches anything under it.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
    }
}

/// `path` with the part a route's `path_prefix` matched replaced by `with` (the Gateway API's
/// `ReplacePrefixMatch`): `/api` → `/v2` turns `/api` into `/v2` and `/api/x` into `/v2/x`;
/// an empty `with` strips the prefix (`/api/x` → `/x`, `/api` → `/`). `None` when the prefix
/// does not match on a segment boundary. One rule for `proxy.strip_prefix`, the `rewrite`
/// filter and the `redirect` terminal.
pub fn replace_prefix(prefix: &str, with: &str, path: &str) -> Option<String> {
    // A trailing `/` on either side is the segment boundary, not part of the prefix.
    replace_bare_prefix(
        prefix.trim_end_matches('/'),
        with.trim_end_matches('/'),
        path,
    )
}

/// [`replace_prefix`] with `prefix` and `with` already without their trailing `/` (a rule
/// compiled at load trims them once).
pub fn replace_bare_prefix(prefix: &str, with: &str, path: &str) -> Option<String> {
    let rest = path.strip_prefix(prefix)?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    Some(match (with.is_empty(), rest.is_empty()) {
        (true, true) => "/".to_owned(),
        (false, true) => with.to_owned(),
        _ => [with, rest].concat(),
    })
}

/// One listener's routes (indices into [`Router::routes`]), in file order, by the first path
/// segment they require.
#[derive(Debug)]
struct ListenerRoutes {
    /// The candidates of a path whose first segment is not in `by_segment`: the routes that may
    /// match any first segment, or every route when the table is not indexed.
    elsewhere: Box<[u32]>,
    /// For each first segment some route requires: its routes and those that may match any
    /// first segment, in file order. Empty when fewer than two segments are required: with one
    /// (every route under `/api`, say) the index would narrow nothing and only cost a lookup.
    by_segment: SegmentTable<Box<[u32]>>,
}

impl ListenerRoutes {
    /// `routes` in file order; `segment_of` gives the first segment a route requires.
    fn new(routes: &[u32], segment_of: impl Fn(u32) -> Option<Box<[u8]>>) -> Self {
        let mut anywhere = Vec::new();
        // Each segment's own routes, segments in order of first appearance.
        let mut own: Vec<(Box<[u8]>, Vec<u32>)> = Vec::new();
        let mut position: HashMap<Box<[u8]>, usize> = HashMap::new();
        for &route in routes {
            match segment_of(route) {
                None => anywhere.push(route),
                Some(segment) => {
                    let at = *position.entry(segment.clone()).or_insert_with(|| {
                        own.push((segment, Vec::new()));
                        own.len() - 1
                    });
                    own[at].1.push(route);
                }
            }
        }
        if own.len() < 2 {
            return Self {
                elsewhere: routes.into(),
                by_segment: SegmentTable::new(Vec::new()),
            };
        }
        let by_segment = own
            .into_iter()
            .map(|(segment, routes)| (segment, merged(&routes, &anywhere)))
            .collect();
        Self {
            elsewhere: anywhere.into_boxed_slice(),
            by_segment: SegmentTable::new(by_segment),
        }
    }

    /// The routes that may match `path`, in file order.
    #[inline]
    fn candidates(&self, path: &str) -> &[u32] {
        if self.by_segment.is_empty() {
            return &self.elsewhere;
        }
        self.by_segment
            .get_for_path(path)
            .unwrap_or(&self.elsewhere)
    }
}

/// Two ascending lists of route indices as one.
fn merged(a: &[u32], b: &[u32]) -> Box<[u32]> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.iter().peekable(), b.iter().peekable());
    while let (Some(&&x), Some(&&y)) = (a.peek(), b.peek()) {
        if x < y {
            out.push(x);
            a.next();
        } else {
            out.push(y);
            b.next();
        }
    }
    out.extend(a.chain(b));
    out.into_boxed_slice()
}

/// Per-listener ordered route tables over any payload `T`.
#[derive(Debug)]
pub struct Router<T> {
    routes: Vec<(Matcher, T)>,
    by_listener: Vec<ListenerRoutes>,
    /// Some route has a `host` condition.
    matches_hosts: bool,
    /// Some route has a `headers` condition.
    matches_headers: bool,
}

impl<T> Router<T> {
    /// `routes` in file order, each with the listener indices it applies to.
    pub fn new(listeners: usize, routes: Vec<(Matcher, Vec<usize>, T)>) -> Self {
        let mut in_order: Vec<Vec<u32>> = vec![Vec::new(); listeners];
        let mut compiled = Vec::with_capacity(routes.len());
        for (i, (matcher, on, payload)) in routes.into_iter().enumerate() {
            let i = u32::try_from(i).expect("fewer than 2^32 routes");
            for l in on {
                if let Some(list) = in_order.get_mut(l) {
                    list.push(i);
                }
            }
            compiled.push((matcher, payload));
        }
        let by_listener = in_order
            .iter()
            .map(|list| {
                ListenerRoutes::new(list, |i| {
                    compiled[i as usize].0.first_segment().map(Box::from)
                })
            })
            .collect();
        let matches_hosts = compiled
            .iter()
            .any(|(m, _)| !matches!(m.host, HostMatch::Any));
        // Query conditions count too: a request routed without its header map (the HTTP/1.1
        // fast path) is routed without its query as well.
        let matches_headers = compiled.iter().any(|(m, _)| m.reads_headers_or_query());
        Self {
            routes: compiled,
            by_listener,
            matches_hosts,
            matches_headers,
        }
    }

    /// Whether any route looks at the host. When none does, the caller can pass `""` and skip
    /// finding the host (a header lookup and a scan for the port) on every request.
    pub fn matches_hosts(&self) -> bool {
        self.matches_hosts
    }

    /// Whether any route looks at request headers other than the host, or at the query. When
    /// none does, a request can be routed without a header map (the HTTP/1.1 fast path).
    pub fn matches_headers(&self) -> bool {
        self.matches_headers
    }

    /// The first route of `listener` that matches.
    pub fn find(
        &self,
        listener: usize,
        method: &Method,
        host: &str,
        path: &str,
        headers: &HeaderMap,
    ) -> Option<&T> {
        self.find_index(listener, method, host, path, headers)
            .map(|i| self.route(i))
    }

    /// The index of the first route of `listener` that matches, for [`Router::route`]: a
    /// future that owns the router can keep the index where it cannot keep a borrow.
    pub fn find_index(
        &self,
        listener: usize,
        method: &Method,
        host: &str,
        path: &str,
        headers: &HeaderMap,
    ) -> Option<usize> {
        self.by_listener
            .get(listener)?
            .candidates(path)
            .iter()
            .map(|&i| i as usize)
            .find(|&i| self.routes[i].0.matches(method, host, path, headers))
    }

    /// [`Router::find_index`] with the request's query string, for routes that require query
    /// parameters.
    pub fn find_index_query(
        &self,
        listener: usize,
        method: &Method,
        host: &str,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<usize> {
        self.by_listener
            .get(listener)?
            .candidates(path)
            .iter()
            .map(|&i| i as usize)
            .find(|&i| {
                self.routes[i]
                    .0
                    .matches_query(method, host, path, query, headers)
            })
    }

    /// The route at an index [`Router::find_index`] gave.
    pub fn route(&self, index: usize) -> &T {
        &self.routes[index].1
    }
}

/// The request's host without port: `:authority` / absolute-form URI first, then `Host`.
pub fn request_host<'a>(uri: &'a http::Uri, headers: &'a HeaderMap) -> &'a str {
    let raw = match uri.host() {
        Some(h) => return h,
        None => headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or(""),
    };
    strip_port(raw)
}

/// `authority` without its port (an IPv6 literal keeps its brackets).
pub fn strip_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        // IPv6 literal: keep the brackets' content.
        return authority
            .find(']')
            .map_or(authority, |end| &authority[..=end]);
    }
    match authority.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_prefix_works_on_segment_boundaries() {
        let r = |prefix, with, path| replace_prefix(prefix, with, path);
        assert_eq!(r("/api", "/v2", "/api").as_deref(), Some("/v2"));
        assert_eq!(r("/api", "/v2", "/api/x/y").as_deref(), Some("/v2/x/y"));
        assert_eq!(r("/api/", "/v2/", "/api/x").as_deref(), Some("/v2/x"));
        assert_eq!(r("/api", "/v2", "/api/").as_deref(), Some("/v2/"));
        assert_eq!(r("/api", "", "/api/x").as_deref(), Some("/x"));
        assert_eq!(r("/api", "/", "/api").as_deref(), Some("/"));
        assert_eq!(r("/", "/v2", "/x").as_deref(), Some("/v2/x"));
        assert_eq!(r("/", "", "/x").as_deref(), Some("/x"));
        assert_eq!(r("/api", "/v2", "/apix"), None);
        assert_eq!(r("/api", "/v2", "/other"), None);
    }

    #[test]
    fn regular_expressions_on_header_values_and_query_parameters() {
        let m = m("{ header_regex: { X-Env: '^(canary|beta)$' }, query_regex: { v: '^2\\.' } }");
        let q = |env: &[&str], query| {
            let mut h = HeaderMap::new();
            for e in env {
                h.append("x-env", e.parse().unwrap());
            }
            m.matches_query(&Method::GET, "", "/", query, &h)
        };
        assert!(q(&["canary"], Some("v=2.1")));
        assert!(
            q(&["stable", "beta"], Some("a=1&v=2.0")),
            "any value of the header"
        );
        assert!(
            !q(&["canary-x"], Some("v=2.1")),
            "anchored by the expression"
        );
        assert!(!q(&["canary"], Some("v=3.0")));
        assert!(!q(&[], Some("v=2.1")), "no header, no match");
        assert!(!q(&["beta"], None), "no query, no match");
    }

    #[test]
    fn query_conditions_need_every_pair_as_sent() {
        let m = m("{ query: { v: '2', debug: '' } }");
        let h = HeaderMap::new();
        let q = |query| m.matches_query(&Method::GET, "", "/", query, &h);
        assert!(q(Some("v=2&debug")));
        assert!(q(Some("a=1&debug=&v=2")));
        assert!(!q(Some("v=3&debug")));
        assert!(!q(Some("v=2")));
        assert!(!q(None));
        assert!(!m.matches(&Method::GET, "", "/", &h), "no query, no match");
    }

    fn route(yaml: &str) -> gateway_config::Route {
        let cfg = gateway_config::load_str(yaml, "t.yaml", std::path::Path::new(".")).unwrap();
        cfg.routes[0].clone()
    }

    fn m(yaml_match: &str) -> Matcher {
        Matcher::new(&route(&format!(
            "routes:\n  - match: {yaml_match}\n    respond: {{ status: 200 }}\n"
        )))
        .unwrap()
    }

    #[test]
    fn host_exact_and_wildcard() {
        let h = HeaderMap::new();
        let exact = m("{ host: api.example.com }");
        assert!(exact.matches(&Method::GET, "API.example.com", "/", &h));
        assert!(!exact.matches(&Method::GET, "x.api.example.com", "/", &h));
        let wild = m("{ host: \"*.example.com\" }");
        assert!(wild.matches(&Method::GET, "a.example.com", "/", &h));
        assert!(wild.matches(&Method::GET, "a.b.example.com", "/", &h));
        assert!(!wild.matches(&Method::GET, "example.com", "/", &h));
        assert!(!wild.matches(&Method::GET, "badexample.com", "/", &h));
    }

    #[test]
    fn paths_methods_headers() {
        let h = HeaderMap::new();
        let p = m("{ path_prefix: /users }");
        assert!(p.matches(&Method::GET, "", "/users", &h));
        assert!(p.matches(&Method::GET, "", "/users/7", &h));
        assert!(!p.matches(&Method::GET, "", "/usersx", &h));
        let e = m("{ path: /hello }");
        assert!(e.matches(&Method::GET, "", "/hello", &h));
        assert!(!e.matches(&Method::GET, "", "/hello/", &h));
        let r = m("{ path_regex: \"^/v[0-9]+/\" }");
        assert!(r.matches(&Method::GET, "", "/v2/x", &h));
        assert!(!r.matches(&Method::GET, "", "/vx/x", &h));
        let meth = m("{ methods: [GET, post] }");
        assert!(meth.matches(&Method::POST, "", "/", &h));
        assert!(!meth.matches(&Method::DELETE, "", "/", &h));
        let hdr = m("{ headers: { x-canary: \"true\" } }");
        assert!(!hdr.matches(&Method::GET, "", "/", &h));
        let mut with = HeaderMap::new();
        with.insert("x-canary", HeaderValue::from_static("true"));
        assert!(hdr.matches(&Method::GET, "", "/", &with));
    }

    #[test]
    fn host_header_port_is_ignored() {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("example.com:8080"));
        assert_eq!(request_host(&"/x".parse().unwrap(), &h), "example.com");
        h.insert("host", HeaderValue::from_static("[::1]:8080"));
        assert_eq!(request_host(&"/x".parse().unwrap(), &h), "[::1]");
        assert_eq!(
            request_host(&"http://a.example/x".parse().unwrap(), &h),
            "a.example"
        );
    }

    #[test]
    fn a_router_knows_whether_any_route_looks_at_the_host() {
        let hostless = Router::new(1, vec![(m("{ path: /a }"), vec![0], ())]);
        assert!(!hostless.matches_hosts());
        let hosted = Router::new(
            1,
            vec![
                (m("{ path: /a }"), vec![0], ()),
                (m("{ host: \"*.example.com\" }"), vec![0], ()),
            ],
        );
        assert!(hosted.matches_hosts());
        // Without host conditions the empty host routes as any other would.
        assert!(
            hostless
                .find(0, &Method::GET, "", "/a", &HeaderMap::new())
                .is_some()
        );
    }

    /// A table where the index matters: several routes per first segment, routes for any path
    /// (a regex, no path condition, `/`) between them, exact and prefix paths, conditions
    /// beyond the path, and routes on one listener only.
    const INDEXED: &str = r#"
listeners:
  - { name: a, bind: "127.0.0.1:0" }
  - { name: b, bind: "127.0.0.1:0" }
routes:
  - match: { path: /hello }
    respond: { body: r0 }
  - match: { path_prefix: /static, methods: [POST] }
    respond: { body: r1 }
  - match: { path_regex: "^/static/[0-9]+$" }
    respond: { body: r2 }
  - match: { path_prefix: /static/ }
    respond: { body: r3 }
  - match: { host: "*.example.com" }
    respond: { body: r4 }
  - listeners: [b]
    match: { path_prefix: /static }
    respond: { body: r5 }
  - match: { path_prefix: /api/v1 }
    respond: { body: r6 }
  - match: { path: / }
    respond: { body: r7 }
  - match: { path_prefix: /api }
    respond: { body: r8 }
  - match: { path_prefix: //x }
    respond: { body: r9 }
  - listeners: [a]
    match: { path_prefix: / }
    respond: { body: r10 }
"#;

    #[test]
    fn the_index_finds_what_a_scan_in_file_order_finds() {
        let config =
            gateway_config::load_str(INDEXED, "t.yaml", std::path::Path::new(".")).unwrap();
        let plain: Vec<(Matcher, Vec<usize>)> = config
            .routes
            .iter()
            .map(|r| (Matcher::new(r).unwrap(), r.listeners.clone()))
            .collect();
        let router = Router::new(
            2,
            plain
                .iter()
                .enumerate()
                .map(|(i, (m, l))| (m.clone(), l.clone(), i))
                .collect(),
        );
        // The index is used: `/static` has its own candidates, without `/api`'s or `/`'s.
        assert_eq!(
            router.by_listener[0]
                .by_segment
                .get_for_path("/static")
                .map(|c| &c[..]),
            Some(&[1, 2, 3, 4, 10][..])
        );
        assert_eq!(&*router.by_listener[1].elsewhere, &[2, 4]);
        let segments = ["", "static", "staticx", "Static", "api", "hello", "x", "1"];
        let mut paths = vec![
            String::new(),
            "*".into(),
            "/".into(),
            "//".into(),
            "//x".into(),
        ];
        for a in segments {
            for b in ["", "/", "/1", "/v1", "/v1/users", "/42", "/a/b", "x"] {
                paths.push(format!("/{a}{b}"));
            }
        }
        let h = HeaderMap::new();
        let mut found_some = 0;
        for listener in 0..2 {
            for host in ["", "a.example.com"] {
                for method in [Method::GET, Method::POST] {
                    for path in &paths {
                        let found = router.find(listener, &method, host, path, &h).copied();
                        let expected = plain.iter().position(|(m, on)| {
                            on.contains(&listener) && m.matches(&method, host, path, &h)
                        });
                        assert_eq!(found, expected, "{listener} {method} {host:?} {path:?}");
                        found_some += usize::from(found.is_some());
                    }
                }
            }
        }
        assert!(found_some > 100, "the table matches most of these paths");
        let rx = |path: &str| router.find(1, &Method::GET, "", path, &h).copied();
        assert_eq!(rx("/static/7"), Some(2));
        assert_eq!(rx("/static/x"), Some(3));
        assert_eq!(rx("/static"), Some(5));
        assert_eq!(rx("/api/v1/users"), Some(6));
        assert_eq!(rx("/api/v2"), Some(8));
        assert_eq!(rx("/"), Some(7));
        assert_eq!(rx("//x/y"), Some(9));
        assert_eq!(rx("/staticx"), None);
    }

    #[test]
    fn routes_under_one_segment_are_scanned_without_the_index() {
        let router = Router::new(
            1,
            vec![
                (m("{ path_prefix: /api/v1 }"), vec![0], 0),
                (m("{ path_regex: \"^/api/v[0-9]+/health$\" }"), vec![0], 1),
                (m("{ path_prefix: /api }"), vec![0], 2),
            ],
        );
        let routes = &router.by_listener[0];
        assert!(routes.by_segment.is_empty());
        assert_eq!(&*routes.elsewhere, &[0, 1, 2]);
        let h = HeaderMap::new();
        let find = |path: &str| router.find(0, &Method::GET, "", path, &h).copied();
        assert_eq!(find("/api/v1/users"), Some(0));
        assert_eq!(find("/api/v2/health"), Some(1));
        assert_eq!(find("/api/v2"), Some(2));
        assert_eq!(find("/other"), None);
    }
}
