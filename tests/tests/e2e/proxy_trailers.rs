//! Trailers through the proxy: fields no trailer may carry (framing, routing, request
//! modifiers, authentication, hop-by-hop) are dropped both ways, and an allowed one passes.
//! Request trailers to an HTTP/1.1 upstream (the proxy's own client) and to an h2c upstream
//! (hyper's); response trailers from an HTTP/1.1 upstream through the fast path and the general
//! path, which agree, and from an h2c upstream to an HTTP/2 client.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::{
    FAST_AND_GENERAL_LISTENERS, TestGateway, fast_path_chain_count, fast_path_count, http2c,
    raw_with_timeout,
};
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A chunked request whose trailer section holds fields no trailer may carry, and `x-checksum`.
const CHUNKED_POST: &[u8] = b"POST /upload HTTP/1.1\r\nHost: shop.example\r\n\
    Transfer-Encoding: chunked\r\nTE: trailers\r\nConnection: close\r\n\r\n\
    5\r\nhello\r\n0\r\n\
    Content-Length: 999\r\nTransfer-Encoding: chunked\r\nHost: evil.example\r\n\
    Connection: close\r\nKeep-Alive: timeout=5\r\nAuthorization: Basic YTpi\r\n\
    X-Forwarded-For: 10.0.0.1\r\nX-Checksum: abc\r\n\r\n";

/// The trailer names the upstream must not see from [`CHUNKED_POST`].
const DROPPED: [&str; 7] = [
    "content-length",
    "transfer-encoding",
    "host",
    "connection",
    "keep-alive",
    "authorization",
    "x-forwarded-for",
];

/// Where the last chunk (`0` CRLF) of the chunked body `body` begins.
fn last_chunk(body: &str) -> Option<usize> {
    if body.starts_with("0\r\n") {
        return Some(0);
    }
    body.match_indices("\r\n0\r\n").next().map(|(i, _)| i + 2)
}

/// The trailer section of a chunked message (`text` from its head on), lower-cased lines.
fn trailer_lines(text: &str) -> Vec<String> {
    let (_, body) = text.split_once("\r\n\r\n").expect("a head");
    let last = last_chunk(body).unwrap_or_else(|| panic!("no last chunk in {text:?}"));
    body[last + 3..]
        .split("\r\n")
        .take_while(|l| !l.is_empty())
        .map(str::to_ascii_lowercase)
        .collect()
}

/// An HTTP/1.1 upstream that reads one chunked request per connection, keeps its bytes, and
/// answers `200 ok`.
async fn recording_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                // The message ends with the empty line after the last chunk's trailer section.
                while !ends_chunked_message(&got) {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                record
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&got).into_owned());
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            });
        }
    });
    (addr, seen)
}

/// Whether `got` holds a whole chunked message: its head, and its body up to the empty line
/// that ends the trailer section.
fn ends_chunked_message(got: &[u8]) -> bool {
    let text = String::from_utf8_lossy(got);
    let Some((_, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    last_chunk(body).is_some_and(|i| {
        let section = &body[i + 3..];
        section.starts_with("\r\n") || section.contains("\r\n\r\n")
    })
}

fn proxy_to(upstream: &str) -> String {
    format!(
        r#"{FAST_AND_GENERAL_LISTENERS}upstreams:
  app: {{ {upstream} }}
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: app }}
"#
    )
}

#[tokio::test]
async fn request_trailers_that_frame_route_or_authenticate_never_reach_an_http1_upstream() {
    let (upstream, seen) = recording_upstream().await;
    let gw = TestGateway::start(&proxy_to(&format!("targets: [\"{upstream}\"]"))).await;
    let out = raw_with_timeout(gw.addr("general"), CHUNKED_POST, Duration::from_secs(5)).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let trailers = trailer_lines(&seen[0]);
    assert_eq!(trailers, ["x-checksum: abc"], "{}", seen[0]);
    // The header section the upstream saw is the gateway's, not the trailers'.
    let head = seen[0]
        .split("\r\n\r\n")
        .next()
        .unwrap()
        .to_ascii_lowercase();
    assert!(head.contains("host: shop.example"), "{head}");
    assert!(head.contains("x-forwarded-for: 127.0.0.1\r\n"), "{head}");
    for name in DROPPED {
        let in_trailers = trailers.iter().any(|l| l.starts_with(&format!("{name}:")));
        assert!(!in_trailers, "{name} reached the upstream");
    }
}

/// An HTTP/1.1 upstream answering every request chunked, with trailers of every kind; its
/// `Trailer` field declares all but `x-undeclared`.
async fn trailing_upstream() -> SocketAddr {
    gateway_tests::raw_target(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\
          trailer: x-checksum, host, content-length, connection, keep-alive, x-forwarded-for, set-cookie\r\n\r\n\
          4\r\ndata\r\n0\r\n\
          x-checksum: abc\r\nhost: evil.example\r\ncontent-length: 4\r\nconnection: close\r\n\
          keep-alive: timeout=1\r\nx-forwarded-for: 10.0.0.1\r\nset-cookie: s=1\r\n\
          x-undeclared: 1\r\n\r\n",
    )
    .await
}

