//! The set of bound HTTP listeners and how a reload changes it: a listener whose bind address is
//! unchanged keeps its socket (and its open connections) and gets its new settings; removed
//! listeners stop accepting (their connections finish); new ones are bound. New sockets are all
//! bound before anything changes, so a reload that cannot bind leaves everything as it was.
//! An `http3` listener has a QUIC side on the same port (UDP), kept, reconfigured or drained
//! (GOAWAY) the same way; its TCP side then advertises it with `Alt-Svc`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::FutureExt as _;
use gateway_config::{Config, Listener};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::conn::{self, ListenerRuntime};
use super::h3::{self, QuicListener};
use super::policy::ListenerPolicy;
use super::service::ServiceSettings;
use super::tls::{self, CertSet};
use crate::error::GatewayError;
use crate::generation::Generation;
use crate::telemetry::{ListenerMetrics, Telemetry};

/// A bound listener.
pub struct BoundListener {
    /// The address it is bound to (the real port when configured with port 0).
    pub local: SocketAddr,
    /// The configured bind address.
    pub configured: SocketAddr,
    /// HTTP/1.1 and HTTP/2 over TCP; absent on an HTTP/3-only listener.
    tcp: Option<TcpSide>,
    /// HTTP/3 over QUIC, on the same port.
    quic: Option<QuicListener>,
}

/// The TCP side of a listener.
struct TcpSide {
    /// Settings used by new connections; swapped on reload.
    runtime: Arc<ArcSwap<ListenerRuntime>>,
    /// Stops the accept loop.
    stop: CancellationToken,
}

/// What a reload prepares for one listener before anything changes.
struct Prepared<'c> {
    listener: &'c Listener,
    /// Name of the bound listener it keeps the sockets of.
    reuse: Option<String>,
    tcp: Option<(Arc<ListenerRuntime>, Option<TcpListener>)>,
    quic: Option<(
        quinn::ServerConfig,
        Arc<h3::H3Runtime>,
        Option<std::net::UdpSocket>,
    )>,
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
    /// ACME certificates, OCSP staples and challenge answers (kept across reloads).
    pub certs: Arc<crate::certs::CertRegistry>,
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
        let certs = CertSet {
            files: tls::load_certificates(config)?,
            registry: cx.certs.clone(),
        };
        // Build every runtime and bind every new socket first; only then change anything.
        let mut prepared = Vec::new();
        for (index, l) in config.listeners.iter().enumerate() {
            if !(l.http1 || l.http2 || l.http3) {
                continue;
            }
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
            let kept = reuse.as_ref().and_then(|n| self.by_name.get(n));
            let (tcp_socket, udp_socket, port) = bind_missing(l, kept)?;
            let tcp = if l.http1 || l.http2 {
                let alt_svc = l.http3.then(|| h3::alt_svc(port));
                let runtime = runtime_for(config, index, l, &certs, cx, alt_svc)?;
                Some((runtime, tcp_socket))
            } else {
                None
            };
            let quic = if l.http3 {
                let (server, runtime) = h3::prepare(config, index, l, &certs, cx)?;
                Some((server, runtime, udp_socket))
            } else {
                None
            };
            prepared.push(Prepared {
                listener: l,
                reuse,
                tcp,
                quic,
            });
        }

        let mut next = HashMap::new();
        for p in prepared {
            let l = p.listener;
            let kept = p.reuse.and_then(|old| self.by_name.remove(&old));
            let (mut local, old_tcp, old_quic) = match kept {
                Some(k) => (Some(k.local), k.tcp, k.quic),
                None => (None, None, None),
            };
            let tcp = match (old_tcp, p.tcp) {
                (Some(side), Some((runtime, _))) => {
                    side.runtime.store(runtime);
                    Some(side)
                }
                (Some(side), None) => {
                    tracing::info!(listener = %l.name, "HTTP/1.1 and HTTP/2 turned off; open connections finish");
                    side.stop.cancel();
                    None
                }
                (None, Some((runtime, Some(socket)))) => {
                    let started = start(l, socket, runtime, cx)?;
                    local.get_or_insert(started.local);
                    Some(started.side)
                }
                (None, _) => None,
            };
            let quic = match (old_quic, p.quic) {
                (Some(q), Some((server, runtime, _))) => {
                    q.reconfigure(server, runtime);
                    Some(q)
                }
                (Some(q), None) => {
                    tracing::info!(listener = %l.name, "HTTP/3 turned off; its connections drain");
                    q.drain();
                    None
                }
                (None, Some((server, runtime, Some(socket)))) => {
                    let q = QuicListener::start(
                        socket,
                        server,
                        runtime,
                        cx.shutdown.child_token(),
                        &cx.acceptors,
                        cx.connections.clone(),
                    )?;
                    local.get_or_insert(q.local);
                    Some(q)
                }
                (None, _) => None,
            };
            let Some(local) = local else { continue };
            let bound = BoundListener {
                local,
                configured: l.addr,
                tcp,
                quic,
            };
            next.insert(l.name.clone(), bound);
        }
        for (name, old) in self.by_name.drain() {
            tracing::info!(listener = %name, addr = %old.local, "listener removed; open connections finish");
            old.stop();
        }
        self.by_name = next;
        Ok(())
    }

    /// Stops every accept loop; QUIC connections get GOAWAY.
    pub fn stop_all(&self) {
        for l in self.by_name.values() {
            l.stop();
        }
    }

    /// The QUIC endpoints, so shutdown can let their closing packets out.
    pub fn quic_endpoints(&self) -> Vec<quinn::Endpoint> {
        self.by_name
            .values()
            .filter_map(|l| l.quic.as_ref().map(|q| q.endpoint().clone()))
            .collect()
    }
}

