//! Target selection shared by the HTTP reverse proxy and L4 streams: the balancers, per-target
//! health (passive ejection and active-check state) and counters. Nothing here knows HTTP: a
//! caller that balances by a request property (client IP, path, header, cookie) hashes it with
//! [`hash_bytes`] and passes the `u64`.
//!
//! ```
//! use stream_proxy::upstream::{HealthPolicy, TargetSpec, Targets};
//! use gateway_config::model::Balance;
//!
//! let targets = Targets::new(
//!     vec![TargetSpec::new("127.0.0.1:9001", "127.0.0.1:9001".parse().unwrap(), 1)],
//!     Balance::RoundRobin,
//!     HealthPolicy::default(),
//! );
//! let first = targets.select(0, &[]).expect("one healthy target");
//! // ... connect to first.target().addr ...
//! targets.report_failure(first.index());
//! // A retry asks for any target but the ones already tried:
//! assert!(targets.select(0, &[first.index()]).is_none());
//! ```

mod balancer;
mod hash;
mod health;
mod stats;

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gateway_config::model::Balance;
use tokio::time::Instant;

use balancer::{Balancer, Candidates};
use health::{HealthState, Transition};

pub use hash::{KeyHasher, hash_bytes};
pub use health::HealthPolicy;
pub use stats::{Health, TargetSnapshot, TargetStats};

/// One target as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    /// `host:port` as written (the HTTP authority, the name in metrics, the ring identity).
    pub authority: Arc<str>,
    /// Resolved address.
    pub addr: SocketAddr,
    /// Relative weight (at least 1).
    pub weight: u32,
}

impl TargetSpec {
    /// A target.
    pub fn new(authority: &str, addr: SocketAddr, weight: u32) -> Self {
        Self {
            authority: Arc::from(authority),
            addr,
            weight: weight.max(1),
        }
    }
}

/// A target with its live state.
#[derive(Debug)]
pub struct TargetState {
    /// What was configured.
    pub spec: TargetSpec,
    /// Counters.
    pub stats: TargetStats,
    health: HealthState,
}

/// Told when passive checks eject a target here: the target's authority and how long it stays
/// out. Runs on the request path of the failing request, so it must only hand the fact on.
pub type EjectionListener = Arc<dyn Fn(&str, Duration) + Send + Sync>;

/// An upstream's targets with their balancer and health.
#[derive(Debug)]
pub struct Targets {
    name: Arc<str>,
    targets: Box<[Arc<TargetState>]>,
    balancer: Balancer,
    policy: HealthPolicy,
    epoch: Instant,
    listener: OnceLock<Listener>,
}

struct Listener(EjectionListener);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EjectionListener")
    }
}

/// A chosen target. It counts as in flight (for `least_requests` and `random`) until dropped,
/// so hold it for as long as the request or connection uses the target.
#[derive(Debug)]
pub struct Selection {
    index: usize,
    target: Arc<TargetState>,
}

impl Selection {
    /// Index of the target in configuration order (pass it to `report_*` and `excluding`).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The target.
    pub fn target(&self) -> &TargetSpec {
        &self.target.spec
    }
}

impl Drop for Selection {
    fn drop(&mut self) {
        self.target.stats.in_flight.fetch_sub(1, Relaxed);
    }
}

impl Targets {
    /// Builds a set from specs in configuration order.
    pub fn new(specs: Vec<TargetSpec>, balance: Balance, policy: HealthPolicy) -> Self {
        Self::named("", specs, balance, policy)
    }

    /// Builds a set from a validated upstream.
    pub fn from_config(upstream: &gateway_config::Upstream) -> Self {
        let specs = upstream
            .targets
            .iter()
            .map(|t| TargetSpec::new(&t.authority, t.addr, t.weight))
            .collect();
        Self::named(
            &upstream.name,
            specs,
            upstream.settings.balance,
            HealthPolicy::from(&upstream.settings.health_check),
        )
    }

    fn named(name: &str, specs: Vec<TargetSpec>, balance: Balance, policy: HealthPolicy) -> Self {
        let ids: Vec<(&str, u32)> = specs.iter().map(|s| (&*s.authority, s.weight)).collect();
        let balancer = Balancer::new(balance, &ids);
        Self {
            name: Arc::from(name),
            targets: specs
                .into_iter()
                .map(|spec| {
                    Arc::new(TargetState {
                        spec,
                        stats: TargetStats::default(),
                        health: HealthState::default(),
                    })
                })
                .collect(),
            balancer,
            policy,
            epoch: Instant::now(),
            listener: OnceLock::new(),
        }
    }

    /// The upstream's name (empty for sets built with [`Targets::new`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets the one listener told about passive ejections (shared health); `false` if one is
    /// set already.
    pub fn set_ejection_listener(&self, listener: EjectionListener) -> bool {
        self.listener.set(Listener(listener)).is_ok()
    }

    /// Ejects the target written `authority` for `eject_for`, on another instance's report,
    /// unless it is the last selectable target here. The listener is not told (the report came
    /// from it). `false` when no target is written so.
    pub fn eject_from_peer(&self, authority: &str, eject_for: Duration) -> bool {
        let Some(index) = self
            .targets
            .iter()
            .position(|t| &*t.spec.authority == authority)
        else {
            return false;
        };
        let t = &self.targets[index];
        let now = self.now_ms();
        let until = now.saturating_add(eject_for.as_millis() as u64);
        let transition = t
            .health
            .on_peer_ejection(&t.stats, until, now, || self.alone(index));
        self.log(t, transition);
        true
    }

