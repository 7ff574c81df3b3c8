//! Where an ACME certificate is kept between runs: `STORAGE/NAME/account.json` (the ACME
//! account's credentials), `key.pem` (the certificate's private key) and `cert.pem` (the chain).
//! Secrets are written with mode 0600 inside a 0700 directory, and every file is replaced
//! atomically (written beside, then renamed) so a crash never leaves half a key.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::certs::LoadedCert;
use crate::error::GatewayError;

/// The files of one certificate.
#[derive(Debug, Clone)]
pub struct Storage {
    dir: PathBuf,
}

impl Storage {
    /// `root/name`.
    pub fn new(root: &Path, name: &str) -> Self {
        Self {
            dir: root.join(name),
        }
    }

    /// The account file.
    pub fn account(&self) -> PathBuf {
        self.dir.join("account.json")
    }

    /// The certificate's private key.
    pub fn key(&self) -> PathBuf {
        self.dir.join("key.pem")
    }

    /// The certificate chain.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> GatewayError {
        GatewayError::Certificate(format!("{what} in {}: {e}", self.dir.display()))
    }

    /// The stored certificate, if both files are there and usable.
    pub fn load(&self, ocsp_stapling: bool) -> Result<Option<LoadedCert>, GatewayError> {
        let (cert, key) = (self.cert(), self.key());
        if !cert.is_file() || !key.is_file() {
            return Ok(None);
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
            .and_then(|it| it.collect::<Result<_, _>>())
            .map_err(|e| self.error("reading cert.pem", e))?;
        let key =
            PrivateKeyDer::from_pem_file(&key).map_err(|e| self.error("reading key.pem", e))?;
        LoadedCert::new(chain, &key, ocsp_stapling)
            .map(Some)
            .map_err(|(_, m)| self.error("stored certificate", m))
    }

    /// Stores a new key and chain (key first: a chain is never stored without its key).
    pub fn save(&self, key_pem: &str, chain_pem: &str) -> Result<(), GatewayError> {
        self.write(&self.key(), key_pem.as_bytes(), true)?;
        self.write(&self.cert(), chain_pem.as_bytes(), false)
    }

    /// Writes `path` atomically; secrets get mode 0600.
    pub fn write(&self, path: &Path, data: &[u8], secret: bool) -> Result<(), GatewayError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| self.error("creating the directory", e))?;
        let tmp = path.with_extension("tmp");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(if secret { 0o600 } else { 0o644 })
            .open(&tmp)
            .map_err(|e| self.error("writing", e))?;
        file.write_all(data)
            .and_then(|()| file.sync_all())
            .map_err(|e| self.error("writing", e))?;
        std::fs::rename(&tmp, path).map_err(|e| self.error("renaming", e))
    }
}

/// A stored or issued certificate with its validity (Unix seconds).
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert: Arc<LoadedCert>,
    /// Not before.
    pub not_before: i64,
    /// Not after.
    pub not_after: i64,
}

impl Issued {
    /// Reads the validity of `cert`'s leaf.
    pub fn new(cert: LoadedCert) -> Result<Self, GatewayError> {
        use x509_parser::prelude::*;
        let (_, leaf) = X509Certificate::from_der(&cert.chain()[0])
            .map_err(|e| GatewayError::Certificate(format!("cannot parse the certificate: {e}")))?;
        let v = leaf.validity();
        Ok(Self {
            not_before: v.not_before.timestamp(),
            not_after: v.not_after.timestamp(),
            cert: Arc::new(cert),
        })
    }

    /// Whether the leaf covers every name in `domains`.
    pub fn covers(&self, domains: &[String]) -> bool {
        domains.iter().all(|d| self.cert.names().contains(d))
    }
}
