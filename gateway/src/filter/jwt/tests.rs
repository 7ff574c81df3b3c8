use gateway_config::JwksSource;
use serde_json::json;

use super::testing::{SigningKey, jwks, now};
use super::token::MAX_TOKEN;
use super::*;

fn config() -> Jwt {
    Jwt {
        issuer: Some("https://id.example".into()),
        audiences: vec!["orders".into()],
        jwks: JwksSource::File("/nonexistent/jwks.json".into()),
        refresh: Duration::from_secs(600),
        algorithms: JwtAlgorithm::ALL.to_vec(),
        from: TokenSource::Bearer,
        claims_to_headers: vec![
            ("sub".into(), "x-user".into()),
            ("roles".into(), "x-roles".into()),
            ("admin".into(), "x-admin".into()),
        ],
        clock_skew: Duration::from_secs(60),
        required: true,
        realm: "api".into(),
    }
}

fn claims() -> Value {
    json!({ "iss": "https://id.example", "aud": "orders", "sub": "alice",
            "exp": now() + 600, "iat": now(), "roles": ["a", "b"], "admin": true })
}

fn factory(cfg: &Jwt, keys: &[&SigningKey]) -> (JwtFilterFactory, Arc<Registry>) {
    let registry = Registry::new();
    let source = Arc::new(KeySource::new(&cfg.jwks, &registry));
    source.set_keys(KeySet::parse(jwks(keys).as_bytes()).unwrap());
    let f = JwtFilterFactory::with_source(cfg, "r", &registry, source).unwrap();
    (f, registry)
}

fn cx() -> RequestCx {
    RequestCx::test()
}

fn request(headers: &[(&str, &str)], uri: &str) -> request::Parts {
    let mut b = http::Request::builder().uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap().into_parts().0
}

