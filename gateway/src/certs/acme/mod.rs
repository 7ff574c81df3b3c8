//! Automatic certificates: one task per `certificates.NAME.acme` entry loads the stored
//! certificate at start (no new order while it is not due), orders one when there is none, and
//! renews ahead of expiry (when `renew_before`, by default a third of the lifetime, remains),
//! retrying failures with exponential backoff. Each new certificate goes to the
//! [`CertRegistry`], which swaps it into the listeners' resolvers. The tasks outlive config
//! generations: a reload keeps a task whose settings did not change.

pub mod order;
pub mod storage;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gateway_config::model::AcmeConfig;
use gateway_config::{CertificateSource, Config};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{AcmeEntry, CertRegistry};
use crate::telemetry::metrics::{Counter, Gauge, Registry};
use storage::{Issued, Storage};

/// First retry after a failed order; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_secs(5);
/// Longest wait between failed attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// The running ACME tasks.
pub struct AcmeManager {
    registry: Arc<CertRegistry>,
    metrics: Arc<Registry>,
    tasks: Mutex<HashMap<String, Task>>,
}

struct Task {
    settings: AcmeConfig,
    ocsp_stapling: bool,
    renew: Arc<Notify>,
    stop: CancellationToken,
}

impl Drop for Task {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl AcmeManager {
    /// No tasks yet.
    pub fn new(registry: Arc<CertRegistry>, metrics: Arc<Registry>) -> Self {
        Self {
            registry,
            metrics,
            tasks: Mutex::default(),
        }
    }

    /// Starts, keeps or stops tasks to match `config`. A new task's stored certificate is in the
    /// registry when this returns, so the first handshakes already get it.
    pub fn apply(&self, config: &Config, shutdown: &CancellationToken) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        let wanted: HashMap<&str, (&AcmeConfig, bool)> = config
            .certificates
            .iter()
            .filter_map(|(name, c)| match &c.source {
                CertificateSource::Acme(a) => Some((name.as_str(), (a, c.ocsp_stapling))),
                CertificateSource::Files { .. } => None,
            })
            .collect();
        tasks.retain(|name, t| {
            wanted
                .get(name.as_str())
                .is_some_and(|(s, o)| **s == t.settings && *o == t.ocsp_stapling)
        });
        self.registry.retain_acme(|name| wanted.contains_key(name));
        for (name, (settings, ocsp_stapling)) in wanted {
            if tasks.contains_key(name) {
                continue;
            }
            let storage = Storage::new(&settings.storage, name);
            let stored = match storage
                .load(ocsp_stapling)
                .and_then(|c| c.map(Issued::new).transpose())
            {
                Ok(Some(c)) if c.covers(&settings.domains) => Some(c),
                Ok(Some(_)) => {
                    tracing::info!(
                        certificate = name,
                        "stored certificate does not cover the configured domains; ordering a new one"
                    );
                    None
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(certificate = name, error = %e, "stored certificate unusable; ordering a new one");
                    None
                }
            };
            let metrics = AcmeMetrics::new(&self.metrics, name);
            if let Some(c) = &stored {
                metrics.not_after.set(c.not_after);
            }
            self.registry.set_acme(
                name,
                AcmeEntry {
                    domains: settings.domains.clone(),
                    cert: stored.as_ref().map(|c| c.cert.clone()),
                },
            );
            let task = Task {
                settings: settings.clone(),
                ocsp_stapling,
                renew: Arc::new(Notify::new()),
                stop: shutdown.child_token(),
            };
            let run = Renewal {
                name: name.to_owned(),
                settings: settings.clone(),
                ocsp_stapling,
                storage,
                registry: self.registry.clone(),
                metrics,
                renew: task.renew.clone(),
            };
            tokio::spawn(run.run(stored, task.stop.clone()));
            tasks.insert(name.to_owned(), task);
        }
    }

