//! The native `basic_auth` filter: HTTP Basic authentication (RFC 7617) against an htpasswd
//! file of bcrypt or SHA-crypt entries ([`htpasswd`]).
//!
//! Password hashes are slow on purpose, so a check runs on Tokio's blocking pool, never on an
//! async worker, and at most `max_concurrent_checks` run at once: beyond that the request gets
//! 503 at once, so a flood of wrong passwords costs a bounded share of the CPU and cannot queue
//! up work without end. A successful check is remembered for `cache` under a keyed SHA-256 of
//! the user and password (the key is random per file version, so the table never holds
//! anything a password could be recovered from), as Caddy does, so a logged-in user's next
//! requests cost a hash lookup, not a bcrypt run.
//!
//! An unknown user's password is checked against a real hash of the file all the same (and
//! refused), so the answer's timing does not tell which users exist.
//!
//! The file is watched ([`crate::file_watch`], as plugin files are) and reloaded off the
//! request path; a version that does not parse is logged and counted, and the last good one
//! keeps serving. A new version starts with an empty cache, so a removed user or a changed
//! password takes effect at once.

mod htpasswd;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use base64::Engine as _;
use http::header::{AUTHORIZATION, HeaderName, HeaderValue, WWW_AUTHENTICATE};
use http::{HeaderMap, Response, StatusCode, request, response};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use self::htpasswd::Htpasswd;
use super::{FilterFactory, Flow, HttpFilter};
use crate::body::{Body, BoxError};
use crate::context::RequestCx;
use crate::error::error_response;
use crate::telemetry::LogNotes;
use crate::telemetry::{Counter, Registry};
use gateway_config::model::BasicAuthConfig;

/// Remembered logins per file version; past it, expired ones are dropped, then all.
const CACHE_ENTRIES: usize = 4096;
/// Longer `Authorization` values are refused before they are decoded.
const MAX_CREDENTIALS: usize = 4096;

/// Why a request was let in or not: the `result` label of the requests counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Missing,
    Malformed,
    UnknownUser,
    BadPassword,
    Overloaded,
}

impl Outcome {
    const ALL: [Self; 6] = [
        Self::Ok,
        Self::Missing,
        Self::Malformed,
        Self::UnknownUser,
        Self::BadPassword,
        Self::Overloaded,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::UnknownUser => "unknown_user",
            Self::BadPassword => "bad_password",
            Self::Overloaded => "overloaded",
        }
    }
}

/// Remembered logins: a keyed hash of `user:password` → the user and when it expires.
type Logins = HashMap<[u8; 32], (Arc<str>, Instant)>;

/// One version of the file, with the logins checked against it.
struct Users {
    file: Htpasswd,
    /// The logins that passed.
    cache: Mutex<Logins>,
    /// The key of those hashes.
    key: [u8; 32],
}

impl Users {
    fn new(file: Htpasswd) -> Self {
        Self {
            file,
            cache: Mutex::default(),
            key: rand::random(),
        }
    }

    fn cache_key(&self, user: &str, password: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update((user.len() as u64).to_le_bytes());
        h.update(user.as_bytes());
        h.update(password);
        h.finalize().into()
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Arc<str>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (user, until) = cache.get(key)?;
        (Instant::now() < *until).then(|| user.clone())
    }

    fn remember(&self, key: [u8; 32], user: Arc<str>, ttl: Duration) {
        let now = Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.retain(|_, (_, until)| *until > now);
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(key, (user, now + ttl));
    }
}

/// The route's settings and the file's current version, shared by its requests and watcher.
struct Shared {
    path: PathBuf,
    users: ArcSwap<Users>,
    challenge: HeaderValue,
    forward_authorization: bool,
    user_header: Option<HeaderName>,
    cache_ttl: Duration,
    checks: Arc<Semaphore>,
    counters: [Counter; 6],
    reloaded: Counter,
    rejected: Counter,
}

impl Shared {
    fn count(&self, outcome: Outcome) {
        self.counters[outcome as usize].inc();
    }

