//! Closing a client connection without discarding what the client sent last.
//!
//! A socket closed while unread bytes sit in its receive buffer makes the kernel send RST
//! instead of FIN. The client may then lose the response it has not read yet (the `400` for a
//! malformed request), and an HTTP/2 client sees a reset instead of the end of the connection
//! (h2spec's invalid-preface case: the HTTP/2 server reads exactly the 24 preface bytes and stops).
//! Dropping a [`Lingering`] stream first reads away, without waiting, what has already arrived.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Bytes read away at most when closing (more than that was not a stray leftover).
const DRAIN_LIMIT: usize = 64 * 1024;

/// A client TCP stream that drains its receive buffer when dropped.
pub struct Lingering(pub TcpStream);

impl Drop for Lingering {
    fn drop(&mut self) {
        // Not zeroed: most connections end with nothing to read, and zeroing 4 KiB for each
        // is work for nothing.
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut drained = 0;
        // Non-blocking reads only: what has arrived is read, nothing is waited for.
        while drained < DRAIN_LIMIT {
            match self.0.try_read_buf(&mut &mut buf[..]) {
                Ok(n) if n > 0 => drained += n,
                _ => break,
            }
        }
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
