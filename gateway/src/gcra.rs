//! The token buckets of the `rate_limit` filter, in GCRA form (the generic cell rate
//! algorithm): a bucket is stored as one number, its "theoretical arrival time" (the instant it
//! will be full again), so a key costs 16 bytes plus the map's overhead. Keys are a keyed 64-bit
//! hash of the client IP or header value (collisions need ~2^32 keys, and an attacker cannot
//! aim them). The table is split into [`SHARDS`] mutex-guarded maps; idle buckets (already full
//! again) are dropped lazily by a sweep of a shard every [`SWEEP_EVERY`] when it is touched, and
//! a shard never holds more than [`MAX_KEYS_PER_SHARD`] keys, so memory stays bounded (about
//! 36 MiB per filter at the cap of 1,048,576 keys) however many clients there are.
//!
//! Buckets survive a config reload when the route keeps the same name and the filter the same
//! position and settings: generations of one gateway find them in [`store`].
//!
//! Below both the filter and the cluster: `scope: global` buckets
//! ([`crate::cluster::GlobalLimiter`]) run the same algorithm in Redis and answer with the same
//! [`Decision`].

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Shards of a limiter's table (a power of two).
pub const SHARDS: usize = 64;
/// Most keys one shard holds; past it, idle buckets are swept and then some evicted.
pub const MAX_KEYS_PER_SHARD: usize = 1 << 14;
/// How often a touched shard drops its idle buckets.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// Tokens left after this request.
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset: Duration,
    /// Until the next request would be allowed (zero when allowed).
    pub retry_after: Duration,
}

/// Identity hasher: keys are already keyed SipHash outputs.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Default)]
struct Shard {
    /// Key → theoretical arrival time (ns since the limiter's epoch).
    buckets: HashMap<u64, u64, BuildHasherDefault<Prehashed>>,
    next_sweep: u64,
}

/// Token buckets for one filter.
pub struct Limiter {
    shards: Box<[Mutex<Shard>]>,
    /// Header values are hashed with a key of their own, apart from client addresses'
    /// ([`crate::connection::client_ip_hash`]), so a header value can never be made to land in a client address's
    /// bucket.
    value_hasher: std::collections::hash_map::RandomState,
    epoch: Instant,
    /// Nanoseconds per token.
    interval: u64,
    /// How far ahead of now a bucket's arrival time may run: `(capacity - 1) × interval`.
    tolerance: u64,
    capacity: u64,
}

impl Limiter {
    /// Buckets refilled at `requests / per`, holding `requests + burst` tokens.
    pub fn new(requests: u64, per: Duration, burst: u64) -> Self {
        let requests = requests.max(1);
        let per_ns = u64::try_from(per.as_nanos()).unwrap_or(u64::MAX).max(1);
        let interval = (per_ns / requests).max(1);
        let capacity = requests.saturating_add(burst);
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            value_hasher: std::collections::hash_map::RandomState::new(),
            epoch: Instant::now(),
            interval,
            tolerance: interval.saturating_mul(capacity - 1),
            capacity,
        }
    }

    /// Tokens a full bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How long one token takes to come back.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    /// The key of a header value.
    pub fn value_key(&self, value: &[u8]) -> u64 {
        self.value_hasher.hash_one(value)
    }

    /// Takes a token from `key`'s bucket, if it has one.
    pub fn check(&self, key: u64) -> Decision {
        self.check_at(key, self.now())
    }

    /// Takes a token from `key`'s bucket for a request that arrived `at` (the request's own
    /// start time, so a decision reads no clock of its own).
    pub fn check_arrived(&self, key: u64, at: Instant) -> Decision {
        let since = at.saturating_duration_since(self.epoch).as_nanos();
        self.check_at(key, u64::try_from(since).unwrap_or(u64::MAX))
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// [`Limiter::check`] at `now` ns since the epoch (tests drive time directly).
    pub fn check_at(&self, key: u64, now: u64) -> Decision {
        // Middle bits pick the shard: the map uses the low bits for its index and the top
        // seven for its control bytes.
        let shard = &self.shards[(key >> 32) as usize & (SHARDS - 1)];
        let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
        if now >= shard.next_sweep {
            shard.buckets.retain(|_, tat| *tat > now);
            shard.next_sweep = now.saturating_add(SWEEP_EVERY.as_nanos() as u64);
        }
        // One probe of the map for a known key; a new one (whose bucket is full) takes two.
        let tat = match shard.buckets.get_mut(&key) {
            Some(stored) => {
                let tat = (*stored).max(now);
                let ahead = tat - now;
                if ahead > self.tolerance {
                    return Decision {
                        allowed: false,
                        remaining: 0,
                        reset: Duration::from_nanos(ahead),
                        retry_after: Duration::from_nanos(ahead - self.tolerance),
                    };
                }
                *stored = tat.saturating_add(self.interval);
                tat
            }
            None => {
                if shard.buckets.len() >= MAX_KEYS_PER_SHARD {
                    make_room(&mut shard.buckets, now);
                }
                shard.buckets.insert(key, now.saturating_add(self.interval));
                now
            }
        };
        let used = tat.saturating_add(self.interval) - now;
        Decision {
            allowed: true,
            remaining: (self.tolerance + self.interval).saturating_sub(used) / self.interval,
            reset: Duration::from_nanos(used),
            retry_after: Duration::ZERO,
        }
    }

    /// Keys stored (all shards).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).buckets.len())
            .sum()
    }

    /// Whether no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Frees room in a full shard: idle buckets first; if every bucket is in use (a flood of
