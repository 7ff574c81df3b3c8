//! The metrics registry's scrape-time collectors for what lives above telemetry: the live
//! generation's upstream targets, the Wasm plugins' metrics and the allocator's. The registry
//! renders them (on the admin API's `GET /metrics`, and for the OTLP metrics export) without
//! knowing the generation, the proxy or the Wasm host.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::generation::Generation;
use crate::proxy::Upstreams;
use crate::telemetry::Telemetry;
use crate::telemetry::metrics::label_text;

/// Registers the scrape-time collectors: the live generation's upstream targets, plugin metrics
/// and memory.
pub fn register(telemetry: &Telemetry, generation: Arc<ArcSwap<Generation>>) {
    telemetry.registry.add_collector(Box::new(move |out| {
        render_upstreams(&generation.load().upstreams, out);
        // Plugin metrics: guest-defined series and per-plugin reload/failure counters.
        crate::wasm::render_prometheus(out);
        crate::memory::render_prometheus(out);
    }));
}

/// Per-target upstream series, read from the live generation at scrape time.
fn render_upstreams(upstreams: &Upstreams, out: &mut String) {
    use std::fmt::Write as _;
    let families: [(&str, &str, &str); 7] = [
        (
            "gateway_upstream_attempts_total",
            "counter",
            "Attempts sent to a target.",
        ),
        (
            "gateway_upstream_failures_total",
            "counter",
            "Attempts that failed (connect, reset, timeout, statuses counted by passive health).",
        ),
        (
            "gateway_upstream_ejections_total",
            "counter",
            "Times a target was ejected by health checks.",
        ),
        (
            "gateway_upstream_ejections_spared_total",
            "counter",
            "Passive ejections not made because the target was the last selectable one.",
        ),
        (
            "gateway_upstream_check_failures_total",
            "counter",
            "Failed active health checks.",
        ),
        (
            "gateway_upstream_in_flight",
            "gauge",
            "Requests in flight to a target.",
        ),
        (
            "gateway_upstream_healthy",
            "gauge",
            "1 when the target is in rotation, 0 when ejected.",
        ),
    ];
    let mut rows: Vec<(String, Vec<stream_proxy::upstream::TargetSnapshot>)> = upstreams
        .iter()
        .map(|u| (u.name.to_string(), u.targets.snapshot()))
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let _ = writeln!(
        out,
        "# HELP gateway_upstream_retries_total Requests retried on another target.\n# TYPE gateway_upstream_retries_total counter"
    );
    let mut names: Vec<_> = upstreams.iter().collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    for u in &names {
        let labels = [("upstream".to_owned(), u.name.to_string())];
        let retries = u.retries_total.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(
            out,
            "gateway_upstream_retries_total{} {retries}",
            label_text(&labels, None)
        );
    }
    let _ = writeln!(
        out,
        "# HELP gateway_upstream_resolve_failures_total Lookups of a target's host name that failed or found no address (the name kept its last addresses).\n# TYPE gateway_upstream_resolve_failures_total counter"
    );
    for u in &names {
        let labels = [("upstream".to_owned(), u.name.to_string())];
        let _ = writeln!(
            out,
            "gateway_upstream_resolve_failures_total{} {}",
            label_text(&labels, None),
            u.targets.resolve_failures()
        );
    }
    let _ = writeln!(
        out,
        "# HELP gateway_upstream_discarded_connections_total Keep-alive connections to a target closed rather than reused because the target broke HTTP/1.1 framing (reason: unexpected_bytes after a complete response, bodiless_with_framing on a 1xx or 204).\n# TYPE gateway_upstream_discarded_connections_total counter"
    );
    for u in &names {
        for (target, counts) in u.discarded_connections() {
            for (reason, value) in counts {
                let labels = [
                    ("upstream".to_owned(), u.name.to_string()),
                    ("target".to_owned(), target.clone()),
                ];
                let _ = writeln!(
                    out,
                    "gateway_upstream_discarded_connections_total{} {value}",
                    label_text(&labels, Some(("reason", reason)))
                );
            }
        }
    }
    for (i, (name, kind, help)) in families.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (upstream, targets) in &rows {
            for t in targets {
                let value = match i {
                    0 => t.attempts as i64,
                    1 => t.failures as i64,
                    2 => t.ejections as i64,
                    3 => t.ejections_spared as i64,
                    4 => t.check_failures as i64,
                    5 => i64::from(t.in_flight),
                    _ => i64::from(t.health == stream_proxy::upstream::Health::Healthy),
                };
                let labels = [
                    ("upstream".to_owned(), upstream.clone()),
                    ("target".to_owned(), t.id.clone()),
                ];
                let _ = writeln!(out, "{name}{} {value}", label_text(&labels, None));
            }
        }
    }
}
