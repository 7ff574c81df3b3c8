//! `rate-limit`: a per-key fixed-window rate limiter. The key is a header's value (e.g. an API
//! key) or the client's IP address; counts live in shared data, updated with compare-and-swap,
//! so every worker's VM (and every route using the plugin) shares one budget per key. Over the
//! budget: 429 with `retry-after`. Every response carries `x-ratelimit-remaining`.
//!
//! Config: `{"requests": 100, "window_seconds": 60, "key": "header:x-api-key"}` (`key`
//! defaults to `client_ip`; a request without the header is limited by client IP).

use std::rc::Rc;

use gateway_plugin_sdk::{Filter, Flow, Reply, Request, Response, now_unix, shared};
use serde::Deserialize;

#[derive(Deserialize)]
struct Config {
    requests: u64,
    #[serde(default = "minute")]
    window_seconds: u64,
    #[serde(default = "client_ip")]
    key: String,
}

fn minute() -> u64 {
    60
}
fn client_ip() -> String {
    "client_ip".into()
}

struct RateLimit {
    config: Rc<Config>,
    remaining: Option<u64>,
}

/// Takes one request from the key's budget: `Ok(remaining)` or `Err(seconds to wait)`.
fn take(key: &str, c: &Config, now: u64) -> Result<u64, u64> {
    let window = c.window_seconds.max(1);
    let current = now / window;
    let slot = format!("rate-limit/{key}");
    loop {
        // Value: "WINDOW COUNT" (one entry per key, reset when the window moves on).
        let (count, version) = match shared::get(&slot) {
            Some((v, version)) => {
                let text = String::from_utf8_lossy(&v).into_owned();
                let mut it = text.split(' ').map(|n| n.parse::<u64>().unwrap_or(0));
                let (w, n) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
                (if w == current { n } else { 0 }, version)
            }
            None => (0, 0),
        };
        if count >= c.requests {
            return Err(window - now % window);
        }
        let value = format!("{current} {}", count + 1);
        if shared::set(&slot, value.as_bytes(), version) {
            return Ok(c.requests - count - 1);
        }
    }
}

impl Filter for RateLimit {
    type Config = Config;

    fn create(config: &Rc<Config>) -> Self {
        Self { config: config.clone(), remaining: None }
    }

    fn on_request(&mut self, req: &mut Request) -> Flow {
        let c = &self.config;
        let key = match c.key.strip_prefix("header:") {
            Some(h) => req.header(h).map(|v| format!("h:{v}")),
            None => None,
        }
        .unwrap_or_else(|| format!("ip:{}", req.client_ip()));
        match take(&key, c, now_unix()) {
            Ok(remaining) => {
                self.remaining = Some(remaining);
                Flow::Continue
            }
            Err(wait) => Flow::Reply(
                Reply::new(429)
                    .header("retry-after", &wait.to_string())
                    .header("x-ratelimit-remaining", "0")
                    .body("too many requests\n"),
            ),
        }
    }

    fn on_response(&mut self, res: &mut Response) -> Flow {
        if let Some(r) = self.remaining {
            res.set_header("x-ratelimit-remaining", &r.to_string());
        }
        Flow::Continue
    }
}

gateway_plugin_sdk::export_filter!(RateLimit);
