//! Routes compiled into a matcher once per config generation. Matching is first-match-wins in
//! file order, per listener; each route's conditions are checked cheapest first (method, host,
//! path, headers) and nothing is allocated per lookup.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method};

use gateway_config::{HostMatch, PathMatch};

/// One route's compiled conditions.
#[derive(Debug, Clone)]
pub struct Matcher {
    host: HostMatch,
    path: PathMatch,
    methods: Vec<Method>,
    headers: Vec<(HeaderName, HeaderValue)>,
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
        Ok(Self {
            host: route.host.clone(),
            path: route.path.clone(),
            methods,
            headers,
        })
    }

    /// Whether a request with these facts matches. `host` has no port.
    pub fn matches(&self, method: &Method, host: &str, path: &str, headers: &HeaderMap) -> bool {
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
    }
}

/// A prefix matches on segment boundaries: `/users` matches `/users` and `/users/7` but not
/// `/usersx`; a prefix ending in `/` matches anything under it.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
    }
}

/// Per-listener ordered route tables over any payload `T`.
#[derive(Debug)]
pub struct Router<T> {
    routes: Vec<(Matcher, T)>,
    by_listener: Vec<Vec<usize>>,
    /// Some route has a `host` condition.
    matches_hosts: bool,
    /// Some route has a `headers` condition.
    matches_headers: bool,
}

impl<T> Router<T> {
    /// `routes` in file order, each with the listener indices it applies to.
    pub fn new(listeners: usize, routes: Vec<(Matcher, Vec<usize>, T)>) -> Self {
        let mut by_listener = vec![Vec::new(); listeners];
        let mut compiled = Vec::with_capacity(routes.len());
        for (i, (matcher, on, payload)) in routes.into_iter().enumerate() {
            for l in on {
                if let Some(list) = by_listener.get_mut(l) {
                    list.push(i);
                }
            }
            compiled.push((matcher, payload));
        }
        let matches_hosts = compiled
            .iter()
            .any(|(m, _)| !matches!(m.host, HostMatch::Any));
        let matches_headers = compiled.iter().any(|(m, _)| !m.headers.is_empty());
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

    /// Whether any route looks at request headers other than the host. When none does, a
    /// request can be routed without a header map (the HTTP/1.1 fast path).
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
            .iter()
            .copied()
            .find(|&i| self.routes[i].0.matches(method, host, path, headers))
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
}
