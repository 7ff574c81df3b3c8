//! OpenTelemetry traces, exported over OTLP (gRPC or HTTP/protobuf) by a lean tracer of our
//! own rather than the OpenTelemetry SDK: the request path needs only "continue or start a
//! trace, decide sampling, queue a finished span", and owning that keeps a span to one small
//! allocation, lets the queue count what it drops, and needs no exporter thread
//! (docs/architecture.md, "Choices and why").
//!
//! * [`context`]: W3C `traceparent`/`tracestate` parsing and formatting, ids.
//! * [`sampler`]: parent-based, ratio for new traces.
//! * [`span`]: a finished span as queued; [`http_spans`] builds the HTTP server and client spans
//!   with the semantic-convention attributes, which [`open`] ends with their bodies; [`stream`]
//!   the L4 connection spans.
//! * `export`: the batching task; `convert`: finished spans as OTLP messages
//!   (`opentelemetry-proto`'s types); OTLP over hyper is `telemetry::otlp`, shared with the
//!   metrics exporter.
//!
//! Without `telemetry.traces` there is no [`Tracer`], and the request path does one atomic
//! load to find that out. A [`Tracer`] lives until the config changes its settings: reload
//! builds a new one (new exporter), and the old one's exporter sends what it has and stops
//! when its last request ends.

pub mod context;
pub(crate) mod convert;
mod export;
pub mod http_spans;
pub mod open;
pub mod sampler;
pub mod span;
pub mod stream;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway_config::model::TelemetryConfig;
use http::HeaderValue;
use indexmap::IndexMap;
use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::context::{RemoteParent, SpanContext, SpanId, TraceId, new_span_id, new_trace_id};
use self::sampler::Sampler;
use self::span::{Parent, SpanData};
use super::metrics::{Counter, Registry};
use super::otlp::{self as transport, Signal};

pub use self::http_spans::{ClientSpan, InternalSpan, ServerSpan};
pub use self::open::OpenSpan;

/// `service.name` when the config names none.
pub const DEFAULT_SERVICE_NAME: &str = "gateway";

/// What a tracer was built from; a reload with equal settings keeps the running tracer.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    endpoint: String,
    ratio: f64,
    headers: IndexMap<String, String>,
    service_name: String,
    resource_attributes: IndexMap<String, String>,
}

impl Settings {
    fn of(config: &TelemetryConfig) -> Option<Self> {
        let traces = config.traces.as_ref()?;
        Some(Self {
            endpoint: traces.otlp_endpoint.clone(),
            ratio: traces.ratio(),
            headers: traces.headers.clone(),
            service_name: config
                .service_name
                .clone()
                .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
            resource_attributes: config.resource_attributes.clone(),
        })
    }
}

/// Checks `config.traces` the way [`Tracer::start`] will, without starting anything (for
/// `gateway validate`). `Err` is the key at fault and a message.
pub fn check(config: &TelemetryConfig) -> Result<(), (&'static str, String)> {
    match &config.traces {
        Some(t) => {
            transport::Endpoint::parse(&t.otlp_endpoint, Signal::Traces)
                .map_err(|m| ("telemetry.traces.otlp_endpoint", m))?;
            transport::export_headers(&t.headers).map_err(|m| ("telemetry.traces.headers", m))?;
            Ok(())
        }
        None => Ok(()),
    }
}

/// Samples, and queues finished spans for its exporter task.
pub struct Tracer {
    sampler: Sampler,
    queue: mpsc::Sender<SpanData>,
    signal: Arc<export::Signal>,
    dropped: Counter,
    settings: Settings,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("endpoint", &self.settings.endpoint)
            .field("ratio", &self.settings.ratio)
            .finish_non_exhaustive()
    }
}

