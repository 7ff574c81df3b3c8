//! `proxy.mirror`: copies of a route's requests sent, fire-and-forget, to another upstream.
//!
//! A request is picked by `percent` (spread evenly over the requests, not drawn at random, so a
//! share holds over any run), and only while fewer than `max_in_flight` copies are out. The
//! copy carries the method, target and fields the route's upstream gets, its `Host` (or
//! `:authority`) suffixed with `-shadow` before any port, as Envoy marks its shadows, so the
//! shadow can tell copies from real traffic. Its body is teed from the client's as the real
//! request reads it, through a channel of [`COPY_FRAMES`] frames that is never waited on: when
//! the shadow falls behind, the copy is cut (its request fails upstream) rather than the
//! client's request slowed or buffered. The copy runs in a task of its own with the shadow
//! upstream's pool, balancer, health and the route's timeout; its answer is read and dropped.
//! Each picked request ends as one `result` of `gateway_mirror_requests_total`: `sent` (the
//! shadow answered, below 500), `failed` (no answer, a 5xx, or a broken answer) or `dropped`
//! (not sent: too many in flight, or its body copy cut).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::HeaderValue;
use http::uri::Authority;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::mpsc;

use super::{ProxyRoute, RequestLine, Rewritten, Tries, pace, trailers};
use crate::body::{Body, BoxError};
use crate::telemetry::{Counter, Registry};

/// Frames of a request body a copy may lag behind the real request before it is cut.
const COPY_FRAMES: usize = 16;

/// Parts per million of requests a percentage picks.
const MILLION: u64 = 1_000_000;

/// A route's mirror, built with the route.
pub(super) struct Mirror {
    /// The shadow upstream, addressed as the route addresses its own (no retries: a copy is
    /// sent once).
    route: Arc<ProxyRoute>,
    /// Requests picked per million.
    per_million: u64,
    /// Requests seen, for the even spread of the picked ones.
    seen: AtomicU64,
    max_in_flight: usize,
    in_flight: AtomicUsize,
    sent: Counter,
    dropped: Counter,
    failed: Counter,
}

/// A picked request's copy, between the tee and the request made of it.
pub(super) struct Copy {
    body: Body,
    cut: Arc<AtomicBool>,
    slot: Slot,
}

impl Mirror {
    /// The mirror of route `route_name`, sending to `shadow` (a route to the shadow upstream).
    pub(super) fn new(
        route_name: &str,
        cfg: &gateway_config::model::MirrorConfig,
        shadow: ProxyRoute,
        registry: &Registry,
    ) -> Self {
        let counter = |result| {
            registry.counter(
                "gateway_mirror_requests_total",
                "Requests picked for a copy to a route's mirror, by how the copy ended (sent: the shadow answered below 500; failed: no answer, a 5xx or a broken one; dropped: not sent, too many in flight or its body copy cut).",
                &[("route", route_name), ("result", result)],
            )
        };
        let mut shadow = shadow;
        shadow.shadow = true;
        shadow.retries = 0;
        Self {
            route: Arc::new(shadow),
            per_million: (cfg.percent.clamp(0.0, 100.0) * 10_000.0).round() as u64,
            seen: AtomicU64::new(0),
            max_in_flight: cfg.max_in_flight,
            in_flight: AtomicUsize::new(0),
            sent: counter("sent"),
            dropped: counter("dropped"),
            failed: counter("failed"),
        }
    }

    /// Whether the request counted `n` (from 0) is picked: the picked ones spread evenly, so
    /// any `1/percent` requests in a row hold one.
    fn picks(&self, n: u64) -> bool {
        let before = (u128::from(n) * u128::from(self.per_million)) / u128::from(MILLION);
        let after = (u128::from(n + 1) * u128::from(self.per_million)) / u128::from(MILLION);
        after > before
    }

    /// Picks the request or not; when picked, and a slot is free, the client's `body` comes back
    /// teed with its copy. The note is what the access log says: `copied`, `dropped` (picked,
    /// but too many copies in flight), or nothing when the request was not picked.
    pub(super) fn select(
        self: &Arc<Self>,
        body: Body,
        empty: bool,
    ) -> (Body, Option<Copy>, Option<&'static str>) {
        if !self.picks(self.seen.fetch_add(1, Relaxed)) {
            return (body, None, None);
        }
        let Some(slot) = Slot::take(self) else {
            self.dropped.inc();
            return (body, None, Some("dropped"));
        };
        if empty {
            let cut = Arc::new(AtomicBool::new(false));
            let copy = Copy {
                body: Body::empty(),
                cut,
                slot,
            };
            return (body, Some(copy), Some("copied"));
        }
        let (tee, copy) = tee(body);
        let copy = Copy {
            cut: copy.cut.clone(),
            body: Body::new(copy),
            slot,
        };
        (Body::new(tee), Some(copy), Some("copied"))
    }

