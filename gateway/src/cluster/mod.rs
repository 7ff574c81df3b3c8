//! State shared by several gateway instances through one Redis server (`cluster:`): global
//! rate limits ([`GlobalLimiter`]), plugins' global shared data and queues, and passive health
//! ejections. Without `cluster:` nothing here runs and everything stays in the process.
//!
//! One [`Cluster`] per gateway and cluster settings, kept across reloads while the settings are
//! unchanged (a generation holds an `Arc`; the gateway's other generations find it in a store
//! keyed by the gateway's registry, as rate-limit buckets are). It owns:
//!
//! * the request-path link (`link`): one multiplexed connection, a bounded wait per call, and
//!   a background task that reconnects and pings, so a dead Redis costs a request nothing; a
//!   connection Redis closed (a restart) is replaced and the call run again, so it costs no
//!   fallback either;
//! * a subscriber on `{prefix}:health` and `{prefix}:queue`, reconnecting on its own;
//! * a publisher of this instance's ejections.
//!
//! The background tasks stop when the last generation using the cluster is dropped.

mod health;
mod link;
pub mod rate_limit;
mod shared_data;

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use gateway_config::model::ClusterConfig;
use stream_proxy::upstream::Targets;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use rate_limit::GlobalLimiter;

use crate::telemetry::{Counter, Registry};
use health::{Ejection, HealthShare};
use link::{Link, RECONNECT_EVERY};

/// Who is told that a global queue got a message: the Wasm host registers itself when it is
/// created, so the cluster, below it, does not name it. Until then nobody listens, as no plugin
/// was ever loaded.
static QUEUE_LISTENER: OnceLock<fn(&str, &str)> = OnceLock::new();

/// Registers the process's listener for global queue messages (`vm_id`, queue name); only the
/// first registration counts.
pub fn on_global_queue(listener: fn(&str, &str)) {
    let _ = QUEUE_LISTENER.set(listener);
}

/// One gateway's connection to the cluster.
pub struct Cluster {
    settings: ClusterConfig,
    link: Arc<Link>,
    /// This process's id in health messages (so its own are not applied twice).
    instance: String,
    health: Arc<HealthShare>,
    shared_data: Arc<shared_data::RedisSharedData>,
    stop: CancellationToken,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Cluster {
    /// The live cluster of the gateway owning `registry` for `settings`, or a new one (its
    /// background tasks started on the current Tokio runtime).
    pub fn get_or_start(
        registry: &Arc<Registry>,
        settings: &ClusterConfig,
    ) -> Result<Arc<Self>, String> {
        store::get_or_insert(registry, settings, || Self::start(registry, settings))
    }

    /// A cluster for `settings` that is built and never started: the Redis URL is checked and
    /// everything a generation takes from a cluster (limiters, the plugins' store) exists, but
    /// nothing connects and no task runs, so no runtime is needed (`gateway validate`). Its
    /// link stays down: anything that used it would fall back to local state.
    pub fn checked(registry: &Registry, settings: &ClusterConfig) -> Result<Arc<Self>, String> {
        Self::build(registry, settings).map(|(cluster, _)| cluster)
    }

    fn start(registry: &Registry, settings: &ClusterConfig) -> Result<Arc<Self>, String> {
        let (cluster, ejections) = Self::build(registry, settings)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "the cluster needs a Tokio runtime".to_owned())?;
        runtime.spawn(cluster.link.clone().maintain(cluster.stop.clone()));
        runtime.spawn(subscribe(Arc::downgrade(&cluster), cluster.stop.clone()));
        if settings.share_health {
            runtime.spawn(publish(
                Arc::downgrade(&cluster),
                ejections,
                cluster.stop.clone(),
            ));
        }
        Ok(cluster)
    }

