//! HTTP/3 end to end with a real QUIC client (quinn + h3): respond, static files (1 KiB and
//! 10 MiB hashed, ranges, ETag revalidation, precompressed, HEAD), proxy to an HTTP/1.1
//! backend (streamed upload, trailers), 404, 100 concurrent streams on one connection,
//! clients that close or vanish mid-download, Alt-Svc on HTTP/1.1 and HTTP/2, the connection
//! cap, a failed handshake counted, 0-RTT (off by default; safe methods only when on), and GOAWAY drains on reload and
//! shutdown that let running downloads finish.

use std::time::Duration;

use bytes::{Buf, Bytes};
use gateway::telemetry::ListenerMetrics;
use gateway_tests::backend::Backend;
use gateway_tests::h3::{Relay, client_config, client_config_offering, connect, connect_with};
use gateway_tests::{KeyKind, TestCa, TestGateway, https, temp_dir, write_file};
use http::Version;
use sha2::{Digest, Sha256};

const BIG: usize = 10 * 1024 * 1024;

struct Setup {
    gw: TestGateway,
    ca: TestCa,
    backend: Backend,
    small: Vec<u8>,
    big: Vec<u8>,
}

/// Deterministic incompressible bytes.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3]
        })
        .collect()
}

fn sha(data: &[u8]) -> Vec<u8> {
    Sha256::digest(data).to_vec()
}

/// A TLS listener `web` with http1, http2 and http3 (`http3` settings as YAML lines indented
/// six spaces), a plain listener `plain`, and routes: `/hello` respond, `/up/*` proxy to an
/// HTTP/1.1 backend, `/h2c/*` to the same backend over h2c, `/files/*` static.
async fn setup(http3: &str) -> Setup {
    let ca = TestCa::new();
    let dir = temp_dir();
    ca.write(dir.path(), "site", &["site.test"], KeyKind::Ecdsa);
    let small = noise(1024, 7);
    let big = noise(BIG, 11);
    write_file(dir.path(), "public/files/small.bin", &small);
    write_file(dir.path(), "public/files/big.bin", &big);
    write_file(dir.path(), "public/files/page.txt", "plain text page\n");
    write_file(dir.path(), "public/files/page.txt.gz", b"pretend-gzip");
    let backend = Backend::start("b1").await;
    let yaml = format!(
        r#"
server: {{ watch_config: false, drain_timeout: 10s }}
certificates:
  site: {{ cert: site.pem, key: site.key }}
listeners:
  - name: web
    bind: 127.0.0.1:0
    protocols: [http1, http2, http3]
    tls: {{ certificates: [site] }}
    http3:
      max_concurrent_streams: 128
{http3}
  - name: plain
    bind: 127.0.0.1:0
upstreams:
  app: {{ targets: [{backend}] }}
  app2c: {{ targets: [{backend}], protocol: h2c }}
routes:
  - match: {{ path: /hello }}
    respond: {{ body: "hello over h3", headers: {{ content-type: text/plain }} }}
  - match: {{ path_prefix: /up/ }}
    proxy: {{ upstream: app, strip_prefix: /up }}
  - match: {{ path_prefix: /h2c/ }}
    proxy: {{ upstream: app2c, strip_prefix: /h2c }}
  - match: {{ path_prefix: /files/ }}
    static: {{ root: public, precompressed: [gzip] }}
"#,
        backend = backend.addr()
    );
    Setup {
        gw: TestGateway::start_in(dir, &yaml).await,
        ca,
        backend,
        small,
        big,
    }
}

fn quic_metrics(gw: &TestGateway) -> ListenerMetrics {
    ListenerMetrics::quic(&gw.gateway().telemetry().registry, "web")
}

