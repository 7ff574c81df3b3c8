//! TCP passthrough: 1 GiB echoed and checked by SHA-256, half-close both ways, many parallel
//! connections, failover past a dead target, the connection cap, the idle timeout, drain on
//! shutdown and a reload that keeps the socket.

use std::time::Duration;

use gateway_tests::backend::l4::{Mode, TcpBackend, hex};
use gateway_tests::{TestGateway, refusing_addr, write_file};
use sha2::{Digest, Sha256};
use stream_proxy::upstream::Health;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{closed_silently, config, eventually, exchange, read_to_end};

const GIB: usize = 1 << 30;
const BLOCK: usize = 1 << 20;

fn stream(extra: &str) -> String {
    format!("  - name: s\n    bind: 127.0.0.1:0\n    protocol: tcp\n    upstream: app\n{extra}")
}

/// A 1 MiB block with its index stamped in front, so reordered or repeated blocks change the
/// hash (the block body is built once: the test crate is not optimised).
fn block(base: &[u8], i: usize) -> Vec<u8> {
    let mut b = base.to_vec();
    b[..8].copy_from_slice(&(i as u64).to_le_bytes());
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_echoed_and_verified_by_sha256() {
    echo_and_verify("", GIB, Duration::ZERO).await;
}

/// Without splice, and with a client that starts reading late: the echo backs up until the
/// relay's writes to the client are refused, so the bytes held for a slow reader (and freed
/// after) are exercised, and still arrive whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_gets_every_byte_through_the_copying_relay() {
    echo_and_verify(
        "    zero_copy: false\n",
        64 << 20,
        Duration::from_millis(500),
    )
    .await;
}

async fn echo_and_verify(extra: &str, bytes: usize, read_after: Duration) {
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let gw = TestGateway::start(&config(&[("app", &[echo.addr()])], &stream(extra))).await;
    let tcp = TcpStream::connect(gw.stream_addr("s")).await.unwrap();
    let (mut r, mut w) = tcp.into_split();
    let base: Vec<u8> = (0..BLOCK).map(|i| (i * 7 + i / 251) as u8).collect();

    let writer = tokio::spawn(async move {
        let mut sent = Sha256::new();
        for i in 0..bytes / BLOCK {
            let b = block(&base, i);
            sent.update(&b);
            w.write_all(&b).await.unwrap();
        }
        w.shutdown().await.unwrap();
        sent.finalize()
    });
    tokio::time::sleep(read_after).await;
    let mut received = Sha256::new();
    let mut total = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        received.update(&buf[..n]);
        total += n;
    }
    let sent = writer.await.unwrap();
    assert_eq!(total, bytes);
    assert_eq!(hex(&received.finalize()), hex(&sent));
    assert!(eventually(|| gw.stream_stats("s").connections_active == 0).await);
    let stats = gw.stream_stats("s");
    assert_eq!(
        (stats.bytes_in, stats.bytes_out),
        (bytes as u64, bytes as u64)
    );
}

/// The client sends, then shuts down its write side; the backend only answers after it sees
/// that FIN, so the answer proves both the FIN was passed on and the other direction kept
/// flowing after it.
#[tokio::test]
async fn client_half_close_is_passed_on_and_the_reply_still_arrives() {
    let drain = TcpBackend::start(Mode::Drain, false).await;
    for zero_copy in [true, false] {
        let gw = TestGateway::start(&config(
            &[("app", &[drain.addr()])],
            &stream(&format!("    zero_copy: {zero_copy}\n")),
        ))
        .await;
        let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let reply = exchange(gw.stream_addr("s"), &payload).await;
        let want = format!("{} {}\n", payload.len(), hex(&Sha256::digest(&payload)));
        assert_eq!(
            String::from_utf8_lossy(&reply),
            want,
            "zero_copy: {zero_copy}"
        );
    }
}

