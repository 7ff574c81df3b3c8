//! The `cache` filter end to end, over HTTP/1.1 and HTTP/2, in front of a real backend that
//! counts the requests it gets: fresh hits never reach it; `no-store`, `private`, `Set-Cookie`,
//! `Vary: *`, `Authorization` and oversized answers are not stored; `Vary` keeps a variant per
//! header value; freshness from `max-age`, `s-maxage`, `Expires`, `Age` and `default_ttl`;
//! revalidation with the backend's 304; the client's own conditions and ranges answered from
//! the cache; unsafe methods invalidating; 50 concurrent misses coalesced into one request;
//! eviction under a small bound; the admin purge; a reload keeping the objects;
//! `stale-while-revalidate` answering at once while the backend is slow, `stale-if-error`
//! standing in for a 503, a failed answer and a stopped backend; HTTP/3 and TLS clients sharing
//! the objects; `compress` after `cache` storing one object per coding; the access log's field.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::h3::connect;
use gateway_tests::{
    KeyKind, TestCa, TestGateway, TestResponse, admin_request, counter_value, http1, http2c, https,
    raw_target, temp_dir,
};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

/// Requests the backend got, by path.
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<HashMap<String, usize>>>);

impl Counts {
    fn get(&self, path: &str) -> usize {
        self.0.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn bump(&self, path: &str) -> usize {
        let mut m = self.0.lock().unwrap();
        let n = m.entry(path.to_owned()).or_default();
        *n += 1;
        *n
    }
}

async fn backend() -> (SocketAddr, Counts) {
    let (addr, counts, stop) = stoppable_backend().await;
    std::mem::forget(stop);
    (addr, counts)
}

/// A backend that closes its listener and every connection when `stop` is sent `true`.
async fn stoppable_backend() -> (SocketAddr, Counts, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Counts::default();
    let (stop, stopped) = watch::channel(false);
    let c = counts.clone();
    tokio::spawn(async move {
        loop {
            let mut until = stopped.clone();
            let tcp = tokio::select! {
                _ = until.wait_for(|s| *s) => return,
                r = listener.accept() => match r {
                    Ok((tcp, _)) => tcp,
                    Err(_) => continue,
                },
            };
            let c = c.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let c = c.clone();
                    async move { answer(&req, &c).await }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection(TokioIo::new(tcp), svc);
                tokio::select! {
                    _ = until.wait_for(|s| *s) => {}
                    _ = conn => {}
                }
            });
        }
    });
    (addr, counts, stop)
}

