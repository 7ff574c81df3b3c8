//! Faults, each with the status a client sees and a check that nothing leaks: an upstream that
//! resets mid-body, one that accepts and never answers, slow-loris heads and bodies, clients
//! that stop reading (static file and proxied body), a flapping target, a plugin that traps on
//! every call, and a config file replaced mid-write.
//!
//! "Nothing leaks" means that once the fault is over the listener's active-connection gauge is
//! back to its baseline and so are the gateway's own sockets: file descriptors of this process
//! (`/proc/self/fd`) that are TCP sockets bound to the listener's port, or connected to the
//! upstream's port. Counting only those keeps the check exact while other tests run in the same
//! process.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use gateway_tests::backend::Backend;
use gateway_tests::{TestGateway, http1, raw_status, rss_kib, temp_dir, write_file};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::proxy::{upstream, yaml};

/// Which end of a TCP connection a port names.
#[derive(Clone, Copy)]
pub(crate) enum End {
    /// Sockets whose local port it is (accepted by a listener on it).
    Local,
    /// Sockets connected to it.
    Remote,
}

/// Socket inodes from `/proc/self/net/tcp{,6}` with `port` at `end`, listening sockets left
/// out.
fn socket_inodes(port: u16, end: End) -> HashSet<u64> {
    let mut out = HashSet::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] == "0A" {
                continue;
            }
            let addr = match end {
                End::Local => f[1],
                End::Remote => f[2],
            };
            let p = addr
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if p == Some(port)
                && let Ok(inode) = f[9].parse::<u64>()
                && inode != 0
            {
                out.insert(inode);
            }
        }
    }
    out
}

/// Open file descriptors of this process that are TCP sockets with `port` at `end`.
pub(crate) fn open_sockets(port: u16, end: End) -> usize {
    let inodes = socket_inodes(port, end);
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy().into_owned();
            t.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse::<u64>()
                .ok()
        })
        .filter(|inode| inodes.contains(inode))
        .count()
}

/// A series' value in the gateway's metrics (0 when absent).
pub(crate) fn metric(gw: &TestGateway, series: &str) -> i64 {
    let text = gw.gateway().telemetry().registry.render();
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as i64)
}

/// Open connections on listener `name`.
pub(crate) fn active(gw: &TestGateway, name: &str) -> i64 {
    metric(
        gw,
        &format!("gateway_listener_active_connections{{listener=\"{name}\"}}"),
    )
}

/// Waits up to `within` for `check`; panics with `what` and the last value otherwise.
pub(crate) async fn settles<T: std::fmt::Debug + PartialEq>(
    what: &str,
    within: Duration,
    want: T,
    mut check: impl FnMut() -> T,
) {
    let deadline = Instant::now() + within;
    loop {
        let now = check();
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {now:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The gateway is back to its baseline: no connection open on `main`, none of its sockets on
/// the listener's port, and at most `pooled` connections to `upstream` (kept-alive ones).
async fn no_leak(gw: &TestGateway, upstream: Option<SocketAddr>, pooled: usize) {
    let port = gw.addr("main").port();
    let limit = Duration::from_secs(5);
    settles("active connections", limit, 0, || active(gw, "main")).await;
    settles("gateway sockets on the listener port", limit, 0, || {
        open_sockets(port, End::Local)
    })
    .await;
    if let Some(up) = upstream {
        settles("gateway sockets to the upstream", limit, true, || {
            open_sockets(up.port(), End::Remote) <= pooled
        })
        .await;
    }
}

/// Sends `request` and reads until the gateway closes or `quiet` passes without data.
/// Returns what was read and whether the connection ended (EOF or reset).
async fn exchange(addr: SocketAddr, request: &[u8], quiet: Duration) -> (Vec<u8>, bool) {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(quiet, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, false),
        }
    }
}

#[tokio::test]
async fn upstream_reset_mid_body_cuts_the_response_and_leaks_nothing() {
    // Headers, 64 KiB of a promised MiB, then a reset (SO_LINGER 0).
    let raw = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = raw.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = raw.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1048576\r\n\r\n")
                    .await;
                let _ = s.write_all(&vec![b'x'; 64 * 1024]).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                drop(s);
            });
        }
    });
    let gw = TestGateway::start(&yaml(
        &format!("    targets: [{backend}]\n    timeout: 5s"),
        "",
    ))
    .await;
    let started = Instant::now();
    let (out, closed) = exchange(
        gw.addr("main"),
        b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(closed, "the client connection is closed, not left hanging");
    assert!(started.elapsed() < Duration::from_secs(4));
    let text = String::from_utf8_lossy(&out[..out.len().min(200)]).into_owned();
    assert_eq!(raw_status(&text), 200, "{text}");
    let body = out.len() - out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4;
    assert!(
        (64 * 1024..1048576).contains(&body),
        "the body is cut short: {body} bytes"
    );
    assert_eq!(upstream(&gw).targets.snapshot()[0].failures, 1);
    no_leak(&gw, Some(backend), 0).await;
}

