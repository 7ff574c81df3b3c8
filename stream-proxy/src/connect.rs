//! Opening the upstream side of a TCP connection: pick a target with the upstream's balancer
//! (consistent hashing on the client IP, as HTTP's `client_ip` key), connect within its
//! `connect_timeout`, and on refusal or timeout report the failure (passive health) and try the
//! next healthy target, until every target has been tried once.
//!
//! The connect timer is armed only when the connect is still in progress after the runtime's
//! next look at epoll. A nearby target (same host, same rack) has answered by then, and arming
//! a tokio timer that is earlier than every other one wakes the time driver with an eventfd
//! write: one system call per connection saved on the short-connection path.
//!
//! Whether the handshake succeeded is read from epoll's report, not from `SO_ERROR`: a refused
//! or reset connect comes back with `EPOLLERR`/`EPOLLHUP`, a completed one with `EPOLLOUT`
//! alone. `getsockopt` runs only on the failure path (for the error's text), another system
//! call fewer per connection.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

use socket2::{Domain, Socket, Type};
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::StreamError;
use crate::compiled::StreamUpstream;
use crate::upstream::{KeyHasher, Selection};

/// A connected target; the selection counts the connection as in flight until dropped.
pub(crate) struct Connected {
    pub(crate) io: TcpStream,
    pub(crate) selection: Selection,
}

pub(crate) async fn connect(up: &StreamUpstream, client: IpAddr) -> Result<Connected, StreamError> {
    let mut key = KeyHasher::new();
    key.write_ip(client);
    let key = key.finish();
    let mut tried = Vec::new();
    while let Some(selection) = up.targets.select(key, &tried) {
        let addr = selection.target().addr;
        let index = selection.index();
        match connect_within(addr, up.connect_timeout).await {
            Ok(Ok(io)) => {
                up.targets.report_success_on(selection.state());
                return Ok(Connected { io, selection });
            }
            Ok(Err(e)) => {
                tracing::debug!(upstream = %up.name, target = %addr, error = %e, "connect failed; trying the next target");
            }
            Err(_) => {
                tracing::debug!(upstream = %up.name, target = %addr, timeout = ?up.connect_timeout, "connect timed out; trying the next target");
            }
        }
        up.targets.report_failure_on(selection.state());
        tried.push(index);
    }
    Err(StreamError::NoHealthyTarget(up.name.to_string()))
}

/// [`open`] bounded by `timeout`; `Err(Elapsed)` when it passed. The timer is armed only for a
/// connect still pending after one scheduling round (see the module header).
async fn connect_within(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<io::Result<TcpStream>, tokio::time::error::Elapsed> {
    let mut connecting = pin!(open(addr));
    if let Poll::Ready(done) = poll_once(connecting.as_mut()).await {
        return Ok(done);
    }
    // Deferred until the runtime has polled epoll, where a nearby target's answer is waiting.
    tokio::task::yield_now().await;
    if let Poll::Ready(done) = poll_once(connecting.as_mut()).await {
        return Ok(done);
    }
    tokio::time::timeout(timeout, connecting).await
}

/// A TCP connection to `addr`, with `TCP_NODELAY` set before the handshake.
async fn open(addr: SocketAddr) -> io::Result<TcpStream> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking(), None)?;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let socket = {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        s.set_nonblocking(true)?;
        s
    };
    // Best effort, as before: a socket without it still relays correctly.
    let _ = socket.set_nodelay(true);
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    let ready = stream.ready(Interest::WRITABLE | Interest::ERROR).await?;
    if ready.is_error() || ready.is_write_closed() {
        // A connect that completed and was reset at once has no pending error either way.
        return Err(stream
            .take_error()?
            .unwrap_or_else(|| io::ErrorKind::ConnectionReset.into()));
    }
    Ok(stream)
}

/// Polls `f` once, without waiting.
async fn poll_once<F: Future>(mut f: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await
}
