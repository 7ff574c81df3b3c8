//! Requests coalesced on another one's fetch stream its answer as it arrives: a backend sends
//! an answer's head and the first part of its body, then holds the rest; requests arriving
//! meanwhile get that first part at once (framed by `Content-Length` or chunked), and the rest
//! when the backend sends it, from the one request the backend got, over HTTP/1.1 and HTTP/2.
//! A leading client that leaves midway cuts no one off: the answer is read to its end and
//! stored.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::{TestGateway, counter_value};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const FIRST: &str = "the first part of the body|";
const SECOND: &str = "and the second part";

/// A backend that answers the head and [`FIRST`], then [`SECOND`] once `release` is `true`;
/// it counts the requests it got.
async fn holding_backend() -> (SocketAddr, Arc<AtomicUsize>, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let (release, released) = watch::channel(false);
    let counted = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counted = counted.clone();
            let mut released = released.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let chunked = head.starts_with(b"GET /chunked");
                let (start, rest) = if chunked {
                    (
                        format!(
                            "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n\
                             Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
                             {:x}\r\n{FIRST}\r\n",
                            FIRST.len()
                        ),
                        format!("{:x}\r\n{SECOND}\r\n0\r\n\r\n", SECOND.len()),
                    )
                } else {
                    (
                        format!(
                            "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n\
                             Content-Length: {}\r\nConnection: close\r\n\r\n{FIRST}",
                            FIRST.len() + SECOND.len()
                        ),
                        SECOND.to_owned(),
                    )
                };
                if s.write_all(start.as_bytes()).await.is_err() {
                    return;
                }
                let _ = released.wait_for(|r| *r).await;
                let _ = s.write_all(rest.as_bytes()).await;
            });
        }
    });
    (addr, requests, release)
}

async fn start() -> (TestGateway, Arc<AtomicUsize>, watch::Sender<bool>) {
    let (backend, requests, release) = holding_backend().await;
    let yaml = crate::cors::with_app(
        backend,
        r#"caches:
  main: { memory: 1MiB }
routes:
  - name: cached
    match: { path_prefix: / }
    filters:
      - cache: { store: main, coalesce_timeout: 30s }
    proxy: { upstream: app }
"#,
    );
    (TestGateway::start(&yaml).await, requests, release)
}

/// A client that has sent `GET path` and reads what comes back.
struct Reader {
    tcp: TcpStream,
    got: Vec<u8>,
}

impl Reader {
    async fn get(addr: SocketAddr, path: &str) -> Self {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: cached.test\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.unwrap();
        Self {
            tcp,
            got: Vec::new(),
        }
    }

    /// Reads until `text` has come (at most 10 s).
    async fn until(&mut self, text: &str) {
        let wait = async {
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&self.got).contains(text) {
                let n = self.tcp.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before {text:?}: {:?}", self.text());
                self.got.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("no {text:?} in 10 s: {:?}", self.text()));
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.got).to_lowercase()
    }
}

/// An HTTP/2 (prior knowledge) `GET path`, its response's body still to read.
async fn h2_get(addr: SocketAddr, path: &str) -> http::Response<Incoming> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(format!("http://cached.test{path}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    sender.send_request(req).await.unwrap()
}

/// Reads `body` until `text` has come (at most 10 s); what came.
async fn h2_until(body: &mut Incoming, got: &mut Vec<u8>, text: &str) {
    let wait = async {
        while !String::from_utf8_lossy(got).contains(text) {
            let frame = body.frame().await.expect("more body").unwrap();
            if let Ok(data) = frame.into_data() {
                got.extend_from_slice(&data);
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("no {text:?} in 10 s over HTTP/2"));
}

#[tokio::test]
async fn waiters_stream_the_answer_as_it_arrives() {
    for path in ["/length", "/chunked"] {
        let (gw, requests, release) = start().await;
        let addr = gw.addr("main");
        let mut leader = Reader::get(addr, path).await;
        leader.until(FIRST).await;
        // The backend holds the rest: the waiters get the first part from the leader's fetch.
        let mut waiters = Vec::new();
        for _ in 0..20 {
            waiters.push(Reader::get(addr, path).await);
        }
        let mut h2 = h2_get(addr, path).await;
        let status = h2.headers()["cache-status"].to_str().unwrap().to_owned();
        assert!(status.ends_with("; detail=coalesced"), "{path}: {status}");
        let mut h2_got = Vec::new();
        h2_until(h2.body_mut(), &mut h2_got, FIRST).await;
        for w in &mut waiters {
            w.until(FIRST).await;
            assert!(!w.text().contains(SECOND), "{path}: the rest is held");
            assert!(
                w.text().contains("cache-status: gateway; hit; ttl=")
                    && w.text().contains("; detail=coalesced"),
                "{path}: {}",
                w.text()
            );
            if path == "/chunked" {
                assert!(w.text().contains("transfer-encoding: chunked"), "{path}");
            } else {
                let length = FIRST.len() + SECOND.len();
                assert!(w.text().contains(&format!("content-length: {length}")));
            }
        }
        release.send_replace(true);
        h2_until(h2.body_mut(), &mut h2_got, SECOND).await;
        assert_eq!(String::from_utf8_lossy(&h2_got), format!("{FIRST}{SECOND}"));
        assert!(h2.body_mut().frame().await.is_none_or(|f| f.is_ok()));
        leader.until(SECOND).await;
        for w in &mut waiters {
            w.until(SECOND).await;
            if path == "/chunked" {
                w.until("\r\n0\r\n\r\n").await;
            }
        }
        assert_eq!(requests.load(Ordering::SeqCst), 1, "{path}");
        let hits = "gateway_cache_hits_total{cache=\"main\",tier=\"memory\"}";
        assert_eq!(counter_value(&gw, hits).await, 21, "{path}");
        // Stored whole: a later request is an ordinary hit.
        let mut later = Reader::get(addr, path).await;
        later.until(SECOND).await;
        assert!(later.text().contains("cache-status: gateway; hit; ttl="));
        assert!(!later.text().contains("coalesced"));
        assert_eq!(requests.load(Ordering::SeqCst), 1, "{path}");
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn a_leading_client_that_leaves_cuts_no_waiter_off() {
    let (gw, requests, release) = start().await;
    let addr = gw.addr("main");
    let mut leader = Reader::get(addr, "/length").await;
    leader.until(FIRST).await;
    let mut waiters = Vec::new();
    for _ in 0..5 {
        waiters.push(Reader::get(addr, "/length").await);
    }
    for w in &mut waiters {
        w.until(FIRST).await;
    }
    drop(leader);
    // Time for the gateway to notice the leader's client gone.
    tokio::time::sleep(Duration::from_millis(200)).await;
    release.send_replace(true);
    for w in &mut waiters {
        w.until(SECOND).await;
    }
    let mut later = Reader::get(addr, "/length").await;
    later.until(SECOND).await;
    assert!(later.text().contains("cache-status: gateway; hit; ttl="));
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    gw.shutdown().await;
}
