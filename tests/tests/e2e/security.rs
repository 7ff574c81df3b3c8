//! Security defaults end to end: no version in `Server`, HSTS on TLS listeners only, old TLS
//! versions and weak suites refused (checked with `openssl s_client` when it is installed),
//! client certificates (mTLS) required and verified, and the request body limit (413 for a
//! declared and for a streamed body; HTTP/1.1 and HTTP/2).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{
    KeyKind, TestCa, TestGateway, http1, http2c, https, raw_status, raw_with_timeout, temp_dir,
    tls_connect,
};
use http::Request;
use http_body_util::Full;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTE: &str = r#"
routes:
  - match: { path: /hello }
    respond: { body: "hello" }
"#;

#[tokio::test]
async fn server_header_names_no_version_and_can_be_turned_off() {
    let yaml = format!("listeners:\n  - name: main\n    bind: 127.0.0.1:0\n{ROUTE}");
    let gw = TestGateway::start(&yaml).await;
    let mut c = http1(gw.addr("main")).await;
    for path in ["/hello", "/missing"] {
        let res = c.get(path).await;
        assert_eq!(res.header("server"), "gateway", "{path}");
    }
    let quiet = format!("server: {{ server_header: \"\" }}\n{yaml}");
    let gw = TestGateway::start(&quiet).await;
    let mut c = http1(gw.addr("main")).await;
    for path in ["/hello", "/missing"] {
        assert!(c.get(path).await.head.headers.get("server").is_none());
    }
}

struct Tls {
    gw: TestGateway,
    ca: TestCa,
    /// Issues the client certificates the listener `mtls` accepts.
    client_ca: TestCa,
}

async fn tls_gateway() -> Tls {
    let ca = TestCa::new();
    let client_ca = TestCa::new();
    let dir = temp_dir();
    ca.write(dir.path(), "site", &["a.test"], KeyKind::Ecdsa);
    ca.write(dir.path(), "rsa", &["a.test"], KeyKind::Rsa);
    std::fs::write(dir.path().join("clients.pem"), &client_ca.pem).unwrap();
    let yaml = format!(
        r#"
certificates:
  site: {{ cert: site.pem, key: site.key }}
  rsa: {{ cert: rsa.pem, key: rsa.key }}
listeners:
  - name: tls
    bind: 127.0.0.1:0
    tls:
      certificates: [site, rsa]
      hsts: {{ max_age: 365d, include_subdomains: true }}
  - name: plain
    bind: 127.0.0.1:0
  - name: mtls
    bind: 127.0.0.1:0
    tls: {{ certificates: [site], client_ca: clients.pem }}
{ROUTE}"#
    );
    Tls {
        gw: TestGateway::start_in(dir, &yaml).await,
        ca,
        client_ca,
    }
}

#[tokio::test]
async fn hsts_is_sent_on_tls_listeners_only() {
    let t = tls_gateway().await;
    let want = "max-age=31536000; includeSubDomains";
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let (mut c, _) = https(t.gw.addr("tls"), "a.test", &t.ca, &[alpn]).await;
        for path in ["/hello", "/missing"] {
            let res = c.get(path).await;
            assert_eq!(res.header("strict-transport-security"), want, "{path}");
        }
    }
    let mut c = http1(t.gw.addr("plain")).await;
    let res = c.get("/hello").await;
    assert!(res.head.headers.get("strict-transport-security").is_none());
}

/// A client presenting a certificate issued by `issuer`, or none.
fn client_config(t: &Tls, issuer: Option<&TestCa>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(t.ca.der()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match issuer {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let (cert, key) = ca.issue(&["client.test"], KeyKind::Ecdsa);
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    }
}

/// Whether a GET over a fresh TLS connection with `config` is answered with 200. With TLS 1.3
/// the server's verdict on a client certificate may arrive after the client's handshake ends,
/// so the exchange, not the handshake, is what counts.
async fn served(addr: std::net::SocketAddr, config: rustls::ClientConfig) -> bool {
    let Ok(mut tls) = tls_connect(addr, "a.test", config).await else {
        return false;
    };
    let req = b"GET /hello HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n";
    if tls.write_all(req).await.is_err() {
        return false;
    }
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut out)).await;
    matches!(read, Ok(Ok(_))) && raw_status(&String::from_utf8_lossy(&out)) == 200
}

