//! The `cache` filter's request side: the lookup (a fresh hit answered here, a stale one
//! served under `stale-while-revalidate` or revalidated), the read of an object from the disk
//! tier and the wait for another request's fetch of the same object, streaming its answer as it
//! arrives (both in the async phase: the memory tier answers without one), and the request set
//! up to fetch.

use std::sync::Arc;

use http::header::{CACHE_CONTROL, IF_RANGE, RANGE};
use http::{Method, request};
use tokio::sync::watch;
use tokio::time::Instant;

use super::control::CacheControl;
use super::flight::Flight;
use super::serve::{self, Conditions};
use super::store::{Fetch, Object, Tier};
use super::{CacheFilter, Lookup, Pending, Step, hit_status, revalidate, validator, with_outcome};
use crate::context::RequestCx;
use crate::filter::Flow;

impl CacheFilter {
    /// The request-header phase as far as it goes without waiting: `None` when the request
    /// must read its object from disk or wait for another one's fetch ([`CacheFilter::waiting`]
    /// is then set, and asking again answers `None` at once).
    pub(super) fn request_now(&mut self, req: &mut request::Parts, cx: &RequestCx) -> Option<Flow> {
        if self.waiting.is_some() {
            return None;
        }
        let head = match req.method {
            Method::GET => false,
            Method::HEAD => true,
            Method::OPTIONS | Method::TRACE => return Some(Flow::Continue),
            _ => {
                let method = std::mem::replace(&mut req.method, Method::GET);
                self.step = Step::Invalidate(self.shared.primary(req, cx));
                req.method = method;
                return Some(Flow::Continue);
            }
        };
        let shared = self.shared.clone();
        let request_cc = CacheControl::parse(req.headers.get_all(CACHE_CONTROL));
        if request_cc.no_store {
            self.step = Step::Pass("request");
            return Some(Flow::Continue);
        }
        let bypass = request_cc.no_cache || request_cc.max_age == Some(0);
        let lookup = Lookup {
            primary: shared.primary(req, cx),
            request_cc,
            head,
            bypass,
            coalesced: false,
            tier: Tier::Memory,
        };
        let cached = (!bypass)
            .then(|| shared.store.get(&lookup.primary, &req.headers))
            .flatten();
        if cached.is_none() && !bypass && shared.store.on_disk(&lookup.primary, &req.headers) {
            self.waiting = Some(Box::new(Pending::Disk(lookup)));
            return None;
        }
        if cached.is_none() && !bypass && !head && !Conditions::conditional(&req.headers) {
            match shared.store.fetch(&lookup.primary) {
                Fetch::Lead(l) => self.leader = Some(l),
                Fetch::Wait(done) => {
                    self.waiting = Some(Box::new(Pending::Fetch(done, lookup)));
                    return None;
                }
            }
        }
        Some(self.decide(req, cx, lookup, cached))
    }

    /// The request-header phase, reading the object from disk or waiting for another
    /// request's fetch when it must.
    pub(super) async fn request(&mut self, req: &mut request::Parts, cx: &RequestCx) -> Flow {
        if let Some(flow) = self.request_now(req, cx) {
            return flow;
        }
        let Some(pending) = self.waiting.take() else {
            return Flow::Continue;
        };
        let shared = self.shared.clone();
        let (mut done, mut lookup) = match *pending {
            Pending::Fetch(done, lookup) => (done, lookup),
            Pending::Disk(mut lookup) => {
                let found = shared.store.find(&lookup.primary, &req.headers).await;
                if let Some((obj, tier)) = found {
                    lookup.tier = tier;
                    return self.decide(req, cx, lookup, Some(obj));
                }
                // Gone meanwhile (evicted, purged, unreadable): a miss.
                if lookup.head || Conditions::conditional(&req.headers) {
                    return self.decide(req, cx, lookup, None);
                }
                match shared.store.fetch(&lookup.primary) {
                    Fetch::Lead(l) => {
                        self.leader = Some(l);
                        return self.decide(req, cx, lookup, None);
                    }
                    Fetch::Wait(done) => (done, lookup),
                }
            }
        };
        shared.metrics.coalesced.inc();
        if let Some(answer) = self.wait_for_fetch(&mut done, req, &lookup).await {
            return answer;
        }
        let found = shared.store.find(&lookup.primary, &req.headers).await;
        let cached = found.map(|(obj, tier)| {
            lookup.tier = tier;
            obj
        });
        if let (None, Fetch::Lead(l)) = (&cached, shared.store.fetch(&lookup.primary)) {
            self.leader = Some(l);
        }
        lookup.coalesced = true;
        self.decide(req, cx, lookup, cached)
    }

