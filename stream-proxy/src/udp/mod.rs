//! UDP streams: one listening socket, a session per client address, each with its own connected
//! upstream socket (so replies are matched to the client by the kernel, and a target chosen by
//! the balancer keeps the whole session). Datagrams up to 64 KiB pass unchanged.
//!
//! A new client address goes through the filters' `on_connect` and the `max_connections` cap
//! (sessions) before a session is made; datagrams that cannot get a session are dropped and
//! counted, so a flood of source addresses costs at most the cap in sockets and tasks. When
//! draining, no session is created and the loop ends once the last session has expired.

mod session;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::filter::ConnectionInfo;
use crate::listener::Listening;
use crate::relay::Direction;
use crate::stats::StreamStats;
use crate::upstream::KeyHasher;
use session::{Session, SessionTask, Table};

/// Largest datagram relayed (the IPv4/IPv6 payload limit is just under this).
pub const MAX_DATAGRAM: usize = 64 * 1024;

/// Receives client datagrams until `hard` fires, or `stop` fired and no session is left.
pub(crate) async fn serve(
    socket: Arc<UdpSocket>,
    listening: Arc<Listening>,
    stop: CancellationToken,
    hard: CancellationToken,
    tasks: TaskTracker,
) {
    let table = Arc::new(Table::default());
    let local = socket.local_addr().ok();
    let stats = listening.stats.clone();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut draining = false;
    loop {
        if draining && table.is_empty() {
            return;
        }
        let (n, client) = tokio::select! {
            _ = hard.cancelled() => return,
            _ = stop.cancelled(), if !draining => { draining = true; continue }
            _ = table.left.notified(), if draining => continue,
            r = socket.recv_from(&mut buf) => match r {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::debug!(stream = %listening.name(), error = %e, "udp receive failed");
                    continue;
                }
            },
        };
        let session = match table.touch(client) {
            Some(s) if !s.is_closed() => Some(s),
            _ if draining => None,
            _ => {
                let ctx = NewSession {
                    socket: &socket,
                    table: &table,
                    listening: &listening,
                    local: local.unwrap_or(client),
                    hard: &hard,
                    tasks: &tasks,
                };
                ctx.create(client).await
            }
        };
        let Some(session) = session else {
            StreamStats::inc(&stats.datagrams_dropped);
            continue;
        };
        match session.upstream.send(&buf[..n]).await {
            Ok(_) => {
                StreamStats::inc(&stats.datagrams_in);
                session.progress.add(Direction::In, n);
            }
            Err(e) => {
                StreamStats::inc(&stats.datagrams_dropped);
                tracing::debug!(%client, error = %e, "udp send to target failed");
            }
        }
    }
}

struct NewSession<'a> {
    socket: &'a Arc<UdpSocket>,
    table: &'a Arc<Table>,
    listening: &'a Listening,
    local: SocketAddr,
    hard: &'a CancellationToken,
    tasks: &'a TaskTracker,
}

impl NewSession<'_> {
    /// A session for `client`, or `None` (counted) when the cap, a filter or the upstream says no.
    async fn create(&self, client: SocketAddr) -> Option<Arc<Session>> {
        let rt = self.listening.runtime();
        let stats = &self.listening.stats;
        let active = stats
            .udp_sessions_active
            .load(std::sync::atomic::Ordering::Relaxed);
        if rt.max_connections > 0 && active >= rt.max_connections as u64 {
            StreamStats::inc(&stats.connections_refused);
            return None;
        }
        let info = ConnectionInfo {
            stream: rt.name.clone(),
            protocol: rt.protocol,
            client,
            peer: client,
            local: self.local,
        };
        let Ok(filters) = rt.filters.connect(&info).await else {
            StreamStats::inc(&stats.filter_denials);
            return None;
        };
        let upstream = rt.upstream.clone()?;
        let mut key = KeyHasher::new();
        key.write_ip(client.ip());
        let Some(selection) = upstream.targets.select(key.finish(), &[]) else {
            StreamStats::inc(&stats.upstream_unavailable);
            return None;
        };
        let target = selection.target().addr;
        let socket = match connected_socket(target).await {
            Ok(s) => s,
            Err(e) => {
                // Debug, not warn: under a flood of sources (no cap, fd limit reached) this
                // would log once per datagram; `datagrams_dropped` counts it.
                tracing::debug!(stream = %rt.name, %target, error = %e, "cannot open a udp socket to the target");
                return None;
            }
        };
        let session = Arc::new(Session::new(socket, stats.clone()));
        self.table.insert(client, session.clone());
        StreamStats::inc(&stats.udp_sessions_created);
        StreamStats::inc(&stats.udp_sessions_active);
        crate::hooks::opened();
        let task = SessionTask {
            session: session.clone(),
            table: self.table.clone(),
            listener: self.socket.clone(),
            info,
            upstream,
            selection,
            idle: rt.idle_timeout,
            stats: stats.clone(),
        };
        let ids = filters.log_ids();
        self.tasks.spawn(crate::log_ids::scope(
            ids,
            task.run(filters, self.hard.clone()),
        ));
        Some(session)
    }
}

async fn connected_socket(target: SocketAddr) -> std::io::Result<UdpSocket> {
    let any: IpAddr = match target {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind(SocketAddr::new(any, 0)).await?;
    socket.connect(target).await?;
    Ok(socket)
}
