//! Load limits: out of file descriptors (the accept loop backs off instead of spinning, and
//! serves again once descriptors free up), and thousands of idle keep-alive connections held
//! with bounded memory while new requests are still answered quickly. The connection cap per
//! listener is tested in `core::connection_cap_refuses_extra_connections`. Memory goes back to
//! the kernel once a burst of connections (HTTP or L4) has closed.

use std::io::{Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gateway_tests::ports::reserved_port;
use gateway_tests::{Running, TestGateway, gateway_binary, rss_kib, temp_dir, write_file};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::faults::{End, active, open_sockets, settles};

/// User plus system CPU time of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}

fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// The whole answer to `GET path` on a connection of its own, or `None` within 2 s.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = StdTcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    // The admin API answers only requests naming its own address.
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn get_hello(port: u16) -> Option<String> {
    get(port, "/hello")
}

#[test]
fn out_of_file_descriptors_backs_off_then_serves_again() {
    let binary = gateway_binary();
    if !binary.exists() {
        eprintln!(
            "skipped: {} is not built (cargo build -p gateway --bin gateway)",
            binary.display()
        );
        return;
    }
    let dir = temp_dir();
    let (port, cfg) = gateway_tests::binary_config(dir.path(), |port| {
        format!(
            "server: {{ watch_config: false, worker_threads: 2 }}\nlisteners:\n  - name: a\n    bind: 127.0.0.1:{port}\nroutes:\n  - match: {{ path: /hello }}\n    respond: {{ body: hi }}\n"
        )
    });
    let log = dir.path().join("stderr.log");
    // A shell lowers the descriptor limit, then becomes the gateway.
    let child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 64 && exec \"$0\" run --config \"$1\"")
        .arg(&binary)
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let child = Running(child);
    let pid = child.0.id();
    let mut up = false;
    for _ in 0..200 {
        if get_hello(port).is_some_and(|o| o.starts_with("HTTP/1.1 200")) {
            up = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(up, "the gateway answered");

    // Hold more connections than it has descriptors: the rest wait in the backlog and every
    // accept fails with EMFILE.
    let mut held = Vec::new();
    for _ in 0..120 {
        held.push(StdTcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("accept failed")
    {
        assert!(
            Instant::now() < deadline,
            "the gateway never ran out of descriptors"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Out of descriptors for a second: a loop retrying accept would burn a whole core.
    let hz = clock_ticks_per_second();
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(pid) - before;
    assert!(
        used * 100 < hz * 20,
        "the gateway used {used} of {hz} ticks in a second while out of descriptors"
    );

    // Descriptors free up: it serves again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if get_hello(port).is_some_and(|o| o.starts_with("HTTP/1.1 200")) {
            break;
        }
        assert!(Instant::now() < deadline, "the gateway did not recover");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The soft limit on open files of this process.
fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

#[tokio::test]
async fn two_thousand_idle_keep_alive_connections_with_bounded_memory() {
    const N: usize = 2000;
    // Each connection is two descriptors here (client and gateway side); leave room for the
    // other tests in this process.
    let limit = open_files_limit();
    if limit < (2 * N + 2000) as u64 {
        eprintln!("skipped: the open files limit ({limit}) is too low for {N} connections");
        return;
    }
    let gw = TestGateway::start(
        "server: { watch_config: false }\nlisteners:\n  - name: main\n    bind: 127.0.0.1:0\nroutes:\n  - match: { path: /hello }\n    respond: { body: hi }\n",
    )
    .await;
    let addr = gw.addr("main");
    let port = addr.port();
    let (rss_before, _) = rss_kib();
    let mut held = Vec::with_capacity(N);
    let mut buf = [0u8; 256];
    for _ in 0..N {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(tcp);
    }
    settles(
        "connections held",
        Duration::from_secs(10),
        N as i64,
        || active(&gw, "main"),
    )
    .await;
    let (rss_held, _) = rss_kib();
    // A new client is answered at once while they are all held.
    let started = Instant::now();
    let res = gateway_tests::http1(addr).await.get("/hello").await;
    let took = started.elapsed();
    assert_eq!(res.status(), 200);
    assert!(took < Duration::from_secs(1), "answered in {took:?}");
    // Both ends are in this process: the figure bounds client plus gateway per connection.
    let per_conn = rss_held.saturating_sub(rss_before) * 1024 / N as u64;
    eprintln!(
        "{N} idle keep-alive connections: {per_conn} bytes of RSS each (both ends), a new request answered in {took:?}"
    );
    // Measured at about 32 KiB for both ends; other tests in this process move RSS too, so
    // only a gross regression (such as a whole response buffered per connection) fails.
    assert!(per_conn < 256 * 1024, "{per_conn} bytes per connection");
    drop(held);
    settles("connections closed", Duration::from_secs(10), 0, || {
        active(&gw, "main")
    })
    .await;
    settles("gateway sockets", Duration::from_secs(10), 0, || {
        open_sockets(port, End::Local)
    })
    .await;
}

/// `VmRSS` of process `pid`, in KiB.
fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The value of the unlabelled series `name` on the admin API's `/metrics`.
fn metric(admin: u16, name: &str) -> Option<u64> {
    get(admin, "/metrics")?
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The gateway binary in a process of its own (so that its memory is its own and no other
/// test's connections count toward its burst) on `rest` of a config, with a burst of 500
/// connections and the admin API on port `admin`. The directory holds the config.
fn gateway_with_burst_of_500(admin: u16, rest: &str) -> (Running, tempfile::TempDir) {
    gateway_process(&format!(
        "server: {{ watch_config: false, release_memory_after_burst: 500 }}\nadmin: {{ bind: 127.0.0.1:{admin} }}\n{rest}"
    ))
}

/// The gateway binary in a process of its own on `config`; the directory holds the config.
fn gateway_process(config: &str) -> (Running, tempfile::TempDir) {
    let dir = temp_dir();
    let cfg = write_file(dir.path(), "g.yaml", config);
    let child = Command::new(gateway_binary())
        .args(["run", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Running(child), dir)
}

#[test]
fn memory_goes_back_to_the_kernel_once_a_burst_of_connections_has_closed() {
    const N: usize = 2000;
    let limit = open_files_limit();
    if limit < (N + 2000) as u64 {
        eprintln!("skipped: the open files limit ({limit}) is too low for {N} connections");
        return;
    }
    let (port, admin) = (reserved_port(), reserved_port());
    let (child, _dir) = gateway_with_burst_of_500(
        admin,
        &format!(
            "listeners:\n  - name: a\n    bind: 127.0.0.1:{port}\nroutes:\n  - match: {{ path: /hello }}\n    respond: {{ body: hi }}\n"
        ),
    );
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get_hello(port).is_some_and(|o| o.starts_with("HTTP/1.1 200")) {
        assert!(Instant::now() < deadline, "the gateway never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    let releases = || metric(admin, "gateway_memory_burst_releases_total");
    assert_eq!(releases(), Some(0));
    let before = vm_rss_kib(pid);

    let mut held = Vec::with_capacity(N);
    let mut buf = [0u8; 512];
    for _ in 0..N {
        let mut s = StdTcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut got = Vec::new();
        while !got.ends_with(b"hi") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "the gateway closed a kept-alive connection");
            got.extend_from_slice(&buf[..n]);
        }
        held.push(s);
    }
    let grown = vm_rss_kib(pid).saturating_sub(before);
    // Without growth there would be nothing to give back, and the test would prove nothing.
    assert!(
        grown > 3 * 1024,
        "{N} connections grew the gateway's RSS by only {grown} KiB"
    );
    // While they are open, nothing is released but the one release as the burst began (at
    // 250 open, half the burst).
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(releases(), Some(0), "released while the burst was open");
    assert_eq!(
        metric(admin, "gateway_memory_burst_start_releases_total"),
        Some(1),
        "one release as the burst began"
    );

    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while releases() != Some(1) {
        assert!(
            Instant::now() < deadline,
            "no release after the burst closed ({:?})",
            releases()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The allocator's 10 s decay would have kept most of it; the release gives back all but
    // what the gateway still uses.
    let after = vm_rss_kib(pid);
    eprintln!("RSS {before} KiB idle, +{grown} KiB with {N} connections, {after} KiB after");
    assert!(
        after < before + grown / 4,
        "RSS {after} KiB after the burst, {before} KiB before it, {grown} KiB grown"
    );
}

/// The L4 stream proxy's connections count toward the burst too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_l4_connections_closing_releases_memory_too() {
    use gateway_tests::backend::l4::{Mode, TcpBackend};
    const N: usize = 600;
    if open_files_limit() < (3 * N + 2000) as u64 {
        eprintln!("skipped: the open files limit is too low for {N} relayed connections");
        return;
    }
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let (port, admin) = (reserved_port(), reserved_port());
    let _gateway = gateway_with_burst_of_500(
        admin,
        &format!(
            "upstreams:\n  app:\n    targets: [{}]\nstreams:\n  - name: s\n    bind: 127.0.0.1:{port}\n    protocol: tcp\n    upstream: app\n",
            echo.addr()
        ),
    );
    let releases = move || {
        tokio::task::spawn_blocking(move || metric(admin, "gateway_memory_burst_releases_total"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while releases().await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "the admin API never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Each connection echoes a line, so it is relayed end to end before the next one opens.
    let mut held = Vec::with_capacity(N);
    for i in 0..N {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let line = format!("{i}\n");
        tcp.write_all(line.as_bytes()).await.unwrap();
        let mut got = vec![0; line.len()];
        tcp.read_exact(&mut got).await.unwrap();
        assert_eq!(got, line.as_bytes());
        held.push(tcp);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(releases().await.unwrap(), Some(0), "released while open");

    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = releases().await.unwrap();
        if now == Some(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no release after the burst closed ({now:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the gateway's own RSS grows by, per connection, with `n` connections each opened and
/// sent `request` (then held), measured once they are all in. `answered`: read the answer to
/// the request before the next connection.
fn rss_per_held_connection(
    pid: u32,
    port: u16,
    n: usize,
    request: &[u8],
    answered: bool,
) -> (u64, Vec<StdTcpStream>) {
    let before = vm_rss_kib(pid);
    let mut held = Vec::with_capacity(n);
    let mut buf = [0u8; 512];
    for _ in 0..n {
        let mut s = StdTcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request).unwrap();
        if answered {
            let mut got = Vec::new();
            while !got.ends_with(b"hi") {
                let read = s.read(&mut buf).unwrap();
                assert!(read > 0, "the gateway closed a kept-alive connection");
                got.extend_from_slice(&buf[..read]);
            }
        }
        held.push(s);
    }
    // The last connections' bytes reach the gateway's tasks before the reading.
    std::thread::sleep(Duration::from_millis(500));
    let grown = vm_rss_kib(pid).saturating_sub(before);
    (grown * 1024 / n as u64, held)
}

/// Connection footprint (issue "Connection footprint"): a kept-alive HTTP/1.1 connection
/// between requests, and a client holding half a request head, cost the gateway a bounded
/// number of bytes each. The bounds are the figures of a debug build with headroom (a release
/// build needs less: docs/benchmarks.md, "Connections and memory"); what they catch is state
/// kept per connection that belongs to a request (a read or write buffer, an answer's future).
#[test]
fn idle_and_slow_connections_each_cost_the_gateway_a_few_kilobytes() {
    const N: usize = 2000;
    if open_files_limit() < (2 * N + 2000) as u64 {
        eprintln!("skipped: the open files limit is too low for {N} connections");
        return;
    }
    let port = reserved_port();
    let (child, _dir) = gateway_process(&format!(
        "server: {{ watch_config: false, release_memory_after_burst: 0 }}\nlisteners:\n  - name: a\n    bind: 127.0.0.1:{port}\n    header_read_timeout: 60s\nroutes:\n  - match: {{ path: /hello }}\n    respond: {{ body: hi }}\n"
    ));
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get_hello(port).is_some_and(|o| o.starts_with("HTTP/1.1 200")) {
        assert!(Instant::now() < deadline, "the gateway never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Warm: the first thousand connections grow tables (the watchdog's, the runtime's) that
    // the next ones reuse.
    let (_, warm) = rss_per_held_connection(
        pid,
        port,
        N / 2,
        b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
        true,
    );
    let (idle, idle_held) = rss_per_held_connection(
        pid,
        port,
        N,
        b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
        true,
    );
    let (slow, slow_held) = rss_per_held_connection(
        pid,
        port,
        N,
        b"GET /hello HTTP/1.1\r\nHost: x\r\nUser-Agent: half a he",
        false,
    );
    // Opened at once, as a load generator opens its connections, each sending its request
    // before the gateway has answered any.
    let before = vm_rss_kib(pid);
    let mut quiet: Vec<StdTcpStream> = (0..N)
        .map(|_| {
            let mut s = StdTcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let opened = vm_rss_kib(pid).saturating_sub(before) * 1024 / N as u64;
    eprintln!(
        "per connection: {idle} bytes kept alive between requests, {slow} bytes slow, {opened} bytes opened at once"
    );
    // A debug build's figures with about a third of headroom.
    const BOUND: u64 = 2816;
    assert!(idle < BOUND, "{idle} bytes per kept-alive connection");
    assert!(slow < BOUND, "{slow} bytes per slow client");
    assert!(
        opened < BOUND,
        "{opened} bytes per connection opened at once"
    );
    let mut buf = [0u8; 512];
    for s in &mut quiet {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    }
    // Every one of them is still open and served.
    assert!(get_hello(port).is_some_and(|o| o.starts_with("HTTP/1.1 200")));
    drop((warm, idle_held, slow_held, quiet));
}
