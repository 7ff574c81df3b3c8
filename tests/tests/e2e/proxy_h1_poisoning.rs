//! Response-queue poisoning: an upstream that writes bytes after a complete answer (a body
//! after a `HEAD`'s head, a 204's or a 304's) must never have them read as the answer to the
//! next request on that connection. Through the HTTP/1.1 fast path and the general path, the
//! request after such an answer gets the upstream's real answer on a new connection, and the
//! discarded connections are counted.
//!
//! The upstream here answers `/bodiless/...` with a head only and, 50 ms later (or in the same
//! write, for `/bodiless/head-glued`), writes a stray answer on the same connection, and says
//! so on a channel; every other path gets an answer naming the connection it came on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::{
    Client, FAST_AND_GENERAL_LISTENERS, TestGateway, counter_value, fast_path_count, http1,
};
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// What the upstream writes after a bodiless answer's head.
const STRAY: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\npoisoned";
/// How long the upstream waits before writing [`STRAY`].
const STRAY_AFTER: Duration = Duration::from_millis(50);
/// No request here takes long; a hang fails the test rather than stalling it.
const NO_HANG: Duration = Duration::from_secs(10);

/// The head the upstream answers a `/bodiless/...` path with.
fn bodiless_head(path: &str) -> &'static [u8] {
    match path {
        // A `HEAD`'s or a 304's length describes the `GET` representation: allowed.
        "/bodiless/head" | "/bodiless/head-glued" => {
            b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n"
        }
        "/bodiless/304" => b"HTTP/1.1 304 Not Modified\r\ncontent-length: 8\r\netag: \"v\"\r\n\r\n",
        "/bodiless/204" => b"HTTP/1.1 204 No Content\r\n\r\n",
        // A 204 or 1xx that declares a body is a protocol error (RFC 9112 §6.1, §6.2).
        "/bodiless/204-length" => b"HTTP/1.1 204 No Content\r\ncontent-length: 8\r\n\r\n",
        "/bodiless/204-chunked" => b"HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n",
        "/bodiless/103-length" => {
            b"HTTP/1.1 103 Early Hints\r\ncontent-length: 8\r\n\r\n\
              HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        }
        _ => panic!("no bodiless answer for {path}"),
    }
}

/// The upstream; returns its address and a channel that gets, for each stray answer written,
/// the number of the connection it went on.
async fn poisoning_upstream() -> (SocketAddr, mpsc::UnboundedReceiver<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (strays, written) = mpsc::unbounded_channel();
    let accepted = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let conn = accepted.fetch_add(1, Relaxed);
            let strays = strays.clone();
            tokio::spawn(serve(s, conn, strays));
        }
    });
    (addr, written)
}

/// Answers the requests of one connection (heads only: `GET` and `HEAD`).
async fn serve(mut s: TcpStream, conn: usize, strays: mpsc::UnboundedSender<usize>) {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end);
        let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
        if path == "/bodiless/head-glued" {
            // The stray answer in the same write as the head.
            let _ = s.write_all(&[bodiless_head(&path), STRAY].concat()).await;
            let _ = strays.send(conn);
        } else if path.starts_with("/bodiless/") {
            if s.write_all(bodiless_head(&path)).await.is_err() {
                return;
            }
            tokio::time::sleep(STRAY_AFTER).await;
            // The gateway may have closed the connection by now: that is the point.
            let _ = s.write_all(STRAY).await;
            let _ = strays.send(conn);
        } else {
            let body = format!("real answer on connection {conn}");
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if s.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

async fn start(upstream: SocketAddr) -> TestGateway {
    TestGateway::start(&format!(
        r#"{FAST_AND_GENERAL_LISTENERS}upstreams:
  app: {{ targets: ["{upstream}"] }}
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: app }}
"#
    ))
    .await
}

/// `gateway_upstream_discarded_connections_total` of the one target, for `reason`.
async fn discarded(gw: &TestGateway, upstream: SocketAddr, reason: &str) -> u64 {
    let series = format!(
        "gateway_upstream_discarded_connections_total{{upstream=\"app\",target=\"{upstream}\",reason=\"{reason}\"}}"
    );
    counter_value(gw, &series).await
}

/// Sends `method path` and returns the status and the body.
async fn send(c: &mut Client, method: &str, path: &str) -> (u16, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = tokio::time::timeout(NO_HANG, c.send(req))
        .await
        .expect("no hang")
        .expect("an answer");
    (res.status(), res.text())
}

/// The number of the upstream connection a real answer names.
fn real_connection(body: &str) -> usize {
    body.strip_prefix("real answer on connection ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not the upstream's real answer: {body:?}"))
}

#[tokio::test]
async fn a_stray_answer_written_after_a_bodiless_one_never_answers_the_next_request() {
    let (upstream, mut strays) = poisoning_upstream().await;
    let gw = start(upstream).await;
    let cases = [
        ("HEAD", "/bodiless/head", 200),
        ("HEAD", "/bodiless/head-glued", 200),
        ("GET", "/bodiless/304", 304),
        ("GET", "/bodiless/204", 204),
        ("GET", "/bodiless/204-length", 204),
    ];
    for listener in ["fast", "general"] {
        let fast_before = fast_path_count(&gw, listener).await;
        let mut c = http1(gw.addr(listener)).await;
        for (method, path, status) in cases {
            for round in 0..10 {
                let answered = send(&mut c, method, path).await;
                assert_eq!(answered, (status, String::new()), "{listener} {path}");
                // The stray answer is on the wire (and, unless the connection was closed,
                // in the gateway's socket) before the next request is sent.
                let poisoned = tokio::time::timeout(NO_HANG, strays.recv())
                    .await
                    .expect("the stray answer was written")
                    .expect("upstream running");
                let (status, body) = send(&mut c, "GET", "/next").await;
                assert_eq!(status, 200, "{listener} {path} round {round}: {body}");
                assert_ne!(
                    real_connection(&body),
                    poisoned,
                    "{listener} {path} round {round}: the poisoned connection was reused"
                );
            }
        }
        let fast_after = fast_path_count(&gw, listener).await;
        let expected = if listener == "fast" { 100 } else { 0 };
        assert_eq!(fast_after - fast_before, expected, "{listener}");
    }
    // The HEADs', the 304's and the plain 204's connections were found with bytes nobody asked
    // for and closed; the 204 that declared a body closed its connection with its answer.
    assert_eq!(discarded(&gw, upstream, "unexpected_bytes").await, 80);
    assert_eq!(discarded(&gw, upstream, "bodiless_with_framing").await, 20);
}

#[tokio::test]
async fn a_bodiless_status_that_declares_a_body_does_not_leave_its_connection_for_another_request()
{
    let (upstream, _strays) = poisoning_upstream().await;
    let gw = start(upstream).await;
    let cases = [
        ("/bodiless/204-length", 204, ""),
        ("/bodiless/204-chunked", 204, ""),
        ("/bodiless/103-length", 200, "ok"),
    ];
    for listener in ["fast", "general"] {
        let mut c = http1(gw.addr(listener)).await;
        for (path, status, body) in cases {
            for round in 0..10 {
                let answered = send(&mut c, "GET", path).await;
                assert_eq!(answered, (status, body.to_owned()), "{listener} {path}");
                // At once, before the stray answer: only a connection not reused is safe.
                let (status, body) = send(&mut c, "GET", "/next").await;
                assert_eq!(status, 200, "{listener} {path} round {round}: {body}");
                real_connection(&body);
            }
        }
    }
    assert_eq!(discarded(&gw, upstream, "bodiless_with_framing").await, 60);
}
