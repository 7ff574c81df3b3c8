//! The OTLP trace messages the gateway sends, as prost structs with the field numbers of
//! `opentelemetry/proto/{collector/trace,trace,common,resource}/v1/*.proto` (OTLP 1.x, stable).
//! Only the fields the gateway fills are declared: protobuf readers skip nothing they expect,
//! and the end-to-end tests decode what is sent with the `opentelemetry-proto` crate, so a
//! wrong tag would fail there. Declaring them here keeps that crate (and the OpenTelemetry SDK
//! it depends on) out of the gateway.

use super::span::{Kind, Parent, Resolved, SpanData, Status, Value};

/// `ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExportTraceServiceRequest {
    /// Spans grouped by resource.
    #[prost(message, repeated, tag = "1")]
    pub(crate) resource_spans: Vec<ResourceSpans>,
}

/// `ResourceSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResourceSpans {
    /// The process.
    #[prost(message, optional, tag = "1")]
    pub(crate) resource: Option<Resource>,
    /// Spans grouped by instrumentation scope.
    #[prost(message, repeated, tag = "2")]
    pub(crate) scope_spans: Vec<ScopeSpans>,
}

/// `Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Resource {
    /// `service.name` and friends.
    #[prost(message, repeated, tag = "1")]
    pub(crate) attributes: Vec<KeyValue>,
}

/// `ScopeSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ScopeSpans {
    /// Who made the spans.
    #[prost(message, optional, tag = "1")]
    pub(crate) scope: Option<InstrumentationScope>,
    /// The spans.
    #[prost(message, repeated, tag = "2")]
    pub(crate) spans: Vec<Span>,
}

/// `InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct InstrumentationScope {
    /// Name.
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    /// Version.
    #[prost(string, tag = "2")]
    pub(crate) version: String,
}

/// `Span`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Span {
    /// 16 bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) trace_id: Vec<u8>,
    /// 8 bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) span_id: Vec<u8>,
    /// W3C `tracestate`.
    #[prost(string, tag = "3")]
    pub(crate) trace_state: String,
    /// 8 bytes, empty for a root span.
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) parent_span_id: Vec<u8>,
    /// Name.
    #[prost(string, tag = "5")]
    pub(crate) name: String,
    /// `SpanKind`: 1 internal, 2 server, 3 client.
    #[prost(int32, tag = "6")]
    pub(crate) kind: i32,
    /// Start.
    #[prost(fixed64, tag = "7")]
    pub(crate) start_time_unix_nano: u64,
    /// End.
    #[prost(fixed64, tag = "8")]
    pub(crate) end_time_unix_nano: u64,
    /// Attributes.
    #[prost(message, repeated, tag = "9")]
    pub(crate) attributes: Vec<KeyValue>,
    /// Outcome.
    #[prost(message, optional, tag = "15")]
    pub(crate) status: Option<SpanStatus>,
    /// W3C trace flags in bits 0-7; bits 8 and 9 say whether the parent is remote.
    #[prost(fixed32, tag = "16")]
    pub(crate) flags: u32,
}

/// `Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SpanStatus {
    /// Description of the error.
    #[prost(string, tag = "2")]
    pub(crate) message: String,
    /// 0 unset, 1 ok, 2 error.
    #[prost(int32, tag = "3")]
    pub(crate) code: i32,
}

/// `KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct KeyValue {
    /// Key.
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    /// Value.
    #[prost(message, optional, tag = "2")]
    pub(crate) value: Option<AnyValue>,
}

/// `AnyValue` (the string, boolean and integer cases).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AnyValue {
    /// The value.
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3")]
    pub(crate) value: Option<any_value::Value>,
}

/// `AnyValue`'s oneof.
pub(crate) mod any_value {
    /// `AnyValue.value`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub(crate) enum Value {
        /// `string_value`.
        #[prost(string, tag = "1")]
        String(String),
        /// `bool_value`.
        #[prost(bool, tag = "2")]
        Bool(bool),
        /// `int_value`.
        #[prost(int64, tag = "3")]
        Int(i64),
    }
}

/// `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`.
const HAS_IS_REMOTE: u32 = 0x100;
/// `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`.
const IS_REMOTE: u32 = 0x200;
/// W3C `sampled`: every exported span was sampled.
const SAMPLED: u32 = 0x01;

/// A string attribute.
pub(crate) fn string_kv(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::String(value.into())),
        }),
    }
}

fn kv(key: &str, value: &Value) -> KeyValue {
    let value = match value.resolve() {
        Resolved::Str(s) => any_value::Value::String(s.into_owned()),
        Resolved::Int(i) => any_value::Value::Int(i),
        Resolved::Bool(b) => any_value::Value::Bool(b),
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
        Parent::Remote(id) => (id.to_vec(), IS_REMOTE),
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
        name,
        kind: match s.kind {
            Kind::Internal => 1,
            Kind::Server => 2,
            Kind::Client => 3,
        },
        start_time_unix_nano: s.start.as_nanos() as u64,
        end_time_unix_nano: s.end.as_nanos() as u64,
        attributes: s.attributes.iter().map(|(k, v)| kv(k, v)).collect(),
        status: match &s.status {
            Status::Unset => None,
            Status::Error(message) => Some(SpanStatus {
                message: message.to_string(),
                code: 2,
            }),
        },
        flags: SAMPLED | HAS_IS_REMOTE | remote,
    }
}

/// One export request for `spans`, under `resource` and the gateway's scope.
pub(crate) fn request(resource: &Resource, spans: &[SpanData]) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "gateway".into(),
                    version: crate::VERSION.into(),
                }),
                spans: spans.iter().map(span).collect(),
            }],
        }],
    }
}
