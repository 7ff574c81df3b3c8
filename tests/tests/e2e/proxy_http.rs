//! Reverse proxy end to end: what is forwarded (headers, Host, paths), failures (refused,
//! timeouts, broken and silent upstreams, client disconnects), retries, pooling and TLS to
//! upstreams.

use std::time::{Duration, Instant};

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{
    TestCa, TestGateway, http1, http2c, raw_status, raw_with_timeout, refusing_addr,
};
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::proxy::{get, targets, upstream, yaml};

#[tokio::test]
async fn hop_by_hop_headers_are_removed_both_ways() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{}]", b.addr()), "")).await;
    let mut c = http1(gw.addr("main")).await;
    let req = Request::get("/hop")
        .header("connection", "x-secret, keep-alive")
        .header("x-secret", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("proxy-connection", "keep-alive")
        .header("te", "gzip")
        .header("upgrade", "foo/1")
        .header("x-end-to-end", "kept")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let seen = b.last().unwrap();
    for h in [
        "connection",
        "x-secret",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "upgrade",
    ] {
        assert!(!seen.headers.contains_key(h), "{h} reached the upstream");
    }
    assert_eq!(seen.header("x-end-to-end"), "kept");
    // And on the way back.
    for h in ["x-hop-named", "keep-alive", "proxy-authenticate"] {
        assert_eq!(res.header(h), "", "{h} reached the client");
    }
    assert_eq!(res.header("x-end-to-end"), "1");
    assert_eq!(res.header("via"), "1.1 gateway");
}

#[tokio::test]
async fn forwarding_headers_and_host() {
    let b = Backend::start("a").await;
    let upstream = format!("    targets: [{}]", b.addr());
    let gw = TestGateway::start(&yaml(&upstream, "")).await;
    let mut c = http1(gw.addr("main")).await;
    let req = Request::get("/x?q=1")
        .header("host", "api.example.com:8080")
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-forwarded-proto", "https")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(c.send(req).await.unwrap().status(), 200);
    let seen = b.last().unwrap();
    assert_eq!(seen.uri, "/x?q=1");
    assert_eq!(seen.header("host"), "api.example.com:8080");
    assert_eq!(seen.header("x-forwarded-for"), "203.0.113.9, 127.0.0.1");
    assert_eq!(seen.header("x-forwarded-proto"), "http");
    assert_eq!(seen.header("x-forwarded-host"), "api.example.com:8080");
    assert_eq!(
        seen.header("forwarded"),
        "for=127.0.0.1;proto=http;host=\"api.example.com:8080\""
    );
    assert_eq!(seen.header("via"), "1.1 gateway");

    // The next request on the connection, with no forwarding headers of its own: the
    // connection's address (made once per connection) goes in as it is.
    let req = Request::get("/y")
        .header("host", "api.example.com:8080")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(c.send(req).await.unwrap().status(), 200);
    let seen = b.last().unwrap();
    assert_eq!(seen.uri, "/y");
    assert_eq!(seen.header("x-forwarded-for"), "127.0.0.1");
    assert_eq!(
        seen.header("forwarded"),
        "for=127.0.0.1;proto=http;host=\"api.example.com:8080\""
    );

    // preserve_host: false sends the target's authority instead.
    let gw = TestGateway::start(&yaml(&upstream, ", preserve_host: false")).await;
    let mut c = http1(gw.addr("main")).await;
    let req = Request::get("/")
        .header("host", "api.example.com")
        .body(Full::new(Bytes::new()))
        .unwrap();
    c.send(req).await.unwrap();
    assert_eq!(b.last().unwrap().header("host"), b.addr().to_string());

    // An HTTP/2 client's :authority becomes Host for an HTTP/1.1 upstream.
    let gw = TestGateway::start(&yaml(&upstream, "")).await;
    let mut c = http2c(gw.addr("main")).await;
    let req = Request::get("http://h2.example.com/p")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(c.send(req).await.unwrap().status(), 200);
    let seen = b.last().unwrap();
    assert_eq!(seen.header("host"), "h2.example.com");
    assert_eq!(seen.header("via"), "2 gateway");
    assert_eq!(seen.version, http::Version::HTTP_11);
}

