//! L4 streams end to end: the real gateway from YAML, real TCP/TLS/UDP clients and backends on
//! 127.0.0.1. One module per area; the shared helpers are here.

mod filters;
mod proxy_protocol;
mod sni;
mod tcp;
mod udp;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A config with one upstream per `(name, targets)` and the given `streams:` entries (YAML
/// lines indented by two spaces, starting with `- name:`).
pub(crate) fn config(upstreams: &[(&str, &[SocketAddr])], streams: &str) -> String {
    let mut out = String::from("upstreams:\n");
    for (name, targets) in upstreams {
        let list: Vec<String> = targets.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "  {name}:\n    targets: [{}]\n    connect_timeout: 1s\n",
            list.join(", ")
        ));
    }
    out.push_str("streams:\n");
    out.push_str(streams);
    out
}

/// Sends `payload`, half-closes, and returns everything read until the peer closes (or 5 s of
/// silence).
pub(crate) async fn exchange(addr: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(payload).await.expect("write");
    tcp.shutdown().await.expect("shutdown");
    read_to_end(&mut tcp).await
}

/// Everything until EOF (an error or 5 s of silence also end it).
pub(crate) async fn read_to_end(tcp: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Whether the gateway closed `tcp` (EOF or reset) within 3 s without sending anything.
pub(crate) async fn closed_silently(tcp: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(3), tcp.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// Polls `check` every 20 ms for up to 5 s.
pub(crate) async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    for _ in 0..250 {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}
