//! The `redirect` terminal: a `Location` made from the request with the configured parts
//! replaced (scheme, host, port, path, query), and a short body as nginx sends one. Everything
//! that does not depend on the request (status, body, the parts given) is made at config load.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};

use crate::body::Body;
use crate::context::RequestCx;
use crate::error::error_response;
use crate::request::rewrite::PathRule;
use crate::router::strip_port;
use crate::telemetry::LogNotes;
use crate::telemetry::{Counter, Registry};

/// A compiled redirect.
pub struct Redirect {
    status: StatusCode,
    scheme: Option<&'static str>,
    host: Option<Box<str>>,
    port: Option<u16>,
    path: Option<PathRule>,
    strip_query: bool,
    /// The nginx-like page (not sent for `HEAD`).
    body: Bytes,
    /// The HTTP/1.1 fast path's status line and `Content-Type`, made at load.
    wire_head: Bytes,
    /// `content-length: N` CRLF, for the fast path.
    wire_length: Bytes,
    /// Redirects answered.
    answered: Counter,
}

/// What a `Location` is made from: the request's facts.
pub struct Origin<'r> {
    /// `http` or `https`: how the client reached the gateway.
    pub scheme: &'static str,
    /// `Host` or `:authority` as sent (may carry a port), `None` when the request had none.
    pub authority: Option<&'r str>,
    /// The port the connection was accepted on, for a request without an authority.
    pub local: std::net::SocketAddr,
    /// The request's path (normalized by the entry rules).
    pub path: &'r str,
    /// Its query, without `?`.
    pub query: Option<&'r str>,
}

impl Redirect {
    /// Compiles a validated redirect of route `route`.
    pub fn new(route: &str, cfg: &gateway_config::Redirect, registry: &Registry) -> Self {
        let status = StatusCode::from_u16(cfg.status).unwrap_or(StatusCode::FOUND);
        let title = format!(
            "{} {}",
            status.as_str(),
            status.canonical_reason().unwrap_or("Redirect")
        );
        let body = format!(
            "<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n<center><h1>{title}</h1>\
             </center>\r\n</body>\r\n</html>\r\n"
        );
        let wire_head = format!(
            "HTTP/1.1 {} {}\r\n",
            status.as_str(),
            status.canonical_reason().unwrap_or("<none>")
        );
        Self {
            wire_head: wire_head.into(),
            wire_length: format!("content-length: {}\r\n", body.len()).into(),
            status,
            scheme: cfg.scheme.as_deref().map(|s| match s {
                "https" => "https",
                _ => "http",
            }),
            host: cfg.host.as_deref().map(Box::from),
            port: cfg.port,
            path: cfg.path.as_ref().map(PathRule::new),
            strip_query: cfg.strip_query,
            body: body.into(),
            answered: registry.counter(
                "gateway_http_redirects_total",
                "Requests answered by a redirect route, by route and status.",
                &[("route", route), ("status", status.as_str())],
            ),
        }
    }

