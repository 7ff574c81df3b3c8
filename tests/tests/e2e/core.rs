//! HTTP core end to end: respond, routing, the headers filter, keep-alive, h2c, limits and
//! malformed requests, timeouts, graceful drain.

use std::time::Duration;

use bytes::Bytes;
use gateway_tests::{TestGateway, http1, http2c, raw, raw_status, raw_with_timeout};
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTES: &str = r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
  - name: other
    bind: 127.0.0.1:0
    protocols: [http1]
routes:
  - name: only-other
    listeners: [other]
    match: { path: /which }
    respond: { body: "other" }
  - name: hello
    match: { path: /hello }
    respond: { status: 200, body: "Hello, world!", headers: { content-type: text/plain } }
  - name: api-host
    match: { host: api.example.com, path_prefix: /users }
    respond: { body: "api" }
  - name: wildcard
    match: { host: "*.example.com" }
    respond: { body: "wildcard" }
  - name: versioned
    match: { path_regex: "^/v[0-9]+/" }
    respond: { body: "versioned" }
  - name: post-only
    match: { path: /submit, methods: [POST] }
    respond: { status: 201, body: "created" }
  - name: canary
    match: { path: /which, headers: { x-canary: "true" } }
    respond: { body: "canary" }
  - name: which
    match: { path: /which }
    filters:
      - headers: { request_set: { x-env: prod }, response_set: { x-served-by: edge }, response_remove: [server], response_add: { x-extra: "1" } }
    respond: { body: "main", headers: { x-extra: "0" } }
  - name: teapot
    match: { path_prefix: /tea }
    respond: { status: 418, body: "short and stout" }
"#;

