//! Terminals produce a route's response: a synthetic `respond`, static files, or the reverse
//! proxy. Dispatch is a plain `match`. A synthetic response to a bodiless request, and a static
//! file served from the cache, are made at once, without a future; the other paths are boxed,
//! so a [`TerminalFuture`] is a response or a pointer, whatever the terminal (the static and
//! proxy futures are kilobytes, and one allocation per request is noise next to their work).

use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::Either;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};

use crate::body::Body;
use crate::context::RequestCx;

/// A terminal's answer: ready at once, or one boxed future.
pub type TerminalFuture = Either<Ready<Response<Body>>, BoxedResponse>;

/// A terminal's boxed future. It owns what it uses (it borrows neither the route nor the
/// request's context), so the service can hold it as the request's only allocation instead of
/// boxing it again inside a future of its own.
pub type BoxedResponse = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// A route's terminal.
pub enum Terminal {
    /// A fixed response.
    Respond(Arc<Respond>),
    /// Files from a root directory.
    Static(Arc<crate::static_files::StaticFiles>),
    /// The reverse proxy.
    Proxy(Arc<crate::proxy::ProxyRoute>),
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
        }
    }

    /// The response when it needs no waiting at all: a synthetic response to a bodiless
    /// request, or a static file from the cache. The service and the filter chain answer these
    /// without making a future.
    pub fn respond_now(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &Body,
    ) -> Option<Response<Body>> {
        match self {
            Self::Respond(r) if http_body::Body::is_end_stream(body) => Some(r.response(method)),
            Self::Static(s) => s.serve_now(method, uri, headers),
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
/// an HTTP/1 connection to parse the next request into. Reserving for filters on every route
/// cost 10,000 keep-alive connections about 5 MB.
pub struct Respond {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    /// The header map's reservation: the configured headers and the ones added after them.
    capacity: usize,
}

impl Respond {
    /// Compiles the configured response, for a route with or without filters.
    pub fn new(cfg: &gateway_config::model::RespondConfig, filtered: bool) -> Result<Self, String> {
        let status = StatusCode::from_u16(cfg.status).map_err(|e| e.to_string())?;
        let mut headers = Vec::with_capacity(cfg.headers.len());
        for (k, v) in &cfg.headers {
            headers.push((
                HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header `{k}`: {e}"))?,
                HeaderValue::from_str(v).map_err(|e| format!("header `{k}`: {e}"))?,
            ));
        }
        let added = SERVER_HEADERS + if filtered { FILTER_HEADERS } else { 0 };
        Ok(Self {
            status,
            capacity: headers.len() + added,
            headers,
            body: Bytes::from(cfg.body.clone()),
        })
    }

    fn response(&self, method: &Method) -> Response<Body> {
        let body = if method == Method::HEAD {
            Body::empty()
        } else {
            Body::full(self.body.clone())
        };
        let mut res = Response::new(body);
        *res.status_mut() = self.status;
        let headers = res.headers_mut();
        headers.reserve(self.capacity);
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        if method == Method::HEAD {
            res.headers_mut().insert(
                http::header::CONTENT_LENGTH,
                HeaderValue::from(self.body.len()),
            );
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn respond(filtered: bool) -> Respond {
        let cfg: gateway_config::model::RespondConfig =
            serde_yaml::from_str("{ body: hi, headers: { content-type: text/plain } }").unwrap();
        Respond::new(&cfg, filtered).unwrap()
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
}