    /// Sends `copy` as the request `line` with `fields` (the rewritten request the route's
    /// upstream gets), in a task of its own.
    pub(super) fn send(
        &self,
        copy: Copy,
        line: &RequestLine,
        fields: &Bytes,
        declared_length: Option<u64>,
        empty: bool,
    ) {
        let route = self.route.clone();
        let h2 = route.upstream.connector.is_h2();
        let shadow = line
            .host
            .as_ref()
            .map(HeaderValue::as_bytes)
            .or_else(|| line.authority.as_ref().map(|a| a.as_str().as_bytes()))
            .map(shadow_host);
        let body = if h2 && !empty {
            trailers::stripped(copy.body)
        } else {
            copy.body
        };
        let (body, pace) = pace::paced(body, empty, route.timeout);
        let rewritten = Rewritten {
            line: RequestLine {
                method: line.method.clone(),
                path: line.path.clone(),
                host: shadow
                    .as_ref()
                    .filter(|_| !h2)
                    .and_then(|h| HeaderValue::from_bytes(h).ok()),
                authority: shadow
                    .as_ref()
                    .filter(|_| h2)
                    .and_then(|h| Authority::try_from(h.as_slice()).ok()),
            },
            fields: fields.clone(),
            declared_length,
            body: Some(body),
            pace,
            tries: Tries::new(0, 0),
            body_empty: empty,
            upgrading: false,
            websocket_over_h2: false,
            client_upgrade: None,
        };
        let (cut, slot) = (copy.cut, copy.slot);
        tokio::spawn(async move {
            let res = route.try_targets(rewritten, None).await;
            let status = res.status();
            let drained = drain(res.into_body()).await;
            let counter = if cut.load(Relaxed) {
                &slot.0.dropped
            } else if status.is_server_error() || drained.is_err() {
                &slot.0.failed
            } else {
                &slot.0.sent
            };
            counter.inc();
            drop(slot);
        });
    }
}

/// `host` with `-shadow` appended to its name, before any port (`a.example:8080` becomes
/// `a.example-shadow:8080`; `[::1]:80` becomes `[::1]-shadow:80`).
fn shadow_host(host: &[u8]) -> Vec<u8> {
    let bracket = host.iter().rposition(|b| *b == b']');
    let colon = host.iter().rposition(|b| *b == b':');
    let name_end = match (colon, bracket) {
        (Some(c), Some(b)) if c > b => c,
        (Some(c), None) => c,
        _ => host.len(),
    };
    let mut out = Vec::with_capacity(host.len() + 7);
    out.extend_from_slice(&host[..name_end]);
    out.extend_from_slice(b"-shadow");
    out.extend_from_slice(&host[name_end..]);
    out
}

/// Reads a shadow's answer to its end and drops it.
async fn drain(mut body: Body) -> Result<(), BoxError> {
    use http_body_util::BodyExt;
    while let Some(frame) = body.frame().await {
        frame?;
    }
    Ok(())
}

/// One of the mirror's `max_in_flight` places, given back when the copy ends.
struct Slot(Arc<Mirror>);

