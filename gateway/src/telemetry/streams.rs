//! L4 stream series for /metrics, read from the stream proxy's counters at scrape time.

use std::fmt::Write as _;
use std::sync::Arc;

use stream_proxy::StreamStatsSnapshot;

use super::metrics::label_text;

type Row<'a> = (&'a str, &'a str, &'a str, fn(&StreamStatsSnapshot) -> u64);

const FAMILIES: [Row<'static>; 10] = [
    (
        "gateway_stream_connections_total",
        "counter",
        "TCP connections accepted per stream.",
        |s| s.connections_accepted,
    ),
    (
        "gateway_stream_refused_total",
        "counter",
        "Connections refused at max_connections.",
        |s| s.connections_refused,
    ),
    (
        "gateway_stream_active_connections",
        "gauge",
        "Open TCP connections per stream.",
        |s| s.connections_active,
    ),
    (
        "gateway_stream_filter_denials_total",
        "counter",
        "Connections closed by stream filters.",
        |s| s.filter_denials,
    ),
    (
        "gateway_stream_upstream_unavailable_total",
        "counter",
        "Connections closed because no target could be reached.",
        |s| s.upstream_unavailable,
    ),
    (
        "gateway_stream_received_bytes_total",
        "counter",
        "Bytes received from clients.",
        |s| s.bytes_in,
    ),
    (
        "gateway_stream_sent_bytes_total",
        "counter",
        "Bytes sent to clients.",
        |s| s.bytes_out,
    ),
    (
        "gateway_stream_udp_sessions_total",
        "counter",
        "UDP sessions created.",
        |s| s.udp_sessions_created,
    ),
    (
        "gateway_stream_udp_active_sessions",
        "gauge",
        "Open UDP sessions.",
        |s| s.udp_sessions_active,
    ),
    (
        "gateway_stream_udp_dropped_datagrams_total",
        "counter",
        "Datagrams dropped (session cap, oversize, send errors).",
        |s| s.datagrams_dropped,
    ),
];

/// Appends the stream families for `streams` (name, counters).
pub fn render_streams(streams: &[(Arc<str>, StreamStatsSnapshot)], out: &mut String) {
    if streams.is_empty() {
        return;
    }
    for (name, kind, help, value) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (stream, snap) in streams {
            let labels = [("stream".to_owned(), stream.to_string())];
            let _ = writeln!(out, "{name}{} {}", label_text(&labels, None), value(snap));
        }
    }
}
