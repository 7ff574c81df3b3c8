//! Writing a file's bytes to a client connection without copying them through user memory:
//! `sendfile(2)` on a plain TCP socket, for the HTTP/1.1 fast path's large bodies: cached ones
//! in sealed memory files ([`crate::static_files::SealedFile`]) and files too large for the
//! cache, from disk ([`crate::static_files::LargeFile`]).
//!
//! A connection's stream is layers (activity tracking, framing checks, the PROXY header's
//! replay, the lingering close) around a `TcpStream`, or a TLS session, or a pipe in the fuzz
//! targets. [`SendFile`] goes through the layers to the socket; a stream that is not a plain
//! socket says so ([`SendFile::sends_files`]) and its bodies are written as bytes.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::task::{Context, Poll, ready};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// The most `sendfile` moves in one call (Linux's limit for one read or write).
const MAX_SEND: usize = 0x7fff_f000;

/// A client stream that may send a file's bytes straight from the file.
pub trait SendFile {
    /// Whether [`SendFile::poll_send_file`] reaches a socket. Not for TLS (the bytes are
    /// encrypted in user memory) nor in-memory pipes.
    fn sends_files(&self) -> bool {
        false
    }

    /// Writes from `bufs` and tells the kernel that more follows (`MSG_MORE`): a response head
    /// then goes out in the same segment as the start of the file sent after it, rather than in
    /// a small segment of its own.
    fn poll_write_more(
        &self,
        _cx: &mut Context<'_>,
        _bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }

    /// Sends up to `len` bytes of `file` from `offset`; returns how many went.
    fn poll_send_file(
        &self,
        _cx: &mut Context<'_>,
        _file: BorrowedFd<'_>,
        _offset: u64,
        _len: usize,
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }
}

impl SendFile for TcpStream {
    fn sends_files(&self) -> bool {
        true
    }

    fn poll_write_more(
        &self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let socket = self.as_raw_fd();
        poll_socket(self, cx, || {
            // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix (std documents it), and
            // the slices outlive the call; the header is zeroed apart from the vector.
            #[allow(
                unsafe_code,
                reason = "sendmsg with MSG_MORE, which std and tokio do not offer"
            )]
            let sent = unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = bufs.as_ptr().cast_mut().cast();
                msg.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
                libc::sendmsg(socket, &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL)
            };
            usize::try_from(sent).map_err(|_| io::Error::last_os_error())
        })
    }

    fn poll_send_file(
        &self,
        cx: &mut Context<'_>,
        file: BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        let socket = self.as_raw_fd();
        let offset = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        poll_socket(self, cx, || {
            let mut at = offset;
            // SAFETY: both descriptors are open for the call (borrowed), and `at` is a valid
            // offset the call updates.
            #[allow(unsafe_code, reason = "sendfile, which std and tokio do not offer")]
            let sent =
                unsafe { libc::sendfile(socket, file.as_raw_fd(), &mut at, len.min(MAX_SEND)) };
            usize::try_from(sent).map_err(|_| io::Error::last_os_error())
        })
    }
}

/// Runs a non-blocking write `op` on `socket` when it is writable, waiting (through tokio's
/// readiness) while the socket buffer is full.
fn poll_socket(
    socket: &TcpStream,
    cx: &mut Context<'_>,
    mut op: impl FnMut() -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        ready!(socket.poll_write_ready(cx))?;
        // `try_io` clears the readiness when `op` would block, so the next poll waits.
        match socket.try_io(Interest::WRITABLE, &mut op) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            res => return Poll::Ready(res),
        }
    }
}

/// Streams that are not plain sockets: their bodies are written as bytes.
impl<T> SendFile for tokio_rustls::server::TlsStream<T> {}
impl SendFile for tokio::io::DuplexStream {}

impl<T: SendFile> SendFile for stream_proxy::Rewind<T> {
    // The replayed prefix is read-side only: writes go straight to the stream.
    fn sends_files(&self) -> bool {
        self.get_ref().sends_files()
    }

    fn poll_write_more(
        &self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_ref().poll_write_more(cx, bufs)
    }

    fn poll_send_file(
        &self,
        cx: &mut Context<'_>,
        file: BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        self.get_ref().poll_send_file(cx, file, offset, len)
    }
}

impl SendFile for super::linger::Lingering {
    fn sends_files(&self) -> bool {
        self.0.sends_files()
    }

    fn poll_write_more(
        &self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.0.poll_write_more(cx, bufs)
    }

    fn poll_send_file(
        &self,
        cx: &mut Context<'_>,
        file: BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        self.0.poll_send_file(cx, file, offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::static_files::SealedFile;
    use tokio::io::AsyncReadExt;

    /// A connected pair on loopback: (the gateway's side, the client's).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"));
        let (client, accepted) = tokio::join!(client, listener.accept());
        (accepted.expect("accept").0, client.expect("connect"))
    }

    #[tokio::test]
    async fn a_file_and_the_head_before_it_arrive_whole_past_a_full_socket_buffer() {
        let (server, mut client) = pair().await;
        // A small send buffer, so that the file does not fit: sending waits for the reader.
        socket2::SockRef::from(&server)
            .set_send_buffer_size(8192)
            .expect("sndbuf");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let sealed = SealedFile::copy_of(&data).expect("memfd");
        let head = b"HTTP/1.1 200 OK\r\n\r\n";
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.expect("read");
            got
        });
        let mut written = 0;
        while written < head.len() {
            let bufs = [IoSlice::new(&head[written..])];
            written += std::future::poll_fn(|cx| server.poll_write_more(cx, &bufs))
                .await
                .expect("head");
        }
        let (mut offset, mut calls) = (0, 0);
        while offset < data.len() {
            let left = data.len() - offset;
            let n = std::future::poll_fn(|cx| {
                server.poll_send_file(cx, sealed.fd(), offset as u64, left)
            })
            .await
            .expect("sendfile");
            assert!(n > 0);
            (offset, calls) = (offset + n, calls + 1);
        }
        drop(server);
        let got = reader.await.expect("reader");
        assert_eq!(&got[..head.len()], head);
        assert!(got[head.len()..] == data[..], "the file's bytes, in order");
        assert!(calls > 1, "the socket buffer filled and sending resumed");
    }
}
