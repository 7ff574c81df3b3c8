//! The series every tier of a cache has (memory and disk), registered once for both.

use crate::telemetry::{Counter, Gauge, Registry};

/// What a tier counts of its objects.
pub(super) struct TierMetrics {
    /// Bytes its objects take.
    pub(super) bytes: Gauge,
    /// Objects it holds.
    pub(super) objects: Gauge,
    /// Objects evicted to keep it within its bound.
    pub(super) evictions: Counter,
    /// Objects written to it.
    pub(super) writes: Counter,
}

impl TierMetrics {
    /// The series of one tier; `labels` name the cache and the tier.
    pub(super) fn new(registry: &Registry, labels: &[(&str, &str)]) -> Self {
        Self {
            bytes: registry.gauge(
                "gateway_cache_bytes",
                "Bytes the cache's objects take, by cache and tier.",
                labels,
            ),
            objects: registry.gauge(
                "gateway_cache_objects",
                "Objects in the cache, by cache and tier.",
                labels,
            ),
            evictions: registry.counter(
                "gateway_cache_evictions_total",
                "Objects evicted to keep the cache within its bound, by cache and tier.",
                labels,
            ),
            writes: registry.counter(
                "gateway_cache_writes_total",
                "Objects written to a tier, by cache and tier.",
                labels,
            ),
        }
    }
}
