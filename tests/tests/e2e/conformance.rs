//! HTTP/2 conformance: h2spec (installed by `scripts/setup.sh` when Go is present) runs its
//! whole suite, strict cases included, against an h2c listener and a TLS listener (ALPN `h2`);
//! any failing case fails the test with h2spec's own report. Without h2spec the test says why
//! and passes.

use std::path::PathBuf;

use gateway_tests::{KeyKind, TestCa, TestGateway, temp_dir};

/// Where `scripts/setup.sh` puts h2spec, or the `H2SPEC` variable, or `PATH`.
fn h2spec() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("H2SPEC") {
        return Some(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    // `go install` puts binaries in $(go env GOPATH)/bin.
    let gopath = std::process::Command::new("go")
        .args(["env", "GOPATH"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|p| !p.is_empty());
    if let Some(gopath) = gopath {
        dirs.extend(std::env::split_paths(&gopath).map(|p| p.join("bin")));
    }
    dirs.into_iter()
        .map(|d| d.join("h2spec"))
        .find(|p| p.is_file())
}

/// The summary line: "145 tests, 145 passed, 0 skipped, 0 failed".
fn summary(out: &str) -> Option<(u32, u32, u32, u32)> {
    let line = out.lines().rev().find(|l| l.contains(" tests, "))?;
    let nums: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    match nums[..] {
        [tests, passed, skipped, failed] => Some((tests, passed, skipped, failed)),
        _ => None,
    }
}

async fn run_h2spec(bin: &PathBuf, port: u16, tls: bool) -> Result<(u32, u32), String> {
    let mut cmd = tokio::process::Command::new(bin);
    // `-S`: also the strict cases (SHOULD-level requirements).
    cmd.args(["-S", "-h", "127.0.0.1", "-p", &port.to_string()]);
    // A generous per-case timeout: the machine running the suite may be busy.
    cmd.args(["-o", "10"]);
    if tls {
        cmd.args(["-t", "-k"]);
    }
    let out = cmd
        .output()
        .await
        .map_err(|e| format!("cannot run h2spec: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let Some((tests, passed, skipped, failed)) = summary(&text) else {
        return Err(format!("no h2spec summary:\n{text}"));
    };
    if failed > 0 || !out.status.success() {
        let report = text
            .split_once("Failures:")
            .map_or(text.as_str(), |(_, f)| f);
        return Err(format!(
            "{failed} of {tests} h2spec cases failed:\n{report}"
        ));
    }
    // The suite really ran (h2spec 2.2.1 has 146 cases with `-S`).
    assert!(tests >= 140 && passed + skipped == tests, "{text}");
    Ok((passed, skipped))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_on_h2c_and_tls_listeners() {
    let Some(bin) = h2spec() else {
        eprintln!(
            "skipping: h2spec not found (scripts/setup.sh installs it when Go is available; or set H2SPEC)"
        );
        return;
    };
    let ca = TestCa::new();
    let dir = temp_dir();
    ca.write(dir.path(), "site", &["localhost"], KeyKind::Ecdsa);
    let yaml = r#"
certificates:
  site: { cert: site.pem, key: site.key }
listeners:
  - name: h2c
    bind: 127.0.0.1:0
    protocols: [http2]
  - name: tls
    bind: 127.0.0.1:0
    tls: { certificates: [site] }
routes:
  - match: { path_prefix: / }
    respond: { status: 200, body: "conformance\n", headers: { content-type: text/plain } }
"#;
    let gw = TestGateway::start_in(dir, yaml).await;
    let mut failures = Vec::new();
    for (listener, tls) in [("h2c", false), ("tls", true)] {
        match run_h2spec(&bin, gw.addr(listener).port(), tls).await {
            Ok((passed, skipped)) => {
                eprintln!("h2spec on {listener}: {passed} passed, {skipped} skipped, 0 failed")
            }
            Err(e) => failures.push(format!("listener {listener}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn listeners_limited_to_one_protocol_do_not_speak_the_other() {
    let yaml = r#"
listeners:
  - name: h1
    bind: 127.0.0.1:0
    protocols: [http1]
  - name: h2
    bind: 127.0.0.1:0
    protocols: [http2]
routes:
  - match: { path_prefix: / }
    respond: { body: "ok" }
"#;
    let gw = TestGateway::start(yaml).await;
    // Each listener serves its own protocol...
    assert_eq!(
        gateway_tests::http1(gw.addr("h1"))
            .await
            .get("/")
            .await
            .status(),
        200
    );
    assert_eq!(
        gateway_tests::http2c(gw.addr("h2"))
            .await
            .get("/")
            .await
            .status(),
        200
    );
    // ...and not the other one.
    let mut h2_on_h1 = gateway_tests::http2c(gw.addr("h1")).await;
    let req = http::Request::get("/")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert!(
        h2_on_h1.send(req).await.is_err(),
        "h2c served on an http1 listener"
    );
    let out = gateway_tests::raw(gw.addr("h2"), b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert!(
        !out.starts_with("HTTP/1.1"),
        "HTTP/1 served on an http2 listener: {out}"
    );
}
