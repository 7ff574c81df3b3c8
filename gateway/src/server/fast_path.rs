//! The HTTP/1.1 fast path: the gateway's own HTTP/1.1 engine for every request without a body.
//!
//! A request is parsed with httparse (the parser hyper uses), read by [`mod@classify`], and answered
//! here in one of four ways, chosen per request from what the route's chain and terminal are
//! (decided at config load):
//! - `GET` and `HEAD` for a route without filters whose answer needs nothing but the route:
//!   a fixed response or a cached static file, from wire text made ahead of time plus the
//!   server's fields and the `Date` line (on a plain TCP connection, a file not in the cache is
//!   looked up here too and a large one sent from disk with `sendfile`) ([`prepared`]);
//! - such requests for a filterless proxy route, forwarded as text ([`forward`]);
//! - everything else without a body (routes with filters, other methods, preconditions, no
//!   matching route, requests the entry rules refuse or change) through the one service every
//!   protocol shares, the route's filter chain and terminal, with the response encoded here as
//!   hyper encodes it ([`general`]);
//! - a request with `Connection: close` is answered too, and ends the connection ([`close`]).
//!
//! Only what hyper alone still does hands the connection over to hyper for the rest of its
//! life, with the bytes not yet answered: a request with a body or framing headers, `Expect`,
//! `Upgrade`, `Connection` other than `keep-alive` or one `close`, HTTP/1.0, a target outside a
//! conservative subset of what hyper takes, more headers than [`MAX_HEADERS`], a parse error
//! (hyper answers it), and requests while an ACME challenge is pending.
//! The bytes arrive through the framing checks ([`super::checked`]) and the activity tracking
//! ([`super::idle`]) as they would for hyper, so refusals, timeouts and the drain behave the
//! same; route metrics, the access log and traces record each answer as the general path does
//! (a sampled request's server span ends once its answer has been written). The listener
//! setting `http1_fast_path: false` turns this off.
//!
//! [`serve`] and [`answer_ready`] return `async move` blocks rather than being `async fn`s, for
//! the reason [`super::conn`]'s header gives: their state is part of every connection's.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use http::HeaderMap;
use stream_proxy::watchdog::Signal;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::{ConnWatch, FastPathListener, ListenerRuntime};
use super::idle::Verdict;
use super::sendfile::SendFile;
use crate::server::service::ConnService;
use crate::telemetry::Counter;
use answers::{Answers, WriteAll};
use classify::classify;
use forward::Forwarded;
use general::General;
use prepared::{Outcome, Pending};

mod answers;
mod classify;
mod forward;
mod general;
mod prepared;

/// Most header lines a request on the fast path may have; one with more is hyper's (which
/// allows 128).
const MAX_HEADERS: usize = 32;

/// The read buffer's first size: a request head of a browser is 0.5–2 KiB.
const READ_CHUNK: usize = 4096;

/// Answers gathered from pipelined requests before they are written.
const OUT_LIMIT: usize = 64 * 1024;

/// How the fast path left a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Closed: the client ended it, an error, a deadline or the drain.
    Closed,
    /// hyper serves the rest, starting with the bytes left in the read buffer.
    HandOff,
}

/// What the answers of one connection's ready requests share: built when they are read and
/// dropped once they are answered, so a connection between requests keeps none of it.
pub struct Lane<'a> {
    svc: &'a Arc<ConnService>,
    /// The listener's count of requests answered here.
    answered: &'a Counter,
    /// The listener's count of requests answered here through the service ([`general`]).
    through_chain: &'a Counter,
    /// The listener's own header lines (HSTS, `Alt-Svc`), added to every response as the
    /// general path adds them.
    listener_lines: &'a [u8],
    /// Whether the connection is a plain socket that takes `sendfile`: a file not in the
    /// cache is then looked up and answered here (a large one sent from disk).
    sends_files: bool,
    /// The peer is one of the listener's `trusted_proxies`: a request naming its client in a
    /// forwarding field is the service's, which makes that client the request's.
    trusted_peer: bool,
}

/// What a connection on the fast path keeps for its whole life, requests or not.
pub struct Conn<'a> {
    svc: &'a Arc<ConnService>,
    shared: &'a FastPathListener,
    sends_files: bool,
    trusted_peer: bool,
}

impl<'a> Conn<'a> {
    /// The fast path of one connection served by `svc`; `sends_files` as
    /// [`SendFile::sends_files`] says of the connection.
    pub fn new(svc: &'a Arc<ConnService>, shared: &'a FastPathListener, sends_files: bool) -> Self {
        Self {
            svc,
            shared,
            sends_files,
            trusted_peer: svc.policy.trusts(svc.conn.peer.ip()),
        }
    }

