//! Starting, running and draining the gateway: bind every listener of a generation, accept
//! connections, and on shutdown stop accepting, let in-flight work finish (bounded by
//! `server.drain_timeout`) and return.

pub mod conn;
pub mod idle;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_config::Config;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::GatewayError;
use crate::generation::Generation;
use conn::ListenerRuntime;

/// A running gateway.
pub struct Gateway {
    generation: Arc<ArcSwap<Generation>>,
    addrs: HashMap<String, SocketAddr>,
    shutdown: CancellationToken,
    connections: TaskTracker,
    acceptors: TaskTracker,
    drain_timeout: Duration,
}

impl Gateway {
    /// Builds the first generation from `config`, binds every listener and starts serving.
    pub async fn start(config: Config) -> Result<Self, GatewayError> {
        let config = Arc::new(config);
        let generation = Arc::new(ArcSwap::from_pointee(Generation::build(config.clone())?));
        let certs = tls::load_certificates(&config)?;
        let shutdown = CancellationToken::new();
        let connections = TaskTracker::new();
        let acceptors = TaskTracker::new();
        let mut addrs = HashMap::new();

        for (index, l) in config.listeners.iter().enumerate() {
            if !(l.http1 || l.http2) {
                continue;
            }
            let listener = bind_tcp(l.addr).map_err(|source| GatewayError::Bind {
                what: format!("listener `{}`", l.name),
                addr: l.addr,
                source,
            })?;
            let local = listener
                .local_addr()
                .map_err(|e| GatewayError::Internal(e.to_string()))?;
            addrs.insert(l.name.clone(), local);
            let tls =
                tls::server_config(&config, index, l, &certs)?.map(tokio_rustls::TlsAcceptor::from);
            let rt = Arc::new(ListenerRuntime {
                name: Arc::from(l.name.as_str()),
                index,
                tls,
                http1: l.http1,
                http2: l.http2,
                builder: ListenerRuntime::hyper_builder(&l.settings),
                idle_timeout: l.settings.idle_timeout.get(),
                header_timeout: l.settings.header_read_timeout.get(),
                max_uri: l.settings.max_uri_length.as_usize(),
                generation: generation.clone(),
            });
            let limit = (l.settings.max_connections > 0)
                .then(|| Arc::new(Semaphore::new(l.settings.max_connections)));
            acceptors.spawn(accept_loop(
                rt,
                listener,
                limit,
                shutdown.clone(),
                connections.clone(),
            ));
            tracing::info!(listener = %l.name, addr = %local, tls = l.tls.is_some(), "listening");
        }
        acceptors.close();
        Ok(Self {
            generation,
            addrs,
            shutdown,
            connections,
            acceptors,
            drain_timeout: config.server.drain_timeout.get(),
        })
    }

    /// The bound address of a listener (useful with port 0).
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.addrs.get(name).copied()
    }

    /// The generation currently serving.
    pub fn generation(&self) -> Arc<Generation> {
        self.generation.load_full()
    }

    /// A token that starts the drain when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops accepting, waits for in-flight connections (up to the drain timeout), returns.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.acceptors.wait().await;
        self.connections.close();
        if tokio::time::timeout(self.drain_timeout, self.connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.connections.len(),
                "drain timeout reached; closing the remaining connections"
            );
        }
    }

    /// Serves until SIGINT or SIGTERM, then drains.
    pub async fn run_until_signal(self) {
        wait_for_signal().await;
        tracing::info!("shutting down: draining connections");
        self.shutdown().await;
        tracing::info!("stopped");
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install SIGTERM handler");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
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
    rt: Arc<ListenerRuntime>,
    listener: TcpListener,
    limit: Option<Arc<Semaphore>>,
    shutdown: CancellationToken,
    connections: TaskTracker,
) {
    let local = listener.local_addr().ok();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
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
                    tracing::debug!(listener = %rt.name, %client, "connection limit reached; refusing");
                    drop(stream);
                    continue;
                }
            },
        };
        let local = stream.local_addr().ok().or(local).unwrap_or(client);
        let rt = rt.clone();
        let token = shutdown.clone();
        connections.spawn(async move {
            conn::serve(rt, stream, client, local, token).await;
            drop(permit);
        });
    }
}