/// The answer to a request; an error (the connection is closed without an answer) where the
/// backend is to fail.
async fn answer(
    req: &Request<Incoming>,
    counts: &Counts,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let path = req.uri().path();
    let key = format!("{} {path}", req.method());
    let n = counts.bump(if req.method() == "GET" { path } else { &key });
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let r = Response::builder();
    let body = format!("{path} #{n}");
    let now = httpdate::fmt_http_date(std::time::SystemTime::now());
    let later = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(60));
    let res = match path {
        "/fresh" | "/purge/a" | "/purge/b" | "/other" => r
            .header("cache-control", "max-age=60")
            .header("etag", "\"v1\"")
            .header("last-modified", "Mon, 07 Dec 2026 00:00:00 GMT")
            .body(body),
        "/s-maxage" => r
            .header("cache-control", "max-age=0, s-maxage=60")
            .body(body),
        "/expires" => r.header("date", &now).header("expires", &later).body(body),
        "/expired" => r.header("expires", "0").body(body),
        "/aged" => r
            .header("cache-control", "max-age=60")
            .header("age", "30")
            .body(body),
        "/no-store" => r.header("cache-control", "no-store, max-age=60").body(body),
        "/private" => r.header("cache-control", "private, max-age=60").body(body),
        "/cookie" | "/strip-cookie/a" => r
            .header("cache-control", "max-age=60")
            .header("set-cookie", "id=1")
            .body(body),
        "/vary-star" => r
            .header("cache-control", "max-age=60")
            .header("vary", "*")
            .body(body),
        "/vary" => r
            .header("cache-control", "max-age=60")
            .header("vary", "Accept-Language")
            .body(format!("{} #{n}", header("accept-language"))),
        "/auth" => r.header("cache-control", "max-age=60").body(body),
        "/auth-public" => r.header("cache-control", "public, max-age=60").body(body),
        "/plain" => r.body(body),
        "/big" => r
            .header("cache-control", "max-age=60")
            .body("x".repeat(5000)),
        "/range" => r
            .header("cache-control", "max-age=60")
            .header("etag", "\"r\"")
            .body((0..100u8).map(|i| b'a' + i % 26).map(char::from).collect()),
        "/revalidate" | "/no-cache" => {
            let cc = if path == "/no-cache" {
                "no-cache"
            } else {
                "max-age=0"
            };
            if header("if-none-match") == "\"e1\"" {
                r.status(304)
                    .header("cache-control", cc)
                    .header("etag", "\"e1\"")
                    .header("x-refreshed", n.to_string())
                    .body(String::new())
            } else {
                r.header("cache-control", cc)
                    .header("etag", "\"e1\"")
                    .body(body)
            }
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            r.header("cache-control", "max-age=60").body(body)
        }
        "/swr" => {
            if n > 1 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            r.header("cache-control", "max-age=1, stale-while-revalidate=30")
                .header("age", "5")
                .body(body)
        }
        "/sie" if n > 1 => r.status(503).body(body),
        "/sie" => r
            .header("cache-control", "max-age=1, stale-if-error=60")
            .header("age", "5")
            .body(body),
        "/sie-reset" if n > 1 => return Err(std::io::Error::other("reset")),
        "/sie-reset" | "/gone/x" => r
            .header("cache-control", "max-age=1")
            .header("age", "5")
            .body(body),
        "/text" => r
            .header("cache-control", "max-age=60")
            .header("content-type", "text/plain")
            .body("a compressible line of text\n".repeat(100)),
        p if p.starts_with("/kib/") => r
            .header("cache-control", "max-age=600")
            .body("k".repeat(1024)),
        p if p.starts_with("/kib-no-store/") => {
            r.header("cache-control", "no-store").body("k".repeat(1024))
        }
        p if p.starts_with("/evict/") => r
            .header("cache-control", "max-age=60")
            .body("e".repeat(2000)),
        _ => r.status(404).body(body),
    };
    Ok(res.unwrap().map(|b| Full::new(Bytes::from(b))))
}

fn config(backend: SocketAddr, gone: SocketAddr) -> String {
    crate::cors::with_app(
        backend,
        &format!(
            r#"  gone:
    targets: [{gone}]
caches:
  main: {{ memory: 1MiB }}
  small: {{ memory: 8KiB }}
routes:
  - name: ttl
    match: {{ path: /plain }}
    filters:
      - cache: {{ store: main, default_ttl: 60s }}
    proxy: {{ upstream: app }}
  - name: small
    match: {{ path_prefix: /evict/ }}
    filters:
      - cache: {{ store: small }}
    proxy: {{ upstream: app }}
  - name: gone
    match: {{ path_prefix: /gone/ }}
    filters:
      - cache: {{ store: main, stale_if_error: 5m }}
    proxy: {{ upstream: gone }}
  - name: reset
    match: {{ path: /sie-reset }}
    filters:
      - cache: {{ store: main, stale_if_error: 5m }}
    proxy: {{ upstream: app }}
  - name: strip-cookie
    match: {{ path_prefix: /strip-cookie/ }}
    filters:
      - cache: {{ store: main, set_cookie: strip }}
    proxy: {{ upstream: app }}
  - name: cached
    match: {{ path_prefix: / }}
    filters:
      - cache: {{ store: main, max_object_size: 4KiB }}
    proxy: {{ upstream: app }}
"#
        ),
    )
}

/// Request header lines.
type Headers<'a> = &'a [(&'a str, &'a str)];

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> TestResponse {
    send(addr, "GET", path, headers).await
}

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> TestResponse {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::new())).unwrap();
    http1(addr).await.send(req).await.expect("request")
}