impl Slot {
    fn take(mirror: &Arc<Mirror>) -> Option<Self> {
        let before = mirror.in_flight.fetch_add(1, Relaxed);
        if before >= mirror.max_in_flight {
            mirror.in_flight.fetch_sub(1, Relaxed);
            return None;
        }
        Some(Self(mirror.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

/// The client's `body` teed: the body to send on, and its copy.
fn tee(body: Body) -> (Tee, CopyBody) {
    let (tx, rx) = mpsc::channel(COPY_FRAMES);
    let copy = CopyBody {
        rx,
        cut: Arc::new(AtomicBool::new(false)),
        hint: body.size_hint(),
        done: false,
    };
    let tee = Tee {
        inner: body,
        tx: Some(tx),
    };
    (tee, copy)
}

/// What goes from the tee to the copy.
enum Piece {
    Frame(Frame<Bytes>),
    End,
}

/// The client's body, each frame handed on as it is and offered to the copy, never waited for.
struct Tee {
    inner: Body,
    /// `None` once the copy is cut or complete.
    tx: Option<mpsc::Sender<Piece>>,
}

impl Tee {
    fn offer(&mut self, piece: Piece) {
        if let Some(tx) = &self.tx
            && tx.try_send(piece).is_err()
        {
            // Full (the shadow is behind) or closed (the copy ended): dropping the sender
            // without `End` cuts the copy.
            self.tx = None;
        }
    }
}

impl HttpBody for Tee {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let copy = if let Some(data) = frame.data_ref() {
                    Some(Frame::data(data.clone()))
                } else {
                    frame.trailers_ref().map(|t| Frame::trailers(t.clone()))
                };
                if let Some(copy) = copy {
                    self.offer(Piece::Frame(copy));
                }
            }
            Poll::Ready(None) => {
                self.offer(Piece::End);
                self.tx = None;
            }
            // The client's body failed: the copy is cut with it.
            Poll::Ready(Some(Err(_))) => self.tx = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The copy's body: the tee's frames, failing when the tee cut it.
struct CopyBody {
    rx: mpsc::Receiver<Piece>,
    cut: Arc<AtomicBool>,
    /// The client's body's, so the copy is framed as the real request is.
    hint: SizeHint,
    done: bool,
}

impl HttpBody for CopyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match std::task::ready!(self.rx.poll_recv(cx)) {
            Some(Piece::Frame(frame)) => Poll::Ready(Some(Ok(frame))),
            Some(Piece::End) => {
                self.done = true;
                Poll::Ready(None)
            }
            None => {
                self.done = true;
                self.cut.store(true, Relaxed);
                Poll::Ready(Some(Err(
                    "the request's copy was cut: the mirror fell behind".into(),
                )))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shadow_host_is_marked_before_the_port() {
        let s = |h: &str| String::from_utf8(shadow_host(h.as_bytes())).unwrap();
        assert_eq!(s("api.example.com"), "api.example.com-shadow");
        assert_eq!(s("api.example.com:8080"), "api.example.com-shadow:8080");
        assert_eq!(s("[::1]:80"), "[::1]-shadow:80");
        assert_eq!(s("[::1]"), "[::1]-shadow");
    }

    fn picked(percent: f64, n: u64) -> u64 {
        let per_million = (percent * 10_000.0).round() as u64;
        let m = |i: u64| {
            let before = (u128::from(i) * u128::from(per_million)) / u128::from(MILLION);
            let after = (u128::from(i + 1) * u128::from(per_million)) / u128::from(MILLION);
            after > before
        };
        (0..n).filter(|i| m(*i)).count() as u64
    }

    #[test]
    fn a_percentage_picks_its_share_evenly() {
        assert_eq!(picked(100.0, 1000), 1000);
        assert_eq!(picked(0.0, 1000), 0);
        assert_eq!(picked(10.0, 1000), 100);
        assert_eq!(picked(10.0, 10), 1);
        assert_eq!(picked(0.5, 1000), 5);
        assert_eq!(picked(33.3, 1000), 333);
    }

    #[tokio::test]
    async fn a_copy_that_falls_behind_is_cut_and_the_client_body_flows_on() {
        use http_body_util::BodyExt;
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = (0..COPY_FRAMES + 4)
            .map(|i| Ok(Frame::data(Bytes::from(format!("chunk{i};")))))
            .collect();
        let client = Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )));
        let (tee, copy) = tee(client);
        let cut = copy.cut.clone();
        // The real request reads everything while the copy reads nothing.
        let all = Body::new(tee).collect().await.unwrap().to_bytes();
        assert!(all.ends_with(format!("chunk{};", COPY_FRAMES + 3).as_bytes()));
        let copied = Body::new(copy).collect().await;
        assert!(copied.is_err(), "a cut copy must fail, not look complete");
        assert!(cut.load(Relaxed));
    }

    #[tokio::test]
    async fn a_copy_that_keeps_up_gets_the_whole_body_and_its_end() {
        use http_body_util::BodyExt;
        let (tee, copy) = tee(Body::full(Bytes::from_static(b"hello")));
        assert_eq!(copy.size_hint().exact(), Some(5));
        let cut = copy.cut.clone();
        let all = Body::new(tee).collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"hello");
        let copied = Body::new(copy).collect().await.unwrap().to_bytes();
        assert_eq!(&copied[..], b"hello");
        assert!(!cut.load(Relaxed));
    }
}