    /// Waits for another request's fetch of this one's object (at most `coalesce_timeout`):
    /// the answer streaming from it once that request found it storable, when this request
    /// may have it (a plain GET of the same variant, early enough to read the body from its
    /// start); `None` when the fetch ended (stored or not) or the wait ran out without one.
    async fn wait_for_fetch(
        &mut self,
        done: &mut watch::Receiver<Option<Arc<Flight>>>,
        req: &request::Parts,
        lookup: &Lookup,
    ) -> Option<Flow> {
        let streams = !lookup.bypass && !req.headers.contains_key(RANGE);
        let until = Instant::now() + self.shared.coalesce_timeout;
        loop {
            // Without an answer for this request (another variant, or too late to join),
            // what the fetch stores is looked up once it has ended.
            let flight = done.borrow_and_update().clone();
            if let Some(flight) = flight.filter(|_| streams)
                && let Some(res) = flight.answer(&req.headers)
            {
                // Served from the answer in memory as it arrives.
                self.shared.metrics.hit(Tier::Memory);
                return Some(with_outcome(res, "hit"));
            }
            match tokio::time::timeout_at(until, done.changed()).await {
                Ok(Ok(())) => {}
                // The fetch ended, or the wait ran out.
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }

    /// Serves `cached` when it may be, or sets the request up to fetch (and revalidate).
    fn decide(
        &mut self,
        req: &mut request::Parts,
        cx: &RequestCx,
        lookup: Lookup,
        cached: Option<Arc<Object>>,
    ) -> Flow {
        let shared = self.shared.clone();
        let now = Instant::now();
        let head = lookup.head;
        if let Some(obj) = &cached {
            let cond = Conditions::of(&req.headers);
            if obj.fresh(now) {
                shared.metrics.hit(lookup.tier);
                let detail = lookup.coalesced.then_some("coalesced");
                let status = hit_status(obj.lifetime, obj.age(now), detail);
                return with_outcome(serve::answer(obj, now, head, &cond, status), "hit");
            }
            if !obj.always_revalidate && obj.staleness(now) < obj.stale_while_revalidate {
                shared.metrics.stale_while_revalidate.inc();
                if let Fetch::Lead(leader) = shared.store.fetch(&lookup.primary) {
                    let fetching = lookup.fetching(req, "stale");
                    revalidate::spawn(&shared, leader, obj, &fetching, req, cx);
                }
                let status = hit_status(obj.lifetime, obj.age(now), Some("stale-while-revalidate"));
                return with_outcome(serve::answer(obj, now, head, &cond, status), "stale");
            }
        }
        let fwd = if lookup.bypass { "request" } else { "miss" };
        let mut fetching = lookup.fetching(req, fwd);
        if let Some(obj) = cached {
            if obj.staleness(now) < obj.stale_if_error {
                fetching.fallback = Some(obj.clone());
            }
            if let Some(validator) = validator(&obj) {
                shared.metrics.revalidations.inc();
                // The client's own conditions are answered from the refreshed object.
                let _ = Conditions::take(&mut req.headers);
                req.headers.insert(validator.0, validator.1);
                fetching.fwd = "stale";
                fetching.stale = Some(obj);
                self.step = Step::Fetch(fetching);
                return Flow::Continue;
            }
        }
        shared.metrics.misses.inc();
        if !head {
            // The whole object is fetched and stored; a later range is answered from it.
            req.headers.remove(RANGE);
            req.headers.remove(IF_RANGE);
        }
        self.step = Step::Fetch(fetching);
        Flow::Continue
    }
}
