//! OCSP stapling end to end against a real responder (`openssl ocsp`): a certificate whose
//! authority information access names the responder gets a checked "good" answer stapled to its
//! handshakes; a revoked certificate's answer is refused and never stapled; a responder that is
//! down leaves handshakes working without a staple. Each failure is counted in
//! `gateway_ocsp_fetches_total`. Without `openssl` the tests say why and return.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gateway_tests::ports::reserved_port;
use gateway_tests::{TestGateway, temp_dir, tls_connect};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serials of the two leaves, as `openssl` writes them in `index.txt`.
const GOOD_SERIAL: &str = "1001";
const REVOKED_SERIAL: &str = "1002";

fn have_openssl() -> bool {
    let found = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipped: openssl is not installed (scripts/setup.sh installs it)");
    }
    found
}

/// Runs `openssl ARGS` in `dir` and returns its stdout; panics with stderr on failure.
fn openssl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A test CA, and leaves signed by it that name `http://127.0.0.1:PORT/` as their OCSP
/// responder. Each leaf's `NAME.pem` holds the leaf followed by the CA (the issuer must follow
/// the leaf for the gateway to build the request).
fn make_pki(dir: &Path, responder_port: u16, leaves: &[(&str, &str, &str)]) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    openssl(
        dir,
        &[
            &["req", "-x509", "-nodes", "-days", "2"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=OCSP Test CA",
            ],
        ]
        .concat(),
    );
    // Two responder certificates signed by the CA: one delegated to sign OCSP responses (the
    // OCSPSigning extended key usage), one not.
    for (name, eku) in [
        ("delegated", "extendedKeyUsage = OCSPSigning\n"),
        ("undelegated", ""),
    ] {
        let (key, csr, crt, cnf) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.cnf"),
        );
        std::fs::write(
            dir.join(&cnf),
            format!("basicConstraints = CA:FALSE\n{eku}"),
        )
        .expect("write responder ext");
        let subj = format!("/CN=OCSP responder {name}");
        openssl(
            dir,
            &[
                &["req", "-new", "-nodes"][..],
                &ec,
                &["-keyout", &key, "-out", &csr, "-subj", &subj],
            ]
            .concat(),
        );
        openssl(
            dir,
            &[
                "x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key", "-days", "1",
                "-extfile", &cnf, "-out", &crt,
            ],
        );
    }
    let mut index = String::new();
    for (name, host, serial) in leaves {
        let ext = format!(
            "authorityInfoAccess = OCSP;URI:http://127.0.0.1:{responder_port}/\n\
             subjectAltName = DNS:{host}\n\
             basicConstraints = CA:FALSE\n"
        );
        std::fs::write(dir.join(format!("{name}.cnf")), ext).expect("write ext.cnf");
        let (key, csr, crt, cnf) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.cnf"),
        );
        let subj = format!("/CN={host}");
        openssl(
            dir,
            &[
                &["req", "-new", "-nodes"][..],
                &ec,
                &["-keyout", &key, "-out", &csr, "-subj", &subj],
            ]
            .concat(),
        );
        let set_serial = format!("0x{serial}");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                &set_serial,
                "-days",
                "1",
                "-extfile",
                &cnf,
                "-out",
                &crt,
            ],
        );
        let printed = openssl(dir, &["x509", "-in", &crt, "-noout", "-serial"]);
        assert_eq!(printed.trim(), format!("serial={serial}"));
        let chain = [
            std::fs::read(dir.join(&crt)).expect("leaf"),
            std::fs::read(dir.join("ca.pem")).expect("ca"),
        ]
        .concat();
        std::fs::write(dir.join(format!("{name}.pem")), chain).expect("write chain");
        // The CA database: V(alid) or R(evoked), expiry, revocation time, serial, file, subject.
        if *serial == REVOKED_SERIAL {
            index.push_str(&format!(
                "R\t491231235959Z\t250101000000Z\t{serial}\tunknown\t{subj}\n"
            ));
        } else {
            index.push_str(&format!("V\t491231235959Z\t\t{serial}\tunknown\t{subj}\n"));
        }
    }
    std::fs::write(dir.join("index.txt"), index).expect("write index.txt");
}

