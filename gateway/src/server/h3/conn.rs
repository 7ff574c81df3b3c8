//! Serving one QUIC connection: the handshake (or 0.5-RTT when early data is on), the h3
//! connection, one task per request stream handed to the protocol-agnostic [`ConnService`],
//! 425 for unsafe methods sent as 0-RTT early data, and the drain: GOAWAY, let the accepted
//! requests finish and their responses be acknowledged, then close with H3_NO_ERROR.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use h3::server::RequestResolver;
use http::{HeaderValue, Method, Request, StatusCode, Version};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::body::{RequestBody, send_response};
use super::endpoint::H3Runtime;
use super::quic::{self, EarlyStreams};
use crate::body::Body;
use crate::connection::ConnInfo;
use crate::error::error_response;
use crate::filter::with_server;
use crate::server::idle::Activity;
use crate::server::service::ConnService;

/// HTTP/3's "no error" code (RFC 9114 §8.1), for closing a connection that is done.
const H3_NO_ERROR: quinn::VarInt = quinn::VarInt::from_u32(0x100);

/// Serves one incoming QUIC connection until it closes, idles out or drains.
pub(super) async fn serve(
    rt: Arc<H3Runtime>,
    incoming: quinn::Incoming,
    local: SocketAddr,
    drain: CancellationToken,
) {
    let client = incoming.remote_address();
    let Some((conn, mut handshake)) = establish(&rt, incoming).await else {
        return;
    };
    let sni = conn
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name)
        .map(Arc::from);
    let info = ConnInfo::new(
        client,
        conn.local_ip()
            .map_or(local, |ip| SocketAddr::new(ip, local.port())),
        rt.name.clone(),
        true,
        sni,
    );
    let svc = Arc::new(ConnService {
        settings: rt.service.clone(),
        conn: Arc::new(info),
        // QUIC has its own idle timeout and no head deadline; the bookkeeping goes unused.
        activity: Activity::new(false),
    });
    let early = Arc::new(EarlyStreams::default());
    let built = h3::server::builder()
        .max_field_section_size(rt.max_field_section)
        .send_grease(false)
        .build::<_, Bytes>(quic::Connection::new(conn.clone(), early.clone()))
        .await;
    let mut h3 = match built {
        Ok(h3) => h3,
        Err(e) => {
            tracing::debug!(%client, error = %e, "HTTP/3 connection setup failed");
            return;
        }
    };

    let mut requests = JoinSet::new();
    let mut draining = false;
    let handshake_deadline = tokio::time::sleep(rt.handshake_timeout);
    tokio::pin!(handshake_deadline);
    loop {
        tokio::select! {
            // Accept first: a stream that is ready is taken before a drain or timeout is acted on.
            biased;
            accepted = h3.accept() => match accepted {
                Ok(Some(resolver)) => {
                    requests.spawn(request(svc.clone(), resolver, early.clone()));
                }
                Ok(None) => break,
                Err(e) => {
                    if !e.is_h3_no_error() {
                        tracing::debug!(%client, error = %e, "HTTP/3 connection ended with an error");
                    }
                    // The connection is gone: nothing a request writes can arrive.
                    requests.abort_all();
                    break;
                }
            },
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
            _ = completed(&mut handshake), if handshake.is_some() => {
                handshake = None;
            }
            _ = &mut handshake_deadline, if handshake.is_some() => {
                tracing::debug!(%client, "QUIC handshake (after 0-RTT) not completed in time; closing");
                requests.abort_all();
                break;
            }
            _ = drain.cancelled(), if !draining => {
                draining = true;
                // GOAWAY naming the next stream: what was accepted is served, later ones retry.
                if h3.shutdown(1).await.is_err() {
                    requests.abort_all();
                    break;
                }
            }
        }
        if draining && requests.is_empty() {
            break;
        }
    }
    while requests.join_next().await.is_some() {}
    // Every response was acknowledged (finishing a stream waits for that), so nothing is lost.
    conn.close(H3_NO_ERROR, b"");
}

/// Resolves when a 0.5-RTT connection's handshake completes (never when there is none).
async fn completed(handshake: &mut Option<quinn::ZeroRttAccepted>) {
    match handshake {
        Some(h) => {
            let _ = h.await;
        }
        None => std::future::pending().await,
    }
}

/// Completes the handshake; with early data on, returns at once (0.5-RTT) with the future
/// that completes it, so requests sent as 0-RTT can be read straight away.
async fn establish(
    rt: &H3Runtime,
    incoming: quinn::Incoming,
) -> Option<(quinn::Connection, Option<quinn::ZeroRttAccepted>)> {
    let client = incoming.remote_address();
    let connecting = match incoming.accept() {
        Ok(c) => c,
        Err(e) => {
            // quinn reads the client's first flight here, ClientHello included: its errors
            // (no common ALPN or version, a malformed hello) are handshake failures.
            rt.metrics.handshake_errors.inc();
            tracing::debug!(%client, error = %e, "QUIC connection not accepted");
            return None;
        }
    };
    let connecting = if rt.early_data {
        match connecting.into_0rtt() {
            Ok((conn, done)) => return Some((conn, Some(done))),
            Err(connecting) => connecting,
        }
    } else {
        connecting
    };
    match tokio::time::timeout(rt.handshake_timeout, connecting).await {
        Ok(Ok(conn)) => Some((conn, None)),
        Ok(Err(e)) => {
            rt.metrics.handshake_errors.inc();
            tracing::debug!(%client, error = %e, "QUIC handshake failed");
            None
        }
        Err(_) => {
            rt.metrics.handshake_timeouts.inc();
            tracing::debug!(%client, "QUIC handshake timed out");
            None
        }
    }
}

/// Methods that may be served from replayable early data (RFC 8470 §3: safe methods).
fn safe_early(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Serves one request stream.
async fn request(
    svc: Arc<ConnService>,
    resolver: RequestResolver<quic::Connection, Bytes>,
    early: Arc<EarlyStreams>,
) {
    let (req, stream) = match resolver.resolve_request().await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "malformed HTTP/3 request");
            return;
        }
    };
    let is_early = early.contains(stream.id());
    let (mut send, recv) = stream.split();
    let (mut parts, ()) = req.into_parts();
    parts.version = Version::HTTP_3;
    let head_only = parts.method == Method::HEAD;
    let res = if is_early && !safe_early(&parts.method) {
        let generation = svc.generation.load();
        with_server(
            error_response(StatusCode::TOO_EARLY),
            generation.server_header.as_ref(),
        )
    } else {
        if is_early {
            // RFC 8470 §5.1: tell upstreams the request came in early data.
            parts
                .headers
                .insert("early-data", HeaderValue::from_static("1"));
        }
        let body = Body::new(RequestBody::new(recv));
        svc.handle(Request::from_parts(parts, body)).await
    };
    if let Err(e) = send_response(&mut send, res, head_only).await
        && !e.is_h3_no_error()
    {
        tracing::debug!(error = %e, "HTTP/3 response not delivered");
    }
}
