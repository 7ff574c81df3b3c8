//! Health state of one target, updated lock-free from two sources.
//!
//! * Passive: every request (or connection) outcome the caller counts as the target's (what
//!   counts is the caller's rule: the HTTP proxy's is in the gateway). `unhealthy_after`
//!   consecutive failures eject the target for `eject_for`; after that it is selectable again,
//!   and one more failure ejects it again at once (the failure count is only reset by a
//!   success), so a dead target costs one probe per window rather than `unhealthy_after`.
//!   An ejection that would leave the set with no selectable target is not made (it is counted
//!   as spared): passive signals come from the requests clients choose to send, and those must
//!   never be able to take the last target out. Only active checks can.
//! * Active: periodic checks. `unhealthy_after` consecutive failed checks mark the target down
//!   with no time limit; `healthy_after` consecutive passing checks bring it back, and also end a
//!   passive ejection early (the config contract: "consecutive successes before an ejected
//!   target returns").
//!
//! Times are milliseconds since the owning set's epoch; 0 means "not ejected", so the hot path
//! reads one atomic and never the clock while every target is healthy.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use super::stats::{Health, TargetStats};

/// Thresholds shared by a set's targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Consecutive failures (passive or active) before a target is taken out.
    pub unhealthy_after: u32,
    /// Consecutive passing active checks before it returns.
    pub healthy_after: u32,
    /// How long a passive ejection lasts.
    pub eject_for: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self::from(&gateway_config::model::HealthCheckConfig::default())
    }
}

impl From<&gateway_config::model::HealthCheckConfig> for HealthPolicy {
    fn from(c: &gateway_config::model::HealthCheckConfig) -> Self {
        Self {
            unhealthy_after: c.unhealthy_after.max(1),
            healthy_after: c.healthy_after.max(1),
            eject_for: c.eject_for.get(),
        }
    }
}

/// What a state change was, for logging by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    None,
    Ejected,
    /// Ejected on another instance's report.
    PeerEjected,
    /// An ejection was due, but the target is the last selectable one and stays in; reported
    /// once until the target succeeds again.
    Spared,
    Down,
    Recovered,
}

#[derive(Debug, Default)]
pub(crate) struct HealthState {
    consecutive_failures: AtomicU32,
    /// Deadline of a passive ejection (ms since epoch), 0 when none.
    ejected_until: AtomicU64,
    active_down: AtomicBool,
    active_passes: AtomicU32,
    active_fails: AtomicU32,
    /// An ejection was spared since the last success (so it is logged once, not per failure).
    spared: AtomicBool,
}

impl HealthState {
    /// Whether selection may pick the target; `now` is only called while an ejection is on record.
    #[inline]
    pub(crate) fn available(&self, now: impl FnOnce() -> u64) -> bool {
        if self.active_down.load(Relaxed) {
            return false;
        }
        match self.ejected_until.load(Relaxed) {
            0 => true,
            until => now() >= until,
        }
    }

    pub(crate) fn health(&self, now_ms: u64) -> Health {
        if self.active_down.load(Relaxed) {
            Health::Down
        } else if !self.available(|| now_ms) {
            Health::Ejected
        } else {
            Health::Healthy
        }
    }

    pub(crate) fn on_success(&self, stats: &TargetStats, now: impl FnOnce() -> u64) -> Transition {
        let until = self.ejected_until.load(Relaxed);
        if until != 0 {
            // A request that started before the ejection and finished well says little; only a
            // success after the window (a probe) ends the ejection.
            if now() < until {
                return Transition::None;
            }
            if self.ejected_until.swap(0, Relaxed) != 0 {
                self.consecutive_failures.store(0, Relaxed);
                stats.recoveries.fetch_add(1, Relaxed);
                return Transition::Recovered;
            }
        }
        // Load first: a store on every success would bounce the cache line between cores.
        if self.consecutive_failures.load(Relaxed) != 0 {
            self.consecutive_failures.store(0, Relaxed);
            self.spared.store(false, Relaxed);
        }
        Transition::None
    }

