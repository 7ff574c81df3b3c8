//! One ACME order (RFC 8555 §7.4): account (restored from storage or registered), new order,
//! each pending authorization answered with the configured challenge, a fresh P-256 key and
//! CSR, finalization, and the chain stored. Challenge answers are withdrawn when the order ends,
//! however it ends.

use std::time::Duration;

use gateway_config::model::{AcmeChallenge, AcmeConfig};
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::storage::{Issued, Storage};
use crate::certs::LoadedCert;
use crate::certs::challenge::{Challenges, PendingAnswers};
use crate::certs::fetch::{AcmeHttp, HttpClient};
use crate::error::GatewayError;

/// How long the CA gets to validate and to issue.
const POLL: RetryPolicy = RetryPolicy::new()
    .initial_delay(Duration::from_millis(250))
    .backoff(1.5)
    .timeout(Duration::from_secs(90));

fn acme_error(what: &str, e: impl std::fmt::Display) -> GatewayError {
    GatewayError::Certificate(format!("{what}: {e}"))
}

/// The account for `settings`, from storage when it was registered with the same directory.
pub async fn account(settings: &AcmeConfig, storage: &Storage) -> Result<Account, GatewayError> {
    let http = HttpClient::new(settings.directory_ca.as_deref(), Duration::from_secs(30))
        .map_err(|e| acme_error("directory_ca", e))?;
    let builder = || Account::builder_with_http(Box::new(AcmeHttp(http.clone())));
    if let Ok(text) = std::fs::read_to_string(storage.account()) {
        let same_ca = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                v.get("directory")
                    .and_then(|d| d.as_str().map(str::to_owned))
            })
            .is_some_and(|d| d == settings.directory);
        if same_ca {
            let creds: AccountCredentials =
                serde_json::from_str(&text).map_err(|e| acme_error("account.json", e))?;
            return builder()
                .from_credentials(creds)
                .await
                .map_err(|e| acme_error("restoring the ACME account", e));
        }
    }
    let contact: Vec<String> = settings
        .email
        .iter()
        .map(|e| format!("mailto:{e}"))
        .collect();
    let contact: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, creds) = builder()
        .create(
            &NewAccount {
                contact: &contact,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            settings.directory.clone(),
            None,
        )
        .await
        .map_err(|e| acme_error("registering the ACME account", e))?;
    let json = serde_json::to_vec_pretty(&creds).map_err(|e| acme_error("account.json", e))?;
    storage.write(&storage.account(), &json, true)?;
    tracing::info!(directory = %settings.directory, "ACME account registered");
    Ok(account)
}

/// Orders a certificate for `settings.domains`, answers its challenges and stores the result.
pub async fn issue(
    account: &Account,
    settings: &AcmeConfig,
    storage: &Storage,
    challenges: &Challenges,
    ocsp_stapling: bool,
) -> Result<Issued, GatewayError> {
    let identifiers: Vec<Identifier> = settings
        .domains
        .iter()
        .map(|d| Identifier::Dns(d.clone()))
        .collect();
    let mut order = account
        .new_order(&NewOrder::new(&identifiers))
        .await
        .map_err(|e| acme_error("new order", e))?;
    let mut answers = PendingAnswers::new(challenges);
    let kind = match settings.challenge {
        AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        AcmeChallenge::Http01 => ChallengeType::Http01,
    };
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.map_err(|e| acme_error("authorization", e))?;
        match authz.status {
            AuthorizationStatus::Valid => continue,
            AuthorizationStatus::Pending => {}
            other => {
                return Err(acme_error("authorization", format!("status {other:?}")));
            }
        }
        let domain = authz.identifier().to_string();
        let mut challenge = authz.challenge(kind.clone()).ok_or_else(|| {
            acme_error(
                "authorization",
                format!("the CA offers no {kind:?} challenge for {domain}"),
            )
        })?;
        let key_auth = challenge.key_authorization();
        match settings.challenge {
            AcmeChallenge::TlsAlpn01 => answers.alpn(&domain, key_auth.digest().as_ref())?,
            AcmeChallenge::Http01 => answers.http(&challenge.token, key_auth.as_str()),
        }
        challenge
            .set_ready()
            .await
            .map_err(|e| acme_error("challenge", e))?;
    }
    let status = order
        .poll_ready(&POLL)
        .await
        .map_err(|e| acme_error("validation", e))?;
    if status != OrderStatus::Ready {
        return Err(acme_error(
            "validation",
            format!("order is {status:?}, not ready: {:?}", order.state().error),
        ));
    }
    drop(answers);

    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| acme_error("key", e))?;
    let params = rcgen::CertificateParams::new(settings.domains.clone())
        .map_err(|e| acme_error("CSR", e))?;
    let csr = params
        .serialize_request(&key)
        .map_err(|e| acme_error("CSR", e))?;
    order
        .finalize_csr(csr.der())
        .await
        .map_err(|e| acme_error("finalize", e))?;
    let chain_pem = order
        .poll_certificate(&POLL)
        .await
        .map_err(|e| acme_error("certificate download", e))?;

    let key_pem = key.serialize_pem();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| acme_error("issued chain", e))?;
    let der =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| acme_error("key", e))?;
    let cert = LoadedCert::new(chain, &der, ocsp_stapling)
        .map_err(|(_, m)| acme_error("issued certificate", m))?;
    let issued = Issued::new(cert)?;
    storage.save(&key_pem, &chain_pem)?;
    Ok(issued)
}
