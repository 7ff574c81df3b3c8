//! A config generation: everything built from one validated config (router, terminals, filter
//! factories, TLS settings). Built whole before it is used; requests hold an `Arc` to the
//! generation they started on, so a reload never changes a request midway.

use std::sync::Arc;

use gateway_config::{AuthService, Config, Filter, RouteAction};

use crate::cluster::Cluster;
use crate::error::GatewayError;
use crate::filter::{Chain, FilterFactory, HeadersFilterFactory};
use crate::proxy::{Upstream, Upstreams};
use crate::router::{Matcher, Router};
use crate::telemetry::stream_observer::observed;
use crate::telemetry::{RouteMetrics, Telemetry};
use crate::terminal::{Respond, Terminal};
use crate::wasm::{Plugins, WasmFilterFactory, WasmStreamFilterFactory};

/// One route, compiled.
pub struct CompiledRoute {
    /// Route name (for logs, metrics, traces).
    pub name: Arc<str>,
    /// Filters.
    pub chain: Chain,
    /// Terminal.
    pub terminal: Terminal,
    /// Request counters and latency.
    pub metrics: RouteMetrics,
}

/// Everything a request needs, built from one config.
pub struct Generation {
    /// The validated config it was built from.
    pub config: Arc<Config>,
    /// Routes per listener.
    pub router: Router<CompiledRoute>,
    /// `Server` header value, if any.
    pub server_header: Option<http::HeaderValue>,
    /// Upstreams with their pools, one set per generation, shared by the routes naming them.
    /// Dropping the generation stops their background tasks.
    pub upstreams: Upstreams,
    /// Listener names in config order (a listener's index in the router).
    pub listener_names: Vec<Arc<str>>,
    /// Requests no route matched.
    pub unrouted: RouteMetrics,
    /// L4 streams, using the same upstream targets (balancers, health) as the routes.
    pub streams: stream_proxy::CompiledStreams,
    /// Wasm plugins (their VMs and file watchers live as long as the generation).
    pub plugins: Plugins,
    /// The connection to other instances (`cluster:`), shared with the previous generation
    /// when its settings are unchanged.
    pub cluster: Option<Arc<Cluster>>,
    /// The response caches by name, shared with the previous generation (objects included).
    pub caches: indexmap::IndexMap<String, Arc<crate::filter::cache::store::Store>>,
}

/// Whether building a generation also sets its machinery going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// Serving: the cluster connects, upstreams reap idle connections and run health checks,
    /// plugin files are watched.
    Serve,
    /// Checking only (`gateway validate`): every part is built as for serving, so every error
    /// serving would meet is found, and nothing connects or runs.
    Check,
}

impl Generation {
    /// Builds a generation and starts what it runs in the background (inside a Tokio
    /// runtime); any failure is located in the config file.
    pub fn build(config: Arc<Config>, telemetry: &Telemetry) -> Result<Self, GatewayError> {
        Self::assemble(config, telemetry, Purpose::Serve)
    }

    /// Builds a generation as [`Generation::build`] does, to find the errors serving it would
    /// meet, without starting anything: no Redis connection, no task, no runtime needed. The
    /// result is inert; dropping it is all it is for.
    pub fn check(config: Arc<Config>, telemetry: &Telemetry) -> Result<Self, GatewayError> {
        Self::assemble(config, telemetry, Purpose::Check)
    }

