//! The relay for streams whose filters inspect data: each chunk read is passed through the
//! filters' data hooks (client bytes in order, upstream bytes in reverse order) and what they
//! leave is written on. The last call of a direction has `end_of_stream` set, so a filter that
//! buffers can emit what it kept before the write side is shut down.
//!
//! Both directions share the filter instances; a lock around them (uncontended except when both
//! directions have a chunk at once) serialises the hooks, so a filter never sees two calls at
//! the same time.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use super::{BUFFER_SIZE, Direction, Progress};
use crate::StreamError;
use crate::filter::ActiveFilters;

/// Relays through `filters` until both directions have ended; the first error or filter
/// `Close` ends both.
pub async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    filters: &mut ActiveFilters,
    progress: &Progress,
) -> Result<(), StreamError> {
    let filters = Mutex::new(filters);
    let (mut client_r, mut client_w) = client.split();
    let (mut upstream_r, mut upstream_w) = upstream.split();
    tokio::try_join!(
        pump(
            &mut client_r,
            &mut upstream_w,
            Direction::In,
            &filters,
            progress
        ),
        pump(
            &mut upstream_r,
            &mut client_w,
            Direction::Out,
            &filters,
            progress
        ),
    )?;
    Ok(())
}

async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    dir: Direction,
    filters: &Mutex<&mut ActiveFilters>,
    progress: &Progress,
) -> Result<(), StreamError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut chunk = BytesMut::with_capacity(BUFFER_SIZE);
    loop {
        chunk.clear();
        chunk.reserve(BUFFER_SIZE);
        let eos = r.read_buf(&mut chunk).await? == 0;
        {
            let mut f = filters.lock().await;
            match dir {
                Direction::In => f.downstream(&mut chunk, eos).await?,
                Direction::Out => f.upstream(&mut chunk, eos).await?,
            }
        }
        if chunk.is_empty() {
            progress.touch();
        } else {
            w.write_all(&chunk).await?;
            progress.add(dir, chunk.len());
        }
        if eos {
            half_close(w).await?;
            return Ok(());
        }
    }
}

/// Shuts down the write side; a peer that is already gone is not an error here (the other
/// direction reports it if it matters).
async fn half_close<W: AsyncWrite + Unpin>(w: &mut W) -> std::io::Result<()> {
    match w.shutdown().await {
        Err(e) if e.kind() != std::io::ErrorKind::NotConnected => Err(e),
        _ => Ok(()),
    }
}
