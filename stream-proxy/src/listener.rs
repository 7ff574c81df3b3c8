//! A bound stream socket and its accept loop. The socket outlives config generations: a reload
//! that keeps a stream's protocol and bind address swaps the [`CompiledStream`] the next
//! connections use, and keeps the socket and the counters.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_config::model::StreamProtocol;
use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::StreamError;
use crate::compiled::CompiledStream;
use crate::stats::StreamStats;
use crate::watchdog::{Idle, Watchdog};

/// What a running stream's connections share.
pub(crate) struct Listening {
    runtime: ArcSwap<CompiledStream>,
    pub(crate) stats: Arc<StreamStats>,
}

impl Listening {
    pub(crate) fn new(rt: Arc<CompiledStream>) -> Self {
        Self {
            runtime: ArcSwap::new(rt),
            stats: Arc::new(StreamStats::default()),
        }
    }

    /// The compiled stream new connections use.
    pub(crate) fn runtime(&self) -> Arc<CompiledStream> {
        self.runtime.load_full()
    }

    pub(crate) fn swap(&self, rt: Arc<CompiledStream>) {
        self.runtime.store(rt);
    }

    pub(crate) fn name(&self) -> Arc<str> {
        self.runtime.load().name.clone()
    }
}

/// A bound socket, before its loop starts.
pub(crate) enum Bound {
    Tcp(TcpListener),
    Udp(Arc<UdpSocket>),
}

impl Bound {
    /// Binds `rt`'s address (SO_REUSEADDR, a deep accept backlog, large UDP buffers).
    pub(crate) fn bind(rt: &CompiledStream) -> Result<Self, StreamError> {
        let err = |source| StreamError::Bind {
            stream: rt.name.to_string(),
            addr: rt.addr,
            source,
        };
        let (kind, proto) = match rt.protocol {
            StreamProtocol::Tcp => (socket2::Type::STREAM, socket2::Protocol::TCP),
            StreamProtocol::Udp => (socket2::Type::DGRAM, socket2::Protocol::UDP),
        };
        let socket = bound_socket(rt.addr, kind, proto).map_err(err)?;
        match rt.protocol {
            StreamProtocol::Tcp => listen(socket).map(Self::Tcp).map_err(err),
            StreamProtocol::Udp => {
                // Bursts from many clients queue here while the loop works; the kernel caps
                // the request at net.core.rmem_max.
                let _ = socket.set_recv_buffer_size(4 << 20);
                UdpSocket::from_std(socket.into())
                    .map(|s| Self::Udp(Arc::new(s)))
                    .map_err(err)
            }
        }
    }

    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Self::Tcp(l) => l.local_addr(),
            Self::Udp(s) => s.local_addr(),
        }
    }

    /// Starts the loop: TCP accept loops are tracked in `acceptors` (they end when `stop`
    /// fires); connections, UDP receive loops and sessions in `tasks`.
    pub(crate) fn serve(
        self,
        listening: Arc<Listening>,
        stop: CancellationToken,
        hard: CancellationToken,
        acceptors: &TaskTracker,
        tasks: &TaskTracker,
    ) {
        match self {
            Self::Tcp(listener) => {
                acceptors.spawn(accept_loop(listener, listening, stop, hard, tasks.clone()));
            }
            Self::Udp(socket) => {
                tasks.spawn(crate::udp::serve(
                    socket,
                    listening,
                    stop,
                    hard,
                    tasks.clone(),
                ));
            }
        }
    }
}

/// A TCP listener on `addr` as every listening socket of the gateway is made: SO_REUSEADDR
/// (a restart binds while old connections linger in TIME_WAIT), IPv6 sockets v6-only (so
/// `[::]` and `0.0.0.0` can be bound side by side), non-blocking, a deep accept backlog,
/// `TCP_NODELAY` for the connections it accepts. The HTTP listeners and the admin API use it too.
pub fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    listen(bound_socket(
        addr,
        socket2::Type::STREAM,
        socket2::Protocol::TCP,
    )?)
}

fn bound_socket(
    addr: SocketAddr,
    kind: socket2::Type,
    proto: socket2::Protocol,
) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), kind, Some(proto))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

fn listen(socket: socket2::Socket) -> std::io::Result<TcpListener> {
    // Linux copies a listener's TCP options into every socket it accepts, so setting it here
    // saves each connection its own `setsockopt` ([`accepted_nodelay`]).
    socket.set_tcp_nodelay(true)?;
    socket.listen(4096)?;
    TcpListener::from_std(socket.into())
}

/// Makes an accepted TCP stream send small writes at once. On Linux it already does: it
/// inherited `TCP_NODELAY` from its listener ([`bind_tcp`]).
pub fn accepted_nodelay(stream: &tokio::net::TcpStream) {
    if cfg!(not(target_os = "linux")) {
        let _ = stream.set_nodelay(true);
    }
}

/// The local address of a stream accepted by a listener bound to `bound`. A socket bound to
/// one address accepts only on it: the kernel is asked (a syscall per connection) only for
/// wildcard binds.
pub fn accepted_local(
    stream: &tokio::net::TcpStream,
    bound: Option<SocketAddr>,
    peer: SocketAddr,
) -> SocketAddr {
    match bound {
        Some(b) if !b.ip().is_unspecified() => b,
        _ => stream.local_addr().ok().or(bound).unwrap_or(peer),
    }
}

async fn accept_loop(
    listener: TcpListener,
    listening: Arc<Listening>,
    stop: CancellationToken,
    hard: CancellationToken,
    tasks: TaskTracker,
) {
    let bound = listener.local_addr().ok();
    // Every connection's idle deadline and the drain stop (`hard`).
    let watchdog = Watchdog::<Idle>::start(hard);
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => r,
        };
        let (io, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning on a full fd table.
                tracing::warn!(stream = %listening.name(), error = %e, "accept failed; backing off");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let rt = listening.runtime();
        let stats = listening.stats.clone();
        // Only this loop admits connections, so check-then-increment cannot overshoot.
        let active = stats.connections_active.load(Relaxed);
        if rt.max_connections > 0 && active >= rt.max_connections as u64 {
            StreamStats::inc(&stats.connections_refused);
            tracing::debug!(stream = %rt.name, %peer, "max_connections reached; refusing");
            continue;
        }
        StreamStats::inc(&stats.connections_accepted);
        let guard = Active::new(stats.clone());
        let local = accepted_local(&io, bound, peer);
        // Boxed: the connection's future is a few KiB, and tokio moves a task's future whole
        // when it stores it at spawn and replaces it with the output at the end. Behind a box,
        // those moves are of a pointer.
        let conn = Box::pin(crate::tcp::serve(
            io,
            peer,
            local,
            rt,
            stats,
            watchdog.register(Idle::unarmed()),
        ));
        tasks.spawn(async move {
            conn.await;
            drop(guard);
        });
    }
}

/// Counts a connection as active until dropped (also if its task is cancelled).
struct Active(Arc<StreamStats>);

impl Active {
    fn new(stats: Arc<StreamStats>) -> Self {
        StreamStats::inc(&stats.connections_active);
        crate::hooks::opened();
        Self(stats)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        StreamStats::dec(&self.0.connections_active);
        crate::hooks::closed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_streams_have_nodelay_without_a_call_of_their_own() {
        let listener = bind_tcp("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        accepted_nodelay(&accepted);
        assert!(accepted.nodelay().expect("getsockopt"));
        // The client's socket was not set: the option is the listener's, not the system's.
        assert!(!client.nodelay().expect("getsockopt"));
    }
}
