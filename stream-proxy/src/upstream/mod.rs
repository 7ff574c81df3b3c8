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
//!
//! The set can change while it serves: host-name targets are resolved when the set is built and
//! again on each [`Targets::refresh`] ([`resolve`]), every address of a name becoming a target.
//! The current set is swapped whole; a [`Selection`] keeps its target (with its counters,
//! health and attachment, such as the HTTP proxy's connection pool) alive until it is dropped,
//! so a target that vanished from DNS leaves once its last request or connection ends.

mod balancer;
mod hash;
mod health;
pub mod resolve;
mod stats;

use std::any::Any;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_config::model::Balance;
use tokio::time::Instant;

use balancer::{Balancer, Candidates};
use health::{HealthState, Transition};
use resolve::{Entry, Lookup};

pub use hash::{KeyHasher, hash_bytes};
pub use health::HealthPolicy;
pub use stats::{Health, TargetSnapshot, TargetStats};

/// One target as configured (or, for a host name, one of its addresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    /// `host:port` as written (the HTTP authority and TLS name).
    pub authority: Arc<str>,
    /// The target's name in metrics, logs and the consistent-hash ring: the authority, with
    /// `@IP` after it when the address came from resolving a name (a name may have several).
    pub id: Arc<str>,
    /// Resolved address.
    pub addr: SocketAddr,
    /// Relative weight (at least 1).
    pub weight: u32,
}

impl TargetSpec {
    /// A target written as an address.
    pub fn new(authority: &str, addr: SocketAddr, weight: u32) -> Self {
        let authority: Arc<str> = Arc::from(authority);
        Self {
            id: authority.clone(),
            authority,
            addr,
            weight: weight.max(1),
        }
    }

    /// One address a host-name target resolved to.
    pub fn resolved(authority: &str, addr: SocketAddr, weight: u32) -> Self {
        Self {
            id: Arc::from(format!("{authority}@{}", addr.ip())),
            authority: Arc::from(authority),
            addr,
            weight: weight.max(1),
        }
    }
}

/// What a user of the set keeps per target beside it (the HTTP proxy's connection pool), made
/// by an [`Attacher`] when the target joins the set and dropped with the target.
pub type Attachment = Arc<dyn Any + Send + Sync>;

/// Makes a target's [`Attachment`] as it joins the set.
pub type Attacher = Arc<dyn Fn(&TargetSpec) -> Option<Attachment> + Send + Sync>;

/// A target with its live state.
pub struct TargetState {
    /// What was configured.
    pub spec: TargetSpec,
    /// Counters.
    pub stats: TargetStats,
    health: HealthState,
    attachment: Option<Attachment>,
}

impl TargetState {
    /// The target's attachment, if it has one of type `T`.
    pub fn attachment<T: Any>(&self) -> Option<&T> {
        self.attachment.as_deref()?.downcast_ref()
    }
}

impl std::fmt::Debug for TargetState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetState")
            .field("spec", &self.spec)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Told when passive checks eject a target here: the target's id and how long it stays
/// out. Runs on the request path of the failing request, so it must only hand the fact on.
pub type EjectionListener = Arc<dyn Fn(&str, Duration) + Send + Sync>;

/// The targets in service at one time, with their balancer.
#[derive(Debug)]
struct Set {
    targets: Box<[Arc<TargetState>]>,
    balancer: Balancer,
}

/// An upstream's targets with their balancer and health.
pub struct Targets {
    name: Arc<str>,
    set: SetCell,
    balance: Balance,
    policy: HealthPolicy,
    epoch: Instant,
    listener: OnceLock<Listener>,
    /// The configured entries and what their names last resolved to.
    entries: Mutex<Vec<Entry>>,
    lookup: Lookup,
    attacher: Option<Attacher>,
    resolve_failures: AtomicU64,
}

impl std::fmt::Debug for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Targets")
            .field("name", &self.name)
            .field("set", &*self.set.load())
            .finish_non_exhaustive()
    }
}

struct Listener(EjectionListener);

/// Where the current set lives: a set of addresses only never changes, and is read without the
/// swap's cost on every selection; a set with host names is swapped when they resolve anew.
enum SetCell {
    Fixed(Arc<Set>),
    Changing(ArcSwap<Set>),
}

/// The current set, borrowed or guarded.
enum Current<'a> {
    Fixed(&'a Arc<Set>),
    Changing(arc_swap::Guard<Arc<Set>>),
}

impl Current<'_> {
    fn clone_arc(&self) -> Arc<Set> {
        match self {
            Self::Fixed(set) => Arc::clone(set),
            Self::Changing(guard) => Arc::clone(guard),
        }
    }
}

impl std::ops::Deref for Current<'_> {
    type Target = Set;

    fn deref(&self) -> &Set {
        match self {
            Self::Fixed(set) => set,
            Self::Changing(guard) => guard,
        }
    }
}

