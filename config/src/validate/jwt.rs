//! `routes[].filters[].jwt`: the key-set source (one of `url` and `file`), the algorithms
//! (asymmetric only: `none` proves nothing and an HMAC secret cannot be published in a key set),
//! the token's place, and the headers verified claims become.

use std::path::Path;

use super::{Checker, Result, valid_header_name, valid_header_value};
use crate::model::JwtConfig;
use crate::runtime::{JwksSource, Jwt, JwtAlgorithm, TokenSource};

/// Headers a claim may not be written to: they frame or route the request.
const RESERVED_HEADERS: [&str; 6] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
];

/// The shortest period between two fetches of a key set.
const MIN_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// One `jwt` filter at `key`, on the route `route`.
pub(super) fn validate(c: &Checker<'_>, key: &str, j: &JwtConfig, route: &str) -> Result<Jwt> {
    if j.issuer.as_deref() == Some("") {
        return c.err(format!("{key}.issuer"), "must not be empty");
    }
    if j.audiences.iter().any(String::is_empty) {
        return c.err(format!("{key}.audiences"), "audiences must not be empty");
    }
    let jwks = source(c, key, j)?;
    if j.jwks.refresh.get() < MIN_REFRESH {
        return c.err(format!("{key}.jwks.refresh"), "must be at least 1s");
    }
    let algorithms = algorithms(c, key, &j.algorithms)?;
    let from = token_source(c, &format!("{key}.from"), &j.from)?;
    let mut claims_to_headers = Vec::with_capacity(j.claims_to_headers.len());
    for (claim, header) in &j.claims_to_headers {
        let hkey = format!("{key}.claims_to_headers.{claim}");
        if claim.is_empty() {
            return c.err(hkey, "the claim name must not be empty");
        }
        let lower = header.to_ascii_lowercase();
        if !valid_header_name(header) {
            return c.err(hkey, format!("`{header}` is not a valid header name"));
        }
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return c.err(hkey, format!("`{header}` cannot be set from a claim"));
        }
        claims_to_headers.push((claim.clone(), lower));
    }
    let realm = j.realm.clone().unwrap_or_else(|| route.to_owned());
    if !valid_header_value(&realm) || realm.contains(['"', '\\']) {
        return c.err(
            format!("{key}.realm"),
            "must be printable text without quotes or backslashes",
        );
    }
    Ok(Jwt {
        issuer: j.issuer.clone(),
        audiences: j.audiences.clone(),
        jwks,
        refresh: j.jwks.refresh.get(),
        algorithms,
        from,
        claims_to_headers,
        clock_skew: j.clock_skew.get(),
        required: j.required,
        realm,
    })
}

fn source(c: &Checker<'_>, key: &str, j: &JwtConfig) -> Result<JwksSource> {
    match (&j.jwks.url, &j.jwks.file) {
        (Some(url), None) => {
            let rest = url
                .strip_prefix("https://")
                .or_else(|| url.strip_prefix("http://"));
            let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or(""));
            match host {
                Some(h) if !h.is_empty() && !url.contains(char::is_whitespace) => {
                    Ok(JwksSource::Url(url.clone()))
                }
                _ => c.err(
                    format!("{key}.jwks.url"),
                    format!("`{url}` is not an http:// or https:// URL with a host"),
                ),
            }
        }
        (None, Some(file)) => {
            let path = c.path(Path::new(file));
            c.file_exists(&format!("{key}.jwks.file"), &path)?;
            Ok(JwksSource::File(path))
        }
        (Some(_), Some(_)) => c.err(format!("{key}.jwks"), "use only one of `url` and `file`"),
        (None, None) => c.err(format!("{key}.jwks"), "give `url` or `file`"),
    }
}

fn algorithms(c: &Checker<'_>, key: &str, names: &[String]) -> Result<Vec<JwtAlgorithm>> {
    if names.is_empty() {
        return c.err(format!("{key}.algorithms"), "name at least one algorithm");
    }
    let mut out = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let akey = format!("{key}.algorithms[{i}]");
        let alg = match JwtAlgorithm::from_name(name) {
            Some(a) => a,
            None if name.eq_ignore_ascii_case("none") => {
                return c.err(
                    akey,
                    "`none` is never accepted: an unsigned token proves nothing",
                );
            }
            None if name.to_ascii_uppercase().starts_with("HS") => {
                return c.err(
                    akey,
                    format!(
                        "`{name}` is not supported: HMAC needs a shared secret, and a key set \
                         is public"
                    ),
                );
            }
            None => {
                let known: Vec<&str> = JwtAlgorithm::ALL.iter().map(|a| a.name()).collect();
                return c.err(
                    akey,
                    format!(
                        "unknown algorithm `{name}` (supported: {})",
                        known.join(", ")
                    ),
                );
            }
        };
        if !out.contains(&alg) {
            out.push(alg);
        }
    }
    Ok(out)
}

fn token_source(c: &Checker<'_>, key: &str, from: &str) -> Result<TokenSource> {
    if from == "bearer" {
        return Ok(TokenSource::Bearer);
    }
    let parsed = match from.split_once(':') {
        Some(("header", n)) if valid_header_name(n) => {
            Some(TokenSource::Header(n.to_ascii_lowercase()))
        }
        Some(("cookie", n)) if valid_header_name(n) => Some(TokenSource::Cookie(n.to_owned())),
        Some(("query", n)) if !n.is_empty() && !n.contains(['&', '=', '#', ' ']) => {
            Some(TokenSource::Query(n.to_owned()))
        }
        _ => None,
    };
    parsed.map_or_else(
        || {
            c.err(
                key,
                format!("`{from}` is not bearer, header:NAME, cookie:NAME or query:NAME"),
            )
        },
        Ok,
    )
}
