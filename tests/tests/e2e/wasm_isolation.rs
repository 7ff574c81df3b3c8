//! Isolation: a trap (in a head callback or in the body callback of a response whose head
//! has not gone out), an out-of-bounds pointer, a runaway loop (`limits.time`) and memory
//! growth past `limits.memory` each fail only their own request with 500, are counted, and the
//! VM is replaced: the next requests are served normally.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use gateway_tests::{TestGateway, http1, temp_dir};

use crate::wasm::{install, one_plugin};

#[tokio::test]
async fn hostile_plugin_fails_only_its_requests() {
    let dir = temp_dir();
    install(dir.path(), "hostile", "hostile.wasm");
    // The time limit is wall-clock epochs: it must leave `/memory` (filling 16 MiB of fresh
    // pages) room to reach the memory cap on a loaded 2-core CI machine, or that request is
    // reported as a timeout instead; `/loop` still has to stop well under 2 s.
    let cfg = one_plugin(
        "hostile.wasm",
        "{}",
        "    limits: { memory: 16MiB, time: 250ms }",
        None,
    );
    let gw = TestGateway::start_in(dir, &cfg).await;
    let addr = gw.addr("main");
    let handle = gw
        .gateway()
        .generation()
        .plugins
        .get("hostile")
        .cloned()
        .expect("plugin");
    let stats = handle.stats.clone();

    // A steady stream of good requests runs alongside the hostile ones.
    let good = tokio::spawn(async move {
        let mut c = http1(addr).await;
        let mut ok = 0;
        for _ in 0..60 {
            let r = c.get("/fine").await;
            if r.status() == 200 && r.header("x-hostile") == "calm" {
                ok += 1;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        ok
    });

    let mut c = http1(addr).await;
    for (path, counter) in [
        ("/trap", &stats.traps),
        ("/trap-body", &stats.traps),
        ("/oob", &stats.memory_access),
        ("/loop", &stats.timeouts),
        ("/loop-response-body", &stats.timeouts),
        ("/memory", &stats.memory_limits),
    ] {
        let before = counter.load(Relaxed);
        let started = Instant::now();
        let r = c.get(path).await;
        assert_eq!(r.status(), 500, "{path}: {}", r.text());
        assert_eq!(counter.load(Relaxed), before + 1, "{path} counted");
        if path == "/loop" {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "loop stopped at its limit"
            );
        }
        // The same connection is served by a fresh VM right after.
        let r = c.get("/after").await;
        assert_eq!(r.status(), 200, "after {path}");
        assert_eq!(r.header("x-hostile"), "calm");
    }
    assert!(stats.vm_replacements.load(Relaxed) >= 4);
    // Good requests on the other connection may share a VM with a failing one; only those
    // paused or mid-call in it could fail, and none is.
    assert_eq!(good.await.unwrap(), 60);
    let mut metrics = String::new();
    gateway::wasm::render_prometheus(&mut metrics);
    assert!(
        metrics.contains("gateway_plugin_failures_total{plugin=\"hostile\",kind=\"timeout\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_plugin_over_its_time_in_the_request_body_callback_answers_500() {
    let dir = temp_dir();
    install(dir.path(), "hostile", "hostile_body.wasm");
    let backend = gateway_tests::backend::Backend::start("hostile-body").await;
    let cfg = one_plugin(
        "hostile_body.wasm",
        "{}",
        "    limits: { time: 100ms }",
        Some(backend.addr()),
    );
    let gw = TestGateway::start_in(dir, &cfg).await;
    let handle = gw
        .gateway()
        .generation()
        .plugins
        .get("hostile_body")
        .cloned();
    let stats = handle.expect("plugin").stats.clone();
    let mut c = http1(gw.addr("main")).await;
    let req = http::Request::post("/echo/loop-body")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"payload",
        )))
        .unwrap();
    let r = c.send(req).await.unwrap();
    assert_eq!(r.status(), 500, "{}", r.text());
    assert_eq!(
        stats.timeouts.load(Relaxed),
        1,
        "counted as a plugin failure"
    );
    let r = http1(gw.addr("main")).await.get("/echo/after").await;
    assert_eq!(r.status(), 200, "the next request is served");
}

#[tokio::test]
async fn a_module_that_cannot_start_is_a_config_error() {
    let dir = temp_dir();
    std::fs::write(dir.path().join("junk.wasm"), b"\0asm\x01\0\0\0garbage").unwrap();
    let cfg = one_plugin("junk.wasm", "{}", "", None);
    let err = TestGateway::try_start_in(dir, &cfg)
        .await
        .err()
        .expect("refused");
    assert!(
        err.contains("plugins.junk.wasm") && err.contains("compile"),
        "{err}"
    );

    // A plugin whose on_configure rejects its configuration.
    let dir = temp_dir();
    install(dir.path(), "local_reply", "lr.wasm");
    let cfg = one_plugin("lr.wasm", r#"{ not: expected }"#, "", None);
    let err = TestGateway::try_start_in(dir, &cfg)
        .await
        .err()
        .expect("refused");
    assert!(err.contains("configuration rejected"), "{err}");
}