    /// The cluster's parts, and the receiving end of this instance's ejections (for the task
    /// that publishes them).
    fn build(
        registry: &Registry,
        settings: &ClusterConfig,
    ) -> Result<(Arc<Self>, mpsc::Receiver<Ejection>), String> {
        let client = redis::Client::open(settings.redis.as_str()).map_err(|e| e.to_string())?;
        let counter = |name: &str, help: &str, labels: &[(&str, &str)]| -> Counter {
            registry.counter(name, help, labels)
        };
        let link = Arc::new(Link::new(
            client,
            settings.timeout.get(),
            counter(
                "gateway_cluster_redis_errors_total",
                "Redis calls that failed or timed out (each one fell back to local state).",
                &[],
            ),
            counter(
                "gateway_cluster_redis_retries_total",
                "Redis calls whose connection Redis had closed (a restart, its idle timeout), run once more on a fresh connection.",
                &[],
            ),
            registry.gauge(
                "gateway_cluster_redis_up",
                "1 while the connection to the cluster's Redis is up.",
                &[],
            ),
        ));
        let (tx, rx) = mpsc::channel(health::BACKLOG);
        let events = |direction| {
            counter(
                "gateway_cluster_health_events_total",
                "Passive ejections published to and received from other instances.",
                &[("direction", direction)],
            )
        };
        let health = Arc::new(HealthShare::new(
            tx,
            events("sent"),
            events("received"),
            events("dropped"),
        ));
        let cluster = Arc::new(Self {
            instance: format!("{:016x}", rand::random::<u64>()),
            shared_data: Arc::new(shared_data::RedisSharedData::new(
                link.clone(),
                &settings.prefix,
            )),
            settings: settings.clone(),
            link: link.clone(),
            health,
            stop: CancellationToken::new(),
        });
        Ok((cluster, rx))
    }

    /// The settings it was started with.
    pub fn settings(&self) -> &ClusterConfig {
        &self.settings
    }

    /// Whether the link to Redis is up now.
    pub fn is_up(&self) -> bool {
        self.link.is_up()
    }

    /// A limiter for the rate-limit filter at `index` of route `route`.
    pub fn limiter(
        &self,
        route: &str,
        index: usize,
        requests: u64,
        per: Duration,
        burst: u64,
    ) -> GlobalLimiter {
        let prefix = format!("{}:rl:{route}:{index}:", self.settings.prefix);
        GlobalLimiter::new(self.link.clone(), prefix, requests, per, burst)
    }

    /// The store of plugins with `shared_data: { scope: global }`.
    pub fn shared_data(&self) -> wasm_host::shared::GlobalStoreRef {
        wasm_host::shared::GlobalStoreRef(self.shared_data.clone())
    }

    /// Shares `set`'s passive ejections with the other instances (with `share_health`).
    pub fn watch_health(&self, set: &Arc<Targets>) {
        if self.settings.share_health {
            self.health.watch(set);
        }
    }

    fn channel(&self, name: &str) -> String {
        format!("{}:{name}", self.settings.prefix)
    }
}

/// Publishes this instance's ejections.
async fn publish(
    cluster: Weak<Cluster>,
    mut rx: mpsc::Receiver<Ejection>,
    stop: CancellationToken,
) {
    loop {
        let e = tokio::select! {
            _ = stop.cancelled() => return,
            e = rx.recv() => match e { Some(e) => e, None => return },
        };
        let Some(c) = cluster.upgrade() else { return };
        let channel = c.channel("health");
        let message = health::message(&c.instance, &e);
        let (channel, message) = (&channel, &message);
        let sent = c
            .link
            .call(|mut conn| async move {
                redis::cmd("PUBLISH")
                    .arg(channel)
                    .arg(message)
                    .query_async::<()>(&mut conn)
                    .await
            })
            .await;
        if sent.is_some() {
            c.health.sent.inc();
        } else {
            c.health.dropped.inc();
        }
    }
}

/// Receives peers' ejections and queue notifications; reconnects while the cluster lives.
async fn subscribe(cluster: Weak<Cluster>, stop: CancellationToken) {
    loop {
        let Some(c) = cluster.upgrade() else { return };
        let (health, queue) = (c.channel("health"), c.channel("queue"));
        let client = c.link.client.clone();
        drop(c);
        let session = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&health).await?;
            pubsub.subscribe(&queue).await?;
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let Some(c) = cluster.upgrade() else { break };
                let Ok(payload) = msg.get_payload::<String>() else {
                    continue;
                };
                if msg.get_channel_name() == health {
                    c.health.apply(&c.instance, &payload);
                } else if let Some((vm, name)) =
                    wasm_host::shared::split_global_queue_name(&payload)
                    && let Some(notify) = QUEUE_LISTENER.get()
                {
                    notify(vm, name);
                }
            }
            redis::RedisResult::Ok(())
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = session => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RECONNECT_EVERY) => {}
        }
    }
}

/// Where generations of one gateway find the cluster of the previous one.
mod store {
    use super::*;
    use crate::per_gateway::PerGateway;

    static STORE: PerGateway<ClusterConfig, Cluster> = PerGateway::new();

    pub(super) fn get_or_insert(
        registry: &Arc<Registry>,
        settings: &ClusterConfig,
        make: impl FnOnce() -> Result<Arc<Cluster>, String>,
    ) -> Result<Arc<Cluster>, String> {
        STORE.get_or_try_insert(registry, settings.clone(), make)
    }
}
