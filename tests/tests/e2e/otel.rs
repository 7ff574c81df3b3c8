//! OpenTelemetry traces end to end: the gateway exports to a real OTLP receiver (gRPC and
//! HTTP/protobuf, decoded with `opentelemetry-proto`), continues incoming `traceparent`s,
//! sends its own upstream, samples parent-based, ends spans with the response body (a slow
//! body, a client that leaves), survives a dead collector without slowing requests, follows
//! reloads, and reports L4 connections.

use std::time::Duration;

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::backend::l4::{Mode, TcpBackend};
use gateway_tests::otlp::{OtlpReceiver, Received, Span, attr_bool, attr_int, attr_str, hex};
use gateway_tests::{TestGateway, http1, http2c};
use http::Request;
use http_body_util::Full;

const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

/// A gateway with listener `main`, admin, upstream `app` on `targets`, routes `api` (proxy,
/// one retry) and `broken` (respond 503), and `telemetry` as given (YAML lines indented by
/// two spaces).
fn config(telemetry: &str, targets: &[std::net::SocketAddr]) -> String {
    let list: Vec<String> = targets.iter().map(ToString::to_string).collect();
    format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
telemetry:
{telemetry}
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app:
    targets: [{}]
    retries: 1
routes:
  - name: broken
    match: {{ path: /broken }}
    respond: {{ status: 503 }}
  - name: api
    match: {{ path_prefix: / }}
    proxy: {{ upstream: app }}
"#,
        list.join(", ")
    )
}

fn traces(endpoint: &str, ratio: f64) -> String {
    format!(
        "  service_name: edge-test\n  traces: {{ otlp_endpoint: \"{endpoint}\", sample_ratio: {ratio} }}\n"
    )
}

fn get(path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::get(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).expect("request")
}

fn traceparent(flags: &str) -> String {
    format!("00-{PARENT_TRACE}-{PARENT_SPAN}-{flags}")
}

fn find(spans: &[Received], kind: i32) -> Vec<&Span> {
    spans
        .iter()
        .map(|r| &r.span)
        .filter(|s| s.kind == kind)
        .collect()
}

const SERVER: i32 = 2;
const CLIENT: i32 = 3;

