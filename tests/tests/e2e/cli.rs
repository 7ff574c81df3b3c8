//! The `gateway` binary: `version`, `validate` (ok / located error, exit codes), and `run`
//! draining on SIGTERM.

use std::process::Command;
use std::time::Duration;

use gateway_tests::{binary_config, gateway_binary, temp_dir, write_file};

#[test]
fn version_prints_the_version() {
    let out = Command::new(gateway_binary())
        .arg("version")
        .output()
        .expect("run gateway");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("gateway "));
}

#[test]
fn validate_says_ok_or_names_file_line_col() {
    let dir = temp_dir();
    let good = write_file(
        dir.path(),
        "good.yaml",
        "listeners:\n  - name: a\n    bind: 127.0.0.1:0\nroutes:\n  - match: { path: / }\n    respond: { body: hi }\n",
    );
    let out = Command::new(gateway_binary())
        .args(["validate", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");

    let bad = write_file(
        dir.path(),
        "bad.yaml",
        "listeners:\n  - name: a\n    bind: 127.0.0.1:0\nroutes:\n  - match: { path: / }\n    proxy: { upstream: missing }\n",
    );
    let out = Command::new(gateway_binary())
        .args(["validate", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml:6:24: routes[0].proxy.upstream: unknown upstream `missing`"),
        "{err}"
    );

    let syntax = write_file(
        dir.path(),
        "syntax.yaml",
        "listeners:\n  - name: a\n     bind: [\n",
    );
    let out = Command::new(gateway_binary())
        .args(["validate", "--config"])
        .arg(&syntax)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("syntax.yaml:3:"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn run_serves_and_drains_on_sigterm() {
    let dir = temp_dir();
    let (port, cfg) = binary_config(dir.path(), |port| {
        format!(
            "listeners:\n  - name: a\n    bind: 127.0.0.1:{port}\nroutes:\n  - match: {{ path: /hello }}\n    respond: {{ body: hi }}\n"
        )
    });
    let child = Command::new(gateway_binary())
        .args(["run", "--config"])
        .arg(&cfg)
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let child = &mut child.0;
    let mut ok = false;
    for _ in 0..100 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            ok = out.starts_with("HTTP/1.1 200") && out.ends_with("hi");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ok, "the gateway answered");
    // SIGTERM: drain and exit 0.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "no longer accepting"
    );
}

/// Kills the child if the test fails before it exits, so no gateway outlives its test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary's runtime keeps upstream timers for reuse (`proxy::deadline`), which the
/// in-process gateways of the other tests never do: a timer reset for a later request still
/// fires at that request's deadline, on the fast path and the general path, with one worker
/// (a current-thread runtime) and with two.
#[tokio::test]
async fn reused_upstream_timers_fire_at_each_requests_deadline() {
    use bytes::Bytes;
    use http_body_util::Full;
    use std::time::Instant;

    let backend = gateway_tests::backend::Backend::start("b").await;
    for workers in [1, 2] {
        let dir = temp_dir();
        let (port, cfg) = binary_config(dir.path(), |port| {
            format!(
                "server: {{ watch_config: false, worker_threads: {workers} }}\n\
                 listeners:\n  - name: a\n    bind: 127.0.0.1:{port}\n\
                 upstreams:\n  app:\n    targets: [\"{}\"]\n    timeout: 300ms\n    health_check: {{ unhealthy_after: 100 }}\n\
                 routes:\n  - match: {{ path_prefix: / }}\n    proxy: {{ upstream: app }}\n",
                backend.addr()
            )
        });
        let child = Command::new(gateway_binary())
            .args(["run", "--config"])
            .arg(&cfg)
            .spawn()
            .unwrap();
        let _child = KillOnDrop(child);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut up = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(up, "the gateway listens ({workers} workers)");
        let mut c = gateway_tests::http1(addr).await;
        let post = |path: &str| {
            http::Request::post(path)
                .body(Full::new(Bytes::from_static(b"x")))
                .unwrap()
        };
        for round in 0..3 {
            // Answered attempts give their timers back; after the pause those are past their
            // deadlines, and only a reset lets the next attempts wait for their answers...
            for pause in [false, true] {
                if pause {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
                for _ in 0..5 {
                    assert_eq!(c.get("/").await.status(), 200, "{workers} workers");
                    let status = c.send(post("/")).await.unwrap().status();
                    assert_eq!(status, 200, "{workers} workers");
                }
            }
            // ...and the next attempts' deadlines still hold, on either path.
            for general in [false, true] {
                let began = Instant::now();
                let status = if general {
                    c.send(post("/slow/3000")).await.unwrap().status()
                } else {
                    c.get("/slow/3000").await.status()
                };
                let took = began.elapsed();
                assert_eq!(status, 504, "{workers} workers, round {round}");
                assert!(
                    took >= Duration::from_millis(300) && took < Duration::from_millis(2500),
                    "{workers} workers, round {round}, general path {general}: {took:?}"
                );
            }
        }
    }
}
