//! What filters and terminals add to a request's access-log line, end to end: an
//! authentication filter's refusal and its reason (`jwt`, `basic_auth`), CORS preflights and
//! refused origins, the `Location` of a redirect (on the HTTP/1.1 fast path and over h2c), the
//! encoding a `compress` filter chose, and a request copied to a mirror. Requests with nothing
//! to say carry none of these members.

use std::time::Duration;

use bytes::Bytes;
use gateway::filter::jwt::testing::{SigningKey, jwks};
use gateway_config::JwtAlgorithm;
use gateway_tests::backend::Backend;
use gateway_tests::{TestGateway, http1, http2c, temp_dir, write_file};
use http::Request;
use http_body_util::Full;
use serde_json::Value;

fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "site.example");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

/// The access log's lines once `n` are written.
async fn lines(gw: &TestGateway, n: usize) -> Vec<Value> {
    let path = gw.dir().join("access.log");
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), n, "{text}");
    lines
}

#[tokio::test]
async fn filters_and_terminals_say_what_they_did_in_the_access_log() {
    let key = SigningKey::generate(JwtAlgorithm::EdDsa, "k");
    let dir = temp_dir();
    write_file(dir.path(), "jwks.json", jwks(&[&key]));
    let hash = bcrypt::hash("pw", 4).unwrap();
    write_file(dir.path(), "users.htpasswd", format!("alice:{hash}\n"));
    let (app, shadow) = (Backend::start("app").await, Backend::start("shadow").await);
    let yaml = format!(
        r#"
server: {{ watch_config: false }}
telemetry:
  access_log: {{ path: access.log, format: json }}
listeners:
  - name: main
    bind: 127.0.0.1:0
    protocols: [http1, http2]
upstreams:
  app: {{ targets: ["{}"] }}
  shadow: {{ targets: ["{}"] }}
routes:
  - name: jwt
    match: {{ path_prefix: /jwt }}
    filters: [ {{ jwt: {{ jwks: {{ file: jwks.json }} }} }} ]
    proxy: {{ upstream: app }}
  - name: basic
    match: {{ path_prefix: /basic }}
    filters: [ {{ basic_auth: {{ realm: r, htpasswd: users.htpasswd }} }} ]
    proxy: {{ upstream: app }}
  - name: cors
    match: {{ path_prefix: /cors }}
    filters: [ {{ cors: {{ allow_origins: ["https://app.example"] }} }} ]
    proxy: {{ upstream: app }}
  - name: moved
    match: {{ path_prefix: /old }}
    redirect: {{ path: /new, status: 301 }}
  - name: text
    match: {{ path_prefix: /text }}
    filters: [ {{ compress: {{ algorithms: [gzip], min_size: 10 }} }} ]
    respond: {{ body: "{}", headers: {{ content-type: text/plain }} }}
  - name: mirrored
    match: {{ path_prefix: /mirrored }}
    proxy: {{ upstream: app, mirror: {{ upstream: shadow }} }}
"#,
        app.addr(),
        shadow.addr(),
        "a compressible line of text ".repeat(20),
    );
    let gw = TestGateway::start_in(dir, &yaml).await;
    let addr = gw.addr("main");
    let mut c = http1(addr).await;
    let expired = key.sign(&serde_json::json!({ "sub": "bob", "exp": 1 }));
    let bearer = format!("Bearer {expired}");
    let sent: [(Request<Full<Bytes>>, u16); 7] = [
        (request("GET", "/jwt", &[("authorization", &bearer)]), 401),
        (request("GET", "/basic", &[]), 401),
        (
            request(
                "OPTIONS",
                "/cors",
                &[
                    ("origin", "https://app.example"),
                    ("access-control-request-method", "GET"),
                ],
            ),
            204,
        ),
        (
            request("GET", "/cors", &[("origin", "https://evil.example")]),
            200,
        ),
        (request("GET", "/old/page?x=1", &[]), 301),
        (request("GET", "/text", &[("accept-encoding", "gzip")]), 200),
        (request("GET", "/mirrored", &[]), 200),
    ];
    for (req, status) in sent {
        let path = req.uri().to_string();
        assert_eq!(c.send(req).await.unwrap().status(), status, "{path}");
    }
    // The general path writes the same members (a redirect over h2c).
    let mut h2 = http2c(addr).await;
    assert_eq!(
        h2.send(request("GET", "/old/h2", &[]))
            .await
            .unwrap()
            .status(),
        301
    );
    // Nothing to say: none of the members.
    assert_eq!(
        c.send(request("GET", "/cors", &[])).await.unwrap().status(),
        200
    );

    let l = lines(&gw, 9).await;
    assert_eq!(l[0]["auth"], "jwt:expired");
    assert_eq!(l[1]["auth"], "basic_auth:missing");
    assert_eq!(l[2]["cors"], "preflight");
    assert_eq!(l[3]["cors"], "denied");
    assert_eq!(l[4]["redirect"], "http://site.example/new?x=1");
    assert_eq!(l[5]["compress"], "gzip");
    assert_eq!(l[6]["mirror"], "copied");
    // (The h2c client names the gateway's address as the authority.)
    let h2_location = l[7]["redirect"].as_str().unwrap_or_default();
    assert!(h2_location.starts_with("http://127.0.0.1:") && h2_location.ends_with("/new"));
    for member in ["auth", "cors", "redirect", "compress", "mirror"] {
        assert!(l[8].get(member).is_none(), "{member} in {}", l[8]);
    }
}