async fn admin_metrics(gw: &TestGateway) -> String {
    let addr = gw.gateway().admin_addr().expect("admin");
    let req = gateway_tests::admin_head(gw, "GET", "/metrics", "");
    gateway_tests::raw(addr, req.as_bytes()).await
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn grpc_export_continues_the_client_trace_with_semconv_attributes() {
    let collector = OtlpReceiver::start().await;
    let backend = Backend::start("b1").await;
    let gw = TestGateway::start(&config(
        &traces(&collector.grpc_endpoint(), 1.0),
        &[backend.addr()],
    ))
    .await;
    let addr = gw.addr("main");
    let mut c = http1(addr).await;
    let tp = traceparent("01");
    let res = c
        .send(get(
            "/hello?token=secret",
            &[
                ("traceparent", &tp),
                ("tracestate", "vendor=abc"),
                ("user-agent", "otel-test/1.0"),
            ],
        ))
        .await
        .expect("request");
    assert_eq!(res.status(), 200);

    // The backend got the trace, with the gateway's client span as parent.
    let seen = backend.last().expect("backend saw the request");
    let sent = seen.header("traceparent").to_owned();
    assert_eq!(sent.len(), 55, "{sent}");
    assert!(sent.starts_with(&format!("00-{PARENT_TRACE}-")), "{sent}");
    assert!(sent.ends_with("-01"), "{sent}");
    assert_ne!(&sent[36..52], PARENT_SPAN);
    assert_eq!(seen.header("tracestate"), "vendor=abc");

    let spans = collector.trace(PARENT_TRACE, 2).await;
    let server = find(&spans, SERVER);
    let client = find(&spans, CLIENT);
    assert_eq!((server.len(), client.len()), (1, 1), "{spans:#?}");
    let (server, client) = (server[0], client[0]);

    // Parentage: incoming span -> server span -> client span -> backend.
    assert_eq!(hex(&server.parent_span_id), PARENT_SPAN);
    assert_eq!(client.parent_span_id, server.span_id);
    assert_eq!(hex(&client.span_id), &sent[36..52]);
    assert_eq!(server.trace_state, "vendor=abc");
    assert_eq!(server.flags & 0x301, 0x301, "sampled, parent remote");

    let a = &server.attributes;
    assert_eq!(server.name, "GET api");
    assert_eq!(attr_str(a, "http.request.method"), "GET");
    assert_eq!(attr_str(a, "url.path"), "/hello");
    assert_eq!(attr_str(a, "url.scheme"), "http");
    assert_eq!(attr_str(a, "http.route"), "api");
    assert_eq!(attr_int(a, "http.response.status_code"), Some(200));
    assert_eq!(attr_str(a, "server.address"), "127.0.0.1");
    assert_eq!(attr_int(a, "server.port"), Some(i64::from(addr.port())));
    assert_eq!(attr_str(a, "client.address"), "127.0.0.1");
    assert_eq!(attr_str(a, "network.protocol.version"), "1.1");
    assert_eq!(attr_str(a, "user_agent.original"), "otel-test/1.0");
    assert!(server.status.is_none(), "{:?}", server.status);
    assert!(server.end_time_unix_nano >= server.start_time_unix_nano);
    assert!(server.start_time_unix_nano <= client.start_time_unix_nano);

    let a = &client.attributes;
    assert_eq!(client.name, "GET");
    assert_eq!(attr_str(a, "http.request.method"), "GET");
    assert_eq!(attr_str(a, "server.address"), "127.0.0.1");
    assert_eq!(
        attr_int(a, "server.port"),
        Some(i64::from(backend.addr().port()))
    );
    assert_eq!(attr_int(a, "http.response.status_code"), Some(200));
    assert!(client.status.is_none());

    let resource = &spans[0].resource;
    assert_eq!(attr_str(resource, "service.name"), "edge-test");
    assert_eq!(attr_str(resource, "service.version"), gateway::VERSION);
    assert!(!attr_str(resource, "host.name").is_empty());
    assert!(collector.requests().0 > 0, "sent over gRPC");
}

#[tokio::test]
async fn http_export_marks_5xx_and_retried_attempts_as_errors() {
    let collector = OtlpReceiver::start().await;
    let (b1, b2) = (Backend::start("b1").await, Backend::start("b2").await);
    let gw = TestGateway::start(&config(
        &traces(&collector.http_endpoint(), 1.0),
        &[b1.addr(), b2.addr()],
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/broken").await.status(), 503);
    assert_eq!(c.get("/status/503").await.status(), 503);

    // Three spans: the local 503, and the proxied one with its two attempts.
    let spans = collector
        .wait_for(Duration::from_secs(10), |s| s.len() >= 4)
        .await;
    let servers = find(&spans, SERVER);
    let clients = find(&spans, CLIENT);
    assert_eq!((servers.len(), clients.len()), (2, 2), "{spans:#?}");
    for s in &servers {
        assert_eq!(s.status.as_ref().map(|s| s.code), Some(2), "{s:?}");
        assert_eq!(attr_str(&s.attributes, "error.type"), "503");
        assert!(s.parent_span_id.is_empty(), "a new trace");
    }
    let broken = servers
        .iter()
        .find(|s| attr_str(&s.attributes, "http.route") == "broken")
        .expect("span of /broken");
    assert_eq!(broken.name, "GET broken");
    let proxied = servers
        .iter()
        .find(|s| attr_str(&s.attributes, "http.route") == "api")
        .expect("span of /status/503");
    for c in &clients {
        assert_eq!(c.trace_id, proxied.trace_id);
        assert_eq!(c.parent_span_id, proxied.span_id);
        assert_eq!(c.status.as_ref().map(|s| s.code), Some(2));
        assert_eq!(
            attr_int(&c.attributes, "http.response.status_code"),
            Some(503)
        );
    }
    let resent: Vec<Option<i64>> = clients
        .iter()
        .map(|c| attr_int(&c.attributes, "http.request.resend_count"))
        .collect();
    assert!(
        resent.contains(&None) && resent.contains(&Some(1)),
        "{resent:?}"
    );
    let (grpc, http) = collector.requests();
    assert_eq!(grpc, 0);
    assert!(http > 0, "sent over OTLP/HTTP");
}

#[tokio::test]
async fn ratio_zero_still_keeps_sampled_parents_and_propagates_the_rest() {
    let collector = OtlpReceiver::start().await;
    let backend = Backend::start("b1").await;
    let gw = TestGateway::start(&config(
        &traces(&collector.grpc_endpoint(), 0.0),
        &[backend.addr()],
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;

    // New trace at ratio 0: not recorded, but propagated unsampled.
    assert_eq!(c.get("/new").await.status(), 200);
    let sent = backend
        .last()
        .expect("seen")
        .header("traceparent")
        .to_owned();
    assert!(sent.starts_with("00-") && sent.ends_with("-00"), "{sent}");
    let unsampled_trace = sent[3..35].to_owned();

    // An unsampled parent stays unsampled, with its trace id.
    let tp = traceparent("00");
    c.send(get("/unsampled", &[("traceparent", &tp)]))
        .await
        .expect("request");
    let sent = backend
        .last()
        .expect("seen")
        .header("traceparent")
        .to_owned();
    assert!(sent.starts_with(&format!("00-{PARENT_TRACE}-")), "{sent}");
    assert!(sent.ends_with("-00"), "{sent}");

    // An invalid traceparent starts a new trace (unsampled here).
    c.send(get("/invalid", &[("traceparent", "00-zz-yy-01")]))
        .await
        .expect("request");
    let sent = backend
        .last()
        .expect("seen")
        .header("traceparent")
        .to_owned();
    assert!(
        !sent.contains(PARENT_TRACE) && sent.ends_with("-00"),
        "{sent}"
    );

    // A sampled parent is always kept.
    let sampled = "0af7651916cd43dd8448eb211c80319c";
    let tp = format!("00-{sampled}-b7ad6b7169203331-01");
    c.send(get("/sampled", &[("traceparent", &tp)]))
        .await
        .expect("request");
    let spans = collector.trace(sampled, 2).await;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    // Spans are exported in order, so anything recorded earlier has arrived by now.
    let all = collector.received();
    assert!(
        all.iter().all(|r| hex(&r.span.trace_id) == sampled),
        "only the sampled trace: {all:#?} (unsampled was {unsampled_trace})"
    );
}

#[tokio::test]
async fn a_dead_collector_costs_spans_not_latency() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let backend = Backend::start("b1").await;
    let gw = TestGateway::start(&config(
        &traces(&format!("http://{dead}"), 1.0),
        &[backend.addr()],
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    let start = std::time::Instant::now();
    for _ in 0..200 {
        assert_eq!(c.get("/broken").await.status(), 503);
    }
    // Generous for a debug build on a busy machine; an export on the request path would take
    // a connect attempt per request.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    let mut dropped = 0;
    for _ in 0..100 {
        let text = admin_metrics(&gw).await;
        dropped = metric(&text, "gateway_trace_spans_dropped_total");
        if dropped >= 200 {
            assert_eq!(metric(&text, "gateway_trace_spans_exported_total"), 0);
            assert!(metric(&text, "gateway_trace_export_failures_total") > 0);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dropped, 200);
}

#[tokio::test]
async fn a_silent_collector_does_not_hold_requests() {
    // Accepts connections and never answers: every export waits for its timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = silent.local_addr().expect("addr");
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            held.push(tcp);
        }
    });
    let backend = Backend::start("b1").await;
    let gw = TestGateway::start(&config(
        &traces(&format!("http://{addr}"), 1.0),
        &[backend.addr()],
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    // Past one batch and the flush interval, so an export is stuck while requests go on.
    for i in 0..3 {
        let start = std::time::Instant::now();
        for _ in 0..300 {
            assert_eq!(c.get("/broken").await.status(), 503);
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "round {i}: {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    hold.abort();
}

#[tokio::test]
async fn reload_switches_the_exporter() {
    let first = OtlpReceiver::start().await;
    let second = OtlpReceiver::start().await;
    let backend = Backend::start("b1").await;
    let targets = [backend.addr()];
    let gw = TestGateway::start(&config(&traces(&first.grpc_endpoint(), 1.0), &targets)).await;
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/one").await.status(), 200);
    first
        .wait_for(Duration::from_secs(10), |s| !s.is_empty())
        .await;

    let path = gw.dir().join("gateway.yaml");
    std::fs::write(
        &path,
        config(&traces(&second.http_endpoint(), 1.0), &targets),
    )
    .expect("write");
    gw.gateway().reload().await.expect("reload");
    assert_eq!(c.get("/two").await.status(), 200);
    let spans = second
        .wait_for(Duration::from_secs(10), |s| s.len() >= 2)
        .await;
    assert!(
        spans
            .iter()
            .any(|r| attr_str(&r.span.attributes, "url.path") == "/two"),
        "{spans:#?}"
    );
    assert!(
        first
            .received()
            .iter()
            .all(|r| attr_str(&r.span.attributes, "url.path") != "/two")
    );

    // Without `traces` nothing is traced and nothing is injected.
    std::fs::write(&path, config("  service_name: edge-test\n", &targets)).expect("write");
    gw.gateway().reload().await.expect("reload");
    assert_eq!(c.get("/three").await.status(), 200);
    assert_eq!(backend.last().expect("seen").header("traceparent"), "");
}

#[tokio::test]
async fn access_log_carries_the_trace_id() {
    let collector = OtlpReceiver::start().await;
    let backend = Backend::start("b1").await;
    let telemetry = traces(&collector.grpc_endpoint(), 1.0)
        + "  access_log: { path: access.log, format: json }\n";
    let gw = TestGateway::start(&config(&telemetry, &[backend.addr()])).await;
    let mut c = http1(gw.addr("main")).await;
    let tp = traceparent("01");
    c.send(get("/logged", &[("traceparent", &tp)]))
        .await
        .expect("request");
    let log = gw.dir().join("access.log");
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("/logged") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        text.contains(&format!("\"trace_id\":\"{PARENT_TRACE}\"")),
        "{text}"
    );
}

#[tokio::test]
async fn tcp_stream_connections_get_a_span() {
    let collector = OtlpReceiver::start().await;
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let yaml = format!(
        r#"
telemetry:
{}
upstreams:
  db:
    targets: [{}]
streams:
  - name: echo
    bind: 127.0.0.1:0
    protocol: tcp
    upstream: db
"#,
        traces(&collector.grpc_endpoint(), 1.0),
        echo.addr()
    );
    let gw = TestGateway::start(&yaml).await;
    let reply = crate::streams::exchange(gw.stream_addr("echo"), b"hello, stream").await;
    assert_eq!(reply, b"hello, stream");
    let spans = collector
        .wait_for(Duration::from_secs(10), |s| !s.is_empty())
        .await;
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let s = &spans[0].span;
    assert_eq!(s.name, "tcp echo");
    assert_eq!(s.kind, SERVER);
    let a = &s.attributes;
    assert_eq!(attr_str(a, "network.transport"), "tcp");
    assert_eq!(attr_str(a, "gateway.stream"), "echo");
    assert_eq!(
        attr_str(a, "gateway.stream.target"),
        echo.addr().to_string()
    );
    assert_eq!(attr_str(a, "client.address"), "127.0.0.1");
    assert_eq!(attr_int(a, "gateway.stream.bytes_in"), Some(13));
    assert_eq!(attr_int(a, "gateway.stream.bytes_out"), Some(13));
    assert!(s.status.is_none(), "{:?}", s.status);
    assert!(s.end_time_unix_nano >= s.start_time_unix_nano);
}

#[tokio::test]
async fn udp_sessions_get_a_span_when_they_expire() {
    let collector = OtlpReceiver::start().await;
    let echo = gateway_tests::backend::l4::UdpEcho::start().await;
    let yaml = format!(
        r#"
telemetry:
{}
upstreams:
  dns:
    targets: [{}]
streams:
  - name: dns
    bind: 127.0.0.1:0
    protocol: udp
    upstream: dns
    idle_timeout: 200ms
"#,
        traces(&collector.grpc_endpoint(), 1.0),
        echo.addr()
    );
    let gw = TestGateway::start(&yaml).await;
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    socket
        .send_to(b"query", gw.stream_addr("dns"))
        .await
        .expect("send");
    let mut buf = [0u8; 64];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buf))
        .await
        .expect("echo in time")
        .expect("recv");
    assert_eq!(&buf[..n], b"query");
    let spans = collector
        .wait_for(Duration::from_secs(10), |s| !s.is_empty())
        .await;
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let s = &spans[0].span;
    assert_eq!(s.name, "udp dns");
    let a = &s.attributes;
    assert_eq!(attr_str(a, "network.transport"), "udp");
    assert_eq!(
        attr_str(a, "gateway.stream.target"),
        echo.addr().to_string()
    );
    assert_eq!(
        attr_int(a, "client.port"),
        Some(i64::from(socket.local_addr().expect("addr").port()))
    );
    assert_eq!(attr_int(a, "gateway.stream.bytes_in"), Some(5));
    assert_eq!(attr_int(a, "gateway.stream.bytes_out"), Some(5));
}

#[tokio::test]
async fn plugin_http_calls_carry_the_request_trace() {
    let collector = OtlpReceiver::start().await;
    let auth = Backend::start("auth").await;
    let app = Backend::start("app").await;
    let dir = gateway_tests::temp_dir();
    crate::wasm::install(dir.path(), "http_auth", "auth.wasm");
    let yaml = format!(
        r#"
telemetry:
{}
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  auth: {{ targets: [{}] }}
  app: {{ targets: [{}] }}
plugins:
  auth:
    wasm: auth.wasm
    config: {{ upstream: auth, path: /check, timeout_ms: 2000 }}
routes:
  - name: guarded
    match: {{ path_prefix: / }}
    filters: [ {{ plugin: auth }} ]
    proxy: {{ upstream: app }}
"#,
        traces(&collector.grpc_endpoint(), 1.0),
        auth.addr(),
        app.addr()
    );
    let gw = TestGateway::start_in(dir, &yaml).await;
    let mut c = http1(gw.addr("main")).await;
    let tp = traceparent("01");
    c.send(get(
        "/private",
        &[("traceparent", &tp), ("authorization", "Bearer x")],
    ))
    .await
    .expect("request");

    // The call reached the auth service inside the request's trace.
    let seen = auth.last().expect("the plugin called the auth service");
    let sent = seen.header("traceparent").to_owned();
    assert!(sent.starts_with(&format!("00-{PARENT_TRACE}-")), "{sent}");

    let spans = collector.trace(PARENT_TRACE, 3).await;
    let server = find(&spans, SERVER);
    let internal = find(&spans, 1);
    assert_eq!((server.len(), internal.len()), (1, 1), "{spans:#?}");
    let call = internal[0];
    assert_eq!(call.name, "plugin http_call");
    assert_eq!(attr_str(&call.attributes, "gateway.upstream"), "auth");
    assert_eq!(call.parent_span_id, server[0].span_id);
    let attempt = find(&spans, CLIENT)
        .into_iter()
        .find(|s| s.parent_span_id == call.span_id)
        .expect("the call's upstream attempt");
    assert_eq!(hex(&attempt.span_id), &sent[36..52]);
}

#[tokio::test]
async fn http3_requests_get_server_spans() {
    let collector = OtlpReceiver::start().await;
    let ca = gateway_tests::TestCa::new();
    let dir = gateway_tests::temp_dir();
    ca.write(
        dir.path(),
        "site",
        &["site.test"],
        gateway_tests::KeyKind::Ecdsa,
    );
    let yaml = format!(
        r#"
telemetry:
{}
certificates:
  site: {{ cert: site.pem, key: site.key }}
listeners:
  - name: web
    bind: 127.0.0.1:0
    protocols: [http1, http2, http3]
    tls: {{ certificates: [site] }}
routes:
  - name: hello
    match: {{ path: /hello }}
    respond: {{ body: "hi" }}
"#,
        traces(&collector.grpc_endpoint(), 1.0)
    );
    let gw = TestGateway::start_in(dir, &yaml).await;
    let client = gateway_tests::h3::connect(gw.addr("web"), "site.test", &ca).await;
    let res = client
        .send(
            client
                .request("GET", "/hello")
                .header("traceparent", traceparent("01"))
                .body(Bytes::new())
                .expect("request"),
        )
        .await
        .expect("HTTP/3 request");
    assert_eq!(res.status(), 200);
    let spans = collector.trace(PARENT_TRACE, 1).await;
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let s = &spans[0].span;
    assert_eq!(s.name, "GET hello");
    assert_eq!(hex(&s.parent_span_id), PARENT_SPAN);
    let a = &s.attributes;
    assert_eq!(attr_str(a, "network.protocol.version"), "3");
    assert_eq!(attr_str(a, "url.scheme"), "https");
    assert_eq!(attr_str(a, "server.address"), "site.test");
    assert_eq!(attr_int(a, "http.response.status_code"), Some(200));
    client.close().await;
}

fn duration_ms(s: &Span) -> u64 {
    s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano) / 1_000_000
}

#[tokio::test]
async fn spans_last_until_the_response_body_has_been_sent() {
    let collector = OtlpReceiver::start().await;
    let backend = Backend::start("b1").await;
    let gw = TestGateway::start(&config(
        &traces(&collector.grpc_endpoint(), 1.0),
        &[backend.addr()],
    ))
    .await;
    // The head comes at once, the body 300 ms later, over both HTTP versions.
    let traces = [
        (
            "4bf92f3577b34da6a3ce929d0e0e0001",
            http1(gw.addr("main")).await,
        ),
        (
            "4bf92f3577b34da6a3ce929d0e0e0002",
            http2c(gw.addr("main")).await,
        ),
    ];
    for (trace, mut c) in traces {
        let tp = format!("00-{trace}-{PARENT_SPAN}-01");
        let res = c
            .send(get("/slow-body/300", &[("traceparent", &tp)]))
            .await
            .expect("request");
        assert_eq!((res.status(), res.text().as_str()), (200, "slow body"));
        let spans = collector.trace(trace, 2).await;
        let (server, client) = (find(&spans, SERVER), find(&spans, CLIENT));
        assert_eq!((server.len(), client.len()), (1, 1), "{spans:#?}");
        let (server, client) = (server[0], client[0]);
        assert!(
            duration_ms(server) >= 300,
            "server span {}",
            duration_ms(server)
        );
        assert!(
            duration_ms(client) >= 300,
            "client span {}",
            duration_ms(client)
        );
        // The upstream body ends before the client's does.
        assert!(client.end_time_unix_nano <= server.end_time_unix_nano);
        assert!(server.status.is_none() && client.status.is_none());
        assert_eq!(attr_bool(&server.attributes, "gateway.client_gone"), None);
    }
}

#[tokio::test]
async fn a_client_gone_before_the_body_ends_its_spans_marked() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let collector = OtlpReceiver::start().await;
    let backend = Backend::start("b1").await;
    let gw = TestGateway::start(&config(
        &traces(&collector.grpc_endpoint(), 1.0),
        &[backend.addr()],
    ))
    .await;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr("main"))
        .await
        .expect("connect");
    let tp = traceparent("01");
    let req = format!("GET /slow-body/2000 HTTP/1.1\r\nHost: gw\r\ntraceparent: {tp}\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.expect("write");
    // Read the head, then leave before the body.
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tcp.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed before the head");
        head.extend_from_slice(&buf[..n]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let left = std::time::Instant::now();
    drop(tcp);

    let spans = collector.trace(PARENT_TRACE, 2).await;
    let (server, client) = (find(&spans, SERVER), find(&spans, CLIENT));
    assert_eq!((server.len(), client.len()), (1, 1), "{spans:#?}");
    for s in [server[0], client[0]] {
        assert_eq!(
            attr_bool(&s.attributes, "gateway.client_gone"),
            Some(true),
            "{s:#?}"
        );
        // Ended when the client left, not when the body would have ended.
        assert!(duration_ms(s) < 1500, "{}", duration_ms(s));
    }
    assert!(left.elapsed() < Duration::from_secs(10));
}

/// OpenTelemetry's standard variables configure what the file leaves out: a config without
/// `telemetry:` exports spans and metrics to `OTEL_EXPORTER_OTLP_ENDPOINT` (OTLP/HTTP, the
/// signal paths appended), under `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, with the
/// `OTEL_EXPORTER_OTLP_HEADERS` on every export. The binary runs in a process of its own so
/// the variables reach no other test.
#[tokio::test]
async fn otel_environment_variables_configure_the_export() {
    use std::process::Command;
    let collector = OtlpReceiver::start().await;
    let dir = gateway_tests::temp_dir();
    let (port, cfg) = gateway_tests::binary_config(dir.path(), |port| {
        format!(
            "listeners:\n  - name: a\n    bind: 127.0.0.1:{port}\nroutes:\n  - name: hello\n    match: {{ path: /hello }}\n    respond: {{ body: hi }}\n"
        )
    });
    let child = Command::new(gateway_tests::gateway_binary())
        .args(["run", "--config"])
        .arg(&cfg)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.http_base())
        .env("OTEL_SERVICE_NAME", "from-env")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=test,team=edge%20ops",
        )
        .env("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cret")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "200")
        .env("OTEL_TRACES_SAMPLER", "always_on")
        .spawn()
        .expect("run gateway");
    let _child = gateway_tests::Running(child);
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    assert!(
        gateway_tests::ports::wait_listening(addr, Duration::from_secs(10)).await,
        "the gateway listens"
    );
    let mut c = http1(addr).await;
    assert_eq!(c.get("/hello").await.status(), 200);

    let spans = collector
        .wait_for(Duration::from_secs(10), |s| !s.is_empty())
        .await;
    let span = spans.first().expect("a span exported");
    assert_eq!(attr_str(&span.resource, "service.name"), "from-env");
    assert_eq!(attr_str(&span.resource, "deployment.environment"), "test");
    assert_eq!(attr_str(&span.resource, "team"), "edge ops");
    let metrics = collector
        .wait_for_metrics(|m| m.iter().any(|m| m.name == "gateway_http_requests_total"))
        .await;
    assert!(metrics.is_some(), "metrics exported on the interval");
    let headers = collector.http_headers();
    assert!(headers.len() >= 2, "{headers:?}");
    assert!(
        headers
            .iter()
            .all(|h| h.get("api-key").is_some_and(|v| v == "s3cret")),
        "{headers:?}"
    );
}

/// A variable that cannot be used stops the start with its name, as a config error would.
#[test]
fn a_bad_otel_variable_is_named() {
    let dir = gateway_tests::temp_dir();
    let cfg = gateway_tests::write_file(
        dir.path(),
        "g.yaml",
        "listeners:\n  - name: a\n    bind: 127.0.0.1:0\nroutes:\n  - match: { path: / }\n    respond: { body: hi }\n",
    );
    let out = std::process::Command::new(gateway_tests::gateway_binary())
        .args(["validate", "--config"])
        .arg(&cfg)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
        .env("OTEL_TRACES_SAMPLER", "traceidratio")
        .env("OTEL_TRACES_SAMPLER_ARG", "lots")
        .output()
        .expect("run gateway");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("environment variable OTEL_TRACES_SAMPLER_ARG: `lots` is not a ratio"),
        "{err}"
    );
}

