//! `connection_rate: { connections, per, burst }`: a token bucket per client IP address. A
//! bucket holds `connections + burst` tokens and refills at `connections` per `per`; a new
//! connection (or UDP session) takes one, and is refused when none is left.
//!
//! Memory is bounded: at most [`MAX_TRACKED`] addresses are tracked. A bucket that has refilled
//! completely carries no information (it equals a fresh one), so when the table is full such
//! buckets are dropped. If the table is still full of clients that are all being limited, a new
//! address is admitted untracked (fail open) rather than locking every newcomer out: this
//! filter is per-client fairness; `max_connections` is what protects the gateway.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway_config::model::ConnectionRateConfig;
use tokio::time::Instant;

use super::{ConnectionInfo, Decision, StreamFilter, StreamFilterFactory};

/// Most client addresses tracked per filter (about 40 bytes each).
pub const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

#[derive(Debug)]
struct Table {
    buckets: HashMap<IpAddr, Bucket>,
    /// A full sweep that freed little is not repeated before this.
    next_sweep: Instant,
}

/// The shared state of one `connection_rate` entry.
#[derive(Debug)]
pub struct ConnectionRate {
    capacity: f64,
    /// Tokens per second.
    rate: f64,
    per: Duration,
    max_tracked: usize,
    table: Mutex<Table>,
    /// Addresses admitted untracked because the table was full.
    pub untracked: AtomicU64,
}

impl ConnectionRate {
    /// A limiter for `cfg` (validated: `connections` and `per` are positive).
    pub fn new(cfg: &ConnectionRateConfig) -> Self {
        Self::with_capacity(cfg, MAX_TRACKED)
    }

    fn with_capacity(cfg: &ConnectionRateConfig, max_tracked: usize) -> Self {
        let per = cfg.per.get().max(Duration::from_millis(1));
        Self {
            capacity: (cfg.connections.saturating_add(cfg.burst)).max(1) as f64,
            rate: cfg.connections.max(1) as f64 / per.as_secs_f64(),
            per,
            max_tracked,
            table: Mutex::new(Table {
                buckets: HashMap::new(),
                next_sweep: Instant::now(),
            }),
            untracked: AtomicU64::new(0),
        }
    }

    /// Takes a token for `ip` at `now`; false when its bucket is empty.
    pub fn admit(&self, ip: IpAddr, now: Instant) -> bool {
        let ip = ip.to_canonical();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if !table.buckets.contains_key(&ip) && table.buckets.len() >= self.max_tracked {
            self.sweep(&mut table, now);
            if table.buckets.len() >= self.max_tracked {
                self.untracked.fetch_add(1, Relaxed);
                return true;
            }
        }
        let bucket = table.buckets.entry(ip).or_insert(Bucket {
            tokens: self.capacity,
            last: now,
        });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.capacity);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Addresses currently tracked.
    pub fn tracked(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .buckets
            .len()
    }

    fn sweep(&self, table: &mut Table, now: Instant) {
        if now < table.next_sweep {
            return;
        }
        let before = table.buckets.len();
        let (capacity, rate) = (self.capacity, self.rate);
        table.buckets.retain(|_, b| {
            let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
            b.tokens + elapsed * rate < capacity
        });
        // Sweeping is O(n): if it freed under an eighth, wait a window before the next one.
        if before - table.buckets.len() < before / 8 {
            table.next_sweep = now + self.per;
        }
    }
}

/// Builds `connection_rate` filters sharing one [`ConnectionRate`].
#[derive(Debug, Clone)]
pub struct ConnectionRateFactory(pub Arc<ConnectionRate>);

impl StreamFilterFactory for ConnectionRateFactory {
    fn name(&self) -> &str {
        "connection_rate"
    }

    fn create(&self) -> Box<dyn StreamFilter> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl StreamFilter for ConnectionRateFactory {
    async fn on_connect(&mut self, info: &ConnectionInfo) -> Decision {
        if self.0.admit(info.client.ip(), Instant::now()) {
            Decision::Continue
        } else {
            Decision::Close
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(connections: u64, per_ms: u64, burst: u64) -> ConnectionRateConfig {
        ConnectionRateConfig {
            connections,
            per: gateway_config::Duration::from_millis(per_ms),
            burst,
        }
    }

    fn ip(n: u32) -> IpAddr {
        IpAddr::from(n.to_be_bytes())
    }

    #[test]
    fn bucket_allows_connections_plus_burst_then_refills() {
        let r = ConnectionRate::new(&cfg(2, 1000, 1));
        let t0 = Instant::now();
        let a = ip(1);
        assert!(r.admit(a, t0));
        assert!(r.admit(a, t0));
        assert!(r.admit(a, t0));
        assert!(!r.admit(a, t0));
        // Another client has its own bucket.
        assert!(r.admit(ip(2), t0));
        // Two per second: one token back after 500 ms.
        assert!(!r.admit(a, t0 + Duration::from_millis(400)));
        assert!(r.admit(a, t0 + Duration::from_millis(900)));
        assert!(!r.admit(a, t0 + Duration::from_millis(950)));
    }

    #[test]
    fn ipv4_mapped_is_the_same_client() {
        let r = ConnectionRate::new(&cfg(1, 1000, 0));
        let t0 = Instant::now();
        assert!(r.admit("10.0.0.1".parse().unwrap(), t0));
        assert!(!r.admit("::ffff:10.0.0.1".parse().unwrap(), t0));
    }

    #[test]
    fn memory_is_bounded_and_refilled_buckets_are_dropped() {
        let r = ConnectionRate::with_capacity(&cfg(1, 1000, 0), 100);
        let t0 = Instant::now();
        for n in 0..100 {
            assert!(r.admit(ip(n), t0));
        }
        assert_eq!(r.tracked(), 100);
        // Table full of limited clients: a newcomer passes untracked, nothing grows.
        assert!(r.admit(ip(1000), t0));
        assert_eq!(r.tracked(), 100);
        assert_eq!(r.untracked.load(Relaxed), 1);
        // A second later every bucket is full again: the sweep empties the table.
        let t1 = t0 + Duration::from_secs(2);
        assert!(r.admit(ip(2000), t1));
        assert_eq!(r.tracked(), 1);
        // Limiting still works for tracked clients.
        assert!(!r.admit(ip(2000), t1));
    }
}
