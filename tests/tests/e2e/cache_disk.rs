//! The cache's disk tier end to end, in front of a real backend that counts its requests:
//! objects pushed out of a tiny memory tier, or too large for it, served from their files (the
//! backend asked once: ranges, HEAD, conditions, HTTP/2 and 20 coalesced misses included); a
//! stale one revalidated with a 304 keeping its body; a restart of the gateway binary after it
//! was killed keeping the objects, with a file cut short found and removed; the directory
//! staying within `size` (plus one object); purge and invalidation removing the files; a
//! reload keeping the tier or moving it; a directory that becomes unwritable costing the store
//! only; one that cannot be made stopping `validate` and the start with a located error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::{
    Running, TestGateway, TestResponse, admin_request, binary_config, counter_value,
    gateway_binary, http1, http2c, temp_dir, write_file,
};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// Requests the backend got, by method and path.
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<HashMap<String, usize>>>);

impl Counts {
    fn get(&self, path: &str) -> usize {
        self.0.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

/// The body of object `path` of `size` bytes: its path repeated, so that a byte out of place
/// shows.
fn body_of(path: &str, size: usize) -> Vec<u8> {
    path.bytes().cycle().take(size).collect()
}

/// A backend answering `GET /o/NAME?size=N` with an `N`-byte body (2000 by default), fresh for
/// ten minutes, and `304` to its `ETag`; other methods with 204.
async fn backend() -> (SocketAddr, Counts) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Counts::default();
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let c = c.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let c = c.clone();
                    async move { Ok::<_, std::io::Error>(answer(&req, &c)) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
            });
        }
    });
    (addr, counts)
}

fn answer(req: &Request<Incoming>, counts: &Counts) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let key = match req.method().as_str() {
        "GET" => path.clone(),
        m => format!("{m} {path}"),
    };
    *counts.0.lock().unwrap().entry(key).or_default() += 1;
    if req.method() != "GET" {
        return Response::builder()
            .status(204)
            .body(Full::default())
            .unwrap();
    }
    let size = req
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("size="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let etag = format!("\"{path}\"");
    // `/o/stale/...` is stale at once: each request revalidates it.
    let cc = if path.starts_with("/o/stale/") {
        "max-age=0"
    } else {
        "max-age=600"
    };
    let r = Response::builder()
        .header("cache-control", cc)
        .header("etag", &etag);
    if req
        .headers()
        .get("if-none-match")
        .is_some_and(|v| *v == *etag)
    {
        return r.status(304).body(Full::default()).unwrap();
    }
    r.body(Full::new(Bytes::from(body_of(&path, size))))
        .unwrap()
}

fn config(backend: SocketAddr, memory: &str, disk: &str) -> String {
    crate::cors::with_app(
        backend,
        &format!(
            r#"caches:
  main: {{ memory: {memory}, disk: {disk} }}
routes:
  - match: {{ path_prefix: /o/ }}
    filters:
      - cache: {{ store: main, max_object_size: 1MiB }}
    proxy: {{ upstream: app }}
"#
        ),
    )
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> TestResponse {
    send(addr, "GET", path, headers).await
}

async fn send(addr: SocketAddr, method: &str, path: &str, h: &[(&str, &str)]) -> TestResponse {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in h {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::new())).unwrap();
    http1(addr).await.send(req).await.expect("request")
}

/// The cache's files (two directory levels down).
fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let entries = |p: &Path| {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect::<Vec<_>>()
    };
    for a in entries(root).into_iter().filter(|p| p.is_dir()) {
        for b in entries(&a).into_iter().filter(|p| p.is_dir()) {
            out.extend(entries(&b));
        }
    }
    out.sort();
    out
}

fn bytes_on_disk(root: &Path) -> u64 {
    files(root)
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}

