//! Writing the PROXY protocol header the gateway sends to an upstream before any client byte.
//! Both addresses of a header must be of one family; when they differ (an IPv4 client on an IPv6
//! listener's mapped address, say), the IPv4 one is written IPv4-mapped into IPv6.

use std::net::{IpAddr, SocketAddr};

use bytes::{BufMut, BytesMut};

use super::V2_SIGNATURE;

/// Appends a v1 (text) header for a TCP connection from `source` to `destination`.
pub fn write_v1(source: SocketAddr, destination: SocketAddr, out: &mut BytesMut) {
    let (src, dst) = same_family(source.ip(), destination.ip());
    let family = if src.is_ipv4() { "TCP4" } else { "TCP6" };
    let line = format!(
        "PROXY {family} {src} {dst} {} {}\r\n",
        source.port(),
        destination.port()
    );
    out.extend_from_slice(line.as_bytes());
}

/// Appends a v2 (binary) `PROXY` header for a TCP connection, without TLVs.
pub fn write_v2(source: SocketAddr, destination: SocketAddr, out: &mut BytesMut) {
    out.extend_from_slice(&V2_SIGNATURE);
    out.put_u8(0x21); // version 2, PROXY
    match same_family(source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.put_u8(0x11); // INET, STREAM
            out.put_u16(12);
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        (s, d) => {
            out.put_u8(0x21); // INET6, STREAM
            out.put_u16(36);
            out.extend_from_slice(&v6(s));
            out.extend_from_slice(&v6(d));
        }
    }
    out.put_u16(source.port());
    out.put_u16(destination.port());
}

/// Appends a v2 `LOCAL` header: a connection made by the proxy itself (health checks), whose
/// receiver keeps the real peer address.
pub fn write_v2_local(out: &mut BytesMut) {
    out.extend_from_slice(&V2_SIGNATURE);
    out.put_u8(0x20); // version 2, LOCAL
    out.put_u8(0x00); // UNSPEC
    out.put_u16(0);
}

fn same_family(a: IpAddr, b: IpAddr) -> (IpAddr, IpAddr) {
    match (a, b) {
        (IpAddr::V4(_), IpAddr::V6(_)) | (IpAddr::V6(_), IpAddr::V4(_)) => {
            (IpAddr::V6(v6_addr(a)), IpAddr::V6(v6_addr(b)))
        }
        same => same,
    }
}

fn v6_addr(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn v6(ip: IpAddr) -> [u8; 16] {
    v6_addr(ip).octets()
}
