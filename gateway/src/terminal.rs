//! Terminals produce a route's response: a synthetic `respond`, a `redirect`, static files, or
//! the reverse proxy. Dispatch is a plain `match`. A synthetic response or a redirect to a
//! bodiless request, and a static file served from the cache, are made at once, without a
//! future; the other paths are boxed, so a [`TerminalFuture`] is a response or a pointer,
//! whatever the terminal (the static and proxy futures are kilobytes, and one allocation per
//! request is noise next to their work).

use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::Either;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::body::Body;
use crate::context::RequestCx;
use gateway_http1::fields::push_field;

mod redirect;

pub use redirect::{Origin, Redirect};

/// A terminal's answer: ready at once, or one boxed future.
pub type TerminalFuture = Either<Ready<Response<Body>>, BoxedResponse>;

/// A terminal's boxed future. It owns what it uses (it borrows neither the route nor the
/// request's context), so the service can hold it as the request's only allocation instead of
/// boxing it again inside a future of its own.
pub type BoxedResponse = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// A route's terminal (cheap to clone: the cache filter keeps one to revalidate through).
#[derive(Clone)]
pub enum Terminal {
    /// A fixed response.
    Respond(Arc<Respond>),
    /// Files from a root directory.
    Static(Arc<crate::static_files::StaticFiles>),
    /// The reverse proxy.
    Proxy(Arc<crate::proxy::ProxyRoute>),
    /// The reverse proxy to upstreams picked by weight.
    Split(Arc<crate::proxy::Split>),
    /// A redirect.
    Redirect(Arc<Redirect>),
}

impl Terminal {
    /// Produces the response.
    pub fn handle(&self, req: Request<Body>, cx: &RequestCx) -> TerminalFuture {
        match self {
            Self::Respond(r) if http_body::Body::is_end_stream(req.body()) => {
                Either::Left(ready(r.response(req.method())))
            }
            Self::Respond(r) => Either::Right(Box::pin(respond_after_body(r.clone(), req))),
            Self::Static(s) => Either::Right(Box::pin(s.clone().serve(req))),
            Self::Proxy(p) => Either::Right(Box::pin(p.forward(req, cx))),
            Self::Redirect(r) if http_body::Body::is_end_stream(req.body()) => {
                Either::Left(ready(r.response(&req, cx)))
            }
            Self::Redirect(r) => {
                Either::Right(Box::pin(redirect_after_body(r.clone(), req, cx.clone())))
            }
            Self::Split(s) => Either::Right(Box::pin(s.forward(req, cx))),
        }
    }

    /// The upstream that answered `res`, for the access log: the route's one, or the one a
    /// split picked; `None` for other terminals.
    pub fn served_by(&self, res: &Response<Body>) -> Option<Arc<str>> {
        match self {
            Self::Proxy(p) => Some(p.upstream_name().clone()),
            Self::Split(_) => res
                .extensions()
                .get::<crate::proxy::ServedBy>()
                .map(|s| s.0.clone()),
            _ => None,
        }
    }

    /// [`Terminal::respond_now`] for a route without filters, with the server's `Server`
    /// header added: the response takes over the request's header map (see [`Respond`]).
    pub fn respond_alone(
        &self,
        req: &mut Request<Body>,
        server: Option<&HeaderValue>,
    ) -> Option<Response<Body>> {
        match self {
            Self::Respond(r) if http_body::Body::is_end_stream(req.body()) => {
                let headers = std::mem::take(req.headers_mut());
                Some(r.response_in(headers, req.method(), server))
            }
            Self::Static(s) => s.serve_now_alone(req, server),
            _ => None,
        }
    }

