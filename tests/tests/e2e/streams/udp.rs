//! UDP streams: many clients each in their own session, large datagrams, idle expiry, the
//! session cap against a flood of source addresses, filters, and drain.

use std::net::SocketAddr;
use std::time::Duration;

use gateway_tests::TestGateway;
use gateway_tests::backend::l4::UdpEcho;
use tokio::net::UdpSocket;

use super::{config, eventually};

fn stream(extra: &str) -> String {
    format!("  - name: u\n    bind: 127.0.0.1:0\n    protocol: udp\n    upstream: dns\n{extra}")
}

/// Sends `payload` from `socket` to `to` and waits up to `wait` for the echo.
async fn ping(socket: &UdpSocket, to: SocketAddr, payload: &[u8], wait: Duration) -> bool {
    socket.send_to(payload, to).await.unwrap();
    let mut buf = vec![0u8; 65536];
    match tokio::time::timeout(wait, socket.recv_from(&mut buf)).await {
        Ok(Ok((n, from))) => from == to && buf[..n] == *payload,
        _ => false,
    }
}

/// [`ping`] with up to three tries, as a real UDP client would: a burst of large datagrams from
/// many clients may overflow the test backend's socket buffer. Stale echoes are skipped.
async fn ping_retrying(socket: &UdpSocket, to: SocketAddr, payload: &[u8]) -> bool {
    let mut buf = vec![0u8; 65536];
    for _ in 0..3 {
        socket.send_to(payload, to).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while let Ok(Ok((n, from))) =
            tokio::time::timeout_at(deadline, socket.recv_from(&mut buf)).await
        {
            if from == to && buf[..n] == *payload {
                return true;
            }
        }
    }
    false
}

async fn client() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_each_get_their_own_session() {
    let echo = UdpEcho::start().await;
    let gw = TestGateway::start(&config(&[("dns", &[echo.addr()])], &stream(""))).await;
    let addr = gw.stream_addr("u");
    let clients = (0..50usize).map(|c| {
        tokio::spawn(async move {
            let socket = client().await;
            for i in 0..20usize {
                // Sizes from 1 byte to 60,000 bytes (64 KiB-class datagrams pass whole).
                let len = 1 + (c * 20 + i) * 60;
                let payload: Vec<u8> = (0..len).map(|j| (j + c + i) as u8).collect();
                if !ping_retrying(&socket, addr, &payload).await {
                    return false;
                }
            }
            true
        })
    });
    for ok in futures_util::future::join_all(clients).await {
        assert!(ok.unwrap());
    }
    assert_eq!(echo.sources(), 50);
    // A datagram is counted once its send has returned, which can be just after the client
    // already has it: the last counts may land a moment after the last echo.
    let counted = |s: &stream_proxy::StreamStatsSnapshot| {
        // Retries (see ping_retrying) may add a few datagrams.
        s.datagrams_in >= 1000 && s.datagrams_out >= 1000
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut stats = gw.stream_stats("u");
    while !counted(&stats) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        stats = gw.stream_stats("u");
    }
    assert!(counted(&stats), "{stats:?}");
    assert_eq!(stats.udp_sessions_created, 50);
    assert_eq!(stats.udp_sessions_active, 50);
}

#[tokio::test]
async fn sessions_expire_after_the_idle_timeout() {
    let echo = UdpEcho::start().await;
    let gw = TestGateway::start(&config(
        &[("dns", &[echo.addr()])],
        &stream("    idle_timeout: 300ms\n"),
    ))
    .await;
    let addr = gw.stream_addr("u");
    let socket = client().await;
    // Traffic every 150 ms keeps one session alive past the timeout.
    for _ in 0..4 {
        assert!(ping(&socket, addr, b"q", Duration::from_secs(2)).await);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(gw.stream_stats("u").udp_sessions_created, 1);
    assert!(eventually(|| gw.stream_stats("u").udp_sessions_active == 0).await);
    assert_eq!(gw.stream_stats("u").udp_sessions_expired, 1);
    // The next datagram opens a new session (a new source port at the backend).
    assert!(ping(&socket, addr, b"again", Duration::from_secs(2)).await);
    assert_eq!(echo.sources(), 2);
}

#[tokio::test]
async fn the_session_cap_bounds_a_flood_of_sources() {
    let echo = UdpEcho::start().await;
    let gw = TestGateway::start(&config(
        &[("dns", &[echo.addr()])],
        &stream("    max_connections: 5\n"),
    ))
    .await;
    let addr = gw.stream_addr("u");
    // Sixty sources at once: five get sessions, the rest are dropped and counted.
    let floods = (0..60).map(|_| async move {
        let socket = client().await;
        let answered = ping(&socket, addr, b"flood", Duration::from_millis(500)).await;
        (socket, answered)
    });
    let results = futures_util::future::join_all(floods).await;
    let answered = results.iter().filter(|(_, a)| *a).count();
    assert_eq!(answered, 5);
    let stats = gw.stream_stats("u");
    assert_eq!(stats.udp_sessions_active, 5);
    assert_eq!(stats.connections_refused, 55);
    assert_eq!(echo.sources(), 5);
    // The admitted clients keep working.
    let (admitted, _) = results.iter().find(|(_, a)| *a).unwrap();
    assert!(ping(admitted, addr, b"still", Duration::from_secs(2)).await);
}

#[tokio::test]
async fn filters_apply_to_new_sessions() {
    let echo = UdpEcho::start().await;
    let gw = TestGateway::start(&config(
        &[("dns", &[echo.addr()])],
        &stream("    filters:\n      - deny: [127.0.0.0/8]\n"),
    ))
    .await;
    let socket = client().await;
    assert!(
        !ping(
            &socket,
            gw.stream_addr("u"),
            b"x",
            Duration::from_millis(300)
        )
        .await
    );
    assert_eq!(gw.stream_stats("u").filter_denials, 1);
    assert_eq!(echo.datagrams(), 0);
}

#[tokio::test]
async fn drain_serves_open_sessions_but_opens_none() {
    let echo = UdpEcho::start().await;
    let yaml = format!(
        "server: {{ drain_timeout: 1s }}\n{}",
        config(&[("dns", &[echo.addr()])], &stream(""))
    );
    let gw = TestGateway::start(&yaml).await;
    let addr = gw.stream_addr("u");
    let open = client().await;
    assert!(ping(&open, addr, b"1", Duration::from_secs(2)).await);
    let stopping = tokio::spawn(gw.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(ping(&open, addr, b"2", Duration::from_secs(2)).await);
    assert!(!ping(&client().await, addr, b"new", Duration::from_millis(300)).await);
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .unwrap()
        .unwrap();
    assert!(!ping(&open, addr, b"3", Duration::from_millis(300)).await);
}