    /// The 401 answer, with the challenge.
    fn refuse(&self, outcome: Outcome) -> Flow {
        self.count(outcome);
        let mut res = error_response(StatusCode::UNAUTHORIZED);
        res.headers_mut()
            .insert(WWW_AUTHENTICATE, self.challenge.clone());
        LogNotes::on(res.extensions_mut()).auth = Some(("basic_auth", outcome.label()));
        Flow::Respond(res)
    }

    fn overloaded(&self) -> Flow {
        self.count(Outcome::Overloaded);
        let mut res: Response<Body> = error_response(StatusCode::SERVICE_UNAVAILABLE);
        res.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        LogNotes::on(res.extensions_mut()).auth = Some(("basic_auth", Outcome::Overloaded.label()));
        Flow::Respond(res)
    }

    /// Lets the request on as `user`.
    fn admit(&self, req: &mut request::Parts, cx: &mut RequestCx, user: Arc<str>) -> Flow {
        self.count(Outcome::Ok);
        if !self.forward_authorization {
            req.headers.remove(AUTHORIZATION);
        }
        if let Some(name) = &self.user_header {
            req.headers.remove(name);
            // `from_bytes`: a UTF-8 name beyond ASCII is a valid field value (obs-text).
            if let Ok(v) = HeaderValue::from_bytes(user.as_bytes()) {
                req.headers.insert(name.clone(), v);
            }
        }
        cx.user = Some(user);
        Flow::Continue
    }

    /// Decides without hashing when it can: no or malformed credentials, or a cached login.
    /// `Err` carries the credentials to check.
    fn decide_now(
        &self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, (Arc<Users>, Credentials)> {
        let creds = match credentials(&req.headers) {
            Ok(c) => c,
            Err(outcome) => return Ok(self.refuse(outcome)),
        };
        let users = self.users.load_full();
        if !self.cache_ttl.is_zero()
            && let Some(user) = users.cached(&users.cache_key(&creds.user, &creds.password))
        {
            return Ok(self.admit(req, cx, user));
        }
        Err((users, creds))
    }

    /// Starts watching the file (inside a Tokio runtime; a no-op outside one). The task ends
    /// when the generation holding the filter is dropped.
    fn watch(self: &Arc<Self>) {
        crate::file_watch::watch(self, self.path.clone(), |shared| async move {
            let path = shared.path.clone();
            let Ok(loaded) =
                tokio::task::spawn_blocking(move || Htpasswd::load(&path, &path)).await
            else {
                return;
            };
            match loaded {
                Ok(file) => {
                    tracing::info!(file = %shared.path.display(), users = file.len(), "htpasswd file reloaded");
                    shared.users.store(Arc::new(Users::new(file)));
                    shared.reloaded.inc();
                }
                Err(e) => {
                    tracing::error!(error = %e, "htpasswd file rejected; the previous version keeps serving");
                    shared.rejected.inc();
                }
            }
        });
    }
}

/// A user name and password from an `Authorization: Basic` field.
struct Credentials {
    user: String,
    password: Vec<u8>,
}

/// Reads the credentials of a request: [`Outcome::Missing`] without a Basic `Authorization`
/// field, [`Outcome::Malformed`] for one that does not decode to UTF-8 `user:password` (or
/// for several fields).
fn credentials(headers: &HeaderMap) -> Result<Credentials, Outcome> {
    let mut fields = headers.get_all(AUTHORIZATION).iter();
    let Some(value) = fields.next() else {
        return Err(Outcome::Missing);
    };
    if fields.next().is_some() {
        return Err(Outcome::Malformed);
    }
    let value = value.as_bytes();
    let scheme_end = value.iter().position(|b| *b == b' ').unwrap_or(value.len());
    if !value[..scheme_end].eq_ignore_ascii_case(b"basic") {
        return Err(Outcome::Missing);
    }
    let encoded = value[scheme_end..].trim_ascii();
    if encoded.is_empty() || encoded.len() > MAX_CREDENTIALS {
        return Err(Outcome::Malformed);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| Outcome::Malformed)?;
    let text = String::from_utf8(decoded).map_err(|_| Outcome::Malformed)?;
    let (user, password) = text.split_once(':').ok_or(Outcome::Malformed)?;
    if user.is_empty() || user.contains(char::is_control) {
        return Err(Outcome::Malformed);
    }
    Ok(Credentials {
        user: user.to_owned(),
        password: password.as_bytes().to_vec(),
    })
}

/// Factory of the `basic_auth` filter for one route.
pub struct BasicAuthFilterFactory {
    shared: Arc<Shared>,
}

impl BasicAuthFilterFactory {
    /// Reads the htpasswd file and prepares the answers; an error names the file (as
    /// `shown`) and its line.
    pub fn new(
        route: &str,
        cfg: &BasicAuthConfig,
        shown: &std::path::Path,
        registry: &Registry,
    ) -> Result<Self, String> {
        let file = Htpasswd::load(&cfg.htpasswd, shown)?;
        let challenge =
            HeaderValue::from_str(&format!("Basic realm=\"{}\", charset=\"UTF-8\"", cfg.realm))
                .map_err(|e| format!("realm: {e}"))?;
        let user_header = cfg
            .user_header
            .as_deref()
            .map(|h| HeaderName::from_bytes(h.as_bytes()).map_err(|e| format!("user_header: {e}")))
            .transpose()?;
        let checks = cfg.max_concurrent_checks.unwrap_or_else(|| {
            2 * std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        });
        let counters = Outcome::ALL.map(|o| {
            registry.counter(
                "gateway_basic_auth_requests_total",
                "Requests checked by basic_auth filters, by result.",
                &[("route", route), ("result", o.label())],
            )
        });
        let reloads = |result| {
            registry.counter(
                "gateway_basic_auth_file_reloads_total",
                "htpasswd file changes seen by basic_auth filters, by result.",
                &[("route", route), ("result", result)],
            )
        };
        Ok(Self {
            shared: Arc::new(Shared {
                path: cfg.htpasswd.clone(),
                users: ArcSwap::from_pointee(Users::new(file)),
                challenge,
                forward_authorization: cfg.forward_authorization,
                user_header,
                cache_ttl: cfg.cache.get(),
                checks: Arc::new(Semaphore::new(checks)),
                counters,
                reloaded: reloads("ok"),
                rejected: reloads("error"),
            }),
        })
    }