impl SetCell {
    fn load(&self) -> Current<'_> {
        match self {
            Self::Fixed(set) => Current::Fixed(set),
            Self::Changing(swap) => Current::Changing(swap.load()),
        }
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
    /// Index of the target in the set it was chosen from (pass it to `excluding`).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The target.
    pub fn target(&self) -> &TargetSpec {
        &self.target.spec
    }

    /// The target with its state, to report on (`report_*_on`) and read its attachment: it
    /// stays this target even after the set changed.
    pub fn state(&self) -> &TargetState {
        &self.target
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
        let entries = specs.iter().map(Entry::fixed).collect();
        Self::build("", entries, balance, policy, resolve::system(), None)
    }

    /// Builds a set from a validated upstream, resolving host names with the system's resolver.
    pub fn from_config(upstream: &gateway_config::Upstream) -> Self {
        Self::from_config_with(upstream, resolve::system(), None)
    }

    /// Builds a set from a validated upstream, resolving host names with `lookup` (now, and on
    /// each [`Targets::refresh`]); `attacher` makes each target's attachment.
    pub fn from_config_with(
        upstream: &gateway_config::Upstream,
        lookup: Lookup,
        attacher: Option<Attacher>,
    ) -> Self {
        let entries = upstream.targets.iter().map(Entry::from_config).collect();
        Self::build(
            &upstream.name,
            entries,
            upstream.settings.balance,
            HealthPolicy::from(&upstream.settings.health_check),
            lookup,
            attacher,
        )
    }

    fn build(
        name: &str,
        entries: Vec<Entry>,
        balance: Balance,
        policy: HealthPolicy,
        lookup: Lookup,
        attacher: Option<Attacher>,
    ) -> Self {
        let fixed = entries.iter().all(Entry::is_fixed);
        let empty = Arc::new(Set {
            targets: Box::new([]),
            balancer: Balancer::new(balance, &[]),
        });
        let mut targets = Self {
            name: Arc::from(name),
            set: SetCell::Changing(ArcSwap::new(empty)),
            balance,
            policy,
            epoch: Instant::now(),
            listener: OnceLock::new(),
            entries: Mutex::new(entries),
            lookup,
            attacher,
            resolve_failures: AtomicU64::new(0),
        };
        targets.refresh();
        if fixed {
            targets.set = SetCell::Fixed(targets.set.load().clone_arc());
        }
        targets
    }

