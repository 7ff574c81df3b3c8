//! JSON Web Key sets (RFC 7517/7518/8037): each usable signing key parsed once, when the set is
//! loaded, into an aws-lc-rs public key per algorithm it may verify. A key binds its algorithms
//! by type (`kty`, `crv`) and, when it names one, by its `alg`, so a token cannot pick an
//! algorithm its key was not made for. Keys the filter cannot use (encryption keys, HMAC
//! secrets, unknown types, short RSA moduli) are skipped; a set with no usable key is an error.

use aws_lc_rs::signature::{self, ParsedPublicKey, RsaParameters, RsaPublicKeyComponents};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use gateway_config::JwtAlgorithm;
use serde::Deserialize;

/// Most keys read from one set (identity providers publish a handful).
const MAX_KEYS: usize = 64;

/// Shortest RSA modulus accepted, in bytes (2048 bits, RFC 7518 §3.3).
const MIN_RSA_BYTES: usize = 256;

/// Most keys tried for a token that names no `kid`.
const MAX_KIDLESS_TRIES: usize = 8;

/// One usable key.
pub(super) struct Key {
    kid: Option<Box<str>>,
    verifiers: Vec<(JwtAlgorithm, ParsedPublicKey)>,
}

/// The keys of one fetch.
pub(super) struct KeySet {
    keys: Vec<Key>,
}

