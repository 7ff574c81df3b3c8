//! What `GET /config` hides: the values of keys that look like secrets anywhere in the tree
//! (plugin configs carry API keys and signing secrets, `admin.token` the admin's own), the
//! values of credential headers in header maps (a `headers` filter that sets `authorization`
//! for the backend), and the passwords in URLs (`cluster.redis`). Each is replaced by
//! [`MARKER`].

use serde_yaml::Value;

/// What a hidden value is replaced with.
const MARKER: &str = "<redacted>";

/// Words that make a config key, or a header name, name a secret.
const SECRET_WORDS: [&str; 8] = [
    "secret",
    "password",
    "passwd",
    "token",
    "api_key",
    "apikey",
    "private",
    "credential",
];

/// Headers that carry credentials whatever their value looks like.
const CREDENTIAL_HEADERS: [&str; 4] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
];

/// Keys whose value is a map from header names to values (`headers` filters' `request_set`,
/// `request_add`, `response_set`, `response_add`; `respond.headers`; `match.headers`).
const HEADER_MAPS: [&str; 5] = [
    "request_set",
    "request_add",
    "response_set",
    "response_add",
    "headers",
];

/// Hides every secret in `value`, at any depth.
pub fn redact(value: &mut Value) {
    match value {
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                let key = k.as_str().unwrap_or_default().to_ascii_lowercase();
                if names_a_secret(&key) || key == "keys" {
                    *v = Value::String(MARKER.into());
                    continue;
                }
                if HEADER_MAPS.contains(&key.as_str())
                    && let Value::Mapping(headers) = v
                {
                    redact_header_values(headers);
                }
                redact(v);
            }
        }
        Value::Sequence(seq) => seq.iter_mut().for_each(redact),
        Value::String(s) => redact_url_password(s),
        _ => {}
    }
}

/// Whether a lower-case name (a config key or a header name) says it holds a secret.
fn names_a_secret(name: &str) -> bool {
    SECRET_WORDS.iter().any(|w| name.contains(w))
}

/// Whether a header's value is a credential: a credential header, or a name that says it holds
/// a key, a token, a secret or a password (`x-api-key`, `x-auth-token`).
fn is_secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    CREDENTIAL_HEADERS.contains(&name.as_str()) || name.contains("key") || names_a_secret(&name)
}

/// Hides the values of the credential headers in one header map. Entries whose value is itself
/// a map (a `headers` filter's `request_set: {...}`) are left to the walk, which finds the
/// header map inside.
fn redact_header_values(headers: &mut serde_yaml::Mapping) {
    for (name, v) in headers.iter_mut() {
        if !matches!(v, Value::Mapping(_) | Value::Sequence(_))
            && name.as_str().is_some_and(is_secret_header)
        {
            *v = Value::String(MARKER.into());
        }
    }
}

/// `scheme://user:password@host…` → `scheme://user:<redacted>@host…` (e.g. `cluster.redis`).
fn redact_url_password(s: &mut String) {
    let Some(start) = s.find("://").map(|i| i + 3) else {
        return;
    };
    let authority_end = s[start..].find('/').map_or(s.len(), |i| start + i);
    let Some(at) = s[start..authority_end].rfind('@').map(|i| start + i) else {
        return;
    };
    let colon = s[start..at].find(':').map_or(start, |i| start + i + 1);
    if colon < at {
        s.replace_range(colon..at, MARKER);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redacted(yaml: &str) -> String {
        let mut v: Value = serde_yaml::from_str(yaml).unwrap();
        redact(&mut v);
        serde_yaml::to_string(&v).unwrap()
    }

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let text = redacted(
            "plugins:\n  auth:\n    config: { jwt_secret: s3cret, header: x-api-key, keys: [a, b], nested: { Password: p } }\n",
        );
        assert!(
            !text.contains("s3cret") && !text.contains(" p\n") && !text.contains("- a"),
            "{text}"
        );
        assert!(text.contains("header: x-api-key"), "{text}");
    }

    #[test]
    fn passwords_in_urls_are_redacted() {
        let text = redacted(
            "cluster: { redis: \"redis://app:hunter2@10.0.0.5:6379/1\" }\nother: \"redis://10.0.0.5:6379\"\n",
        );
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            text.contains("redis://app:<redacted>@10.0.0.5:6379/1"),
            "{text}"
        );
        assert!(text.contains("redis://10.0.0.5:6379"), "{text}");
    }

    #[test]
    fn credential_headers_in_header_maps_are_redacted() {
        let text = redacted(
            "routes:\n  - filters:\n      - headers:\n          request_set: { Authorization: Bearer abc, X-Api-Key: k1, x-kept: v1 }\n          request_add: { cookie: c1, x-upstream-token: t1 }\n          response_set: { Set-Cookie: s1, x-password-hint: p1 }\n          response_add: { proxy-authorization: Basic b1, x-client-secret: z1 }\n          request_remove: [authorization]\n    respond: { headers: { set-cookie: s2, x-also-kept: v2 } }\n    match: { headers: { x-api-key: k2 } }\n",
        );
        for secret in ["abc", "k1", "c1", "t1", "s1", "p1", "b1", "z1", "s2", "k2"] {
            assert!(!text.contains(secret), "{secret} shown:\n{text}");
        }
        assert!(text.contains("x-kept: v1"), "{text}");
        assert!(text.contains("x-also-kept: v2"), "{text}");
        assert!(text.contains("- authorization"), "{text}");
        assert!(text.contains("Authorization: <redacted>"), "{text}");
    }

    #[test]
    fn the_header_rule() {
        for name in [
            "Authorization",
            "proxy-authorization",
            "Cookie",
            "set-cookie",
            "x-api-key",
            "X-Auth-Token",
            "x-client-secret",
            "x-db-password",
        ] {
            assert!(is_secret_header(name), "{name}");
        }
        for name in ["x-request-id", "accept", "x-forwarded-for", "cache-control"] {
            assert!(!is_secret_header(name), "{name}");
        }
    }
}
