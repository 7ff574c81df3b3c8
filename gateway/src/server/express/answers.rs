//! The fast path's output: the answers gathered for one write, as header text with the bodies
//! of cached files referenced rather than copied, and their vectored write.
//!
//! Copying a file's body into a per-connection buffer cost more than the copy's instructions:
//! at 1,000 connections each connection's buffer is cold, and writing a 1 KiB body into it was
//! 20 cache-line misses per request, most of the memory traffic of a cached 1 KiB file (callgrind's
//! cache simulation). The cached body is shared by every connection and stays warm; the kernel
//! copies it from there. The buffer also no longer grows to a large file's size and keeps it.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;

use crate::telemetry::trace::OpenSpan;

/// Bodies up to this size are copied into the text: an extra slice costs more than the copy.
const COPY_UP_TO: usize = 256;

/// Slices of the common write, made on the stack: one answer (text, body, the text after it).
/// Filling an array costs two stores a slice on every write, so it is no larger than this.
const FEW_SLICES: usize = 4;

/// Most slices handed to one vectored write (the kernel takes up to 1,024): pipelined answers
/// with more bodies than [`FEW_SLICES`] holds.
const MANY_SLICES: usize = 128;

/// Room made for the text at a connection's start: one small answer's status line, headers
/// and body (`respond`'s are 150–250 bytes). Grown from nothing, the first answer's lines cost
/// four or five reallocations, on every new connection. No more: the text keeps its room for
/// the connection's life (512 bytes cost 10,000 kept-alive connections 3.5 MB more).
const FIRST_TEXT: usize = 256;

/// Answers waiting to be written, in order.
#[derive(Default)]
pub(super) struct Answers {
    /// Status lines, header lines and small bodies.
    pub(super) text: Vec<u8>,
    /// Bodies that go after `text[..at]`, each with its `at` (in order).
    bodies: Vec<(usize, Bytes)>,
    /// The bodies' total length.
    body_bytes: usize,
    /// The recorded spans of these answers' requests, ended when the answers have been
    /// written ([`Answers::clear`]); dropped unwritten, they record that the client left.
    spans: Vec<OpenSpan>,
}

impl Answers {
    /// Answers with room for the first one's text.
    pub(super) fn with_room() -> Self {
        Self {
            text: Vec::with_capacity(FIRST_TEXT),
            ..Self::default()
        }
    }

    /// Appends a body after the text so far.
    pub(super) fn push_body(&mut self, body: &Bytes) {
        if body.len() <= COPY_UP_TO {
            self.text.extend_from_slice(body);
        } else {
            self.bodies.push((self.text.len(), body.clone()));
            self.body_bytes += body.len();
        }
    }

    /// Bytes gathered.
    pub(super) fn len(&self) -> usize {
        self.text.len() + self.body_bytes
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds the span of an answer's request.
    pub(super) fn push_span(&mut self, span: OpenSpan) {
        self.spans.push(span);
    }

    /// Empties it once written, keeping the text's room: the answers' spans end now.
    pub(super) fn clear(&mut self) {
        self.text.clear();
        self.bodies.clear();
        self.body_bytes = 0;
        // Checked here and ended out of line, so that without spans (traces off, or the
        // request not sampled) this stays a few stores inlined into the write loop.
        if !self.spans.is_empty() {
            self.end_spans();
        }
    }

    #[inline(never)]
    fn end_spans(&mut self) {
        for span in self.spans.drain(..) {
            span.finish();
        }
    }

    /// Fills `slices` with what is left from byte `from` on, in order; returns how many.
    fn slices<'a>(&'a self, from: usize, slices: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let mut skip = from;
        let mut text_at = 0;
        let mut push = |part: &'a [u8], n: &mut usize| {
            if *n == slices.len() {
                return;
            }
            if skip >= part.len() {
                skip -= part.len();
                return;
            }
            let rest = &part[skip..];
            skip = 0;
            if !rest.is_empty() {
                slices[*n] = IoSlice::new(rest);
                *n += 1;
            }
        };
        for (at, body) in &self.bodies {
            push(&self.text[text_at..*at], &mut n);
            push(body, &mut n);
            text_at = *at;
        }
        push(&self.text[text_at..], &mut n);
        n
    }
}

/// Writes and flushes the answers.
pub(super) struct WriteAll<'a, IO> {
    pub(super) io: &'a mut IO,
    pub(super) answers: &'a Answers,
    pub(super) written: usize,
    /// Whether all was written and flushed.
    pub(super) done: bool,
}