/// A running `openssl ocsp` responder, killed on drop.
struct Responder {
    child: Child,
}

impl Responder {
    /// Starts the responder on `port` and waits until it answers a status query for `probe`
    /// with `expect` ("good" or "revoked"), so the gateway's first fetch finds it up.
    /// `signer` names the key pair that signs responses: `ca` (`ca.pem`, `ca.key`; `ca-no-certs`
    /// without including the certificate), or a
    /// responder certificate, `delegated` or `undelegated` (`NAME.crt`, `NAME.key`).
    fn start(dir: &Path, port: u16, signer: &str, probe: &str, expect: &str) -> Self {
        let (signer_cert, signer_key) = match signer {
            "ca" | "ca-no-certs" => ("ca.pem".to_owned(), "ca.key".to_owned()),
            name => (format!("{name}.crt"), format!("{name}.key")),
        };
        // `ca-no-certs` leaves the signer's certificate out of the response.
        let no_certs = ["-resp_no_certs"];
        let no_certs = if signer == "ca-no-certs" {
            &no_certs[..]
        } else {
            &[]
        };
        let log = std::fs::File::create(dir.join("responder.log")).expect("log file");
        let child = Command::new("openssl")
            .current_dir(dir)
            .args([
                "ocsp",
                "-index",
                "index.txt",
                // A port number only: `openssl ocsp` takes no address (the test talks to it
                // over 127.0.0.1).
                "-port",
                &port.to_string(),
                "-rsigner",
                &signer_cert,
                "-rkey",
                &signer_key,
                "-CA",
                "ca.pem",
                "-ndays",
                "1",
            ])
            .args(no_certs)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start openssl ocsp");
        let responder = Self { child };
        let url = format!("http://127.0.0.1:{port}/");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut responder = responder;
        loop {
            if let Ok(Some(status)) = responder.child.try_wait() {
                panic!(
                    "the OCSP responder exited ({status}): {}",
                    std::fs::read_to_string(dir.join("responder.log")).unwrap_or_default()
                );
            }
            let out = Command::new("openssl")
                .current_dir(dir)
                .args([
                    // Status only: the stapled answer's signature is checked on its own.
                    "ocsp",
                    "-issuer",
                    "ca.pem",
                    "-cert",
                    probe,
                    "-url",
                    &url,
                    "-noverify",
                ])
                .output()
                .expect("run openssl ocsp client");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && text.contains(&format!("{probe}: ")) {
                assert!(
                    text.contains(&format!("{probe}: {expect}")),
                    "the responder's own answer for {probe}: {text}"
                );
                return responder;
            }
            assert!(
                Instant::now() < deadline,
                "the OCSP responder did not answer within 5 s: {}{}",
                text,
                std::fs::read_to_string(dir.join("responder.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks the chain against the test CA like any client, and records the stapled OCSP
/// response (empty when the server sent none).
#[derive(Debug)]
struct RecordingVerifier {
    inner: Arc<WebPkiServerVerifier>,
    staple: Mutex<Option<Vec<u8>>>,
}

impl ServerCertVerifier for RecordingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.staple.lock().unwrap() = Some(ocsp_response.to_vec());
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// One TLS handshake (rustls always asks for a stapled response) for `name`: the staple the
/// server sent, empty if none. Panics if the handshake fails.
async fn handshake_staple(addr: SocketAddr, name: &str, ca_pem: &Path) -> Vec<u8> {
    connect(addr, name, ca_pem, rustls::DEFAULT_VERSIONS)
        .await
        .0
}

/// [`handshake_staple`] with the given TLS versions, also returning the connection.
async fn connect(
    addr: SocketAddr,
    name: &str,
    ca_pem: &Path,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> (
    Vec<u8>,
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca_pem).expect("ca pem"))
        .expect("root");
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .expect("verifier");
    let verifier = Arc::new(RecordingVerifier {
        inner,
        staple: Mutex::new(None),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    let tls = tls_connect(addr, name, config)
        .await
        .unwrap_or_else(|e| panic!("TLS handshake for {name}: {e}"));
    let staple = verifier.staple.lock().unwrap().take();
    (staple.expect("the verifier ran"), tls)
}

async fn metrics(gw: &TestGateway) -> String {
    let addr = gw.gateway().admin_addr().expect("admin");
    let req = gateway_tests::admin_head(gw, "GET", "/metrics", "");
    gateway_tests::raw(addr, req.as_bytes()).await
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

const OK: &str = "gateway_ocsp_fetches_total{result=\"ok\"}";
const FAILED: &str = "gateway_ocsp_fetches_total{result=\"error\"}";

/// Polls the admin metrics (up to 10 s) until `done` holds for them; returns the last text.
async fn wait_metrics(gw: &TestGateway, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(gw).await;
        if done(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within 10 s; OCSP metrics: {:?}",
            text.lines()
                .filter(|l| l.starts_with("gateway_ocsp"))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn gateway_yaml(certs: &[&str]) -> String {
    let mut yaml = String::from("admin: { bind: 127.0.0.1:0 }\ncertificates:\n");
    for c in certs {
        yaml.push_str(&format!("  {c}: {{ cert: {c}.pem, key: {c}.key }}\n"));
    }
    yaml.push_str(&format!(
        "listeners:\n  - name: tls\n    bind: 127.0.0.1:0\n    tls: {{ certificates: [{}] }}\n\
         routes:\n  - match: {{ path: /hello }}\n    respond: {{ body: hello }}\n",
        certs.join(", ")
    ));
    yaml
}

/// Polls handshakes for `name` (up to 10 s) until one carries a staple, and returns it.
async fn wait_for_staple(addr: SocketAddr, name: &str, files: &Path) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let staple = handshake_staple(addr, name, &files.join("ca.pem")).await;
        if !staple.is_empty() {
            return staple;
        }
        assert!(
            Instant::now() < deadline,
            "no OCSP staple for {name} within 10 s; responder log: {}",
            std::fs::read_to_string(files.join("responder.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The staple is an `OCSPResponse` with status successful, and `openssl` reads it as a signed
/// answer for `leaf` that verifies against the test CA, status good.
fn check_staple(files: &Path, staple: &[u8], leaf: &str) {
    // OCSPResponse ::= SEQUENCE { responseStatus ENUMERATED successful(0), ... }
    assert_eq!(staple[0], 0x30, "an OCSPResponse is a SEQUENCE");
    let len_bytes = if staple[1] & 0x80 == 0 {
        0
    } else {
        usize::from(staple[1] & 0x7f)
    };
    assert_eq!(
        &staple[2 + len_bytes..5 + len_bytes],
        &[0x0a, 0x01, 0x00],
        "responseStatus successful"
    );
    std::fs::write(files.join("staple.der"), staple).expect("write staple");
    let out = Command::new("openssl")
        .current_dir(files)
        .args([
            "ocsp",
            "-respin",
            "staple.der",
            "-issuer",
            "ca.pem",
            "-cert",
            leaf,
            "-CAfile",
            "ca.pem",
        ])
        .output()
        .expect("run openssl ocsp");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stderr.contains("Response verify OK"),
        "openssl does not verify the staple: {stderr}"
    );
    assert!(stdout.contains(&format!("{leaf}: good")), "{stdout}");
}

#[tokio::test]
async fn a_good_status_is_stapled_and_a_revoked_one_is_not() {
    if !have_openssl() {
        return;
    }
    let dir = temp_dir();
    let port = reserved_port();
    make_pki(
        dir.path(),
        port,
        &[
            ("good", "localhost", GOOD_SERIAL),
            ("revoked", "revoked.localhost", REVOKED_SERIAL),
        ],
    );
    let _responder = Responder::start(dir.path(), port, "ca", "revoked.crt", "revoked");
    let files: PathBuf = dir.path().to_path_buf();
    let gw = TestGateway::start_in(dir, &gateway_yaml(&["good", "revoked"])).await;
    let addr = gw.addr("tls");
    let ca = files.join("ca.pem");

    let staple = wait_for_staple(addr, "localhost", &files).await;
    check_staple(&files, &staple, "good.crt");
    // TLS 1.2 carries it in a CertificateStatus message rather than in the certificate entry.
    let (staple12, _) = connect(addr, "localhost", &ca, &[&rustls::version::TLS12]).await;
    assert_eq!(staple12, staple, "the same staple over TLS 1.2");

    // The revoked leaf's answer was fetched and refused (counted), and is never stapled.
    let text = wait_metrics(&gw, "one fetch ok and one refused", |t| {
        metric(t, OK) >= 1 && metric(t, FAILED) >= 1
    })
    .await;
    assert_eq!(
        metric(&text, OK),
        1,
        "only the good leaf's answer is accepted"
    );
    assert_eq!(
        metric(&text, FAILED),
        1,
        "the revoked leaf's answer is refused"
    );
    let staple = handshake_staple(addr, "revoked.localhost", &ca).await;
    assert!(
        staple.is_empty(),
        "a revoked status must not be stapled ({} bytes were)",
        staple.len()
    );
    // The good leaf keeps its staple.
    assert!(!handshake_staple(addr, "localhost", &ca).await.is_empty());
}

#[tokio::test]
async fn a_responder_that_is_down_leaves_handshakes_unstapled() {
    if !have_openssl() {
        return;
    }
    let dir = temp_dir();
    // Nothing listens on this port.
    let port = reserved_port();
    make_pki(dir.path(), port, &[("good", "localhost", GOOD_SERIAL)]);
    let ca = dir.path().join("ca.pem");
    let gw = TestGateway::start_in(dir, &gateway_yaml(&["good"])).await;
    let text = wait_metrics(&gw, "a failed OCSP fetch counted", |t| {
        metric(t, FAILED) >= 1
    })
    .await;
    assert_eq!(metric(&text, OK), 0);
    let staple = handshake_staple(gw.addr("tls"), "localhost", &ca).await;
    assert!(staple.is_empty(), "no staple without a responder");
    // A connection serves requests as usual.
    let mut tls = connect(gw.addr("tls"), "localhost", &ca, rustls::DEFAULT_VERSIONS)
        .await
        .1;
    tls.write_all(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.ok();
    let out = String::from_utf8_lossy(&out);
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("hello"),
        "{out}"
    );
}

#[tokio::test]
async fn the_issuer_without_certs_and_a_delegated_responder_are_accepted_an_undelegated_one_is_not()
{
    if !have_openssl() {
        return;
    }
    for (signer, stapled) in [
        ("ca-no-certs", true),
        ("delegated", true),
        ("undelegated", false),
    ] {
        let dir = temp_dir();
        let port = reserved_port();
        make_pki(dir.path(), port, &[("good", "localhost", GOOD_SERIAL)]);
        let _responder = Responder::start(dir.path(), port, signer, "good.crt", "good");
        let files = dir.path().to_path_buf();
        let gw = TestGateway::start_in(dir, &gateway_yaml(&["good"])).await;
        let addr = gw.addr("tls");
        if stapled {
            let staple = wait_for_staple(addr, "localhost", &files).await;
            check_staple(&files, &staple, "good.crt");
        } else {
            // Signed by a certificate of the CA that may not sign OCSP answers: refused.
            let text = wait_metrics(&gw, "a refused OCSP answer counted", |t| {
                metric(t, FAILED) >= 1
            })
            .await;
            assert_eq!(metric(&text, OK), 0, "{signer}");
            let staple = handshake_staple(addr, "localhost", &files.join("ca.pem")).await;
            assert!(
                staple.is_empty(),
                "an undelegated signer's answer was stapled"
            );
        }
    }
}
