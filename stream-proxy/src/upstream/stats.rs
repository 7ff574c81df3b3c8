//! Per-target counters, kept as plain atomics so the observability work can export them without
//! this crate knowing about Prometheus or OpenTelemetry. Counters only grow; `in_flight` is a
//! gauge owned by [`Selection`](super::Selection) guards.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Counters of one target.
#[derive(Debug, Default)]
pub struct TargetStats {
    /// Times the target was selected (each retry counts).
    pub attempts: AtomicU64,
    /// Requests or connections that failed on this target (passive health input).
    pub failures: AtomicU64,
    /// Active health checks that failed.
    pub check_failures: AtomicU64,
    /// Transitions from healthy to ejected or down.
    pub ejections: AtomicU64,
    /// Transitions from ejected or down back to healthy.
    pub recoveries: AtomicU64,
    /// Passive ejections (local or a peer's) not made because the target was the last
    /// selectable one of its set.
    pub ejections_spared: AtomicU64,
    pub(crate) in_flight: AtomicU32,
}

impl TargetStats {
    /// Requests or connections currently using the target.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Relaxed)
    }
}

/// A target's health as selection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Selectable.
    Healthy,
    /// Passively ejected after consecutive failures; selectable again after `eject_for`. Never
    /// the last selectable target of its set.
    Ejected,
    /// Marked down by active checks until `healthy_after` checks pass.
    Down,
}

/// A point-in-time copy of one target's state, for metrics and the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSnapshot {
    /// `host:port` as configured.
    pub authority: String,
    /// The target's name in metrics: the authority, with `@IP` when it came from a host name.
    pub id: String,
    /// Resolved address.
    pub addr: SocketAddr,
    /// Relative weight.
    pub weight: u32,
    /// Current health.
    pub health: Health,
    /// In-flight requests or connections.
    pub in_flight: u32,
    /// See [`TargetStats::attempts`].
    pub attempts: u64,
    /// See [`TargetStats::failures`].
    pub failures: u64,
    /// See [`TargetStats::check_failures`].
    pub check_failures: u64,
    /// See [`TargetStats::ejections`].
    pub ejections: u64,
    /// See [`TargetStats::recoveries`].
    pub recoveries: u64,
    /// See [`TargetStats::ejections_spared`].
    pub ejections_spared: u64,
}
