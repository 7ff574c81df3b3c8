//! OpenTelemetry's standard environment variables (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_*`, `OTEL_TRACES_SAMPLER*`,
//! `OTEL_METRIC_EXPORT_INTERVAL`), applied to `telemetry:` where the file says nothing, so a
//! gateway deployed beside OpenTelemetry SDKs is configured the way they are. The file always
//! wins over the environment.

use indexmap::IndexMap;

use crate::model::{MetricsExportConfig, TelemetryConfig, TracesConfig};
use crate::units::Duration;

/// Why a variable cannot be used: its name and what is wrong.
pub(crate) type EnvProblem = (&'static str, String);

/// Which signal a variable is about.
#[derive(Clone, Copy)]
enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    fn http_path(self) -> &'static str {
        match self {
            Self::Traces => "v1/traces",
            Self::Metrics => "v1/metrics",
        }
    }
}

/// Fills what `telemetry` leaves unset from the variables `var` returns.
pub(crate) fn apply(
    telemetry: &mut TelemetryConfig,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<(), EnvProblem> {
    let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let resource = match get("OTEL_RESOURCE_ATTRIBUTES") {
        Some(text) => pairs(&text).map_err(|m| ("OTEL_RESOURCE_ATTRIBUTES", m))?,
        None => IndexMap::new(),
    };
    if telemetry.service_name.is_none() {
        telemetry.service_name =
            get("OTEL_SERVICE_NAME").or_else(|| resource.get("service.name").cloned());
    }
    for (key, value) in resource {
        if key != "service.name" {
            telemetry.resource_attributes.entry(key).or_insert(value);
        }
    }
    let disabled = get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));

    if telemetry.traces.is_none()
        && !disabled
        && let Some(endpoint) = endpoint(&get, Signal::Traces)?
    {
        telemetry.traces = Some(TracesConfig {
            otlp_endpoint: endpoint,
            sample_ratio: None,
            headers: IndexMap::new(),
        });
    }
    if let Some(traces) = telemetry.traces.as_mut() {
        if traces.sample_ratio.is_none() {
            traces.sample_ratio = sampler(&get)?;
        }
        add_headers(
            &mut traces.headers,
            &get,
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        )?;
    }

    if telemetry.metrics.is_none()
        && !disabled
        && let Some(endpoint) = endpoint(&get, Signal::Metrics)?
    {
        let interval = match get("OTEL_METRIC_EXPORT_INTERVAL") {
            Some(ms) => ms
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
                .ok_or((
                    "OTEL_METRIC_EXPORT_INTERVAL",
                    format!("`{ms}` is not a number of milliseconds above 0"),
                ))?,
            None => MetricsExportConfig::DEFAULT_INTERVAL,
        };
        telemetry.metrics = Some(MetricsExportConfig {
            otlp_endpoint: endpoint,
            interval,
            headers: IndexMap::new(),
        });
    }
    if let Some(metrics) = telemetry.metrics.as_mut() {
        add_headers(
            &mut metrics.headers,
            &get,
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        )?;
    }
    Ok(())
}

