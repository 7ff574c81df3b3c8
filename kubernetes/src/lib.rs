//! The Kubernetes Gateway API controller. It watches GatewayClasses, Gateways, HTTPRoutes,
//! ReferenceGrants, Services, EndpointSlices and TLS Secrets, and hands the gateway a config
//! fragment (listeners, certificates, upstreams, routes) each time they change; the gateway
//! merges it with its file and applies it as a new generation, then says whether that worked,
//! and the controller writes status. It knows the config model, never the server's internals.
//!
//! ```text
//! watch loops ─▶ Store ─▶ reconcile ─▶ translate ─▶ Update{fragment} ─▶ gateway
//!                                  ◀── applied: Result ◀────────────────┘
//!                         status ◀─┘
//! ```

pub mod client;
mod error;
pub mod status;
pub mod translate;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use gateway_config::KubernetesConfig;
use gateway_config::model::RawConfig;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub use client::Client;
pub use error::KubeError;

/// A config fragment for the gateway to apply; it answers through `applied`.
pub struct Update {
    /// What the cluster asks for.
    pub fragment: RawConfig,
    /// `Ok` once the fragment serves, or why the gateway refused it.
    pub applied: oneshot::Sender<Result<(), String>>,
}

/// The running controller; dropping it stops its watches.
pub struct Controller {
    tasks: Vec<JoinHandle<()>>,
    /// Listener certificates from Secrets, as files the config names.
    _cert_dir: tempfile::TempDir,
}

impl Drop for Controller {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Bursts of events (a rollout touching a slice several times) are taken as one change.
const SETTLE: Duration = Duration::from_millis(20);

impl Controller {
    /// Starts watching; updates come on the returned channel once every kind has been listed.
    pub fn start(config: KubernetesConfig) -> Result<(Self, mpsc::Receiver<Update>), KubeError> {
        let client = Client::new(config.kubeconfig.as_deref())?;
        let cert_dir = tempfile::Builder::new()
            .prefix("gateway-kubernetes-")
            .tempdir()
            .map_err(|e| KubeError::Credentials(format!("certificate directory: {e}")))?;
        let scopes: Vec<Option<String>> = if config.namespaces.is_empty() {
            vec![None]
        } else {
            config.namespaces.iter().cloned().map(Some).collect()
        };
        let mut loops = Vec::new();
        for kind in watch::Kind::ALL {
            if kind.namespaced() {
                loops.extend(scopes.iter().map(|s| (kind, s.clone())));
            } else {
                loops.push((kind, None));
            }
        }
        let store = watch::Store::new(loops.len());
        let mut tasks: Vec<JoinHandle<()>> = loops
            .into_iter()
            .map(|(kind, ns)| tokio::spawn(watch::run(client.clone(), kind, ns, store.clone())))
            .collect();
        let (tx, rx) = mpsc::channel(1);
        let dir = cert_dir.path().to_owned();
        tasks.push(tokio::spawn(reconcile(client, config, store, tx, dir)));
        Ok((
            Self {
                tasks,
                _cert_dir: cert_dir,
            },
            rx,
        ))
    }
}

async fn reconcile(
    client: Client,
    config: KubernetesConfig,
    store: Arc<watch::Store>,
    tx: mpsc::Sender<Update>,
    cert_dir: std::path::PathBuf,
) {
    let mut changes = store.subscribe();
    // A partial view would drop routes that are only not listed yet.
    while !store.synced() {
        if changes.changed().await.is_err() {
            return;
        }
    }
    tracing::info!("kubernetes: every watched kind listed");
    // A hash of the last fragment sent: the fragment itself is the gateway's to keep.
    let mut last: Option<u64> = None;
    let mut applied: Result<(), String> = Ok(());
    let mut refused_ports = BTreeMap::new();
    // The ports of the last config the gateway took.
    let mut good_ports = BTreeSet::new();
    let mut written = status::Written::new();
    loop {
        changes.borrow_and_update();
        let snapshot = store.snapshot();
        let mut t = translate::translate(&snapshot, &config, &cert_dir);
        translate::prune(&mut t);
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            serde_json::to_string(&t.fragment)
                .unwrap_or_default()
                .hash(&mut h);
            h.finish()
        };
        if last.as_ref() != Some(&key) {
            let Some(outcome) = apply(&tx, t.fragment, &good_ports).await else {
                return;
            };
            (applied, refused_ports) = (outcome.applied, outcome.refused_ports);
            if let Some(ports) = outcome.ports {
                good_ports = ports;
            }
            // Kept even when refused: the same objects would be refused the same way.
            last = Some(key);
        }
        status::write(
            &client,
            &snapshot,
            &t.report,
            &config,
            &applied,
            &refused_ports,
            &mut written,
        )
        .await;
        if changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(SETTLE).await;
    }
}

