//! Reading the first bytes of a connection until a parser decides (the PROXY protocol header,
//! the TLS ClientHello): bounded in size and time, keeping every byte read in the caller's
//! buffer so nothing is lost for whoever reads next.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::StreamError;

/// Reads from `io` into `buf` (which may already hold bytes) until `decide` returns a verdict.
/// `decide` sees the whole buffer each time and may consume from its front. Fails when `io`
/// ends, `buf` reaches `max` bytes, or `timeout` passes (zero: no limit); `what` names the
/// header in those errors.
pub(crate) async fn read_until<R, T>(
    io: &mut R,
    buf: &mut BytesMut,
    timeout: Duration,
    max: usize,
    what: &'static str,
    mut decide: impl FnMut(&mut BytesMut) -> Result<Option<T>, StreamError>,
) -> Result<T, StreamError>
where
    R: AsyncRead + Unpin,
{
    let deadline = (!timeout.is_zero()).then(|| tokio::time::Instant::now() + timeout);
    loop {
        if let Some(verdict) = decide(buf)? {
            return Ok(verdict);
        }
        if buf.len() >= max {
            return Err(StreamError::HeaderTooLarge { what, max });
        }
        // Modest reads: most headers are small, and what follows them is someone else's.
        buf.reserve(4096.min(max - buf.len()));
        let mut limited = (&mut *io).take((max - buf.len()) as u64);
        let read = limited.read_buf(buf);
        let result = match deadline {
            Some(d) => tokio::time::timeout_at(d, read).await,
            None => Ok(read.await),
        };
        match result {
            Ok(Ok(0)) => return Err(StreamError::HeaderEof(what)),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(StreamError::HeaderTimeout { what, timeout }),
        }
    }
}
