//! Trailers of request bodies that hyper's clients write (HTTP/2, a protocol switch): the
//! fields no trailer carries ([`gateway_http1::trailers`]) are dropped on the way. The proxy's
//! own HTTP/1.1 client leaves them out as it writes the trailer section.

use bytes::Bytes;
use http_body_util::BodyExt as _;

use crate::body::Body;

/// `body` with [`gateway_http1::trailers::strip`] applied to its trailers.
pub(crate) fn stripped(body: Body) -> Body {
    Body::new(body.map_frame(|mut frame: http_body::Frame<Bytes>| {
        if let Some(trailers) = frame.trailers_mut() {
            gateway_http1::trailers::strip(trailers);
        }
        frame
    }))
}
