//! Answers to pending ACME challenges, shared by every listener: TLS-ALPN-01 certificates (RFC
//! 8737), served by the TLS resolver to a ClientHello that offers only `acme-tls/1`, and HTTP-01
//! key authorizations, served on plain listeners before any route. A request pays one atomic
//! load for this while no HTTP-01 challenge is pending.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustls::crypto::aws_lc_rs;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::GatewayError;
use crate::telemetry::metrics::{Counter, Registry};

/// The ALPN protocol of TLS-ALPN-01 validation connections.
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Where HTTP-01 answers live.
pub const HTTP_CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// Pending challenge answers.
#[derive(Debug)]
pub struct Challenges {
    alpn: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    http: Mutex<HashMap<String, String>>,
    /// Number of pending HTTP-01 tokens: the request path reads only this while it is 0.
    http_pending: AtomicUsize,
    served_http: Counter,
    served_alpn: Counter,
}

impl Challenges {
    /// No challenge pending; counters registered in `metrics`.
    pub fn new(metrics: &Registry) -> Self {
        let served = |kind| {
            metrics.counter(
                "gateway_acme_challenges_served_total",
                "ACME challenge answers served to validation requests",
                &[("challenge", kind)],
            )
        };
        Self {
            alpn: Mutex::default(),
            http: Mutex::default(),
            http_pending: AtomicUsize::new(0),
            served_http: served("http-01"),
            served_alpn: served("tls-alpn-01"),
        }
    }

    /// The TLS-ALPN-01 certificate for `server_name`, if a validation for it is pending.
    pub fn alpn_cert(&self, server_name: &str) -> Option<Arc<CertifiedKey>> {
        let name = server_name.to_ascii_lowercase();
        let found = lock(&self.alpn).get(&name).cloned();
        if found.is_some() {
            self.served_alpn.inc();
        }
        found
    }

    /// The HTTP-01 answer for a request path, if it names a pending token.
    pub fn http_answer(&self, path: &str) -> Option<String> {
        if self.http_pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let token = path.strip_prefix(HTTP_CHALLENGE_PREFIX)?;
        let found = lock(&self.http).get(token).cloned();
        if found.is_some() {
            self.served_http.inc();
        }
        found
    }

    /// Serves a TLS-ALPN-01 certificate for `domain` carrying the SHA-256 of the key
    /// authorization in the critical acmeIdentifier extension.
    pub(crate) fn add_alpn(&self, domain: &str, digest: &[u8]) -> Result<(), GatewayError> {
        let err = |e: &dyn std::fmt::Display| {
            GatewayError::Certificate(format!("TLS-ALPN-01 certificate for {domain}: {e}"))
        };
        let mut params =
            rcgen::CertificateParams::new(vec![domain.to_owned()]).map_err(|e| err(&e))?;
        params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
        let key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| err(&e))?;
        let cert = params.self_signed(&key).map_err(|e| err(&e))?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = aws_lc_rs::sign::any_supported_type(&der).map_err(|e| err(&e))?;
        let certified = CertifiedKey::new(vec![cert.der().clone()], signing);
        lock(&self.alpn).insert(domain.to_owned(), Arc::new(certified));
        Ok(())
    }

    /// Stops answering TLS-ALPN-01 for `domain`.
    pub(crate) fn remove_alpn(&self, domain: &str) {
        lock(&self.alpn).remove(domain);
    }

    /// Serves `key_authorization` at the HTTP-01 path of `token`.
    pub(crate) fn add_http(&self, token: &str, key_authorization: &str) {
        let mut map = lock(&self.http);
        if map
            .insert(token.to_owned(), key_authorization.to_owned())
            .is_none()
        {
            self.http_pending.fetch_add(1, Ordering::Release);
        }
    }

    /// Stops answering the HTTP-01 token.
    pub(crate) fn remove_http(&self, token: &str) {
        if lock(&self.http).remove(token).is_some() {
            self.http_pending.fetch_sub(1, Ordering::Release);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes the answers of one order when it ends, however it ends.
pub(crate) struct PendingAnswers<'a> {
    challenges: &'a Challenges,
    alpn: Vec<String>,
    http: Vec<String>,
}

impl<'a> PendingAnswers<'a> {
    pub(crate) fn new(challenges: &'a Challenges) -> Self {
        Self {
            challenges,
            alpn: Vec::new(),
            http: Vec::new(),
        }
    }

    pub(crate) fn alpn(&mut self, domain: &str, digest: &[u8]) -> Result<(), GatewayError> {
        self.challenges.add_alpn(domain, digest)?;
        self.alpn.push(domain.to_owned());
        Ok(())
    }

    pub(crate) fn http(&mut self, token: &str, key_authorization: &str) {
        self.challenges.add_http(token, key_authorization);
        self.http.push(token.to_owned());
    }
}

impl Drop for PendingAnswers<'_> {
    fn drop(&mut self) {
        for d in &self.alpn {
            self.challenges.remove_alpn(d);
        }
        for t in &self.http {
            self.challenges.remove_http(t);
        }
    }
}

/// The response carrying an HTTP-01 key authorization.
pub fn http01_response(key_authorization: String) -> http::Response<crate::body::Body> {
    let mut res = http::Response::new(crate::body::Body::from(key_authorization));
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/octet-stream"),
    );
    res
}
