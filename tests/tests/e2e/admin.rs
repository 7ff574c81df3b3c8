//! The admin API against what a browser on the admin's host can be made to send: a
//! state-changing request from another origin (CSRF) and a request for a foreign name resolved
//! to the admin's address (DNS rebinding) are refused, `admin.origins` extends what is accepted,
//! `admin.token` / `admin.token_file` require a bearer token, and `GET /config` hides header
//! credentials set by `headers` filters.

use gateway_tests::{TestGateway, admin_request, counter_value, http1, raw, raw_status, temp_dir};

const TOKEN: &str = "e2e-admin-token-0123456789abcdef";

/// A gateway with the admin API (`admin_extra`: more keys of `admin`) and a `/hello` route
/// answering `body`.
fn config(admin_extra: &str, body: &str) -> String {
    format!(
        "admin: {{ bind: 127.0.0.1:0{admin_extra} }}\nserver: {{ watch_config: false }}\nlisteners:\n  - name: main\n    bind: 127.0.0.1:0\nroutes:\n  - name: hello\n    match: {{ path: /hello }}\n    respond: {{ body: \"{body}\" }}\n"
    )
}

/// Writes `yaml` as the config file with the running listeners' ports, so that a reload keeps
/// them.
fn rewrite(gw: &TestGateway, yaml: &str) {
    let main = gw.addr("main").port();
    let admin = gw.gateway().admin_addr().expect("admin").port();
    let yaml = yaml
        .replacen("bind: 127.0.0.1:0", &format!("bind: 127.0.0.1:{admin}"), 1)
        .replacen("bind: 127.0.0.1:0", &format!("bind: 127.0.0.1:{main}"), 1);
    std::fs::write(gw.dir().join("gateway.yaml"), yaml).unwrap();
}

async fn hello(gw: &TestGateway) -> String {
    http1(gw.addr("main")).await.get("/hello").await.text()
}

async fn refused(gw: &TestGateway, reason: &str) -> u64 {
    counter_value(
        gw,
        &format!("gateway_admin_refused_total{{reason=\"{reason}\"}}"),
    )
    .await
}

