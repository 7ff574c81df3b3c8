//! Per-listener request policy, built once when a listener's settings load: the URI and body
//! limits, the request body's read timeout, the `Strict-Transport-Security` header of TLS
//! listeners, and the counters of refused requests (`gateway_http_rejected_total{listener,
//! reason}`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use gateway_config::Listener;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::body::{Body, BoxError};
use crate::connection::ConnInfo;
use crate::error::{BodyLimitExceeded, GatewayError};
use crate::forwarded::TrustedProxies;
use crate::request::{self, EntryRefusal, EntryRules, EscapedSlashes, PathRules};
use crate::telemetry::{Counter, Registry};
use gateway_http1::framing::Violation;

/// Reasons counted besides the framing violations.
const URI_TOO_LONG: &str = "uri_too_long";
const BODY_TOO_LARGE: &str = "body_too_large";

/// Counters of refused requests, one per reason, registered up front.
///
/// Shared: every connection holds the listener's set, so a clone is one reference count, not a
/// copy of the list with a reference count taken on each counter, for every connection.
#[derive(Clone, Debug, Default)]
pub struct Rejections {
    counters: Arc<[(&'static str, Counter)]>,
}

impl Rejections {
    /// The series of `listener`.
    pub fn new(registry: &Registry, listener: &str) -> Self {
        let reasons = Violation::ALL
            .iter()
            .map(|v| v.reason())
            .chain([URI_TOO_LONG, BODY_TOO_LARGE])
            .chain(EntryRefusal::REASONS);
        let counters = reasons
            .map(|reason| {
                let c = registry.counter(
                    "gateway_http_rejected_total",
                    "Requests refused before routing (ambiguous framing, limits), by reason.",
                    &[("listener", listener), ("reason", reason)],
                );
                (reason, c)
            })
            .collect();
        Self { counters }
    }

    /// Counts one refusal (only on the refusal path, so a short scan is fine).
    pub fn count(&self, reason: &str) {
        if let Some((_, c)) = self.counters.iter().find(|(r, _)| *r == reason) {
            c.inc();
        }
    }
}

/// What the service checks and adds for every request of a listener.
#[derive(Debug)]
pub struct ListenerPolicy {
    /// Longest request target (path and query).
    pub max_uri: usize,
    /// Largest request body; 0 means unlimited.
    pub max_body: u64,
    /// `Strict-Transport-Security` for every response (TLS listeners with `tls.hsts`).
    pub hsts: Option<HeaderValue>,
    /// `Host` and path rules every request must pass.
    pub entry: EntryRules,
    /// Refusal counters.
    pub rejected: Rejections,
    /// `trusted_proxies`, when any, with the count of malformed forwarding fields they sent
    /// (`gateway_http_forwarded_invalid_total`).
    pub trusted: Option<(TrustedProxies, Counter)>,
}

impl ListenerPolicy {
    /// Builds the policy of `listener`.
    pub fn new(listener: &Listener, registry: &Registry) -> Self {
        let settings = &listener.settings;
        Self {
            max_uri: settings.max_uri_length.as_usize(),
            max_body: settings.max_body_size.bytes(),
            hsts: listener
                .tls
                .as_ref()
                .and_then(|t| t.hsts.as_ref())
                .map(hsts_value),
            entry: entry_rules(settings),
            rejected: Rejections::new(registry, &listener.name),
            trusted: TrustedProxies::new(&listener.trusted_proxies).map(|t| {
                let invalid = registry.counter(
                    "gateway_http_forwarded_invalid_total",
                    "Requests from a trusted proxy whose X-Forwarded-For or Forwarded held a malformed entry, by listener.",
                    &[("listener", &listener.name)],
                );
                (t, invalid)
            }),
        }
    }

    /// Whether `peer` is one of the listener's trusted proxies.
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        self.trusted.as_ref().is_some_and(|(t, _)| t.contains(peer))
    }

    /// A request's own facts, when its peer is a trusted proxy whose forwarding fields name
    /// another client, or whose `X-Forwarded-Proto` another scheme; `None` (the connection's
    /// facts hold) otherwise, and at once when the listener trusts no one.
    pub fn client_of(&self, conn: &ConnInfo, headers: &http::HeaderMap) -> Option<Arc<ConnInfo>> {
        let (trusted, invalid) = self.trusted.as_ref()?;
        if !trusted.contains(conn.peer.ip()) {
            return None;
        }
        let resolved = trusted.resolve(headers);
        if resolved.invalid {
            invalid.inc();
            tracing::debug!(peer = %conn.peer, "malformed forwarding field from a trusted proxy");
        }
        let https = crate::forwarded::forwarded_https(headers).unwrap_or(conn.https);
        let client = resolved.client.filter(|c| c.ip() != conn.client.ip());
        if client.is_none() && https == conn.https {
            return None;
        }
        Some(Arc::new(
            conn.via_proxy(client.unwrap_or(conn.client), https),
        ))
    }

    /// Checks a request before routing: `414` for a long target, `413` for a declared length
    /// over the limit. A body of unknown length is wrapped so it fails once it passes the limit.
    /// (By reference: a request is a few hundred bytes, and moving it in and out again copies
    /// it twice on every request.)
    pub fn admit(&self, req: &mut Request<Body>) -> Result<(), StatusCode> {
        let uri_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
        if uri_len > self.max_uri {
            self.rejected.count(URI_TOO_LONG);
            return Err(StatusCode::URI_TOO_LONG);
        }
        if let Err(refusal) = request::enter(req, &self.entry) {
            tracing::debug!(reason = refusal.reason(), "request refused on entry");
            self.rejected.count(refusal.reason());
            return Err(StatusCode::BAD_REQUEST);
        }
        self.admit_entered(req);
        if self.max_body == 0 || req.body().is_end_stream() {
            return Ok(());
        }
        match req.body().size_hint().exact() {
            // The protocol layer already holds the body to its declared length.
            Some(n) if n <= self.max_body => Ok(()),
            Some(_) => {
                self.rejected.count(BODY_TOO_LARGE);
                Err(StatusCode::PAYLOAD_TOO_LARGE)
            }
            None => {
                let inner = std::mem::take(req.body_mut());
                *req.body_mut() = Body::new(Limited {
                    inner,
                    left: self.max_body,
                    limit: self.max_body,
                    rejected: self.rejected.clone(),
                });
                Ok(())
            }
        }
    }

    /// [`Self::admit`] for a body-less request whose URI length and entry rules the caller
    /// checked already ([`crate::request::passes_unchanged`]): what is left of the admission is
    /// the removal of the client's hop-by-hop fields.
    pub fn admit_entered(&self, req: &mut Request<Body>) {
        crate::proxy::headers::strip_on_entry(req.headers_mut());
    }

    /// Adds the listener's response headers.
    pub fn decorate<B>(&self, res: &mut Response<B>) {
        if let Some(v) = &self.hsts {
            res.headers_mut()
                .insert(http::header::STRICT_TRANSPORT_SECURITY, v.clone());
        }
    }
}

/// The listener's `Host` and path rules.
fn entry_rules(settings: &gateway_config::model::ListenerConfig) -> EntryRules {
    use gateway_config::model::{EscapedSlashesAction, PathForward};
    let cfg = &settings.path_normalization;
    EntryRules {
        path: PathRules {
            merge_slashes: cfg.merge_slashes,
            escaped_slashes: match cfg.escaped_slashes {
                EscapedSlashesAction::Reject => EscapedSlashes::Reject,
                EscapedSlashesAction::Keep => EscapedSlashes::Keep,
                EscapedSlashesAction::Decode => EscapedSlashes::Decode,
            },
        },
        forward_original: cfg.forward == PathForward::Original,
        strict_uri: settings.strict_uri,
    }
}

/// The `Strict-Transport-Security` value, formatted once.
fn hsts_value(cfg: &gateway_config::model::HstsConfig) -> HeaderValue {
    let mut v = format!("max-age={}", cfg.max_age.get().as_secs());
    if cfg.include_subdomains {
        v.push_str("; includeSubDomains");
    }
    if cfg.preload {
        v.push_str("; preload");
    }
    HeaderValue::try_from(v).unwrap_or_else(|_| HeaderValue::from_static("max-age=0"))
}

/// A request body of unknown length held to a byte limit.
struct Limited {
    inner: Body,
    left: u64,
    limit: u64,
    rejected: Rejections,
}

impl HttpBody for Limited {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            let n = data.len() as u64;
            if n > self.left {
                self.left = 0;
                self.rejected.count(BODY_TOO_LARGE);
                return Poll::Ready(Some(Err(BodyLimitExceeded(self.limit).into())));
            }
            self.left -= n;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps hyper's incoming body so that waiting longer than `limit` for its next bytes fails it
/// with [`GatewayError::BodyReadTimeout`] (a slow-loris upload). Requests without a body are
/// not wrapped, so they cost nothing extra.
pub fn incoming_with_timeout(body: hyper::body::Incoming, limit: Duration) -> Body {
    if body.is_end_stream() {
        return Body::incoming(body);
    }
    Body::new(ReadTimeout {
        body,
        limit,
        timer: None,
        armed: false,
        expired: false,
    })
}

/// A request body whose reads are bounded in time: the clock runs only while the reader waits
/// for bytes, so a slow consumer (an upstream applying backpressure) does not count.
struct ReadTimeout {
    body: hyper::body::Incoming,
    limit: Duration,
    /// Created on the first wait and reset afterwards, so a long upload allocates one timer.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the timer measures the current wait.
    armed: bool,
    expired: bool,
}

impl HttpBody for ReadTimeout {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(r) => {
                this.armed = false;
                Poll::Ready(r.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let deadline = tokio::time::Instant::now() + this.limit;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if !this.armed {
                    timer.as_mut().reset(deadline);
                    this.armed = true;
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.expired = true;
                        Poll::Ready(Some(Err(Box::new(GatewayError::BodyReadTimeout(
                            this.limit,
                        )))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::is_body_limit;
    use http_body_util::BodyExt;

    fn policy(max_body: u64) -> ListenerPolicy {
        ListenerPolicy {
            max_uri: 16,
            max_body,
            hsts: None,
            entry: EntryRules::default(),
            rejected: Rejections::default(),
            trusted: None,
        }
    }

    #[tokio::test]
    async fn limits_uri_declared_and_streamed_bodies() {
        let p = policy(4);
        let mut long = Request::get("/0123456789abcdefgh")
            .body(Body::empty())
            .unwrap();
        assert_eq!(p.admit(&mut long).err(), Some(StatusCode::URI_TOO_LONG));
        let mut declared = Request::post("/")
            .header("host", "a")
            .body(Body::full("hello"))
            .unwrap();
        assert_eq!(
            p.admit(&mut declared).err(),
            Some(StatusCode::PAYLOAD_TOO_LARGE)
        );
        let chunks = futures_util::stream::iter(
            ["ab", "cd", "e"]
                .map(|s| Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(s.as_bytes())))),
        );
        let mut streamed = Request::post("/")
            .header("host", "a")
            .body(Body::new(http_body_util::StreamBody::new(chunks)))
            .unwrap();
        p.admit(&mut streamed).unwrap();
        let body = streamed.into_body();
        let err = body.collect().await.unwrap_err();
        assert!(is_body_limit(&*err), "{err}");
        let mut fits = Request::post("/")
            .header("host", "a")
            .body(Body::full("abcd"))
            .unwrap();
        assert!(p.admit(&mut fits).is_ok());
    }

    #[test]
    fn hsts_value_lists_the_directives() {
        let cfg = gateway_config::model::HstsConfig {
            max_age: "365d".parse().unwrap(),
            include_subdomains: true,
            preload: true,
        };
        assert_eq!(
            hsts_value(&cfg),
            "max-age=31536000; includeSubDomains; preload"
        );
    }
}
