//! TLS to upstream targets: one rustls client config per upstream, built at config load (CA
//! bundle or the bundled web roots, optional client certificate, ALPN from the upstream's
//! protocol), and the name each target is verified against (`tls.server_name`, else the
//! target's host). The HTTP/3 load generator (`h3load`) builds its QUIC client's config here
//! too, so there is one place that decides roots and what `insecure_skip_verify` still checks.

use std::sync::Arc;

use gateway_config::model::UpstreamTlsConfig;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, aws_lc_rs};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// Builds the client config; errors name the offending key (`tls.ca`, ...) and file, and are
/// located by the caller.
pub fn client_config(
    tls: &UpstreamTlsConfig,
    alpn: &'static [u8],
) -> Result<Arc<ClientConfig>, (&'static str, String)> {
    let provider = Arc::new(aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ("tls", e.to_string()))?;
    let builder = if tls.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipVerify(provider)))
    } else {
        builder.with_root_certificates(roots(tls)?)
    };
    let mut config = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| ("tls.cert", format!("cannot read {}: {e}", cert.display())))?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                (
                    "tls.key",
                    format!("no usable key in {}: {e}", key.display()),
                )
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| ("tls.cert", e.to_string()))?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

fn roots(tls: &UpstreamTlsConfig) -> Result<RootCertStore, (&'static str, String)> {
    let mut roots = RootCertStore::empty();
    match &tls.ca {
        Some(ca) => {
            let certs = CertificateDer::pem_file_iter(ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| ("tls.ca", format!("cannot read {}: {e}", ca.display())))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err((
                    "tls.ca",
                    format!("no usable certificate in {}", ca.display()),
                ));
            }
        }
        // Bundled rather than read from the system: the same trust on every host and in every
        // container image, with no file to go missing.
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(roots)
}

/// The name sent as SNI and verified in the certificate: `server_name`, else the host part of
/// the target's authority (an IP address is verified against the certificate's IP SANs and not
/// sent as SNI).
pub(crate) fn server_name(
    tls: &UpstreamTlsConfig,
    authority: &str,
) -> Result<ServerName<'static>, String> {
    let host = match &tls.server_name {
        Some(name) => name.as_str(),
        None => host_of(authority),
    };
    ServerName::try_from(host.to_owned())
        .map_err(|e| format!("`{host}` is not a valid server name: {e}"))
}

/// `example.com:443` → `example.com`, `[::1]:443` → `::1`.
fn host_of(authority: &str) -> &str {
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// `insecure_skip_verify`: any certificate is accepted, but the handshake signatures are still
/// checked so the connection is at least to whoever holds the presented key.
#[derive(Debug)]
struct SkipVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_authorities() {
        assert_eq!(host_of("example.com:443"), "example.com");
        assert_eq!(host_of("[::1]:8443"), "::1");
        assert_eq!(host_of("10.0.0.1:80"), "10.0.0.1");
        assert_eq!(host_of("example.com"), "example.com");
    }

    #[test]
    fn server_name_prefers_the_configured_one() {
        let mut tls = UpstreamTlsConfig::default();
        assert_eq!(
            server_name(&tls, "10.0.0.1:443").unwrap(),
            ServerName::try_from("10.0.0.1").unwrap()
        );
        tls.server_name = Some("users.internal".into());
        assert_eq!(
            server_name(&tls, "10.0.0.1:443").unwrap(),
            ServerName::try_from("users.internal").unwrap()
        );
    }
}
