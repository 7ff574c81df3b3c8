//! The metrics registry: metrics guests define (`proxy_define_metric`: counters, gauges,
//! histograms) and the host's own per-plugin counters (guest calls by callback, reloads,
//! failures by kind, VM replacements). [`Metrics::render_prometheus`] writes both in Prometheus text format, for the
//! admin `/metrics` endpoint.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

/// Histogram bucket upper bounds (guest values are unitless; these suit counts and ms).
const BUCKETS: [i64; 12] = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, 10000];

/// `proxy_metric_type_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Set to a value.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

impl MetricKind {
    pub(crate) fn from_abi(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Counter,
            1 => Self::Gauge,
            2 => Self::Histogram,
            _ => return None,
        })
    }
}

struct Metric {
    name: String,
    kind: MetricKind,
    value: AtomicI64,
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
}

/// A guest callback the host calls, as counted in `gateway_plugin_calls_total{callback}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Callback {
    /// `proxy_on_context_create` for a request or connection.
    ContextCreate,
    /// `proxy_on_request_headers`.
    RequestHeaders,
    /// `proxy_on_request_body`.
    RequestBody,
    /// `proxy_on_request_trailers`.
    RequestTrailers,
    /// `proxy_on_response_headers`.
    ResponseHeaders,
    /// `proxy_on_response_body`.
    ResponseBody,
    /// `proxy_on_response_trailers`.
    ResponseTrailers,
    /// The end of a context: `proxy_on_done`, `proxy_on_log`, `proxy_on_delete`.
    Log,
    /// `proxy_on_new_connection`.
    NewConnection,
    /// `proxy_on_downstream_data`.
    DownstreamData,
    /// `proxy_on_upstream_data`.
    UpstreamData,
    /// `proxy_on_downstream_connection_close`.
    DownstreamClose,
    /// `proxy_on_upstream_connection_close`.
    UpstreamClose,
    /// `proxy_on_tick`.
    Tick,
    /// `proxy_on_queue_ready`.
    QueueReady,
    /// `proxy_on_http_call_response`.
    HttpCallResponse,
}

impl Callback {
    /// Every callback, in label order.
    pub const ALL: [Self; 16] = [
        Self::ContextCreate,
        Self::RequestHeaders,
        Self::RequestBody,
        Self::RequestTrailers,
        Self::ResponseHeaders,
        Self::ResponseBody,
        Self::ResponseTrailers,
        Self::Log,
        Self::NewConnection,
        Self::DownstreamData,
        Self::UpstreamData,
        Self::DownstreamClose,
        Self::UpstreamClose,
        Self::Tick,
        Self::QueueReady,
        Self::HttpCallResponse,
    ];

    /// The `callback` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::ContextCreate => "context_create",
            Self::RequestHeaders => "request_headers",
            Self::RequestBody => "request_body",
            Self::RequestTrailers => "request_trailers",
            Self::ResponseHeaders => "response_headers",
            Self::ResponseBody => "response_body",
            Self::ResponseTrailers => "response_trailers",
            Self::Log => "log",
            Self::NewConnection => "new_connection",
            Self::DownstreamData => "downstream_data",
            Self::UpstreamData => "upstream_data",
            Self::DownstreamClose => "downstream_close",
            Self::UpstreamClose => "upstream_close",
            Self::Tick => "tick",
            Self::QueueReady => "queue_ready",
            Self::HttpCallResponse => "http_call_response",
        }
    }
}

/// Host-side counters of one plugin.
#[derive(Debug, Default)]
pub struct PluginStats {
    /// Guest calls by [`Callback`] (its discriminant is the index): one relaxed add per call
    /// into a counter found when the plugin was loaded.
    pub calls: [AtomicU64; Callback::ALL.len()],
    /// Successful hot reloads.
    pub reloads_ok: AtomicU64,
    /// Rejected reloads (compile, link or start failure).
    pub reloads_failed: AtomicU64,
    /// Guest traps (panics, unreachable, bad indirect calls).
    pub traps: AtomicU64,
    /// Calls stopped at `limits.time`.
    pub timeouts: AtomicU64,
    /// Growth refused at `limits.memory`.
    pub memory_limits: AtomicU64,
    /// Out-of-bounds pointers passed to host calls.
    pub memory_access: AtomicU64,
    /// VMs replaced after a failure.
    pub vm_replacements: AtomicU64,
    /// Linear memory of the plugin's live VMs, bytes (a gauge).
    pub memory_bytes: AtomicU64,
}

