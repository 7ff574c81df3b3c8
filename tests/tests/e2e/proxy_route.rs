//! A proxy route's own settings end to end, over HTTP/1.1 and h2c: `split` across real backends
//! by weight (counts, metrics, the access log's `upstream`) and a split's `status` share, `mirror` (the shadow gets copies
//! with their bodies; a slow or dead shadow changes nothing for the client; the in-flight bound
//! holds and its drops are counted), and route-level `timeout` and `retries` over the
//! upstream's.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{Client, TestGateway, counter_value, http1, http2c, refusing_addr};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

fn gateway(upstreams: &str, routes: &str) -> String {
    format!(
        "admin: {{ bind: 127.0.0.1:0 }}\nlisteners:\n  - name: main\n    bind: 127.0.0.1:0\n    protocols: [http1, http2]\n\
         telemetry:\n  access_log: {{ path: access.log, format: json }}\n\
         upstreams:\n{upstreams}routes:\n{routes}"
    )
}

async fn tally(c: &mut Client, path: &str, n: usize) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for _ in 0..n {
        let r = c.get(path).await;
        assert_eq!(r.status(), 200);
        *out.entry(r.header("x-backend").to_owned()).or_default() += 1;
    }
    out
}

#[tokio::test]
async fn a_split_sends_each_upstream_its_weight_and_says_which_one_answered() {
    let (a, b, standby) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("standby").await,
    );
    let gw = TestGateway::start(&gateway(
        &format!(
            "  a: {{ targets: [{}] }}\n  b: {{ targets: [{}] }}\n  standby: {{ targets: [{}] }}\n",
            a.addr(),
            b.addr(),
            standby.addr()
        ),
        "  - name: canary\n    match: { path_prefix: / }\n    proxy:\n      split: [ { upstream: a, weight: 3 }, \
         { upstream: b, weight: 1 }, { upstream: standby, weight: 0 } ]\n",
    ))
    .await;
    // The fast path (HTTP/1.1 GETs): a pick per request from the precomputed cycle, exact.
    let mut c = http1(gw.addr("main")).await;
    let t = tally(&mut c, "/", 1000).await;
    assert_eq!(
        (t["a"], t["b"], t.get("standby")),
        (750, 250, None),
        "{t:?}"
    );
    // The general path (HTTP/2) walks the same cycle.
    let mut c = http2c(gw.addr("main")).await;
    let t = tally(&mut c, "/", 400).await;
    assert_eq!(
        (t["a"], t["b"], t.get("standby")),
        (300, 100, None),
        "{t:?}"
    );
    // A request with a body goes through the general path on HTTP/1.1 too.
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..4 {
        let req = Request::post("/upload").body(Full::new(Bytes::from_static(b"abc")));
        let r = c.send(req.unwrap()).await.unwrap();
        assert_eq!(r.text(), "3");
    }
    let picked =
        |u: &str| format!("gateway_split_requests_total{{route=\"canary\",upstream=\"{u}\"}}");
    assert_eq!(counter_value(&gw, &picked("a")).await, 1053);
    assert_eq!(counter_value(&gw, &picked("b")).await, 351);
    assert_eq!(counter_value(&gw, &picked("standby")).await, 0);
    assert_eq!(standby.requests(), 0);

    // Each access-log line names the upstream that answered, on both paths.
    let lines = access_lines(&gw, 1404).await;
    let mut by_upstream: HashMap<String, usize> = HashMap::new();
    for l in &lines {
        *by_upstream
            .entry(l["upstream"].as_str().expect("upstream").to_owned())
            .or_default() += 1;
    }
    assert_eq!((by_upstream["a"], by_upstream["b"]), (1053, 351));
}

#[tokio::test]
async fn a_split_entry_with_a_status_answers_its_share_itself() {
    let a = Backend::start("a").await;
    let gw = TestGateway::start(&gateway(
        &format!("  a: {{ targets: [{}] }}\n", a.addr()),
        "  - name: faulty\n    match: { path_prefix: / }\n    proxy:\n      split: [ { upstream: a, weight: 3 }, \
         { status: 503, weight: 1 } ]\n",
    ))
    .await;
    // HTTP/1.1 GETs (a split with a status share leaves the text forward) and HTTP/2 alike.
    for mut c in [http1(gw.addr("main")).await, http2c(gw.addr("main")).await] {
        let mut by_status: HashMap<u16, usize> = HashMap::new();
        for _ in 0..400 {
            let r = c.get("/x").await;
            if r.status() == 200 {
                assert_eq!(r.header("x-backend"), "a");
            } else {
                assert_eq!(r.text(), "503 Service Unavailable\n");
            }
            *by_status.entry(r.status()).or_default() += 1;
        }
        assert_eq!(
            (by_status[&200], by_status[&503]),
            (300, 100),
            "{by_status:?}"
        );
    }
    assert_eq!(a.requests(), 600);
    let picked = "gateway_split_requests_total{route=\"faulty\",upstream=\"status 503\"}";
    assert_eq!(counter_value(&gw, picked).await, 200);
}

