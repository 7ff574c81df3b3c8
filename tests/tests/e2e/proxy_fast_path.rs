//! Proxied `GET`/`HEAD` requests on the HTTP/1.1 fast path: the backend sees the same rewritten
//! request as from the general path (forwarding fields, hop-by-hop fields dropped, `TE:
//! trailers` kept), the client gets the same answer, the fast path counts the request, a
//! retry on a 502 from one target reaches the other, chunked answers keep their trailers, a
//! close-delimited answer is sent chunked, and a body cut short ends the connection.

use std::time::Duration;

use gateway_tests::backend::Backend;
use gateway_tests::{
    FAST_AND_GENERAL_LISTENERS, TestGateway, fast_path_count, normalized_response, raw_target,
    raw_with_timeout,
};

async fn start(targets: &str) -> TestGateway {
    let yaml = format!(
        r#"{FAST_AND_GENERAL_LISTENERS}upstreams:
  origin: {{ targets: [{targets}], retries: 1 }}
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: origin }}
"#
    );
    TestGateway::start(&yaml).await
}

const REQUEST: &[u8] = b"GET /api/x?y=1 HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-For: 203.0.113.9\r\nForwarded: for=203.0.113.9\r\nX-Forwarded-Proto: https\r\nKeep-Alive: timeout=5\r\nTE: trailers, deflate\r\nX-Custom: kept\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn a_proxied_get_is_forwarded_as_the_general_path_forwards_it() {
    let backend = Backend::start("origin").await;
    let gw = start(&format!("\"{}\"", backend.addr())).await;
    let mut seen = Vec::new();
    let mut answers = Vec::new();
    for listener in ["fast", "general"] {
        let before = fast_path_count(&gw, listener).await;
        let out = raw_with_timeout(gw.addr(listener), REQUEST, Duration::from_secs(5)).await;
        let after = fast_path_count(&gw, listener).await;
        assert_eq!(after - before, u64::from(listener == "fast"), "{listener}");
        answers.push(normalized_response(&out));
        seen.push(backend.last().expect("the backend saw the request"));
    }
    assert_eq!(answers[0], answers[1]);
    assert!(answers[0].0.starts_with("HTTP/1.1 200"), "{:?}", answers[0]);
    assert!(answers[0].1.contains(&"connection: close".to_string()));
    let (fast, general) = (&seen[0], &seen[1]);
    assert_eq!(fast.uri, general.uri);
    for name in [
        "host",
        "x-forwarded-for",
        "forwarded",
        "x-forwarded-proto",
        "x-forwarded-host",
        "via",
        "te",
        "x-custom",
    ] {
        let all = |s: &gateway_tests::backend::Seen| -> Vec<String> {
            s.headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(all(fast), all(general), "{name}");
    }
    assert_eq!(fast.header("x-forwarded-for"), "203.0.113.9, 127.0.0.1");
    assert_eq!(fast.header("x-forwarded-proto"), "http");
    assert_eq!(fast.header("te"), "trailers");
    assert_eq!(fast.header("x-custom"), "kept");
    for gone in ["keep-alive", "connection", "close"] {
        assert!(fast.headers.get(gone).is_none(), "{gone} went upstream");
    }
}

#[tokio::test]
async fn a_502_from_one_target_is_retried_on_the_other_from_the_fast_path() {
    // A target that answers every request with 502 and closes.
    let bad = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bad_addr = bad.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = bad.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbad")
                .await;
        }
    });
    let good = Backend::start("good").await;
    let gw = start(&format!("\"{bad_addr}\", \"{}\"", good.addr())).await;
    for i in 0..4 {
        let request = format!("GET /r{i} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let out =
            raw_with_timeout(gw.addr("fast"), request.as_bytes(), Duration::from_secs(5)).await;
        assert!(out.starts_with("HTTP/1.1 200"), "request {i}: {out}");
    }
    assert_eq!(good.requests(), 4);
}