/// Waits up to `secs` for the open QUIC connection gauge to reach `want`.
async fn active_becomes(gw: &TestGateway, want: i64, secs: u64) -> i64 {
    let gauge = quic_metrics(gw).active;
    for _ in 0..secs * 20 {
        if gauge.get() == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gauge.get()
}

#[tokio::test]
async fn respond_static_proxy_and_404_over_h3() {
    let s = setup("").await;
    let c = connect(s.gw.addr("web"), "site.test", &s.ca).await;

    let res = c.get("/hello").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.head.version, Version::HTTP_3);
    assert_eq!(res.text(), "hello over h3");
    assert_eq!(res.header("server"), "gateway");
    assert_eq!(res.header("alt-svc"), "", "no Alt-Svc on HTTP/3 itself");

    let res = c.get("/files/small.bin").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.header("content-length"), "1024");
    assert_eq!(sha(&res.body), sha(&s.small));

    let res = c.get("/files/big.bin").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.body.len(), BIG);
    assert_eq!(sha(&res.body), sha(&s.big));

    assert_eq!(c.get("/nothing/here").await.status(), 404);
    assert_eq!(c.get("/files/missing.bin").await.status(), 404);

    // Proxy to the HTTP/1.1 backend: request head, streamed upload, trailers.
    let res = c.get("/up/anything").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.text(), "b1");
    let seen = s.backend.last().expect("backend saw the request");
    assert_eq!(seen.version, Version::HTTP_11);
    assert_eq!(seen.uri.path(), "/anything");
    assert!(
        seen.header("via").contains("3 gateway"),
        "{}",
        seen.header("via")
    );
    assert_eq!(
        seen.header("transfer-encoding"),
        "",
        "bodiless GET sent without a body"
    );

    let upload = noise(3 * 1024 * 1024 + 17, 3);
    let req = c
        .request("POST", "/up/upload")
        .header("content-length", upload.len())
        .body(Bytes::from(upload.clone()))
        .unwrap();
    let res = c.send(req).await.expect("upload");
    assert_eq!(res.status(), 200);
    assert_eq!(res.text(), upload.len().to_string());

    // Trailers need an upstream that can send them unasked: HTTP/2 (h2c).
    let res = c.get("/h2c/trailers").await;
    assert_eq!(res.text(), "data");
    let trailers = res.trailers.expect("trailers over HTTP/3");
    assert_eq!(trailers.get("x-checksum").unwrap(), "abc");
    c.close().await;
}

#[tokio::test]
async fn the_entry_rules_hold_over_h3() {
    let s = setup("").await;
    let c = connect(s.gw.addr("web"), "site.test", &s.ca).await;
    // Routed on the normalized path: `/x/../up/a/./b//c` is `/up/a/b/c`.
    let res = c.get("/x/../up/a/./b//c?q=/../").await;
    assert_eq!(res.status(), 200, "{}", res.text());
    let seen = s.backend.last().expect("forwarded");
    assert_eq!(seen.uri.to_string(), "/a/b/c?q=/../");
    let before = s.backend.requests();
    assert_eq!(c.get("/up/a%2Fb").await.status(), 400);
    assert_eq!(c.get("/up/%zz").await.status(), 400);
    assert_eq!(
        s.backend.requests(),
        before,
        "refused requests reached the backend"
    );
}

#[tokio::test]
async fn ranges_etags_precompressed_and_head_over_h3() {
    let s = setup("").await;
    let c = connect(s.gw.addr("web"), "site.test", &s.ca).await;

    let req = c
        .request("GET", "/files/big.bin")
        .header("range", "bytes=1000-1999")
        .body(Bytes::new())
        .unwrap();
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status(), 206);
    assert_eq!(
        res.header("content-range"),
        format!("bytes 1000-1999/{BIG}")
    );
    assert_eq!(&res.body[..], &s.big[1000..2000]);

    let req = c
        .request("GET", "/files/big.bin")
        .header("range", "bytes=-10")
        .body(Bytes::new())
        .unwrap();
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status(), 206);
    assert_eq!(&res.body[..], &s.big[BIG - 10..]);

    let first = c.get("/files/small.bin").await;
    let etag = first.header("etag").to_owned();
    assert!(!etag.is_empty());
    let req = c
        .request("GET", "/files/small.bin")
        .header("if-none-match", &etag)
        .body(Bytes::new())
        .unwrap();
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status(), 304);
    assert!(res.body.is_empty());

    let req = c
        .request("GET", "/files/page.txt")
        .header("accept-encoding", "gzip")
        .body(Bytes::new())
        .unwrap();
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.header("content-encoding"), "gzip");
    assert_eq!(&res.body[..], b"pretend-gzip");

    let req = c
        .request("HEAD", "/files/small.bin")
        .body(Bytes::new())
        .unwrap();
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.header("content-length"), "1024");
    assert!(res.body.is_empty());
    c.close().await;
}

#[tokio::test]
async fn hundred_concurrent_streams_on_one_connection() {
    let s = setup("").await;
    let c = connect(s.gw.addr("web"), "site.test", &s.ca).await;
    let requests = (0..100).map(|i| {
        let c = &c;
        async move {
            let path = match i % 3 {
                0 => "/hello",
                1 => "/files/small.bin",
                _ => "/up/x",
            };
            (i, c.get(path).await)
        }
    });
    let results = futures_util::future::join_all(requests).await;
    for (i, res) in results {
        assert_eq!(res.status(), 200, "request {i}");
        match i % 3 {
            0 => assert_eq!(res.text(), "hello over h3"),
            1 => assert_eq!(sha(&res.body), sha(&s.small)),
            _ => assert_eq!(res.text(), "b1"),
        }
    }
    assert_eq!(quic_metrics(&s.gw).accepted.get(), 1, "one connection");
    c.close().await;
    assert_eq!(active_becomes(&s.gw, 0, 5).await, 0);
}

