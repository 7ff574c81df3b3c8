//! The set of bound HTTP listeners and how a reload changes it: a listener whose bind address is
//! unchanged keeps its socket (and its open connections) and gets its new settings; removed
//! listeners stop accepting (their connections finish); new ones are bound. New sockets are all
//! bound before anything changes, so a reload that cannot bind leaves everything as it was.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_config::{Config, Listener};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::conn::{self, ListenerRuntime};
use super::tls::{self, LoadedCert};
use crate::error::GatewayError;
use crate::generation::Generation;
use crate::telemetry::{ListenerMetrics, Telemetry};

/// A bound listener.
pub struct BoundListener {
    /// The address it is bound to (the real port when configured with port 0).
    pub local: SocketAddr,
    /// The configured bind address.
    pub configured: SocketAddr,
    /// Settings used by new connections; swapped on reload.
    runtime: Arc<ArcSwap<ListenerRuntime>>,
    /// Stops the accept loop.
    stop: CancellationToken,
}

/// Everything the listeners share.
pub struct ListenerContext {
    /// The live generation.
    pub generation: Arc<ArcSwap<Generation>>,
    /// Metrics and access log.
    pub telemetry: Arc<Telemetry>,
    /// Cancelled when the gateway drains.
    pub shutdown: CancellationToken,
    /// Tracks connections, so draining can wait for them.
    pub connections: TaskTracker,
    /// Tracks accept loops.
    pub acceptors: TaskTracker,
}

/// Listeners by name.
#[derive(Default)]
pub struct ListenerSet {
    by_name: HashMap<String, BoundListener>,
}

impl ListenerSet {
    /// The bound address of a listener.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.by_name.get(name).map(|l| l.local)
    }

    /// Makes the set match `config`: keep, rebind, add, remove.
    pub fn apply(&mut self, config: &Config, cx: &ListenerContext) -> Result<(), GatewayError> {
        let certs = tls::load_certificates(config)?;
        let wanted: Vec<(usize, &Listener)> = config
            .listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| l.http1 || l.http2)
            .collect();

        // Build every runtime and bind every new socket first; only then change anything.
        let mut prepared = Vec::new();
        for (index, l) in &wanted {
            let runtime = runtime_for(config, *index, l, &certs, cx)?;
            let reuse = self
                .by_name
                .iter()
                .find(|(_, b)| l.addr.port() != 0 && (b.configured == l.addr || b.local == l.addr))
                .map(|(name, _)| name.clone())
                .or_else(|| {
                    self.by_name
                        .get(&l.name)
                        .filter(|b| b.configured == l.addr)
                        .map(|_| l.name.clone())
                });
            let socket = match &reuse {
                Some(_) => None,
                None => Some(bind_tcp(l.addr).map_err(|source| GatewayError::Bind {
                    what: format!("listener `{}`", l.name),
                    addr: l.addr,
                    source,
                })?),
            };
            prepared.push((l.name.clone(), l, runtime, reuse, socket));
        }

        let mut next = HashMap::new();
        for (name, l, runtime, reuse, socket) in prepared {
            let bound = match (reuse.and_then(|old| self.by_name.remove(&old)), socket) {
                (Some(kept), _) => {
                    kept.runtime.store(runtime);
                    kept
                }
                (None, Some(socket)) => start(l, socket, runtime, cx)?,
                (None, None) => continue,
            };
            next.insert(name, bound);
        }
        for (name, old) in self.by_name.drain() {
            tracing::info!(listener = %name, addr = %old.local, "listener removed; open connections finish");
            old.stop.cancel();
        }
        self.by_name = next;
        Ok(())
    }

    /// Stops every accept loop.
    pub fn stop_all(&self) {
        for l in self.by_name.values() {
            l.stop.cancel();
        }
    }
}

fn runtime_for(
    config: &Config,
    index: usize,
    l: &Listener,
    certs: &HashMap<String, Arc<LoadedCert>>,
    cx: &ListenerContext,
) -> Result<Arc<ListenerRuntime>, GatewayError> {
    let tls = tls::server_config(config, index, l, certs)?.map(tokio_rustls::TlsAcceptor::from);
    Ok(Arc::new(ListenerRuntime {
        name: Arc::from(l.name.as_str()),
        tls,
        http1: l.http1,
        http2: l.http2,
        builder: ListenerRuntime::hyper_builder(&l.settings),
        idle_timeout: l.settings.idle_timeout.get(),
        header_timeout: l.settings.header_read_timeout.get(),
        max_uri: l.settings.max_uri_length.as_usize(),
        accept_proxy_protocol: l.settings.accept_proxy_protocol,
        generation: cx.generation.clone(),
        telemetry: cx.telemetry.clone(),
        metrics: ListenerMetrics::new(&cx.telemetry.registry, &l.name),
    }))
}

fn start(
    l: &Listener,
    socket: TcpListener,
    runtime: Arc<ListenerRuntime>,
    cx: &ListenerContext,
) -> Result<BoundListener, GatewayError> {
    let local = socket
        .local_addr()
        .map_err(|e| GatewayError::Internal(e.to_string()))?;
    let stop = cx.shutdown.child_token();
    let runtime = Arc::new(ArcSwap::new(runtime));
    let limit = (l.settings.max_connections > 0)
        .then(|| Arc::new(Semaphore::new(l.settings.max_connections)));
    cx.acceptors.spawn(accept_loop(
        runtime.clone(),
        socket,
        limit,
        stop.clone(),
        cx.connections.clone(),
    ));
    tracing::info!(listener = %l.name, addr = %local, tls = l.tls.is_some(), "listening");
    Ok(BoundListener {
        local,
        configured: l.addr,
        runtime,
        stop,
    })
}

/// Binds a TCP listener with SO_REUSEADDR and a deep backlog.
pub fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    TcpListener::from_std(socket.into())
}

async fn accept_loop(
    runtime: Arc<ArcSwap<ListenerRuntime>>,
    listener: TcpListener,
    limit: Option<Arc<Semaphore>>,
    stop: CancellationToken,
    connections: TaskTracker,
) {
    let local = listener.local_addr().ok();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => r,
        };
        let rt = runtime.load_full();
        let (stream, client): (TcpStream, SocketAddr) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // EMFILE/ENFILE and friends: back off instead of spinning on a full fd table.
                tracing::warn!(listener = %rt.name, error = %e, "accept failed; backing off");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match &limit {
            None => None,
            Some(sem) => match sem.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    rt.metrics.refused.inc();
                    tracing::debug!(listener = %rt.name, %client, "connection limit reached; refusing");
                    drop(stream);
                    continue;
                }
            },
        };
        rt.metrics.accepted.inc();
        let local = stream.local_addr().ok().or(local).unwrap_or(client);
        // `stop` is a child of the gateway's drain token: connections drain gracefully when the
        // gateway stops or when a reload removes their listener (in-flight requests finish).
        let token = stop.clone();
        connections.spawn(async move {
            let active = rt.metrics.active.clone();
            active.add(1);
            conn::serve(rt, stream, client, local, token).await;
            active.add(-1);
            drop(permit);
        });
    }
}
