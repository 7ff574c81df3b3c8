//! Admin API, metrics and access log end to end.

use std::time::Duration;

use gateway_tests::{TestGateway, http1, http2c, temp_dir};

async fn admin_get(gw: &TestGateway, path: &str) -> (u16, String) {
    gateway_tests::admin_request(gw, "GET", path, "").await
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

const YAML: &str = r#"
admin: { bind: 127.0.0.1:0 }
server: { watch_config: false }
listeners:
  - name: main
    bind: 127.0.0.1:0
plugins: {}
routes:
  - name: hello
    match: { path: /hello }
    respond: { body: "hi" }
  - name: broken
    match: { path: /broken }
    respond: { status: 503 }
"#;

#[tokio::test]
async fn health_ready_and_unknown_paths() {
    let gw = TestGateway::start(YAML).await;
    assert_eq!(admin_get(&gw, "/health").await, (200, "ok\n".into()));
    assert_eq!(admin_get(&gw, "/ready").await, (200, "ready\n".into()));
    assert_eq!(admin_get(&gw, "/nope").await.0, 404);
}

#[tokio::test]
async fn metrics_count_requests_by_route_status_and_protocol() {
    let gw = TestGateway::start(YAML).await;
    let addr = gw.addr("main");
    let mut c = http1(addr).await;
    for _ in 0..3 {
        assert_eq!(c.get("/hello").await.status(), 200);
    }
    assert_eq!(c.get("/broken").await.status(), 503);
    assert_eq!(c.get("/missing").await.status(), 404);
    let mut h2 = http2c(addr).await;
    assert_eq!(h2.get("/hello").await.status(), 200);
    let (status, text) = admin_get(&gw, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(
            &text,
            r#"gateway_http_requests_total{route="hello",status="2xx",protocol="http1"}"#
        ),
        3
    );
    assert_eq!(
        metric(
            &text,
            r#"gateway_http_requests_total{route="hello",status="2xx",protocol="http2"}"#
        ),
        1
    );
    assert_eq!(
        metric(
            &text,
            r#"gateway_http_requests_total{route="broken",status="5xx",protocol="http1"}"#
        ),
        1
    );
    assert_eq!(
        metric(
            &text,
            r#"gateway_http_requests_total{route="",status="4xx",protocol="http1"}"#
        ),
        1
    );
    assert_eq!(
        metric(
            &text,
            r#"gateway_http_request_duration_seconds_count{route="hello"}"#
        ),
        4
    );
    assert_eq!(
        metric(
            &text,
            r#"gateway_listener_active_connections{listener="main"}"#
        ),
        2
    );
    assert!(
        metric(
            &text,
            r#"gateway_listener_connections_total{listener="main"}"#
        ) >= 2
    );
    drop(c);
    drop(h2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, text) = admin_get(&gw, "/metrics").await;
    assert_eq!(
        metric(
            &text,
            r#"gateway_listener_active_connections{listener="main"}"#
        ),
        0
    );
}

#[tokio::test]
async fn config_endpoint_redacts_secrets() {
    let dir = temp_dir();
    crate::wasm::install(dir.path(), "add_header", "p.wasm");
    let yaml = YAML.replace(
        "plugins: {}",
        "plugins:\n  auth:\n    wasm: p.wasm\n    config: { jwt_secret: very-secret-value, header: x-api-key }",
    );
    let gw = TestGateway::start_in(dir, &yaml).await;
    let (status, body) = admin_get(&gw, "/config").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("x-api-key") && !body.contains("very-secret-value"),
        "{body}"
    );
    assert!(body.contains("<redacted>"), "{body}");
}