async fn access_lines(gw: &TestGateway, n: usize) -> Vec<serde_json::Value> {
    let path = gw.dir().join("access.log");
    for _ in 0..200 {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= n {
            return text
                .lines()
                .map(|l| serde_json::from_str(l).expect("JSON"))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fewer than {n} access log lines");
}

/// A request as the shadow saw it, body included.
#[derive(Debug, Clone)]
struct Copied {
    method: String,
    path: String,
    host: String,
    forwarded_for: String,
    body: Bytes,
}

/// A shadow backend that records what it gets, waits `delay` before answering, and tracks how
/// many requests it holds at once.
struct Shadow {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Copied>>>,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Shadow {
    async fn start(delay: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let state = (seen.clone(), now.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let svc =
                        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                            let (seen, now, most) = state.clone();
                            async move {
                                let held = now.fetch_add(1, Relaxed) + 1;
                                most.fetch_max(held, Relaxed);
                                let (parts, body) = req.into_parts();
                                let body = body.collect().await.map(|b| b.to_bytes());
                                let header = |n: &str| {
                                    parts
                                        .headers
                                        .get(n)
                                        .and_then(|v| v.to_str().ok())
                                        .unwrap_or("")
                                        .to_owned()
                                };
                                let host = parts
                                    .uri
                                    .authority()
                                    .map(|a| a.to_string())
                                    .unwrap_or_else(|| header("host"));
                                seen.lock().unwrap().push(Copied {
                                    method: parts.method.to_string(),
                                    path: parts.uri.path().to_owned(),
                                    host,
                                    forwarded_for: header("x-forwarded-for"),
                                    body: body.unwrap_or_default(),
                                });
                                tokio::time::sleep(delay).await;
                                now.fetch_sub(1, Relaxed);
                                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                                    b"shadow answer",
                                ))))
                            }
                        });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            seen,
            now,
            most,
        }
    }

    fn seen(&self) -> Vec<Copied> {
        self.seen.lock().unwrap().clone()
    }

    async fn wait_for(&self, n: usize) -> Vec<Copied> {
        for _ in 0..200 {
            if self.seen.lock().unwrap().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.seen()
    }
}

fn mirrored(app: SocketAddr, shadow: SocketAddr, mirror: &str) -> String {
    gateway(
        &format!(
            "  app: {{ targets: [{app}] }}\n  shadow: {{ targets: [{shadow}], timeout: 30s }}\n"
        ),
        &format!(
            "  - name: mirrored\n    match: {{ path_prefix: /api }}\n    proxy: {{ upstream: app, strip_prefix: /api, mirror: {mirror} }}\n"
        ),
    )
}

fn post(path: &str, host: &str, body: Bytes) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", host)
        .body(Full::new(body))
        .unwrap()
}

