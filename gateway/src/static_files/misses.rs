//! Concurrent cache misses for one file share one lookup. The first request to miss looks the
//! file up on the blocking pool; the others wait for it and then read the cache, or, when the
//! lookup ended in an error status (a missing file: 404s are not cached), answer with that
//! status. A request that missed the cache while the lookup ran but joins after it ended reads
//! the entry it left; requests for a file the lookup did not cache look again. Without this a
//! cold start under load sends every waiting request to the blocking pool at once, which
//! starts a thread for each, and their stacks and allocator caches stay resident until the
//! threads exit (docs/performance-log.md, "Then: one lookup per cold file").

use std::collections::HashMap;
use std::sync::Mutex;

use http::StatusCode;
use tokio::sync::watch;

/// The lookups in progress, by cache key.
#[derive(Default)]
pub(super) struct Misses {
    inflight: Mutex<HashMap<Box<str>, watch::Receiver<Option<StatusCode>>>>,
}

/// A request's part in a miss.
pub(super) enum Miss<'a> {
    /// This request looks the file up; the others wait until the guard is dropped.
    Lead(Lead<'a>),
    /// Another request is looking the file up: [`follow`] waits until it has ended.
    Follow(watch::Receiver<Option<StatusCode>>),
}

/// Held by the request that looks the file up, until its result is in the cache.
pub(super) struct Lead<'a> {
    misses: &'a Misses,
    key: Box<str>,
    done: watch::Sender<Option<StatusCode>>,
}

impl Lead<'_> {
    /// The lookup ended in an error status, which the waiting requests answer with too.
    pub(super) fn failed(&self, status: StatusCode) {
        self.done.send_replace(Some(status));
    }
}

/// Waits for the lookup a request follows to end: the error status it ended with, or `None`
/// when it cached the file, found one the cache does not take, or was cancelled.
pub(super) async fn follow(mut done: watch::Receiver<Option<StatusCode>>) -> Option<StatusCode> {
    // `Err` once the lead is dropped without a status; a status sent before the drop is still
    // seen, since this receiver has not seen it yet.
    match done.changed().await {
        Ok(()) => *done.borrow(),
        Err(_) => None,
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        // Removed before the sender is dropped (fields drop after this body), so a request
        // that finds no entry after this starts a lookup of its own, and one that found the
        // entry is woken.
        lock(&self.misses.inflight).remove(&self.key);
    }
}

impl Misses {
    /// Leads the lookup of `key`, or follows the one in progress.
    pub(super) fn join(&self, key: &str) -> Miss<'_> {
        let mut inflight = lock(&self.inflight);
        if let Some(done) = inflight.get(key) {
            return Miss::Follow(done.clone());
        }
        let (tx, rx) = watch::channel(None);
        inflight.insert(key.into(), rx);
        Miss::Lead(Lead {
            misses: self,
            key: key.into(),
            done: tx,
        })
    }
}

/// A poisoned lock only means a panic elsewhere mid-update; the map stays valid.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn followers_wait_for_the_lead_and_the_next_miss_leads_again() {
        let misses = Misses::default();
        let Miss::Lead(lead) = misses.join("/a") else {
            panic!("the first miss must lead");
        };
        let Miss::Follow(follower) = misses.join("/a") else {
            panic!("a second miss must follow");
        };
        assert!(
            matches!(misses.join("/b"), Miss::Lead(_)),
            "other keys lead"
        );
        let waiting = tokio::spawn(follow(follower));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the follower did not wait");
        drop(lead);
        assert_eq!(
            waiting.await.expect("task"),
            None,
            "released without a status"
        );

        // A lookup that fails hands its status to the requests that waited for it.
        let Miss::Lead(lead) = misses.join("/a") else {
            panic!("a later miss must lead");
        };
        let Miss::Follow(follower) = misses.join("/a") else {
            panic!("a second miss must follow");
        };
        lead.failed(StatusCode::NOT_FOUND);
        drop(lead);
        assert_eq!(follow(follower).await, Some(StatusCode::NOT_FOUND));
    }
}
