//! The one body type that flows through the gateway, in both directions. It avoids a heap
//! allocation for the common cases (no body, one buffer, hyper's own incoming body) and boxes
//! only genuinely streaming bodies (files, filtered or compressed streams, upstream responses).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

/// Errors carried inside body streams.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request or response body.
pub struct Body {
    kind: Kind,
}

enum Kind {
    Once(Option<Bytes>),
    Incoming(hyper::body::Incoming),
    Boxed(Pin<Box<dyn HttpBody<Data = Bytes, Error = BoxError> + Send>>),
}

impl Body {
    /// No body.
    pub const fn empty() -> Self {
        Self {
            kind: Kind::Once(None),
        }
    }

    /// A body of one buffer (cheap to clone: `Bytes` is reference counted).
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let b = bytes.into();
        Self {
            kind: Kind::Once((!b.is_empty()).then_some(b)),
        }
    }

    /// The body's one buffer, when it is a single buffer already in memory.
    pub(crate) fn as_full(&self) -> Option<&Bytes> {
        match &self.kind {
            Kind::Once(b) => b.as_ref(),
            _ => None,
        }
    }

    /// What the body says of its length, as hyper's HTTP/1.1 encoders read it: ended already,
    /// of an exact size, or unknown until it ends.
    pub(crate) fn length(&self) -> gateway_http1::BodyLength {
        use gateway_http1::BodyLength;
        if self.is_end_stream() {
            BodyLength::Empty
        } else {
            self.size_hint()
                .exact()
                .map_or(BodyLength::Unknown, BodyLength::Known)
        }
    }

    /// Wraps any body stream.
    pub fn new<B>(body: B) -> Self
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        use http_body_util::BodyExt;
        Self {
            kind: Kind::Boxed(Box::pin(body.map_err(Into::into))),
        }
    }

    /// A body made of a stream of frames that says its length (`SizeHint`) up front, as
    /// `http_body_util::StreamBody` does not: an encoder then frames it by `Content-Length`.
    pub fn from_frames<S>(frames: S, length: SizeHint) -> Self
    where
        S: futures_util::Stream<Item = Result<Frame<Bytes>, BoxError>> + Send + 'static,
    {
        Self::new(Frames { frames, length })
    }

    /// Wraps hyper's incoming body without boxing it.
    pub fn incoming(body: hyper::body::Incoming) -> Self {
        Self {
            kind: Kind::Incoming(body),
        }
    }
}

impl Default for Body {
    fn default() -> Self {
        Self::empty()
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Self::full(b)
    }
}

impl From<&'static str> for Body {
    fn from(s: &'static str) -> Self {
        Self::full(Bytes::from_static(s.as_bytes()))
    }
}

impl From<String> for Body {
    fn from(s: String) -> Self {
        Self::full(Bytes::from(s))
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Once(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Incoming(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Kind::Boxed(b) => b.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Once(b) => b.is_none(),
            Kind::Incoming(b) => b.is_end_stream(),
            Kind::Boxed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Once(None) => SizeHint::with_exact(0),
            Kind::Once(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Incoming(b) => b.size_hint(),
            Kind::Boxed(b) => b.size_hint(),
        }
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Once(_) => "once",
            Kind::Incoming(_) => "incoming",
            Kind::Boxed(_) => "stream",
        };
        f.debug_struct("Body").field("kind", &kind).finish()
    }
}

pin_project_lite::pin_project! {
    /// [`Body::from_frames`]'s stream.
    struct Frames<S> {
        #[pin]
        frames: S,
        length: SizeHint,
    }
}

impl<S> HttpBody for Frames<S>
where
    S: futures_util::Stream<Item = Result<Frame<Bytes>, BoxError>>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.project().frames.poll_next(cx)
    }

    fn size_hint(&self) -> SizeHint {
        self.length
    }
}