/// A gateway binary in a process of its own, for its log: the log is installed once per
/// process and goes to stderr. Killed when dropped.
struct LoggingGateway {
    child: std::process::Child,
    /// Every line of its stderr, as it comes.
    lines: std::sync::mpsc::Receiver<String>,
}

impl LoggingGateway {
    /// Runs the binary on `yaml` (with `RUST_LOG` as given, else unset) and waits until `port`
    /// accepts connections.
    async fn start(yaml: &str, port: u16, rust_log: Option<&str>) -> (Self, tempfile::TempDir) {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let dir = gateway_tests::temp_dir();
        let cfg = gateway_tests::write_file(dir.path(), "g.yaml", yaml);
        let mut command = Command::new(gateway_tests::gateway_binary());
        command
            .args(["run", "--config"])
            .arg(&cfg)
            .env_remove("RUST_LOG")
            .stderr(Stdio::piped());
        if let Some(filter) = rust_log {
            command.env("RUST_LOG", filter);
        }
        let mut child = command.spawn().expect("run gateway");
        let (tx, lines) = std::sync::mpsc::channel::<String>();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let gateway = Self { child, lines };
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        assert!(
            gateway_tests::ports::wait_listening(addr, Duration::from_secs(10)).await,
            "the gateway listens"
        );
        (gateway, dir)
    }

