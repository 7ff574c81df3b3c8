//! Connection activity tracking for the idle and header-read timeouts.
//!
//! hyper's own HTTP/1 header timer also runs while a kept-alive connection waits for its next
//! request, which would make the idle timeout and the slow-header timeout one setting. Instead,
//! the IO wrapper stamps the time of the last byte moved and of the first byte of a new request
//! head, the service marks requests in flight, and the listener's watchdog table
//! (`stream_proxy::watchdog`, through [`ConnDeadlines`]) decides on a coarse tick.
//! Writes that cannot make progress (a client that stopped reading) are stamped too, so the
//! watchdog can close a connection whose peer has refused every byte for `write_timeout`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Milliseconds of the coarse monotonic clock (never 0, so 0 can mean "unset"). Every read and
/// write of a connection is stamped, so the stamp is the kernel's cached tick, not a TSC read
/// (see `stream_proxy::clock`).
fn now_ms() -> u64 {
    stream_proxy::clock::coarse_ms().max(1)
}

/// Shared between the IO wrapper, the service and the watchdog.
#[derive(Debug, Default)]
pub struct Activity {
    last: AtomicU64,
    head_started: AtomicU64,
    in_flight: AtomicUsize,
    track_heads: AtomicBool,
    /// When a write first found the socket full with no progress since (0: not blocked).
    write_blocked: AtomicU64,
    /// A `101 Switching Protocols` was answered: the framing checks stop.
    switched: AtomicBool,
}

/// What the watchdog decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Check again after this long.
    Wait(Duration),
    /// Nothing in flight and no traffic for the idle timeout: close gracefully.
    Idle,
    /// A request head has been arriving for longer than the header timeout.
    SlowHead,
    /// The peer has accepted no byte for longer than the write timeout.
    WriteStalled,
}

impl Activity {
    /// `track_heads` enables the HTTP/1 header-read deadline.
    pub fn new(track_heads: bool) -> Arc<Self> {
        let a = Self {
            track_heads: AtomicBool::new(track_heads),
            ..Self::default()
        };
        a.last.store(now_ms(), Ordering::Relaxed);
        Arc::new(a)
    }

    fn on_read(&self) {
        let now = now_ms();
        self.last.store(now, Ordering::Relaxed);
        if self.track_heads.load(Ordering::Relaxed)
            && self.in_flight.load(Ordering::Relaxed) == 0
            && self.head_started.load(Ordering::Relaxed) == 0
        {
            self.head_started.store(now, Ordering::Relaxed);
        }
    }

    fn on_write(&self) {
        self.last.store(now_ms(), Ordering::Relaxed);
        self.write_blocked.store(0, Ordering::Relaxed);
    }

    /// A write or flush found no room: start the stall clock unless it already runs.
    fn on_write_blocked(&self) {
        if self.write_blocked.load(Ordering::Relaxed) == 0 {
            self.write_blocked.store(now_ms(), Ordering::Relaxed);
        }
    }

    /// A request head was parsed: it is in flight until [`Activity::request_done`]. HTTP/2
    /// multiplexes and pings, so head deadlines apply to HTTP/1 only.
    pub fn request_started(&self, http2: bool) {
        if http2 {
            self.track_heads.store(false, Ordering::Relaxed);
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_started.store(0, Ordering::Relaxed);
    }

    /// The service answered a request with `101 Switching Protocols`.
    pub fn switch_protocols(&self) {
        self.switched.store(true, Ordering::Release);
    }

    /// Whether the connection switched protocols.
    pub fn switched_protocols(&self) -> bool {
        self.switched.load(Ordering::Acquire)
    }

    /// The service answered a request.
    pub fn request_done(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.last.store(now_ms(), Ordering::Relaxed);
    }

    /// Decides whether the connection should be closed. A zero `write` turns the write-stall
    /// deadline off. The watchdog calls [`Activity::check_at`] with its own reading of the clock.
    #[cfg(test)]
    fn check(&self, idle: Duration, header: Duration, write: Duration) -> Verdict {
        // Never early: see `stream_proxy::clock::deadline_ms`.
        self.check_at(stream_proxy::clock::deadline_ms(), idle, header, write)
    }

    /// [`Activity::check`] as of `now`, a `stream_proxy::clock::deadline_ms` reading.
    fn check_at(&self, now: u64, idle: Duration, header: Duration, write: Duration) -> Verdict {
        let blocked = self.write_blocked.load(Ordering::Relaxed);
        if blocked != 0 && !write.is_zero() {
            let stalled = Duration::from_millis(now.saturating_sub(blocked));
            if stalled >= write {
                return Verdict::WriteStalled;
            }
            // Whatever else is pending, look again when the stall would reach the limit.
            return match self.check_traffic(now, idle, header) {
                Verdict::Wait(d) => Verdict::Wait(d.min(write - stalled)),
                other => other,
            };
        }
        match self.check_traffic(now, idle, header) {
            // A stall may start at any moment; look again within the write timeout.
            Verdict::Wait(d) if !write.is_zero() => Verdict::Wait(d.min(write)),
            other => other,
        }
    }

    fn check_traffic(&self, now: u64, idle: Duration, header: Duration) -> Verdict {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Verdict::Wait(idle.min(header));
        }
        let head = self.head_started.load(Ordering::Relaxed);
        if head != 0 {
            let waited = Duration::from_millis(now.saturating_sub(head));
            return if waited >= header {
                Verdict::SlowHead
            } else {
                Verdict::Wait(header - waited)
            };
        }
        let quiet = Duration::from_millis(now.saturating_sub(self.last.load(Ordering::Relaxed)));
        if quiet >= idle {
            Verdict::Idle
        } else if self.track_heads.load(Ordering::Relaxed) {
            // A head may start at any moment; look again within the header timeout.
            Verdict::Wait((idle - quiet).min(header))
        } else {
            Verdict::Wait(idle - quiet)
        }
    }
}