    /// A failure counted against the target. `alone` tells whether no other target of the set
    /// is selectable now; it is asked only when an ejection is due.
    pub(crate) fn on_failure(
        &self,
        stats: &TargetStats,
        policy: &HealthPolicy,
        now_ms: u64,
        alone: impl FnOnce() -> bool,
    ) -> Transition {
        stats.failures.fetch_add(1, Relaxed);
        let n = self
            .consecutive_failures
            .fetch_add(1, Relaxed)
            .saturating_add(1);
        if n < policy.unhealthy_after || policy.eject_for.is_zero() {
            return Transition::None;
        }
        let until = now_ms
            .saturating_add(policy.eject_for.as_millis() as u64)
            .max(1);
        self.eject(stats, until, now_ms, alone, Transition::Ejected)
    }

    /// Another gateway instance ejected the target (shared passive health): keep it out until
    /// `until` (ms since the set's epoch), or longer if it is already out longer. A peer's
    /// report is a passive signal too: the last selectable target stays in.
    pub(crate) fn on_peer_ejection(
        &self,
        stats: &TargetStats,
        until: u64,
        now_ms: u64,
        alone: impl FnOnce() -> bool,
    ) -> Transition {
        let until = until.max(1);
        self.eject(stats, until, now_ms, alone, Transition::PeerEjected)
    }

    /// Takes the target out until `until`, or extends an ejection already running (never
    /// shortening it), unless that leaves no target of the set selectable.
    fn eject(
        &self,
        stats: &TargetStats,
        until: u64,
        now_ms: u64,
        alone: impl FnOnce() -> bool,
        made: Transition,
    ) -> Transition {
        let previous = self.ejected_until.fetch_max(until, Relaxed);
        if previous != 0 && previous > now_ms {
            // Already out: only the window moved.
            self.active_passes.store(0, Relaxed);
            return Transition::None;
        }
        // Checked after the ejection is on record, with a fence between (as the other target's
        // ejection has), so two targets failing at once cannot both see the other still in and
        // both go: at least one sees the other out, and at worst both stay in.
        std::sync::atomic::fence(SeqCst);
        if alone() {
            // Undone unless another report moved the window meanwhile.
            let _ = self
                .ejected_until
                .compare_exchange(until, previous, Relaxed, Relaxed);
            stats.ejections_spared.fetch_add(1, Relaxed);
            return if self.spared.swap(true, Relaxed) {
                Transition::None
            } else {
                Transition::Spared
            };
        }
        // Active passes counted before the ejection must not end it at once.
        self.active_passes.store(0, Relaxed);
        stats.ejections.fetch_add(1, Relaxed);
        made
    }

    pub(crate) fn on_check(
        &self,
        stats: &TargetStats,
        policy: &HealthPolicy,
        passed: bool,
    ) -> Transition {
        if passed {
            self.active_fails.store(0, Relaxed);
            let n = self.active_passes.fetch_add(1, Relaxed).saturating_add(1);
            let out = self.active_down.load(Relaxed) || self.ejected_until.load(Relaxed) != 0;
            if out && n >= policy.healthy_after {
                self.active_down.store(false, Relaxed);
                self.ejected_until.store(0, Relaxed);
                self.consecutive_failures.store(0, Relaxed);
                stats.recoveries.fetch_add(1, Relaxed);
                return Transition::Recovered;
            }
        } else {
            stats.check_failures.fetch_add(1, Relaxed);
            self.active_passes.store(0, Relaxed);
            let n = self.active_fails.fetch_add(1, Relaxed).saturating_add(1);
            if n >= policy.unhealthy_after && !self.active_down.swap(true, Relaxed) {
                stats.ejections.fetch_add(1, Relaxed);
                return Transition::Down;
            }
        }
        Transition::None
    }
}
