//! The connection to Redis the request path uses: one multiplexed connection (concurrent
//! requests are pipelined on it, so a decision costs one round trip and no connection of its
//! own), kept up by a background task.
//!
//! The request path never waits for a dead Redis: while the link is down a call returns `None`
//! at once (the caller falls back), and a call that fails or takes longer than `timeout` marks
//! the link down. The background task reconnects (every [`RECONNECT_EVERY`]) and, while up,
//! pings every [`PING_EVERY`] so a silent loss is found without a request paying for it.
//!
//! A connection Redis closed (a restart between two pings, its idle `timeout`, `CLIENT KILL`)
//! is not a dead Redis: a call that finds its connection closed opens one fresh connection
//! (shared by every call that found the same one closed) and runs once more on it, within one
//! more `timeout`; only when that fails too is the link marked down. Each new connection bumps
//! [`Link::epoch`], so blocking connections opened before it (`shared_data`) are not reused.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use tokio::sync::{Mutex, Notify};
use tokio_util::sync::CancellationToken;

use crate::telemetry::{Counter, Gauge};

/// Pause between connection attempts while Redis is unreachable.
pub(crate) const RECONNECT_EVERY: Duration = Duration::from_millis(250);
/// Interval of the liveness ping while connected.
pub(crate) const PING_EVERY: Duration = Duration::from_millis(500);

/// The shared connection and its state.
pub(crate) struct Link {
    pub(crate) client: redis::Client,
    conn: ArcSwapOption<MultiplexedConnection>,
    /// How many connections have been stored: a connection of any kind opened under an older
    /// value may be to a server that has restarted since.
    epoch: AtomicU64,
    /// Held while a call replaces a closed connection, so the calls that found it closed
    /// together open one new connection, not one each.
    renewing: Mutex<()>,
    wake: Notify,
    pub(crate) timeout: Duration,
    errors: Counter,
    retries: Counter,
    up: Gauge,
}

/// Whether `e` says the connection is closed (reset, broken pipe, end of file), as opposed to
/// an error reply or a timeout: only then does a fresh connection stand a chance.
pub(crate) fn closed(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}

impl Link {
    pub(crate) fn new(
        client: redis::Client,
        timeout: Duration,
        errors: Counter,
        retries: Counter,
        up: Gauge,
    ) -> Self {
        Self {
            client,
            conn: ArcSwapOption::empty(),
            epoch: AtomicU64::new(0),
            renewing: Mutex::new(()),
            wake: Notify::new(),
            timeout,
            errors,
            retries,
            up,
        }
    }

    /// Whether the last call or ping succeeded.
    pub(crate) fn is_up(&self) -> bool {
        self.conn.load().is_some()
    }

    /// The current [`Link::epoch`]: read it before opening a connection of another kind, and
    /// drop that connection once the epoch has moved on.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Runs one command (or script, or pipeline) on the shared connection, bounded by the
    /// timeout. `None`: Redis is down or the call failed (counted; the caller falls back).
    /// `f` runs a second time, on a fresh connection, when the first one was found closed.
    pub(crate) async fn call<T, F, Fut>(&self, f: F) -> Option<T>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.conn.load_full()?;
        match tokio::time::timeout(self.timeout, f((*conn).clone())).await {
            Ok(Ok(v)) => return Some(v),
            Ok(Err(e)) if closed(&e) => {}
            other => return self.outcome(other),
        }
        // The connection was closed under us (a restart, most likely): one more try on a fresh
        // connection, opening it included, within one more timeout.
        let retry = tokio::time::timeout(self.timeout, async {
            let fresh = self.renew(&conn).await?;
            self.retried();
            f((*fresh).clone()).await
        })
        .await;
        self.outcome(retry)
    }

    /// `Some` for a value; otherwise counts the failure and marks the link down.
    fn outcome<T>(
        &self,
        r: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
    ) -> Option<T> {
        match r {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.failed(&e);
                None
            }
            Err(_) => {
                self.failed(&"no answer within cluster.timeout");
                None
            }
        }
    }

    /// A connection to use instead of `stale`, which was found closed: the one another call
    /// already opened in its place, or a new one. An error when none can be had (or the link
    /// was marked down meanwhile).
    async fn renew(
        &self,
        stale: &Arc<MultiplexedConnection>,
    ) -> redis::RedisResult<Arc<MultiplexedConnection>> {
        let _one = self.renewing.lock().await;
        match self.conn.load_full() {
            Some(current) if !Arc::ptr_eq(&current, stale) => return Ok(current),
            Some(_) => {}
            None => {
                return Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the redis link went down meanwhile",
                )));
            }
        }
        let fresh = self.store(self.connect().await?);
        tracing::info!("redis closed the connection (a restart?); reconnected");
        Ok(fresh)
    }

    /// Makes `conn` the shared connection and the link up.
    fn store(&self, conn: MultiplexedConnection) -> Arc<MultiplexedConnection> {
        let conn = Arc::new(conn);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.conn.store(Some(conn.clone()));
        self.up.set(1);
        conn
    }

    /// Counts a call that is about to run again on a fresh connection.
    pub(crate) fn retried(&self) {
        self.retries.inc();
    }

    /// Counts a failed call and marks the link down; the maintainer reconnects.
    pub(crate) fn failed(&self, why: &dyn std::fmt::Display) {
        self.errors.inc();
        if self.conn.swap(None).is_some() {
            self.up.set(0);
            tracing::warn!(error = %why, "redis unreachable; shared state falls back to local until it is back");
        }
        self.wake.notify_one();
    }

    async fn connect(&self) -> redis::RedisResult<MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout.max(Duration::from_secs(1))))
            .set_response_timeout(Some(self.timeout));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// Keeps the link up until `stop`.
    pub(crate) async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        let mut logged_down = false;
        loop {
            let wait = if self.is_up() {
                let ping = self
                    .call(|mut c| async move { redis::cmd("PING").query_async::<()>(&mut c).await })
                    .await;
                if ping.is_some() {
                    PING_EVERY
                } else {
                    Duration::ZERO
                }
            } else {
                match self.connect().await {
                    Ok(conn) => {
                        self.store(conn);
                        logged_down = false;
                        tracing::info!("redis connected; shared state is global");
                        PING_EVERY
                    }
                    Err(e) => {
                        if !logged_down {
                            tracing::warn!(error = %e, "cannot reach redis; retrying in the background");
                            logged_down = true;
                        }
                        RECONNECT_EVERY
                    }
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified(), if self.is_up() => {}
            }
        }
    }
}
