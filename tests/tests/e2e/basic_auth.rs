//! The `basic_auth` filter end to end: real bcrypt and SHA-crypt entries made by the test, a
//! real backend, HTTP/1.1 and h2c clients. Good credentials reach the backend as the user
//! header (the `Authorization` field and a forged user header removed); missing, malformed and
//! wrong ones get 401 with the challenge, each counted by reason; the htpasswd file is reloaded
//! when it changes, a broken version is refused and the last good one keeps serving; checks
//! beyond the bound get 503 while cached logins still pass; the access log names the user.

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{
    Client, TestGateway, counter_value, fast_path_chain_count, http1, http2c, temp_dir, write_file,
};
use http::Request;
use http_body_util::Full;
use sha_crypt::{Algorithm, CustomizedPasswordHasher, Params, ShaCrypt};

const CHALLENGE: &str = r#"Basic realm="admin area", charset="UTF-8""#;

fn sha_crypt(alg: Algorithm, rounds: u32, password: &str) -> String {
    ShaCrypt::default()
        .hash_password_customized(
            password.as_bytes(),
            b"e2e-salt",
            Some(alg.to_str()),
            None,
            Params::new(rounds).unwrap(),
        )
        .unwrap()
        .to_string()
}

/// alice (bcrypt), bob (SHA-512-crypt), carol (SHA-256-crypt).
fn htpasswd() -> String {
    format!(
        "# test users\nalice:{}\nbob:{}\ncarol:{}\n",
        bcrypt::hash("alice-pw", 5).unwrap(),
        sha_crypt(Algorithm::Sha512Crypt, 5000, "bob-pw"),
        sha_crypt(Algorithm::Sha256Crypt, 1000, "carol-pw"),
    )
}

fn config(backend: &Backend, extra: &str) -> String {
    format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
telemetry:
  access_log: {{ path: access.log, format: json }}
listeners:
  - name: main
    bind: 127.0.0.1:0
    protocols: [http1, http2]
upstreams:
  app: {{ targets: [{}] }}
routes:
  - name: admin
    match: {{ path_prefix: /admin }}
    filters:
      - basic_auth: {{ realm: admin area, htpasswd: users.htpasswd, user_header: x-user{extra} }}
    proxy: {{ upstream: app }}
"#,
        backend.addr()
    )
}

