//! Serving one accepted connection: TLS handshake and ALPN, the hyper connection (HTTP/1.1,
//! HTTP/2, or either by preface sniffing on cleartext), the HTTP/1 framing checks, and its
//! place in the listener's watchdog table (idle, header-read and write-stall deadlines, and the
//! graceful shutdown when the gateway drains).
//!
//! Memory per connection matters at 10,000 connections. The hyper connection is boxed and the
//! TLS path is a boxed future of its own, so a connection's task holds neither the TLS state nor
//! the larger of the protocols' states. For the same reason the task keeps no state it no
//! longer needs: hyper's connection is set up by a plain function (an `async fn` would keep its
//! arguments for its whole life), the first read polls the socket directly, and the rare PROXY
//! header read is boxed, which keeps the task in a small size class of the allocator. A
//! cleartext port serving both protocols reads the first bytes to pick HTTP/1 or h2c and
//! replays them to that protocol's server, instead of letting hyper-util's reader consume and
//! replay them: that replay splits hyper's first read, which makes it double its 8 KiB read
//! buffer.
//!
//! The steps a connection's task awaits for its whole life are functions returning an
//! `async move` block, not `async fn`s: an `async fn` moves its arguments into locals and keeps
//! the originals too, so its state holds every argument twice (the stream, the addresses, the
//! watch) for as long as the connection lives. The block uses the captured values in place.

use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use stream_proxy::watchdog::{Signal, Watch, Watchdog};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::connection::ConnInfo;
use crate::server::checked::CheckedIo;
use crate::server::fast_path;
use crate::server::idle::{Activity, ConnDeadlines, TrackedIo, Verdict};
use crate::server::linger::Lingering;
use crate::server::sendfile::SendFile;
use crate::server::service::{ConnService, HyperService, ServiceSettings};
use crate::server::streams::{BatchedStreams, StreamBatch};
use crate::telemetry::ListenerMetrics;
use gateway_http1::framing::Framing;

/// The watchdog table of one listener's HTTP connections.
pub type ConnWatchdog = Watchdog<ConnDeadlines>;

/// A connection's place in its listener's watchdog table.
pub type ConnWatch = Watch<ConnDeadlines>;

/// Registers a connection just accepted on `rt`'s listener; its deadlines start when the
/// first-bytes peek or HTTP arms them.
pub fn watch(watchdog: &ConnWatchdog, rt: &ListenerRuntime) -> ConnWatch {
    watchdog.register(ConnDeadlines::new(
        rt.idle_timeout,
        rt.header_timeout,
        rt.write_timeout,
    ))
}

/// Per-listener settings every connection uses, built when the listener starts.
pub struct ListenerRuntime {
    /// Listener name.
    pub name: Arc<str>,
    /// TLS, if any.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Serves HTTP/1.
    pub http1: bool,
    /// Serves HTTP/2.
    pub http2: bool,
    /// hyper settings.
    pub builder: auto::Builder<BatchedStreams>,
    /// The same HTTP/1 settings, for connections that may only speak HTTP/1.
    pub h1_builder: hyper::server::conn::http1::Builder,
    /// Largest HTTP/1 request head (hyper's read buffer); the framing checks hold no more.
    pub max_head: usize,
    /// Idle timeout.
    pub idle_timeout: Duration,
    /// Header read timeout (also bounds the TLS handshake).
    pub header_timeout: Duration,
    /// Longest the client may accept no byte of what is being written; zero: no limit.
    pub write_timeout: Duration,
    /// What every connection's service shares: the generation, limits, response headers,
    /// telemetry, body timeout and ACME answers.
    pub service: Arc<ServiceSettings>,
    /// Expect a PROXY protocol header (from a front load balancer) before anything else.
    pub accept_proxy_protocol: bool,
    /// Connection counters.
    pub metrics: ListenerMetrics,
    /// HTTP/1.1 requests without a body are served without hyper ([`fast_path`]).
    pub http1_fast_path: bool,
    /// What the fast path shares across the listener's connections.
    pub fast_path: FastPathListener,
}