/// What became of a fragment.
struct Outcome {
    applied: Result<(), String>,
    /// Ports left out because the config with them was refused, with the reason.
    refused_ports: BTreeMap<u16, String>,
    /// The ports now served, when something was applied.
    ports: Option<BTreeSet<u16>>,
}

/// Sends `fragment` to the gateway. When it is refused and brings new listener or stream ports
/// (one that cannot be bound is the usual cause), it is sent again without them, so that one Gateway's
/// bad port does not hold back every other change. `None` when the gateway has stopped.
async fn apply(
    tx: &mpsc::Sender<Update>,
    fragment: RawConfig,
    good_ports: &BTreeSet<u16>,
) -> Option<Outcome> {
    let ports = |f: &RawConfig| -> BTreeSet<u16> {
        let binds = f.listeners.iter().map(|l| &l.bind);
        binds
            .chain(f.streams.iter().map(|s| &s.bind))
            .filter_map(|b| port_of(b))
            .collect()
    };
    let all = ports(&fragment);
    let error = match send(tx, fragment.clone()).await? {
        Ok(()) => {
            return Some(Outcome {
                applied: Ok(()),
                refused_ports: BTreeMap::new(),
                ports: Some(all),
            });
        }
        Err(e) => e,
    };
    tracing::error!(%error, "kubernetes config refused; the last good one serves");
    let new: BTreeSet<u16> = all.difference(good_ports).copied().collect();
    let refused = Outcome {
        applied: Err(error.clone()),
        refused_ports: BTreeMap::new(),
        ports: None,
    };
    if new.is_empty() {
        return Some(refused);
    }
    let names: Vec<String> = new.iter().map(|p| translate::listener_name(*p)).collect();
    let mut reduced = fragment;
    reduced.listeners.retain(|l| !names.contains(&l.name));
    reduced
        .streams
        .retain(|s| port_of(&s.bind).is_none_or(|p| !new.contains(&p)));
    reduced.routes.retain(|r| {
        !r.listeners
            .as_ref()
            .is_some_and(|ls| ls.iter().all(|n| names.contains(n)))
    });
    match send(tx, reduced).await? {
        Ok(()) => {
            tracing::warn!(ports = ?new, "kubernetes listeners left out; the rest applied");
            Some(Outcome {
                applied: Ok(()),
                refused_ports: new.iter().map(|p| (*p, error.clone())).collect(),
                ports: Some(all.difference(&new).copied().collect()),
            })
        }
        Err(_) => Some(refused),
    }
}

/// The port of an `ip:port` bind.
fn port_of(bind: &str) -> Option<u16> {
    bind.rsplit(':').next()?.parse().ok()
}

async fn send(tx: &mpsc::Sender<Update>, fragment: RawConfig) -> Option<Result<(), String>> {
    let (done, answer) = oneshot::channel();
    tx.send(Update {
        fragment,
        applied: done,
    })
    .await
    .ok()?;
    Some(
        answer
            .await
            .unwrap_or_else(|_| Err("the gateway stopped".into())),
    )
}
