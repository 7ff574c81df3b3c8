//! Opening the upstream side of a TCP connection: pick a target with the upstream's balancer
//! (consistent hashing on the client IP, as HTTP's `client_ip` key), connect within its
//! `connect_timeout`, and on refusal or timeout report the failure (passive health) and try the
//! next healthy target, until every target has been tried once.
//!
//! The connect timer is armed only when the connect is still in progress after the runtime's
//! next look at epoll. A nearby target (same host, same rack) has answered by then, and arming
//! a tokio timer that is earlier than every other one wakes the time driver with an eventfd
//! write: one system call per connection saved on the short-connection path.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

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
                let _ = io.set_nodelay(true);
                up.targets.report_success(index);
                return Ok(Connected { io, selection });
            }
            Ok(Err(e)) => {
                tracing::debug!(upstream = %up.name, target = %addr, error = %e, "connect failed; trying the next target");
            }
            Err(_) => {
                tracing::debug!(upstream = %up.name, target = %addr, timeout = ?up.connect_timeout, "connect timed out; trying the next target");
            }
        }
        up.targets.report_failure(index);
        tried.push(index);
    }
    Err(StreamError::NoHealthyTarget(up.name.to_string()))
}

/// `TcpStream::connect` bounded by `timeout`; `Err(Elapsed)` when it passed. The timer is armed
/// only for a connect still pending after one scheduling round (see the module header).
async fn connect_within(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<io::Result<TcpStream>, tokio::time::error::Elapsed> {
    let mut connecting = pin!(TcpStream::connect(addr));
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

/// Polls `f` once, without waiting.
async fn poll_once<F: Future>(mut f: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await
}
