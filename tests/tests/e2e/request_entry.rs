//! What a request is checked for and made into as it enters, on the HTTP/1.1 fast path and the
//! general path alike (and over HTTP/2 where it applies): the client's hop-by-hop fields go
//! before any filter, routes match the normalized path, `Host` follows RFC 9112, and an
//! `Upgrade` that is not answered with `101` leaves the framing checks on. Each request is raw
//! bytes on a real socket, against a real backend that records what it receives.

use std::time::Duration;

use gateway_tests::backend::Backend;
use gateway_tests::{
    FAST_AND_GENERAL_LISTENERS, TestGateway, counter_value, http2c, raw, raw_status,
    raw_with_timeout,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LISTENERS: [&str; 2] = ["fast", "general"];

/// `/api/admin` answers 403 itself; the rest of `/api` goes to `backend`; `/gw` sets `x-gw` on
/// the request before the proxy; `/static` is a fixed answer.
async fn setup(extra_listener_keys: &str) -> (TestGateway, Backend) {
    let backend = Backend::start("origin").await;
    let listeners = FAST_AND_GENERAL_LISTENERS.replace(
        "    http1_fast_path: false\n",
        &format!("    http1_fast_path: false\n{extra_listener_keys}"),
    );
    let listeners = listeners.replace(
        "  - name: fast\n    bind: 127.0.0.1:0\n",
        &format!("  - name: fast\n    bind: 127.0.0.1:0\n{extra_listener_keys}"),
    );
    let yaml = format!(
        r#"{listeners}
upstreams:
  origin: {{ targets: ["{addr}"] }}
routes:
  - match: {{ path_prefix: /api/admin }}
    respond: {{ status: 403, body: "denied" }}
  - match: {{ path_prefix: /api }}
    proxy: {{ upstream: origin }}
  - match: {{ path_prefix: /gw }}
    filters:
      - headers: {{ request_set: {{ x-gw: from-gateway }} }}
    proxy: {{ upstream: origin }}
  - match: {{ path_prefix: / }}
    respond: {{ status: 200, body: "root" }}
"#,
        addr = backend.addr()
    );
    (TestGateway::start(&yaml).await, backend)
}

fn get(target: &str, extra: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: gw.example\r\n{extra}Connection: close\r\n\r\n")
        .into_bytes()
}

#[tokio::test]
async fn a_field_the_client_names_in_connection_does_not_remove_what_a_filter_sets() {
    let (gw, backend) = setup("").await;
    for listener in LISTENERS {
        let out = raw(
            gw.addr(listener),
            &get(
                "/gw/x",
                "Connection: keep-alive, x-gw, x-secret\r\nX-Gw: from-client\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\nTE: trailers, deflate\r\n",
            ),
        )
        .await;
        assert_eq!(raw_status(&out), 200, "{listener}: {out}");
        let seen = backend.last().expect("the backend saw the request");
        assert_eq!(seen.header("x-gw"), "from-gateway", "{listener}");
        assert_eq!(seen.header("x-secret"), "", "{listener}");
        assert_eq!(seen.header("keep-alive"), "", "{listener}");
        assert_eq!(seen.header("te"), "trailers", "{listener}");
    }
    gw.shutdown().await;
}

/// Each probe names `/api/admin` in disguise; the deny route must answer it, the backend must
/// never see it.
const PREFIX_ESCAPES: &[&str] = &[
    "/api/x/../admin",
    "/api/./admin",
    "/api//admin",
    "/api/%61dmin",
    "/api/x/%2e%2e/admin",
    "/api/x/%2E%2E/admin/",
    "//api/admin",
];

#[tokio::test]
async fn routes_match_the_normalized_path_on_every_path() {
    let (gw, backend) = setup("").await;
    for listener in LISTENERS {
        for probe in PREFIX_ESCAPES {
            let out = raw(gw.addr(listener), &get(probe, "")).await;
            assert_eq!(raw_status(&out), 403, "{listener} {probe}: {out}");
        }
    }
    // Over HTTP/2 too (h2c on the general listener).
    let mut client = http2c(gw.addr("general")).await;
    for probe in PREFIX_ESCAPES {
        assert_eq!(client.get(probe).await.status(), 403, "h2 {probe}");
    }
    assert_eq!(
        backend.requests(),
        0,
        "the backend saw a disguised /api/admin"
    );

    // A path that needs normalizing is forwarded normalized, its query untouched.
    for listener in LISTENERS {
        let out = raw(gw.addr(listener), &get("/api/v1/./x/../users?q=a/../b", "")).await;
        assert_eq!(raw_status(&out), 200, "{listener}: {out}");
        let seen = backend.last().expect("forwarded");
        assert_eq!(seen.uri.to_string(), "/api/v1/users?q=a/../b", "{listener}");
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn an_escaped_slash_or_a_backslash_is_refused_by_default() {
    let (gw, backend) = setup("").await;
    for listener in LISTENERS {
        for probe in [
            "/api%2Fadmin",
            "/api/x/..%2Fadmin",
            "/api/x/..%5cadmin",
            "/api/%zz",
        ] {
            let out = raw(gw.addr(listener), &get(probe, "")).await;
            assert_eq!(raw_status(&out), 400, "{listener} {probe}: {out}");
        }
    }
    assert_eq!(backend.requests(), 0);
    let escaped = "gateway_http_rejected_total{listener=\"fast\",reason=\"escaped_slash\"}";
    assert_eq!(counter_value(&gw, escaped).await, 3);
    let invalid =
        "gateway_http_rejected_total{listener=\"general\",reason=\"invalid_path_escape\"}";
    assert_eq!(counter_value(&gw, invalid).await, 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn escaped_slashes_kept_as_data_and_the_original_path_forwarded_when_configured() {
    let keys = "    path_normalization: { escaped_slashes: keep, forward: original }\n";
    let (gw, backend) = setup(keys).await;
    for listener in LISTENERS {
        // Routed on `/api/admin` (normalized) though the original is forwarded.
        let out = raw(gw.addr(listener), &get("/api/x/../admin", "")).await;
        assert_eq!(raw_status(&out), 403, "{listener}: {out}");
        // `%2F` is data: `/api/x%2Fy` stays under `/api` and reaches the backend as written.
        let out = raw(gw.addr(listener), &get("/api/x/..%2Fy/./z", "")).await;
        assert_eq!(raw_status(&out), 200, "{listener}: {out}");
        let seen = backend.last().expect("forwarded");
        assert_eq!(seen.uri.to_string(), "/api/x/..%2Fy/./z", "{listener}");
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn host_follows_rfc_9112() {
    let (gw, backend) = setup("").await;
    let probes: &[(&str, &[u8], &str)] = &[
        (
            "no Host",
            b"GET /api/x HTTP/1.1\r\nConnection: close\r\n\r\n",
            "missing_host",
        ),
        (
            "two Host lines",
            b"GET /api/x HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
            "duplicate_host",
        ),
        (
            "userinfo in an absolute target",
            b"GET http://x@evil/api/x HTTP/1.1\r\nHost: evil\r\nConnection: close\r\n\r\n",
            "userinfo_in_target",
        ),
        (
            "a quote in Host",
            b"GET /api/x HTTP/1.1\r\nHost: a\"b\r\nConnection: close\r\n\r\n",
            "invalid_host",
        ),
        (
            "a comma in Host",
            b"GET /api/x HTTP/1.1\r\nHost: a,b\r\nConnection: close\r\n\r\n",
            "invalid_host",
        ),
        (
            "a semicolon in Host",
            b"GET /api/x HTTP/1.1\r\nHost: a;for=1\r\nConnection: close\r\n\r\n",
            "invalid_host",
        ),
        (
            "a space in Host",
            b"GET /api/x HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n",
            "invalid_host",
        ),
    ];
    for listener in LISTENERS {
        for (what, bytes, reason) in probes {
            let series = format!(
                "gateway_http_rejected_total{{listener=\"{listener}\",reason=\"{reason}\"}}"
            );
            let before = counter_value(&gw, &series).await;
            let out = raw(gw.addr(listener), bytes).await;
            assert_eq!(raw_status(&out), 400, "{listener}, {what}: {out}");
            // hyper itself refuses some shapes before the gateway's rules see them; the rest
            // are counted by reason.
            let after = counter_value(&gw, &series).await;
            assert!(after <= before + 1, "{listener}, {what}");
        }
        // HTTP/1.0 needs no Host; an IPv6 literal with a port is a host.
        let out = raw(gw.addr(listener), b"GET /api/x HTTP/1.0\r\n\r\n").await;
        assert!(
            out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
            "{out}"
        );
        let out = raw(
            gw.addr(listener),
            b"GET /api/x HTTP/1.1\r\nHost: [::1]:8080\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(raw_status(&out), 200, "{listener}: {out}");
        assert_eq!(
            backend.last().expect("seen").header("x-forwarded-host"),
            "[::1]:8080"
        );
    }
    assert_eq!(
        backend.requests(),
        2 * 2,
        "only the good requests reached the backend"
    );
    let missing = "gateway_http_rejected_total{listener=\"fast\",reason=\"missing_host\"}";
    assert_eq!(counter_value(&gw, missing).await, 1);
    let invalid = "gateway_http_rejected_total{listener=\"general\",reason=\"invalid_host\"}";
    assert_eq!(counter_value(&gw, invalid).await, 4);
    gw.shutdown().await;
}

/// Requests in smuggling shapes, each sent after a request with `Upgrade` that the route
/// answers with an ordinary `200`: the connection is still HTTP/1, so each is refused.
const AFTER_UPGRADE: &[(&str, &[u8])] = &[
    (
        "two content-lengths",
        b"POST /api/smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\nhello",
    ),
    (
        "gzip, chunked",
        b"POST /api/smuggled HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    ),
    ("bare LF", b"GET /api/smuggled HTTP/1.1\nHost: a\n\n"),
];

#[tokio::test]
async fn an_upgrade_answered_without_101_leaves_the_framing_checks_on() {
    let (gw, backend) = setup("").await;
    for listener in LISTENERS {
        for (what, smuggled) in AFTER_UPGRADE {
            let mut s = tokio::net::TcpStream::connect(gw.addr(listener))
                .await
                .unwrap();
            // `/` answers 200 by itself: no 101, so the connection stays HTTP/1.
            s.write_all(
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: foo\r\n\r\n",
            )
            .await
            .unwrap();
            let mut first = vec![0u8; 1024];
            let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut first))
                .await
                .expect("an answer")
                .unwrap();
            let first = String::from_utf8_lossy(&first[..n]).to_string();
            assert_eq!(raw_status(&first), 200, "{listener} {what}: {first}");
            s.write_all(smuggled).await.unwrap();
            let mut rest = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest)).await;
            let rest = String::from_utf8_lossy(&rest).to_string();
            assert_eq!(raw_status(&rest), 400, "{listener} {what}: {rest}");
        }
    }
    assert_eq!(
        backend.requests(),
        0,
        "a smuggled request reached the backend"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_request_the_rules_leave_unchanged_stays_on_the_fast_path() {
    let (gw, _backend) = setup("").await;
    let before = gateway_tests::fast_path_count(&gw, "fast").await;
    let out = raw_with_timeout(
        gw.addr("fast"),
        b"GET /a%20b HTTP/1.1\r\nHost: gw.example:8080\r\nConnection: close\r\n\r\n",
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(raw_status(&out), 200, "{out}");
    assert_eq!(
        gateway_tests::fast_path_count(&gw, "fast").await,
        before + 1
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn bytes_other_servers_take_in_a_target_are_taken_and_forwarded_escaped() {
    let (gw, backend) = setup("").await;
    for listener in LISTENERS {
        let out = raw(
            gw.addr(listener),
            &get("/api/a\"b<c>d|e{f}g^h`?q=\"<x>\"|{}^`", ""),
        )
        .await;
        assert_eq!(raw_status(&out), 200, "{listener}: {out}");
        let seen = backend.last().expect("forwarded");
        assert_eq!(
            seen.uri.to_string(),
            "/api/a%22b%3Cc%3Ed|e{f}g^h%60?q=%22%3Cx%3E%22|{}^%60",
            "{listener}"
        );
    }
    gw.shutdown().await;

    // A listener kept to RFC 3986 refuses each of them.
    let (gw, backend) = setup("    strict_uri: true\n").await;
    for listener in LISTENERS {
        for probe in [
            "/api/a\"b",
            "/api/a<b",
            "/api/a`b",
            "/api/a|b",
            "/api/a{b}",
            "/api/a^b",
            "/api/x?q=<x>",
        ] {
            let out = raw(gw.addr(listener), &get(probe, "")).await;
            assert_eq!(raw_status(&out), 400, "{listener} {probe}: {out}");
        }
        let out = raw(gw.addr(listener), &get("/api/fine?q=1", "")).await;
        assert_eq!(raw_status(&out), 200, "{listener}: {out}");
    }
    assert_eq!(backend.requests(), 2);
    let series = "gateway_http_rejected_total{listener=\"general\",reason=\"invalid_target\"}";
    assert_eq!(
        counter_value(&gw, series).await,
        4,
        "the four the URI parser takes (`\"`, `|`, `{{}}`, `^`)"
    );
    gw.shutdown().await;
}
