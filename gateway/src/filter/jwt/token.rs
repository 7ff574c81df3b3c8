//! A compact JWS (RFC 7515) read and checked: three base64url segments, a header naming an
//! accepted algorithm, a signature one of the set's keys verifies, and claims (RFC 7519) whose
//! times, issuer and audience hold. Every failure is a [`Reject`], never a panic: sizes are
//! capped before decoding, and serde_json's recursion limit bounds hostile nesting.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use gateway_config::JwtAlgorithm;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::keys::{Candidates, KeySet};

/// Longest token accepted (a few claims signed with RSA-4096 fit in 2 KiB).
pub(super) const MAX_TOKEN: usize = 8 * 1024;

/// Why a token is refused; each maps to a metric label and a short description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reject {
    /// No token where the filter looks.
    Missing,
    /// Not a well-formed token.
    Malformed(&'static str),
    /// An algorithm not accepted here, or one the key was not made for.
    BadAlgorithm(&'static str),
    /// The `kid` is in no key set (even after a refetch).
    UnknownKey,
    /// No key of the set has been loaded.
    KeysUnavailable,
    /// The signature does not verify.
    BadSignature,
    /// `exp` has passed.
    Expired,
    /// `nbf` (or `iat`) is in the future.
    NotYetValid,
    /// `iss` is not the configured issuer.
    WrongIssuer,
    /// `aud` names none of the configured audiences.
    WrongAudience,
}

impl Reject {
    /// The `result` label of `gateway_jwt_requests_total`.
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed(_) => "malformed",
            Self::BadAlgorithm(_) => "bad_algorithm",
            Self::UnknownKey => "unknown_key",
            Self::KeysUnavailable => "keys_unavailable",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongIssuer => "wrong_issuer",
            Self::WrongAudience => "wrong_audience",
        }
    }

    /// The `error_description` sent to the client.
    pub(super) fn description(self) -> &'static str {
        match self {
            Self::Missing => "no token",
            Self::Malformed(why) | Self::BadAlgorithm(why) => why,
            Self::UnknownKey => "unknown signing key",
            Self::KeysUnavailable => "signing keys unavailable",
            Self::BadSignature => "invalid signature",
            Self::Expired => "token expired",
            Self::NotYetValid => "token not yet valid",
            Self::WrongIssuer => "wrong issuer",
            Self::WrongAudience => "wrong audience",
        }
    }

    /// Every label, for the counters made at load.
    pub(super) const LABELS: [&'static str; 10] = [
        "missing",
        "malformed",
        "bad_algorithm",
        "unknown_key",
        "keys_unavailable",
        "bad_signature",
        "expired",
        "not_yet_valid",
        "wrong_issuer",
        "wrong_audience",
    ];
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    /// Extensions the token says must be understood: none are, so a token with any is refused.
    crit: Option<Value>,
}

/// A token split and decoded, its signature not yet checked.
pub(super) struct Token<'a> {
    alg: JwtAlgorithm,
    kid: Option<String>,
    signed: &'a [u8],
    signature: Vec<u8>,
    payload: Vec<u8>,
}

fn decode(segment: &str, what: &'static str) -> Result<Vec<u8>, Reject> {
    URL_SAFE_NO_PAD
        .decode(segment)
        .map_err(|_| Reject::Malformed(what))
}

impl<'a> Token<'a> {
    /// Splits and decodes `text`, checking the algorithm against `accepted`.
    pub(super) fn parse(text: &'a str, accepted: &[JwtAlgorithm]) -> Result<Self, Reject> {
        if text.len() > MAX_TOKEN {
            return Err(Reject::Malformed("token too large"));
        }
        let mut parts = text.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Reject::Malformed("not a compact JWS (three segments)"));
        };
        let header: Header = serde_json::from_slice(&decode(h, "header is not base64url")?)
            .map_err(|_| Reject::Malformed("header is not a JSON object"))?;
        if header.crit.is_some() {
            return Err(Reject::Malformed("unsupported critical header"));
        }
        let alg = JwtAlgorithm::from_name(&header.alg)
            .filter(|a| accepted.contains(a))
            .ok_or(Reject::BadAlgorithm("algorithm not accepted"))?;
        let payload = decode(p, "payload is not base64url")?;
        let signature = decode(s, "signature is not base64url")?;
        Ok(Self {
            alg,
            kid: header.kid,
            signed: &text.as_bytes()[..h.len() + 1 + p.len()],
            signature,
            payload,
        })
    }

    /// The `kid` the header names.
    pub(super) fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// Checks the signature with the set's keys.
    pub(super) fn verify(&self, keys: &KeySet) -> Result<(), Reject> {
        match keys.candidates(self.kid(), self.alg) {
            Candidates::UnknownKid => Err(Reject::UnknownKey),
            Candidates::WrongType => Err(Reject::BadAlgorithm("no key for this algorithm")),
            Candidates::Keys(keys) => keys
                .iter()
                .any(|k| k.verify_sig(self.signed, &self.signature).is_ok())
                .then_some(())
                .ok_or(Reject::BadSignature),
        }
    }

    /// The claims, once the signature verified.
    pub(super) fn claims(&self) -> Result<Map<String, Value>, Reject> {
        serde_json::from_slice(&self.payload)
            .map_err(|_| Reject::Malformed("payload is not a JSON object"))
    }
}

/// What the claims must satisfy.
pub(super) struct Rules<'a> {
    pub(super) issuer: Option<&'a str>,
    pub(super) audiences: &'a [String],
    pub(super) skew: Duration,
}

/// The time window a token is valid in (seconds since the epoch), from `nbf` and `exp`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    not_before: Option<f64>,
    expires: Option<f64>,
}

impl Window {
    /// Whether the window holds at `now` with `skew` of leeway.
    pub(super) fn check(&self, now: f64, skew: Duration) -> Result<(), Reject> {
        let skew = skew.as_secs_f64();
        if self.expires.is_some_and(|exp| now > exp + skew) {
            return Err(Reject::Expired);
        }
        if self.not_before.is_some_and(|nbf| now + skew < nbf) {
            return Err(Reject::NotYetValid);
        }
        Ok(())
    }
}

fn time_claim(claims: &Map<String, Value>, name: &str) -> Result<Option<f64>, Reject> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|v| v.is_finite())
            .map(Some)
            .ok_or(Reject::Malformed("time claim is not a number")),
        Some(_) => Err(Reject::Malformed("time claim is not a number")),
    }
}

impl Rules<'_> {
    /// Checks the claims (`exp`, `nbf` and `iat` when present; `iss` and `aud` when
    /// configured) and returns the time window to check again on a cached token.
    pub(super) fn check(&self, claims: &Map<String, Value>, now: f64) -> Result<Window, Reject> {
        let window = Window {
            not_before: time_claim(claims, "nbf")?,
            expires: time_claim(claims, "exp")?,
        };
        window.check(now, self.skew)?;
        if time_claim(claims, "iat")?.is_some_and(|iat| iat > now + self.skew.as_secs_f64()) {
            return Err(Reject::NotYetValid);
        }
        if let Some(issuer) = self.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(issuer)
        {
            return Err(Reject::WrongIssuer);
        }
        if !self.audiences.is_empty() {
            let named = |a: &Value| {
                a.as_str()
                    .is_some_and(|a| self.audiences.iter().any(|x| x == a))
            };
            let ok = match claims.get("aud") {
                Some(Value::Array(list)) => list.iter().any(named),
                Some(one) => named(one),
                None => false,
            };
            if !ok {
                return Err(Reject::WrongAudience);
            }
        }
        Ok(window)
    }
}
