//! The relay for streams whose filters do not inspect data: read then write, each direction on
//! its own, with half-close. Unlike `tokio::io::copy_bidirectional` it counts bytes as they move
//! (live counters, idle tracking), and it holds no buffer of its own while a connection waits:
//!
//! * bytes are read into one scratch buffer per thread and written on at once (the common case
//!   on a healthy connection: the socket takes them all), so an idle connection costs only its
//!   task, not 2 × 64 KiB;
//! * what the destination does not take right away is copied into a buffer owned by that
//!   direction until it drains, then freed;
//! * a read that fills the whole scratch buffer means a bulk transfer: on Linux, when allowed,
//!   that direction switches to splice(2) for the rest of the connection. Request/response
//!   traffic of small messages stays on plain `recv`/`send`, which costs less per message than
//!   two splices through a pipe (and the pipe's two descriptors are only made for bulk);
//! * a read that returns less than the buffer holds has drained the socket, so the next wait
//!   goes straight to epoll instead of to a `recv` that would only say "try again", and when the
//!   peer's FIN had already arrived (epoll's `RDHUP`) that read was the last one: the end of the
//!   stream is known without the `recv` that would return 0. Two system calls fewer per
//!   message and direction on request/response traffic;
//! * those last bytes are sent with `MSG_MORE` (Linux), so they and the FIN that follows them
//!   leave as one segment.

use std::cell::RefCell;
use std::io::{self, Read};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tokio::io::{Interest, Ready};
use tokio::net::TcpStream;

use super::{BUFFER_SIZE, Direction, Progress};

thread_local! {
    /// Shared by every connection on this thread: it only holds bytes between one read and the
    /// write that follows it, with no await in between.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; BUFFER_SIZE].into_boxed_slice());
}

/// Relays until both directions have ended; the first error ends both. `zero_copy` lets a
/// direction carrying bulk data switch to splice(2) (Linux only; elsewhere it is ignored).
pub async fn relay(
    client: &TcpStream,
    upstream: &TcpStream,
    progress: &Progress,
    zero_copy: bool,
) -> io::Result<()> {
    let one_ended = AtomicBool::new(false);
    tokio::try_join!(
        pump(
            client,
            upstream,
            Direction::In,
            progress,
            zero_copy,
            &one_ended
        ),
        pump(
            upstream,
            client,
            Direction::Out,
            progress,
            zero_copy,
            &one_ended
        ),
    )?;
    Ok(())
}

/// What one read-and-write step did.
enum Step {
    /// The readiness was stale: nothing to read after all.
    Spurious,
    /// The peer sent FIN.
    Eof,
    /// `read` bytes arrived; those the destination did not take are in the backlog. `last`:
    /// the peer's FIN was in before them, so nothing follows.
    Moved {
        read: usize,
        filled: bool,
        last: bool,
    },
}

/// One direction: copies until `from` ends, then shuts down `to`'s write side.
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    dir: Direction,
    progress: &Progress,
    zero_copy: bool,
    one_ended: &AtomicBool,
) -> io::Result<()> {
    let mut backlog: Vec<u8> = Vec::new();
    // The second direction to end needs no shutdown: both sockets are closed right after,
    // which sends the FIN (nothing is left unread on either).
    let end = |to: &TcpStream| {
        if one_ended.swap(true, Relaxed) {
            Ok(())
        } else {
            half_close(to)
        }
    };
    loop {
        let ready = from.ready(Interest::READABLE).await?;
        let step =
            SCRATCH.with_borrow_mut(|buf| read_and_forward(from, to, buf, &mut backlog, ready))?;
        let (read, filled, last) = match step {
            Step::Spurious => continue,
            Step::Eof => return end(to),
            Step::Moved { read, filled, last } => (read, filled, last),
        };
        if !backlog.is_empty() {
            drain(to, &backlog).await?;
            // A slow reader's burst is not kept for the rest of the connection.
            backlog = Vec::new();
        }
        progress.add(dir, read);
        if last {
            return end(to);
        }
        #[cfg(target_os = "linux")]
        if filled
            && zero_copy
            && let Ok(pipe) = super::splice::Pipe::new()
        {
            return super::splice::pump(from, to, &pipe, dir, progress, one_ended).await;
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (filled, zero_copy);
    }
}

/// Reads what `from` has into `buf` and writes as much of it to `to` as the socket takes now;
/// the rest goes to `backlog`. `ready` is the readiness the wait returned, before this read.
fn read_and_forward(
    from: &TcpStream,
    to: &TcpStream,
    buf: &mut [u8],
    backlog: &mut Vec<u8>,
    ready: Ready,
) -> io::Result<Step> {
    // The FIN had arrived before this read: a short read below takes everything there is.
    let fin_in = ready.is_read_closed();
    let mut got = 0;
    let read = from.try_io(Interest::READABLE, || {
        let n = (&*socket2::SockRef::from(from)).read(buf)?;
        got = n;
        if n > 0 && n < buf.len() && !fin_in {
            // The read drained the socket (a stream socket returns all it holds, up to the
            // buffer). Reporting "would block" clears the readiness, so the next wait goes to
            // epoll; data arriving after the read is a new edge, and tokio does not clear a
            // readiness newer than the one this read began with.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    let read = match read {
        Ok(0) => return Ok(Step::Eof),
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => got,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Spurious),
        Err(e) => return Err(e),
    };
    // The peer's FIN came with these bytes, so the FIN goes on right after them (a shutdown or
    // the close). Sent with `MSG_MORE`, they wait for it in the socket, and data and FIN leave
    // as one segment: a packet and its ACK fewer per connection on request/response traffic.
    let last = fin_in && read < buf.len();
    let mut written = 0;
    while written < read {
        let sent = if last {
            send_before_fin(to, &buf[written..read])
        } else {
            to.try_write(&buf[written..read])
        };
        match sent {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    backlog.extend_from_slice(&buf[written..read]);
    Ok(Step::Moved {
        read,
        filled: read == buf.len(),
        last,
    })
}

/// Writes the last bytes before a FIN, held back for it (`MSG_MORE`) where Linux allows.
/// Whatever does not fit now goes out with the backlog, without the flag, so nothing waits
/// on a FIN that is not yet due.
fn send_before_fin(to: &TcpStream, data: &[u8]) -> io::Result<usize> {
    #[cfg(target_os = "linux")]
    {
        to.try_io(Interest::WRITABLE, || {
            socket2::SockRef::from(to).send_with_flags(data, libc::MSG_MORE | libc::MSG_NOSIGNAL)
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        to.try_write(data)
    }
}

/// Writes all of `data` to `to`, waiting for room as needed.
async fn drain(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        to.writable().await?;
        match to.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Shuts down `to`'s write side; a peer that is already gone is not an error here (the other
/// direction reports it if it matters).
pub(crate) fn half_close(to: &TcpStream) -> io::Result<()> {
    match socket2::SockRef::from(to).shutdown(Shutdown::Write) {
        Err(e) if e.kind() != io::ErrorKind::NotConnected => Err(e),
        _ => Ok(()),
    }
}
