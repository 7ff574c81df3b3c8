//! Reverse proxy end to end: balancing (distribution per algorithm, consistent-hash stickiness
//! and minimal remapping), passive ejection of a killed backend, recovery through active
//! checks, and all targets down (which only active checks can make; see `proxy_health` for
//! what passive health counts). Shared helpers for the other `proxy_*` modules live here.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{TestGateway, TestResponse, http1, refusing_addr};
use http::Request;
use http_body_util::Full;
use stream_proxy::upstream::Health;

/// A gateway with one listener `main` and one upstream `app` (its settings given as YAML
/// lines indented by four spaces) behind a catch-all route with extra `route` settings.
pub(crate) fn yaml(upstream: &str, route: &str) -> String {
    format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  app:
{upstream}
routes:
  - name: app
    match: {{ path_prefix: / }}
    proxy: {{ upstream: app{route} }}
"#
    )
}

/// `[a, b, ...]` for a targets list.
pub(crate) fn targets(addrs: &[SocketAddr]) -> String {
    let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    format!("[{}]", list.join(", "))
}

/// A port nothing listens on.
pub(crate) fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(path).body(Full::new(Bytes::new())).unwrap()
}

/// GETs `path` `n` times on one connection; counts answers by `x-backend` (or by status when
/// the gateway answered itself).
async fn tally(gw: &TestGateway, path: &str, n: usize) -> HashMap<String, usize> {
    let mut c = http1(gw.addr("main")).await;
    let mut out = HashMap::new();
    for _ in 0..n {
        let r = c.get(path).await;
        *out.entry(who(&r)).or_default() += 1;
    }
    out
}

fn who(r: &TestResponse) -> String {
    match r.header("x-backend") {
        "" => format!("status {}", r.status()),
        b => b.to_owned(),
    }
}

async fn backends(names: &[&str]) -> Vec<Backend> {
    let mut out = Vec::new();
    for n in names {
        out.push(Backend::start(n).await);
    }
    out
}

fn addrs(b: &[Backend]) -> Vec<SocketAddr> {
    b.iter().map(Backend::addr).collect()
}

pub(crate) fn upstream(gw: &TestGateway) -> std::sync::Arc<gateway::proxy::Upstream> {
    gw.gateway()
        .generation()
        .upstreams
        .get("app")
        .expect("upstream app")
        .clone()
}

#[tokio::test]
async fn round_robin_follows_weights_exactly() {
    let b = backends(&["a", "b", "c"]).await;
    let a = addrs(&b);
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: [{}, {}, {{ address: {}, weight: 2 }}]",
            a[0], a[1], a[2]
        ),
        "",
    ))
    .await;
    let t = tally(&gw, "/", 40).await;
    assert_eq!((t["a"], t["b"], t["c"]), (10, 10, 20), "{t:?}");
}

