//! Live reload end to end: POST /reload, the config file watch, listeners added and removed,
//! an invalid config rejected with its location while the old one keeps serving, open HTTP/1.1,
//! HTTP/2 and WebSocket connections surviving, and a reload under load failing no request.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gateway_tests::backend::WsEcho;
use gateway_tests::{TestGateway, http1, http2c};
use tokio_tungstenite::tungstenite::Message;

fn config(body: &str, extra_listener: bool) -> String {
    let extra = if extra_listener {
        "  - name: extra\n    bind: 127.0.0.1:0\n"
    } else {
        ""
    };
    format!(
        "admin: {{ bind: 127.0.0.1:0 }}\nserver: {{ watch_config: false }}\nlisteners:\n  - name: main\n    bind: 127.0.0.1:0\n{extra}routes:\n  - name: hello\n    match: {{ path: /hello }}\n    respond: {{ body: \"{body}\" }}\n"
    )
}

/// Rewrites the config in place, keeping the bound port of `main` so the listener is kept.
fn rewrite(gw: &TestGateway, yaml: &str) {
    let port = gw.addr("main").port();
    let yaml = yaml.replacen(
        "bind: 127.0.0.1:0\n",
        &format!("bind: 127.0.0.1:{port}\n"),
        1,
    );
    // Admin keeps its port too (its bind is the first 127.0.0.1:0).
    let admin = gw.gateway().admin_addr().unwrap().port();
    let yaml = yaml.replacen(
        "admin: { bind: 127.0.0.1:0 }",
        &format!("admin: {{ bind: 127.0.0.1:{admin} }}"),
        1,
    );
    std::fs::write(gw.dir().join("gateway.yaml"), yaml).unwrap();
}

async fn admin(gw: &TestGateway, method: &str, path: &str) -> (u16, String) {
    gateway_tests::admin_request(gw, method, path, "").await
}

#[tokio::test]
async fn post_reload_swaps_routes_and_keeps_connections() {
    let mut yaml = config("v1", false);
    let gw = TestGateway::start(&yaml).await;
    // Pin `main` to its real port in the file so the reload keeps the socket.
    rewrite(&gw, &yaml);
    let addr = gw.addr("main");
    let mut h1 = http1(addr).await;
    let mut h2 = http2c(addr).await;
    assert_eq!(h1.get("/hello").await.text(), "v1");
    assert_eq!(h2.get("/hello").await.text(), "v1");

    yaml = config("v2", false);
    rewrite(&gw, &yaml);
    let (status, body) = admin(&gw, "POST", "/reload").await;
    assert_eq!(status, 200, "{body}");
    // The same connections are still open and now see the new generation.
    assert_eq!(h1.get("/hello").await.text(), "v2");
    assert_eq!(h2.get("/hello").await.text(), "v2");
    assert_eq!(gw.addr("main"), addr);
    let (_, metrics) = admin(&gw, "GET", "/metrics").await;
    assert!(
        metrics.contains("gateway_config_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn invalid_config_is_rejected_with_its_location_and_the_old_one_serves() {
    let yaml = config("v1", false);
    let gw = TestGateway::start(&yaml).await;
    rewrite(&gw, &yaml);
    let addr = gw.addr("main");
    rewrite(
        &gw,
        &yaml.replace("respond: { body: \"v1\" }", "proxy: { upstream: nowhere }"),
    );
    let (status, body) = admin(&gw, "POST", "/reload").await;
    assert_eq!(status, 400);
    assert!(
        body.contains("gateway.yaml:9:")
            && body.contains("routes[0].proxy.upstream: unknown upstream `nowhere`"),
        "{body}"
    );
    let mut c = http1(addr).await;
    assert_eq!(c.get("/hello").await.text(), "v1");
    let (_, metrics) = admin(&gw, "GET", "/metrics").await;
    assert!(
        metrics.contains("gateway_config_reloads_total{result=\"failed\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn listeners_are_added_and_removed_by_reload() {
    let yaml = config("v1", false);
    let gw = TestGateway::start(&yaml).await;
    rewrite(&gw, &config("v1", true));
    assert_eq!(admin(&gw, "POST", "/reload").await.0, 200);
    let extra = gw.addr("extra");
    let mut c = http1(extra).await;
    assert_eq!(c.get("/hello").await.text(), "v1");

    rewrite(&gw, &config("v1", false));
    assert_eq!(admin(&gw, "POST", "/reload").await.0, 200);
    // The listener no longer accepts, and its idle kept-alive connection is closed gracefully
    // (a request in flight would have finished first).
    assert!(tokio::net::TcpStream::connect(extra).await.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let req = http::Request::get("/hello")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert!(
        c.send(req).await.is_err(),
        "the idle connection on the removed listener was closed"
    );
    // The remaining listener serves on.
    let mut m = http1(gw.addr("main")).await;
    assert_eq!(m.get("/hello").await.text(), "v1");
}

#[tokio::test]
async fn a_changed_config_file_is_picked_up_by_the_watch() {
    let yaml = config("v1", false).replace("watch_config: false", "watch_config: true");
    let gw = TestGateway::start(&yaml).await;
    let addr = gw.addr("main");
    rewrite(
        &gw,
        &config("v2", false).replace("watch_config: false", "watch_config: true"),
    );
    let mut c = http1(addr).await;
    let mut seen = String::new();
    for _ in 0..50 {
        seen = c.get("/hello").await.text();
        if seen == "v2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, "v2");
}

#[tokio::test]
async fn reload_under_load_fails_no_request_and_keeps_websockets() {
    let ws = WsEcho::start().await;
    let yaml = |body: &str| {
        format!(
            "{}upstreams:\n  ws: {{ targets: [\"{}\"] }}\n",
            config(body, false).replace(
                "routes:\n",
                "routes:\n  - name: ws\n    match: { path: /ws }\n    proxy: { upstream: ws }\n"
            ),
            ws.addr()
        )
    };
    let gw = TestGateway::start(&yaml("v1")).await;
    rewrite(&gw, &yaml("v1"));
    let addr = gw.addr("main");

    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .expect("websocket");
    socket.send(Message::text("before")).await.unwrap();
    assert_eq!(
        socket.next().await.unwrap().unwrap(),
        Message::text("before")
    );

    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (ok, failed, stop) = (ok.clone(), failed.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut c = http1(addr).await;
            while !stop.load(Ordering::Relaxed) {
                let res = c.get("/hello").await;
                if res.status() == 200 && (res.text() == "v1" || res.text().starts_with('v')) {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for i in 2..7 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        rewrite(&gw, &yaml(&format!("v{i}")));
        assert_eq!(admin(&gw, "POST", "/reload").await.0, 200);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker did not panic");
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(
        ok.load(Ordering::Relaxed) > 100,
        "load ran: {}",
        ok.load(Ordering::Relaxed)
    );
    // The WebSocket opened before the reloads still echoes.
    socket.send(Message::text("after")).await.unwrap();
    assert_eq!(
        socket.next().await.unwrap().unwrap(),
        Message::text("after")
    );
    let mut c = http1(addr).await;
    assert_eq!(c.get("/hello").await.text(), "v6");
}
