//! The HTTP/1.1 fast path end to end: a listener with it answers exactly what a listener
//! without it answers (status, every header but `Date`, body), from prepared answers (fixed
//! responses and cached files) or through the route's chain, over keep-alive and pipelined
//! requests; a request it does not take (a body, `Expect`, `Upgrade`) hands the connection to
//! hyper with every byte in order; its answers are counted, logged and traced as the general
//! path's.

use std::net::SocketAddr;
use std::time::Duration;

use gateway_tests::{
    FAST_AND_GENERAL_LISTENERS, TestGateway, fast_path_chain_count, fast_path_count,
    raw_bytes_with_timeout, raw_with_timeout, temp_dir, write_file,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The routes both listeners of [`FAST_AND_GENERAL_LISTENERS`] serve.
const ROUTES: &str = r#"
routes:
  - name: hello
    match: { path: /hello }
    respond: { status: 200, body: "Hello, world!\n", headers: { content-type: text/plain, x-one: "1" } }
  - name: teapot
    match: { path: /teapot }
    respond: { status: 418, body: "short and stout", headers: { server: kettle } }
  - name: odd
    match: { path: /odd }
    respond: { status: 599 }
  - name: filtered
    match: { path: /filtered }
    filters:
      - headers: { response_set: { x-filtered: "yes" } }
    respond: { body: "through the chain" }
  - name: files
    match: { path_prefix: /files }
    static: { root: public, compress: [gzip], compress_min_size: 16 }
"#;

/// One response read off a connection.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    reason: String,
    /// Every header but `date`, lower-case names, sorted.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// Splits `bytes` into the responses to `heads` (one per request: `true` for `HEAD`); `None`
/// while they are incomplete.
fn try_answers(mut bytes: &[u8], heads: &[bool]) -> Option<Vec<Answer>> {
    let mut out = Vec::new();
    for &head in heads {
        let mut h = [httparse::EMPTY_HEADER; 32];
        let mut res = httparse::Response::new(&mut h);
        let len = match res.parse(bytes) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return None,
            Err(e) => panic!("response {} malformed: {e:?}", out.len()),
        };
        let mut headers: Vec<(String, String)> = res
            .headers
            .iter()
            .map(|h| {
                let value = String::from_utf8(h.value.to_vec()).expect("text header");
                (h.name.to_ascii_lowercase(), value)
            })
            .collect();
        let dates = headers.iter().filter(|(n, _)| n == "date").count();
        assert_eq!(dates, 1, "one Date header: {headers:?}");
        headers.retain(|(n, _)| n != "date");
        headers.sort();
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map_or(0, |(_, v)| v.parse().expect("length"));
        let chunked = headers.contains(&("transfer-encoding".into(), "chunked".into()));
        let (body, used) = if chunked && !head {
            dechunk(&bytes[len..])?
        } else {
            let body_len = if head { 0 } else { length };
            (bytes.get(len..len + body_len)?.to_vec(), body_len)
        };
        out.push(Answer {
            status: res.code.expect("status"),
            reason: res.reason.expect("reason").to_owned(),
            headers,
            body,
        });
        bytes = &bytes[len + used..];
    }
    assert!(bytes.is_empty(), "bytes after the last response: {bytes:?}");
    Some(out)
}

/// A chunked body at the start of `bytes` (without trailers), decoded, and the bytes it took;
/// `None` while incomplete.
fn dechunk(bytes: &[u8]) -> Option<(Vec<u8>, usize)> {
    let (mut body, mut at) = (Vec::new(), 0);
    loop {
        let (start, size) = match httparse::parse_chunk_size(&bytes[at..]) {
            Ok(httparse::Status::Complete(found)) => found,
            Ok(httparse::Status::Partial) => return None,
            Err(e) => panic!("bad chunk size: {e:?}"),
        };
        let size = usize::try_from(size).expect("chunk size");
        at += start;
        if size == 0 {
            assert_eq!(bytes.get(at..at + 2)?, b"\r\n", "no trailers expected");
            return Some((body, at + 2));
        }
        body.extend_from_slice(bytes.get(at..at + size)?);
        assert_eq!(bytes.get(at + size..at + size + 2)?, b"\r\n");
        at += size + 2;
    }
}

/// [`try_answers`] on a whole exchange.
fn answers(bytes: &[u8], heads: &[bool]) -> Vec<Answer> {
    try_answers(bytes, heads).unwrap_or_else(|| panic!("incomplete answers: {bytes:?}"))
}

/// Reads until the answers to `heads` are complete.
async fn read_answers<R: AsyncRead + Unpin>(rd: &mut R, heads: &[bool]) -> Vec<Answer> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if let Some(got) = try_answers(&out, heads) {
            return got;
        }
        let n = tokio::time::timeout(Duration::from_secs(5), rd.read(&mut buf))
            .await
            .expect("answers in time")
            .expect("read");
        assert!(n > 0, "connection closed after {} bytes", out.len());
        out.extend_from_slice(&buf[..n]);
    }
}

/// Writes `requests` in one write on a new connection and reads until it has been quiet for a
/// moment (or the gateway closed it).
async fn exchange(addr: SocketAddr, requests: &[u8]) -> String {
    raw_with_timeout(addr, requests, Duration::from_millis(500)).await
}

/// [`exchange`] for binary-safe responses.
async fn exchange_bytes(addr: SocketAddr, requests: &[u8]) -> Vec<u8> {
    raw_bytes_with_timeout(addr, requests, Duration::from_millis(500)).await
}

/// Puts a file in the cache: its first request (a miss) is the general path's.
async fn cache(addr: SocketAddr, path: &str) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n");
    let got = answers(&exchange_bytes(addr, request.as_bytes()).await, &[false]);
    assert_eq!(got[0].status, 200, "{path}");
}

async fn start() -> TestGateway {
    start_with("").await
}

/// [`start`] with more top-level configuration (`telemetry`).
async fn start_with(more: &str) -> TestGateway {
    let dir = temp_dir();
    write_file(
        dir.path(),
        "public/files/a.txt",
        "the quick brown fox jumps over the lazy dog, twice: the quick brown fox jumps over the lazy dog\n",
    );
    write_file(dir.path(), "public/files/b.json", "{\"k\": 1}");
    TestGateway::start_in(dir, &format!("{FAST_AND_GENERAL_LISTENERS}{ROUTES}{more}")).await
}

/// Requests the fast path takes, each with whether it is `HEAD`.
const PLAIN: &[(&str, bool)] = &[
    ("GET /hello HTTP/1.1\r\nHost: a\r\n\r\n", false),
    ("HEAD /hello HTTP/1.1\r\nHost: a\r\n\r\n", true),
    (
        "GET /hello?x=1&y=%20 HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
        false,
    ),
    ("GET /teapot HTTP/1.1\r\nHost: a\r\n\r\n", false),
    ("GET /odd HTTP/1.1\r\nHost: a\r\n\r\n", false),
    ("GET /files/a.txt HTTP/1.1\r\nHost: a\r\n\r\n", false),
    ("HEAD /files/a.txt HTTP/1.1\r\nHost: a\r\n\r\n", true),
    (
        "GET /files/a.txt HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\n\r\n",
        false,
    ),
    (
        "GET /files/a.txt HTTP/1.1\r\nHost: a\r\nAccept-Encoding: br;q=1, gzip;q=0\r\n\r\n",
        false,
    ),
    (
        "GET /files/b.json HTTP/1.1\r\nHost: a\r\nUser-Agent: t\r\nAccept: */*\r\n\r\n",
        false,
    ),
];

