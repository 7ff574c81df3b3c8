//! Wasm plugins end to end, through the real gateway: upstream-SDK plugins unchanged (header
//! mutation both ways, body rewrite, local reply, HTTP-call auth that pauses, shared data with
//! CAS across requests, a tick timer), plugin metrics (guest-defined, and calls per callback).
//! Shared helpers for the other `wasm_*` modules live here too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use gateway_tests::{TestGateway, http1, http2c, temp_dir};
use http::Request;
use http_body_util::Full;

/// The built plugin `name` (`add_header`, ...), building the plugins first if needed.
pub(crate) fn plugin(name: &str) -> PathBuf {
    static BUILD: Mutex<bool> = Mutex::new(false);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root
        .join("plugins/target/wasm32-wasip1/release")
        .join(format!("{name}.wasm"));
    let mut built = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    if !*built && (!path.exists() || std::env::var_os("REBUILD_PLUGINS").is_some()) {
        let status = std::process::Command::new("bash")
            .arg(root.join("scripts/build-plugins.sh"))
            .status()
            .expect("run scripts/build-plugins.sh");
        assert!(status.success(), "scripts/build-plugins.sh failed");
        *built = true;
    }
    path
}

/// Copies plugin `name` into `dir` as `file` (so a test can replace it) and returns the path.
pub(crate) fn install(dir: &Path, name: &str, file: &str) -> PathBuf {
    let dest = dir.join(file);
    std::fs::copy(plugin(name), &dest).expect("copy plugin");
    dest
}

/// Replaces `dest` atomically with plugin `name` (write aside, then rename, as deploys do).
pub(crate) fn replace(dest: &Path, bytes: &[u8]) {
    let tmp = dest.with_extension("tmp");
    std::fs::write(&tmp, bytes).expect("write");
    std::fs::rename(&tmp, dest).expect("rename");
}

/// A GET with headers.
pub(crate) fn get(path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::get(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).expect("request")
}

/// A config with one plugin on a `respond` route (and `/echo` proxied to `echo`, if given).
/// The plugin is named after its file (`live.wasm` → `live`): plugin counters are kept by name
/// for the whole process, so concurrent tests use distinct names.
pub(crate) fn one_plugin(
    wasm: &str,
    config: &str,
    limits: &str,
    echo: Option<SocketAddr>,
) -> String {
    let name = wasm.trim_end_matches(".wasm");
    let upstream = echo.map_or(String::new(), |a| {
        format!("upstreams:\n  echo: {{ targets: [{a}], protocol: h2c }}\n")
    });
    let echo_route = echo.map_or(String::new(), |_| {
        "  - name: echo\n    match: { path_prefix: /echo }\n    filters: [ { plugin: NAME } ]\n    proxy: { upstream: echo, strip_prefix: /echo }\n".replace("NAME", name)
    });
    format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
{upstream}plugins:
  {name}:
    wasm: {wasm}
    config: {config}
{limits}
routes:
{echo_route}  - name: hello
    match: {{ path_prefix: / }}
    filters: [ {{ plugin: {name} }} ]
    respond: {{ status: 200, body: "hello from the gateway", headers: {{ content-type: text/plain }} }}
"#
    )
}

#[tokio::test]
async fn add_header_both_ways_over_h1_and_h2() {
    let dir = temp_dir();
    install(dir.path(), "add_header", "add_header.wasm");
    let backend = gateway_tests::backend::Backend::start("app").await;
    let cfg = one_plugin(
        "add_header.wasm",
        r#"{ name: x-powered-by, value: wasm }"#,
        "",
        Some(backend.addr()),
    );
    let gw = TestGateway::start_in(dir, &cfg).await;
    let mut c = http1(gw.addr("main")).await;
    let r = c.get("/hello").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.header("x-powered-by"), "wasm");
    assert_eq!(r.text(), "hello from the gateway");
    let mut c2 = http2c(gw.addr("main")).await;
    for _ in 0..3 {
        let r = c2.get("/hello").await;
        assert_eq!(r.header("x-powered-by"), "wasm");
    }
    // The request side: the upstream saw the header the plugin added.
    let r = c.get("/echo/x").await;
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(r.header("x-powered-by"), "wasm");
    let seen = backend.last().expect("a request");
    assert_eq!(seen.header("x-powered-by"), "wasm");
}