async fn start() -> (TestGateway, SocketAddr, Counts) {
    let (backend, counts) = backend().await;
    let (gone, _) = self::backend().await;
    let gw = TestGateway::start(&config(backend, gone)).await;
    let addr = gw.addr("main");
    (gw, addr, counts)
}

#[tokio::test]
async fn fresh_answers_are_served_from_the_cache() {
    let (gw, addr, counts) = start().await;
    let first = get(addr, "/fresh", &[]).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.text(), "/fresh #1");
    assert_eq!(first.header("cache-status"), "gateway; fwd=miss; stored");
    assert_eq!(first.header("age"), "0");
    let second = get(addr, "/fresh", &[]).await;
    assert_eq!(second.text(), "/fresh #1");
    assert!(
        second
            .header("cache-status")
            .starts_with("gateway; hit; ttl="),
        "{:?}",
        second.head
    );
    assert_eq!(second.header("content-length"), "9");
    assert!(second.header("age").parse::<u64>().unwrap() < 5);
    let head = send(addr, "HEAD", "/fresh", &[]).await;
    assert_eq!((head.status(), head.body.len()), (200, 0));
    assert_eq!(head.header("content-length"), "9");
    // HTTP/2 shares the objects.
    let h2 = http2c(addr).await.get("/fresh").await;
    assert_eq!(h2.text(), "/fresh #1");
    assert!(h2.header("cache-status").contains("hit"));
    // Another query is another object.
    assert_eq!(get(addr, "/fresh?a=1", &[]).await.text(), "/fresh #2");
    assert_eq!(counts.get("/fresh"), 2);
    for path in ["/s-maxage", "/expires", "/plain"] {
        get(addr, path, &[]).await;
        let again = get(addr, path, &[]).await;
        assert_eq!(again.text(), format!("{path} #1"), "{path} from the cache");
    }
    let aged = get(addr, "/aged", &[]).await;
    assert_eq!(aged.header("age"), "30");
    assert!(
        get(addr, "/aged", &[])
            .await
            .header("age")
            .parse::<u64>()
            .unwrap()
            >= 30
    );
    assert_eq!(
        counter_value(
            &gw,
            "gateway_cache_hits_total{cache=\"main\",tier=\"memory\"}"
        )
        .await,
        7
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn answers_that_must_not_be_stored_are_not() {
    let (gw, addr, counts) = start().await;
    let cases: &[(&str, Headers, &str)] = &[
        ("/no-store", &[], "forbidden"),
        ("/private", &[], "forbidden"),
        ("/cookie", &[], "set_cookie"),
        ("/vary-star", &[], "vary"),
        ("/expired", &[], "uncacheable"),
        ("/auth", &[("authorization", "Bearer t")], "forbidden"),
        ("/big", &[], "too_large"),
    ];
    for (path, headers, reason) in cases {
        let a = get(addr, path, headers).await;
        let b = get(addr, path, headers).await;
        assert_eq!(b.text().len(), a.text().len());
        assert_eq!(counts.get(path), 2, "{path} went to the backend twice");
        {
            assert_eq!(
                b.header("cache-status"),
                format!("gateway; fwd=miss; detail={reason}"),
                "{path}"
            );
        }
    }
    // `public` opens an answer to an Authorization request to the shared cache.
    get(addr, "/auth-public", &[("authorization", "Bearer t")]).await;
    get(addr, "/auth-public", &[("authorization", "Bearer t")]).await;
    assert_eq!(counts.get("/auth-public"), 1);
    // A request that says no-store is not answered from, nor stored in, the cache.
    get(addr, "/fresh", &[("cache-control", "no-store")]).await;
    get(addr, "/fresh", &[]).await;
    assert_eq!(counts.get("/fresh"), 2);
    assert_eq!(
        counter_value(
            &gw,
            "gateway_cache_not_stored_total{cache=\"main\",reason=\"forbidden\"}"
        )
        .await,
        6
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn set_cookie_strip_stores_the_answer_without_its_cookie() {
    let (gw, addr, counts) = start().await;
    let first = get(addr, "/strip-cookie/a", &[]).await;
    assert_eq!(first.header("cache-status"), "gateway; fwd=miss; stored");
    // The client whose request fetched the answer gets its cookie ...
    assert_eq!(first.header("set-cookie"), "id=1");
    let second = get(addr, "/strip-cookie/a", &[]).await;
    assert_eq!(second.text(), "/strip-cookie/a #1");
    assert!(second.header("cache-status").starts_with("gateway; hit"));
    // ... and no one else does.
    assert_eq!(second.header("set-cookie"), "");
    let h2 = http2c(addr).await.get("/strip-cookie/a").await;
    assert!(h2.header("cache-status").starts_with("gateway; hit"));
    assert_eq!(h2.header("set-cookie"), "");
    assert_eq!(counts.get("/strip-cookie/a"), 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn vary_keeps_a_variant_per_header_value() {
    let (gw, addr, counts) = start().await;
    let en = [("accept-language", "en")];
    let fr = [("accept-language", "fr")];
    assert_eq!(get(addr, "/vary", &en).await.text(), "en #1");
    assert_eq!(get(addr, "/vary", &fr).await.text(), "fr #2");
    assert_eq!(get(addr, "/vary", &en).await.text(), "en #1");
    assert_eq!(get(addr, "/vary", &fr).await.text(), "fr #2");
    assert_eq!(counts.get("/vary"), 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn stale_objects_are_revalidated_and_a_304_refreshes_them() {
    let (gw, addr, counts) = start().await;
    for path in ["/revalidate", "/no-cache"] {
        let first = get(addr, path, &[]).await;
        assert_eq!(first.text(), format!("{path} #1"));
        let second = get(addr, path, &[]).await;
        assert_eq!(second.status(), 200);
        assert_eq!(second.text(), format!("{path} #1"), "the stored body");
        assert_eq!(second.header("x-refreshed"), "2", "the 304's headers");
        assert_eq!(
            second.header("cache-status"),
            "gateway; fwd=stale; fwd-status=304"
        );
        // The client's own condition is answered after the revalidation.
        let cond = get(addr, path, &[("if-none-match", "\"e1\"")]).await;
        assert_eq!((cond.status(), cond.body.len()), (304, 0));
        assert_eq!(counts.get(path), 3);
    }
    assert_eq!(
        counter_value(&gw, "gateway_cache_revalidations_total{cache=\"main\"}").await,
        4
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn conditional_and_range_requests_are_answered_from_the_cache() {
    let (gw, addr, counts) = start().await;
    // A range asked on a miss: the whole object is fetched, stored and sent.
    let whole = get(addr, "/range", &[("range", "bytes=0-9")]).await;
    assert_eq!((whole.status(), whole.body.len()), (200, 100));
    let part = get(addr, "/range", &[("range", "bytes=10-19")]).await;
    assert_eq!(part.status(), 206);
    assert_eq!(part.text(), "klmnopqrst");
    assert_eq!(part.header("content-range"), "bytes 10-19/100");
    let tail = get(addr, "/range", &[("range", "bytes=-5")]).await;
    assert_eq!((tail.status(), tail.text().as_str()), (206, "rstuv"));
    let past = get(addr, "/range", &[("range", "bytes=500-")]).await;
    assert_eq!(
        (past.status(), past.header("content-range")),
        (416, "bytes */100")
    );
    let other = get(
        addr,
        "/range",
        &[("range", "bytes=0-1"), ("if-range", "\"old\"")],
    )
    .await;
    assert_eq!((other.status(), other.body.len()), (200, 100));
    assert_eq!(counts.get("/range"), 1);

    get(addr, "/fresh", &[]).await;
    let inm = get(addr, "/fresh", &[("if-none-match", "W/\"x\", \"v1\"")]).await;
    assert_eq!((inm.status(), inm.body.len()), (304, 0));
    assert_eq!(inm.header("etag"), "\"v1\"");
    let changed = get(addr, "/fresh", &[("if-none-match", "\"v0\"")]).await;
    assert_eq!(changed.status(), 200);
    let ims = get(
        addr,
        "/fresh",
        &[("if-modified-since", "Mon, 07 Dec 2026 01:00:00 GMT")],
    )
    .await;
    assert_eq!(ims.status(), 304);
    let older = get(
        addr,
        "/fresh",
        &[("if-modified-since", "Sun, 06 Dec 2026 01:00:00 GMT")],
    )
    .await;
    assert_eq!(older.status(), 200);
    assert_eq!(counts.get("/fresh"), 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn unsafe_methods_invalidate_the_url() {
    let (gw, addr, counts) = start().await;
    get(addr, "/fresh", &[]).await;
    get(addr, "/other", &[]).await;
    let post = send(addr, "POST", "/fresh", &[]).await;
    assert_eq!(post.header("cache-status"), "gateway; fwd=method");
    assert_eq!(get(addr, "/fresh", &[]).await.text(), "/fresh #2");
    assert_eq!(get(addr, "/other", &[]).await.text(), "/other #1");
    send(addr, "DELETE", "/other", &[]).await;
    assert_eq!(get(addr, "/other", &[]).await.text(), "/other #2");
    assert_eq!(counts.get("/fresh"), 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn concurrent_misses_send_one_request() {
    let (gw, addr, counts) = start().await;
    let tasks: Vec<_> = (0..50)
        .map(|_| tokio::spawn(async move { get(addr, "/slow", &[]).await }))
        .collect();
    for t in tasks {
        let res = t.await.unwrap();
        assert_eq!(res.text(), "/slow #1");
    }
    assert_eq!(counts.get("/slow"), 1);
    assert_eq!(
        counter_value(
            &gw,
            "gateway_cache_hits_total{cache=\"main\",tier=\"memory\"}"
        )
        .await,
        49
    );
    assert!(counter_value(&gw, "gateway_cache_coalesced_total{cache=\"main\"}").await >= 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_small_cache_evicts_the_least_recently_used() {
    let (gw, addr, counts) = start().await;
    for i in 0..3 {
        get(addr, &format!("/evict/{i}"), &[]).await;
    }
    // /evict/0 used again: /evict/1 is the least recently used when /evict/3 comes.
    get(addr, "/evict/0", &[]).await;
    get(addr, "/evict/3", &[]).await;
    get(addr, "/evict/0", &[]).await;
    get(addr, "/evict/1", &[]).await;
    assert_eq!(counts.get("/evict/0"), 1);
    assert_eq!(counts.get("/evict/1"), 2);
    let evicted = "gateway_cache_evictions_total{cache=\"small\",tier=\"memory\"}";
    assert!(counter_value(&gw, evicted).await >= 1);
    let (_, metrics) = admin_request(&gw, "GET", "/metrics", "").await;
    let bytes = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gateway_cache_bytes{cache=\"small\",tier=\"memory\"} "))
        .unwrap();
    assert!(bytes.parse::<u64>().unwrap() <= 8192, "{bytes}");
    gw.shutdown().await;
}

#[tokio::test]
async fn purge_by_prefix_and_path_and_reload_keeps_the_objects() {
    let (gw, addr, counts) = start().await;
    for p in ["/purge/a", "/purge/b", "/fresh"] {
        get(addr, p, &[]).await;
    }
    let (status, body) = admin_request(&gw, "POST", "/cache/main/purge?path=/purge/a", "").await;
    assert_eq!((status, body.as_str()), (200, "purged 1 object(s)\n"));
    let (status, body) = admin_request(&gw, "POST", "/cache/main/purge?prefix=/purge/", "").await;
    assert_eq!((status, body.as_str()), (200, "purged 1 object(s)\n"));
    assert_eq!(
        admin_request(&gw, "POST", "/cache/nope/purge?prefix=/", "")
            .await
            .0,
        404
    );
    assert_eq!(
        admin_request(&gw, "POST", "/cache/main/purge", "").await.0,
        400
    );
    assert_eq!(
        admin_request(&gw, "GET", "/cache/main/purge?prefix=/", "")
            .await
            .0,
        405
    );
    get(addr, "/purge/a", &[]).await;
    get(addr, "/purge/b", &[]).await;
    assert_eq!((counts.get("/purge/a"), counts.get("/purge/b")), (2, 2));
    // A reload keeps the store and what it holds.
    assert_eq!(admin_request(&gw, "POST", "/reload", "").await.0, 200);
    assert_eq!(get(addr, "/fresh", &[]).await.text(), "/fresh #1");
    assert_eq!(counts.get("/fresh"), 1);
    assert_eq!(
        counter_value(&gw, "gateway_cache_purged_total{cache=\"main\"}").await,
        2
    );
    gw.shutdown().await;
}

/// Waits until the backend has had `n` requests for `path`.
async fn backend_reaches(counts: &Counts, path: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while counts.get(path) < n {
        assert!(
            Instant::now() < deadline,
            "{path}: {} requests",
            counts.get(path)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn stale_while_revalidate_answers_at_once_and_refreshes_behind() {
    let (gw, addr, counts) = start().await;
    // Stored already stale (Age 5 > max-age 1), within its 30 s of stale-while-revalidate.
    assert_eq!(get(addr, "/swr", &[]).await.text(), "/swr #1");
    let asked = Instant::now();
    let stale = get(addr, "/swr", &[]).await;
    assert!(
        asked.elapsed() < Duration::from_millis(400),
        "not held by the slow backend"
    );
    assert_eq!(stale.text(), "/swr #1");
    assert!(
        stale
            .header("cache-status")
            .ends_with("detail=stale-while-revalidate"),
        "{:?}",
        stale.head
    );
    backend_reaches(&counts, "/swr", 2).await;
    // The background fetch stores its answer once its body is in.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let next = get(addr, "/swr", &[]).await;
        if next.text() == "/swr #2" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the revalidated answer never came"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served = "gateway_cache_stale_total{cache=\"main\",reason=\"while_revalidate\"}";
    assert!(counter_value(&gw, served).await >= 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn stale_if_error_stands_in_for_a_failing_backend() {
    let (backend, counts) = backend().await;
    let (gone, _, stop) = stoppable_backend().await;
    let gw = TestGateway::start(&config(backend, gone)).await;
    let addr = gw.addr("main");
    // The answer's own stale-if-error, against a 503.
    assert_eq!(get(addr, "/sie", &[]).await.text(), "/sie #1");
    let stale = get(addr, "/sie", &[]).await;
    assert_eq!((stale.status(), stale.text().as_str()), (200, "/sie #1"));
    assert_eq!(
        stale.header("cache-status"),
        "gateway; fwd=stale; fwd-status=503; detail=stale-if-error"
    );
    assert_eq!(counts.get("/sie"), 2);
    // The filter's default, against a backend that closes the connection without answering.
    assert_eq!(get(addr, "/sie-reset", &[]).await.text(), "/sie-reset #1");
    let stale = get(addr, "/sie-reset", &[]).await;
    assert_eq!(
        (stale.status(), stale.text().as_str()),
        (200, "/sie-reset #1")
    );
    // And against a backend that is gone.
    assert_eq!(get(addr, "/gone/x", &[]).await.text(), "/gone/x #1");
    stop.send(true).unwrap();
    let stale = get(addr, "/gone/x", &[]).await;
    assert_eq!((stale.status(), stale.text().as_str()), (200, "/gone/x #1"));
    assert!(
        stale
            .header("cache-status")
            .contains("detail=stale-if-error")
    );
    // Beyond what it allows, or for an object without any, the failure goes through.
    assert_eq!(get(addr, "/gone/other", &[]).await.status(), 502);
    let served = "gateway_cache_stale_total{cache=\"main\",reason=\"if_error\"}";
    assert_eq!(counter_value(&gw, served).await, 3);
    gw.shutdown().await;
}

/// A gateway caching `/` in front of a backend that answers every connection with `answer`.
async fn hostile(answer: &'static [u8]) -> TestGateway {
    let target = raw_target(answer).await;
    let (gone, _) = backend().await;
    let yaml = config(target, gone).replace("default_ttl: 60s", "default_ttl: 0s");
    TestGateway::start(&yaml).await
}

#[tokio::test]
async fn a_hostile_backend_gets_nothing_stored_and_breaks_nothing() {
    // A body cut short of its Content-Length: the client sees the failure, nothing is stored.
    let gw = hostile(
        b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 100\r\n\r\nshort",
    )
    .await;
    let addr = gw.addr("main");
    for _ in 0..2 {
        let req = Request::get("/cut").body(Full::new(Bytes::new())).unwrap();
        let mut client = http1(addr).await;
        let res = client.send(req).await;
        assert!(res.is_err() || res.unwrap().body.len() < 100);
    }
    let truncated = "gateway_cache_not_stored_total{cache=\"main\",reason=\"truncated\"}";
    assert_eq!(counter_value(&gw, truncated).await, 2);
    assert_eq!(
        counter_value(
            &gw,
            "gateway_cache_hits_total{cache=\"main\",tier=\"memory\"}"
        )
        .await,
        0
    );
    gw.shutdown().await;

    // Hostile Cache-Control, Vary and Age values: answered, and stored only as far as they
    // make sense (an unterminated quote ends the field; an overlong max-age saturates).
    let gw = hostile(
        b"HTTP/1.1 200 OK\r\nCache-Control: ,,=,max-age=99999999999999999999999, private=\"x\r\n\
          Vary: ,,, ,\r\nAge: -5\r\nETag: \"\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    )
    .await;
    let addr = gw.addr("main");
    let first = get(addr, "/odd", &[("if-none-match", "\"")]).await;
    assert_eq!((first.status(), first.text().as_str()), (200, "ok"));
    assert_eq!(
        first.header("cache-status"),
        "gateway; fwd=miss; detail=forbidden"
    );
    let range = get(addr, "/odd", &[("range", "bytes=99999999999999999999999-")]).await;
    assert_eq!(range.status(), 200);
    gw.shutdown().await;

    let gw = hostile(
        b"HTTP/1.1 200 OK\r\nCache-Control: max-age=99999999999999999999999\r\n\
          Vary: ,,accept, ,\r\nAge: 99999999999999999999\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    )
    .await;
    let addr = gw.addr("main");
    assert_eq!(
        get(addr, "/odd", &[]).await.header("cache-status"),
        "gateway; fwd=miss; stored"
    );
    let hit = get(addr, "/odd", &[("range", "bytes=1-")]).await;
    assert_eq!((hit.status(), hit.text().as_str()), (206, "k"));
    gw.shutdown().await;
}

#[tokio::test]
async fn the_access_log_says_what_the_cache_did() {
    let (backend, _) = backend().await;
    let (gone, _) = self::backend().await;
    let yaml = config(backend, gone).replacen(
        "listeners:",
        "telemetry:\n  access_log: { path: access.log, format: json }\nlisteners:",
        1,
    );
    let gw = TestGateway::start(&yaml).await;
    let addr = gw.addr("main");
    get(addr, "/fresh", &[]).await;
    get(addr, "/fresh", &[]).await;
    send(addr, "POST", "/fresh", &[]).await;
    get(addr, "/revalidate", &[]).await;
    get(addr, "/revalidate", &[]).await;
    let path = gw.dir().join("access.log");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut text = String::new();
    while Instant::now() < deadline {
        text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let outcomes: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["cache"].to_string())
        .collect();
    assert_eq!(
        outcomes,
        [
            "\"miss\"",
            "\"hit\"",
            "\"pass\"",
            "\"miss\"",
            "\"revalidated\""
        ],
        "{text}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn every_protocol_shares_the_objects_and_compress_stores_one_per_coding() {
    let ca = TestCa::new();
    let dir = temp_dir();
    ca.write(dir.path(), "site", &["site.test"], KeyKind::Ecdsa);
    let (backend, counts) = backend().await;
    let yaml = format!(
        r#"
server: {{ watch_config: false }}
certificates:
  site: {{ cert: site.pem, key: site.key }}
listeners:
  - name: web
    bind: 127.0.0.1:0
    protocols: [http1, http2, http3]
    tls: {{ certificates: [site] }}
upstreams:
  app: {{ targets: [{backend}] }}
caches:
  main: {{ memory: 1MiB }}
routes:
  - match: {{ path_prefix: / }}
    filters:
      - cache: {{ store: main }}
      - compress: {{}}
    proxy: {{ upstream: app }}
"#
    );
    let gw = TestGateway::start_in(dir, &yaml).await;
    let addr = gw.addr("web");
    let (mut h1, _) = https(addr, "site.test", &ca, &[b"http/1.1"]).await;
    assert_eq!(h1.get("/fresh").await.text(), "/fresh #1");
    let h3 = connect(addr, "site.test", &ca).await;
    let hit = h3.get("/fresh").await;
    assert_eq!(hit.text(), "/fresh #1");
    assert!(hit.header("cache-status").contains("hit"), "{:?}", hit.head);
    let (mut h2, alpn) = https(addr, "site.test", &ca, &[b"h2"]).await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(h2.get("/fresh").await.text(), "/fresh #1");
    assert_eq!(counts.get("/fresh"), 1);

    let text = |coding: &'static str| {
        Request::get("/text")
            .header("accept-encoding", coding)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let gzip = h1.send(text("gzip")).await.unwrap();
    assert_eq!(gzip.header("content-encoding"), "gzip");
    assert_eq!(gzip.header("cache-status"), "gateway; fwd=miss; stored");
    let again = h1.send(text("gzip")).await.unwrap();
    assert_eq!(again.header("content-encoding"), "gzip");
    assert!(again.header("cache-status").contains("hit"));
    assert_eq!(again.body, gzip.body);
    let plain = h1.send(text("identity")).await.unwrap();
    assert_eq!(plain.header("content-encoding"), "");
    assert_eq!(plain.body.len(), 2800);
    assert!(
        h1.send(text("identity"))
            .await
            .unwrap()
            .header("cache-status")
            .contains("hit")
    );
    assert_eq!(counts.get("/text"), 2);
    h3.close().await;
    gw.shutdown().await;
}

/// 10,000 objects of 1 KiB: what the cache counts stays within twice their bytes. What the
/// process grows by is only printed: the other tests of this binary run in the same process at
/// the same time, so its resident size is theirs too (the measured figures are in
/// docs/performance-log.md, "Response cache memory").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_small_objects_take_at_most_twice_their_bytes() {
    let (backend, _) = backend().await;
    let (gone, _) = self::backend().await;
    let yaml = config(backend, gone).replace("main: { memory: 1MiB }", "main: { memory: 64MiB }");
    let gw = TestGateway::start(&yaml).await;
    let addr = gw.addr("main");
    const N: u64 = 10_000;
    let mut client = http1(addr).await;
    // The same traffic, not stored: what the process keeps from it is not the cache's.
    for i in 0..N {
        client.get(&format!("/kib-no-store/{i}")).await;
    }
    let (before, _) = gateway_tests::rss_kib();
    for i in 0..N {
        let res = client.get(&format!("/kib/{i}")).await;
        assert_eq!(res.body.len(), 1024);
    }
    let (after, _) = gateway_tests::rss_kib();
    let (_, metrics) = admin_request(&gw, "GET", "/metrics", "").await;
    let series = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{cache=\"main\",tier=\"memory\"}} ")))
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(series("gateway_cache_objects"), N);
    let counted = series("gateway_cache_bytes");
    let grown = (after.saturating_sub(before)) * 1024;
    eprintln!("10,000 objects of 1 KiB: counted {counted} bytes, the process grew by {grown}");
    assert!(counted <= 2 * N * 1024, "counted {counted}");
    gw.shutdown().await;
}