/// Waits up to a second for a counter to reach `n` (copies end after their request's answer).
async fn wait_counter(gw: &TestGateway, series: &str, n: u64) {
    for _ in 0..50 {
        if counter_value(gw, series).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn mirror_series(result: &str) -> String {
    format!("gateway_mirror_requests_total{{route=\"mirrored\",result=\"{result}\"}}")
}

#[tokio::test]
async fn the_shadow_gets_copies_with_their_bodies_and_a_marked_host() {
    let app = Backend::start("app").await;
    let shadow = Shadow::start(Duration::ZERO).await;
    let gw = TestGateway::start(&mirrored(app.addr(), shadow.addr, "{ upstream: shadow }")).await;
    let big: Bytes = (0..300_000u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let mut h1 = http1(gw.addr("main")).await;
    let r = h1
        .send(post("/api/upload", "api.example.com:8080", big.clone()))
        .await
        .unwrap();
    assert_eq!((r.status(), r.text()), (200, "300000".to_owned()));
    let r = h1.get("/api/plain").await;
    assert_eq!(r.header("x-backend"), "app");
    let mut h2 = http2c(gw.addr("main")).await;
    let req = Request::post("/api/upload").body(Full::new(Bytes::from_static(b"over h2")));
    assert_eq!(h2.send(req.unwrap()).await.unwrap().text(), "7");

    let seen = shadow.wait_for(3).await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    let upload = seen
        .iter()
        .find(|c| c.body.len() == big.len())
        .expect("the big copy");
    assert_eq!(
        upload.body, big,
        "the copy's body is the client's, byte for byte"
    );
    assert_eq!(
        (upload.method.as_str(), upload.path.as_str()),
        ("POST", "/upload")
    );
    assert_eq!(upload.host, "api.example.com-shadow:8080");
    assert_eq!(upload.forwarded_for, "127.0.0.1");
    let plain = seen
        .iter()
        .find(|c| c.path == "/plain")
        .expect("the GET's copy");
    assert_eq!((plain.method.as_str(), plain.body.len()), ("GET", 0));
    assert!(seen.iter().any(|c| &c.body[..] == b"over h2"), "{seen:?}");
    // The real upstream got the unmarked host.
    assert_eq!(
        app.last().unwrap().header("host"),
        gw.addr("main").to_string()
    );
    wait_counter(&gw, &mirror_series("sent"), 3).await;
    assert_eq!(counter_value(&gw, &mirror_series("sent")).await, 3);
    assert_eq!(counter_value(&gw, &mirror_series("failed")).await, 0);
}

#[tokio::test]
async fn a_slow_or_dead_shadow_changes_nothing_for_the_client() {
    let app = Backend::start("app").await;
    let slow = Shadow::start(Duration::from_secs(3)).await;
    let gw = TestGateway::start(&mirrored(app.addr(), slow.addr, "{ upstream: shadow }")).await;
    let mut c = http1(gw.addr("main")).await;
    let started = Instant::now();
    for _ in 0..5 {
        let r = c
            .send(post("/api/upload", "a", Bytes::from_static(b"12345")))
            .await
            .unwrap();
        assert_eq!((r.status(), r.text()), (200, "5".to_owned()));
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the client waited for the shadow: {:?}",
        started.elapsed()
    );
    assert_eq!(slow.wait_for(5).await.len(), 5);

    let dead = refusing_addr();
    let gw = TestGateway::start(&mirrored(app.addr(), dead, "{ upstream: shadow }")).await;
    let mut c = http2c(gw.addr("main")).await;
    for _ in 0..4 {
        let r = c.get("/api/x").await;
        assert_eq!((r.status(), r.header("x-backend")), (200, "app"));
    }
    wait_counter(&gw, &mirror_series("failed"), 4).await;
    assert_eq!(counter_value(&gw, &mirror_series("failed")).await, 4);
    assert_eq!(counter_value(&gw, &mirror_series("sent")).await, 0);
}

#[tokio::test]
async fn copies_in_flight_stay_within_the_bound_and_the_rest_are_dropped_and_counted() {
    let app = Backend::start("app").await;
    let shadow = Shadow::start(Duration::from_millis(1500)).await;
    let gw = TestGateway::start(&mirrored(
        app.addr(),
        shadow.addr,
        "{ upstream: shadow, max_in_flight: 2 }",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..10 {
        assert_eq!(c.get("/api/x").await.status(), 200);
    }
    assert_eq!(counter_value(&gw, &mirror_series("dropped")).await, 8);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(shadow.seen().len(), 2);
    assert!(shadow.most.load(Relaxed) <= 2);
    // Once the copies end, their places are free again.
    for _ in 0..100 {
        if shadow.now.load(Relaxed) == 0 && counter_value(&gw, &mirror_series("sent")).await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(c.get("/api/y").await.status(), 200);
    assert_eq!(shadow.wait_for(3).await.len(), 3);
    assert_eq!(counter_value(&gw, &mirror_series("dropped")).await, 8);
}

#[tokio::test]
async fn a_percentage_mirrors_that_share_of_the_requests() {
    let app = Backend::start("app").await;
    let shadow = Shadow::start(Duration::ZERO).await;
    let gw = TestGateway::start(&mirrored(
        app.addr(),
        shadow.addr,
        "{ upstream: shadow, percent: 25 }",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..40 {
        assert_eq!(c.get("/api/x").await.status(), 200);
    }
    assert_eq!(shadow.wait_for(10).await.len(), 10);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(shadow.seen().len(), 10);
}

#[tokio::test]
async fn a_route_timeout_and_retries_override_the_upstreams() {
    let b = Backend::start("b").await;
    let dead = refusing_addr();
    let gw = TestGateway::start(&gateway(
        &format!(
            "  slow: {{ targets: [{b}], timeout: 10s }}\n  \
             patient: {{ targets: [{dead}, {b}], retries: 0 }}\n  \
             eager: {{ targets: [{dead}, {b}], retries: 2 }}\n",
            b = b.addr()
        ),
        "  - { name: short, match: { path_prefix: /short }, proxy: { upstream: slow, strip_prefix: /short, timeout: 300ms } }\n\
         \x20 - { name: long, match: { path_prefix: /long }, proxy: { upstream: slow, strip_prefix: /long } }\n\
         \x20 - { name: retry, match: { path_prefix: /retry }, proxy: { upstream: patient, strip_prefix: /retry, retries: 1 } }\n\
         \x20 - { name: once, match: { path_prefix: /once }, proxy: { upstream: eager, strip_prefix: /once, retries: 0 } }\n",
    ))
    .await;
    for mut c in [http1(gw.addr("main")).await, http2c(gw.addr("main")).await] {
        let started = Instant::now();
        assert_eq!(c.get("/short/slow/2000").await.status(), 504);
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
        // The same upstream on a route without its own timeout keeps the upstream's.
        assert_eq!(c.get("/long/slow/600").await.status(), 200);
    }
    // The route's retry reaches the live target whenever the dead one is tried first.
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..4 {
        assert_eq!(c.get("/retry/").await.status(), 200);
    }
    // Without the route's retries the dead target's turn is a 502, the upstream's 2 retries
    // notwithstanding.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(c.get("/once/").await.status());
    }
    assert!(statuses.contains(&502), "{statuses:?}");
}

/// The loopback addresses `localhost` has here (127.0.0.1, and ::1 where the system says so).
fn localhost_addrs() -> Vec<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    let mut ips: Vec<_> = ("localhost", 0)
        .to_socket_addrs()
        .expect("localhost resolves")
        .map(|a| a.ip())
        .filter(|ip| ip.is_loopback())
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

/// A backend on each address `localhost` has, all on one port (`localhost:PORT` names them all).
async fn localhost_backends() -> (u16, Vec<Backend>) {
    let ips = localhost_addrs();
    for _ in 0..20 {
        let first = Backend::start_on("127.0.0.1", SocketAddr::from(([127, 0, 0, 1], 0))).await;
        let port = first.addr().port();
        let others: Vec<_> = ips.iter().filter(|ip| !ip.is_ipv4()).collect();
        // The port may be taken on the other address: then take another.
        if others
            .iter()
            .any(|ip| std::net::TcpListener::bind(SocketAddr::new(**ip, port)).is_err())
        {
            continue;
        }
        let mut backends = vec![first];
        for ip in others {
            backends.push(Backend::start_on(&ip.to_string(), SocketAddr::new(*ip, port)).await);
        }
        return (port, backends);
    }
    panic!("no port free on every loopback address");
}

#[tokio::test]
async fn a_host_name_target_is_every_address_it_has_for_routes_and_streams() {
    let (port, backends) = localhost_backends().await;
    let gw = TestGateway::start(&format!(
        "{}streams:\n  - {{ name: raw, bind: 127.0.0.1:0, protocol: tcp, upstream: app }}\n",
        gateway(
            &format!("  app: {{ targets: [localhost:{port}], resolve_every: 100ms }}\n"),
            "  - { name: app, match: { path_prefix: / }, proxy: { upstream: app } }\n",
        )
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    let per_address = 20;
    let t = tally(&mut c, "/", per_address * backends.len()).await;
    for b in &backends {
        assert_eq!(t[b.name()], per_address, "{t:?}");
    }
    // Each address is a target of its own in the metrics, named after the written target.
    let series = format!(
        "gateway_upstream_attempts_total{{upstream=\"app\",target=\"localhost:{port}@127.0.0.1\"}}"
    );
    assert_eq!(counter_value(&gw, &series).await, per_address as u64);
    assert_eq!(
        counter_value(
            &gw,
            "gateway_upstream_resolve_failures_total{upstream=\"app\"}"
        )
        .await,
        0
    );
    // Refreshes that find the same addresses change nothing for requests.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let mut c = http2c(gw.addr("main")).await;
    let t = tally(&mut c, "/", per_address * backends.len()).await;
    assert_eq!(t.len(), backends.len(), "{t:?}");
    // The stream proxy shares the upstream's targets.
    let answer = gateway_tests::raw(
        gw.stream_addr("raw"),
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
