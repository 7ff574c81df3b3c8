//! Keep-alive connections to one target.
//!
//! Built on `hyper::client::conn` rather than hyper-util's legacy `Client`, because the proxy
//! needs what that client does not offer: a cap on connections per target with requests waiting
//! for a free one (`pool.max_connections_per_target`), connecting to a resolved address while the
//! request keeps the client's `Host`/`:authority` (the legacy pool keys connections by URI
//! authority, which would split one target's pool per virtual host), and returning a connection
//! to the pool inline when the response body ends instead of spawning a task per request to
//! wait for it. The pool itself is a mutex-guarded LIFO stack (the most recently used
//! connection is the warmest and the least likely to have been closed by the peer).
//!
//! HTTP/2 targets share one multiplexed connection, opened by the first request that needs it
//! (others wait for that handshake rather than racing to open their own).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};

use http::HeaderValue;
use http::uri::Authority;
use hyper::client::conn::{http1, http2};
use rustls_pki_types::ServerName;
use tokio::sync::Notify;

use super::connect::{Conn, ConnectError, Connector};
use crate::body::Body;

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

/// Counts shared with connection driver tasks (kept apart from the idle stack so that a driver
/// never keeps its own idle sender alive).
#[derive(Default)]
struct Counts {
    open: AtomicUsize,
    freed: Notify,
}

struct Idle {
    tx: http1::SendRequest<Body>,
    tick: u32,
}

/// One target's connections.
pub(crate) struct Pool {
    pub(crate) endpoint: Endpoint,
    limits: Limits,
    counts: Arc<Counts>,
    idle: Mutex<Vec<Idle>>,
    h2: Mutex<Option<http2::SendRequest<Body>>>,
    h2_connecting: tokio::sync::Mutex<()>,
    h2_used: AtomicBool,
    /// Advanced by the reaper; idle entries older than two ticks are closed.
    tick: AtomicU32,
}

/// A checked-out connection.
pub(crate) enum Checkout {
    /// An HTTP/1.1 connection, exclusively ours until released; `reused` when it came from the
    /// idle stack (and so may have been closed by the peer meanwhile).
    H1 { conn: PooledH1, reused: bool },
    /// A handle on the shared HTTP/2 connection.
    H2(http2::SendRequest<Body>),
}

/// An HTTP/1.1 connection on loan from its pool.
pub(crate) struct PooledH1 {
    pub(crate) tx: http1::SendRequest<Body>,
    pool: Arc<Pool>,
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
            if let Some(tx) = self.take_idle() {
                return Ok(Checkout::H1 {
                    conn: PooledH1 {
                        tx,
                        pool: self.clone(),
                    },
                    reused: true,
                });
            }
            if self.reserve() {
                let counts = self.counts.clone();
                // Boxed: the connect future (TCP, TLS, handshake) is several KiB, and inline it
                // would make every request's future that large, and copied on each await.
                let opened = Box::pin(connector.connect(
                    self.endpoint.addr,
                    &self.endpoint.server_name,
                    move || {
                        counts.open.fetch_sub(1, Relaxed);
                        counts.freed.notify_one();
                    },
                ))
                .await;
                return match opened {
                    Ok(Conn::H1(tx)) => Ok(Checkout::H1 {
                        conn: PooledH1 {
                            tx,
                            pool: self.clone(),
                        },
                        reused: false,
                    }),
                    Ok(Conn::H2(_)) => unreachable_h2(),
                    Err(e) => {
                        self.counts.open.fetch_sub(1, Relaxed);
                        self.counts.freed.notify_one();
                        Err(e)
                    }
                };
            }
            // At the cap: a connection coming back idle or closing wakes us. `notify_one`
            // stores a permit when nobody waits yet, so a release between the checks above and
            // this await is not lost.
            self.counts.freed.notified().await;
        }
    }

    fn take_idle(&self) -> Option<http1::SendRequest<Body>> {
        let mut idle = lock(&self.idle);
        while let Some(entry) = idle.pop() {
            // Released connections are ready; one that is not has been closed by the peer.
            if entry.tx.is_ready() {
                return Some(entry.tx);
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

    fn put_idle(&self, tx: http1::SendRequest<Body>) {
        let mut idle = lock(&self.idle);
        if idle.len() < self.limits.max_idle {
            idle.push(Idle {
                tx,
                tick: self.tick.load(Relaxed),
            });
            drop(idle);
            self.counts.freed.notify_one();
        }
        // Else the sender is dropped here and hyper closes the connection.
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

    /// Closes connections idle for longer than `idle_timeout`; the reaper calls this every half
    /// `idle_timeout`, so a connection is closed after one to one and a half timeouts.
    pub(crate) fn reap(&self) {
        let now = self.tick.fetch_add(1, Relaxed).wrapping_add(1);
        lock(&self.idle).retain(|e| now.wrapping_sub(e.tick) < 2 && !e.tx.is_closed());
        if now.is_multiple_of(2) && !self.h2_used.swap(false, Relaxed) {
            // Our handle goes; streams still running keep the connection until they end.
            lock(&self.h2).take();
        }
    }
}

impl PooledH1 {
    /// The response ended cleanly: the connection goes back to the pool. If hyper has not yet
    /// marked it ready (the driver runs in another task and may lag the body's end by a
    /// moment), a small task waits for that rather than losing a good connection.
    pub(crate) fn release(mut self) {
        if self.tx.is_ready() {
            self.pool.put_idle(self.tx);
        } else if !self.tx.is_closed() {
            tokio::spawn(async move {
                let ready =
                    tokio::time::timeout(std::time::Duration::from_secs(5), self.tx.ready());
                if let Ok(Ok(())) = ready.await {
                    self.pool.put_idle(self.tx);
                }
            });
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
