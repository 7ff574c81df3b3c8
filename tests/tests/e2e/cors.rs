//! The `cors` filter end to end, over HTTP/1.1 and HTTP/2: preflights answered by the gateway
//! (204) and never forwarded, allowed and denied origins (exact, subdomain wildcard, hostile
//! look-alikes), credentials, `Vary: Origin` appended to the terminal's, `*` echoing the
//! headers asked for, a later filter's local reply carrying the headers, and the counters.

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{Client, TestGateway, TestResponse, counter_value, http1, http2c};
use http::{Method, Request};
use http_body_util::Full;

/// A gateway (with admin) whose upstream `app` is `backend`, then `routes` (YAML from `routes:`).
pub(crate) fn with_app(backend: std::net::SocketAddr, routes: &str) -> String {
    format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app:
    targets: [{backend}]
{routes}"#
    )
}

fn config(backend: std::net::SocketAddr) -> String {
    with_app(
        backend,
        r#"routes:
  - name: api
    match: { path_prefix: /api }
    filters:
      - cors:
          allow_origins: ["https://app.example.com", "https://*.example.org"]
          allow_methods: [GET, PUT]
          allow_headers: [authorization, content-type]
          expose_headers: [x-backend]
          allow_credentials: true
          max_age: 10m
    proxy: { upstream: app }
  - name: limited
    match: { path_prefix: /limited }
    filters:
      - cors: { allow_origins: ["https://app.example.com"] }
      - rate_limit: { requests: 1, per: 1m }
    respond: { body: ok, headers: { vary: Cookie } }
  - name: open
    match: { path_prefix: /open }
    filters:
      - cors: { allow_origins: ["*"], allow_methods: ["*"], allow_headers: ["*"] }
    respond: { body: open }
"#,
    )
}