#[tokio::test]
async fn silent_upstream_gets_504_after_the_timeout_and_leaks_nothing() {
    // Accepts, reads the request, never answers (holds the socket open).
    let raw = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = raw.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = raw.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    let gw = TestGateway::start(&yaml(
        &format!("    targets: [{backend}]\n    timeout: 300ms\n    health_check: {{ unhealthy_after: 100 }}"),
        "",
    ))
    .await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..3 {
        let started = Instant::now();
        assert_eq!(c.get("/wait").await.status(), 504);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(2500),
            "{took:?}"
        );
    }
    // The timed-out upstream connections were closed, not pooled.
    settles(
        "sockets to the silent upstream",
        Duration::from_secs(5),
        0,
        || open_sockets(backend.port(), End::Remote),
    )
    .await;
    drop(c);
    no_leak(&gw, Some(backend), 0).await;
}

#[tokio::test]
async fn slow_loris_heads_are_cut_and_leak_nothing() {
    let gw = TestGateway::start(
        "server: { watch_config: false }\nlisteners:\n  - name: main\n    bind: 127.0.0.1:0\n    header_read_timeout: 300ms\nroutes:\n  - match: { path_prefix: / }\n    respond: { body: ok }\n",
    )
    .await;
    let addr = gw.addr("main");
    // Fifty clients each send part of a head, then a byte now and then, never the end.
    let mut clients = Vec::new();
    for _ in 0..50 {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        clients.push(tcp);
    }
    settles("slow heads open", Duration::from_secs(5), 50, || {
        active(&gw, "main")
    })
    .await;
    let started = Instant::now();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for c in &mut clients {
            let _ = c.write_all(b"X").await;
        }
    }
    // Trickling does not extend the deadline: every one is closed.
    settles("slow heads closed", Duration::from_secs(3), 0, || {
        active(&gw, "main")
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    for c in &mut clients {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(2), c.read(&mut buf))
            .await
            .expect("closed by the gateway")
            .unwrap_or(0);
        assert_eq!(n, 0, "no response to a head that never ended");
    }
    // Others are still served.
    assert_eq!(http1(addr).await.get("/").await.status(), 200);
    drop(clients);
    no_leak(&gw, None, 0).await;
}

#[tokio::test]
async fn slow_loris_body_gets_408_and_the_connection_closes() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{}]", b.addr()), "").replace(
        "    bind: 127.0.0.1:0\n",
        "    bind: 127.0.0.1:0\n    body_read_timeout: 400ms\n",
    ))
    .await;
    let addr = gw.addr("main");

    // A body that trickles in faster than the timeout is fine: the clock measures each wait.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 8\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        tcp.write_all(b"z").await.unwrap();
    }
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), tcp.read(&mut buf))
        .await
        .expect("answered")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert_eq!(raw_status(&text), 200, "{text}");
    drop(tcp);

    // A body that stops: 408 once the wait passes the timeout, then the connection closes.
    let started = Instant::now();
    let (out, closed) = exchange(
        addr,
        b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nonly ten b",
        Duration::from_secs(3),
    )
    .await;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(raw_status(&text), 408, "{text}");
    assert!(closed, "the connection is closed after the 408");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // The client's failure is not the target's.
    let s = &upstream(&gw).targets.snapshot()[0];
    assert_eq!((s.failures, s.in_flight), (0, 0));
    no_leak(&gw, Some(b.addr()), 1).await;
}

/// A client with a small receive window that reads `first` bytes of the answer to `request`,
/// then stops reading. Returns the socket (still open) and what it read.
async fn stop_reading(addr: SocketAddr, request: &[u8], first: usize) -> (TcpStream, usize) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut tcp = socket.connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    let mut got = 0;
    while got < first {
        let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
            .await
            .expect("data arrives")
            .unwrap();
        assert!(n > 0, "closed early");
        got += n;
    }
    (tcp, got)
}

/// Samples this process's RSS every 20 ms until stopped; returns the peak in KiB.
fn rss_sampler() -> (Arc<AtomicBool>, tokio::task::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut peak = 0;
            while !stop.load(Relaxed) {
                peak = peak.max(rss_kib().0);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        }
    });
    (stop, task)
}

