//! Where a `jwt` filter's keys come from: one [`KeySource`] per key-set location and refresh
//! period in the process, shared by every route (and every config generation) naming it, so a
//! reload keeps the keys it has. A background task fetches the set (a file, or a URL through
//! the gateway's own HTTPS client), on its period and at once when a token names an unknown
//! `kid` (rate-limited). A failed fetch keeps the last good set; the task ends when the last
//! filter using the source is gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use gateway_config::JwksSource;
use http::{Request, header};
use http_body_util::Empty;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::keys::KeySet;
use crate::certs::fetch::HttpClient;
use crate::error::GatewayError;
use crate::telemetry::{Counter, Registry};

/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The shortest time between two fetches asked for by unknown `kid`s.
const FORCED_REFETCH_INTERVAL: Duration = Duration::from_secs(10);

/// Largest key-set file read.
const MAX_FILE: u64 = 1024 * 1024;

/// Sources alive in the process, by location and period.
type Registered = HashMap<(JwksSource, Duration), Weak<KeySource>>;
static SOURCES: LazyLock<Mutex<Registered>> = LazyLock::new(Default::default);

/// One key set, kept fresh.
pub(super) struct KeySource {
    location: JwksSource,
    keys: ArcSwapOption<KeySet>,
    /// Counts finished fetches, for requests waiting on one.
    fetched: watch::Sender<u64>,
    /// Whether a fetch is under way (or about to start).
    fetching: AtomicBool,
    wake: Arc<Notify>,
    last_forced: Mutex<Option<Instant>>,
    fetch_ok: Counter,
    fetch_failed: Counter,
}

impl KeySource {
    /// The process's source for `location`, started (its first fetch under way) if new.
    pub(super) fn get_or_start(
        location: &JwksSource,
        refresh: Duration,
        registry: &Registry,
    ) -> Result<Arc<Self>, String> {
        let mut sources = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
        sources.retain(|_, s| s.strong_count() > 0);
        let key = (location.clone(), refresh);
        if let Some(s) = sources.get(&key).and_then(Weak::upgrade) {
            return Ok(s);
        }
        let client = HttpClient::new(None, FETCH_TIMEOUT)?;
        let source = Arc::new(Self::new(location, registry));
        tokio::spawn(run(
            Arc::downgrade(&source),
            source.wake.clone(),
            refresh,
            client,
        ));
        sources.insert(key, Arc::downgrade(&source));
        Ok(source)
    }

    /// A source that never fetches (checking a config, tests).
    pub(super) fn new(location: &JwksSource, registry: &Registry) -> Self {
        let label = location.to_string();
        let counter = |result| {
            registry.counter(
                "gateway_jwks_fetches_total",
                "JSON Web Key Set fetches by the jwt filter, by source and result (ok, failed).",
                &[("source", &label), ("result", result)],
            )
        };
        Self {
            location: location.clone(),
            keys: ArcSwapOption::empty(),
            fetched: watch::Sender::new(0),
            fetching: AtomicBool::new(true),
            wake: Arc::new(Notify::new()),
            last_forced: Mutex::new(None),
            fetch_ok: counter("ok"),
            fetch_failed: counter("failed"),
        }
    }

    /// The current key set, if one has been loaded.
    pub(super) fn keys(&self) -> Option<Arc<KeySet>> {
        self.keys.load_full()
    }

    /// Installs a set (tests, and the task after a good fetch).
    pub(super) fn set_keys(&self, keys: KeySet) {
        self.keys.store(Some(Arc::new(keys)));
    }

    /// Waits (at most `wait`) for a fetch newer than now: the one under way, else one asked
    /// for now unless another was asked for within the last few seconds. False when no fetch
    /// is coming.
    pub(super) async fn refetched(&self, wait: Duration) -> bool {
        let mut seen = self.fetched.subscribe();
        if !self.fetching.load(Ordering::Acquire) {
            let mut last = self.last_forced.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if last.is_some_and(|t| now.duration_since(t) < FORCED_REFETCH_INTERVAL) {
                return false;
            }
            *last = Some(now);
            self.wake.notify_one();
        }
        matches!(tokio::time::timeout(wait, seen.changed()).await, Ok(Ok(())))
    }

    async fn fetch(&self, client: &HttpClient) -> Result<KeySet, String> {
        let body = match &self.location {
            JwksSource::File(path) => {
                let meta = tokio::fs::metadata(path).await.map_err(|e| e.to_string())?;
                if meta.len() > MAX_FILE {
                    return Err(format!("larger than {MAX_FILE} bytes"));
                }
                Bytes::from(tokio::fs::read(path).await.map_err(|e| e.to_string())?)
            }
            JwksSource::Url(url) => {
                let req = Request::get(url.as_str())
                    .header(header::ACCEPT, "application/json")
                    .body(Empty::<Bytes>::new())
                    .map_err(|e| e.to_string())?;
                let res = client.send(req).await.map_err(|e| match e {
                    GatewayError::Certificate(m) => m,
                    other => other.to_string(),
                })?;
                if !res.status().is_success() {
                    return Err(format!("answered {}", res.status()));
                }
                res.into_body()
            }
        };
        KeySet::parse(&body)
    }

    fn publish(&self, result: Result<KeySet, String>) {
        match result {
            Ok(keys) => {
                self.fetch_ok.inc();
                tracing::debug!(source = %self.location, keys = keys.len(), "JWKS fetched");
                self.set_keys(keys);
            }
            Err(e) => {
                self.fetch_failed.inc();
                let kept = if self.keys.load().is_some() {
                    "keeping the last good key set"
                } else {
                    "no key set yet: tokens are refused"
                };
                tracing::warn!(source = %self.location, error = %e, "JWKS fetch failed; {kept}");
            }
        }
        self.fetching.store(false, Ordering::Release);
        self.fetched.send_modify(|n| *n += 1);
    }
}

impl Drop for KeySource {
    fn drop(&mut self) {
        // Wakes the task so it sees the source gone and ends.
        self.wake.notify_one();
    }
}

/// The fetch loop: a fetch, then a wait for the period or a wake-up; ends with the source.
async fn run(source: Weak<KeySource>, wake: Arc<Notify>, refresh: Duration, client: HttpClient) {
    loop {
        let Some(s) = source.upgrade() else { return };
        s.fetching.store(true, Ordering::Release);
        let result = s.fetch(&client).await;
        s.publish(result);
        drop(s);
        tokio::select! {
            () = tokio::time::sleep(refresh) => {}
            () = wake.notified() => {}
        }
    }
}
