//! Hot reload: replacing a plugin's .wasm swaps it in without a restart and without failing
//! any request of a load running through the swap; a broken module is rejected (counted and
//! logged) while the old one keeps serving; a config reload with a new plugin configuration
//! takes effect the same way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use gateway_tests::{TestGateway, http1, temp_dir};

use crate::wasm::{install, one_plugin, plugin, replace};

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn swap_under_load_with_zero_failures_then_reject_a_broken_module() {
    let dir = temp_dir();
    let wasm = install(dir.path(), "add_header", "live.wasm");
    let cfg = one_plugin("live.wasm", r#"{ name: x-version, value: one }"#, "", None);
    let gw = TestGateway::start_in(dir, &cfg).await;
    let addr = gw.addr("main");
    let handle = gw
        .gateway()
        .generation()
        .plugins
        .get("live")
        .cloned()
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (stop, failures, served) = (stop.clone(), failures.clone(), served.clone());
        load.push(tokio::spawn(async move {
            let mut c = http1(addr).await;
            let mut versions = Vec::new();
            while !stop.load(Relaxed) {
                let r = c.get("/").await;
                if r.status() != 200 {
                    eprintln!("failed: {} {}", r.status(), r.text());
                    failures.fetch_add(1, Relaxed);
                }
                served.fetch_add(1, Relaxed);
                versions.push(r.header("x-version").to_owned() + r.header("x-count"));
            }
            versions
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A different module: shared-counter adds x-request-count instead of x-version.
    let old = handle.digest();
    replace(&wasm, &std::fs::read(plugin("shared_counter")).unwrap());
    wait_for("the new module", || handle.digest() != old).await;
    let mut c = http1(addr).await;
    let r = c.get("/").await;
    assert!(!r.header("x-request-count").is_empty(), "new module serves");
    assert_eq!(handle.stats.reloads_ok.load(Relaxed), 1);

    // A broken module is rejected; the previous one keeps serving.
    let good = handle.digest();
    replace(&wasm, b"\0asm\x01\0\0\0not a module");
    wait_for("the rejection", || {
        handle.stats.reloads_failed.load(Relaxed) == 1
    })
    .await;
    assert_eq!(handle.digest(), good);
    let r = c.get("/").await;
    assert_eq!(r.status(), 200);
    assert!(
        !r.header("x-request-count").is_empty(),
        "old module still serves"
    );

    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Relaxed);
    let mut all = Vec::new();
    for t in load {
        all.extend(t.await.unwrap());
    }
    let s = &handle.stats;
    assert_eq!(
        failures.load(Relaxed),
        0,
        "no request failed across the swaps (traps {}, timeouts {})",
        s.traps.load(Relaxed),
        s.timeouts.load(Relaxed)
    );
    assert!(served.load(Relaxed) > 50);
    assert!(
        all.iter().any(|v| v == "one"),
        "the old module served before the swap"
    );
}

#[tokio::test]
async fn same_bytes_do_not_recompile() {
    let dir = temp_dir();
    let wasm = install(dir.path(), "add_header", "same.wasm");
    let cfg = one_plugin("same.wasm", r#"{ name: x-a, value: b }"#, "", None);
    let gw = TestGateway::start_in(dir, &cfg).await;
    let handle = gw
        .gateway()
        .generation()
        .plugins
        .get("same")
        .cloned()
        .unwrap();
    let digest = handle.digest();
    // Touch: new mtime, same bytes.
    replace(&wasm, &std::fs::read(&wasm).unwrap());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(handle.digest(), digest);
    assert_eq!(handle.stats.reloads_ok.load(Relaxed), 0);
    assert_eq!(handle.stats.reloads_failed.load(Relaxed), 0);
}

#[tokio::test]
async fn config_reload_reconfigures_the_plugin() {
    let dir = temp_dir();
    install(dir.path(), "add_header", "conf.wasm");
    let cfg = one_plugin("conf.wasm", r#"{ name: x-version, value: one }"#, "", None);
    let gw = TestGateway::start_in(dir, &cfg).await;
    let addr = gw.addr("main");
    let mut c = http1(addr).await;
    assert_eq!(c.get("/").await.header("x-version"), "one");
    let before = gw
        .gateway()
        .generation()
        .plugins
        .get("conf")
        .unwrap()
        .digest();

    // Same module, new configuration; the listener keeps its port.
    let cfg = one_plugin("conf.wasm", r#"{ name: x-version, value: two }"#, "", None)
        .replace("127.0.0.1:0", &addr.to_string());
    std::fs::write(gw.dir().join("gateway.yaml"), cfg).unwrap();
    gw.gateway().reload().await.expect("reload");
    let r = c.get("/").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.header("x-version"), "two");
    // The bytes did not change, so the module came from the compile cache.
    assert_eq!(
        gw.gateway()
            .generation()
            .plugins
            .get("conf")
            .unwrap()
            .digest(),
        before
    );

    // A configuration the plugin rejects (`on_configure` false) is a failed reload; the
    // running generation keeps serving.
    install(gw.dir(), "local_reply", "conf.wasm");
    let bad = one_plugin("conf.wasm", r#"{ nonsense: 1 }"#, "", None)
        .replace("127.0.0.1:0", &addr.to_string());
    std::fs::write(gw.dir().join("gateway.yaml"), bad).unwrap();
    let err = gw.gateway().reload().await.expect_err("rejected");
    assert!(err.to_string().contains("configuration rejected"), "{err}");
    assert_eq!(c.get("/").await.header("x-version"), "two");
}