#[tokio::test]
async fn answers_match_the_general_path_header_for_header() {
    let gw = start().await;
    let (fast, general) = (gw.addr("fast"), gw.addr("general"));
    cache(general, "/files/a.txt").await;
    cache(general, "/files/b.json").await;
    let before = fast_path_count(&gw, "fast").await;
    let requests: Vec<u8> = PLAIN.iter().flat_map(|(r, _)| r.bytes()).collect();
    let heads: Vec<bool> = PLAIN.iter().map(|(_, h)| *h).collect();
    let from_fast = answers(&exchange_bytes(fast, &requests).await, &heads);
    let from_general = answers(&exchange_bytes(general, &requests).await, &heads);
    for (i, (f, g)) in from_fast.iter().zip(&from_general).enumerate() {
        assert_eq!(f, g, "request {i}: {:?}", PLAIN[i].0);
    }
    // What the answers say, so that the comparison is not of two wrong answers.
    assert_eq!(from_fast[0].body, b"Hello, world!\n");
    assert!(from_fast[0].headers.contains(&("x-one".into(), "1".into())));
    assert!(
        from_fast[0]
            .headers
            .contains(&("server".into(), "gateway".into()))
    );
    assert_eq!(from_fast[1].body, b"");
    assert!(
        from_fast[1]
            .headers
            .contains(&("content-length".into(), "14".into()))
    );
    assert_eq!(
        (from_fast[3].status, from_fast[3].reason.as_str()),
        (418, "I'm a teapot")
    );
    let servers: Vec<_> = from_fast[3]
        .headers
        .iter()
        .filter(|(n, _)| n == "server")
        .collect();
    assert_eq!(servers, [&("server".to_owned(), "kettle".to_owned())]);
    assert_eq!(from_fast[4].status, 599);
    assert!(from_fast[5].body.starts_with(b"the quick brown fox"));
    assert!(
        from_fast[7]
            .headers
            .contains(&("content-encoding".into(), "gzip".into()))
    );
    assert!(
        !from_fast[8]
            .headers
            .iter()
            .any(|(n, _)| n == "content-encoding")
    );
    assert_eq!(from_fast[9].body, b"{\"k\": 1}");
    // Every one of them came off the fast path, and none of the general listener's did.
    let after = fast_path_count(&gw, "fast").await;
    assert_eq!(after - before, PLAIN.len() as u64);
    assert_eq!(fast_path_count(&gw, "general").await, 0);
}

#[tokio::test]
async fn a_request_it_does_not_take_hands_the_rest_to_hyper_in_order() {
    let gw = start().await;
    let fast = gw.addr("fast");
    cache(fast, "/files/a.txt").await;
    let before = fast_path_count(&gw, "fast").await;
    let requests = concat!(
        "GET /hello HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /files/a.txt HTTP/1.1\r\nHost: a\r\n\r\n",
        // A body: hyper's from here on.
        "POST /hello HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        "GET /filtered HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /files/a.txt HTTP/1.1\r\nHost: a\r\nRange: bytes=0-2\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: a\r\n\r\n",
    );
    let out = exchange_bytes(fast, requests.as_bytes()).await;
    let got = answers(&out, &[false; 6]);
    let statuses: Vec<u16> = got.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 206, 200]);
    assert_eq!(got[0].body, b"Hello, world!\n");
    assert!(got[1].body.starts_with(b"the quick"));
    assert_eq!(got[2].body, b"Hello, world!\n");
    assert!(
        got[3]
            .headers
            .contains(&("x-filtered".into(), "yes".into()))
    );
    assert_eq!(got[4].body, b"the");
    assert_eq!(got[5].body, b"Hello, world!\n");
    // The two before the POST were the fast path's; everything after it was hyper's.
    assert_eq!(fast_path_count(&gw, "fast").await - before, 2);
}

#[tokio::test]
async fn requests_with_framing_or_connection_headers_go_to_hyper() {
    let gw = start().await;
    let fast = gw.addr("fast");
    let before = fast_path_count(&gw, "fast").await;
    // Each on its own connection, after one request the fast path takes.
    // The third field: hyper closes; the fourth: the fast path serves it (through the service,
    // as every body-less request it can read).
    let cases: &[(&str, u16, bool, bool)] = &[
        // Two `Connection` lines: hyper decides what they come to.
        (
            "GET /hello HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n",
            200,
            true,
            false,
        ),
        (
            "GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close, te\r\n\r\n",
            200,
            true,
            false,
        ),
        ("GET /hello HTTP/1.0\r\nHost: a\r\n\r\n", 200, false, false),
        (
            "GET /hello HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
            200,
            false,
            false,
        ),
        (
            "GET /hello HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
            200,
            false,
            false,
        ),
        // Two `Host` lines: refused on entry (RFC 9112 §3.2) by the service.
        (
            "GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            400,
            false,
            true,
        ),
        (
            "GET /hello\"x HTTP/1.1\r\nHost: a\r\n\r\n",
            404,
            false,
            true,
        ),
        ("GET /nowhere HTTP/1.1\r\nHost: a\r\n\r\n", 404, false, true),
        (
            "DELETE /hello HTTP/1.1\r\nHost: a\r\n\r\n",
            200,
            false,
            true,
        ),
        ("GET /hello HTTP/1.1\r\nHost a\r\n\r\n", 400, true, false),
    ];
    for (request, status, closes, _) in cases {
        let both = format!("GET /hello HTTP/1.1\r\nHost: a\r\n\r\n{request}");
        let out = exchange(fast, both.as_bytes()).await;
        let second = out
            .match_indices("HTTP/1.")
            .nth(1)
            .map(|(i, _)| &out[i..])
            .unwrap_or_else(|| panic!("two answers to {request:?}: {out:?}"));
        assert_eq!(
            second.get(9..12),
            Some(status.to_string().as_str()),
            "{request:?}: {out:?}"
        );
        if *closes {
            assert!(
                second.to_ascii_lowercase().contains("connection: close"),
                "{request:?}: {second:?}"
            );
        }
    }
    let here = cases.iter().filter(|c| c.3).count();
    assert_eq!(
        fast_path_count(&gw, "fast").await - before,
        (cases.len() + here) as u64,
        "the first request of each connection and the body-less ones"
    );
}

/// Writes `requests` on a new connection and reads until the gateway closes it, which it must
/// do within 5 s (a reset instead of a close fails too).
async fn until_closed<S: AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut io: S,
    requests: &[u8],
) -> Vec<u8> {
    io.write_all(requests).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), io.read_to_end(&mut out))
        .await
        .expect("the gateway closes the connection")
        .expect("a clean end");
    out
}

