//! TLS for HTTP listeners: the rustls server configs, built from file certificates loaded once
//! per generation and the ACME certificates kept by [`CertRegistry`] (swapped in at run time),
//! with SNI choosing among the listener's named certificates ([`SniResolver`]), OCSP staples,
//! TLS-ALPN-01 challenge answers, ALPN from the listener's protocols, session resumption by
//! tickets and a session cache, optional client certificates. The QUIC side of an `http3`
//! listener gets its own config from the same pieces (TLS 1.3, `h3`).

use std::collections::HashMap;
use std::sync::Arc;

use rustls::crypto::aws_lc_rs;
use rustls::server::{ServerSessionMemoryCache, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use gateway_config::{CertificateSource, Config, Listener, MinTlsVersion};

use crate::certs::challenge::ACME_TLS_ALPN;
use crate::certs::{CertRegistry, LoadedCert, SniResolver};
use crate::error::GatewayError;

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
    let resolver = Arc::new(SniResolver::new(
        tls.certificates.clone(),
        files,
        answers_tls_alpn(config, listener).then(|| certs.registry.challenges.clone()),
    ));
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
