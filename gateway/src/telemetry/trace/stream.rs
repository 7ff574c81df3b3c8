//! Spans for L4 streams: one per TCP connection or UDP session, with the bytes both ways and
//! the target chosen, made from the summary the stream observer
//! (`telemetry::stream_observer`) gets when the connection ends.

use std::sync::Arc;

use gateway_config::model::StreamProtocol;
use stream_proxy::{CloseSummary, ConnectionInfo};

use super::Tracer;
use super::context::SpanContext;
use super::span::{self, Kind, Parent, SpanData, Status, Value};

/// Records the span of one ended connection or session (a new trace, sampled by ratio):
/// `span`, the context made when it was accepted ([`Tracer::root_span`]), or a new one when
/// traces were off then.
pub fn record(
    tracer: &Arc<Tracer>,
    info: &ConnectionInfo,
    summary: &CloseSummary,
    span: Option<SpanContext>,
) {
    let span = span.unwrap_or_else(|| tracer.root_span());
    if !span.sampled {
        return;
    }
    let transport = match info.protocol {
        StreamProtocol::Udp => "udp",
        _ => "tcp",
    };
    let mut a = Vec::with_capacity(11);
    a.push(("network.transport", Value::Static(transport)));
    a.push(("gateway.stream", Value::Shared(info.stream.clone())));
    a.push(("client.address", Value::Ip(info.client.ip())));
    a.push(("client.port", Value::Int(i64::from(info.client.port()))));
    a.push(("server.address", Value::Ip(info.local.ip())));
    a.push(("server.port", Value::Int(i64::from(info.local.port()))));
    if let Some(target) = summary.target {
        a.push((
            "gateway.stream.target",
            Value::Owned(target.to_string().into()),
        ));
    }
    if let Some(sni) = &summary.sni {
        a.push(("tls.client.server_name", Value::Owned(sni.as_str().into())));
    }
    a.push((
        "gateway.stream.bytes_in",
        Value::Int(summary.bytes_in as i64),
    ));
    a.push((
        "gateway.stream.bytes_out",
        Value::Int(summary.bytes_out as i64),
    ));
    let status = match &summary.error {
        Some(e) => Status::Error(e.as_str().into()),
        None => Status::Unset,
    };
    let end = span::now();
    tracer.record(SpanData {
        trace_id: span.trace_id,
        span_id: span.span_id,
        parent: Parent::None,
        trace_state: None,
        name: (
            Value::Static(transport),
            Some(Value::Shared(info.stream.clone())),
        ),
        kind: Kind::Server,
        start: end.saturating_sub(summary.duration),
        end,
        attributes: a,
        status,
    });
}