    fn lane(&self) -> Lane<'a> {
        Lane {
            svc: self.svc,
            answered: &self.shared.answered,
            through_chain: &self.shared.through_chain,
            listener_lines: &self.shared.listener_lines,
            sends_files: self.sends_files,
            trusted_peer: self.trusted_peer,
        }
    }
}

/// What answering the requests at the front of the buffer came to.
enum Front {
    /// Every complete request was answered; more bytes are needed for the next one.
    NeedMore,
    /// The answers reached [`OUT_LIMIT`]: write them, then go on with the buffer.
    Full,
    /// The request at the front of the buffer is hyper's.
    HandOff,
    /// The last answer ends the connection: the client asked for it to close.
    Close,
    /// The request at the front, `len` bytes, waits for its file's re-check or lookup.
    Waits(Box<Pending>, usize),
    /// The request at the front (already removed from the buffer) is proxied: it is forwarded
    /// once the answers before it are written.
    Forwards(Box<Forwarded>),
    /// The request at the front (already removed from the buffer) goes to the service once the
    /// answers before it are written.
    General(Box<General>),
}

/// Answers the complete requests at the front of `buf` into `out`, removing them from `buf`,
/// until one is hyper's or waits, the buffer holds no complete request, or `out` is full.
fn answer_front(lane: &Lane<'_>, buf: &mut BytesMut, out: &mut Answers) -> Front {
    while !buf.is_empty() {
        if out.len() >= OUT_LIMIT {
            return Front::Full;
        }
        // Left uninitialised: the parser writes the ones it finds, and filling every slot
        // first would be stores on every request for nothing.
        let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let len = match req.parse_with_uninit_headers(buf, &mut headers) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Front::NeedMore,
            // hyper answers a malformed head (400) or one with more headers (up to its own
            // limit) itself.
            Err(_) => return Front::HandOff,
        };
        let Some(plain) = classify(&req) else {
            return Front::HandOff;
        };
        match lane.answer(&plain, out) {
            // Whatever the client sent after it is not answered (nor was it by hyper).
            Outcome::Answered if plain.close => return Front::Close,
            Outcome::Answered => {}
            Outcome::HandOff => return Front::HandOff,
            Outcome::Waits(pending) => return Front::Waits(pending, len),
            Outcome::Forwards(job) => {
                buf.advance(len);
                return Front::Forwards(job);
            }
            Outcome::General(routed) => {
                let Some(job) = General::read(&req, &buf[..len], plain.close, routed) else {
                    return Front::HandOff;
                };
                buf.advance(len);
                return Front::General(job);
            }
        }
        buf.advance(len);
    }
    Front::NeedMore
}

/// Serves `io` on the fast path until the connection ends or hyper has to take over
/// ([`Ended::HandOff`]: `buf` then holds the bytes read and not answered).
///
/// Between requests a connection waits here with its socket, `conn` and an empty `buf` (which
/// holds no memory then, see [`ReadMore`]); the answers' output buffer is the thread's while
/// they are written ([`Answers::take`]), and the state only some requests need (a file's
/// lookup, the exchange with an upstream, the service) is boxed for their time, so that 10,000
/// waiting keep-alive connections do not each hold it.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its state (module header)"
)]
pub fn serve<IO>(
    conn: &Conn<'_>,
    rt: &ListenerRuntime,
    io: &mut IO,
    buf: &mut BytesMut,
    watch: &ConnWatch,
) -> impl Future<Output = Ended>
where
    IO: AsyncRead + AsyncWrite + SendFile + Unpin,
{
    async move {
        loop {
            if buf.len() >= rt.max_head {
                // A head larger than the limit: hyper answers 431.
                return Ended::HandOff;
            }
            let mut read = ReadMore {
                io: &mut *io,
                buf: &mut *buf,
            };
            match until_done(&mut read, watch, rt, false).await {
                Ok(0) if buf.is_empty() => return Ended::Closed,
                // The client ended mid-head: hyper reports it as it would have.
                Ok(0) => return Ended::HandOff,
                Ok(_) => {}
                Err(end) => return end,
            }
            if let Some(end) = answer_ready(conn.lane(), rt, io, buf, watch).await {
                return end;
            }
        }
    }
}

