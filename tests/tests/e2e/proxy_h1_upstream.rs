//! The proxy's HTTP/1.1 client against upstreams written byte by byte: response framings
//! (chunked with trailers, close-delimited, bodiless statuses), connection reuse, an upstream
//! that answers before the upload ends, pooled connections the upstream closed, bodies that
//! come after their heads, and responses that are not valid HTTP/1.1.
//!
//! Each upstream here is a script: for every request it reads (head and body, whichever way
//! the body is framed) it is told which connection and which request on it this is, and
//! answers with bytes, or closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::{TestGateway, http1, http2c, raw_status, raw_with_timeout};
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::proxy::{get, upstream, yaml};

/// One request as the upstream read it.
struct Seen {
    /// Which accepted connection (from 0).
    conn: usize,
    /// Which request on that connection (from 0).
    nth: usize,
    /// The head, request line first.
    head: String,
    /// The body, chunked coding removed.
    body: Vec<u8>,
}

/// What the script does with a request.
enum Reply {
    /// Writes these bytes and reads the next request.
    Send(Vec<u8>),
    /// Writes these bytes, then closes.
    SendAndClose(Vec<u8>),
    /// Closes without answering.
    Close,
    /// Writes the first bytes, waits, then writes the rest and reads the next request.
    Later(Vec<u8>, Duration, Vec<u8>),
}