/// distinct keys), a sixteenth of the shard in the map's (effectively random) order, so the
/// scan is paid once per that many new keys rather than once per key.
fn make_room(buckets: &mut HashMap<u64, u64, BuildHasherDefault<Prehashed>>, now: u64) {
    buckets.retain(|_, tat| *tat > now);
    if buckets.len() < MAX_KEYS_PER_SHARD {
        return;
    }
    let victims: Vec<u64> = buckets
        .keys()
        .take(MAX_KEYS_PER_SHARD / 16)
        .copied()
        .collect();
    for k in victims {
        buckets.remove(&k);
    }
}

/// Where generations of one gateway find the limiters of the previous one.
pub mod store {
    use std::sync::Arc;

    use super::Limiter;
    use crate::per_gateway::PerGateway;
    use crate::telemetry::Registry;

    /// Route name, filter position and settings: a limiter is reused only when all are equal.
    pub type Key = (String, usize, String);

    static STORE: PerGateway<Key, Limiter> = PerGateway::new();

    /// The live limiter for `key` in the gateway owning `registry`, or a new one from `make`.
    pub fn get_or_insert(
        registry: &Arc<Registry>,
        key: Key,
        make: impl FnOnce() -> Limiter,
    ) -> Arc<Limiter> {
        STORE.get_or_insert(registry, key, make)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::Arc;

    use super::*;
    use crate::connection::client_ip_hash;
    use crate::telemetry::Registry;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn bucket_allows_capacity_then_refills_at_the_rate() {
        let l = Limiter::new(10, Duration::from_secs(1), 5);
        let k = l.value_key(b"a");
        let mut allowed = 0;
        for _ in 0..20 {
            allowed += u64::from(l.check_at(k, 0).allowed);
        }
        assert_eq!(allowed, 15, "requests + burst at once");
        let d = l.check_at(k, 0);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Duration::from_millis(100));
        // A tenth of a second later one token is back.
        assert!(l.check_at(k, SEC / 10).allowed);
        assert!(!l.check_at(k, SEC / 10).allowed);
        // After a long pause the bucket is full again.
        let d = l.check_at(k, 100 * SEC);
        assert!(d.allowed);
        assert_eq!(d.remaining, 14);
        assert_eq!(d.reset, Duration::from_millis(100));
    }

    #[test]
    fn remaining_counts_down() {
        let l = Limiter::new(3, Duration::from_secs(1), 0);
        let k = l.value_key(b"k");
        let r: Vec<u64> = (0..3).map(|_| l.check_at(k, 0).remaining).collect();
        assert_eq!(r, [2, 1, 0]);
        assert!(!l.check_at(k, 0).allowed);
    }

    #[test]
    fn keys_are_independent() {
        let l = Limiter::new(1, Duration::from_secs(60), 0);
        assert!(l.check_at(l.value_key(b"a"), 0).allowed);
        assert!(!l.check_at(l.value_key(b"a"), 0).allowed);
        assert!(l.check_at(l.value_key(b"b"), 0).allowed);
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(client_ip_hash(v4), client_ip_hash(mapped));
        assert_ne!(
            client_ip_hash(v4),
            client_ip_hash("10.0.0.2".parse().unwrap())
        );
        // A connection's cached hash is the same key.
        let conn = crate::connection::ConnInfo::new(
            "[::ffff:10.0.0.1]:4000".parse().unwrap(),
            "127.0.0.1:80".parse().unwrap(),
            Arc::from("l"),
            false,
            None,
        );
        assert_eq!(conn.client_hash(), client_ip_hash(v4));
        assert_eq!(conn.client_hash(), conn.client_hash());
        assert_ne!(client_ip_hash(v4), l.value_key(b"10.0.0.1"));
    }

    #[test]
    fn idle_buckets_are_swept_and_shards_are_capped() {
        let l = Limiter::new(1, Duration::from_secs(1), 0);
        for i in 0..10_000u64 {
            l.check_at(l.value_key(&i.to_le_bytes()), 0);
        }
        assert_eq!(l.len(), 10_000);
        // Past the sweep interval every bucket is full again and goes on the next touch.
        let later = SWEEP_EVERY.as_nanos() as u64 + 2 * SEC;
        for i in 0..SHARDS as u64 * 64 {
            l.check_at(l.value_key(&(1_000_000 + i).to_le_bytes()), later);
        }
        assert!(l.len() <= SHARDS * 64, "{}", l.len());
        // A flood of distinct keys at one instant never exceeds the cap.
        let l = Limiter::new(1, Duration::from_secs(3600), 0);
        for i in 0..(SHARDS * MAX_KEYS_PER_SHARD + 50_000) as u64 {
            l.check_at(l.value_key(&i.to_le_bytes()), 0);
        }
        assert!(l.len() <= SHARDS * MAX_KEYS_PER_SHARD);
    }

    #[test]
    fn store_reuses_live_limiters_per_gateway() {
        let reg = Registry::new();
        let key = || ("r".to_owned(), 0, "x".to_owned());
        let a = store::get_or_insert(&reg, key(), || Limiter::new(1, Duration::from_secs(1), 0));
        let b = store::get_or_insert(&reg, key(), || Limiter::new(1, Duration::from_secs(1), 0));
        assert!(Arc::ptr_eq(&a, &b));
        let other = Registry::new();
        let c = store::get_or_insert(&other, key(), || Limiter::new(1, Duration::from_secs(1), 0));
        assert!(!Arc::ptr_eq(&a, &c));
        drop((a, b));
        let d = store::get_or_insert(&reg, key(), || Limiter::new(1, Duration::from_secs(1), 0));
        assert_eq!(d.len(), 0, "a dropped limiter is not resurrected");
    }
}
