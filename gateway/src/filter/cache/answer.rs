//! The `cache` filter's response side: a 304 refreshing the revalidated object, a failure
//! answered with the stale one (`stale-if-error`), an unsafe method's success invalidating the
//! URL, and a storable answer streamed into the store as its body goes to the client (and to
//! the requests coalesced on its fetch, [`Flight`]).

use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::header::{AGE, CONTENT_LENGTH, RANGE};
use http::{HeaderValue, StatusCode, response};
use tokio::time::Instant;

use super::disk::Guard;
use super::flight::Flight;
use super::fresh::{self, NotStored};
use super::serve::{self, Conditions};
use super::store::{Payload, variant};
use super::{CacheFilter, Fetching, Fill, Step, object, set_status, stored_head, with_outcome};
use crate::filter::{Flow, ReadToEnd};
use crate::telemetry::LogNotes;

impl CacheFilter {
    pub(super) fn response(&mut self, res: &mut response::Parts) -> Flow {
        let shared = self.shared.clone();
        match std::mem::replace(&mut self.step, Step::Pass("method")) {
            Step::Pass(fwd) => {
                LogNotes::on(&mut res.extensions).cache = Some("pass");
                set_status(&mut res.headers, &format!("gateway; fwd={fwd}"));
            }
            Step::Invalidate(primary) => {
                if res.status.is_success() || res.status.is_redirection() {
                    let n = shared.store.remove(&primary);
                    shared.metrics.invalidations.add(n as u64);
                }
                LogNotes::on(&mut res.extensions).cache = Some("pass");
                set_status(&mut res.headers, "gateway; fwd=method");
            }
            Step::Fetch(f) => return self.fetched(f, res),
        }
        Flow::Continue
    }

