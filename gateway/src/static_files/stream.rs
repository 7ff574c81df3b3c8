//! A response body that streams a byte range of an open file in large chunks. Each chunk is a
//! positional read (`pread`) on the blocking pool straight into the buffer that is sent, and the
//! next chunk is read while the current one is written, so a 1 GiB file needs two chunks of
//! memory at most.
//!
//! A chunk the connection has written and dropped is read into again: a fresh buffer per chunk
//! costs page faults and the kernel's zeroing of the new pages, a large share of a streamed file's
//! CPU. Buffers are never zeroed: reads write into their uninitialised room, so the allocator
//! reuses freed pages as they are instead of handing out cleared ones.
//!
//! A chunk whose pages are all in the page cache is read on the connection's own thread
//! (`preadv2` with `RWF_NOWAIT`, which fails rather than wait for the disk): the trip to the
//! blocking pool and back (two thread wake-ups) cost more than the copy for a 64 KiB range, and
//! nginx reads in its event loop. Only a chunk that would wait goes to the blocking pool (the
//! refused read has started the kernel's read-ahead of those pages meanwhile).

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::task::JoinHandle;

/// Bytes read per chunk: large enough that the per-read overhead (a trip to the blocking pool)
/// is small next to the copy, small enough to keep memory per response modest.
pub(super) const CHUNK: u64 = CHUNK_BYTES as u64;
const CHUNK_BYTES: usize = 256 * 1024;

/// `len` bytes of `file` from `offset`.
pub(super) struct FileBody {
    file: Arc<File>,
    /// Where the next read (not yet started) begins.
    next: u64,
    /// Bytes not yet read.
    unread: u64,
    /// Bytes not yet handed out (read or in flight).
    remaining: u64,
    pending: Option<Pending>,
    /// The chunks handed out last (their bytes are shared with the connection), whose buffers
    /// the next reads take once the connection has let go of them.
    handed: Vec<Bytes>,
}

/// Chunks kept for reuse: the connection holds one or two while the next is read.
const KEPT: usize = 2;

/// The next chunk: read already, or being read on the blocking pool.
enum Pending {
    Read(Bytes),
    Reading(JoinHandle<io::Result<Bytes>>),
}

impl FileBody {
    pub(super) fn new(file: Arc<File>, offset: u64, len: u64) -> Self {
        let mut body = Self {
            file,
            next: offset,
            unread: len,
            remaining: len,
            pending: None,
            handed: Vec::new(),
        };
        // Start reading right away: the response headers are sent meanwhile.
        body.start_read();
        body
    }

    fn start_read(&mut self) {
        if self.unread == 0 || self.pending.is_some() {
            return;
        }
        let n = self.unread.min(CHUNK);
        let (file, at) = (self.file.clone(), self.next);
        self.next += n;
        self.unread -= n;
        // At most `CHUNK` bytes, which fits in a usize.
        let n = usize::try_from(n).unwrap_or(CHUNK_BYTES);
        let mut buf = buffer(n, self.reusable());
        if read_cached(&file, at, n, &mut buf) {
            self.pending = Some(Pending::Read(buf.freeze()));
            return;
        }
        self.pending = Some(Pending::Reading(tokio::task::spawn_blocking(move || {
            read_chunk(&file, at, n, buf)
        })));
    }

    /// The buffer of a chunk handed out earlier that nothing else holds any more.
    fn reusable(&mut self) -> Option<BytesMut> {
        let i = self.handed.iter().position(Bytes::is_unique)?;
        self.handed.swap_remove(i).try_into_mut().ok()
    }

    /// Keeps a handle on a chunk handed out, for [`FileBody::reusable`].
    fn hand_out(&mut self, chunk: &Bytes) {
        if self.handed.len() == KEPT {
            self.handed.remove(0);
        }
        self.handed.push(chunk.clone());
    }
}

/// Completes `buf` to `n` bytes: `buf` already holds the chunk's first bytes (none, or what a
/// read that would have waited got), the rest is read at `at` plus that. A short file
/// (truncated since it was opened) is an error, since the response already promised its length.
fn read_chunk(file: &File, at: u64, n: usize, mut buf: BytesMut) -> io::Result<Bytes> {
    while buf.len() < n {
        match pread_into(file, at, n, &mut buf, 0) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf.freeze())
}

