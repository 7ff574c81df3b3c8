//! An upstream at run time: its targets (balancer and health, shared with L4 streams through
//! [`stream_proxy::upstream::Targets`]), one connection pool per target (the target's
//! attachment, so it comes and goes with the target), the connector, and the settings requests
//! need, all built once per config generation. Host-name targets are resolved when the
//! generation is built, never during validation; with `resolve_every`, a background task
//! resolves them again off the request path and the set changes under the requests. A target
//! that leaves keeps its pool until its last request ends; its idle connections close with it.
//! [`Upstreams`] holds a generation's upstreams and their background tasks (idle reaping,
//! active health checks, name refreshes), which stop when the generation is dropped; requests
//! still in flight keep their upstream (and so its pools) alive through an `Arc`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gateway_config::{Config, HashKey};
use http::header::{self, HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use stream_proxy::upstream::resolve::{self, Lookup};
use stream_proxy::upstream::{Attacher, Attachment, KeyHasher, Selection, TargetSpec, Targets};
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
    resolve_every: Option<Duration>,
}

/// What a target's pool is made of besides its address, the same for every address of one
/// written target.
struct EndpointParts {
    server_name: rustls_pki_types::ServerName<'static>,
    host: HeaderValue,
    authority: Authority,
}

enum HashOn {
    ClientIp,
    Path,
    Header(HeaderName),
    Cookie(Box<str>),
}

