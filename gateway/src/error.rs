//! The gateway's error type. Errors never reach hyper: each one is turned into a response
//! (status and a short plain-text reason) in exactly one place, [`GatewayError::into_response`].

use std::time::Duration;

use http::{Response, StatusCode, header};

use crate::body::{Body, BoxError};

/// What went wrong while serving a request or building a generation.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The configuration is invalid (located).
    #[error(transparent)]
    Config(#[from] gateway_config::ConfigError),
    /// A socket could not be bound.
    #[error("cannot bind {what} {addr}: {source}")]
    Bind {
        /// Listener or stream name.
        what: String,
        /// Address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No route matched.
    #[error("no route for {host}{path}")]
    NoRoute {
        /// Host.
        host: String,
        /// Path.
        path: String,
    },
    /// The request body exceeded a limit.
    #[error("request body larger than {0} bytes")]
    BodyTooLarge(u64),
    /// Reading the request body failed.
    #[error("reading the request body failed")]
    RequestBody(#[source] BoxError),
    /// The client sent no request body bytes for this long while the gateway waited.
    #[error("no request body bytes for {0:?}")]
    BodyReadTimeout(Duration),
    /// Connecting to an upstream failed.
    #[error("connect to upstream {addr} failed")]
    UpstreamConnect {
        /// Target.
        addr: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The upstream did not answer in time.
    #[error("upstream timed out after {0:?}")]
    UpstreamTimeout(Duration),
    /// The upstream answered with something unusable or reset.
    #[error("upstream {addr} failed")]
    UpstreamFailed {
        /// Target.
        addr: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// No healthy target is left.
    #[error("no healthy target in upstream `{0}`")]
    NoHealthyTarget(String),
    /// A filter failed.
    #[error("filter `{filter}` failed")]
    Filter {
        /// Filter name.
        filter: &'static str,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Obtaining, renewing or stapling a certificate failed (ACME, OCSP, storage).
    #[error("certificate: {0}")]
    Certificate(String),
    /// Anything else internal.
    #[error("internal error: {0}")]
    Internal(String),
}

impl GatewayError {
    /// The status a client sees for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NoRoute { .. } => StatusCode::NOT_FOUND,
            Self::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            // A body cut off at the listener's `max_body_size` fails the same way as a broken
            // one; the marker error inside tells them apart.
            Self::RequestBody(e) if is_body_limit(&**e) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyReadTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::RequestBody(e) if is_body_read_timeout(&**e) => StatusCode::REQUEST_TIMEOUT,
            Self::RequestBody(_) => StatusCode::BAD_REQUEST,
            Self::UpstreamConnect { .. } | Self::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::NoHealthyTarget(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Config(_)
            | Self::Bind { .. }
            | Self::Filter { .. }
            | Self::Certificate(_)
            | Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The response for this error: its status and the status's reason as text.
    pub fn into_response(self) -> Response<Body> {
        error_response(self.status())
    }
}

/// The error a body over the listener's limit fails with; the proxy and the body-buffering
/// filters turn it into `413`.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than {0} bytes")]
pub struct BodyLimitExceeded(pub u64);

/// Whether `error` (or anything it wraps) is a body over the listener's limit.
pub fn is_body_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if e.is::<BodyLimitExceeded>() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Whether a body error is (or wraps, as hyper's client does) a body read timeout.
fn is_body_read_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if matches!(
            err.downcast_ref::<GatewayError>(),
            Some(GatewayError::BodyReadTimeout(_))
        ) {
            return true;
        }
        cur = err.source();
    }
    false
}

/// A minimal plain-text response for `status`.
pub fn error_response(status: StatusCode) -> Response<Body> {
    let reason = status.canonical_reason().unwrap_or("Error");
    let mut res = Response::new(Body::from(format!("{} {reason}\n", status.as_u16())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}
