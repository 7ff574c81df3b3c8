//! The configuration contract parses whole, and validation reports located errors.

use std::path::Path;

#[test]
fn the_whole_contract_parses() {
    let text = include_str!("fixtures/contract.yaml");
    let raw = gateway_config::parse(text, "contract.yaml").expect("contract parses");
    assert_eq!(raw.listeners.len(), 2);
    assert_eq!(raw.routes.len(), 3);
    assert_eq!(raw.routes[0].filters.len(), 4);
    assert_eq!(raw.streams.len(), 3);
    assert_eq!(raw.upstreams["users"].targets.len(), 2);
    assert_eq!(raw.waf["strict"].rules[0].id, 1001);
    let metrics = raw.telemetry.as_ref().and_then(|t| t.metrics.as_ref());
    assert_eq!(
        metrics.map(|m| m.interval.get()),
        Some(std::time::Duration::from_secs(10))
    );
}

#[test]
fn unknown_keys_are_located_errors() {
    let text = "listeners:\n  - name: web\n    bind: 127.0.0.1:0\n    protocol: [http1]\n";
    let err = gateway_config::parse(text, "g.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("g.yaml:4:5: "), "{err}");
    assert!(err.contains("unknown field `protocol`"), "{err}");
}

#[test]
fn dangling_upstream_reference_names_file_line_col_and_key() {
    let text = "routes:\n  - match: { path: /x }\n    proxy: { upstream: nope }\n";
    let err = gateway_config::load_str(text, "g.yaml", Path::new("."))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "g.yaml:3:24: routes[0].proxy.upstream: unknown upstream `nope` (none are defined)"
    );
}