/// The size of the future that answers a connection's ready requests ([`answer_ready`]), part
/// of every fast-path connection's state.
#[cfg(test)]
pub fn answer_future_size<IO>(
    conn: &Conn<'_>,
    rt: &ListenerRuntime,
    io: &mut IO,
    buf: &mut BytesMut,
    watch: &ConnWatch,
) -> usize
where
    IO: AsyncRead + AsyncWrite + SendFile + Unpin,
{
    std::mem::size_of_val(&answer_ready(conn.lane(), rt, io, buf, watch))
}

/// Answers the requests in `buf` and writes the answers, until the buffer holds no complete
/// request (`None`: read more) or the connection ends or goes to hyper.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its state (module header)"
)]
fn answer_ready<IO>(
    lane: Lane<'_>,
    rt: &ListenerRuntime,
    io: &mut IO,
    buf: &mut BytesMut,
    watch: &ConnWatch,
) -> impl Future<Output = Option<Ended>>
where
    IO: AsyncRead + AsyncWrite + SendFile + Unpin,
{
    async move {
        let lane = &lane;
        let mut out = Answers::take();
        loop {
            let front = match answer_front(lane, buf, &mut out) {
                // The re-check or lookup goes to the blocking pool; the answer joins the others
                // after it, in order.
                Front::Waits(pending, len) => {
                    let close = pending.close;
                    // Boxed: a file's re-check or lookup is rare beside the requests answered
                    // at once, and its state would make every answer's future larger, which each
                    // request pays for when the future is made.
                    if !Box::pin(lane.finish_waiting(*pending, &mut out)).await {
                        // The service answers it after all (a revalidation of a file just looked
                        // up, say): the request is still at the front of the buffer.
                        match General::at_front(buf, len, close, None) {
                            Some(job) => Front::General(job),
                            None => Front::HandOff,
                        }
                    } else if close {
                        Front::Close
                    } else {
                        buf.advance(len);
                        Front::Full
                    }
                }
                front => front,
            };
            // Answers already made go out before hyper takes over: they come first on the wire.
            if !out.is_empty() {
                let mut write = WriteAll {
                    io: &mut *io,
                    answers: &out,
                    written: 0,
                    done: false,
                };
                let wrote = until_done(&mut write, watch, rt, true).await;
                // Written whole, even when a drain then closes the connection: the answers'
                // spans end now. Otherwise they are dropped, and record that the client left.
                if write.done {
                    out.clear();
                }
                if let Err(end) = wrote {
                    return Some(end);
                }
            }
            match front {
                Front::HandOff => return Some(Ended::HandOff),
                Front::Close => return Some(close(lane, io, watch, rt).await),
                Front::Forwards(job) => {
                    let closes = job.closes();
                    // Boxed for the request's time: the exchange with the upstream is kilobytes of
                    // state that requests answered from prepared text never need.
                    let forwarded = Box::pin(lane.forward(*job, io, buf, &mut out, watch, rt));
                    if let Err(end) = forwarded.await {
                        return Some(end);
                    }
                    if closes {
                        return Some(close(lane, io, watch, rt).await);
                    }
                }
                Front::General(job) => {
                    // Boxed for the request's time, as the forwarded exchange above.
                    let served = Box::pin(lane.serve_general(job, io, buf, &mut out, watch, rt));
                    match served.await {
                        Ok(true) => return Some(close(lane, io, watch, rt).await),
                        Ok(false) => {}
                        Err(end) => return Some(end),
                    }
                }
                Front::Full | Front::Waits(..) => {}
                Front::NeedMore => {
                    out.put_back();
                    return None;
                }
            }
        }
    }
}

/// What routing gets for the header conditions it never has here.
static NO_HEADERS: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);

thread_local! {
    /// A read buffer that a waiting connection of this thread let go, for the next one to read.
    static SPARE_READ_BUFFER: Cell<Option<BytesMut>> = const { Cell::new(None) };
}

