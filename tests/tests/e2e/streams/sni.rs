//! SNI routing: two TLS backends chosen by server name (exact and wildcard) with end-to-end TLS
//! through the gateway, the fallback for plain text and unknown names, a stream without
//! fallback, a ClientHello fragmented over records and segments, and broken hellos that close
//! only their own connection.

use std::sync::Arc;
use std::time::Duration;

use gateway_tests::backend::l4::{TcpBackend, TlsTag};
use gateway_tests::{TestCa, TestGateway, tls_connect};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{closed_silently, config, exchange, read_to_end};

struct Setup {
    ca: TestCa,
    gw: TestGateway,
    _backends: (TlsTag, TlsTag, TcpBackend),
}

async fn setup() -> Setup {
    let ca = TestCa::new();
    let a = TlsTag::start(&ca, &["a.example.com"], "a").await;
    let b = TlsTag::start(&ca, &["x.b.example.com"], "b").await;
    let fallback = TcpBackend::tag("fallback").await;
    let streams = r#"  - name: sni
    bind: 127.0.0.1:0
    protocol: tcp
    sni_routes:
      a.example.com: ua
      "*.b.example.com": ub
    upstream: fb
    header_read_timeout: 500ms
  - name: strict
    bind: 127.0.0.1:0
    protocol: tcp
    sni_routes: { a.example.com: ua }
    header_read_timeout: 500ms
"#;
    let yaml = config(
        &[
            ("ua", &[a.addr()]),
            ("ub", &[b.addr()]),
            ("fb", &[fallback.addr()]),
        ],
        streams,
    );
    Setup {
        gw: TestGateway::start(&yaml).await,
        ca,
        _backends: (a, b, fallback),
    }
}

/// The first flight of a rustls client for `name`: one record holding the ClientHello.
fn client_hello(name: &str) -> Vec<u8> {
    let ca = TestCa::new();
    let config = Arc::new(ca.client_config(&[]));
    let name = rustls_pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(config, name).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}

async fn tls_tag(s: &Setup, stream: &str, name: &str) -> std::io::Result<String> {
    let mut tls = tls_connect(s.gw.stream_addr(stream), name, s.ca.client_config(&[])).await?;
    let mut out = String::new();
    tls.read_to_string(&mut out).await?;
    Ok(out)
}

#[tokio::test]
async fn routes_by_exact_and_wildcard_name_with_tls_end_to_end() {
    let s = setup().await;
    assert_eq!(tls_tag(&s, "sni", "a.example.com").await.unwrap(), "a\n");
    assert_eq!(tls_tag(&s, "sni", "x.b.example.com").await.unwrap(), "b\n");
    assert_eq!(tls_tag(&s, "strict", "a.example.com").await.unwrap(), "a\n");
    assert_eq!(s.gw.stream_stats("sni").connections_accepted, 2);
}

#[tokio::test]
async fn plain_text_and_unknown_names_take_the_fallback() {
    let s = setup().await;
    let addr = s.gw.stream_addr("sni");
    assert_eq!(exchange(addr, b"hello").await, b"fallback\nhello");
    // The peeked hello is forwarded unchanged to the fallback (which echoes it).
    let hello = client_hello("other.example.com");
    let mut want = b"fallback\n".to_vec();
    want.extend_from_slice(&hello);
    assert_eq!(exchange(addr, &hello).await, want);
    // A client that says nothing (server-speaks-first protocols) gets the fallback after the
    // header timeout.
    let mut quiet = TcpStream::connect(addr).await.unwrap();
    let mut tag = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(3), quiet.read_exact(&mut tag))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&tag, b"fallback\n");
}

#[tokio::test]
async fn without_fallback_unmatched_connections_are_closed() {
    let s = setup().await;
    let addr = s.gw.stream_addr("strict");
    assert_eq!(exchange(addr, &client_hello("x.b.example.com")).await, b"");
    assert_eq!(exchange(addr, b"plain text").await, b"");
    let mut quiet = TcpStream::connect(addr).await.unwrap();
    assert!(closed_silently(&mut quiet).await);
    assert_eq!(s.gw.stream_stats("strict").bad_handshakes, 3);
}

/// The ClientHello re-framed as many small records and written a few bytes at a time: the
/// gateway reassembles it, routes by its name to a TLS backend (which answers with a TLS
/// record, where the fallback would answer in text).
#[tokio::test]
async fn hello_fragmented_over_records_and_segments() {
    let s = setup().await;
    let hello = client_hello("x.b.example.com");
    let mut framed = Vec::new();
    for chunk in hello[5..].chunks(40) {
        framed.extend_from_slice(&[22, 3, 1]);
        framed.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        framed.extend_from_slice(chunk);
    }
    let mut tcp = TcpStream::connect(s.gw.stream_addr("sni")).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    for piece in framed.chunks(7) {
        tcp.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut head = [0u8; 3];
    tcp.read_exact(&mut head).await.unwrap();
    assert_eq!(head, [22, 3, 3], "a TLS ServerHello record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_hellos_close_only_their_own_connection() {
    let s = setup().await;
    let addr = s.gw.stream_addr("sni");
    let hello = client_hello("a.example.com");
    let mut oversized = vec![22, 3, 1, 0x40, 0, 1, 0xff, 0xff, 0xff];
    oversized.resize(5 + 0x4000, 0);
    for _ in 0..2 {
        oversized.extend_from_slice(&[22, 3, 1, 0x40, 0]);
        oversized.extend(std::iter::repeat_n(0u8, 0x4000));
    }
    let bad = async {
        // Truncated, then the client gives up (FIN): closed, not sent to the fallback.
        assert_eq!(exchange(addr, &hello[..hello.len() / 2]).await, b"");
        // Truncated, then silence past the header timeout.
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled.write_all(&hello[..20]).await.unwrap();
        assert!(closed_silently(&mut stalled).await);
        // A handshake message longer than the 16 KiB peek buffer.
        let mut big = TcpStream::connect(addr).await.unwrap();
        let _ = big.write_all(&oversized).await;
        assert_eq!(read_to_end(&mut big).await, b"");
    };
    let good = async {
        for _ in 0..20 {
            assert_eq!(tls_tag(&s, "sni", "a.example.com").await.unwrap(), "a\n");
        }
    };
    tokio::join!(bad, good);
    // A record that claims to be a handshake but holds garbage is "not TLS": the fallback.
    let garbage = b"\x16\x03\x01\x00\x08\x01\x00\x00\x04junk";
    assert!(exchange(addr, garbage).await.starts_with(b"fallback\n"));
    assert_eq!(s.gw.stream_stats("sni").bad_handshakes, 3);
}
