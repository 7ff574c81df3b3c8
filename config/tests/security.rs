//! Security settings in the config: the admin API stays on loopback unless `allow_remote` says
//! otherwise, its token and origins are checked at load, `proxy.upgrades` holds protocol
//! tokens, and `tls.hsts` defaults and preload rules.

fn load(yaml: &str) -> Result<gateway_config::Config, String> {
    let dir = tempfile::tempdir().unwrap();
    // Certificate files only need to exist for validation.
    std::fs::write(dir.path().join("c.pem"), "").unwrap();
    std::fs::write(dir.path().join("c.key"), "").unwrap();
    gateway_config::load_str(yaml, "g.yaml", dir.path()).map_err(|e| e.to_string())
}

#[test]
fn admin_beyond_loopback_needs_allow_remote() {
    for bind in ["127.0.0.1:9901", "[::1]:9901"] {
        assert!(load(&format!("admin: {{ bind: \"{bind}\" }}\n")).is_ok());
    }
    let err = load("admin: { bind: 0.0.0.0:9901 }\n").unwrap_err();
    assert!(
        err.contains("admin.bind") && err.contains("allow_remote"),
        "{err}"
    );
    let config = load("admin: { bind: 0.0.0.0:9901, allow_remote: true }\n").unwrap();
    assert_eq!(config.admin.unwrap().addr.to_string(), "0.0.0.0:9901");
}

#[test]
fn admin_token_and_origins_are_checked_at_load() {
    let token = "0123456789abcdef0123";
    let config = load(&format!(
        "admin: {{ bind: 127.0.0.1:9901, token: {token} }}\n"
    ))
    .unwrap();
    assert_eq!(
        config
            .admin
            .as_ref()
            .unwrap()
            .token
            .as_ref()
            .unwrap()
            .as_bytes(),
        token.as_bytes()
    );
    // The token's debug form does not show it.
    assert!(!format!("{:?}", config.admin.as_ref().unwrap()).contains(token));

    let err = load("admin:\n  bind: 127.0.0.1:9901\n  token: short\n").unwrap_err();
    assert!(
        err.starts_with("g.yaml:3:10: admin.token:") && err.contains("16"),
        "{err}"
    );
    assert!(!err.contains("short\n"), "{err}");
    let err = load("admin: { bind: 127.0.0.1:9901, token: \"has spaces in it, 0123456789\" }\n")
        .unwrap_err();
    assert!(
        err.contains("admin.token") && err.contains("may only hold"),
        "{err}"
    );
    let err = load(&format!(
        "admin:\n  bind: 127.0.0.1:9901\n  token: {token}\n  token_file: t.txt\n"
    ))
    .unwrap_err();
    assert!(
        err.starts_with("g.yaml:4:15: admin.token_file:") && err.contains("only one"),
        "{err}"
    );
    let err = load("admin:\n  bind: 127.0.0.1:9901\n  token_file: missing.txt\n").unwrap_err();
    assert!(
        err.starts_with("g.yaml:3:15: admin.token_file:")
            && err.contains("cannot read `missing.txt`"),
        "{err}"
    );

    let config = load(
        "admin: { bind: 127.0.0.1:9901, origins: [\"HTTPS://Ops.Example\", \"admin.internal:9443\"] }\n",
    )
    .unwrap();
    let origins = &config.admin.unwrap().origins;
    assert_eq!(origins[0].scheme.as_deref(), Some("https"));
    assert_eq!(origins[0].authority, "ops.example");
    assert_eq!(origins[1].scheme, None);
    assert_eq!(origins[1].authority, "admin.internal:9443");
    let err = load(
        "admin:\n  bind: 127.0.0.1:9901\n  origins:\n    - localhost:9901\n    - http://a/b\n",
    )
    .unwrap_err();
    assert!(
        err.starts_with("g.yaml:5:7: admin.origins[1]:") && err.contains("path"),
        "{err}"
    );
}

#[test]
fn admin_token_file_is_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.txt"), "  0123456789abcdef0123==\n").unwrap();
    let config = gateway_config::load_str(
        "admin: { bind: 127.0.0.1:9901, token_file: t.txt }\n",
        "g.yaml",
        dir.path(),
    )
    .unwrap();
    let admin = config.admin.unwrap();
    assert_eq!(admin.token.unwrap().as_bytes(), b"0123456789abcdef0123==");
    std::fs::write(dir.path().join("t.txt"), "\n").unwrap();
    let err = gateway_config::load_str(
        "admin: { bind: 127.0.0.1:9901, token_file: t.txt }\n",
        "g.yaml",
        dir.path(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("admin.token_file") && err.contains("`t.txt`"),
        "{err}"
    );
}

#[test]
fn proxy_upgrades_are_protocol_tokens() {
    let route = |upgrades: &str| {
        load(&format!(
            "upstreams:\n  app: {{ targets: [127.0.0.1:9] }}\nroutes:\n  - proxy: {{ upstream: app{upgrades} }}\n"
        ))
    };
    let proxy = |c: gateway_config::Config| match &c.routes[0].action {
        gateway_config::RouteAction::Proxy(p) => p.upgrades.clone(),
        _ => panic!("not a proxy route"),
    };
    assert_eq!(proxy(route("").unwrap()), ["websocket"]);
    assert!(proxy(route(", upgrades: []").unwrap()).is_empty());
    assert_eq!(
        proxy(route(", upgrades: [WebSocket, TLS/1.0]").unwrap()),
        ["websocket", "tls/1.0"]
    );
    let err = route(", upgrades: [websocket, \"a b\"]").unwrap_err();
    assert!(err.contains("routes[0].proxy.upgrades[1]"), "{err}");
    let err = route(", upgrades: [\"foo/\"]").unwrap_err();
    assert!(err.contains("routes[0].proxy.upgrades[0]"), "{err}");
}

const TLS: &str = "certificates:\n  c: { cert: c.pem, key: c.key }\nlisteners:\n  - name: a\n    bind: 127.0.0.1:0\n    tls:\n      certificates: [c]\n";

#[test]
fn hsts_defaults_and_preload_rules() {
    let config = load(&format!("{TLS}      hsts: {{}}\n")).unwrap();
    let hsts = config.listeners[0]
        .tls
        .as_ref()
        .unwrap()
        .hsts
        .clone()
        .unwrap();
    assert_eq!(hsts.max_age.get().as_secs(), 365 * 24 * 3600);
    assert!(!hsts.include_subdomains && !hsts.preload);

    let err = load(&format!("{TLS}      hsts: {{ preload: true }}\n")).unwrap_err();
    assert!(
        err.contains("tls.hsts.preload") && err.contains("include_subdomains"),
        "{err}"
    );
    let err = load(&format!(
        "{TLS}      hsts: {{ max_age: 30d, include_subdomains: true, preload: true }}\n"
    ))
    .unwrap_err();
    assert!(err.contains("tls.hsts.max_age"), "{err}");
    assert!(
        load(&format!(
            "{TLS}      hsts: {{ max_age: 730d, include_subdomains: true, preload: true }}\n"
        ))
        .is_ok()
    );
    let err = load(&format!("{TLS}      hsts: {{ max_age: 1y }}\n")).unwrap_err();
    assert!(err.contains("max_age"), "{err}");
}
