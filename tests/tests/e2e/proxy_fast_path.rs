//! Proxied `GET`/`HEAD` requests on the HTTP/1.1 fast path: the backend sees the same rewritten
//! request as from the general path (forwarding fields, hop-by-hop fields dropped, `TE:
//! trailers` kept), the client gets the same answer, the fast path counts the request, and a
//! retry on a 502 from one target reaches the other.

use std::time::Duration;

use gateway_tests::backend::Backend;
use gateway_tests::{TestGateway, fast_path_count, raw_with_timeout};

async fn start(targets: &str) -> TestGateway {
    let yaml = format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
listeners:
  - name: fast
    bind: 127.0.0.1:0
  - name: general
    bind: 127.0.0.1:0
    http1_fast_path: false
upstreams:
  origin: {{ targets: [{targets}], retries: 1 }}
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: origin }}
"#
    );
    TestGateway::start(&yaml).await
}

/// The response without its `date` line, header names lower case and sorted.
fn normalized(raw: &str) -> (String, Vec<String>, String) {
    let (head, body) = raw.split_once("\r\n\r\n").expect("a whole response");
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_string();
    let mut fields: Vec<String> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').expect("a field");
            format!("{}: {}", n.to_ascii_lowercase(), v.trim())
        })
        .filter(|l| !l.starts_with("date:"))
        .collect();
    fields.sort();
    (status, fields, body.to_string())
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
        answers.push(normalized(&out));
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
