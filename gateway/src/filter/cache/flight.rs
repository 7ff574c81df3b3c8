//! An answer on its way into the store, as the requests coalesced on its fetch read it: its
//! head once the leading request found the answer storable, then its body's pieces as they
//! arrive, so that a waiter streams the body instead of waiting for the whole object.
//!
//! The pieces form a chain of shared links: a reader holds the link it sent last, so what
//! every reader has sent is freed. The flight keeps its first link (a request coalescing now
//! starts from the beginning) only while the answer may still go to the memory tier, whose
//! fill holds that much anyway; past that, the body goes to disk and a request arriving then
//! waits for the stored object instead.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::header::{AGE, CONTENT_LENGTH};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body::{Frame, SizeHint};
use tokio::sync::watch;
use tokio::time::Instant;

use super::fresh::Freshness;
use super::hit_status;
use super::serve::CACHE_STATUS;
use super::store::variant;
use crate::body::{Body, BoxError};

/// The head of an answer being stored, and its body so far.
pub(super) struct Flight {
    status: StatusCode,
    /// The head as it is stored ([`super::stored_head`]).
    headers: HeaderMap,
    /// Its age when it arrived, and when that was; how long it is fresh.
    initial_age: Duration,
    lifetime: Duration,
    arrived: Instant,
    /// Its `Content-Length`, when it declared one.
    length: Option<u64>,
    /// The request headers it varies on, and the leading request's values of them.
    vary: Vec<HeaderName>,
    variant: String,
    /// Where a reader joining now starts; `None` once the body outgrew the memory tier.
    first: Mutex<Option<Arc<Link>>>,
    progress: watch::Sender<Progress>,
}

/// One piece of the body, and the next once it arrives.
struct Link {
    piece: Bytes,
    next: OnceLock<Arc<Link>>,
}

/// How far the body has come (each piece linked is announced by a change of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// More pieces may come.
    Receiving,
    /// Whole: the last piece is in the chain.
    Complete,
    /// Cut off (the upstream failed, the answer was too large or was not stored).
    Failed,
}

impl Flight {
    /// The flight of an answer with `status` and stored head `headers`, fresh as `freshness`
    /// says (`variant`: the leading request's values of the headers it varies on), and the end
    /// that writes its body.
    pub(super) fn start(
        status: StatusCode,
        headers: HeaderMap,
        freshness: &Freshness,
        length: Option<u64>,
        variant: String,
    ) -> (Arc<Self>, FlightWriter) {
        let first = Arc::new(Link {
            piece: Bytes::new(),
            next: OnceLock::new(),
        });
        let flight = Arc::new(Self {
            status,
            headers,
            initial_age: freshness.initial_age,
            lifetime: freshness.lifetime,
            arrived: Instant::now(),
            length,
            vary: freshness.vary.clone(),
            variant,
            first: Mutex::new(Some(first.clone())),
            progress: watch::Sender::new(Progress::Receiving),
        });
        let writer = FlightWriter {
            flight: flight.clone(),
            last: first,
            received: 0,
            ended: false,
        };
        (flight, writer)
    }

    /// The answer for a waiting GET with `request`'s headers, streaming the body as it
    /// arrives; `None` when the request selects another variant or came too late to read the
    /// body from its start.
    pub(super) fn answer(&self, request: &HeaderMap) -> Option<Response<Body>> {
        if variant(&self.vary, request) != self.variant {
            return None;
        }
        let at = self
            .first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        let mut headers = self.headers.clone();
        let age = self.initial_age + self.arrived.elapsed();
        headers.insert(AGE, HeaderValue::from(age.as_secs()));
        let status = hit_status(self.lifetime, age, Some("coalesced"));
        headers.insert(CACHE_STATUS.clone(), status);
        if let Some(n) = self.length {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
        }
        let frames = pieces(at, self.progress.subscribe()).map(|p| p.map(Frame::data));
        let length = self.length.map(SizeHint::with_exact).unwrap_or_default();
        let mut res = Response::new(Body::from_frames(frames, length));
        *res.status_mut() = self.status;
        *res.headers_mut() = headers;
        Some(res)
    }

    /// Whether a waiter still reads its body.
    pub(super) fn has_readers(&self) -> bool {
        self.progress.receiver_count() > 0
    }
}

/// The leading request's end of a flight: adds the body's pieces as they arrive. Dropped
/// before [`FlightWriter::complete`], the flight fails and its readers' answers are cut off.
pub(super) struct FlightWriter {
    flight: Arc<Flight>,
    last: Arc<Link>,
    /// Body bytes so far.
    received: u64,
    ended: bool,
}

impl FlightWriter {
    /// Body bytes so far.
    pub(super) fn received(&self) -> u64 {
        self.received
    }

