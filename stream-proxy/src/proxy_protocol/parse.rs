//! Parsing a PROXY protocol v1 (text) or v2 (binary) header from the start of a byte stream,
//! as a pure function: [`parse`] says "need more", or returns the header and its length, or
//! rejects the bytes with a reason. v2 TLVs are skipped; `LOCAL` and unknown address families
//! are reported so the caller keeps the real peer address.
//!
//! Spec: <https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt>.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{ProxyHeader, V1_MAX, V2_SIGNATURE};
use crate::StreamError;

type Result<T> = std::result::Result<T, StreamError>;

const fn bad(reason: &'static str) -> StreamError {
    StreamError::ProxyProtocol(reason)
}

/// `Ok(None)`: the bytes so far are a prefix of a valid header. `Ok(Some((header, len)))`: a
/// complete header of `len` bytes. `Err`: not a PROXY protocol header (close the connection).
pub fn parse(buf: &[u8]) -> Result<Option<(ProxyHeader, usize)>> {
    // Whole signatures first: fixed-length comparisons, the case of every complete header.
    if buf.starts_with(&V2_SIGNATURE) {
        return parse_v2(buf);
    }
    if buf.starts_with(b"PROXY ") {
        return parse_v1(buf);
    }
    if buf.is_empty() {
        return Ok(None);
    }
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] == V2_SIGNATURE[..n] {
        return if n < V2_SIGNATURE.len() {
            Ok(None)
        } else {
            parse_v2(buf)
        };
    }
    let n = buf.len().min(6);
    if buf[..n] == b"PROXY "[..n] {
        return if n < 6 { Ok(None) } else { parse_v1(buf) };
    }
    Err(bad(
        "the connection does not start with a PROXY protocol header",
    ))
}

fn parse_v1(buf: &[u8]) -> Result<Option<(ProxyHeader, usize)>> {
    let window = &buf[..buf.len().min(V1_MAX)];
    // The first line feed ends the header, and must follow a carriage return: an earlier CRLF
    // would have an earlier line feed, and a bare one is refused.
    // The same bytes are refused whether or not the CRLF has arrived yet, so the verdict on a
    // header never depends on how it was split (`UNKNOWN` accepts anything else up to CRLF).
    let Some(lf) = window.iter().position(|&b| b == b'\n' || b == 0) else {
        return if buf.len() >= V1_MAX {
            Err(bad("v1 header longer than 107 bytes"))
        } else {
            Ok(None)
        };
    };
    if window[lf] == 0 || window[lf - 1] != b'\r' {
        return Err(bad("v1 header with a bare line feed or a NUL byte"));
    }
    let end = lf - 1;
    let line = std::str::from_utf8(&buf[6..end]).map_err(|_| bad("v1 header is not ASCII"))?;
    let mut fields = line.split(' ');
    let header = match fields.next() {
        Some("UNKNOWN") => ProxyHeader::Unknown,
        Some(family @ ("TCP4" | "TCP6")) => {
            let (Some(src), Some(dst), Some(sport), Some(dport), None) = (
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
            ) else {
                return Err(bad("v1 header needs exactly four address fields"));
            };
            let v6 = family == "TCP6";
            let source = SocketAddr::new(v1_ip(src, v6)?, v1_port(sport)?);
            let destination = SocketAddr::new(v1_ip(dst, v6)?, v1_port(dport)?);
            ProxyHeader::Proxied {
                source,
                destination,
            }
        }
        _ => return Err(bad("v1 protocol is not TCP4, TCP6 or UNKNOWN")),
    };
    Ok(Some((header, lf + 1)))
}

fn v1_ip(text: &str, v6: bool) -> Result<IpAddr> {
    let ip = if v6 {
        text.parse::<Ipv6Addr>().map(IpAddr::V6)
    } else {
        text.parse::<Ipv4Addr>().map(IpAddr::V4)
    };
    ip.map_err(|_| bad("v1 address does not match its family"))
}

fn v1_port(text: &str) -> Result<u16> {
    // Decimal without sign or leading zeros, as the spec requires.
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    canonical
        .then(|| text.parse().ok())
        .flatten()
        .ok_or(bad("v1 port is not a number from 0 to 65535"))
}

fn parse_v2(buf: &[u8]) -> Result<Option<(ProxyHeader, usize)>> {
    let Some(fixed) = buf.get(..16) else {
        return Ok(None);
    };
    let (version, command) = (fixed[12] >> 4, fixed[12] & 0x0f);
    if version != 2 {
        return Err(bad("v2 version nibble is not 2"));
    }
    let (family, transport) = (fixed[13] >> 4, fixed[13] & 0x0f);
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    if command > 1 || family > 3 || transport > 2 {
        return Err(bad("v2 command, family or transport is unknown"));
    }
    let Some(payload) = buf.get(16..16 + len) else {
        return Ok(None);
    };
    let header = match (command, family) {
        (0, _) => ProxyHeader::Local,
        (_, 1) => {
            let a = payload
                .get(..12)
                .ok_or(bad("v2 IPv4 addresses truncated"))?;
            let ip = |o: usize| IpAddr::from([a[o], a[o + 1], a[o + 2], a[o + 3]]);
            let port = |o: usize| u16::from_be_bytes([a[o], a[o + 1]]);
            ProxyHeader::Proxied {
                source: SocketAddr::new(ip(0), port(8)),
                destination: SocketAddr::new(ip(4), port(10)),
            }
        }
        (_, 2) => {
            let a = payload
                .get(..36)
                .ok_or(bad("v2 IPv6 addresses truncated"))?;
            let ip = |o: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&a[o..o + 16]);
                IpAddr::from(octets)
            };
            let port = |o: usize| u16::from_be_bytes([a[o], a[o + 1]]);
            ProxyHeader::Proxied {
                source: SocketAddr::new(ip(0), port(32)),
                destination: SocketAddr::new(ip(16), port(34)),
            }
        }
        // UNSPEC or UNIX: no IP addresses to use.
        _ => ProxyHeader::Unknown,
    };
    Ok(Some((header, 16 + len)))
}