/// The backend greets and shuts down its write side at once: the client sees the greeting and
/// EOF, and can still send; the backend receives all of it.
#[tokio::test]
async fn upstream_half_close_leaves_the_client_direction_open() {
    let greet = TcpBackend::start(Mode::Greet, false).await;
    for zero_copy in [true, false] {
        let gw = TestGateway::start(&config(
            &[("app", &[greet.addr()])],
            &stream(&format!("    zero_copy: {zero_copy}\n")),
        ))
        .await;
        let before = greet.received().len();
        let mut tcp = TcpStream::connect(gw.stream_addr("s")).await.unwrap();
        let mut hello = Vec::new();
        tcp.read_to_end(&mut hello).await.unwrap();
        assert_eq!(hello, b"hello\n");
        for _ in 0..3 {
            tcp.write_all(&[7u8; 1000]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        tcp.shutdown().await.unwrap();
        assert!(eventually(|| greet.received().len() == before + 1).await);
        assert_eq!(
            greet.received().last(),
            Some(&3000),
            "zero_copy: {zero_copy}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_parallel_connections() {
    let echo = TcpBackend::start(Mode::Echo, false).await;
    for zero_copy in [true, false] {
        let gw = TestGateway::start(&config(
            &[("app", &[echo.addr()])],
            &stream(&format!("    zero_copy: {zero_copy}\n")),
        ))
        .await;
        let addr = gw.stream_addr("s");
        let clients = (0..128u32).map(|c| {
            tokio::spawn(async move {
                let payload: Vec<u8> = (0..256 * 1024u32).map(|i| (i ^ c) as u8).collect();
                exchange(addr, &payload).await == payload
            })
        });
        for ok in futures_util::future::join_all(clients).await {
            assert!(ok.unwrap(), "zero_copy: {zero_copy}");
        }
        let stats = gw.stream_stats("s");
        assert_eq!(stats.connections_accepted, 128);
        assert!(eventually(|| gw.stream_stats("s").connections_active == 0).await);
    }
}

#[tokio::test]
async fn a_dead_target_is_skipped_and_ejected() {
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let dead = refusing_addr();
    let gw = TestGateway::start(&config(&[("app", &[dead, echo.addr()])], &stream(""))).await;
    for i in 0..10u8 {
        assert_eq!(exchange(gw.stream_addr("s"), &[i; 10]).await, [i; 10]);
    }
    assert_eq!(echo.connections(), 10);
    let targets = gw
        .gateway()
        .generation()
        .upstreams
        .get("app")
        .unwrap()
        .targets
        .clone();
    let snap = targets.snapshot();
    assert!(snap[0].failures >= 1, "{snap:?}");
    assert_eq!(snap[0].health, Health::Ejected);
}

#[tokio::test]
async fn no_live_target_closes_the_connection() {
    let gw = TestGateway::start(&config(&[("app", &[refusing_addr()])], &stream(""))).await;
    let mut tcp = TcpStream::connect(gw.stream_addr("s")).await.unwrap();
    assert!(closed_silently(&mut tcp).await);
    assert_eq!(gw.stream_stats("s").upstream_unavailable, 1);
}

#[tokio::test]
async fn max_connections_refuses_beyond_the_cap() {
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let gw = TestGateway::start(&config(
        &[("app", &[echo.addr()])],
        &stream("    max_connections: 2\n"),
    ))
    .await;
    let addr = gw.stream_addr("s");
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        tcp.read_exact(&mut buf).await.unwrap();
        held.push(tcp);
    }
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(closed_silently(&mut third).await);
    let stats = gw.stream_stats("s");
    assert_eq!(
        (stats.connections_refused, stats.connections_active),
        (1, 2)
    );
    drop(held.pop());
    assert!(eventually(|| gw.stream_stats("s").connections_active == 1).await);
    assert_eq!(exchange(addr, b"again").await, b"again");
}

#[tokio::test]
async fn idle_timeout_closes_a_quiet_connection() {
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let gw = TestGateway::start(&config(
        &[("app", &[echo.addr()])],
        &stream("    idle_timeout: 300ms\n"),
    ))
    .await;
    let mut tcp = TcpStream::connect(gw.stream_addr("s")).await.unwrap();
    // Traffic keeps it open past the timeout...
    for _ in 0..4 {
        tcp.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        tcp.read_exact(&mut b).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // ...silence closes it.
    let started = tokio::time::Instant::now();
    assert!(closed_silently(&mut tcp).await);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(gw.stream_stats("s").idle_timeouts, 1);
}

#[tokio::test]
async fn shutdown_drains_open_connections_then_closes_them() {
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let yaml = format!(
        "server: {{ drain_timeout: 1s }}\n{}",
        config(&[("app", &[echo.addr()])], &stream(""))
    );
    let gw = TestGateway::start(&yaml).await;
    let addr = gw.stream_addr("s");
    let mut open = TcpStream::connect(addr).await.unwrap();
    open.write_all(b"1").await.unwrap();
    let mut b = [0u8; 1];
    open.read_exact(&mut b).await.unwrap();

    let started = tokio::time::Instant::now();
    let stopping = tokio::spawn(gw.shutdown());
    tokio::time::sleep(Duration::from_millis(200)).await;
    // No new connections...
    let refused = match TcpStream::connect(addr).await {
        Err(_) => true,
        Ok(mut t) => closed_silently(&mut t).await,
    };
    assert!(refused);
    // ...while the open one still works, until the drain timeout closes it.
    open.write_all(b"2").await.unwrap();
    open.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"2");
    assert!(closed_silently(&mut open).await);
    stopping.await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

#[tokio::test]
async fn reload_keeps_the_socket_and_open_connections() {
    let (a, b) = (TcpBackend::tag("a").await, TcpBackend::tag("b").await);
    let gw = TestGateway::start(&config(&[("app", &[a.addr()])], &stream(""))).await;
    let addr = gw.stream_addr("s");
    let mut old = TcpStream::connect(addr).await.unwrap();
    let mut tag = [0u8; 2];
    old.read_exact(&mut tag).await.unwrap();
    assert_eq!(&tag, b"a\n");

    write_file(
        gw.dir(),
        "gateway.yaml",
        config(&[("app", &[b.addr()])], &stream("")),
    );
    gw.gateway().reload().await.unwrap();
    assert_eq!(gw.stream_addr("s"), addr);
    assert_eq!(exchange(addr, b"").await, b"b\n");
    // The connection made before the reload still reaches its backend.
    old.write_all(b"still here").await.unwrap();
    old.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut old).await, b"still here");
    assert_eq!(gw.stream_stats("s").connections_accepted, 2);
}

#[tokio::test]
async fn a_reload_that_cannot_bind_a_stream_changes_nothing() {
    let (a, b) = (TcpBackend::tag("a").await, TcpBackend::tag("b").await);
    let gw = TestGateway::start(&config(&[("app", &[a.addr()])], &stream(""))).await;
    let addr = gw.stream_addr("s");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let second = format!(
        "  - name: t\n    bind: {}\n    protocol: tcp\n    upstream: app\n",
        taken.local_addr().unwrap()
    );
    let yaml = config(&[("app", &[b.addr()])], &[stream(""), second].concat());
    write_file(gw.dir(), "gateway.yaml", yaml);
    let err = gw.gateway().reload().await.unwrap_err().to_string();
    assert!(err.contains("stream `t`"), "{err}");
    // The running stream keeps its old upstream, and no new stream appeared.
    assert_eq!(exchange(addr, b"").await, b"a\n");
    assert!(gw.gateway().stream_addr("t").is_none());
}
