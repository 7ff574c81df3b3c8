//! TLS for HTTP listeners: file certificates loaded once per generation and ACME certificates
//! kept by [`CertRegistry`] (swapped in at run time), SNI choosing among the listener's named
//! certificates (exact names first, then wildcards, then the first certificate; a name whose
//! ACME certificate has not arrived yet gets a TLS alert), ECDSA preferred over RSA when the
//! client supports it, OCSP staples, TLS-ALPN-01 challenge answers, ALPN from the listener's
//! protocols, session resumption by tickets and a session cache, optional client certificates.
//! The QUIC side of an `http3` listener gets its own config from the same pieces (TLS 1.3, `h3`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arc_swap::ArcSwap;

use rustls::crypto::aws_lc_rs;
use rustls::server::{
    ClientHello, ResolvesServerCert, ServerSessionMemoryCache, WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use gateway_config::{CertificateSource, Config, Listener, MinTlsVersion};

use crate::certs::CertRegistry;
use crate::certs::challenge::{ACME_TLS_ALPN, Challenges};
use crate::error::GatewayError;

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

/// Loads every file certificate in `config` (so a broken file is found at load, located). ACME
/// certificates are the [`CertRegistry`]'s.
pub fn load_certificates(
    config: &Config,
) -> Result<HashMap<String, Arc<LoadedCert>>, GatewayError> {
    let mut out = HashMap::new();
    for (name, c) in &config.certificates {
        let CertificateSource::Files { cert, key } = &c.source else {
            continue;
        };
        let located =
            |field: &str, msg: String| config.error(format!("certificates.{name}.{field}"), msg);
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| located("cert", format!("cannot read {}: {e}", cert.display())))?
            .collect::<Result<_, _>>()
            .map_err(|e| located("cert", format!("invalid PEM in {}: {e}", cert.display())))?;
        if chain.is_empty() {
            return Err(located("cert", format!("no certificate in {}", cert.display())).into());
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
            located(
                "key",
                format!("no usable private key in {}: {e}", key.display()),
            )
        })?;
        let loaded = LoadedCert::new(chain, &key, c.ocsp_stapling)
            .map_err(|(field, msg)| located(field, msg))?;
        out.insert(name.clone(), Arc::new(loaded));
    }
    Ok(out)
}

/// What a listener's TLS config is built from: this generation's file certificates and the
/// registry that holds ACME certificates, staples and challenge answers.
pub struct CertSet {
    /// File certificates by name.
    pub files: HashMap<String, Arc<LoadedCert>>,
    /// Live certificates shared across generations.
    pub registry: Arc<CertRegistry>,
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
    /// The index for the current ACME certificates and OCSP staples.
    pub(crate) fn rebuild(
        &self,
        acme: &HashMap<String, crate::certs::AcmeEntry>,
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

/// The rustls server config for one listener's TCP side (ALPN `h2`/`http/1.1`).
pub fn server_config(
    config: &Config,
    index: usize,
    listener: &Listener,
    certs: &CertSet,
) -> Result<Option<Arc<ServerConfig>>, GatewayError> {
    let Some(tls) = &listener.tls else {
        return Ok(None);
    };
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
        MinTlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        MinTlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let mut server = build(config, index, listener, certs, versions, true)?;
    if listener.http2 {
        server.alpn_protocols.push(b"h2".to_vec());
    }
    if listener.http1 {
        server.alpn_protocols.push(b"http/1.1".to_vec());
    }
    if answers_tls_alpn(config, listener) {
        server.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
    }
    server.max_early_data_size = 0;
    Ok(Some(Arc::new(server)))
}

/// The rustls server config for one listener's QUIC side: the same certificates, SNI choice,
/// client CA and tickets as TCP, but TLS 1.3 only (QUIC has no other) and ALPN `h3`. QUIC
/// allows an early-data limit of 0 or `u32::MAX` only, so 0-RTT is all or nothing.
pub fn quic_server_config(
    config: &Config,
    index: usize,
    listener: &Listener,
    certs: &CertSet,
) -> Result<Option<ServerConfig>, GatewayError> {
    if listener.tls.is_none() {
        return Ok(None);
    }
    let early = listener.settings.http3.enable_0rtt;
    // rustls accepts early data only on stateful resumption, whose tickets are single use: a
    // replayed first flight cannot resume twice in this process.
    let tls13 = &[&rustls::version::TLS13];
    let mut server = build(config, index, listener, certs, tls13, !early)?;
    // TLS-ALPN-01 is answered on TCP only; `h3` alone keeps validators off the QUIC side.
    server.alpn_protocols = vec![b"h3".to_vec()];
    server.max_early_data_size = if early { u32::MAX } else { 0 };
    Ok(Some(server))
}

fn build(
    config: &Config,
    index: usize,
    listener: &Listener,
    certs: &CertSet,
    versions: &[&'static rustls::SupportedProtocolVersion],
    stateless_tickets: bool,
) -> Result<ServerConfig, GatewayError> {
    let key = format!("listeners[{index}].tls");
    let Some(tls) = &listener.tls else {
        return Err(config.error(key, "TLS settings are missing").into());
    };
    let files = tls
        .certificates
        .iter()
        .filter_map(|n| certs.files.get(n).map(|c| (n.clone(), c.clone())))
        .collect();
    let resolver = Arc::new(SniResolver {
        names: tls.certificates.clone(),
        files,
        index: ArcSwap::default(),
        challenges: answers_tls_alpn(config, listener).then(|| certs.registry.challenges.clone()),
    });
    certs.registry.register(&resolver);
    let provider = Arc::new(aws_lc_rs::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| config.error(&key, e.to_string()))?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|e| config.error(format!("{key}.client_ca"), e.to_string()))?
            {
                let cert =
                    cert.map_err(|e| config.error(format!("{key}.client_ca"), e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| config.error(format!("{key}.client_ca"), e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| config.error(format!("{key}.client_ca"), e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut server = builder.with_cert_resolver(resolver);
    server.session_storage = ServerSessionMemoryCache::new(16 * 1024);
    if stateless_tickets {
        server.ticketer =
            aws_lc_rs::Ticketer::new().map_err(|e| config.error(&key, e.to_string()))?;
    }
    Ok(server)
}

/// Whether the listener serves an ACME certificate validated by TLS-ALPN-01.
fn answers_tls_alpn(config: &Config, listener: &Listener) -> bool {
    listener.tls.as_ref().is_some_and(|tls| {
        tls.certificates.iter().any(|n| {
            matches!(
                config.certificates.get(n).map(|c| &c.source),
                Some(CertificateSource::Acme(a))
                    if a.challenge == gateway_config::model::AcmeChallenge::TlsAlpn01
            )
        })
    })
}
