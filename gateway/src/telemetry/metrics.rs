//! A small Prometheus metrics registry. Handles (counters, gauges, histograms) are registered
//! when a config generation is built and kept by the code that records into them, so the hot
//! path is one relaxed atomic add: no lookup, no lock, no allocation. The same name and labels
//! always return the same handle, so values survive reloads. Values owned elsewhere (upstream
//! health, plugin metrics) are appended at scrape time by collectors.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A monotonically increasing count.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Clone, Debug, Default)]
pub struct Gauge(Arc<AtomicI64>);

impl Gauge {
    /// Adds `n` (negative to subtract).
    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Sets the value.
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Upper bounds (seconds) of the latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct HistogramCells {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

/// A handle to a histogram.
#[derive(Clone, Debug, Default)]
pub struct Histogram(Arc<HistogramCells>);

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            self.0.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.0.count.fetch_add(1, Ordering::Relaxed);
        self.0
            .sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }
    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0.count.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
enum Cell {
    Counter(Counter),
    Gauge(Gauge),
    Histogram(Histogram),
}

type Labels = Vec<(String, String)>;

struct Family {
    help: String,
    kind: &'static str,
    series: BTreeMap<Labels, Cell>,
}

/// Appends metrics computed at scrape time.
pub type Collector = Box<dyn Fn(&mut String) + Send + Sync>;

/// The registry: metric families by name.
#[derive(Default)]
pub struct Registry {
    families: Mutex<BTreeMap<String, Family>>,
    collectors: Mutex<Vec<Collector>>,
}

impl Registry {
    /// A fresh registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn cell(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        make: fn() -> Cell,
        kind: &'static str,
    ) -> Cell {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let family = families.entry(name.to_owned()).or_insert_with(|| Family {
            help: help.to_owned(),
            kind,
            series: BTreeMap::new(),
        });
        let key: Labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        family.series.entry(key).or_insert_with(make).clone()
    }

    /// The counter `name{labels}`.
    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        match self.cell(
            name,
            help,
            labels,
            || Cell::Counter(Counter::default()),
            "counter",
        ) {
            Cell::Counter(c) => c,
            _ => Counter::default(),
        }
    }

    /// The gauge `name{labels}`.
    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
        match self.cell(
            name,
            help,
            labels,
            || Cell::Gauge(Gauge::default()),
            "gauge",
        ) {
            Cell::Gauge(g) => g,
            _ => Gauge::default(),
        }
    }

    /// The latency histogram `name{labels}` (seconds).
    pub fn histogram(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Histogram {
        match self.cell(
            name,
            help,
            labels,
            || Cell::Histogram(Histogram::default()),
            "histogram",
        ) {
            Cell::Histogram(h) => h,
            _ => Histogram::default(),
        }
    }

    /// Adds a scrape-time collector.
    pub fn add_collector(&self, collector: Collector) {
        self.collectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(collector);
    }

    /// The Prometheus text exposition of everything registered.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        {
            let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
            for (name, family) in families.iter() {
                let _ = writeln!(out, "# HELP {name} {}", family.help);
                let _ = writeln!(out, "# TYPE {name} {}", family.kind);
                for (labels, cell) in &family.series {
                    render_cell(&mut out, name, labels, cell);
                }
            }
        }
        for c in self
            .collectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            c(&mut out);
        }
        out
    }
}

/// Formats `{a="1",b="2"}` with Prometheus escaping (`extra` appended last).
pub fn label_text(labels: &[(String, String)], extra: Option<(&str, &str)>) -> String {
    let mut s = String::new();
    let all = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(extra);
    for (i, (k, v)) in all.enumerate() {
        s.push(if i == 0 { '{' } else { ',' });
        s.push_str(k);
        s.push_str("=\"");
        for ch in v.chars() {
            match ch {
                '\\' => s.push_str("\\\\"),
                '"' => s.push_str("\\\""),
                '\n' => s.push_str("\\n"),
                c => s.push(c),
            }
        }
        s.push('"');
    }
    if !s.is_empty() {
        s.push('}');
    }
    s
}

fn render_cell(out: &mut String, name: &str, labels: &Labels, cell: &Cell) {
    match cell {
        Cell::Counter(c) => {
            let _ = writeln!(out, "{name}{} {}", label_text(labels, None), c.get());
        }
        Cell::Gauge(g) => {
            let _ = writeln!(out, "{name}{} {}", label_text(labels, None), g.get());
        }
        Cell::Histogram(h) => {
            let mut cumulative = 0;
            for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
                cumulative += h.0.buckets[i].load(Ordering::Relaxed);
                let le = bound.to_string();
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {cumulative}",
                    label_text(labels, Some(("le", &le)))
                );
            }
            let count = h.0.count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{} {count}",
                label_text(labels, Some(("le", "+Inf")))
            );
            let sum = h.0.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(out, "{name}_sum{} {sum}", label_text(labels, None));
            let _ = writeln!(out, "{name}_count{} {count}", label_text(labels, None));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_labels_same_handle_and_text_format() {
        let r = Registry::new();
        let a = r.counter("x_total", "X.", &[("route", "a\"b")]);
        let b = r.counter("x_total", "X.", &[("route", "a\"b")]);
        a.inc();
        b.add(2);
        let h = r.histogram("lat_seconds", "Latency.", &[]);
        h.observe(Duration::from_millis(3));
        let text = r.render();
        assert!(
            text.contains("# TYPE x_total counter\nx_total{route=\"a\\\"b\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("lat_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("lat_seconds_bucket{le=\"0.0025\"} 0"),
            "{text}"
        );
        assert!(text.contains("lat_seconds_count 1"), "{text}");
    }
}
