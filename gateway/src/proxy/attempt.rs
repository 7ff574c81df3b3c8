//! One attempt on one of an upstream's targets: the request made for it, sent on the proxy's own
//! HTTP/1.1 client or hyper's, within the attempt's deadline, and the upstream's answer made
//! the client's (hop-by-hop fields and `Via`, a protocol switch spliced, the body wrapped for
//! its deadline and the pool).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;
use http::header::{self, HeaderMap};
use http::{Request, Response, StatusCode, Uri, Version};
use stream_proxy::upstream::Selection;

use super::body::{self, Lease, RawBody};
use super::connect::ConnectError;
use super::pool::{Checkout, Pool};
use super::{
    Failed, ProxyRoute, RequestLine, Rewritten, Sent, connect_error, deadline, h1, headers, pace,
    until, until_paced, upgrade,
};
use crate::body::{Body, BoxError};
use crate::error::GatewayError;
use crate::telemetry::trace::OpenSpan;

impl ProxyRoute {
    /// The request for one attempt on `pool`'s target: with the rewritten `headers`, or
    /// without (`None`: they and `Host` are lent to the HTTP/1.1 client's encoder, and the
    /// request carries only what the attempt adds).
    pub(super) fn request(
        &self,
        line: &RequestLine,
        headers: Option<HeaderMap>,
        body: Body,
        pool: &Pool,
    ) -> Request<Body> {
        let mut req = Request::new(body);
        *req.method_mut() = line.method.clone();
        let Some(headers) = headers else {
            *req.uri_mut() = Uri::from(line.path.clone());
            return req;
        };
        *req.headers_mut() = headers;
        if self.upstream.connector.is_h2() {
            let mut uri = http::uri::Parts::default();
            uri.scheme = Some(self.upstream.scheme.clone());
            uri.authority = Some(
                line.authority
                    .clone()
                    .unwrap_or_else(|| pool.endpoint.authority.clone()),
            );
            uri.path_and_query = Some(line.path.clone());
            *req.uri_mut() = Uri::from_parts(uri).unwrap_or_default();
            *req.version_mut() = Version::HTTP_2;
            req.headers_mut().remove(header::HOST);
        } else {
            *req.uri_mut() = Uri::from(line.path.clone());
            let host = line.host.clone();
            req.headers_mut().insert(
                header::HOST,
                host.unwrap_or_else(|| pool.endpoint.host.clone()),
            );
        }
        req
    }