#[tokio::test]
async fn strip_prefix_cuts_at_a_segment_boundary() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app: {{ targets: [{}] }}
routes:
  - match: {{ path_prefix: /api }}
    proxy: {{ upstream: app, strip_prefix: /api }}
"#,
        b.addr()
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    for (sent, expected) in [
        ("/api/users/7?x=1", "/users/7?x=1"),
        ("/api", "/"),
        ("/api?x=1", "/?x=1"),
    ] {
        assert_eq!(c.get(sent).await.status(), 200);
        assert_eq!(b.last().unwrap().uri, expected, "for {sent}");
    }
}

#[tokio::test]
async fn slow_upstream_gets_504_within_the_timeout() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(
        &format!("    targets: [{}]\n    timeout: 300ms", b.addr()),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    let started = Instant::now();
    assert_eq!(c.get("/slow/3000").await.status(), 504);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    assert_eq!(upstream(&gw).targets.snapshot()[0].failures, 1);
    // The connection that timed out is not reused for the next request.
    assert_eq!(c.get("/").await.status(), 200);
}

#[tokio::test]
async fn refused_connect_is_502_and_fast() {
    let gw = TestGateway::start(&yaml(&format!("    targets: [{}]", refusing_addr()), "")).await;
    let mut c = http1(gw.addr("main")).await;
    let started = Instant::now();
    assert_eq!(c.get("/").await.status(), 502);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn broken_and_silent_upstreams_never_hang() {
    // A raw upstream: garbage for /garbage, a truncated body for /truncated, silence otherwise.
    let raw = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = raw.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = raw.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                if head.starts_with("GET /garbage") {
                    let _ = s.write_all(b"NOT HTTP AT ALL\r\n\r\n").await;
                } else if head.starts_with("GET /truncated") {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nonly ten b")
                        .await;
                } else {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            });
        }
    });
    let gw = TestGateway::start(&yaml(
        &format!("    targets: [{addr}]\n    timeout: 500ms\n    health_check: {{ unhealthy_after: 100 }}"),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/garbage").await.status(), 502);
    assert_eq!(c.get("/silent").await.status(), 504);
    // Headers already went out: the client sees the body cut short, not a hang.
    let cut = tokio::time::timeout(
        Duration::from_secs(5),
        http1(gw.addr("main")).await.send(get("/truncated")),
    )
    .await
    .expect("no hang");
    assert!(
        cut.is_err(),
        "a truncated body must surface as an error: {cut:?}"
    );
    let failures = upstream(&gw).targets.snapshot()[0].failures;
    assert_eq!(failures, 3);
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_request() {
    let raw = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = raw.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = raw.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf).await;
        // Never answer; report when the gateway closes its side.
        let started = Instant::now();
        let eof = matches!(s.read(&mut buf).await, Ok(0) | Err(_));
        let _ = tx.send((eof, started.elapsed()));
    });
    let gw = TestGateway::start(&yaml(&format!("    targets: [{addr}]"), "")).await;
    let mut client = tokio::net::TcpStream::connect(gw.addr("main"))
        .await
        .unwrap();
    client
        .write_all(b"GET /wait HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(client);
    let (eof, after) = tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .expect("the upstream connection was not closed")
        .unwrap();
    assert!(eof && after < Duration::from_secs(2), "{after:?}");
}

#[tokio::test]
async fn a_client_abandoning_its_upload_cancels_cleanly() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{}]", b.addr()), "")).await;
    let mut client = tokio::net::TcpStream::connect(gw.addr("main"))
        .await
        .unwrap();
    client
        .write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\n\r\n")
        .await
        .unwrap();
    client.write_all(&[b'x'; 1000]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(client);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = &upstream(&gw).targets.snapshot()[0];
    assert_eq!((s.attempts, s.failures, s.in_flight), (1, 0, 0));
    // And the target is still in use.
    assert_eq!(http1(gw.addr("main")).await.get("/").await.status(), 200);
}

#[tokio::test]
async fn a_broken_request_body_is_not_the_targets_failure() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{}]", b.addr()), "")).await;
    // A chunked body that turns to garbage after its first chunk, on a connection kept open.
    let out = raw_with_timeout(
        gw.addr("main"),
        b"POST /upload HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nZZZ\r\n",
        Duration::from_millis(800),
    )
    .await;
    assert_eq!(raw_status(&out), 400, "{out}");
    let s = &upstream(&gw).targets.snapshot()[0];
    assert_eq!((s.attempts, s.failures, s.in_flight), (1, 0, 0));
}

