//! Where the host behaves as Envoy does for upstream-SDK plugins (the `envoy-compat` test
//! plugin reports what it sees): the plugin configuration's bytes, the request head as one
//! shape over HTTP/1.1, HTTP/2 and HTTP/3, and the response body callbacks of a client that
//! goes away.

use std::net::SocketAddr;
use std::time::Duration;

use gateway_tests::backend::Backend;
use gateway_tests::{KeyKind, TestCa, TestGateway, TestResponse, http1, http2c, temp_dir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::wasm::install;

/// Three copies of the plugin (a string, a map and no `config`) on `/str`, `/map`, `/none`;
/// `/up` proxies through the map one to `backend` over HTTP/1.1, `/slow` to `slow`. Listener
/// `main` is plain, `web` is TLS with HTTP/3.
async fn gateway(backend: SocketAddr, slow: SocketAddr) -> (TestGateway, TestCa) {
    let dir = temp_dir();
    let ca = TestCa::new();
    ca.write(dir.path(), "site", &["site.test"], KeyKind::Ecdsa);
    for name in ["compat_str", "compat_map", "compat_none"] {
        install(dir.path(), "envoy_compat", &format!("{name}.wasm"));
    }
    let yaml = format!(
        r#"
certificates:
  site: {{ cert: site.pem, key: site.key }}
listeners:
  - name: main
    bind: 127.0.0.1:0
  - name: web
    bind: 127.0.0.1:0
    protocols: [http1, http2, http3]
    tls: {{ certificates: [site] }}
upstreams:
  app: {{ targets: [{backend}] }}
  slow: {{ targets: [{slow}] }}
plugins:
  compat_str:
    wasm: compat_str.wasm
    config: "some text"
  compat_map:
    wasm: compat_map.wasm
    config: {{ a: 1 }}
  compat_none:
    wasm: compat_none.wasm
routes:
  - match: {{ path_prefix: /str/ }}
    filters: [ {{ plugin: compat_str }} ]
    respond: {{ body: "str" }}
  - match: {{ path_prefix: /none/ }}
    filters: [ {{ plugin: compat_none }} ]
    respond: {{ body: "none" }}
  - match: {{ path_prefix: /up/ }}
    filters: [ {{ plugin: compat_map }} ]
    proxy: {{ upstream: app, strip_prefix: /up }}
  - match: {{ path_prefix: /slow/ }}
    filters: [ {{ plugin: compat_map }} ]
    proxy: {{ upstream: slow, strip_prefix: /slow }}
  - match: {{ path_prefix: /map/ }}
    filters: [ {{ plugin: compat_map }} ]
    respond: {{ body: "map" }}
"#
    );
    (TestGateway::start_in(dir, &yaml).await, ca)
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn plugin_configuration_arrives_as_under_envoy() {
    let backend = Backend::start("compat-config").await;
    let (gw, _ca) = gateway(backend.addr(), backend.addr()).await;
    let mut c = http1(gw.addr("main")).await;

    // A YAML string is handed over as its bytes, not as a JSON string.
    let r = c.get("/str/inspect").await;
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(r.header("x-config-status"), "0");
    assert_eq!(r.header("x-config-size"), "9");
    assert_eq!(r.header("x-config-hex"), hex("some text"));

    // A map is handed over as JSON.
    let r = c.get("/map/inspect").await;
    assert_eq!(r.header("x-config-hex"), hex(r#"{"a":1}"#));

    // No configuration: an empty buffer (OK, no pointer), as Envoy gives in on_configure.
    let r = c.get("/none/inspect").await;
    assert_eq!(r.header("x-config-status"), "0");
    assert_eq!(r.header("x-config-size"), "0");
    assert_eq!(r.header("x-config-null"), "true");

    // Outside on_configure Envoy has no plugin configuration to give: NotFound (1).
    for path in ["/str/inspect", "/none/inspect"] {
        let r = c.get(path).await;
        assert_eq!(r.header("x-config-later"), "1 true", "{path}");
    }

    // The VMs' linear memory is on /metrics, whole Wasm pages.
    let mut metrics = String::new();
    gateway::wasm::render_prometheus(&mut metrics);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("gateway_plugin_memory_bytes{plugin=\"compat_str\"}"))
        .unwrap_or_else(|| panic!("{metrics}"));
    let bytes: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(bytes >= 1 << 16 && bytes.is_multiple_of(1 << 16), "{line}");
}

fn names(r: &TestResponse) -> String {
    r.header("x-names").to_owned()
}

#[tokio::test]
async fn request_heads_look_alike_over_h1_h2_and_h3() {
    let backend = Backend::start("compat-heads").await;
    let (gw, ca) = gateway(backend.addr(), backend.addr()).await;

    let h1 = http1(gw.addr("main")).await.get("/none/inspect").await;
    let h2 = http2c(gw.addr("main")).await.get("/none/inspect").await;
    let h3 = gateway_tests::h3::connect(gw.addr("web"), "site.test", &ca)
        .await
        .get("/none/inspect")
        .await;
    let authority = gw.addr("main").to_string();
    for (proto, r) in [("h1", &h1), ("h2", &h2), ("h3", &h3)] {
        assert_eq!(r.status(), 200, "{proto}: {}", r.text());
        assert_eq!(
            names(r),
            ":authority,:method,:path,:scheme",
            "{proto}: only the pseudo-headers, no `host`"
        );
        assert_eq!(r.header("x-host"), "(none)", "{proto}: `host` is not found");
    }
    assert_eq!(h1.header("x-authority"), authority);
    assert_eq!(h2.header("x-authority"), authority);
    let web = format!("site.test:{}", gw.addr("web").port());
    assert_eq!(h3.header("x-authority"), web);

    // A change to `:authority` goes upstream as `Host` over HTTP/1.1, whatever the client spoke.
    for mut c in [http1(gw.addr("main")).await, http2c(gw.addr("main")).await] {
        let r = c.get("/up/authority/x").await;
        assert_eq!(r.status(), 200, "{}", r.text());
        let seen = backend.last().expect("a request upstream");
        assert_eq!(seen.header("host"), "rewritten.example");
        assert_eq!(seen.headers.get_all("host").iter().count(), 1);
    }
}

/// An upstream that answers with `head` at once, then `body` after `delay`, then closes.
async fn staged_upstream(head: String, body: Vec<u8>, delay: Duration) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (head, body) = (head.clone(), body.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(head.as_bytes()).await;
                tokio::time::sleep(delay).await;
                let _ = s.write_all(&body).await;
            });
        }
    });
    addr
}