impl<IO: AsyncWrite + Unpin> Future for WriteAll<'_, IO> {
    type Output = std::io::Result<usize>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let total = this.answers.len();
        while this.written < total {
            let needed = 2 * this.answers.bodies.len() + 1;
            let k = if needed <= FEW_SLICES {
                let mut slices = [IoSlice::new(&[]); FEW_SLICES];
                let n = this.answers.slices(this.written, &mut slices);
                std::task::ready!(Pin::new(&mut *this.io).poll_write_vectored(cx, &slices[..n]))?
            } else {
                let mut slices = vec![IoSlice::new(&[]); needed.min(MANY_SLICES)];
                let n = this.answers.slices(this.written, &mut slices);
                std::task::ready!(Pin::new(&mut *this.io).poll_write_vectored(cx, &slices[..n]))?
            };
            if k == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            this.written += k;
        }
        std::task::ready!(Pin::new(&mut *this.io).poll_flush(cx))?;
        this.done = true;
        Poll::Ready(Ok(this.written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers with small and large bodies between text.
    fn sample() -> (Answers, Vec<u8>) {
        let big = Bytes::from(vec![b'x'; 1000]);
        let other = Bytes::from(vec![b'y'; 300]);
        let mut a = Answers::default();
        let mut expected = Vec::new();
        for (head, body) in [
            (&b"HEAD1\r\n\r\n"[..], &big),
            (b"H2\r\n\r\n", &Bytes::from_static(b"small")),
            (b"H3\r\n\r\n", &other),
            (b"", &big),
        ] {
            a.text.extend_from_slice(head);
            a.push_body(body);
            expected.extend_from_slice(head);
            expected.extend_from_slice(body);
        }
        a.text.extend_from_slice(b"tail");
        expected.extend_from_slice(b"tail");
        (a, expected)
    }

    #[test]
    fn the_slices_from_any_offset_are_the_bytes_in_order() {
        let (a, expected) = sample();
        assert_eq!(a.len(), expected.len());
        assert_eq!(a.bodies.len(), 3, "the small body is copied");
        for from in 0..=expected.len() {
            let mut slices = [IoSlice::new(&[]); MANY_SLICES];
            let n = a.slices(from, &mut slices);
            let joined: Vec<u8> = slices[..n].iter().flat_map(|s| s.iter().copied()).collect();
            assert_eq!(joined, expected[from..], "from {from}");
            assert!(slices[..n].iter().all(|s| !s.is_empty()));
        }
        let mut one = [IoSlice::new(&[])];
        assert_eq!(a.slices(3, &mut one), 1);
        assert_eq!(&*one[0], &expected[3..9]);
    }

    /// A writer that takes at most `step` bytes a call, through vectored writes or not.
    struct Trickle {
        got: Vec<u8>,
        step: usize,
        vectored: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let k = buf.len().min(self.step);
            self.got.extend_from_slice(&buf[..k]);
            Poll::Ready(Ok(k))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            if !self.vectored {
                let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
                return self.poll_write(cx, first);
            }
            let mut left = self.step;
            let mut k = 0;
            for b in bufs {
                let take = b.len().min(left);
                self.got.extend_from_slice(&b[..take]);
                (left, k) = (left - take, k + take);
            }
            Poll::Ready(Ok(k))
        }

        fn is_write_vectored(&self) -> bool {
            self.vectored
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// One answer with a large body: the common write, from the stack's slices.
    fn single() -> (Answers, Vec<u8>) {
        let body = Bytes::from(vec![b'z'; 1024]);
        let mut a = Answers::default();
        a.text.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        a.push_body(&body);
        let mut expected = a.text.clone();
        expected.extend_from_slice(&body);
        (a, expected)
    }

    #[tokio::test]
    async fn partial_writes_resume_where_they_stopped() {
        for (a, expected) in [sample(), single()] {
            write_in_steps(&a, &expected).await;
        }
    }

    async fn write_in_steps(a: &Answers, expected: &[u8]) {
        for vectored in [true, false] {
            for step in [1, 7, 999, 1000, 1001, 1 << 20] {
                let mut io = Trickle {
                    got: Vec::new(),
                    step,
                    vectored,
                };
                let written = WriteAll {
                    io: &mut io,
                    answers: a,
                    written: 0,
                    done: false,
                }
                .await
                .unwrap();
                assert_eq!(written, expected.len());
                assert_eq!(io.got, expected, "step {step}, vectored {vectored}");
            }
        }
    }
}