#[tokio::test]
async fn connection_close_is_answered_here_and_ends_the_connection() {
    let gw = start().await;
    let (fast, general) = (gw.addr("fast"), gw.addr("general"));
    cache(general, "/files/a.txt").await;
    let closing = [
        (
            "GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            false,
        ),
        (
            "HEAD /hello HTTP/1.1\r\nHost: a\r\nconnection: Close\r\n\r\n",
            true,
        ),
        (
            "GET /teapot HTTP/1.1\r\nConnection: close\r\nHost: a\r\n\r\n",
            false,
        ),
        (
            "GET /files/a.txt HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
            false,
        ),
        (
            "HEAD /files/a.txt HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            true,
        ),
    ];
    for (last, head) in closing {
        let before = fast_path_count(&gw, "fast").await;
        // A keep-alive request, the closing one, and one after it that no one answers.
        let requests = format!(
            "GET /hello HTTP/1.1\r\nHost: a\r\n\r\n{last}GET /hello HTTP/1.1\r\nHost: a\r\n\r\n"
        );
        let mut got = Vec::new();
        for addr in [fast, general] {
            let tcp = TcpStream::connect(addr).await.expect("connect");
            // Two answers and nothing after them (`answers` checks).
            got.push(answers(
                &until_closed(tcp, requests.as_bytes()).await,
                &[false, head],
            ));
        }
        assert_eq!(got[0], got[1], "{last:?}");
        let [first, closed] = &got[0][..] else {
            unreachable!()
        };
        assert!(
            !first.headers.iter().any(|(n, _)| n == "connection"),
            "{last:?}"
        );
        assert!(
            closed
                .headers
                .contains(&("connection".into(), "close".into())),
            "{last:?}: {closed:?}"
        );
        assert_eq!(closed.body.is_empty(), head, "{last:?}");
        assert_eq!(fast_path_count(&gw, "fast").await - before, 2, "{last:?}");
    }
}

/// A gateway in `dir` with one TLS listener, `secure` (a certificate for `gw.test` from `ca`),
/// and `routes` (YAML list items).
async fn start_tls(
    ca: &gateway_tests::TestCa,
    dir: tempfile::TempDir,
    routes: &str,
) -> TestGateway {
    ca.write(
        dir.path(),
        "gw",
        &["gw.test"],
        gateway_tests::KeyKind::Ecdsa,
    );
    let config = format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
certificates:
  gw: {{ cert: gw.pem, key: gw.key }}
listeners:
  - name: secure
    bind: 127.0.0.1:0
    tls: {{ certificates: [gw] }}
routes:
{routes}"#
    );
    TestGateway::start_in(dir, &config).await
}

#[tokio::test]
async fn connection_close_over_tls_ends_with_close_notify() {
    let ca = gateway_tests::TestCa::new();
    let routes = r#"
  - name: hello
    match: { path: /hello }
    respond: { body: "Hello, world!\n" }
"#;
    let gw = start_tls(&ca, temp_dir(), routes).await;
    let addr = gw.addr("secure");
    let before = fast_path_count(&gw, "secure").await;
    let tls = gateway_tests::tls_connect(addr, "gw.test", ca.client_config(&[b"http/1.1"]))
        .await
        .expect("handshake");
    // rustls reports an end without `close_notify` as an error, which `until_closed` fails on.
    let requests = "GET /hello HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let got = answers(
        &until_closed(tls, requests.as_bytes()).await,
        &[false, false],
    );
    assert_eq!(got[1].body, b"Hello, world!\n");
    assert!(
        got[1]
            .headers
            .contains(&("connection".into(), "close".into()))
    );
    assert_eq!(fast_path_count(&gw, "secure").await - before, 2);
}

#[tokio::test]
async fn over_tls_a_cached_files_range_is_answered_here_and_a_kept_ones_there() {
    let ca = gateway_tests::TestCa::new();
    let dir = temp_dir();
    let medium: Vec<u8> = (0..100 * 1024).map(|i| (i % 239) as u8).collect();
    let large: Vec<u8> = (0..600 * 1024).map(|i| (i % 251) as u8).collect();
    write_file(dir.path(), "public/medium.bin", &medium);
    write_file(dir.path(), "public/large.bin", &large);
    let routes = r#"
  - name: files
    match: { path_prefix: / }
    static: { root: public, compress: [], cache: { revalidate_after: 60s } }
"#;
    let gw = start_tls(&ca, dir, routes).await;
    let addr = gw.addr("secure");
    let exchange = |requests: String, heads: usize| {
        let ca = &ca;
        async move {
            let tls = gateway_tests::tls_connect(addr, "gw.test", ca.client_config(&[b"http/1.1"]))
                .await
                .expect("handshake");
            answers(
                &until_closed(tls, requests.as_bytes()).await,
                &vec![false; heads],
            )
        }
    };
    let get = |path: &str, more: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: a\r\n{more}Connection: close\r\n\r\n")
    };
    // First requests (looked up on the general path, over TLS): cached, and kept open.
    assert!(exchange(get("/medium.bin", ""), 1).await[0].body == medium);
    assert!(exchange(get("/large.bin", ""), 1).await[0].body == large);

    let before = fast_path_count(&gw, "secure").await;
    let part = exchange(get("/medium.bin", "Range: bytes=100-65635\r\n"), 1)
        .await
        .remove(0);
    assert_eq!(
        fast_path_count(&gw, "secure").await,
        before + 1,
        "answered here"
    );
    assert_eq!(part.status, 206);
    assert!(part.body == medium[100..65_636]);
    assert!(part.headers.contains(&(
        "content-range".into(),
        format!("bytes 100-65635/{}", medium.len())
    )));

    // A file on disk needs `sendfile`: over TLS its range goes through the chain.
    let before = fast_path_chain_count(&gw, "secure").await;
    let part = exchange(get("/large.bin", "Range: bytes=-100\r\n"), 1)
        .await
        .remove(0);
    assert_eq!(
        fast_path_chain_count(&gw, "secure").await,
        before + 1,
        "answered through the chain"
    );
    assert_eq!(part.status, 206);
    assert!(part.body == large[large.len() - 100..]);
}

