//! Finished spans as OTLP messages: the exporter task turns a batch of queued [`SpanData`] into
//! one `ExportTraceServiceRequest` of `opentelemetry-proto`'s prost types (the text the request
//! path left unformatted is made here). The resource and scope messages built here are the
//! metrics exporter's too.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, InstrumentationScope, KeyValue, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, SpanFlags, Status as OtlpStatus,
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
        Kind::Internal => SpanKind::Internal,
        Kind::Server => SpanKind::Server,
        Kind::Client => SpanKind::Client,
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
                code: StatusCode::Error as i32,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderValue;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;

    use super::*;

    fn data(parent: Parent, status: Status) -> SpanData {
        SpanData {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent,
            trace_state: Some(HeaderValue::from_static("k=v")),
            name: (Value::Static("GET"), Some(Value::Shared("api".into()))),
            kind: Kind::Server,
            start: Duration::from_nanos(5),
            end: Duration::from_nanos(9),
            attributes: vec![
                ("http.response.status_code", Value::Int(502)),
                ("url.path", Value::Owned("/a".into())),
                ("error", Value::Bool(true)),
            ],
            status,
        }
    }

    #[test]
    fn a_span_becomes_the_otlp_span() {
        let s = span(&data(Parent::Remote([3; 8]), Status::Error("refused".into())));
        assert_eq!((s.trace_id, s.span_id), (vec![1; 16], vec![2; 8]));
        assert_eq!(s.parent_span_id, vec![3; 8]);
        assert_eq!(s.trace_state, "k=v");
        assert_eq!(s.name, "GET api");
        assert_eq!(s.kind, SpanKind::Server as i32);
        assert_eq!((s.start_time_unix_nano, s.end_time_unix_nano), (5, 9));
        // Sampled, and the parent is known to be remote.
        assert_eq!(s.flags, 0x301);
        let values: Vec<_> = s
            .attributes
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_ref().and_then(|v| v.value.clone())))
            .collect();
        assert_eq!(
            values,
            vec![
                ("http.response.status_code", Some(Any::IntValue(502))),
                ("url.path", Some(Any::StringValue("/a".into()))),
                ("error", Some(Any::BoolValue(true))),
            ]
        );
        let status = s.status.expect("an error status");
        assert_eq!((status.code, status.message.as_str()), (2, "refused"));

        let root = span(&data(Parent::None, Status::Unset));
        assert!(root.parent_span_id.is_empty());
        assert_eq!(root.flags, 0x101);
        assert_eq!(root.status, None);
        let local = span(&data(Parent::Local([4; 8]), Status::Unset));
        assert_eq!((local.parent_span_id, local.flags), (vec![4; 8], 0x101));
    }

    #[test]
    fn a_request_holds_the_resource_the_scope_and_the_spans() {
        let resource = Resource {
            attributes: vec![string_kv("service.name", "edge")],
            ..Resource::default()
        };
        let spans = [
            data(Parent::None, Status::Unset),
            data(Parent::Local([4; 8]), Status::Unset),
        ];
        let r = request(&resource, &spans);
        let [rs] = &r.resource_spans[..] else {
            panic!("one resource");
        };
        assert_eq!(rs.resource.as_ref(), Some(&resource));
        let [ss] = &rs.scope_spans[..] else {
            panic!("one scope");
        };
        assert_eq!(ss.scope, Some(scope()));
        assert_eq!(ss.spans.len(), 2);
    }
}