    /// On a route with filters, after their request hooks: the response when it needs no
    /// waiting at all (a synthetic response to a bodiless request, or a static file from the
    /// cache), made without a future.
    ///
    /// The request's parts are done with once the terminal has answered, unless the chain
    /// keeps them for filters that read them later (`keeps_head`), so a synthetic response
    /// takes over their header map, as on a route without filters ([`Respond`]); the `Server`
    /// header is the chain's to add.
    pub fn respond_now(
        &self,
        parts: &mut http::request::Parts,
        body: &Body,
        keeps_head: bool,
    ) -> Option<Response<Body>> {
        match self {
            Self::Respond(r) if http_body::Body::is_end_stream(body) => {
                let headers = if keeps_head {
                    HeaderMap::new()
                } else {
                    std::mem::take(&mut parts.headers)
                };
                Some(r.response_in(headers, &parts.method, None))
            }
            Self::Static(s) => s.serve_now(&parts.method, &parts.uri, &parts.headers),
            _ => None,
        }
    }
}

/// A synthetic response to a request with a body: read first (see [`discard`]).
async fn respond_after_body(r: Arc<Respond>, req: Request<Body>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    if let Err(e) = discard(body).await {
        return crate::error::GatewayError::RequestBody(e).into_response();
    }
    r.response(&parts.method)
}

/// A redirect of a request with a body: read first, as for [`respond_after_body`].
async fn redirect_after_body(
    r: Arc<Redirect>,
    req: Request<Body>,
    cx: RequestCx,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    if let Err(e) = discard(body).await {
        return crate::error::GatewayError::RequestBody(e).into_response();
    }
    r.response(&Request::from_parts(parts, ()), &cx)
}

/// A request's header map emptied for its response, with room for `capacity` headers, unless
/// it holds more than `reusable` (what a fresh map of `capacity` holds): then a fresh map, so
/// that hyper, which keeps the last response's map of an HTTP/1 connection, keeps no more than
/// a fresh map would have cost.
pub(crate) fn response_map(mut map: HeaderMap, capacity: usize, reusable: usize) -> HeaderMap {
    if map.capacity() > reusable {
        return HeaderMap::with_capacity(capacity);
    }
    map.clear();
    map.reserve(capacity);
    map
}

/// Bodies a synthetic response reads to the end before answering.
const DISCARD_LIMIT: usize = 64 * 1024;

/// Reads and drops a request body that a synthetic response does not use, so the whole request
/// has been received (and HTTP/2 has checked it against its `content-length`) before the answer:
/// a malformed body gets an error, not a success. Past [`DISCARD_LIMIT`] the rest is left to the
/// protocol layer (drained or reset).
async fn discard(mut body: Body) -> Result<(), crate::body::BoxError> {
    use http_body_util::BodyExt;
    let mut seen = 0;
    while seen <= DISCARD_LIMIT {
        match body.frame().await {
            None => break,
            Some(frame) => seen += frame?.data_ref().map_or(0, Bytes::len),
        }
    }
    Ok(())
}

/// Headers the server may add to any response after its terminal: `Server`, `Alt-Svc`,
/// `Strict-Transport-Security`.
const SERVER_HEADERS: usize = 3;

/// Room for the headers a route's filters may add to a response (the rate limiter's four, a
/// filter's own).
const FILTER_HEADERS: usize = 5;

/// A synthetic response, built once: per request only the header map is made, sized at config
/// load for the headers added after it. A map that has to grow rehashes and reallocates, which
/// costs more than the rest of building the response; a map with room to spare costs memory
/// for the connection's whole life, because hyper keeps the last response's (cleared) map of
/// an HTTP/1 connection to parse the next request into. So the room is reserved for what the
/// route adds, not for filters on every route.
///
/// The response takes over the request's map when it is no larger than a fresh one would be
/// ([`Respond::response_in`]): hyper parsed the request into the map it kept from the
/// connection's last response, so one map serves the connection's requests and responses in
/// turn, with no allocation, and no more memory than a fresh map held.
pub struct Respond {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    /// The header map's reservation: the configured headers and the ones added after them.
    capacity: usize,
    /// What a fresh map of `capacity` holds; a request's map is reused up to this size.
    reusable: usize,
    /// The configured headers include `Server`, which the server's own then does not replace.
    sets_server: bool,
    /// The response as the HTTP/1.1 fast path writes it, on a route without filters whose
    /// response hyper would frame by its length.
    canned: Option<Canned>,
}