/// What the HTTP/1.1 fast path shares across a listener's connections: its counters and the
/// listener's own header lines.
pub struct FastPathListener {
    /// Every request answered there.
    pub answered: crate::telemetry::Counter,
    /// Those of them served through the route's filter chain and terminal, rather than from
    /// answers prepared ahead of time or the text forward.
    pub through_chain: crate::telemetry::Counter,
    /// The listener's header lines (HSTS, `Alt-Svc`), written into every response as the
    /// general path adds them; made once here, not per connection.
    pub listener_lines: Box<[u8]>,
}

impl ListenerRuntime {
    /// The fast path's counters of the listener and its header lines: `hsts` and `alt_svc` as
    /// [`ListenerPolicy::hsts`] and [`ListenerRuntime::alt_svc`].
    pub fn fast_path_listener(
        registry: &crate::telemetry::Registry,
        listener: &str,
        hsts: Option<&http::HeaderValue>,
        alt_svc: Option<&http::HeaderValue>,
    ) -> FastPathListener {
        let mut listener_lines = Vec::new();
        for (name, value) in [("strict-transport-security", hsts), ("alt-svc", alt_svc)] {
            if let Some(value) = value {
                gateway_http1::fields::push_field(
                    &mut listener_lines,
                    name.as_bytes(),
                    value.as_bytes(),
                );
            }
        }
        FastPathListener {
            listener_lines: listener_lines.into_boxed_slice(),
            answered: registry.counter(
                "gateway_http1_fast_path_requests_total",
                "HTTP/1.1 requests answered on the fast path (every request without a body, without hyper), per listener.",
                &[("listener", listener)],
            ),
            through_chain: registry.counter(
                "gateway_http1_fast_path_chain_requests_total",
                "Of the HTTP/1.1 fast path's requests, those served through the route's filter chain and terminal rather than from prepared answers, per listener.",
                &[("listener", listener)],
            ),
        }
    }

    /// The largest HTTP/1 request head accepted (hyper needs at least 8 KiB of read buffer).
    pub fn max_head(settings: &gateway_config::model::ListenerConfig) -> usize {
        settings.max_header_size.as_usize().max(8192)
    }

    /// The builder for HTTP/1-only connections, set up as the auto builder's HTTP/1 side.
    pub fn http1_builder(
        settings: &gateway_config::model::ListenerConfig,
    ) -> hyper::server::conn::http1::Builder {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(None)
            // hyper answers 431 when a request head does not fit the read buffer.
            .max_buf_size(Self::max_head(settings))
            .max_headers(128)
            .keep_alive(true);
        b
    }

    /// Builds the hyper connection builder from listener settings.
    pub fn hyper_builder(
        settings: &gateway_config::model::ListenerConfig,
    ) -> auto::Builder<BatchedStreams> {
        let mut b = auto::Builder::new(BatchedStreams);
        let max_head = Self::max_head(settings);
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .max_buf_size(max_head)
            .max_headers(128)
            .keep_alive(true);
        b.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(settings.http2.max_concurrent_streams)
            .initial_stream_window_size(
                settings
                    .http2
                    .initial_stream_window
                    .bytes()
                    .min(u32::MAX as u64) as u32,
            )
            .initial_connection_window_size(
                settings
                    .http2
                    .initial_connection_window
                    .bytes()
                    .min(u32::MAX as u64) as u32,
            )
            .max_header_list_size(max_head as u32)
            .enable_connect_protocol();
        b
    }
}

