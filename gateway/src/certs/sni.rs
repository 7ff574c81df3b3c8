//! The certificates a listener serves and the choice among them: [`LoadedCert`] (a chain checked
//! against its key, with the names it covers) and [`SniResolver`], which picks one by SNI from an
//! index the [`CertRegistry`](super::CertRegistry) rebuilds whenever a certificate or staple
//! changes (exact names first, then wildcards, then the first certificate; ECDSA preferred over
//! RSA when the client supports it; a name whose ACME certificate has not arrived yet gets a TLS
//! alert), and which answers TLS-ALPN-01 validation handshakes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::aws_lc_rs;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::AcmeEntry;
use super::challenge::{ACME_TLS_ALPN, Challenges};

/// A loaded certificate with the names it is valid for.
#[derive(Debug)]
pub struct LoadedCert {
    key: Arc<CertifiedKey>,
    names: Vec<String>,
    ecdsa: bool,
    /// Whether OCSP responses are fetched and stapled for it.
    pub(crate) ocsp_stapling: bool,
}

impl LoadedCert {
    /// Checks a chain (leaf first) against its key and reads the names it covers.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: &PrivateKeyDer<'_>,
        ocsp_stapling: bool,
    ) -> Result<Self, (&'static str, String)> {
        if chain.is_empty() {
            return Err(("cert", "no certificate".into()));
        }
        let ecdsa = matches!(key, PrivateKeyDer::Sec1(_))
            || matches!(key, PrivateKeyDer::Pkcs8(k) if is_ec_pkcs8(k.secret_pkcs8_der()));
        let signing = aws_lc_rs::sign::any_supported_type(key)
            .map_err(|e| ("key", format!("unsupported private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signing);
        certified
            .keys_match()
            .map_err(|e| ("key", format!("key does not match the certificate: {e}")))?;
        let names = cert_names(&certified.cert[0]).map_err(|m| ("cert", m))?;
        Ok(Self {
            key: Arc::new(certified),
            names,
            ecdsa,
            ocsp_stapling,
        })
    }

    /// The chain, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.key.cert
    }

    /// The DNS names (or common name) the leaf is valid for, lower-case.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The same certificate with an OCSP response stapled to its handshakes.
    fn stapled(&self, ocsp: &[u8]) -> Self {
        let mut key = (*self.key).clone();
        key.ocsp = Some(ocsp.to_vec());
        Self {
            key: Arc::new(key),
            names: self.names.clone(),
            ecdsa: self.ecdsa,
            ocsp_stapling: self.ocsp_stapling,
        }
    }
}

/// id-ecPublicKey (1.2.840.10045.2.1) appears in the PKCS#8 algorithm identifier of EC keys.
fn is_ec_pkcs8(der: &[u8]) -> bool {
    const EC_OID: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    der.windows(EC_OID.len()).take(64).any(|w| w == EC_OID)
}

fn cert_names(der: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    use x509_parser::prelude::*;
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| format!("cannot parse certificate: {e}"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for gn in &san.value.general_names {
            if let GeneralName::DNSName(n) = gn {
                names.push(n.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        for cn in cert.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                names.push(s.to_ascii_lowercase());
            }
        }
    }
    Ok(names)
}

/// The certificates one resolver chooses among, rebuilt whenever one of them changes.
#[derive(Debug, Default)]
pub(crate) struct SniIndex {
    exact: HashMap<String, Vec<Arc<LoadedCert>>>,
    wildcard: HashMap<String, Vec<Arc<LoadedCert>>>,
    default: Vec<Arc<LoadedCert>>,
    /// Names of ACME certificates not issued yet: refused, not answered with another name's.
    pending: HashSet<String>,
}

impl SniIndex {
    fn new(certs: Vec<Arc<LoadedCert>>, pending: HashSet<String>) -> Self {
        let mut exact: HashMap<String, Vec<Arc<LoadedCert>>> = HashMap::new();
        let mut wildcard: HashMap<String, Vec<Arc<LoadedCert>>> = HashMap::new();
        for c in &certs {
            for n in &c.names {
                match n.strip_prefix("*.") {
                    Some(suffix) => wildcard
                        .entry(suffix.to_owned())
                        .or_default()
                        .push(c.clone()),
                    None => exact.entry(n.clone()).or_default().push(c.clone()),
                }
            }
        }
        // ECDSA first: cheaper handshakes, used whenever the client can verify it.
        let order = |v: &mut Vec<Arc<LoadedCert>>| v.sort_by_key(|c| !c.ecdsa);
        exact.values_mut().for_each(order);
        wildcard.values_mut().for_each(order);
        let mut default = certs;
        order(&mut default);
        Self {
            exact,
            wildcard,
            default,
            pending,
        }
    }

    fn candidates(&self, name: Option<&str>) -> &[Arc<LoadedCert>] {
        if let Some(name) = name {
            let name = name.to_ascii_lowercase();
            if let Some(v) = self.exact.get(&name) {
                return v;
            }
            if self.pending.contains(&name) {
                return &[];
            }
            if let Some((_, parent)) = name.split_once('.')
                && let Some(v) = self.wildcard.get(parent)
            {
                return v;
            }
        }
        &self.default
    }

    /// Whether `leaf` (DER) is one of the certificates served.
    pub(crate) fn serves(&self, leaf: &[u8]) -> bool {
        self.default.iter().any(|c| c.key.cert[0].as_ref() == leaf)
    }

    /// Every certificate served.
    pub(crate) fn certificates(&self) -> &[Arc<LoadedCert>] {
        &self.default
    }
}

/// Picks a certificate by SNI from an index that certificate changes swap; answers TLS-ALPN-01
/// validation handshakes when the listener serves an ACME certificate using them.
#[derive(Debug)]
pub struct SniResolver {
    /// The listener's certificate names, in config order.
    names: Vec<String>,
    /// This generation's file certificates among them.
    files: HashMap<String, Arc<LoadedCert>>,
    index: ArcSwap<SniIndex>,
    challenges: Option<Arc<Challenges>>,
}

impl SniResolver {
    /// A resolver among `names` (the listener's certificate names, in config order), of which
    /// `files` are this generation's file certificates; with `challenges`, it answers TLS-ALPN-01
    /// validation handshakes. It serves nothing until the registry builds its index.
    pub(crate) fn new(
        names: Vec<String>,
        files: HashMap<String, Arc<LoadedCert>>,
        challenges: Option<Arc<Challenges>>,
    ) -> Self {
        Self {
            names,
            files,
            index: ArcSwap::default(),
            challenges,
        }
    }

    /// The index for the current ACME certificates and OCSP staples.
    pub(crate) fn rebuild(
        &self,
        acme: &HashMap<String, AcmeEntry>,
        staples: &HashMap<Vec<u8>, Arc<[u8]>>,
    ) {
        let mut certs = Vec::new();
        let mut pending = HashSet::new();
        for name in &self.names {
            let cert = match (self.files.get(name), acme.get(name)) {
                (Some(c), _) => c.clone(),
                (None, Some(entry)) => match &entry.cert {
                    Some(c) => c.clone(),
                    None => {
                        pending.extend(entry.domains.iter().cloned());
                        continue;
                    }
                },
                (None, None) => continue,
            };
            match staples.get(cert.key.cert[0].as_ref()) {
                Some(ocsp) => certs.push(Arc::new(cert.stapled(ocsp))),
                None => certs.push(cert),
            }
        }
        self.index.store(Arc::new(SniIndex::new(certs, pending)));
    }

    /// The index in use.
    pub(crate) fn index(&self) -> arc_swap::Guard<Arc<SniIndex>> {
        self.index.load()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A validation server offers only `acme-tls/1`; nobody else offers it.
        if let Some(challenges) = &self.challenges
            && let Some(mut alpn) = hello.alpn()
            && alpn.any(|p| p == ACME_TLS_ALPN)
        {
            return hello.server_name().and_then(|n| challenges.alpn_cert(n));
        }
        let index = self.index.load();
        let schemes = hello.signature_schemes();
        let candidates = index.candidates(hello.server_name());
        candidates
            .iter()
            .find(|c| c.key.key.choose_scheme(schemes).is_some())
            .or_else(|| candidates.first())
            .map(|c| c.key.clone())
    }
}