/// A scripted upstream; returns its address and the number of connections it accepted.
async fn scripted(
    script: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let script = Arc::new(script);
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let conn = count.fetch_add(1, Relaxed);
            let script = script.clone();
            tokio::spawn(async move {
                let mut reader = Reader { s, buf: Vec::new() };
                for nth in 0.. {
                    let Some((head, body)) = reader.request().await else {
                        return;
                    };
                    let seen = Seen {
                        conn,
                        nth,
                        head,
                        body,
                    };
                    match script(&seen) {
                        Reply::Send(bytes) => {
                            if reader.s.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                        Reply::SendAndClose(bytes) => {
                            let _ = reader.s.write_all(&bytes).await;
                            return;
                        }
                        Reply::Close => return,
                        Reply::Later(first, wait, rest) => {
                            if reader.s.write_all(&first).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(wait).await;
                            if reader.s.write_all(&rest).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// Reads requests off a connection.
struct Reader {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Reader {
    /// More bytes into `buf`; false at EOF.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match self.s.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Bytes up to and including the next CRLF.
    async fn line(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                return Some(self.buf.drain(..i + 2).collect());
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    async fn exactly(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill().await {
                return None;
            }
        }
        Some(self.buf.drain(..n).collect())
    }

    /// The next request's head and decoded body.
    async fn request(&mut self) -> Option<(String, Vec<u8>)> {
        let mut head = String::new();
        loop {
            let line = self.line().await?;
            if line == b"\r\n" {
                break;
            }
            head.push_str(&String::from_utf8_lossy(&line));
        }
        let lower = head.to_ascii_lowercase();
        let field = |name: &str| {
            lower
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        let body = if field("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
            let mut body = Vec::new();
            loop {
                let size_line = String::from_utf8(self.line().await?).ok()?;
                let size = usize::from_str_radix(size_line.trim(), 16).ok()?;
                if size == 0 {
                    // Trailers, up to the empty line, are kept in the head.
                    loop {
                        let line = self.line().await?;
                        if line == b"\r\n" {
                            break;
                        }
                        head.push_str("trailer ");
                        head.push_str(&String::from_utf8_lossy(&line));
                    }
                    break body;
                }
                body.extend(self.exactly(size).await?);
                self.exactly(2).await?;
            }
        } else {
            let n = field("content-length:").map_or(0, |v| v.parse().unwrap());
            self.exactly(n).await?
        };
        Some((head, body))
    }
}

/// The request line's path.
fn path(seen: &Seen) -> &str {
    seen.head.split(' ').nth(1).unwrap_or("")
}

fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn chunked_and_close_delimited_responses_pass_through() {
    let (addr, accepted) = scripted(|seen| match path(seen) {
        "/chunked" => Reply::Send(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n\
              4;ext=1\r\ndata\r\n6\r\n-more-\r\n0\r\nx-checksum: abc\r\n\r\n"
                .to_vec(),
        ),
        "/close" => Reply::SendAndClose(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end".to_vec(),
        ),
        _ => Reply::Send(ok("plain")),
    })
    .await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{addr}]"), "")).await;
    let mut c = http2c(gw.addr("main")).await;
    for _ in 0..3 {
        let res = c.get("/chunked").await;
        assert_eq!((res.status(), &res.body[..]), (200, &b"data-more-"[..]));
        assert_eq!(res.trailers.expect("trailers")["x-checksum"], "abc");
    }
    // A chunked response that ended cleanly leaves its connection for the next request.
    assert_eq!(accepted.load(Relaxed), 1);
    let res = c.get("/close").await;
    assert_eq!((res.status(), res.text().as_str()), (200, "until the end"));
    // Over HTTP/1.1 the close-delimited body gets a framing of its own.
    let res = http1(gw.addr("main")).await.get("/close").await;
    assert_eq!((res.status(), res.text().as_str()), (200, "until the end"));
    assert_eq!(c.get("/").await.text(), "plain");
    let s = &upstream(&gw).targets.snapshot()[0];
    assert_eq!(s.failures, 0);
}

#[tokio::test]
async fn a_body_that_comes_after_its_head_arrives_whole() {
    // The proxy takes a look for the body's first frame as the head arrives, without waiting;
    // when nothing is there yet it waits for it with the request's own waker. A wake-up lost
    // on the way would hang these requests.
    let wait = Duration::from_millis(100);
    let (addr, accepted) = scripted(move |seen| match path(seen) {
        "/length" => Reply::Later(
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n".to_vec(),
            wait,
            b"came later".to_vec(),
        ),
        "/chunked" => Reply::Later(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nsoon\r\n".to_vec(),
            wait,
            b"6\r\n, late\r\n0\r\n\r\n".to_vec(),
        ),
        _ => Reply::Later(Vec::new(), wait, ok("head and body late")),
    })
    .await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{addr}]"), "")).await;
    let no_hang = Duration::from_secs(10);
    let mut h1 = http1(gw.addr("main")).await;
    let mut h2 = http2c(gw.addr("main")).await;
    for _ in 0..2 {
        for (path, body) in [
            ("/length", "came later"),
            ("/chunked", "soon, late"),
            ("/", "head and body late"),
        ] {
            let res = tokio::time::timeout(no_hang, h1.get(path))
                .await
                .expect("no hang");
            assert_eq!((res.status(), res.text().as_str()), (200, body), "{path}");
            let res = tokio::time::timeout(no_hang, h2.get(path))
                .await
                .expect("no hang");
            assert_eq!((res.status(), res.text().as_str()), (200, body), "{path}");
        }
    }
    // Each body ended cleanly, so its connection went back to the pool.
    assert_eq!(accepted.load(Relaxed), 1);
    assert_eq!(upstream(&gw).targets.snapshot()[0].failures, 0);
}

#[tokio::test]
async fn bodiless_responses_keep_the_connection_in_step() {
    let (addr, accepted) = scripted(|seen| match path(seen) {
        // A HEAD answer announces the length a GET would have; no bytes follow.
        "/head" => Reply::Send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n".to_vec()),
        "/204" => Reply::Send(b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()),
        "/304" => {
            Reply::Send(b"HTTP/1.1 304 Not Modified\r\ncontent-length: 50\r\netag: \"x\"\r\n\r\n".to_vec())
        }
        // Interim responses before the final one are not forwarded as the answer.
        "/interim" => Reply::Send(
            b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal"
                .to_vec(),
        ),
        _ => Reply::Send(ok(&format!("request {} on connection {}", seen.nth, seen.conn))),
    })
    .await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{addr}]"), "")).await;
    let mut c = http1(gw.addr("main")).await;
    let head = Request::head("/head")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = c.send(head).await.unwrap();
    assert_eq!((res.status(), res.header("content-length")), (200, "100"));
    assert!(res.body.is_empty());
    let res = c.get("/204").await;
    assert_eq!((res.status(), res.body.len()), (204, 0));
    let res = c.get("/304").await;
    assert_eq!((res.status(), res.header("etag")), (304, "\"x\""));
    let res = c.get("/interim").await;
    assert_eq!((res.status(), res.text().as_str()), (200, "final"));
    // Had any of these been read as having a body, this request would hang or be misread.
    let res = tokio::time::timeout(Duration::from_secs(5), c.get("/next"))
        .await
        .expect("no hang");
    assert_eq!(res.text(), "request 4 on connection 0");
    assert_eq!(accepted.load(Relaxed), 1);
}

#[tokio::test]
async fn request_bodies_are_framed_by_what_the_gateway_knows() {
    let (addr, _) = scripted(|seen| {
        let framing = if seen
            .head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            "chunked"
        } else {
            "length"
        };
        let trailer = seen
            .head
            .lines()
            .find_map(|l| l.strip_prefix("trailer "))
            .unwrap_or("none");
        Reply::Send(ok(&format!(
            "{framing} {} {trailer}",
            String::from_utf8_lossy(&seen.body)
        )))
    })
    .await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{addr}]"), "")).await;
    // A body of known length keeps it; a client's chunked body stays chunked, trailers and all.
    let mut c = http1(gw.addr("main")).await;
    let req = Request::post("/")
        .body(Full::new(Bytes::from("abc")))
        .unwrap();
    assert_eq!(c.send(req).await.unwrap().text(), "length abc none");
    let out = raw_with_timeout(
        gw.addr("main"),
        b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nte: trailers\r\n\r\n\
          3\r\nabc\r\n2\r\nde\r\n0\r\nx-sum: 5\r\n\r\n",
        Duration::from_millis(500),
    )
    .await;
    assert!(out.ends_with("chunked abcde x-sum: 5"), "{out}");
    let out = raw_with_timeout(
        gw.addr("main"),
        b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nz",
        Duration::from_millis(500),
    )
    .await;
    assert!(out.ends_with("length z none"), "{out}");
}

#[tokio::test]
async fn an_early_answer_to_an_upload_reaches_the_client() {
    // The upstream refuses the upload on its head alone, without reading the body.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\nconnection: close\r\n\r\ntoo big!",
                    )
                    .await;
                let _ = s.shutdown().await;
                // Keep the socket a moment, unread, as a busy server would.
                tokio::time::sleep(Duration::from_millis(500)).await;
            });
        }
    });
    let gw = TestGateway::start(&yaml(
        &format!("    targets: [{addr}]\n    timeout: 5s"),
        "",
    ))
    .await;
    let mut client = TcpStream::connect(gw.addr("main")).await.unwrap();
    client
        .write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 67108864\r\n\r\n")
        .await
        .unwrap();
    // Upload in the background until the gateway stops taking it; read the answer meanwhile.
    let (mut rd, mut wr) = client.into_split();
    let uploading = tokio::spawn(async move {
        let block = vec![b'x'; 64 * 1024];
        for _ in 0..1024 {
            if wr.write_all(&block).await.is_err() {
                break;
            }
        }
    });
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        while !out.windows(8).any(|w| w == b"too big!") {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    uploading.abort();
    assert!(read.is_ok(), "no answer within 5 s");
    let text = String::from_utf8_lossy(&out);
    assert_eq!(raw_status(&text), 413, "{text}");
    assert!(text.ends_with("too big!"), "{text}");
}