impl Verdict {
    /// The code of a closing verdict in the watchdog's `Signal::Expired`.
    fn code(&self) -> u8 {
        match self {
            Self::Wait(_) | Self::Idle => 0,
            Self::SlowHead => 1,
            Self::WriteStalled => 2,
        }
    }

    /// The verdict a watchdog's `Signal::Expired` code stands for.
    pub fn from_code(code: u8) -> Self {
        match code {
            1 => Self::SlowHead,
            2 => Self::WriteStalled,
            _ => Self::Idle,
        }
    }
}

/// An HTTP connection in its listener's watchdog table: its activity, and the listener's
/// timeouts as they were when it was accepted (a reload changes them for new connections).
/// Registered at accept, armed when HTTP starts: the PROXY header, the first bytes and the TLS
/// handshake have timeouts of their own.
pub struct ConnDeadlines {
    activity: Arc<Activity>,
    armed: AtomicBool,
    idle: Duration,
    header: Duration,
    write: Duration,
}

impl ConnDeadlines {
    /// Unarmed deadlines; a zero `write` turns the write-stall deadline off.
    pub fn new(idle: Duration, header: Duration, write: Duration) -> Self {
        Self {
            activity: Activity::new(true),
            armed: AtomicBool::new(false),
            idle,
            header,
            write,
        }
    }

    /// Starts the deadlines, counting from now; `track_heads` as in [`Activity::new`].
    pub fn arm(&self, track_heads: bool) -> &Arc<Activity> {
        let a = &self.activity;
        a.last.store(now_ms(), Ordering::Relaxed);
        a.track_heads.store(track_heads, Ordering::Relaxed);
        self.armed.store(true, Ordering::Release);
        a
    }
}

impl stream_proxy::watchdog::Deadlines for ConnDeadlines {
    fn expired(&self, now: u64) -> Option<u8> {
        if !self.armed.load(Ordering::Acquire) {
            return None;
        }
        match self
            .activity
            .check_at(now, self.idle, self.header, self.write)
        {
            Verdict::Wait(_) => None,
            closing => Some(closing.code()),
        }
    }

    fn shortest_ms(&self) -> u64 {
        [self.idle, self.header, self.write]
            .into_iter()
            .filter(|d| !d.is_zero())
            .min()
            .map_or(u64::MAX, |d| {
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
            })
    }
}

/// An IO stream that reports its activity.
pub struct TrackedIo<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> TrackedIo<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TrackedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.on_read();
        }
        res
    }
}

impl<T> TrackedIo<T> {
    fn note_write(&self, res: &Poll<io::Result<usize>>) {
        match res {
            Poll::Ready(Ok(n)) if *n > 0 => self.activity.on_write(),
            Poll::Pending => self.activity.on_write_blocked(),
            _ => {}
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TrackedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note_write(&res);
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note_write(&res);
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // TLS accepts plaintext into its buffer and only a flush finds the socket full.
        let res = Pin::new(&mut self.inner).poll_flush(cx);
        match res {
            Poll::Pending => self.activity.on_write_blocked(),
            Poll::Ready(Ok(())) => self.activity.write_blocked.store(0, Ordering::Relaxed),
            Poll::Ready(Err(_)) => {}
        }
        res
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Sending a file counts as writing, as a write does.
impl<T: super::sendfile::SendFile> super::sendfile::SendFile for TrackedIo<T> {
    fn sends_files(&self) -> bool {
        self.inner.sends_files()
    }

    fn poll_write_more(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = self.inner.poll_write_more(cx, bufs);
        self.note_write(&res);
        res
    }

    fn poll_send_file(
        &self,
        cx: &mut Context<'_>,
        file: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        let res = self.inner.poll_send_file(cx, file, offset, len);
        self.note_write(&res);
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_and_slow_head_verdicts() {
        let a = Activity::new(true);
        let long = Duration::from_secs(60);
        assert!(matches!(a.check(long, long, long), Verdict::Wait(_)));
        assert_eq!(a.check(Duration::ZERO, long, long), Verdict::Idle);
        a.on_read();
        assert_eq!(a.check(long, Duration::ZERO, long), Verdict::SlowHead);
        a.request_started(false);
        assert!(matches!(
            a.check(Duration::ZERO, Duration::ZERO, long),
            Verdict::Wait(_)
        ));
        a.request_done();
        assert_eq!(a.check(Duration::ZERO, long, long), Verdict::Idle);
    }

    #[test]
    fn a_stalled_write_closes_even_with_a_request_in_flight() {
        let a = Activity::new(true);
        let long = Duration::from_secs(60);
        a.request_started(false);
        a.on_write_blocked();
        // Within the limit: wait no longer than the rest of the write timeout.
        match a.check(long, long, Duration::from_secs(5)) {
            Verdict::Wait(d) => assert!(d <= Duration::from_secs(5), "{d:?}"),
            v => panic!("{v:?}"),
        }
        assert_eq!(a.check(long, long, Duration::ZERO), Verdict::Wait(long));
        // Nothing stalled yet: still look again within the write timeout.
        a.on_write();
        assert_eq!(
            a.check(long, long, Duration::from_secs(1)),
            Verdict::Wait(Duration::from_secs(1))
        );
        a.on_write_blocked();
        // Past the 1 ms limit by more than the coarse clock's resolution (1–10 ms).
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            a.check(long, long, Duration::from_millis(1)),
            Verdict::WriteStalled
        );
        // Progress clears the stall.
        a.on_write();
        assert!(matches!(
            a.check(long, long, Duration::from_millis(1)),
            Verdict::Wait(_)
        ));
    }
}