    /// One attempt: a connection, the request sent, the response head, all within `timeout`
    /// (which the client's waits while its body goes up, noted on `pace`, do not use up). An
    /// `upgrading` request goes through hyper's client, which can hand the connection over once
    /// the upstream switches protocols; every other HTTP/1.1 request through [`h1`], with the
    /// request's `shared` fields (which hyper's clients never get: they take them in `req`).
    ///
    /// A plain function returning a block rather than an `async fn`, which would keep `req`
    /// twice in its state.
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async fn` would keep its arguments twice in its state"
    )]
    pub(super) fn attempt<'a>(
        &'a self,
        pool: &'a Arc<Pool>,
        mut req: Request<Body>,
        shared: Option<h1::Shared<'a>>,
        upgrading: bool,
        pace: Option<&'a pace::Pace>,
    ) -> impl Future<Output = Result<Sent, Failed>> + Send + 'a {
        async move {
            let up = &self.upstream;
            let timeout = self.timeout.unwrap_or_default();
            let timed_out = || GatewayError::UpstreamTimeout(timeout);
            let upstream_failed = |e: BoxError| GatewayError::UpstreamFailed {
                addr: pool.endpoint.addr.to_string(),
                source: e,
            };
            let mut deadline = deadline::start(self.timeout);
            // A pooled connection the peer closed while idle hands the request back unsent; try
            // again on another (a fresh one, once the idle ones run out).
            loop {
                let checkout = match until(&mut deadline, pool.checkout(&up.connector)).await {
                    Some(Ok(c)) => c,
                    failed => return Err(not_connected(failed, pool, timeout, req)),
                };
                let (sent, reused) = match checkout {
                    Checkout::H1 { conn, reused } if !upgrading => {
                        let send = conn.send(req, shared, pool, reused);
                        match until_paced(&mut deadline, pace, send).await {
                            Some(Ok(response)) => {
                                return Ok(Sent {
                                    response: response.map(RawBody::H1),
                                    deadline,
                                });
                            }
                            None => {
                                return Err(Failed {
                                    error: timed_out(),
                                    unsent: None,
                                });
                            }
                            Some(Err(failure)) => match failure.unsent {
                                Some(again) if failure.stale => {
                                    req = again;
                                    continue;
                                }
                                unsent => {
                                    let error = match failure.error {
                                        h1::FailureKind::Upstream(e) => upstream_failed(e.into()),
                                        // The client's, not the target's.
                                        h1::FailureKind::RequestBody(e) => {
                                            GatewayError::RequestBody(e)
                                        }
                                    };
                                    return Err(Failed {
                                        error,
                                        unsent: unsent.map(Request::into_body),
                                    });
                                }
                            },
                        }
                    }
                    Checkout::H1 { conn, reused } => {
                        debug_assert!(shared.is_none(), "hyper's client needs the whole request");
                        let (io, open) = conn.into_io();
                        let handshake = up.connector.handshake_h1(pool.endpoint.addr, io, || {
                            drop(open);
                        });
                        let mut tx = match until(&mut deadline, handshake).await {
                            Some(Ok(tx)) => tx,
                            failed => return Err(not_connected(failed, pool, timeout, req)),
                        };
                        let send = tx.try_send_request(req);
                        (until_paced(&mut deadline, pace, send).await, reused)
                    }
                    Checkout::H2(mut tx) => {
                        debug_assert!(shared.is_none(), "hyper's client needs the whole request");
                        let send = tx.try_send_request(req);
                        (until_paced(&mut deadline, pace, send).await, false)
                    }
                };
                match sent {
                    Some(Ok(response)) => {
                        return Ok(Sent {
                            response: response.map(RawBody::Hyper),
                            deadline,
                        });
                    }
                    None => {
                        return Err(Failed {
                            error: timed_out(),
                            unsent: None,
                        });
                    }
                    Some(Err(mut e)) => match e.take_message() {
                        Some(again) if reused => req = again,
                        unsent => {
                            let e = e.into_error();
                            // A "user" error is ours or the client's (above all, the client's
                            // request body failing mid-upload), not the target's; HTTP/2 tells a
                            // failed body only as the stream it reset, so the body's own note
                            // decides.
                            let error = match pace.and_then(pace::Pace::body_error) {
                                Some(body) => GatewayError::RequestBody(body),
                                None if e.is_user() => GatewayError::RequestBody(e.into()),
                                None => upstream_failed(e.into()),
                            };
                            return Err(Failed {
                                error,
                                unsent: unsent.map(Request::into_body),
                            });
                        }
                    },
                }
            }
        }
    }

    /// The client's response from an upstream's: at once when the body's first look decides
    /// it (most responses), or a boxed future for the rest ([`body::WrapLater`]). Nothing big
    /// is kept across an await of the request's future for it.
    pub(super) fn respond<'a>(
        &'a self,
        sent: Sent,
        selection: Selection,
        span: Option<OpenSpan>,
        req: &mut Rewritten,
    ) -> Responding<'a> {
        let client_upgrade = req.client_upgrade.take();
        let websocket_over_h2 = req.websocket_over_h2;
        let Sent {
            mut response,
            deadline,
        } = sent;
        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        // A tunnel's span ends at the switch rather than lasting as long as the tunnel.
        let span = match span {
            Some(s) if switching => {
                s.finish();
                None
            }
            s => s,
        };
        let lease = Lease {
            upstream: self.upstream.clone(),
            selection,
            deadline,
            timeout: self.timeout,
            span,
        };
        if switching {
            let Some(client) = client_upgrade else {
                // A switch nobody asked for cannot be relayed.
                return Either::Left(self.fail(GatewayError::UpstreamFailed {
                    addr: lease.selection.target().addr.to_string(),
                    source: "upstream switched protocols unasked".into(),
                }));
            };
            // Only hyper's client carries a request that asked to switch, so the switch is in
            // this response's extensions.
            let upstream = hyper::upgrade::on(&mut response);
            let (parts, _) = response.into_parts();
            return Either::Left(upgrade::tunnel(
                parts,
                client,
                upstream,
                lease,
                websocket_over_h2,
            ));
        }
        let (mut parts, incoming) = response.into_parts();
        // The proxy's own client reads only the end-to-end fields into the map
        // ([`gateway_http1::decode::response_head`]); hyper's reads them all.
        if matches!(incoming, RawBody::Hyper(_)) {
            headers::remove_hop_by_hop(&mut parts.headers, false);
        }
        parts
            .headers
            .append(header::VIA, headers::via(parts.version));
        parts.version = Version::HTTP_11;
        let addr = lease.selection.target().addr;
        let finish = move |body: Result<Body, BoxError>| match body {
            Ok(body) => Response::from_parts(parts, body),
            Err(source) => self.fail(GatewayError::UpstreamFailed {
                addr: addr.to_string(),
                source,
            }),
        };
        match body::wrap(incoming, lease) {
            Ok(body) => Either::Left(finish(body)),
            Err(later) => Either::Right(Box::pin(async move { finish(later.await) })),
        }
    }
}

/// The client's response, or (when the upstream body's first frame was not there yet) a boxed
/// future of it.
pub(super) type Responding<'a> =
    Either<Response<Body>, Pin<Box<dyn Future<Output = Response<Body>> + Send + 'a>>>;

/// An attempt that got no connection: `Some(Err(_))` a connect error, `None` the deadline
/// first. The request, untouched, goes back for another target.
pub(super) fn not_connected<T>(
    outcome: Option<Result<T, ConnectError>>,
    pool: &Pool,
    timeout: Duration,
    req: Request<Body>,
) -> Failed {
    let error = match outcome {
        Some(Err(e)) => connect_error(pool, e),
        Some(Ok(_)) | None => GatewayError::UpstreamTimeout(timeout),
    };
    Failed {
        error,
        unsent: Some(req.into_body()),
    }
}