impl Upstream {
    pub(crate) fn build(
        config: &Config,
        u: &gateway_config::Upstream,
        lookup: &Lookup,
    ) -> Result<Self, GatewayError> {
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
        // Checked for every written target now, so a target's pool cannot fail to be made when
        // its name resolves later.
        let mut parts = HashMap::with_capacity(u.targets.len());
        for (i, t) in u.targets.iter().enumerate() {
            let bad = |m: String| config.error(key(&format!("targets[{i}]")), m);
            let endpoint = EndpointParts {
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
            parts.insert(t.authority.clone(), endpoint);
        }
        let attacher: Attacher = Arc::new(move |spec: &TargetSpec| {
            let p = parts.get(&*spec.authority)?;
            let endpoint = Endpoint {
                addr: spec.addr,
                server_name: p.server_name.clone(),
                host: p.host.clone(),
                authority: p.authority.clone(),
            };
            let pool: Attachment = Arc::new(Arc::new(Pool::new(endpoint, limits)));
            Some(pool)
        });
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
            targets: Arc::new(Targets::from_config_with(u, lookup.clone(), Some(attacher))),
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
            resolve_every: s.resolve_every.map(|d| d.get()),
        })
    }

    /// The pool of a selected target.
    pub(crate) fn pool(selection: &Selection) -> Option<&Arc<Pool>> {
        selection.state().attachment::<Arc<Pool>>()
    }

    /// The pools of the targets now, in the targets' order.
    pub(crate) fn pools(&self) -> Vec<Arc<Pool>> {
        self.targets
            .current()
            .iter()
            .filter_map(|t| t.attachment::<Arc<Pool>>().cloned())
            .collect()
    }

    /// For each target now, in the targets' order, its id and how many of its pooled
    /// connections were closed for each [`Discard`] reason: `(reason label, count)`.
    pub(crate) fn discarded_connections(&self) -> Vec<(String, [(&'static str, u64); 2])> {
        self.targets
            .current()
            .iter()
            .filter_map(|t| {
                let pool = t.attachment::<Arc<Pool>>()?;
                let counts = Discard::ALL.map(|why| (why.label(), pool.discards(why)));
                Some((t.spec.id.to_string(), counts))
            })
            .collect()
    }

    /// The consistent-hash key of a request whose fields are a header map (0 for other
    /// balancers); see [`Self::key_by`].
    pub(crate) fn hash_key(&self, parts: &http::request::Parts, cx: &RequestCx) -> u64 {
        self.key_by(parts.uri.path(), cx.client_ip(), |name| {
            parts
                .headers
                .get_all(name)
                .iter()
                .map(HeaderValue::as_bytes)
        })
    }

    /// [`Self::hash_key`] read from a raw request head (the fast path's): `path` is the
    /// target's path without its query, `fields` the head's fields.
    pub(crate) fn hash_key_text(
        &self,
        path: &str,
        fields: &[httparse::Header<'_>],
        client: std::net::IpAddr,
    ) -> u64 {
        self.key_by(path, client, |name| {
            fields
                .iter()
                .filter(move |f| f.name.eq_ignore_ascii_case(name.as_str()))
                .map(|f| f.value)
        })
    }

    /// The one rule of the consistent-hash key, over a request's `path`, its client's address and
    /// `values`, the values of its fields of a name in order. A request without the configured
    /// header (its first value counts, as a header map's `get` finds it) or cookie falls back to
    /// its client's address, so it still sticks.
    fn key_by<'s, 'v, V>(
        &'s self,
        path: &str,
        client: std::net::IpAddr,
        values: impl Fn(&'s HeaderName) -> V,
    ) -> u64
    where
        V: Iterator<Item = &'v [u8]>,
    {
        let Some(on) = &self.hash_on else { return 0 };
        let mut h = KeyHasher::new();
        let value = match on {
            HashOn::ClientIp => None,
            HashOn::Path => Some(path.as_bytes()),
            HashOn::Header(name) => values(name).next(),
            HashOn::Cookie(name) => cookie(values(&COOKIE), name),
        };
        match value {
            Some(value) => h.write(value),
            None => h.write_ip(client),
        }
        h.finish()
    }

    /// Whether [`super::ProxyRoute::rewrite_text`] takes every request to this upstream: an
    /// HTTP/1.1 upstream.
    pub(crate) fn forwards_as_text(&self) -> bool {
        !self.connector.is_h2()
    }

    /// Connections open to each target (for tests and metrics).
    pub fn open_connections(&self) -> Vec<usize> {
        self.pools().iter().map(|p| p.open()).collect()
    }

    /// Idle keep-alive connections to each target.
    pub fn idle_connections(&self) -> Vec<usize> {
        self.pools().iter().map(|p| p.idle()).collect()
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
                    _ = shed.tick() => up.pools().iter().for_each(|p| p.shed_buffers()),
                    _ = reap.tick(), if reap_every.is_some() => {
                        up.pools().iter().for_each(|p| p.reap())
                    }
                }
            }
        });
        if let Some(every) = self.resolve_every {
            tokio::spawn(refresh_names(self.targets.clone(), every, cancel.clone()));
        }
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

/// Resolves `targets`' host names again every `every`, on a blocking thread (the system's
/// resolver blocks), until `cancel`.
async fn refresh_names(targets: Arc<Targets>, every: Duration, cancel: CancellationToken) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let t = targets.clone();
        // A lookup that hangs holds its thread, not this task's next tick past cancellation.
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::task::spawn_blocking(move || t.refresh()) => {}
        }
    }
}

/// The `Cookie` field's name, for [`Upstream::key_by`]'s lookups (a static: they borrow it).
static COOKIE: HeaderName = header::COOKIE;

/// The value of cookie `name` among a request's `Cookie` field values; a value that is not
/// visible ASCII is passed over, as `HeaderValue::to_str` refuses it.
fn cookie<'v>(values: impl Iterator<Item = &'v [u8]>, name: &str) -> Option<&'v [u8]> {
    values
        .filter(|v| v.iter().all(|&b| b == b'\t' || (b' '..=b'~').contains(&b)))
        .flat_map(|v| v.split(|&b| b == b';'))
        .filter_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            Some((&pair[..eq], &pair[eq + 1..]))
        })
        .find(|(k, _)| *k == name.as_bytes())
        .map(|(_, v)| v)
}

/// A generation's upstreams. Dropping it stops their background tasks.
pub struct Upstreams {
    by_name: HashMap<String, Arc<Upstream>>,
    background: CancellationToken,
}

impl Upstreams {
    /// Builds every upstream in `config`, resolving host names with the system's resolver.
    /// Nothing runs until [`Upstreams::start`].
    pub fn build(config: &Config) -> Result<Self, GatewayError> {
        Self::build_with(config, &resolve::system())
    }

