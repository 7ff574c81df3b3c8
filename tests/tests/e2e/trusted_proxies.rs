//! `listeners[].trusted_proxies` end to end, on real sockets from several loopback addresses:
//! an untrusting edge gateway in front of a trusting inner one, the client they name in the
//! inner one's rate-limit keys, WAF lists, access log, spans and forwarding headers; HTTP/1.1
//! (the fast path and hyper's server), h2c and HTTP/3; `Forwarded`; malformed fields counted.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{
    Client, TestGateway, connect_from, counter_value, http1_over, http2c_over, temp_dir,
};
use http::Request;
use http_body_util::Full;

/// The inner gateway: trusts 127.0.0.1 (the edge gateway's outgoing address).
fn inner(backend: &Backend) -> String {
    format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
telemetry:
  access_log: {{ path: access.log, format: json }}
listeners:
  - name: inner
    bind: 127.0.0.1:0
    trusted_proxies: [127.0.0.1, "10.0.0.0/8"]
waf:
  blocklist:
    mode: block
    deny: [127.0.0.66/32]
upstreams:
  app:
    targets: [{}]
routes:
  - name: limited
    match: {{ path_prefix: /limited }}
    filters:
      - rate_limit: {{ requests: 2, per: 1m, key: client_ip }}
    respond: {{ body: ok }}
  - name: guarded
    match: {{ path_prefix: /guarded }}
    filters:
      - waf: blocklist
    respond: {{ body: ok }}
  - name: hello
    match: {{ path: /hello }}
    respond: {{ body: hi }}
  - name: moved
    match: {{ path_prefix: /moved }}
    redirect: {{ path: /new }}
  - name: app
    match: {{ path_prefix: / }}
    proxy: {{ upstream: app }}
"#,
        backend.addr()
    )
}

