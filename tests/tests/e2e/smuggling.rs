//! HTTP/1.1 request smuggling shapes, written raw after a good request on the same connection,
//! against a proxy route to a backend that records what it receives: each is answered with
//! 400 (after the good request's 200), the connection closes, the backend sees only the good
//! request, and `gateway_http_rejected_total` counts the reason.

use std::time::Duration;

use gateway_tests::backend::Backend;
use gateway_tests::{TestGateway, raw_with_timeout};

async fn setup() -> (TestGateway, Backend) {
    let backend = Backend::start("origin").await;
    let yaml = format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  origin: {{ targets: ["{}"] }}
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: origin }}
"#,
        backend.addr()
    );
    (TestGateway::start(&yaml).await, backend)
}

/// Status codes of the responses in raw HTTP/1.1 output, in order.
fn statuses(out: &str) -> Vec<u16> {
    // The bodies here never contain the text, so every occurrence starts a response.
    out.match_indices("HTTP/1.1 ")
        .filter_map(|(i, m)| out.get(i + m.len()..i + m.len() + 3)?.parse().ok())
        .collect()
}

async fn metrics(gw: &TestGateway) -> String {
    let addr = gw.gateway().admin_addr().expect("admin");
    raw_with_timeout(
        addr,
        gateway_tests::admin_head(gw, "GET", "/metrics", "").as_bytes(),
        Duration::from_secs(2),
    )
    .await
}

const GOOD: &[u8] = b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n";

/// (name, request, reason counted). Every body would be a second request to a parser that
/// framed it differently.
const SHAPES: &[(&str, &[u8], &str)] = &[
    (
        "content-length then transfer-encoding",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /inner HTTP/1.1\r\nHost: a\r\n\r\n",
        "content_length_with_transfer_encoding",
    ),
    (
        "transfer-encoding then content-length",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\nGET /inner HTTP/1.1\r\nHost: a\r\n\r\n",
        "content_length_with_transfer_encoding",
    ),
    (
        "duplicate content-length",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        "duplicate_content_length",
    ),
    (
        "conflicting content-length",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\nhello",
        "duplicate_content_length",
    ),
    (
        "content-length list",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\nhello",
        "invalid_content_length",
    ),
    (
        "signed content-length",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello",
        "invalid_content_length",
    ),
    (
        "obs-fold",
        b"GET /smuggled HTTP/1.1\r\nHost: a\r\nX-Note: one\r\n two\r\n\r\n",
        "obs_fold",
    ),
    (
        "obs-fold of transfer-encoding",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
        "invalid_transfer_encoding",
    ),
    (
        "bare LF",
        b"GET /smuggled HTTP/1.1\nHost: a\n\n",
        "bare_lf",
    ),
    (
        "bare LF in one header line",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: 3\n\r\nabc",
        "bare_lf",
    ),
    (
        "invalid chunk size",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        "invalid_chunk",
    ),
    (
        "chunk size with a sign",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
        "invalid_chunk",
    ),
    (
        "chunk size overflowing 64 bits",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n100000000000000005\r\nhello\r\n0\r\n\r\n",
        "invalid_chunk",
    ),
    (
        "transfer-encoding gzip, chunked",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        "invalid_transfer_encoding",
    ),
    (
        "transfer-encoding identity",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello",
        "invalid_transfer_encoding",
    ),
    (
        "transfer-encoding twice",
        b"POST /smuggled HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "invalid_transfer_encoding",
    ),
];

#[tokio::test]
async fn each_smuggling_shape_gets_400_and_never_reaches_the_backend() {
    let (gw, backend) = setup().await;
    let addr = gw.addr("main");
    for (name, shape, _) in SHAPES {
        let before = backend.requests();
        let input = [GOOD, shape].concat();
        let out = raw_with_timeout(addr, &input, Duration::from_secs(5)).await;
        assert_eq!(statuses(&out), [200, 400], "{name}: {out}");
        assert!(out.contains("connection: close"), "{name}: {out}");
        assert_eq!(
            backend.requests() - before,
            1,
            "{name}: only the good request reaches the backend"
        );
        assert_eq!(backend.last().unwrap().uri.path(), "/first", "{name}");
    }
    let text = metrics(&gw).await;
    for (name, _, reason) in SHAPES {
        let series =
            format!("gateway_http_rejected_total{{listener=\"main\",reason=\"{reason}\"}} ");
        let count: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        assert!(count >= 1, "{name}: {reason} not counted:\n{text}");
    }
}

#[tokio::test]
async fn well_formed_requests_of_every_framing_are_forwarded_whole() {
    let (gw, backend) = setup().await;
    let input: &[u8] = b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n\
POST /upload HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nTransfer-Encoding: Chunked\r\n\r\n4\r\nwxyz\r\n0\r\n\r\n\
\r\nGET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let out = raw_with_timeout(gw.addr("main"), input, Duration::from_secs(5)).await;
    // The 100 Continue comes from the gateway itself (the proxy reads the body).
    let codes: Vec<u16> = statuses(&out).into_iter().filter(|c| *c != 100).collect();
    assert_eq!(codes, [200, 200, 200, 200], "{out}");
    assert!(
        out.contains("\r\n\r\n5") && out.contains("\r\n\r\n4"),
        "{out}"
    );
    assert_eq!(backend.requests(), 4);
}

#[tokio::test]
async fn a_bad_later_chunk_cuts_the_request_off() {
    let (gw, backend) = setup().await;
    // The head and first chunk are fine, so the request is forwarded; the malformed chunk
    // ends the body there and no second request is read from the connection.
    let input: &[u8] = b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\nGET /inner HTTP/1.1\r\nHost: a\r\n\r\n";
    let out = raw_with_timeout(gw.addr("main"), input, Duration::from_secs(5)).await;
    assert!(
        statuses(&out).iter().all(|s| *s == 400),
        "no success for a broken body: {out}"
    );
    assert!(
        backend.last().is_none_or(|s| s.uri.path() != "/inner"),
        "the bytes after the bad chunk are never a request"
    );
}

#[tokio::test]
async fn an_oversized_head_gets_431_and_nothing_after_it_is_read() {
    let backend = Backend::start("origin").await;
    let yaml = format!(
        r#"
listeners:
  - {{ name: fast, bind: 127.0.0.1:0, max_header_size: 8KiB }}
  - {{ name: general, bind: 127.0.0.1:0, max_header_size: 8KiB, http1_fast_path: false }}
upstreams:
  origin: {{ targets: ["{}"] }}
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: origin }}
"#,
        backend.addr()
    );
    let gw = TestGateway::start(&yaml).await;
    // Complete in one write, past the 8 KiB limit, with a smuggling shape after it: the parser
    // gets the limit's worth of the head and answers 431; nothing after it is read as a request.
    let big = [
        b"GET /big HTTP/1.1\r\nHost: a\r\nX-Pad: ".as_slice(),
        &[b'a'; 8 * 1024],
        b"\r\n\r\n",
        SHAPES[0].1,
    ]
    .concat();
    let input = [GOOD, &big].concat();
    for listener in ["fast", "general"] {
        let before = backend.requests();
        let out = raw_with_timeout(gw.addr(listener), &input, Duration::from_secs(5)).await;
        assert_eq!(statuses(&out), [200, 431], "{listener}: {out}");
        assert_eq!(backend.requests() - before, 1, "{listener}");
        assert_eq!(backend.last().unwrap().uri.path(), "/first", "{listener}");
    }
}
