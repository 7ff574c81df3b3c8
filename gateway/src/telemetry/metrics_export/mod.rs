//! OTLP metrics export (`telemetry.metrics`): every `interval`, a background task reads the
//! registry (what `GET /metrics` shows, collectors included), converts it (`convert`) into
//! `opentelemetry-proto`'s messages and sends it to the collector over the trace exporter's
//! OTLP transport, gRPC or HTTP/protobuf. Values are cumulative since the process started, as
//! in Prometheus.
//!
//! Nothing on the request path changes: the task reads the same atomics a scrape reads. At
//! most one export is in flight; a slow collector makes the task skip ticks, a failed or
//! timed-out export is counted (`gateway_metrics_export_failures_total`) and the next tick
//! sends fresh values. On shutdown the last values are sent once more.

mod convert;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gateway_config::model::TelemetryConfig;
use indexmap::IndexMap;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{ResourceMetrics, ScopeMetrics};
use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::metrics::{Counter, Registry};
use super::otlp::{Endpoint, Signal, Transport, export_headers};
use super::trace::convert::scope;
use super::trace::{DEFAULT_SERVICE_NAME, resource};

/// Longest one export may take, connection included (OTLP exporters default to 10 s); also
/// never longer than the interval, so a stuck export cannot hold back the next one for long.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// What an exporter was built from; a reload with equal settings keeps the running one.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    endpoint: String,
    interval: Duration,
    headers: IndexMap<String, String>,
    service_name: String,
    resource_attributes: IndexMap<String, String>,
}

impl Settings {
    fn of(config: &TelemetryConfig) -> Option<Self> {
        let m = config.metrics.as_ref()?;
        Some(Self {
            endpoint: m.otlp_endpoint.clone(),
            interval: m.interval.get(),
            headers: m.headers.clone(),
            service_name: config
                .service_name
                .clone()
                .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
            resource_attributes: config.resource_attributes.clone(),
        })
    }
}

/// Why `telemetry.metrics` cannot be used: the key at fault and a message.
pub type ConfigProblem = (&'static str, String);

/// Checks `config.metrics` the way [`MetricsExporter::start`] will, without starting anything.
pub fn check(config: &TelemetryConfig) -> Result<(), ConfigProblem> {
    let Some(m) = &config.metrics else {
        return Ok(());
    };
    if m.interval.get().is_zero() {
        return Err((
            "telemetry.metrics.interval",
            "the interval must be longer than 0".into(),
        ));
    }
    Endpoint::parse(&m.otlp_endpoint, Signal::Metrics)
        .map_err(|e| ("telemetry.metrics.otlp_endpoint", e))?;
    export_headers(&m.headers).map_err(|e| ("telemetry.metrics.headers", e))?;
    Ok(())
}

/// The export task of one `telemetry.metrics` setting. Dropping it stops the task.
pub struct MetricsExporter {
    settings: Settings,
    /// Cancelled on drop: the task ends at once.
    stop: CancellationToken,
    /// Cancelled by [`MetricsExporter::shutdown`]: the task sends once more, then ends.
    last: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for MetricsExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsExporter")
            .field("endpoint", &self.settings.endpoint)
            .field("interval", &self.settings.interval)
            .finish_non_exhaustive()
    }
}

impl MetricsExporter {
    /// Starts exporting `registry` as `config.metrics` asks; `Ok(None)` without it. Must run
    /// inside the Tokio runtime. `started` is when the values began counting.
    pub fn start(
        config: &TelemetryConfig,
        registry: &Arc<Registry>,
        started: SystemTime,
    ) -> Result<Option<Arc<Self>>, ConfigProblem> {
        check(config)?;
        let Some(settings) = Settings::of(config) else {
            return Ok(None);
        };
        let endpoint = Endpoint::parse(&settings.endpoint, Signal::Metrics)
            .map_err(|e| ("telemetry.metrics.otlp_endpoint", e))?;
        let headers =
            export_headers(&settings.headers).map_err(|e| ("telemetry.metrics.headers", e))?;
        let task = Task {
            registry: registry.clone(),
            transport: Transport::new(endpoint, headers),
            resource: resource(&settings.service_name, &settings.resource_attributes),
            started: started.duration_since(UNIX_EPOCH).unwrap_or_default(),
            interval: settings.interval,
            endpoint: settings.endpoint.clone(),
            exports: registry.counter(
                "gateway_metrics_exports_total",
                "OTLP metrics export requests the collector accepted.",
                &[],
            ),
            failures: registry.counter(
                "gateway_metrics_export_failures_total",
                "OTLP metrics export requests that failed or timed out.",
                &[],
            ),
            failing: false,
        };
        let (stop, last) = (CancellationToken::new(), CancellationToken::new());
        let handle = tokio::spawn(task.run(stop.clone(), last.clone()));
        Ok(Some(Arc::new(Self {
            settings,
            stop,
            last,
            task: Mutex::new(Some(handle)),
        })))
    }