#[tokio::test]
async fn many_pipelined_requests_are_answered_in_order_across_writes() {
    let gw = start().await;
    let fast = gw.addr("fast");
    cache(fast, "/files/a.txt").await;
    // More answers than the fast path gathers into one write (64 KiB).
    let n = 1500;
    let mut requests = Vec::new();
    for i in 0..n {
        let path = if i % 2 == 0 { "/files/a.txt" } else { "/hello" };
        requests
            .extend_from_slice(format!("GET {path}?i={i} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
    }
    let mut tcp = TcpStream::connect(fast).await.expect("connect");
    let (mut rd, mut wr) = tcp.split();
    let write = async {
        wr.write_all(&requests).await.expect("write");
    };
    let heads = vec![false; n];
    let read = read_answers(&mut rd, &heads);
    let ((), got) = tokio::join!(write, read);
    for (i, a) in got.iter().enumerate() {
        assert_eq!(a.status, 200);
        if i % 2 == 0 {
            assert!(a.body.starts_with(b"the quick"), "answer {i}");
        } else {
            assert_eq!(a.body, b"Hello, world!\n", "answer {i}");
        }
    }
}

#[tokio::test]
async fn a_file_due_for_its_recheck_is_rechecked_on_the_fast_path() {
    let gw = start().await;
    let fast = gw.addr("fast");
    cache(fast, "/files/b.json").await;
    let mut tcp = TcpStream::connect(fast).await.expect("connect");
    let get = b"GET /files/b.json HTTP/1.1\r\nHost: a\r\n\r\n";
    async fn one(tcp: &mut TcpStream, request: &[u8]) -> Answer {
        tcp.write_all(request).await.expect("write");
        read_answers(tcp, &[false]).await.remove(0)
    }
    let before = fast_path_count(&gw, "fast").await;
    assert_eq!(one(&mut tcp, get).await.body, b"{\"k\": 1}");
    // A new version of the file, noticed once `revalidate_after` (1 s) has passed.
    write_file(
        gw.dir(),
        "public/files/b.json",
        "{\"k\": 2, \"more\": true}",
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(one(&mut tcp, get).await.body, b"{\"k\": 2, \"more\": true}");
    assert_eq!(one(&mut tcp, get).await.body, b"{\"k\": 2, \"more\": true}");
    // Removed: the route's terminal answers 404 through the chain, on the same connection.
    let chained = fast_path_chain_count(&gw, "fast").await;
    std::fs::remove_file(gw.dir().join("public/files/b.json")).expect("remove");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(one(&mut tcp, get).await.status, 404);
    assert_eq!(fast_path_count(&gw, "fast").await - before, 4);
    assert_eq!(fast_path_chain_count(&gw, "fast").await - chained, 1);
}

/// The access log's records, without what differs between two requests made one after the
/// other (`time`, `duration_ms`), once `n` have been written.
async fn access_records(gw: &TestGateway, n: usize) -> Vec<serde_json::Value> {
    let path = gw.dir().join("access.log");
    for _ in 0..100 {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= n {
            return text
                .lines()
                .map(|line| {
                    let mut v: serde_json::Value = serde_json::from_str(line).expect("JSON");
                    let record = v.as_object_mut().expect("object");
                    assert!(
                        record.remove("time").is_some() && record.remove("duration_ms").is_some()
                    );
                    v
                })
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fewer than {n} access log lines");
}

#[tokio::test]
async fn the_access_log_records_fast_answers_as_it_records_the_general_paths() {
    let gw = start_with("telemetry:\n  access_log: { path: access.log, format: json }\n").await;
    let (fast, general) = (gw.addr("fast"), gw.addr("general"));
    cache(general, "/files/a.txt").await;
    cache(general, "/files/b.json").await;
    // What the log copies from a request: the target with its query, the host without its
    // port, the first `User-Agent` and `Referer` (a non-ASCII one as the general path reads it).
    let mut requests: Vec<u8> = PLAIN.iter().flat_map(|(r, _)| r.bytes()).collect();
    requests.extend_from_slice(
        b"GET /hello?q=%C3%A9 HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: caf\xc3\xa9/1\r\n\
          User-Agent: second\r\nReferer: http://a/from?x=1\r\n\r\n",
    );
    let mut heads: Vec<bool> = PLAIN.iter().map(|(_, h)| *h).collect();
    heads.push(false);
    let before = fast_path_count(&gw, "fast").await;
    answers(&exchange_bytes(fast, &requests).await, &heads);
    assert_eq!(
        fast_path_count(&gw, "fast").await - before,
        heads.len() as u64
    );
    answers(&exchange_bytes(general, &requests).await, &heads);
    // The two cache fills come first.
    let records = access_records(&gw, 2 + 2 * heads.len()).await;
    let (from_fast, from_general) = records[2..].split_at(heads.len());
    for (i, (f, g)) in from_fast.iter().zip(from_general).enumerate() {
        assert_eq!(f, g, "request {i}");
    }
    // What the records say, so that the comparison is not of two wrong records.
    let hello = &from_fast[0];
    assert_eq!(
        (
            &hello["method"],
            &hello["target"],
            &hello["status"],
            &hello["bytes"]
        ),
        (&"GET".into(), &"/hello".into(), &200.into(), &14.into())
    );
    assert_eq!(
        (&hello["route"], &hello["protocol"]),
        (&"hello".into(), &"HTTP/1.1".into())
    );
    assert_eq!(from_fast[1]["method"], "HEAD");
    assert_eq!(from_fast[1]["bytes"], 14);
    assert_eq!(from_fast[3]["status"], 418);
    assert_eq!(from_fast[5]["route"], "files");
    assert_eq!(from_fast[5]["bytes"], 96);
    assert!(
        from_fast[7]["bytes"].as_u64().unwrap() < 95,
        "gzip: {}",
        from_fast[7]
    );
    assert_eq!(from_fast[9]["user_agent"], "t");
    let last = &from_fast[heads.len() - 1];
    assert_eq!(last["target"], "/hello?q=%C3%A9");
    assert_eq!(last["host"], "example.com");
    assert_eq!(last["user_agent"], "café/1");
    assert_eq!(last["referer"], "http://a/from?x=1");
    assert_eq!(last["client"], "127.0.0.1");

    // A file due for its re-check is recorded too, once.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let get = b"GET /files/b.json HTTP/1.1\r\nHost: a\r\n\r\n";
    let before = fast_path_count(&gw, "fast").await;
    answers(&exchange_bytes(fast, get).await, &[false]);
    assert_eq!(fast_path_count(&gw, "fast").await - before, 1);
    let records = access_records(&gw, records.len() + 1).await;
    assert_eq!(records.len(), 3 + 2 * heads.len());
    let recheck = records.last().unwrap();
    assert_eq!(
        (&recheck["target"], &recheck["status"], &recheck["bytes"]),
        (&"/files/b.json".into(), &200.into(), &8.into())
    );
}

#[tokio::test]
async fn the_access_log_has_every_line_once_the_gateway_has_stopped() {
    let gw = start_with("telemetry:\n  access_log: { path: access.log, format: combined }\n").await;
    let n = 300;
    let requests: Vec<u8> = (0..n)
        .flat_map(|i| format!("GET /hello?i={i} HTTP/1.1\r\nHost: a\r\n\r\n").into_bytes())
        .collect();
    let mut tcp = TcpStream::connect(gw.addr("fast")).await.expect("connect");
    tcp.write_all(&requests).await.expect("write");
    read_answers(&mut tcp, &vec![false; n]).await;
    drop(tcp);
    // Stopped at once, most likely before the writer's next round (every 100 ms).
    let dir = gw.shutdown_keeping_dir().await;
    let text = std::fs::read_to_string(dir.path().join("access.log")).expect("log");
    let targets: Vec<&str> = text
        .lines()
        .map(|l| l.split(' ').nth(6).unwrap_or(""))
        .collect();
    let expected: Vec<String> = (0..n).map(|i| format!("/hello?i={i}")).collect();
    assert_eq!(targets, expected);
}

#[tokio::test]
async fn large_cached_files_are_written_whole_and_in_order_when_pipelined() {
    let gw = start().await;
    let fast = gw.addr("fast");
    // Bodies over the size copied into the answer text are written from the cache.
    let big: Vec<u8> = (0..200 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let mid: Vec<u8> = (0..1024u32).map(|i| (i % 13) as u8 + b'a').collect();
    write_file(gw.dir(), "public/files/big.bin", &big);
    write_file(gw.dir(), "public/files/mid.bin", &mid);
    cache(fast, "/files/big.bin").await;
    cache(fast, "/files/mid.bin").await;
    cache(fast, "/files/a.txt").await;
    let before = fast_path_count(&gw, "fast").await;
    let order = [
        ("GET", "/files/big.bin"),
        ("GET", "/files/mid.bin"),
        ("HEAD", "/files/big.bin"),
        ("GET", "/hello"),
        ("GET", "/files/mid.bin"),
        ("GET", "/files/big.bin"),
        ("GET", "/files/a.txt"),
    ];
    let mut requests = String::new();
    for (method, path) in order {
        requests.push_str(&format!("{method} {path} HTTP/1.1\r\nHost: a\r\n\r\n"));
    }
    let heads: Vec<bool> = order.iter().map(|(m, _)| *m == "HEAD").collect();
    let got = answers(&exchange_bytes(fast, requests.as_bytes()).await, &heads);
    let bodies: Vec<&[u8]> = got.iter().map(|a| &a.body[..]).collect();
    assert!(bodies[0] == big && bodies[5] == big, "the 200 KiB bodies");
    assert!(bodies[1] == mid && bodies[4] == mid, "the 1 KiB bodies");
    assert!(bodies[2].is_empty());
    assert!(
        got[2]
            .headers
            .contains(&("content-length".into(), big.len().to_string()))
    );
    assert_eq!(bodies[3], b"Hello, world!\n");
    assert!(bodies[6].starts_with(b"the quick"));
    assert_eq!(
        fast_path_count(&gw, "fast").await - before,
        order.len() as u64
    );
}

/// Memory files of `len` bytes that the gateways of this process hold cached bodies in, for
/// `sendfile` (by size: other tests' gateways make and drop their own meanwhile).
fn sealed_files_of(len: usize) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("fd list")
        .filter_map(|e| {
            let path = e.ok()?.path();
            let target = std::fs::read_link(&path).ok()?;
            let size = std::fs::metadata(&path).ok()?.len();
            Some((target, size))
        })
        .filter(|(target, size)| {
            target.to_string_lossy().contains("gateway-static-file") && *size == len as u64
        })
        .count()
}

#[tokio::test]
async fn large_files_sent_from_memory_files_reach_a_slow_reader_whole() {
    use async_compression::tokio::bufread::GzipDecoder;
    let gw = start().await;
    let fast = gw.addr("fast");
    // Hex digits from a generator: gzip about halves them, so both the file (240 KiB) and its
    // compressed variant are large enough to be held in memory files.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let text: Vec<u8> = (0..240 * 1024)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            b"0123456789abcdef"[(x >> 60) as usize]
        })
        .collect();
    write_file(gw.dir(), "public/files/digits.txt", &text);
    assert_eq!(sealed_files_of(text.len()), 0);
    cache(fast, "/files/digits.txt").await;
    assert_eq!(
        sealed_files_of(text.len()),
        1,
        "the body is in a memory file"
    );
    let before = fast_path_count(&gw, "fast").await;
    // Sixteen answers, about 3 MB: more than the socket buffers hold, so sending stops in the
    // middle of a file until the client reads on.
    let mut requests = String::new();
    for i in 0..16 {
        let coding = if i % 2 == 1 {
            "Accept-Encoding: gzip\r\n"
        } else {
            ""
        };
        requests.push_str(&format!(
            "GET /files/digits.txt HTTP/1.1\r\nHost: a\r\n{coding}\r\n"
        ));
    }
    let mut conn = TcpStream::connect(fast).await.expect("connect");
    conn.write_all(requests.as_bytes()).await.expect("send");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        read_answers(&mut conn, &[false; 16]),
    )
    .await
    .expect("all answers within 10 s");
    for (i, answer) in got.iter().enumerate() {
        assert_eq!(answer.status, 200, "answer {i}");
        let gzip = answer
            .headers
            .contains(&("content-encoding".into(), "gzip".into()));
        assert_eq!(gzip, i % 2 == 1, "answer {i}");
        let body = if gzip {
            let mut out = Vec::new();
            GzipDecoder::new(&answer.body[..])
                .read_to_end(&mut out)
                .await
                .expect("gzip");
            assert!(answer.body.len() >= 32 * 1024, "a large compressed variant");
            out
        } else {
            answer.body.clone()
        };
        assert!(body == text, "answer {i}: the file's bytes");
    }
    assert_eq!(fast_path_count(&gw, "fast").await - before, 16);
}

#[tokio::test]
async fn files_not_in_the_cache_are_looked_up_here_and_large_ones_sent_from_disk() {
    let gw = start().await;
    let (fast, general) = (gw.addr("fast"), gw.addr("general"));
    // Over the cache's 256 KiB: sent from the file on disk. Random bytes, so that gzip (on
    // for this route) does not make them smaller and no compressed variant is offered.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let large: Vec<u8> = (0..1024 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    write_file(gw.dir(), "public/files/large.bin", &large);
    write_file(
        gw.dir(),
        "public/files/small.txt",
        "not cached until asked for\n",
    );
    let requests = concat!(
        "GET /files/large.bin HTTP/1.1\r\nHost: a\r\n\r\n",
        "HEAD /files/large.bin HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /files/missing.txt HTTP/1.1\r\nHost: a\r\n\r\n",
        "HEAD /files/missing.txt HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /files/small.txt HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /files/large.bin HTTP/1.1\r\nHost: a\r\n\r\n",
    );
    let heads = [false, true, false, true, false, false];
    let before = fast_path_count(&gw, "fast").await;
    let from_fast = answers(&exchange_bytes(fast, requests.as_bytes()).await, &heads);
    // Every one of them answered here, the small file's miss and the 404s included.
    assert_eq!(
        fast_path_count(&gw, "fast").await - before,
        heads.len() as u64
    );
    let from_general = answers(&exchange_bytes(general, requests.as_bytes()).await, &heads);
    for (i, (f, g)) in from_fast.iter().zip(&from_general).enumerate() {
        assert_eq!(f, g, "answer {i}: the same as the general path's");
    }
    // What the answers say, so that the comparison is not of two wrong answers.
    assert_eq!(from_fast[0].status, 200);
    assert!(from_fast[0].body == large && from_fast[5].body == large);
    assert!(from_fast[1].body.is_empty());
    assert!(
        from_fast[1]
            .headers
            .contains(&("content-length".into(), large.len().to_string()))
    );
    assert_eq!(
        (from_fast[2].status, &from_fast[2].body[..]),
        (404, &b"404 Not Found\n"[..])
    );
    assert!(from_fast[3].status == 404 && from_fast[3].body.is_empty());
    assert_eq!(from_fast[4].body, b"not cached until asked for\n");
    // A large text file is compressed on the fly for a client that takes gzip: that answer goes
    // through the chain (its length is not known: chunked); the identity one is sent from here.
    let text: String = (0..40_000).map(|i| format!("line {i}\n")).collect();
    write_file(gw.dir(), "public/files/large.txt", &text);
    let identity = b"GET /files/large.txt HTTP/1.1\r\nHost: a\r\n\r\n";
    let gzip = b"GET /files/large.txt HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\n\r\n";
    let before = fast_path_count(&gw, "fast").await;
    let plain = answers(&exchange_bytes(fast, identity).await, &[false]);
    assert!(plain[0].body == text.as_bytes());
    assert!(
        plain[0]
            .headers
            .contains(&("vary".into(), "accept-encoding".into()))
    );
    assert_eq!(fast_path_count(&gw, "fast").await, before + 1);
    let out = exchange_bytes(fast, gzip).await;
    let head = String::from_utf8_lossy(&out[..out.len().min(512)]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert_eq!(fast_path_count(&gw, "fast").await, before + 2);
    let general = answers(&exchange_bytes(gw.addr("general"), gzip).await, &[false]);
    assert_eq!(
        answers(&out, &[false]),
        general,
        "the general path's, chunk for chunk"
    );
}

/// Descriptors of this process open on `path` (on a file deleted since, too: the kernel's link
/// then ends in " (deleted)").
fn descriptors_on(path: &std::path::Path) -> usize {
    let name = path.to_string_lossy().into_owned();
    std::fs::read_dir("/proc/self/fd")
        .expect("fd list")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| {
            let target = target.to_string_lossy();
            target == name || target.strip_suffix(" (deleted)") == Some(&name)
        })
        .count()
}

#[tokio::test]
async fn large_files_stay_open_for_the_next_requests_and_a_replaced_one_is_seen_when_due() {
    let gw = start().await;
    let fast = gw.addr("fast");
    let path = gw.dir().join("public/files/kept.bin");
    let content =
        |seed: u8, len: usize| -> Vec<u8> { (0..len).map(|i| (i % 251) as u8 ^ seed).collect() };
    let first = content(1, 600 * 1024);
    write_file(gw.dir(), "public/files/kept.bin", &first);
    let get = b"GET /files/kept.bin HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let body_of = |out: Vec<u8>| answers(&out, &[false]).remove(0).body;

    // The first request looks the file up and keeps it open; the next ones are answered from
    // that descriptor, and no other is opened for them.
    assert!(body_of(exchange_bytes(fast, get).await) == first);
    assert_eq!(descriptors_on(&path), 1, "kept open after its answer");
    let before = fast_path_count(&gw, "fast").await;
    for _ in 0..3 {
        assert!(body_of(exchange_bytes(fast, get).await) == first);
    }
    assert_eq!(fast_path_count(&gw, "fast").await, before + 3);
    assert_eq!(descriptors_on(&path), 1);
    // The general path (here a range, on the listener without the fast path) streams it from
    // the same descriptor.
    let range = b"GET /files/kept.bin HTTP/1.1\r\nHost: a\r\nRange: bytes=100-199\r\nConnection: close\r\n\r\n";
    let part = answers(&exchange_bytes(gw.addr("general"), range).await, &[false]).remove(0);
    assert_eq!(part.status, 206);
    assert!(part.body == first[100..200]);
    assert_eq!(descriptors_on(&path), 1);

    // Replaced (a new file renamed over it, as deployments do): the kept file answers until its
    // re-check is due (`revalidate_after`, 1 s), then the new one does and the old one's
    // descriptor is closed.
    let second = content(2, 700 * 1024);
    write_file(gw.dir(), "public/files/kept.new", &second);
    std::fs::rename(gw.dir().join("public/files/kept.new"), &path).expect("rename");
    assert!(body_of(exchange_bytes(fast, get).await) == first);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(body_of(exchange_bytes(fast, get).await) == second);
    assert!(body_of(exchange_bytes(fast, get).await) == second);
    assert_eq!(
        descriptors_on(&path),
        1,
        "the new file kept, the old one closed"
    );

    // Written in place with another length: seen by the next request (its descriptor's
    // status changed), with the new length.
    let third = content(3, 300 * 1024);
    std::fs::write(&path, &third).expect("write");
    assert!(body_of(exchange_bytes(fast, get).await) == third);

    // Deleted: a 404 once due, and nothing left open on it.
    std::fs::remove_file(&path).expect("remove");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = exchange_bytes(fast, get).await;
    assert_eq!(answers(&out, &[false])[0].status, 404);
    assert_eq!(descriptors_on(&path), 0);
}

/// The value of header `name` in `answer`.
fn header_of<'a>(answer: &'a Answer, name: &str) -> &'a str {
    answer
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in {:?}", answer.headers))
}

