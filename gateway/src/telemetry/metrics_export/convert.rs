//! The registry's Prometheus text as OTLP metrics. Part of what `/metrics` shows is written at
//! scrape time by collectors (upstream targets, L4 streams, plugins) that only produce text,
//! so the exporter reads the same exposition a scrape gets and converts it: one source of
//! truth, and every family on `/metrics` is exported. Counters become monotonic cumulative
//! sums, gauges gauges, histograms explicit-bucket histograms (buckets de-accumulated).
//! Only the text format the gateway itself writes needs to be understood; a line that does
//! not parse is skipped and counted.

use std::time::Duration;

use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum,
    metric, number_data_point,
};

use crate::telemetry::trace::convert::string_kv;

/// Every value counts from the process start.
const CUMULATIVE: i32 = AggregationTemporality::Cumulative as i32;

type Labels = Vec<(String, String)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One `name{labels} value` line.
#[derive(Debug, PartialEq)]
struct Sample<'a> {
    name: &'a str,
    labels: Labels,
    value: &'a str,
}

/// A family as it is assembled.
struct Family {
    name: String,
    help: String,
    kind: Kind,
    /// Counter and gauge points, in order.
    numbers: Vec<(Labels, number_data_point::Value)>,
    /// Histogram series, in order.
    histograms: Vec<Series>,
}

/// One histogram series: its labels without `le`.
#[derive(Default)]
struct Series {
    labels: Labels,
    /// `(le, cumulative count)` for the finite bounds.
    buckets: Vec<(f64, u64)>,
    count: u64,
    sum: Option<f64>,
}

/// What the conversion made: the metrics, and how many lines it had to skip.
pub(crate) struct Converted {
    pub(crate) metrics: Vec<Metric>,
    pub(crate) skipped: usize,
}

/// Converts `text`; every point gets `start` (the process start) and `now` (Unix time).
pub(crate) fn convert(text: &str, start: Duration, now: Duration) -> Converted {
    let mut families: Vec<Family> = Vec::new();
    let mut skipped = 0;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            comment(rest, &mut families);
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        if !parse_sample(line).is_some_and(|s| add(&mut families, s)) {
            skipped += 1;
        }
    }
    let (start, now) = (start.as_nanos() as u64, now.as_nanos() as u64);
    let metrics = families
        .into_iter()
        .filter(|f| !f.numbers.is_empty() || !f.histograms.is_empty())
        .map(|f| to_metric(f, start, now))
        .collect();
    Converted { metrics, skipped }
}

/// `HELP name text` or `TYPE name kind`: starts (or annotates) a family.
fn comment(rest: &str, families: &mut Vec<Family>) {
    let (what, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
    if name.is_empty() || !matches!(what, "HELP" | "TYPE") {
        return;
    }
    let family = family_mut(families, name);
    match what {
        "HELP" => family.help = value.replace("\\n", "\n").replace("\\\\", "\\"),
        _ => {
            family.kind = match value.trim() {
                "counter" => Kind::Counter,
                "histogram" => Kind::Histogram,
                _ => Kind::Gauge,
            }
        }
    }
}

/// The family `name`, added (as a gauge, Prometheus' "untyped") if new. The latest family
/// comes first: samples follow their `TYPE` line.
fn family_mut<'f>(families: &'f mut Vec<Family>, name: &str) -> &'f mut Family {
    let i = match families.iter().rposition(|f| f.name == name) {
        Some(i) => i,
        None => {
            families.push(Family {
                name: name.to_owned(),
                help: String::new(),
                kind: Kind::Gauge,
                numbers: Vec::new(),
                histograms: Vec::new(),
            });
            families.len() - 1
        }
    };
    &mut families[i]
}

/// Files a sample under its family; `false` when its value does not parse.
fn add(families: &mut Vec<Family>, s: Sample<'_>) -> bool {
    // A histogram's lines carry suffixes on the family's name.
    let histogram = ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = s.name.strip_suffix(suffix)?;
        families
            .iter()
            .rposition(|f| f.name == base && f.kind == Kind::Histogram)
            .map(|i| (i, *suffix))
    });
    if let Some((i, suffix)) = histogram {
        return add_histogram(&mut families[i], s, suffix);
    }
    let Some(value) = number(s.value) else {
        return false;
    };
    family_mut(families, s.name).numbers.push((s.labels, value));
    true
}

