//! Finished spans as OTLP messages: the exporter task turns a batch of queued [`SpanData`] into
//! one `ExportTraceServiceRequest` of `opentelemetry-proto`'s prost types (the text the request
//! path left unformatted is made here). The resource and scope messages built here are the
//! metrics exporter's too.
//!
//! A [`Batch`] keeps its request between exports and overwrites it in place: a span's ids,
//! name and attribute strings are written into the previous batch's buffers, so converting a
//! span allocates nothing once a batch of its size has been sent, and sending frees nothing.
//! Every text and id field of the messages is an owned `String` or `Vec<u8>`: built afresh,
//! each attribute cost two allocations and two frees, most of what converting a span cost
//! (docs/performance-log.md, "OTLP messages from `opentelemetry-proto`"). The price is the
//! largest batch's buffers, kept for as long as the tracer.

use std::fmt::Write as _;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
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

/// The instrumentation scope of everything the gateway reports: itself.
pub(crate) fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "gateway".into(),
        version: crate::VERSION.into(),
        ..InstrumentationScope::default()
    }
}

/// One tracer's export request, rewritten for each batch.
pub(crate) struct Batch {
    /// One resource with one scope: [`Batch::spans_mut`] relies on it.
    request: ExportTraceServiceRequest,
    /// Spans of an earlier, larger batch, kept for their buffers (at most a batch's worth).
    spare: Vec<Span>,
}

impl Batch {
    /// An empty request under `resource` and the gateway's scope.
    pub(crate) fn new(resource: Resource) -> Self {
        Self {
            request: ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(resource),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(scope()),
                        ..ScopeSpans::default()
                    }],
                    ..ResourceSpans::default()
                }],
            },
            spare: Vec::new(),
        }
    }

    /// The export request for `spans`, written over the previous one.
    pub(crate) fn fill(&mut self, spans: &[SpanData]) -> &ExportTraceServiceRequest {
        let mut out = std::mem::take(self.spans_mut());
        if out.len() > spans.len() {
            self.spare.extend(out.drain(spans.len()..));
        }
        while out.len() < spans.len() {
            out.push(self.spare.pop().unwrap_or_default());
        }
        for (o, s) in out.iter_mut().zip(spans) {
            write_span(o, s);
        }
        *self.spans_mut() = out;
        &self.request
    }

    fn spans_mut(&mut self) -> &mut Vec<Span> {
        &mut self.request.resource_spans[0].scope_spans[0].spans
    }
}

/// Overwrites `out` with the OTLP form of `s`.
fn write_span(out: &mut Span, s: &SpanData) {
    set_bytes(&mut out.trace_id, &s.trace_id);
    set_bytes(&mut out.span_id, &s.span_id);
    let (parent, remote): (&[u8], u32) = match &s.parent {
        Parent::None => (&[], 0),
        Parent::Local(id) => (id, 0),
        Parent::Remote(id) => (id, SpanFlags::ContextIsRemoteMask as u32),
    };
    set_bytes(&mut out.parent_span_id, parent);
    out.flags = SAMPLED | SpanFlags::ContextHasIsRemoteMask as u32 | remote;
    out.trace_state.clear();
    if let Some(state) = &s.trace_state {
        out.trace_state
            .push_str(&String::from_utf8_lossy(state.as_bytes()));
    }
    out.name.clear();
    push_text(&mut out.name, &s.name.0);
    if let Some(rest) = &s.name.1 {
        out.name.push(' ');
        push_text(&mut out.name, rest);
    }
    out.kind = match s.kind {
        Kind::Internal => SpanKind::Internal,
        Kind::Server => SpanKind::Server,
        Kind::Client => SpanKind::Client,
    } as i32;
    out.start_time_unix_nano = s.start.as_nanos() as u64;
    out.end_time_unix_nano = s.end.as_nanos() as u64;
    out.attributes.truncate(s.attributes.len());
    for (i, (key, value)) in s.attributes.iter().enumerate() {
        if i == out.attributes.len() {
            out.attributes.push(KeyValue::default());
        }
        let kv = &mut out.attributes[i];
        kv.key.clear();
        kv.key.push_str(key);
        set_value(kv.value.get_or_insert_with(AnyValue::default), value);
    }
    out.status = match &s.status {
        Status::Unset => None,
        Status::Error(message) => Some(OtlpStatus {
            message: message.to_string(),
            code: StatusCode::Error as i32,
        }),
    };
}

fn set_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.clear();
    out.extend_from_slice(bytes);
}

/// `value` in `out`, into the string already there when both are text.
fn set_value(out: &mut AnyValue, value: &Value) {
    let text = match value.resolve() {
        Resolved::Str(text) => text,
        Resolved::Int(i) => {
            out.value = Some(any_value::Value::IntValue(i));
            return;
        }
        Resolved::Bool(b) => {
            out.value = Some(any_value::Value::BoolValue(b));
            return;
        }
    };
    match &mut out.value {
        Some(any_value::Value::StringValue(s)) => {
            s.clear();
            s.push_str(&text);
        }
        other => *other = Some(any_value::Value::StringValue(text.into_owned())),
    }
}

/// Appends `value` as text.
fn push_text(out: &mut String, value: &Value) {
    match value.resolve() {
        Resolved::Str(s) => out.push_str(&s),
        Resolved::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Resolved::Bool(b) => out.push_str(if b { "true" } else { "false" }),
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

    fn span(s: &SpanData) -> Span {
        let mut out = Span::default();
        write_span(&mut out, s);
        out
    }

    #[test]
    fn a_span_becomes_the_otlp_span() {
        let s = span(&data(
            Parent::Remote([3; 8]),
            Status::Error("refused".into()),
        ));
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
            .map(|kv| {
                (
                    kv.key.as_str(),
                    kv.value.as_ref().and_then(|v| v.value.clone()),
                )
            })
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
        let mut batch = Batch::new(resource.clone());
        let r = batch.fill(&spans);
        let [rs] = &r.resource_spans[..] else {
            panic!("one resource");
        };
        assert_eq!(rs.resource.as_ref(), Some(&resource));
        let [ss] = &rs.scope_spans[..] else {
            panic!("one scope");
        };
        assert_eq!(ss.scope, Some(scope()));
        assert_eq!(ss.spans, spans.iter().map(span).collect::<Vec<_>>());
    }

    #[test]
    fn a_reused_batch_says_what_a_fresh_one_says() {
        let mut other = data(Parent::Local([5; 8]), Status::Error("x".into()));
        other.trace_state = None;
        other.name = (Value::Int(7), None);
        other.kind = Kind::Client;
        other.attributes = vec![
            ("url.path", Value::Int(1)),
            ("a", Value::Static("longer text than before")),
            ("b", Value::Bool(false)),
            ("c", Value::Static("more")),
        ];
        let first = [
            data(Parent::Remote([3; 8]), Status::Error("refused".into())),
            data(Parent::None, Status::Unset),
            other.clone(),
        ];
        let resource = Resource::default();
        let mut reused = Batch::new(resource.clone());
        reused.fill(&first);
        // Fewer spans, attributes of other types and counts in each place.
        for next in [
            vec![other.clone(), data(Parent::None, Status::Unset)],
            vec![data(Parent::None, Status::Unset)],
            vec![
                other.clone(),
                other.clone(),
                data(Parent::None, Status::Unset),
                other,
            ],
        ] {
            let fresh = Batch::new(resource.clone()).fill(&next).clone();
            assert_eq!(reused.fill(&next), &fresh);
        }
    }
}