#[tokio::test]
async fn pooled_connections_the_upstream_closed_cost_no_request() {
    // Connection 0 answers once, then takes the next request and closes without answering:
    // the keep-alive race, where the upstream times out an idle connection just as a request
    // is sent on it. Every later connection answers.
    let (addr, accepted) = scripted(|seen| match (seen.conn, seen.nth) {
        (0, 0) => Reply::Send(ok("first")),
        (0, _) => Reply::Close,
        (c, _) if path(seen) == "/idle-close" => Reply::SendAndClose(ok(&format!("closing {c}"))),
        (c, n) => Reply::Send(ok(&format!(
            "{c}/{n} {}",
            String::from_utf8_lossy(&seen.body)
        ))),
    })
    .await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{addr}]"), "")).await;
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/").await.text(), "first");
    // Sent on the pooled connection, lost by the upstream, sent again on a new one.
    assert_eq!(c.get("/").await.text(), "1/0 ");
    assert_eq!(accepted.load(Relaxed), 2);
    // An upstream that closes after answering (without saying so): the closed connection is
    // noticed when it is taken from the pool, and the request goes to a new one.
    assert_eq!(c.get("/idle-close").await.text(), "closing 1");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let req = Request::post("/")
        .body(Full::new(Bytes::from("body")))
        .unwrap();
    assert_eq!(c.send(req).await.unwrap().text(), "2/0 body");
    let s = &upstream(&gw).targets.snapshot()[0];
    assert_eq!(
        s.failures, 0,
        "a stale connection is not the target's failure"
    );
}