    /// Reads the log, every line a JSON object, up to the first whose message is `message`:
    /// that line, and the ones before it.
    fn wait_for_line(&self, message: &str) -> (serde_json::Value, Vec<serde_json::Value>) {
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no `{message}` line in {seen:#?}"));
            let value: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            if value["fields"]["message"] == message {
                return (value, seen);
            }
            seen.push(value);
        }
    }
}

impl Drop for LoggingGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `line`'s `span_id`, checked to be 16 lowercase hex digits.
fn logged_span_id(line: &serde_json::Value) -> String {
    let span_id = line["span_id"].as_str().expect("span_id").to_owned();
    assert_eq!(span_id.len(), 16, "{line}");
    assert!(
        span_id
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "{line}"
    );
    span_id
}

/// The gateway's own log, as JSON, carries the ids of the request's server span on every line
/// written while the request is served, and none on lines written outside requests: the
/// upstream refuses the connection, so the proxy warns once per request.
#[tokio::test]
async fn json_log_lines_written_for_a_request_carry_its_trace_and_span_ids() {
    let collector = OtlpReceiver::start().await;
    // Reserved for this test and never bound: connecting to it is refused.
    let refused = gateway_tests::ports::reserved_port();
    let port = gateway_tests::ports::reserved_port();
    let yaml = format!(
        r#"
server: {{ log_format: json, watch_config: false }}
telemetry:
  traces: {{ otlp_endpoint: "{}", sample_ratio: 1.0 }}
listeners:
  - name: a
    bind: 127.0.0.1:{port}
upstreams:
  gone:
    targets: ["127.0.0.1:{refused}"]
routes:
  - name: gone
    match: {{ path_prefix: / }}
    proxy: {{ upstream: gone }}
"#,
        collector.grpc_endpoint()
    );
    let (gw, _dir) = LoggingGateway::start(&yaml, port, None).await;
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut c = http1(addr).await;
    let tp = traceparent("01");
    let res = c
        .send(get("/x", &[("traceparent", &tp)]))
        .await
        .expect("request");
    assert_eq!(res.status(), 502);

    let (warning, before) = gw.wait_for_line("proxying failed");
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["trace_id"], PARENT_TRACE, "{warning}");
    let span_id = logged_span_id(&warning);
    // The gateway's own span, not the caller's: the server span it exported.
    assert_ne!(span_id, PARENT_SPAN);
    let spans = collector.trace(PARENT_TRACE, 1).await;
    let server = find(&spans, SERVER);
    assert_eq!(server.len(), 1, "{spans:#?}");
    assert_eq!(hex(&server[0].span_id), span_id);
    // Lines written outside any request (the start, the listeners) carry no ids.
    let outside: Vec<_> = before
        .iter()
        .filter(|l| l.get("trace_id").is_none())
        .collect();
    assert!(!outside.is_empty(), "the start is logged: {before:#?}");
    for line in outside {
        assert!(line.get("span_id").is_none(), "{line}");
    }
}

