//! Entry points of the fuzz targets in `gateway/fuzz/`, shared with the unit test that replays
//! their seed corpora (`gateway/fuzz/corpus/<target>/`) on every `cargo test`, so an input that
//! once failed stays fixed. Compiled for tests and with the `fuzzing` feature only.
//!
//! * [`router`]: a lookup over a fixed route table with fuzzed method, host, path and headers
//!   gives the first route whose conditions hold, as a plain scan in file order would.
//! * [`waf_decode`]: the WAF's decoders never panic and never grow their input.
//! * [`http1_head`]: fuzzed bytes as a client connection, over an in-memory pipe, through the
//!   real connection serving, service, router, filter chain (`headers`, `waf`) and `respond`:
//!   no panic, no hang, and only HTTP/1 responses come back.
//! * [`path_normalize`] and [`host`] ([`entry`]): the entry rules for paths and `Host`.
//! * [`jwt`]: the `jwt` filter's token and key-set parsers never panic.
//! * [`cache_control`]: the `cache` filter's header parsers (`Cache-Control`, dates, `Vary`,
//!   entity tags, ranges) and the answers made from them never panic.
//! * [`cache_file`]: the cache's disk files (prelude and head), as a start-up scan or a read
//!   meets them: no panic.
//! * [`basic_auth`]: `Authorization: Basic` values and htpasswd files, as `basic_auth` reads
//!   them: no panic, and credentials that survive their own encoding.
//! * [`forwarded`]: the client a trusted proxy's `X-Forwarded-For` or `Forwarded` names.
//!
//! The HTTP/1.1 codec's own targets (request framing, response heads, chunked bodies) live
//! beside it, in `http1/fuzz/`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::connection::ConnInfo;
use crate::filter::waf::normalize;
use crate::generation::Generation;
use crate::router::{Matcher, Router, request_host};
use crate::server::conn::{ConnWatchdog, ListenerRuntime, serve_io, watch};
use crate::server::policy::ListenerPolicy;
use crate::server::service::ServiceSettings;
use crate::telemetry::{ListenerMetrics, Telemetry};

mod entry;
mod forwarded;

pub use entry::{host, path_normalize};
pub use forwarded::forwarded;

/// Routes for [`router`]: every kind of condition, on two listeners.
const ROUTES: &str = r#"
listeners:
  - { name: a, bind: "127.0.0.1:0" }
  - { name: b, bind: "127.0.0.1:0" }
routes:
  - match: { host: api.example.com, path_prefix: /v1 }
    respond: { body: r0 }
  - match: { host: "*.example.com", path: /exact, methods: [GET, HEAD] }
    respond: { body: r1 }
  - match: { path_regex: "^/items/[0-9]+$" }
    respond: { body: r2 }
  - match: { path_prefix: /app/, headers: { x-canary: "1" } }
    respond: { body: r3 }
  - listeners: [b]
    match: { path_prefix: /b, methods: [POST, PUT] }
    respond: { body: r4 }
  - listeners: [a]
    match: { path_prefix: /static }
    respond: { body: r5 }
  - match: { host: "*.Example.COM" }
    respond: { body: r6 }
"#;

struct RouteTable {
    router: Router<usize>,
    /// The same routes for the oracle: (conditions, listeners).
    plain: Vec<(Matcher, Vec<usize>)>,
}

fn route_table() -> &'static RouteTable {
    static TABLE: OnceLock<RouteTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let config = gateway_config::load_str(ROUTES, "fuzz.yaml", Path::new("."))
            .expect("the fuzz route table is valid");
        let plain: Vec<_> = config
            .routes
            .iter()
            .map(|r| (Matcher::new(r).expect("matcher"), r.listeners.clone()))
            .collect();
        let compiled = plain
            .iter()
            .enumerate()
            .map(|(i, (m, l))| (m.clone(), l.clone(), i))
            .collect();
        RouteTable {
            router: Router::new(config.listeners.len(), compiled),
            plain,
        }
    })
}

/// Input: lines of method, request target, then `name: value` headers.
pub fn router(data: &[u8]) {
    let table = route_table();
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let method = lines.next().unwrap_or("");
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return;
    };
    let target = lines.next().unwrap_or("/");
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value.trim()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let Ok(uri) = target.parse::<http::Uri>() else {
        return;
    };
    let host = request_host(&uri, &headers);
    let path = uri.path();
    for listener in 0..3 {
        let found = table
            .router
            .find(listener, &method, host, path, &headers)
            .copied();
        let expected = table
            .plain
            .iter()
            .position(|(m, on)| on.contains(&listener) && m.matches(&method, host, path, &headers));
        assert_eq!(
            found, expected,
            "listener {listener}, host {host:?}, path {path:?}"
        );
    }
}

