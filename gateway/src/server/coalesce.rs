//! Write coalescing for HTTP/2 connections: the frames one poll of the connection produces
//! leave in one write (one TLS record, one system call) instead of one write per response.
//!
//! Why: h2 hands a DATA frame of 256 bytes or more to the socket by itself, flushing what it
//! had buffered before it, so ten 1 KiB responses answered together cost ten writes: ten TLS
//! records sealed, ten `writev` calls. An event-loop server gathers them. Here the connection's
//! task ([`super::streams::StreamBatch`]) marks the polls after which it will poll the
//! connection again; during those, a flush only records that it is owed, and the bytes wait in
//! a buffer. The task's last poll of the connection flushes for real, so nothing waits past the
//! task's turn. Buffers come from a per-thread spare and go back once written, so an idle
//! connection holds none.

use std::cell::Cell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::AsyncWrite;

/// Gathered bytes go out before they reach this: one full TLS record.
const GATHER_LIMIT: usize = 16 * 1024;

/// Most slices of one vectored write passed on together with the gathered bytes (h2 writes two).
const MAX_SLICES: usize = 8;

thread_local! {
    /// Whether flushes on this thread may wait for the connection's next poll.
    static DEFERRING: Cell<bool> = const { Cell::new(false) };
    /// A flush was put off while deferring: the connection must be polled again to make it.
    static OWED: Cell<bool> = const { Cell::new(false) };
    /// A gathering buffer no connection is using.
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Lets flushes wait until it is dropped; [`owed`] then says whether one did.
pub struct Deferring(());

impl Deferring {
    pub fn start() -> Self {
        OWED.set(false);
        DEFERRING.set(true);
        Deferring(())
    }
}

impl Drop for Deferring {
    fn drop(&mut self) {
        DEFERRING.set(false);
    }
}

/// Whether a flush was put off since the last [`Deferring::start`].
pub fn owed() -> bool {
    OWED.get()
}

/// The write side of one connection: gathers writes while flushes are deferred, if the caller
/// says the connection is one to gather (it speaks HTTP/2), and passes them through otherwise.
#[derive(Debug, Default)]
pub struct WriteGather {
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    sent: usize,
}

impl WriteGather {
    fn pending(&self) -> &[u8] {
        &self.buf[self.sent..]
    }

    fn gather(&mut self, bufs: &[IoSlice<'_>]) {
        if self.buf.capacity() == 0 {
            self.buf = SPARE.take();
            self.buf.reserve(GATHER_LIMIT);
        }
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
    }

    /// Marks `n` more bytes written; an emptied buffer goes back to the thread's spare, or to
    /// the allocator when the spare slot is taken: kept, it would stay with its connection for
    /// good, and every connection that once gathered beside another would hold one.
    fn advance(&mut self, n: usize) {
        self.sent += n;
        if self.sent == self.buf.len() {
            self.sent = 0;
            let mut emptied = std::mem::take(&mut self.buf);
            emptied.clear();
            let spare = SPARE.take();
            SPARE.set(if spare.capacity() == 0 {
                emptied
            } else {
                spare
            });
        }
    }

    /// Writes out everything gathered.
    fn poll_drain<T: AsyncWrite>(
        &mut self,
        mut inner: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while !self.pending().is_empty() {
            let n = ready!(inner.as_mut().poll_write(cx, self.pending()))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.advance(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Writes `bufs`, gathered if `gather` (the connection speaks HTTP/2) and flushes are
    /// deferred.
    pub fn poll_write_vectored<T: AsyncWrite>(
        &mut self,
        gather: bool,
        mut inner: Pin<&mut T>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if !gather || !DEFERRING.get() {
            ready!(self.poll_drain(inner.as_mut(), cx))?;
            return inner.poll_write_vectored(cx, bufs);
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        loop {
            let pending = self.pending().len();
            if pending + total < GATHER_LIMIT {
                self.gather(bufs);
                return Poll::Ready(Ok(total));
            }
            if pending == 0 {
                return inner.poll_write_vectored(cx, bufs);
            }
            // Too much to gather: what was gathered and the new bytes go on in one write, so
            // the TLS layer cuts full records from both.
            let mut slices = [IoSlice::new(&[]); MAX_SLICES + 1];
            slices[0] = IoSlice::new(self.pending());
            let taken = bufs.len().min(MAX_SLICES);
            slices[1..=taken].copy_from_slice(&bufs[..taken]);
            let n = ready!(inner.as_mut().poll_write_vectored(cx, &slices[..=taken]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if n > pending {
                self.advance(pending);
                return Poll::Ready(Ok(n - pending));
            }
            self.advance(n);
        }
    }

    pub fn poll_write<T: AsyncWrite>(
        &mut self,
        gather: bool,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(gather, inner, cx, &[IoSlice::new(buf)])
    }

    pub fn poll_flush<T: AsyncWrite>(
        &mut self,
        mut inner: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pending().is_empty() {
            if DEFERRING.get() {
                OWED.set(true);
                return Poll::Ready(Ok(()));
            }
            ready!(self.poll_drain(inner.as_mut(), cx))?;
        }
        inner.poll_flush(cx)
    }

    pub fn poll_shutdown<T: AsyncWrite>(
        &mut self,
        mut inner: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(inner.as_mut(), cx))?;
        inner.poll_shutdown(cx)
    }
}

/// A writer for tests of what reaches the socket.
#[cfg(test)]
pub mod test_writer {
    use std::io::{self, IoSlice};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::AsyncWrite;

    /// A writer that records each write it accepts; `budget` caps the bytes of the next write
    /// (0: it answers `Pending`).
    #[derive(Default)]
    pub struct Recorder {
        pub writes: Vec<Vec<u8>>,
        pub flushes: usize,
        pub budget: Option<usize>,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            if let Some(budget) = self.budget {
                if budget == 0 {
                    return Poll::Pending;
                }
                all.truncate(budget);
            }
            let n = all.len();
            self.writes.push(all);
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_writer::Recorder;
    use super::*;

    fn cx() -> Context<'static> {
        Context::from_waker(std::task::Waker::noop())
    }

    /// A write of an HTTP/2 connection (one to gather).
    fn write(g: &mut WriteGather, r: &mut Recorder, bytes: &[u8]) -> Poll<io::Result<usize>> {
        g.poll_write(true, Pin::new(r), &mut cx(), bytes)
    }

    fn flush(g: &mut WriteGather, r: &mut Recorder) -> Poll<io::Result<()>> {
        g.poll_flush(Pin::new(r), &mut cx())
    }

    #[test]
    fn while_deferring_writes_and_flushes_wait_and_leave_together_in_order() {
        let (mut g, mut r) = (WriteGather::default(), Recorder::default());
        {
            let _d = Deferring::start();
            for part in [&b"one "[..], b"two ", b"three"] {
                assert!(
                    matches!(write(&mut g, &mut r, part), Poll::Ready(Ok(n)) if n == part.len())
                );
                assert!(flush(&mut g, &mut r).is_ready());
            }
            assert!(r.writes.is_empty() && r.flushes == 0);
            assert!(owed(), "the put-off flush is owed");
        }
        assert!(flush(&mut g, &mut r).is_ready());
        assert_eq!(r.writes, vec![b"one two three".to_vec()]);
        assert_eq!(r.flushes, 1);
        assert!(
            g.buf.capacity() == 0,
            "the emptied buffer went back to the spare"
        );
    }

    #[test]
    fn connections_gathering_at_once_keep_no_buffer_once_written() {
        let (mut a, mut b) = (WriteGather::default(), WriteGather::default());
        let mut r = Recorder::default();
        {
            let _d = Deferring::start();
            let _ = write(&mut a, &mut r, b"frames of one connection");
            let _ = write(&mut b, &mut r, b"frames of another");
            assert!(a.buf.capacity() > 0 && b.buf.capacity() > 0);
        }
        assert!(flush(&mut a, &mut r).is_ready());
        assert!(flush(&mut b, &mut r).is_ready());
        assert_eq!(
            (a.buf.capacity(), b.buf.capacity()),
            (0, 0),
            "a written connection keeps no gathering buffer"
        );
        assert!(
            SPARE.take().capacity() >= GATHER_LIMIT,
            "one is the thread's spare"
        );
    }

    #[test]
    fn not_gathered_or_not_deferring_writes_go_straight_through() {
        let (mut g, mut r) = (WriteGather::default(), Recorder::default());
        {
            let _d = Deferring::start();
            let _ = g.poll_write(false, Pin::new(&mut r), &mut cx(), b"h1 answer");
            let _ = flush(&mut g, &mut r);
            assert!(!owed());
        }
        let _ = write(&mut g, &mut r, b"outside a batch");
        assert_eq!(
            r.writes,
            vec![b"h1 answer".to_vec(), b"outside a batch".to_vec()]
        );
        assert_eq!(r.flushes, 1);
    }

    #[test]
    fn past_the_limit_gathered_and_new_bytes_go_on_in_one_write() {
        let (mut g, mut r) = (WriteGather::default(), Recorder::default());
        let _d = Deferring::start();
        let small = vec![b'a'; 100];
        let big = vec![b'b'; GATHER_LIMIT];
        let _ = write(&mut g, &mut r, &small);
        assert!(matches!(write(&mut g, &mut r, &big), Poll::Ready(Ok(n)) if n == big.len()));
        assert_eq!(r.writes, vec![[small.clone(), big.clone()].concat()]);
        // With nothing gathered, a large write is not copied.
        let _ = write(&mut g, &mut r, &big);
        assert_eq!(r.writes.len(), 2);
        assert_eq!(r.writes[1], big);
    }

    #[test]
    fn partial_and_refused_writes_lose_and_reorder_nothing() {
        let (mut g, mut r) = (WriteGather::default(), Recorder::default());
        let first = vec![b'x'; 1000];
        let second = vec![b'y'; GATHER_LIMIT];
        {
            let _d = Deferring::start();
            let _ = write(&mut g, &mut r, &first);
            // The socket takes nothing, then 300 bytes a write, then all.
            r.budget = Some(0);
            assert!(write(&mut g, &mut r, &second).is_pending());
            let mut accepted = 0;
            for budget in [Some(300), None] {
                r.budget = budget;
                match write(&mut g, &mut r, &second[accepted..]) {
                    Poll::Ready(Ok(n)) => accepted += n,
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(accepted, second.len());
        }
        assert!(flush(&mut g, &mut r).is_ready());
        let out: Vec<u8> = r.writes.concat();
        assert_eq!(out, [first, second].concat());
    }

    #[test]
    fn shutdown_writes_what_was_gathered_first() {
        let (mut g, mut r) = (WriteGather::default(), Recorder::default());
        {
            let _d = Deferring::start();
            let _ = write(&mut g, &mut r, b"goaway");
            let _ = flush(&mut g, &mut r);
        }
        assert!(g.poll_shutdown(Pin::new(&mut r), &mut cx()).is_ready());
        assert_eq!(r.writes, vec![b"goaway".to_vec()]);
    }
}