/// How the fast path answers a request: from answers prepared ahead of time, or through the
/// route's chain and terminal (as the general path does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answered {
    Here,
    There,
}

/// Sends `request` (one, a `HEAD` when `head`) on a new connection to the fast listener and to
/// the general one; checks that the answers are the same and that the fast path answered it
/// from prepared answers (`Here`) or through the chain (`There`), and returns the answer.
async fn on_both(gw: &TestGateway, request: &str, head: bool, expect: Answered) -> Answer {
    let before = fast_path_count(gw, "fast").await;
    let before_chain = fast_path_chain_count(gw, "fast").await;
    let here = exchange_bytes(gw.addr("fast"), request.as_bytes()).await;
    let here = answers(&here, &[head]).remove(0);
    let counted = fast_path_count(gw, "fast").await - before;
    let chained = fast_path_chain_count(gw, "fast").await - before_chain;
    assert_eq!(
        counted, 1,
        "{request:?}: every body-less request is the fast path's"
    );
    let answered = if chained == 0 {
        Answered::Here
    } else {
        Answered::There
    };
    assert_eq!(
        answered, expect,
        "{request:?} (through the chain: {chained})"
    );
    let there = exchange_bytes(gw.addr("general"), request.as_bytes()).await;
    let there = answers(&there, &[head]).remove(0);
    assert_eq!(here, there, "{request:?}: the general path's answer");
    here
}