#[tokio::test]
async fn clients_that_close_or_vanish_mid_download_leave_nothing_behind() {
    let s = setup("      idle_timeout: 1s\n").await;
    let addr = s.gw.addr("web");

    // A client that closes its connection in the middle of a 10 MiB download.
    let c = connect(addr, "site.test", &s.ca).await;
    let req = c.request("GET", "/files/big.bin").body(()).unwrap();
    let mut stream = c.open(req).await.unwrap();
    stream.finish().await.unwrap();
    assert_eq!(stream.recv_response().await.unwrap().status(), 200);
    let chunk = stream.recv_data().await.unwrap().expect("some data");
    assert!(chunk.remaining() > 0);
    c.close().await;

    // A client whose packets stop arriving (no CONNECTION_CLOSE): the idle timeout ends it.
    let relay = Relay::start(addr).await;
    let v = connect(relay.addr, "site.test", &s.ca).await;
    let req = v.request("GET", "/files/big.bin").body(()).unwrap();
    let mut stream = v.open(req).await.unwrap();
    stream.finish().await.unwrap();
    assert_eq!(stream.recv_response().await.unwrap().status(), 200);
    let _ = stream.recv_data().await.unwrap();
    relay.blackhole();

    // The gateway keeps serving others meanwhile.
    let other = connect(addr, "site.test", &s.ca).await;
    let res = other.get("/files/big.bin").await;
    assert_eq!(sha(&res.body), sha(&s.big));
    other.close().await;

    // Every connection task ends: the abandoned downloads do not linger.
    assert_eq!(active_becomes(&s.gw, 0, 10).await, 0);
    drop(stream);
    drop(v);
}

#[tokio::test]
async fn alt_svc_is_advertised_on_http1_and_http2() {
    let s = setup("").await;
    let addr = s.gw.addr("web");
    let want = format!("h3=\":{}\"; ma=86400", addr.port());
    for alpn in [&b"h2"[..], &b"http/1.1"[..]] {
        let (mut c, _) = https(addr, "site.test", &s.ca, &[alpn]).await;
        let res = c.get("/hello").await;
        assert_eq!(res.status(), 200);
        assert_eq!(res.header("alt-svc"), want, "ALPN {alpn:?}");
        // Also on errors the gateway answers itself.
        assert_eq!(c.get("/nothing").await.header("alt-svc"), want);
    }
    // A listener without http3 advertises nothing.
    let mut plain = gateway_tests::http1(s.gw.addr("plain")).await;
    assert_eq!(plain.get("/hello").await.header("alt-svc"), "");
}

#[tokio::test]
async fn connection_cap_refuses_extra_connections() {
    let s = setup("      max_connections: 1\n").await;
    let addr = s.gw.addr("web");
    let first = connect(addr, "site.test", &s.ca).await;
    assert_eq!(first.get("/hello").await.status(), 200);
    let second = connect_with(addr, "site.test", &client_config(&s.ca), false).await;
    assert!(second.is_err(), "the second connection is refused");
    assert!(quic_metrics(&s.gw).refused.get() >= 1);
    first.close().await;
    assert_eq!(active_becomes(&s.gw, 0, 5).await, 0);
    let third = connect(addr, "site.test", &s.ca).await;
    assert_eq!(third.get("/hello").await.status(), 200);
    third.close().await;
}