#[tokio::test]
async fn a_lost_non_idempotent_request_is_not_sent_twice() {
    // The same race for a POST: the upstream may have acted on it, so it is not repeated.
    let posts = Arc::new(AtomicUsize::new(0));
    let seen_posts = posts.clone();
    let (addr, _) = scripted(move |seen| match (seen.conn, seen.nth) {
        (0, 0) => Reply::Send(ok("first")),
        _ => {
            if seen.head.starts_with("POST") {
                seen_posts.fetch_add(1, Relaxed);
            }
            Reply::Close
        }
    })
    .await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{addr}]"), "")).await;
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/").await.text(), "first");
    let req = Request::post("/")
        .body(Full::new(Bytes::from("once")))
        .unwrap();
    assert_eq!(c.send(req).await.unwrap().status(), 502);
    assert_eq!(posts.load(Relaxed), 1);
}

#[tokio::test]
async fn invalid_responses_are_502_and_counted() {
    let (addr, _) = scripted(|seen| match path(seen) {
        "/two-lengths" => Reply::SendAndClose(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!".to_vec(),
        ),
        "/bad-chunk" => Reply::SendAndClose(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        ),
        "/huge-head" => {
            let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
            for i in 0..2000 {
                head.extend_from_slice(format!("x-filler-{i}: {}\r\n", "v".repeat(40)).as_bytes());
            }
            head.extend_from_slice(b"content-length: 0\r\n\r\n");
            Reply::SendAndClose(head)
        }
        "/bad-status" => Reply::SendAndClose(b"HTTP/1.1 99 Odd\r\n\r\n".to_vec()),
        _ => Reply::Send(ok("fine")),
    })
    .await;
    let gw = TestGateway::start(&yaml(
        &format!("    targets: [{addr}]\n    health_check: {{ unhealthy_after: 100 }}"),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    for path in ["/two-lengths", "/huge-head", "/bad-status"] {
        assert_eq!(c.get(path).await.status(), 502, "{path}");
    }
    // A body that goes bad is never passed on as complete: a 502 when it fails before the
    // gateway answers (it waits one scheduling round for a first frame), else a cut body.
    let bad = tokio::time::timeout(
        Duration::from_secs(5),
        http1(gw.addr("main")).await.send(get("/bad-chunk")),
    )
    .await
    .expect("no hang");
    if let Ok(res) = bad {
        assert_eq!(res.status(), 502, "{res:?}");
    }
    let s = &upstream(&gw).targets.snapshot()[0];
    assert_eq!(s.failures, 4);
    assert_eq!(c.get("/").await.text(), "fine");
}
