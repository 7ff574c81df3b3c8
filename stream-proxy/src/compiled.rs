//! The per-generation form of the `streams:` section: every stream with its upstreams resolved
//! to the generation's shared [`Targets`] (the same balancer and health state the HTTP proxy
//! uses), its SNI table compiled and its filter factories built. Built once when a config
//! loads; a connection holds the `Arc<CompiledStream>` it was accepted with until it ends, so a
//! reload never changes a connection midway.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gateway_config::model::{
    ProxyProtocolVersion, SniFallback, StreamConfig, StreamFilterConfig, StreamProtocol,
};
use gateway_config::{Config, Stream};

use crate::StreamError;
use crate::filter::{
    CidrFilterFactory, ConnectionRate, ConnectionRateFactory, FilterChain, StreamFilterFactory,
};
use crate::sni::SniRoutes;
use crate::upstream::Targets;

/// What the gateway supplies when streams are built: the generation's upstream targets and
/// the factories for `plugin:` filters (proxy-wasm network filters live in the gateway, which
/// this crate does not depend on).
pub trait Resolver {
    /// The targets of upstream `name`, shared with the HTTP proxy.
    fn targets(&self, upstream: &str) -> Option<Arc<Targets>>;

    /// The factory for a `plugin: NAME` stream filter, or why there is none.
    fn plugin(&self, name: &str) -> Result<Arc<dyn StreamFilterFactory>, String> {
        let _ = name;
        Err("plugin stream filters are not available in this build".into())
    }

    /// A filter put first on every stream, so it sees every connection and session the
    /// stream's own filters see, including the ones they refuse: the gateway's tracing turns
    /// its `on_close` summary into a span. It should not inspect data (that would turn off
    /// splice). `None`, the default, adds nothing.
    fn observer(&self) -> Option<Arc<dyn StreamFilterFactory>> {
        None
    }
}

/// An upstream as a stream uses it.
#[derive(Debug)]
pub struct StreamUpstream {
    /// Name in the config.
    pub name: Arc<str>,
    /// Targets with their balancer and health.
    pub targets: Arc<Targets>,
    /// Time allowed for the TCP handshake with one target.
    pub connect_timeout: Duration,
}

/// One stream, ready for connections.
#[derive(Debug)]
pub struct CompiledStream {
    /// Name.
    pub name: Arc<str>,
    /// Configured bind address (port 0: any).
    pub addr: SocketAddr,
    /// TCP or UDP.
    pub protocol: StreamProtocol,
    /// `upstream:` (the SNI fallback when `sni_routes` are set).
    pub upstream: Option<Arc<StreamUpstream>>,
    /// `sni_routes:`, compiled.
    pub sni_routes: SniRoutes<Arc<StreamUpstream>>,
    /// What to do without an SNI match.
    pub sni_fallback: SniFallback,
    /// Header sent to the upstream.
    pub proxy_protocol: ProxyProtocolVersion,
    /// Expect a header from the client side.
    pub accept_proxy_protocol: bool,
    /// No bytes either way (TCP) or no datagram (UDP) for this long ends it; zero: never.
    pub idle_timeout: Duration,
    /// Time allowed for the PROXY header and the ClientHello.
    pub header_timeout: Duration,
    /// Concurrent connections (TCP) or sessions (UDP); 0: unlimited.
    pub max_connections: usize,
    /// Relay with splice(2) when no filter inspects data.
    pub zero_copy: bool,
    /// Filters.
    pub filters: FilterChain,
}

/// A generation's streams.
#[derive(Debug, Default, Clone)]
pub struct CompiledStreams {
    /// In config order.
    pub streams: Vec<Arc<CompiledStream>>,
}

impl CompiledStreams {
    /// Builds every stream of `config`; errors carry the key path to locate them.
    pub fn build(config: &Config, resolver: &dyn Resolver) -> Result<Self, StreamError> {
        let streams = config
            .streams
            .iter()
            .enumerate()
            .map(|(i, s)| CompiledStream::build(config, s, &format!("streams[{i}]"), resolver))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            streams: streams.into_iter().map(Arc::new).collect(),
        })
    }
}

impl CompiledStream {
    fn build(
        config: &Config,
        s: &Stream,
        key: &str,
        resolver: &dyn Resolver,
    ) -> Result<Self, StreamError> {
        // Validated by the config crate: references exist, UDP streams have no SNI routes
        // and no PROXY protocol.
        let st: &StreamConfig = &s.settings;
        let err = |k: String, m: &str| StreamError::Config {
            key: k,
            message: m.into(),
        };
        let upstream = |name: &str, k: String| {
            let targets = resolver
                .targets(name)
                .ok_or_else(|| err(k.clone(), "no such upstream"))?;
            let connect_timeout = config
                .upstreams
                .get(name)
                .map_or(Duration::from_secs(2), |u| u.settings.connect_timeout.get());
            Ok::<_, StreamError>(Arc::new(StreamUpstream {
                name: Arc::from(name),
                targets,
                connect_timeout,
            }))
        };
        let main = st
            .upstream
            .as_deref()
            .map(|u| upstream(u, format!("{key}.upstream")))
            .transpose()?;
        let mut sni = Vec::with_capacity(st.sni_routes.len());
        for (host, u) in &st.sni_routes {
            sni.push((
                host.clone(),
                upstream(u, format!("{key}.sni_routes.{host}"))?,
            ));
        }
        Ok(Self {
            name: Arc::from(st.name.as_str()),
            addr: s.addr,
            protocol: st.protocol,
            upstream: main,
            sni_routes: SniRoutes::new(sni),
            sni_fallback: st.sni_fallback,
            proxy_protocol: st.proxy_protocol,
            accept_proxy_protocol: st.accept_proxy_protocol,
            idle_timeout: st.idle_timeout.get(),
            header_timeout: st.header_read_timeout.get(),
            max_connections: st.max_connections,
            zero_copy: st.zero_copy,
            filters: build_filters(s, st.protocol, key, resolver)?,
        })
    }
}

fn build_filters(
    s: &Stream,
    protocol: StreamProtocol,
    key: &str,
    resolver: &dyn Resolver,
) -> Result<FilterChain, StreamError> {
    let mut factories: Vec<Arc<dyn StreamFilterFactory>> = Vec::with_capacity(s.filters.len() + 1);
    factories.extend(resolver.observer());
    for (j, f) in s.filters.iter().enumerate() {
        let fkey = format!("{key}.filters[{j}]");
        factories.push(match f {
            StreamFilterConfig::Allow(nets) => Arc::new(CidrFilterFactory::allow(nets)),
            StreamFilterConfig::Deny(nets) => Arc::new(CidrFilterFactory::deny(nets)),
            StreamFilterConfig::ConnectionRate(r) => {
                Arc::new(ConnectionRateFactory(Arc::new(ConnectionRate::new(r))))
            }
            StreamFilterConfig::Plugin(name) => {
                let factory = resolver
                    .plugin(name)
                    .map_err(|message| StreamError::Config {
                        key: format!("{fkey}.plugin"),
                        message,
                    })?;
                if protocol == StreamProtocol::Udp && factory.inspects_data() {
                    return Err(StreamError::Config {
                        key: format!("{fkey}.plugin"),
                        message: "network filters that inspect data need TCP".into(),
                    });
                }
                factory
            }
        });
    }
    Ok(FilterChain::new(factories))
}