#[tokio::test]
async fn access_log_writes_json_and_combined_lines() {
    for (format, check) in [
        (
            "json",
            r#""method":"GET","target":"/hello?x=1","protocol":"HTTP/1.1","status":200"#,
        ),
        (
            "combined",
            "\"GET /hello?x=1 HTTP/1.1\" 200 2 \"-\" \"test-agent\"",
        ),
    ] {
        let dir = temp_dir();
        let yaml = YAML.replace(
            "plugins: {}",
            &format!("telemetry:\n  access_log: {{ path: access.log, format: {format} }}"),
        );
        let gw = TestGateway::start_in(dir, &yaml).await;
        let mut c = http1(gw.addr("main")).await;
        let req = http::Request::get("/hello?x=1")
            .header("user-agent", "test-agent")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        assert_eq!(c.send(req).await.unwrap().status(), 200);
        let path = gw.dir().join("access.log");
        let mut text = String::new();
        for _ in 0..50 {
            text = std::fs::read_to_string(&path).unwrap_or_default();
            if !text.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(text.contains(check), "{format}: {text}");
        if format == "json" {
            let v: serde_json::Value =
                serde_json::from_str(text.lines().next().unwrap()).expect("valid JSON");
            assert_eq!(v["route"], "hello");
            assert_eq!(v["user_agent"], "test-agent");
        }
    }
}

/// Reads `path` until `lines` lines have arrived (the writer is a background thread).
async fn wait_for_lines(path: &std::path::Path, lines: usize) -> String {
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= lines {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    text
}

#[tokio::test]
async fn access_log_records_tcp_connections_and_udp_sessions() {
    use gateway_tests::backend::l4::{Mode, TcpBackend, UdpEcho};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let udp = UdpEcho::start().await;
    for format in ["json", "combined"] {
        let yaml = format!(
            "{}upstreams:\n  echo: {{ targets: [\"{}\"] }}\n  udp: {{ targets: [\"{}\"] }}\n\
             streams:\n  - name: echo\n    bind: 127.0.0.1:0\n    protocol: tcp\n    upstream: echo\n\
             \x20 - name: dns\n    bind: 127.0.0.1:0\n    protocol: udp\n    upstream: udp\n    idle_timeout: 200ms\n",
            YAML.replace(
                "plugins: {}",
                &format!("telemetry:\n  access_log: {{ path: access.log, format: {format} }}"),
            ),
            echo.addr(),
            udp.addr(),
        );
        let gw = TestGateway::start_in(temp_dir(), &yaml).await;
        let mut tcp = tokio::net::TcpStream::connect(gw.stream_addr("echo"))
            .await
            .unwrap();
        let client = tcp.local_addr().unwrap();
        tcp.write_all(b"0123456789").await.unwrap();
        let mut buf = [0u8; 10];
        tcp.read_exact(&mut buf).await.unwrap();
        tcp.shutdown().await.unwrap();
        assert_eq!(
            tcp.read(&mut buf).await.unwrap(),
            0,
            "echo closes after our FIN"
        );
        drop(tcp);

        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.send_to(b"ping", gw.stream_addr("dns")).await.unwrap();
        let mut dgram = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), sock.recv(&mut dgram))
            .await
            .expect("udp echo")
            .unwrap();
        assert_eq!(&dgram[..n], b"ping");

        // The UDP line comes when its session expires (idle_timeout).
        let text = wait_for_lines(&gw.dir().join("access.log"), 2).await;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{format}: {text}");
        let tcp_line = lines
            .iter()
            .find(|l| l.contains("TCP"))
            .expect("a TCP line");
        let udp_line = lines
            .iter()
            .find(|l| l.contains("UDP"))
            .expect("a UDP line");
        if format == "json" {
            let v: serde_json::Value = serde_json::from_str(tcp_line).expect("valid JSON");
            assert_eq!(v["stream"], "echo");
            assert_eq!(v["client"], client.to_string());
            assert_eq!(v["target"], echo.addr().to_string());
            assert_eq!(v["bytes_in"], 10);
            assert_eq!(v["bytes_out"], 10);
            assert!(v.get("error").is_none(), "{tcp_line}");
            let v: serde_json::Value = serde_json::from_str(udp_line).expect("valid JSON");
            assert_eq!(v["stream"], "dns");
            assert_eq!(v["bytes_in"], 4);
            assert_eq!(v["bytes_out"], 4);
        } else {
            // nginx's stream "basic" layout: client [time] protocol status sent received secs.
            let f: Vec<&str> = tcp_line.split(' ').collect();
            assert_eq!(f[0], "127.0.0.1", "{tcp_line}");
            assert_eq!(&f[3..6], ["TCP", "200", "10"], "{tcp_line}");
            assert_eq!(f[6], "10", "{tcp_line}");
            assert_eq!(f[8], "echo", "{tcp_line}");
            assert_eq!(f[9], echo.addr().to_string(), "{tcp_line}");
            assert!(udp_line.contains(" UDP 200 4 4 "), "{udp_line}");
        }
    }
}