/// Serves one TCP connection until it ends, idles out or the gateway drains (the listener's
/// watchdog tells it through `watch`).
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its state (module header)"
)]
pub fn serve(
    rt: Arc<ListenerRuntime>,
    mut stream: TcpStream,
    mut client: SocketAddr,
    mut local: SocketAddr,
    watch: ConnWatch,
) -> impl Future<Output = ()> {
    async move {
        stream_proxy::accepted_nodelay(&stream);
        let mut rest = bytes::BytesMut::new();
        if rt.accept_proxy_protocol {
            // Boxed: only listeners behind a load balancer read this header, and its state would
            // otherwise enlarge every connection's task.
            let header = stream_proxy::proxy_protocol::read_header(
                &mut stream,
                &mut rest,
                rt.header_timeout,
            );
            match Box::pin(header).await {
                Ok(h) => (client, local) = h.addresses(client, local),
                Err(e) => {
                    tracing::debug!(peer = %client, error = %e, "bad PROXY protocol header; closing");
                    return;
                }
            }
        }
        match &rt.tls {
            None => {
                let (h1, h2) = match (rt.http1, rt.http2) {
                    // Bytes read past a PROXY header already tell.
                    (true, true) => {
                        if rest.is_empty() && !read_first(&mut stream, &mut rest, &watch).await {
                            return;
                        }
                        match version_of(&rest) {
                            Peeked::Http1 => (true, false),
                            Peeked::Http2 => (false, true),
                            Peeked::Either => (true, true),
                        }
                    }
                    both => both,
                };
                // The bytes read so far (past a PROXY header, or the first read) belong to HTTP:
                // replay them first.
                let stream = stream_proxy::Rewind::new(rest.freeze(), Lingering(stream));
                let info = ConnInfo::new(client, local, rt.name.clone(), false, None);
                serve_http(rt, stream, info, h1, h2, watch).await;
            }
            Some(acceptor) => {
                // Bytes read past the PROXY header belong to TLS: replay them first.
                let stream = stream_proxy::Rewind::new(rest.freeze(), Lingering(stream));
                // Boxed: the handshake's state would otherwise enlarge every plain connection's task.
                let acceptor = acceptor.clone();
                Box::pin(serve_tls(rt, acceptor, stream, client, local, watch)).await;
            }
        }
    }
}

/// What a cleartext connection's first bytes say about its HTTP version.
enum Peeked {
    Http1,
    Http2,
    /// A prefix of the HTTP/2 preface, split over segments: hyper-util's reader waits for more.
    Either,
}

/// The connection preface of an h2c client with prior knowledge.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads a cleartext connection's first bytes into `first`; `false` when the client closed,
/// sent nothing within the idle timeout, or the gateway is draining. The bytes are read, not
/// peeked: they are replayed to whichever server takes the connection (through the framing
/// checks, as if read there), and a peek would cost every connection a second `recv` for the
/// same bytes. The wait is the watchdog's (armed here; HTTP re-arms it), so a connection whose
/// first bytes are not there yet arms no timer and waits on no drain token of its own.
async fn read_first(
    stream: &mut TcpStream,
    first: &mut bytes::BytesMut,
    watch: &ConnWatch,
) -> bool {
    watch.deadlines().arm(false);
    let mut read = pin!(std::future::poll_fn(|cx| {
        // Read into the thread's spare read buffer and keep a copy of what came: a connection
        // whose readiness was reported before its bytes came holds no buffer while it waits,
        // and 10,000 connections opened at once do not each hold one until their first request
        // has been answered.
        std::task::ready!(stream.poll_read_ready(cx))?;
        fast_path::with_read_buffer(|spare| {
            let read = tokio_util::io::poll_read_buf(Pin::new(&mut *stream), cx, spare);
            first.extend_from_slice(spare);
            read
        })
    }));
    matches!(
        std::future::poll_fn(|cx| watch.poll_until(read.as_mut(), cx)).await,
        Ok(Ok(n)) if n > 0
    )
}

/// What a cleartext connection's first bytes (at least one) say about its HTTP version.
fn version_of(first: &[u8]) -> Peeked {
    let seen = first.len().min(H2_PREFACE.len());
    if first[..seen] != H2_PREFACE[..seen] {
        Peeked::Http1
    } else if seen == H2_PREFACE.len() {
        Peeked::Http2
    } else {
        Peeked::Either
    }
}

/// The TLS handshake, then HTTP over it as ALPN decided.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its state (module header)"
)]
fn serve_tls(
    rt: Arc<ListenerRuntime>,
    acceptor: tokio_rustls::TlsAcceptor,
    stream: stream_proxy::Rewind<Lingering>,
    client: SocketAddr,
    local: SocketAddr,
    watch: ConnWatch,
) -> impl Future<Output = ()> {
    async move {
        // Boxed for its time: the handshake's state holds the TLS session, and inline it would
        // stay in this future for the connection's life after the session has moved on. For
        // the same reason the session is a local of the inner block only: a local's room stays
        // in the future across every later await, even once it has been moved out.
        let handshake = Box::pin(tokio::time::timeout(
            rt.header_timeout,
            acceptor.accept(stream),
        ));
        let served = {
            let tls = match handshake.await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    rt.metrics.handshake_errors.inc();
                    tracing::debug!(%client, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    rt.metrics.handshake_timeouts.inc();
                    tracing::debug!(%client, "TLS handshake timed out");
                    return;
                }
            };
            after_handshake(rt, tls, client, local, watch)
        };
        served.await;
    }
}