    /// Starts watching the htpasswd file (only when serving).
    pub fn watch(&self) {
        self.shared.watch();
    }
}

impl FilterFactory for BasicAuthFilterFactory {
    fn name(&self) -> &'static str {
        "basic_auth"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(BasicAuthFilter {
            shared: self.shared.clone(),
        })
    }

    fn after_response(&self) -> bool {
        false
    }
}

struct BasicAuthFilter {
    shared: Arc<Shared>,
}

#[async_trait::async_trait]
impl HttpFilter for BasicAuthFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        self.shared.decide_now(req, cx).ok().map(Ok)
    }

    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        if let Some(user) = &cx.user {
            LogNotes::on(&mut res.extensions).user = Some(user.clone());
        }
        Some(Ok(Flow::Continue))
    }

    async fn on_request_headers(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        let shared = &self.shared;
        let (users, creds) = match shared.decide_now(req, cx) {
            Ok(flow) => return Ok(flow),
            Err(pending) => pending,
        };
        let Ok(permit) = shared.checks.clone().try_acquire_owned() else {
            return Ok(shared.overloaded());
        };
        let checked = users.clone();
        let Credentials { user, password } = creds;
        let (user, password, ok, known) = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let (hash, known) = checked.file.lookup(&user);
            let ok = hash.is_some_and(|h| h.verify(&password));
            (user, password, ok, known)
        })
        .await?;
        match (known, ok) {
            (true, true) => {
                let user: Arc<str> = Arc::from(user);
                if !shared.cache_ttl.is_zero() {
                    let key = users.cache_key(&user, &password);
                    users.remember(key, user.clone(), shared.cache_ttl);
                }
                Ok(shared.admit(req, cx, user))
            }
            (true, false) => Ok(shared.refuse(Outcome::BadPassword)),
            (false, _) => Ok(shared.refuse(Outcome::UnknownUser)),
        }
    }
}

