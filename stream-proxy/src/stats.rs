//! Per-stream counters as plain atomics, for the observability work to export (Prometheus,
//! admin API) without this crate knowing either. A stream keeps its counters across reloads
//! as long as its socket is kept. Counters only grow; `*_active` are gauges.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of one stream.
#[derive(Debug, Default)]
pub struct StreamStats {
    /// TCP connections accepted (and admitted by `max_connections`).
    pub connections_accepted: AtomicU64,
    /// TCP connections or UDP sessions refused by `max_connections`.
    pub connections_refused: AtomicU64,
    /// TCP connections open now.
    pub connections_active: AtomicU64,
    /// Connections or sessions refused by a stream filter (allow, deny, connection_rate, plugin).
    pub filter_denials: AtomicU64,
    /// Connections closed because a filter's data hook asked for it.
    pub filter_closes: AtomicU64,
    /// Connections closed for a bad PROXY protocol header or ClientHello, or no route.
    pub bad_handshakes: AtomicU64,
    /// Connections or sessions with no target to go to (all down or refusing).
    pub upstream_unavailable: AtomicU64,
    /// Connections closed by the idle timeout.
    pub idle_timeouts: AtomicU64,
    /// Bytes from clients to upstreams (TCP payload or UDP datagrams).
    pub bytes_in: AtomicU64,
    /// Bytes from upstreams to clients.
    pub bytes_out: AtomicU64,
    /// UDP sessions opened.
    pub udp_sessions_created: AtomicU64,
    /// UDP sessions open now.
    pub udp_sessions_active: AtomicU64,
    /// UDP sessions ended by the idle timeout.
    pub udp_sessions_expired: AtomicU64,
    /// UDP datagrams from clients to upstreams.
    pub datagrams_in: AtomicU64,
    /// UDP datagrams from upstreams to clients.
    pub datagrams_out: AtomicU64,
    /// UDP datagrams dropped (no session could be made, or a socket error).
    pub datagrams_dropped: AtomicU64,
}

impl StreamStats {
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn dec(counter: &AtomicU64) {
        counter.fetch_sub(1, Relaxed);
    }

    /// A copy of every counter, for tests and reports.
    pub fn snapshot(&self) -> StreamStatsSnapshot {
        let g = |c: &AtomicU64| c.load(Relaxed);
        StreamStatsSnapshot {
            connections_accepted: g(&self.connections_accepted),
            connections_refused: g(&self.connections_refused),
            connections_active: g(&self.connections_active),
            filter_denials: g(&self.filter_denials),
            filter_closes: g(&self.filter_closes),
            bad_handshakes: g(&self.bad_handshakes),
            upstream_unavailable: g(&self.upstream_unavailable),
            idle_timeouts: g(&self.idle_timeouts),
            bytes_in: g(&self.bytes_in),
            bytes_out: g(&self.bytes_out),
            udp_sessions_created: g(&self.udp_sessions_created),
            udp_sessions_active: g(&self.udp_sessions_active),
            udp_sessions_expired: g(&self.udp_sessions_expired),
            datagrams_in: g(&self.datagrams_in),
            datagrams_out: g(&self.datagrams_out),
            datagrams_dropped: g(&self.datagrams_dropped),
        }
    }
}

/// A point-in-time copy of [`StreamStats`] (same fields, plain numbers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(
    missing_docs,
    reason = "the fields mirror StreamStats, documented there"
)]
pub struct StreamStatsSnapshot {
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub connections_active: u64,
    pub filter_denials: u64,
    pub filter_closes: u64,
    pub bad_handshakes: u64,
    pub upstream_unavailable: u64,
    pub idle_timeouts: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub udp_sessions_created: u64,
    pub udp_sessions_active: u64,
    pub udp_sessions_expired: u64,
    pub datagrams_in: u64,
    pub datagrams_out: u64,
    pub datagrams_dropped: u64,
}
