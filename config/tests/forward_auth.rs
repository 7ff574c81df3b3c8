//! `forward_auth` services: a URL becomes an upstream of one target (default ports, IPv6,
//! TLS with the host as server name for https) and a path; an upstream takes a path.

use std::path::Path;

use gateway_config::{AuthService, Filter};

fn service(filter: &str) -> (AuthService, String) {
    let text = format!(
        "upstreams:\n  auth: {{ targets: [127.0.0.1:9200] }}\nroutes:\n  - match: {{ path: /x }}\n    filters: [ {{ forward_auth: {filter} }} ]\n    respond: {{ body: x }}\n"
    );
    let config = gateway_config::load_str(&text, "g.yaml", Path::new(".")).unwrap();
    match &config.routes[0].filters[0] {
        Filter::ForwardAuth(f) => (f.service.clone(), f.path.clone()),
        _ => unreachable!(),
    }
}

#[test]
fn urls_become_one_target_upstreams() {
    for (url, authority, tls, path) in [
        ("http://127.0.0.1", "127.0.0.1:80", false, "/"),
        ("https://127.0.0.1/v?x=1", "127.0.0.1:443", true, "/v?x=1"),
        ("http://[::1]:9200?q", "[::1]:9200", false, "/?q"),
        (
            "http://localhost:9200/auth",
            "localhost:9200",
            false,
            "/auth",
        ),
    ] {
        let (service, got_path) = service(&format!("{{ url: \"{url}\" }}"));
        let AuthService::Url(up) = service else {
            panic!("{url}: not a URL service");
        };
        assert_eq!(up.targets[0].authority, authority, "{url}");
        assert_eq!(up.settings.tls.is_some(), tls, "{url}");
        assert_eq!(got_path, path, "{url}");
        assert_eq!(up.settings.retries, 0);
    }
}

#[test]
fn upstreams_take_a_path_defaulting_to_the_root() {
    let (named, path) = service("{ upstream: auth, response_headers: [X-User] }");
    assert!(matches!(named, AuthService::Upstream(n) if n == "auth"));
    assert_eq!(path, "/");
    let (_, path) = service("{ upstream: auth, path: /verify }");
    assert_eq!(path, "/verify");
}

#[test]
fn bad_services_are_located_errors() {
    for (filter, says) in [
        ("{ url: \"http://a/x\", upstream: auth }", "needs one of"),
        ("{ url: \"http://u:p@a/x\" }", "credentials"),
        ("{ url: \"http://a:0/x\" }", "port"),
        ("{ url: \"http://a b/x\" }", "host"),
        ("{ url: \"http://a/x\", path: /y }", "goes with `upstream`"),
        ("{ upstream: nope }", "unknown upstream"),
        ("{ upstream: auth, path: verify }", "starting with /"),
        ("{ upstream: auth, timeout: 0s }", "greater than 0"),
    ] {
        let text = format!(
            "upstreams:\n  auth: {{ targets: [127.0.0.1:9200] }}\nroutes:\n  - match: {{ path: /x }}\n    filters: [ {{ forward_auth: {filter} }} ]\n    respond: {{ body: x }}\n"
        );
        let err = gateway_config::load_str(&text, "g.yaml", Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("g.yaml:5:"), "{filter}: {err}");
        assert!(err.contains(says), "{filter}: {err}");
    }
}