fn get(path: &str, authorization: Option<&[u8]>) -> Request<Full<Bytes>> {
    let mut b = Request::get(path).header("x-user", "forged");
    if let Some(v) = authorization {
        b = b.header("authorization", v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

fn basic(user: &str, password: &str) -> Vec<u8> {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}").into_bytes()
}

async fn status(c: &mut Client, authorization: Option<&[u8]>) -> (u16, String) {
    let res = c.send(get("/admin/x", authorization)).await.unwrap();
    (res.status(), res.header("www-authenticate").to_owned())
}

fn series(result: &str) -> String {
    format!("gateway_basic_auth_requests_total{{route=\"admin\",result=\"{result}\"}}")
}

#[tokio::test]
async fn every_hash_kind_gets_in_and_every_bad_credential_gets_401() {
    let backend = Backend::start("app").await;
    let dir = temp_dir();
    write_file(dir.path(), "users.htpasswd", htpasswd());
    let gw = TestGateway::start_in(dir, &config(&backend, "")).await;
    for h2 in [false, true] {
        let mut c = if h2 {
            http2c(gw.addr("main")).await
        } else {
            http1(gw.addr("main")).await
        };
        for (user, pw) in [
            ("alice", "alice-pw"),
            ("bob", "bob-pw"),
            ("carol", "carol-pw"),
        ] {
            let res = c
                .send(get("/admin/x", Some(&basic(user, pw))))
                .await
                .unwrap();
            assert_eq!(res.status(), 200, "{user} h2={h2}");
            let seen = backend.last().unwrap();
            assert_eq!(seen.header("x-user"), user, "the forged copy is replaced");
            assert_eq!(
                seen.header("authorization"),
                "",
                "removed before forwarding"
            );
        }
        let refused: [Option<&[u8]>; 8] = [
            None,
            Some(b"Bearer token"),
            Some(&basic("alice", "wrong")),
            Some(&basic("bob", "")),
            Some(&basic("mallory", "alice-pw")),
            Some(b"Basic !!!"),
            Some(b"Basic YWxpY2U="), // "alice": no colon
            Some(b"Basic /w=="),     // not UTF-8
        ];
        for auth in refused {
            assert_eq!(
                status(&mut c, auth).await,
                (401, CHALLENGE.to_owned()),
                "{auth:?} h2={h2}"
            );
        }
    }
    assert_eq!(counter_value(&gw, &series("ok")).await, 6);
    assert_eq!(counter_value(&gw, &series("missing")).await, 4);
    assert_eq!(counter_value(&gw, &series("bad_password")).await, 4);
    assert_eq!(counter_value(&gw, &series("unknown_user")).await, 2);
    assert_eq!(counter_value(&gw, &series("malformed")).await, 6);
    assert_eq!(
        backend.requests(),
        6,
        "no refused request reached the backend"
    );
    assert!(
        fast_path_chain_count(&gw, "main").await >= 11,
        "HTTP/1.1 went by the fast path"
    );

    // The access log names the user let in.
    let path = gw.dir().join("access.log");
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= 22 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(text.contains(r#""user":"alice""#), "{text}");
    let refused = text
        .lines()
        .find(|l| l.contains(r#""status":401"#))
        .unwrap();
    assert!(!refused.contains(r#""user""#), "{refused}");
}

#[tokio::test]
async fn authorization_is_forwarded_when_asked() {
    let backend = Backend::start("app").await;
    let dir = temp_dir();
    write_file(dir.path(), "users.htpasswd", htpasswd());
    let gw = TestGateway::start_in(dir, &config(&backend, ", forward_authorization: true")).await;
    let mut c = http1(gw.addr("main")).await;
    let auth = basic("carol", "carol-pw");
    assert_eq!(status(&mut c, Some(&auth)).await.0, 200);
    let seen = backend.last().unwrap();
    assert_eq!(seen.header("authorization").as_bytes(), &auth[..]);
}

/// Polls until `c`'s request with `auth` gets `want` (the file is checked once a second).
async fn until_status(c: &mut Client, auth: &[u8], want: u16) {
    for _ in 0..60 {
        if status(c, Some(auth)).await.0 == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never got {want}");
}

#[tokio::test]
async fn the_file_is_reloaded_when_it_changes_and_a_broken_one_is_refused() {
    let backend = Backend::start("app").await;
    let dir = temp_dir();
    let file = write_file(dir.path(), "users.htpasswd", htpasswd());
    let gw = TestGateway::start_in(dir, &config(&backend, "")).await;
    let mut c = http1(gw.addr("main")).await;
    let alice = basic("alice", "alice-pw");
    let dave = basic("dave", "dave-pw");
    assert_eq!(
        status(&mut c, Some(&alice)).await.0,
        200,
        "cached from now on"
    );
    assert_eq!(status(&mut c, Some(&dave)).await.0, 401);

    // alice removed, dave added: no config reload, and alice's cached login goes with the
    // old version.
    let v2 = format!(
        "dave:{}\n",
        sha_crypt(Algorithm::Sha512Crypt, 1000, "dave-pw")
    );
    std::fs::write(&file, v2).unwrap();
    until_status(&mut c, &dave, 200).await;
    assert_eq!(status(&mut c, Some(&alice)).await.0, 401);
    let reloads = "gateway_basic_auth_file_reloads_total{route=\"admin\",result=\"ok\"}";
    assert_eq!(counter_value(&gw, reloads).await, 1);

    // A version with an MD5 entry is refused: dave still gets in.
    std::fs::write(&file, "dave:$apr1$abcdefgh$0123456789abcdefghijkl\n").unwrap();
    let rejected = "gateway_basic_auth_file_reloads_total{route=\"admin\",result=\"error\"}";
    for _ in 0..60 {
        if counter_value(&gw, rejected).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(counter_value(&gw, rejected).await, 1);
    assert_eq!(status(&mut c, Some(&dave)).await.0, 200);
}

#[tokio::test]
async fn checks_beyond_the_bound_get_503_and_cached_logins_still_pass() {
    let backend = Backend::start("app").await;
    let dir = temp_dir();
    // A slow hash, so that one check is still running when the next request comes.
    let slow = bcrypt::hash("slow-pw", 13).unwrap();
    let fast = bcrypt::hash("alice-pw", 4).unwrap();
    write_file(
        dir.path(),
        "users.htpasswd",
        format!("slow:{slow}\nalice:{fast}\n"),
    );
    let gw = TestGateway::start_in(dir, &config(&backend, ", max_concurrent_checks: 1")).await;
    let alice = basic("alice", "alice-pw");
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(status(&mut c, Some(&alice)).await.0, 200);

    // Two wrong passwords for the slow user at once: whichever comes second finds the one
    // slot taken and gets 503 at once, while the first is still hashing.
    let addr = gw.addr("main");
    let wrong = |pw: &'static str| async move {
        let mut c = http1(addr).await;
        status(&mut c, Some(&basic("slow", pw))).await.0
    };
    let first = tokio::spawn(wrong("wrong"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        status(&mut c, Some(&alice)).await.0,
        200,
        "a cached login needs no check, so no slot"
    );
    let second = tokio::spawn(wrong("also-wrong"));
    let (first, second) = tokio::join!(first, second);
    let mut codes = [first.unwrap(), second.unwrap()];
    codes.sort_unstable();
    assert_eq!(
        codes,
        [401, 503],
        "one check ran, the other found the slot taken"
    );
    assert_eq!(
        status(&mut c, Some(&alice)).await.0,
        200,
        "a cached login needs no check"
    );
    assert_eq!(counter_value(&gw, &series("overloaded")).await, 1);
    let hashing = series("bad_password");
    assert_eq!(counter_value(&gw, &hashing).await, 1);
}

#[tokio::test]
async fn a_broken_htpasswd_file_is_a_located_error_naming_its_line() {
    let dir = temp_dir();
    let good = bcrypt::hash("pw", 4).unwrap();
    write_file(
        dir.path(),
        "users.htpasswd",
        format!("alice:{good}\nbob:{{SHA}}qUqP5cyxm6YcTAhz05Hph5gvu9M=\n"),
    );
    let backend = Backend::start("app").await;
    let err = TestGateway::try_start_in(dir, &config(&backend, ""))
        .await
        .err()
        .expect("refused");
    assert!(
        err.contains("routes[0].filters[0].basic_auth.htpasswd")
            && err.contains("users.htpasswd:2: user `bob`")
            && err.contains("SHA-1"),
        "{err}"
    );
}