/// The keys a token's header points at.
pub(super) enum Candidates<'a> {
    /// Keys to try, in order.
    Keys(Vec<&'a ParsedPublicKey>),
    /// The `kid` is not in the set.
    UnknownKid,
    /// Keys exist for the `kid` (or, without one, none at all) but none verifies this algorithm.
    WrongType,
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawKey {
    kty: String,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

impl KeySet {
    /// Parses a JWKS document; keys that cannot be used are skipped.
    pub(super) fn parse(json: &[u8]) -> Result<Self, String> {
        let raw: RawSet =
            serde_json::from_slice(json).map_err(|e| format!("not a JSON Web Key Set: {e}"))?;
        let mut keys = Vec::new();
        let mut skipped = Vec::new();
        for (i, value) in raw.keys.into_iter().take(MAX_KEYS).enumerate() {
            match serde_json::from_value::<RawKey>(value)
                .map_err(|e| e.to_string())
                .and_then(|k| Key::parse(&k))
            {
                Ok(Some(k)) => keys.push(k),
                Ok(None) => {}
                Err(e) => skipped.push(format!("key {i}: {e}")),
            }
        }
        if !skipped.is_empty() {
            tracing::debug!(skipped = %skipped.join("; "), "JWKS keys skipped");
        }
        if keys.is_empty() {
            let why = skipped.first().map_or(String::new(), |s| format!(" ({s})"));
            return Err(format!("no usable signing key in the set{why}"));
        }
        Ok(Self { keys })
    }

    /// How many keys the set holds.
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The keys to try for a token signed with `alg` naming `kid`.
    pub(super) fn candidates(&self, kid: Option<&str>, alg: JwtAlgorithm) -> Candidates<'_> {
        fn verifier(k: &Key, alg: JwtAlgorithm) -> Option<&ParsedPublicKey> {
            k.verifiers.iter().find(|(a, _)| *a == alg).map(|v| &v.1)
        }
        match kid {
            Some(kid) => {
                let mut named = self.keys.iter().filter(|k| k.kid.as_deref() == Some(kid));
                let Some(first) = named.next() else {
                    return Candidates::UnknownKid;
                };
                let found: Vec<_> = std::iter::once(first)
                    .chain(named)
                    .filter_map(|k| verifier(k, alg))
                    .collect();
                if found.is_empty() {
                    Candidates::WrongType
                } else {
                    Candidates::Keys(found)
                }
            }
            None => {
                let found: Vec<_> = self
                    .keys
                    .iter()
                    .filter_map(|k| verifier(k, alg))
                    .take(MAX_KIDLESS_TRIES)
                    .collect();
                if found.is_empty() {
                    Candidates::WrongType
                } else {
                    Candidates::Keys(found)
                }
            }
        }
    }
}

fn b64(field: &str, value: Option<&String>) -> Result<Vec<u8>, String> {
    let v = value.ok_or_else(|| format!("no `{field}`"))?;
    URL_SAFE_NO_PAD
        .decode(v.trim_end_matches('='))
        .map_err(|e| format!("`{field}`: {e}"))
}

impl Key {
    /// A usable key, `None` for a key that is not for signatures, or why it is unusable.
    fn parse(k: &RawKey) -> Result<Option<Self>, String> {
        if k.use_.as_deref().is_some_and(|u| u != "sig") {
            return Ok(None);
        }
        let named = match &k.alg {
            None => None,
            Some(a) => match JwtAlgorithm::from_name(a) {
                Some(a) => Some(a),
                // An algorithm the filter does not verify (HS256, RSA-OAEP...): never usable.
                None => return Ok(None),
            },
        };
        let wanted = |a: &JwtAlgorithm| named.is_none_or(|n| n == *a);
        let verifiers = match k.kty.as_str() {
            "RSA" => rsa_verifiers(k, &wanted)?,
            "EC" => {
                let (alg, len, params) = match k.crv.as_deref() {
                    Some("P-256") => (JwtAlgorithm::Es256, 32, &signature::ECDSA_P256_SHA256_FIXED),
                    Some("P-384") => (JwtAlgorithm::Es384, 48, &signature::ECDSA_P384_SHA384_FIXED),
                    other => return Err(format!("unsupported curve {other:?}")),
                };
                if !wanted(&alg) {
                    return Err(format!("`alg` {:?} does not fit an EC key", k.alg));
                }
                let (x, y) = (b64("x", k.x.as_ref())?, b64("y", k.y.as_ref())?);
                if x.len() != len || y.len() != len {
                    return Err("coordinates of the wrong length".into());
                }
                let mut point = Vec::with_capacity(1 + 2 * len);
                point.push(0x04);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                let key = ParsedPublicKey::new(params, &point).map_err(|e| e.to_string())?;
                vec![(alg, key)]
            }
            "OKP" => {
                if k.crv.as_deref() != Some("Ed25519") {
                    return Err(format!("unsupported curve {:?}", k.crv));
                }
                if !wanted(&JwtAlgorithm::EdDsa) {
                    return Err(format!("`alg` {:?} does not fit an Ed25519 key", k.alg));
                }
                let x = b64("x", k.x.as_ref())?;
                let key =
                    ParsedPublicKey::new(&signature::ED25519, &x).map_err(|e| e.to_string())?;
                vec![(JwtAlgorithm::EdDsa, key)]
            }
            // Symmetric secrets never belong to a public set; other types are unknown.
            _ => return Ok(None),
        };
        Ok(Some(Self {
            kid: k.kid.as_deref().map(Box::from),
            verifiers,
        }))
    }
}

fn rsa_verifiers(
    k: &RawKey,
    wanted: &dyn Fn(&JwtAlgorithm) -> bool,
) -> Result<Vec<(JwtAlgorithm, ParsedPublicKey)>, String> {
    let n = b64("n", k.n.as_ref())?;
    let e = b64("e", k.e.as_ref())?;
    let n = strip_zeros(&n);
    let e = strip_zeros(&e);
    if n.len() < MIN_RSA_BYTES {
        return Err("RSA modulus shorter than 2048 bits".into());
    }
    let components = RsaPublicKeyComponents { n, e };
    let mut out = Vec::new();
    for alg in JwtAlgorithm::ALL.into_iter().filter(wanted) {
        let Some(params) = rsa_params(alg) else {
            continue;
        };
        let key = components
            .to_parsed_public_key(params)
            .map_err(|e| format!("RSA key: {e}"))?;
        out.push((alg, key));
    }
    if out.is_empty() {
        return Err(format!("`alg` {:?} does not fit an RSA key", k.alg));
    }
    Ok(out)
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    &b[start..]
}

fn rsa_params(alg: JwtAlgorithm) -> Option<&'static RsaParameters> {
    Some(match alg {
        JwtAlgorithm::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
        JwtAlgorithm::Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
        JwtAlgorithm::Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
        JwtAlgorithm::Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
        JwtAlgorithm::Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
        JwtAlgorithm::Ps512 => &signature::RSA_PSS_2048_8192_SHA512,
        _ => return None,
    })
}