/// A synthetic response as wire text, made at config load for the HTTP/1.1 fast path
/// (`server::fast_path`), in the order hyper writes the same response: the status line and the
/// configured headers, then the server's own (`Server` unless configured, the listener's), then
/// `Content-Length` and `Date`.
pub struct Canned {
    /// Status line and configured header lines.
    pub head: Bytes,
    /// The configured headers carry `Server`: the server's own is not added.
    pub sets_server: bool,
    /// `content-length: N` CRLF.
    pub length: Bytes,
    /// The body (not sent for `HEAD`).
    pub body: Bytes,
}

impl Canned {
    /// `None` when hyper would treat the response specially: no body allowed by its status, or
    /// a configured header hyper reads (framing, connection, its own `Date`).
    fn new(
        status: StatusCode,
        headers: &[(HeaderName, HeaderValue)],
        body: &Bytes,
    ) -> Option<Self> {
        use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
        let bodiless = status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let special = [CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION, DATE];
        if bodiless || headers.iter().any(|(n, _)| special.contains(n)) {
            return None;
        }
        let mut head = Vec::with_capacity(64 + headers.len() * 40);
        head.extend_from_slice(b"HTTP/1.1 ");
        head.extend_from_slice(status.as_str().as_bytes());
        head.push(b' ');
        // hyper's reason phrase, unknown codes included.
        head.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        head.extend_from_slice(b"\r\n");
        for (name, value) in headers {
            push_field(&mut head, name.as_str().as_bytes(), value.as_bytes());
        }
        Some(Self {
            head: head.into(),
            sets_server: headers.iter().any(|(n, _)| n == http::header::SERVER),
            length: format!("content-length: {}\r\n", body.len()).into(),
            body: body.clone(),
        })
    }
}

impl Respond {
    /// Compiles the configured response, for a route with or without filters; `fast` when the
    /// HTTP/1.1 fast path may answer it (it then gets its wire text).
    pub fn new(
        cfg: &gateway_config::model::RespondConfig,
        filtered: bool,
        fast: bool,
    ) -> Result<Self, String> {
        let status = StatusCode::from_u16(cfg.status).map_err(|e| e.to_string())?;
        let mut headers = Vec::with_capacity(cfg.headers.len());
        for (k, v) in &cfg.headers {
            headers.push((
                HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header `{k}`: {e}"))?,
                HeaderValue::from_str(v).map_err(|e| format!("header `{k}`: {e}"))?,
            ));
        }
        let added = SERVER_HEADERS + if filtered { FILTER_HEADERS } else { 0 };
        let capacity = headers.len() + added;
        let body = Bytes::from(cfg.body.clone());
        Ok(Self {
            canned: fast.then(|| Canned::new(status, &headers, &body)).flatten(),
            status,
            capacity,
            reusable: HeaderMap::<HeaderValue>::with_capacity(capacity).capacity(),
            sets_server: headers.iter().any(|(name, _)| name == http::header::SERVER),
            headers,
            body,
        })
    }

    /// The configured status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The response as wire text for the HTTP/1.1 fast path, if it has one.
    pub fn canned(&self) -> Option<&Canned> {
        self.canned.as_ref()
    }

    /// The response, in a fresh header map; the caller adds the `Server` header.
    fn response(&self, method: &Method) -> Response<Body> {
        self.response_in(HeaderMap::new(), method, None)
    }

