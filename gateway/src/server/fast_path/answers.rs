//! The fast path's output: the answers gathered for one write, as header text with the bodies
//! of cached files referenced rather than copied, and their vectored write.
//!
//! A file's body is not copied into a per-connection buffer: with many connections each
//! connection's buffer is cold, and the copy's cache misses cost more than its instructions.
//! The cached body is shared by every connection and stays warm; the kernel copies it from
//! there, and the buffer never grows to a large file's size and keeps it
//! (docs/performance-log.md holds the measurements).
//!
//! A large body held in a sealed memory file goes out with `sendfile` on a plain TCP connection
//! ([`super::super::sendfile`]): the kernel then hands the socket the file's pages instead of
//! copying the bytes, and the head before it is written with `MSG_MORE` so that both leave in
//! the same segments.

use std::cell::RefCell;
use std::fs::File;
use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::super::sendfile::SendFile;
use crate::static_files::SealedFile;
use crate::telemetry::trace::OpenSpan;

/// Bodies up to this size are copied into the text: an extra slice costs more than the copy.
const COPY_UP_TO: usize = 256;

/// Slices of the common write, made on the stack: one answer (text, body, the text after it).
/// Filling an array costs two stores a slice on every write, so it is no larger than this.
const FEW_SLICES: usize = 4;

/// Most slices handed to one vectored write (the kernel takes up to 1,024): pipelined answers
/// with more bodies than [`FEW_SLICES`] holds.
const MANY_SLICES: usize = 128;

/// Room made for the text of answers a thread has no spare for: one small answer's status line,
/// headers and body. Grown from nothing, the first answer's lines would cost several
/// reallocations.
const FIRST_TEXT: usize = 256;

/// Largest text room kept for the thread's next answers; answers that grew past it (pipelined
/// requests, a large head) give their memory back to the allocator.
const KEEP_TEXT: usize = 8192;

/// Most bodies and spans kept room for in the thread's spare answers.
const KEEP_ENTRIES: usize = 32;

/// Most spare answers a thread keeps: about as many as it has requests in flight at once
/// (proxied ones hold theirs while the upstream answers), each a few hundred bytes.
const KEEP_SPARES: usize = 128;

thread_local! {
    /// Answers connections of this thread wrote and let go, for the next requests read on the
    /// thread: a connection between requests keeps no output buffer, and the connections of a
    /// worker take turns with the same warm memory. Several, because a request waiting for its
    /// upstream holds its answers meanwhile; boxed, so that taking and giving back move a
    /// pointer.
    #[allow(
        clippy::vec_box,
        reason = "answers in use are a box in the connection's future, 8 bytes rather than 88; \
                  taking one from here and giving it back moves that pointer"
    )]
    static SPARES: RefCell<Vec<Box<Answers>>> = const { RefCell::new(Vec::new()) };
}

/// A body referenced by the answers.
struct Body {
    /// Where it goes: after `text[..at]`.
    at: usize,
    held: Held,
}

/// Where a body's bytes are.
enum Held {
    Bytes(Bytes),
    /// In a sealed memory file, which a plain socket is sent from (its mapping otherwise).
    Sealed(Arc<SealedFile>),
    /// `len` bytes of a file on disk from `offset`, which only a plain socket takes (the fast
    /// path answers from disk only on such connections).
    Disk {
        file: Arc<File>,
        offset: u64,
        len: usize,
    },
}

impl Held {
    /// The bytes, for a write; a file on disk has none in memory.
    fn bytes(&self) -> &[u8] {
        match self {
            Held::Bytes(b) => b,
            Held::Sealed(f) => f.as_slice(),
            Held::Disk { .. } => &[],
        }
    }

    fn len(&self) -> usize {
        match self {
            Held::Disk { len, .. } => *len,
            held => held.bytes().len(),
        }
    }

    /// The file `sendfile` reads, if it is in one, and where the bytes start in it.
    fn file(&self) -> Option<(BorrowedFd<'_>, u64)> {
        match self {
            Held::Bytes(_) => None,
            Held::Sealed(f) => Some((f.fd(), 0)),
            Held::Disk { file, offset, .. } => Some((file.as_fd(), *offset)),
        }
    }
}

/// Answers waiting to be written, in order.
#[derive(Default)]
pub(super) struct Answers {
    /// Status lines, header lines and small bodies.
    pub(super) text: Vec<u8>,
    /// Bodies that go after `text[..at]`, in order.
    bodies: Vec<Body>,
    /// The bodies' total length.
    body_bytes: usize,
    /// How many of the bodies are in a file (sealed, or on disk).
    files: usize,
    /// The recorded spans of these answers' requests, ended when the answers have been
    /// written ([`Answers::clear`]); dropped unwritten, they record that the client left.
    spans: Vec<OpenSpan>,
}

