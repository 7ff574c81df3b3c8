//! The connection to Redis the request path uses: one multiplexed connection (concurrent
//! requests are pipelined on it, so a decision costs one round trip and no connection of its
//! own), kept up by a background task.
//!
//! The request path never waits for a dead Redis: while the link is down a call returns `None`
//! at once (the caller falls back), and a call that fails or takes longer than `timeout` marks
//! the link down. The background task reconnects (every [`RECONNECT_EVERY`]) and, while up,
//! pings every [`PING_EVERY`] so a silent loss is found without a request paying for it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;
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
    wake: Notify,
    pub(crate) timeout: Duration,
    errors: Counter,
    up: Gauge,
}

impl Link {
    pub(crate) fn new(
        client: redis::Client,
        timeout: Duration,
        errors: Counter,
        up: Gauge,
    ) -> Self {
        Self {
            client,
            conn: ArcSwapOption::empty(),
            wake: Notify::new(),
            timeout,
            errors,
            up,
        }
    }

    /// Whether the last call or ping succeeded.
    pub(crate) fn is_up(&self) -> bool {
        self.conn.load().is_some()
    }

    /// Runs one command (or script, or pipeline) on the shared connection, bounded by the
    /// timeout. `None`: Redis is down or the call failed (counted; the caller falls back).
    pub(crate) async fn call<T, F, Fut>(&self, f: F) -> Option<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.conn.load_full()?;
        match tokio::time::timeout(self.timeout, f((*conn).clone())).await {
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
                        self.conn.store(Some(Arc::new(conn)));
                        self.up.set(1);
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
