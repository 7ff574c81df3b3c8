//! PROXY protocol round trips (every prefix is "need more", the whole header parses back to
//! what was written), the spec's examples, TLVs, LOCAL, and garbage.

use std::net::SocketAddr;

use bytes::BytesMut;
use rand::{RngExt, SeedableRng};

use super::*;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn roundtrip(bytes: &[u8], want: ProxyHeader) {
    for cut in 0..bytes.len() {
        assert!(
            matches!(parse(&bytes[..cut]), Ok(None)),
            "prefix of {cut} bytes"
        );
    }
    let mut with_data = bytes.to_vec();
    with_data.extend_from_slice(b"client bytes");
    assert_eq!(parse(&with_data).unwrap(), Some((want, bytes.len())));
}

#[test]
fn v1_and_v2_round_trips() {
    let pairs = [
        (addr("192.0.2.1:56324"), addr("198.51.100.7:443")),
        (addr("[2001:db8::1]:1"), addr("[2001:db8::2]:65535")),
        (addr("192.0.2.1:0"), addr("[2001:db8::2]:80")),
    ];
    for (source, destination) in pairs {
        // Mixed families come back IPv4-mapped.
        let mapped = |a: SocketAddr| match (source.is_ipv4(), destination.is_ipv4(), a) {
            (true, false, SocketAddr::V4(v4)) | (false, true, SocketAddr::V4(v4)) => {
                SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port())
            }
            _ => a,
        };
        let want = ProxyHeader::Proxied {
            source: mapped(source),
            destination: mapped(destination),
        };
        let mut v1 = BytesMut::new();
        write_v1(source, destination, &mut v1);
        assert!(v1.len() <= V1_MAX);
        roundtrip(&v1, want);
        let mut v2 = BytesMut::new();
        write_v2(source, destination, &mut v2);
        roundtrip(&v2, want);
    }
}

#[test]
fn v1_spec_examples() {
    let line = b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n";
    roundtrip(
        line,
        ProxyHeader::Proxied {
            source: addr("255.255.255.255:65535"),
            destination: addr("255.255.255.255:65535"),
        },
    );
    roundtrip(b"PROXY UNKNOWN\r\n", ProxyHeader::Unknown);
    roundtrip(
        b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n",
        ProxyHeader::Unknown,
    );
}

#[test]
fn v2_local_unspec_unix_and_tlvs() {
    let mut local = BytesMut::new();
    write_v2_local(&mut local);
    roundtrip(&local, ProxyHeader::Local);

    // PROXY over UNIX sockets: 216 address bytes, no IP to use.
    let mut unix = V2_SIGNATURE.to_vec();
    unix.extend_from_slice(&[0x21, 0x31, 0, 216]);
    unix.extend_from_slice(&[b'/'; 216]);
    roundtrip(&unix, ProxyHeader::Unknown);

    // IPv4 with two TLVs (ALPN, authority) after the addresses: skipped.
    let mut tlv = BytesMut::new();
    write_v2(addr("10.1.2.3:4000"), addr("10.0.0.1:443"), &mut tlv);
    let tlvs = [&[0x01, 0, 2][..], b"h2", &[0x02, 0, 11], b"example.com"].concat();
    let len = 12 + tlvs.len() as u16;
    tlv[14..16].copy_from_slice(&len.to_be_bytes());
    tlv.extend_from_slice(&tlvs);
    roundtrip(
        &tlv,
        ProxyHeader::Proxied {
            source: addr("10.1.2.3:4000"),
            destination: addr("10.0.0.1:443"),
        },
    );
}

#[test]
fn garbage_is_rejected_with_a_reason() {
    let cases: [&[u8]; 14] = [
        b"GET / HTTP/1.1\r\n",
        b"\x16\x03\x01\x02\x00",
        b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
        b"PROXY TCP4 ::1 ::1 1 2\r\n",
        b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 080 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 +80 2\r\n",
        b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
        b"\r\n\r\n\0\r\nQUIT\n\x11\x11\x00\x0c", // version 1 in a v2 header
        b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x04\x00\x00\x00\x00", // addresses truncated
    ];
    for case in cases {
        assert!(
            matches!(parse(case), Err(StreamError::ProxyProtocol(_))),
            "{:?}",
            String::from_utf8_lossy(case)
        );
    }
    let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat();
    assert!(parse(&long).is_err());
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut good = BytesMut::new();
    write_v2(addr("[::1]:5"), addr("[::2]:6"), &mut good);
    for _ in 0..20_000 {
        let mut input: Vec<u8> = if rng.random_bool(0.5) {
            good.to_vec()
        } else {
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n".to_vec()
        };
        for _ in 0..rng.random_range(0..4) {
            let i = rng.random_range(0..input.len());
            input[i] = rng.random();
        }
        let cut = rng.random_range(0..=input.len());
        if let Ok(Some((_, len))) = parse(&input[..cut]) {
            assert!(len <= cut);
        }
    }
}

#[tokio::test]
async fn read_header_keeps_what_follows() {
    let (mut client, mut server) = tokio::io::duplex(1024);
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        for piece in [&b"PROXY TCP4 1.2.3.4 "[..], b"5.6.7.8 1000 443\r\nhello"] {
            client.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        std::future::pending::<()>().await;
    });
    let mut buf = BytesMut::new();
    let header = read_header(&mut server, &mut buf, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        header.addresses(addr("9.9.9.9:1"), addr("9.9.9.9:2")),
        (addr("1.2.3.4:1000"), addr("5.6.7.8:443"))
    );
    // Bytes after the header were either read into buf or are still in the pipe.
    let mut rest = buf.to_vec();
    if rest.len() < 5 {
        let mut more = vec![0; 5 - rest.len()];
        tokio::io::AsyncReadExt::read_exact(&mut server, &mut more)
            .await
            .unwrap();
        rest.extend_from_slice(&more);
    }
    assert_eq!(rest, b"hello");
}

#[tokio::test(start_paused = true)]
async fn read_header_times_out_and_rejects_garbage() {
    let (_client, mut server) = tokio::io::duplex(64);
    let mut buf = BytesMut::from(&b"PROXY TCP4"[..]);
    let got = read_header(&mut server, &mut buf, Duration::from_secs(3)).await;
    assert!(matches!(got, Err(StreamError::HeaderTimeout { .. })));

    let mut buf = BytesMut::from(&b"SSH-2.0-OpenSSH_9.6\r\n"[..]);
    let got = read_header(&mut server, &mut buf, Duration::from_secs(3)).await;
    assert!(matches!(got, Err(StreamError::ProxyProtocol(_))));
}