fn add_histogram(family: &mut Family, mut s: Sample<'_>, suffix: &str) -> bool {
    let le = s
        .labels
        .iter()
        .position(|(k, _)| k == "le")
        .map(|i| s.labels.remove(i).1);
    let series = match family.histograms.iter().position(|h| h.labels == s.labels) {
        Some(i) => &mut family.histograms[i],
        None => {
            family.histograms.push(Series {
                labels: s.labels,
                ..Series::default()
            });
            let last = family.histograms.len() - 1;
            &mut family.histograms[last]
        }
    };
    match (suffix, le) {
        ("_bucket", Some(le)) if le == "+Inf" => s.value.parse().map(|_: u64| ()).is_ok(),
        ("_bucket", Some(le)) => match (le.parse::<f64>(), s.value.parse::<u64>()) {
            (Ok(bound), Ok(n)) => {
                series.buckets.push((bound, n));
                true
            }
            _ => false,
        },
        ("_sum", None) => s.value.parse().map(|v| series.sum = Some(v)).is_ok(),
        ("_count", None) => s.value.parse().map(|n| series.count = n).is_ok(),
        _ => false,
    }
}

/// An integer when the text is one (counters, most gauges), else a double.
fn number(text: &str) -> Option<number_data_point::Value> {
    if let Ok(i) = text.parse::<i64>() {
        return Some(number_data_point::Value::AsInt(i));
    }
    text.parse::<f64>()
        .ok()
        .map(number_data_point::Value::AsDouble)
}

fn to_metric(f: Family, start: u64, now: u64) -> Metric {
    let attributes = |labels: Labels| -> Vec<KeyValue> {
        labels.into_iter().map(|(k, v)| string_kv(&k, v)).collect()
    };
    let numbers = |numbers: Vec<(Labels, number_data_point::Value)>| {
        numbers
            .into_iter()
            .map(|(labels, value)| NumberDataPoint {
                attributes: attributes(labels),
                start_time_unix_nano: start,
                time_unix_nano: now,
                value: Some(value),
                ..NumberDataPoint::default()
            })
            .collect()
    };
    let data = match f.kind {
        Kind::Counter => metric::Data::Sum(Sum {
            data_points: numbers(f.numbers),
            aggregation_temporality: CUMULATIVE,
            is_monotonic: true,
        }),
        Kind::Gauge => metric::Data::Gauge(Gauge {
            data_points: numbers(f.numbers),
        }),
        Kind::Histogram => metric::Data::Histogram(Histogram {
            data_points: f
                .histograms
                .into_iter()
                .map(|mut h| {
                    h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                    let mut below = 0;
                    let mut bucket_counts = Vec::with_capacity(h.buckets.len() + 1);
                    for (_, cumulative) in &h.buckets {
                        bucket_counts.push(cumulative.saturating_sub(below));
                        below = (*cumulative).max(below);
                    }
                    bucket_counts.push(h.count.saturating_sub(below));
                    HistogramDataPoint {
                        attributes: attributes(h.labels),
                        start_time_unix_nano: start,
                        time_unix_nano: now,
                        count: h.count,
                        sum: h.sum,
                        bucket_counts,
                        explicit_bounds: h.buckets.iter().map(|(b, _)| *b).collect(),
                        ..HistogramDataPoint::default()
                    }
                })
                .collect(),
            aggregation_temporality: CUMULATIVE,
        }),
    };
    Metric {
        unit: unit(&f.name).into(),
        name: f.name,
        description: f.help,
        data: Some(data),
        ..Metric::default()
    }
}

/// The UCUM unit a Prometheus name's suffix states.
fn unit(name: &str) -> &'static str {
    let name = name.strip_suffix("_total").unwrap_or(name);
    if name.ends_with("_seconds") {
        "s"
    } else if name.ends_with("_bytes") {
        "By"
    } else {
        ""
    }
}

/// `name{k="v",...} value` (labels optional, Prometheus escapes in values).
fn parse_sample(line: &str) -> Option<Sample<'_>> {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = parse_labels(after)?;
        labels = parsed;
        rest = tail;
    }
    let value = rest.split_whitespace().next()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The labels up to the closing `}`, and what follows it.
