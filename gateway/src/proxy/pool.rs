//! Keep-alive connections to one target.
//!
//! The pool is the proxy's own rather than hyper-util's legacy `Client`, because the proxy needs
//! what that client does not offer: a cap on connections per target with requests waiting for a
//! free one (`pool.max_connections_per_target`), connecting to a resolved address while the
//! request keeps the client's `Host`/`:authority` (the legacy pool keys connections by URI
//! authority, which would split one target's pool per virtual host), and HTTP/1.1 connections
//! driven by the request itself ([`super::h1`]). Idle HTTP/1.1 connections are plain sockets on
//! a mutex-guarded LIFO stack (the most recently used is the warmest and the least likely to
//! have been closed by the peer).
//!
//! A connection is looked at, without blocking, as it comes back and again when it is taken
//! (and by the reaper): one the peer closed is dropped, and one holding or receiving bytes that
//! answer no request is dropped and counted ([`Discard`]). Such bytes (a body after a `HEAD`'s
//! or a 204's head, an answer sent ahead) would otherwise be read as the next request's answer,
//! and that request may be another client's: response-queue poisoning.
//!
//! HTTP/2 targets share one multiplexed hyper connection, opened by the first request that
//! needs it (others wait for that handshake rather than racing to open their own).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

use http::HeaderValue;
use http::uri::Authority;
use hyper::client::conn::http2;
use rustls_pki_types::ServerName;
use tokio::sync::Notify;

use super::connect::{Conn, ConnectError, Connector};
use super::h1::{H1Conn, Idle};
use crate::body::Body;

/// How many idle HTTP/1.1 connections per target keep their read buffer (8 KiB, one page of it
/// touched) past a shedding pass ([`Pool::shed_buffers`], every [`SHED_EVERY`]). The stack is
/// last in, first out, so steady traffic takes its connections from the top and finds their
/// buffers there; the connections below are what a burst left, and with a large
/// `max_idle_per_target` they would hold megabytes of buffers nobody reads (nginx's kept-alive
/// upstream connections hold no buffer either).
///
/// The buffers are shed by a pass rather than as connections come back: with 1,000 requests in
/// flight the stack is deep, and a buffer freed on release was allocated again by the next
/// exchange on that connection. The buffer's size class holds one object per slab, so beyond
/// the allocator's thread cache each of those was a slab made and unmade, on every proxied
/// request at 1,000 connections (docs/performance-log.md, "The request's future at 1,000
/// connections").
const BUFFERED_IDLE: usize = 16;

/// How often idle connections below the top [`BUFFERED_IDLE`] give up their read buffers.
pub(crate) const SHED_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Where a pool connects, and the names the target goes by, computed at config load.
pub(crate) struct Endpoint {
    /// Resolved address.
    pub(crate) addr: std::net::SocketAddr,
    /// TLS name.
    pub(crate) server_name: ServerName<'static>,
    /// `Host` when the client's is not preserved.
    pub(crate) host: HeaderValue,
    /// `:authority` when the client's is not preserved (HTTP/2).
    pub(crate) authority: Authority,
}

/// Limits from `upstreams.*.pool`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_idle: usize,
    /// 0: unlimited.
    pub(crate) max_open: usize,
}

/// Counts shared with the connections (kept apart from the idle stack so that an idle
/// connection never keeps its own pool alive).
#[derive(Default)]
struct Counts {
    open: AtomicUsize,
    freed: Notify,
}

/// One open connection of a pool: counted from the reservation that opened it until dropped.
pub(crate) struct OpenConn(Arc<Counts>);

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
        self.0.freed.notify_one();
    }
}

struct IdleConn {
    conn: H1Conn,
    tick: u32,
}

/// Why an HTTP/1.1 connection the upstream would have kept open was closed instead: the
/// upstream broke the protocol in a way that could poison the next exchange on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Discard {
    /// Bytes after a complete answer: in the read buffer when the answer ended, or readable
    /// when the connection came back to the pool, sat in it, or was taken from it.
    UnexpectedBytes,
    /// A 1xx or 204 declared a body (`Transfer-Encoding`, a non-zero `Content-Length`).
    BodilessFramed,
}

