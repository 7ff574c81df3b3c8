//! Concurrent cache misses for one file share one lookup. The first request to miss looks the
//! file up on the blocking pool; the others wait for it and then read the cache. Without this a
//! cold start under load sent every waiting request to the blocking pool at once: 1,000
//! connections asking for one 1 KiB file started 180 to 220 blocking threads, which held about
//! 5 MB more until they exited 10 s later (docs/benchmarks.md, "Then: one lookup per cold
//! file").

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

/// The lookups in progress, by cache key.
#[derive(Default)]
pub(super) struct Misses {
    inflight: Mutex<HashMap<Box<str>, watch::Receiver<()>>>,
}

/// A request's part in a miss.
pub(super) enum Miss<'a> {
    /// This request looks the file up; the others wait until the guard is dropped.
    Lead(Lead<'a>),
    /// Another request is looking the file up: wait with `changed()`, which returns (with an
    /// error, as nothing is ever sent) once that lookup has ended, cancelled or not.
    Follow(watch::Receiver<()>),
}

/// Held by the request that looks the file up, until its result is in the cache.
pub(super) struct Lead<'a> {
    misses: &'a Misses,
    key: Box<str>,
    _done: watch::Sender<()>,
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
        let (tx, rx) = watch::channel(());
        inflight.insert(key.into(), rx);
        Miss::Lead(Lead {
            misses: self,
            key: key.into(),
            _done: tx,
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
        let Miss::Follow(mut follower) = misses.join("/a") else {
            panic!("a second miss must follow");
        };
        assert!(
            matches!(misses.join("/b"), Miss::Lead(_)),
            "other keys lead"
        );
        let waiting = tokio::spawn(async move { follower.changed().await.is_err() });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the follower did not wait");
        drop(lead);
        assert!(
            waiting.await.expect("task"),
            "the follower was not released"
        );
        assert!(
            matches!(misses.join("/a"), Miss::Lead(_)),
            "a later miss leads"
        );
    }
}