    /// The upstream's answer to a fetch: a 304 refreshes the stale object and answers from
    /// it; a storable answer starts filling the store.
    fn fetched(&mut self, f: Box<Fetching>, res: &mut response::Parts) -> Flow {
        let shared = self.shared.clone();
        let now_sys = SystemTime::now();
        let cond = Conditions::of(&f.request);
        if let Some(fallback) = &f.fallback
            && matches!(res.status.as_u16(), 500 | 502 | 503 | 504)
        {
            shared.metrics.stale_if_error.inc();
            self.leader = None;
            let status = format!(
                "gateway; fwd=stale; fwd-status={}; detail=stale-if-error",
                res.status.as_u16()
            );
            let status = HeaderValue::from_str(&status)
                .unwrap_or_else(|_| HeaderValue::from_static("gateway; fwd=stale"));
            let answer = serve::answer(fallback, Instant::now(), f.head, &cond, status);
            return with_outcome(answer, "stale");
        }
        if let (Some(stale), StatusCode::NOT_MODIFIED) = (&f.stale, res.status) {
            let obj = shared.refresh(stale, &res.headers, &f, now_sys);
            let status = HeaderValue::from_static("gateway; fwd=stale; fwd-status=304");
            let answer = serve::answer(&obj, Instant::now(), f.head, &cond, status);
            return with_outcome(answer, "revalidated");
        }
        LogNotes::on(&mut res.extensions).cache = Some("miss");
        let fwd = f.fwd;
        let with_status = |extra: &str| {
            if fwd == "stale" {
                format!(
                    "gateway; fwd=stale; fwd-status={}{extra}",
                    res.status.as_u16()
                )
            } else {
                format!("gateway; fwd={fwd}{extra}")
            }
        };
        if f.head || f.request.contains_key(RANGE) && res.status == StatusCode::PARTIAL_CONTENT {
            set_status(&mut res.headers, &with_status(""));
            self.leader = None;
            return Flow::Continue;
        }
        let decided = fresh::decide(
            &f.request,
            &f.request_cc,
            res.status,
            &res.headers,
            &shared.defaults,
            now_sys,
        )
        .and_then(|fr| {
            let declared = res
                .headers
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > shared.max_object_size as u64) {
                return Err(NotStored::TooLarge);
            }
            Ok((fr, declared))
        });
        match decided {
            Ok((freshness, expected)) => {
                let status = with_status("; stored");
                res.headers
                    .insert(AGE, HeaderValue::from(freshness.initial_age.as_secs()));
                let memory_bound = shared.store.memory_bound();
                let headers = stored_head(&res.headers);
                if let Some(leader) = &self.leader {
                    let (flight, writer) = Flight::start(
                        res.status,
                        headers.clone(),
                        &freshness,
                        expected,
                        variant(&freshness.vary, &f.request),
                    );
                    leader.publish(flight.clone());
                    self.flight = Some(writer);
                    // Requests coalesced on this one stream its body: it is read to its end
                    // while they do, even when this request's client goes away.
                    res.extensions
                        .insert(ReadToEnd::as_long_as(move || flight.has_readers()));
                }
                self.fill = Some(Fill {
                    status: res.status,
                    headers,
                    fetching: f,
                    freshness,
                    body: BytesMut::with_capacity(
                        expected
                            .map_or(0, |n| n as usize)
                            .min(shared.max_object_size)
                            .min(memory_bound),
                    ),
                    received: 0,
                    memory_bound: memory_bound as u64,
                    disk: None,
                    expected,
                });
                set_status(&mut res.headers, &status);
            }
            Err(r) => {
                shared.not_stored(r);
                let status = with_status(&format!("; detail={}", r.label()));
                set_status(&mut res.headers, &status);
                self.leader = None;
            }
        }
        Flow::Continue
    }

    pub(super) fn body(&mut self, chunk: Option<&Bytes>, eos: bool) {
        self.relay(chunk, eos);
        if self.fill.is_none() {
            return;
        }
        if let Some(c) = chunk
            && let Err(reason) = self.piece(c)
        {
            // Dropping a disk fill abandons it.
            self.fill = None;
            self.leader = None;
            if let Some(r) = reason {
                self.shared.not_stored(r);
            }
            return;
        }
        if !eos {
            return;
        }
        let Some(fill) = self.fill.take() else { return };
        // Coalesced requests wait until the object can be found.
        let done = self.leader.take().map(|l| Box::new(l) as Guard);
        if fill.expected.is_some_and(|n| n != fill.received) {
            self.shared.not_stored(NotStored::Truncated);
        } else if let Some(disk) = fill.disk {
            self.shared.store.end_fill(disk, done);
        } else {
            let f = fill.fetching;
            let obj = object(
                fill.status,
                fill.headers,
                Payload::Memory(fill.body.freeze()),
                &f.path,
                &fill.freshness,
            );
            if !self
                .shared
                .store
                .put_guarded(&f.primary, &f.request, obj, done)
            {
                self.shared.not_stored(NotStored::TooLarge);
            }
        }
    }

    /// Hands a piece of the body to the requests coalesced on this fetch, whether or not it
    /// is stored: they are cut off only when the upstream fails or the answer grows past what
    /// a stored object may be (they would hold that much while they send it).
    fn relay(&mut self, chunk: Option<&Bytes>, eos: bool) {
        let Some(writer) = &mut self.flight else {
            return;
        };
        if let Some(c) = chunk {
            if writer.received() + c.len() as u64 > self.shared.max_object_size as u64 {
                self.flight = None;
                return;
            }
            writer.push(c.clone());
        }
        if eos && let Some(writer) = self.flight.take() {
            writer.complete();
        }
    }

    /// Takes a piece of the body being stored: into memory, or, once the object is too large
    /// for the memory tier, to the disk tier as it comes (what arrived before included). The
    /// reason to count when the object is not to be stored after all (none when the disk
    /// tier's writer is behind: counted there).
    fn piece(&mut self, c: &Bytes) -> Result<(), Option<NotStored>> {
        let shared = &self.shared;
        let fill = self.fill.as_mut().expect("filling");
        fill.received += c.len() as u64;
        if fill.received > shared.max_object_size as u64 {
            return Err(Some(NotStored::TooLarge));
        }
        if fill.disk.is_none() && fill.received > fill.memory_bound {
            let f = &fill.fetching;
            let head = object(
                fill.status,
                fill.headers.clone(),
                Payload::Memory(Bytes::new()),
                &f.path,
                &fill.freshness,
            );
            let Some(mut disk) = shared.store.begin_fill(&f.primary, &f.request, head) else {
                return Err((!shared.store.has_disk()).then_some(NotStored::TooLarge));
            };
            // Requests arriving from now on wait for the stored file.
            if let Some(writer) = &self.flight {
                writer.close_to_joiners();
            }
            let so_far = std::mem::take(&mut fill.body).freeze();
            if !so_far.is_empty() && !disk.push(so_far) {
                return Err(None);
            }
            fill.disk = Some(disk);
        }
        match &mut fill.disk {
            Some(d) => d.push(c.clone()).then_some(()).ok_or(None),
            None => {
                fill.body.extend_from_slice(c);
                Ok(())
            }
        }
    }
}