/// The edge gateway: trusts no one, forwards everything to `inner`.
fn edge(inner: &TestGateway) -> String {
    format!(
        r#"
listeners:
  - name: edge
    bind: 127.0.0.1:0
upstreams:
  inner:
    targets: [{}]
routes:
  - name: all
    match: {{ path_prefix: / }}
    proxy: {{ upstream: inner }}
"#,
        inner.addr("inner")
    )
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

async fn h1_from(source: &str, gw: &TestGateway, listener: &str) -> Client {
    let addr = gw.addr(listener);
    http1_over(connect_from(ip(source), addr).await, addr.to_string()).await
}

fn get(path: &str, fields: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::get(path);
    for (name, value) in fields {
        b = b.header(*name, *value);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

/// The access log's `client` for each line whose target is `target`.
async fn logged_clients(gw: &TestGateway, target: &str, want: usize) -> Vec<String> {
    let path = gw.dir().join("access.log");
    let mut clients = Vec::new();
    for _ in 0..100 {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        clients = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == target)
            .map(|v| v["client"].as_str().unwrap_or_default().to_owned())
            .collect();
        if clients.len() >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    clients
}

#[tokio::test]
async fn behind_an_untrusting_edge_the_real_client_is_the_client_everywhere() {
    let b = Backend::start("app").await;
    let inner = TestGateway::start_in(temp_dir(), &inner(&b)).await;
    let edge = TestGateway::start(&edge(&inner)).await;

    // A client's own X-Forwarded-For is not believed by the edge, which appends its peer; the
    // inner gateway trusts the edge and names that peer.
    let mut a = h1_from("127.0.0.9", &edge, "edge").await;
    let res = a
        .send(get("/app/x", &[("x-forwarded-for", "6.6.6.6")]))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let seen = b.last().unwrap();
    assert_eq!(
        seen.header("x-forwarded-for"),
        "6.6.6.6, 127.0.0.9, 127.0.0.1"
    );
    assert_eq!(logged_clients(&inner, "/app/x", 1).await, ["127.0.0.9"]);

    // Rate-limit buckets are per real client, not per edge.
    let mut other = h1_from("127.0.0.10", &edge, "edge").await;
    for want in [200, 200, 429] {
        let res = a.send(get("/limited", &[])).await.unwrap();
        assert_eq!(res.status(), want);
    }
    assert_eq!(
        other.send(get("/limited", &[])).await.unwrap().status(),
        200
    );

    // WAF lists see the real client.
    let mut denied = h1_from("127.0.0.66", &edge, "edge").await;
    assert_eq!(
        denied.send(get("/guarded", &[])).await.unwrap().status(),
        403
    );
    assert_eq!(a.send(get("/guarded", &[])).await.unwrap().status(), 200);
}

#[tokio::test]
async fn an_untrusted_peer_is_not_believed() {
    let b = Backend::start("app").await;
    let inner = TestGateway::start_in(temp_dir(), &inner(&b)).await;
    let mut c = h1_from("127.0.0.9", &inner, "inner").await;
    let spoof = [
        ("x-forwarded-for", "127.0.0.66"),
        ("forwarded", "for=127.0.0.66"),
    ];
    assert_eq!(c.send(get("/guarded", &spoof)).await.unwrap().status(), 200);
    c.send(get("/direct", &spoof)).await.unwrap();
    // As before: the chain is kept and the peer appended.
    assert_eq!(
        b.last().unwrap().header("x-forwarded-for"),
        "127.0.0.66, 127.0.0.9"
    );
    assert_eq!(logged_clients(&inner, "/direct", 1).await, ["127.0.0.9"]);
}

#[tokio::test]
async fn a_trusted_peer_names_the_client_over_http1_fast_path_hyper_and_h2c() {
    let b = Backend::start("app").await;
    let inner = TestGateway::start_in(temp_dir(), &inner(&b)).await;
    let addr = inner.addr("inner");
    // HTTP/1.1 on the fast path (a body-less GET of a `respond` route)...
    let mut c = h1_from("127.0.0.1", &inner, "inner").await;
    c.send(get(
        "/hello",
        &[("x-forwarded-for", "198.51.100.4, 10.1.2.3")],
    ))
    .await
    .unwrap();
    // ...on hyper's server (a request with a body)...
    let post = Request::post("/hello")
        .header("x-forwarded-for", "198.51.100.5")
        .body(Full::new(Bytes::from_static(b"body")))
        .unwrap();
    c.send(post).await.unwrap();
    // ...and over h2c, with `Forwarded` alone, an IPv6 client and its port.
    let tcp = connect_from(ip("127.0.0.1"), addr).await;
    let mut h2 = http2c_over(tcp, addr.to_string()).await;
    let fwd = [("forwarded", r#"for="[2001:db8::7]:4711";proto=https"#)];
    h2.send(get("/hello", &fwd)).await.unwrap();
    let clients = logged_clients(&inner, "/hello", 3).await;
    assert_eq!(clients, ["198.51.100.4", "198.51.100.5", "2001:db8::7"]);

    // The proxy keeps the chain it was sent and appends its peer.
    h2.send(get("/via-h2", &[("x-forwarded-for", "203.0.113.5")]))
        .await
        .unwrap();
    assert_eq!(
        b.last().unwrap().header("x-forwarded-for"),
        "203.0.113.5, 127.0.0.1"
    );
    let forwarded = b.last().unwrap().header("forwarded").to_owned();
    assert!(
        forwarded.starts_with("for=127.0.0.1;proto=http"),
        "{forwarded}"
    );
}

#[tokio::test]
async fn malformed_fields_stop_at_the_last_good_hop_and_are_counted() {
    let b = Backend::start("app").await;
    let inner = TestGateway::start_in(temp_dir(), &inner(&b)).await;
    let mut c = h1_from("127.0.0.1", &inner, "inner").await;
    for bad in ["192.0.2.1, not-an-address, 10.0.0.2", "junk"] {
        c.send(get("/hello", &[("x-forwarded-for", bad)]))
            .await
            .unwrap();
    }
    let fwd = [("forwarded", r#"for="[2001:db8::1"#)];
    assert_eq!(c.send(get("/hello", &fwd)).await.unwrap().status(), 200);
    let clients = logged_clients(&inner, "/hello", 3).await;
    assert_eq!(clients, ["10.0.0.2", "127.0.0.1", "127.0.0.1"]);
    let series = r#"gateway_http_forwarded_invalid_total{listener="inner"}"#;
    assert_eq!(counter_value(&inner, series).await, 3);
}

#[tokio::test]
async fn spans_name_the_client_a_trusted_proxy_reports() {
    let collector = gateway_tests::otlp::OtlpReceiver::start().await;
    let yaml = format!(
        r#"
telemetry:
  traces: {{ otlp_endpoint: "{}", sample_ratio: 1.0 }}
listeners:
  - name: inner
    bind: 127.0.0.1:0
    trusted_proxies: [127.0.0.1]
routes:
  - name: hello
    match: {{ path: /hello }}
    respond: {{ body: hi }}
"#,
        collector.grpc_endpoint()
    );
    let gw = TestGateway::start(&yaml).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let tp = format!("00-{trace}-00f067aa0ba902b7-01");
    let mut c = h1_from("127.0.0.1", &gw, "inner").await;
    let fields = [
        ("traceparent", tp.as_str()),
        ("x-forwarded-for", "192.0.2.33"),
    ];
    assert_eq!(c.send(get("/hello", &fields)).await.unwrap().status(), 200);
    let spans = collector.trace(trace, 1).await;
    let a = &spans[0].span.attributes;
    assert_eq!(
        gateway_tests::otlp::attr_str(a, "client.address"),
        "192.0.2.33"
    );
}

#[tokio::test]
async fn http3_requests_from_a_trusted_peer_name_their_client() {
    let ca = gateway_tests::TestCa::new();
    let dir = temp_dir();
    ca.write(
        dir.path(),
        "site",
        &["site.test"],
        gateway_tests::KeyKind::Ecdsa,
    );
    let yaml = r#"
certificates:
  site: { cert: site.pem, key: site.key }
listeners:
  - name: web
    bind: 127.0.0.1:0
    protocols: [http1, http2, http3]
    tls: { certificates: [site] }
    trusted_proxies: [127.0.0.1]
waf:
  blocklist: { mode: block, deny: [192.0.2.44/32] }
routes:
  - name: guarded
    match: { path_prefix: /guarded }
    filters:
      - waf: blocklist
    respond: { body: ok }
"#;
    let gw = TestGateway::start_in(dir, yaml).await;
    let c = gateway_tests::h3::connect(gw.addr("web"), "site.test", &ca).await;
    for (client, want) in [("192.0.2.44", 403), ("192.0.2.45", 200)] {
        let req = c
            .request("GET", "/guarded")
            .header("x-forwarded-for", client)
            .body(Bytes::new())
            .unwrap();
        assert_eq!(c.send(req).await.unwrap().status(), want, "{client}");
    }
}

/// A load balancer that ends the client's TLS says so in `X-Forwarded-Proto`: from a trusted
/// peer the upstream gets the client's scheme (over the fast path's HTTP/1.1 and h2c alike),
/// while `Forwarded` still describes the hop the gateway received; from any other peer the
/// field is replaced by the connection's own scheme.
#[tokio::test]
async fn a_trusted_peer_reports_the_scheme_its_client_used() {
    let b = Backend::start("app").await;
    let inner = TestGateway::start_in(temp_dir(), &inner(&b)).await;
    let addr = inner.addr("inner");
    let https = [("x-forwarded-proto", "https")];
    let mut trusted = h1_from("127.0.0.1", &inner, "inner").await;
    trusted.send(get("/scheme", &https)).await.unwrap();
    let seen = b.last().unwrap();
    assert_eq!(seen.header("x-forwarded-proto"), "https");
    let forwarded = seen.header("forwarded");
    assert!(
        forwarded.starts_with("for=127.0.0.1;proto=http;"),
        "{forwarded}"
    );
    // With a client named too, over h2c.
    let tcp = connect_from(ip("127.0.0.1"), addr).await;
    let mut h2 = http2c_over(tcp, addr.to_string()).await;
    let both = [
        ("x-forwarded-for", "198.51.100.9"),
        ("x-forwarded-proto", "https"),
    ];
    h2.send(get("/scheme-h2", &both)).await.unwrap();
    assert_eq!(b.last().unwrap().header("x-forwarded-proto"), "https");
    assert_eq!(
        logged_clients(&inner, "/scheme-h2", 1).await,
        ["198.51.100.9"]
    );
    // A redirect that names no scheme keeps the client's.
    let moved = trusted.send(get("/moved", &https)).await.unwrap();
    assert!(
        moved.header("location").starts_with("https://"),
        "{moved:?}"
    );
    // Not believed from an untrusted peer.
    let mut other = h1_from("127.0.0.9", &inner, "inner").await;
    other.send(get("/scheme", &https)).await.unwrap();
    assert_eq!(b.last().unwrap().header("x-forwarded-proto"), "http");
    let moved = other.send(get("/moved", &https)).await.unwrap();
    assert!(moved.header("location").starts_with("http://"), "{moved:?}");
}
