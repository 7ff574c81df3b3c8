//! The example plugins through the real gateway: api-key, jwt-auth, rate-limit and waf-rules
//! (written with gateway-plugin-sdk) chained on one route; the tcp-audit network filter on an
//! L4 stream; a plugin built with the proxy-wasm Go SDK under Go's own wasip1 target.

use std::time::Duration;

use bytes::Bytes;
use gateway_tests::backend::l4::{Mode, TcpBackend};
use gateway_tests::{TestGateway, http1, temp_dir};
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::wasm::{get, install, plugin};

#[tokio::test]
async fn sdk_plugins_chained_on_a_route() {
    let dir = temp_dir();
    for (name, file) in [
        ("waf_rules", "waf.wasm"),
        ("api_key", "key.wasm"),
        ("rate_limit", "rl.wasm"),
    ] {
        install(dir.path(), name, file);
    }
    let backend = gateway_tests::backend::Backend::start("app").await;
    let cfg = format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app: {{ targets: [{}] }}
plugins:
  waf:
    wasm: waf.wasm
    config:
      rules:
        - {{ id: 7, where: "header:user-agent", contains: nikto }}
        - {{ id: 8, where: body, contains: "drop table" }}
  keys:
    wasm: key.wasm
    config: {{ keys: {{ k-alice: alice, k-bob: bob }} }}
  limit:
    wasm: rl.wasm
    config: {{ requests: 3, window_seconds: 3600, key: "header:x-consumer" }}
routes:
  - match: {{ path_prefix: / }}
    filters: [ {{ plugin: waf }}, {{ plugin: keys }}, {{ plugin: limit }} ]
    proxy: {{ upstream: app }}
"#,
        backend.addr()
    );
    let gw = TestGateway::start_in(dir, &cfg).await;
    let mut c = http1(gw.addr("main")).await;

    let r = c
        .send(get("/", &[("user-agent", "Nikto/2")]))
        .await
        .unwrap();
    assert_eq!((r.status(), r.header("x-waf-rule")), (403, "7"));
    let r = c.send(get("/", &[])).await.unwrap();
    assert_eq!(r.status(), 401);
    let r = c.send(get("/", &[("x-api-key", "wrong")])).await.unwrap();
    assert_eq!(r.status(), 401);

    // alice has 3 requests; the rate limit keys on the consumer the api-key plugin set.
    for left in ["2", "1", "0"] {
        let r = c
            .send(get("/a", &[("x-api-key", "k-alice")]))
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text());
        assert_eq!(r.header("x-ratelimit-remaining"), left);
    }
    let seen = backend.last().unwrap();
    assert_eq!(seen.header("x-consumer"), "alice");
    assert_eq!(seen.header("x-api-key"), "", "the key is not forwarded");
    let r = c
        .send(get("/a", &[("x-api-key", "k-alice")]))
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let r = c.send(get("/a", &[("x-api-key", "k-bob")])).await.unwrap();
    assert_eq!(r.status(), 200);

    // The WAF reads the body before the upstream sees anything.
    let before = backend.requests();
    let req = Request::post("/upload")
        .header("x-api-key", "k-bob")
        .body(Full::new(Bytes::from("name=x; DROP TABLE users")))
        .unwrap();
    let r = c.send(req).await.unwrap();
    assert_eq!((r.status(), r.header("x-waf-rule")), (403, "8"));
    assert_eq!(backend.requests(), before);
}

#[tokio::test]
async fn jwt_auth_through_the_gateway() {
    let dir = temp_dir();
    install(dir.path(), "jwt_auth", "jwt.wasm");
    let cfg = r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
plugins:
  jwt:
    wasm: jwt.wasm
    config: { secret: "topsecret", claims_to_headers: { sub: x-user } }
routes:
  - match: { path_prefix: / }
    filters: [ { plugin: jwt }, { headers: { response_set: { x-seen: "1" } } } ]
    respond: { body: "in" }
"#;
    let gw = TestGateway::start_in(dir, cfg).await;
    let mut c = http1(gw.addr("main")).await;
    // {"alg":"HS256","typ":"JWT"} . {"sub":"carol"} signed with "topsecret".
    let token = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJjYXJvbCJ9.\
                 tImh-i0oK1cCbbptDeLrFx-jC0P9jWoVliKyKOOhnmE";
    let r = c
        .send(get("/", &[("authorization", &format!("Bearer {token}"))]))
        .await
        .unwrap();
    assert_eq!((r.status(), r.text().as_str()), (200, "in"));
    let r = c
        .send(get("/", &[("authorization", "Bearer x.y.z")]))
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn tcp_audit_network_filter() {
    let dir = temp_dir();
    install(dir.path(), "tcp_audit", "audit.wasm");
    let backend = TcpBackend::start(Mode::Echo, false).await;
    let cfg = format!(
        r#"
upstreams:
  echo: {{ targets: [{}] }}
plugins:
  audit:
    wasm: audit.wasm
    config: {{ block: "DROP TABLE" }}
streams:
  - name: db
    bind: 127.0.0.1:0
    protocol: tcp
    upstream: echo
    filters: [ {{ plugin: audit }} ]
"#,
        backend.addr()
    );
    let gw = TestGateway::start_in(dir, &cfg).await;
    let addr = gw.stream_addr("db");
    let shared = &gateway::wasm::host().shared;
    let count = |k: &str| -> u64 {
        shared
            .get(k.as_bytes())
            .and_then(|(v, _)| String::from_utf8_lossy(&v).parse().ok())
            .unwrap_or(0)
    };
    let (conns, bytes_in) = (count("tcp-audit/connections"), count("tcp-audit/bytes_in"));

    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"SELECT 1;").await.unwrap();
    let mut buf = [0u8; 9];
    tcp.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"SELECT 1;", "data passes both ways");
    tcp.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut rest)).await;
    drop(tcp);

    // A blocked pattern closes the connection.
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"DROP TABLE users;").await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "closed by the plugin");
    assert!(out.is_empty(), "nothing echoed: {out:?}");

    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while count("tcp-audit/bytes_in") < bytes_in + 9 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(count("tcp-audit/connections") >= conns + 2);
    assert!(count("tcp-audit/bytes_in") >= bytes_in + 9);
}

#[tokio::test]
async fn go_sdk_plugin() {
    let path = plugin("go_headers");
    if !path.exists() {
        eprintln!(
            "skipping: Go is not installed (or the Go plugin did not build), so there is no go_headers.wasm"
        );
        return;
    }
    let dir = temp_dir();
    install(dir.path(), "go_headers", "go.wasm");
    let cfg = crate::wasm::one_plugin("go.wasm", r#"{ value: gopher }"#, "", None);
    let gw = TestGateway::start_in(dir, &cfg).await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..3 {
        let r = c.get("/some/path").await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.header("x-go-plugin"), "gopher");
        assert_eq!(r.header("x-go-path"), "/some/path");
    }
    let r = c.get("/go-teapot").await;
    assert_eq!(r.status(), 418);
    assert_eq!(r.text(), "short and stout\n");
}