    /// The response, in `headers` (a request's map, emptied here) unless it is larger than a
    /// fresh map would be, with `server` as its `Server` header unless the configured headers
    /// set one.
    fn response_in(
        &self,
        headers: HeaderMap,
        method: &Method,
        server: Option<&HeaderValue>,
    ) -> Response<Body> {
        let mut headers = response_map(headers, self.capacity, self.reusable);
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        if let Some(server) = server.filter(|_| !self.sets_server) {
            headers.insert(http::header::SERVER, server.clone());
        }
        let body = if method == Method::HEAD {
            headers.insert(
                http::header::CONTENT_LENGTH,
                HeaderValue::from(self.body.len()),
            );
            Body::empty()
        } else {
            Body::full(self.body.clone())
        };
        let mut res = Response::new(body);
        *res.status_mut() = self.status;
        *res.headers_mut() = headers;
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn respond(filtered: bool) -> Respond {
        let cfg: gateway_config::model::RespondConfig =
            serde_yaml::from_str("{ body: hi, headers: { content-type: text/plain } }").unwrap();
        Respond::new(&cfg, filtered, !filtered).unwrap()
    }

    #[test]
    fn the_header_map_has_room_for_what_follows_the_terminal_and_no_more() {
        let plain = respond(false).response(&Method::GET);
        let filtered = respond(true).response(&Method::GET);
        assert_eq!(plain.headers().len(), 1);
        // The server's own headers never make the map grow...
        assert!(plain.headers().capacity() > SERVER_HEADERS);
        assert!(filtered.headers().capacity() >= 1 + SERVER_HEADERS + FILTER_HEADERS);
        // ...and a route without filters does not keep the filters' room (hyper holds the
        // map for the connection's life).
        assert!(plain.headers().capacity() < filtered.headers().capacity());
    }

    fn request_map(capacity: usize) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(capacity);
        map.insert("x-request", HeaderValue::from_static("1"));
        map.insert(http::header::HOST, HeaderValue::from_static("example.com"));
        map
    }

    #[test]
    fn a_request_map_no_larger_than_a_fresh_one_is_emptied_and_reused() {
        let r = respond(false);
        let server = HeaderValue::from_static("gw");
        let small = request_map(r.reusable);
        let small_indices = small.capacity();
        let res = r.response_in(small, &Method::GET, Some(&server));
        let headers = res.headers();
        assert_eq!(headers.len(), 2, "{headers:?}");
        assert_eq!(headers["content-type"], "text/plain");
        assert_eq!(headers["server"], "gw");
        assert_eq!(headers.capacity(), small_indices);
        // A map grown by a request with many headers is not kept for the connection's life.
        let large = request_map(16 * r.reusable);
        let res = r.response_in(large, &Method::GET, Some(&server));
        assert_eq!(res.headers().len(), 2);
        assert_eq!(res.headers().capacity(), r.reusable);
    }

    #[test]
    fn on_a_route_with_filters_the_response_takes_the_request_parts_map_without_server() {
        let r = Arc::new(respond(true));
        let reusable = r.reusable;
        let terminal = Terminal::Respond(r);
        let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        parts.headers = request_map(reusable);
        let indices = parts.headers.capacity();
        let res = terminal
            .respond_now(&mut parts, &Body::empty(), false)
            .expect("a bodiless request is answered at once");
        assert_eq!(res.headers().len(), 1, "{:?}", res.headers());
        assert_eq!(res.headers()["content-type"], "text/plain");
        assert_eq!(res.headers().capacity(), indices);
        assert!(parts.headers.is_empty());
        // When the chain keeps the request for filters that read it later, its map stays.
        parts.headers = request_map(reusable);
        let res = terminal
            .respond_now(&mut parts, &Body::empty(), true)
            .expect("answered at once");
        assert_eq!(res.headers().len(), 1, "{:?}", res.headers());
        assert_eq!(parts.headers["x-request"], "1");
        assert_eq!(parts.headers.len(), 2);
    }

    #[test]
    fn a_configured_server_header_stays_and_head_gets_the_length_without_the_body() {
        let cfg: gateway_config::model::RespondConfig =
            serde_yaml::from_str("{ body: hello, headers: { server: mine } }").unwrap();
        let r = Respond::new(&cfg, false, true).unwrap();
        let res = r.response_in(
            request_map(4),
            &Method::HEAD,
            Some(&HeaderValue::from_static("gw")),
        );
        assert_eq!(res.headers().get_all("server").iter().count(), 1);
        assert_eq!(res.headers()["server"], "mine");
        assert_eq!(res.headers()["content-length"], "5");
        assert!(http_body::Body::is_end_stream(res.body()));
    }
}