fn parse_labels(mut s: &str) -> Option<(Labels, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(tail) = s.strip_prefix('}') {
            return Some((labels, tail));
        }
        let (key, after) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let close = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key.trim().to_owned(), value));
        s = &after[close + 1..];
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::any_value;

    use super::*;
    use crate::telemetry::Registry;

    fn labels(kvs: &[KeyValue]) -> Vec<(String, String)> {
        kvs.iter()
            .map(|kv| {
                let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(any_value::Value::StringValue(s)) => s.clone(),
                    other => format!("{other:?}"),
                };
                (kv.key.clone(), v)
            })
            .collect()
    }

    #[test]
    fn labels_with_escapes_parse() {
        let s = parse_sample(r#"x_total{a="q\"uo\\te",b="new\nline"} 7"#).expect("sample");
        assert_eq!(s.name, "x_total");
        assert_eq!(
            s.labels,
            vec![
                ("a".to_owned(), "q\"uo\\te".to_owned()),
                ("b".to_owned(), "new\nline".to_owned())
            ]
        );
        assert_eq!(s.value, "7");
        assert_eq!(parse_sample("up 1").map(|s| s.value), Some("1"));
        assert_eq!(parse_sample(r#"x{a="unterminated} 1"#), None);
        assert_eq!(parse_sample(r#"x{a="1" 1"#), None);
    }

    #[test]
    fn the_registry_converts_family_by_family() {
        let r = Registry::new();
        let c = r.counter("req_total", "Requests.", &[("route", "a\"b")]);
        c.add(5);
        r.gauge("open", "Open.", &[]).set(-2);
        let h = r.histogram("lat_seconds", "Latency.", &[("route", "x")]);
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        r.add_collector(Box::new(|out| {
            out.push_str("# TYPE plugin_level gauge\nplugin_level 1.5\nnot a sample\n");
        }));
        let got = convert(&r.render(), Duration::from_secs(1), Duration::from_secs(2));
        assert_eq!(got.skipped, 1, "the line that is no sample");
        let by_name = |n: &str| {
            got.metrics
                .iter()
                .find(|m| m.name == n)
                .unwrap_or_else(|| panic!("{n} missing"))
        };

        let Some(metric::Data::Sum(sum)) = &by_name("req_total").data else {
            panic!("a sum");
        };
        assert!(sum.is_monotonic);
        assert_eq!(sum.aggregation_temporality, CUMULATIVE);
        let p = &sum.data_points[0];
        assert_eq!(p.value, Some(number_data_point::Value::AsInt(5)));
        assert_eq!(labels(&p.attributes), vec![("route".into(), "a\"b".into())]);
        assert_eq!(
            (p.start_time_unix_nano, p.time_unix_nano),
            (1e9 as u64, 2e9 as u64)
        );
        assert_eq!(by_name("req_total").description, "Requests.");

        let Some(metric::Data::Gauge(g)) = &by_name("open").data else {
            panic!("a gauge");
        };
        assert_eq!(
            g.data_points[0].value,
            Some(number_data_point::Value::AsInt(-2))
        );
        let Some(metric::Data::Gauge(g)) = &by_name("plugin_level").data else {
            panic!("a gauge");
        };
        assert_eq!(
            g.data_points[0].value,
            Some(number_data_point::Value::AsDouble(1.5))
        );

        let m = by_name("lat_seconds");
        assert_eq!(m.unit, "s");
        let Some(metric::Data::Histogram(hist)) = &m.data else {
            panic!("a histogram");
        };
        let p = &hist.data_points[0];
        assert_eq!(labels(&p.attributes), vec![("route".into(), "x".into())]);
        assert_eq!(p.count, 3);
        assert_eq!(p.explicit_bounds.len(), 14);
        assert_eq!(p.bucket_counts.len(), 15);
        assert_eq!(p.bucket_counts.iter().sum::<u64>(), 3);
        // 0.3 ms in the first bucket (<= 0.5 ms), 3 ms in (2.5 ms, 5 ms], 60 s past the last.
        assert_eq!(p.bucket_counts[0], 1);
        assert_eq!(p.bucket_counts[3], 1);
        assert_eq!(p.bucket_counts[14], 1);
        assert!(
            (p.sum.unwrap_or_default() - 60.0033).abs() < 1e-6,
            "{:?}",
            p.sum
        );
    }
}