/// What follows a TLS handshake: HTTP over it as ALPN decided, or the end of an ACME
/// validation.
fn after_handshake(
    rt: Arc<ListenerRuntime>,
    mut tls: tokio_rustls::server::TlsStream<stream_proxy::Rewind<Lingering>>,
    client: SocketAddr,
    local: SocketAddr,
    watch: ConnWatch,
) -> impl Future<Output = ()> {
    // A TLS-ALPN-01 validation ends with the handshake (RFC 8737 section 3).
    if tls.get_ref().1.alpn_protocol() == Some(crate::certs::challenge::ACME_TLS_ALPN) {
        return Either::Left(Box::pin(async move {
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut tls).await;
        }));
    }
    let (alpn_h2, sni) = {
        let (_, session) = tls.get_ref();
        (
            session.alpn_protocol() == Some(b"h2"),
            session.server_name().map(Arc::from),
        )
    };
    let info = ConnInfo::new(client, local, rt.name.clone(), true, sni);
    // ALPN decided the protocol; without ALPN, HTTP/1.1 is the safe default.
    let (h1, h2) = if alpn_h2 {
        (false, true)
    } else {
        (rt.http1, !rt.http1 && rt.http2)
    };
    Either::Right(serve_http(rt, tls, info, h1, h2, watch))
}

/// Serves cleartext HTTP on any byte stream with the listener's protocols: what [`serve`] does
/// after TLS and the PROXY header. The fuzz targets drive it over in-memory pipes.
pub async fn serve_io<IO>(rt: Arc<ListenerRuntime>, io: IO, info: ConnInfo, watch: ConnWatch)
where
    IO: AsyncRead + AsyncWrite + SendFile + Unpin + Send + 'static,
{
    let (h1, h2) = (rt.http1, rt.http2);
    serve_http(rt, io, info, h1, h2, watch).await;
}

/// Sets up hyper's connection over `io` and returns the future that serves it.
///
/// Not an `async fn`: an async fn's arguments (the stream, the connection's addresses) stay in
/// its state for as long as it runs, even once moved into hyper's connection, and that state is
/// part of every connection's task. Done here before the first poll, the setup leaves the task
/// only what [`drive`] keeps.
fn serve_http<IO>(
    rt: Arc<ListenerRuntime>,
    io: IO,
    info: ConnInfo,
    h1: bool,
    h2: bool,
    watch: ConnWatch,
) -> impl Future<Output = ()> + Send
where
    IO: AsyncRead + AsyncWrite + SendFile + Unpin + Send + 'static,
{
    let client = info.client;
    let activity = watch.deadlines().arm(!h2 || h1).clone();
    let service = conn_service(&rt, info, activity.clone());
    // HTTP/1 requests are checked for ambiguous framing before hyper parses them; a
    // connection that chose HTTP/2 by ALPN is not (HTTP/2 frames every message itself).
    let strict = rt.service.policy.entry.strict_uri;
    let framing = match (h1, h2) {
        (false, true) => Framing::off(),
        (true, false) => Framing::http1(rt.max_head, false).strict_targets(strict),
        // Served by preface sniffing below: an HTTP/2 preface turns the checks off.
        _ => Framing::http1(rt.max_head, true).strict_targets(strict),
    };
    let tracked = TrackedIo::new(io, activity.clone());
    let io = TokioIo::new(CheckedIo::new(
        tracked,
        framing,
        rt.service.policy.rejected.clone(),
        activity,
    ));
    // hyper-util's `serve_connection_with_upgrades` sniffs the preface whatever the builder's
    // version is, so a connection limited to one protocol uses that protocol's own server: an
    // ALPN `h2` connection never falls back to HTTP/1, an HTTP/1-only one never to h2c.
    // Each hyper connection is boxed (see the module header). hyper-util's connections borrow
    // their builder until they know the protocol; owned, they copy it only while sniffing the
    // preface, which an HTTP/2-only connection never does.
    match (h1, h2) {
        (false, true) => {
            let builder = rt.builder.clone().http2_only();
            let conn = Box::pin(builder.serve_connection(io, service).into_owned());
            let conn = StreamBatch::new(conn);
            Either::Left(drive(
                conn,
                |c| c.conn.as_mut().graceful_shutdown(),
                rt,
                client,
                watch,
            ))
        }
        (true, false) => {
            // The fast path takes the connection's first requests (all of them, usually); a
            // request it does not answer hands the connection to hyper. Boxed, like hyper's
            // connection: its state would otherwise enlarge every connection's task.
            let checked = io.into_inner();
            // Everything the hyper connection needs goes through `first`, so that this future
            // keeps only the box (what it captures, it keeps for its whole life).
            let first = Box::pin(first_requests(rt, checked, service, watch, client));
            let served = async move {
                let Some(HandedOff {
                    io,
                    service,
                    rt,
                    client,
                    watch,
                }) = first.await
                else {
                    return;
                };
                let conn = rt.h1_builder.serve_connection(TokioIo::new(io), service);
                let conn = Box::pin(conn.with_upgrades());
                drive(conn, |c| c.as_mut().graceful_shutdown(), rt, client, watch).await;
            };
            Either::Right(Either::Left(served))
        }
        _ => {
            let conn = rt.builder.serve_connection_with_upgrades(io, service);
            let conn = StreamBatch::new(Box::pin(conn.into_owned()));
            let served = drive(
                conn,
                |c| c.conn.as_mut().graceful_shutdown(),
                rt,
                client,
                watch,
            );
            Either::Right(Either::Right(served))
        }
    }
}

