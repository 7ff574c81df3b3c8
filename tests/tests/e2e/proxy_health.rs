//! Passive health end to end: what a client can and cannot make count against a target. A
//! backend's own 5xx for one URL does not (unless `health_check.passive.statuses` lists it), a
//! slow or stalled upload does not (it is the client's: `408`), a dead target does, and the last
//! selectable target of an upstream is never ejected on passive signals: it is tried again by
//! the next request, which reaches it as soon as it is back.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{
    TestGateway, counter_value, fast_path_count, http1, raw_status, raw_target, refusing_addr,
};
use http::Request;
use http_body_util::Full;
use stream_proxy::upstream::Health;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::proxy::{targets, upstream, yaml};

/// [`yaml`] with an admin listener (for the counters) and `listener` settings (YAML lines
/// indented by four spaces) on `main`.
fn config(upstream: &str, listener: &str) -> String {
    let base = yaml(upstream, "").replace(
        "    bind: 127.0.0.1:0\n",
        &format!("    bind: 127.0.0.1:0\n{listener}"),
    );
    format!("admin: {{ bind: 127.0.0.1:0 }}\n{base}")
}

/// A POST of `len` bytes to `/upload` whose body goes out one byte every `every` after the
/// head. The status of the answer (0 when none came within 10 s) and how long it took.
async fn slow_upload(addr: SocketAddr, len: usize, every: Duration) -> (u16, Duration) {
    let started = Instant::now();
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = tcp.into_split();
    let head = format!("POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n");
    wr.write_all(head.as_bytes()).await.expect("head");
    let writer = tokio::spawn(async move {
        for _ in 0..len {
            tokio::time::sleep(every).await;
            if wr.write_all(b"z").await.is_err() {
                return;
            }
        }
        // Held open: the answer is read on the other half.
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        while !out.windows(4).any(|w| w == b"\r\n\r\n") {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    writer.abort();
    let status = if read.is_ok() {
        raw_status(&String::from_utf8_lossy(&out))
    } else {
        0
    };
    (status, started.elapsed())
}

async fn spared(gw: &TestGateway, target: SocketAddr) -> u64 {
    counter_value(
        gw,
        &format!(r#"gateway_upstream_ejections_spared_total{{upstream="app",target="{target}"}}"#),
    )
    .await
}

#[tokio::test]
async fn a_backends_own_503_for_one_url_takes_no_target_out() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let gw = TestGateway::start(&config(
        &format!("    targets: {}", targets(&[a.addr(), b.addr()])),
        "",
    ))
    .await;
    // GETs take the HTTP/1.1 fast path, POSTs the general path (which keeps the connection
    // from then on): both report by the same rule.
    let (mut fast, mut general) = (http1(gw.addr("main")).await, http1(gw.addr("main")).await);
    for i in 0..10 {
        let res = if i % 2 == 0 {
            fast.get("/status/503").await
        } else {
            let req = Request::post("/status/503")
                .body(Full::new(Bytes::from_static(b"x")))
                .unwrap();
            general.send(req).await.unwrap()
        };
        assert_eq!(res.status(), 503);
        assert_eq!(res.text(), "status 503", "the backend's own answer");
    }
    assert_eq!((a.requests(), b.requests()), (5, 5));
    assert!(
        fast_path_count(&gw, "main").await >= 5,
        "the GETs took the fast path"
    );
    let up = upstream(&gw);
    for (i, s) in up.targets.snapshot().iter().enumerate() {
        assert_eq!((s.failures, s.ejections), (0, 0), "target {i}: {s:?}");
    }
    // Every other URL still reaches both.
    assert_eq!(fast.get("/").await.header("x-backend"), "a");
    assert_eq!(fast.get("/").await.header("x-backend"), "b");
}

#[tokio::test]
async fn a_single_target_answering_503_still_serves_its_other_urls() {
    let a = Backend::start("a").await;
    let gw = TestGateway::start(&config(&format!("    targets: [{}]", a.addr()), "")).await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..10 {
        assert_eq!(c.get("/status/503").await.status(), 503);
    }
    let res = c.get("/ok").await;
    assert_eq!((res.status(), res.header("x-backend")), (200, "a"));
    let s = &upstream(&gw).targets.snapshot()[0];
    assert_eq!((s.failures, s.ejections), (0, 0), "{s:?}");
}

#[tokio::test]
async fn listed_statuses_count_and_eject_the_target_that_sends_them() {
    let failing =
        raw_target(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\ndown").await;
    let b = Backend::start("b").await;
    let gw = TestGateway::start(&config(
        &format!(
            "    targets: {}\n    health_check: {{ unhealthy_after: 2, eject_for: 60s, passive: {{ statuses: [503] }} }}",
            targets(&[failing, b.addr()])
        ),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(c.get("/").await.status());
    }
    answers.sort_unstable();
    // Round robin: the failing target answers twice, and its two failures eject it.
    assert_eq!(answers, [200, 200, 503, 503]);
    assert_eq!(upstream(&gw).targets.health(0), Some(Health::Ejected));
    for _ in 0..6 {
        assert_eq!(c.get("/").await.header("x-backend"), "b");
    }
    let s = &upstream(&gw).targets.snapshot()[0];
    assert_eq!((s.failures, s.ejections), (2, 1), "{s:?}");
}

#[tokio::test]
async fn a_stalled_upload_gets_408_and_is_not_the_targets_failure() {
    for protocol in ["http1", "h2c"] {
        let a = Backend::start("a").await;
        let gw = TestGateway::start(&config(
            &format!(
                "    targets: [{}]\n    protocol: {protocol}\n    timeout: 200ms",
                a.addr()
            ),
            "    body_read_timeout: 500ms\n",
        ))
        .await;
        for _ in 0..2 {
            // One byte a second: each wait passes `body_read_timeout`, and the upstream's
            // shorter `timeout` runs out meanwhile.
            let (status, took) = slow_upload(gw.addr("main"), 10, Duration::from_secs(1)).await;
            assert_eq!(
                status, 408,
                "{protocol}: the client's fault, not a 5xx ({took:?})"
            );
            assert!(
                took >= Duration::from_millis(500) && took < Duration::from_secs(5),
                "{protocol}: {took:?}"
            );
        }
        let s = &upstream(&gw).targets.snapshot()[0];
        assert_eq!((s.failures, s.ejections), (0, 0), "{protocol}: {s:?}");
        let res = http1(gw.addr("main")).await.get("/").await;
        assert_eq!((res.status(), res.header("x-backend")), (200, "a"));
    }
}

#[tokio::test]
async fn an_upload_that_keeps_coming_outlasts_the_upstream_timeout() {
    for protocol in ["h2c", "http1"] {
        let a = Backend::start("a").await;
        let gw = TestGateway::start(&config(
            &format!(
                "    targets: [{}]\n    protocol: {protocol}\n    timeout: 300ms",
                a.addr()
            ),
            "    body_read_timeout: 2s\n",
        ))
        .await;
        // Eight bytes 150 ms apart: four times the upstream's `timeout`, every wait the client's.
        let (status, took) = slow_upload(gw.addr("main"), 8, Duration::from_millis(150)).await;
        assert_eq!(status, 200, "{protocol}: not a 504 ({took:?})");
        assert!(took >= Duration::from_millis(1200), "{protocol}: {took:?}");
        let s = &upstream(&gw).targets.snapshot()[0];
        assert_eq!(s.failures, 0, "{protocol}: {s:?}");
    }
}

#[tokio::test]
async fn a_dead_target_is_ejected_while_another_serves_but_the_last_one_never_is() {
    let (mut a, mut b) = (Backend::start("a").await, Backend::start("b").await);
    let gw = TestGateway::start(&config(
        &format!(
            "    targets: {}\n    health_check: {{ unhealthy_after: 2, eject_for: 60s }}",
            targets(&[a.addr(), b.addr()])
        ),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    a.stop().await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(c.get("/").await.status());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 502).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(upstream(&gw).targets.health(0), Some(Health::Ejected));

    // Now "b" dies too: it is the last selectable target, so it stays in and every request
    // tries it (a 502, not the 503 of an empty upstream)...
    b.stop().await;
    for _ in 0..5 {
        assert_eq!(c.get("/").await.status(), 502);
    }
    assert_eq!(upstream(&gw).targets.health(1), Some(Health::Healthy));
    assert!(spared(&gw, b.addr()).await >= 1);
    // ...and the first request after it is back reaches it.
    b.restart().await;
    assert_eq!(c.get("/").await.header("x-backend"), "b");
}

#[tokio::test]
async fn a_single_target_refusing_connections_is_never_ejected() {
    let mut a = Backend::start("a").await;
    let gw = TestGateway::start(&config(
        &format!(
            "    targets: [{}]\n    health_check: {{ unhealthy_after: 1, eject_for: 60s }}",
            a.addr()
        ),
        "",
    ))
    .await;
    a.stop().await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..5 {
        assert_eq!(
            c.get("/").await.status(),
            502,
            "tried, not refused as ejected"
        );
    }
    let s = &upstream(&gw).targets.snapshot()[0];
    assert_eq!(
        (s.failures, s.ejections, s.ejections_spared),
        (5, 0, 5),
        "{s:?}"
    );
    assert_eq!(spared(&gw, a.addr()).await, 5);
    a.restart().await;
    let res = c.get("/").await;
    assert_eq!((res.status(), res.header("x-backend")), (200, "a"));
    // A refusing address the same: every request is a 502 from trying it.
    let gw = TestGateway::start(&config(&format!("    targets: [{}]", refusing_addr()), "")).await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..4 {
        assert_eq!(c.get("/").await.status(), 502);
    }
}