impl BoundListener {
    fn stop(&self) {
        if let Some(t) = &self.tcp {
            t.stop.cancel();
        }
        if let Some(q) = &self.quic {
            q.drain();
        }
    }
}

/// Binds the sockets `l` needs that `kept` does not already have: TCP for HTTP/1.1 and HTTP/2,
/// UDP for HTTP/3, on one port. Returns them with that port.
fn bind_missing(
    l: &Listener,
    kept: Option<&BoundListener>,
) -> Result<(Option<TcpListener>, Option<std::net::UdpSocket>, u16), GatewayError> {
    let bind_error = |addr, source| GatewayError::Bind {
        what: format!("listener `{}`", l.name),
        addr,
        source,
    };
    let want_tcp = (l.http1 || l.http2) && kept.is_none_or(|k| k.tcp.is_none());
    let want_udp = l.http3 && kept.is_none_or(|k| k.quic.is_none());
    let mut addr = kept.map_or(l.addr, |k| SocketAddr::new(l.addr.ip(), k.local.port()));
    // With port 0 the TCP port is picked first; if that UDP port is taken, pick another.
    let attempts = if addr.port() == 0 && want_tcp && want_udp {
        16
    } else {
        1
    };
    for attempt in 1..=attempts {
        let tcp = match want_tcp {
            true => Some(stream_proxy::bind_tcp(addr).map_err(|e| bind_error(addr, e))?),
            false => None,
        };
        let mut udp_addr = addr;
        if let Some(t) = &tcp {
            udp_addr.set_port(t.local_addr().map_err(|e| bind_error(addr, e))?.port());
        }
        let udp = match want_udp {
            false => None,
            true => match h3::bind_udp(udp_addr) {
                Ok(u) => Some(u),
                Err(e) if attempt < attempts && e.kind() == std::io::ErrorKind::AddrInUse => {
                    continue;
                }
                Err(e) => return Err(bind_error(udp_addr, e)),
            },
        };
        let port = match &udp {
            Some(u) => u.local_addr().map_err(|e| bind_error(addr, e))?.port(),
            None => udp_addr.port(),
        };
        addr.set_port(port);
        return Ok((tcp, udp, port));
    }
    Err(bind_error(
        addr,
        std::io::Error::from(std::io::ErrorKind::AddrInUse),
    ))
}

fn runtime_for(
    config: &Config,
    index: usize,
    l: &Listener,
    certs: &CertSet,
    cx: &ListenerContext,
    alt_svc: Option<http::HeaderValue>,
) -> Result<Arc<ListenerRuntime>, GatewayError> {
    let tls = tls::server_config(config, index, l, certs)?.map(tokio_rustls::TlsAcceptor::from);
    let policy = Arc::new(ListenerPolicy::new(l, &cx.telemetry.registry));
    let fast_path = ListenerRuntime::fast_path_listener(
        &cx.telemetry.registry,
        &l.name,
        policy.hsts.as_ref(),
        alt_svc.as_ref(),
    );
    Ok(Arc::new(ListenerRuntime {
        name: Arc::from(l.name.as_str()),
        tls,
        http1: l.http1,
        http2: l.http2,
        builder: ListenerRuntime::hyper_builder(&l.settings),
        h1_builder: ListenerRuntime::http1_builder(&l.settings),
        http1_fast_path: l.settings.http1_fast_path,
        fast_path,
        max_head: ListenerRuntime::max_head(&l.settings),
        idle_timeout: l.settings.idle_timeout.get(),
        header_timeout: l.settings.header_read_timeout.get(),
        write_timeout: l.settings.write_timeout.get(),
        service: Arc::new(ServiceSettings {
            generation: cx.generation.clone(),
            policy,
            body_read_timeout: Some(l.settings.body_read_timeout.get()).filter(|d| !d.is_zero()),
            telemetry: cx.telemetry.clone(),
            alt_svc,
            http01: l.tls.is_none().then(|| cx.certs.challenges.clone()),
        }),
        accept_proxy_protocol: l.settings.accept_proxy_protocol,
        metrics: ListenerMetrics::new(&cx.telemetry.registry, &l.name),
    }))
}