    /// [`Upstreams::build`] with host names resolved by `lookup`, now and on each refresh.
    pub fn build_with(config: &Config, lookup: &Lookup) -> Result<Self, GatewayError> {
        let mut by_name = HashMap::with_capacity(config.upstreams.len());
        for (name, u) in &config.upstreams {
            by_name.insert(name.clone(), Arc::new(Upstream::build(config, u, lookup)?));
        }
        Ok(Self {
            by_name,
            background: CancellationToken::new(),
        })
    }

    /// Starts every upstream's background tasks (idle-connection reaping, active health
    /// checks, name refreshes) on the current Tokio runtime; they stop when `self` is dropped.
    pub fn start(&self) {
        self.by_name
            .values()
            .for_each(|up| up.spawn_background(&self.background));
    }

    /// Starts the background tasks of an upstream built outside the config's `upstreams:` (a
    /// `forward_auth` URL's), stopped with the others.
    pub(crate) fn start_private(&self, up: &Arc<Upstream>) {
        up.spawn_background(&self.background);
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

    /// The refresh task, with a lookup the test answers: a name that does not resolve at load
    /// leaves the upstream without targets (it still builds), later answers become targets with
    /// their pools, a failed lookup keeps them, and the task stops with its generation.
    #[tokio::test]
    async fn the_refresh_task_follows_the_names_answers_until_the_generation_goes() {
        use std::net::IpAddr;
        use std::sync::Mutex;
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

        let answer: Arc<Mutex<Option<Vec<IpAddr>>>> = Arc::new(Mutex::new(None));
        let calls = Arc::new(AtomicUsize::new(0));
        let lookup: Lookup = {
            let (answer, calls) = (answer.clone(), calls.clone());
            Arc::new(move |host| {
                assert_eq!(host, "app.internal");
                calls.fetch_add(1, Relaxed);
                let found = answer.lock().unwrap().clone();
                found.ok_or_else(|| std::io::Error::other("no such host"))
            })
        };
        let yaml =
            "upstreams:\n  app:\n    targets: [app.internal:8080]\n    resolve_every: 20ms\n";
        let config = gateway_config::load_str(yaml, "t.yaml", std::path::Path::new(".")).unwrap();
        let upstreams = Upstreams::build_with(&config, &lookup).unwrap();
        let up = upstreams.get("app").unwrap().clone();
        assert!(up.targets.is_empty());
        upstreams.start();

        let wait_for = |n: usize| {
            let up = up.clone();
            async move {
                for _ in 0..200 {
                    if up.targets.len() == n {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("never {n} targets: {:?}", up.targets.snapshot());
            }
        };
        let loopback: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
        *answer.lock().unwrap() = Some(loopback[..1].to_vec());
        wait_for(1).await;
        *answer.lock().unwrap() = Some(loopback.clone());
        wait_for(2).await;
        let addrs: Vec<_> = up.pools().iter().map(|p| p.endpoint.addr).collect();
        assert_eq!(
            addrs,
            [
                "127.0.0.1:8080".parse().unwrap(),
                "[::1]:8080".parse().unwrap()
            ]
        );
        assert_eq!(up.pools()[1].endpoint.host, "app.internal:8080");

        // Failures keep the last good set.
        *answer.lock().unwrap() = None;
        let before = up.targets.resolve_failures();
        while up.targets.resolve_failures() < before + 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(up.targets.len(), 2);

        drop(upstreams);
        tokio::time::sleep(Duration::from_millis(60)).await;
        let stopped = calls.load(Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            calls.load(Relaxed),
            stopped,
            "the task outlived its generation"
        );
    }

    /// A name that does not resolve when the config loads: the upstream is built without a
    /// target for it and its requests get `503` (no healthy target), not a failed start.
    #[tokio::test]
    async fn a_name_not_resolved_yet_is_answered_503() {
        let lookup: Lookup = Arc::new(|_| Err(std::io::Error::other("no such host")));
        let yaml = "upstreams:\n  app:\n    targets: [app.internal:8080]\n\
                    routes:\n  - match: { path_prefix: / }\n    proxy: { upstream: app }\n";
        let config = gateway_config::load_str(yaml, "t.yaml", std::path::Path::new(".")).unwrap();
        let upstreams = Upstreams::build_with(&config, &lookup).unwrap();
        let up = upstreams.get("app").unwrap().clone();
        assert_eq!((up.targets.len(), up.targets.resolve_failures()), (0, 1));
        let gateway_config::RouteAction::Proxy(p) = &config.routes[0].action else {
            panic!("not a proxy route");
        };
        let route = Arc::new(super::super::ProxyRoute::new(p, up));
        let fields = [httparse::Header {
            name: "host",
            value: b"example.com",
        }];
        let request = super::super::TextRequest {
            head: false,
            target: "/",
            path: "/",
            host: Some(b"example.com"),
            fields: &fields,
        };
        let ip: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let client = crate::connection::ClientText::new(ip, false);
        let fwd = route.rewrite_text(&request, &client, ip).unwrap();
        let replaced = super::super::Replaced {
            hsts: false,
            alt_svc: false,
        };
        let answer = route.forward_text(&fwd, replaced, &mut Vec::new()).await;
        let Err(res) = answer else {
            panic!("answered without a target");
        };
        assert_eq!(res.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    }

    /// The upstream `app` of a config with `hash_on`.
    fn hashed_on(hash_on: &str) -> Arc<Upstream> {
        let yaml = format!(
            "upstreams:\n  app:\n    targets: [127.0.0.1:9]\n    balance: consistent_hash\n\
             \x20   hash_on: {hash_on}\n\
             routes:\n  - match: {{ path_prefix: / }}\n    proxy: {{ upstream: app }}\n"
        );
        let config =
            gateway_config::load_str(&yaml, "t.yaml", std::path::Path::new(".")).expect("config");
        Upstreams::build(&config).expect("upstreams").by_name["app"].clone()
    }

    /// The balancer's key is the same read from a header map as from the raw head's fields, and
    /// a request without the header or cookie falls back to its client's address.
    #[test]
    fn the_key_is_one_rule_over_a_map_and_over_raw_fields() {
        let fields = [
            ("Host", "h"),
            ("X-User", "alice"),
            ("x-user", "bob"),
            ("Cookie", "theme=dark; session=s1"),
            ("cookie", "lang=en"),
        ];
        let raw: Vec<httparse::Header<'_>> = fields
            .iter()
            .map(|(name, value)| httparse::Header {
                name,
                value: value.as_bytes(),
            })
            .collect();
        let mut map = http::HeaderMap::new();
        for (name, value) in fields {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static(value),
            );
        }
        let (one, other): (std::net::IpAddr, std::net::IpAddr) =
            ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        for (hash_on, by_client) in [
            ("header:x-user", false),
            ("cookie:session", false),
            ("path", false),
            ("client_ip", true),
            ("header:x-absent", true),
            ("cookie:absent", true),
        ] {
            let up = hashed_on(hash_on);
            let from_map = |client| {
                up.key_by("/p", client, |name| {
                    map.get_all(name).iter().map(HeaderValue::as_bytes)
                })
            };
            assert_eq!(
                up.hash_key_text("/p", &raw, one),
                from_map(one),
                "{hash_on}"
            );
            assert_eq!(from_map(one) != from_map(other), by_client, "{hash_on}");
        }
        // The first `X-User` counts, as a map's `get` finds it.
        let up = hashed_on("header:x-user");
        let alice = [httparse::Header {
            name: "x-user",
            value: b"alice",
        }];
        assert_eq!(
            up.hash_key_text("/p", &raw, one),
            up.hash_key_text("/", &alice, other)
        );
    }

    #[test]
    fn cookie_lookup() {
        let values = || [&b"a=1; session=abc"[..], b"b=2", b"caf\xc3\xa9=1; x=y"].into_iter();
        assert_eq!(cookie(values(), "session"), Some(&b"abc"[..]));
        assert_eq!(cookie(values(), "b"), Some(&b"2"[..]));
        assert_eq!(cookie(values(), "sess"), None);
        // A value that is not visible ASCII is passed over whole.
        assert_eq!(cookie(values(), "x"), None);
    }
}
