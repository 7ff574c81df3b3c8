//! Small conversions for the HTTP filter: a guest's local reply as a response, a resumed
//! pause as the filter's outcome, `end_of_stream` for a request head.

use http::header::{CONTENT_LENGTH, HeaderName, HeaderValue, TRANSFER_ENCODING};
use http::{Response, StatusCode, Version, request};
use wasm_host::{LocalResponse, PluginError};

use super::pool::Resume;
use crate::body::{Body, BoxError};
use crate::error::error_response;

/// A plugin failure as the error a hook returns (the chain answers 500 and logs it, with the
/// [`PluginError`] as the source).
pub(crate) fn fail(e: PluginError) -> BoxError {
    Box::new(e)
}

/// `end_of_stream` for the request head: HTTP/1.1 without a length or chunked coding has no
/// body; otherwise a declared length of 0.
pub(crate) fn headers_only(req: &request::Parts) -> bool {
    let len = req.headers.get(CONTENT_LENGTH).map(HeaderValue::as_bytes);
    match len {
        Some(l) => l == b"0",
        None => req.version <= Version::HTTP_11 && !req.headers.contains_key(TRANSFER_ENCODING),
    }
}

/// The response for a guest's local reply.
pub(crate) fn local_response(r: LocalResponse) -> Response<Body> {
    let mut res = Response::new(Body::full(r.body));
    *res.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (k, v) in r.headers {
        if k.starts_with(':') {
            continue;
        }
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_bytes(&v),
        ) {
            res.headers_mut().append(k, v);
        }
    }
    res
}

pub(crate) fn outcome(resume: Resume) -> Result<Option<Response<Body>>, BoxError> {
    match resume {
        Resume::Continue => Ok(None),
        Resume::Local(r) => Ok(Some(local_response(r))),
        Resume::Close => Ok(Some(error_response(StatusCode::FORBIDDEN))),
        Resume::Failed => Err(fail(PluginError::Unavailable(
            "the plugin VM failed while the request was paused".into(),
        ))),
    }
}