    /// Adds a piece of the body.
    pub(super) fn push(&mut self, piece: Bytes) {
        if piece.is_empty() {
            return;
        }
        self.received += piece.len() as u64;
        let link = Arc::new(Link {
            piece,
            next: OnceLock::new(),
        });
        // Only this writer sets a link's successor, once.
        let _ = self.last.next.set(link.clone());
        self.last = link;
        // Unchanged, but announced: readers wake to the new link.
        self.flight.progress.send_modify(|_| {});
    }

    /// Requests arriving from now on wait for the stored object: the body goes to disk, and
    /// the flight no longer keeps it from its start.
    pub(super) fn close_to_joiners(&self) {
        *self.flight.first.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The body is whole.
    pub(super) fn complete(mut self) {
        self.ended = true;
        self.close_to_joiners();
        self.flight.progress.send_replace(Progress::Complete);
    }
}

impl Drop for FlightWriter {
    fn drop(&mut self) {
        if !self.ended {
            self.close_to_joiners();
            self.flight.progress.send_replace(Progress::Failed);
        }
    }
}

/// The pieces after `at`, as they arrive.
fn pieces(
    at: Arc<Link>,
    progress: watch::Receiver<Progress>,
) -> impl Stream<Item = Result<Bytes, BoxError>> + Send {
    futures_util::stream::unfold(Some((at, progress)), |state| async move {
        let (at, mut progress) = state?;
        loop {
            // Seen before the chain is looked at: the writer links a piece before it says so,
            // so a piece linked after this look wakes the wait below.
            let now = *progress.borrow_and_update();
            if let Some(next) = at.next.get() {
                let piece = next.piece.clone();
                return Some((Ok(piece), Some((next.clone(), progress))));
            }
            match now {
                Progress::Receiving => {}
                Progress::Complete => return None,
                Progress::Failed => return Some((Err(cut_off()), None)),
            }
            // The flight (and with it the sender) goes only after its writer said how the body
            // ended; gone while still receiving, the body is cut off.
            if progress.changed().await.is_err()
                && matches!(*progress.borrow(), Progress::Receiving)
            {
                return Some((Err(cut_off()), None));
            }
        }
    })
}

fn cut_off() -> BoxError {
    "the coalesced fetch's answer was cut off".into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn fresh(vary: Vec<HeaderName>) -> Freshness {
        Freshness {
            lifetime: Duration::from_secs(60),
            initial_age: Duration::ZERO,
            always_revalidate: false,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
            vary,
        }
    }

    fn flight() -> (Arc<Flight>, FlightWriter) {
        let fresh = fresh(Vec::new());
        Flight::start(
            StatusCode::OK,
            HeaderMap::new(),
            &fresh,
            None,
            String::new(),
        )
    }

    #[tokio::test]
    async fn a_reader_gets_what_came_before_it_and_what_comes_after() {
        let (flight, mut writer) = flight();
        writer.push(Bytes::from_static(b"one "));
        let early = flight.answer(&HeaderMap::new()).expect("joins");
        let reading = tokio::spawn(early.into_body().collect());
        tokio::task::yield_now().await;
        writer.push(Bytes::from_static(b"two "));
        let late = flight.answer(&HeaderMap::new()).expect("joins");
        writer.push(Bytes::from_static(b"three"));
        writer.complete();
        let early = reading.await.unwrap().unwrap().to_bytes();
        let late = late.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&early[..], b"one two three");
        assert_eq!(&late[..], b"one two three");
        assert!(flight.answer(&HeaderMap::new()).is_none(), "ended");
    }

    #[tokio::test]
    async fn a_writer_dropped_midway_cuts_the_readers_off() {
        let (flight, mut writer) = flight();
        writer.push(Bytes::from_static(b"part"));
        let res = flight.answer(&HeaderMap::new()).expect("joins");
        drop(writer);
        assert!(res.into_body().collect().await.is_err());
    }

    #[tokio::test]
    async fn past_the_memory_tier_no_one_joins_but_readers_go_on() {
        let (flight, mut writer) = flight();
        writer.push(Bytes::from_static(b"a"));
        let res = flight.answer(&HeaderMap::new()).expect("joins");
        writer.close_to_joiners();
        assert!(flight.answer(&HeaderMap::new()).is_none());
        writer.push(Bytes::from_static(b"b"));
        writer.complete();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ab");
    }

    #[test]
    fn another_variant_is_not_served() {
        let vary = vec![http::header::ACCEPT_ENCODING];
        let mut leader = HeaderMap::new();
        leader.insert(
            http::header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip"),
        );
        let (flight, _writer) = Flight::start(
            StatusCode::OK,
            HeaderMap::new(),
            &fresh(vary.clone()),
            Some(3),
            variant(&vary, &leader),
        );
        assert!(flight.answer(&HeaderMap::new()).is_none());
        let res = flight.answer(&leader).expect("same variant");
        assert_eq!(res.headers()[CONTENT_LENGTH], "3");
        assert_eq!(
            res.headers()[&CACHE_STATUS],
            "gateway; hit; ttl=60; detail=coalesced"
        );
    }
}
