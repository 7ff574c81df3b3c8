//! Observability shared by every config generation: the metrics registry (scraped on the
//! admin API, optionally pushed as OTLP metrics, see [`metrics_export`]), the access log,
//! per-route request metrics, and the tracer (OTLP traces, see [`trace`]). Handles are
//! registered when a generation is built, so recording a request is a few relaxed atomic adds.

pub mod access_log;
pub mod log_format;
pub mod metrics;
pub mod metrics_export;
mod otlp;
mod process;
pub mod stream_observer;
mod streams;
mod switch;
pub mod trace;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use http::{StatusCode, Version};

pub use access_log::{AccessLog, AccessRecord, LogNotes, RequestText};
pub use metrics::{Counter, Gauge, Histogram, Registry};
pub use metrics_export::MetricsExporter;
pub use streams::render_streams;
pub use switch::Switch;
pub use trace::Tracer;

/// The value of the first `name` line among a raw request head's lines, as a header map's
/// `get` reads it: what the access log and the server span take from the HTTP/1.1 fast path.
pub(crate) fn first_line<'a>(lines: &[httparse::Header<'a>], name: &str) -> Option<&'a [u8]> {
    let line = lines.iter().find(|h| h.name.eq_ignore_ascii_case(name))?;
    Some(line.value)
}

/// Process-wide telemetry, owned by the running gateway.
pub struct Telemetry {
    /// Prometheus registry (exported on the admin API).
    pub registry: Arc<Registry>,
    /// The access log, when configured (swapped on reload; shared with the stream observers,
    /// which read it when a connection ends).
    pub access_log: Arc<Switch<AccessLog>>,
    /// The tracer, when `telemetry.traces` is configured (replaced on reload when its settings
    /// change; shared with the stream observers, which read it when a connection ends).
    pub tracer: Arc<Switch<Tracer>>,
    /// The OTLP metrics exporter, when `telemetry.metrics` is configured (replaced on reload
    /// when its settings change).
    pub metrics_export: ArcSwapOption<MetricsExporter>,
    /// When the process-level series started counting (the start of OTLP cumulative values).
    pub started: SystemTime,
    /// Successful config reloads.
    pub reloads_ok: Counter,
    /// Rejected config reloads.
    pub reloads_failed: Counter,
}

impl Telemetry {
    /// A fresh registry with the process-level series registered.
    pub fn new() -> Arc<Self> {
        let registry = Registry::new();
        registry.add_collector(Box::new(process::render_prometheus));
        let reloads = |result| {
            registry.counter(
                "gateway_config_reloads_total",
                "Config reloads by result.",
                &[("result", result)],
            )
        };
        Arc::new(Self {
            reloads_ok: reloads("ok"),
            reloads_failed: reloads("failed"),
            access_log: Arc::new(Switch::empty()),
            tracer: Arc::new(Switch::empty()),
            metrics_export: ArcSwapOption::empty(),
            started: SystemTime::now(),
            registry,
        })
    }

    /// (Re)starts the access log for `cfg` (none when absent).
    pub fn configure_access_log(
        &self,
        cfg: Option<&gateway_config::model::AccessLogConfig>,
    ) -> std::io::Result<()> {
        let log = match cfg {
            None => None,
            Some(c) => Some(Arc::new(AccessLog::start(c, &self.registry)?)),
        };
        self.access_log.store(log);
        Ok(())
    }

    /// The tracer `cfg` asks for: the running one when its settings are unchanged (so a reload
    /// keeps its exporter and connection), a new one when they changed, none without
    /// `traces`. Nothing is swapped in yet: the caller stores it once the whole config is
    /// accepted. `Err` is a message about `telemetry.traces.otlp_endpoint`.
    pub fn tracer_for(
        &self,
        cfg: &gateway_config::model::TelemetryConfig,
    ) -> Result<Option<Arc<Tracer>>, String> {
        match self.tracer.load_full() {
            Some(t) if t.matches(cfg) => Ok(Some(t)),
            _ => Tracer::start(cfg, &self.registry),
        }
    }

    /// The metrics exporter `cfg` asks for, like [`Telemetry::tracer_for`]: the running one
    /// when unchanged, a new one (already exporting) when changed, none without `metrics`.
    /// `Err` names the key at fault.
    pub fn metrics_exporter_for(
        &self,
        cfg: &gateway_config::model::TelemetryConfig,
    ) -> Result<Option<Arc<MetricsExporter>>, metrics_export::ConfigProblem> {
        match self.metrics_export.load_full() {
            Some(m) if m.matches(cfg) => Ok(Some(m)),
            _ => MetricsExporter::start(cfg, &self.registry, self.started),
        }
    }
}

