//! The `forward_auth` filter end to end, with a real authentication service started here and a
//! real backend, over HTTP/1.1 and h2c: an allowed request goes on with the service's headers
//! (the client's forged copies removed), a refusal reaches the client as the service wrote it,
//! the service hanging gets 504 and the service down 503, each counted; the auth request
//! carries the copied headers and the X-Forwarded-* description, and reuses its connection.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::backend::{Backend, Seen};
use gateway_tests::{
    Client, TestCa, TestGateway, TestResponse, counter_value, fast_path_chain_count, http1, http2c,
    raw_target, refusing_addr, temp_dir, write_file,
};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// An auth service deciding by the `Authorization` it is sent: `Bearer good` → 200 with
/// `x-user-id: alice`; `Bearer slow` → no answer for 10 s; `Bearer busy` → its own 503;
/// `Bearer huge` → 403 with a 100 KiB body; anything else → 401 with a challenge, a reason
/// header and a body.
struct AuthService {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
}

impl AuthService {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (log, count) = (seen.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Relaxed);
                let log = log.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let log = log.clone();
                        async move { Ok::<_, Infallible>(decide(&log, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            seen,
            connections,
        }
    }

    fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a request")
    }
}

async fn decide(log: &Mutex<Vec<Seen>>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    log.lock().unwrap().push(Seen {
        method: req.method().clone(),
        uri: req.uri().clone(),
        version: req.version(),
        headers: req.headers().clone(),
    });
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let res = match auth {
        "Bearer good" => Response::builder()
            .header("x-user-id", "alice")
            .header("x-other", "not copied")
            .body(Full::new(Bytes::from_static(b"ok"))),
        "Bearer slow" => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Response::builder().body(Full::new(Bytes::new()))
        }
        "Bearer huge" => Response::builder()
            .status(403)
            .header("x-reason", "too much")
            .body(Full::new(Bytes::from(vec![b'x'; 100 * 1024]))),
        "Bearer busy" => Response::builder()
            .status(503)
            .body(Full::new(Bytes::from_static(b"auth says busy"))),
        _ => Response::builder()
            .status(401)
            .header("www-authenticate", r#"Bearer realm="app""#)
            .header("x-reason", "no token")
            .body(Full::new(Bytes::from_static(b"login first"))),
    };
    res.unwrap()
}

fn config(auth: &AuthService, backend: &Backend) -> String {
    let (auth, app, dead) = (auth.addr, backend.addr(), refusing_addr());
    format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
listeners:
  - name: main
    bind: 127.0.0.1:0
    protocols: [http1, http2]
upstreams:
  app: {{ targets: [{app}] }}
  auth: {{ targets: [{auth}] }}
  dead: {{ targets: [{dead}] }}
routes:
  - name: by-url
    match: {{ path_prefix: /url }}
    filters:
      - forward_auth: {{ url: "http://{auth}/verify?from=url", request_headers: [authorization, cookie],
                         response_headers: [x-user-id, x-absent], timeout: 500ms }}
    proxy: {{ upstream: app }}
  - name: by-upstream
    match: {{ path_prefix: /up }}
    filters:
      - forward_auth: {{ upstream: auth, path: /check, request_headers: [authorization],
                         response_headers: [x-user-id], timeout: 500ms }}
    proxy: {{ upstream: app }}
  - name: url-down
    match: {{ path_prefix: /url-down }}
    filters:
      - forward_auth: {{ url: "http://{dead}/verify" }}
    proxy: {{ upstream: app }}
  - name: upstream-down
    match: {{ path_prefix: /upstream-down }}
    filters:
      - forward_auth: {{ upstream: dead }}
    proxy: {{ upstream: app }}
"#
    )
}

async fn send(c: &mut Client, method: &str, path: &str, token: &str) -> TestResponse {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {token}"))
        .header("cookie", "session=s1")
        .header("x-user-id", "admin")
        .header("x-absent", "forged")
        .body(Full::new(Bytes::new()))
        .unwrap();
    c.send(req).await.unwrap()
}

fn series(route: &str, result: &str) -> String {
    format!("gateway_forward_auth_requests_total{{route=\"{route}\",result=\"{result}\"}}")
}

