//! `jwt-auth`: bearer JWT authentication, HS256. The token comes from `authorization: Bearer
//! ...`; the signature (HMAC-SHA256 with the configured secret, compared in constant time),
//! `exp`, `nbf` and optionally `iss` and `aud` are checked. Valid tokens pass with claims
//! copied into request headers (`claims_to_headers`); anything else gets 401.
//!
//! Config: `{"secret": "...", "issuer": "https://issuer", "audience": "api",
//! "claims_to_headers": {"sub": "x-user"}, "leeway_seconds": 30}`.

use std::collections::HashMap;
use std::rc::Rc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use gateway_plugin_sdk::{Filter, Flow, Reply, Request, now_unix};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Config {
    secret: String,
    issuer: Option<String>,
    audience: Option<String>,
    #[serde(default)]
    claims_to_headers: HashMap<String, String>,
    #[serde(default = "leeway")]
    leeway_seconds: u64,
}

fn leeway() -> u64 {
    30
}

struct Jwt(Rc<Config>);

fn deny(why: &str) -> Flow {
    Flow::Reply(
        Reply::new(401)
            .header("www-authenticate", &format!("Bearer error=\"invalid_token\", error_description=\"{why}\""))
            .header("content-type", "text/plain")
            .body(format!("unauthorized: {why}\n")),
    )
}

/// The verified claims, or why not.
fn verify(c: &Config, token: &str, now: u64) -> Result<serde_json::Map<String, Value>, &'static str> {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed token");
    };
    let header: Value = URL_SAFE_NO_PAD
        .decode(h)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or("malformed header")?;
    if header.get("alg").and_then(Value::as_str) != Some("HS256") {
        return Err("unsupported algorithm");
    }
    let sig = URL_SAFE_NO_PAD.decode(s).map_err(|_| "malformed signature")?;
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(c.secret.as_bytes()).map_err(|_| "bad key")?;
    mac.update(h.as_bytes());
    mac.update(b".");
    mac.update(p.as_bytes());
    mac.verify_slice(&sig).map_err(|_| "bad signature")?;
    let claims: serde_json::Map<String, Value> = URL_SAFE_NO_PAD
        .decode(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or("malformed claims")?;
    let num = |k: &str| claims.get(k).and_then(Value::as_u64);
    if num("exp").is_some_and(|exp| now > exp + c.leeway_seconds) {
        return Err("token expired");
    }
    if num("nbf").is_some_and(|nbf| now + c.leeway_seconds < nbf) {
        return Err("token not yet valid");
    }
    if let Some(iss) = &c.issuer {
        if claims.get("iss").and_then(Value::as_str) != Some(iss) {
            return Err("wrong issuer");
        }
    }
    if let Some(aud) = &c.audience {
        let ok = match claims.get("aud") {
            Some(Value::String(a)) => a == aud,
            Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(aud)),
            _ => false,
        };
        if !ok {
            return Err("wrong audience");
        }
    }
    Ok(claims)
}

impl Filter for Jwt {
    type Config = Config;

    fn create(config: &Rc<Config>) -> Self {
        Self(config.clone())
    }

    fn on_request(&mut self, req: &mut Request) -> Flow {
        let Some(auth) = req.header("authorization") else {
            return deny("missing bearer token");
        };
        let Some(token) = auth.strip_prefix("Bearer ").or_else(|| auth.strip_prefix("bearer ")) else {
            return deny("missing bearer token");
        };
        match verify(&self.0, token.trim(), now_unix()) {
            Ok(claims) => {
                for (claim, header) in &self.0.claims_to_headers {
                    let value = match claims.get(claim) {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => v.to_string(),
                        None => continue,
                    };
                    req.set_header(header, &value);
                }
                Flow::Continue
            }
            Err(why) => deny(why),
        }
    }
}

gateway_plugin_sdk::export_filter!(Jwt);
