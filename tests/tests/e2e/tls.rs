//! TLS listeners end to end: ALPN h2 and http/1.1, TLS 1.2 and 1.3, SNI choosing among named
//! certificates (ECDSA and RSA, exact and wildcard), session resumption, and a bad or missing
//! handshake counted and not affecting others.

use std::sync::Arc;

use gateway_tests::{KeyKind, TestCa, TestGateway, https, temp_dir, tls_connect};

use crate::faults::metric;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Setup {
    gw: TestGateway,
    ca: TestCa,
}

async fn setup(extra_listener: &str) -> Setup {
    let ca = TestCa::new();
    let dir = temp_dir();
    ca.write(
        dir.path(),
        "a-ecdsa",
        &["a.test", "*.wild.test"],
        KeyKind::Ecdsa,
    );
    ca.write(dir.path(), "a-rsa", &["a.test"], KeyKind::Rsa);
    ca.write(dir.path(), "b", &["b.test"], KeyKind::Rsa);
    let yaml = format!(
        r#"
certificates:
  a-ecdsa: {{ cert: a-ecdsa.pem, key: a-ecdsa.key }}
  a-rsa: {{ cert: a-rsa.pem, key: a-rsa.key }}
  b: {{ cert: b.pem, key: b.key }}
listeners:
  - name: tls
    bind: 127.0.0.1:0
    tls: {{ certificates: [a-ecdsa, a-rsa, b] }}
{extra_listener}
routes:
  - match: {{ path: /hello }}
    respond: {{ body: "secure hello" }}
"#
    );
    Setup {
        gw: TestGateway::start_in(dir, &yaml).await,
        ca,
    }
}

fn leaf(tls: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> CertificateDer<'static> {
    tls.get_ref().1.peer_certificates().expect("peer certs")[0]
        .clone()
        .into_owned()
}

fn names_of(der: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    san.value
        .general_names
        .iter()
        .filter_map(|g| match g {
            GeneralName::DNSName(n) => Some(n.to_string()),
            _ => None,
        })
        .collect()
}

fn is_ecdsa(der: &CertificateDer<'_>) -> bool {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).unwrap();
    cert.public_key().algorithm.algorithm.to_id_string() == "1.2.840.10045.2.1"
}

#[tokio::test]
async fn alpn_negotiates_h2_and_http11() {
    let s = setup("").await;
    let addr = s.gw.addr("tls");
    let (mut c, alpn) = https(addr, "a.test", &s.ca, &[b"h2", b"http/1.1"]).await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    let res = c.get("/hello").await;
    assert_eq!(res.head.version, http::Version::HTTP_2);
    assert_eq!(res.text(), "secure hello");

    let (mut c, alpn) = https(addr, "a.test", &s.ca, &[b"http/1.1"]).await;
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    let res = c.get("/hello").await;
    assert_eq!(res.head.version, http::Version::HTTP_11);
    assert_eq!(res.text(), "secure hello");

    // No ALPN at all: HTTP/1.1.
    let (mut c, alpn) = https(addr, "a.test", &s.ca, &[]).await;
    assert_eq!(alpn, None);
    assert_eq!(c.get("/hello").await.text(), "secure hello");
}

#[tokio::test]
async fn tls12_and_tls13_both_work_and_min_version_is_enforced() {
    let s = setup(
        "  - name: tls13only\n    bind: 127.0.0.1:0\n    tls: { certificates: [b], min_version: \"1.3\" }\n",
    )
    .await;
    for (version, expect) in [
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let config = client_with_versions(&s.ca, &[version]);
        let tls = tls_connect(s.gw.addr("tls"), "a.test", config)
            .await
            .expect("handshake");
        assert_eq!(tls.get_ref().1.protocol_version(), Some(expect));
    }
    let config = client_with_versions(&s.ca, &[&rustls::version::TLS12]);
    assert!(
        tls_connect(s.gw.addr("tls13only"), "b.test", config)
            .await
            .is_err()
    );
    let config = client_with_versions(&s.ca, &[&rustls::version::TLS13]);
    assert!(
        tls_connect(s.gw.addr("tls13only"), "b.test", config)
            .await
            .is_ok()
    );
}