#[tokio::test]
async fn mutual_tls_requires_a_certificate_from_the_client_ca() {
    let t = tls_gateway().await;
    let addr = t.gw.addr("mtls");
    assert!(served(addr, client_config(&t, Some(&t.client_ca))).await);
    assert!(
        !served(addr, client_config(&t, None)).await,
        "no certificate"
    );
    let stranger = TestCa::new();
    assert!(
        !served(addr, client_config(&t, Some(&stranger))).await,
        "a certificate from another CA"
    );
    // The listener without `client_ca` does not ask.
    assert!(served(t.gw.addr("tls"), client_config(&t, None)).await);
}

/// Runs `openssl s_client` with `args`; `None` when openssl is not installed.
async fn s_client(port: u16, args: &[&str]) -> Option<(bool, String)> {
    let out = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-servername", "a.test"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .ok()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.success(), text))
}

#[tokio::test]
async fn old_tls_versions_and_weak_suites_are_refused() {
    let t = tls_gateway().await;
    let port = t.gw.addr("tls").port();
    // The client side is told to allow everything, so a refusal is the server's.
    let weak: &[(&str, &[&str])] = &[
        ("TLS 1.0", &["-tls1", "-cipher", "DEFAULT@SECLEVEL=0"]),
        ("TLS 1.1", &["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"]),
        (
            "RSA key exchange",
            &["-tls1_2", "-cipher", "AES128-GCM-SHA256"],
        ),
        (
            "CBC suite",
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA"],
        ),
        (
            "CBC-SHA256 suite",
            &["-tls1_2", "-cipher", "ECDHE-RSA-AES128-SHA256"],
        ),
    ];
    let Some((ok, text)) = s_client(port, &["-tls1_2"]).await else {
        eprintln!("skipping: openssl not found (scripts/setup.sh installs it)");
        return;
    };
    assert!(ok && text.contains("TLSv1.2"), "TLS 1.2 works:\n{text}");
    let (ok, text) = s_client(port, &["-tls1_3"]).await.unwrap();
    assert!(ok && text.contains("TLSv1.3"), "TLS 1.3 works:\n{text}");
    let (ok, text) = s_client(
        port,
        &["-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"],
    )
    .await
    .unwrap();
    assert!(ok, "a modern TLS 1.2 suite works:\n{text}");
    for (what, args) in weak {
        let (ok, text) = s_client(port, args).await.unwrap();
        assert!(!ok, "{what} was accepted:\n{text}");
        // Refused by the server (a handshake-failure or protocol-version alert), not by the
        // client failing to build its hello.
        assert!(
            text.contains("alert") && !text.contains("no protocols available"),
            "{what}: not refused by the server:\n{text}"
        );
    }
}

async fn body_limit_gateway() -> (TestGateway, Backend) {
    let backend = Backend::start("origin").await;
    let yaml = format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
    max_body_size: 1KiB
upstreams:
  origin: {{ targets: ["{}"] }}
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: origin }}
"#,
        backend.addr()
    );
    (TestGateway::start(&yaml).await, backend)
}

#[tokio::test]
async fn bodies_over_max_body_size_get_413() {
    let (gw, backend) = body_limit_gateway().await;
    let addr = gw.addr("main");
    let big = "x".repeat(2000);

    // Declared with Content-Length: refused before anything is forwarded.
    let out = raw_with_timeout(
        addr,
        format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\nConnection: close\r\n\r\n{big}").as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(raw_status(&out), 413, "{out}");
    assert_eq!(backend.requests(), 0);

    // Chunked: cut off once it passes the limit.
    let chunk = "x".repeat(300);
    let chunks: String = (0..7).map(|_| format!("12c\r\n{chunk}\r\n")).collect();
    let out = raw_with_timeout(
        addr,
        format!("POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{chunks}0\r\n\r\n").as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(raw_status(&out), 413, "{out}");

    // At the limit, and HTTP/2 over it.
    let mut c = http1(addr).await;
    let req = Request::post("/upload")
        .body(Full::new(Bytes::from(vec![b'y'; 1024])))
        .unwrap();
    let res = c.send(req).await.unwrap();
    assert_eq!((res.status(), res.text()), (200, "1024".to_owned()));
    let mut h2 = http2c(addr).await;
    let req = Request::post("/upload")
        .body(Full::new(Bytes::from(big.clone())))
        .unwrap();
    assert_eq!(h2.send(req).await.unwrap().status(), 413);
}
