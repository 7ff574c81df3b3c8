//! The gateway's observer of L4 streams. The stream proxy knows neither tracing nor the access
//! log; it runs this observer (a stream filter with only `on_connect`, which makes the
//! connection's span ids for its log lines when traces are on, and `on_close`, see
//! `stream_proxy::Resolver::observer`) first on every TCP connection and UDP session when the
//! config has `telemetry.traces` or `telemetry.access_log`, and the summary it gets at the close
//! becomes a span and an access-log record. Both sinks are read when the connection ends, so
//! connections that outlive a reload report to the new ones. Without either section no observer
//! is attached and a connection pays nothing for it.

use std::sync::Arc;
use std::time::SystemTime;

use gateway_config::model::StreamProtocol;
use stream_proxy::log_ids::LogIds;
use stream_proxy::{
    CloseSummary, ConnectionInfo, Decision, Resolver, StreamFilter, StreamFilterFactory,
};

use super::Switch;
use super::access_log::{AccessLog, StreamRecord};
use super::trace::context::SpanContext;
use super::trace::{Tracer, stream::record as record_span};

/// Builds one observer per connection.
pub struct StreamObserverFactory {
    tracer: Arc<Switch<Tracer>>,
    access_log: Arc<Switch<AccessLog>>,
}

impl StreamFilterFactory for StreamObserverFactory {
    fn name(&self) -> &str {
        "observer"
    }

    fn create(&self) -> Box<dyn StreamFilter> {
        Box::new(StreamObserver {
            tracer: self.tracer.clone(),
            access_log: self.access_log.clone(),
            span: None,
        })
    }
}

/// `resolver` with the observer added when `config` traces or logs.
pub fn observed<'a>(
    resolver: &'a dyn Resolver,
    config: &gateway_config::Config,
    telemetry: &super::Telemetry,
) -> Observed<'a> {
    let wanted = config.telemetry.traces.is_some() || config.telemetry.access_log.is_some();
    let observer = wanted.then(|| {
        Arc::new(StreamObserverFactory {
            tracer: telemetry.tracer.clone(),
            access_log: telemetry.access_log.clone(),
        }) as Arc<dyn StreamFilterFactory>
    });
    Observed(resolver, observer)
}

/// A resolver plus the observer.
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

struct StreamObserver {
    tracer: Arc<Switch<Tracer>>,
    access_log: Arc<Switch<AccessLog>>,
    /// The connection's span, made when it was accepted with traces on, so that the lines
    /// logged while it is served can name it.
    span: Option<SpanContext>,
}

#[async_trait::async_trait]
impl StreamFilter for StreamObserver {
    async fn on_connect(&mut self, _info: &ConnectionInfo) -> Decision {
        // The ids are made here rather than at the close (the same work, earlier), for the
        // lines logged meanwhile; with traces off this is one atomic load.
        if let Some(tracer) = self.tracer.load_full() {
            self.span = Some(tracer.root_span());
        }
        Decision::Continue
    }

    fn log_ids(&self) -> Option<LogIds> {
        self.span.map(|s| LogIds {
            trace_id: s.trace_id,
            span_id: s.span_id,
        })
    }

    async fn on_close(&mut self, info: &ConnectionInfo, summary: &CloseSummary) {
        if let Some(tracer) = self.tracer.load_full() {
            record_span(&tracer, info, summary, self.span);
        }
        if let Some(log) = self.access_log.load_full() {
            log.log_stream(StreamRecord {
                time: SystemTime::now()
                    .checked_sub(summary.duration)
                    .unwrap_or_else(SystemTime::now),
                stream: info.stream.clone(),
                protocol: match info.protocol {
                    StreamProtocol::Udp => "UDP",
                    _ => "TCP",
                },
                client: info.client,
                target: summary.target,
                sni: summary.sni.clone(),
                bytes_in: summary.bytes_in,
                bytes_out: summary.bytes_out,
                duration: summary.duration,
                error: summary.error.clone(),
            });
        }
    }
}