#[tokio::test]
async fn revalidations_of_cached_files_are_answered_here_as_the_general_path_answers_them() {
    let gw = start().await;
    let (fast, general) = (gw.addr("fast"), gw.addr("general"));
    cache(general, "/files/a.txt").await;
    let ask = |method: &str, more: &str| {
        format!("{method} /files/a.txt HTTP/1.1\r\nHost: a\r\n{more}\r\n")
    };
    let plain = answers(
        &exchange_bytes(fast, ask("GET", "").as_bytes()).await,
        &[false],
    )
    .remove(0);
    let gzipped = ask("GET", "Accept-Encoding: gzip\r\n");
    let gzipped = answers(&exchange_bytes(fast, gzipped.as_bytes()).await, &[false]).remove(0);
    let (etag, lm) = (
        header_of(&plain, "etag"),
        header_of(&plain, "last-modified"),
    );
    let gz_etag = header_of(&gzipped, "etag");
    assert_ne!(etag, gz_etag, "each coding has its own tag");
    let weak = format!("W/{etag}");
    let cases: Vec<(&str, String, u16)> = vec![
        ("GET", format!("If-None-Match: {etag}\r\n"), 304),
        ("GET", format!("If-None-Match: {weak}\r\n"), 304),
        ("GET", format!("If-None-Match: \"x\", {etag}\r\n"), 304),
        ("GET", "If-None-Match: *\r\n".into(), 304),
        ("GET", "If-None-Match: \"other\"\r\n".into(), 200),
        ("GET", format!("If-Modified-Since: {lm}\r\n"), 304),
        (
            "GET",
            "If-Modified-Since: Thu, 01 Jan 1970 00:00:00 GMT\r\n".into(),
            200,
        ),
        ("GET", "If-Modified-Since: yesterday\r\n".into(), 200),
        // If-None-Match decides when both are there.
        (
            "GET",
            format!("If-None-Match: \"other\"\r\nIf-Modified-Since: {lm}\r\n"),
            200,
        ),
        ("HEAD", format!("If-None-Match: {etag}\r\n"), 304),
        ("HEAD", "If-None-Match: \"other\"\r\n".into(), 200),
        // The tag of the representation the request's codings choose.
        (
            "GET",
            format!("Accept-Encoding: gzip\r\nIf-None-Match: {gz_etag}\r\n"),
            304,
        ),
        (
            "GET",
            format!("Accept-Encoding: gzip\r\nIf-None-Match: {etag}\r\n"),
            200,
        ),
        ("GET", format!("If-None-Match: {gz_etag}\r\n"), 200),
    ];
    for (method, more, status) in &cases {
        let request = ask(method, more);
        let here = on_both(&gw, &request, *method == "HEAD", Answered::Here).await;
        assert_eq!(here.status, *status, "{request:?}");
        if here.status == 304 {
            assert!(here.body.is_empty());
            assert!(here.headers.iter().all(|(n, _)| n != "content-length"));
        }
    }
    // A range of a file with a compressed variant is of the identity bytes, whatever the
    // request's codings (as the general path serves it).
    let ranged = ask("GET", "Accept-Encoding: gzip\r\nRange: bytes=4-8\r\n");
    let part = on_both(&gw, &ranged, false, Answered::Here).await;
    assert_eq!((part.status, &part.body[..]), (206, &plain.body[4..9]));
    // Pipelined: a 304 between two 200s, each in its place.
    let three = format!(
        "{}{}{}",
        ask("GET", ""),
        ask("GET", &format!("If-None-Match: {etag}\r\n")),
        ask("GET", "")
    );
    let got = answers(&exchange_bytes(fast, three.as_bytes()).await, &[false; 3]);
    let statuses: Vec<u16> = got.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [200, 304, 200]);
    assert!(got[0].body == plain.body && got[2].body == plain.body);

    // Left to the general path: other preconditions, a revalidation with a range, a header
    // twice, and a file not cached yet (looked up here, then answered there from the entry).
    write_file(
        gw.dir(),
        "public/files/new.txt",
        "not cached before this request\n",
    );
    let future = "If-Modified-Since: Fri, 01 Jan 2100 00:00:00 GMT\r\n";
    let handed = [
        (ask("GET", &format!("If-Match: {etag}\r\n")), 200),
        (
            ask(
                "GET",
                "If-Unmodified-Since: Thu, 01 Jan 1970 00:00:00 GMT\r\n",
            ),
            412,
        ),
        (
            ask("GET", "If-None-Match: \"other\"\r\nRange: bytes=0-3\r\n"),
            206,
        ),
        (
            ask(
                "GET",
                &format!("If-None-Match: \"x\"\r\nIf-None-Match: {etag}\r\n"),
            ),
            304,
        ),
        (ask("GET", future).replace("a.txt", "new.txt"), 304),
    ];
    for (request, status) in &handed {
        let there = on_both(&gw, request, false, Answered::There).await;
        assert_eq!(there.status, *status, "{request:?}");
    }
}

