//! The gateway's PROXY protocol parser (`stream_proxy::proxy_protocol::parse`) against the
//! `ppp` crate, on the headers load balancers send: v1 over IPv4 and IPv6, v2 over IPv4 without
//! TLVs and over IPv6 with two. Each side goes from the bytes to the client and local socket
//! addresses and the header's length, which is what a listener needs. The choice this measures
//! is recorded in docs/architecture.md.

use std::net::{IpAddr, SocketAddr};

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use ppp::{HeaderResult, v1, v2};
use stream_proxy::proxy_protocol::{ProxyHeader, V2_SIGNATURE, parse};

/// What a listener takes from a header: the addresses (none for LOCAL/UNKNOWN) and its length.
type Parsed = Option<(Option<(SocketAddr, SocketAddr)>, usize)>;

fn ours(buf: &[u8]) -> Parsed {
    let (header, len) = parse(buf).ok()??;
    let addresses = match header {
        ProxyHeader::Proxied {
            source,
            destination,
        } => Some((source, destination)),
        ProxyHeader::Local | ProxyHeader::Unknown => None,
    };
    Some((addresses, len))
}

fn theirs(buf: &[u8]) -> Parsed {
    let pair = |s: IpAddr, sp: u16, d: IpAddr, dp: u16| {
        Some((SocketAddr::new(s, sp), SocketAddr::new(d, dp)))
    };
    match HeaderResult::parse(buf) {
        HeaderResult::V1(Ok(h)) => {
            let addresses = match h.addresses {
                v1::Addresses::Tcp4(a) => pair(
                    a.source_address.into(),
                    a.source_port,
                    a.destination_address.into(),
                    a.destination_port,
                ),
                v1::Addresses::Tcp6(a) => pair(
                    a.source_address.into(),
                    a.source_port,
                    a.destination_address.into(),
                    a.destination_port,
                ),
                v1::Addresses::Unknown => None,
            };
            Some((addresses, h.header.len()))
        }
        HeaderResult::V2(Ok(h)) => {
            let addresses = match h.addresses {
                v2::Addresses::IPv4(a) => pair(
                    a.source_address.into(),
                    a.source_port,
                    a.destination_address.into(),
                    a.destination_port,
                ),
                v2::Addresses::IPv6(a) => pair(
                    a.source_address.into(),
                    a.source_port,
                    a.destination_address.into(),
                    a.destination_port,
                ),
                v2::Addresses::Unspecified | v2::Addresses::Unix(_) => None,
            };
            Some((addresses, h.header.len()))
        }
        HeaderResult::V1(Err(_)) | HeaderResult::V2(Err(_)) => None,
    }
}

/// A v2 PROXY header for a TCP connection, with `tlvs` (type, value) after the addresses.
fn v2_header(source: SocketAddr, destination: SocketAddr, tlvs: &[(u8, &[u8])]) -> Vec<u8> {
    let mut addresses = Vec::new();
    let family = match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            addresses.extend_from_slice(&s.octets());
            addresses.extend_from_slice(&d.octets());
            0x11
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            addresses.extend_from_slice(&s.octets());
            addresses.extend_from_slice(&d.octets());
            0x21
        }
        _ => unreachable!("one family per header"),
    };
    addresses.extend_from_slice(&source.port().to_be_bytes());
    addresses.extend_from_slice(&destination.port().to_be_bytes());
    for (kind, value) in tlvs {
        addresses.push(*kind);
        addresses.extend_from_slice(&u16::try_from(value.len()).unwrap().to_be_bytes());
        addresses.extend_from_slice(value);
    }
    let mut out = V2_SIGNATURE.to_vec();
    out.extend_from_slice(&[0x21, family]);
    out.extend_from_slice(&u16::try_from(addresses.len()).unwrap().to_be_bytes());
    out.extend_from_slice(&addresses);
    out
}

fn cases() -> Vec<(&'static str, Vec<u8>)> {
    let request = b"GET / HTTP/1.1\r\nhost: example.com\r\n\r\n";
    let v4 = (
        "192.0.2.10:56324".parse().unwrap(),
        "198.51.100.1:443".parse().unwrap(),
    );
    let v6 = (
        "[2001:db8::10]:56324".parse().unwrap(),
        "[2001:db8::1]:443".parse().unwrap(),
    );
    let mut all = vec![
        (
            "v1_tcp4",
            b"PROXY TCP4 192.0.2.10 198.51.100.1 56324 443\r\n".to_vec(),
        ),
        (
            "v1_tcp6",
            b"PROXY TCP6 2001:db8::10 2001:db8::1 56324 443\r\n".to_vec(),
        ),
        ("v2_tcp4", v2_header(v4.0, v4.1, &[])),
        (
            "v2_tcp6_tlvs",
            v2_header(v6.0, v6.1, &[(0x01, b"h2"), (0x02, b"api.example.com")]),
        ),
    ];
    for (_, bytes) in &mut all {
        bytes.extend_from_slice(request);
    }
    all
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("proxy_protocol");
    for (name, bytes) in cases() {
        // Both parsers must read the same header the same way, or the comparison means nothing.
        let expected = ours(&bytes);
        assert!(
            expected.is_some(),
            "{name}: refused by the gateway's parser"
        );
        assert_eq!(theirs(&bytes), expected, "{name}: the parsers disagree");
        group.bench_function(format!("{name}/gateway"), |b| {
            b.iter(|| ours(black_box(&bytes)))
        });
        group.bench_function(format!("{name}/ppp"), |b| {
            b.iter(|| theirs(black_box(&bytes)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