/// The endpoint of a signal: its own variable as it is, else the shared one, to which OTLP/HTTP
/// appends the signal's path (the specification's rule). `None` when neither is set.
fn endpoint(
    get: &dyn Fn(&str) -> Option<String>,
    signal: Signal,
) -> Result<Option<String>, EnvProblem> {
    let (own, own_protocol) = match signal {
        Signal::Traces => (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
        Signal::Metrics => (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        ),
    };
    let (name, protocol) = match get(own_protocol) {
        Some(p) => (own_protocol, p),
        None => (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            get("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap_or_else(|| "http/protobuf".into()),
        ),
    };
    let http = match protocol.trim() {
        "http/protobuf" => true,
        "grpc" => false,
        other => {
            return Err((
                name,
                format!("`{other}` is not supported: use grpc or http/protobuf"),
            ));
        }
    };
    if let Some(url) = get(own) {
        let url = url.trim().to_owned();
        // The gateway tells the two protocols apart by the path (`telemetry.traces`): an
        // OTLP/HTTP endpoint given without the signal's path gets it, as a gRPC one loses any.
        return Ok(Some(match http {
            true if !url.trim_end_matches('/').ends_with(signal.http_path()) => {
                format!("{}/{}", url.trim_end_matches('/'), signal.http_path())
            }
            _ => url,
        }));
    }
    Ok(get("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| {
        let base = base.trim().trim_end_matches('/');
        if http {
            format!("{base}/{}", signal.http_path())
        } else {
            base.to_owned()
        }
    }))
}

/// The sampling ratio `OTEL_TRACES_SAMPLER` (and its `_ARG`) names. The gateway's sampler is
/// always parent-based (a sampled parent is kept, so no trace is cut at the gateway): the
/// non-parent-based names mean their parent-based forms.
fn sampler(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<f64>, EnvProblem> {
    let Some(name) = get("OTEL_TRACES_SAMPLER") else {
        return Ok(None);
    };
    let ratio = match name.trim() {
        "always_on" | "parentbased_always_on" => 1.0,
        "always_off" | "parentbased_always_off" => 0.0,
        "traceidratio" | "parentbased_traceidratio" => match get("OTEL_TRACES_SAMPLER_ARG") {
            Some(arg) => arg
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or((
                    "OTEL_TRACES_SAMPLER_ARG",
                    format!("`{arg}` is not a ratio between 0.0 and 1.0"),
                ))?,
            None => 1.0,
        },
        other => {
            return Err((
                "OTEL_TRACES_SAMPLER",
                format!(
                    "`{other}` is not supported: use always_on, always_off, traceidratio or their parentbased_ forms"
                ),
            ));
        }
    };
    Ok(Some(ratio))
}

/// Adds the headers of the shared and the signal's variable to `headers`, the file's entries
/// and then the signal's own winning.
fn add_headers(
    headers: &mut IndexMap<String, String>,
    get: &dyn Fn(&str) -> Option<String>,
    own: &'static str,
) -> Result<(), EnvProblem> {
    for name in [own, "OTEL_EXPORTER_OTLP_HEADERS"] {
        if let Some(text) = get(name) {
            for (key, value) in pairs(&text).map_err(|m| (name, m))? {
                headers.entry(key.to_ascii_lowercase()).or_insert(value);
            }
        }
    }
    Ok(())
}

/// `key1=value1,key2=value2` with percent-encoded values (the W3C Baggage form the
/// specification uses for these lists).
fn pairs(text: &str) -> Result<IndexMap<String, String>, String> {
    let mut out = IndexMap::new();
    for item in text.split(',').filter(|i| !i.trim().is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("`{}` is not key=value", item.trim()))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("`{}` has no key", item.trim()));
        }
        out.insert(key.to_owned(), percent_decode(value.trim())?);
    }
    Ok(out)
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("`{text}` has a bad percent escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{text}` is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn applied(
        file: TelemetryConfig,
        vars: &[(&str, &str)],
    ) -> Result<TelemetryConfig, EnvProblem> {
        let mut t = file;
        apply(&mut t, &env(vars))?;
        Ok(t)
    }

    #[test]
    fn nothing_set_changes_nothing() {
        let t = applied(TelemetryConfig::default(), &[]).unwrap();
        assert!(t.service_name.is_none() && t.traces.is_none() && t.metrics.is_none());
        assert!(t.resource_attributes.is_empty());
    }

    #[test]
    fn the_shared_endpoint_gets_each_signals_path_over_http() {
        let t = applied(
            TelemetryConfig::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_SERVICE_NAME", "edge"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod,team=a%20b,service.name=ignored",
                ),
                ("OTEL_EXPORTER_OTLP_HEADERS", "Api-Key=s%3Dcret"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
            ],
        )
        .unwrap();
        assert_eq!(t.service_name.as_deref(), Some("edge"));
        assert_eq!(t.resource_attributes["deployment.environment"], "prod");
        assert_eq!(t.resource_attributes["team"], "a b");
        assert!(!t.resource_attributes.contains_key("service.name"));
        let traces = t.traces.unwrap();
        assert_eq!(traces.otlp_endpoint, "http://collector:4318/v1/traces");
        assert_eq!(traces.sample_ratio, Some(0.25));
        assert_eq!(traces.headers["api-key"], "s=cret");
        let metrics = t.metrics.unwrap();
        assert_eq!(metrics.otlp_endpoint, "http://collector:4318/v1/metrics");
        assert_eq!(metrics.interval.get(), std::time::Duration::from_secs(5));
    }

    #[test]
    fn grpc_endpoints_stay_as_they_are_and_signal_variables_win() {
        let t = applied(
            TelemetryConfig::default(),
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                (
                    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                    "https://metrics:4318/v1/metrics",
                ),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource"),
            ],
        )
        .unwrap();
        assert_eq!(t.traces.unwrap().otlp_endpoint, "http://collector:4317");
        assert_eq!(
            t.metrics.unwrap().otlp_endpoint,
            "https://metrics:4318/v1/metrics"
        );
        assert_eq!(t.service_name.as_deref(), Some("from-resource"));
    }

    #[test]
    fn the_file_wins() {
        let file = TelemetryConfig {
            service_name: Some("file".into()),
            traces: Some(TracesConfig {
                otlp_endpoint: "http://file:4317".into(),
                sample_ratio: Some(0.5),
                headers: IndexMap::from([("api-key".to_owned(), "file".to_owned())]),
            }),
            ..TelemetryConfig::default()
        };
        let t = applied(
            file,
            &[
                ("OTEL_SERVICE_NAME", "env"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                ("OTEL_TRACES_SAMPLER", "always_off"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=env,x-other=1"),
                ("OTEL_SDK_DISABLED", "true"),
            ],
        )
        .unwrap();
        assert_eq!(t.service_name.as_deref(), Some("file"));
        let traces = t.traces.unwrap();
        assert_eq!(traces.otlp_endpoint, "http://file:4317");
        assert_eq!(traces.sample_ratio, Some(0.5));
        assert_eq!(traces.headers["api-key"], "file");
        assert_eq!(traces.headers["x-other"], "1");
        assert!(t.metrics.is_none(), "OTEL_SDK_DISABLED adds no exporter");
    }

    #[test]
    fn bad_values_name_their_variable() {
        for (vars, variable) in [
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                ],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                    ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
                ],
                "OTEL_TRACES_SAMPLER",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                vec![("OTEL_RESOURCE_ATTRIBUTES", "novalue")],
                "OTEL_RESOURCE_ATTRIBUTES",
            ),
            (
                vec![("OTEL_RESOURCE_ATTRIBUTES", "a=%zz")],
                "OTEL_RESOURCE_ATTRIBUTES",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                    ("OTEL_EXPORTER_OTLP_HEADERS", "=x"),
                ],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                    ("OTEL_METRIC_EXPORT_INTERVAL", "soon"),
                ],
                "OTEL_METRIC_EXPORT_INTERVAL",
            ),
        ] {
            let err = applied(TelemetryConfig::default(), &vars).unwrap_err();
            assert_eq!(err.0, variable, "{err:?}");
        }
    }
}