/// An empty buffer with room for `n` bytes: `reused` when it is large enough, else a new one.
/// Never zeroed: the reads write into its spare room. (A zeroed buffer of a range's size is
/// `calloc`'s large size, for which the allocator hands out pages the kernel must fault in and
/// clear, a page fault per page of every range.)
fn buffer(n: usize, reused: Option<BytesMut>) -> BytesMut {
    match reused {
        Some(mut buf) if buf.capacity() >= n => {
            buf.clear();
            buf
        }
        _ => BytesMut::with_capacity(n),
    }
}

/// Whether `preadv2` with `RWF_NOWAIT` may be tried; cleared for good when the kernel or a file
/// system refuses the flag, so such a host pays one failed call, not one per chunk.
static NOWAIT: AtomicBool = AtomicBool::new(true);

/// Reads what it can of the chunk's `n` bytes at `at` into `buf` without waiting for the disk:
/// `true` when every byte was in the page cache. Otherwise `buf` keeps what was read, for the
/// blocking pool's read to complete.
fn read_cached(file: &File, at: u64, n: usize, buf: &mut BytesMut) -> bool {
    if !NOWAIT.load(Ordering::Relaxed) {
        return false;
    }
    match pread_into(file, at, n, buf, libc::RWF_NOWAIT) {
        Ok(_) => buf.len() == n,
        Err(e) => {
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS)
            ) {
                NOWAIT.store(false, Ordering::Relaxed);
            }
            // `EAGAIN`: the first page is not cached.
            false
        }
    }
}

/// One positional read of the chunk's next bytes (the chunk is `n` bytes at `at`; `buf` holds
/// its first `buf.len()`) into `buf`'s spare room; `buf` grows by the count read.
#[allow(
    unsafe_code,
    reason = "reads into the buffer's uninitialised room (and preadv2's RWF_NOWAIT, which std does not offer)"
)]
fn pread_into(
    file: &File,
    at: u64,
    n: usize,
    buf: &mut BytesMut,
    flags: libc::c_int,
) -> io::Result<usize> {
    let held = buf.len();
    let offset = at
        .checked_add(held as u64)
        .and_then(|o| libc::off_t::try_from(o).ok())
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let room = buf.spare_capacity_mut();
    let want = n.saturating_sub(held).min(room.len());
    let iov = libc::iovec {
        iov_base: room.as_mut_ptr().cast(),
        iov_len: want,
    };
    // SAFETY: one iovec over the first `want` bytes of `buf`'s spare room, which it owns and
    // which outlives the call; the descriptor is open (borrowed from `file`). Flags 0 uses
    // `pread`, which every kernel has (`preadv2` needs 4.6).
    let read = unsafe {
        if flags == 0 {
            libc::pread(file.as_raw_fd(), iov.iov_base, iov.iov_len, offset)
        } else {
            libc::preadv2(file.as_raw_fd(), &iov, 1, offset, flags)
        }
    };
    let read = usize::try_from(read).map_err(|_| io::Error::last_os_error())?;
    // SAFETY: the kernel wrote `read` bytes (at most `want`, within the spare room) right
    // after the `held` ones.
    unsafe { buf.set_len(held + read.min(want)) };
    Ok(read)
}