/// Input: any bytes, decoded as a query value, a form value, a path and HTML.
pub fn waf_decode(data: &[u8]) {
    for plus in [false, true] {
        let (decoded, _) = normalize::url_decode(data, plus);
        assert!(decoded.len() <= data.len(), "url_decode grew its input");
    }
    let (path, _) = normalize::normalize_path(data);
    assert!(path.len() <= data.len(), "normalize_path grew its input");
    if let Some(html) = normalize::html_entity_decode(data) {
        assert!(
            html.len() <= data.len(),
            "html_entity_decode grew its input"
        );
    }
    let (folded, _) = normalize::fold_overlong(std::borrow::Cow::Borrowed(data));
    assert!(folded.len() <= data.len());
}

/// Fuzzed bytes as a JSON Web Token and as a key set (see
/// [`crate::filter::jwt::check_untrusted`]).
pub fn jwt(data: &[u8]) {
    crate::filter::jwt::check_untrusted(data);
}

/// Fuzzed bytes as every header the `cache` filter reads (see
/// [`crate::filter::cache::check_untrusted`]).
pub fn cache_control(data: &[u8]) {
    crate::filter::cache::check_untrusted(data);
}

/// Fuzzed bytes as a file of the cache's disk tier (see
/// [`crate::filter::cache::disk::file::check_untrusted`]).
pub fn cache_file(data: &[u8]) {
    crate::filter::cache::disk::file::check_untrusted(data);
}

/// The listener and routes for [`http1_head`]: a `headers` filter, a WAF in block mode and a
/// bare `respond`, with short timeouts so a stalled input ends quickly.
const SERVER: &str = r#"
server: { watch_config: false }
listeners:
  - name: main
    bind: "127.0.0.1:0"
    max_header_size: 8KiB
    max_body_size: 4KiB
    header_read_timeout: 1s
    body_read_timeout: 1s
    write_timeout: 1s
waf:
  strict:
    mode: block
    detect: [sqli, xss, path_traversal, scanner, protocol, command_injection]
    max_body: 1KiB
routes:
  - match: { path_prefix: /waf }
    filters: [ { waf: strict } ]
    respond: { status: 200, body: "waf ok" }
  - match: { path_prefix: /h }
    filters:
      - headers: { request_set: { x-env: fuzz }, request_remove: [cookie], response_set: { x-served-by: fuzz }, response_remove: [server] }
    respond: { status: 201, body: "headers ok", headers: { content-type: text/plain } }
  - match: { path_prefix: / }
    respond: { status: 200, body: "hello" }
"#;

struct Server {
    rt: tokio::runtime::Runtime,
    listener: Arc<ListenerRuntime>,
}

fn server() -> &'static Server {
    static SERVER_CELL: OnceLock<Server> = OnceLock::new();
    SERVER_CELL.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let config = gateway_config::load_str(SERVER, "fuzz.yaml", Path::new("."))
            .expect("the fuzz server config is valid");
        let config = Arc::new(config);
        let telemetry = Telemetry::new();
        let generation = rt
            .block_on(async { Generation::build(config.clone(), &telemetry) })
            .expect("generation");
        let l = &config.listeners[0];
        let listener = Arc::new(ListenerRuntime {
            name: Arc::from(l.name.as_str()),
            tls: None,
            http1: l.http1,
            http2: l.http2,
            builder: ListenerRuntime::hyper_builder(&l.settings),
            h1_builder: ListenerRuntime::http1_builder(&l.settings),
            http1_fast_path: l.settings.http1_fast_path,
            fast_path: ListenerRuntime::fast_path_listener(
                &telemetry.registry,
                &l.name,
                None,
                None,
            ),
            max_head: ListenerRuntime::max_head(&l.settings),
            idle_timeout: l.settings.idle_timeout.get(),
            header_timeout: l.settings.header_read_timeout.get(),
            write_timeout: l.settings.write_timeout.get(),
            accept_proxy_protocol: false,
            metrics: ListenerMetrics::new(&telemetry.registry, &l.name),
            service: Arc::new(ServiceSettings {
                generation: Arc::new(ArcSwap::from_pointee(generation)),
                policy: Arc::new(ListenerPolicy::new(l, &telemetry.registry)),
                body_read_timeout: Some(l.settings.body_read_timeout.get()),
                telemetry,
                alt_svc: None,
                http01: None,
            }),
        });
        Server { rt, listener }
    })
}

