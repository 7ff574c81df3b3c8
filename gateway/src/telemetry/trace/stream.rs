//! Spans for L4 streams: one per TCP connection or UDP session, with the bytes both ways and
//! the target chosen. The stream proxy does not know about tracing; it runs the gateway's
//! observer (a stream filter with only `on_close`, see `stream_proxy::Resolver::observer`) first
//! on every connection, and the summary it gets at the close becomes the span. The observer
//! reads the current tracer when the connection ends, so connections that outlive a reload
//! report to the new exporter.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use gateway_config::model::StreamProtocol;
use stream_proxy::{CloseSummary, ConnectionInfo, Resolver, StreamFilter, StreamFilterFactory};

use super::Tracer;
use super::span::{self, Kind, SpanData, Status, Value};

/// Builds the per-connection observers of a generation whose config has `telemetry.traces`.
pub struct StreamTraceFactory {
    tracer: Arc<ArcSwapOption<Tracer>>,
}

impl StreamTraceFactory {
    /// An observer reporting to whatever tracer `tracer` holds when a connection ends.
    pub fn new(tracer: Arc<ArcSwapOption<Tracer>>) -> Self {
        Self { tracer }
    }
}

impl StreamFilterFactory for StreamTraceFactory {
    fn name(&self) -> &str {
        "trace"
    }

    fn create(&self) -> Box<dyn StreamFilter> {
        Box::new(StreamTrace {
            tracer: self.tracer.clone(),
        })
    }
}

/// `resolver` with the tracing observer added when `config` has `telemetry.traces`.
pub fn observed<'a>(
    resolver: &'a dyn Resolver,
    config: &gateway_config::Config,
    tracer: &Arc<ArcSwapOption<Tracer>>,
) -> Observed<'a> {
    let observer =
        config.telemetry.traces.as_ref().map(|_| {
            Arc::new(StreamTraceFactory::new(tracer.clone())) as Arc<dyn StreamFilterFactory>
        });
    Observed(resolver, observer)
}

/// A resolver plus the tracing observer.
pub struct Observed<'a>(&'a dyn Resolver, Option<Arc<dyn StreamFilterFactory>>);

impl Resolver for Observed<'_> {
    fn targets(&self, upstream: &str) -> Option<Arc<stream_proxy::upstream::Targets>> {
        self.0.targets(upstream)
    }

    fn plugin(&self, name: &str) -> Result<Arc<dyn StreamFilterFactory>, String> {
        self.0.plugin(name)
    }

    fn observer(&self) -> Option<Arc<dyn StreamFilterFactory>> {
        self.1.clone()
    }
}

struct StreamTrace {
    tracer: Arc<ArcSwapOption<Tracer>>,
}

#[async_trait::async_trait]
impl StreamFilter for StreamTrace {
    async fn on_close(&mut self, info: &ConnectionInfo, summary: &CloseSummary) {
        if let Some(tracer) = self.tracer.load_full() {
            record(&tracer, info, summary);
        }
    }
}

/// Records the span of one ended connection or session (a new trace, sampled by ratio).
pub fn record(tracer: &Arc<Tracer>, info: &ConnectionInfo, summary: &CloseSummary) {
    let cx = tracer.root();
    if !cx.sampled() {
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
        trace_id: cx.span.trace_id,
        span_id: cx.span.span_id,
        parent: cx.parent,
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
