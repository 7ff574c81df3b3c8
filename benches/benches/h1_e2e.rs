//! HTTP/1.1 end to end: a real gateway on `127.0.0.1:0` in this process, a hyper client on one
//! kept-alive connection, and the latency of one request/response round trip (request written,
//! response head parsed, body read to the end) through the kernel's loopback.
//!
//! Client and gateway share one `current_thread` runtime, so each iteration is the whole CPU
//! cost of a request on both sides with no cross-thread wake-up in it: a stable figure to
//! compare builds with, not a throughput number (the side-by-side harness in `benches/harness`
//! gives those). Routes: `respond` bare, `respond` behind a `headers` filter, and a miss (404).

use std::time::Duration;

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

const CONFIG: &str = r#"
server:
  worker_threads: 1
  watch_config: false
  drain_timeout: 1s
listeners:
  - name: plain
    bind: 127.0.0.1:0
    protocols: [http1]
routes:
  - name: hello
    match: { path: /hello }
    respond: { status: 200, body: "Hello, world!\n", headers: { content-type: text/plain } }
  - name: filtered
    match: { path: /filtered }
    filters:
      - headers: { response_set: { x-bench: "1" }, response_remove: [server] }
    respond: { status: 200, body: "Hello, world!\n", headers: { content-type: text/plain } }
"#;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let config =
        gateway_config::load_str(CONFIG, "h1_e2e.yaml", std::path::Path::new(".")).expect("config");
    let gateway = rt
        .block_on(gateway::Gateway::start(config))
        .expect("gateway starts");
    let addr = gateway.listener_addr("plain").expect("listener");

    let mut sender = rt.block_on(async {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        sender
    });

    let mut group = c.benchmark_group("h1_e2e/keepalive");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    for (name, path, status) in [
        ("respond", "/hello", 200u16),
        ("respond_headers_filter", "/filtered", 200),
        ("no_route_404", "/nothing", 404),
    ] {
        group.bench_function(name, |b| {
            // One `block_on` per batch, not per request: entering the runtime is not part of
            // what is measured.
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        let req = Request::get(path)
                            .header("host", "bench.example")
                            .body(Empty::<Bytes>::new())
                            .expect("request");
                        let res = sender.send_request(req).await.expect("response");
                        assert_eq!(res.status().as_u16(), status);
                        let body = res.into_body().collect().await.expect("body");
                        black_box(body.to_bytes());
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();

    drop(sender);
    rt.block_on(gateway.shutdown());
}

criterion_group!(benches, bench);
criterion_main!(benches);
