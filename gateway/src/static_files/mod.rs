//! Terminal `static`: files from a root directory. (Being filled in: see the static files work.)

use http::{Request, Response};

use crate::body::Body;
use crate::error::error_response;

/// A compiled `static` terminal.
pub struct StaticFiles {
    _root: std::path::PathBuf,
}

impl StaticFiles {
    /// Builds the terminal from validated config.
    pub fn new(cfg: &gateway_config::model::StaticConfig) -> Result<Self, String> {
        Ok(Self {
            _root: cfg.root.clone(),
        })
    }

    /// Serves one request.
    pub async fn serve(&self, _req: Request<Body>) -> Response<Body> {
        error_response(http::StatusCode::NOT_IMPLEMENTED)
    }
}
