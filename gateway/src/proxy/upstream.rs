//! An upstream at run time: its targets (balancer and health, shared with L4 streams through
//! [`stream_proxy::upstream::Targets`]), one connection pool per target, the connector, and the
//! settings requests need, all built once per config generation. [`Upstreams`] holds a
//! generation's upstreams and their background tasks (idle reaping, active health checks),
//! which stop when the generation is dropped; requests still in flight keep their upstream (and
//! so its pools) alive through an `Arc`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gateway_config::{Config, HashKey};
use http::header::{self, HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use stream_proxy::upstream::{KeyHasher, Targets};
use tokio_util::sync::CancellationToken;

use super::connect::Connector;
use super::pool::{Discard, Endpoint, Limits, Pool};
use crate::context::RequestCx;
use crate::error::GatewayError;

/// One upstream, ready for requests.
pub struct Upstream {
    /// Name in the config.
    pub name: Arc<str>,
    /// Targets with their balancer, health and counters.
    pub targets: Arc<Targets>,
    pub(crate) pools: Box<[Arc<Pool>]>,
    pub(crate) connector: Connector,
    /// `http` or `https`, for HTTP/2 `:scheme`.
    pub(crate) scheme: Scheme,
    /// Whole-response deadline per attempt; `None` when configured as 0.
    pub(crate) timeout: Option<Duration>,
    pub(crate) retries: u32,
    /// Retries sent to another target (for metrics).
    pub retries_total: std::sync::atomic::AtomicU64,
    /// Answers of the targets that count as their failures (`health_check.passive.statuses`).
    pub(crate) counted_statuses: super::outcome::CountedStatuses,
    hash_on: Option<HashOn>,
    health: gateway_config::model::HealthCheckConfig,
    idle_timeout: Duration,
}

enum HashOn {
    ClientIp,
    Path,
    Header(HeaderName),
    Cookie(Box<str>),
}

impl Upstream {
    fn build(config: &Config, u: &gateway_config::Upstream) -> Result<Self, GatewayError> {
        let key = |k: &str| format!("upstreams.{}.{k}", u.name);
        let s = &u.settings;
        let connector = Connector::new(s.protocol, s.tls.as_ref(), s.connect_timeout.get())
            .map_err(|(k, m)| config.error(key(k), m))?;
        let tls = s.tls.clone().unwrap_or_default();
        let limits = Limits {
            max_idle: if s.pool.idle_timeout.get().is_zero() {
                0
            } else {
                s.pool.max_idle_per_target
            },
            max_open: s.pool.max_connections_per_target,
        };
        let mut pools = Vec::with_capacity(u.targets.len());
        for (i, t) in u.targets.iter().enumerate() {
            let bad = |m: String| config.error(key(&format!("targets[{i}]")), m);
            let endpoint = Endpoint {
                addr: t.addr,
                server_name: super::tls::server_name(&tls, &t.authority).map_err(|m| {
                    if tls.server_name.is_some() {
                        config.error(key("tls.server_name"), m)
                    } else {
                        bad(m)
                    }
                })?,
                host: HeaderValue::from_str(&t.authority).map_err(|e| bad(e.to_string()))?,
                authority: Authority::try_from(t.authority.as_str())
                    .map_err(|e| bad(e.to_string()))?,
            };
            pools.push(Arc::new(Pool::new(endpoint, limits)));
        }
        let hash_on = u.hash_on.as_ref().map(|h| match h {
            HashKey::ClientIp => HashOn::ClientIp,
            HashKey::Path => HashOn::Path,
            // Validated as a header name when the config was loaded.
            HashKey::Header(n) => {
                HeaderName::from_bytes(n.as_bytes()).map_or(HashOn::ClientIp, HashOn::Header)
            }
            HashKey::Cookie(n) => HashOn::Cookie(n.as_str().into()),
        });
        let hash_on = (s.balance == gateway_config::model::Balance::ConsistentHash)
            .then_some(hash_on)
            .flatten();
        Ok(Self {
            name: Arc::from(u.name.as_str()),
            targets: Arc::new(Targets::from_config(u)),
            pools: pools.into(),
            scheme: if s.tls.is_some()
                || s.protocol == gateway_config::model::UpstreamProtocol::Http2
            {
                Scheme::HTTPS
            } else {
                Scheme::HTTP
            },
            connector,
            timeout: Some(s.timeout.get()).filter(|t| !t.is_zero()),
            retries: s.retries,
            retries_total: std::sync::atomic::AtomicU64::new(0),
            counted_statuses: super::outcome::CountedStatuses::new(
                &s.health_check.passive.statuses,
            ),
            hash_on,
            health: s.health_check.clone(),
            idle_timeout: s.pool.idle_timeout.get(),
        })
    }

    /// For each target, in the targets' order, how many of its pooled connections were closed
    /// for each [`Discard`] reason: `(reason label, count)`.
    pub(crate) fn discarded_connections(
        &self,
    ) -> impl Iterator<Item = [(&'static str, u64); 2]> + '_ {
        self.pools
            .iter()
            .map(|pool| Discard::ALL.map(|why| (why.label(), pool.discards(why))))
    }

    /// The consistent-hash key of a request (0 for other balancers). A request without the
    /// configured header or cookie falls back to its client's address, so it still sticks.
    pub(crate) fn hash_key(&self, parts: &http::request::Parts, cx: &RequestCx) -> u64 {
        let Some(on) = &self.hash_on else { return 0 };
        let mut h = KeyHasher::new();
        let found = match on {
            HashOn::ClientIp => false,
            HashOn::Path => {
                h.write(parts.uri.path().as_bytes());
                true
            }
            HashOn::Header(name) => parts.headers.get(name).is_some_and(|v| {
                h.write(v.as_bytes());
                true
            }),
            HashOn::Cookie(name) => cookie(&parts.headers, name).is_some_and(|v| {
                h.write(v.as_bytes());
                true
            }),
        };
        if !found {
            h.write_ip(cx.client_ip());
        }
        h.finish()
    }

    /// [`Self::hash_key`] read from a raw request head (the fast path's): `path` is the
    /// target's path without its query, `fields` the head's fields. `None` when the key is a
    /// cookie, which is read from the general path's header map only.
    pub(crate) fn hash_key_text(
        &self,
        path: &str,
        fields: &[httparse::Header<'_>],
        client: std::net::IpAddr,
    ) -> Option<u64> {
        let Some(on) = &self.hash_on else {
            return Some(0);
        };
        let mut h = KeyHasher::new();
        let found = match on {
            HashOn::ClientIp => false,
            HashOn::Path => {
                h.write(path.as_bytes());
                true
            }
            // The first line with the name, as a header map's `get` finds it.
            HashOn::Header(name) => fields
                .iter()
                .find(|f| f.name.eq_ignore_ascii_case(name.as_str()))
                .is_some_and(|f| {
                    h.write(f.value);
                    true
                }),
            HashOn::Cookie(_) => return None,
        };
        if !found {
            h.write_ip(client);
        }
        Some(h.finish())
    }

    /// Whether [`super::ProxyRoute::rewrite_text`] takes every request to this upstream: an
    /// HTTP/1.1 upstream that does not balance by a cookie.
    pub(crate) fn forwards_as_text(&self) -> bool {
        !self.connector.is_h2() && !matches!(self.hash_on, Some(HashOn::Cookie(_)))
    }

    /// Connections open to each target (for tests and metrics).
    pub fn open_connections(&self) -> Vec<usize> {
        self.pools.iter().map(|p| p.open()).collect()
    }

    /// Idle keep-alive connections to each target.
    pub fn idle_connections(&self) -> Vec<usize> {
        self.pools.iter().map(|p| p.idle()).collect()
    }

    fn spawn_background(self: &Arc<Self>, cancel: &CancellationToken) {
        let (up, cancel_pools) = (self.clone(), cancel.clone());
        // Without an idle timeout nothing is reaped; the buffers are still shed.
        let reap_every = (!self.idle_timeout.is_zero())
            .then(|| (self.idle_timeout / 2).max(Duration::from_millis(50)));
        tokio::spawn(async move {
            let mut shed = tokio::time::interval(super::pool::SHED_EVERY);
            // Without a period the branch below is disabled and this interval never polled.
            let mut reap = tokio::time::interval(reap_every.unwrap_or(super::pool::SHED_EVERY));
            shed.tick().await;
            reap.tick().await;
            loop {
                tokio::select! {
                    _ = cancel_pools.cancelled() => return,
                    _ = shed.tick() => up.pools.iter().for_each(|p| p.shed_buffers()),
                    _ = reap.tick(), if reap_every.is_some() => {
                        up.pools.iter().for_each(|p| p.reap())
                    }
                }
            }
        });
        if let Some(path) = &self.health.path {
            tokio::spawn(super::health::run(
                self.clone(),
                path.clone(),
                self.health.clone(),
                cancel.clone(),
            ));
        }
    }
}

/// The value of cookie `name` among the request's `Cookie` headers.
fn cookie<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A generation's upstreams. Dropping it stops their background tasks.
pub struct Upstreams {
    by_name: HashMap<String, Arc<Upstream>>,
    background: CancellationToken,
}

impl Upstreams {
    /// Builds every upstream in `config`. Nothing runs until [`Upstreams::start`].
    pub fn build(config: &Config) -> Result<Self, GatewayError> {
        let mut by_name = HashMap::with_capacity(config.upstreams.len());
        for (name, u) in &config.upstreams {
            by_name.insert(name.clone(), Arc::new(Upstream::build(config, u)?));
        }
        Ok(Self {
            by_name,
            background: CancellationToken::new(),
        })
    }

    /// Starts every upstream's background tasks (idle-connection reaping, active health
    /// checks) on the current Tokio runtime; they stop when `self` is dropped.
    pub fn start(&self) {
        self.by_name
            .values()
            .for_each(|up| up.spawn_background(&self.background));
    }

    /// An upstream by name.
    pub fn get(&self, name: &str) -> Option<&Arc<Upstream>> {
        self.by_name.get(name)
    }

    /// Every upstream, for metrics.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.by_name.values()
    }
}

impl Drop for Upstreams {
    fn drop(&mut self) {
        self.background.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_lookup() {
        let mut h = http::HeaderMap::new();
        h.append(header::COOKIE, "a=1; session=abc".parse().unwrap());
        h.append(header::COOKIE, "b=2".parse().unwrap());
        assert_eq!(cookie(&h, "session"), Some("abc"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "sess"), None);
    }
}
