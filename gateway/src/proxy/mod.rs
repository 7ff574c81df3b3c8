//! Terminal `proxy`: the reverse proxy. (Being filled in: see the reverse proxy work.)

use http::{Request, Response};

use crate::body::Body;
use crate::context::RequestCx;
use crate::error::error_response;

/// A route's proxy terminal.
pub struct ProxyRoute;

impl ProxyRoute {
    /// Forwards one request.
    pub async fn forward(&self, _req: Request<Body>, _cx: &RequestCx) -> Response<Body> {
        error_response(http::StatusCode::NOT_IMPLEMENTED)
    }
}
