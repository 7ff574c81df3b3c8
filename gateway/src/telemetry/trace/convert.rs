//! Finished spans as OTLP messages: the exporter task turns a batch of queued [`SpanData`] into
//! one `ExportTraceServiceRequest` of `opentelemetry-proto`'s prost types (the text the request
//! path left unformatted is made here). The resource and scope messages built here are the
//! metrics exporter's too.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, InstrumentationScope, KeyValue, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, SpanFlags, Status as OtlpStatus, span, status,
};

use super::span::{Kind, Parent, Resolved, SpanData, Status, Value};

/// W3C `sampled`: every exported span was sampled.
const SAMPLED: u32 = 0x01;

/// A string attribute.
pub(crate) fn string_kv(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
    }
}

fn kv(key: &str, value: &Value) -> KeyValue {
    let value = match value.resolve() {
        Resolved::Str(s) => any_value::Value::StringValue(s.into_owned()),
        Resolved::Int(i) => any_value::Value::IntValue(i),
        Resolved::Bool(b) => any_value::Value::BoolValue(b),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

fn text(value: &Value) -> String {
    match value.resolve() {
        Resolved::Str(s) => s.into_owned(),
        Resolved::Int(i) => i.to_string(),
        Resolved::Bool(b) => b.to_string(),
    }
}

/// The instrumentation scope of everything the gateway reports: itself.
pub(crate) fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "gateway".into(),
        version: crate::VERSION.into(),
        ..InstrumentationScope::default()
    }
}

/// The OTLP form of one span.
pub(crate) fn span(s: &SpanData) -> Span {
    let mut name = text(&s.name.0);
    if let Some(rest) = &s.name.1 {
        name.push(' ');
        name.push_str(&text(rest));
    }
    let (parent_span_id, remote) = match s.parent {
        Parent::None => (Vec::new(), 0),
        Parent::Local(id) => (id.to_vec(), 0),
        Parent::Remote(id) => (id.to_vec(), SpanFlags::ContextIsRemoteMask as u32),
    };
    let kind = match s.kind {
        Kind::Internal => span::SpanKind::Internal,
        Kind::Server => span::SpanKind::Server,
        Kind::Client => span::SpanKind::Client,
    };
    Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        trace_state: s
            .trace_state
            .as_ref()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default(),
        parent_span_id,
        flags: SAMPLED | SpanFlags::ContextHasIsRemoteMask as u32 | remote,
        name,
        kind: kind as i32,
        start_time_unix_nano: s.start.as_nanos() as u64,
        end_time_unix_nano: s.end.as_nanos() as u64,
        attributes: s.attributes.iter().map(|(k, v)| kv(k, v)).collect(),
        status: match &s.status {
            Status::Unset => None,
            Status::Error(message) => Some(OtlpStatus {
                message: message.to_string(),
                code: status::StatusCode::Error as i32,
            }),
        },
        ..Span::default()
    }
}

/// One export request for `spans`, under `resource` and the gateway's scope.
pub(crate) fn request(resource: &Resource, spans: &[SpanData]) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope()),
                spans: spans.iter().map(span).collect(),
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}
