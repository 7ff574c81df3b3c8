//! One TCP connection from accept to close:
//!
//! 1. PROXY protocol header from a front load balancer (`accept_proxy_protocol`): the client
//!    address becomes the real one.
//! 2. Filters' `on_connect` (allow, deny, connection_rate, plugins): the first `Close` refuses.
//! 3. Route: with `sni_routes`, peek the ClientHello and pick by server name, else `upstream`.
//! 4. Connect to a target (balancer, health, failover).
//! 5. Send the PROXY header (`proxy_protocol`) and the bytes already read, then relay both ways
//!    until both sides are done, the idle timeout passes, or a filter closes.
//!
//! Every step is bounded in time (header timeout, connect timeout, idle timeout) and every
//! failure closes only this connection. The idle deadline and the drain stop are the stream's
//! watchdog's (`watchdog.rs`). One debug line per connection reports the outcome.

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;

use bytes::BytesMut;
use gateway_config::model::{ProxyProtocolVersion, SniFallback};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::Instrument;

use crate::compiled::{CompiledStream, StreamUpstream};
use crate::connect::connect;
use crate::filter::{ActiveFilters, CloseSummary, ConnectionInfo};
use crate::relay::{Direction, Progress, buffered, filtered};
use crate::sni::{ClientHello, read_client_hello};
use crate::stats::StreamStats;
use crate::watchdog::{Idle, Signal, Watch};
use crate::{StreamError, proxy_protocol};

/// Serves one accepted connection; `watch` ends it when idle or when the drain timeout passed.
pub(crate) async fn serve(
    io: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    rt: Arc<CompiledStream>,
    stats: Arc<StreamStats>,
    watch: Watch<Idle>,
) {
    // Debug level: at the default level neither the span nor the close line costs anything per
    // connection. The per-connection record is the access log's (the gateway's observer).
    let span = tracing::debug_span!(
        "stream",
        stream = %rt.name,
        %peer,
        client = tracing::field::Empty,
        target = tracing::field::Empty,
        sni = tracing::field::Empty,
    );
    let progress = Progress::watched(stats.clone(), watch.stamp());
    // A disabled span (the default level) clones for nothing; recording into it is a no-op,
    // where `Span::current()` would look the span up on every call.
    let fields = span.clone();
    let work = async {
        let mut ids = None;
        let outcome = handle(io, peer, local, &rt, &progress, &watch, &fields, &mut ids).await;
        count(&stats, &outcome);
        crate::log_ids::sync_scope(ids, || log(&progress, &outcome));
    };
    work.instrument(span).await;
}

/// `ids`: set to what the filters name for the connection's log lines, once they let it in.
#[allow(
    clippy::too_many_arguments,
    reason = "one connection's pieces, borrowed from `serve`"
)]
async fn handle(
    mut io: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    rt: &CompiledStream,
    progress: &Progress,
    watch: &Watch<Idle>,
    span: &tracing::Span,
    ids: &mut Option<crate::log_ids::LogIds>,
) -> Result<(), StreamError> {
    crate::listener::accepted_nodelay(&io);
    let mut pending = BytesMut::new();
    let (client, local) = if rt.accept_proxy_protocol {
        let header = pin!(proxy_protocol::read_header(
            &mut io,
            &mut pending,
            rt.header_timeout
        ));
        watch
            .until(header)
            .await
            .map_err(|_| StreamError::Shutdown)??
            .addresses(peer, local)
    } else {
        (peer, local)
    };
    span.record("client", tracing::field::display(client));
    let info = ConnectionInfo {
        stream: rt.name.clone(),
        protocol: rt.protocol,
        client,
        peer,
        local,
    };
    let mut filters = rt
        .filters
        .connect(&info)
        .await
        .map_err(StreamError::FilterRefused)?;
    // The drain timeout stops the work but not `on_close`: every filter that saw the
    // connection start sees it end.
    let mut summary = CloseSummary::default();
    *ids = filters.log_ids();
    // The work ends (and its sockets close) at the end of this block, before `on_close`.
    let result = {
        let work = pin!(crate::log_ids::scope(
            *ids,
            proxy(
                &mut io,
                pending,
                &info,
                rt,
                &mut filters,
                progress,
                &mut summary,
                watch,
                span,
            )
        ));
        match watch.until(work).await {
            Ok(result) => result,
            Err(Signal::Expired(_)) => Err(StreamError::Idle(rt.idle_timeout)),
            Err(Signal::Stop) => Err(StreamError::Shutdown),
        }
    };
    // Without filters nobody reads the summary (a clock read and, on error, a string).
    if !filters.is_empty() {
        summary.bytes_in = progress.bytes_in();
        summary.bytes_out = progress.bytes_out();
        summary.duration = progress.elapsed();
        summary.error = result.as_ref().err().map(ToString::to_string);
        filters.close(&info, &summary).await;
    }
    result
}