    /// Renews now: the named certificate, or every one. Returns how many renewals started, or
    /// `None` when `name` is not an ACME certificate.
    pub fn renew(&self, name: Option<&str>) -> Option<usize> {
        let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        match name {
            Some(n) => {
                tasks.get(n)?.renew.notify_one();
                Some(1)
            }
            None => {
                tasks.values().for_each(|t| t.renew.notify_one());
                Some(tasks.len())
            }
        }
    }
}

/// Counters of one ACME certificate.
struct AcmeMetrics {
    ok: Counter,
    failed: Counter,
    not_after: Gauge,
}

impl AcmeMetrics {
    fn new(metrics: &Registry, name: &str) -> Self {
        let orders = |result| {
            metrics.counter(
                "gateway_acme_orders_total",
                "ACME orders (first issuance and renewals), by result",
                &[("certificate", name), ("result", result)],
            )
        };
        Self {
            ok: orders("ok"),
            failed: orders("error"),
            not_after: metrics.gauge(
                "gateway_acme_certificate_expiry_seconds",
                "When the served ACME certificate expires (Unix time)",
                &[("certificate", name)],
            ),
        }
    }
}

/// The renewal loop of one certificate.
struct Renewal {
    name: String,
    settings: AcmeConfig,
    ocsp_stapling: bool,
    storage: Storage,
    registry: Arc<CertRegistry>,
    metrics: AcmeMetrics,
    renew: Arc<Notify>,
}

impl Renewal {
    async fn run(self, mut current: Option<Issued>, stop: CancellationToken) {
        let mut account = None;
        let mut failures = 0u32;
        let mut retry_in: Option<Duration> = None;
        loop {
            let wait = retry_in.unwrap_or_else(|| match &current {
                None => Duration::ZERO,
                Some(c) => self.due_in(c),
            });
            if !wait.is_zero() {
                tracing::debug!(certificate = %self.name, ?wait, "next ACME order");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = self.renew.notified() => {}
            }
            let attempt = async {
                if account.is_none() {
                    account = Some(order::account(&self.settings, &self.storage).await?);
                }
                let acct = account.as_ref().expect("set above");
                let challenges = &self.registry.challenges;
                order::issue(
                    acct,
                    &self.settings,
                    &self.storage,
                    challenges,
                    self.ocsp_stapling,
                )
                .await
            };
            let result = tokio::select! {
                _ = stop.cancelled() => return,
                r = attempt => r,
            };
            match result {
                Ok(issued) => {
                    failures = 0;
                    retry_in = None;
                    self.metrics.ok.inc();
                    self.metrics.not_after.set(issued.not_after);
                    tracing::info!(certificate = %self.name, domains = ?self.settings.domains, "ACME certificate issued and swapped in");
                    self.registry.set_acme(
                        &self.name,
                        AcmeEntry {
                            domains: self.settings.domains.clone(),
                            cert: Some(issued.cert.clone()),
                        },
                    );
                    current = Some(issued);
                }
                Err(e) => {
                    failures += 1;
                    self.metrics.failed.inc();
                    let backoff = MIN_BACKOFF
                        .saturating_mul(1 << failures.saturating_sub(1).min(16))
                        .min(MAX_BACKOFF);
                    tracing::warn!(certificate = %self.name, error = %e, retry_in = ?backoff, "ACME order failed");
                    retry_in = Some(backoff);
                    // A stale account (e.g. the CA forgot it) is registered anew next time.
                    if failures.is_multiple_of(3) {
                        account = None;
                    }
                }
            }
        }
    }

    /// Time until `c` is due for renewal.
    fn due_in(&self, c: &Issued) -> Duration {
        let lifetime = (c.not_after - c.not_before).max(0);
        let before = match self.settings.renew_before {
            Some(d) => d.get().as_secs() as i64,
            None => lifetime / 3,
        };
        let due = c.not_after - before;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        Duration::from_secs((due - now).max(0) as u64)
    }
}