/// A started TCP side and its bound address.
struct StartedTcp {
    local: SocketAddr,
    side: TcpSide,
}

fn start(
    l: &Listener,
    socket: TcpListener,
    runtime: Arc<ListenerRuntime>,
    cx: &ListenerContext,
) -> Result<StartedTcp, GatewayError> {
    let local = socket
        .local_addr()
        .map_err(|e| GatewayError::Internal(e.to_string()))?;
    let stop = cx.shutdown.child_token();
    let runtime = Arc::new(ArcSwap::new(runtime));
    let limit = (l.settings.max_connections > 0)
        .then(|| Arc::new(Semaphore::new(l.settings.max_connections)));
    // Every connection's deadlines and the drain stop: one table and sweeper per listener.
    let watchdog = conn::ConnWatchdog::start(stop.clone());
    cx.acceptors.spawn(accept_loop(
        runtime.clone(),
        socket,
        limit,
        stop.clone(),
        cx.connections.clone(),
        watchdog,
    ));
    tracing::info!(listener = %l.name, addr = %local, tls = l.tls.is_some(), "listening");
    Ok(StartedTcp {
        local,
        side: TcpSide { runtime, stop },
    })
}

/// The task that serves one accepted connection, counted in the listener's active gauge and the
/// process-wide connection count while it lives.
///
/// A combinator, not an `async` block awaiting `serve`: the block would hold `serve`'s future
/// twice over (captured, then moved to be awaited), and the stream, addresses and watch a third
/// time, in every connection's task. The closure's guards drop with the task however it ends.
fn connection_task(
    rt: Arc<ListenerRuntime>,
    stream: TcpStream,
    client: SocketAddr,
    local: SocketAddr,
    watch: conn::ConnWatch,
    permit: Option<OwnedSemaphorePermit>,
) -> impl Future<Output = ()> + Send + 'static {
    let active = rt.metrics.active.clone();
    active.add(1);
    let open = crate::memory::connection_opened();
    conn::serve(rt, stream, client, local, watch).map(move |()| {
        active.add(-1);
        drop((open, permit));
    })
}

/// Pause after a failed accept (out of file descriptors): short enough to serve again soon
/// after descriptors free up, long enough that a full table costs next to no CPU.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

async fn accept_loop(
    runtime: Arc<ArcSwap<ListenerRuntime>>,
    listener: TcpListener,
    limit: Option<Arc<Semaphore>>,
    stop: CancellationToken,
    connections: TaskTracker,
    watchdog: conn::ConnWatchdog,
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
                // EMFILE/ENFILE and friends: the pending connection stays in the backlog, so the
                // socket stays readable; back off instead of spinning on a full fd table.
                rt.metrics.accept_errors.inc();
                tracing::warn!(listener = %rt.name, error = %e, "accept failed; backing off");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
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
        let local = stream_proxy::accepted_local(&stream, local, client);
        // The watchdog delivers `stop`, a child of the gateway's drain token: connections drain
        // gracefully when the gateway stops or when a reload removes their listener (in-flight
        // requests finish).
        let watch = conn::watch(&watchdog, &rt);
        connections.spawn(connection_task(rt, stream, client, local, watch, permit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Largest future a connection's task may carry, in a debug build. tokio adds a header of
    /// its own and rounds the task up, and the allocator rounds again to a size class, so a
    /// little growth past this moves every connection's task into the next class.
    const TASK_FUTURE_LIMIT: usize = 352;

    #[test]
    fn a_connection_task_fits_its_size_class() {
        let (runtime, listener) = crate::fuzzing::test_listener();
        runtime.block_on(async {
            let accept = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = accept.local_addr().expect("address");
            let stream = TcpStream::connect(addr).await.expect("connect");
            let watchdog = conn::ConnWatchdog::start(CancellationToken::new());
            let watch = conn::watch(&watchdog, &listener);
            let task = connection_task(listener.clone(), stream, addr, addr, watch, None);
            let size = std::mem::size_of_val(&task);
            assert!(
                size <= TASK_FUTURE_LIMIT,
                "a connection's task future is {size} bytes, over {TASK_FUTURE_LIMIT}: \
                 docs/performance-log.md, \"Then: smaller connection tasks\", says what kept it \
                 small"
            );
        });
    }
}