/// Runs the filter's synchronous hook: `Ok` with the request and context when it passed,
/// `Err` with the 401's challenge.
fn run(
    f: &JwtFilterFactory,
    headers: &[(&str, &str)],
) -> Result<(request::Parts, RequestCx), String> {
    let mut req = request(headers, "/");
    let mut cx = cx();
    let mut filter = f.create();
    match filter.on_request_headers_sync(&mut req, &mut cx) {
        Some(Ok(Flow::Continue)) => Ok((req, cx)),
        Some(Ok(Flow::Respond(res))) => {
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
            Err(res.headers()[WWW_AUTHENTICATE].to_str().unwrap().to_owned())
        }
        Some(Err(e)) => panic!("filter error {e}"),
        None => Err("refetch".into()),
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// The rejection of `token` by keys `keys` under `cfg`.
fn verdict(cfg: &Jwt, keys: &[&SigningKey], token: &str) -> Result<(), Reject> {
    let (f, _) = factory(cfg, keys);
    f.shared.verify(token, now() as f64).map(|_| ())
}

#[test]
fn every_algorithm_verifies_and_a_changed_signature_does_not() {
    let cfg = config();
    for alg in JwtAlgorithm::ALL {
        let key = SigningKey::generate(alg, "k1");
        let token = key.sign(&claims());
        assert_eq!(verdict(&cfg, &[&key], &token), Ok(()), "{}", alg.name());
        // Another key of the same kind, published under the same kid, does not verify it.
        let other = SigningKey::generate(alg, "k1");
        assert_eq!(
            verdict(&cfg, &[&other], &token),
            Err(Reject::BadSignature),
            "{}",
            alg.name()
        );
        let (head, sig) = token.rsplit_once('.').unwrap();
        let mut sig = URL_SAFE_NO_PAD_DECODE(sig);
        sig[0] ^= 1;
        let tampered = format!("{head}.{}", b64(&sig));
        assert_eq!(verdict(&cfg, &[&key], &tampered), Err(Reject::BadSignature));
    }
}

#[allow(non_snake_case, reason = "reads as the engine it stands for")]
fn URL_SAFE_NO_PAD_DECODE(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap()
}

fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

#[test]
fn a_token_cannot_choose_an_algorithm_its_key_was_not_made_for() {
    let cfg = config();
    let rsa = SigningKey::generate(JwtAlgorithm::Rs256, "rsa");
    let ec = SigningKey::generate(JwtAlgorithm::Es256, "ec");
    let keys = [&rsa, &ec];
    // The RSA key is published for RS256 only: a PS256 signature by it is refused.
    let pss = SigningKey::generate(JwtAlgorithm::Ps256, "rsa");
    let header = json!({"alg": "PS256", "kid": "rsa"});
    let token = pss.sign_with_header(&header, &claims());
    assert_eq!(
        verdict(&cfg, &keys, &token),
        Err(Reject::BadAlgorithm("no key for this algorithm"))
    );
    // An RSA-signed token pointing at the EC key.
    let token = rsa.sign_with_header(&json!({"alg": "RS256", "kid": "ec"}), &claims());
    assert!(matches!(
        verdict(&cfg, &keys, &token),
        Err(Reject::BadAlgorithm(_))
    ));
    // `none`, HMAC, and algorithms left out of the configured list.
    for alg in ["none", "HS256", "RS1", ""] {
        let token = rsa.sign_with_header(&json!({"alg": alg, "kid": "rsa"}), &claims());
        assert!(
            matches!(verdict(&cfg, &keys, &token), Err(Reject::BadAlgorithm(_))),
            "{alg}"
        );
    }
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none"}"#),
        b64(claims().to_string().as_bytes())
    );
    assert!(matches!(
        verdict(&cfg, &keys, &unsigned),
        Err(Reject::BadAlgorithm(_))
    ));
    let mut only_es = config();
    only_es.algorithms = vec![JwtAlgorithm::Es256];
    assert!(matches!(
        verdict(&only_es, &keys, &rsa.sign(&claims())),
        Err(Reject::BadAlgorithm(_))
    ));
}

#[test]
fn tokens_without_kid_try_the_keys_of_their_type() {
    let cfg = config();
    let a = SigningKey::generate(JwtAlgorithm::Es256, "a");
    let b = SigningKey::generate(JwtAlgorithm::Es256, "b");
    let token = b.sign_with_header(&json!({"alg": "ES256"}), &claims());
    assert_eq!(verdict(&cfg, &[&a, &b], &token), Ok(()));
    let unknown = b.sign_with_header(&json!({"alg": "ES256", "kid": "zz"}), &claims());
    assert_eq!(verdict(&cfg, &[&a], &unknown), Err(Reject::UnknownKey));
}

#[test]
fn time_issuer_and_audience_claims() {
    let cfg = config();
    let key = SigningKey::generate(JwtAlgorithm::Es256, "k");
    let check = |edit: &dyn Fn(&mut Value)| {
        let mut c = claims();
        edit(&mut c);
        verdict(&cfg, &[&key], &key.sign(&c))
    };
    let t = now();
    assert_eq!(check(&|c| c["exp"] = json!(t - 120)), Err(Reject::Expired));
    assert_eq!(
        check(&|c| c["exp"] = json!(t - 30)),
        Ok(()),
        "within the skew"
    );
    assert_eq!(
        check(&|c| c["nbf"] = json!(t + 120)),
        Err(Reject::NotYetValid)
    );
    assert_eq!(
        check(&|c| c["iat"] = json!(t + 3600)),
        Err(Reject::NotYetValid)
    );
    assert_eq!(
        check(&|c| c["exp"] = json!("soon")),
        Err(Reject::Malformed("time claim is not a number"))
    );
    assert_eq!(
        check(&|c| drop(c.as_object_mut().unwrap().remove("exp"))),
        Ok(())
    );
    assert_eq!(
        check(&|c| c["iss"] = json!("https://evil")),
        Err(Reject::WrongIssuer)
    );
    assert_eq!(
        check(&|c| drop(c.as_object_mut().unwrap().remove("iss"))),
        Err(Reject::WrongIssuer)
    );
    assert_eq!(
        check(&|c| c["aud"] = json!("billing")),
        Err(Reject::WrongAudience)
    );
    assert_eq!(check(&|c| c["aud"] = json!(["billing", "orders"])), Ok(()));
    assert_eq!(
        check(&|c| c["aud"] = json!([1, {"a": "orders"}])),
        Err(Reject::WrongAudience)
    );
    assert_eq!(
        check(&|c| drop(c.as_object_mut().unwrap().remove("aud"))),
        Err(Reject::WrongAudience)
    );
}

#[test]
fn hostile_tokens_are_malformed_never_a_panic() {
    let cfg = config();
    let key = SigningKey::generate(JwtAlgorithm::Es256, "k");
    let good = key.sign(&claims());
    let (h, rest) = good.split_once('.').unwrap();
    let (p, s) = rest.split_once('.').unwrap();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_header = format!("{}.{p}.{s}", b64(deep.as_bytes()));
    let deep_claims = key.sign_with_header(&json!({"alg": "ES256", "kid": "k"}), &json!(null));
    let padded = format!("{h}=.{p}.{s}");
    let std_alphabet = format!("{}.{p}.{s}", h.replace('-', "+").replace('_', "/") + "+");
    let huge = format!("{h}.{}.{s}", "A".repeat(MAX_TOKEN));
    let cases = [
        "".to_owned(),
        "abc".to_owned(),
        format!("{h}.{p}"),
        format!("{h}.{p}.{s}.x"),
        format!("{}.{p}.{s}", b64(b"{not json")),
        format!("{}.{p}.{s}", b64(b"[1,2]")),
        format!("{}.{p}.{s}", b64(br#"{"alg":"ES256","crit":["b64"]}"#)),
        format!("{h}.{p}.***"),
        padded,
        std_alphabet,
        huge,
        deep_header,
    ];
    for token in &cases {
        let r = verdict(&cfg, &[&key], token);
        assert!(matches!(r, Err(Reject::Malformed(_))), "{token:.60}: {r:?}");
    }
    // An empty payload is no token this key signed.
    assert!(verdict(&cfg, &[&key], &format!("{h}..{s}")).is_err());
    // Signed, but its payload is no JSON object.
    assert_eq!(
        verdict(&cfg, &[&key], &deep_claims),
        Err(Reject::Malformed("payload is not a JSON object"))
    );
}

#[test]
fn key_sets_skip_what_they_cannot_use() {
    let good = SigningKey::generate(JwtAlgorithm::EdDsa, "ed");
    let set = json!({"keys": [
        {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
        {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"},
        {"kty": "RSA", "n": b64(&[0xff; 128]), "e": "AQAB", "kid": "short"},
        {"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA"},
        {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"},
        "not an object",
        good.jwk(),
    ]});
    let keys = KeySet::parse(set.to_string().as_bytes()).unwrap();
    assert_eq!(keys.len(), 1);
    assert!(KeySet::parse(br#"{"keys": []}"#).is_err());
    assert!(KeySet::parse(b"<html>").is_err());
    assert!(KeySet::parse(br#"{"keys": [{"kty": "oct", "k": "AA"}]}"#).is_err());
}

#[test]
fn claims_become_headers_and_client_copies_are_removed() {
    let key = SigningKey::generate(JwtAlgorithm::Rs256, "k");
    let (f, registry) = factory(&config(), &[&key]);
    let auth = bearer(&key.sign(&claims()));
    let (req, cx) = run(
        &f,
        &[
            ("authorization", &auth),
            ("x-user", "mallory"),
            ("x-admin", "true"),
            ("x-admin", "1"),
        ],
    )
    .unwrap();
    assert_eq!(
        req.headers.get_all("x-user").iter().collect::<Vec<_>>(),
        ["alice"]
    );
    assert_eq!(req.headers["x-roles"], r#"["a","b"]"#);
    assert_eq!(req.headers.get_all("x-admin").iter().count(), 1);
    assert_eq!(req.headers["x-admin"], "true");
    let verified = cx.jwt.expect("claims in the context");
    assert_eq!(verified.subject().map(|s| &**s), Some("alice"));
    assert_eq!(verified.get("admin"), Some(&json!(true)));
    assert!(
        registry
            .render()
            .contains(r#"gateway_jwt_requests_total{route="r",result="ok"} 1"#)
    );
    // A claim that cannot be a header value sets no header, and the forged copy still goes.
    let mut c = claims();
    c["sub"] = json!("a\nb");
    let auth = bearer(&key.sign(&c));
    let (req, _) = run(&f, &[("authorization", &auth), ("x-user", "mallory")]).unwrap();
    assert!(req.headers.get("x-user").is_none());
}

#[test]
fn answers_follow_rfc_6750() {
    let key = SigningKey::generate(JwtAlgorithm::Es384, "k");
    let (f, registry) = factory(&config(), &[&key]);
    assert_eq!(run(&f, &[]).unwrap_err(), r#"Bearer realm="api""#);
    assert_eq!(
        run(&f, &[("authorization", "Basic YTpi")]).unwrap_err(),
        r#"Bearer realm="api""#
    );
    let mut c = claims();
    c["exp"] = json!(now() - 3600);
    let expired = bearer(&key.sign(&c));
    assert_eq!(
        run(&f, &[("authorization", &expired)]).unwrap_err(),
        r#"Bearer realm="api", error="invalid_token", error_description="token expired""#
    );
    assert_eq!(
        run(&f, &[("authorization", "Bearer x.y")]).unwrap_err(),
        r#"Bearer realm="api", error="invalid_token", error_description="not a compact JWS (three segments)""#
    );
    let text = registry.render();
    assert!(
        text.contains(r#"gateway_jwt_requests_total{route="r",result="missing"} 2"#),
        "{text}"
    );
    assert!(text.contains(r#"gateway_jwt_requests_total{route="r",result="expired"} 1"#));
    assert!(text.contains(r#"gateway_jwt_requests_total{route="r",result="malformed"} 1"#));
}

#[test]
fn optional_tokens_let_anonymous_requests_through_but_not_bad_tokens() {
    let key = SigningKey::generate(JwtAlgorithm::Es256, "k");
    let mut cfg = config();
    cfg.required = false;
    let (f, _) = factory(&cfg, &[&key]);
    let (req, cx) = run(&f, &[("x-user", "mallory")]).unwrap();
    assert!(req.headers.get("x-user").is_none());
    assert!(cx.jwt.is_none());
    assert!(run(&f, &[("authorization", "Bearer a.b.c")]).is_err());
}

#[test]
fn a_key_not_yet_fetched_defers_to_the_waiting_hook() {
    let key = SigningKey::generate(JwtAlgorithm::Es256, "k");
    let other = SigningKey::generate(JwtAlgorithm::Es256, "new");
    let (f, _) = factory(&config(), &[&key]);
    let auth = bearer(&other.sign(&claims()));
    assert_eq!(run(&f, &[("authorization", &auth)]).unwrap_err(), "refetch");
}

#[test]
fn verified_tokens_are_remembered_until_the_keys_change() {
    let key = SigningKey::generate(JwtAlgorithm::Rs256, "k");
    let (f, _) = factory(&config(), &[&key]);
    let token = key.sign(&claims());
    let first = f.shared.verify(&token, now() as f64).unwrap();
    let again = f.shared.cached(&token).expect("cached");
    assert!(Arc::ptr_eq(&first, &again));
    f.shared
        .source
        .set_keys(KeySet::parse(jwks(&[&key]).as_bytes()).unwrap());
    assert!(
        f.shared.cached(&token).is_none(),
        "a new key set verifies again"
    );
}

#[test]
fn tokens_are_found_where_configured() {
    let find = |from: TokenSource, headers: &[(&str, &str)], uri: &str| {
        find_token(&request(headers, uri), &from).map(|t| t.into_owned())
    };
    assert_eq!(
        find(
            TokenSource::Bearer,
            &[("authorization", "bearer  t1 ")],
            "/"
        )
        .as_deref(),
        Some("t1")
    );
    assert_eq!(
        find(TokenSource::Bearer, &[("authorization", "Bearer")], "/"),
        None
    );
    assert_eq!(
        find(TokenSource::Bearer, &[("authorization", "Bearer ")], "/"),
        None
    );
    let h = TokenSource::Header("x-token".into());
    assert_eq!(
        find(h.clone(), &[("x-token", "t2")], "/").as_deref(),
        Some("t2")
    );
    assert_eq!(
        find(h, &[("x-token", "Bearer t2")], "/").as_deref(),
        Some("t2")
    );
    let c = TokenSource::Cookie("session".into());
    let cookies = [("cookie", "a=1; session=t3"), ("cookie", "b=2")];
    assert_eq!(find(c.clone(), &cookies, "/").as_deref(), Some("t3"));
    assert_eq!(find(c, &[("cookie", "xsession=t")], "/"), None);
    let q = TokenSource::Query("access_token".into());
    assert_eq!(
        find(q.clone(), &[], "/p?a=1&access_token=t4").as_deref(),
        Some("t4")
    );
    assert_eq!(
        find(q.clone(), &[], "/p?access_token=t%2E5").as_deref(),
        Some("t.5")
    );
    assert_eq!(find(q.clone(), &[], "/p?access_token=%zz"), None);
    assert_eq!(find(q, &[], "/p?access_token="), None);
}
