//! The `gateway` binary: `version`, `validate` (ok / located error, exit codes), and `run`
//! draining on SIGTERM.

use std::process::Command;
use std::time::Duration;

use gateway_tests::{gateway_binary, temp_dir, write_file};

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
    // Bound by the gateway's own process: a port the kernel never hands out on its own, so no
    // parallel test's outgoing connection can take it first.
    let port = gateway_tests::ports::reserved_port();
    let cfg = write_file(
        dir.path(),
        "g.yaml",
        format!(
            "listeners:\n  - name: a\n    bind: 127.0.0.1:{port}\nroutes:\n  - match: {{ path: /hello }}\n    respond: {{ body: hi }}\n"
        ),
    );
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