impl Tracer {
    /// Starts a tracer and its exporter for `config.traces`; `Ok(None)` when traces are off.
    /// Must run inside the Tokio runtime. `Err` is a message for `telemetry.traces.otlp_endpoint`.
    pub fn start(
        config: &TelemetryConfig,
        registry: &Registry,
    ) -> Result<Option<Arc<Self>>, String> {
        let Some(settings) = Settings::of(config) else {
            return Ok(None);
        };
        let endpoint = transport::Endpoint::parse(&settings.endpoint, Signal::Traces)?;
        let headers = transport::export_headers(&settings.headers)?;
        let counters = counters(registry);
        let (queue, rx) = mpsc::channel(export::QUEUE);
        let signal = Arc::new(export::Signal::default());
        let exporter = export::Exporter::new(
            rx,
            transport::Transport::new(endpoint, headers),
            resource(&settings.service_name, &settings.resource_attributes),
            counters.clone(),
            signal.clone(),
            settings.endpoint.clone(),
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn(exporter.run(stop.clone()));
        Ok(Some(Arc::new(Self {
            sampler: Sampler::new(settings.ratio),
            queue,
            signal,
            dropped: counters.dropped,
            settings,
            stop,
            task: Mutex::new(Some(task)),
        })))
    }

    /// Whether `config` asks for exactly this tracer.
    pub fn matches(&self, config: &TelemetryConfig) -> bool {
        Settings::of(config).as_ref() == Some(&self.settings)
    }

    /// The context of a request's server span: a child of the request's valid parent
    /// ([`context::extract`] from a header map, [`context::extract_lines`] from a raw head;
    /// sampled as the parent is), else the root of a new trace (sampled by ratio).
    pub fn begin(self: &Arc<Self>, parent: Option<RemoteParent>) -> TraceCx {
        match parent {
            Some(parent) => self.child_of(parent),
            None => self.root(),
        }
    }

    /// The context of a new trace's root span.
    pub fn root(self: &Arc<Self>) -> TraceCx {
        TraceCx {
            tracer: self.clone(),
            span: self.root_span(),
            parent: Parent::None,
            state: None,
        }
    }

    /// A new trace's root span: ids and the sampling decision.
    pub fn root_span(&self) -> SpanContext {
        let trace_id = new_trace_id();
        SpanContext {
            trace_id,
            span_id: new_span_id(),
            sampled: self.sampler.sample_new(&trace_id),
        }
    }

    fn child_of(self: &Arc<Self>, parent: RemoteParent) -> TraceCx {
        let p = parent.context;
        TraceCx {
            tracer: self.clone(),
            span: SpanContext {
                trace_id: p.trace_id,
                span_id: new_span_id(),
                sampled: self.sampler.sample(Some(&p), &p.trace_id),
            },
            parent: Parent::Remote(p.span_id),
            state: parent.state,
        }
    }

    /// Queues a finished span; never waits (a full queue drops it, counted).
    pub fn record(&self, span: SpanData) {
        // Counted before the push, so the exporter never takes a span it has not counted.
        self.signal.queued();
        if let Err(TrySendError::Full(_) | TrySendError::Closed(_)) = self.queue.try_send(span) {
            self.signal.unqueued();
            self.dropped.inc();
        }
    }

    /// Sends what is queued and stops the exporter, waiting at most `within` (shutdown).
    pub async fn shutdown(&self, within: Duration) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let abort = task.abort_handle();
            if tokio::time::timeout(within, task).await.is_err() {
                abort.abort();
                tracing::warn!(
                    "trace export did not finish within the drain; queued spans are lost"
                );
            }
        }
    }
}

fn counters(registry: &Registry) -> export::Counters {
    export::Counters {
        exported: registry.counter(
            "gateway_trace_spans_exported_total",
            "Spans the trace collector accepted.",
            &[],
        ),
        dropped: registry.counter(
            "gateway_trace_spans_dropped_total",
            "Spans dropped: export queue full, export failed or timed out.",
            &[],
        ),
        failures: registry.counter(
            "gateway_trace_export_failures_total",
            "OTLP export requests that failed or timed out.",
            &[],
        ),
    }
}

/// The resource every span (and metric) is reported under.
/// Configured attributes come after the gateway's own and cannot replace them.
pub(crate) fn resource(service_name: &str, more: &IndexMap<String, String>) -> Resource {
    const OWN: [&str; 5] = [
        "service.name",
        "service.version",
        "host.name",
        "telemetry.sdk.name",
        "telemetry.sdk.language",
    ];
    let mut attributes = vec![
        convert::string_kv("service.name", service_name),
        convert::string_kv("service.version", crate::VERSION),
        convert::string_kv("host.name", host_name()),
        convert::string_kv("telemetry.sdk.name", "gateway"),
        convert::string_kv("telemetry.sdk.language", "rust"),
    ];
    attributes.extend(
        more.iter()
            .filter(|(k, _)| !OWN.contains(&k.as_str()))
            .map(|(k, v)| convert::string_kv(k, v)),
    );
    Resource {
        attributes,
        ..Resource::default()
    }
}