const PROTOCOLS: [&str; 3] = ["http1", "http2", "http3"];
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Request counters and latency of one route.
pub struct RouteMetrics {
    requests: [[Counter; 5]; 3],
    latency: Histogram,
}

impl RouteMetrics {
    /// Registers (or finds, after a reload) the series of `route`.
    pub fn new(registry: &Registry, route: &str) -> Self {
        let requests = PROTOCOLS.map(|protocol| {
            CLASSES.map(|class| {
                registry.counter(
                    "gateway_http_requests_total",
                    "HTTP requests by route, status class and protocol.",
                    &[("route", route), ("status", class), ("protocol", protocol)],
                )
            })
        });
        let latency = registry.histogram(
            "gateway_http_request_duration_seconds",
            "Time from request head to response head, by route.",
            &[("route", route)],
        );
        Self { requests, latency }
    }

    /// Counts one answered request.
    pub fn record(&self, version: Version, status: StatusCode, elapsed: Duration) {
        let protocol = protocol_index(version);
        let class = (status.as_u16() / 100).clamp(1, 5) as usize - 1;
        self.requests[protocol][class].inc();
        self.latency.observe(elapsed);
    }
}

fn protocol_index(v: Version) -> usize {
    match v {
        Version::HTTP_2 => 1,
        Version::HTTP_3 => 2,
        _ => 0,
    }
}

/// `HTTP/1.1`-style protocol text for logs.
pub fn protocol_text(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// Connection counters of one listener and transport (`tcp`, or `quic` for HTTP/3).
#[derive(Clone)]
pub struct ListenerMetrics {
    /// Open connections.
    pub active: Gauge,
    /// Connections accepted.
    pub accepted: Counter,
    /// Connections refused at the cap.
    pub refused: Counter,
    /// Connections closed because the client accepted no byte for `write_timeout`.
    pub write_timeouts: Counter,
    /// Connections closed because a request head did not arrive whole within
    /// `header_read_timeout` (slow or stalled clients).
    pub header_timeouts: Counter,
    /// Failed accepts (EMFILE and the like), each followed by a back-off.
    pub accept_errors: Counter,
    /// TLS (or QUIC) handshakes the client broke off or got wrong.
    pub handshake_errors: Counter,
    /// TLS (or QUIC) handshakes not finished within the listener's handshake time.
    pub handshake_timeouts: Counter,
}

const HANDSHAKE_FAILURES_HELP: &str = "TLS or QUIC handshakes that failed, by reason: error (the client sent something that is not a valid handshake, or offered nothing the listener accepts) or timeout.";

impl ListenerMetrics {
    /// Registers (or finds) the series of `listener` (its TCP connections).
    pub fn new(registry: &Registry, listener: &str) -> Self {
        Self::with_labels(registry, &[("listener", listener)])
    }

    /// The series of `listener`'s QUIC (HTTP/3) connections: the same families, labelled
    /// `transport="quic"`, so TCP series keep their labels.
    pub fn quic(registry: &Registry, listener: &str) -> Self {
        Self::with_labels(registry, &[("listener", listener), ("transport", "quic")])
    }

    fn with_labels(registry: &Registry, labels: &[(&str, &str)]) -> Self {
        Self {
            active: registry.gauge(
                "gateway_listener_active_connections",
                "Open connections per listener.",
                labels,
            ),
            accepted: registry.counter(
                "gateway_listener_connections_total",
                "Connections accepted per listener.",
                labels,
            ),
            refused: registry.counter(
                "gateway_listener_refused_connections_total",
                "Connections refused because the listener was at max_connections.",
                labels,
            ),
            write_timeouts: registry.counter(
                "gateway_listener_write_timeouts_total",
                "Connections closed because the client read nothing for write_timeout.",
                labels,
            ),
            header_timeouts: registry.counter(
                "gateway_listener_header_timeouts_total",
                "Connections closed because a request head did not arrive whole within header_read_timeout.",
                labels,
            ),
            accept_errors: registry.counter(
                "gateway_listener_accept_errors_total",
                "Accepts that failed (such as EMFILE: out of file descriptors) and were retried after a pause.",
                labels,
            ),
            handshake_errors: registry.counter(
                "gateway_listener_handshake_failures_total",
                HANDSHAKE_FAILURES_HELP,
                &[labels, &[("reason", "error")]].concat(),
            ),
            handshake_timeouts: registry.counter(
                "gateway_listener_handshake_failures_total",
                HANDSHAKE_FAILURES_HELP,
                &[labels, &[("reason", "timeout")]].concat(),
            ),
        }
    }
}
