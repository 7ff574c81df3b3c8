//! The harness at work: the example plugins (built by scripts/build-plugins.sh, which this test
//! runs when they are missing) driven without a gateway.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gateway_plugin_sdk::harness::{Decision, Harness};
use sha2::{Digest, Sha256};

fn plugin(name: &str) -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join(format!("plugins/target/wasm32-wasip1/release/{name}.wasm"));
    let _g = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    if !path.exists() {
        let ok = std::process::Command::new("bash")
            .arg(root.join("scripts/build-plugins.sh"))
            .status()
            .expect("run build-plugins.sh")
            .success();
        assert!(ok, "scripts/build-plugins.sh failed");
    }
    path
}

fn get(path: &str, headers: &[(&str, &str)]) -> http::Request<Vec<u8>> {
    let mut b = http::Request::get(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Vec::new()).unwrap()
}

#[test]
fn api_key_accepts_known_keys_and_strips_them() {
    let cfg = r#"{"keys": {"k-1": "alice"}}"#;
    let mut h = Harness::load(plugin("api_key"), cfg).unwrap();
    let (ctx, d) = h.send(get("/x", &[("x-api-key", "k-1")])).unwrap();
    let Decision::Forward(req) = d else {
        panic!("{d:?}")
    };
    assert_eq!(req.headers()["x-consumer"], "alice");
    assert!(req.headers().get("x-api-key").is_none());
    let res = h.respond(ctx, http::Response::new(b"ok".to_vec())).unwrap();
    assert_eq!(res.status(), 200);

    let (_, d) = h.send(get("/x", &[("x-api-key", "nope")])).unwrap();
    let Decision::Reply(r) = d else {
        panic!("{d:?}")
    };
    assert_eq!(r.status(), 401);
    assert_eq!(r.body(), b"invalid API key\n");
}

fn b64url(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn hmac_sha256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut k = [0u8; 64];
    k[..key.len()].copy_from_slice(key);
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<_>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

/// An HS256 token for `claims`.
pub fn jwt(secret: &str, claims: &str) -> String {
    let head = b64url(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = b64url(claims.as_bytes());
    let sig = hmac_sha256(secret.as_bytes(), format!("{head}.{body}").as_bytes());
    format!("{head}.{body}.{}", b64url(&sig))
}

#[test]
fn jwt_auth_verifies_signature_expiry_and_issuer() {
    let cfg = r#"{"secret": "s3cret", "issuer": "me", "claims_to_headers": {"sub": "x-user"}}"#;
    let mut h = Harness::load(plugin("jwt_auth"), cfg).unwrap();
    let good = jwt("s3cret", r#"{"sub":"alice","iss":"me","exp":99999999999}"#);
    let (_, d) = h
        .send(get("/", &[("authorization", &format!("Bearer {good}"))]))
        .unwrap();
    let Decision::Forward(req) = d else {
        panic!("{d:?}")
    };
    assert_eq!(req.headers()["x-user"], "alice");

    for (token, why) in [
        (jwt("other", r#"{"sub":"a","iss":"me"}"#), "bad signature"),
        (
            jwt("s3cret", r#"{"sub":"a","iss":"me","exp":1000}"#),
            "token expired",
        ),
        (jwt("s3cret", r#"{"sub":"a","iss":"you"}"#), "wrong issuer"),
        ("not.a.jwt".to_owned(), "malformed"),
    ] {
        let (_, d) = h
            .send(get("/", &[("authorization", &format!("Bearer {token}"))]))
            .unwrap();
        let Decision::Reply(r) = d else {
            panic!("{why}: {d:?}")
        };
        assert_eq!(r.status(), 401);
        assert!(String::from_utf8_lossy(r.body()).contains(why), "{why}");
    }
    let (_, d) = h.send(get("/", &[])).unwrap();
    assert!(matches!(d, Decision::Reply(ref r) if r.status() == 401));
}

#[test]
fn rate_limit_counts_per_key_in_shared_data() {
    let cfg = r#"{"requests": 3, "window_seconds": 3600, "key": "header:x-key"}"#;
    let mut h = Harness::load(plugin("rate_limit"), cfg).unwrap();
    for i in 0..3 {
        let (ctx, d) = h.send(get("/", &[("x-key", "a")])).unwrap();
        assert!(matches!(d, Decision::Forward(_)), "request {i}");
        let res = h.respond(ctx, http::Response::new(Vec::new())).unwrap();
        assert_eq!(
            res.headers()["x-ratelimit-remaining"],
            (2 - i).to_string().as_str()
        );
    }
    let (_, d) = h.send(get("/", &[("x-key", "a")])).unwrap();
    let Decision::Reply(r) = d else {
        panic!("{d:?}")
    };
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    // Another key has its own budget.
    let (_, d) = h.send(get("/", &[("x-key", "b")])).unwrap();
    assert!(matches!(d, Decision::Forward(_)));
}

#[test]
fn waf_rules_block_headers_paths_and_bodies() {
    let cfg = r#"{"rules": [
        {"id": 1, "where": "header:user-agent", "contains": "sqlmap"},
        {"id": 2, "where": "path", "contains": "../"},
        {"id": 3, "where": "body", "contains": "<script"}]}"#;
    let mut h = Harness::load(plugin("waf_rules"), cfg).unwrap();
    let (_, d) = h.send(get("/a", &[("user-agent", "SQLMap/1.0")])).unwrap();
    assert!(matches!(d, Decision::Reply(ref r) if r.headers()["x-waf-rule"] == "1"));
    let (_, d) = h.send(get("/a/../etc/passwd", &[])).unwrap();
    assert!(matches!(d, Decision::Reply(ref r) if r.headers()["x-waf-rule"] == "2"));
    let post = http::Request::post("/c")
        .body(b"hello <SCRIPT>x</script>".to_vec())
        .unwrap();
    let (_, d) = h.send(post).unwrap();
    assert!(matches!(d, Decision::Reply(ref r) if r.status() == 403));
    let post = http::Request::post("/c")
        .body(b"harmless".to_vec())
        .unwrap();
    let (_, d) = h.send(post).unwrap();
    let Decision::Forward(req) = d else {
        panic!("{d:?}")
    };
    assert_eq!(req.body(), b"harmless");
}

#[test]
fn http_calls_are_answered_by_the_test() {
    let mut h = Harness::load(plugin("http_auth"), r#"{"upstream": "auth"}"#).unwrap();
    let (ctx, d) = h.send(get("/", &[("authorization", "t")])).unwrap();
    assert!(matches!(d, Decision::Paused));
    let calls = h.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].upstream, "auth");
    let d = h
        .answer(ctx, calls[0].token, 200, &[("x-user", "bob")], b"")
        .unwrap();
    let Decision::Forward(req) = d else {
        panic!("{d:?}")
    };
    assert_eq!(req.headers()["x-auth-user"], "bob");

    let (ctx, _) = h.send(get("/", &[])).unwrap();
    let token = h.calls()[0].token;
    let d = h.answer(ctx, token, 0, &[], b"").unwrap();
    assert!(matches!(d, Decision::Reply(ref r) if r.status() == 403));
}