    fn assemble(
        config: Arc<Config>,
        telemetry: &Telemetry,
        purpose: Purpose,
    ) -> Result<Self, GatewayError> {
        let cluster = match &config.cluster {
            Some(c) => Some(
                match purpose {
                    Purpose::Serve => Cluster::get_or_start(&telemetry.registry, c),
                    Purpose::Check => Cluster::checked(&telemetry.registry, c),
                }
                .map_err(|m| config.error("cluster.redis", m))?,
            ),
            None => None,
        };
        let lookup = stream_proxy::upstream::resolve::system();
        let upstreams = Upstreams::build_with(&config, &lookup)?;
        let caches: indexmap::IndexMap<_, _> = config
            .caches
            .iter()
            .map(|(name, c)| {
                let store = crate::filter::cache::store::get_or_insert(
                    &telemetry.registry,
                    name,
                    c.memory.as_usize(),
                );
                (name.clone(), store)
            })
            .collect();
        for (name, c) in &config.caches {
            if let Some(disk) = &c.disk {
                match purpose {
                    Purpose::Serve => crate::filter::cache::disk::prepare(&disk.path),
                    Purpose::Check => crate::filter::cache::disk::check(&disk.path),
                }
                .map_err(|m| config.error(format!("caches.{name}.disk.path"), m))?;
            }
        }
        let plugins = Plugins::build(&config, &upstreams, cluster.as_ref())?;
        let mut routes = Vec::with_capacity(config.routes.len());
        let mut watched = Vec::new();
        let mut private_upstreams = Vec::new();
        for (i, route) in config.routes.iter().enumerate() {
            let key = format!("routes[{i}]");
            let matcher =
                Matcher::new(route).map_err(|m| config.error(format!("{key}.match"), m))?;
            // Before the filters: the cache revalidates in the background through it.
            let terminal = match &route.action {
                RouteAction::Respond(r) => Terminal::Respond(Arc::new(
                    Respond::new(r, !route.filters.is_empty(), route.filters.is_empty())
                        .map_err(|m| config.error(format!("{key}.respond"), m))?,
                )),
                RouteAction::Static(s) => Terminal::Static(Arc::new(
                    crate::static_files::StaticFiles::new(s)
                        .map_err(|m| config.error(format!("{key}.static"), m))?,
                )),
                RouteAction::Redirect(r) => Terminal::Redirect(Arc::new(
                    crate::terminal::Redirect::new(&route.name, r, &telemetry.registry),
                )),
                RouteAction::Proxy(p) => crate::proxy::terminal(
                    &config,
                    &format!("{key}.proxy"),
                    &route.name,
                    p,
                    &upstreams,
                    &telemetry.registry,
                )?,
            };
            let mut factories: Vec<Arc<dyn FilterFactory>> = Vec::new();
            for (j, filter) in route.filters.iter().enumerate() {
                let fkey = format!("{key}.filters[{j}]");
                match filter {
                    Filter::Headers(h) => {
                        factories.push(Arc::new(
                            HeadersFilterFactory::new(h).map_err(|m| config.error(fkey, m))?,
                        ));
                    }
                    Filter::BasicAuth(b) => {
                        let f = Arc::new(
                            crate::filter::BasicAuthFilterFactory::new(
                                &route.name,
                                b,
                                b.htpasswd
                                    .strip_prefix(&config.base_dir)
                                    .unwrap_or(&b.htpasswd),
                                &telemetry.registry,
                            )
                            .map_err(|m| config.error(format!("{fkey}.basic_auth.htpasswd"), m))?,
                        );
                        watched.push(f.clone());
                        factories.push(f);
                    }
                    Filter::ForwardAuth(fa) => {
                        let service = match &fa.service {
                            AuthService::Upstream(name) => {
                                upstreams.get(name).cloned().ok_or_else(|| {
                                    config.error(
                                        format!("{fkey}.forward_auth.upstream"),
                                        "no such upstream",
                                    )
                                })?
                            }
                            AuthService::Url(u) => {
                                let up = Arc::new(Upstream::build(&config, u, &lookup)?);
                                private_upstreams.push(up.clone());
                                up
                            }
                        };
                        factories.push(Arc::new(
                            crate::filter::ForwardAuthFilterFactory::new(
                                &route.name,
                                fa,
                                service,
                                &telemetry.registry,
                            )
                            .map_err(|m| config.error(format!("{fkey}.forward_auth"), m))?,
                        ));
                    }
                    Filter::Rewrite(rw) => {
                        factories.push(Arc::new(
                            crate::filter::RewriteFilterFactory::new(
                                &route.name,
                                rw,
                                &telemetry.registry,
                            )
                            .map_err(|m| config.error(format!("{fkey}.rewrite"), m))?,
                        ));
                    }
                    Filter::Plugin(name) => {
                        let handle = plugins.get(name).ok_or_else(|| {
                            config.error(format!("{fkey}.plugin"), "no such plugin")
                        })?;
                        factories.push(Arc::new(WasmFilterFactory::new(handle.clone())));
                    }
                    Filter::Waf(name) => {
                        let policy = config.waf.get(name).ok_or_else(|| {
                            config.error(format!("{fkey}.waf"), "no such WAF policy")
                        })?;
                        factories.push(Arc::new(
                            crate::filter::WafFilterFactory::new(policy, &telemetry.registry)
                                .map_err(|m| config.error(format!("{fkey}.waf"), m))?,
                        ));
                    }
                    Filter::Cors(cors) => {
                        factories.push(Arc::new(
                            crate::filter::CorsFilterFactory::new(
                                &route.name,
                                cors,
                                &telemetry.registry,
                            )
                            .map_err(|m| config.error(format!("{fkey}.cors"), m))?,
                        ));
                    }
                    Filter::Cache(cfg) => {
                        let store = caches.get(&cfg.settings.store).cloned().ok_or_else(|| {
                            config.error(format!("{fkey}.cache.store"), "no such cache")
                        })?;
                        factories.push(Arc::new(crate::filter::CacheFilterFactory::new(
                            cfg,
                            store,
                            terminal.clone(),
                            &telemetry.registry,
                        )));
                    }
                    Filter::Compress(cfg) => {
                        factories.push(Arc::new(crate::filter::CompressFilterFactory::new(
                            &route.name,
                            cfg,
                            &telemetry.registry,
                        )));
                    }
                    Filter::Jwt(jwt) => {
                        factories.push(Arc::new(
                            crate::filter::JwtFilterFactory::new(
                                jwt,
                                &route.name,
                                &telemetry.registry,
                                purpose == Purpose::Serve,
                            )
                            .map_err(|m| config.error(format!("{fkey}.jwt"), m))?,
                        ));
                    }
                    Filter::RateLimit { settings, key } => {
                        factories.push(Arc::new(
                            crate::filter::RateLimitFilterFactory::new(
                                &route.name,
                                j,
                                settings,
                                key,
                                &telemetry.registry,
                                cluster.as_ref(),
                            )
                            .map_err(|m| config.error(format!("{fkey}.rate_limit"), m))?,
                        ));
                    }
                }
            }
            let chain = Chain::new(factories);
            routes.push((
                matcher,
                route.listeners.clone(),
                CompiledRoute {
                    name: Arc::from(route.name.as_str()),
                    chain,
                    terminal,
                    metrics: RouteMetrics::new(&telemetry.registry, &route.name),
                },
            ));
        }
        let resolver = StreamResolver(&upstreams, &plugins);
        let resolver = observed(&resolver, &config, telemetry);
        let streams =
            stream_proxy::CompiledStreams::build(&config, &resolver).map_err(|e| match e {
                stream_proxy::StreamError::Config { key, message } => config.error(key, message),
                other => config.error("streams", other.to_string()),
            })?;
        let server_header = match config.server.server_header.as_str() {
            "" => None,
            v => Some(
                http::HeaderValue::from_str(v)
                    .map_err(|e| config.error("server.server_header", e.to_string()))?,
            ),
        };
        // Only once everything is built: a build that fails leaves nothing running.
        if purpose == Purpose::Serve {
            upstreams.start();
            private_upstreams
                .iter()
                .for_each(|u| upstreams.start_private(u));
            if let Some(c) = &cluster {
                for u in upstreams.iter() {
                    c.watch_health(&u.targets);
                }
            }
            plugins.watch();
            watched.iter().for_each(|f| f.watch());
            for (name, store) in &caches {
                let c = &config.caches[name];
                store.resize(c.memory.as_usize());
                if let Err(e) = store.set_disk(name, c.disk.as_ref(), &telemetry.registry) {
                    tracing::error!(cache = %name, error = %e, "cache disk tier not started");
                }
            }
        }
        Ok(Self {
            router: Router::new(config.listeners.len(), routes),
            listener_names: config
                .listeners
                .iter()
                .map(|l| Arc::from(l.name.as_str()))
                .collect(),
            unrouted: RouteMetrics::new(&telemetry.registry, ""),
            config,
            server_header,
            upstreams,
            streams,
            plugins,
            cluster,
            caches,
        })
    }

    /// The router index of a listener, by name (indices change across reloads; names do not).
    pub fn listener_index(&self, name: &str) -> Option<usize> {
        self.listener_names.iter().position(|n| &**n == name)
    }
}

/// What streams take from a generation: its upstreams' targets, shared with the HTTP proxy so
/// health learnt on one side applies to the other.
struct StreamResolver<'a>(&'a Upstreams, &'a Plugins);

impl stream_proxy::Resolver for StreamResolver<'_> {
    fn targets(&self, upstream: &str) -> Option<Arc<stream_proxy::upstream::Targets>> {
        self.0.get(upstream).map(|u| u.targets.clone())
    }

    fn plugin(&self, name: &str) -> Result<Arc<dyn stream_proxy::StreamFilterFactory>, String> {
        let handle = self.1.get(name).ok_or("no such plugin")?;
        Ok(Arc::new(WasmStreamFilterFactory::new(handle.clone())))
    }
}
