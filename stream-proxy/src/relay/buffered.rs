//! The portable relay: one buffer per direction, read then write, with half-close. Unlike
//! `tokio::io::copy_bidirectional` it counts bytes as they move (live counters, idle tracking).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{BUFFER_SIZE, Direction, Progress};

/// Relays until both directions have ended; the first error ends both.
pub async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    progress: &Progress,
) -> io::Result<()> {
    let (mut client_r, mut client_w) = client.split();
    let (mut upstream_r, mut upstream_w) = upstream.split();
    tokio::try_join!(
        copy(&mut client_r, &mut upstream_w, Direction::In, progress),
        copy(&mut upstream_r, &mut client_w, Direction::Out, progress),
    )?;
    Ok(())
}

/// Copies until `r` ends, then shuts down `w`'s write side.
pub async fn copy<R, W>(r: &mut R, w: &mut W, dir: Direction, progress: &Progress) -> io::Result<()>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut buf = vec![0u8; BUFFER_SIZE];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return half_close(w).await;
        }
        w.write_all(&buf[..n]).await?;
        progress.add(dir, n);
    }
}

/// Shuts down the write side; a peer that is already gone is not an error here (the other
/// direction reports it if it matters).
pub(crate) async fn half_close<W: AsyncWrite + Unpin + ?Sized>(w: &mut W) -> io::Result<()> {
    match w.shutdown().await {
        Err(e) if e.kind() != io::ErrorKind::NotConnected => Err(e),
        _ => Ok(()),
    }
}