impl Answers {
    /// Empty answers to gather a connection's next ones into: the thread's spare, or new ones
    /// with room for the first one's text.
    pub(super) fn take() -> Box<Self> {
        SPARES.with_borrow_mut(Vec::pop).unwrap_or_else(|| {
            Box::new(Self {
                text: Vec::with_capacity(FIRST_TEXT),
                ..Self::default()
            })
        })
    }

    /// Hands written (empty) answers back as the thread's spare, unless they grew past what is
    /// worth keeping.
    pub(super) fn put_back(self: Box<Self>) {
        debug_assert!(self.is_empty() && self.spans.is_empty());
        if self.text.capacity() <= KEEP_TEXT
            && self.bodies.capacity() <= KEEP_ENTRIES
            && self.spans.capacity() <= KEEP_ENTRIES
        {
            SPARES.with_borrow_mut(|spares| {
                if spares.len() < KEEP_SPARES {
                    spares.push(self);
                }
            });
        }
    }

    /// Appends a body after the text so far; `sealed` is the memory file it maps, if any.
    pub(super) fn push_body(&mut self, body: &Bytes, sealed: Option<&Arc<SealedFile>>) {
        if body.len() <= COPY_UP_TO {
            self.text.extend_from_slice(body);
        } else {
            let held = match sealed {
                Some(file) => {
                    self.files += 1;
                    Held::Sealed(file.clone())
                }
                None => Held::Bytes(body.clone()),
            };
            let at = self.text.len();
            self.bodies.push(Body { at, held });
            self.body_bytes += body.len();
        }
    }

