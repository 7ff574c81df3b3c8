//! Opening a connection to one target: TCP (with `connect_timeout` covering the TCP handshake,
//! TLS and the HTTP/2 preface), TLS with SNI and ALPN, and, for what hyper's client drives
//! (HTTP/2, health checks, protocol switches), the hyper client handshake. A hyper connection's
//! driver runs in its own task; `on_close` runs when it ends so the pool can count open
//! connections. Pooled HTTP/1.1 connections take the bare [`Io`] from [`Connector::open`].
//!
//! hyper's HTTP/1.1 client carries one request per connection here and is never pooled (a
//! health check's connection closes after its request, a protocol switch's becomes a tunnel),
//! so the pool's checks for bytes after an answer ([`super::pool`]) cover every connection the
//! proxy reuses.

use std::net::SocketAddr;
use std::time::Duration;

use gateway_config::model::{UpstreamProtocol, UpstreamTlsConfig};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use super::h1::Io;
use crate::body::{Body, BoxError};

/// A sender for one connection.
pub(crate) enum Conn {
    /// HTTP/1.1: one request at a time.
    H1(http1::SendRequest<Body>),
    /// HTTP/2: multiplexed, cheap to clone.
    H2(http2::SendRequest<Body>),
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// `connect_timeout` passed.
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    /// Refused, reset, unreachable.
    #[error("connect failed: {0}")]
    Io(#[source] std::io::Error),
    /// TLS handshake failed (certificate, protocol).
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    /// The HTTP/2 handshake failed, or the peer did not agree to HTTP/2.
    #[error("HTTP handshake failed: {0}")]
    Handshake(#[source] BoxError),
}

/// Everything needed to open connections for one upstream, built at config load.
pub(crate) struct Connector {
    h2: bool,
    tls: Option<tokio_rustls::TlsConnector>,
    connect_timeout: Duration,
    h1_builder: http1::Builder,
    h2_builder: http2::Builder<TokioExecutor>,
}

impl Connector {
    /// Builds the connector; TLS errors come back as `(key suffix, message)`.
    pub(crate) fn new(
        protocol: UpstreamProtocol,
        tls: Option<&UpstreamTlsConfig>,
        connect_timeout: Duration,
    ) -> Result<Self, (&'static str, String)> {
        // `protocol: http2` is HTTP/2 over TLS by definition, so it gets TLS with the defaults
        // (web roots, the target's host as SNI) even without a `tls` block.
        let default_tls = UpstreamTlsConfig::default();
        let (h2, tls) = match protocol {
            UpstreamProtocol::Http1 => (false, tls),
            UpstreamProtocol::Http2 => (true, Some(tls.unwrap_or(&default_tls))),
            UpstreamProtocol::H2c if tls.is_some() => {
                return Err((
                    "protocol",
                    "h2c is cleartext HTTP/2; use `protocol: http2` for HTTP/2 over TLS".into(),
                ));
            }
            UpstreamProtocol::H2c => (true, None),
        };
        let alpn: &'static [u8] = if h2 { b"h2" } else { b"http/1.1" };
        let tls = match tls {
            Some(t) => Some(tokio_rustls::TlsConnector::from(super::tls::client_config(
                t, alpn,
            )?)),
            None => None,
        };
        let mut h1_builder = http1::Builder::new();
        h1_builder.max_headers(128);
        let mut h2_builder = http2::Builder::new(TokioExecutor::new());
        h2_builder
            .timer(TokioTimer::new())
            // Larger windows than the 64 KiB default: one stream can carry a large body at
            // full speed, and memory stays bounded by the window.
            .initial_stream_window_size(2 << 20)
            .initial_connection_window_size(8 << 20)
            // Pings find a dead connection before a request is lost on it.
            .keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10));
        Ok(Self {
            h2,
            tls,
            connect_timeout,
            h1_builder,
            h2_builder,
        })
    }

    /// Whether this upstream speaks HTTP/2.
    pub(crate) fn is_h2(&self) -> bool {
        self.h2
    }

    /// Opens a connection's transport (TCP, then TLS when configured), bounded by
    /// `connect_timeout`.
    pub(crate) async fn open(
        &self,
        addr: SocketAddr,
        server_name: &ServerName<'static>,
    ) -> Result<Io, ConnectError> {
        let opened = tokio::time::timeout(self.connect_timeout, async {
            let tcp = TcpStream::connect(addr).await.map_err(ConnectError::Io)?;
            let _ = tcp.set_nodelay(true);
            let Some(tls) = &self.tls else {
                return Ok(Io::Plain(tcp));
            };
            let stream = tls
                .connect(server_name.clone(), tcp)
                .await
                .map_err(ConnectError::Tls)?;
            if self.h2 && stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(ConnectError::Handshake(
                    "the target did not negotiate HTTP/2 (ALPN h2)".into(),
                ));
            }
            Ok(Io::Tls(Box::new(stream)))
        });
        match opened.await {
            Ok(r) => r,
            Err(_) => Err(ConnectError::Timeout(self.connect_timeout)),
        }
    }

    /// Opens a connection driven by hyper's client, bounded by `connect_timeout` (the HTTP/2
    /// preface included).
    pub(crate) async fn connect(
        &self,
        addr: SocketAddr,
        server_name: &ServerName<'static>,
        on_close: impl FnOnce() + Send + 'static,
    ) -> Result<Conn, ConnectError> {
        let started = tokio::time::Instant::now();
        let io = self.open(addr, server_name).await?;
        let left = self.connect_timeout.saturating_sub(started.elapsed());
        let (conn, driver) = match tokio::time::timeout(left, self.handshake(io)).await {
            Ok(r) => r?,
            Err(_) => return Err(ConnectError::Timeout(self.connect_timeout)),
        };
        spawn_driver(addr, driver, on_close);
        Ok(conn)
    }

    /// Hands an open transport to hyper's HTTP/1.1 client for one exchange that may switch
    /// protocols (the connection is never pooled again).
    pub(crate) async fn handshake_h1(
        &self,
        addr: SocketAddr,
        io: Io,
        on_close: impl FnOnce() + Send + 'static,
    ) -> Result<http1::SendRequest<Body>, ConnectError> {
        let (tx, conn) = self
            .h1_builder
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| ConnectError::Handshake(e.into()))?;
        spawn_driver(addr, Box::pin(conn.with_upgrades()), on_close);
        Ok(tx)
    }

    async fn handshake(
        &self,
        io: Io,
    ) -> Result<
        (
            Conn,
            futures_util::future::BoxFuture<'static, hyper::Result<()>>,
        ),
        ConnectError,
    > {
        let io = TokioIo::new(io);
        if self.h2 {
            let (tx, conn) = self
                .h2_builder
                .handshake(io)
                .await
                .map_err(|e| ConnectError::Handshake(e.into()))?;
            Ok((Conn::H2(tx), Box::pin(conn)))
        } else {
            let (tx, conn) = self
                .h1_builder
                .handshake(io)
                .await
                .map_err(|e| ConnectError::Handshake(e.into()))?;
            // `with_upgrades` lets a 101 response hand the socket over for WebSocket.
            Ok((Conn::H1(tx), Box::pin(conn.with_upgrades())))
        }
    }
}

/// Runs a hyper connection's driver in a task of its own; `on_close` when it ends.
fn spawn_driver(
    addr: SocketAddr,
    driver: futures_util::future::BoxFuture<'static, hyper::Result<()>>,
    on_close: impl FnOnce() + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(e) = driver.await {
            tracing::debug!(%addr, error = %e, "upstream connection ended with an error");
        }
        on_close();
    });
}
