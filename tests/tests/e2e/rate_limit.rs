//! The `rate_limit` filter end to end: the bucket allows `requests + burst`, then answers 429
//! with `Retry-After` and the RateLimit headers (each `headers:` form), recovers after the
//! window, counts refusals, and keys by client IP or by a header (requests without it fall back
//! to their IP).

use std::time::Duration;

use bytes::Bytes;
use gateway_tests::{TestGateway, http1, raw};
use http::Request;
use http_body_util::Full;

const CONFIG: &str = r#"
admin: { bind: 127.0.0.1:0 }
server: { watch_config: false }
listeners:
  - name: main
    bind: 127.0.0.1:0
routes:
  - name: per-ip
    match: { path: /ip }
    filters:
      - rate_limit: { requests: 3, per: 1s }
    respond: { body: "ok" }
  - name: per-key
    match: { path: /key }
    filters:
      - rate_limit: { requests: 2, per: 1m, burst: 1, key: "header:x-api-key" }
    respond: { body: "ok" }
  - name: separate
    match: { path: /separate }
    filters:
      - rate_limit: { requests: 3, per: 1s, headers: draft-06 }
    respond: { body: "ok" }
  - name: quiet
    match: { path: /quiet }
    filters:
      - rate_limit: { requests: 1, per: 1m, headers: none }
    respond: { body: "ok" }
"#;

fn with_key(path: &str, key: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::get(path);
    if let Some(k) = key {
        b = b.header("x-api-key", k);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

#[tokio::test]
async fn over_the_limit_gets_429_with_headers_then_recovers() {
    let gw = TestGateway::start(CONFIG).await;
    let mut c = http1(gw.addr("main")).await;
    for (left, reset) in [("2", "1"), ("1", "1"), ("0", "1")] {
        let res = c.get("/ip").await;
        assert_eq!(res.status(), 200);
        assert_eq!(res.header("ratelimit-policy"), r#""per-ip";q=3;w=1"#);
        assert_eq!(
            res.header("ratelimit"),
            format!(r#""per-ip";r={left};t={reset}"#)
        );
        assert_eq!(
            res.header("ratelimit-limit"),
            "",
            "only the draft-10 fields"
        );
    }
    // The bucket is the client address's, not the connection's.
    let res = http1(gw.addr("main")).await.get("/ip").await;
    assert_eq!(
        res.status(),
        429,
        "a second connection from the same address"
    );
    assert_eq!(res.header("retry-after"), "1");
    assert_eq!(res.header("ratelimit-policy"), r#""per-ip";q=3;w=1"#);
    assert_eq!(res.header("ratelimit"), r#""per-ip";r=0;t=1"#);
    assert_eq!(res.text(), "429 Too Many Requests\n");

    // A full window later the bucket is full again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let res = c.get("/ip").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.header("ratelimit"), r#""per-ip";r=2;t=1"#);

    let addr = gw.gateway().admin_addr().expect("admin");
    let m = raw(
        addr,
        gateway_tests::admin_head(&gw, "GET", "/metrics", "").as_bytes(),
    )
    .await;
    assert!(
        m.contains("gateway_rate_limited_total{route=\"per-ip\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn header_keys_have_their_own_buckets() {
    let gw = TestGateway::start(CONFIG).await;
    let mut c = http1(gw.addr("main")).await;
    for key in [Some("alice"), Some("bob"), None] {
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(c.send(with_key("/key", key)).await.unwrap().status());
        }
        // requests 2 + burst 1 = 3, then 429; each key (and the keyless client's IP) apart.
        assert_eq!(got, [200, 200, 200, 429], "{key:?}");
    }
    let res = c.send(with_key("/key", Some("alice"))).await.unwrap();
    assert_eq!(res.status(), 429);
    let retry: u64 = res.header("retry-after").parse().unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    assert_eq!(res.header("ratelimit-policy"), r#""per-key";q=3;w=60"#);
}

#[tokio::test]
async fn draft06_fields_and_none_on_request() {
    let gw = TestGateway::start(CONFIG).await;
    let mut c = http1(gw.addr("main")).await;
    for remaining in ["2", "1", "0"] {
        let res = c.get("/separate").await;
        assert_eq!(res.status(), 200);
        assert_eq!(res.header("ratelimit-limit"), "3");
        assert_eq!(res.header("ratelimit-remaining"), remaining);
        assert_eq!(res.header("ratelimit-reset"), "1");
        assert_eq!(res.header("ratelimit-policy"), "3;w=1");
        assert_eq!(res.header("ratelimit"), "", "only the draft-06 fields");
    }
    let res = c.get("/separate").await;
    assert_eq!(res.status(), 429);
    assert_eq!(res.header("retry-after"), "1");
    assert_eq!(res.header("ratelimit-remaining"), "0");
    assert_eq!(res.header("ratelimit-reset"), "1");

    // `headers: none`: limited just the same, without a field saying so until the refusal's
    // Retry-After.
    let res = c.get("/quiet").await;
    assert_eq!(res.status(), 200);
    assert_no_rate_limit_fields(&res);
    let res = c.get("/quiet").await;
    assert_eq!(res.status(), 429);
    let retry: u64 = res.header("retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_no_rate_limit_fields(&res);
}

fn assert_no_rate_limit_fields(res: &gateway_tests::TestResponse) {
    assert!(
        res.head
            .headers
            .keys()
            .all(|n| !n.as_str().starts_with("ratelimit")),
        "{:?}",
        res.head.headers
    );
}
