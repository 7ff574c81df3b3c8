//! The PROXY protocol: v1 and v2 headers sent to upstreams (parsed by the test backend), headers
//! accepted from a front load balancer on streams (the real client reaches the filters and the
//! upstream) and on HTTP listeners (the real client reaches `X-Forwarded-For`), and garbage.

use std::net::SocketAddr;

use bytes::BytesMut;
use gateway_tests::backend::Backend;
use gateway_tests::backend::l4::{Mode, TcpBackend};
use gateway_tests::{TestGateway, raw, raw_status};
use stream_proxy::proxy_protocol::{ProxyHeader, write_v2};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{config, read_to_end};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[tokio::test]
async fn v1_and_v2_headers_are_sent_to_the_upstream() {
    for version in ["v1", "v2"] {
        let backend = TcpBackend::start(Mode::Echo, true).await;
        let stream = format!(
            "  - name: s\n    bind: 127.0.0.1:0\n    protocol: tcp\n    upstream: app\n    proxy_protocol: {version}\n"
        );
        let gw = TestGateway::start(&config(&[("app", &[backend.addr()])], &stream)).await;
        let mut tcp = TcpStream::connect(gw.stream_addr("s")).await.unwrap();
        let me = tcp.local_addr().unwrap();
        tcp.write_all(b"payload").await.unwrap();
        tcp.shutdown().await.unwrap();
        assert_eq!(read_to_end(&mut tcp).await, b"payload", "{version}");
        assert_eq!(
            backend.headers(),
            [ProxyHeader::Proxied {
                source: me,
                destination: gw.stream_addr("s"),
            }],
            "{version}"
        );
    }
}

/// A stream behind a load balancer: the header's client is what the allow list checks and
/// what the upstream is told.
#[tokio::test]
async fn a_stream_accepts_a_header_from_a_front_balancer() {
    let backend = TcpBackend::start(Mode::Echo, true).await;
    let stream = "  - name: s
    bind: 127.0.0.1:0
    protocol: tcp
    upstream: app
    accept_proxy_protocol: true
    proxy_protocol: v2
    filters:
      - allow: [203.0.113.0/24]
";
    let gw = TestGateway::start(&config(&[("app", &[backend.addr()])], stream)).await;
    let gw_addr = gw.stream_addr("s");
    let send = |header: Vec<u8>| async move {
        let mut tcp = TcpStream::connect(gw_addr).await.unwrap();
        let mut bytes = header;
        bytes.extend_from_slice(b"data");
        let _ = tcp.write_all(&bytes).await;
        let _ = tcp.shutdown().await;
        read_to_end(&mut tcp).await
    };

    let v1 = b"PROXY TCP4 203.0.113.7 198.51.100.1 40000 5432\r\n".to_vec();
    assert_eq!(send(v1).await, b"data");
    let mut v2 = BytesMut::new();
    write_v2(
        addr("[2001:db8::7]:41000"),
        addr("[2001:db8::1]:5432"),
        &mut v2,
    );
    // An IPv6 client is outside the allow list: refused.
    assert_eq!(send(v2.to_vec()).await, b"");
    let mut v2 = BytesMut::new();
    write_v2(
        addr("203.0.113.9:41000"),
        addr("198.51.100.1:5432"),
        &mut v2,
    );
    assert_eq!(send(v2.to_vec()).await, b"data");
    assert_eq!(
        backend.headers(),
        [
            ProxyHeader::Proxied {
                source: addr("203.0.113.7:40000"),
                destination: addr("198.51.100.1:5432")
            },
            ProxyHeader::Proxied {
                source: addr("203.0.113.9:41000"),
                destination: addr("198.51.100.1:5432")
            },
        ]
    );
    // The real peer (127.0.0.1) without a header: garbage, closed.
    assert_eq!(send(b"GET / HTTP/1.1\r\n\r\n".to_vec()).await, b"");
    let stats = gw.stream_stats("s");
    assert_eq!((stats.filter_denials, stats.bad_handshakes), (1, 1));
    assert_eq!(backend.connections(), 2);
}

#[tokio::test]
async fn an_http_listener_sees_the_real_client_through_the_header() {
    let b = Backend::start("b").await;
    let yaml = format!(
        r#"
listeners:
  - name: lb
    bind: 127.0.0.1:0
    accept_proxy_protocol: true
upstreams:
  app:
    targets: [{}]
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: app }}
"#,
        b.addr()
    );
    let gw = TestGateway::start(&yaml).await;
    let lb = gw.addr("lb");
    let request = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";

    let mut v1 = b"PROXY TCP4 203.0.113.7 198.51.100.1 40000 80\r\n".to_vec();
    v1.extend_from_slice(request);
    assert_eq!(raw_status(&raw(lb, &v1).await), 200);
    assert_eq!(b.last().unwrap().header("x-forwarded-for"), "203.0.113.7");

    let mut v2 = BytesMut::new();
    write_v2(
        addr("[2001:db8::9]:40000"),
        addr("[2001:db8::1]:80"),
        &mut v2,
    );
    v2.extend_from_slice(request);
    assert_eq!(raw_status(&raw(lb, &v2).await), 200);
    assert_eq!(b.last().unwrap().header("x-forwarded-for"), "2001:db8::9");

    // A LOCAL header (the balancer's own health check) keeps the socket's peer.
    let mut local = BytesMut::new();
    stream_proxy::proxy_protocol::write_v2_local(&mut local);
    local.extend_from_slice(request);
    assert_eq!(raw_status(&raw(lb, &local).await), 200);
    assert_eq!(b.last().unwrap().header("x-forwarded-for"), "127.0.0.1");

    // No header: closed without an answer, and the backend saw nothing.
    assert_eq!(raw(lb, request).await, "");
    assert_eq!(b.requests(), 3);
}