/// A raw request to the admin port with the given head lines (`Host` among them or not).
async fn admin_raw(gw: &TestGateway, method: &str, path: &str, lines: &str) -> (u16, String) {
    let addr = gw.gateway().admin_addr().expect("admin");
    let req = format!(
        "{method} {path} HTTP/1.1\r\n{lines}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let out = raw(addr, req.as_bytes()).await;
    (raw_status(&out), out)
}

#[tokio::test]
async fn cross_site_and_rebound_requests_are_refused_and_change_nothing() {
    let gw = TestGateway::start(&config("", "v1")).await;
    let port = gw.gateway().admin_addr().unwrap().port();
    rewrite(&gw, &config("", "v2"));

    // A page on evil.example posting to the admin port: refused, nothing reloaded.
    let (status, out) =
        admin_request(&gw, "POST", "/reload", "Origin: http://evil.example\r\n").await;
    assert_eq!(status, 403, "{out}");
    assert!(out.contains("origin not allowed"), "{out}");
    // `null` is the origin of sandboxed frames and local files.
    let (status, _) = admin_request(&gw, "POST", "/reload", "Origin: null\r\n").await;
    assert_eq!(status, 403);
    assert_eq!(refused(&gw, "origin").await, 2);

    // evil.example resolved to 127.0.0.1 (DNS rebinding): its name is the Host, on every
    // request, reads included.
    let evil_host = format!("Host: evil.example:{port}\r\n");
    for (method, path) in [("POST", "/reload"), ("GET", "/config"), ("GET", "/metrics")] {
        let (status, out) = admin_raw(&gw, method, path, &evil_host).await;
        assert_eq!(status, 403, "{method} {path}: {out}");
        assert!(out.contains("host not allowed"), "{out}");
    }
    // No Host at all (HTTP/1.0), and two of which one is foreign.
    assert_eq!(admin_raw(&gw, "GET", "/config", "").await.0, 403);
    let two = format!("Host: 127.0.0.1:{port}\r\n{evil_host}");
    assert_eq!(admin_raw(&gw, "POST", "/reload", &two).await.0, 403);
    assert_eq!(refused(&gw, "host").await, 5);

    assert_eq!(hello(&gw).await, "v1");
    assert_eq!(
        counter_value(&gw, "gateway_config_reloads_total{result=\"ok\"}").await,
        0
    );
    // The probes tell nothing and are probed by address: they answer whatever the Host.
    assert_eq!(admin_raw(&gw, "GET", "/health", &evil_host).await.0, 200);
    assert_eq!(admin_raw(&gw, "GET", "/ready", "").await.0, 200);

    // The admin's own address forms, with or without an Origin of its own.
    for (host, origin) in [
        (format!("127.0.0.1:{port}"), String::new()),
        (
            format!("localhost:{port}"),
            format!("Origin: http://localhost:{port}\r\n"),
        ),
        (format!("LocalHost:{port}"), String::new()),
        (format!("[::1]:{port}"), String::new()),
    ] {
        let lines = format!("Host: {host}\r\n{origin}");
        let (status, out) = admin_raw(&gw, "POST", "/reload", &lines).await;
        assert_eq!(status, 200, "{host}: {out}");
    }
    assert_eq!(hello(&gw).await, "v2");
    assert_eq!(
        counter_value(&gw, "gateway_config_reloads_total{result=\"ok\"}").await,
        4
    );
}

#[tokio::test]
async fn configured_origins_are_accepted_besides_the_own_ones() {
    let extra = ", origins: [\"https://ops.example\", \"admin.internal:9443\"]";
    let gw = TestGateway::start(&config(extra, "v1")).await;
    let port = gw.gateway().admin_addr().unwrap().port();
    // A management page at https://ops.example, behind a proxy that keeps its Host.
    let lines = "Host: ops.example\r\nOrigin: https://ops.example\r\n";
    assert_eq!(admin_raw(&gw, "POST", "/reload", lines).await.0, 200);
    let lines = "Host: admin.internal:9443\r\n";
    assert_eq!(admin_raw(&gw, "GET", "/config", lines).await.0, 200);
    // The scheme is part of an origin written with one.
    let lines = "Host: ops.example\r\nOrigin: http://ops.example\r\n";
    assert_eq!(admin_raw(&gw, "POST", "/reload", lines).await.0, 403);
    // The listener's own forms still work.
    let lines = format!("Host: localhost:{port}\r\n");
    assert_eq!(admin_raw(&gw, "GET", "/config", &lines).await.0, 200);
}

#[tokio::test]
async fn a_token_is_required_when_configured() {
    let gw = TestGateway::start(&config(&format!(", token: {TOKEN}"), "v1")).await;
    rewrite(&gw, &config(&format!(", token: {TOKEN}"), "v2"));

    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    let (status, out) = admin_raw(
        &gw,
        "GET",
        "/config",
        &format!("Host: {}\r\n", gw.gateway().admin_addr().unwrap()),
    )
    .await;
    assert_eq!(status, 401, "{out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("www-authenticate: bearer\r\n"),
        "{out}"
    );
    for wrong in [
        "Authorization: Bearer wrong-token-0123456789abcdef\r\n",
        "Authorization: Basic ZTJlOmFkbWlu\r\n",
        &format!("Authorization: Bearer {TOKEN}x\r\n"),
    ] {
        let (status, _) = admin_request(&gw, "POST", "/reload", wrong).await;
        assert_eq!(status, 401, "{wrong}");
    }
    assert_eq!(hello(&gw).await, "v1");
    let (_, metrics) = admin_request(&gw, "GET", "/metrics", &bearer).await;
    assert!(
        metrics.contains("gateway_admin_refused_total{reason=\"token\"} 4\n"),
        "{metrics}"
    );

    let (status, body) = admin_request(&gw, "GET", "/config", &bearer).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(TOKEN), "{body}");
    assert_eq!(admin_request(&gw, "POST", "/reload", &bearer).await.0, 200);
    assert_eq!(hello(&gw).await, "v2");
    // The probes need no token.
    assert_eq!(admin_request(&gw, "GET", "/health", "").await.0, 200);
    assert_eq!(admin_request(&gw, "GET", "/ready", "").await.0, 200);
    // A right token does not make a foreign page's request acceptable.
    let (status, _) = admin_request(
        &gw,
        "POST",
        "/reload",
        &format!("{bearer}Origin: http://evil.example\r\n"),
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn a_token_file_is_read_again_at_every_reload() {
    let dir = temp_dir();
    std::fs::write(dir.path().join("admin.token"), format!("{TOKEN}\n")).unwrap();
    let yaml = config(", token_file: admin.token", "v1");
    let gw = TestGateway::start_in(dir, &yaml).await;
    rewrite(&gw, &yaml);
    let old = format!("Authorization: Bearer {TOKEN}\r\n");
    assert_eq!(admin_request(&gw, "GET", "/config", "").await.0, 401);
    assert_eq!(admin_request(&gw, "GET", "/config", &old).await.0, 200);

    let rotated = "rotated-token-fedcba9876543210";
    std::fs::write(gw.dir().join("admin.token"), format!("  {rotated}  \n")).unwrap();
    assert_eq!(admin_request(&gw, "POST", "/reload", &old).await.0, 200);
    assert_eq!(admin_request(&gw, "GET", "/config", &old).await.0, 401);
    let new = format!("Authorization: Bearer {rotated}\r\n");
    let (status, body) = admin_request(&gw, "GET", "/config", &new).await;
    assert_eq!(status, 200);
    assert!(!body.contains(rotated), "{body}");
}

#[tokio::test]
async fn config_hides_credentials_set_by_headers_filters() {
    let yaml = format!(
        "{}  - name: api\n    match: {{ path: /api }}\n    filters:\n      - headers:\n          request_set: {{ Authorization: \"Bearer upstream-credential-1\", x-api-key: upstream-key-2, x-kept: shown-3 }}\n          request_add: {{ Cookie: \"session=cookie-4\" }}\n          response_set: {{ x-client-secret: secret-5 }}\n          response_add: {{ Set-Cookie: \"id=cookie-6\", Proxy-Authorization: \"Basic proxy-7\" }}\n    respond: {{ body: ok }}\n",
        config(&format!(", token: {TOKEN}"), "v1")
    );
    let gw = TestGateway::start(&yaml).await;
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    let (status, body) = admin_request(&gw, "GET", "/config", &bearer).await;
    assert_eq!(status, 200, "{body}");
    for secret in [
        "upstream-credential-1",
        "upstream-key-2",
        "cookie-4",
        "secret-5",
        "cookie-6",
        "proxy-7",
        TOKEN,
    ] {
        assert!(!body.contains(secret), "{secret} shown:\n{body}");
    }
    assert!(body.contains("Authorization: <redacted>"), "{body}");
    assert!(body.contains("x-kept: shown-3"), "{body}");
    // The filter itself still sets the header for the backend.
    assert_eq!(http1(gw.addr("main")).await.get("/api").await.status(), 200);
}
