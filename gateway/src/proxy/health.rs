//! Active health checks: every `interval`, each target gets `GET path` on a fresh connection
//! (so a check proves the target accepts connections, and never disturbs pooled ones), bounded
//! by `timeout`. A 2xx or 3xx passes. Results feed the targets' active health state; the task
//! ends when its generation is dropped.

use std::sync::Arc;

use futures_util::future::join_all;
use gateway_config::model::HealthCheckConfig;
use http::{Method, Request, header};
use tokio_util::sync::CancellationToken;

use super::connect::Conn;
use super::pool::Pool;
use super::upstream::Upstream;
use crate::body::Body;

const USER_AGENT: header::HeaderValue = header::HeaderValue::from_static("gateway-health-check");

pub(crate) async fn run(
    up: Arc<Upstream>,
    path: String,
    cfg: HealthCheckConfig,
    cancel: CancellationToken,
) {
    let Ok(path) = http::uri::PathAndQuery::try_from(path) else {
        tracing::warn!(upstream = %up.name, "health check path is not a valid URI path");
        return;
    };
    let mut ticks = tokio::time::interval(cfg.interval.get());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        // The targets now: a target that joins later is checked from the next round on.
        let targets = up.targets.current();
        let (up, path, cfg) = (&up, &path, &cfg);
        let checks = targets.iter().filter_map(|t| {
            let pool = t.attachment::<Arc<Pool>>()?;
            Some(async move { (t, check(up, pool, path, cfg).await) })
        });
        let results = tokio::select! {
            _ = cancel.cancelled() => return,
            r = join_all(checks) => r,
        };
        for (t, passed) in results {
            up.targets.report_check_on(t, passed);
        }
    }
}

async fn check(
    up: &Upstream,
    pool: &Pool,
    path: &http::uri::PathAndQuery,
    cfg: &HealthCheckConfig,
) -> bool {
    let endpoint = &pool.endpoint;
    let attempt = async {
        let conn = up
            .connector
            .connect(endpoint.addr, &endpoint.server_name, || {})
            .await
            .ok()?;
        let mut req = Request::new(Body::empty());
        *req.method_mut() = Method::GET;
        req.headers_mut()
            .insert(header::USER_AGENT, USER_AGENT.clone());
        let res = match conn {
            Conn::H1(mut tx) => {
                *req.uri_mut() = path.clone().into();
                req.headers_mut()
                    .insert(header::HOST, endpoint.host.clone());
                tx.send_request(req).await.ok()?
            }
            Conn::H2(mut tx) => {
                *req.uri_mut() = http::Uri::from_parts({
                    let mut p = http::uri::Parts::default();
                    p.scheme = Some(up.scheme.clone());
                    p.authority = Some(endpoint.authority.clone());
                    p.path_and_query = Some(path.clone());
                    p
                })
                .ok()?;
                *req.version_mut() = http::Version::HTTP_2;
                tx.send_request(req).await.ok()?
            }
        };
        let s = res.status();
        Some(s.is_success() || s.is_redirection())
    };
    let passed = matches!(
        tokio::time::timeout(cfg.timeout.get(), attempt).await,
        Ok(Some(true))
    );
    if !passed {
        tracing::debug!(upstream = %up.name, target = %endpoint.host.to_str().unwrap_or("?"), "health check failed");
    }
    passed
}