/// The kernel's host name (no libc call, so no `unsafe`), else `$HOSTNAME`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

tokio::task_local! {
    /// The trace of the request the current task is serving, for work that is started without
    /// a [`crate::context::RequestCx`] at hand: a plugin's `proxy_http_call` is dispatched from
    /// inside a VM call and performed by a task of its own.
    static CURRENT: TraceCx;
}

/// Runs `fut` (a request) with `cx` as the current trace.
///
/// A plain function, not an `async fn`: an `async fn` would store `fut` twice (as its argument
/// and inside the scope it awaits), and request futures are kilobytes.
pub fn scope<F: std::future::Future>(
    cx: TraceCx,
    fut: F,
) -> impl std::future::Future<Output = F::Output> {
    CURRENT.scope(cx, fut)
}

/// Runs `f` with `cx` as the current trace: synchronous work on a request's behalf that may
/// start tasks of its own (the filter chain's synchronous hooks run outside the request's
/// [`scope`]; a plugin callback there may dispatch an HTTP call).
pub fn with_current<R>(cx: Option<&TraceCx>, f: impl FnOnce() -> R) -> R {
    match cx {
        Some(cx) => CURRENT.sync_scope(cx.clone(), f),
        None => f(),
    }
}

/// `fut` with `cx`, when there is one, as the current trace; otherwise `fut` itself.
pub fn scope_some<F: std::future::Future>(
    cx: Option<TraceCx>,
    fut: F,
) -> impl std::future::Future<Output = F::Output> {
    match cx {
        Some(cx) => futures_util::future::Either::Left(CURRENT.scope(cx, fut)),
        None => futures_util::future::Either::Right(fut),
    }
}

/// The trace of the request the current task is serving, if it is traced.
pub fn current() -> Option<TraceCx> {
    CURRENT.try_with(TraceCx::clone).ok()
}

/// The ids of the request span the current task is serving, if it is traced: what the
/// gateway's own log lines carry (`telemetry::log_format`). A copy of 25 bytes, no clone of the
/// context, and nothing at all for the request: the lookup is made by whoever writes a line.
pub fn current_span() -> Option<SpanContext> {
    CURRENT.try_with(|cx| cx.span).ok()
}

/// The ids the current task's log lines carry: the request span's ([`current_span`]), else
/// those of the L4 connection or UDP session it serves (named by the stream observer,
/// `telemetry::stream_observer`).
pub fn current_log_ids() -> Option<(TraceId, SpanId)> {
    match current_span() {
        Some(span) => Some((span.trace_id, span.span_id)),
        None => stream_proxy::log_ids::current().map(|ids| (ids.trace_id, ids.span_id)),
    }
}

/// `fut` carrying the current trace along, for a task spawned on a request's behalf.
pub fn in_current<F>(fut: F) -> impl std::future::Future<Output = F::Output>
where
    F: std::future::Future,
{
    let cx = current();
    async move {
        match cx {
            Some(cx) => CURRENT.scope(cx, fut).await,
            None => fut.await,
        }
    }
}

/// A request's place in its trace, carried in [`crate::context::RequestCx`] so terminals can
/// start child spans and propagate the trace upstream.
#[derive(Debug, Clone)]
pub struct TraceCx {
    tracer: Arc<Tracer>,
    /// The request's (server) span.
    pub span: SpanContext,
    /// Its parent.
    pub parent: Parent,
    /// `tracestate` to carry on.
    pub state: Option<HeaderValue>,
}

impl TraceCx {
    /// The tracer.
    pub fn tracer(&self) -> &Arc<Tracer> {
        &self.tracer
    }

    /// Whether spans of this trace are recorded.
    pub fn sampled(&self) -> bool {
        self.span.sampled
    }
}
