//! Running a generation's streams: bind them, swap in a new generation on reload, and drain.
//!
//! * Start binds every stream; any failure binds none.
//! * Reload ([`StreamServer::reload`]) keeps the socket (and counters) of every stream whose
//!   protocol and bind address are unchanged and points its next connections at the new
//!   generation; it binds added streams and stops accepting on removed ones, whose open
//!   connections and sessions get `drain_timeout` to finish. Connections in flight always keep
//!   the generation they started on.
//! * Drain ([`StreamServer::drain`], on shutdown) stops accepting everywhere, waits for open
//!   connections and UDP sessions up to `drain_timeout`, then closes what is left.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway_config::model::StreamProtocol;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::StreamError;
use crate::compiled::{CompiledStream, CompiledStreams};
use crate::listener::{Bound, Listening};
use crate::stats::StreamStats;

/// The running streams.
pub struct StreamServer {
    running: Mutex<Vec<Running>>,
    /// Cancelled to stop accepting everywhere (a child of the gateway's shutdown token).
    stop: CancellationToken,
    /// Cancelled to close every connection at once (drain timeout passed).
    hard: CancellationToken,
    acceptors: TaskTracker,
    tasks: TaskTracker,
}

struct Running {
    protocol: StreamProtocol,
    /// As configured (port 0 stays 0).
    configured: SocketAddr,
    local: SocketAddr,
    listening: Arc<Listening>,
    stop: CancellationToken,
    hard: CancellationToken,
}

impl Running {
    fn keeps(&self, rt: &CompiledStream) -> bool {
        // Port 0 means "any port": only the same stream keeps its socket.
        self.protocol == rt.protocol
            && self.configured == rt.addr
            && (rt.addr.port() != 0 || *self.listening.name() == *rt.name)
    }
}

/// Sockets bound by [`StreamServer::prepare`], not serving yet. Dropping it releases them (the
/// reload failed elsewhere and nothing changes).
pub struct PreparedStreams {
    streams: CompiledStreams,
    added: Vec<(Arc<CompiledStream>, Bound, SocketAddr)>,
}

impl StreamServer {
    /// Binds and starts every stream; `shutdown` cancelled stops accepting (as
    /// [`StreamServer::drain`] does, without waiting). Needs a Tokio runtime.
    pub fn start(
        streams: &CompiledStreams,
        shutdown: &CancellationToken,
    ) -> Result<Self, StreamError> {
        let server = Self {
            running: Mutex::new(Vec::new()),
            stop: shutdown.child_token(),
            hard: CancellationToken::new(),
            acceptors: TaskTracker::new(),
            tasks: TaskTracker::new(),
        };
        server.reload(streams, Duration::ZERO)?;
        Ok(server)
    }

    /// Applies a new generation's streams (see the module docs); removed streams' connections
    /// get `drain_timeout`. Sockets for added streams are bound first; if one fails, nothing
    /// changes. [`StreamServer::prepare`] and [`StreamServer::commit`] are the two halves, for a
    /// caller that has other things to prepare in between.
    pub fn reload(
        &self,
        streams: &CompiledStreams,
        drain_timeout: Duration,
    ) -> Result<(), StreamError> {
        let prepared = self.prepare(streams)?;
        self.commit(prepared, drain_timeout);
        Ok(())
    }

    /// Binds the sockets a reload to `streams` needs, without changing anything yet. Reloads
    /// must be serialised by the caller between `prepare` and `commit`.
    pub fn prepare(&self, streams: &CompiledStreams) -> Result<PreparedStreams, StreamError> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let mut kept = vec![false; running.len()];
        let mut added = Vec::new();
        for rt in &streams.streams {
            match running.iter().position(|r| r.keeps(rt)) {
                Some(i) if !kept[i] => kept[i] = true,
                _ => {
                    let bound = Bound::bind(rt)?;
                    let local = bound.local_addr().map_err(|source| StreamError::Bind {
                        stream: rt.name.to_string(),
                        addr: rt.addr,
                        source,
                    })?;
                    added.push((rt.clone(), bound, local));
                }
            }
        }
        Ok(PreparedStreams {
            streams: streams.clone(),
            added,
        })
    }

    /// Applies a prepared reload: swaps kept streams to their new settings, retires removed
    /// ones, starts added ones on the sockets `prepare` bound.
    pub fn commit(&self, prepared: PreparedStreams, drain_timeout: Duration) {
        let order: Vec<Arc<str>> = prepared
            .streams
            .streams
            .iter()
            .map(|rt| rt.name.clone())
            .collect();
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = Vec::with_capacity(order.len());
        for r in std::mem::take(&mut *running) {
            match prepared.streams.streams.iter().find(|rt| r.keeps(rt)) {
                Some(rt) => {
                    r.listening.swap(rt.clone());
                    next.push(r);
                }
                None => self.retire(r, drain_timeout),
            }
        }
        for (rt, bound, local) in prepared.added {
            let listening = Arc::new(Listening::new(rt.clone()));
            let (stop, hard) = (self.stop.child_token(), self.hard.child_token());
            tracing::info!(stream = %rt.name, addr = %local, protocol = ?rt.protocol, "stream listening");
            bound.serve(
                listening.clone(),
                stop.clone(),
                hard.clone(),
                &self.acceptors,
                &self.tasks,
            );
            next.push(Running {
                protocol: rt.protocol,
                configured: rt.addr,
                local,
                listening,
                stop,
                hard,
            });
        }
        // Config order, for listings.
        next.sort_by_key(|r| {
            let name = r.listening.name();
            order.iter().position(|n| **n == *name)
        });
        *running = next;
    }

    /// A removed stream: stop accepting now, close what is still open after the drain timeout.
    fn retire(&self, r: Running, timeout: Duration) {
        tracing::info!(stream = %r.listening.name(), addr = %r.local, "stream removed; draining");
        r.stop.cancel();
        let all = self.hard.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(timeout) => {}
                _ = all.cancelled() => {}
            }
            r.hard.cancel();
        });
    }

    fn find<T>(&self, name: &str, f: impl Fn(&Running) -> T) -> Option<T> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.iter().find(|r| *r.listening.name() == *name).map(f)
    }

    /// The bound address of a stream (useful with port 0).
    pub fn local_addr(&self, name: &str) -> Option<SocketAddr> {
        self.find(name, |r| r.local)
    }

    /// A stream's counters.
    pub fn stats(&self, name: &str) -> Option<Arc<StreamStats>> {
        self.find(name, |r| r.listening.stats.clone())
    }

    /// Every stream's name and counters, in config order.
    pub fn all_stats(&self) -> Vec<(Arc<str>, Arc<StreamStats>)> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running
            .iter()
            .map(|r| (r.listening.name(), r.listening.stats.clone()))
            .collect()
    }

    /// Stops accepting, waits for open connections and sessions up to `timeout`, then closes
    /// the rest and returns once they are gone.
    pub async fn drain(&self, timeout: Duration) {
        self.stop.cancel();
        self.acceptors.close();
        self.acceptors.wait().await;
        self.tasks.close();
        if tokio::time::timeout(timeout, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.tasks.len(),
                "stream drain timeout reached; closing the remaining connections"
            );
            self.hard.cancel();
            self.tasks.wait().await;
        }
    }
}

impl Drop for StreamServer {
    fn drop(&mut self) {
        self.stop.cancel();
        self.hard.cancel();
    }
}