#[tokio::test]
async fn least_requests_avoids_the_busy_target() {
    let b = backends(&["a", "b"]).await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: {}\n    balance: least_requests",
            targets(&addrs(&b))
        ),
        "",
    ))
    .await;
    // Idle: ties rotate, so the split is even.
    let t = tally(&gw, "/", 20).await;
    assert_eq!((t["a"], t["b"]), (10, 10), "{t:?}");

    // One slow request in flight on one target: the next requests all go to the other.
    let addr = gw.addr("main");
    let slow = tokio::spawn(async move { http1(addr).await.get("/slow/2000").await });
    let is_slow = |b: &Backend| b.last().is_some_and(|s| s.uri.path() == "/slow/2000");
    let mut busy = None;
    for _ in 0..100 {
        if is_slow(&b[0]) || is_slow(&b[1]) {
            busy = Some(if is_slow(&b[0]) { "a" } else { "b" });
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let busy = busy.expect("the slow request reached a backend");
    let t = tally(&gw, "/", 10).await;
    assert_eq!(t.get(busy), None, "{t:?}");
    assert_eq!(slow.await.unwrap().status(), 200);
}

#[tokio::test]
async fn random_spreads_load() {
    let b = backends(&["a", "b", "c"]).await;
    let gw = TestGateway::start(&yaml(
        &format!("    targets: {}\n    balance: random", targets(&addrs(&b))),
        "",
    ))
    .await;
    let t = tally(&gw, "/", 300).await;
    for name in ["a", "b", "c"] {
        assert!((60..=140).contains(&t[name]), "{t:?}");
    }
}

async fn place(c: &mut gateway_tests::Client, user: u32) -> String {
    let req = Request::get("/")
        .header("x-user", format!("user-{user}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    who(&c.send(req).await.unwrap())
}

#[tokio::test]
async fn consistent_hash_is_sticky_and_remaps_only_the_lost_share() {
    let mut b = backends(&["a", "b", "c", "d"]).await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: {}\n    balance: consistent_hash\n    hash_on: header:x-user\n    retries: 1\n    health_check: {{ unhealthy_after: 1, eject_for: 60s }}",
            targets(&addrs(&b))
        ),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    let mut before = Vec::new();
    for u in 0..200 {
        before.push(place(&mut c, u).await);
    }
    for u in 0..200 {
        assert_eq!(place(&mut c, u).await, before[u as usize], "user-{u} moved");
    }
    let per: HashMap<&str, usize> = before.iter().fold(HashMap::new(), |mut m, w| {
        *m.entry(w.as_str()).or_default() += 1;
        m
    });
    assert_eq!(per.len(), 4, "every target owns some users: {per:?}");

    b[2].stop().await; // "c" goes away; its users move, nobody else's do.
    for u in 0..200 {
        let now = place(&mut c, u).await;
        if before[u as usize] == "c" {
            assert!(["a", "b", "d"].contains(&now.as_str()), "user-{u}: {now}");
        } else {
            assert_eq!(
                now, before[u as usize],
                "user-{u} moved though its target is up"
            );
        }
    }
}

/// A balancer keyed on a cookie places a request by the one rule whichever path forwards it: a
/// `GET` goes out as the fast path's text (no header map), a `POST` with a body through the
/// general path, and a user's both land on the same target.
#[tokio::test]
async fn a_cookie_keyed_balancer_places_a_user_alike_on_both_paths() {
    let b = backends(&["a", "b", "c", "d"]).await;
    let yaml = format!(
        "admin: {{ bind: 127.0.0.1:0 }}\n{}",
        yaml(
            &format!(
                "    targets: {}\n    balance: consistent_hash\n    hash_on: cookie:session",
                targets(&addrs(&b))
            ),
            "",
        )
    );
    let gw = TestGateway::start(&yaml).await;
    // A connection's first request with a body hands it to hyper for good: one each.
    let mut gets = http1(gw.addr("main")).await;
    let mut posts = http1(gw.addr("main")).await;
    let request = |method: &str, user: u32, body: &'static [u8]| {
        Request::builder()
            .method(method)
            .uri("/")
            .header("cookie", format!("theme=dark; session=user-{user}"))
            .header("cookie", "lang=en")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()
    };
    let chain_before = gateway_tests::fast_path_chain_count(&gw, "main").await;
    let text_before = gateway_tests::fast_path_count(&gw, "main").await;
    let mut placed = HashMap::<String, usize>::new();
    for user in 0..100 {
        let by_text = who(&gets.send(request("GET", user, b"")).await.unwrap());
        let by_map = who(&posts.send(request("POST", user, b"x")).await.unwrap());
        assert_eq!(by_text, by_map, "user-{user}");
        *placed.entry(by_text).or_default() += 1;
    }
    assert!(placed.len() >= 3, "the users spread: {placed:?}");
    // The GETs were the fast path's text forward, not its way through the chain.
    let text = gateway_tests::fast_path_count(&gw, "main").await - text_before;
    let chain = gateway_tests::fast_path_chain_count(&gw, "main").await - chain_before;
    assert_eq!((text, chain), (100, 0));
}

#[tokio::test]
async fn killed_backend_is_ejected_and_no_request_fails_after() {
    let mut b = backends(&["a", "b"]).await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: {}\n    health_check: {{ unhealthy_after: 2, eject_for: 60s }}",
            targets(&addrs(&b))
        ),
        "",
    ))
    .await;
    let t = tally(&gw, "/", 10).await;
    assert_eq!((t["a"], t["b"]), (5, 5));

    b[1].stop().await;
    // Without retries, the failures that eject "b" reach clients: exactly `unhealthy_after`.
    let t = tally(&gw, "/", 50).await;
    assert_eq!(t.get("status 502"), Some(&2), "{t:?}");
    assert_eq!(t["a"], 48, "{t:?}");
    assert_eq!(upstream(&gw).targets.health(1), Some(Health::Ejected));
    // Once ejected, nothing fails.
    let t = tally(&gw, "/", 50).await;
    assert_eq!(t.get("a"), Some(&50), "{t:?}");
    let snap = upstream(&gw).targets.snapshot();
    assert_eq!((snap[1].failures, snap[1].ejections), (2, 1));
}

