//! Opening the upstream side of a TCP connection: pick a target with the upstream's balancer
//! (consistent hashing on the client IP, as HTTP's `client_ip` key), connect within its
//! `connect_timeout`, and on refusal or timeout report the failure (passive health) and try the
//! next healthy target, until every target has been tried once.

use std::net::IpAddr;

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
        match tokio::time::timeout(up.connect_timeout, TcpStream::connect(addr)).await {
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
