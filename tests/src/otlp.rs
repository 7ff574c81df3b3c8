//! A real OTLP receiver for tests: tonic gRPC `TraceService` and `MetricsService` (served by
//! hyper over h2c) and OTLP/HTTP `/v1/traces` and `/v1/metrics` endpoints, on 127.0.0.1:0.
//! What the gateway sends is decoded with the official message types of `opentelemetry-proto`
//! (the types the gateway encodes, sent through its own transport), so the tests check what it
//! fills in and how it frames and sends it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use prost::Message;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use opentelemetry_proto::tonic::metrics::v1::Metric;
pub use opentelemetry_proto::tonic::trace::v1::Span;

/// One received span with the resource it was reported under.
#[derive(Debug, Clone)]
pub struct Received {
    /// The span.
    pub span: Span,
    /// Its resource's attributes.
    pub resource: Vec<KeyValue>,
}

#[derive(Default)]
struct Store {
    spans: Mutex<Vec<Received>>,
    /// Metrics export requests, each as the metrics it carried (resources flattened).
    metrics: Mutex<Vec<Vec<Metric>>>,
    grpc_requests: Mutex<usize>,
    http_requests: Mutex<usize>,
    /// The headers of every OTLP/HTTP export request.
    http_headers: Mutex<Vec<http::HeaderMap>>,
}

impl Store {
    fn add_metrics(&self, req: ExportMetricsServiceRequest, grpc: bool) {
        let metrics = req
            .resource_metrics
            .into_iter()
            .flat_map(|rm| rm.scope_metrics)
            .flat_map(|sm| sm.metrics)
            .collect();
        self.metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(metrics);
        self.count(grpc);
    }

    fn count(&self, grpc: bool) {
        let counter = if grpc {
            &self.grpc_requests
        } else {
            &self.http_requests
        };
        *counter.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    fn add(&self, req: ExportTraceServiceRequest, grpc: bool) {
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        for rs in req.resource_spans {
            let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push(Received {
                        span,
                        resource: resource.clone(),
                    });
                }
            }
        }
        drop(spans);
        self.count(grpc);
    }
}

/// `TraceService/Export`, on tonic's server machinery (the glue `tonic-build` would generate
/// for the service; the crate's generated server needs tonic's transport feature).
#[derive(Clone)]
struct Grpc(Arc<Store>);

const EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
const EXPORT_METRICS: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

impl tonic::server::UnaryService<ExportTraceServiceRequest> for Grpc {
    type Response = ExportTraceServiceResponse;
    type Future = tonic::codegen::BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<ExportTraceServiceRequest>) -> Self::Future {
        self.0.add(request.into_inner(), true);
        Box::pin(async { Ok(tonic::Response::new(ExportTraceServiceResponse::default())) })
    }
}

/// `MetricsService/Export`.
#[derive(Clone)]
struct GrpcMetrics(Arc<Store>);

impl tonic::server::UnaryService<ExportMetricsServiceRequest> for GrpcMetrics {
    type Response = ExportMetricsServiceResponse;
    type Future = tonic::codegen::BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<ExportMetricsServiceRequest>) -> Self::Future {
        self.0.add_metrics(request.into_inner(), true);
        Box::pin(async { Ok(tonic::Response::new(ExportMetricsServiceResponse::default())) })
    }
}

async fn grpc_dispatch(
    svc: Grpc,
    req: http::Request<Incoming>,
) -> http::Response<tonic::body::Body> {
    match req.uri().path() {
        EXPORT => {
            let codec = tonic_prost::ProstCodec::<
                ExportTraceServiceResponse,
                ExportTraceServiceRequest,
            >::default();
            tonic::server::Grpc::new(codec).unary(svc, req).await
        }
        EXPORT_METRICS => {
            let codec = tonic_prost::ProstCodec::<
                ExportMetricsServiceResponse,
                ExportMetricsServiceRequest,
            >::default();
            let metrics = GrpcMetrics(svc.0.clone());
            tonic::server::Grpc::new(codec).unary(metrics, req).await
        }
        _ => tonic::Status::unimplemented("no such method").into_http(),
    }
}

/// The receiver: a gRPC and an HTTP endpoint sharing one span store.
pub struct OtlpReceiver {
    grpc: SocketAddr,
    http: SocketAddr,
    store: Arc<Store>,
    tasks: Vec<JoinHandle<()>>,
}

impl OtlpReceiver {
    /// Starts both endpoints.
    pub async fn start() -> Self {
        let store = Arc::new(Store::default());
        let grpc_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let http_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let grpc = grpc_listener.local_addr().expect("addr");
        let http = http_listener.local_addr().expect("addr");
        let tasks = vec![
            tokio::spawn(serve_grpc(grpc_listener, store.clone())),
            tokio::spawn(serve_http(http_listener, store.clone())),
        ];
        Self {
            grpc,
            http,
            store,
            tasks,
        }
    }

