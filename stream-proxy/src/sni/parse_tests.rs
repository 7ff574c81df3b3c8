//! ClientHello parser tests: real hellos from rustls, hand-built ones re-fragmented into many
//! records, every prefix of each (never a wrong verdict on a partial hello), and garbage.

use super::*;
use rand::{RngExt, SeedableRng};

/// A ClientHello handshake message (without record framing) with optional SNI and padding.
pub(crate) fn hello_message(sni: Option<&str>, padding: usize) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]); // random
    body.push(32);
    body.extend_from_slice(&[1; 32]); // session id
    body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]); // two suites
    body.extend_from_slice(&[1, 0]); // null compression
    let mut exts = Vec::new();
    // An unrelated extension first, so the parser must skip one.
    exts.extend_from_slice(&[0, 10, 0, 4, 0, 2, 0, 29]);
    if let Some(name) = sni {
        let n = name.len() as u16;
        exts.extend_from_slice(&0u16.to_be_bytes());
        exts.extend_from_slice(&(n + 5).to_be_bytes());
        exts.extend_from_slice(&(n + 3).to_be_bytes());
        exts.push(0);
        exts.extend_from_slice(&n.to_be_bytes());
        exts.extend_from_slice(name.as_bytes());
    }
    if padding > 0 {
        exts.extend_from_slice(&21u16.to_be_bytes());
        exts.extend_from_slice(&(padding as u16).to_be_bytes());
        exts.extend(std::iter::repeat_n(0, padding));
    }
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut msg = vec![1];
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    msg
}

/// `message` framed as handshake records of at most `fragment` bytes each.
pub(crate) fn records(message: &[u8], fragment: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in message.chunks(fragment) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

fn rustls_hello(name: &str) -> Vec<u8> {
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}

/// Every strict prefix is `Incomplete` and the whole input gives `want`.
fn check_prefixes(input: &[u8], want: &ClientHello) {
    for cut in 0..input.len() {
        assert_eq!(
            parse_client_hello(&input[..cut]),
            ClientHello::Incomplete,
            "prefix of {cut} bytes"
        );
    }
    assert_eq!(&parse_client_hello(input), want);
}

#[test]
fn real_client_hello_from_rustls() {
    let hello = rustls_hello("Db.Example.COM");
    check_prefixes(&hello, &ClientHello::Sni("db.example.com".into()));
}

#[test]
fn bytes_after_the_hello_are_ignored() {
    let mut input = records(&hello_message(Some("a.example.com"), 0), 1 << 14);
    input.extend_from_slice(b"\x17\x03\x03 trailing application data");
    assert_eq!(
        parse_client_hello(&input),
        ClientHello::Sni("a.example.com".into())
    );
}

#[test]
fn hello_split_over_many_records() {
    let msg = hello_message(Some("x.b.example.com"), 3000);
    for fragment in [1, 2, 3, 5, 100, 1000] {
        check_prefixes(
            &records(&msg, fragment),
            &ClientHello::Sni("x.b.example.com".into()),
        );
    }
}

#[test]
fn hello_larger_than_one_record() {
    let msg = hello_message(Some("big.example.com"), 20_000);
    let input = records(&msg, 1 << 14);
    assert!(input.len() > (1 << 14) + 5);
    assert_eq!(
        parse_client_hello(&input),
        ClientHello::Sni("big.example.com".into())
    );
}

#[test]
fn no_sni_and_trailing_dot() {
    check_prefixes(&records(&hello_message(None, 0), 64), &ClientHello::NoSni);
    assert_eq!(
        parse_client_hello(&records(&hello_message(Some("a.example.com."), 0), 512)),
        ClientHello::Sni("a.example.com".into())
    );
    // An IP literal or control bytes are not a host name.
    for bad in ["10.0.0.1:443", "a\u{1}b", ""] {
        assert_eq!(
            parse_client_hello(&records(&hello_message(Some(bad), 0), 512)),
            ClientHello::NoSni,
            "{bad:?}"
        );
    }
}

#[test]
fn not_tls() {
    for input in [
        &b"GET / HTTP/1.1\r\n"[..],
        b"\x16\x02",
        b"SSH-2.0-OpenSSH",
        b"\x80\x2e\x01\x03\x01",                 // SSLv2-style hello
        b"\x16\x03\x01\x00\x00",                 // empty record
        b"\x16\x03\x01\x40\x01",                 // record over 2^14
        b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", // ServerHello
        b"\x15\x03\x03\x00\x02\x02\x28",         // alert
    ] {
        assert_eq!(parse_client_hello(input), ClientHello::NotTls, "{input:?}");
    }
}

#[test]
fn a_non_handshake_record_in_the_middle_is_not_tls() {
    let msg = hello_message(Some("a.example.com"), 0);
    let mut input = records(&msg[..10], 10);
    input.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
    assert_eq!(parse_client_hello(&input), ClientHello::NotTls);
}

#[test]
fn malformed_inner_lengths_are_not_tls() {
    let msg = hello_message(Some("a.example.com"), 0);
    // Session id length 33, odd cipher-suite length, extension length past the end.
    for (at, value) in [(38usize, 33u8), (72, 3), (80, 0xff)] {
        let mut bad = msg.clone();
        bad[at] = value;
        let got = parse_client_hello(&records(&bad, 512));
        assert_ne!(got, ClientHello::Sni("a.example.com".into()), "offset {at}");
        assert_ne!(got, ClientHello::Incomplete, "offset {at}");
    }
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let good = records(&hello_message(Some("a.example.com"), 100), 50);
    for _ in 0..20_000 {
        let mut input = if rng.random_bool(0.5) {
            good.clone()
        } else {
            (0..rng.random_range(0..300))
                .map(|_| rng.random())
                .collect()
        };
        // Flip a few bytes and cut somewhere.
        for _ in 0..rng.random_range(0..4) {
            if !input.is_empty() {
                let i = rng.random_range(0..input.len());
                input[i] = rng.random();
            }
        }
        let cut = rng.random_range(0..=input.len());
        let _ = parse_client_hello(&input[..cut]);
    }
}