async fn clients(gw: &TestGateway) -> [(&'static str, Client); 2] {
    [
        ("h1", http1(gw.addr("main")).await),
        ("h2", http2c(gw.addr("main")).await),
    ]
}

#[tokio::test]
async fn allowed_requests_go_on_with_the_services_headers_and_forgeries_removed() {
    let (auth, backend) = (AuthService::start().await, Backend::start("app").await);
    let gw = TestGateway::start(&config(&auth, &backend)).await;
    for (proto, mut c) in clients(&gw).await {
        let res = send(&mut c, "DELETE", "/url/items/7?force=1", "good").await;
        assert_eq!(res.status(), 200, "{proto}");
        let seen = backend.last().unwrap();
        let users: Vec<_> = seen.headers.get_all("x-user-id").iter().collect();
        assert_eq!(users, ["alice"], "{proto}: only the service's value");
        assert_eq!(seen.header("x-absent"), "", "{proto}: forged copy removed");
        assert_eq!(
            seen.header("x-other"),
            "",
            "{proto}: not listed, not copied"
        );
        assert_eq!(seen.method, "DELETE");

        let asked = auth.last();
        assert_eq!(asked.method, "GET", "{proto}");
        assert_eq!(asked.uri, "/verify?from=url");
        assert_eq!(asked.header("authorization"), "Bearer good");
        assert_eq!(asked.header("cookie"), "session=s1");
        assert_eq!(
            asked.header("x-user-id"),
            "",
            "{proto}: not sent to the service"
        );
        assert_eq!(asked.header("x-forwarded-method"), "DELETE");
        assert_eq!(asked.header("x-forwarded-uri"), "/url/items/7?force=1");
        assert_eq!(asked.header("x-forwarded-proto"), "http");
        assert_eq!(
            asked.header("x-forwarded-host"),
            gw.addr("main").to_string()
        );
        assert_eq!(asked.header("x-forwarded-for"), "127.0.0.1");

        let res = send(&mut c, "GET", "/up/x", "good").await;
        assert_eq!(res.status(), 200, "{proto}");
        assert_eq!(auth.last().uri, "/check");
        assert_eq!(
            auth.last().header("cookie"),
            "",
            "not listed for this route"
        );
    }
    assert_eq!(counter_value(&gw, &series("by-url", "allowed")).await, 2);
    assert_eq!(
        counter_value(&gw, &series("by-upstream", "allowed")).await,
        2
    );
}

#[tokio::test]
async fn refusals_reach_the_client_as_the_service_wrote_them() {
    let (auth, backend) = (AuthService::start().await, Backend::start("app").await);
    let gw = TestGateway::start(&config(&auth, &backend)).await;
    for (proto, mut c) in clients(&gw).await {
        for path in ["/url/a", "/up/a"] {
            let res = send(&mut c, "GET", path, "bad").await;
            assert_eq!(res.status(), 401, "{proto} {path}");
            assert_eq!(res.header("www-authenticate"), r#"Bearer realm="app""#);
            assert_eq!(res.header("x-reason"), "no token");
            assert_eq!(res.text(), "login first");
            // The service's own 503 is its answer, not the service being down.
            let res = send(&mut c, "GET", path, "busy").await;
            assert_eq!((res.status(), res.text().as_str()), (503, "auth says busy"));
            // A body past the bound is dropped; the status and headers still go.
            let res = send(&mut c, "GET", path, "huge").await;
            assert_eq!((res.status(), res.body.len()), (403, 0), "{proto} {path}");
            assert_eq!(res.header("x-reason"), "too much");
        }
    }
    assert_eq!(backend.requests(), 0);
    assert_eq!(counter_value(&gw, &series("by-url", "denied")).await, 6);
    assert_eq!(
        counter_value(&gw, &series("by-upstream", "denied")).await,
        6
    );
    assert!(
        fast_path_chain_count(&gw, "main").await >= 6,
        "HTTP/1.1 went by the fast path"
    );
}

#[tokio::test]
async fn a_hanging_service_gets_504_and_a_dead_one_503() {
    let (auth, backend) = (AuthService::start().await, Backend::start("app").await);
    let gw = TestGateway::start(&config(&auth, &backend)).await;
    for (proto, mut c) in clients(&gw).await {
        for path in ["/url/a", "/up/a"] {
            let start = tokio::time::Instant::now();
            let res = send(&mut c, "GET", path, "slow").await;
            assert_eq!(res.status(), 504, "{proto} {path}");
            assert!(start.elapsed() < Duration::from_secs(3), "{proto} {path}");
        }
        for path in ["/url-down/a", "/upstream-down/a"] {
            let res = send(&mut c, "GET", path, "good").await;
            assert_eq!(res.status(), 503, "{proto} {path}");
        }
    }
    assert_eq!(backend.requests(), 0);
    assert_eq!(counter_value(&gw, &series("by-url", "timeout")).await, 2);
    assert_eq!(
        counter_value(&gw, &series("by-upstream", "timeout")).await,
        2
    );
    assert_eq!(
        counter_value(&gw, &series("url-down", "unavailable")).await,
        2
    );
    assert_eq!(
        counter_value(&gw, &series("upstream-down", "unavailable")).await,
        2
    );
}

#[tokio::test]
async fn auth_requests_reuse_their_connection() {
    let (auth, backend) = (AuthService::start().await, Backend::start("app").await);
    let gw = TestGateway::start(&config(&auth, &backend)).await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..5 {
        assert_eq!(send(&mut c, "GET", "/url/a", "good").await.status(), 200);
        assert_eq!(send(&mut c, "GET", "/url/a", "bad").await.status(), 401);
    }
    assert_eq!(auth.connections.load(Relaxed), 1);
}

#[tokio::test]
async fn https_services_are_verified() {
    let ca = TestCa::new();
    let tls_service = Backend::start_tls("auth", &ca).await;
    let backend = Backend::start("app").await;
    let dir = temp_dir();
    write_file(dir.path(), "ca.pem", &ca.pem);
    let (svc, app) = (tls_service.addr(), backend.addr());
    let yaml = format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app: {{ targets: [{app}] }}
  auth: {{ targets: [{svc}], tls: {{ ca: ca.pem, server_name: localhost }} }}
routes:
  - match: {{ path_prefix: /trusted }}
    filters: [ {{ forward_auth: {{ upstream: auth, path: /allowed }} }} ]
    proxy: {{ upstream: app }}
  - match: {{ path_prefix: /refused }}
    filters: [ {{ forward_auth: {{ upstream: auth, path: /status/403 }} }} ]
    proxy: {{ upstream: app }}
  - match: {{ path_prefix: /unknown-ca }}
    filters: [ {{ forward_auth: {{ url: "https://{svc}/allowed" }} }} ]
    proxy: {{ upstream: app }}
"#
    );
    let gw = TestGateway::start_in(dir, &yaml).await;
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/trusted").await.status(), 200);
    assert_eq!(tls_service.last().unwrap().uri.path(), "/allowed");
    assert_eq!(c.get("/refused").await.status(), 403);
    // The URL form verifies against the public roots, which do not know the test CA.
    assert_eq!(c.get("/unknown-ca").await.status(), 503);
    assert_eq!(backend.requests(), 1);
}

#[tokio::test]
async fn a_hostile_service_fails_closed() {
    let backend = Backend::start("app").await;
    let switching = raw_target(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
    )
    .await;
    let garbage = raw_target(b"not HTTP at all\r\n\r\n").await;
    let cut = raw_target(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc").await;
    let app = backend.addr();
    let yaml = format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app: {{ targets: [{app}] }}
routes:
  - match: {{ path_prefix: /switching }}
    filters: [ {{ forward_auth: {{ url: "http://{switching}/", timeout: 1s }} }} ]
    proxy: {{ upstream: app }}
  - match: {{ path_prefix: /garbage }}
    filters: [ {{ forward_auth: {{ url: "http://{garbage}/", timeout: 1s }} }} ]
    proxy: {{ upstream: app }}
  - match: {{ path_prefix: /cut }}
    filters: [ {{ forward_auth: {{ url: "http://{cut}/", timeout: 1s }} }} ]
    proxy: {{ upstream: app }}
"#
    );
    let gw = TestGateway::start(&yaml).await;
    for path in ["/switching", "/garbage"] {
        let mut c = http1(gw.addr("main")).await;
        assert_eq!(c.get(path).await.status(), 503, "{path}");
        // The client's connection is still good.
        assert_eq!(c.get(path).await.status(), 503, "{path}");
    }
    // An allowing answer whose body breaks off is still an answer: the request goes on.
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/cut").await.status(), 200);
    assert_eq!(backend.requests(), 1);
}