    /// The answer to `req`.
    pub fn response<B>(&self, req: &Request<B>, cx: &RequestCx) -> Response<Body> {
        let uri = req.uri();
        let authority = match uri.authority() {
            Some(a) => Some(a.as_str()),
            None => req
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok()),
        };
        let origin = Origin {
            scheme: cx.scheme(),
            authority: authority.filter(|a| !a.is_empty()),
            local: cx.conn.local,
            path: uri.path(),
            query: uri.query(),
        };
        let Some(location) = self.location(&origin) else {
            // The entry rules refused such hosts already; never echo one into a header.
            return error_response(StatusCode::BAD_REQUEST);
        };
        self.answered.inc();
        let mut headers = HeaderMap::with_capacity(8);
        headers.insert(LOCATION, location);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/html"));
        let body = if req.method() == Method::HEAD {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(self.body.len()));
            Body::empty()
        } else {
            Body::full(self.body.clone())
        };
        let mut res = Response::new(body);
        *res.status_mut() = self.status;
        LogNotes::on(res.extensions_mut()).redirect = headers
            .get(LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(Box::from);
        *res.headers_mut() = headers;
        res
    }

    /// The status answered.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Appends the head's start as the HTTP/1.1 fast path writes it (the status line,
    /// `Location` and `Content-Type`, in the order of [`Redirect::response`]'s fields), counts
    /// the redirect, and returns the `content-length` line and the body for the caller to add
    /// after the server's own fields.
    pub fn push_wire_head(&self, out: &mut Vec<u8>, location: &HeaderValue) -> (&Bytes, &Bytes) {
        self.answered.inc();
        out.extend_from_slice(&self.wire_head);
        gateway_http1::fields::push_field(out, b"location", location.as_bytes());
        gateway_http1::fields::push_field(out, b"content-type", b"text/html");
        (&self.wire_length, &self.body)
    }

    /// The `Location` for a request, `None` when the request's host is not one to write.
    pub fn location(&self, origin: &Origin<'_>) -> Option<HeaderValue> {
        let scheme = self.scheme.unwrap_or(origin.scheme);
        let (host, port) = match origin.authority {
            Some(a) => {
                let host = strip_port(a);
                let port = a[host.len()..]
                    .strip_prefix(':')
                    .and_then(|p| p.parse().ok());
                (host, port)
            }
            None => ("", Some(origin.local.port())),
        };
        let local_ip;
        let host = match (&self.host, host) {
            (Some(h), _) => &**h,
            (None, "") => {
                local_ip = match origin.local.ip() {
                    std::net::IpAddr::V4(v4) => v4.to_string(),
                    std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                };
                &local_ip
            }
            (None, h) if crate::request::host::is_valid(h.as_bytes()) => h,
            (None, _) => return None,
        };
        // The client's port stays only while the scheme does: a new scheme has its own.
        let port = match self.port {
            Some(p) => Some(p),
            None if scheme == origin.scheme => port,
            None => None,
        };
        let default_port = if scheme == "https" { 443 } else { 80 };
        let path = match &self.path {
            Some(rule) => match rule.apply(origin.path) {
                Ok(p) => p,
                Err(_) => return None,
            },
            None => origin.path.into(),
        };
        let mut out = String::with_capacity(scheme.len() + host.len() + path.len() + 32);
        out.push_str(scheme);
        out.push_str("://");
        out.push_str(host);
        if let Some(p) = port.filter(|&p| p != default_port) {
            out.push(':');
            out.push_str(&p.to_string());
        }
        out.push_str(&path);
        if let Some(q) = origin.query.filter(|_| !self.strip_query) {
            out.push('?');
            out.push_str(q);
        }
        HeaderValue::from_str(&out).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirect(route: &str, yaml: &str) -> Redirect {
        let text = format!("routes: [{{ {route} redirect: {yaml} }}]");
        let cfg = gateway_config::load_str(&text, "t.yaml", std::path::Path::new(".")).unwrap();
        let gateway_config::RouteAction::Redirect(r) = &cfg.routes[0].action else {
            panic!("not a redirect");
        };
        Redirect::new("r", r, &Registry::default())
    }

    fn origin<'a>(scheme: &'static str, authority: Option<&'a str>, target: &'a str) -> Origin<'a> {
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        };
        Origin {
            scheme,
            authority,
            local: "127.0.0.1:8080".parse().unwrap(),
            path,
            query,
        }
    }

    fn location(r: &Redirect, o: &Origin<'_>) -> String {
        r.location(o).unwrap().to_str().unwrap().to_owned()
    }

    #[test]
    fn http_to_https_drops_the_port_and_keeps_path_and_query() {
        let r = redirect("", "{ scheme: https }");
        let o = origin("http", Some("example.com:8080"), "/a/b?x=1");
        assert_eq!(location(&r, &o), "https://example.com/a/b?x=1");
        let r = redirect("", "{ scheme: https, port: 8443 }");
        assert_eq!(location(&r, &o), "https://example.com:8443/a/b?x=1");
        let r = redirect("", "{ scheme: https, port: 443 }");
        assert_eq!(location(&r, &o), "https://example.com/a/b?x=1");
    }

    #[test]
    fn an_unchanged_scheme_keeps_the_client_port_unless_default() {
        let r = redirect("", "{ path: /new }");
        let o = origin("http", Some("example.com:8080"), "/old?q");
        assert_eq!(location(&r, &o), "http://example.com:8080/new?q");
        let o = origin("https", Some("[::1]:443"), "/old");
        assert_eq!(location(&r, &o), "https://[::1]/new");
        let r = redirect("", "{ host: other.example, strip_query: true }");
        let o = origin("http", Some("example.com"), "/p?q=1");
        assert_eq!(location(&r, &o), "http://other.example/p");
    }

    #[test]
    fn replace_prefix_uses_the_route_prefix() {
        let r = redirect(
            "match: { path_prefix: /docs/ },",
            "{ replace_prefix: /manual }",
        );
        let o = origin("http", Some("example.com"), "/docs/intro?v=2");
        assert_eq!(location(&r, &o), "http://example.com/manual/intro?v=2");
    }

    #[test]
    fn a_request_without_host_gets_the_listener_address() {
        let r = redirect("", "{ path: /x }");
        let o = origin("http", None, "/");
        assert_eq!(location(&r, &o), "http://127.0.0.1:8080/x");
    }

    #[test]
    fn hostile_hosts_are_never_written() {
        let r = redirect("", "{ scheme: https }");
        for bad in ["evil.com/x", "a b", "a\"b", "evil.com@x", "[zz]", "a,b"] {
            assert!(
                r.location(&origin("http", Some(bad), "/")).is_none(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_body_names_the_status() {
        let r = redirect("", "{ status: 301, path: /n }");
        assert!(
            std::str::from_utf8(&r.body)
                .unwrap()
                .contains("301 Moved Permanently")
        );
    }
}
