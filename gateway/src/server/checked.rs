//! The IO wrapper between hyper and a client connection: it applies [`Framing`] to an HTTP/1
//! connection's incoming bytes, and gathers an HTTP/2 connection's writes ([`WriteGather`]).
//!
//! Bytes of a complete, well-framed request go to hyper as read (the common case costs one scan
//! of the head and nothing per body byte beyond counting). An incomplete head is held back until
//! it is whole, so hyper never starts on a request the checks would refuse. A refused request is
//! replaced with a line hyper's own parser answers with `400 Bad Request` and
//! `connection: close`; hyper sends that after the responses to any earlier pipelined requests,
//! and the stream ends there. Inside a body, the stream simply ends at the malformed byte, which
//! hyper reports as a body error (the gateway's `400`). A head longer than the limit ends the
//! stream once hyper has the limit's worth of it, which hyper answers with `431`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::coalesce::WriteGather;
use super::idle::Activity;
use super::policy::Rejections;
use gateway_http1::framing::{Framing, Scan, Violation, escape_target};

/// What hyper is handed instead of a refused request: a method that is not a token, which its
/// parser answers with 400.
const REFUSED_HEAD: &[u8] = b"\x00 / HTTP/1.1\r\n\r\n";

/// An IO stream whose HTTP/1 requests are checked for ambiguous framing.
pub struct CheckedIo<T> {
    inner: T,
    framing: Framing,
    /// Bytes of a request head that is not complete yet.
    held: BytesMut,
    /// Checked bytes to hand on before reading more.
    ready: Bytes,
    /// A request was refused: after `ready`, the stream ends.
    closing: bool,
    rejected: Rejections,
    writes: WriteGather,
    /// Where the service records that the connection switched protocols.
    activity: Arc<Activity>,
    /// `held` was rewritten (its target escaped) and is to be scanned again before reading.
    rescan: bool,
}