/// Gives `buf` room to read into: the thread's spare buffer if it has none.
fn make_room(buf: &mut BytesMut) {
    if buf.capacity() == 0 {
        *buf = SPARE_READ_BUFFER
            .take()
            .unwrap_or_else(|| BytesMut::with_capacity(READ_CHUNK));
        return;
    }
    rewind(buf);
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// Runs `read` on the thread's spare read buffer (a new one when another connection holds it),
/// emptied, and keeps the buffer for the next read of the thread: for reads whose bytes are
/// copied out at once.
pub fn with_read_buffer<R>(read: impl FnOnce(&mut BytesMut) -> R) -> R {
    let mut buf = BytesMut::new();
    make_room(&mut buf);
    let out = read(&mut buf);
    buf.clear();
    rewind(&mut buf);
    give_back(&mut buf);
    out
}

/// Lets go of an empty read buffer while its connection waits; a buffer grown past the usual
/// size (or still shared, so [`make_room`] could not rewind it) goes back to the allocator.
/// [`make_room`] rewound it before the read that found nothing, so it is at its start.
fn give_back(buf: &mut BytesMut) {
    let spare = std::mem::take(buf);
    if spare.capacity() == READ_CHUNK {
        SPARE_READ_BUFFER.set(Some(spare));
    }
}

/// Keeps the start of a request head the client has not finished in memory of its size while
/// the connection waits for the rest, and lets the read buffer go: a slow client holds a few
/// hundred bytes rather than a buffer of [`READ_CHUNK`]. A head past a quarter of the buffer is
/// left where it is (it is nearly all of it).
fn keep_partial(buf: &mut BytesMut) {
    if buf.len() > READ_CHUNK / 4 || buf.capacity() == buf.len() {
        return;
    }
    let fitted = BytesMut::from(&buf[..]);
    let mut whole = std::mem::replace(buf, fitted);
    whole.clear();
    rewind(&mut whole);
    give_back(&mut whole);
}

/// Moves an empty buffer's free space back to the start of its memory. When the next request is
/// there already (pipelined, or arriving while the answer was written), reading on where the
/// last one ended would walk the requests through all 4 KiB, into lines no cache holds, instead
/// of the ones just used.
fn rewind(buf: &mut BytesMut) {
    if buf.is_empty() {
        // One byte more than the room after the cursor is found only by moving the (empty)
        // data to the start of the memory; `try_reclaim` never allocates. Refused when the
        // cursor is at the start already, or the memory is shared: nothing to do then.
        let _ = buf.try_reclaim(buf.capacity() + 1);
    }
}

/// Ends a connection whose last answer has been written. A TLS session is closed with its
/// `close_notify` (as hyper's shutdown does), so a client can tell the end from a truncation;
/// plain TCP needs no `shutdown`: the connection's close, right after, sends the FIN behind
/// the answer (once [`super::linger`] has read away what the client sent after its request).
async fn close<IO: AsyncWrite + Unpin>(
    lane: &Lane<'_>,
    io: &mut IO,
    watch: &ConnWatch,
    rt: &ListenerRuntime,
) -> Ended {
    if lane.svc.conn.tls {
        let mut shutdown =
            std::pin::pin!(async { tokio::io::AsyncWriteExt::shutdown(io).await.map(|()| 0) });
        let _ = until_done(&mut shutdown, watch, rt, true).await;
    }
    Ended::Closed
}

/// Runs an IO step until it is done or the watchdog ends the connection. While writing
/// (`writing`), a drain or idle signal lets the answers already made go out first and then
/// closes, as hyper's graceful shutdown does; while waiting for a request, it closes at once.
async fn until_done<F>(
    step: &mut F,
    watch: &ConnWatch,
    rt: &ListenerRuntime,
    writing: bool,
) -> Result<usize, Ended>
where
    F: Future<Output = std::io::Result<usize>> + Unpin,
{
    let mut draining = false;
    loop {
        let signal = match std::future::poll_fn(|cx| watch.poll_until(Pin::new(&mut *step), cx))
            .await
        {
            Ok(Ok(_)) if draining => return Err(Ended::Closed),
            Ok(Ok(n)) => return Ok(n),
            Ok(Err(e)) => {
                tracing::debug!(listener = %rt.name, error = %e, "connection ended with an error");
                return Err(Ended::Closed);
            }
            Err(signal) => signal,
        };
        let verdict = match signal {
            Signal::Stop => Verdict::Idle,
            Signal::Expired(code) => Verdict::from_code(code),
        };
        match verdict {
            Verdict::SlowHead => {
                rt.metrics.header_timeouts.inc();
                tracing::debug!(listener = %rt.name, "request head not received in time; closing");
                return Err(Ended::Closed);
            }
            Verdict::WriteStalled => {
                // Dropping the connection drops what it buffered (see `conn::drive`).
                rt.metrics.write_timeouts.inc();
                tracing::debug!(listener = %rt.name, "client read nothing for write_timeout; closing");
                return Err(Ended::Closed);
            }
            Verdict::Idle | Verdict::Wait(_) if writing => draining = true,
            Verdict::Idle | Verdict::Wait(_) => return Err(Ended::Closed),
        }
    }
}

/// Reads what the client sent into the buffer's free space.
///
/// A connection waiting for its next request holds no read buffer: an empty one is given to the
/// thread's spare slot when the socket has nothing to read, and the next connection of the
/// thread to read takes it. So the connections of a worker take turns with the same few cache
/// lines, where each kept a buffer of its own that, with many connections, no cache held
/// between two of its requests.
struct ReadMore<'a, IO> {
    io: &'a mut IO,
    buf: &'a mut BytesMut,
}