impl Discard {
    pub(crate) const ALL: [Discard; 2] = [Discard::UnexpectedBytes, Discard::BodilessFramed];

    /// The `reason` label of `gateway_upstream_discarded_connections_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Discard::UnexpectedBytes => "unexpected_bytes",
            Discard::BodilessFramed => "bodiless_with_framing",
        }
    }
}

/// One target's connections.
pub(crate) struct Pool {
    pub(crate) endpoint: Endpoint,
    limits: Limits,
    counts: Arc<Counts>,
    idle: Mutex<Vec<IdleConn>>,
    h2: Mutex<Option<http2::SendRequest<Body>>>,
    h2_connecting: tokio::sync::Mutex<()>,
    h2_used: AtomicBool,
    /// Advanced by the reaper; idle entries older than two ticks are closed.
    tick: AtomicU32,
    /// Connections closed for each [`Discard`], in [`Discard::ALL`]'s order.
    discards: [AtomicU64; 2],
}

/// A checked-out connection.
pub(crate) enum Checkout {
    /// An HTTP/1.1 connection, exclusively ours until released; `reused` when it came from the
    /// idle stack (and so may have been closed by the peer meanwhile).
    H1 { conn: H1Conn, reused: bool },
    /// A handle on the shared HTTP/2 connection.
    H2(http2::SendRequest<Body>),
}

impl Pool {
    pub(crate) fn new(endpoint: Endpoint, limits: Limits) -> Self {
        Self {
            endpoint,
            limits,
            counts: Arc::default(),
            idle: Mutex::new(Vec::new()),
            h2: Mutex::new(None),
            h2_connecting: tokio::sync::Mutex::new(()),
            h2_used: AtomicBool::new(false),
            tick: AtomicU32::new(0),
            discards: Default::default(),
        }
    }

    /// Counts a connection closed because of `why`.
    pub(crate) fn discarded(&self, why: Discard) {
        self.discards[why as usize].fetch_add(1, Relaxed);
    }

    /// The connections closed so far for `why`.
    pub(crate) fn discards(&self, why: Discard) -> u64 {
        self.discards[why as usize].load(Relaxed)
    }

    /// Whether an idle connection can carry a request; one holding bytes nobody asked for is
    /// counted.
    fn still_quiet(&self, conn: &mut H1Conn) -> bool {
        match conn.probe_idle() {
            Idle::Quiet => true,
            Idle::Closed => false,
            Idle::Unexpected => {
                self.discarded(Discard::UnexpectedBytes);
                false
            }
        }
    }

    /// Connections open now (idle or busy).
    pub(crate) fn open(&self) -> usize {
        self.counts.open.load(Relaxed)
    }

    /// Idle connections now.
    pub(crate) fn idle(&self) -> usize {
        lock(&self.idle).len()
    }

    /// A connection: idle, new, or (at the cap) the next one freed. The caller bounds the wait.
    pub(crate) async fn checkout(
        self: &Arc<Self>,
        connector: &Connector,
    ) -> Result<Checkout, ConnectError> {
        if connector.is_h2() {
            return self.checkout_h2(connector).await.map(Checkout::H2);
        }
        loop {
            if let Some(conn) = self.take_idle() {
                return Ok(Checkout::H1 { conn, reused: true });
            }
            if self.reserve() {
                let open = OpenConn(self.counts.clone());
                // Boxed: the connect future (TCP, TLS) is large, and inline it would make every
                // request's future that large, and copied on each await.
                let opened =
                    Box::pin(connector.open(self.endpoint.addr, &self.endpoint.server_name)).await;
                // On failure `open` is dropped here, which frees the reservation.
                return opened.map(|io| Checkout::H1 {
                    conn: H1Conn::new(io, open),
                    reused: false,
                });
            }
            // At the cap: a connection coming back idle or closing wakes us. `notify_one`
            // stores a permit when nobody waits yet, so a release between the checks above and
            // this await is not lost.
            self.counts.freed.notified().await;
        }
    }