async fn send(
    c: &mut Client,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> TestResponse {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    c.send(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("request")
}

fn cors_headers(r: &TestResponse) -> Vec<String> {
    r.head
        .headers
        .keys()
        .map(|k| k.as_str().to_owned())
        .filter(|k| k.starts_with("access-control-"))
        .collect()
}

fn vary(r: &TestResponse) -> Vec<String> {
    r.head
        .headers
        .get_all("vary")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// A preflight for `method` from `origin`, asking for `headers` when given.
async fn preflight(
    c: &mut Client,
    path: &str,
    origin: &str,
    method: &str,
    headers: Option<&str>,
) -> TestResponse {
    let mut h = vec![
        ("origin", origin),
        ("access-control-request-method", method),
    ];
    h.extend(headers.map(|v| ("access-control-request-headers", v)));
    send(c, Method::OPTIONS, path, &h).await
}

async fn clients(gw: &TestGateway) -> [Client; 2] {
    [http1(gw.addr("main")).await, http2c(gw.addr("main")).await]
}

#[tokio::test]
async fn preflights_are_answered_here_and_never_forwarded() {
    let backend = Backend::start("app").await;
    let gw = TestGateway::start(&config(backend.addr())).await;
    for mut c in clients(&gw).await {
        let origin = "https://app.example.com";
        let r = preflight(&mut c, "/api/orders", origin, "PUT", Some("authorization")).await;
        assert_eq!(r.status(), 204);
        assert_eq!(
            r.header("access-control-allow-origin"),
            "https://app.example.com"
        );
        assert_eq!(r.header("access-control-allow-methods"), "GET, PUT");
        assert_eq!(
            r.header("access-control-allow-headers"),
            "authorization, content-type"
        );
        assert_eq!(r.header("access-control-allow-credentials"), "true");
        assert_eq!(r.header("access-control-max-age"), "600");
        assert_eq!(vary(&r), ["Origin"]);
        assert!(r.body.is_empty());

        // A look-alike origin, an origin with a path, a method not allowed: 204, no CORS.
        for (origin, method) in [
            ("https://app.example.com.evil.com", "PUT"),
            ("https://example.org", "PUT"),
            ("https://evil.com/.example.org", "PUT"),
            ("null", "PUT"),
            ("https://app.example.com", "DELETE"),
        ] {
            let r = send(
                &mut c,
                Method::OPTIONS,
                "/api/orders",
                &[
                    ("origin", origin),
                    ("access-control-request-method", method),
                ],
            )
            .await;
            assert_eq!(r.status(), 204, "{origin} {method}");
            assert!(cors_headers(&r).is_empty(), "{origin} {method}: {r:?}");
        }
    }
    assert_eq!(backend.requests(), 0, "a preflight reached the backend");
    let series =
        |result| format!("gateway_cors_preflights_total{{route=\"api\",result=\"{result}\"}}");
    assert_eq!(counter_value(&gw, &series("allowed")).await, 2);
    assert_eq!(counter_value(&gw, &series("denied")).await, 10);
}

#[tokio::test]
async fn actual_requests_get_headers_only_for_allowed_origins() {
    let backend = Backend::start("app").await;
    let gw = TestGateway::start(&config(backend.addr())).await;
    for mut c in clients(&gw).await {
        let r = send(
            &mut c,
            Method::GET,
            "/api/x",
            &[("origin", "https://a.b.example.org")],
        )
        .await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.header("x-backend"), "app");
        assert_eq!(
            r.header("access-control-allow-origin"),
            "https://a.b.example.org"
        );
        assert_eq!(r.header("access-control-allow-credentials"), "true");
        assert_eq!(r.header("access-control-expose-headers"), "x-backend");
        assert_eq!(vary(&r), ["Origin"]);

        let r = send(
            &mut c,
            Method::GET,
            "/api/x",
            &[("origin", "https://example.org.evil.com")],
        )
        .await;
        assert_eq!(r.status(), 200);
        assert!(cors_headers(&r).is_empty());
        assert_eq!(vary(&r), ["Origin"]);

        // Without Origin the answer still varies on it (a cache must not serve it cross-origin).
        let r = send(&mut c, Method::GET, "/api/x", &[]).await;
        assert!(cors_headers(&r).is_empty());
        assert_eq!(vary(&r), ["Origin"]);

        // OPTIONS without Access-Control-Request-Method is an ordinary request.
        let before = backend.requests();
        let r = send(
            &mut c,
            Method::OPTIONS,
            "/api/x",
            &[("origin", "https://app.example.com")],
        )
        .await;
        assert_eq!(r.header("x-backend"), "app");
        assert_eq!(
            r.header("access-control-allow-origin"),
            "https://app.example.com"
        );
        assert_eq!(backend.requests(), before + 1);
    }
    assert_eq!(
        counter_value(&gw, "gateway_cors_denied_total{route=\"api\"}").await,
        2
    );
}

#[tokio::test]
async fn star_echoes_what_is_asked_and_does_not_vary() {
    let backend = Backend::start("app").await;
    let gw = TestGateway::start(&config(backend.addr())).await;
    for mut c in clients(&gw).await {
        let asked = Some("authorization, x-trace");
        let r = preflight(&mut c, "/open", "https://anyone.example", "PATCH", asked).await;
        assert_eq!(r.status(), 204);
        assert_eq!(r.header("access-control-allow-origin"), "*");
        assert_eq!(r.header("access-control-allow-methods"), "PATCH");
        assert_eq!(
            r.header("access-control-allow-headers"),
            "authorization, x-trace"
        );
        assert_eq!(r.header("access-control-allow-credentials"), "");
        let r = send(
            &mut c,
            Method::GET,
            "/open",
            &[("origin", "https://anyone.example")],
        )
        .await;
        assert_eq!(r.text(), "open");
        assert_eq!(r.header("access-control-allow-origin"), "*");
        assert!(vary(&r).is_empty());
    }
}

#[tokio::test]
async fn a_later_filters_local_reply_carries_the_headers_and_vary_is_appended() {
    let backend = Backend::start("app").await;
    let gw = TestGateway::start(&config(backend.addr())).await;
    let mut c = http1(gw.addr("main")).await;
    let origin = [("origin", "https://app.example.com")];
    let r = send(&mut c, Method::GET, "/limited", &origin).await;
    assert_eq!(r.text(), "ok");
    assert_eq!(vary(&r), ["Cookie", "Origin"]);
    let r = send(&mut c, Method::GET, "/limited", &origin).await;
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.header("access-control-allow-origin"),
        "https://app.example.com"
    );
    assert_eq!(vary(&r), ["Origin"]);
}
