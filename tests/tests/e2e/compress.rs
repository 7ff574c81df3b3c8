//! The `compress` filter end to end, over HTTP/1.1 and HTTP/2, with a real backend: each
//! coding decoded by the test equals the original (proxied and `respond` answers), the
//! client's weights and the server's order pick the coding, the skip cases go through as they
//! were, a streamed answer arrives decodable chunk by chunk before the backend ends it, and the
//! counters.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::{TestGateway, TestResponse, counter_value, http1, http2c};
use http::{Method, Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

type Body = BoxBody<Bytes, Infallible>;

fn text() -> Vec<u8> {
    (0..300)
        .flat_map(|i| {
            format!("line {i}: a compressible answer, as JSON or HTML would be\n").into_bytes()
        })
        .collect()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// The backend: fixed answers by path; `/events` sends one event, then the second when
/// `release` is notified.
async fn backend(release: Arc<Notify>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let release = release.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let release = release.clone();
                    async move { Ok::<_, Infallible>(answer(req.uri().path(), release)) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn answer(path: &str, release: Arc<Notify>) -> Response<Body> {
    let r = Response::builder();
    let plain = "text/plain; charset=utf-8";
    match path {
        "/text" => r
            .header("content-type", plain)
            .header("etag", "\"v1\"")
            .body(full(text())),
        "/small" => r.header("content-type", plain).body(full(vec![b'a'; 100])),
        "/png" => r.header("content-type", "image/png").body(full(text())),
        "/encoded" => r
            .header("content-type", plain)
            .header("content-encoding", "gzip")
            .body(full(gzip(&text()))),
        "/range" => r
            .status(206)
            .header("content-type", plain)
            .header(
                "content-range",
                format!("bytes 0-{}/99999", text().len() - 1),
            )
            .body(full(text())),
        "/no-transform" => r
            .header("content-type", plain)
            .header("cache-control", "public, no-transform")
            .body(full(text())),
        "/events" => {
            let events = futures_util::stream::unfold(0, move |n| {
                let release = release.clone();
                async move {
                    match n {
                        0 => Some((Ok(Frame::data(Bytes::from_static(b"data: one\n\n"))), 1)),
                        1 => {
                            release.notified().await;
                            Some((Ok(Frame::data(Bytes::from_static(b"data: two\n\n"))), 2))
                        }
                        _ => None,
                    }
                }
            });
            r.header("content-type", "text/event-stream")
                .body(StreamBody::new(events).boxed())
        }
        _ => r.status(404).body(full("")),
    }
    .unwrap()
}

fn config(backend: SocketAddr) -> String {
    let body = "respond body, repeated; ".repeat(20);
    crate::cors::with_app(
        backend,
        &format!(
            r#"routes:
  - name: c
    match: {{ path_prefix: /c/ }}
    filters:
      - compress: {{}}
    proxy: {{ upstream: app, strip_prefix: /c }}
  - name: r
    match: {{ path: /r }}
    filters:
      - compress: {{ algorithms: [gzip, br], min_size: 0 }}
    respond: {{ body: "{body}", headers: {{ content-type: text/html }} }}
"#
        ),
    )
}

/// A decoder fed as bytes arrive; what it produced so far is readable after each chunk.
enum Decoder {
    Gzip(Box<flate2::write::GzDecoder<Vec<u8>>>),
    Br(Box<brotli::DecompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
}

impl Decoder {
    fn new(coding: &str) -> Self {
        match coding {
            "gzip" => Self::Gzip(Box::new(flate2::write::GzDecoder::new(Vec::new()))),
            "br" => Self::Br(Box::new(brotli::DecompressorWriter::new(Vec::new(), 4096))),
            "zstd" => Self::Zstd(zstd::stream::write::Decoder::new(Vec::new()).unwrap()),
            other => panic!("unexpected coding `{other}`"),
        }
    }

    fn feed(&mut self, data: &[u8]) -> &[u8] {
        match self {
            Self::Gzip(d) => {
                d.write_all(data).unwrap();
                d.flush().unwrap();
                d.get_ref()
            }
            Self::Br(d) => {
                d.write_all(data).unwrap();
                d.flush().unwrap();
                d.get_ref()
            }
            Self::Zstd(d) => {
                d.write_all(data).unwrap();
                d.flush().unwrap();
                d.get_ref()
            }
        }
    }
}

fn decode(r: &TestResponse) -> Vec<u8> {
    Decoder::new(r.header("content-encoding"))
        .feed(&r.body)
        .to_vec()
}

fn get(path: &str, accept: &str, method: Method) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(path);
    if !accept.is_empty() {
        b = b.header("accept-encoding", accept);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

#[tokio::test]
async fn each_coding_decodes_to_the_original() {
    let addr = backend(Arc::new(Notify::new())).await;
    let gw = TestGateway::start(&config(addr)).await;
    let clients = [http1(gw.addr("main")).await, http2c(gw.addr("main")).await];
    for mut c in clients {
        for (accept, coding) in [
            ("zstd", "zstd"),
            ("br", "br"),
            ("gzip", "gzip"),
            ("gzip, deflate, br, zstd", "zstd"),
            ("zstd;q=0.5, br;q=0.9, gzip;q=0.9", "br"),
            ("zstd;q=0, *;q=0.1", "br"),
        ] {
            let r = c.send(get("/c/text", accept, Method::GET)).await.unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(r.header("content-encoding"), coding, "{accept}");
            assert_eq!(r.header("etag"), "W/\"v1\"");
            assert_eq!(r.header("vary"), "Accept-Encoding");
            assert!(r.body.len() < text().len() / 3);
            assert_eq!(decode(&r), text(), "{accept}");
            if let Some(n) = r.head.headers.get("content-length") {
                // hyper states the length of the whole compressed body it sends.
                assert_eq!(n.to_str().unwrap(), r.body.len().to_string());
            }
        }
        let r = c.send(get("/r", "zstd, br", Method::GET)).await.unwrap();
        assert_eq!(r.header("content-encoding"), "br");
        assert_eq!(decode(&r), "respond body, repeated; ".repeat(20).as_bytes());
    }
    let series = |name, alg| format!("gateway_compress_{name}{{route=\"c\",algorithm=\"{alg}\"}}");
    assert_eq!(
        counter_value(&gw, &series("responses_total", "zstd")).await,
        4
    );
    let into = counter_value(&gw, &series("in_bytes_total", "br")).await;
    let out = counter_value(&gw, &series("out_bytes_total", "br")).await;
    assert_eq!(into, 6 * text().len() as u64);
    assert!(out > 0 && out < into / 3, "{out} of {into}");
}

#[tokio::test]
async fn answers_that_must_not_change_go_as_they_are() {
    let addr = backend(Arc::new(Notify::new())).await;
    let gw = TestGateway::start(&config(addr)).await;
    let clients = [http1(gw.addr("main")).await, http2c(gw.addr("main")).await];
    let all = "zstd, br, gzip";
    for mut c in clients {
        for (path, accept, method, reason) in [
            ("/c/small", all, Method::GET, "size"),
            ("/c/png", all, Method::GET, "type"),
            ("/c/encoded", all, Method::GET, "encoded"),
            ("/c/range", all, Method::GET, "range"),
            ("/c/no-transform", all, Method::GET, "no_transform"),
            ("/c/text", all, Method::HEAD, "head"),
            ("/c/text", "identity", Method::GET, "not_accepted"),
            (
                "/c/text",
                "gzip;q=0, br;q=0, zstd;q=0",
                Method::GET,
                "not_accepted",
            ),
            ("/c/text", "", Method::GET, "not_accepted"),
        ] {
            let r = c.send(get(path, accept, method.clone())).await.unwrap();
            let what = format!("{method} {path} {accept:?}");
            match path {
                "/c/encoded" => {
                    assert_eq!(r.header("content-encoding"), "gzip", "{what}");
                    assert_eq!(decode(&r), text(), "{what}");
                }
                _ => assert_eq!(r.header("content-encoding"), "", "{what}"),
            }
            let expect = match path {
                "/c/small" => vec![b'a'; 100],
                _ if method == Method::HEAD => Vec::new(),
                "/c/encoded" => gzip(&text()),
                _ => text(),
            };
            assert_eq!(r.body, expect, "{what}");
            // Only an answer another client could get compressed varies on the header.
            let varies = matches!(reason, "head" | "not_accepted");
            assert_eq!(r.header("vary") == "Accept-Encoding", varies, "{what}");
            let series =
                format!("gateway_compress_skipped_total{{route=\"c\",reason=\"{reason}\"}}");
            assert!(counter_value(&gw, &series).await > 0, "{what}");
        }
    }
}

/// Sends `GET path` on a fresh connection and hands back the streaming response.
async fn stream_get(addr: SocketAddr, h2: bool, path: &str, accept: &str) -> Response<Incoming> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let req = Request::get(format!("http://{addr}{path}"))
        .header("host", addr.to_string())
        .header("accept-encoding", accept)
        .body(Full::new(Bytes::new()))
        .unwrap();
    if h2 {
        let (mut s, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        tokio::spawn(conn);
        s.send_request(req).await.unwrap()
    } else {
        let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut req = req;
        *req.uri_mut() = path.parse().unwrap();
        s.send_request(req).await.unwrap()
    }
}

#[tokio::test]
async fn a_streamed_answer_arrives_chunk_by_chunk() {
    let release = Arc::new(Notify::new());
    let addr = backend(release.clone()).await;
    let gw = TestGateway::start(&config(addr)).await;
    for h2 in [false, true] {
        for coding in ["gzip", "br", "zstd"] {
            let res = stream_get(gw.addr("main"), h2, "/c/events", coding).await;
            assert_eq!(res.headers()["content-encoding"], coding);
            let mut body = res.into_body();
            let mut decoder = Decoder::new(coding);
            // The first event decodes while the backend still holds the second.
            let first = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    let frame = body.frame().await.expect("frame").expect("data");
                    if let Ok(data) = frame.into_data()
                        && decoder.feed(&data) == b"data: one\n\n"
                    {
                        break;
                    }
                }
            })
            .await;
            assert!(first.is_ok(), "h2={h2} {coding}: the first event stalled");
            release.notify_one();
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.unwrap().into_data() {
                    decoder.feed(&data);
                }
            }
            assert_eq!(
                decoder.feed(b""),
                b"data: one\n\ndata: two\n\n",
                "h2={h2} {coding}"
            );
        }
    }
}

#[tokio::test]
async fn static_answers_are_compressed_once() {
    let dir = gateway_tests::temp_dir();
    gateway_tests::write_file(dir.path(), "public/plain/a.txt", text());
    gateway_tests::write_file(dir.path(), "public/own/a.txt", text());
    let yaml = r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
routes:
  - name: plain
    match: { path_prefix: /plain }
    filters: [ { compress: {} } ]
    static: { root: public, compress: [] }
  - name: own
    match: { path_prefix: /own }
    filters: [ { compress: { algorithms: [gzip] } } ]
    static: { root: public }
"#;
    let gw = TestGateway::start_in(dir, yaml).await;
    for mut c in [http1(gw.addr("main")).await, http2c(gw.addr("main")).await] {
        // The terminal serves identity: the filter compresses.
        let r = c
            .send(get("/plain/a.txt", "zstd", Method::GET))
            .await
            .unwrap();
        assert_eq!(r.header("content-encoding"), "zstd");
        assert_eq!(decode(&r), text());
        // The terminal compressed (with its own choice): the filter leaves it alone.
        let r = c.send(get("/own/a.txt", "br", Method::GET)).await.unwrap();
        assert_eq!(r.header("content-encoding"), "br");
        assert_eq!(decode(&r), text());
    }
}