    /// Whether `config` asks for exactly this exporter.
    pub fn matches(&self, config: &TelemetryConfig) -> bool {
        Settings::of(config).as_ref() == Some(&self.settings)
    }

    /// Sends the values once more and stops, waiting at most `within` (shutdown).
    pub async fn shutdown(&self, within: Duration) {
        self.last.cancel();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let abort = task.abort_handle();
            if tokio::time::timeout(within, task).await.is_err() {
                abort.abort();
                tracing::warn!("the last metrics export did not finish within the drain");
            }
        }
    }
}

impl Drop for MetricsExporter {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The task's state.
struct Task {
    registry: Arc<Registry>,
    transport: Transport,
    resource: Resource,
    /// Since the Unix epoch: the start of every cumulative value.
    started: Duration,
    interval: Duration,
    endpoint: String,
    exports: Counter,
    failures: Counter,
    /// Whether the last export failed (a dead collector is logged once, not per tick).
    failing: bool,
}

impl Task {
    async fn run(mut self, stop: CancellationToken, last: CancellationToken) {
        let start = tokio::time::Instant::now() + self.interval;
        let mut tick = tokio::time::interval_at(start, self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let final_export = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = last.cancelled() => true,
                _ = tick.tick() => false,
            };
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = self.export() => {}
            }
            if final_export {
                return;
            }
        }
    }

    async fn export(&mut self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let converted = convert::convert(&self.registry.render(), self.started, now);
        if converted.skipped > 0 {
            tracing::debug!(
                lines = converted.skipped,
                "metrics lines not understood by the OTLP export"
            );
        }
        let message = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(scope()),
                    metrics: converted.metrics,
                    ..ScopeMetrics::default()
                }],
                ..ResourceMetrics::default()
            }],
        };
        let within = self.interval.min(EXPORT_TIMEOUT);
        let error = match tokio::time::timeout(within, self.transport.export(&message)).await {
            Ok(Ok(())) => {
                self.exports.inc();
                if self.failing {
                    self.failing = false;
                    tracing::info!(endpoint = %self.endpoint, "metrics export recovered");
                }
                return;
            }
            Ok(Err(e)) => e,
            Err(_) => {
                self.transport.reset();
                format!("timed out after {within:?}")
            }
        };
        self.failures.inc();
        if self.failing {
            tracing::debug!(endpoint = %self.endpoint, %error, "metrics export failed");
        } else {
            self.failing = true;
            tracing::warn!(endpoint = %self.endpoint, %error, "metrics export failed; retrying at the next interval");
        }
    }
}

#[cfg(test)]
mod tests {
    use gateway_config::model::MetricsExportConfig;
    use gateway_config::units::Duration as ConfigDuration;

    use super::*;

    fn config(endpoint: &str, interval: ConfigDuration) -> TelemetryConfig {
        TelemetryConfig {
            metrics: Some(MetricsExportConfig {
                otlp_endpoint: endpoint.into(),
                interval,
                headers: IndexMap::new(),
            }),
            ..TelemetryConfig::default()
        }
    }

    #[test]
    fn check_names_the_key_at_fault() {
        let ten = ConfigDuration::from_secs(10);
        assert!(check(&TelemetryConfig::default()).is_ok());
        assert!(check(&config("http://collector:4317", ten)).is_ok());
        assert!(check(&config("https://collector/v1/metrics", ten)).is_ok());
        let (key, _) = check(&config("ftp://collector", ten)).unwrap_err();
        assert_eq!(key, "telemetry.metrics.otlp_endpoint");
        let (key, message) = check(&config(
            "http://collector:4317",
            ConfigDuration::from_secs(0),
        ))
        .unwrap_err();
        assert_eq!(key, "telemetry.metrics.interval");
        assert!(message.contains("longer than 0"), "{message}");
    }

    #[tokio::test]
    async fn equal_settings_keep_the_exporter_and_drop_stops_it() {
        let registry = Registry::new();
        let cfg = config("http://127.0.0.1:9", ConfigDuration::from_secs(10));
        let exporter = MetricsExporter::start(&cfg, &registry, SystemTime::now())
            .expect("valid")
            .expect("configured");
        assert!(exporter.matches(&cfg));
        let other = config("http://127.0.0.1:9", ConfigDuration::from_secs(5));
        assert!(!exporter.matches(&other));
        assert!(!exporter.matches(&TelemetryConfig::default()));
        let task = exporter
            .task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .expect("task");
        drop(exporter);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends when the exporter is dropped")
            .expect("no panic");
    }
}
