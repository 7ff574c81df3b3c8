//! Automatic HTTPS against a real ACME CA (Pebble on loopback, validating against the gateway's
//! own listeners): issuance by TLS-ALPN-01 and HTTP-01, the issued chain served to a client that
//! trusts only Pebble's root, storage reused at restart without a new order, and a renewal forced
//! through the admin API while a load of fresh TLS connections runs with no failure. Also, without
//! Pebble: an ACME name whose certificate has not arrived gets a TLS alert while the listener's
//! other names are served.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gateway_tests::pebble::Pebble;
use gateway_tests::ports::reserved_port;
use gateway_tests::{KeyKind, TestCa, TestGateway, http1, temp_dir, tls_connect};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn client_config(root_pem: &str) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(c.expect("root PEM")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Every request does a full handshake, so each one sees the certificate served now.
    config.resumption = rustls::client::Resumption::disabled();
    config
}

/// One request on a fresh TLS connection: the leaf's serial and the response text.
async fn fetch(
    addr: SocketAddr,
    name: &str,
    config: &rustls::ClientConfig,
) -> std::io::Result<(Vec<u8>, String)> {
    let mut tls = tls_connect(addr, name, config.clone()).await?;
    let leaf = tls.get_ref().1.peer_certificates().expect("peer certs")[0].clone();
    let serial = {
        use x509_parser::prelude::*;
        let (_, cert) = X509Certificate::from_der(&leaf).expect("leaf");
        cert.raw_serial().to_vec()
    };
    let req = format!("GET /hello HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await?;
    Ok((serial, String::from_utf8_lossy(&out).into_owned()))
}

/// Retries `fetch` until the served leaf satisfies `done` (or `limit` passes).
async fn wait_for_cert(
    addr: SocketAddr,
    name: &str,
    config: &rustls::ClientConfig,
    limit: Duration,
    done: impl Fn(&[u8]) -> bool,
) -> Vec<u8> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < limit {
        match fetch(addr, name, config).await {
            Ok((serial, _)) if done(&serial) => return serial,
            Ok(_) => last = "old certificate".into(),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no (new) certificate for {name} within {limit:?}: {last}");
}

async fn admin(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut client = http1(addr).await;
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let res = client.send(req).await.expect("admin request");
    (res.status(), res.text())
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

fn config(
    pebble: &Pebble,
    storage: &std::path::Path,
    domain: &str,
    challenge: &str,
    tls: u16,
    plain: u16,
) -> String {
    format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
certificates:
  site:
    acme:
      domains: [{domain}]
      email: ops@example.com
      directory: {dir}
      directory_ca: {ca}
      challenge: {challenge}
      storage: {storage}
listeners:
  - name: tls
    bind: 127.0.0.1:{tls}
    tls: {{ certificates: [site] }}
  - name: plain
    bind: 127.0.0.1:{plain}
routes:
  - match: {{ path: /hello }}
    respond: {{ body: "hello over acme" }}
"#,
        dir = pebble.directory,
        ca = pebble.directory_ca.display(),
        storage = storage.display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_alpn_01_issues_then_restart_reuses_storage_and_renewal_swaps_under_load() {
    let work = temp_dir();
    let (tls_port, plain_port) = (reserved_port(), reserved_port());
    let Some(pebble) = Pebble::start(work.path(), plain_port, tls_port).await else {
        return;
    };
    let storage = work.path().join("acme");
    let domain = "alpn.acme.test";
    let yaml = config(
        &pebble,
        &storage,
        domain,
        "tls-alpn-01",
        tls_port,
        plain_port,
    );
    let root = pebble.issuing_root().await;
    let client = client_config(&root);

    let gw = TestGateway::start_in(temp_dir(), &yaml).await;
    let addr = gw.addr("tls");
    let first = wait_for_cert(addr, domain, &client, Duration::from_secs(60), |_| true).await;
    let (_, text) = fetch(addr, domain, &client).await.expect("request");
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("hello over acme"),
        "{text}"
    );

    // Stored with safe permissions.
    use std::os::unix::fs::PermissionsExt;
    for (file, mode) in [
        ("account.json", 0o600),
        ("key.pem", 0o600),
        ("cert.pem", 0o644),
    ] {
        let meta = std::fs::metadata(storage.join("site").join(file)).expect(file);
        assert_eq!(meta.permissions().mode() & 0o777, mode, "{file}");
    }
    let admin_addr = gw.gateway().admin_addr().expect("admin");
    let (_, metrics) = admin(admin_addr, "GET", "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            r#"gateway_acme_orders_total{certificate="site",result="ok"}"#
        ),
        1,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            r#"gateway_acme_challenges_served_total{challenge="tls-alpn-01"}"#
        ) >= 1,
        "{metrics}"
    );
    gw.shutdown().await;

    // A restart serves the stored certificate at once, without a new order.
    let gw = TestGateway::start_in(temp_dir(), &yaml).await;
    let addr = gw.addr("tls");
    let (serial, _) = fetch(addr, domain, &client)
        .await
        .expect("stored certificate served");
    assert_eq!(
        serial, first,
        "the stored certificate is served after a restart"
    );
    let admin_addr = gw.gateway().admin_addr().expect("admin");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, metrics) = admin(admin_addr, "GET", "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            r#"gateway_acme_orders_total{certificate="site",result="ok"}"#
        ),
        0,
        "no order at start while the stored certificate is not due: {metrics}"
    );

    // Renewal forced while a load of new TLS connections runs: no request fails.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (stop, ok, failed, client) = (stop.clone(), ok.clone(), failed.clone(), client.clone());
        workers.push(tokio::spawn(async move {
            let mut serials = std::collections::HashSet::new();
            while !stop.load(Ordering::Relaxed) {
                match fetch(addr, domain, &client).await {
                    Ok((serial, text)) if text.ends_with("hello over acme") => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        serials.insert(serial);
                    }
                    Ok((_, text)) => {
                        eprintln!("bad response: {text}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("request failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            serials
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = admin(admin_addr, "POST", "/acme/renew?certificate=site").await;
    assert_eq!(status, 202, "{body}");
    let renewed = wait_for_cert(addr, domain, &client, Duration::from_secs(60), |s| {
        s != first
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let mut seen = std::collections::HashSet::new();
    for w in workers {
        seen.extend(w.await.expect("worker"));
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert_eq!(
        failed,
        0,
        "{failed} of {} requests failed during the renewal",
        ok + failed
    );
    assert!(ok >= 10, "the load ran ({ok} requests)");
    assert!(
        seen.contains(&first) && seen.contains(&renewed),
        "the load saw both certificates"
    );
    let (_, metrics) = admin(admin_addr, "GET", "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            r#"gateway_acme_orders_total{certificate="site",result="ok"}"#
        ),
        1,
        "{metrics}"
    );
    let stored = std::fs::read_to_string(storage.join("site/cert.pem")).expect("cert.pem");
    let leaf = CertificateDer::pem_slice_iter(stored.as_bytes())
        .next()
        .expect("leaf")
        .expect("PEM");
    let (_, parsed) = x509_parser::parse_x509_certificate(&leaf).expect("stored leaf");
    assert_eq!(
        parsed.raw_serial(),
        renewed.as_slice(),
        "the renewed certificate is stored"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_01_issues_through_the_plain_listener() {
    let work = temp_dir();
    let (tls_port, plain_port) = (reserved_port(), reserved_port());
    let Some(pebble) = Pebble::start(work.path(), plain_port, tls_port).await else {
        return;
    };
    let storage = work.path().join("acme");
    let domain = "http.acme.test";
    let yaml = config(&pebble, &storage, domain, "http-01", tls_port, plain_port);
    let client = client_config(&pebble.issuing_root().await);
    let gw = TestGateway::start_in(temp_dir(), &yaml).await;
    let addr = gw.addr("tls");
    wait_for_cert(addr, domain, &client, Duration::from_secs(60), |_| true).await;
    let (_, text) = fetch(addr, domain, &client).await.expect("request");
    assert!(text.ends_with("hello over acme"), "{text}");

    let admin_addr = gw.gateway().admin_addr().expect("admin");
    let (_, metrics) = admin(admin_addr, "GET", "/metrics").await;
    assert!(
        metric(
            &metrics,
            r#"gateway_acme_challenges_served_total{challenge="http-01"}"#
        ) >= 1,
        "{metrics}"
    );
    // With no challenge pending the path is an ordinary request (no route here: 404).
    let mut plain = http1(gw.addr("plain")).await;
    assert_eq!(
        plain
            .get("/.well-known/acme-challenge/anything")
            .await
            .status(),
        404
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_pending_acme_name_gets_an_alert_while_other_names_are_served() {
    let ca = TestCa::new();
    let dir = temp_dir();
    ca.write(dir.path(), "other", &["other.test"], KeyKind::Ecdsa);
    ca.write(dir.path(), "directory-ca", &["127.0.0.1"], KeyKind::Ecdsa);
    // A directory nobody listens on: the order fails and is retried with backoff.
    let closed = reserved_port();
    let yaml = format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
certificates:
  other: {{ cert: other.pem, key: other.key }}
  site:
    acme:
      domains: [pending.test]
      directory: https://127.0.0.1:{closed}/dir
      directory_ca: directory-ca.pem
      storage: acme
listeners:
  - name: tls
    bind: 127.0.0.1:0
    tls: {{ certificates: [other, site] }}
routes:
  - match: {{ path: /hello }}
    respond: {{ body: "hello over acme" }}
"#
    );
    let gw = TestGateway::start_in(dir, &yaml).await;
    let addr = gw.addr("tls");
    let (_, text) = fetch(addr, "other.test", &ca.client_config(&[b"http/1.1"]))
        .await
        .expect("the other name is served");
    assert!(text.ends_with("hello over acme"), "{text}");
    let err = fetch(addr, "pending.test", &ca.client_config(&[b"http/1.1"]))
        .await
        .expect_err("no certificate yet");
    assert!(err.to_string().contains("AccessDenied"), "{err}");

    let admin_addr = gw.gateway().admin_addr().expect("admin");
    let start = Instant::now();
    loop {
        let (_, metrics) = admin(admin_addr, "GET", "/metrics").await;
        if metric(
            &metrics,
            r#"gateway_acme_orders_total{certificate="site",result="error"}"#,
        ) >= 1
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        admin(admin_addr, "POST", "/acme/renew?certificate=other")
            .await
            .0,
        404
    );
    assert_eq!(admin(admin_addr, "POST", "/acme/renew").await.0, 202);
    // Still serving after failed orders.
    assert!(
        fetch(addr, "other.test", &ca.client_config(&[b"http/1.1"]))
            .await
            .is_ok()
    );
    gw.shutdown().await;
}