impl<IO: AsyncRead + Unpin> Future for ReadMore<'_, IO> {
    type Output = std::io::Result<usize>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        make_room(this.buf);
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut *this.io), cx, this.buf);
        if read.is_pending() {
            if this.buf.is_empty() {
                give_back(this.buf);
            } else {
                keep_partial(this.buf);
            }
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emptied_read_buffer_is_read_into_from_its_start_again() {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let start = buf.as_ptr();
        buf.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        buf.advance(buf.len());
        assert_ne!(buf.as_ptr(), start);
        rewind(&mut buf);
        assert_eq!(buf.as_ptr(), start);
        assert_eq!(buf.capacity(), READ_CHUNK);

        // Bytes not yet answered stay where they are.
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n");
        buf.advance(4);
        let rest = buf.as_ptr();
        rewind(&mut buf);
        assert_eq!((buf.as_ptr(), &buf[..]), (rest, &b"/ HTTP/1.1\r\n"[..]));

        // A buffer with no memory yet is left without any.
        let mut fresh = BytesMut::new();
        rewind(&mut fresh);
        assert_eq!(fresh.capacity(), 0);
    }

    #[test]
    fn a_partial_head_is_kept_in_memory_of_its_size_while_the_client_is_slow() {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let (mut client, mut server) = tokio::io::duplex(64);
        let mut buf = BytesMut::new();
        let mut reading = ReadMore {
            io: &mut server,
            buf: &mut buf,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime
            .block_on(tokio::io::AsyncWriteExt::write_all(
                &mut client,
                b"GET / HTTP/1.1\r\nHo",
            ))
            .unwrap();
        let Poll::Ready(Ok(n)) = Pin::new(&mut reading).poll(&mut cx) else {
            panic!("the bytes written were not read");
        };
        assert_eq!(n, 18);
        let whole = reading.buf.as_ptr();
        // Nothing more yet: the read buffer goes to the thread's spare, the bytes stay.
        assert!(Pin::new(&mut reading).poll(&mut cx).is_pending());
        assert_eq!(&reading.buf[..], b"GET / HTTP/1.1\r\nHo");
        assert!(reading.buf.capacity() < READ_CHUNK / 4);
        let spare = SPARE_READ_BUFFER
            .take()
            .expect("the read buffer was kept for the thread");
        assert_eq!((spare.as_ptr(), spare.capacity()), (whole, READ_CHUNK));
        SPARE_READ_BUFFER.set(Some(spare));

        // The rest of the head is read after the bytes kept.
        runtime
            .block_on(tokio::io::AsyncWriteExt::write_all(
                &mut client,
                b"st: a\r\n\r\n",
            ))
            .unwrap();
        let Poll::Ready(Ok(_)) = Pin::new(&mut reading).poll(&mut cx) else {
            panic!("the rest was not read");
        };
        assert_eq!(&reading.buf[..], b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    }

    #[tokio::test]
    async fn a_connection_waiting_for_its_next_request_holds_no_read_buffer() {
        use tokio::io::AsyncWriteExt;

        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let (_client_a, mut server_a) = tokio::io::duplex(64);
        let (mut client_b, mut server_b) = tokio::io::duplex(64);
        let mut buf_a = BytesMut::with_capacity(READ_CHUNK);
        let memory = buf_a.as_ptr();
        let mut waiting = ReadMore {
            io: &mut server_a,
            buf: &mut buf_a,
        };
        assert!(Pin::new(&mut waiting).poll(&mut cx).is_pending());
        assert_eq!(waiting.buf.capacity(), 0);

        // The next connection of the thread to read takes the same memory.
        let mut buf_b = BytesMut::new();
        let mut reading = ReadMore {
            io: &mut server_b,
            buf: &mut buf_b,
        };
        client_b.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let Poll::Ready(Ok(n)) = Pin::new(&mut reading).poll(&mut cx) else {
            panic!("the bytes written were not read");
        };
        assert_eq!(&reading.buf[..n], b"GET / HTTP/1.1\r\n");
        assert_eq!(
            (reading.buf.as_ptr(), reading.buf.capacity()),
            (memory, READ_CHUNK)
        );

        // Bytes read and not yet answered are kept while the rest is awaited.
        assert!(Pin::new(&mut reading).poll(&mut cx).is_pending());
        assert_eq!(&reading.buf[..], b"GET / HTTP/1.1\r\n");
    }
}