#[tokio::test]
async fn plugin_calls_are_counted_per_callback_on_metrics() {
    let dir = temp_dir();
    install(dir.path(), "add_header", "calls_counted.wasm");
    let cfg = format!(
        "admin: {{ bind: 127.0.0.1:0 }}\n{}",
        one_plugin(
            "calls_counted.wasm",
            r#"{ name: x-powered-by, value: wasm }"#,
            "",
            None,
        )
    );
    let gw = TestGateway::start_in(dir, &cfg).await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..3 {
        assert_eq!(c.get("/").await.header("x-powered-by"), "wasm");
    }
    let admin = gw.gateway().admin_addr().expect("admin");
    let scrape = gateway_tests::admin_head(&gw, "GET", "/metrics", "");
    let metrics = gateway_tests::raw(admin, scrape.as_bytes()).await;
    let series = |callback: &str| {
        format!(
            "gateway_plugin_calls_total{{plugin=\"calls_counted\",callback=\"{callback}\"}} 3\n"
        )
    };
    for callback in ["context_create", "request_headers", "response_headers"] {
        assert!(metrics.contains(&series(callback)), "{callback}: {metrics}");
    }
    // The plugin has no tick: callbacks it does not implement are not listed.
    assert!(
        !metrics.contains("plugin=\"calls_counted\",callback=\"tick\""),
        "{metrics}"
    );
}

#[tokio::test]
async fn body_rewrite_both_ways() {
    let dir = temp_dir();
    install(dir.path(), "body_rewrite", "rw.wasm");
    let backend = gateway_tests::backend::Backend::start("app").await;
    let cfg = one_plugin(
        "rw.wasm",
        r#"{ from: gateway, to: GW }"#,
        "",
        Some(backend.addr()),
    );
    let gw = TestGateway::start_in(dir, &cfg).await;
    let mut c = http1(gw.addr("main")).await;
    let r = c.get("/hello").await;
    assert_eq!(r.text(), "hello from the GW");
    assert_eq!(r.header("x-body-rewrite"), "on");
    // The answer was whole before its head went out: the rewritten length is stated, not
    // chunked.
    assert_eq!(r.header("content-length"), "17");
    assert_eq!(r.header("transfer-encoding"), "");
    // Request body: the backend's /upload answer reports what it received.
    let req = Request::post("/echo/upload")
        .body(Full::new(Bytes::from("to the gateway and back")))
        .unwrap();
    let r = c.send(req).await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    // "to the GW and back": the upstream received the rewritten 18 bytes.
    assert_eq!(r.text(), "18");
    // A small upstream answer that came whole with its head goes out with its length too.
    assert_eq!(r.header("content-length"), "2");
    // Response trailers (h2c upstream and client, which carry them) go through
    // proxy_on_response_trailers.
    let mut h2 = http2c(gw.addr("main")).await;
    let r = h2.get("/echo/trailers").await;
    assert_eq!(r.status(), 200);
    let trailers = r.trailers.expect("trailers");
    assert_eq!(trailers["x-checksum"], "abc");
    assert_eq!(trailers["x-body-rewrite"], "trailers-seen");
}