#[tokio::test]
async fn stream_series_count_connections_and_bytes() {
    use gateway_tests::backend::l4::{Mode, TcpBackend};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let yaml = format!(
        "{YAML}upstreams:\n  echo: {{ targets: [\"{}\"] }}\nstreams:\n  - name: echo\n    bind: 127.0.0.1:0\n    protocol: tcp\n    upstream: echo\n",
        echo.addr()
    );
    let gw = TestGateway::start(&yaml).await;
    let mut tcp = tokio::net::TcpStream::connect(gw.stream_addr("echo"))
        .await
        .unwrap();
    tcp.write_all(b"0123456789").await.unwrap();
    let mut buf = [0u8; 10];
    tcp.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"0123456789");
    let (_, text) = admin_get(&gw, "/metrics").await;
    assert_eq!(
        metric(&text, r#"gateway_stream_connections_total{stream="echo"}"#),
        1
    );
    assert_eq!(
        metric(&text, r#"gateway_stream_active_connections{stream="echo"}"#),
        1
    );
    assert_eq!(
        metric(
            &text,
            r#"gateway_stream_received_bytes_total{stream="echo"}"#
        ),
        10
    );
    assert_eq!(
        metric(&text, r#"gateway_stream_sent_bytes_total{stream="echo"}"#),
        10
    );
}

#[tokio::test]
async fn upstream_series_count_attempts_failures_and_retries() {
    let live = gateway_tests::backend::Backend::start("live").await;
    let dead = gateway_tests::refusing_addr();
    let yaml = format!(
        "{YAML}upstreams:\n  u:\n    targets: [\"{dead}\", \"{}\"]\n    retries: 1\n    health_check: {{ unhealthy_after: 100 }}\n",
        live.addr()
    )
    .replace("routes:\n", "routes:\n  - name: up\n    match: { path_prefix: /up }\n    proxy: { upstream: u }\n");
    let gw = TestGateway::start(&yaml).await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..4 {
        assert_eq!(c.get("/up").await.status(), 200);
    }
    let (_, text) = admin_get(&gw, "/metrics").await;
    let retries = metric(&text, r#"gateway_upstream_retries_total{upstream="u"}"#);
    let failures = metric(
        &text,
        &format!(r#"gateway_upstream_failures_total{{upstream="u",target="{dead}"}}"#),
    );
    assert!(retries >= 1, "{text}");
    assert_eq!(retries, failures, "every failed attempt was retried");
}

/// Every series the Grafana dashboard in docs/ queries is one the gateway exports: a gateway
/// with each kind of part the dashboard shows (routes, a proxied upstream, a rate limit, a WAF
/// policy, a plugin, a TCP stream) is scraped and each metric name of each query is looked
/// for among the families `/metrics` declares.
#[tokio::test]
async fn the_dashboard_queries_only_exported_metrics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let mut queried = std::collections::BTreeSet::new();
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            panels += 1;
            let expr = target["expr"].as_str().expect("a query");
            queried.extend(metric_names(expr));
        }
    }
    assert!(panels >= 20 && queried.len() >= 20, "{queried:?}");

    let dir = temp_dir();
    crate::wasm::install(dir.path(), "add_header", "dashboard.wasm");
    let backend = gateway_tests::backend::Backend::start("app").await;
    let yaml = format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app: {{ targets: [{backend}] }}
plugins:
  dashboard: {{ wasm: dashboard.wasm, config: {{ name: x-a, value: b }} }}
waf:
  strict: {{ mode: block, detect: [sqli] }}
routes:
  - name: api
    match: {{ path_prefix: / }}
    filters:
      - waf: strict
      - rate_limit: {{ requests: 100, per: 1s }}
      - plugin: dashboard
    proxy: {{ upstream: app }}
streams:
  - name: tcp
    bind: 127.0.0.1:0
    protocol: tcp
    upstream: app
"#,
        backend = backend.addr()
    );
    let gw = TestGateway::start_in(dir, &yaml).await;
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/x").await.status(), 200);
    let (_, metrics) = admin_get(&gw, "/metrics").await;
    let exported: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let missing: Vec<_> = queried
        .iter()
        .filter(|name| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            !exported.contains(name.as_str()) && !exported.contains(family)
        })
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// The metric names in a PromQL expression: the gateway's and the process's series.
fn metric_names(expr: &str) -> Vec<String> {
    let bytes = expr.as_bytes();
    let mut names = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &expr[i..];
        let starts = (rest.starts_with("gateway_") || rest.starts_with("process_"))
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        if starts {
            let len = rest
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                .count();
            names.push(rest[..len].to_owned());
            i += len;
        } else {
            i += 1;
        }
    }
    names
}