/// A chunked body's data and its trailer lines (names lower case).
fn dechunk(mut body: &str) -> (String, Vec<String>) {
    let mut data = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            let trailers = rest
                .split("\r\n")
                .take_while(|l| !l.is_empty())
                .map(|l| l.to_ascii_lowercase())
                .collect();
            return (data, trailers);
        }
        data.push_str(&rest[..size]);
        assert_eq!(&rest[size..size + 2], "\r\n", "a chunk ends with CRLF");
        body = &rest[size + 2..];
    }
}

#[tokio::test]
async fn a_chunked_answer_with_trailers_is_relayed_as_the_general_path_relays_it() {
    let target = raw_target(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\r\n\
          5\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 42\r\n\r\n",
    )
    .await;
    let gw = start(&format!("\"{target}\"")).await;
    let request = b"GET /t HTTP/1.1\r\nHost: a\r\nTE: trailers\r\nConnection: close\r\n\r\n";
    let mut answers = Vec::new();
    for listener in ["fast", "general"] {
        let before = fast_path_count(&gw, listener).await;
        let out = raw_with_timeout(gw.addr(listener), request, Duration::from_secs(5)).await;
        let after = fast_path_count(&gw, listener).await;
        assert_eq!(after - before, u64::from(listener == "fast"), "{listener}");
        let (status, fields, body) = normalized_response(&out);
        assert!(status.starts_with("HTTP/1.1 200"), "{listener}: {out}");
        assert!(
            fields.contains(&"transfer-encoding: chunked".to_string()),
            "{listener}: {out}"
        );
        answers.push((fields, dechunk(&body)));
    }
    assert_eq!(answers[0], answers[1]);
    let (data, trailers) = &answers[0].1;
    assert_eq!(data, "hello world");
    assert_eq!(trailers, &vec!["x-sum: 42".to_string()]);
}

#[tokio::test]
async fn a_close_delimited_answer_reaches_the_client_chunked_and_whole() {
    let target =
        raw_target(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end").await;
    let gw = start(&format!("\"{target}\"")).await;
    let request = b"GET /old HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let out = raw_with_timeout(gw.addr("fast"), request, Duration::from_secs(5)).await;
    let (status, fields, body) = normalized_response(&out);
    assert!(status.starts_with("HTTP/1.1 200"), "{out}");
    assert!(fields.contains(&"via: 1.0 gateway".to_string()), "{out}");
    assert!(
        fields.contains(&"transfer-encoding: chunked".to_string()),
        "{out}"
    );
    assert_eq!(dechunk(&body).0, "until the end");
}

/// Reads `stream` to its end; panics if it does not end within five seconds.
async fn read_to_end(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out))
        .await
        .expect("the gateway ended the connection")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

/// The general path (hyper) drops the connection without writing the head it holds when the
/// body breaks; the fast path writes what came before the break, as nginx does. Both end the
/// connection at once, and neither answers the request pipelined behind.
#[tokio::test]
async fn a_truncated_upstream_body_ends_the_client_connection_without_a_hang() {
    use tokio::io::AsyncWriteExt;
    let target = raw_target(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b").await;
    let gw = start(&format!("\"{target}\"")).await;
    for listener in ["fast", "general"] {
        let mut tcp = tokio::net::TcpStream::connect(gw.addr(listener))
            .await
            .unwrap();
        tcp.write_all(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let out = read_to_end(&mut tcp).await;
        if listener == "general" && out.is_empty() {
            continue;
        }
        let (head, body) = out
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("{listener}: no head in {out:?}"));
        assert!(head.starts_with("HTTP/1.1 200"), "{listener}: {out}");
        let head = head.to_ascii_lowercase();
        assert!(head.contains("content-length: 100"), "{listener}: {out}");
        assert_eq!(body, "only ten b", "{listener}: nothing after the cut");
    }
}
