//! Security settings in the config: the admin API stays on loopback unless `allow_remote` says
//! otherwise, and `tls.hsts` defaults and preload rules.

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
    assert_eq!(config.admin.unwrap().to_string(), "0.0.0.0:9901");
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
