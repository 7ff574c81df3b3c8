//! The admin API, on its own listener (loopback unless configured otherwise):
//! `GET /health` (the process is up), `GET /ready` (serving, not draining), `GET /metrics`
//! (Prometheus text), `GET /config` (the running config, secrets redacted), `POST /reload`
//! (200, or 400 with the located error), `POST /acme/renew[?certificate=NAME]` (202: ACME
//! renewals start now; 404 for a name that is not an ACME certificate),
//! `POST /cache/NAME/purge?prefix=P` or `?path=P` (200 with how many objects went; 404 for a
//! name that is not a cache).
//!
//! Every request but the two probes (`GET /health`, `GET /ready`, which tell nothing but that
//! the process serves, and which load balancers and orchestrators probe by address, without a
//! token) passes [`access`] first: `Host`, `Origin` and the bearer token.

mod access;
mod redact;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::GatewayError;
use crate::generation::Generation;
use crate::telemetry::Telemetry;
use access::{Guard, Refusal};
pub use redact::redact;

/// What the admin API reads and drives in the running gateway. [`crate::server::Gateway`]
/// implements it: the admin API names only this, so it sits below the server that starts it.
pub trait Control: Clone + Send + Sync + 'static {
    /// The generation serving now.
    fn generation(&self) -> Arc<Generation>;
    /// The gateway's telemetry (`GET /metrics` renders its registry).
    fn telemetry(&self) -> &Telemetry;
    /// Whether the gateway serves, not draining.
    fn is_ready(&self) -> bool;
    /// Reloads the config file: the located error when the new config is not used.
    fn reload(&self) -> impl Future<Output = Result<(), GatewayError>> + Send;
    /// Starts the renewal of the named ACME certificate, or of all of them: how many, or
    /// `None` for a name that is not an ACME certificate.
    fn renew_certificates(&self, name: Option<&str>) -> Option<usize>;
}

/// Serves the admin API, bound at `local`, until `stop` is cancelled.
pub async fn serve<G: Control>(
    listener: TcpListener,
    local: SocketAddr,
    gateway: G,
    stop: CancellationToken,
) {
    let guard = Arc::new(Guard::new(local, &gateway.telemetry().registry));
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let gw = gateway.clone();
        let guard = guard.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let gw = gw.clone();
                let guard = guard.clone();
                async move { Ok::<_, Infallible>(handle(&gw, &guard, req).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(body.into()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    res
}

const PLAIN: &str = "text/plain; charset=utf-8";

/// The answer to a refused request.
fn refused(refusal: Refusal) -> Response<Full<Bytes>> {
    let (status, body, challenge) = match refusal {
        Refusal::Host => (StatusCode::FORBIDDEN, "host not allowed\n", None),
        Refusal::Origin => (StatusCode::FORBIDDEN, "origin not allowed\n", None),
        Refusal::NoToken => (
            StatusCode::UNAUTHORIZED,
            "bearer token required\n",
            Some("Bearer"),
        ),
        Refusal::WrongToken => (
            StatusCode::UNAUTHORIZED,
            "invalid bearer token\n",
            Some("Bearer error=\"invalid_token\""),
        ),
    };
    let mut res = text(status, PLAIN, body);
    if let Some(challenge) = challenge {
        res.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static(challenge),
        );
    }
    res
}

async fn handle<G: Control>(
    gw: &G,
    guard: &Guard,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let probe = req.method() == Method::GET && matches!(req.uri().path(), "/health" | "/ready");
    if !probe {
        let generation = gw.generation();
        let Some(admin) = &generation.config.admin else {
            // The admin section was just removed; this listener is being stopped.
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                "admin API removed\n",
            );
        };
        if let Err(refusal) = guard.check(&req, admin) {
            return refused(refusal);
        }
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") => text(StatusCode::OK, PLAIN, "ok\n"),
        (&Method::GET, "/ready") => {
            if gw.is_ready() {
                text(StatusCode::OK, PLAIN, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, "draining\n")
            }
        }
        (&Method::GET, "/metrics") => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            gw.telemetry().registry.render(),
        ),
        (&Method::GET, "/config") => {
            let generation = gw.generation();
            let mut value =
                serde_yaml::to_value(&generation.config.raw).unwrap_or(serde_yaml::Value::Null);
            redact(&mut value);
            let body = serde_yaml::to_string(&value).unwrap_or_default();
            text(StatusCode::OK, "application/yaml", body)
        }
        (&Method::POST, "/reload") => match gw.reload().await {
            Ok(()) => text(StatusCode::OK, PLAIN, "reloaded\n"),
            Err(e) => text(StatusCode::BAD_REQUEST, PLAIN, format!("{e}\n")),
        },
        (&Method::POST, "/acme/renew") => {
            let name = req.uri().query().and_then(|q| {
                q.split('&')
                    .find_map(|kv| kv.strip_prefix("certificate="))
                    .map(str::to_owned)
            });
            match gw.renew_certificates(name.as_deref()) {
                Some(n) => text(
                    StatusCode::ACCEPTED,
                    PLAIN,
                    format!("renewing {n} certificate(s)\n"),
                ),
                None => text(StatusCode::NOT_FOUND, PLAIN, "no such ACME certificate\n"),
            }
        }
        (method, path) if path.starts_with("/cache/") => {
            if method != Method::POST {
                return text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    PLAIN,
                    "method not allowed\n",
                );
            }
            purge(gw, path, req.uri().query())
        }
        (_, "/health" | "/ready" | "/metrics" | "/config" | "/reload" | "/acme/renew") => text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "method not allowed\n",
        ),
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n"),
    }
}

/// `POST /cache/NAME/purge?prefix=P` (request paths starting with P) or `?path=P` (exactly P),
/// P as it appears in requests' targets.
fn purge<G: Control>(gw: &G, path: &str, query: Option<&str>) -> Response<Full<Bytes>> {
    let Some(name) = path
        .strip_prefix("/cache/")
        .and_then(|p| p.strip_suffix("/purge"))
    else {
        return text(StatusCode::NOT_FOUND, PLAIN, "not found\n");
    };
    let generation = gw.generation();
    let Some(store) = generation.caches.get(name) else {
        return text(StatusCode::NOT_FOUND, PLAIN, "no such cache\n");
    };
    let mut pairs = query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='));
    let n = match pairs.next() {
        Some(("prefix", p)) if !p.is_empty() => {
            let p = p.to_owned();
            store.purge(move |path| path.starts_with(&p))
        }
        Some(("path", p)) if !p.is_empty() => {
            let p = p.to_owned();
            store.purge(move |path| path == p)
        }
        _ => {
            return text(
                StatusCode::BAD_REQUEST,
                PLAIN,
                "give one of ?prefix=P or ?path=P\n",
            );
        }
    };
    text(StatusCode::OK, PLAIN, format!("purged {n} object(s)\n"))
}