/// The fuzz check (`gateway::fuzzing::basic_auth`): the first byte picks the input. Odd: the
/// rest is an `Authorization` value, and credentials read from it have a non-empty user
/// without control characters and come back from their own encoding. Even: the rest is an
/// htpasswd file, which parses or names a line it has, without panicking.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn fuzz(data: &[u8]) {
    let [control, rest @ ..] = data else {
        return;
    };
    if control & 1 == 1 {
        let Ok(value) = HeaderValue::from_bytes(rest) else {
            return;
        };
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, value);
        if let Ok(c) = credentials(&headers) {
            assert!(!c.user.is_empty() && !c.user.contains(char::is_control));
            let mut raw = c.user.clone().into_bytes();
            raw.push(b':');
            raw.extend(&c.password);
            let again = base64::engine::general_purpose::STANDARD.encode(&raw);
            let mut headers = HeaderMap::new();
            let Ok(v) = HeaderValue::from_str(&format!("Basic {again}")) else {
                panic!("a re-encoded credential is not a field value");
            };
            headers.insert(AUTHORIZATION, v);
            let back = credentials(&headers).expect("re-encoded credentials read");
            assert_eq!((back.user, back.password), (c.user, c.password));
        }
    } else if let Ok(text) = std::str::from_utf8(rest)
        && let Err((line, _)) = Htpasswd::parse(text)
    {
        assert!(line >= 1 && line <= text.lines().count(), "line {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(AUTHORIZATION, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    fn basic(raw: &[u8]) -> Vec<u8> {
        let mut v = b"Basic ".to_vec();
        v.extend(
            base64::engine::general_purpose::STANDARD
                .encode(raw)
                .bytes(),
        );
        v
    }

    #[test]
    fn credentials_decode() {
        let c = credentials(&headers(&[&basic(b"alice:p:w")])).unwrap();
        assert_eq!((c.user.as_str(), &c.password[..]), ("alice", &b"p:w"[..]));
        let c = credentials(&headers(&[b"bAsIc   YjpjYw=="])).unwrap();
        assert_eq!((c.user.as_str(), &c.password[..]), ("b", &b"cc"[..]));
        let c = credentials(&headers(&[&basic("żółw:hasło".as_bytes())])).unwrap();
        assert_eq!(c.user, "żółw");
    }

    #[test]
    fn hostile_headers_are_refused_without_panic() {
        let long = [b"Basic ".as_slice(), &[b'A'; MAX_CREDENTIALS + 4]].concat();
        let cases: [(&[&[u8]], Outcome); 10] = [
            (&[], Outcome::Missing),
            (&[b"Bearer abc"], Outcome::Missing),
            (&[b"Basic"], Outcome::Malformed),
            (&[b"Basic !!!not-base64"], Outcome::Malformed),
            (&[b"Basic YWxpY2U="], Outcome::Malformed), // "alice", no colon
            (&[&basic(b"\xff\xfe:pw")], Outcome::Malformed),
            (&[&basic(b"user:\xff")], Outcome::Malformed),
            (&[&basic(b":pw")], Outcome::Malformed),
            (&[&basic(b"a:b"), &basic(b"a:b")], Outcome::Malformed),
            (&[&long], Outcome::Malformed),
        ];
        for (values, expected) in cases {
            assert_eq!(
                credentials(&headers(values)).err(),
                Some(expected),
                "{values:?}"
            );
        }
    }

    #[test]
    fn cache_keys_depend_on_user_password_and_file_version() {
        let a = Users::new(Htpasswd::default());
        let b = Users::new(Htpasswd::default());
        assert_ne!(a.cache_key("ab", b"c"), a.cache_key("a", b"bc"));
        assert_ne!(a.cache_key("a", b"b"), b.cache_key("a", b"b"));
        let key = a.cache_key("a", b"b");
        a.remember(key, Arc::from("a"), Duration::from_secs(60));
        assert_eq!(a.cached(&key).as_deref(), Some("a"));
        a.remember(key, Arc::from("a"), Duration::ZERO);
        assert!(a.cached(&key).is_none());
    }
}