#[tokio::test]
async fn response_trailers_are_the_same_allowed_ones_on_the_fast_and_the_general_path() {
    let upstream = trailing_upstream().await;
    let gw = TestGateway::start(&proxy_to(&format!("targets: [\"{upstream}\"]"))).await;
    for listener in ["fast", "general"] {
        let before = fast_path_count(&gw, listener).await;
        let out = raw_with_timeout(
            gw.addr(listener),
            b"GET /t HTTP/1.1\r\nHost: shop.example\r\nTE: trailers\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        )
        .await;
        let after = fast_path_count(&gw, listener).await;
        assert_eq!(after - before, u64::from(listener == "fast"), "{listener}");
        assert!(out.starts_with("HTTP/1.1 200"), "{listener}: {out}");
        assert!(out.contains("\r\n4\r\ndata\r\n"), "{listener}: {out}");
        assert_eq!(
            trailer_lines(&out),
            ["x-checksum: abc"],
            "{listener}: {out}"
        );
    }
}

/// A route with a filter in front of the proxy: on the fast listener its requests go through
/// the filter chain and the engine's own response encoder, which must send what hyper sends.
#[tokio::test]
async fn response_trailers_through_the_filter_chain_are_the_general_paths() {
    let upstream = trailing_upstream().await;
    let config = format!(
        r#"{FAST_AND_GENERAL_LISTENERS}upstreams:
  app: {{ targets: ["{upstream}"] }}
routes:
  - match: {{ path_prefix: / }}
    filters:
      - headers: {{ response_set: {{ x-filtered: "yes" }} }}
    proxy: {{ upstream: app }}
"#
    );
    let gw = TestGateway::start(&config).await;
    let mut answers = Vec::new();
    for listener in ["fast", "general"] {
        let before = fast_path_chain_count(&gw, listener).await;
        let out = raw_with_timeout(
            gw.addr(listener),
            b"GET /t HTTP/1.1\r\nHost: shop.example\r\nTE: trailers\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        )
        .await;
        let after = fast_path_chain_count(&gw, listener).await;
        assert_eq!(after - before, u64::from(listener == "fast"), "{listener}");
        assert!(out.starts_with("HTTP/1.1 200"), "{listener}: {out}");
        assert!(out.contains("x-filtered: yes\r\n"), "{listener}: {out}");
        assert!(out.contains("\r\n4\r\ndata\r\n"), "{listener}: {out}");
        assert_eq!(
            trailer_lines(&out),
            ["x-checksum: abc"],
            "{listener}: {out}"
        );
        // The head's lines, less `Date`, in order of name.
        let head = out.split("\r\n\r\n").next().unwrap_or_default().to_owned();
        let mut lines: Vec<String> = head
            .lines()
            .skip(1)
            .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
            .map(str::to_ascii_lowercase)
            .collect();
        lines.sort();
        answers.push(lines);
    }
    assert_eq!(answers[0], answers[1], "the same head on both listeners");
}

/// An h2c upstream that keeps the trailers of every request and answers with `data` and
/// trailers of every kind an HTTP/2 peer may send.
async fn h2c_upstream() -> (SocketAddr, Arc<Mutex<Vec<HeaderMap>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let record = record.clone();
                    async move {
                        let got = req.into_body().collect().await.ok();
                        let trailers = got.and_then(|c| c.trailers().cloned()).unwrap_or_default();
                        record.lock().unwrap().push(trailers);
                        let mut t = HeaderMap::new();
                        for (name, value) in [
                            ("x-checksum", "abc"),
                            ("host", "evil.example"),
                            ("content-length", "4"),
                            ("authorization", "Basic YTpi"),
                            ("x-forwarded-for", "10.0.0.1"),
                            ("cookie", "s=1"),
                        ] {
                            t.insert(name, value.parse().unwrap());
                        }
                        let frames = futures_util::stream::iter([
                            Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"data"))),
                            Ok(Frame::trailers(t)),
                        ]);
                        Ok::<_, Infallible>(Response::new(StreamBody::new(frames)))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn trailers_to_and_from_an_h2c_upstream_lose_the_fields_no_trailer_may_carry() {
    let (upstream, seen) = h2c_upstream().await;
    let gw = TestGateway::start(&proxy_to(&format!(
        "targets: [\"{upstream}\"], protocol: h2c"
    )))
    .await;
    // Request trailers, from an HTTP/1.1 client's chunked body.
    let out = raw_with_timeout(gw.addr("general"), CHUNKED_POST, Duration::from_secs(5)).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let got = seen
        .lock()
        .unwrap()
        .pop()
        .expect("the upstream saw the request");
    let names: Vec<&str> = got.keys().map(http::HeaderName::as_str).collect();
    assert_eq!(names, ["x-checksum"], "{got:?}");
    // Response trailers, to an HTTP/2 client (which gets every trailer the gateway passes on).
    let mut c = http2c(gw.addr("general")).await;
    let res = c
        .send(
            Request::post("/t")
                .body(Full::new(Bytes::from("x")))
                .unwrap(),
        )
        .await
        .expect("an answer");
    assert_eq!((res.status(), res.text().as_str()), (200, "data"));
    let trailers = res.trailers.expect("trailers");
    let names: Vec<&str> = trailers.keys().map(http::HeaderName::as_str).collect();
    assert_eq!(names, ["x-checksum"], "{trailers:?}");
}