fn get(path: &str, host: &str) -> Request<Full<Bytes>> {
    Request::get(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test]
async fn respond_over_http1_and_h2c_with_keep_alive() {
    let gw = TestGateway::start(ROUTES).await;
    let addr = gw.addr("main");
    let mut c = http1(addr).await;
    for _ in 0..3 {
        // Three requests on one connection: keep-alive works.
        let res = c.get("/hello").await;
        assert_eq!(res.status(), 200);
        assert_eq!(res.text(), "Hello, world!");
        assert_eq!(res.header("content-type"), "text/plain");
        assert_eq!(res.header("content-length"), "13");
    }
    let mut h2 = http2c(addr).await;
    let res = h2.get("/hello").await;
    assert_eq!(res.head.version, http::Version::HTTP_2);
    assert_eq!(res.text(), "Hello, world!");
}

/// A client connection whose first write sends one byte, and the rest 50 ms later: the
/// gateway's first read sees a single byte.
struct OneByteFirst {
    tcp: tokio::net::TcpStream,
    first_sent: bool,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl OneByteFirst {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        Self {
            tcp,
            first_sent: false,
            pause: None,
        }
    }
}

impl tokio::io::AsyncRead for OneByteFirst {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for OneByteFirst {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if !this.first_sent && !buf.is_empty() {
            let n = std::task::ready!(std::pin::Pin::new(&mut this.tcp).poll_write(cx, &buf[..1]))?;
            this.first_sent = true;
            this.pause = Some(Box::pin(tokio::time::sleep(Duration::from_millis(50))));
            return std::task::Poll::Ready(Ok(n));
        }
        if let Some(pause) = &mut this.pause {
            std::task::ready!(pause.as_mut().poll(cx));
            this.pause = None;
        }
        std::pin::Pin::new(&mut this.tcp).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl OneByteFirst {
    /// Sends `request` (which asks for the connection to close) and reads to the end.
    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut io = Self::connect(addr).await;
        io.write_all(request).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(5), io.read_to_string(&mut out))
            .await
            .expect("answered")
            .unwrap();
        out
    }
}

#[tokio::test]
async fn the_first_bytes_choose_the_protocol_also_when_they_arrive_one_at_a_time() {
    let gw = TestGateway::start(ROUTES).await;
    let addr = gw.addr("main");
    // `P`: an h2c preface or a `POST`; the gateway waits for more before it chooses.
    let post =
        b"POST /submit HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi";
    let out = OneByteFirst::exchange(addr, post).await;
    assert_eq!(raw_status(&out), 201, "{out}");
    assert!(out.ends_with("created"), "{out}");
    let mut h2 =
        gateway_tests::http2c_over(OneByteFirst::connect(addr).await, addr.to_string()).await;
    let res = h2.get("/hello").await;
    assert_eq!(res.head.version, http::Version::HTTP_2);
    assert_eq!(res.text(), "Hello, world!");
    // And a `GET`, whose first byte already rules HTTP/2 out, on the fast path.
    let get = b"GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let out = OneByteFirst::exchange(addr, get).await;
    assert_eq!(raw_status(&out), 200, "{out}");
    assert!(out.ends_with("Hello, world!"), "{out}");
}

#[tokio::test]
async fn head_has_length_but_no_body() {
    let gw = TestGateway::start(ROUTES).await;
    let mut c = http1(gw.addr("main")).await;
    let req = Request::head("/hello")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = c.send(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.header("content-length"), "13");
    assert!(res.body.is_empty());
}

#[tokio::test]
async fn router_matches_host_path_method_headers_first_match_wins() {
    let gw = TestGateway::start(ROUTES).await;
    let mut c = http1(gw.addr("main")).await;
    let text = |r: gateway_tests::TestResponse| (r.status(), r.text());
    assert_eq!(
        text(c.send(get("/users/7", "api.example.com")).await.unwrap()),
        (200, "api".into())
    );
    assert_eq!(
        text(
            c.send(get("/users/7", "API.Example.com:8080"))
                .await
                .unwrap()
        ),
        (200, "api".into())
    );
    // Segment-boundary prefix: /usersx is not under /users; the wildcard route takes it.
    assert_eq!(
        text(c.send(get("/usersx", "api.example.com")).await.unwrap()),
        (200, "wildcard".into())
    );
    assert_eq!(
        text(c.send(get("/anything", "a.b.example.com")).await.unwrap()),
        (200, "wildcard".into())
    );
    assert_eq!(
        text(c.send(get("/v2/items", "localhost")).await.unwrap()),
        (200, "versioned".into())
    );
    assert_eq!(
        c.send(get("/vx/items", "localhost"))
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        c.send(get("/submit", "localhost")).await.unwrap().status(),
        404
    );
    let post = Request::post("/submit")
        .header("host", "localhost")
        .body(Full::new(Bytes::from("x")))
        .unwrap();
    assert_eq!(text(c.send(post).await.unwrap()), (201, "created".into()));
    let canary = Request::get("/which")
        .header("host", "localhost")
        .header("x-canary", "true")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(text(c.send(canary).await.unwrap()), (200, "canary".into()));
    assert_eq!(
        text(c.send(get("/which", "localhost")).await.unwrap()),
        (200, "main".into())
    );
    assert_eq!(
        text(c.send(get("/tea/cup", "localhost")).await.unwrap()),
        (418, "short and stout".into())
    );
    assert_eq!(
        c.send(get("/nothing-here", "localhost"))
            .await
            .unwrap()
            .status(),
        404
    );

    // Routes can be restricted to listeners: the first route only applies to `other`.
    let mut o = http1(gw.addr("other")).await;
    assert_eq!(
        text(o.send(get("/which", "localhost")).await.unwrap()),
        (200, "other".into())
    );
}

#[tokio::test]
async fn headers_filter_edits_responses() {
    let gw = TestGateway::start(ROUTES).await;
    let mut c = http1(gw.addr("main")).await;
    let res = c.send(get("/which", "localhost")).await.unwrap();
    assert_eq!(res.header("x-served-by"), "edge");
    assert!(
        res.head.headers.get("server").is_none(),
        "server header removed"
    );
    let extra: Vec<_> = res.head.headers.get_all("x-extra").iter().collect();
    assert_eq!(extra, ["0", "1"]);
    // Without the filter the Server header is present.
    let res = c.send(get("/hello", "localhost")).await.unwrap();
    assert_eq!(res.header("server"), "gateway");
}

/// A filter without body hooks leaves the body's length known: the response keeps its
/// `Content-Length` instead of going out chunked.
#[tokio::test]
async fn a_filter_without_body_hooks_keeps_content_length() {
    let gw = TestGateway::start(ROUTES).await;
    let out = gateway_tests::raw(
        gw.addr("main"),
        b"GET /which HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .to_ascii_lowercase();
    assert!(out.contains("x-served-by: edge"), "{out}");
    assert!(out.contains("content-length: 4\r\n"), "{out}");
    assert!(!out.contains("transfer-encoding"), "{out}");
    assert!(out.ends_with("\r\n\r\nmain"), "{out}");
}

#[tokio::test]
async fn oversized_head_gets_431_and_long_uri_414() {
    let gw = TestGateway::start(&format!("{ROUTES}\n").replace(
        "  - name: main\n    bind: 127.0.0.1:0\n",
        "  - name: main\n    bind: 127.0.0.1:0\n    max_header_size: 8KiB\n    max_uri_length: 1KiB\n",
    ))
    .await;
    let addr = gw.addr("main");
    let big = "a".repeat(16 * 1024);
    let res = raw(
        addr,
        format!("GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(raw_status(&res), 431, "{res}");
    let long = "b".repeat(2000);
    let res = raw(
        addr,
        format!("GET /hello?{long} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(raw_status(&res), 414, "{res}");
}

#[tokio::test]
async fn malformed_requests_get_400_and_the_connection_closes() {
    let gw = TestGateway::start(ROUTES).await;
    let addr = gw.addr("main");
    let cases: &[&[u8]] = &[
        b"GARBAGE\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",
        b"GET /hello HTTP/9.9\r\nHost: x\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /he\x00llo HTTP/1.1\r\nHost: x\r\n\r\n",
    ];
    for case in cases {
        let res = raw(addr, case).await;
        let status = raw_status(&res);
        assert!(
            status == 400 || res.is_empty() && status == 0,
            "{:?} -> {res}",
            String::from_utf8_lossy(case)
        );
        if status == 400 {
            // The connection was closed afterwards: raw() returned before its 2 s quiet timeout
            // is checked indirectly by the response being complete.
            assert!(
                res.contains("connection: close")
                    || res.ends_with("\r\n\r\n")
                    || res.contains("content-length: 0"),
                "{res}"
            );
        }
    }
    // The gateway still serves afterwards.
    let mut c = http1(addr).await;
    assert_eq!(c.get("/hello").await.status(), 200);
}

#[tokio::test]
async fn slow_header_is_cut_by_header_read_timeout() {
    let gw = TestGateway::start(&ROUTES.replace(
        "  - name: main\n    bind: 127.0.0.1:0\n",
        "  - name: main\n    bind: 127.0.0.1:0\n    header_read_timeout: 300ms\n",
    ))
    .await;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr("main"))
        .await
        .unwrap();
    tcp.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await;
    let n = n.expect("closed before the test timeout").unwrap_or(0);
    assert!(n == 0 || String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"));
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(
        crate::faults::metric(
            &gw,
            "gateway_listener_header_timeouts_total{listener=\"main\"}"
        ),
        1,
        "the slow client is counted"
    );
}

#[tokio::test]
async fn idle_keep_alive_connection_is_closed_after_idle_timeout() {
    let gw = TestGateway::start(&ROUTES.replace(
        "  - name: main\n    bind: 127.0.0.1:0\n",
        "  - name: main\n    bind: 127.0.0.1:0\n    idle_timeout: 300ms\n",
    ))
    .await;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr("main"))
        .await
        .unwrap();
    tcp.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tcp.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let start = tokio::time::Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "the idle connection is closed");
    assert!(start.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn h2c_idle_connection_gets_goaway() {
    let gw = TestGateway::start(&ROUTES.replace(
        "  - name: main\n    bind: 127.0.0.1:0\n",
        "  - name: main\n    bind: 127.0.0.1:0\n    idle_timeout: 300ms\n",
    ))
    .await;
    let mut c = http2c(gw.addr("main")).await;
    assert_eq!(c.get("/hello").await.status(), 200);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let req = Request::get("/hello")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert!(
        c.send(req).await.is_err(),
        "the idle h2 connection was closed"
    );
}

#[tokio::test]
async fn connection_cap_refuses_extra_connections() {
    let gw = TestGateway::start(&ROUTES.replace(
        "  - name: main\n    bind: 127.0.0.1:0\n",
        "  - name: main\n    bind: 127.0.0.1:0\n    max_connections: 2\n",
    ))
    .await;
    let addr = gw.addr("main");
    let mut a = http1(addr).await;
    let mut b = http1(addr).await;
    assert_eq!(a.get("/hello").await.status(), 200);
    assert_eq!(b.get("/hello").await.status(), 200);
    let res = raw_with_timeout(
        addr,
        b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(res, "", "the third connection is closed without a response");
    drop(a);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut c = http1(addr).await;
    assert_eq!(c.get("/hello").await.status(), 200);
}

#[tokio::test]
async fn drain_finishes_in_flight_requests_and_stops_accepting() {
    let backend = gateway_tests::backend::Backend::start("slow").await;
    let yaml = format!(
        "listeners:\n  - name: main\n    bind: 127.0.0.1:0\nupstreams:\n  slow: {{ targets: [\"{}\"] }}\nroutes:\n  - match: {{ path_prefix: /slow }}\n    proxy: {{ upstream: slow }}\n",
        backend.addr()
    );
    let gw = TestGateway::start(&yaml).await;
    let addr = gw.addr("main");
    let mut c = http1(addr).await;
    let in_flight = tokio::spawn(async move { c.get("/slow/600").await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let started = tokio::time::Instant::now();
    gw.shutdown().await;
    // The drain waited for the request in flight, which completed normally.
    assert!(started.elapsed() >= Duration::from_millis(300));
    let res = in_flight.await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn routes_match_header_values_and_query_parameters_by_regular_expression() {
    let gw = TestGateway::start(
        r#"
listeners: [{ name: main, bind: 127.0.0.1:0 }]
routes:
  - name: beta
    match: { path_prefix: /app, header_regex: { X-Env: "^(beta|canary)$" }, query_regex: { v: '^2\.' } }
    respond: { body: "beta" }
  - name: app
    match: { path_prefix: /app }
    respond: { body: "app" }
"#,
    )
    .await;
    let addr = gw.addr("main");
    let req = |path: &str, env: &[&str]| {
        let mut r = Request::get(path).header("host", "localhost");
        for e in env {
            r = r.header("x-env", *e);
        }
        r.body(Full::new(Bytes::new())).unwrap()
    };
    let cases: [(&str, &[&str], &str); 6] = [
        ("/app?v=2.1", &["beta"], "beta"),
        ("/app?a=1&v=2.0", &["stable", "canary"], "beta"),
        ("/app?v=2.1", &["beta-x"], "app"),
        ("/app?v=3.0", &["beta"], "app"),
        ("/app?v=2.1", &[], "app"),
        ("/app", &["beta"], "app"),
    ];
    for h2 in [false, true] {
        let mut c = if h2 {
            http2c(addr).await
        } else {
            http1(addr).await
        };
        for (path, env, want) in cases {
            let res = c.send(req(path, env)).await.unwrap();
            assert_eq!(res.text(), want, "{path} {env:?} (h2: {h2})");
        }
    }
}