/// A gateway serving a 1 GiB sparse file at `/huge.bin`, with a 500 ms `write_timeout` and a
/// drain that would wait a minute.
async fn huge_file_gateway() -> TestGateway {
    let dir = temp_dir();
    let f = std::fs::File::create(write_file(dir.path(), "public/huge.bin", "")).unwrap();
    f.set_len(1 << 30).unwrap();
    drop(f);
    TestGateway::start_in(
        dir,
        "server: { watch_config: false, drain_timeout: 60s }\nlisteners:\n  - name: main\n    bind: 127.0.0.1:0\n    write_timeout: 500ms\nroutes:\n  - match: { path_prefix: / }\n    static: { root: public }\n",
    )
    .await
}

/// Draining waits for requests in flight, and the deadlines still hold meanwhile: a response
/// stuck on a client that reads nothing ends at `write_timeout`, not at `drain_timeout`.
#[tokio::test]
async fn a_stalled_client_does_not_hold_the_drain_past_write_timeout() {
    let gw = huge_file_gateway().await;
    let (mut tcp, _) = stop_reading(
        gw.addr("main"),
        b"GET /huge.bin HTTP/1.1\r\nhost: x\r\n\r\n",
        64 * 1024,
    )
    .await;
    let started = Instant::now();
    gw.shutdown().await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "the drain took {took:?}");
    // The stalled connection was closed: what the socket buffers held, then the end.
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection was not closed"),
        }
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_a_large_file_is_closed_after_write_timeout() {
    let gw = huge_file_gateway().await;
    let addr = gw.addr("main");
    let before_timeouts = metric(
        &gw,
        "gateway_listener_write_timeouts_total{listener=\"main\"}",
    );
    let (rss_before, _) = rss_kib();
    let (stop, peak) = rss_sampler();
    let started = Instant::now();
    let (mut tcp, got) = stop_reading(
        addr,
        b"GET /huge.bin HTTP/1.1\r\nhost: x\r\n\r\n",
        64 * 1024,
    )
    .await;
    // The gateway gives up on the connection once nothing moved for write_timeout.
    settles(
        "the stalled connection is closed",
        Duration::from_secs(5),
        0,
        || active(&gw, "main"),
    )
    .await;
    let took = started.elapsed();
    stop.store(true, Relaxed);
    let peak = peak.await.unwrap();
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert_eq!(
        metric(
            &gw,
            "gateway_listener_write_timeouts_total{listener=\"main\"}"
        ),
        before_timeouts + 1
    );
    // What is left is what the socket buffers held; then the end of the stream.
    let mut rest = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => rest += n,
            Err(_) => panic!("the connection was not closed"),
        }
    }
    assert!(got + rest < 64 << 20, "read {} bytes of a GiB", got + rest);
    // Other tests share this process (the GiB streaming tests move up to 256 MiB of RSS), so
    // only gross buffering fails: the file is a GiB.
    let grown = peak.saturating_sub(rss_before);
    assert!(grown < 256 * 1024, "RSS grew by {grown} KiB");
    no_leak(&gw, None, 0).await;
}

#[tokio::test]
async fn a_client_that_stops_reading_a_proxied_body_is_closed_and_the_upstream_released() {
    let b = Backend::start("a").await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{}]", b.addr()), "").replace(
        "    bind: 127.0.0.1:0\n",
        "    bind: 127.0.0.1:0\n    write_timeout: 500ms\n",
    ))
    .await;
    let addr = gw.addr("main");
    let (rss_before, _) = rss_kib();
    let (stop, peak) = rss_sampler();
    let (tcp, _) = stop_reading(
        addr,
        b"GET /download/536870912 HTTP/1.1\r\nhost: x\r\n\r\n",
        64 * 1024,
    )
    .await;
    settles(
        "the stalled connection is closed",
        Duration::from_secs(5),
        0,
        || active(&gw, "main"),
    )
    .await;
    stop.store(true, Relaxed);
    let grown = peak.await.unwrap().saturating_sub(rss_before);
    assert!(grown < 256 * 1024, "RSS grew by {grown} KiB");
    // The upstream response could not finish: its connection is dropped, not pooled.
    settles("sockets to the upstream", Duration::from_secs(5), 0, || {
        open_sockets(b.addr().port(), End::Remote)
    })
    .await;
    assert_eq!(upstream(&gw).targets.snapshot()[0].in_flight, 0);
    drop(tcp);
    no_leak(&gw, Some(b.addr()), 0).await;
}

