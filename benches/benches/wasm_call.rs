//! The cost of a Wasm filter. Two views:
//!
//! * `wasm_call/host`: one request's full callback sequence on a started VM of the in-tree
//!   `add-header` plugin (upstream Rust SDK): context create, request headers (the plugin sets
//!   a header), response headers (it sets another), end of the response body, done/log/delete.
//! * `wasm_call/h1_e2e`: a real gateway in this process (one worker, one kept-alive HTTP/1.1
//!   connection, client on the same runtime, as `h1_e2e`), a `respond` route behind the native
//!   `headers` filter against the same route behind the `add-header` plugin doing the same
//!   edits. Their ratio is the plugin's share of a request's cost.
//!
//! The plugin is built by `scripts/build-plugins.sh` when missing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use wasm_host::{CompiledPlugin, HostEngine, HttpStream, PluginInfo, Shared, StreamInfo};

fn add_header_wasm() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join("plugins/target/wasm32-wasip1/release/add_header.wasm");
    if !path.exists() {
        let ok = std::process::Command::new("bash")
            .arg(root.join("scripts/build-plugins.sh"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "scripts/build-plugins.sh failed");
    }
    path
}

fn host(c: &mut Criterion) {
    let bytes = std::fs::read(add_header_wasm()).expect("plugin");
    let info = PluginInfo {
        name: "add-header".into(),
        config: Bytes::from_static(br#"{"name":"x-powered-by","value":"gateway"}"#),
        ..Default::default()
    };
    let compiled = CompiledPlugin::load(&HostEngine::new(), Shared::new(), info, &bytes).unwrap();
    let mut vm = compiled.instantiate(None).unwrap();
    let stream_info = Arc::new(StreamInfo::default());
    let head = || {
        Request::get("/hello")
            .header("host", "bench.example")
            .header("user-agent", "criterion")
            .header("accept", "*/*")
            .body(())
            .unwrap()
            .into_parts()
            .0
    };
    let mut group = c.benchmark_group("wasm_call/host");
    group.throughput(Throughput::Elements(1));
    group.bench_function("add_header_full_sequence", |b| {
        b.iter(|| {
            let mut s = HttpStream::new(stream_info.clone());
            s.put_request(head());
            let id = vm.create_http(s).unwrap();
            vm.on_request_headers(id, true).unwrap();
            vm.on_response_headers(id, false).unwrap();
            vm.on_response_body(id, true).unwrap();
            vm.finish(id).unwrap();
            black_box(vm.take_effects());
        })
    });
    group.finish();
}

fn config(wasm: &Path) -> String {
    format!(
        r#"
server:
  worker_threads: 1
  watch_config: false
  drain_timeout: 1s
listeners:
  - name: plain
    bind: 127.0.0.1:0
    protocols: [http1]
plugins:
  add-header:
    wasm: {}
    config: {{ name: x-powered-by, value: gateway }}
routes:
  - name: native
    match: {{ path: /native }}
    filters:
      - headers: {{ request_set: {{ x-powered-by: gateway }}, response_set: {{ x-powered-by: gateway }} }}
    respond: {{ status: 200, body: "Hello, world!\n", headers: {{ content-type: text/plain }} }}
  - name: wasm
    match: {{ path: /wasm }}
    filters:
      - plugin: add-header
    respond: {{ status: 200, body: "Hello, world!\n", headers: {{ content-type: text/plain }} }}
"#,
        wasm.display()
    )
}

fn e2e(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let config = gateway_config::load_str(&config(&add_header_wasm()), "wasm.yaml", Path::new("."))
        .expect("config");
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
    let mut group = c.benchmark_group("wasm_call/h1_e2e");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    for (name, path) in [
        ("native_headers_filter", "/native"),
        ("wasm_add_header", "/wasm"),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        let req = Request::get(path)
                            .header("host", "bench.example")
                            .body(Empty::<Bytes>::new())
                            .expect("request");
                        let res = sender.send_request(req).await.expect("response");
                        assert_eq!(res.headers()["x-powered-by"], "gateway");
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

criterion_group!(benches, host, e2e);
criterion_main!(benches);