/// The service every request of the connection `info` describes goes through.
fn conn_service(rt: &ListenerRuntime, info: ConnInfo, activity: Arc<Activity>) -> HyperService {
    HyperService(Arc::new(ConnService {
        settings: rt.service.clone(),
        conn: Arc::new(info),
        activity,
    }))
}

/// An HTTP/1 connection handed to hyper after the fast path, with what serving it takes.
struct HandedOff<IO> {
    /// The connection, with the bytes read and not answered in front of it.
    io: stream_proxy::Rewind<IO>,
    service: HyperService,
    rt: Arc<ListenerRuntime>,
    client: SocketAddr,
    watch: ConnWatch,
}

/// The HTTP/1.1 fast path ([`fast_path`]) on a connection's first requests, when the listener
/// has it on; then the connection for hyper, or `None` when it ended.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its state (module header)"
)]
fn first_requests<IO>(
    rt: Arc<ListenerRuntime>,
    mut io: IO,
    service: HyperService,
    watch: ConnWatch,
    client: SocketAddr,
) -> impl Future<Output = Option<HandedOff<IO>>>
where
    IO: AsyncRead + AsyncWrite + SendFile + Unpin,
{
    async move {
        let mut rest = bytes::BytesMut::new();
        if rt.http1_fast_path {
            let conn = fast_path::Conn::new(&service.0, &rt.fast_path, io.sends_files());
            match fast_path::serve(&conn, &rt, &mut io, &mut rest, &watch).await {
                fast_path::Ended::Closed => return None,
                fast_path::Ended::HandOff => {}
            }
        }
        Some(HandedOff {
            io: stream_proxy::Rewind::new(rest.freeze(), io),
            service,
            rt,
            client,
            watch,
        })
    }
}