/// A traced TCP stream connection's log lines carry the ids of the connection's span, the one
/// exported when it ends: its target refuses, and the connection's closing line (at `debug`)
/// names it.
#[tokio::test]
async fn json_log_lines_written_for_a_stream_connection_carry_its_span_ids() {
    let collector = OtlpReceiver::start().await;
    let refused = gateway_tests::ports::reserved_port();
    let port = gateway_tests::ports::reserved_port();
    let yaml = format!(
        r#"
server: {{ log_format: json, watch_config: false }}
telemetry:
  traces: {{ otlp_endpoint: "{}", sample_ratio: 1.0 }}
upstreams:
  gone:
    targets: ["127.0.0.1:{refused}"]
streams:
  - name: tcp-gone
    bind: 127.0.0.1:{port}
    protocol: tcp
    upstream: gone
"#,
        collector.grpc_endpoint()
    );
    let (gw, _dir) = LoggingGateway::start(&yaml, port, Some("info,stream_proxy=debug")).await;
    // The start's probe was a connection too: two connections, two traces, in either order.
    let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let mut rest = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut c, &mut rest).await;
    let mut traces = Vec::new();
    for _ in 0..2 {
        let (closed, _) = gw.wait_for_line("connection closed");
        let trace_id = closed["trace_id"].as_str().expect("trace_id").to_owned();
        assert_eq!(trace_id.len(), 32, "{closed}");
        let span_id = logged_span_id(&closed);
        let spans = collector.trace(&trace_id, 1).await;
        let span = &spans
            .iter()
            .find(|r| hex(&r.span.trace_id) == trace_id)
            .expect("the connection's span")
            .span;
        assert_eq!(span.name, "tcp tcp-gone");
        assert_eq!(hex(&span.span_id), span_id, "{closed}");
        traces.push(trace_id);
    }
    assert_ne!(traces[0], traces[1], "a new trace each");
}
