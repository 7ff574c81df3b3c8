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
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(printed.starts_with("gateway "), "{printed}");
    // The flags every server's users try first say the same.
    for flag in ["--version", "-V"] {
        let out = Command::new(gateway_binary())
            .arg(flag)
            .output()
            .expect("run gateway");
        assert!(out.status.success(), "{flag}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), printed, "{flag}");
    }
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
        assert!(
            gateway_tests::ports::wait_listening(addr, Duration::from_secs(5)).await,
            "the gateway listens ({workers} workers)"
        );
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

/// Runs `gateway validate` on `config`: whether it exited 0, and what it printed.
fn validate(config: &std::path::Path) -> (bool, String) {
    let out = Command::new(gateway_binary())
        .args(["validate", "--config"])
        .arg(config)
        .output()
        .expect("run gateway validate");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed.trim().to_owned())
}

/// `validate` builds everything `run` would and starts none of it: every example config and a
/// config with each optional section say ok, `cluster:` included (its Redis, the OTLP
/// collectors, the ACME directory and the upstream health checks all point at a listener that
/// sees no connection); and a broken config still fails with its located error.
#[test]
fn validate_says_ok_to_every_example_and_every_optional_section() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).expect("config/examples") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let (ok, printed) = validate(&path);
            assert!(ok && printed == "ok", "{}: {printed}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} example configs");

    // Anything that connects during validation connects here.
    let sentinel = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    sentinel.set_nonblocking(true).expect("nonblocking");
    let s = sentinel.local_addr().expect("addr");
    let dir = temp_dir();
    let d = dir.path();

    // The api-gateway example with its commented `cluster:` block turned on, as
    // docs/scale-out.md has operators do.
    let example = std::fs::read_to_string(examples.join("api-gateway.yaml")).expect("example");
    assert!(
        example.contains("\n# cluster:\n#   redis:"),
        "the example's cluster block"
    );
    let clustered = example
        .replace("\n# cluster:", "\ncluster:")
        .replace("\n#   ", "\n  ")
        .replace("redis://127.0.0.1:6379", &format!("redis://{s}"));
    let (ok, printed) = validate(&write_file(d, "api-gateway-cluster.yaml", clustered));
    assert!(
        ok && printed == "ok",
        "api-gateway.yaml with cluster: {printed}"
    );

    let ca = gateway_tests::tls::TestCa::new();
    ca.write(
        d,
        "site",
        &["site.test"],
        gateway_tests::tls::KeyKind::Ecdsa,
    );
    std::fs::create_dir_all(d.join("public")).expect("mkdir");
    std::fs::copy(crate::wasm::plugin("add_header"), d.join("add_header.wasm")).expect("copy");
    std::fs::copy(crate::wasm::plugin("tcp_audit"), d.join("tcp_audit.wasm")).expect("copy");
    let listener = "listeners:\n  - name: a\n    bind: 127.0.0.1:0\n";
    let respond = "routes:\n  - match: { path_prefix: / }\n    respond: { body: hi }\n";
    let sections = [
        (
            "server",
            format!(
                "server: {{ drain_timeout: 5s, worker_threads: 2, server_header: edge, watch_config: false }}\n{listener}{respond}"
            ),
        ),
        (
            "admin",
            format!("admin: {{ bind: 127.0.0.1:0 }}\n{listener}{respond}"),
        ),
        (
            "telemetry",
            format!(
                "telemetry:\n  service_name: edge\n  traces: {{ otlp_endpoint: \"http://{s}\", sample_ratio: 0.5 }}\n  metrics: {{ otlp_endpoint: \"http://{s}/v1/metrics\", interval: 1s }}\n  access_log: {{ path: access.log, format: combined }}\n{listener}{respond}"
            ),
        ),
        (
            "certificates",
            format!(
                "certificates:\n  site: {{ cert: site.pem, key: site.key }}\n  auto:\n    acme: {{ domains: [auto.test], email: ops@example.com, directory: \"https://{s}/directory\", storage: acme }}\n\
                 listeners:\n  - name: tls\n    bind: 127.0.0.1:0\n    protocols: [http1, http2, http3]\n    tls: {{ certificates: [site, auto], hsts: {{ max_age: 1d }} }}\n{respond}"
            ),
        ),
        (
            "upstreams",
            format!(
                "{listener}upstreams:\n  app:\n    targets: [\"{s}\"]\n    health_check: {{ path: /healthz, interval: 100ms }}\n    pool: {{ idle_timeout: 1s }}\n\
                 routes:\n  - match: {{ path_prefix: / }}\n    proxy: {{ upstream: app }}\n"
            ),
        ),
        (
            "plugins",
            format!(
                "plugins:\n  add-header:\n    wasm: add_header.wasm\n    config: {{ name: x-powered-by, value: gateway }}\n  tcp-audit:\n    wasm: tcp_audit.wasm\n\
                 upstreams:\n  app: {{ targets: [\"{s}\"] }}\n{listener}\
                 routes:\n  - match: {{ path_prefix: / }}\n    filters: [{{ plugin: add-header }}]\n    respond: {{ body: hi }}\n\
                 streams:\n  - name: audited\n    bind: 127.0.0.1:0\n    protocol: tcp\n    upstream: app\n    filters: [{{ plugin: tcp-audit }}]\n"
            ),
        ),
        (
            "waf",
            format!(
                "waf:\n  strict:\n    mode: block\n    detect: [sqli, xss]\n    rules:\n      - {{ id: 1001, where: \"header:user-agent\", match: \"(?i)sqlmap\", action: block }}\n\
                 {listener}routes:\n  - match: {{ path_prefix: / }}\n    filters: [{{ waf: strict }}]\n    respond: {{ body: hi }}\n"
            ),
        ),
        (
            "rate limits",
            format!(
                "{listener}routes:\n  - match: {{ path_prefix: / }}\n    filters:\n      - rate_limit: {{ requests: 10, per: 1s, key: \"header:x-api-key\" }}\n    respond: {{ body: hi }}\n"
            ),
        ),
        (
            "streams",
            format!(
                "upstreams:\n  app: {{ targets: [\"{s}\"], health_check: {{ path: /healthz, interval: 100ms }} }}\n\
                 streams:\n  - name: tcp\n    bind: 127.0.0.1:0\n    protocol: tcp\n    upstream: app\n    filters: [{{ allow: [127.0.0.1/32] }}, {{ connection_rate: {{ connections: 5, per: 1s }} }}]\n\
                 \x20 - name: by-sni\n    bind: 127.0.0.1:0\n    protocol: tcp\n    sni_routes: {{ api.example.com: app }}\n\
                 \x20 - name: udp\n    bind: 127.0.0.1:0\n    protocol: udp\n    upstream: app\n"
            ),
        ),
        (
            "static files",
            format!(
                "{listener}routes:\n  - match: {{ path_prefix: / }}\n    static: {{ root: public }}\n"
            ),
        ),
        (
            "cluster",
            format!(
                "cluster: {{ redis: \"redis://{s}\", prefix: edge, timeout: 50ms, share_health: true }}\n\
                 plugins:\n  shared:\n    wasm: add_header.wasm\n    config: {{ name: x-shared, value: \"1\" }}\n    shared_data: {{ scope: global }}\n\
                 upstreams:\n  app: {{ targets: [\"{s}\"], health_check: {{ path: /healthz, interval: 100ms }} }}\n{listener}\
                 routes:\n  - match: {{ path_prefix: /api }}\n    filters:\n      - rate_limit: {{ requests: 100, per: 1s, scope: global, fallback: deny }}\n      - plugin: shared\n    proxy: {{ upstream: app }}\n"
            ),
        ),
    ];
    for (name, yaml) in &sections {
        let path = write_file(d, &format!("{}.yaml", name.replace(' ', "-")), yaml);
        let (ok, printed) = validate(&path);
        assert!(ok && printed == "ok", "{name}: {printed}\n{yaml}");
    }
    match sentinel.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("validation connected to {s}: {other:?}"),
    }

    // Still located: an error only building the generation finds, with `cluster:` present.
    write_file(d, "broken.wasm", "not a wasm module");
    let broken = write_file(
        d,
        "broken.yaml",
        format!(
            "cluster: {{ redis: \"redis://{s}\" }}\nplugins:\n  broken:\n    wasm: broken.wasm\n{listener}{respond}"
        ),
    );
    let (ok, printed) = validate(&broken);
    assert!(!ok, "{printed}");
    assert!(
        printed.starts_with(&format!(
            "error: {}:4:11: plugins.broken.wasm: ",
            broken.display()
        )),
        "{printed}"
    );
}

