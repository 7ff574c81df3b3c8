//! `scope: global` rate limits: the same GCRA as the local limiter
//! ([`crate::gcra::Limiter`]), with the bucket's theoretical arrival time kept in
//! Redis and updated by one Lua script, so a decision is atomic across instances and costs one
//! round trip (EVALSHA; the script is loaded again by EVAL after a Redis restart). Time is the
//! Redis server's (`TIME`), so the instances' clocks need not agree.

use std::sync::Arc;
use std::time::Duration;

use super::link::Link;
use crate::gcra::Decision;

/// KEYS[1]: the bucket. ARGV: interval and tolerance in microseconds. Returns
/// `{allowed, ahead_us, retry_us}` where `ahead_us` is how far the bucket's arrival time is
/// ahead of now after the decision. The key expires when the bucket is full again.
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local ahead = tat - now
if ahead > tolerance then
  return {0, ahead, ahead - tolerance}
end
local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1)
return {1, new_tat - now, 0}
";

/// One filter's buckets in Redis.
pub struct GlobalLimiter {
    link: Arc<Link>,
    script: redis::Script,
    /// `{prefix}:rl:{route}:{index}:` — the client's key is appended.
    key_prefix: String,
    interval_us: u64,
    tolerance_us: u64,
}

impl GlobalLimiter {
    pub(crate) fn new(
        link: Arc<Link>,
        key_prefix: String,
        requests: u64,
        per: Duration,
        burst: u64,
    ) -> Self {
        let requests = requests.max(1);
        let per_us = u64::try_from(per.as_micros()).unwrap_or(u64::MAX).max(1);
        let interval_us = (per_us / requests).max(1);
        let capacity = requests.saturating_add(burst);
        Self {
            link,
            script: redis::Script::new(GCRA),
            key_prefix,
            interval_us,
            tolerance_us: interval_us.saturating_mul(capacity - 1),
        }
    }

    /// The decision for the client `key` (an IP address or a digest of a header value);
    /// `None` when Redis could not decide (the caller falls back).
    pub async fn check(&self, key: &str) -> Option<Decision> {
        let mut bucket = String::with_capacity(self.key_prefix.len() + key.len());
        bucket.push_str(&self.key_prefix);
        bucket.push_str(key);
        let (allowed, ahead, retry): (u8, u64, u64) = self
            .link
            .call(|mut conn| {
                let script = &self.script;
                let bucket = &bucket;
                let (interval, tolerance) = (self.interval_us, self.tolerance_us);
                async move {
                    script
                        .key(bucket)
                        .arg(interval)
                        .arg(tolerance)
                        .invoke_async(&mut conn)
                        .await
                }
            })
            .await?;
        Some(self.decision(allowed == 1, ahead, retry))
    }

    fn decision(&self, allowed: bool, ahead_us: u64, retry_us: u64) -> Decision {
        let reset = Duration::from_micros(ahead_us);
        if !allowed {
            return Decision {
                allowed,
                remaining: 0,
                reset,
                retry_after: Duration::from_micros(retry_us),
            };
        }
        Decision {
            allowed,
            remaining: (self.tolerance_us + self.interval_us).saturating_sub(ahead_us)
                / self.interval_us,
            reset,
            retry_after: Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_and_retry_follow_the_local_limiter() {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let link = Arc::new(Link::new(
            client,
            Duration::from_millis(50),
            Default::default(),
            Default::default(),
            Default::default(),
        ));
        // 3 per second, no burst: interval 333_333 us, tolerance 666_666 us.
        let g = GlobalLimiter::new(link, "gw:rl:r:0:".into(), 3, Duration::from_secs(1), 0);
        let local = crate::gcra::Limiter::new(3, Duration::from_secs(1), 0);
        let k = local.value_key(b"k");
        for i in 1..=3u64 {
            let want = local.check_at(k, 0);
            let got = g.decision(true, i * g.interval_us, 0);
            assert_eq!(got.remaining, want.remaining, "request {i}");
        }
        let refused = g.decision(false, 3 * g.interval_us, g.interval_us + 1);
        assert!(!refused.allowed);
        assert_eq!(refused.remaining, 0);
        assert_eq!(refused.retry_after, Duration::from_micros(333_334));
    }
}
