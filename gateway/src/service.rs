//! The per-connection hyper service: route lookup, the filter chain and terminal, and the few
//! things every response gets. Errors never reach hyper; they are responses by now.

use std::convert::Infallible;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::body::Body;
use crate::context::{ConnInfo, RequestCx};
use crate::error::error_response;
use crate::filter::with_server;
use crate::generation::Generation;
use crate::router::request_host;
use crate::server::idle::Activity;

/// State shared by the requests of one connection.
pub struct ConnService {
    /// The live generation (swapped on reload).
    pub generation: Arc<ArcSwap<Generation>>,
    /// Index of the listener in the generation's config.
    pub listener: usize,
    /// Connection facts.
    pub conn: Arc<ConnInfo>,
    /// Idle/header-timeout bookkeeping.
    pub activity: Arc<Activity>,
    /// Longest URI accepted.
    pub max_uri: usize,
}

impl ConnService {
    /// Serves one request.
    pub async fn call(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        self.activity
            .request_started(req.version() == http::Version::HTTP_2);
        let res = self.route(req).await;
        self.activity.request_done();
        Ok(res)
    }

    async fn route(&self, req: Request<Incoming>) -> Response<Body> {
        let generation = self.generation.load_full();
        let uri = req.uri();
        if uri.path_and_query().map_or(0, |p| p.as_str().len()) > self.max_uri {
            return self.finish(&generation, error_response(StatusCode::URI_TOO_LONG));
        }
        let host = request_host(uri, req.headers());
        let route =
            generation
                .router
                .find(self.listener, req.method(), host, uri.path(), req.headers());
        let Some(route) = route else {
            return self.finish(&generation, error_response(StatusCode::NOT_FOUND));
        };
        let cx = RequestCx {
            conn: self.conn.clone(),
            route: route.name.clone(),
            start: Instant::now(),
        };
        let req = req.map(Body::incoming);
        route
            .chain
            .run(&route.terminal, req, cx, generation.server_header.as_ref())
            .await
    }

    fn finish(&self, generation: &Generation, res: Response<Body>) -> Response<Body> {
        with_server(res, generation.server_header.as_ref())
    }
}
