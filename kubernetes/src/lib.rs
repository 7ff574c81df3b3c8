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
            let (done, answer) = oneshot::channel();
            let update = Update {
                fragment: t.fragment,
                applied: done,
            };
            if tx.send(update).await.is_err() {
                return;
            }
            applied = answer
                .await
                .unwrap_or_else(|_| Err("the gateway stopped".into()));
            if let Err(e) = &applied {
                tracing::error!(error = %e, "kubernetes config refused; the last good one serves");
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
            &mut written,
        )
        .await;
        if changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(SETTLE).await;
    }
}
