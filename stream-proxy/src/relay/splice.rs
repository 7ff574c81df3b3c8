//! The zero-copy path of the relay (Linux): a direction that carries bulk data moves its bytes
//! socket → pipe → socket with splice(2), so payload pages never cross into userspace. The
//! sockets stay registered with tokio; readiness is awaited as usual and `try_io` clears it when
//! splice says EAGAIN.
//!
//! A direction fills its pipe only when the pipe is empty, so EAGAIN on the way in always means
//! "socket has no data" and on the way out "socket buffer full", never "pipe full/empty" — the
//! readiness bookkeeping stays exact.
#![allow(
    unsafe_code,
    reason = "splice(2) and fcntl(2) through libc: the zero-copy relay's only unsafe calls"
)]

use std::io::{self, PipeReader, PipeWriter};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::{Direction, Progress};

/// Bytes asked of one splice call, and the pipe size requested. Larger pipes mean fewer calls
/// per byte; pages are only allocated while data sits in the pipe.
pub const PIPE_SIZE: usize = 256 * 1024;

/// One direction's pipe. Made when the direction turns out to carry bulk data; a failure (the
/// fd limit) keeps that direction on the buffered path.
pub(super) struct Pipe {
    r: PipeReader,
    w: PipeWriter,
}

impl Pipe {
    pub(super) fn new() -> io::Result<Self> {
        let (r, w) = io::pipe()?;
        // SAFETY: fcntl(F_SETPIPE_SZ) on a pipe descriptor we own; it takes an int argument and
        // touches no memory of ours. Failure (a lower pipe-max-size limit) keeps the default.
        unsafe {
            libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE as libc::c_int);
        }
        Ok(Self { r, w })
    }
}

/// Moves `from` → `to` through `pipe` until `from` ends, then shuts down `to`'s write side.
pub(super) async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    dir: Direction,
    progress: &Progress,
    one_ended: &AtomicBool,
) -> io::Result<()> {
    let (from_fd, to_fd) = (from.as_raw_fd(), to.as_raw_fd());
    let (pipe_r, pipe_w) = (pipe.r.as_raw_fd(), pipe.w.as_raw_fd());
    loop {
        let mut in_pipe = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || splice(from_fd, pipe_w, PIPE_SIZE)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => break other?,
            }
        };
        if in_pipe == 0 {
            if one_ended.swap(true, Relaxed) {
                // The other direction ended first: closing both sockets sends the FIN.
                return Ok(());
            }
            return match socket2::SockRef::from(to).shutdown(Shutdown::Write) {
                Err(e) if e.kind() != io::ErrorKind::NotConnected => Err(e),
                _ => Ok(()),
            };
        }
        while in_pipe > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || splice(pipe_r, to_fd, in_pipe)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    in_pipe -= n;
                    progress.add(dir, n);
                }
            }
        }
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: splice reads only its scalar arguments; both offsets are null, as required for
    // sockets and pipes (no file position). A stale descriptor gives EBADF, never memory
    // unsafety, and the descriptors are borrowed from values alive for this call.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