impl<T> CheckedIo<T> {
    /// Wraps `inner`; [`Framing::off`] makes this a plain pass-through.
    pub fn new(inner: T, framing: Framing, rejected: Rejections, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            framing,
            held: BytesMut::new(),
            ready: Bytes::new(),
            closing: false,
            rejected,
            writes: WriteGather::default(),
            activity,
            rescan: false,
        }
    }

    /// Records a refusal: what may still go, then (for a request head) the replacement, then
    /// the end of the stream.
    fn refuse(&mut self, pass: Bytes, violation: Violation, head: bool) {
        tracing::debug!(
            reason = violation.reason(),
            "ambiguous HTTP/1 request framing; refusing"
        );
        self.rejected.count(violation.reason());
        self.ready = if head {
            let mut out = BytesMut::with_capacity(pass.len() + REFUSED_HEAD.len());
            out.extend_from_slice(&pass);
            out.extend_from_slice(REFUSED_HEAD);
            out.freeze()
        } else {
            pass
        };
        self.held.clear();
        self.closing = true;
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CheckedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.closing {
                return Poll::Ready(Ok(()));
            }
            if this.framing.switch_asked() && this.activity.switched_protocols() {
                // Whatever was held is the new protocol's.
                this.framing.switched();
                if !this.held.is_empty() {
                    this.ready = this.held.split().freeze();
                    continue;
                }
            }
            if this.held.is_empty() {
                let before = buf.filled().len();
                ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                if this.framing.is_off() || buf.filled().len() == before {
                    return Poll::Ready(Ok(()));
                }
                let fresh = &buf.filled()[before..];
                let keep = match this.framing.scan(fresh) {
                    Scan::Pass => return Poll::Ready(Ok(())),
                    Scan::Hold(n) => {
                        this.held.extend_from_slice(&fresh[n..]);
                        n
                    }
                    Scan::Reject(n, v) => {
                        this.refuse(Bytes::new(), v, true);
                        n
                    }
                    Scan::Cut(n, v) => {
                        this.refuse(Bytes::new(), v, false);
                        n
                    }
                    Scan::Escape(n) => {
                        this.held.extend_from_slice(&escape_target(&fresh[n..]));
                        this.rescan = true;
                        n
                    }
                    Scan::Truncate(n) => {
                        this.closing = true;
                        n
                    }
                };
                buf.set_filled(before + keep);
                if keep > 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            // A head is partly held: read what follows it and look again (at once, when its
            // target was just escaped).
            if !std::mem::take(&mut this.rescan) {
                let mut space = [0u8; 8192];
                let mut more = ReadBuf::new(&mut space);
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut more))?;
                if more.filled().is_empty() {
                    // The peer ended mid-head: hand it on; the parser reports the incomplete
                    // message.
                    this.ready = this.held.split().freeze();
                    this.closing = true;
                    continue;
                }
                this.held.extend_from_slice(more.filled());
            }
            match this.framing.scan(&this.held) {
                Scan::Pass => this.ready = this.held.split().freeze(),
                Scan::Hold(n) => this.ready = this.held.split_to(n).freeze(),
                Scan::Reject(n, v) => {
                    let pass = this.held.split_to(n).freeze();
                    this.refuse(pass, v, true);
                }
                Scan::Cut(n, v) => {
                    let pass = this.held.split_to(n).freeze();
                    this.refuse(pass, v, false);
                }
                Scan::Escape(n) => {
                    this.ready = this.held.split_to(n).freeze();
                    let escaped = escape_target(&this.held);
                    this.held.clear();
                    this.held.extend_from_slice(&escaped);
                    this.rescan = true;
                }
                Scan::Truncate(n) => {
                    this.ready = this.held.split_to(n).freeze();
                    this.held.clear();
                    this.closing = true;
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CheckedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let gather = this.framing.is_http2();
        this.writes
            .poll_write(gather, Pin::new(&mut this.inner), cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let gather = this.framing.is_http2();
        this.writes
            .poll_write_vectored(gather, Pin::new(&mut this.inner), cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.writes.poll_flush(Pin::new(&mut this.inner), cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.writes.poll_shutdown(Pin::new(&mut this.inner), cx)
    }
}

/// Writes of an HTTP/1 connection pass straight through (only HTTP/2's are gathered), so a
/// file sent here goes out in order after what was written before it.
impl<T: super::sendfile::SendFile> super::sendfile::SendFile for CheckedIo<T> {
    fn sends_files(&self) -> bool {
        !self.framing.is_http2() && self.inner.sends_files()
    }

    fn poll_write_more(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_write_more(cx, bufs)
    }

    fn poll_send_file(
        &self,
        cx: &mut Context<'_>,
        file: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_send_file(cx, file, offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Writes `pieces` one at a time into a pipe read through [`CheckedIo`]; returns what the
    /// parser would have been handed.
    async fn through(pieces: &[&[u8]]) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(64);
        let mut io = CheckedIo::new(
            server,
            Framing::http1(8192, true),
            Rejections::default(),
            Activity::new(true),
        );
        let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
        let writer = tokio::spawn(async move {
            for p in pieces {
                if client.write_all(&p).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
        let mut out = Vec::new();
        io.read_to_end(&mut out).await.unwrap();
        writer.await.unwrap();
        out
    }

    #[tokio::test]
    async fn an_http2_preface_turns_write_gathering_on_and_http1_leaves_it_off() {
        use crate::server::coalesce::{Deferring, owed};

        for (first, gathered) in [
            (&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], true),
            (b"GET / HTTP/1.1\r\n\r\n", false),
        ] {
            let (mut client, server) = tokio::io::duplex(1024);
            let mut io = CheckedIo::new(
                server,
                Framing::http1(8192, true),
                Rejections::default(),
                Activity::new(true),
            );
            client.write_all(first).await.unwrap();
            let mut buf = vec![0u8; first.len()];
            io.read_exact(&mut buf).await.unwrap();
            {
                let _deferring = Deferring::start();
                io.write_all(b"answer").await.unwrap();
                io.flush().await.unwrap();
                assert_eq!(owed(), gathered);
            }
            io.flush().await.unwrap();
            let mut got = [0u8; 6];
            client.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"answer");
        }
    }

    #[tokio::test]
    async fn good_requests_pass_unchanged_however_they_arrive() {
        let input: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(through(&[input]).await, input);
        let bytes: Vec<&[u8]> = input.chunks(3).collect();
        assert_eq!(through(&bytes).await, input);
    }

    #[tokio::test]
    async fn targets_with_bytes_the_uri_parser_refuses_are_escaped_however_they_arrive() {
        let input: &[u8] = b"\r\nGET /a\"b<c>`?q=\"x\" HTTP/1.1\r\nHost: a\r\n\r\nGET /plain HTTP/1.1\r\n\r\nPOST /<p> HTTP/1.1\r\nContent-Length: 4\r\n\r\n<b>\"";
        let want: &[u8] = b"\r\nGET /a%22b%3Cc%3E%60?q=%22x%22 HTTP/1.1\r\nHost: a\r\n\r\nGET /plain HTTP/1.1\r\n\r\nPOST /%3Cp%3E HTTP/1.1\r\nContent-Length: 4\r\n\r\n<b>\"";
        assert_eq!(through(&[input]).await, want);
        let bytes: Vec<&[u8]> = input.chunks(3).collect();
        assert_eq!(through(&bytes).await, want);
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(through(&bytes).await, want);
    }

    #[tokio::test]
    async fn a_refused_head_becomes_a_line_the_parser_refuses_and_the_stream_ends() {
        let good: &[u8] = b"GET / HTTP/1.1\r\n\r\n";
        let bad: &[u8] = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n";
        let want = [good, REFUSED_HEAD].concat();
        assert_eq!(through(&[&[good, bad].concat()]).await, want);
        assert_eq!(through(&[good, &bad[..20], &bad[20..]]).await, want);
        // Inside a body, the stream just ends at the bad byte.
        let body: &[u8] =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nz\r\nGET /x HTTP/1.1\r\n\r\n";
        let cut = body.iter().position(|&b| b == b'z').unwrap();
        assert_eq!(through(&[body]).await, &body[..cut]);
    }

    #[tokio::test]
    async fn an_oversized_head_reaches_the_parser_cut_at_the_limit() {
        // The limit is 8,192 bytes; this head is complete past it, with a request after it.
        let good: &[u8] = b"GET / HTTP/1.1\r\n\r\n";
        let big = [
            b"GET /big HTTP/1.1\r\nX-Pad: ".as_slice(),
            &[b'a'; 8192],
            b"\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        ]
        .concat();
        let want = [good, &big[..8192]].concat();
        assert_eq!(through(&[&[good, &big].concat()]).await, want);
        assert_eq!(through(&[good, &big[..100], &big[100..]]).await, want);
    }
}