    /// Resolves the host names again (blocking: call it off the request path) and, when the
    /// addresses changed, swaps in the new set. A target that stays keeps its state; a new one
    /// starts healthy. A name whose lookup fails or finds nothing keeps the addresses it last
    /// had (counted in [`Targets::resolve_failures`] and logged). Returns whether the set
    /// changed.
    pub fn refresh(&self) -> bool {
        let specs = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            for entry in entries.iter_mut() {
                if let Err(why) = entry.resolve(&self.lookup) {
                    self.resolve_failures.fetch_add(1, Relaxed);
                    tracing::warn!(
                        upstream = %self.name, target = %entry.authority(), error = %why,
                        kept = entry.addresses(),
                        "target name not resolved; its last addresses are kept"
                    );
                }
            }
            entries.iter().flat_map(Entry::specs).collect::<Vec<_>>()
        };
        let current = self.set.load();
        let same = specs.len() == current.targets.len()
            && specs
                .iter()
                .zip(current.targets.iter())
                .all(|(s, t)| *s == t.spec);
        if same {
            return false;
        }
        let targets: Box<[Arc<TargetState>]> = specs
            .into_iter()
            .map(
                |spec| match current.targets.iter().find(|t| t.spec == spec) {
                    Some(kept) => kept.clone(),
                    None => Arc::new(TargetState {
                        attachment: self.attacher.as_ref().and_then(|make| make(&spec)),
                        spec,
                        stats: TargetStats::default(),
                        health: HealthState::default(),
                    }),
                },
            )
            .collect();
        let ids: Vec<(&str, u32)> = targets
            .iter()
            .map(|t| (&*t.spec.id, t.spec.weight))
            .collect();
        let balancer = Balancer::new(self.balance, &ids);
        if !current.targets.is_empty() {
            tracing::info!(upstream = %self.name, targets = targets.len(), "upstream targets changed");
        }
        match &self.set {
            SetCell::Changing(swap) => swap.store(Arc::new(Set { targets, balancer })),
            // Only sets of addresses are fixed, and their addresses never change.
            SetCell::Fixed(_) => return false,
        }
        true
    }

    /// Lookups of a target name that failed or found no address, since the set was built.
    pub fn resolve_failures(&self) -> u64 {
        self.resolve_failures.load(Relaxed)
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

    /// Ejects the target named `id` for `eject_for`, on another instance's report, unless it
    /// is the last selectable target here. The listener is not told (the report came from
    /// it). `false` when no target has that id.
    pub fn eject_from_peer(&self, id: &str, eject_for: Duration) -> bool {
        let set = self.set.load();
        let Some(t) = set.targets.iter().find(|t| &*t.spec.id == id) else {
            return false;
        };
        let now = self.now_ms();
        let until = now.saturating_add(eject_for.as_millis() as u64);
        let transition = t
            .health
            .on_peer_ejection(&t.stats, until, now, || self.alone(&set, t));
        self.log(t, transition);
        true
    }

    /// Number of targets now.
    pub fn len(&self) -> usize {
        self.set.load().targets.len()
    }

    /// Whether there are no targets now (a name that has not resolved yet).
    pub fn is_empty(&self) -> bool {
        self.set.load().targets.is_empty()
    }

    /// The target at `index` in the current set.
    pub fn get(&self, index: usize) -> Option<Arc<TargetState>> {
        self.set.load().targets.get(index).cloned()
    }

    /// The targets now, in configuration order.
    pub fn current(&self) -> Vec<Arc<TargetState>> {
        self.set.load().targets.to_vec()
    }

    /// Picks a healthy target not in `excluding` (indices in the current set); `key` is the
    /// request's hash for `consistent_hash` (ignored otherwise). `None` when every candidate
    /// is down or excluded, or there is none.
    pub fn select(&self, key: u64, excluding: &[usize]) -> Option<Selection> {
        let set = self.set.load();
        let view = View {
            set: self,
            targets: &set.targets,
            excluding,
            now: std::cell::Cell::new(None),
        };
        let index = set.balancer.pick(&view, key)?;
        let target = set.targets.get(index)?.clone();
        target.stats.attempts.fetch_add(1, Relaxed);
        target.stats.in_flight.fetch_add(1, Relaxed);
        Some(Selection { index, target })
    }

    /// A request or connection on `index` (in the current set) succeeded.
    pub fn report_success(&self, index: usize) {
        if let Some(t) = self.get(index) {
            self.report_success_on(&t);
        }
    }

    /// A request or connection on `index` (in the current set) failed; see
    /// [`Targets::report_failure_on`].
    pub fn report_failure(&self, index: usize) {
        if let Some(t) = self.get(index) {
            self.report_failure_on(&t);
        }
    }

    /// An active health check of `index` (in the current set) passed or failed.
    pub fn report_check(&self, index: usize, passed: bool) {
        if let Some(t) = self.get(index) {
            self.report_check_on(&t, passed);
        }
    }

    /// A request or connection on `t` succeeded.
    pub fn report_success_on(&self, t: &TargetState) {
        let transition = t.health.on_success(&t.stats, || self.now_ms());
        self.log(t, transition);
    }

    /// A request or connection on `t` failed in a way that says something about the target
    /// (connect error, reset, timeout of its answer, bad response). Never takes the set's last
    /// selectable target out: that ejection is counted as spared instead.
    pub fn report_failure_on(&self, t: &TargetState) {
        let set = self.set.load();
        let transition = t
            .health
            .on_failure(&t.stats, &self.policy, self.now_ms(), || {
                self.alone(&set, t)
            });
        if transition == Transition::Ejected
            && let Some(Listener(tell)) = self.listener.get()
        {
            tell(&t.spec.id, self.policy.eject_for);
        }
        self.log(t, transition);
    }

    /// An active health check of `t` passed or failed.
    pub fn report_check_on(&self, t: &TargetState, passed: bool) {
        let transition = t.health.on_check(&t.stats, &self.policy, passed);
        self.log(t, transition);
    }

    /// The health of `index` (in the current set) now.
    pub fn health(&self, index: usize) -> Option<Health> {
        self.get(index).map(|t| t.health.health(self.now_ms()))
    }

    /// Copies of every target's state, in configuration order.
    pub fn snapshot(&self) -> Vec<TargetSnapshot> {
        let now = self.now_ms();
        self.set
            .load()
            .targets
            .iter()
            .map(|t| TargetSnapshot {
                authority: t.spec.authority.to_string(),
                id: t.spec.id.to_string(),
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

    /// Whether no target of `set` but `t` is selectable now (ejected and down ones are not).
    fn alone(&self, set: &Set, t: &TargetState) -> bool {
        let now = self.now_ms();
        !set.targets
            .iter()
            .any(|o| !std::ptr::eq(&**o, t) && o.health.available(|| now))
    }

    fn log(&self, t: &TargetState, transition: Transition) {
        let (upstream, target) = (&*self.name, &*t.spec.id);
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
    targets: &'a [Arc<TargetState>],
    excluding: &'a [usize],
    now: std::cell::Cell<Option<u64>>,
}

impl Candidates for View<'_> {
    fn len(&self) -> usize {
        self.targets.len()
    }

    fn weight(&self, i: usize) -> u32 {
        self.targets[i].spec.weight
    }

    fn load(&self, i: usize) -> u32 {
        self.targets[i].stats.in_flight()
    }

    fn eligible(&self, i: usize) -> bool {
        !self.excluding.contains(&i)
            && self.targets[i].health.available(|| match self.now.get() {
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
