//! The validated form of a `jwt` filter: algorithms named by enum, the token's place parsed,
//! the key-set source resolved (a file made absolute), header names lowercased.

use std::path::PathBuf;

/// A `jwt` filter, checked.
#[derive(Debug, Clone)]
pub struct Jwt {
    /// The `iss` required, if any.
    pub issuer: Option<String>,
    /// Accepted audiences; empty means `aud` is not checked.
    pub audiences: Vec<String>,
    /// Where the key set comes from.
    pub jwks: JwksSource,
    /// How often the key set is fetched again.
    pub refresh: std::time::Duration,
    /// Accepted algorithms (never `none`, never HMAC).
    pub algorithms: Vec<JwtAlgorithm>,
    /// Where the token is.
    pub from: TokenSource,
    /// Claim name to request header (lowercase, valid).
    pub claims_to_headers: Vec<(String, String)>,
    /// Leeway on time claims.
    pub clock_skew: std::time::Duration,
    /// Whether a request without a token is refused.
    pub required: bool,
    /// Realm named in `WWW-Authenticate` (a valid quoted-string body).
    pub realm: String,
}

/// Where a key set is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum JwksSource {
    /// An `http://` or `https://` URL.
    Url(String),
    /// A file (absolute).
    File(PathBuf),
}

impl std::fmt::Display for JwksSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url(u) => f.write_str(u),
            Self::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Where a request carries its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `Authorization: Bearer TOKEN`.
    Bearer,
    /// A header (lowercase name) holding the token, optionally after `Bearer `.
    Header(String),
    /// A cookie.
    Cookie(String),
    /// A query parameter.
    Query(String),
}

/// A JWS signature algorithm the filter verifies (RFC 7518 and RFC 8037 names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JwtAlgorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    Rs384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    Rs512,
    /// RSASSA-PSS with SHA-256.
    Ps256,
    /// RSASSA-PSS with SHA-384.
    Ps384,
    /// RSASSA-PSS with SHA-512.
    Ps512,
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// ECDSA on P-384 with SHA-384.
    Es384,
    /// Ed25519.
    EdDsa,
}

impl JwtAlgorithm {
    /// Every supported algorithm.
    pub const ALL: [Self; 9] = [
        Self::Rs256,
        Self::Rs384,
        Self::Rs512,
        Self::Ps256,
        Self::Ps384,
        Self::Ps512,
        Self::Es256,
        Self::Es384,
        Self::EdDsa,
    ];

    /// The `alg` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rs256 => "RS256",
            Self::Rs384 => "RS384",
            Self::Rs512 => "RS512",
            Self::Ps256 => "PS256",
            Self::Ps384 => "PS384",
            Self::Ps512 => "PS512",
            Self::Es256 => "ES256",
            Self::Es384 => "ES384",
            Self::EdDsa => "EdDSA",
        }
    }

    /// The algorithm an `alg` value names (exactly, as RFC 7515 compares them).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}