fn client_with_versions(
    ca: &TestCa,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der()).unwrap();
    rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth()
}

fn client_with_schemes(ca: &TestCa, rsa_only: bool) -> rustls::ClientConfig {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if rsa_only {
        // A client that cannot verify ECDSA signatures (TLS 1.2 RSA suites only).
        provider.cipher_suites.retain(|s| {
            matches!(
                s.suite(),
                rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
                    | rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
            )
        });
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der()).unwrap();
    rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

#[tokio::test]
async fn sni_picks_the_certificate_and_prefers_ecdsa() {
    let s = setup("").await;
    let addr = s.gw.addr("tls");
    let tls = tls_connect(addr, "b.test", s.ca.client_config(&[]))
        .await
        .unwrap();
    assert_eq!(names_of(&leaf(&tls)), ["b.test"]);
    assert!(!is_ecdsa(&leaf(&tls)));

    let tls = tls_connect(addr, "a.test", s.ca.client_config(&[]))
        .await
        .unwrap();
    assert!(
        is_ecdsa(&leaf(&tls)),
        "ECDSA chosen when the client supports it"
    );

    let tls = tls_connect(addr, "a.test", client_with_schemes(&s.ca, true))
        .await
        .unwrap();
    assert!(!is_ecdsa(&leaf(&tls)), "RSA chosen for an RSA-only client");
    assert_eq!(names_of(&leaf(&tls)), ["a.test"]);

    let tls = tls_connect(addr, "x.wild.test", s.ca.client_config(&[]))
        .await
        .unwrap();
    assert!(names_of(&leaf(&tls)).contains(&"*.wild.test".to_string()));
}

#[tokio::test]
async fn sessions_resume() {
    let s = setup("").await;
    let addr = s.gw.addr("tls");
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let config = client_with_versions(&s.ca, versions);
        let config = Arc::new(config);
        let mut kinds = Vec::new();
        for _ in 0..2 {
            let mut tls = tls_connect(addr, "a.test", (*config).clone())
                .await
                .unwrap();
            // Complete one exchange so TLS 1.3 tickets arrive.
            tls.write_all(b"GET /hello HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = Vec::new();
            tls.read_to_end(&mut out).await.ok();
            assert!(String::from_utf8_lossy(&out).contains("secure hello"));
            kinds.push(tls.get_ref().1.handshake_kind());
        }
        assert_eq!(kinds[0], Some(rustls::HandshakeKind::Full));
        assert_eq!(
            kinds[1],
            Some(rustls::HandshakeKind::Resumed),
            "{versions:?}"
        );
    }
}

const HANDSHAKE_ERRORS: &str =
    "gateway_listener_handshake_failures_total{listener=\"tls\",reason=\"error\"}";
const HANDSHAKE_TIMEOUTS: &str =
    "gateway_listener_handshake_failures_total{listener=\"tls\",reason=\"timeout\"}";

#[tokio::test]
async fn garbage_instead_of_a_client_hello_does_not_affect_others() {
    let s = setup("").await;
    let addr = s.gw.addr("tls");
    assert_eq!(metric(&s.gw, HANDSHAKE_ERRORS), 0);
    let out = gateway_tests::raw(addr, b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    assert!(!out.contains("secure hello"));
    // The connection is closed once the handshake failed, and the failure counted.
    assert_eq!(metric(&s.gw, HANDSHAKE_ERRORS), 1);
    assert_eq!(metric(&s.gw, HANDSHAKE_TIMEOUTS), 0);
    let (mut c, _) = https(addr, "a.test", &s.ca, &[b"h2"]).await;
    assert_eq!(c.get("/hello").await.status(), 200);
}

/// A client that connects and never sends its ClientHello is closed after
/// `header_read_timeout`, and counted.
#[tokio::test]
async fn a_client_hello_that_never_comes_times_out_and_is_counted() {
    let s = setup("    header_read_timeout: 300ms").await;
    let mut tcp = tokio::net::TcpStream::connect(s.gw.addr("tls"))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("the gateway closes the connection");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(250));
    assert_eq!(metric(&s.gw, HANDSHAKE_TIMEOUTS), 1);
    assert_eq!(metric(&s.gw, HANDSHAKE_ERRORS), 0);
}
