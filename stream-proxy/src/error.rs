//! The crate's one error type. Most of these end a single connection (and are logged at debug
//! level with the connection's span); `Config` and `Bind` come out of building or starting the
//! streams and are reported by the gateway with the config location.

use std::net::SocketAddr;
use std::time::Duration;

/// What went wrong in a stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A stream's configuration cannot be built (the key path locates it in the file).
    #[error("{key}: {message}")]
    Config {
        /// Key path, e.g. `streams[0].filters[1].plugin`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A stream's socket could not be bound.
    #[error("cannot bind stream `{stream}` to {addr}: {source}")]
    Bind {
        /// Stream name.
        stream: String,
        /// Address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The PROXY protocol header from the client side is malformed.
    #[error("bad PROXY protocol header: {0}")]
    ProxyProtocol(&'static str),
    /// The client closed or stalled before a complete header (PROXY or ClientHello) arrived.
    #[error("client sent no complete {what} within {timeout:?}")]
    HeaderTimeout {
        /// `PROXY protocol header` or `TLS ClientHello`.
        what: &'static str,
        /// The deadline.
        timeout: Duration,
    },
    /// The client closed before a complete header arrived.
    #[error("client closed before a complete {0}")]
    HeaderEof(&'static str),
    /// A header (ClientHello, PROXY header) did not fit its buffer.
    #[error("{what} larger than {max} bytes")]
    HeaderTooLarge {
        /// `PROXY protocol header` or `TLS ClientHello`.
        what: &'static str,
        /// The bound.
        max: usize,
    },
    /// No route for the connection (no SNI match and no usable fallback).
    #[error("no route: {0}")]
    NoRoute(&'static str),
    /// Every target of the upstream is down, ejected or failed to connect.
    #[error("no healthy target in upstream `{0}`")]
    NoHealthyTarget(String),
    /// A stream filter refused the connection in `on_connect`.
    #[error("refused by filter `{0}`")]
    FilterRefused(String),
    /// A stream filter's data hook closed the connection.
    #[error("closed by filter `{0}`")]
    FilterClosed(String),
    /// No bytes moved either way for the idle timeout.
    #[error("idle for {0:?}")]
    Idle(Duration),
    /// The gateway's drain timeout passed.
    #[error("closed by shutdown")]
    Shutdown,
    /// Socket error while relaying.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
