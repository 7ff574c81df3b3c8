//! The byte stream under an upstream HTTP/1.1 connection: plain TCP or TLS, as one concrete
//! type so the exchange code is compiled once, and a probe for connections between exchanges,
//! which nobody reads: closed by the peer, or sent bytes nobody asked for.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// What [`Io::probe_idle`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Idle {
    /// Nothing arrived: the connection can carry a request.
    Quiet,
    /// The peer closed it (or it failed).
    Closed,
    /// Bytes arrived that answer no request: a body after a bodiless answer, or an answer sent
    /// ahead. The next request would read them as its answer (response-queue poisoning).
    Unexpected,
}

/// An upstream connection's transport.
pub(crate) enum Io {
    Plain(TcpStream),
    /// Boxed: a rustls client connection is about a kilobyte, and most upstreams are plain.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Io {
    fn tcp(&self) -> &TcpStream {
        match self {
            Io::Plain(s) => s,
            Io::Tls(s) => s.get_ref().0,
        }
    }

    /// Reads what is there into `buf`'s spare room, growing it to at least `room` bytes first.
    /// `Ok(0)` is the peer's end of stream.
    ///
    /// A short read on a plain socket clears tokio's readiness (it has drained the socket), so
    /// the next wait, and [`Io::probe_idle`], go by epoll rather than by another `recv` that
    /// would only say "would block".
    pub(crate) fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
        room: usize,
    ) -> Poll<io::Result<usize>> {
        if buf.capacity() - buf.len() < room {
            buf.reserve(room);
        }
        tokio_util::io::poll_read_buf(Pin::new(self), cx, buf)
    }

    /// What a connection between exchanges says when looked at without blocking. Nothing reads
    /// it, so a peer's close (or stray bytes) shows only as readiness that tokio recorded from
    /// epoll meanwhile; without it the socket is quiet and no system call is made. With it, one
    /// non-blocking read into `buf` tells: "would block" is a TLS record the library consumed
    /// (a session ticket), end of stream or an error a closed connection, and bytes are bytes
    /// nobody asked for.
    pub(crate) fn probe_idle(&mut self, buf: &mut BytesMut) -> Idle {
        let mut cx = Context::from_waker(Waker::noop());
        if self.tcp().poll_read_ready(&mut cx).is_pending() {
            return Idle::Quiet;
        }
        let before = buf.len();
        match self.poll_fill(&mut cx, buf, 512) {
            Poll::Pending if buf.len() == before => Idle::Quiet,
            Poll::Ready(Ok(0) | Err(_)) => Idle::Closed,
            Poll::Pending | Poll::Ready(Ok(_)) => Idle::Unexpected,
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