impl HttpBody for FileBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let chunk = match self.pending.take() {
            None => return Poll::Ready(None),
            Some(Pending::Read(chunk)) => chunk,
            Some(Pending::Reading(mut reading)) => match Pin::new(&mut reading).poll(cx) {
                Poll::Pending => {
                    self.pending = Some(Pending::Reading(reading));
                    return Poll::Pending;
                }
                Poll::Ready(Ok(Ok(chunk))) => chunk,
                Poll::Ready(Ok(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Err(join)) => return Poll::Ready(Some(Err(io::Error::other(join)))),
            },
        };
        self.remaining -= chunk.len() as u64;
        if self.unread > 0 {
            self.hand_out(&chunk);
        }
        // Read ahead: the next chunk loads while this one is being written.
        self.start_read();
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn streams_ranges_in_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(CHUNK as usize * 2 + 100))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();

        let body = FileBody::new(Arc::new(File::open(&path).unwrap()), 0, data.len() as u64);
        assert_eq!(body.size_hint().exact(), Some(data.len() as u64));
        let mut frames = 0;
        let mut out = Vec::new();
        let mut body = std::pin::pin!(body);
        while let Some(f) = body.frame().await {
            out.extend_from_slice(&f.unwrap().into_data().unwrap());
            frames += 1;
        }
        assert_eq!(out, data);
        assert_eq!(frames, 3);

        let body = FileBody::new(Arc::new(File::open(&path).unwrap()), 10, 20);
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], &data[10..30]);

        let empty = FileBody::new(Arc::new(File::open(&path).unwrap()), 0, 0);
        assert!(empty.is_end_stream());
        assert!(empty.collect().await.unwrap().to_bytes().is_empty());
    }

    #[tokio::test]
    async fn a_chunk_the_connection_dropped_is_read_into_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(CHUNK as usize * 4 + 7))
            .map(|i| (i % 253) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let body = FileBody::new(Arc::new(File::open(&path).unwrap()), 0, data.len() as u64);
        let mut body = std::pin::pin!(body);
        let mut next = async || body.frame().await.unwrap().unwrap().into_data().unwrap();
        // The first chunk is dropped before the second is asked for: the third is read into
        // its buffer. The second is still held when the fourth is read: a new buffer.
        let first = next().await;
        assert!(first[..] == data[..CHUNK as usize]);
        let first_at = first.as_ptr();
        drop(first);
        let second = next().await;
        let third = next().await;
        assert_eq!(third.as_ptr(), first_at, "the first chunk's buffer again");
        let fourth = next().await;
        assert_ne!(fourth.as_ptr(), second.as_ptr());
        let last = next().await;
        let mut out = second.to_vec();
        for chunk in [&third, &fourth, &last] {
            out.extend_from_slice(chunk);
        }
        assert!(out[..] == data[CHUNK as usize..], "every byte, in order");
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn cached_pages_are_read_at_once_and_others_on_the_blocking_pool() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(CHUNK as usize + 5000))
            .map(|i| (i % 241) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        // Just written: in the page cache, so the first chunk is read before any poll.
        let body = FileBody::new(Arc::new(File::open(&path).unwrap()), 0, data.len() as u64);
        assert!(matches!(body.pending, Some(Pending::Read(_))));
        assert!(body.collect().await.unwrap().to_bytes() == data);

        // Out of the page cache (written back, then dropped; a file system that keeps files
        // in memory, such as tmpfs, cannot drop them): the read goes to the blocking pool.
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        // SAFETY: advice on a descriptor this test owns; it changes no memory of the process.
        #[allow(unsafe_code, reason = "posix_fadvise")]
        let dropped =
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) == 0 };
        // SAFETY: fstatfs fills the zeroed plain-data struct it is given, for an open
        // descriptor.
        #[allow(unsafe_code, reason = "fstatfs")]
        let in_memory = unsafe {
            let mut fs: libc::statfs = std::mem::zeroed();
            libc::fstatfs(file.as_raw_fd(), &mut fs) != 0 || fs.f_type == libc::TMPFS_MAGIC
        };
        let uncached = dropped && !in_memory;
        let body = FileBody::new(Arc::new(file), 0, data.len() as u64);
        if uncached {
            assert!(matches!(body.pending, Some(Pending::Reading(_))));
        } else {
            eprintln!("the page cache kept the file (tmpfs?): only the bytes are checked");
        }
        assert!(body.collect().await.unwrap().to_bytes() == data);
    }

    /// A read that would have waited for the disk leaves what it got in the buffer; the blocking
    /// pool's read continues after it rather than reading the chunk again.
    #[test]
    fn the_blocking_read_completes_what_a_cached_read_began() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..10_000).map(|i| (i % 239) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        // A chunk of 6,000 bytes at 1,000 of which 2,500 were read already (marked here with
        // bytes the file does not have at those places, to tell kept from read again).
        let mut held = buffer(6_000, None);
        held.extend_from_slice(&[0xAB; 2_500]);
        let chunk = read_chunk(&file, 1_000, 6_000, held).unwrap();
        assert_eq!(chunk.len(), 6_000);
        assert!(
            chunk[..2_500].iter().all(|&b| b == 0xAB),
            "what was held is kept"
        );
        assert!(
            chunk[2_500..] == data[3_500..7_000],
            "the rest from where it ended"
        );

        // A reused buffer larger than the chunk starts empty, whatever it held before.
        let mut reused = BytesMut::with_capacity(8_000);
        reused.extend_from_slice(&[0xCD; 8_000]);
        let chunk = read_chunk(&file, 0, 100, buffer(100, Some(reused))).unwrap();
        assert!(chunk[..] == data[..100]);

        // Past the end: the file shrank since the response promised its length.
        let err = read_chunk(&file, 9_000, 2_000, buffer(2_000, None)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn truncated_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"short").unwrap();
        let body = FileBody::new(Arc::new(File::open(&path).unwrap()), 0, 100);
        assert!(body.collect().await.is_err());
    }
}