    /// Appends `len` bytes of a file on disk from `offset` after the text so far, to be sent
    /// with `sendfile` (only on a stream that [`SendFile::sends_files`]).
    pub(super) fn push_disk(&mut self, file: &Arc<File>, offset: u64, len: usize) {
        self.files += 1;
        let at = self.text.len();
        self.bodies.push(Body {
            at,
            held: Held::Disk {
                file: file.clone(),
                offset,
                len,
            },
        });
        self.body_bytes += len;
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
    #[inline]
    pub(super) fn clear(&mut self) {
        self.text.clear();
        self.bodies.clear();
        self.body_bytes = 0;
        self.files = 0;
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

    /// Fills `slices` with the bytes from `from` up to `to`, in order; returns how many.
    /// `BOUNDED` false ignores `to` (everything from `from` on): the common write, without
    /// files, then does not pay for the bound. A body on disk has
    /// no bytes in memory: the range asked for must not include any of it (bytes are asked for
    /// up to the next file only, bounded), and filling stops there if it does.
    fn slices<'a, const BOUNDED: bool>(
        &'a self,
        from: usize,
        to: usize,
        slices: &mut [IoSlice<'a>],
    ) -> usize {
        let mut fill = Fill {
            slices,
            n: 0,
            skip: from,
            left: to - from,
        };
        let mut text_at = 0;
        for body in &self.bodies {
            fill.push::<BOUNDED>(&self.text[text_at..body.at]);
            match &body.held {
                Held::Disk { len, .. } if fill.skip >= *len => fill.skip -= len,
                Held::Disk { .. } => return fill.n,
                held => fill.push::<BOUNDED>(held.bytes()),
            }
            text_at = body.at;
        }
        fill.push::<BOUNDED>(&self.text[text_at..]);
        fill.n
    }

    /// The first body in a file that ends after byte `from`: where it starts, its file (and
    /// where in the file its bytes start) and its length.
    fn next_file(&self, from: usize) -> Option<(usize, (BorrowedFd<'_>, u64), usize)> {
        let mut before = 0;
        for body in &self.bodies {
            let (start, len) = (body.at + before, body.held.len());
            before += len;
            if let Some(file) = body.held.file()
                && start + len > from
            {
                return Some((start, file, len));
            }
        }
        None
    }
}

/// Slices being filled ([`Answers::slices`]).
struct Fill<'s, 'a> {
    slices: &'s mut [IoSlice<'a>],
    n: usize,
    /// Bytes still to pass over before the first one written.
    skip: usize,
    /// Bytes still to take, when bounded.
    left: usize,
}

impl<'a> Fill<'_, 'a> {
    #[inline(always)]
    fn push<const BOUNDED: bool>(&mut self, part: &'a [u8]) {
        if self.n == self.slices.len() || (BOUNDED && self.left == 0) {
            return;
        }
        if self.skip >= part.len() {
            self.skip -= part.len();
            return;
        }
        let mut rest = &part[self.skip..];
        self.skip = 0;
        if BOUNDED {
            rest = &rest[..rest.len().min(self.left)];
            self.left -= rest.len();
        }
        if !rest.is_empty() {
            self.slices[self.n] = IoSlice::new(rest);
            self.n += 1;
        }
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

impl<IO: AsyncWrite + SendFile + Unpin> Future for WriteAll<'_, IO> {
    type Output = std::io::Result<usize>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let total = this.answers.len();
        let send_files = this.answers.files > 0 && this.io.sends_files();
        while this.written < total {
            let k = if send_files {
                std::task::ready!(this.poll_with_files(cx, total))?
            } else {
                std::task::ready!(this.poll_bytes(cx, total, false))?
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

impl<'w, IO: AsyncWrite + SendFile + Unpin> WriteAll<'w, IO> {
    /// One vectored write of the bytes from `written` up to `to`; with `more`, the kernel is
    /// told that a file follows them. Inlined: the common write (no files) is on every
    /// request's path, and a call of its own cost it measurably.
    #[inline(always)]
    fn poll_bytes(
        &mut self,
        cx: &mut Context<'_>,
        to: usize,
        more: bool,
    ) -> Poll<std::io::Result<usize>> {
        let (answers, from) = (self.answers, self.written);
        let write = |io: &mut IO, cx: &mut Context<'_>, slices: &[IoSlice<'_>]| {
            if more {
                io.poll_write_more(cx, slices)
            } else {
                Pin::new(io).poll_write_vectored(cx, slices)
            }
        };
        // Bounded when files are among the answers (`to` may stop short of the end).
        let bounded = answers.files > 0;
        let fill = |slices: &mut [IoSlice<'w>]| {
            if bounded {
                answers.slices::<true>(from, to, slices)
            } else {
                answers.slices::<false>(from, to, slices)
            }
        };
        let needed = 2 * answers.bodies.len() + 1;
        if needed <= FEW_SLICES {
            let mut slices = [IoSlice::new(&[]); FEW_SLICES];
            let n = fill(&mut slices);
            write(self.io, cx, &slices[..n])
        } else {
            let mut slices = vec![IoSlice::new(&[]); needed.min(MANY_SLICES)];
            let n = fill(&mut slices);
            write(self.io, cx, &slices[..n])
        }
    }

    /// One step on a socket that sends files: the file the written bytes have reached, or
    /// the bytes up to the next file.
    fn poll_with_files(
        &mut self,
        cx: &mut Context<'_>,
        total: usize,
    ) -> Poll<std::io::Result<usize>> {
        match self.answers.next_file(self.written) {
            Some((start, (file, file_offset), len)) if self.written >= start => {
                let offset = self.written - start;
                // A file on disk that shrank since it was opened ends early: `sendfile` sends
                // nothing, and the write ends with the connection (`WriteZero`).
                self.io
                    .poll_send_file(cx, file, file_offset + offset as u64, len - offset)
            }
            Some((start, ..)) => self.poll_bytes(cx, start, true),
            None => self.poll_bytes(cx, total, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;

    /// Writes all of `answers` to `io`.
    async fn write_all<IO: AsyncWrite + SendFile + Unpin>(
        io: &mut IO,
        answers: &Answers,
    ) -> std::io::Result<usize> {
        WriteAll {
            io,
            answers,
            written: 0,
            done: false,
        }
        .await
    }

    /// Answers with small and large bodies between text; with `sealed`, two of the large ones
    /// are in sealed files.
    fn sample(sealed: bool) -> (Answers, Vec<u8>) {
        let big = Bytes::from(vec![b'x'; 1000]);
        let other = Bytes::from(vec![b'y'; 300]);
        let file: Vec<u8> = (0..40_000u32).map(|i| (i % 249) as u8).collect();
        let file = Arc::new(SealedFile::copy_of(&file).expect("memfd"));
        let (file_bytes, file) = (file.bytes(), sealed.then_some(file));
        let mut a = Answers::default();
        let mut expected = Vec::new();
        for (head, body, file) in [
            (&b"HEAD1\r\n\r\n"[..], &file_bytes, &file),
            (b"H2\r\n\r\n", &Bytes::from_static(b"small"), &None),
            (b"H3\r\n\r\n", &other, &None),
            (b"", &big, &None),
            (b"H5\r\n\r\n", &file_bytes, &file),
        ] {
            a.text.extend_from_slice(head);
            a.push_body(body, file.as_ref());
            expected.extend_from_slice(head);
            expected.extend_from_slice(body);
        }
        a.text.extend_from_slice(b"tail");
        expected.extend_from_slice(b"tail");
        (a, expected)
    }

    /// Answers with a body on disk between others, `len_claimed` bytes of the file from
    /// `offset`: (answers, what they write, the file).
    fn with_disk(offset: u64, len_claimed: usize) -> (Answers, Vec<u8>, tempfile::NamedTempFile) {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
        let mut disk = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut disk, &data).expect("write");
        let file = Arc::new(disk.reopen().expect("reopen"));
        let (mut a, mut expected) = sample(true);
        a.text.extend_from_slice(b"DISK\r\n\r\n");
        a.push_disk(&file, offset, len_claimed);
        a.text.extend_from_slice(b"after");
        expected.extend_from_slice(b"DISK\r\n\r\n");
        let from = offset as usize;
        expected.extend_from_slice(&data[from..(from + len_claimed).min(data.len())]);
        expected.extend_from_slice(b"after");
        (a, expected, disk)
    }

    #[tokio::test]
    async fn a_body_on_disk_is_sent_in_its_place() {
        // The whole file, and a part of it from an offset (a range's 206).
        for (offset, len) in [(0, 300_000), (123_457, 70_001)] {
            let (a, expected, _disk) = with_disk(offset, len);
            for step in [1000, 4096, 65_536, 1 << 20] {
                let mut io = Trickle::new(step, true, true);
                let written = write_all(&mut io, &a).await.expect("write");
                assert_eq!(written, expected.len());
                assert!(*io.got.borrow() == expected, "offset {offset}, step {step}");
            }
        }
    }

    #[tokio::test]
    async fn a_file_on_disk_shorter_than_its_answer_says_ends_the_write() {
        // The file shrank after it was opened: its answer claims more than there is.
        let (a, _, _disk) = with_disk(0, 400_000);
        let mut io = Trickle::new(1 << 20, true, true);
        let ended = write_all(&mut io, &a).await;
        assert_eq!(
            ended.expect_err("cut short").kind(),
            std::io::ErrorKind::WriteZero
        );
    }

    #[test]
    fn the_slices_between_any_offsets_are_the_bytes_in_order() {
        let (a, expected) = sample(false);
        assert_eq!(a.len(), expected.len());
        assert_eq!(a.bodies.len(), 4, "the small body is copied");
        let len = expected.len();
        // Every edge between text and a body, each side of it, and points in between.
        let mut offsets: Vec<usize> = (0..=len).step_by(4999).chain([len]).collect();
        let mut before = 0;
        for body in &a.bodies {
            let (start, len) = (body.at + before, body.held.len());
            before += len;
            for edge in [start, start + len] {
                offsets.extend([edge - 1, edge, edge + 1]);
            }
        }
        for &from in &offsets {
            for &to in offsets.iter().filter(|&&to| to >= from) {
                let mut slices = [IoSlice::new(&[]); MANY_SLICES];
                let n = a.slices::<true>(from, to, &mut slices);
                let joined: Vec<u8> = slices[..n].iter().flat_map(|s| s.iter().copied()).collect();
                assert!(joined == expected[from..to], "from {from} to {to}");
                assert!(slices[..n].iter().all(|s| !s.is_empty()));
            }
        }
        // Unbounded, from any offset to the end.
        for &from in &offsets {
            let mut slices = [IoSlice::new(&[]); MANY_SLICES];
            let n = a.slices::<false>(from, len, &mut slices);
            let joined: Vec<u8> = slices[..n].iter().flat_map(|s| s.iter().copied()).collect();
            assert!(joined == expected[from..], "from {from}");
        }
        let mut one = [IoSlice::new(&[])];
        assert_eq!(a.slices::<false>(3, len, &mut one), 1);
        assert_eq!(&*one[0], &expected[3..9]);
    }

    #[test]
    fn the_next_file_is_found_from_any_offset() {
        let (a, _) = sample(true);
        // The first file starts after "HEAD1\r\n\r\n"; the second after the other answers.
        let second = 9 + 40_000 + 6 + 5 + 6 + 300 + 1000 + 6;
        assert_eq!(a.next_file(0).map(|(at, ..)| at), Some(9));
        assert_eq!(a.next_file(40_008).map(|(at, ..)| at), Some(9));
        assert_eq!(a.next_file(40_009).map(|(at, ..)| at), Some(second));
        assert_eq!(
            a.next_file(second + 39_999).map(|(at, ..)| at),
            Some(second)
        );
        assert!(a.next_file(second + 40_000).is_none());
        assert!(sample(false).0.next_file(0).is_none());
    }

    /// A writer that takes at most `step` bytes a call, through vectored writes or not, and
    /// (with `files`) sends sealed files by reading them as `sendfile` does.
    struct Trickle {
        got: RefCell<Vec<u8>>,
        step: usize,
        vectored: bool,
        files: bool,
        files_sent: Cell<usize>,
    }

    impl Trickle {
        fn new(step: usize, vectored: bool, files: bool) -> Self {
            Self {
                got: RefCell::default(),
                step,
                vectored,
                files,
                files_sent: Cell::new(0),
            }
        }

        fn take(&self, bufs: &[IoSlice<'_>]) -> usize {
            let mut left = self.step;
            let mut k = 0;
            for b in bufs {
                let take = b.len().min(left);
                self.got.borrow_mut().extend_from_slice(&b[..take]);
                (left, k) = (left - take, k + take);
            }
            k
        }
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Poll::Ready(Ok(self.take(&[IoSlice::new(buf)])))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            if !self.vectored {
                let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
                return self.poll_write(cx, first);
            }
            Poll::Ready(Ok(self.take(bufs)))
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

    impl SendFile for Trickle {
        fn sends_files(&self) -> bool {
            self.files
        }

        fn poll_write_more(
            &self,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            Poll::Ready(Ok(self.take(bufs)))
        }

        fn poll_send_file(
            &self,
            _: &mut Context<'_>,
            file: std::os::fd::BorrowedFd<'_>,
            offset: u64,
            len: usize,
        ) -> Poll<std::io::Result<usize>> {
            use std::os::unix::fs::FileExt;
            let file = std::fs::File::from(file.try_clone_to_owned()?);
            let mut buf = vec![0; len.min(self.step)];
            let n = file.read_at(&mut buf, offset)?;
            self.got.borrow_mut().extend_from_slice(&buf[..n]);
            self.files_sent.set(self.files_sent.get() + 1);
            Poll::Ready(Ok(n))
        }
    }

    /// One answer with a large body: the common write, from the stack's slices.
    fn single() -> (Answers, Vec<u8>) {
        let body = Bytes::from(vec![b'z'; 1024]);
        let mut a = Answers::default();
        a.text.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        a.push_body(&body, None);
        let mut expected = a.text.clone();
        expected.extend_from_slice(&body);
        (a, expected)
    }

    #[tokio::test]
    async fn partial_writes_resume_where_they_stopped() {
        for (a, expected) in [sample(false), sample(true), single()] {
            write_in_steps(&a, &expected).await;
        }
    }

    async fn write_in_steps(a: &Answers, expected: &[u8]) {
        for (vectored, files) in [(true, false), (false, false), (true, true)] {
            for step in [1, 7, 999, 1000, 1001, 1 << 20] {
                let mut io = Trickle::new(step, vectored, files);
                let written = write_all(&mut io, a).await.unwrap();
                assert_eq!(written, expected.len());
                let got = io.got.borrow();
                assert!(
                    *got == expected,
                    "step {step}, vectored {vectored}, files {files}"
                );
                // Sealed bodies are sent as files exactly when the stream sends files.
                let sent = io.files_sent.get() > 0;
                assert_eq!(sent, files && a.files > 0, "step {step}");
            }
        }
    }

    #[tokio::test]
    async fn answers_with_sealed_bodies_cross_a_real_socket_whole() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let client = tokio::net::TcpStream::connect(listener.local_addr().expect("addr"));
        let (client, accepted) = tokio::join!(client, listener.accept());
        let (mut server, mut client) = (accepted.expect("accept").0, client.expect("connect"));
        // Smaller than one file: the write waits for the reader in the middle of a file.
        socket2::SockRef::from(&server)
            .set_send_buffer_size(4096)
            .expect("sndbuf");
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut client, &mut got)
                .await
                .expect("read");
            got
        });
        let (a, expected) = sample(true);
        let written = write_all(&mut server, &a).await.expect("write");
        assert_eq!(written, expected.len());
        drop(server);
        assert!(reader.await.expect("reader") == expected);
    }
}
