//! A UDP session: one client address, one connected upstream socket, and a task that carries
//! the upstream's replies back to the client through the listening socket until the session
//! has been quiet for the idle timeout.
//!
//! The session table is shared by the listener's receive loop (lookup, create, mark activity)
//! and the session tasks (expiry). Expiry is decided under the table lock, and the receive loop
//! marks activity under the same lock, so a datagram is never handed to a session that is
//! expiring at that moment.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::UdpSocket;
use tokio::sync::Notify;

use crate::compiled::StreamUpstream;
use crate::filter::{ActiveFilters, CloseSummary, ConnectionInfo};
use crate::relay::{Direction, Progress};
use crate::stats::StreamStats;
use crate::upstream::Selection;

/// One client's session.
pub(crate) struct Session {
    pub(crate) upstream: UdpSocket,
    pub(crate) progress: Progress,
    closed: AtomicBool,
}

/// Live sessions by client address.
#[derive(Default)]
pub(crate) struct Table {
    sessions: Mutex<HashMap<SocketAddr, Arc<Session>>>,
    /// Signalled when a session leaves, so a draining listener can stop once none is left (one
    /// waiter, the receive loop; `notify_one` keeps the signal if it is not waiting yet).
    pub(crate) left: Notify,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client's live session, marked active.
    pub(crate) fn touch(&self, client: SocketAddr) -> Option<Arc<Session>> {
        let sessions = self.lock();
        let s = sessions.get(&client)?;
        s.progress.touch();
        Some(s.clone())
    }

    pub(crate) fn insert(&self, client: SocketAddr, session: Arc<Session>) {
        self.lock().insert(client, session);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Removes `session` if it has been quiet for `idle` (always when `idle` is `None`).
    fn remove_if(
        &self,
        client: SocketAddr,
        session: &Arc<Session>,
        idle: Option<Duration>,
    ) -> bool {
        let mut sessions = self.lock();
        if idle.is_some_and(|idle| session.progress.quiet_for() < idle) {
            return false;
        }
        session.closed.store(true, Relaxed);
        if sessions
            .get(&client)
            .is_some_and(|s| Arc::ptr_eq(s, session))
        {
            sessions.remove(&client);
        }
        drop(sessions);
        self.left.notify_one();
        true
    }
}

impl Session {
    pub(crate) fn new(upstream: UdpSocket, stats: Arc<StreamStats>) -> Self {
        Self {
            upstream,
            progress: Progress::new(stats),
            closed: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }
}

/// What a session task needs.
pub(crate) struct SessionTask {
    pub(crate) session: Arc<Session>,
    pub(crate) table: Arc<Table>,
    pub(crate) listener: Arc<UdpSocket>,
    pub(crate) info: ConnectionInfo,
    pub(crate) upstream: Arc<StreamUpstream>,
    pub(crate) selection: Selection,
    pub(crate) idle: Duration,
    pub(crate) stats: Arc<StreamStats>,
}

impl SessionTask {
    /// Carries replies to the client until the session expires, fails or `stop` fires.
    /// The filters are kept apart from `self`: `&self` is held across awaits and must stay
    /// `Send`, which filter instances (`Send`, not `Sync`) would prevent.
    pub(crate) async fn run(
        self,
        mut filters: ActiveFilters,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let client = self.info.client;
        let target = self.selection.target().addr;
        let mut answered = false;
        let error = loop {
            tokio::select! {
                _ = stop.cancelled() => break Some("closed by shutdown".to_owned()),
                _ = self.session.progress.idle(self.idle) => {
                    if self.table.remove_if(client, &self.session, Some(self.idle)) {
                        StreamStats::inc(&self.stats.udp_sessions_expired);
                        break None;
                    }
                }
                ready = self.session.upstream.readable() => {
                    let reply = ready.and_then(|()| recv(&self.session.upstream));
                    match reply {
                        Ok(None) => {}
                        Ok(Some(datagram)) => {
                            if !answered {
                                answered = true;
                                self.upstream.targets.report_success_on(self.selection.state());
                            }
                            self.forward(&datagram).await;
                        }
                        Err(e) => {
                            // ECONNREFUSED here is the target's ICMP "port unreachable".
                            if e.kind() == io::ErrorKind::ConnectionRefused {
                                self.upstream.targets.report_failure_on(self.selection.state());
                            }
                            break Some(e.to_string());
                        }
                    }
                }
            }
        };
        self.table.remove_if(client, &self.session, None);
        StreamStats::dec(&self.stats.udp_sessions_active);
        crate::hooks::closed();
        let p = &self.session.progress;
        let summary = CloseSummary {
            bytes_in: p.bytes_in(),
            bytes_out: p.bytes_out(),
            target: Some(target),
            sni: None,
            duration: p.elapsed(),
            error,
        };
        tracing::debug!(
            stream = %self.info.stream, %client, %target,
            bytes_in = summary.bytes_in, bytes_out = summary.bytes_out,
            duration_ms = summary.duration.as_millis() as u64,
            error = summary.error.as_deref().unwrap_or(""),
            "udp session closed"
        );
        filters.close(&self.info, &summary).await;
    }

    async fn forward(&self, datagram: &[u8]) {
        match self.listener.send_to(datagram, self.info.client).await {
            Ok(_) => {
                StreamStats::inc(&self.stats.datagrams_out);
                self.session.progress.add(Direction::Out, datagram.len());
            }
            Err(e) => {
                StreamStats::inc(&self.stats.datagrams_dropped);
                tracing::debug!(client = %self.info.client, error = %e, "reply to client failed");
            }
        }
    }
}

/// One datagram from a readable socket, through a per-thread 64 KiB buffer so an idle session
/// holds no buffer of its own. `None`: the readiness was spurious.
fn recv(socket: &UdpSocket) -> io::Result<Option<Bytes>> {
    thread_local! {
        static BUF: std::cell::RefCell<Box<[u8]>> = std::cell::RefCell::new(vec![0; super::MAX_DATAGRAM].into());
    }
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        match socket.try_recv(&mut buf) {
            Ok(n) => Ok(Some(Bytes::copy_from_slice(&buf[..n]))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    })
}
