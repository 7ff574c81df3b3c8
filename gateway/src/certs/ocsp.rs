//! OCSP stapling (RFC 6960, RFC 6066 §8): for a served certificate whose authority-information
//! access names an OCSP responder, a background task POSTs the DER request, checks the answer
//! (successful, for this certificate, status good, current, signed by the issuer or by a
//! responder the issuer delegated to) and staples it, refreshing at half the response's
//! validity. A response that cannot be checked is never stapled: a bad staple fails clients
//! that a missing one does not. The task ends when no listener serves the certificate anymore.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use rustls_pki_types::CertificateDer;
use x509_parser::prelude::*;

use super::CertRegistry;
use super::fetch::HttpClient;
use crate::telemetry::metrics::{Counter, Registry};

mod der;

/// OCSP fetch counters.
#[derive(Clone)]
pub(crate) struct OcspMetrics {
    ok: Counter,
    failed: Counter,
}

impl OcspMetrics {
    pub(crate) fn new(metrics: &Registry) -> Self {
        let c = |result| {
            metrics.counter(
                "gateway_ocsp_fetches_total",
                "OCSP responses fetched for stapling, by result",
                &[("result", result)],
            )
        };
        Self {
            ok: c("ok"),
            failed: c("error"),
        }
    }
}

/// What is needed to ask for and check one certificate's status.
#[derive(Debug, Clone)]
pub struct OcspRequest {
    /// The responder URL from the certificate.
    pub url: String,
    /// The DER `OCSPRequest`.
    pub der: Vec<u8>,
    serial: Vec<u8>,
    issuer_key_hash: Vec<u8>,
    /// The issuer's SubjectPublicKeyInfo pieces, to check signatures.
    issuer_key: der::PublicKey,
}

impl OcspRequest {
    /// The request for the leaf of `chain` (its issuer must follow it), if the leaf names an
    /// OCSP responder with an http(s) URL.
    pub fn for_chain(chain: &[CertificateDer<'_>]) -> Option<Self> {
        let (_, leaf) = X509Certificate::from_der(chain.first()?).ok()?;
        let url = ocsp_url(&leaf)?;
        let (_, issuer) = X509Certificate::from_der(chain.get(1)?).ok()?;
        let name_hash = der::sha1(leaf.issuer().as_raw());
        let key_hash = der::sha1(&issuer.public_key().subject_public_key.data);
        let serial = leaf.raw_serial().to_vec();
        let der = der::ocsp_request(&name_hash, &key_hash, &serial);
        Some(Self {
            url,
            der,
            serial,
            issuer_key_hash: key_hash,
            issuer_key: der::PublicKey::from_spki(issuer.public_key())?,
        })
    }

    /// Checks a DER `OCSPResponse` for this certificate at `now` (Unix seconds).
    pub fn check(&self, response: &[u8], now: i64) -> Result<Validity, String> {
        let basic = der::basic_response(response)?;
        // Signed by the issuer itself, or by a responder certificate the issuer delegated to.
        // Which one is not decided by `certs` being present: responders that sign with the
        // issuer's key commonly include the issuer's own certificate there.
        let verify =
            |key: &der::PublicKey| key.verify(&basic.signature_alg, basic.tbs, &basic.signature);
        if let Err(by_issuer) = verify(&self.issuer_key) {
            let mut delegated = basic
                .certs
                .iter()
                .map(|cert| self.delegated(cert).and_then(|key| verify(&key)));
            if !delegated.any(|r| r.is_ok()) {
                return Err(match basic.certs.is_empty() {
                    true => by_issuer,
                    false => format!(
                        "{by_issuer}: not signed by the issuer nor by a responder it delegated to"
                    ),
                });
            }
        }
        let single = basic
            .responses
            .iter()
            .find(|r| r.serial == self.serial && r.issuer_key_hash == self.issuer_key_hash)
            .ok_or("the response is not for this certificate")?;
        if !single.good {
            return Err("the certificate's status is not good".into());
        }
        // Five minutes of clock skew tolerated either way.
        if single.this_update > now + 300 {
            return Err("the response is not valid yet".into());
        }
        if single.next_update.is_some_and(|t| t < now - 300) {
            return Err("the response has expired".into());
        }
        Ok(Validity {
            this_update: single.this_update,
            next_update: single.next_update,
        })
    }

    /// The key of a responder certificate the issuer signed for OCSP signing.
    fn delegated(&self, cert: &[u8]) -> Result<der::PublicKey, String> {
        let (_, c) = X509Certificate::from_der(cert).map_err(|e| e.to_string())?;
        self.issuer_key.verify(
            &c.signature_algorithm.algorithm.to_id_string(),
            c.tbs_certificate.as_ref(),
            &c.signature_value.data,
        )?;
        let delegated = c
            .extended_key_usage()
            .ok()
            .flatten()
            .is_some_and(|e| e.value.ocsp_signing);
        if !delegated {
            return Err("the responder certificate is not for OCSP signing".into());
        }
        der::PublicKey::from_spki(c.public_key()).ok_or_else(|| "unsupported responder key".into())
    }
}

/// When a checked response is valid (Unix seconds).
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    /// Produced for this time.
    pub this_update: i64,
    /// Valid until, when the responder says.
    pub next_update: Option<i64>,
}