/// The callbacks after the request-header one read the request head the terminal got, which
/// the chain keeps for them: on a `respond` route (the head itself, the terminal only looked at
/// it) and on a proxied route with a request body (a copy, the proxy takes the head). A write to
/// the head after the request phase changes only what the plugin reads next, not the request.
/// The `route_name` property follows the connection from route to route (the connection's facts
/// are made once and kept for one route).
#[tokio::test]
async fn plugins_read_the_request_head_in_later_callbacks() {
    let dir = temp_dir();
    install(dir.path(), "late_reader", "late.wasm");
    let backend = gateway_tests::backend::Backend::start("app").await;
    let cfg = one_plugin("late.wasm", "{}", "", Some(backend.addr()));
    let gw = TestGateway::start_in(dir, &cfg).await;
    let mut c = http1(gw.addr("main")).await;
    // Each reading is `:path x-tag request.path`.
    let r = c.send(get("/one?q=1", &[("x-tag", "a")])).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.header("x-late-response-head"),
        "/one?q=1 a /one?q=1; /one?q=1 rewritten /one?q=1"
    );
    assert_eq!(r.header("x-late-route"), "hello");
    // That request's body and log callbacks ran before this one's head went out.
    let r = c.send(get("/two", &[("x-tag", "b")])).await.unwrap();
    assert_eq!(
        r.header("x-late-response-body"),
        "/one?q=1 rewritten /one?q=1"
    );
    assert_eq!(r.header("x-late-log"), "/one?q=1 rewritten /one?q=1");

    let upload = Request::post("/echo/upload")
        .header("x-tag", "c")
        .body(Full::new(Bytes::from("twelve bytes")))
        .unwrap();
    let r = c.send(upload).await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(r.text(), "12");
    assert_eq!(
        r.header("x-late-response-head"),
        "/echo/upload c /echo/upload; /echo/upload rewritten /echo/upload"
    );
    assert_eq!(r.header("x-late-route"), "echo");
    let seen = backend.last().expect("a request");
    assert_eq!(
        seen.header("x-tag"),
        "c",
        "the later write stays in the plugin"
    );
    let r = c.send(get("/three", &[])).await.unwrap();
    assert_eq!(r.header("x-late-route"), "hello");
    assert_eq!(
        r.header("x-late-request-body"),
        "/echo/upload c /echo/upload"
    );
    assert_eq!(
        r.header("x-late-response-body"),
        "/echo/upload rewritten /echo/upload"
    );
    assert_eq!(
        r.header("x-late-log"),
        "/echo/upload rewritten /echo/upload"
    );
}

#[tokio::test]
async fn local_reply_and_pass_through() {
    let dir = temp_dir();
    install(dir.path(), "local_reply", "lr.wasm");
    let cfg = one_plugin(
        "lr.wasm",
        r#"{ prefix: /blocked, status: 418, body: "no tea" }"#,
        "",
        None,
    );
    let gw = TestGateway::start_in(dir, &cfg).await;
    let mut c = http1(gw.addr("main")).await;
    let r = c.get("/blocked/x").await;
    assert_eq!(r.status(), 418);
    assert_eq!(r.text(), "no tea");
    assert_eq!(r.header("x-local-reply"), "yes");
    let r = c.get("/open").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text(), "hello from the gateway");
}

#[tokio::test]
async fn shared_data_cas_counts_across_requests_and_workers() {
    let dir = temp_dir();
    install(dir.path(), "shared_counter", "sc.wasm");
    let cfg = one_plugin("sc.wasm", "{}", "", None);
    let gw = TestGateway::start_in(dir, &cfg).await;
    let addr = gw.addr("main");
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(tokio::spawn(async move {
            let mut c = http1(addr).await;
            let mut seen = Vec::new();
            for _ in 0..25 {
                let r = c.get("/").await;
                seen.push(r.header("x-request-count").parse::<u64>().expect("count"));
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let first = all[0];
    // CAS makes every increment count exactly once, whichever VM made it.
    assert_eq!(all, (first..first + 100).collect::<Vec<_>>());
    let mut metrics = String::new();
    gateway::wasm::render_prometheus(&mut metrics);
    assert!(
        metrics.contains("wasm_shared_counter_requests"),
        "{metrics}"
    );
}

#[tokio::test]
async fn tick_timer_runs_in_the_root_context() {
    let dir = temp_dir();
    install(dir.path(), "tick", "tick.wasm");
    let cfg = one_plugin("tick.wasm", r#"{ period_ms: 20 }"#, "", None);
    let gw = TestGateway::start_in(dir, &cfg).await;
    let mut c = http1(gw.addr("main")).await;
    let first: u64 = c.get("/").await.header("x-ticks").parse().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let later: u64 = c.get("/").await.header("x-ticks").parse().unwrap();
    assert!(later >= first + 5, "ticks {first} -> {later}");
}