    fn take_idle(&self) -> Option<H1Conn> {
        let mut idle = lock(&self.idle);
        while let Some(mut entry) = idle.pop() {
            if self.still_quiet(&mut entry.conn) {
                return Some(entry.conn);
            }
        }
        None
    }

    fn reserve(&self) -> bool {
        let max = self.limits.max_open;
        if max == 0 {
            self.counts.open.fetch_add(1, Relaxed);
            return true;
        }
        self.counts
            .open
            .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
            .is_ok()
    }

    /// An HTTP/1.1 connection whose exchange completed cleanly goes back on the idle stack
    /// (or is closed when the stack is full), with its read buffer until the next
    /// [`Pool::shed_buffers`]. One the peer closed, or that holds or has received anything
    /// beyond the answer just read, is closed instead.
    pub(crate) fn release_h1(&self, mut conn: H1Conn) {
        if !self.still_quiet(&mut conn) {
            return;
        }
        let mut idle = lock(&self.idle);
        if idle.len() < self.limits.max_idle {
            idle.push(IdleConn {
                conn,
                tick: self.tick.load(Relaxed),
            });
            drop(idle);
            self.counts.freed.notify_one();
        }
        // Else the connection is dropped here: closed, and its `OpenConn` frees its place.
    }

    async fn checkout_h2(
        &self,
        connector: &Connector,
    ) -> Result<http2::SendRequest<Body>, ConnectError> {
        self.h2_used.store(true, Relaxed);
        if let Some(tx) = self.current_h2() {
            return Ok(tx);
        }
        let _one_at_a_time = self.h2_connecting.lock().await;
        if let Some(tx) = self.current_h2() {
            return Ok(tx);
        }
        self.counts.open.fetch_add(1, Relaxed);
        let counts = self.counts.clone();
        let opened = Box::pin(connector.connect(
            self.endpoint.addr,
            &self.endpoint.server_name,
            move || {
                counts.open.fetch_sub(1, Relaxed);
            },
        ))
        .await;
        match opened {
            Ok(Conn::H2(tx)) => {
                *lock(&self.h2) = Some(tx.clone());
                Ok(tx)
            }
            Ok(Conn::H1(_)) => unreachable_h2(),
            Err(e) => {
                self.counts.open.fetch_sub(1, Relaxed);
                Err(e)
            }
        }
    }