#[tokio::test]
async fn ranges_of_cached_and_kept_files_are_answered_here_as_the_general_path_answers_them() {
    // The routes of `ROUTES` but one: its files re-checked once a minute, so that none falls due
    // while the test runs (a file due for its re-check is the general path's).
    let yaml = format!("{FAST_AND_GENERAL_LISTENERS}{ROUTES}").replace(
        "static: { root: public, compress: [gzip], compress_min_size: 16 }",
        "static: { root: public, compress: [], cache: { revalidate_after: 60s } }",
    );
    let dir = temp_dir();
    let data: Vec<u8> = (0..600 * 1024).map(|i| (i % 251) as u8).collect();
    write_file(dir.path(), "public/files/ranged.bin", &data);
    write_file(
        dir.path(),
        "public/files/small.txt",
        "in the memory cache\n",
    );
    // Cached too, and large enough to sit in a memory file.
    let medium: Vec<u8> = (0..100 * 1024).map(|i| (i % 239) as u8).collect();
    write_file(dir.path(), "public/files/medium.bin", &medium);
    let gw = TestGateway::start_in(dir, &yaml).await;
    let fast = gw.addr("fast");
    let ask = |target: &str, more: &str| {
        format!("GET {target} HTTP/1.1\r\nHost: a\r\n{more}Connection: close\r\n\r\n")
    };
    // The first request looks the file up and keeps it open; so is the small one cached.
    let whole = answers(
        &exchange_bytes(fast, ask("/files/ranged.bin", "").as_bytes()).await,
        &[false],
    );
    assert!(whole[0].status == 200 && whole[0].body == data);
    cache(fast, "/files/small.txt").await;
    cache(fast, "/files/medium.bin").await;

    let len = data.len();
    let cases: [(&str, u16, std::ops::Range<usize>); 7] = [
        ("bytes=100-199", 206, 100..200),
        ("bytes=0-0", 206, 0..1),
        ("bytes=614000-", 206, 614_000..len),
        ("bytes=-50", 206, len - 50..len),
        ("bytes=600000-99999999", 206, 600_000..len),
        // Ranges the general path ignores (several, another unit): the whole file, from here.
        ("bytes=0-1,5-6", 200, 0..len),
        ("items=0-1", 200, 0..len),
    ];
    for (range, status, bytes) in cases {
        let request = ask("/files/ranged.bin", &format!("Range: {range}\r\n"));
        let here = on_both(&gw, &request, false, Answered::Here).await;
        assert_eq!(here.status, status, "{range}");
        assert!(
            here.body == data[bytes.clone()],
            "{range}: the bytes asked for"
        );
        if status == 206 {
            let content_range = format!("bytes {}-{}/{len}", bytes.start, bytes.end - 1);
            assert!(
                here.headers
                    .contains(&("content-range".into(), content_range.clone())),
                "{range}: {content_range} in {:?}",
                here.headers
            );
        }
    }
    // Two ranges pipelined on one connection, each in its place.
    let two = format!(
        "{}{}",
        ask("/files/ranged.bin", "Range: bytes=10-19\r\n").replace("Connection: close\r\n", ""),
        ask("/files/ranged.bin", "Range: bytes=-5\r\n")
    );
    let before = fast_path_count(&gw, "fast").await;
    let got = answers(&exchange_bytes(fast, two.as_bytes()).await, &[false, false]);
    assert_eq!(fast_path_count(&gw, "fast").await, before + 2);
    assert!(got[0].body == data[10..20] && got[1].body == data[len - 5..]);
    // `HEAD` ignores the range, here as there: the whole file's 200 head.
    let head = ask("/files/ranged.bin", "Range: bytes=0-9\r\n").replacen("GET", "HEAD", 1);
    assert_eq!(on_both(&gw, &head, true, Answered::Here).await.status, 200);
    // A revalidation of the kept file: its 304, or its whole 200, from here too.
    let (etag, lm) = (
        header_of(&whole[0], "etag"),
        header_of(&whole[0], "last-modified"),
    );
    let revalidations = [
        (format!("If-None-Match: {etag}\r\n"), 304),
        ("If-None-Match: \"other\"\r\n".to_string(), 200),
        (format!("If-Modified-Since: {lm}\r\n"), 304),
    ];
    for (more, status) in revalidations {
        let request = ask("/files/ranged.bin", &more);
        let here = on_both(&gw, &request, false, Answered::Here).await;
        assert_eq!(here.status, status, "{more:?}");
        assert!(status == 304 || here.body == data);
    }

    // Ranges of cached files: from memory, here too.
    let small = b"in the memory cache\n";
    let cached: [(&str, &str, u16, &[u8]); 4] = [
        ("/files/small.txt", "bytes=3-5", 206, &small[3..6]),
        (
            "/files/medium.bin",
            "bytes=1000-70999",
            206,
            &medium[1000..71_000],
        ),
        (
            "/files/medium.bin",
            "bytes=-10",
            206,
            &medium[medium.len() - 10..],
        ),
        ("/files/medium.bin", "bytes=0-1,4-5", 200, &medium),
    ];
    for (target, range, status, bytes) in cached {
        let request = ask(target, &format!("Range: {range}\r\n"));
        let here = on_both(&gw, &request, false, Answered::Here).await;
        assert_eq!(here.status, status, "{target} {range}");
        assert!(here.body == bytes, "{target} {range}: the bytes asked for");
    }

    // Left to the general path, with its answers: unsatisfiable ranges (416) and a range with
    // `If-Range`.
    let handed = [
        ask("/files/ranged.bin", "Range: bytes=700000-\r\n"),
        ask(
            "/files/ranged.bin",
            "Range: bytes=0-9\r\nIf-Range: \"other\"\r\n",
        ),
        ask("/files/medium.bin", "Range: bytes=200000-\r\n"),
    ];
    let statuses = [416, 200, 416];
    for (request, status) in handed.iter().zip(statuses) {
        let there = on_both(&gw, request, false, Answered::There).await;
        assert_eq!(there.status, status, "{request:?}");
    }
}

