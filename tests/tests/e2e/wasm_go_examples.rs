//! The Go SDK's own examples (`http_headers`, `http_body`, `shared_data`, `http_auth_random`),
//! built by `scripts/build-plugins.sh` from the SDK's module in the registry, run in the real
//! gateway against real clients and backends; each test checks what the example's source says
//! it does. Where Go or the module is missing the tests say so and pass without running
//! (under `CI=true` they fail).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{Running, TestGateway, binary_config, gateway_binary, http1, raw, temp_dir};
use http::Request;
use http_body_util::Full;

use crate::wasm::{install, plugin};

/// Whether example `name` was built; says why not otherwise. Under `CI=true` (whose set-up
/// installs Go) a missing example fails instead.
fn built(name: &str) -> bool {
    let ok = plugin(&format!("go_example_{name}")).exists();
    if !ok {
        let why = format!("the Go SDK example {name} was not built (Go or its module missing)");
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipped: {why}");
    }
    ok
}

/// A gateway whose route `/` runs example `name` (configured with `config`, when given) in
/// front of `upstream`; the examples that call out find `httpbin` among the upstreams.
async fn gateway(name: &str, config: Option<&str>, upstream: SocketAddr) -> TestGateway {
    let dir = temp_dir();
    install(dir.path(), &format!("go_example_{name}"), "example.wasm");
    let config = config.map_or(String::new(), |c| format!("\n    config: \"{c}\""));
    let yaml = format!(
        r#"
listeners: [{{ name: main, bind: 127.0.0.1:0 }}]
upstreams:
  app: {{ targets: ["{upstream}"] }}
  httpbin: {{ targets: ["{upstream}"] }}
plugins:
  example:
    wasm: example.wasm{config}
routes:
  - match: {{ path_prefix: / }}
    filters: [ {{ plugin: example }} ]
    proxy: {{ upstream: app }}
"#
    );
    TestGateway::start_in(dir, &yaml).await
}

/// `http_headers`: sets `test: best` on every request (and logs both heads).
#[tokio::test]
async fn http_headers_sets_the_request_header_its_source_sets() {
    if !built("http_headers") {
        return;
    }
    let backend = Backend::start("app").await;
    let gw = gateway("http_headers", None, backend.addr()).await;
    let mut c = http1(gw.addr("main")).await;
    let res = c
        .send(
            Request::get("/x")
                .header("test", "worst")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!((res.status(), res.text().as_str()), (200, "app"));
    let seen = backend.last().expect("the backend saw the request");
    assert_eq!(seen.headers.get_all("test").iter().count(), 1);
    assert_eq!(seen.header("test"), "best");
}

/// `http_body`: a request without `Content-Length` gets 400 "content must be provided"; with
/// one, the body the upstream gets is replaced, or appended or prepended to as the
/// `buffer-operation` header asks.
#[tokio::test]
async fn http_body_rewrites_the_request_body_as_its_source_says() {
    if !built("http_body") {
        return;
    }
    let backend = Backend::start("app").await;
    let gw = gateway("http_body", None, backend.addr()).await;
    let addr = gw.addr("main");
    let mut c = http1(addr).await;
    for (op, want) in [
        (None, "[this is replaced body]".len()),
        (Some("replace"), "[this is replaced body]".len()),
        (
            Some("append"),
            "hello".len() + "[this is appended body]".len(),
        ),
        (
            Some("prepend"),
            "hello".len() + "[this is prepended body]".len(),
        ),
    ] {
        let mut req = Request::post("/upload");
        if let Some(op) = op {
            req = req.header("buffer-operation", op);
        }
        let req = req.body(Full::new(Bytes::from_static(b"hello"))).unwrap();
        let res = c.send(req).await.unwrap();
        // The upstream counts the bytes it received.
        assert_eq!(
            (res.status(), res.text()),
            (200, want.to_string()),
            "{op:?}"
        );
    }
    let chunked = raw(
        addr,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert!(chunked.starts_with("HTTP/1.1 400"), "{chunked}");
    assert!(chunked.ends_with("content must be provided"), "{chunked}");
}

/// FNV-1a, 32 bits: `http_auth_random` lets a request in when the hash of the auth service's
/// answer is even.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// `http_auth_random`: each request is paused while its head is sent to the `httpbin`
/// cluster; an answer whose body hashes even lets it on, an odd one gets 403 "access
/// forbidden" with `powered-by: proxy-wasm-go-sdk!!`. The test backend answers `/status/N`
/// with the body `status N`, so the request's own path decides.
#[tokio::test]
async fn http_auth_random_lets_in_or_forbids_by_the_callout_answer() {
    if !built("http_auth_random") {
        return;
    }
    let backend = Backend::start("app").await;
    let gw = gateway("http_auth_random", None, backend.addr()).await;
    let mut c = http1(gw.addr("main")).await;
    let code = |even: bool| {
        (200..=206)
            .find(|n| fnv1a32(format!("status {n}").as_bytes()).is_multiple_of(2) == even)
            .expect("a status of that parity")
    };
    let (granted, forbidden) = (code(true), code(false));
    let res = c.get(&format!("/status/{granted}")).await;
    assert_eq!(res.status(), granted, "granted: the upstream's answer");
    assert_eq!(res.text(), format!("status {granted}"));
    let res = c.get(&format!("/status/{forbidden}")).await;
    assert_eq!(res.status(), 403);
    assert_eq!(res.text(), "access forbidden");
    assert_eq!(res.header("powered-by"), "proxy-wasm-go-sdk!!");
    // Two callouts and one forwarded request.
    assert_eq!(backend.requests(), 3);
}

/// `shared_data`: the VM sets a shared counter to 10,000,000 when it starts, and every request
/// increments it (compare-and-swap, retried on a mismatch) and logs the new value. The gateway
/// binary runs it, and its log is read.
#[tokio::test]
async fn shared_data_counts_requests_in_the_shared_store() {
    if !built("shared_data") {
        return;
    }
    let dir = temp_dir();
    install(dir.path(), "go_example_shared_data", "example.wasm");
    let (port, config) = binary_config(dir.path(), |port| {
        format!(
            "server: {{ watch_config: false }}\n\
             listeners: [{{ name: main, bind: '127.0.0.1:{port}' }}]\n\
             plugins: {{ example: {{ wasm: example.wasm }} }}\n\
             routes: [{{ filters: [{{ plugin: example }}], respond: {{ body: ok }} }}]\n"
        )
    });
    let log = dir.path().join("gateway.log");
    let child = std::process::Command::new(gateway_binary())
        .args(["run", "--config"])
        .arg(&config)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start the gateway binary");
    let _running = Running(child);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    assert!(
        gateway_tests::ports::wait_listening(addr, Duration::from_secs(60)).await,
        "the gateway did not listen: {}",
        read(&log)
    );
    let mut c = http1(addr).await;
    for _ in 0..3 {
        assert_eq!(c.get("/").await.text(), "ok");
    }
    let mut text = String::new();
    for _ in 0..100 {
        text = read(&log);
        if text.contains("shared value: 10000003") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let values: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split("shared value: ").nth(1))
        .map(|v| v.split_whitespace().next().unwrap_or_default())
        .collect();
    assert_eq!(values, ["10000001", "10000002", "10000003"], "{text}");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