    /// `otlp_endpoint` for OTLP/gRPC.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// `otlp_endpoint` for OTLP/HTTP.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}/v1/traces", self.http)
    }

    /// `telemetry.metrics.otlp_endpoint` for OTLP/HTTP.
    pub fn http_metrics_endpoint(&self) -> String {
        format!("http://{}/v1/metrics", self.http)
    }

    /// Every metrics export received so far, oldest first.
    pub fn metrics(&self) -> Vec<Vec<Metric>> {
        self.store
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits (up to 10 s) for a metrics export in which `done` holds, and returns it.
    pub async fn wait_for_metrics(&self, done: impl Fn(&[Metric]) -> bool) -> Option<Vec<Metric>> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(found) = self.metrics().into_iter().find(|m| done(m)) {
                return Some(found);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.store
            .spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The base URL of the OTLP/HTTP endpoint (what `OTEL_EXPORTER_OTLP_ENDPOINT` names).
    pub fn http_base(&self) -> String {
        format!("http://{}", self.http)
    }

    /// The headers of every OTLP/HTTP export request received so far.
    pub fn http_headers(&self) -> Vec<http::HeaderMap> {
        self.store
            .http_headers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Export requests received over (gRPC, HTTP).
    pub fn requests(&self) -> (usize, usize) {
        let n = |m: &Mutex<usize>| *m.lock().unwrap_or_else(|e| e.into_inner());
        (n(&self.store.grpc_requests), n(&self.store.http_requests))
    }

    /// Waits (up to `timeout`) until `done` holds for the received spans, and returns them.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.received();
            if done(&spans) || tokio::time::Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for `n` spans of the trace `trace_id` (hex).
    pub async fn trace(&self, trace_id: &str, n: usize) -> Vec<Received> {
        let of_trace = |r: &&Received| hex(&r.span.trace_id) == trace_id;
        self.wait_for(Duration::from_secs(10), |all| {
            all.iter().filter(of_trace).count() >= n
        })
        .await
        .into_iter()
        .filter(|r| hex(&r.span.trace_id) == trace_id)
        .collect()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn serve_grpc(listener: TcpListener, store: Arc<Store>) {
    let server = Grpc(store);
    while let Ok((tcp, _)) = listener.accept().await {
        let server = server.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let server = server.clone();
                async move { Ok::<_, Infallible>(grpc_dispatch(server, req).await) }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

async fn serve_http(listener: TcpListener, store: Arc<Store>) {
    while let Ok((tcp, _)) = listener.accept().await {
        let store = store.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let store = store.clone();
                async move { Ok::<_, Infallible>(http_export(&store, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

async fn http_export(store: &Store, req: http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    let reply = |status: u16, body: Bytes| {
        let mut res = http::Response::new(Full::new(body));
        *res.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-protobuf"),
        );
        res
    };
    let protobuf = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
    let path = req.uri().path().to_owned();
    store
        .http_headers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(req.headers().clone());
    if req.method() != http::Method::POST || !protobuf {
        return reply(404, Bytes::new());
    }
    let Ok(body) = req.into_body().collect().await else {
        return reply(400, Bytes::new());
    };
    if path == "/v1/metrics" {
        return match ExportMetricsServiceRequest::decode(body.to_bytes()) {
            Ok(msg) => {
                store.add_metrics(msg, false);
                reply(
                    200,
                    ExportMetricsServiceResponse::default()
                        .encode_to_vec()
                        .into(),
                )
            }
            Err(_) => reply(400, Bytes::new()),
        };
    }
    if path != "/v1/traces" {
        return reply(404, Bytes::new());
    }
    match ExportTraceServiceRequest::decode(body.to_bytes()) {
        Ok(msg) => {
            store.add(msg, false);
            reply(
                200,
                ExportTraceServiceResponse::default().encode_to_vec().into(),
            )
        }
        Err(_) => reply(400, Bytes::new()),
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A string attribute of `attrs` ("" when absent or not a string).
pub fn attr_str(attrs: &[KeyValue], key: &str) -> String {
    match attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
    {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        _ => String::new(),
    }
}

/// A boolean attribute of `attrs` (`None` when absent or not a boolean).
pub fn attr_bool(attrs: &[KeyValue], key: &str) -> Option<bool> {
    match attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
    {
        Some(any_value::Value::BoolValue(b)) => Some(*b),
        _ => None,
    }
}

/// An integer attribute of `attrs` (`None` when absent or not an integer).
pub fn attr_int(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
    {
        Some(any_value::Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}
