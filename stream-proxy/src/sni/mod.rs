//! SNI routing: read the client's first bytes until the TLS ClientHello is complete (bounded by
//! [`MAX_CLIENT_HELLO`] and a deadline), pick a route by server name, and forward the bytes read
//! unchanged to the chosen upstream. Nothing is decrypted; the TLS session is end to end.

mod parse;
mod routes;

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncRead;

pub use parse::{ClientHello, parse_client_hello};
pub use routes::SniRoutes;

use crate::StreamError;
use crate::peek::read_until;

/// Most bytes read while waiting for a complete ClientHello. Real hellos are a few hundred bytes
/// to ~2 KiB (post-quantum key shares); 16 KiB leaves room for large ones and bounds what a
/// slow or hostile client can make us hold.
pub const MAX_CLIENT_HELLO: usize = 16 * 1024;

/// Reads into `buf` (which may already hold bytes) until it starts with a complete ClientHello
/// or is shown not to be one. A client that sends nothing before the deadline is `NotTls` (a
/// server-speaks-first protocol may take the fallback); a partial hello that stalls, ends or
/// outgrows the buffer is an error, which closes the connection. A zero `timeout` waits as long
/// as it takes.
pub async fn read_client_hello<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    timeout: Duration,
) -> Result<ClientHello, StreamError> {
    let decide = |b: &mut BytesMut| {
        Ok(match parse_client_hello(b) {
            ClientHello::Incomplete => None,
            verdict => Some(verdict),
        })
    };
    match read_until(
        io,
        buf,
        timeout,
        MAX_CLIENT_HELLO,
        "TLS ClientHello",
        decide,
    )
    .await
    {
        Err(StreamError::HeaderTimeout { .. }) if buf.is_empty() => Ok(ClientHello::NotTls),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::parse::tests::{hello_message, records};
    use super::*;

    #[tokio::test]
    async fn reads_a_hello_arriving_in_pieces_and_keeps_every_byte() {
        let input = records(&hello_message(Some("a.example.com"), 500), 100);
        let (mut client, mut server) = tokio::io::duplex(64);
        let sent = input.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for chunk in sent.chunks(7) {
                client.write_all(chunk).await.unwrap();
            }
            client.write_all(b"after").await.unwrap();
            std::future::pending::<()>().await;
        });
        let mut buf = BytesMut::new();
        let got = read_client_hello(&mut server, &mut buf, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(got, ClientHello::Sni("a.example.com".into()));
        assert!(input.starts_with(&buf) || buf.starts_with(&input));
    }

    #[tokio::test(start_paused = true)]
    async fn silence_is_not_tls_but_a_stalled_hello_is_an_error() {
        let (_client, mut server) = tokio::io::duplex(64);
        let mut buf = BytesMut::new();
        let got = read_client_hello(&mut server, &mut buf, Duration::from_secs(5)).await;
        assert_eq!(got.unwrap(), ClientHello::NotTls);

        let (_client, mut server) = tokio::io::duplex(64);
        let mut buf = BytesMut::from(&b"\x16\x03\x01\x02\x00\x01"[..]);
        let got = read_client_hello(&mut server, &mut buf, Duration::from_secs(5)).await;
        assert!(matches!(got, Err(StreamError::HeaderTimeout { .. })));
    }

    #[tokio::test]
    async fn oversized_and_truncated_hellos_are_errors() {
        // A record header announcing a huge handshake message, then endless filler.
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut input = records(&hello_message(Some("a.example.com"), 0), 1 << 14);
            input[6..9].copy_from_slice(&[0x0f, 0xff, 0xff]);
            let _ = client.write_all(&input).await;
            for _ in 0..10 {
                let _ = client.write_all(&[22, 3, 1, 0x40, 0]).await;
                let _ = client.write_all(&[0u8; 1 << 14]).await;
            }
        });
        let mut buf = BytesMut::new();
        let got = read_client_hello(&mut server, &mut buf, Duration::from_secs(5)).await;
        assert!(matches!(got, Err(StreamError::HeaderTooLarge { .. })));
        assert_eq!(buf.len(), MAX_CLIENT_HELLO);

        let (client, mut server) = tokio::io::duplex(64);
        let mut buf = BytesMut::from(&b"\x16\x03\x01\x02"[..]);
        drop(client);
        let got = read_client_hello(&mut server, &mut buf, Duration::from_secs(5)).await;
        assert!(matches!(got, Err(StreamError::HeaderEof(_))));
    }
}
