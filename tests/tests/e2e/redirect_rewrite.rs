//! The `redirect` terminal and the `rewrite` filter end to end, over HTTP/1.1 (the fast path's
//! own answers, its general path and hyper's server) and h2c: every status and every part of a `Location`, HTTP→HTTPS,
//! `HEAD`, a redirect behind filters; rewritten paths and hosts as a real backend and static
//! files see them, and a rewrite that makes no valid path.

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{
    Client, TestGateway, counter_value, fast_path_chain_count, fast_path_count, http1, http2c, raw,
    raw_status, temp_dir, write_file,
};
use http::Request;
use http_body_util::Full;

const REDIRECTS: &str = r#"
admin: { bind: 127.0.0.1:0 }
listeners:
  - name: main
    bind: 127.0.0.1:0
routes:
  - { name: s301, match: { path: /s301 }, redirect: { path: /new, status: 301 } }
  - { name: s302, match: { path: /s302 }, redirect: { path: /new } }
  - { name: s303, match: { path: /s303 }, redirect: { path: /new, status: 303 } }
  - { name: s307, match: { path: /s307 }, redirect: { path: /new, status: 307 } }
  - { name: s308, match: { path: /s308 }, redirect: { path: /new, status: 308 } }
  - name: to-https
    match: { path_prefix: /secure }
    redirect: { scheme: https }
  - name: elsewhere
    match: { path_prefix: /elsewhere }
    redirect: { scheme: https, host: example.org, port: 8443, strip_query: true }
  - name: moved
    match: { path_prefix: /docs/ }
    redirect: { replace_prefix: /manual, status: 301 }
  - name: filtered
    match: { path_prefix: /filtered }
    filters:
      - headers: { response_set: { x-chain: ran } }
    redirect: { path: /landing, status: 307 }
"#;

fn req(method: &str, path: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

async fn clients(gw: &TestGateway) -> Vec<(&'static str, Client)> {
    let addr = gw.addr("main");
    vec![("h1", http1(addr).await), ("h2c", http2c(addr).await)]
}

#[tokio::test]
async fn every_status_and_part_of_a_redirect_over_http1_and_http2() {
    let gw = TestGateway::start(REDIRECTS).await;
    let authority = gw.addr("main").to_string();
    for (proto, mut c) in clients(&gw).await {
        for (path, status) in [
            ("/s301", 301),
            ("/s302", 302),
            ("/s303", 303),
            ("/s307", 307),
            ("/s308", 308),
        ] {
            let res = c.send(req("GET", &format!("{path}?a=1"))).await.unwrap();
            assert_eq!(res.status(), status, "{proto} {path}");
            // The scheme is unchanged: the client's port stays, and the query too.
            assert_eq!(
                res.header("location"),
                format!("http://{authority}/new?a=1"),
                "{proto} {path}"
            );
            assert_eq!(res.header("content-type"), "text/html");
            assert!(res.text().contains(&format!("<title>{status} ")), "{proto}");
        }
        let cases = [
            ("/secure/x?q=1", "https://127.0.0.1/secure/x?q=1"),
            ("/elsewhere/y?q=1", "https://example.org:8443/elsewhere/y"),
            (
                "/docs/guide/intro?v=2",
                "http://{authority}/manual/guide/intro?v=2",
            ),
        ];
        for (path, want) in cases {
            let res = c.send(req("GET", path)).await.unwrap();
            let want = want.replace("{authority}", &authority);
            assert_eq!(res.header("location"), want, "{proto} {path}");
        }
        // HEAD: the page's length, no page.
        let res = c.send(req("HEAD", "/s301")).await.unwrap();
        assert_eq!(res.status(), 301);
        assert!(res.body.is_empty(), "{proto}");
        assert_ne!(res.header("content-length"), "0");
        // Behind filters: the chain runs, and its response hooks see the redirect.
        let res = c.send(req("GET", "/filtered/a")).await.unwrap();
        assert_eq!(res.status(), 307);
        assert_eq!(
            res.header("location"),
            format!("http://{authority}/landing")
        );
        assert_eq!(res.header("x-chain"), "ran", "{proto}");
        // A request with a body is read, then redirected.
        let post = Request::post("/s308")
            .body(Full::new(Bytes::from_static(b"payload")))
            .unwrap();
        assert_eq!(c.send(post).await.unwrap().status(), 308, "{proto}");
    }
    let counted = counter_value(
        &gw,
        r#"gateway_http_redirects_total{route="s301",status="301"}"#,
    );
    assert_eq!(counted.await, 4, "GET and HEAD on two protocols");
    // HTTP/1.1: every body-less request is the fast path's (the POST is hyper's); a redirect
    // without filters is its own answer, one behind filters goes through the chain.
    assert_eq!(fast_path_count(&gw, "main").await, 10);
    assert_eq!(fast_path_chain_count(&gw, "main").await, 1);
}

#[tokio::test]
async fn a_hostile_host_never_reaches_a_location() {
    let gw = TestGateway::start(REDIRECTS).await;
    for host in ["evil.example/x", "a\"b", "a,b", "evil.example@x"] {
        let head = format!("GET /secure HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = raw(gw.addr("main"), head.as_bytes()).await;
        assert_eq!(raw_status(&answer), 400, "{host}: {answer}");
        assert!(
            !answer.to_ascii_lowercase().contains("location:"),
            "{answer}"
        );
    }
    // No Host at all (HTTP/1.0): the listener's own address.
    let answer = raw(gw.addr("main"), b"GET /s301 HTTP/1.0\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.0 301 "), "{answer}");
    let want = format!("location: http://{}/new\r\n", gw.addr("main"));
    assert!(answer.to_ascii_lowercase().contains(&want), "{answer}");
}

fn rewrites(backend: &Backend) -> String {
    format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app:
    targets: [{}]
routes:
  - name: orders
    match: {{ path_prefix: /orders }}
    filters:
      - rewrite: {{ path_regex: "^/orders/([0-9]+)$", to: "/v2/orders/$1" }}
    proxy: {{ upstream: app }}
  - name: api
    match: {{ path_prefix: /api }}
    filters:
      - rewrite: {{ replace_prefix: /internal/v3, host: "api.internal:9000" }}
    proxy: {{ upstream: app }}
  - name: fixed
    match: {{ path: /fixed }}
    filters:
      - rewrite: {{ path: /elsewhere }}
    proxy: {{ upstream: app }}
  - name: broken
    match: {{ path_prefix: /broken }}
    filters:
      - rewrite: {{ path_regex: "^/broken/(.*)$", to: "/x/.$1" }}
      # `/broken/` makes `/x/.`: a dot segment.
    proxy: {{ upstream: app }}
"#,
        backend.addr()
    )
}

