//! Certificates for tests: a CA generated per test run issues server and client certificates
//! (ECDSA P-256 or RSA 2048), and builds rustls client configs that trust it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;

/// Key algorithm of an issued certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// ECDSA P-256.
    Ecdsa,
    /// RSA 2048.
    Rsa,
}

/// A test certificate authority.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate in PEM.
    pub pem: String,
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    /// A fresh CA.
    pub fn new() -> Self {
        let key = KeyPair::generate().expect("ca key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "gateway test CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, key).expect("ca cert");
        let pem = issuer.pem();
        Self { issuer, pem }
    }

    /// Issues a certificate for `names`; returns (chain PEM, key PEM).
    pub fn issue(&self, names: &[&str], kind: KeyKind) -> (String, String) {
        let key = match kind {
            KeyKind::Ecdsa => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key"),
            KeyKind::Rsa => rsa_key(),
        };
        let params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        (cert.pem(), key.serialize_pem())
    }

    /// Issues a certificate and writes `<stem>.pem` / `<stem>.key` into `dir`.
    pub fn write(
        &self,
        dir: &Path,
        stem: &str,
        names: &[&str],
        kind: KeyKind,
    ) -> (PathBuf, PathBuf) {
        let (cert, key) = self.issue(names, kind);
        let cert_path = dir.join(format!("{stem}.pem"));
        let key_path = dir.join(format!("{stem}.key"));
        std::fs::write(&cert_path, cert).expect("write cert");
        std::fs::write(&key_path, key).expect("write key");
        (cert_path, key_path)
    }

    /// The CA certificate in DER.
    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A client config trusting this CA, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.der()).expect("root");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }
}

/// RSA keys are slow to generate; one per process is plenty.
fn rsa_key() -> KeyPair {
    use std::sync::OnceLock;
    static PEM: OnceLock<String> = OnceLock::new();
    let pem = PEM.get_or_init(|| {
        let out = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .output()
            .expect("openssl is needed to generate an RSA test key");
        String::from_utf8(out.stdout).expect("pem")
    });
    KeyPair::from_pem(pem).expect("rsa key")
}
