//! The `http3:` block of a listener: defaults, every key accepted, and the located errors for
//! values QUIC cannot use.

use gateway_config::model::CongestionControl;

/// A TLS listener with `http3` and the given extra lines under it (indented four spaces).
fn load(extra: &str) -> Result<gateway_config::Config, String> {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("c.pem"), "x").expect("write");
    std::fs::write(dir.path().join("c.key"), "x").expect("write");
    let text = format!(
        "certificates:\n  c: {{ cert: c.pem, key: c.key }}\nlisteners:\n  - name: web\n    bind: 127.0.0.1:8443\n    protocols: [http1, http2, http3]\n    tls: {{ certificates: [c] }}\n{extra}"
    );
    gateway_config::load_str(&text, "g.yaml", dir.path()).map_err(|e| e.to_string())
}

#[test]
fn defaults() {
    let c = load("").expect("valid");
    let h3 = &c.listeners[0].settings.http3;
    assert!(c.listeners[0].http3);
    assert_eq!(h3.max_concurrent_streams, 128);
    assert_eq!(h3.stream_receive_window.bytes(), 1024 * 1024);
    assert_eq!(h3.connection_receive_window.bytes(), 4 * 1024 * 1024);
    assert!(h3.idle_timeout.is_none());
    assert!(h3.max_connections.is_none());
    assert_eq!(h3.congestion_control, CongestionControl::Cubic);
    assert!(!h3.enable_0rtt);
}

#[test]
fn every_key() {
    let c = load(
        "    http3:\n      max_concurrent_streams: 10\n      stream_receive_window: 256KiB\n      connection_receive_window: 2MiB\n      idle_timeout: 5s\n      max_connections: 7\n      congestion_control: new_reno\n      enable_0rtt: true\n",
    )
    .expect("valid");
    let h3 = &c.listeners[0].settings.http3;
    assert_eq!(h3.max_concurrent_streams, 10);
    assert_eq!(h3.stream_receive_window.bytes(), 256 * 1024);
    assert_eq!(h3.connection_receive_window.bytes(), 2 * 1024 * 1024);
    assert_eq!(h3.idle_timeout.map(|d| d.get().as_secs()), Some(5));
    assert_eq!(h3.max_connections, Some(7));
    assert_eq!(h3.congestion_control, CongestionControl::NewReno);
    assert!(h3.enable_0rtt);
    let bbr = load("    http3: { congestion_control: bbr }\n").expect("valid");
    assert_eq!(
        bbr.listeners[0].settings.http3.congestion_control,
        CongestionControl::Bbr
    );
}

#[test]
fn bad_values_are_located() {
    let err = load("    http3: { max_concurrent_streams: 0 }\n").unwrap_err();
    assert!(
        err.contains("listeners[0].http3.max_concurrent_streams: must be at least 1"),
        "{err}"
    );
    let err = load("    http3: { stream_receive_window: 10 }\n").unwrap_err();
    assert!(err.contains("http3.stream_receive_window"), "{err}");
    let err = load("    http3: { congestion_control: vegas }\n").unwrap_err();
    assert!(err.contains("vegas"), "{err}");
    let err = load("    http3: { idle_timeout: 0s }\n").unwrap_err();
    assert!(err.contains("http3.idle_timeout: must be above 0"), "{err}");
}

#[test]
fn http3_needs_tls_and_claims_udp() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = "listeners:\n  - name: web\n    bind: 127.0.0.1:8443\n    protocols: [http3]\n";
    let err = gateway_config::load_str(text, "g.yaml", dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("http3 requires `tls`"), "{err}");
}

#[test]
fn the_udp_port_is_claimed() {
    let err = load(
        "upstreams:\n  dns: { targets: [127.0.0.1:53] }\nstreams:\n  - { name: dns, bind: 127.0.0.1:8443, protocol: udp, upstream: dns }\n",
    )
    .unwrap_err();
    assert!(
        err.contains("udp address 127.0.0.1:8443 is already bound by listeners[0].bind"),
        "{err}"
    );
}