#[tokio::test]
async fn idempotent_requests_retry_on_another_target() {
    let b = Backend::start("b").await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: {}\n    retries: 1\n    health_check: {{ unhealthy_after: 100 }}",
            targets(&[refusing_addr(), b.addr()])
        ),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..6 {
        assert_eq!(c.get("/").await.header("x-backend"), "b");
    }
    // POST is not idempotent: a connect failure on it is the client's answer.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let req = Request::post("/")
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap();
        statuses.push(c.send(req).await.unwrap().status());
    }
    statuses.sort();
    assert_eq!(statuses, [200, 200, 502, 502]);
    // A PUT with a body that was never sent (connect refused) can be retried.
    for _ in 0..4 {
        let req = Request::put("/")
            .body(Full::new(Bytes::from_static(b"payload")))
            .unwrap();
        assert_eq!(c.send(req).await.unwrap().status(), 200);
    }
}

#[tokio::test]
async fn upstream_503_is_retried_then_returned() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: {}\n    retries: 3\n    health_check: {{ unhealthy_after: 100 }}",
            targets(&[a.addr(), b.addr()])
        ),
        "",
    ))
    .await;
    let res = http1(gw.addr("main")).await.get("/status/503").await;
    assert_eq!(res.status(), 503);
    assert_eq!(res.text(), "status 503", "the upstream's own answer");
    // Tried once on each target: two targets bound the retries.
    assert_eq!((a.requests(), b.requests()), (1, 1));
}

/// Each attempt of a retried request sends the fields the proxy rewrote once: the client's,
/// the forwarding ones, and its own target's `Host`, each once.
#[tokio::test]
async fn every_attempt_of_a_retried_request_sends_the_same_fields() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    for preserve_host in [false, true] {
        let route = format!(", preserve_host: {preserve_host}");
        let gw = TestGateway::start(&yaml(
            &format!(
                "    targets: {}\n    retries: 3\n    health_check: {{ unhealthy_after: 100 }}",
                targets(&[a.addr(), b.addr()])
            ),
            &route,
        ))
        .await;
        let req = Request::get("/status/503?q=1")
            .header("host", "client.example")
            .header("x-client", "one")
            .header("x-client", "two")
            .header("x-forwarded-for", "192.0.2.1")
            .header("connection", "x-hop")
            .header("x-hop", "dropped")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let res = http1(gw.addr("main")).await.send(req).await.unwrap();
        assert_eq!(res.status(), 503);
        let (mut seen_a, mut seen_b) = (a.last().unwrap(), b.last().unwrap());
        for (seen, backend) in [(&seen_a, &a), (&seen_b, &b)] {
            let all = |name: &str| -> Vec<&str> {
                let values = seen.headers.get_all(name).iter();
                values.map(|v| v.to_str().unwrap()).collect()
            };
            let host = if preserve_host {
                "client.example".to_string()
            } else {
                backend.addr().to_string()
            };
            assert_eq!(all("host"), [host.as_str()]);
            assert_eq!(all("x-client"), ["one", "two"]);
            assert_eq!(all("x-forwarded-for").len(), 1);
            assert!(all("x-forwarded-for")[0].starts_with("192.0.2.1, 127.0.0.1"));
            assert_eq!(all("x-forwarded-host"), ["client.example"]);
            assert_eq!(all("via").len(), 1);
            assert!(all("x-hop").is_empty() && all("connection").is_empty());
            assert_eq!(seen.uri, "/status/503?q=1");
        }
        seen_a.headers.remove("host");
        seen_b.headers.remove("host");
        assert_eq!(seen_a.headers, seen_b.headers);
    }
}

