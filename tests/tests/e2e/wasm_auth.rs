//! An auth plugin (upstream SDK) that makes an HTTP call through the gateway's upstream pool
//! and pauses the request until the answer arrives: allowed requests go on with a header the
//! plugin added from the answer, others get the plugin's 403; an unreachable auth service
//! times out into a 403 too, without hanging the request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::{TestGateway, http1, temp_dir};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::wasm::{get, install};

/// An auth service: `Bearer good` gets 200 with `x-user: alice` after a short delay (so the
/// request really waits), anything else 401.
async fn auth_service() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    let ok = req
                        .headers()
                        .get("authorization")
                        .is_some_and(|v| v == "Bearer good");
                    let res = if ok {
                        Response::builder()
                            .header("x-user", "alice")
                            .body(Full::new(Bytes::from("ok")))
                    } else {
                        Response::builder()
                            .status(401)
                            .body(Full::new(Bytes::from("no")))
                    };
                    Ok::<_, Infallible>(res.unwrap())
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

fn config(auth: SocketAddr, backend: SocketAddr) -> String {
    format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  auth: {{ targets: [{auth}] }}
  app: {{ targets: [{backend}] }}
plugins:
  auth:
    wasm: auth.wasm
    config: {{ upstream: auth, path: /check, timeout_ms: 500 }}
routes:
  - match: {{ path_prefix: / }}
    filters: [ {{ plugin: auth }} ]
    proxy: {{ upstream: app }}
"#
    )
}

#[tokio::test]
async fn http_call_pauses_until_the_auth_service_answers() {
    let dir = temp_dir();
    install(dir.path(), "http_auth", "auth.wasm");
    let auth = auth_service().await;
    let backend = gateway_tests::backend::Backend::start("app").await;
    let gw = TestGateway::start_in(dir, &config(auth, backend.addr())).await;
    let mut c = http1(gw.addr("main")).await;

    let r = c
        .send(get("/private", &[("authorization", "Bearer good")]))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(backend.last().unwrap().header("x-auth-user"), "alice");

    let before = backend.requests();
    let r = c
        .send(get("/private", &[("authorization", "Bearer bad")]))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.header("x-auth"), "denied");
    assert_eq!(
        backend.requests(),
        before,
        "a denied request never reaches the upstream"
    );

    // Many at once: each paused request is resumed by its own call's answer.
    let addr = gw.addr("main");
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(tokio::spawn(async move {
            let token = if i % 2 == 0 {
                "Bearer good"
            } else {
                "Bearer nope"
            };
            let mut c = http1(addr).await;
            let r = c
                .send(get("/p", &[("authorization", token)]))
                .await
                .unwrap();
            (i, r.status())
        }));
    }
    for t in tasks {
        let (i, status) = t.await.unwrap();
        assert_eq!(status, if i % 2 == 0 { 200 } else { 403 });
    }
}

#[tokio::test]
async fn unreachable_auth_service_times_out_into_a_denial() {
    let dir = temp_dir();
    install(dir.path(), "http_auth", "auth.wasm");
    // A listener that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let auth = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let backend = gateway_tests::backend::Backend::start("app").await;
    let gw = TestGateway::start_in(dir, &config(auth, backend.addr())).await;
    let mut c = http1(gw.addr("main")).await;
    let started = std::time::Instant::now();
    let r = c
        .send(get("/x", &[("authorization", "Bearer good")]))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(started.elapsed() < Duration::from_secs(3));
}