/// Polls `value` (a metric or a file count: the disk is written by a thread of its own) until
/// `done` says so; its last value.
async fn until<F: std::future::Future<Output = u64>>(
    what: &str,
    mut value: impl FnMut() -> F,
    done: impl Fn(u64) -> bool,
) -> u64 {
    let mut last = 0;
    for _ in 0..1000 {
        last = value().await;
        if done(last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: still {last} after 10 s");
}

const DISK_WRITES: &str = "gateway_cache_writes_total{cache=\"main\",tier=\"disk\"}";

fn is_hit(r: &TestResponse) -> bool {
    r.header("cache-status").starts_with("gateway; hit")
}

#[tokio::test]
async fn objects_pushed_out_of_memory_or_too_large_for_it_are_served_from_disk() {
    let (backend, counts) = backend().await;
    let gw = TestGateway::start(&config(backend, "4KiB", "{ path: cache, size: 1MiB }")).await;
    let (addr, root) = (gw.addr("main"), gw.dir().join("cache"));
    for p in ["/o/a", "/o/b", "/o/c"] {
        let r = get(addr, p, &[]).await;
        assert_eq!(r.header("cache-status"), "gateway; fwd=miss; stored");
    }
    until("3 files", || counter_value(&gw, DISK_WRITES), |n| n == 3).await;
    let memory = "gateway_cache_objects{cache=\"main\",tier=\"memory\"}";
    assert_eq!(counter_value(&gw, memory).await, 1, "4 KiB hold one object");

    // /o/a left memory: from its file, then from memory again (promoted).
    let a = get(addr, "/o/a", &[]).await;
    assert!(is_hit(&a), "{:?}", a.head);
    assert_eq!(a.body, body_of("/o/a", 2000));
    let hits = |tier: &str| format!("gateway_cache_hits_total{{cache=\"main\",tier=\"{tier}\"}}");
    assert_eq!(counter_value(&gw, &hits("disk")).await, 1);
    assert!(is_hit(&get(addr, "/o/a", &[]).await));
    assert_eq!(counter_value(&gw, &hits("memory")).await, 1);
    let h2 = http2c(addr).await.get("/o/b").await;
    assert!(is_hit(&h2) && h2.body == body_of("/o/b", 2000));
    assert_eq!(counts.get("/o/a") + counts.get("/o/b"), 2);

    // Larger than the whole memory tier: stored on disk only, and streamed from its file.
    let big = "/o/big?size=300000";
    let first = get(addr, big, &[]).await;
    assert_eq!(first.header("cache-status"), "gateway; fwd=miss; stored");
    until(
        "the big file",
        || counter_value(&gw, DISK_WRITES),
        |n| n == 4,
    )
    .await;
    let again = get(addr, big, &[]).await;
    assert!(is_hit(&again), "{:?}", again.head);
    assert_eq!(again.header("content-length"), "300000");
    assert!(again.body == body_of("/o/big", 300_000));
    let part = get(addr, big, &[("range", "bytes=100000-100099")]).await;
    assert_eq!(part.status(), 206);
    assert_eq!(part.body, body_of("/o/big", 100_100)[100_000..]);
    let head = send(addr, "HEAD", big, &[]).await;
    assert_eq!((head.status(), head.body.len()), (200, 0));
    assert_eq!(head.header("content-length"), "300000");
    let cond = get(addr, big, &[("if-none-match", "\"/o/big\"")]).await;
    assert_eq!((cond.status(), cond.body.len()), (304, 0));
    assert_eq!(counts.get("/o/big"), 1);

    // Concurrent misses of an object going to disk only: one request upstream, the others
    // wait until its file can be read.
    let many =
        (0..20).map(|_| tokio::spawn(async move { get(addr, "/o/many?size=500000", &[]).await }));
    for r in futures_util::future::join_all(many).await {
        assert!(r.unwrap().body == body_of("/o/many", 500_000));
    }
    assert_eq!(counts.get("/o/many"), 1);

    // An unsafe method removes the URL's file too.
    let before = files(&root).len();
    assert_eq!(send(addr, "DELETE", "/o/c", &[]).await.status(), 204);
    let left = until(
        "the file removed",
        || async { files(&root).len() as u64 },
        |n| n + 1 == before as u64,
    )
    .await;
    assert_eq!(left, 4);
    get(addr, "/o/c", &[]).await;
    assert_eq!(counts.get("/o/c"), 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_stale_object_on_disk_only_is_revalidated_and_keeps_its_body() {
    let (backend, counts) = backend().await;
    let gw = TestGateway::start(&config(backend, "4KiB", "{ path: cache, size: 1MiB }")).await;
    let addr = gw.addr("main");
    let path = "/o/stale/x?size=200000";
    let body = body_of("/o/stale/x", 200_000);
    assert_eq!(
        get(addr, path, &[]).await.header("cache-status"),
        "gateway; fwd=miss; stored"
    );
    until("the file", || counter_value(&gw, DISK_WRITES), |n| n == 1).await;
    for written in [2, 3] {
        let r = get(addr, path, &[]).await;
        assert_eq!(
            r.header("cache-status"),
            "gateway; fwd=stale; fwd-status=304"
        );
        assert!(r.body == body, "the body from the file");
        // The refreshed head is written over the same body, copied from the old file.
        until(
            "the refreshed file",
            || counter_value(&gw, DISK_WRITES),
            |n| n == written,
        )
        .await;
    }
    assert_eq!(counts.get("/o/stale/x"), 3);
    let failed = "gateway_cache_write_failures_total{cache=\"main\",tier=\"disk\",reason=\"io\"}";
    assert_eq!(counter_value(&gw, failed).await, 0);
    gw.shutdown().await;
}

#[tokio::test]
async fn the_directory_stays_within_its_size_and_purge_empties_it() {
    let (backend, counts) = backend().await;
    let size = 16 * 1024;
    let gw = TestGateway::start(&config(backend, "4KiB", "{ path: cache, size: 16KiB }")).await;
    let (addr, root) = (gw.addr("main"), gw.dir().join("cache"));
    for i in 0..20 {
        get(addr, &format!("/o/{i}"), &[]).await;
    }
    until("20 writes", || counter_value(&gw, DISK_WRITES), |n| n == 20).await;
    let on_disk = bytes_on_disk(&root);
    let one = 2000 + 200;
    assert!(on_disk <= size + one, "{on_disk} bytes in the directory");
    let evicted = "gateway_cache_evictions_total{cache=\"main\",tier=\"disk\"}";
    assert!(counter_value(&gw, evicted).await >= 10);
    let counted = "gateway_cache_bytes{cache=\"main\",tier=\"disk\"}";
    assert_eq!(counter_value(&gw, counted).await, on_disk);
    // The last ones are kept: from disk, the backend not asked again.
    assert!(is_hit(&get(addr, "/o/18", &[]).await));
    assert_eq!(counts.get("/o/18"), 1);

    let objects = files(&root).len();
    assert!(objects >= 5, "{objects} files");
    let (status, said) = admin_request(&gw, "POST", "/cache/main/purge?path=/o/18", "").await;
    assert_eq!((status, said.as_str()), (200, "purged 1 object(s)\n"));
    let (_, said) = admin_request(&gw, "POST", "/cache/main/purge?prefix=/o/", "").await;
    assert_eq!(said, format!("purged {} object(s)\n", objects - 1));
    until(
        "no files",
        || async { files(&root).len() as u64 },
        |n| n == 0,
    )
    .await;
    get(addr, "/o/19", &[]).await;
    assert_eq!(counts.get("/o/19"), 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn an_unwritable_directory_still_answers_and_an_impossible_one_stops_the_start() {
    let (backend, counts) = backend().await;
    let gw = TestGateway::start(&config(backend, "1MiB", "{ path: cache, size: 1MiB }")).await;
    let (addr, root) = (gw.addr("main"), gw.dir().join("cache"));
    // The directory replaced by a file: every write fails, whoever the gateway runs as.
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::write(&root, b"in the way").unwrap();
    let r = get(addr, "/o/x", &[]).await;
    assert_eq!((r.status(), r.body.len()), (200, 2000));
    assert_eq!(r.header("cache-status"), "gateway; fwd=miss; stored");
    let failed = "gateway_cache_write_failures_total{cache=\"main\",tier=\"disk\",reason=\"io\"}";
    until("a failed write", || counter_value(&gw, failed), |n| n == 1).await;
    assert!(is_hit(&get(addr, "/o/x", &[]).await), "from memory");
    assert_eq!(counts.get("/o/x"), 1);
    gw.shutdown().await;

    let dir = temp_dir();
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let yaml = config(backend, "1MiB", "{ path: file/sub, size: 1MiB }");
    let cfg = write_file(dir.path(), "check.yaml", &yaml);
    let out = Command::new(gateway_binary())
        .args(["validate", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("caches.main.disk.path") && said.contains("is not a directory"),
        "{said}"
    );
    let err = TestGateway::try_start_in(dir, &yaml)
        .await
        .err()
        .expect("refused");
    assert!(err.contains("caches.main.disk.path"), "{err}");
    assert!(
        err.contains("cannot use") && err.contains("file/sub"),
        "{err}"
    );
}

#[tokio::test]
async fn a_reload_keeps_the_tier_on_its_directory_and_applies_a_new_size_or_path() {
    let (backend, counts) = backend().await;
    let gw = TestGateway::start(&config(backend, "4KiB", "{ path: cache, size: 1MiB }")).await;
    let (addr, root) = (gw.addr("main"), gw.dir().join("cache"));
    for i in 0..8 {
        get(addr, &format!("/o/{i}"), &[]).await;
    }
    until("8 writes", || counter_value(&gw, DISK_WRITES), |n| n == 8).await;

    // A smaller size on the same directory: the same tier, evicting down to it.
    let yaml = config(backend, "4KiB", "{ path: cache, size: 5KiB }");
    std::fs::write(gw.dir().join("gateway.yaml"), &yaml).unwrap();
    assert_eq!(admin_request(&gw, "POST", "/reload", "").await.0, 200);
    until(
        "the new bound",
        || async { bytes_on_disk(&root) },
        |n| n <= 5 * 1024,
    )
    .await;
    assert!(is_hit(&get(addr, "/o/7", &[]).await));
    assert_eq!(counts.get("/o/7"), 1, "kept across the reload");

    // Another directory: a new tier there, the old files left as they are.
    let yaml = config(backend, "4KiB", "{ path: other, size: 1MiB }");
    std::fs::write(gw.dir().join("gateway.yaml"), &yaml).unwrap();
    assert_eq!(admin_request(&gw, "POST", "/reload", "").await.0, 200);
    let left = files(&root).len();
    assert!(left >= 1);
    get(addr, "/o/6", &[]).await;
    let other = gw.dir().join("other");
    until(
        "a file in the new directory",
        || async { files(&other).len() as u64 },
        |n| n == 1,
    )
    .await;
    assert_eq!(files(&root).len(), left);
    gw.shutdown().await;
}

async fn run(cfg: &Path, port: u16) -> Running {
    let child = Command::new(gateway_binary())
        .args(["run", "--config"])
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let running = Running(child);
    for _ in 0..2000 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return running;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the gateway did not listen within 20 s");
}

/// One series of the binary's `/metrics` (0 when absent, or while the admin API is not up yet).
async fn metric(admin: u16, series: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr: SocketAddr = ([127, 0, 0, 1], admin).into();
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let head = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    if tcp.write_all(head.as_bytes()).await.is_err() || tcp.read_to_string(&mut out).await.is_err()
    {
        return 0;
    }
    out.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_killed_gateway_restarts_with_its_disk_tier_and_drops_a_file_cut_short() {
    let (backend, counts) = backend().await;
    let dir = temp_dir();
    let admin = gateway_tests::ports::reserved_port();
    let (port, cfg) = binary_config(dir.path(), |port| {
        format!(
            r#"admin: {{ bind: 127.0.0.1:{admin} }}
server: {{ watch_config: false }}
listeners:
  - name: main
    bind: 127.0.0.1:{port}
upstreams:
  app: {{ targets: [{backend}] }}
caches:
  main: {{ memory: 1MiB, disk: {{ path: cache, size: 1MiB }} }}
routes:
  - match: {{ path_prefix: /o/ }}
    filters: [ {{ cache: {{ store: main }} }} ]
    proxy: {{ upstream: app }}
"#
        )
    });
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let root = dir.path().join("cache");

    let first = run(&cfg, port).await;
    for p in ["/o/keep", "/o/cut"] {
        assert_eq!(get(addr, p, &[]).await.status(), 200);
    }
    until("2 files", || metric(admin, DISK_WRITES), |n| n == 2).await;
    drop(first);

    let cut = files(&root)
        .into_iter()
        .find(|f| {
            let b = std::fs::read(f).unwrap();
            b.windows(6).any(|w| w == b"/o/cut")
        })
        .expect("the file of /o/cut");
    let len = std::fs::metadata(&cut).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .unwrap()
        .set_len(len - 10)
        .unwrap();

    let _second = run(&cfg, port).await;
    let rejected = "gateway_cache_disk_rejected_total{cache=\"main\"}";
    until("the scan", || metric(admin, rejected), |n| n == 1).await;
    let objects = "gateway_cache_objects{cache=\"main\",tier=\"disk\"}";
    until("/o/keep indexed", || metric(admin, objects), |n| n == 1).await;
    assert!(!cut.exists(), "the file cut short was removed");
    let kept = get(addr, "/o/keep", &[]).await;
    assert!(is_hit(&kept), "{:?}", kept.head);
    assert_eq!(kept.body, body_of("/o/keep", 2000));
    assert!(kept.header("age").parse::<u64>().unwrap() < 600);
    assert_eq!(counts.get("/o/keep"), 1, "the backend was not asked again");
    let refetched = get(addr, "/o/cut", &[]).await;
    assert_eq!(
        refetched.header("cache-status"),
        "gateway; fwd=miss; stored"
    );
    assert_eq!(counts.get("/o/cut"), 2);
}
