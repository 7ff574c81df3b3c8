//! The OTLP metrics messages the gateway sends, as prost structs with the field numbers of
//! `opentelemetry/proto/{collector/metrics,metrics}/v1/*.proto` (OTLP 1.x, stable). As for
//! traces, only the fields the gateway fills are declared, the common messages (resource,
//! scope, attributes) are the trace exporter's, and the end-to-end tests decode what is sent
//! with `opentelemetry-proto`.

use crate::telemetry::trace::proto::{InstrumentationScope, KeyValue, Resource};

/// `AGGREGATION_TEMPORALITY_CUMULATIVE`: every value counts from the process start.
pub(crate) const CUMULATIVE: i32 = 2;

/// `ExportMetricsServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExportMetricsServiceRequest {
    /// Metrics grouped by resource.
    #[prost(message, repeated, tag = "1")]
    pub(crate) resource_metrics: Vec<ResourceMetrics>,
}

/// `ResourceMetrics`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResourceMetrics {
    /// The process.
    #[prost(message, optional, tag = "1")]
    pub(crate) resource: Option<Resource>,
    /// Metrics grouped by instrumentation scope.
    #[prost(message, repeated, tag = "2")]
    pub(crate) scope_metrics: Vec<ScopeMetrics>,
}

/// `ScopeMetrics`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ScopeMetrics {
    /// Who made the metrics.
    #[prost(message, optional, tag = "1")]
    pub(crate) scope: Option<InstrumentationScope>,
    /// The metrics.
    #[prost(message, repeated, tag = "2")]
    pub(crate) metrics: Vec<Metric>,
}

/// `Metric`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Metric {
    /// Name (the Prometheus family name).
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    /// The family's help text.
    #[prost(string, tag = "2")]
    pub(crate) description: String,
    /// UCUM unit (`s`, `By`), empty when unitless.
    #[prost(string, tag = "3")]
    pub(crate) unit: String,
    /// The points.
    #[prost(oneof = "metric::Data", tags = "5, 7, 9")]
    pub(crate) data: Option<metric::Data>,
}

/// `Metric`'s oneof.
pub(crate) mod metric {
    /// `Metric.data`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub(crate) enum Data {
        /// `gauge`.
        #[prost(message, tag = "5")]
        Gauge(super::Gauge),
        /// `sum` (counters: monotonic, cumulative).
        #[prost(message, tag = "7")]
        Sum(super::Sum),
        /// `histogram`.
        #[prost(message, tag = "9")]
        Histogram(super::Histogram),
    }
}

/// `Gauge`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Gauge {
    /// One point per series.
    #[prost(message, repeated, tag = "1")]
    pub(crate) data_points: Vec<NumberDataPoint>,
}

/// `Sum`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Sum {
    /// One point per series.
    #[prost(message, repeated, tag = "1")]
    pub(crate) data_points: Vec<NumberDataPoint>,
    /// `AggregationTemporality`.
    #[prost(int32, tag = "2")]
    pub(crate) aggregation_temporality: i32,
    /// Counters only go up.
    #[prost(bool, tag = "3")]
    pub(crate) is_monotonic: bool,
}

/// `Histogram`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Histogram {
    /// One point per series.
    #[prost(message, repeated, tag = "1")]
    pub(crate) data_points: Vec<HistogramDataPoint>,
    /// `AggregationTemporality`.
    #[prost(int32, tag = "2")]
    pub(crate) aggregation_temporality: i32,
}

/// `NumberDataPoint`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct NumberDataPoint {
    /// The series' labels.
    #[prost(message, repeated, tag = "7")]
    pub(crate) attributes: Vec<KeyValue>,
    /// Since when the value counts.
    #[prost(fixed64, tag = "2")]
    pub(crate) start_time_unix_nano: u64,
    /// When it was read.
    #[prost(fixed64, tag = "3")]
    pub(crate) time_unix_nano: u64,
    /// The value.
    #[prost(oneof = "number_data_point::Value", tags = "4, 6")]
    pub(crate) value: Option<number_data_point::Value>,
}

/// `NumberDataPoint`'s oneof.
pub(crate) mod number_data_point {
    /// `NumberDataPoint.value`.
    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub(crate) enum Value {
        /// `as_double`.
        #[prost(double, tag = "4")]
        AsDouble(f64),
        /// `as_int`.
        #[prost(sfixed64, tag = "6")]
        AsInt(i64),
    }
}

/// `HistogramDataPoint`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HistogramDataPoint {
    /// The series' labels.
    #[prost(message, repeated, tag = "9")]
    pub(crate) attributes: Vec<KeyValue>,
    /// Since when the values count.
    #[prost(fixed64, tag = "2")]
    pub(crate) start_time_unix_nano: u64,
    /// When they were read.
    #[prost(fixed64, tag = "3")]
    pub(crate) time_unix_nano: u64,
    /// Observations.
    #[prost(fixed64, tag = "4")]
    pub(crate) count: u64,
    /// Their sum.
    #[prost(double, optional, tag = "5")]
    pub(crate) sum: Option<f64>,
    /// Observations per bucket (not cumulative), one more than `explicit_bounds`.
    #[prost(fixed64, repeated, tag = "6")]
    pub(crate) bucket_counts: Vec<u64>,
    /// Upper bounds of the buckets.
    #[prost(double, repeated, tag = "7")]
    pub(crate) explicit_bounds: Vec<f64>,
}
