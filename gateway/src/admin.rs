//! The admin API, on its own listener (loopback unless configured otherwise):
//! `GET /health` (the process is up), `GET /ready` (serving, not draining), `GET /metrics`
//! (Prometheus text), `GET /config` (the running config, secrets redacted), `POST /reload`
//! (200, or 400 with the located error), `POST /acme/renew[?certificate=NAME]` (202: ACME
//! renewals start now; 404 for a name that is not an ACME certificate).

use std::convert::Infallible;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::server::Gateway;

/// Serves the admin API until `stop` is cancelled.
pub async fn serve(listener: TcpListener, gateway: Gateway, stop: CancellationToken) {
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
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let gw = gw.clone();
                async move { Ok::<_, Infallible>(handle(&gw, req).await) }
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

async fn handle(gw: &Gateway, req: Request<Incoming>) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
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
        (_, "/health" | "/ready" | "/metrics" | "/config" | "/reload" | "/acme/renew") => text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "method not allowed\n",
        ),
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n"),
    }
}

/// Replaces the values of keys that look like secrets anywhere in the tree (plugin configs carry
/// API keys and signing secrets).
pub fn redact(value: &mut serde_yaml::Value) {
    const SECRET_WORDS: [&str; 8] = [
        "secret",
        "password",
        "passwd",
        "token",
        "api_key",
        "apikey",
        "private",
        "credential",
    ];
    match value {
        serde_yaml::Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                let key = k.as_str().unwrap_or_default().to_ascii_lowercase();
                if SECRET_WORDS.iter().any(|w| key.contains(w)) || key == "keys" {
                    *v = serde_yaml::Value::String("<redacted>".into());
                } else {
                    redact(v);
                }
            }
        }
        serde_yaml::Value::Sequence(seq) => seq.iter_mut().for_each(redact),
        serde_yaml::Value::String(s) => redact_url_password(s),
        _ => {}
    }
}

/// `scheme://user:password@host…` → `scheme://user:<redacted>@host…` (e.g. `cluster.redis`).
fn redact_url_password(s: &mut String) {
    let Some(start) = s.find("://").map(|i| i + 3) else {
        return;
    };
    let authority_end = s[start..].find('/').map_or(s.len(), |i| start + i);
    let Some(at) = s[start..authority_end].rfind('@').map(|i| start + i) else {
        return;
    };
    let colon = s[start..at].find(':').map_or(start, |i| start + i + 1);
    if colon < at {
        s.replace_range(colon..at, "<redacted>");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let mut v: serde_yaml::Value =
            serde_yaml::from_str("plugins:\n  auth:\n    config: { jwt_secret: s3cret, header: x-api-key, keys: [a, b], nested: { Password: p } }\n").unwrap();
        super::redact(&mut v);
        let text = serde_yaml::to_string(&v).unwrap();
        assert!(
            !text.contains("s3cret") && !text.contains(" p\n") && !text.contains("- a"),
            "{text}"
        );
        assert!(text.contains("header: x-api-key"), "{text}");
    }

    #[test]
    fn passwords_in_urls_are_redacted() {
        let mut v: serde_yaml::Value =
            serde_yaml::from_str("cluster: { redis: \"redis://app:hunter2@10.0.0.5:6379/1\" }\nother: \"redis://10.0.0.5:6379\"\n").unwrap();
        super::redact(&mut v);
        let text = serde_yaml::to_string(&v).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            text.contains("redis://app:<redacted>@10.0.0.5:6379/1"),
            "{text}"
        );
        assert!(text.contains("redis://10.0.0.5:6379"), "{text}");
    }
}