/// A file that serves nothing (empty, only comments, only an admin section) is refused by
/// `validate` and by `run`, with the reason, instead of "ok" and a gateway answering nothing.
#[test]
fn a_config_that_serves_nothing_is_refused() {
    let dir = temp_dir();
    for (name, text) in [
        ("empty.yaml", ""),
        ("comments.yaml", "# to do\n"),
        ("admin-only.yaml", "admin: { bind: 127.0.0.1:0 }\n"),
    ] {
        let path = write_file(dir.path(), name, text);
        for command in ["validate", "run"] {
            let out = Command::new(gateway_binary())
                .args([command, "--config"])
                .arg(&path)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(1), "{command} {name}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains(&format!(
                    "{name}:1:1: listeners: the configuration serves nothing"
                )),
                "{command} {name}: {err}"
            );
        }
    }
    // A stream alone serves.
    let stream = write_file(
        dir.path(),
        "stream.yaml",
        "upstreams:\n  db: { targets: [127.0.0.1:5432] }\nstreams:\n  - name: db\n    bind: 127.0.0.1:0\n    protocol: tcp\n    upstream: db\n",
    );
    let (ok, said) = validate(&stream);
    assert!(ok, "{said}");
}

/// `validate` reports an error of every section and entry that has one, in one run, each with
/// its location, key path and the line it points at: parse errors (unknown keys, wrong values)
/// and checks (addresses, references) alike.
#[test]
fn validate_reports_every_error_with_its_line() {
    let dir = temp_dir();
    let parse = write_file(
        dir.path(),
        "parse.yaml",
        "server:\n  drain_timout: 1s\nlisteners:\n  - name: a\n    bind: 127.0.0.1:0\n    protocls: [http1]\nroutes:\n  - match: { pth: / }\n    respond: { body: hi }\n",
    );
    let (ok, err) = validate(&parse);
    assert!(!ok);
    assert!(err.contains("3 errors:"), "{err}");
    for expected in [
        "parse.yaml:2:3: server: unknown field `drain_timout`",
        " 2 |   drain_timout: 1s",
        "parse.yaml:6:5: listeners[0]: unknown field `protocls`",
        "parse.yaml:8:14: routes[0].match: unknown field `pth`",
        " 8 |   - match: { pth: / }",
    ] {
        assert!(err.contains(expected), "{expected} in {err}");
    }

    let checks = write_file(
        dir.path(),
        "checks.yaml",
        "listeners:\n  - name: a\n    bind: 127.0.0.1:0\n  - name: b\n    bind: nonsense\nupstreams:\n  app: { targets: [] }\n  ok: { targets: [127.0.0.1:1] }\nroutes:\n  - match: { path: / }\n    respond: { body: hi }\n",
    );
    let (ok, err) = validate(&checks);
    assert!(!ok);
    assert!(err.contains("2 errors:"), "{err}");
    assert!(
        err.contains("checks.yaml:5:11: listeners[1].bind: `nonsense` is not an ip:port"),
        "{err}"
    );
    assert!(
        err.contains("checks.yaml:7:10: upstreams.app.targets: at least one target is required"),
        "{err}"
    );
    assert!(err.contains(" 7 |   app: { targets: [] }"), "{err}");
}