#[tokio::test]
async fn a_flapping_target_costs_no_request_while_another_is_healthy() {
    let a = Backend::start("a").await;
    let mut b = Backend::start("b").await;
    let gw = TestGateway::start(&yaml(
        &format!(
            "    targets: [{}, {}]\n    retries: 1\n    health_check: {{ path: /healthz, interval: 100ms, timeout: 300ms, unhealthy_after: 1, healthy_after: 1, eject_for: 300ms }}",
            a.addr(),
            b.addr()
        ),
        "",
    ))
    .await;
    let addr = gw.addr("main");
    let done = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (done, failures, served) = (done.clone(), failures.clone(), served.clone());
        load.push(tokio::spawn(async move {
            let mut c = http1(addr).await;
            while !done.load(Relaxed) {
                let r = c.get("/").await;
                if r.status() >= 500 {
                    failures.fetch_add(1, Relaxed);
                } else {
                    served.fetch_add(1, Relaxed);
                }
            }
        }));
    }
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.stop().await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        b.restart().await;
    }
    // Recovery: after the last flap "b" is brought back and takes requests again.
    let before = b.requests();
    settles("b serves again", Duration::from_secs(5), true, || {
        b.requests() > before + 5
    })
    .await;
    done.store(true, Relaxed);
    for l in load {
        l.await.unwrap();
    }
    assert_eq!(
        failures.load(Relaxed),
        0,
        "5xx while a healthy target was up"
    );
    assert!(served.load(Relaxed) > 100);
    assert!(upstream(&gw).targets.snapshot()[1].ejections >= 1);
    no_leak(&gw, None, 0).await;
}

/// A plugin (text format) that starts, then traps in every request it sees.
const TRAP_PLUGIN: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_context_create") (param $id i32) (param $root i32)
    (if (i32.ne (local.get $root) (i32.const 0)) (then unreachable)))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) unreachable)
)"#;

#[tokio::test]
async fn a_plugin_that_traps_on_every_call_fails_only_its_route() {
    let dir = temp_dir();
    write_file(
        dir.path(),
        "always_traps.wasm",
        wat::parse_str(TRAP_PLUGIN).expect("valid text"),
    );
    let gw = TestGateway::start_in(
        dir,
        "server: { watch_config: false }\nlisteners:\n  - name: main\n    bind: 127.0.0.1:0\nplugins:\n  always_traps: { wasm: always_traps.wasm }\nroutes:\n  - match: { path_prefix: /trap }\n    filters: [ { plugin: always_traps } ]\n    respond: { body: never }\n  - match: { path_prefix: / }\n    respond: { body: fine }\n",
    )
    .await;
    let addr = gw.addr("main");
    let stats = gw
        .gateway()
        .generation()
        .plugins
        .get("always_traps")
        .cloned()
        .expect("plugin")
        .stats
        .clone();
    let traps_before = stats.traps.load(Relaxed);
    let mut c = http1(addr).await;
    let mut good = http1(addr).await;
    for i in 0..20 {
        let r = c.get("/trap").await;
        assert_eq!(r.status(), 500, "request {i}: {}", r.text());
        let r = good.get("/other").await;
        assert_eq!((r.status(), r.text().as_str()), (200, "fine"));
    }
    assert_eq!(stats.traps.load(Relaxed), traps_before + 20);
    drop((c, good));
    no_leak(&gw, None, 0).await;
}

#[tokio::test]
async fn a_config_file_replaced_mid_write_is_rejected_then_the_whole_one_loads() {
    let config = |body: &str, port: u16| {
        format!(
            "server: {{ watch_config: true }}\nlisteners:\n  - name: main\n    bind: 127.0.0.1:{port}\nroutes:\n  - name: hello\n    match: {{ path: /hello }}\n    respond: {{ body: \"{body}\" }}\n"
        )
    };
    let gw = TestGateway::start(&config("one", 0)).await;
    let port = gw.addr("main").port();
    let path = gw.dir().join("gateway.yaml");
    let mut c = http1(gw.addr("main")).await;
    assert_eq!(c.get("/hello").await.text(), "one");
    let t = gw.gateway().telemetry();
    let (ok_before, failed_before) = (t.reloads_ok.get(), t.reloads_failed.get());

    // The writer has written part of the new file (cut inside a flow mapping) and paused.
    let whole = config("two", port);
    let cut = whole.find("body: ").unwrap() + 8;
    std::fs::write(&path, &whole[..cut]).unwrap();
    settles(
        "the partial file is rejected",
        Duration::from_secs(5),
        true,
        || t.reloads_failed.get() > failed_before,
    )
    .await;
    assert_eq!(t.reloads_ok.get(), ok_before);
    assert_eq!(c.get("/hello").await.text(), "one", "the old config serves");

    // The rest arrives: the whole file loads on the next look.
    std::fs::write(&path, &whole).unwrap();
    settles(
        "the complete file is loaded",
        Duration::from_secs(5),
        true,
        || t.reloads_ok.get() > ok_before,
    )
    .await;
    assert_eq!(c.get("/hello").await.text(), "two");
    assert_eq!(t.reloads_failed.get(), failed_before + 1);
}