#[tokio::test]
async fn connections_are_kept_alive_and_capped() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: [{}]\n    pool: {{ max_connections_per_target: 2 }}",
            b.addr()
        ),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..20 {
        assert_eq!(c.get("/").await.status(), 200);
    }
    let up = upstream(&gw);
    assert_eq!(
        up.open_connections(),
        [1],
        "sequential requests share one connection"
    );

    // Six concurrent 200 ms requests through two connections take three rounds.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let addr = gw.addr("main");
        tasks.push(tokio::spawn(async move {
            http1(addr).await.get("/slow/200").await.status()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(580), "{took:?}");
    assert!(up.open_connections()[0] <= 2);
}

#[tokio::test]
async fn trailers_pass_through_h2c_upstreams() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(
        &format!("    targets: [{}]\n    protocol: h2c", b.addr()),
        "",
    ))
    .await;
    let mut c = http2c(gw.addr("main")).await;
    let res = c.get("/trailers").await;
    assert_eq!(res.status(), 200);
    assert_eq!(&res.body[..], b"data");
    assert_eq!(res.trailers.unwrap()["x-checksum"], "abc");
    let seen = b.last().unwrap();
    assert_eq!(seen.version, http::Version::HTTP_2);
    assert_eq!(
        seen.uri.authority().unwrap().as_str(),
        gw.addr("main").to_string()
    );
}

#[tokio::test]
async fn tls_upstreams_verify_against_the_configured_ca() {
    let ca = TestCa::new();
    let other = TestCa::new();
    let b = Backend::start_tls("secure", &ca).await;
    let dir = gateway_tests::temp_dir();
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.path().join("other.pem"), &other.pem).unwrap();
    let config = format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  h1: {{ targets: [{addr}], tls: {{ ca: ca.pem, server_name: localhost }} }}
  h2: {{ targets: [{addr}], protocol: http2, tls: {{ ca: ca.pem }} }}
  wrong-ca: {{ targets: [{addr}], tls: {{ ca: other.pem, server_name: localhost }} }}
  skip: {{ targets: [{addr}], tls: {{ ca: other.pem, insecure_skip_verify: true }} }}
routes:
  - {{ match: {{ path_prefix: /h1 }}, proxy: {{ upstream: h1 }} }}
  - {{ match: {{ path_prefix: /h2 }}, proxy: {{ upstream: h2 }} }}
  - {{ match: {{ path_prefix: /wrong }}, proxy: {{ upstream: wrong-ca }} }}
  - {{ match: {{ path_prefix: /skip }}, proxy: {{ upstream: skip }} }}
"#,
        addr = b.addr()
    );
    let gw = TestGateway::start_in(dir, &config).await;
    let mut c = http1(gw.addr("main")).await;
    let res = c.get("/h1").await;
    assert_eq!((res.status(), res.text().as_str()), (200, "secure"));
    assert_eq!(b.last().unwrap().version, http::Version::HTTP_11);
    // HTTP/2 over TLS, verified against the target's IP address (the certificate has it).
    let res = c.get("/h2").await;
    assert_eq!(res.status(), 200);
    assert_eq!(b.last().unwrap().version, http::Version::HTTP_2);
    assert_eq!(c.get("/wrong").await.status(), 502);
    assert_eq!(c.get("/skip").await.status(), 200);
}

#[tokio::test]
async fn client_certificates_for_mutual_tls() {
    let ca = TestCa::new();
    let b = Backend::start_mtls("mtls", &ca).await;
    let dir = gateway_tests::temp_dir();
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    ca.write(
        dir.path(),
        "client",
        &["gateway.client"],
        gateway_tests::KeyKind::Ecdsa,
    );
    let config = format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  with-cert: {{ targets: [{addr}], tls: {{ ca: ca.pem, server_name: localhost, cert: client.pem, key: client.key }} }}
  without: {{ targets: [{addr}], tls: {{ ca: ca.pem, server_name: localhost }} }}
routes:
  - {{ match: {{ path_prefix: /with }}, proxy: {{ upstream: with-cert }} }}
  - {{ match: {{ path_prefix: /without }}, proxy: {{ upstream: without }} }}
"#,
        addr = b.addr()
    );
    let gw = TestGateway::start_in(dir, &config).await;
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/with").await.text(), "mtls");
    assert_eq!(c.get("/without").await.status(), 502);
}

#[tokio::test]
async fn plain_connect_is_refused() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{}]", b.addr()), "")).await;
    let out = raw_with_timeout(
        gw.addr("main"),
        b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(raw_status(&out), 405, "{out}");
}
