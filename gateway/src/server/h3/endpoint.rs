//! The QUIC side of a listener: one quinn endpoint on the listener's UDP port (quinn-udp does
//! GSO/GRO and batched I/O), its transport settings, the accept loop with the connection cap,
//! and what a reload changes (settings for new connections) or stops (a drain).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_config::model::{CongestionControl, Http3Settings};
use quinn::congestion::{BbrConfig, CubicConfig, NewRenoConfig};
use quinn::{IdleTimeout, TransportConfig, VarInt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::GatewayError;
use crate::telemetry::ListenerMetrics;

/// Per-listener settings QUIC connections use, built on every (re)load.
pub struct H3Runtime {
    /// Listener name.
    pub name: Arc<str>,
    /// QUIC connection counters (`transport="quic"`).
    pub metrics: ListenerMetrics,
    /// What every connection's service shares: the generation, limits, response headers and
    /// telemetry.
    pub service: Arc<crate::server::service::ServiceSettings>,
    /// Largest request head (QPACK-decoded field section) accepted.
    pub max_field_section: u64,
    /// Time allowed for the handshake.
    pub handshake_timeout: Duration,
    /// 0-RTT early data is accepted.
    pub early_data: bool,
    /// Concurrent QUIC connections allowed; 0 means unlimited.
    pub max_connections: usize,
}

/// The quinn server config (TLS plus transport) for one listener.
pub(super) fn server_config(
    tls: rustls::ServerConfig,
    settings: &Http3Settings,
    listener_idle: Duration,
) -> Result<quinn::ServerConfig, String> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| format!("TLS settings unusable for QUIC: {e}"))?;
    let mut transport = TransportConfig::default();
    let window = |size: gateway_config::ByteSize| {
        VarInt::from_u64(size.bytes()).map_err(|_| "window too large".to_owned())
    };
    let idle = settings.idle_timeout.map_or(listener_idle, |d| d.get());
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(settings.max_concurrent_streams))
        // h3 needs three (control, QPACK encoder and decoder); a few spare for extensions.
        .max_concurrent_uni_streams(VarInt::from_u32(8))
        .stream_receive_window(window(settings.stream_receive_window)?)
        .receive_window(window(settings.connection_receive_window)?)
        .max_idle_timeout(Some(
            IdleTimeout::try_from(idle).map_err(|_| "idle_timeout too long".to_owned())?,
        ));
    transport.congestion_controller_factory(match settings.congestion_control {
        CongestionControl::Cubic => Arc::new(CubicConfig::default()),
        CongestionControl::Bbr => Arc::new(BbrConfig::default()),
        CongestionControl::NewReno => Arc::new(NewRenoConfig::default()),
    });
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(Arc::new(transport));
    Ok(server)
}

/// Binds the UDP socket of a QUIC listener. No SO_REUSEADDR: on Linux it would let a second
/// process share the port and split the datagrams.
pub fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A running QUIC endpoint.
pub struct QuicListener {
    /// Bound address.
    pub local: SocketAddr,
    endpoint: quinn::Endpoint,
    runtime: Arc<ArcSwap<H3Runtime>>,
    /// Cancelled to drain: the accept loop stops and every connection gets GOAWAY.
    drain: CancellationToken,
}

impl QuicListener {
    /// Starts serving on `socket`. Connections drain when `drain` is cancelled.
    pub fn start(
        socket: std::net::UdpSocket,
        config: quinn::ServerConfig,
        runtime: Arc<H3Runtime>,
        drain: CancellationToken,
        acceptors: &TaskTracker,
        connections: TaskTracker,
    ) -> Result<Self, GatewayError> {
        let runtime_io = quinn::default_runtime()
            .ok_or_else(|| GatewayError::Internal("no async runtime for QUIC".into()))?;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(config),
            socket,
            runtime_io,
        )
        .map_err(|e| GatewayError::Internal(format!("QUIC endpoint: {e}")))?;
        let local = endpoint
            .local_addr()
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        tracing::info!(listener = %runtime.name, addr = %local, "listening (HTTP/3 over QUIC)");
        let runtime = Arc::new(ArcSwap::new(runtime));
        acceptors.spawn(accept_loop(
            endpoint.clone(),
            runtime.clone(),
            local,
            drain.clone(),
            connections,
        ));
        Ok(Self {
            local,
            endpoint,
            runtime,
            drain,
        })
    }

    /// New settings for new connections; open ones keep theirs.
    pub fn reconfigure(&self, config: quinn::ServerConfig, runtime: Arc<H3Runtime>) {
        self.endpoint.set_server_config(Some(config));
        self.runtime.store(runtime);
    }

    /// Stops accepting and sends GOAWAY on every connection; they close once their requests
    /// finish. The UDP socket is released when the last one has closed.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// The endpoint, to wait for its closing packets on shutdown.
    pub fn endpoint(&self) -> &quinn::Endpoint {
        &self.endpoint
    }
}

/// Counts a connection as open for the cap and the gauge until dropped.
struct Open {
    count: Arc<AtomicUsize>,
    metrics: ListenerMetrics,
    _process_wide: crate::memory::OpenConnection,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.metrics.active.add(-1);
    }
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    runtime: Arc<ArcSwap<H3Runtime>>,
    local: SocketAddr,
    drain: CancellationToken,
    connections: TaskTracker,
) {
    // Outlives reloads (the runtime is swapped), so a lowered cap counts open connections.
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        let incoming = tokio::select! {
            _ = drain.cancelled() => break,
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
        };
        let rt = runtime.load_full();
        if rt.max_connections > 0 && open.load(Ordering::Relaxed) >= rt.max_connections {
            rt.metrics.refused.inc();
            tracing::debug!(listener = %rt.name, client = %incoming.remote_address(), "QUIC connection limit reached; refusing");
            incoming.refuse();
            continue;
        }
        open.fetch_add(1, Ordering::Relaxed);
        rt.metrics.accepted.inc();
        rt.metrics.active.add(1);
        let guard = Open {
            count: open.clone(),
            metrics: rt.metrics.clone(),
            _process_wide: crate::memory::connection_opened(),
        };
        let token = drain.clone();
        connections.spawn(async move {
            super::conn::serve(rt, incoming, local, token).await;
            drop(guard);
        });
    }
    // Handshakes that arrive from now on are refused instead of waiting for an accept.
    endpoint.set_server_config(None);
}
