//! TLS for HTTP listeners: certificates loaded once per generation, SNI choosing among the
//! listener's named certificates (exact names first, then wildcards, then the first
//! certificate), ECDSA preferred over RSA when the client supports it, ALPN from the listener's
//! protocols, session resumption by tickets and a session cache, optional client certificates.
//! The QUIC side of an `http3` listener gets its own config from the same pieces (TLS 1.3, `h3`).

use std::collections::HashMap;
use std::sync::Arc;

use rustls::crypto::aws_lc_rs;
use rustls::server::{
    ClientHello, ResolvesServerCert, ServerSessionMemoryCache, WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use gateway_config::{Config, Listener, MinTlsVersion};

use crate::error::GatewayError;

/// A loaded certificate with the names it is valid for.
#[derive(Debug)]
pub struct LoadedCert {
    key: Arc<CertifiedKey>,
    names: Vec<String>,
    ecdsa: bool,
}

/// Loads every certificate in `config` (so a broken file is found at load, located).
pub fn load_certificates(
    config: &Config,
) -> Result<HashMap<String, Arc<LoadedCert>>, GatewayError> {
    let mut out = HashMap::new();
    for (name, c) in &config.certificates {
        let located =
            |field: &str, msg: String| config.error(format!("certificates.{name}.{field}"), msg);
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&c.cert)
            .map_err(|e| located("cert", format!("cannot read {}: {e}", c.cert.display())))?
            .collect::<Result<_, _>>()
            .map_err(|e| located("cert", format!("invalid PEM in {}: {e}", c.cert.display())))?;
        if chain.is_empty() {
            return Err(located("cert", format!("no certificate in {}", c.cert.display())).into());
        }
        let key = PrivateKeyDer::from_pem_file(&c.key).map_err(|e| {
            located(
                "key",
                format!("no usable private key in {}: {e}", c.key.display()),
            )
        })?;
        let ecdsa = matches!(&key, PrivateKeyDer::Sec1(_))
            || matches!(&key, PrivateKeyDer::Pkcs8(k) if is_ec_pkcs8(k.secret_pkcs8_der()));
        let signing = aws_lc_rs::sign::any_supported_type(&key)
            .map_err(|e| located("key", format!("unsupported private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signing);
        certified
            .keys_match()
            .map_err(|e| located("key", format!("key does not match the certificate: {e}")))?;
        let names = cert_names(&certified.cert[0]).map_err(|m| located("cert", m))?;
        out.insert(
            name.clone(),
            Arc::new(LoadedCert {
                key: Arc::new(certified),
                names,
                ecdsa,
            }),
        );
    }
    Ok(out)
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

/// Picks a certificate by SNI.
#[derive(Debug)]
struct SniResolver {
    exact: HashMap<String, Vec<Arc<LoadedCert>>>,
    wildcard: HashMap<String, Vec<Arc<LoadedCert>>>,
    default: Vec<Arc<LoadedCert>>,
}

impl SniResolver {
    fn new(certs: Vec<Arc<LoadedCert>>) -> Self {
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
        }
    }

    fn candidates(&self, name: Option<&str>) -> &[Arc<LoadedCert>] {
        if let Some(name) = name {
            let name = name.to_ascii_lowercase();
            if let Some(v) = self.exact.get(&name) {
                return v;
            }
            if let Some((_, parent)) = name.split_once('.')
                && let Some(v) = self.wildcard.get(parent)
            {
                return v;
            }
        }
        &self.default
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let schemes = hello.signature_schemes();
        let candidates = self.candidates(hello.server_name());
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
    certs: &HashMap<String, Arc<LoadedCert>>,
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
    certs: &HashMap<String, Arc<LoadedCert>>,
) -> Result<Option<ServerConfig>, GatewayError> {
    if listener.tls.is_none() {
        return Ok(None);
    }
    let early = listener.settings.http3.enable_0rtt;
    // rustls accepts early data only on stateful resumption, whose tickets are single use: a
    // replayed first flight cannot resume twice in this process.
    let tls13 = &[&rustls::version::TLS13];
    let mut server = build(config, index, listener, certs, tls13, !early)?;
    server.alpn_protocols = vec![b"h3".to_vec()];
    server.max_early_data_size = if early { u32::MAX } else { 0 };
    Ok(Some(server))
}

fn build(
    config: &Config,
    index: usize,
    listener: &Listener,
    certs: &HashMap<String, Arc<LoadedCert>>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    stateless_tickets: bool,
) -> Result<ServerConfig, GatewayError> {
    let key = format!("listeners[{index}].tls");
    let Some(tls) = &listener.tls else {
        return Err(config.error(key, "TLS settings are missing").into());
    };
    let chosen = tls
        .certificates
        .iter()
        .filter_map(|n| certs.get(n).cloned())
        .collect();
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
    let mut server = builder.with_cert_resolver(Arc::new(SniResolver::new(chosen)));
    server.session_storage = ServerSessionMemoryCache::new(16 * 1024);
    if stateless_tickets {
        server.ticketer =
            aws_lc_rs::Ticketer::new().map_err(|e| config.error(&key, e.to_string()))?;
    }
    Ok(server)
}