    /// Number of targets.
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// Whether there are no targets (validated configs always have one).
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// The target at `index`.
    pub fn get(&self, index: usize) -> Option<&TargetState> {
        self.targets.get(index).map(|t| &**t)
    }

    /// Picks a healthy target not in `excluding`; `key` is the request's hash for
    /// `consistent_hash` (ignored otherwise). `None` when every candidate is down or excluded.
    pub fn select(&self, key: u64, excluding: &[usize]) -> Option<Selection> {
        let view = View {
            set: self,
            excluding,
            now: std::cell::Cell::new(None),
        };
        let index = self.balancer.pick(&view, key)?;
        let target = self.targets[index].clone();
        target.stats.attempts.fetch_add(1, Relaxed);
        target.stats.in_flight.fetch_add(1, Relaxed);
        Some(Selection { index, target })
    }

    /// A request or connection on `index` succeeded.
    pub fn report_success(&self, index: usize) {
        if let Some(t) = self.targets.get(index) {
            let transition = t.health.on_success(&t.stats, || self.now_ms());
            self.log(t, transition);
        }
    }

    /// A request or connection on `index` failed in a way that says something about the target
    /// (connect error, reset, timeout of its answer, bad response). Never takes the set's last
    /// selectable target out: that ejection is counted as spared instead.
    pub fn report_failure(&self, index: usize) {
        if let Some(t) = self.targets.get(index) {
            let transition = t
                .health
                .on_failure(&t.stats, &self.policy, self.now_ms(), || self.alone(index));
            if transition == Transition::Ejected
                && let Some(Listener(tell)) = self.listener.get()
            {
                tell(&t.spec.authority, self.policy.eject_for);
            }
            self.log(t, transition);
        }
    }

    /// An active health check of `index` passed or failed.
    pub fn report_check(&self, index: usize, passed: bool) {
        if let Some(t) = self.targets.get(index) {
            let transition = t.health.on_check(&t.stats, &self.policy, passed);
            self.log(t, transition);
        }
    }

    /// The health of `index` now.
    pub fn health(&self, index: usize) -> Option<Health> {
        self.targets
            .get(index)
            .map(|t| t.health.health(self.now_ms()))
    }

    /// Copies of every target's state, in configuration order.
    pub fn snapshot(&self) -> Vec<TargetSnapshot> {
        let now = self.now_ms();
        self.targets
            .iter()
            .map(|t| TargetSnapshot {
                authority: t.spec.authority.to_string(),
                addr: t.spec.addr,
                weight: t.spec.weight,
                health: t.health.health(now),
                in_flight: t.stats.in_flight(),
                attempts: t.stats.attempts.load(Relaxed),
                failures: t.stats.failures.load(Relaxed),
                check_failures: t.stats.check_failures.load(Relaxed),
                ejections: t.stats.ejections.load(Relaxed),
                recoveries: t.stats.recoveries.load(Relaxed),
                ejections_spared: t.stats.ejections_spared.load(Relaxed),
            })
            .collect()
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether no target but `index` is selectable now (ejected and down ones are not).
    fn alone(&self, index: usize) -> bool {
        let now = self.now_ms();
        !self
            .targets
            .iter()
            .enumerate()
            .any(|(i, t)| i != index && t.health.available(|| now))
    }

    fn log(&self, t: &TargetState, transition: Transition) {
        let (upstream, target) = (&*self.name, &*t.spec.authority);
        match transition {
            Transition::None => {}
            Transition::Ejected => tracing::warn!(
                upstream, target, eject_for = ?self.policy.eject_for,
                "target ejected after consecutive failures"
            ),
            Transition::PeerEjected => tracing::warn!(
                upstream,
                target,
                "target ejected on another gateway instance's report"
            ),
            Transition::Spared => tracing::warn!(
                upstream,
                target,
                "target kept in rotation despite consecutive failures: it is the last selectable one"
            ),
            Transition::Down => {
                tracing::warn!(upstream, target, "target marked down by health checks")
            }
            Transition::Recovered => tracing::info!(upstream, target, "target healthy again"),
        }
    }
}

/// The balancers' view of a set for one selection. The clock is read at most once, and only if
/// some target carries an ejection.
struct View<'a> {
    set: &'a Targets,
    excluding: &'a [usize],
    now: std::cell::Cell<Option<u64>>,
}

impl Candidates for View<'_> {
    fn len(&self) -> usize {
        self.set.targets.len()
    }

    fn weight(&self, i: usize) -> u32 {
        self.set.targets[i].spec.weight
    }

    fn load(&self, i: usize) -> u32 {
        self.set.targets[i].stats.in_flight()
    }

    fn eligible(&self, i: usize) -> bool {
        !self.excluding.contains(&i)
            && self.set.targets[i]
                .health
                .available(|| match self.now.get() {
                    Some(now) => now,
                    None => {
                        let now = self.set.now_ms();
                        self.now.set(Some(now));
                        now
                    }
                })
    }
}

#[cfg(test)]
mod tests;