/// Drives one hyper connection until it ends or the watchdog ends it: a draining gateway or an
/// idle connection shuts it down gracefully (in-flight requests finish); a slow request head or
/// a client that reads nothing closes it at once.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its state (module header)"
)]
fn drive<C, E>(
    mut conn: C,
    graceful_shutdown: impl Fn(&mut C),
    rt: Arc<ListenerRuntime>,
    client: SocketAddr,
    watch: ConnWatch,
) -> impl Future<Output = ()>
where
    C: Future<Output = Result<(), E>> + Unpin,
    E: std::fmt::Display,
{
    async move {
        let mut draining = false;
        loop {
            let verdict = match std::future::poll_fn(|cx| watch.poll_until(Pin::new(&mut conn), cx))
                .await
            {
                Ok(res) => {
                    if let Err(e) = res {
                        tracing::debug!(listener = %rt.name, error = %e, "connection ended with an error");
                    }
                    return;
                }
                // Draining: in-flight requests finish, then the connection closes.
                Err(Signal::Stop) => Verdict::Idle,
                Err(Signal::Expired(code)) => Verdict::from_code(code),
            };
            match verdict {
                Verdict::SlowHead => {
                    rt.metrics.header_timeouts.inc();
                    tracing::debug!(listener = %rt.name, "request head not received in time; closing");
                    return;
                }
                Verdict::WriteStalled => {
                    // Dropping the connection drops what it buffered: a client that stopped
                    // reading holds no memory past this point.
                    rt.metrics.write_timeouts.inc();
                    tracing::debug!(listener = %rt.name, %client, "client read nothing for write_timeout; closing");
                    return;
                }
                // Told again on later ticks while it closes; once is enough.
                Verdict::Idle | Verdict::Wait(_) => {
                    if !draining {
                        draining = true;
                        graceful_shutdown(&mut conn);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    /// Largest future the fast path may keep boxed for each HTTP/1.1 connection while it serves
    /// it, in a debug build, over an in-memory pipe: every connection keeps it for its whole
    /// life, so state only some requests need (a file's lookup, the exchange with an upstream,
    /// the service) is boxed for the request's time rather than held inline
    /// (docs/performance-log.md, "Connection footprint: nothing kept between requests").
    const FAST_PATH_FUTURE_LIMIT: usize = 512;

    /// Largest part of that future answering a connection's ready requests takes, in a debug
    /// build.
    const ANSWER_FUTURE_LIMIT: usize = 320;

    /// Largest future a TLS connection keeps boxed beside its task, in a debug build. The
    /// handshake holds the TLS session while it runs; boxed for its time, it leaves nothing
    /// here once the session has moved on to HTTP.
    const TLS_FUTURE_LIMIT: usize = 384;

    #[test]
    fn a_tls_connection_keeps_no_handshake_state() {
        #[derive(Debug)]
        struct NoCertificate;
        impl rustls::server::ResolvesServerCert for NoCertificate {
            fn resolve(
                &self,
                _: rustls::server::ClientHello<'_>,
            ) -> Option<Arc<rustls::sign::CertifiedKey>> {
                None
            }
        }
        let (runtime, rt) = crate::fuzzing::test_listener();
        runtime.block_on(async {
            let accept = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = accept.local_addr().expect("address");
            let stream = TcpStream::connect(addr).await.expect("connect");
            let config = rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(NoCertificate));
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            let watch = watch(&ConnWatchdog::start(CancellationToken::new()), &rt);
            let stream = stream_proxy::Rewind::new(bytes::Bytes::new(), Lingering(stream));
            let tls = serve_tls(rt.clone(), acceptor, stream, addr, addr, watch);
            let size = std::mem::size_of_val(&tls);
            assert!(
                size <= TLS_FUTURE_LIMIT,
                "a TLS connection's future is {size} bytes, over {TLS_FUTURE_LIMIT}"
            );
        });
    }

    #[test]
    fn the_fast_path_future_of_a_connection_stays_small() {
        let (runtime, rt) = crate::fuzzing::test_listener();
        runtime.block_on(async {
            let (_client, server_side) = tokio::io::duplex(1024);
            let addr = SocketAddr::from(([127, 0, 0, 1], 40000));
            let info = ConnInfo::new(addr, addr, rt.name.clone(), false, None);
            let watch = watch(&ConnWatchdog::start(CancellationToken::new()), &rt);
            let activity = watch.deadlines().arm(true).clone();
            let service = conn_service(&rt, info, activity);
            let mut io = server_side;
            let answer = fast_path::answer_future_size(
                &fast_path::Conn::new(&service.0, &rt.fast_path, false),
                &rt,
                &mut io,
                &mut bytes::BytesMut::new(),
                &watch,
            );
            assert!(
                answer <= ANSWER_FUTURE_LIMIT,
                "the future answering a connection's requests is {answer} bytes, over {ANSWER_FUTURE_LIMIT}"
            );
            let first = first_requests(rt.clone(), io, service, watch, addr);
            let size = std::mem::size_of_val(&first);
            assert!(
                size <= FAST_PATH_FUTURE_LIMIT,
                "the fast path's future is {size} bytes, over {FAST_PATH_FUTURE_LIMIT}"
            );
        });
    }
}
