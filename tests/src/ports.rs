//! Loopback ports for processes that must be told their port before they bind it (Pebble, the
//! OCSP responder, a gateway whose ports Pebble dials back). A port from `bind(":0")` is taken
//! from the kernel's ephemeral range, and released for the other process to bind; in between,
//! any outgoing connection of a test running in parallel may be given that same port as its
//! local end, and the later bind fails with "address in use". Ports handed out here come from
//! below that range, where the kernel never picks on its own, and a process-wide counter keeps
//! two tests of this process from being given the same one.

use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where the search starts when the kernel's ephemeral range cannot be read.
const DEFAULT_EPHEMERAL_LOW: u16 = 32768;
/// The lowest port handed out: well above the ports system services listen on.
const LOWEST: u16 = 20000;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The first port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_LOW)
}

/// A loopback port outside the ephemeral range that is free for TCP and UDP right now.
pub fn reserved_port() -> u16 {
    let high = ephemeral_low().max(LOWEST + 1000);
    let span = u32::from(high - LOWEST);
    // Start each test process at a different place so two runs side by side rarely meet.
    let seed = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOWEST + ((seed + step) % span) as u16;
        let tcp = TcpListener::bind(("127.0.0.1", port));
        let udp = UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOWEST}..{high}");
}

/// Whether something accepts connections on `addr` within `within`, tried every 50 ms: a
/// process a test started on a reserved port is ready once its listener is.
pub async fn wait_listening(addr: std::net::SocketAddr, within: std::time::Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
