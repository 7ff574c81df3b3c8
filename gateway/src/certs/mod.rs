//! Certificates that change while the gateway runs: ACME certificates (issued, renewed, loaded
//! from storage) and OCSP staples. [`CertRegistry`] outlives config generations; every TLS
//! resolver built for a listener registers with it, and any change rebuilds the resolvers'
//! indexes (one `ArcSwap` store each), so new handshakes see the new certificate while open
//! connections keep the one they negotiated.

pub mod acme;
pub mod challenge;
pub mod fetch;
pub mod ocsp;
mod sni;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::telemetry::metrics::Registry;
use challenge::Challenges;
pub use sni::{LoadedCert, SniResolver};

/// One ACME certificate as resolvers see it.
#[derive(Debug, Clone)]
pub struct AcmeEntry {
    /// The names it is ordered for (refused with an alert until it arrives).
    pub domains: Vec<String>,
    /// The current certificate, once issued or loaded from storage.
    pub cert: Option<Arc<LoadedCert>>,
}

#[derive(Default)]
struct State {
    acme: HashMap<String, AcmeEntry>,
    /// OCSP responses by leaf certificate (DER).
    staples: HashMap<Vec<u8>, Arc<[u8]>>,
    /// Leaves whose OCSP refresh task runs.
    watched: HashSet<Vec<u8>>,
    resolvers: Vec<Weak<SniResolver>>,
}

/// Live certificates shared by every generation's TLS resolvers.
pub struct CertRegistry {
    state: Mutex<State>,
    /// Pending ACME challenge answers.
    pub challenges: Arc<Challenges>,
    ocsp: ocsp::OcspMetrics,
}

impl CertRegistry {
    /// An empty registry; counters registered in `metrics`.
    pub fn new(metrics: &Registry) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            challenges: Arc::new(Challenges::new(metrics)),
            ocsp: ocsp::OcspMetrics::new(metrics),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Builds `resolver`'s index and keeps it up to date from now on.
    pub(crate) fn register(self: &Arc<Self>, resolver: &Arc<SniResolver>) {
        let mut state = self.state();
        resolver.rebuild(&state.acme, &state.staples);
        state.resolvers.retain(|w| w.strong_count() > 0);
        state.resolvers.push(Arc::downgrade(resolver));
        let certs: Vec<_> = resolver.index().certificates().to_vec();
        drop(state);
        for cert in certs {
            self.watch_ocsp(&cert);
        }
    }

    /// The ACME entry for a certificate name.
    pub fn acme(&self, name: &str) -> Option<AcmeEntry> {
        self.state().acme.get(name).cloned()
    }

    /// Declares (or replaces) an ACME certificate and serves it to new handshakes.
    pub(crate) fn set_acme(self: &Arc<Self>, name: &str, entry: AcmeEntry) {
        let cert = entry.cert.clone();
        {
            let mut state = self.state();
            state.acme.insert(name.to_owned(), entry);
            Self::refresh(&mut state);
        }
        if let Some(cert) = cert {
            self.watch_ocsp(&cert);
        }
    }

    /// Forgets ACME certificates no longer configured.
    pub(crate) fn retain_acme(&self, keep: impl Fn(&str) -> bool) {
        let mut state = self.state();
        state.acme.retain(|name, _| keep(name));
        Self::refresh(&mut state);
    }

    /// Staples `response` to handshakes serving `leaf` (or stops, with `None`).
    pub(crate) fn set_staple(&self, leaf: &[u8], response: Option<Arc<[u8]>>) {
        let mut state = self.state();
        let changed = match response {
            Some(r) => {
                state.staples.insert(leaf.to_vec(), r);
                true
            }
            None => state.staples.remove(leaf).is_some(),
        };
        if changed {
            Self::refresh(&mut state);
        }
    }

    /// The OCSP response stapled for `leaf`, if any.
    pub fn staple(&self, leaf: &[u8]) -> Option<Arc<[u8]>> {
        self.state().staples.get(leaf).cloned()
    }

    /// Whether any live listener still serves `leaf`.
    pub(crate) fn in_use(&self, leaf: &[u8]) -> bool {
        let state = self.state();
        state
            .resolvers
            .iter()
            .filter_map(Weak::upgrade)
            .any(|r| r.index().serves(leaf))
    }

    fn refresh(state: &mut State) {
        state.resolvers.retain(|w| w.strong_count() > 0);
        for r in state.resolvers.iter().filter_map(Weak::upgrade) {
            r.rebuild(&state.acme, &state.staples);
        }
    }

    /// Starts the OCSP refresh task of `cert` unless it runs already or does not apply.
    fn watch_ocsp(self: &Arc<Self>, cert: &Arc<LoadedCert>) {
        if !cert.ocsp_stapling {
            return;
        }
        let Some(request) = ocsp::OcspRequest::for_chain(cert.chain()) else {
            return;
        };
        let leaf = cert.chain()[0].as_ref().to_vec();
        if !self.state().watched.insert(leaf.clone()) {
            return;
        }
        let registry = Arc::downgrade(self);
        let metrics = self.ocsp.clone();
        tokio::spawn(async move {
            ocsp::refresh_loop(registry.clone(), leaf.clone(), request, metrics).await;
            if let Some(r) = registry.upgrade() {
                r.state().watched.remove(&leaf);
                r.set_staple(&leaf, None);
            }
        });
    }
}