#[tokio::test]
async fn killed_backend_with_retries_fails_no_request_at_all() {
    let mut b = backends(&["a", "b"]).await;
    let gw = TestGateway::start(&yaml(
        &format!("    targets: {}\n    retries: 1", targets(&addrs(&b))),
        "",
    ))
    .await;
    b[0].stop().await;
    let t = tally(&gw, "/", 40).await;
    assert_eq!(t.get("b"), Some(&40), "{t:?}");
}

#[tokio::test]
async fn active_checks_take_a_target_out_and_bring_it_back() {
    let mut b = backends(&["a", "b"]).await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: {}\n    health_check: {{ path: /healthz, interval: 100ms, timeout: 500ms, unhealthy_after: 2, healthy_after: 2 }}",
            targets(&addrs(&b))
        ),
        "",
    ))
    .await;
    let up = upstream(&gw);
    let wait_for = |i: usize, h: Health| {
        let up = up.clone();
        async move {
            for _ in 0..100 {
                if up.targets.health(i) == Some(h) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("target {i} never became {h:?}");
        }
    };

    // The check fails: down, no traffic, no failed request.
    b[1].set_healthy(false);
    wait_for(1, Health::Down).await;
    let t = tally(&gw, "/", 20).await;
    assert_eq!(t.get("a"), Some(&20), "{t:?}");
    b[1].set_healthy(true);
    wait_for(1, Health::Healthy).await;
    let t = tally(&gw, "/", 20).await;
    assert_eq!((t["a"], t["b"]), (10, 10), "{t:?}");

    // The process dies and comes back on the same port.
    b[1].stop().await;
    wait_for(1, Health::Down).await;
    let t = tally(&gw, "/", 20).await;
    assert_eq!(t.get("a"), Some(&20), "{t:?}");
    b[1].restart().await;
    wait_for(1, Health::Healthy).await;
    let t = tally(&gw, "/", 20).await;
    assert_eq!((t["a"], t["b"]), (10, 10), "{t:?}");
}

#[tokio::test]
async fn all_targets_down_answers_503_fast() {
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: {}\n    health_check: {{ path: /healthz, interval: 50ms, timeout: 200ms, unhealthy_after: 1, eject_for: 60s }}",
            targets(&[refusing_addr(), refusing_addr()])
        ),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    // Passive failures never eject the last target; the active checks take both down.
    let up = upstream(&gw);
    for _ in 0..100 {
        if (0..2).all(|i| up.targets.health(i) == Some(Health::Down)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!((0..2).all(|i| up.targets.health(i) == Some(Health::Down)));
    let started = std::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(c.get("/").await.status(), 503);
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn reload_keeps_in_flight_requests_and_stops_old_health_checks() {
    let old = Backend::start("old").await;
    let new = Backend::start("new").await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: [{}]\n    health_check: {{ path: /healthz, interval: 50ms }}",
            old.addr()
        ),
        "",
    ))
    .await;
    let addr = gw.addr("main");
    let slow = tokio::spawn(async move { http1(addr).await.get("/slow/800").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(old.health_checks() > 0);

    std::fs::write(
        gw.dir().join("gateway.yaml"),
        yaml(&format!("    targets: [{}]", new.addr()), ""),
    )
    .unwrap();
    gw.gateway().reload().await.expect("reload");
    assert_eq!(http1(addr).await.get("/").await.header("x-backend"), "new");

    // The request that started on the old generation finishes on its pools.
    let res = slow.await.unwrap();
    assert_eq!((res.status(), res.header("x-backend")), (200, "old"));
    // The old generation is gone, and its health checks with it.
    let checks = old.health_checks();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        old.health_checks() <= checks + 1,
        "health checks still running"
    );
    assert_eq!(new.health_checks(), 0);
}

#[tokio::test]
async fn idle_connections_are_closed_after_idle_timeout() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: [{}]\n    pool: {{ idle_timeout: 200ms }}",
            b.addr()
        ),
        "",
    ))
    .await;
    assert_eq!(http1(gw.addr("main")).await.get("/").await.status(), 200);
    let up = upstream(&gw);
    assert_eq!(up.idle_connections(), [1]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(up.idle_connections(), [0]);
    assert_eq!(
        up.open_connections(),
        [0],
        "the reaped connection was closed"
    );
}