#[allow(
    clippy::too_many_arguments,
    reason = "one connection's pieces, borrowed from `handle` for the relay's life"
)]
async fn proxy(
    io: &mut TcpStream,
    mut pending: BytesMut,
    info: &ConnectionInfo,
    rt: &CompiledStream,
    filters: &mut ActiveFilters,
    progress: &Progress,
    summary: &mut CloseSummary,
    watch: &Watch<Idle>,
    span: &tracing::Span,
) -> Result<(), StreamError> {
    let upstream = route(io, &mut pending, rt, summary, span).await?;
    let mut up = connect(upstream, info.client.ip()).await?;
    let target = up.selection.target().addr;
    summary.target = Some(target);
    span.record("target", tracing::field::display(target));

    let mut head = BytesMut::new();
    match rt.proxy_protocol {
        ProxyProtocolVersion::None => {}
        ProxyProtocolVersion::V1 => proxy_protocol::write_v1(info.client, info.local, &mut head),
        ProxyProtocolVersion::V2 => proxy_protocol::write_v2(info.client, info.local, &mut head),
    }
    let inspect = rt.filters.inspects_data();
    if inspect && !pending.is_empty() {
        filters.downstream(&mut pending, false).await?;
    }
    if !head.is_empty() || !pending.is_empty() {
        head.extend_from_slice(&pending);
        up.io.write_all(&head).await?;
        progress.add(Direction::In, pending.len());
    }
    drop(pending);

    // The idle deadline covers the relay; the steps before it have their own timeouts.
    watch.arm_idle(rt.idle_timeout);
    if inspect {
        return filtered::relay(io, &mut up.io, filters, progress).await;
    }
    Ok(buffered::relay(io, &up.io, progress, rt.zero_copy).await?)
}

/// The upstream for this connection: by SNI when the stream has SNI routes, else `upstream`.
async fn route<'a>(
    io: &mut TcpStream,
    pending: &mut BytesMut,
    rt: &'a CompiledStream,
    summary: &mut CloseSummary,
    span: &tracing::Span,
) -> Result<&'a Arc<StreamUpstream>, StreamError> {
    if rt.sni_routes.is_empty() {
        return rt
            .upstream
            .as_ref()
            .ok_or(StreamError::NoRoute("no upstream"));
    }
    let hello = read_client_hello(io, pending, rt.header_timeout).await?;
    if let ClientHello::Sni(name) = &hello {
        span.record("sni", name.as_str());
        summary.sni = Some(name.clone());
        if let Some(up) = rt.sni_routes.lookup(name) {
            return Ok(up);
        }
    }
    let why = match hello {
        ClientHello::Sni(_) => "no SNI route matches",
        ClientHello::NoSni => "the ClientHello has no server name",
        _ => "not a TLS ClientHello",
    };
    match (&rt.upstream, rt.sni_fallback) {
        (Some(up), SniFallback::Upstream) => Ok(up),
        _ => Err(StreamError::NoRoute(why)),
    }
}

fn count(stats: &StreamStats, outcome: &Result<(), StreamError>) {
    let Err(e) = outcome else { return };
    let counter = match e {
        StreamError::FilterRefused(_) => &stats.filter_denials,
        StreamError::FilterClosed(_) => &stats.filter_closes,
        StreamError::ProxyProtocol(_)
        | StreamError::HeaderTimeout { .. }
        | StreamError::HeaderEof(_)
        | StreamError::HeaderTooLarge { .. }
        | StreamError::NoRoute(_) => &stats.bad_handshakes,
        StreamError::NoHealthyTarget(_) => &stats.upstream_unavailable,
        StreamError::Idle(_) => &stats.idle_timeouts,
        _ => return,
    };
    StreamStats::inc(counter);
}

/// The connection's debug line. Every outcome is counted; the access log (the gateway's observer)
/// has the per-connection record.
fn log(progress: &Progress, outcome: &Result<(), StreamError>) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let (bytes_in, bytes_out) = (progress.bytes_in(), progress.bytes_out());
    let duration_ms = progress.elapsed().as_millis() as u64;
    match outcome {
        Ok(()) => tracing::debug!(bytes_in, bytes_out, duration_ms, "connection closed"),
        Err(
            e @ (StreamError::FilterRefused(_)
            | StreamError::ProxyProtocol(_)
            | StreamError::HeaderTimeout { .. }
            | StreamError::HeaderEof(_)
            | StreamError::HeaderTooLarge { .. }
            | StreamError::NoRoute(_)),
        ) => tracing::debug!(error = %e, "connection refused"),
        Err(e) => {
            tracing::debug!(bytes_in, bytes_out, duration_ms, error = %e, "connection closed")
        }
    }
}
