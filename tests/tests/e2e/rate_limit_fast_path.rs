//! A route whose one filter is a local `rate_limit` is answered on the HTTP/1.1 fast path, in
//! front of a fixed response or the proxy: allowed and refused (429) answers are the general
//! path's, field for field; both paths take tokens from the same buckets and count refusals
//! alike; an upstream's own RateLimit fields are replaced by the route's.

use std::time::Duration;

use gateway_tests::backend::Backend;
use gateway_tests::{
    FAST_AND_GENERAL_LISTENERS, TestGateway, counter_value, fast_path_count, normalized_response,
    raw_target, raw_with_timeout,
};

async fn start(backend: &str) -> TestGateway {
    let yaml = format!(
        r#"{FAST_AND_GENERAL_LISTENERS}upstreams:
  origin: {{ targets: ["{backend}"] }}
routes:
  - name: keyed
    match: {{ path: /keyed }}
    filters:
      - rate_limit: {{ requests: 1, per: 1m, key: "header:x-api-key" }}
    respond: {{ status: 200, body: "ok\n", headers: {{ content-type: text/plain }} }}
  - name: old-fields
    match: {{ path: /old }}
    filters:
      - rate_limit: {{ requests: 1, per: 1m, key: "header:x-api-key", headers: draft-06 }}
    respond: {{ body: "ok\n" }}
  - name: by-ip
    match: {{ path: /by-ip }}
    filters:
      - rate_limit: {{ requests: 2, per: 1m }}
    respond: {{ body: "ok\n" }}
  - name: proxied
    match: {{ path_prefix: /api }}
    filters:
      - rate_limit: {{ requests: 1, per: 1m, key: "header:x-api-key" }}
    proxy: {{ upstream: origin }}
"#
    );
    TestGateway::start(&yaml).await
}

async fn ask(gw: &TestGateway, listener: &str, method: &str, path: &str, key: &str) -> String {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: a\r\nX-Api-Key: {key}\r\nConnection: close\r\n\r\n"
    );
    raw_with_timeout(
        gw.addr(listener),
        request.as_bytes(),
        Duration::from_secs(5),
    )
    .await
}

async fn limited_total(gw: &TestGateway, route: &str) -> u64 {
    counter_value(
        gw,
        &format!("gateway_rate_limited_total{{route=\"{route}\"}}"),
    )
    .await
}

#[tokio::test]
async fn allowed_and_refused_answers_are_the_general_paths() {
    let backend = Backend::start("origin").await;
    let gw = start(&backend.addr().to_string()).await;
    for (method, path, route) in [
        ("GET", "/keyed", "keyed"),
        ("HEAD", "/keyed", "keyed"),
        ("GET", "/old", "old-fields"),
        ("GET", "/api/x", "proxied"),
    ] {
        let mut answers = Vec::new();
        for listener in ["fast", "general"] {
            // Each listener's requests have a key of their own, so each starts on a full bucket.
            let key = format!("{listener}-{method}-{path}");
            let before = (
                fast_path_count(&gw, listener).await,
                limited_total(&gw, route).await,
            );
            let allowed = ask(&gw, listener, method, path, &key).await;
            let refused = ask(&gw, listener, method, path, &key).await;
            let after = (
                fast_path_count(&gw, listener).await,
                limited_total(&gw, route).await,
            );
            let fast = u64::from(listener == "fast");
            assert_eq!(after.0 - before.0, 2 * fast, "{listener} {method} {path}");
            assert_eq!(
                after.1 - before.1,
                1,
                "{listener} {method} {path}: one refusal counted"
            );
            answers.push((normalized_response(&allowed), normalized_response(&refused)));
        }
        assert_eq!(answers[0], answers[1], "{method} {path}");
        let ((status, fields, _), (refused, refused_fields, _)) = &answers[0];
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "{method} {path}: {status}"
        );
        assert!(
            refused.starts_with("HTTP/1.1 429"),
            "{method} {path}: {refused}"
        );
        assert!(
            refused_fields
                .iter()
                .any(|f| f.starts_with("retry-after: "))
        );
        let policy = if path == "/old" {
            "ratelimit-limit: 1"
        } else {
            "ratelimit-policy: "
        };
        assert!(fields.iter().any(|f| f.starts_with(policy)), "{fields:?}");
        assert!(refused_fields.iter().any(|f| f.starts_with(policy)));
    }
}

#[tokio::test]
async fn both_paths_take_tokens_from_one_bucket() {
    let backend = Backend::start("origin").await;
    let gw = start(&backend.addr().to_string()).await;
    // Keyed by the client's address: the two listeners' requests share 127.0.0.1's bucket.
    let first = ask(&gw, "fast", "GET", "/by-ip", "-").await;
    let second = ask(&gw, "general", "GET", "/by-ip", "-").await;
    let third = ask(&gw, "fast", "GET", "/by-ip", "-").await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(first.contains(r#"ratelimit: "by-ip";r=1;"#), "{first}");
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(second.contains(r#"ratelimit: "by-ip";r=0;"#), "{second}");
    assert!(third.starts_with("HTTP/1.1 429"), "{third}");
    assert_eq!(limited_total(&gw, "by-ip").await, 1);
    // A refused proxied request never reaches the upstream.
    let seen = backend.requests();
    let ok = ask(&gw, "fast", "GET", "/api/y", "k").await;
    let refused = ask(&gw, "fast", "GET", "/api/y", "k").await;
    assert!(ok.starts_with("HTTP/1.1 200") && refused.starts_with("HTTP/1.1 429"));
    assert_eq!(backend.requests(), seen + 1);
}

#[tokio::test]
async fn an_upstreams_rate_limit_fields_give_way_to_the_routes() {
    // An upstream that sets RateLimit fields of its own.
    let addr = raw_target(b"HTTP/1.1 200 OK\r\nRateLimit: \"up\";r=9;t=9\r\nRateLimit-Policy: \"up\";q=10;w=9\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
    let gw = start(&addr.to_string()).await;
    let mut answers = Vec::new();
    for listener in ["fast", "general"] {
        let out = ask(&gw, listener, "GET", "/api/z", listener).await;
        answers.push(normalized_response(&out));
    }
    assert_eq!(answers[0], answers[1]);
    let fields = &answers[0].1;
    assert!(!fields.iter().any(|f| f.contains("\"up\"")), "{fields:?}");
    assert!(
        fields
            .iter()
            .any(|f| f.starts_with("ratelimit: \"proxied\";r=0;")),
        "{fields:?}"
    );
}
