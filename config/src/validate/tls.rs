//! `certificates:` (files, ACME accounts and challenges, whether an HTTP-01 challenge can be
//! reached) and a listener's HSTS.

use super::*;

/// One `certificates` entry: files that exist, or ACME settings that can work.
pub(super) fn validate_certificate(
    c: &Checker<'_>,
    name: &str,
    cert: &mut CertificateConfig,
) -> Result<Certificate> {
    let key = format!("certificates.{name}");
    let source = match (&mut cert.cert, &mut cert.key, &mut cert.acme) {
        (Some(file), Some(pem_key), None) => {
            *file = c.path(file);
            *pem_key = c.path(pem_key);
            c.file_exists(&format!("{key}.cert"), file)?;
            c.file_exists(&format!("{key}.key"), pem_key)?;
            CertificateSource::Files {
                cert: file.clone(),
                key: pem_key.clone(),
            }
        }
        (None, None, Some(acme)) => {
            validate_acme(c, &format!("{key}.acme"), acme)?;
            CertificateSource::Acme(acme.clone())
        }
        (_, _, Some(_)) => {
            return c.err(
                format!("{key}.acme"),
                "`acme` replaces `cert` and `key`; give one or the other",
            );
        }
        _ => {
            return c.err(key, "give `cert` and `key` (PEM files), or `acme`");
        }
    };
    Ok(Certificate {
        source,
        ocsp_stapling: cert.ocsp_stapling,
    })
}

pub(super) fn validate_acme(c: &Checker<'_>, key: &str, acme: &mut AcmeConfig) -> Result<()> {
    if acme.domains.is_empty() {
        return c.err(format!("{key}.domains"), "at least one domain is required");
    }
    for (i, d) in acme.domains.iter_mut().enumerate() {
        let dkey = format!("{key}.domains[{i}]");
        *d = d.trim_end_matches('.').to_ascii_lowercase();
        if d.starts_with("*.") {
            return c.err(
                dkey,
                "wildcard names need the dns-01 challenge, which is not supported",
            );
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if d.len() > 253 || !d.contains('.') || !d.split('.').all(label_ok) {
            return c.err(dkey, format!("`{d}` is not a DNS name"));
        }
    }
    if !acme.directory.starts_with("https://") {
        return c.err(
            format!("{key}.directory"),
            "must be an https:// URL (the CA's ACME directory)",
        );
    }
    if let Some(email) = &acme.email
        && (!email.contains('@') || email.contains(char::is_whitespace))
    {
        return c.err(
            format!("{key}.email"),
            format!("`{email}` is not an address"),
        );
    }
    acme.storage = c.path(&acme.storage);
    if let Some(ca) = &mut acme.directory_ca {
        *ca = c.path(ca);
        c.file_exists(&format!("{key}.directory_ca"), ca)?;
    }
    if acme.renew_before.is_some_and(|d| d.get().is_zero()) {
        return c.err(format!("{key}.renew_before"), "must be more than 0s");
    }
    Ok(())
}

/// An ACME certificate is only issued if the CA can reach its challenge: TLS-ALPN-01 on a TLS
/// listener serving it, HTTP-01 on a plain HTTP/1 listener.
pub(super) fn check_acme_reachable(
    c: &Checker<'_>,
    certificates: &IndexMap<String, Certificate>,
    listeners: &[Listener],
) -> Result<()> {
    for (name, cert) in certificates {
        let CertificateSource::Acme(acme) = &cert.source else {
            continue;
        };
        let reachable = match acme.challenge {
            AcmeChallenge::TlsAlpn01 => listeners.iter().any(|l| {
                (l.http1 || l.http2)
                    && l.tls
                        .as_ref()
                        .is_some_and(|t| t.certificates.iter().any(|n| n == name))
            }),
            AcmeChallenge::Http01 => listeners.iter().any(|l| l.http1 && l.tls.is_none()),
        };
        if !reachable {
            let why = match acme.challenge {
                AcmeChallenge::TlsAlpn01 => {
                    "tls-alpn-01 needs a TLS listener (http1 or http2) that lists this certificate"
                }
                AcmeChallenge::Http01 => "http-01 needs a plain (non-TLS) http1 listener",
            };
            return c.err(format!("certificates.{name}.acme.challenge"), why);
        }
    }
    Ok(())
}

/// Browsers' preload lists take only a policy that covers subdomains for at least a year.
pub(super) fn validate_hsts(c: &Checker<'_>, key: &str, hsts: &HstsConfig) -> Result<()> {
    const YEAR: u64 = 365 * 24 * 3600;
    if hsts.preload && !hsts.include_subdomains {
        return c.err(
            format!("{key}.preload"),
            "preload needs `include_subdomains: true`",
        );
    }
    if hsts.preload && hsts.max_age.get().as_secs() < YEAR {
        return c.err(
            format!("{key}.max_age"),
            "preload needs a max_age of at least 365d",
        );
    }
    Ok(())
}