#[tokio::test]
async fn a_backend_sees_the_rewritten_path_and_host() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&rewrites(&b)).await;
    for (proto, mut c) in clients(&gw).await {
        let cases = [
            ("/orders/42?x=1", "/v2/orders/42?x=1"),
            ("/orders/abc", "/orders/abc"),
            ("/api/users/7?page=2", "/internal/v3/users/7?page=2"),
            ("/api", "/internal/v3"),
            ("/fixed?k=v", "/elsewhere?k=v"),
        ];
        for (path, want) in cases {
            let res = c.send(req("GET", path)).await.unwrap();
            assert_eq!(res.status(), 200, "{proto} {path}");
            let seen = b.last().unwrap();
            let target = seen.uri.path_and_query().unwrap().as_str();
            assert_eq!(target, want, "{proto} {path}");
        }
        c.send(req("GET", "/api/x")).await.unwrap();
        assert_eq!(
            b.last().unwrap().header("host"),
            "api.internal:9000",
            "{proto}"
        );
        c.send(req("GET", "/orders/1")).await.unwrap();
        assert_eq!(
            b.last().unwrap().header("host"),
            gw.addr("main").to_string()
        );
        // A rule that makes a dot segment: 500, counted, nothing forwarded.
        let before = b.requests();
        let res = c.send(req("GET", "/broken/")).await.unwrap();
        assert_eq!(res.status(), 500, "{proto}");
        assert_eq!(b.requests(), before, "{proto}: garbage reached the backend");
    }
    let failures = r#"gateway_http_rewrite_failures_total{route="broken"}"#;
    assert_eq!(counter_value(&gw, failures).await, 2);
}

#[tokio::test]
async fn static_files_serve_the_rewritten_path() {
    let dir = temp_dir();
    write_file(dir.path(), "public/v2/page.txt", "version two");
    let yaml = r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
routes:
  - name: old
    match: { path_prefix: /old }
    filters:
      - rewrite: { replace_prefix: /v2 }
    static: { root: public }
"#;
    let gw = TestGateway::start_in(dir, yaml).await;
    for (proto, mut c) in clients(&gw).await {
        let res = c.send(req("GET", "/old/page.txt?cache=no")).await.unwrap();
        assert_eq!(res.status(), 200, "{proto}");
        assert_eq!(res.text(), "version two");
        let res = c.send(req("GET", "/v2/page.txt")).await.unwrap();
        assert_eq!(
            res.status(),
            404,
            "{proto}: the router matched on the original"
        );
    }
}