/// A `traceparent` of trace `trace` (hex) from the client's span `00f067aa0ba902b7`.
fn traceparent_of(trace: &str, flags: &str) -> String {
    format!("00-{trace}-00f067aa0ba902b7-{flags}")
}

/// Requests with a trace, each `(request, HEAD?, trace id when its span is recorded)`: a
/// sampled parent's trace is recorded; an unsampled parent's, a new one (the ratio is 0) and
/// one with two `traceparent`s (no valid parent: a new trace) are not.
fn traced_requests(listener: u8) -> Vec<(String, bool, Option<String>)> {
    let trace = |i: u8| format!("{listener:02x}{}{i:02x}", "0".repeat(28));
    let get = |target: &str, host: &str, more: &str| {
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n{more}\r\n")
    };
    let sampled = |i: u8| format!("traceparent: {}\r\n", traceparent_of(&trace(i), "01"));
    vec![
        (
            get(
                "/hello?q=1",
                "example.com:8080",
                &format!(
                    "{}tracestate: v=1\r\nUser-Agent: probe/1\r\nUser-Agent: second\r\n",
                    sampled(1)
                ),
            ),
            false,
            Some(trace(1)),
        ),
        (
            get("/files/a.txt", "a", &sampled(2)).replacen("GET", "HEAD", 1),
            true,
            Some(trace(2)),
        ),
        (
            get(
                "/files/a.txt?v=2",
                "a",
                &format!("{}Accept-Encoding: gzip\r\n", sampled(3)),
            ),
            false,
            Some(trace(3)),
        ),
        (get("/teapot", "a", &sampled(4)), false, Some(trace(4))),
        (get("/odd", "a", &sampled(5)), false, Some(trace(5))),
        (
            get(
                "/hello",
                "a",
                &format!("traceparent: {}\r\n", traceparent_of(&trace(6), "00")),
            ),
            false,
            None,
        ),
        (get("/hello", "a", ""), false, None),
        (
            get("/hello", "a", &format!("{}{}", sampled(7), sampled(7))),
            false,
            None,
        ),
    ]
}

#[tokio::test]
async fn traced_requests_stay_on_the_fast_path_with_the_general_paths_spans() {
    use gateway_tests::otlp::{OtlpReceiver, attr_int, attr_str, hex};
    let collector = OtlpReceiver::start().await;
    let gw = start_with(&format!(
        "telemetry:\n  traces: {{ otlp_endpoint: \"{}\", sample_ratio: 0.0 }}\n  \
         access_log: {{ path: access.log, format: json }}\n",
        collector.grpc_endpoint()
    ))
    .await;
    let (fast, general) = (gw.addr("fast"), gw.addr("general"));
    cache(general, "/files/a.txt").await;
    let before = fast_path_count(&gw, "fast").await;
    let mut expected = Vec::new();
    for (listener, addr) in [(1u8, fast), (2, general)] {
        let requests = traced_requests(listener);
        let bytes: Vec<u8> = requests.iter().flat_map(|(r, ..)| r.bytes()).collect();
        let heads: Vec<bool> = requests.iter().map(|(_, h, _)| *h).collect();
        let got = answers(&exchange_bytes(addr, &bytes).await, &heads);
        let statuses: Vec<u16> = got.iter().map(|a| a.status).collect();
        assert_eq!(statuses, [200, 200, 200, 418, 599, 200, 200, 200]);
        expected.push(requests);
    }
    assert_eq!(
        fast_path_count(&gw, "fast").await - before,
        8,
        "every traced request was answered on the fast path"
    );

    // Five recorded spans a listener, and only those.
    collector
        .wait_for(Duration::from_secs(10), |all| all.len() >= 10)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spans: Vec<_> = collector.received().into_iter().map(|r| r.span).collect();
    assert_eq!(spans.len(), 10, "{spans:#?}");
    let span_of = |trace: &str| {
        spans
            .iter()
            .find(|s| hex(&s.trace_id) == trace)
            .unwrap_or_else(|| panic!("no span of trace {trace}"))
    };
    let (from_fast, from_general) = (&expected[0], &expected[1]);
    for ((_, _, f), (_, _, g)) in from_fast.iter().zip(from_general) {
        let (Some(f), Some(g)) = (f, g) else { continue };
        let (f, g) = (span_of(f), span_of(g));
        assert_eq!(f.name, g.name);
        assert_eq!(
            (
                f.kind,
                &f.parent_span_id,
                &f.trace_state,
                f.flags,
                &f.status
            ),
            (
                g.kind,
                &g.parent_span_id,
                &g.trace_state,
                g.flags,
                &g.status
            ),
            "{}",
            f.name
        );
        // Every attribute alike but the listener's name and, without a port in `Host`, its
        // port.
        let differ = |key: &str| key == "gateway.listener" || key == "server.port";
        let keys = |s: &gateway_tests::otlp::Span| {
            s.attributes
                .iter()
                .map(|kv| kv.key.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(f), keys(g), "{}", f.name);
        for kv in f.attributes.iter().filter(|kv| !differ(&kv.key)) {
            let other = g.attributes.iter().find(|o| o.key == kv.key);
            assert_eq!(Some(kv), other, "{}: {}", f.name, kv.key);
        }
        assert_eq!(attr_str(&f.attributes, "gateway.listener"), "fast");
        assert!(f.end_time_unix_nano >= f.start_time_unix_nano);
    }
    // What the spans say, so that the comparison is not of two wrong spans.
    let hello = span_of(expected[0][0].2.as_deref().unwrap());
    assert_eq!(hello.name, "GET hello");
    assert_eq!(hex(&hello.parent_span_id), "00f067aa0ba902b7");
    assert_eq!(hello.trace_state, "v=1");
    let a = &hello.attributes;
    assert_eq!(attr_str(a, "url.path"), "/hello");
    assert_eq!(attr_str(a, "server.address"), "example.com");
    assert_eq!(attr_int(a, "server.port"), Some(8080));
    assert_eq!(attr_str(a, "user_agent.original"), "probe/1");
    assert_eq!(attr_str(a, "network.protocol.version"), "1.1");
    assert_eq!(attr_int(a, "http.response.status_code"), Some(200));
    let head = span_of(expected[0][1].2.as_deref().unwrap());
    assert_eq!(head.name, "HEAD files");
    assert_eq!(
        attr_int(&head.attributes, "server.port"),
        Some(i64::from(fast.port()))
    );
    let odd = span_of(expected[0][4].2.as_deref().unwrap());
    assert!(
        odd.status.as_ref().is_some_and(|s| s.code == 2),
        "5xx fails"
    );

    // The access log names the trace of recorded spans only.
    let records = access_records(&gw, 1 + 16).await;
    for (record, (_, _, trace)) in records[1..9].iter().zip(from_fast) {
        assert_eq!(
            record.get("trace_id").and_then(|t| t.as_str()),
            trace.as_deref(),
            "{record}"
        );
    }
}