    fn current_h2(&self) -> Option<http2::SendRequest<Body>> {
        let mut slot = lock(&self.h2);
        match &*slot {
            Some(tx) if !tx.is_closed() => Some(tx.clone()),
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    /// Lets the idle connections below the top [`BUFFERED_IDLE`] go of their read buffers.
    pub(crate) fn shed_buffers(&self) {
        let mut idle = lock(&self.idle);
        let below = idle.len().saturating_sub(BUFFERED_IDLE);
        for entry in &mut idle[..below] {
            entry.conn.shed_read_buffer();
        }
    }

    /// Closes connections idle for longer than `idle_timeout`; the reaper calls this every half
    /// `idle_timeout`, so a connection is closed after one to one and a half timeouts.
    pub(crate) fn reap(&self) {
        let now = self.tick.fetch_add(1, Relaxed).wrapping_add(1);
        lock(&self.idle)
            .retain_mut(|e| now.wrapping_sub(e.tick) < 2 && self.still_quiet(&mut e.conn));
        if now.is_multiple_of(2) && !self.h2_used.swap(false, Relaxed) {
            // Our handle goes; streams still running keep the connection until they end.
            lock(&self.h2).take();
        }
    }
}

/// The connector speaks what the pool was built for; a mismatch cannot happen.
fn unreachable_h2<T>() -> Result<T, ConnectError> {
    Err(ConnectError::Handshake(
        "connection protocol does not match the upstream's".into(),
    ))
}

/// A poisoned lock only means a panic elsewhere mid-update; the pool's data stays valid.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool's connection over a real loopback socket, with a read buffer as an exchange
    /// leaves it: reserved, and empty; and the upstream's end of it, which closes it when
    /// dropped.
    async fn used_connection(
        pool: &Pool,
        listener: &tokio::net::TcpListener,
    ) -> (H1Conn, tokio::net::TcpStream) {
        let (tcp, upstream) = tokio::join!(
            tokio::net::TcpStream::connect(listener.local_addr().expect("addr")),
            listener.accept()
        );
        pool.counts.open.fetch_add(1, Relaxed);
        let mut conn = H1Conn::new(
            super::super::h1::Io::Plain(tcp.expect("connect")),
            OpenConn(pool.counts.clone()),
        );
        conn.reserve_read_buffer_for_test(8 * 1024);
        (conn, upstream.expect("accept").0)
    }

    fn pool_for(listener: &tokio::net::TcpListener) -> Pool {
        let endpoint = Endpoint {
            addr: listener.local_addr().expect("addr"),
            server_name: ServerName::try_from("localhost").expect("name"),
            host: HeaderValue::from_static("localhost"),
            authority: Authority::from_static("localhost"),
        };
        Pool::new(
            endpoint,
            Limits {
                max_idle: 64,
                max_open: 0,
            },
        )
    }

    #[tokio::test]
    async fn a_connection_the_upstream_wrote_to_unasked_is_closed_and_counted_not_pooled() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let pool = pool_for(&listener);
        // Bytes that arrived after the answer, not yet read: seen as the connection comes back.
        let (conn, mut upstream) = used_connection(&pool, &listener).await;
        upstream.write_all(b"HTTP/1.1 200 OK").await.expect("write");
        // Lets the runtime's reactor record the socket's readiness, as it does while the
        // connection's task goes on to answer its client.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        pool.release_h1(conn);
        assert_eq!(pool.idle(), 0);
        assert_eq!(pool.discards(Discard::UnexpectedBytes), 1);
        // Bytes that arrive while the connection is idle: seen as it is taken.
        let (conn, mut upstream) = used_connection(&pool, &listener).await;
        pool.release_h1(conn);
        assert_eq!(pool.idle(), 1);
        upstream.write_all(b"poisoned").await.expect("write");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(pool.take_idle().is_none());
        assert_eq!(pool.discards(Discard::UnexpectedBytes), 2);
        // A close is no protocol error: dropped, not counted.
        let (conn, upstream) = used_connection(&pool, &listener).await;
        pool.release_h1(conn);
        drop(upstream);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(pool.take_idle().is_none());
        assert_eq!(pool.discards(Discard::UnexpectedBytes), 2);
        assert_eq!(pool.open(), 0, "every dropped connection freed its place");
    }

    #[tokio::test]
    async fn idle_connections_below_the_top_of_the_stack_give_up_their_read_buffers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let pool = pool_for(&listener);
        let total = BUFFERED_IDLE + 8;
        let mut upstreams = Vec::new();
        for _ in 0..total {
            let (conn, upstream) = used_connection(&pool, &listener).await;
            upstreams.push(upstream);
            pool.release_h1(conn);
        }
        assert_eq!(pool.idle(), total);
        let buffered = |pool: &Pool| -> Vec<bool> {
            let idle = lock(&pool.idle);
            idle.iter().map(|e| e.conn.read_capacity() > 0).collect()
        };
        // Coming back, every connection keeps its buffer: the next exchange may want it now.
        assert!(buffered(&pool).iter().all(|&b| b));
        pool.shed_buffers();
        // The pass leaves them to the top of the stack (the last released, taken first).
        let after = buffered(&pool);
        assert!(after[..8].iter().all(|&b| !b), "{after:?}");
        assert!(after[8..].iter().all(|&b| b), "{after:?}");
        assert_eq!(pool.idle(), total, "shedding closes nothing");
    }
}
