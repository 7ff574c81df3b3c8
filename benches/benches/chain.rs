//! Filter chain overhead: a chain of N no-op filters (N = 0, 1, 4, 16) around a `respond`
//! terminal, driven the way a listener drives it (request in, response out, body read to the
//! end so the response-body and log phases run too).
//!
//! N = 0 is the direct call to the terminal (the chain allocates nothing); the step from 0 to 1
//! is the fixed cost of running any filter (per-request instances, the shared state, the body
//! wrapper), and the slope from 1 to 16 is the cost of one more filter.

use std::net::SocketAddr;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use gateway::Body;
use gateway::connection::ConnInfo;
use gateway::context::RequestCx;
use gateway::filter::{Chain, FilterFactory, HttpFilter};
use gateway::terminal::{Respond, Terminal};
use http::{HeaderValue, Request};
use http_body_util::BodyExt;

/// A filter with every hook left at its default (continue, do nothing).
struct Noop;

#[async_trait::async_trait]
impl HttpFilter for Noop {}

struct NoopFactory;

impl FilterFactory for NoopFactory {
    fn name(&self) -> &'static str {
        "noop"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(Noop)
    }
}

fn terminal() -> Terminal {
    let cfg = gateway_config::model::RespondConfig {
        status: 200,
        body: "Hello, world!\n".into(),
        headers: [("content-type".to_string(), "text/plain".to_string())]
            .into_iter()
            .collect(),
    };
    Terminal::Respond(Arc::new(
        Respond::new(&cfg, true, false).expect("respond config"),
    ))
}

fn request_cx() -> RequestCx {
    let conn = ConnInfo::new(
        SocketAddr::from(([127, 0, 0, 1], 40000)),
        SocketAddr::from(([127, 0, 0, 1], 8080)),
        Arc::from("plain"),
        false,
        None,
    );
    RequestCx {
        conn: Arc::new(conn),
        route: Arc::from("hello"),
        start: tokio::time::Instant::now(),
        trace: None,
        request_head: None,
        jwt: None,
        user: None,
        private_head: false,
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let terminal = terminal();
    let server = HeaderValue::from_static("gateway");
    // One connection's facts, shared by its requests as a listener shares them.
    let cx = request_cx();

    let mut group = c.benchmark_group("chain/noop_filters");
    group.throughput(Throughput::Elements(1));
    for n in [0usize, 1, 4, 16] {
        let factories: Vec<Arc<dyn FilterFactory>> = (0..n)
            .map(|_| Arc::new(NoopFactory) as Arc<dyn FilterFactory>)
            .collect();
        let chain = Chain::new(factories);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            // The batch runs inside one `block_on`: entering the runtime per request would
            // cost more than the chain itself.
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        let req = Request::get("/hello")
                            .header("host", "bench.example")
                            .body(Body::empty())
                            .expect("request");
                        let res = chain.run(&terminal, req, cx.clone(), Some(&server)).await;
                        let body = res.into_body().collect().await.expect("body");
                        black_box(body.to_bytes());
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