/// Sends `GET path` on a raw connection, reads until the response head is in, and closes.
async fn read_head_and_leave(addr: SocketAddr, path: &str) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the head");
        got.extend_from_slice(&buf[..n]);
    }
}

/// What the plugin last recorded in on_log (`BYTES EOS` of the response body it saw), once it
/// is other than `before`.
async fn body_seen(gw: &TestGateway, before: &str) -> String {
    let mut c = http1(gw.addr("main")).await;
    let mut seen = String::new();
    for _ in 0..100 {
        let r = c.get("/none/inspect").await;
        seen = r.header("x-body-seen").to_owned();
        if seen != before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen
}

#[tokio::test]
async fn a_client_that_leaves_after_the_head_ends_the_body_callbacks_as_under_envoy() {
    // The upstream sends the head, then its body once the client has gone: Envoy resets the
    // stream when the client goes, so the plugin gets no body callback, and its log callback
    // still runs.
    let body = vec![b'x'; 64 << 10];
    let slow = staged_upstream(
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()),
        body,
        Duration::from_millis(300),
    )
    .await;
    let big = vec![b'y'; 256 << 10];
    let prompt = staged_upstream(
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", big.len()),
        big,
        Duration::ZERO,
    )
    .await;
    let (gw, _ca) = gateway(prompt, slow).await;
    read_head_and_leave(gw.addr("main"), "/slow/body/late").await;
    assert_eq!(body_seen(&gw, "(none)").await, "0 false");

    // The upstream sends its body right behind the head: Envoy passes it through the body
    // callbacks as it arrives, before the client's close is read, so the plugin sees all of
    // it, to its end.
    read_head_and_leave(gw.addr("main"), "/up/body/prompt").await;
    assert_eq!(
        body_seen(&gw, "0 false").await,
        format!("{} true", 256 << 10)
    );
}
