//! Shared passive health (`cluster.share_health`): an ejection seen here is published on
//! `{prefix}:health`, and ejections other instances publish are applied to the same upstream's
//! targets here, for the same window. Pub/sub delivers in well under a second; a message lost
//! while Redis is down only means that instance finds the dead target itself.
//!
//! Message: `INSTANCE \t UPSTREAM \t TARGET \t MILLISECONDS` (tabs cannot occur in upstream
//! names or `host:port` authorities).

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use stream_proxy::upstream::Targets;
use tokio::sync::mpsc;

use crate::telemetry::Counter;

/// Ejections waiting to be published; more are dropped (and counted) rather than queued
/// without bound.
pub(crate) const BACKLOG: usize = 1024;

/// One ejection to publish.
pub(crate) struct Ejection {
    pub(crate) upstream: Arc<str>,
    pub(crate) target: String,
    pub(crate) window: Duration,
}

/// The target sets of every live generation, and the publisher's queue.
pub(crate) struct HealthShare {
    sets: Mutex<Vec<Weak<Targets>>>,
    tx: mpsc::Sender<Ejection>,
    pub(crate) sent: Counter,
    pub(crate) received: Counter,
    pub(crate) dropped: Counter,
}

impl HealthShare {
    pub(crate) fn new(
        tx: mpsc::Sender<Ejection>,
        sent: Counter,
        received: Counter,
        dropped: Counter,
    ) -> Self {
        Self {
            sets: Mutex::new(Vec::new()),
            tx,
            sent,
            received,
            dropped,
        }
    }

    /// Publishes `set`'s ejections and applies peers' ones to it, for as long as it lives.
    pub(crate) fn watch(self: &Arc<Self>, set: &Arc<Targets>) {
        let upstream: Arc<str> = Arc::from(set.name());
        let me = Arc::downgrade(self);
        set.set_ejection_listener(Arc::new(move |target, window| {
            let Some(me) = me.upgrade() else { return };
            let e = Ejection {
                upstream: upstream.clone(),
                target: target.to_owned(),
                window,
            };
            if me.tx.try_send(e).is_err() {
                me.dropped.inc();
            }
        }));
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        sets.retain(|s| s.strong_count() > 0);
        sets.push(Arc::downgrade(set));
    }

    /// Applies a message from the health channel unless it is our own.
    pub(crate) fn apply(&self, instance: &str, payload: &str) {
        let mut parts = payload.splitn(4, '\t');
        let (Some(from), Some(upstream), Some(target), Some(ms)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            tracing::debug!(payload, "malformed health message ignored");
            return;
        };
        let Ok(ms) = ms.parse::<u64>() else { return };
        if from == instance {
            return;
        }
        self.received.inc();
        let sets: Vec<Arc<Targets>> = self
            .sets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for set in sets.iter().filter(|s| s.name() == upstream) {
            set.eject_from_peer(target, Duration::from_millis(ms));
        }
    }
}

/// The message for `e` from `instance`.
pub(crate) fn message(instance: &str, e: &Ejection) -> String {
    format!(
        "{instance}\t{}\t{}\t{}",
        e.upstream,
        e.target,
        e.window.as_millis()
    )
}