impl PluginStats {
    /// Counts one guest call of `callback`.
    pub fn record_call(&self, callback: Callback) {
        self.calls[callback as usize].fetch_add(1, Relaxed);
    }

    /// Guest calls of `callback` so far.
    pub fn calls(&self, callback: Callback) -> u64 {
        self.calls[callback as usize].load(Relaxed)
    }

    /// Counts a failed guest call by its kind.
    pub fn record_failure(&self, e: &crate::PluginError) {
        use crate::PluginError as E;
        let c = match e {
            E::Timeout(_) => &self.timeouts,
            E::MemoryLimit(_) => &self.memory_limits,
            E::MemoryAccess(_) => &self.memory_access,
            _ => &self.traps,
        };
        c.fetch_add(1, Relaxed);
    }
}

/// The registry.
#[derive(Default)]
pub struct Metrics {
    by_name: Mutex<HashMap<String, u32>>,
    list: RwLock<Vec<Arc<Metric>>>,
    plugins: Mutex<Vec<(String, Arc<PluginStats>)>>,
}

impl Metrics {
    /// Defines (or finds) a metric; ids are shared by every VM, so per-worker VMs add up.
    pub fn define(&self, kind: MetricKind, name: &str) -> u32 {
        let mut by_name = self.by_name.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&id) = by_name.get(name) {
            return id;
        }
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        list.push(Arc::new(Metric {
            name: name.to_owned(),
            kind,
            value: AtomicI64::new(0),
            buckets: Default::default(),
            count: AtomicU64::new(0),
        }));
        // Ids start at 1: some guests treat 0 as "undefined".
        let id = list.len() as u32;
        by_name.insert(name.to_owned(), id);
        id
    }

    fn get(&self, id: u32) -> Option<Arc<Metric>> {
        let list = self.list.read().unwrap_or_else(|p| p.into_inner());
        list.get((id as usize).checked_sub(1)?).cloned()
    }

    /// `proxy_record_metric`: sets a gauge or counter, observes a histogram value.
    pub fn record(&self, id: u32, value: i64) -> bool {
        let Some(m) = self.get(id) else { return false };
        match m.kind {
            MetricKind::Counter | MetricKind::Gauge => m.value.store(value, Relaxed),
            MetricKind::Histogram => {
                m.value.fetch_add(value, Relaxed);
                m.count.fetch_add(1, Relaxed);
                if let Some(i) = BUCKETS.iter().position(|b| value <= *b) {
                    m.buckets[i].fetch_add(1, Relaxed);
                }
            }
        }
        true
    }

    /// `proxy_increment_metric`; histograms cannot be incremented.
    pub fn increment(&self, id: u32, delta: i64) -> Result<(), bool> {
        let Some(m) = self.get(id) else {
            return Err(false);
        };
        if m.kind == MetricKind::Histogram {
            return Err(true);
        }
        m.value.fetch_add(delta, Relaxed);
        Ok(())
    }

    /// `proxy_get_metric` (a histogram reports its observation count).
    pub fn value(&self, id: u32) -> Option<u64> {
        let m = self.get(id)?;
        Some(match m.kind {
            MetricKind::Histogram => m.count.load(Relaxed),
            _ => m.value.load(Relaxed) as u64,
        })
    }

    /// The value of a metric by name (tests and admin).
    pub fn value_by_name(&self, name: &str) -> Option<u64> {
        let id = *self.by_name.lock().ok()?.get(name)?;
        self.value(id)
    }

    /// Host counters for plugin `name` (created on first use, kept across reloads).
    pub fn plugin(&self, name: &str) -> Arc<PluginStats> {
        let mut plugins = self.plugins.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, s)) = plugins.iter().find(|(n, _)| n == name) {
            return s.clone();
        }
        let s = Arc::new(PluginStats::default());
        plugins.push((name.to_owned(), s.clone()));
        s
    }

    /// Appends every metric in Prometheus text format.
    pub fn render_prometheus(&self, out: &mut String) {
        self.render_plugins(out);
        let list = self.list.read().unwrap_or_else(|p| p.into_inner());
        for m in list.iter() {
            let name = prometheus_name(&m.name);
            match m.kind {
                MetricKind::Counter | MetricKind::Gauge => {
                    let kind = if m.kind == MetricKind::Counter {
                        "counter"
                    } else {
                        "gauge"
                    };
                    let _ = writeln!(out, "# TYPE {name} {kind}");
                    let _ = writeln!(out, "{name} {}", m.value.load(Relaxed));
                }
                MetricKind::Histogram => {
                    let _ = writeln!(out, "# TYPE {name} histogram");
                    let mut cumulative = 0;
                    for (b, n) in BUCKETS.iter().zip(&m.buckets) {
                        cumulative += n.load(Relaxed);
                        let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
                    }
                    let count = m.count.load(Relaxed);
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
                    let _ = writeln!(out, "{name}_sum {}", m.value.load(Relaxed));
                    let _ = writeln!(out, "{name}_count {count}");
                }
            }
        }
    }

    fn render_plugins(&self, out: &mut String) {
        let plugins = self.plugins.lock().unwrap_or_else(|p| p.into_inner());
        if plugins.is_empty() {
            return;
        }
        type Field = fn(&PluginStats) -> &AtomicU64;
        let families: [(&str, &str, Field); 7] = [
            ("gateway_plugin_reloads_total", "result=\"ok\"", |s| {
                &s.reloads_ok
            }),
            ("gateway_plugin_reloads_total", "result=\"failed\"", |s| {
                &s.reloads_failed
            }),
            ("gateway_plugin_failures_total", "kind=\"trap\"", |s| {
                &s.traps
            }),
            ("gateway_plugin_failures_total", "kind=\"timeout\"", |s| {
                &s.timeouts
            }),
            (
                "gateway_plugin_failures_total",
                "kind=\"memory_limit\"",
                |s| &s.memory_limits,
            ),
            (
                "gateway_plugin_failures_total",
                "kind=\"memory_access\"",
                |s| &s.memory_access,
            ),
            ("gateway_plugin_vm_replacements_total", "", |s| {
                &s.vm_replacements
            }),
        ];
        let _ = writeln!(out, "# TYPE gateway_plugin_calls_total counter");
        for (name, s) in plugins.iter() {
            // Only callbacks the plugin was called for: most plugins implement a few of them.
            for cb in Callback::ALL {
                let n = s.calls(cb);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "gateway_plugin_calls_total{{plugin=\"{}\",callback=\"{}\"}} {n}",
                        escape(name),
                        cb.label()
                    );
                }
            }
        }
        let _ = writeln!(out, "# TYPE gateway_plugin_memory_bytes gauge");
        for (name, s) in plugins.iter() {
            let _ = writeln!(
                out,
                "gateway_plugin_memory_bytes{{plugin=\"{}\"}} {}",
                escape(name),
                s.memory_bytes.load(Relaxed)
            );
        }
        let mut last = "";
        for (family, label, get) in families {
            if family != last {
                let _ = writeln!(out, "# TYPE {family} counter");
                last = family;
            }
            for (name, s) in plugins.iter() {
                let sep = if label.is_empty() { "" } else { "," };
                let _ = writeln!(
                    out,
                    "{family}{{plugin=\"{}\"{sep}{label}}} {}",
                    escape(name),
                    get(s).load(Relaxed)
                );
            }
        }
    }
}