/// A client offering no ALPN the QUIC side speaks fails its handshake: counted, and the
/// listener goes on serving.
#[tokio::test]
async fn a_failed_quic_handshake_is_counted() {
    let s = setup("").await;
    let addr = s.gw.addr("web");
    let failures = quic_metrics(&s.gw).handshake_errors;
    assert_eq!(failures.get(), 0);
    let wrong_alpn = client_config_offering(&s.ca, &[b"h2"]);
    let refused = connect_with(addr, "site.test", &wrong_alpn, false).await;
    assert!(refused.is_err(), "a handshake without h3 is refused");
    for _ in 0..100 {
        if failures.get() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(failures.get(), 1);
    assert_eq!(quic_metrics(&s.gw).handshake_timeouts.get(), 0);
    let c = connect(addr, "site.test", &s.ca).await;
    assert_eq!(c.get("/hello").await.status(), 200);
    c.close().await;
}

/// Connects once to get a resumption ticket, then again asking for 0-RTT.
async fn resumed(s: &Setup) -> gateway_tests::h3::H3Client {
    let addr = s.gw.addr("web");
    let config = client_config(&s.ca);
    let first = connect_with(addr, "site.test", &config, false)
        .await
        .unwrap();
    assert_eq!(first.get("/hello").await.status(), 200);
    // Tickets arrive after the handshake; give the client a moment to store them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.close().await;
    connect_with(addr, "site.test", &config, true)
        .await
        .unwrap()
}

#[tokio::test]
async fn zero_rtt_is_off_by_default() {
    let s = setup("").await;
    let c = resumed(&s).await;
    assert!(!c.early, "the server's tickets do not allow early data");
    assert_eq!(c.get("/hello").await.status(), 200);
    c.close().await;
}

#[tokio::test]
async fn zero_rtt_serves_safe_methods_only() {
    let s = setup("      enable_0rtt: true\n").await;
    let c = resumed(&s).await;
    assert!(c.early, "the resumed connection sends 0-RTT data");
    // Sent before the handshake completes: they travel as early data.
    let post = c
        .request("POST", "/up/upload")
        .header("content-length", "5")
        .body(Bytes::from_static(b"hello"))
        .unwrap();
    let get = c.request("GET", "/up/early").body(Bytes::new()).unwrap();
    let (post, get) = tokio::join!(c.send(post), c.send(get));
    assert_eq!(post.unwrap().status(), 425, "unsafe method from early data");
    let get = get.unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(s.backend.last().unwrap().header("early-data"), "1");
    // After the handshake the same POST is served.
    let post = c
        .request("POST", "/up/upload")
        .header("content-length", "5")
        .body(Bytes::from_static(b"hello"))
        .unwrap();
    let res = c.send(post).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text(), "5");
    c.close().await;
}

#[tokio::test]
async fn shutdown_sends_goaway_and_lets_downloads_finish() {
    let s = setup("").await;
    let c = connect(s.gw.addr("web"), "site.test", &s.ca).await;
    let req = c.request("GET", "/files/big.bin").body(()).unwrap();
    let mut stream = c.open(req).await.unwrap();
    stream.finish().await.unwrap();
    let head = stream.recv_response().await.unwrap();
    assert_eq!(head.status(), 200);
    let mut body = Vec::new();
    if let Some(mut first) = stream.recv_data().await.unwrap() {
        body.extend_from_slice(&first.copy_to_bytes(first.remaining()));
    }
    let Setup { gw, big, .. } = s;
    let stopping = tokio::spawn(gw.shutdown());
    while let Some(mut chunk) = stream.recv_data().await.expect("download continues") {
        body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    assert_eq!(sha(&body), sha(&big), "the download finished intact");
    // GOAWAY: the connection takes no new requests.
    let late = c.get_result("/hello").await;
    assert!(late.is_err(), "a request after GOAWAY is refused");
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("shutdown completes")
        .unwrap();
}

#[tokio::test]
async fn reload_turning_http3_off_drains_and_keeps_tcp() {
    let s = setup("").await;
    let addr = s.gw.addr("web");
    let c = connect(addr, "site.test", &s.ca).await;
    let req = c.request("GET", "/files/big.bin").body(()).unwrap();
    let mut stream = c.open(req).await.unwrap();
    stream.finish().await.unwrap();
    let head = stream.recv_response().await.unwrap();
    assert_eq!(head.status(), 200);

    // Same listener (port kept), now without http3.
    let path = s.gw.dir().join("gateway.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let yaml = yaml
        .replacen(
            "bind: 127.0.0.1:0",
            &format!("bind: 127.0.0.1:{}", addr.port()),
            1,
        )
        .replace(
            "protocols: [http1, http2, http3]",
            "protocols: [http1, http2]",
        );
    std::fs::write(&path, yaml).unwrap();
    s.gw.gateway().reload().await.expect("reload");

    let mut body = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.expect("download continues") {
        body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    assert_eq!(sha(&body), sha(&s.big));
    assert!(c.get_result("/hello").await.is_err(), "GOAWAY was sent");
    assert_eq!(active_becomes(&s.gw, 0, 5).await, 0);

    // TCP kept its socket and no longer advertises HTTP/3.
    assert_eq!(s.gw.addr("web"), addr);
    let (mut tcp, _) = https(addr, "site.test", &s.ca, &[b"h2"]).await;
    let res = tcp.get("/hello").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.header("alt-svc"), "");
    let again = tokio::time::timeout(
        Duration::from_secs(3),
        connect_with(addr, "site.test", &client_config(&s.ca), false),
    )
    .await;
    assert!(!matches!(again, Ok(Ok(_))), "no QUIC endpoint any more");
}