impl Validity {
    /// When to fetch the next response: half-way through this one's validity.
    fn refresh_in(&self, now: i64) -> Duration {
        let secs = match self.next_update {
            Some(next) => self.this_update + (next - self.this_update) / 2 - now,
            None => 3600,
        };
        Duration::from_secs(secs.clamp(60, 24 * 3600) as u64)
    }
}

fn ocsp_url(cert: &X509Certificate<'_>) -> Option<String> {
    const OCSP: &str = "1.3.6.1.5.5.7.48.1";
    cert.extensions().iter().find_map(|ext| {
        let ParsedExtension::AuthorityInfoAccess(aia) = ext.parsed_extension() else {
            return None;
        };
        aia.accessdescs
            .iter()
            .find_map(|d| match &d.access_location {
                GeneralName::URI(u)
                    if d.access_method.to_id_string() == OCSP
                        && (u.starts_with("http://") || u.starts_with("https://")) =>
                {
                    Some((*u).to_owned())
                }
                _ => None,
            })
    })
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Fetches and checks one response.
pub async fn fetch(
    client: &HttpClient,
    request: &OcspRequest,
) -> Result<(Bytes, Validity), String> {
    let req = http::Request::post(&request.url)
        .header(http::header::CONTENT_TYPE, "application/ocsp-request")
        .header(http::header::ACCEPT, "application/ocsp-response")
        .body(Full::new(Bytes::from(request.der.clone())))
        .map_err(|e| e.to_string())?;
    let res = client.send(req).await.map_err(|e| e.to_string())?;
    if !res.status().is_success() {
        return Err(format!("the responder answered {}", res.status()));
    }
    let body = res.into_body();
    let validity = request.check(&body, unix_now())?;
    Ok((body, validity))
}

/// Keeps the staple of `leaf` fresh while a listener serves it.
pub(crate) async fn refresh_loop(
    registry: Weak<CertRegistry>,
    leaf: Vec<u8>,
    request: OcspRequest,
    metrics: OcspMetrics,
) {
    let client = match HttpClient::new(None, Duration::from_secs(10)) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "OCSP stapling off: no HTTP client");
            return;
        }
    };
    let mut failures = 0u32;
    let mut valid_until: Option<i64> = None;
    loop {
        match registry.upgrade() {
            Some(r) if r.in_use(&leaf) => {}
            _ => return,
        }
        let wait = match fetch(&client, &request).await {
            Ok((der, validity)) => {
                metrics.ok.inc();
                failures = 0;
                valid_until = validity.next_update;
                if let Some(r) = registry.upgrade() {
                    r.set_staple(&leaf, Some(Arc::from(&der[..])));
                }
                tracing::debug!(url = %request.url, "OCSP response stapled");
                validity.refresh_in(unix_now())
            }
            Err(e) => {
                metrics.failed.inc();
                failures += 1;
                tracing::warn!(url = %request.url, error = %e, "OCSP fetch failed; the previous staple stays while valid");
                if valid_until.is_some_and(|t| t < unix_now())
                    && let Some(r) = registry.upgrade()
                {
                    r.set_staple(&leaf, None);
                    valid_until = None;
                }
                Duration::from_secs((30u64 << failures.min(7)).min(3600))
            }
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A P-256 test CA, a leaf naming an OCSP responder, and the responder's answer for it
    // (status good, signed with the CA's key and carrying the CA's certificate, as
    // `openssl ocsp -rsigner ca` answers), produced at `PRODUCED`.
    const CA: &[u8] = include_bytes!("ocsp/testdata/ca.der");
    const LEAF: &[u8] = include_bytes!("ocsp/testdata/leaf.der");
    const RESPONSE: &[u8] = include_bytes!("ocsp/testdata/issuer-signed-with-cert.der");
    const PRODUCED: i64 = 1_795_270_017;

    fn request() -> OcspRequest {
        let chain = [CertificateDer::from(LEAF), CertificateDer::from(CA)];
        OcspRequest::for_chain(&chain).expect("the leaf names a responder")
    }

    #[test]
    fn an_issuer_signed_answer_carrying_the_issuer_certificate_is_accepted() {
        let req = request();
        assert!(req.url.starts_with("http://127.0.0.1:"), "{}", req.url);
        let validity = req.check(RESPONSE, PRODUCED + 60).expect("accepted");
        assert_eq!(validity.next_update, Some(validity.this_update + 86_400));
        // Refreshed half-way through its day.
        assert_eq!(
            validity.refresh_in(validity.this_update),
            Duration::from_secs(43_200)
        );
    }

    #[test]
    fn a_tampered_or_expired_answer_is_refused() {
        let req = request();
        let mut tampered = RESPONSE.to_vec();
        // A byte of the response's own signature value, which ends just before the included
        // certificate and its 8 bytes of wrapping.
        let at = tampered.len() - CA.len() - 10;
        tampered[at] ^= 1;
        assert!(req.check(&tampered, PRODUCED + 60).is_err());
        assert!(req.check(RESPONSE, PRODUCED + 2 * 86_400).is_err());
        assert!(req.check(RESPONSE, PRODUCED - 3600).is_err());
        // Without the issuer in the chain there is nothing to ask or check with.
        assert!(OcspRequest::for_chain(&[CertificateDer::from(LEAF)]).is_none());
    }
}
