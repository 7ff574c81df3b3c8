//! A response body that streams a byte range of an open file in large chunks. Each chunk is a
//! positional read (`pread`) on the blocking pool straight into the buffer that is sent, and the
//! next chunk is read while the current one is written, so a 1 GiB file needs two chunks of
//! memory at most.
//!
//! A chunk the connection has written and dropped is read into again: a fresh 256 KiB buffer
//! per chunk cost a quarter of a streamed 1 MiB file's CPU in page faults and the kernel's
//! zeroing of the new pages (`perf`: `exc_page_fault`, `clear_page_erms`), and its `calloc`
//! zeroed bytes the read then overwrote.
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
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::task::JoinHandle;

/// Bytes read per chunk: large enough that the per-read overhead (a trip to the blocking pool)
/// is small next to the copy, small enough to keep memory per response modest.
pub(super) const CHUNK: u64 = 256 * 1024;

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
        let mut buf = self.reusable();
        if let Some(chunk) = read_cached(&file, at, n, &mut buf) {
            self.pending = Some(Pending::Read(chunk));
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

/// Reads exactly `n` bytes at `at`, into `reused` when given (its bytes are overwritten, not
/// zeroed first); a short file (truncated since it was opened) is an error, since the
/// response already promised its length.
fn read_chunk(file: &File, at: u64, n: u64, reused: Option<BytesMut>) -> io::Result<Bytes> {
    let mut buf = buffer(n, reused)?;
    file.read_exact_at(&mut buf, at)?;
    Ok(buf.freeze())
}

/// A buffer of `n` bytes: `reused` cut to size when it is large enough, else a new one.
fn buffer(n: u64, reused: Option<BytesMut>) -> io::Result<BytesMut> {
    let n = usize::try_from(n).map_err(io::Error::other)?;
    Ok(match reused {
        Some(mut buf) if buf.len() >= n => {
            buf.truncate(n);
            buf
        }
        _ => BytesMut::zeroed(n),
    })
}

/// Whether `preadv2` with `RWF_NOWAIT` may be tried; cleared for good when the kernel or a file
/// system refuses the flag, so such a host pays one failed call, not one per chunk.
static NOWAIT: AtomicBool = AtomicBool::new(true);

/// Reads `n` bytes at `at` without waiting for the disk: the chunk when every byte was in the
/// page cache, `None` when the read would wait (the buffer, if one was made, is left in `buf`
/// for the blocking pool's read).
fn read_cached(file: &File, at: u64, n: u64, buf: &mut Option<BytesMut>) -> Option<Bytes> {
    if !NOWAIT.load(Ordering::Relaxed) {
        return None;
    }
    let mut chunk = buffer(n, buf.take()).ok()?;
    let offset = libc::off_t::try_from(at).ok()?;
    let iov = libc::iovec {
        iov_base: chunk.as_mut_ptr().cast(),
        iov_len: chunk.len(),
    };
    // SAFETY: one iovec over `chunk`, which is `iov_len` bytes long and outlives the call; the
    // descriptor is open (borrowed from `file`).
    #[allow(
        unsafe_code,
        reason = "preadv2 with RWF_NOWAIT, which std does not offer"
    )]
    let read = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
    if usize::try_from(read).is_ok_and(|r| r == chunk.len()) {
        return Some(chunk.freeze());
    }
    if read < 0 {
        let e = io::Error::last_os_error();
        if matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS)
        ) {
            NOWAIT.store(false, Ordering::Relaxed);
        }
    }
    // Short (some pages not cached, or the file shrank) or would block: the blocking pool
    // reads the whole chunk again and reports a short file.
    *buf = Some(chunk);
    None
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

    #[tokio::test]
    async fn truncated_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"short").unwrap();
        let body = FileBody::new(Arc::new(File::open(&path).unwrap()), 0, 100);
        assert!(body.collect().await.is_err());
    }
}