/// Guest metric names as Prometheus names: `wasm_` + the name with other characters as `_`.
fn prometheus_name(name: &str) -> String {
    let mut s = String::with_capacity(name.len() + 5);
    s.push_str("wasm_");
    s.extend(
        name.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
    );
    s
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn define_record_render() {
        let m = Metrics::default();
        let c = m.define(MetricKind::Counter, "requests.total");
        assert_eq!(m.define(MetricKind::Counter, "requests.total"), c);
        m.increment(c, 3).unwrap();
        let h = m.define(MetricKind::Histogram, "size");
        assert!(m.record(h, 7));
        assert_eq!(m.increment(h, 1), Err(true));
        assert_eq!(m.value(c), Some(3));
        m.plugin("p").reloads_ok.fetch_add(1, Relaxed);
        m.plugin("p").record_call(Callback::RequestHeaders);
        m.plugin("p").record_call(Callback::RequestHeaders);
        let mut out = String::new();
        m.render_prometheus(&mut out);
        assert!(
            out.contains(
                "gateway_plugin_calls_total{plugin=\"p\",callback=\"request_headers\"} 2\n"
            ),
            "{out}"
        );
        assert!(!out.contains("callback=\"tick\""), "{out}");
        assert!(out.contains("wasm_requests_total 3"), "{out}");
        assert!(out.contains("wasm_size_bucket{le=\"10\"} 1"), "{out}");
        assert!(out.contains("gateway_plugin_reloads_total{plugin=\"p\",result=\"ok\"} 1"));
    }
}