/// The fuzz targets' runtime and plain listener (HTTP/1.1 and h2c, a `respond` route), for unit
/// tests that need a listener's settings.
#[cfg(test)]
pub(crate) fn test_listener() -> (&'static tokio::runtime::Runtime, Arc<ListenerRuntime>) {
    let s = server();
    (&s.rt, s.listener.clone())
}

/// Scheduler turns the server gets before the client's EOF.
const SERVER_TURNS: usize = 64;

/// How long one input may keep its connection busy once all of it has been sent. Everything
/// the routes do is immediate, so only a hang reaches it.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);

/// Input: the bytes a client sends on one cleartext connection (then it half-closes).
pub fn http1_head(data: &[u8]) {
    let s = server();
    let listener = s.listener.clone();
    s.rt.block_on(async move {
        let (client, server_side) = tokio::io::duplex(64 * 1024);
        let addr = SocketAddr::from(([127, 0, 0, 1], 40000));
        let info = ConnInfo::new(
            addr,
            SocketAddr::from(([127, 0, 0, 1], 8080)),
            listener.name.clone(),
            false,
            None,
        );
        let watch = watch(&ConnWatchdog::start(CancellationToken::new()), &listener);
        let served = tokio::spawn(serve_io(listener, server_side, info, watch));
        let (mut read, mut write) = tokio::io::split(client);
        let send = async {
            // The server may close early (a bad head): a failed write is an answer too.
            let _ = write.write_all(data).await;
            // hyper closes an HTTP/1 connection at the client's EOF without answering what it
            // has not answered yet; let the server run (one thread, all in memory) first.
            for _ in 0..SERVER_TURNS {
                tokio::task::yield_now().await;
            }
            let _ = write.shutdown().await;
        };
        let receive = async {
            let mut out = Vec::new();
            let _ = read.read_to_end(&mut out).await;
            out
        };
        let exchange = async { tokio::join!(send, receive).1 };
        let out = tokio::time::timeout(CONNECTION_DEADLINE, exchange)
            .await
            .expect("the connection ended after the client's input");
        // Everything a cleartext HTTP/1 connection sends is HTTP/1 responses; HTTP/2 (after the
        // preface) is binary framing.
        if !out.is_empty() && !data.starts_with(b"PRI * HTTP/2.0") {
            // An HTTP/1.0 request is answered in HTTP/1.0.
            assert!(
                out.starts_with(b"HTTP/1.1 ") || out.starts_with(b"HTTP/1.0 "),
                "not an HTTP/1 response: {:?}",
                String::from_utf8_lossy(&out[..out.len().min(200)])
            );
        }
        tokio::time::timeout(CONNECTION_DEADLINE, served)
            .await
            .expect("the connection task ended")
            .expect("the connection task did not panic");
    });
}

/// `Authorization` values and htpasswd files (see `crate::filter::basic_auth::fuzz`).
pub fn basic_auth(data: &[u8]) {
    crate::filter::basic_auth::fuzz(data);
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no seed inputs in {}", dir.display());
        files
            .into_iter()
            .map(|p| {
                let bytes = std::fs::read(&p).expect("read");
                (p, bytes)
            })
            .collect()
    }

    #[test]
    fn router_corpus_replays() {
        for (_, input) in corpus("router") {
            super::router(&input);
        }
    }

    #[test]
    fn waf_decode_corpus_replays() {
        for (_, input) in corpus("waf_decode") {
            super::waf_decode(&input);
        }
    }

    #[test]
    fn http1_head_corpus_replays() {
        for (_, input) in corpus("http1_head") {
            super::http1_head(&input);
        }
    }

    /// Replays every seed of `target` through `check`, naming the seed that fails.
    fn replay(target: &str, check: fn(&[u8])) {
        for (path, input) in corpus(target) {
            let outcome = std::panic::catch_unwind(|| check(&input));
            assert!(outcome.is_ok(), "{target}: {} failed", path.display());
        }
    }

    #[test]
    fn path_normalize_corpus_replays() {
        replay("path_normalize", super::path_normalize);
    }

    #[test]
    fn host_corpus_replays() {
        replay("host", super::host);
    }

    #[test]
    fn jwt_corpus_replays() {
        replay("jwt", super::jwt);
    }

    #[test]
    fn cache_control_corpus_replays() {
        replay("cache_control", super::cache_control);
    }

    #[test]
    fn cache_file_corpus_replays() {
        replay("cache_file", super::cache_file);
    }

    #[test]
    fn basic_auth_corpus_replays() {
        replay("basic_auth", super::basic_auth);
    }

    #[test]
    fn forwarded_corpus_replays() {
        replay("forwarded", super::forwarded);
    }
}
