//! The PROXY protocol (v1 text, v2 binary) in both directions: reading the header a front load
//! balancer puts before the client's bytes (`accept_proxy_protocol`, on TCP streams and on HTTP
//! listeners), and writing one to an upstream (`proxy_protocol: v1 | v2`). The parser and the
//! writers are pure functions over bytes; [`read_header`] is the async loop around the parser.

mod parse;
mod write;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::AsyncRead;

pub use parse::parse;
pub use write::{write_v1, write_v2, write_v2_local};

use crate::StreamError;
use crate::peek::read_until;

/// The 12-byte signature that starts every v2 header.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Longest v1 header, CRLF included.
pub const V1_MAX: usize = 107;
/// Longest v2 header: the 16 fixed bytes and a 16-bit payload length.
pub const V2_MAX: usize = 16 + u16::MAX as usize;

/// What a received header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHeader {
    /// The load balancer's own connection (v2 `LOCAL`, e.g. a health check): keep the peer
    /// address.
    Local,
    /// Addresses not conveyed (v1 `UNKNOWN`, v2 `UNSPEC` or `UNIX`): keep the peer address.
    Unknown,
    /// A proxied connection from `source` to `destination`.
    Proxied {
        /// The original client.
        source: SocketAddr,
        /// The address the client connected to.
        destination: SocketAddr,
    },
}

impl ProxyHeader {
    /// The client and local addresses to use, given the socket's own.
    pub fn addresses(&self, peer: SocketAddr, local: SocketAddr) -> (SocketAddr, SocketAddr) {
        match *self {
            Self::Proxied {
                source,
                destination,
            } => (source, destination),
            Self::Local | Self::Unknown => (peer, local),
        }
    }
}

/// Reads a header from `io` into `buf` (which may already hold bytes) within `timeout` (zero:
/// no limit). On success the header's bytes are removed from `buf` and whatever followed them
/// stays there: the caller must use those bytes before reading `io` again.
pub async fn read_header<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    timeout: Duration,
) -> Result<ProxyHeader, StreamError> {
    let decide = |b: &mut BytesMut| {
        Ok(parse(b)?.map(|(header, len)| {
            b.advance(len);
            header
        }))
    };
    read_until(io, buf, timeout, V2_MAX, "PROXY protocol header", decide).await
}

#[cfg(test)]
mod tests;
