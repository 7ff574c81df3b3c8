//! The `jwt` filter end to end: a real JWKS endpoint started by the test, tokens signed by keys
//! the test generates (RSA, EC and Ed25519), a backend recording the headers it got, over
//! HTTP/1.1 (through the fast path) and HTTP/2. Covers the 401 challenges, claims set as
//! headers (and the client's forged copies removed), key rotation without a reload (an unknown
//! `kid` fetches the set again at once, rate-limited), a dead endpoint (the last good keys
//! stay), no keys at all (a bounded wait, then 401), keys from a file with the token in a
//! cookie, the access log's user, the claims as a Wasm plugin's properties, and a reload that
//! keeps the keys it had.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gateway::filter::jwt::testing::{SigningKey, jwks, now};
use gateway_config::JwtAlgorithm;
use gateway_tests::backend::Backend;
use gateway_tests::{
    Client, TestGateway, admin_request, counter_value, fast_path_chain_count, http1, http2c,
    refusing_addr, temp_dir, write_file,
};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// A JWKS endpoint: serves the current set at any path, or 503 while it is "down".
struct JwksServer {
    addr: SocketAddr,
    body: Arc<Mutex<Option<String>>>,
    hits: Arc<AtomicUsize>,
}

impl JwksServer {
    async fn start(set: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let body = Arc::new(Mutex::new(Some(set)));
        let hits = Arc::new(AtomicUsize::new(0));
        let (b, h) = (body.clone(), hits.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (b, h) = (b.clone(), h.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| {
                        h.fetch_add(1, Ordering::SeqCst);
                        let current = b.lock().unwrap().clone();
                        async move {
                            let res = match current {
                                Some(text) => Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(text))),
                                None => Response::builder()
                                    .status(StatusCode::SERVICE_UNAVAILABLE)
                                    .body(Full::new(Bytes::new())),
                            };
                            Ok::<_, Infallible>(res.unwrap())
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Self { addr, body, hits }
    }

    fn url(&self) -> String {
        format!("http://{}/.well-known/jwks.json", self.addr)
    }

    fn publish(&self, set: Option<String>) {
        *self.body.lock().unwrap() = set;
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn config(jwks: &str, backend: SocketAddr) -> String {
    format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app: {{ targets: ["{backend}"] }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    filters:
      - jwt:
          issuer: https://id.example
          audiences: [orders]
          jwks: {jwks}
          claims_to_headers: {{ sub: x-user-id, roles: x-roles }}
    proxy: {{ upstream: app }}
"#
    )
}

/// An identity provider publishing `keys`, a backend, and the gateway between them fetching
/// the keys every `refresh`, with an HTTP/1.1 client.
async fn start(keys: &[&SigningKey], refresh: &str) -> (JwksServer, Backend, TestGateway, Client) {
    let idp = JwksServer::start(jwks(keys)).await;
    let backend = Backend::start("app").await;
    let jwks_key = format!("{{ url: \"{}\", refresh: {refresh} }}", idp.url());
    let gw = TestGateway::start(&config(&jwks_key, backend.addr())).await;
    let c = http1(gw.addr("main")).await;
    (idp, backend, gw, c)
}

fn claims() -> Value {
    json!({ "iss": "https://id.example", "aud": ["orders", "other"], "sub": "alice",
            "roles": ["reader"], "exp": now() + 600, "iat": now() })
}

async fn get(c: &mut Client, token: Option<&str>, extra: &[(&str, &str)]) -> (u16, String) {
    let mut b = Request::get("/api/orders");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    for (k, v) in extra {
        b = b.header(*k, *v);
    }
    let res = c
        .send(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    (res.status(), res.header("www-authenticate").to_owned())
}

async fn jwt_count(gw: &TestGateway, result: &str) -> u64 {
    let series = format!(r#"gateway_jwt_requests_total{{route="api",result="{result}"}}"#);
    counter_value(gw, &series).await
}

#[tokio::test]
async fn tokens_of_the_published_keys_pass_over_http1_and_http2() {
    let rsa = SigningKey::generate(JwtAlgorithm::Rs256, "rsa-1");
    let ec = SigningKey::generate(JwtAlgorithm::Es256, "ec-1");
    let ed = SigningKey::generate(JwtAlgorithm::EdDsa, "ed-1");
    let (idp, backend, gw, mut c) = start(&[&rsa, &ec, &ed], "10m").await;
    let (status, challenge) = get(&mut c, None, &[]).await;
    assert_eq!((status, challenge.as_str()), (401, r#"Bearer realm="api""#));
    assert_eq!(backend.requests(), 0);

    let chained = fast_path_chain_count(&gw, "main").await;
    for key in [&rsa, &ec, &ed] {
        let token = key.sign(&claims());
        let forged = [("x-user-id", "mallory"), ("x-roles", "admin")];
        assert_eq!(get(&mut c, Some(&token), &forged).await.0, 200);
        let seen = backend.last().unwrap();
        assert_eq!(seen.headers.get_all("x-user-id").iter().count(), 1);
        assert_eq!(seen.header("x-user-id"), "alice");
        assert_eq!(seen.header("x-roles"), r#"["reader"]"#);
        // The token goes on to the upstream as it came.
        assert_eq!(seen.header("authorization"), format!("Bearer {token}"));
    }
    assert!(fast_path_chain_count(&gw, "main").await >= chained + 3);

    let mut expired = claims();
    expired["exp"] = json!(now() - 3600);
    let (status, challenge) = get(&mut c, Some(&rsa.sign(&expired)), &[]).await;
    assert_eq!(status, 401);
    assert_eq!(
        challenge,
        r#"Bearer realm="api", error="invalid_token", error_description="token expired""#
    );
    let mut other_audience = claims();
    other_audience["aud"] = json!("billing");
    assert_eq!(
        get(&mut c, Some(&ec.sign(&other_audience)), &[]).await.0,
        401
    );
    let (status, challenge) = get(&mut c, Some("not.a.token"), &[]).await;
    assert_eq!(status, 401);
    assert!(
        challenge.contains(r#"error="invalid_token""#),
        "{challenge}"
    );

    let mut h2 = http2c(gw.addr("main")).await;
    assert_eq!(
        get(&mut h2, Some(&ed.sign(&claims())), &[("x-user-id", "x")])
            .await
            .0,
        200
    );
    assert_eq!(backend.last().unwrap().header("x-user-id"), "alice");
    assert_eq!(get(&mut h2, None, &[]).await.0, 401);

    assert_eq!(jwt_count(&gw, "ok").await, 4);
    assert_eq!(jwt_count(&gw, "missing").await, 2);
    assert_eq!(jwt_count(&gw, "expired").await, 1);
    assert_eq!(jwt_count(&gw, "wrong_audience").await, 1);
    assert!(jwt_count(&gw, "malformed").await >= 1);
    let fetches = format!(
        r#"gateway_jwks_fetches_total{{source="{}",result="ok"}}"#,
        idp.url()
    );
    assert!(counter_value(&gw, &fetches).await >= 1);
    assert_eq!(idp.hits(), 1, "one fetch serves every request");
}

#[tokio::test]
async fn a_rotated_key_is_fetched_at_once_without_a_reload() {
    let old = SigningKey::generate(JwtAlgorithm::Rs256, "2026-01");
    let new = SigningKey::generate(JwtAlgorithm::Ps256, "2026-02");
    let (idp, backend, gw, mut c) = start(&[&old], "1h").await;
    assert_eq!(get(&mut c, Some(&old.sign(&claims())), &[]).await.0, 200);
    assert_eq!(idp.hits(), 1);

    // The identity provider rotates: the new kid is unknown to the cached set.
    idp.publish(Some(jwks(&[&old, &new])));
    assert_eq!(get(&mut c, Some(&new.sign(&claims())), &[]).await.0, 200);
    assert_eq!(idp.hits(), 2, "one refetch for the unknown kid");
    assert_eq!(backend.last().unwrap().header("x-user-id"), "alice");

    // A kid nobody publishes: refused, and right after a refetch it asks for none.
    let stranger = SigningKey::generate(JwtAlgorithm::Rs256, "forged");
    let (status, challenge) = get(&mut c, Some(&stranger.sign(&claims())), &[]).await;
    assert_eq!(status, 401);
    assert!(challenge.contains("unknown signing key"), "{challenge}");
    assert_eq!(idp.hits(), 2, "refetches are rate-limited");
    assert_eq!(jwt_count(&gw, "unknown_key").await, 1);
    // Over HTTP/2 too, the new key is the cached one now.
    let mut h2 = http2c(gw.addr("main")).await;
    assert_eq!(get(&mut h2, Some(&new.sign(&claims())), &[]).await.0, 200);
}

#[tokio::test]
async fn the_last_good_keys_outlive_a_dead_endpoint() {
    let key = SigningKey::generate(JwtAlgorithm::Es384, "k");
    let (idp, _backend, gw, mut c) = start(&[&key], "1s").await;
    assert_eq!(get(&mut c, Some(&key.sign(&claims())), &[]).await.0, 200);

    idp.publish(None);
    let failed = format!(
        r#"gateway_jwks_fetches_total{{source="{}",result="failed"}}"#,
        idp.url()
    );
    for _ in 0..50 {
        if counter_value(&gw, &failed).await >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(counter_value(&gw, &failed).await >= 1, "the refresh failed");
    assert_eq!(get(&mut c, Some(&key.sign(&claims())), &[]).await.0, 200);
}

#[tokio::test]
async fn without_any_key_set_tokens_are_refused_after_a_bounded_wait() {
    let key = SigningKey::generate(JwtAlgorithm::Rs256, "k");
    let backend = Backend::start("app").await;
    let jwks_key = format!("{{ url: \"http://{}/jwks\" }}", refusing_addr());
    let gw = TestGateway::start(&config(&jwks_key, backend.addr())).await;
    let mut c = http1(gw.addr("main")).await;
    let started = std::time::Instant::now();
    let (status, challenge) = get(&mut c, Some(&key.sign(&claims())), &[]).await;
    assert_eq!(status, 401);
    assert!(
        challenge.contains("signing keys unavailable"),
        "{challenge}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(jwt_count(&gw, "keys_unavailable").await, 1);
    assert_eq!(backend.requests(), 0);
}

#[tokio::test]
async fn keys_from_a_file_a_token_in_a_cookie_and_the_user_in_the_access_log() {
    let key = SigningKey::generate(JwtAlgorithm::EdDsa, "file-key");
    let dir = temp_dir();
    write_file(dir.path(), "jwks.json", jwks(&[&key]));
    let backend = Backend::start("app").await;
    let yaml = format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
telemetry:
  access_log: {{ path: access.log, format: json }}
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app: {{ targets: ["{}"] }}
routes:
  - name: site
    match: {{ path_prefix: / }}
    filters:
      - jwt:
          jwks: {{ file: jwks.json }}
          from: cookie:session
          required: false
          claims_to_headers: {{ sub: x-user-id }}
    proxy: {{ upstream: app }}
"#,
        backend.addr()
    );
    let gw = TestGateway::start_in(dir, &yaml).await;
    let mut c = http1(gw.addr("main")).await;
    let send = |cookie: Option<String>| {
        let mut b = Request::get("/page").header("x-user-id", "mallory");
        if let Some(cookie) = cookie {
            b = b.header("cookie", cookie);
        }
        b.body(Full::new(Bytes::new())).unwrap()
    };
    // No token: let through, without the forged identity.
    assert_eq!(c.send(send(None)).await.unwrap().status(), 200);
    assert_eq!(backend.last().unwrap().header("x-user-id"), "");
    let token = key.sign(&json!({ "sub": "bob", "exp": now() + 60 }));
    let res = c
        .send(send(Some(format!("theme=dark; session={token}"))))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(backend.last().unwrap().header("x-user-id"), "bob");
    // A bad token is refused even though a token is optional.
    let res = c.send(send(Some("session=a.b.c".into()))).await.unwrap();
    assert_eq!(res.status(), 401);

    let path = gw.dir().join("access.log");
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let users: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["user"].clone())
        .collect();
    assert_eq!(users, [Value::Null, json!("bob"), Value::Null], "{text}");
}

/// A Wasm plugin after the filter reads the verified claims as `jwt.claims.NAME` properties.
#[tokio::test]
async fn plugins_read_the_verified_claims_as_properties() {
    let key = SigningKey::generate(JwtAlgorithm::Es256, "k");
    let dir = temp_dir();
    write_file(dir.path(), "jwks.json", jwks(&[&key]));
    crate::wasm::install(dir.path(), "late_reader", "late.wasm");
    let yaml = r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
plugins:
  late: { wasm: late.wasm }
routes:
  - name: hello
    match: { path_prefix: / }
    filters:
      - jwt: { jwks: { file: jwks.json }, required: false }
      - plugin: late
    respond: { status: 200, body: "hello" }
"#;
    let gw = TestGateway::start_in(dir, yaml).await;
    for mut c in [http1(gw.addr("main")).await, http2c(gw.addr("main")).await] {
        let token = key.sign(&json!({ "sub": "carol", "exp": now() + 60 }));
        let req = Request::get("/")
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let res = c.send(req).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.header("x-late-jwt-sub"), "carol");
        let res = c.get("/").await;
        assert_eq!((res.status(), res.header("x-late-jwt-sub")), (200, ""));
    }
}

/// A reload builds new filters on the same key source: no refetch, no window without keys.
#[tokio::test]
async fn a_reload_keeps_the_fetched_keys() {
    let key = SigningKey::generate(JwtAlgorithm::Rs512, "k");
    let (idp, _backend, gw, mut c) = start(&[&key], "1h").await;
    assert_eq!(get(&mut c, Some(&key.sign(&claims())), &[]).await.0, 200);
    let path = gw.dir().join("gateway.yaml");
    let admin = gw.gateway().admin_addr().unwrap().port();
    let main = gw.addr("main").port();
    let yaml = std::fs::read_to_string(&path)
        .unwrap()
        .replacen(
            "bind: 127.0.0.1:0 }",
            &format!("bind: 127.0.0.1:{admin} }}"),
            1,
        )
        .replacen(
            "bind: 127.0.0.1:0\n",
            &format!("bind: 127.0.0.1:{main}\n"),
            1,
        );
    std::fs::write(
        &path,
        yaml.replace("audiences: [orders]", "audiences: [orders, more]"),
    )
    .unwrap();
    let (status, body) = admin_request(&gw, "POST", "/reload", "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get(&mut c, Some(&key.sign(&claims())), &[]).await.0, 200);
    assert_eq!(
        idp.hits(),
        1,
        "the reloaded filter uses the keys already fetched"
    );
}
