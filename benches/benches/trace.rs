//! What tracing adds to a request: the server span (start with the request head, status from
//! the response head, end once the response body has been sent) and one upstream attempt's
//! client span with its `traceparent` injection (ended with the upstream body). Every case
//! sends a one-buffer response body, so a recorded span's body wrapper is in the figure.
//!
//! * `off`: no `telemetry.traces` (the one atomic load `ConnService::handle` does).
//! * `unsampled`: traces configured, ratio 0, no incoming parent: a new trace id and span id,
//!   nothing recorded; the attempt only gets a `traceparent` header.
//! * `sampled`: a sampled incoming `traceparent`: both spans recorded and queued for export
//!   (the exporter encodes and sends them on another thread meanwhile).
//! * `sampled_exporter_idle`: the same spans built, with the exporter not running (its queue
//!   full, so they are dropped at the push): the request path alone.
//!
//! The exporter points at a port nothing listens on, so batches are dropped quickly and the
//! queue stays drained; the cost measured is the request path's only.

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use gateway::Body;
use gateway::connection::ConnInfo;
use gateway::telemetry::trace::ServerSpan;
use gateway::telemetry::trace::http_spans::Target;
use gateway::telemetry::{Registry, Tracer};
use gateway_config::model::{TelemetryConfig, TracesConfig};
use http::uri::Authority;
use http::{HeaderMap, Method, Request, StatusCode};
use hyper::body::Body as _;

fn tracer(ratio: f64) -> Arc<Tracer> {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let cfg = TelemetryConfig {
        traces: Some(TracesConfig {
            otlp_endpoint: format!("http://{dead}"),
            sample_ratio: Some(ratio),
            headers: Default::default(),
        }),
        ..TelemetryConfig::default()
    };
    Tracer::start(&cfg, &Registry::new())
        .expect("tracer")
        .expect("traces configured")
}

fn request(traceparent: Option<&'static str>) -> Request<Body> {
    let mut b = Request::get("/api/users/42?page=2")
        .header("host", "example.com")
        .header("user-agent", "bench/1.0");
    if let Some(tp) = traceparent {
        b = b.header("traceparent", tp);
    }
    b.body(Body::empty()).expect("request")
}

/// Polls `body` to its end, as a server sending it would.
fn send_body(mut body: Body) {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    while !body.is_end_stream() {
        match std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
            std::task::Poll::Ready(Some(frame)) => {
                black_box(frame.ok());
            }
            _ => break,
        }
    }
}

/// One request's tracing work: server span, one attempt, end of both with their bodies.
fn traced_request(
    headers: &mut HeaderMap,
    slot: &ArcSwapOption<Tracer>,
    req: &Request<Body>,
    conn: &ConnInfo,
    route: &Arc<str>,
    upstream: &Arc<str>,
    authority: &Authority,
) {
    let span = slot
        .load()
        .as_ref()
        .map(|t| ServerSpan::start(t, req, conn));
    if let Some(cx) = span.as_ref().map(|s| s.context().clone()) {
        // The attempt's headers exist already in the proxy; only the injection is measured.
        headers.clear();
        let target = Target {
            upstream,
            authority,
            addr: SocketAddr::from(([10, 0, 0, 1], 8080)),
        };
        let attempt = cx.start_client(&Method::GET, target, 0, headers);
        black_box(&*headers);
        // The upstream body ended.
        if let Some(open) = attempt.end_head(StatusCode::OK) {
            open.finish();
        }
    }
    let body = Body::from("hello");
    let body = match span.and_then(|s| s.end_head(StatusCode::OK, route)) {
        Some(open) => open.attach(body, false),
        None => body,
    };
    send_body(body);
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let conn = ConnInfo::new(
        SocketAddr::from(([127, 0, 0, 1], 40000)),
        SocketAddr::from(([127, 0, 0, 1], 8080)),
        Arc::from("main"),
        false,
        None,
    );
    let route: Arc<str> = Arc::from("users");
    let upstream: Arc<str> = Arc::from("users");
    let authority = Authority::from_static("users.internal:8080");
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    // A tracer whose exporter never runs (its runtime is not driven): once its queue is full,
    // spans are built and dropped, which isolates the request path from the exporter thread
    // competing for the CPU.
    let idle_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let idle = {
        let _idle_guard = idle_rt.enter();
        tracer(1.0)
    };

    let mut g = c.benchmark_group("trace");
    let cases = [
        ("off", None, None),
        ("unsampled", Some(tracer(0.0)), None),
        ("sampled", Some(tracer(1.0)), Some(parent)),
        ("sampled_exporter_idle", Some(idle), Some(parent)),
    ];
    for (name, t, tp) in cases {
        let slot = ArcSwapOption::new(t);
        let req = request(tp);
        let mut headers = HeaderMap::with_capacity(8);
        g.bench_function(name, |b| {
            b.iter(|| {
                traced_request(
                    &mut headers,
                    &slot,
                    &req,
                    &conn,
                    &route,
                    &upstream,
                    &authority,
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
