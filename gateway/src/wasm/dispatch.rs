//! `proxy_http_call` through the generation's upstream pools: the first argument names an
//! upstream from the config, and the call is one more request on that upstream (balancing,
//! health, keep-alive pools and retries apply, as for proxied requests).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HOST, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;
use wasm_host::{HttpCallOut, HttpCallResponse};

use crate::body::{Body, BoxError};
use crate::connection::ConnInfo;
use crate::context::RequestCx;
use crate::proxy::{ProxyRoute, Upstreams};
use crate::telemetry::trace::{self, InternalSpan, span::Value};

/// Largest HTTP call response body kept for the guest.
const MAX_RESPONSE_BODY: usize = 4 << 20;

/// The upstreams a generation's plugins may call.
pub(crate) struct Dispatch {
    routes: HashMap<String, Arc<ProxyRoute>>,
    cx: RequestCx,
}

impl Dispatch {
    pub(crate) fn new(config: &gateway_config::Config, upstreams: &Upstreams) -> Self {
        let routes = config
            .upstreams
            .keys()
            .filter_map(|name| {
                let up = upstreams.get(name)?.clone();
                let mut cfg = gateway_config::model::ProxyConfig::to_upstream(name);
                // A plugin's call gets its answer as a body; it never switches protocols.
                cfg.upgrades = Vec::new();
                Some((name.clone(), Arc::new(ProxyRoute::new(&cfg, up))))
            })
            .collect();
        let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let cx = RequestCx {
            conn: Arc::new(ConnInfo::new(
                local,
                local,
                Arc::from("plugin"),
                false,
                None,
            )),
            route: Arc::from("plugin-http-call"),
            start: Instant::now(),
            trace: None,
            request_head: None,
            jwt: None,
            user: None,
            private_head: false,
        };
        Self { routes, cx }
    }

    /// Sends the call; the caller applies the guest's timeout.
    pub(crate) async fn send(&self, call: &HttpCallOut) -> Result<HttpCallResponse, BoxError> {
        let route = self
            .routes
            .get(&call.upstream)
            .ok_or_else(|| format!("no upstream named `{}`", call.upstream))?;
        let mut req = Request::new(Body::full(call.body.clone()));
        let mut authority = None;
        for (k, v) in &call.headers {
            match k.as_str() {
                ":method" => *req.method_mut() = Method::from_bytes(v)?,
                ":path" => *req.uri_mut() = Uri::try_from(&v[..])?,
                ":authority" => authority = Some(HeaderValue::from_bytes(v)?),
                k if k.starts_with(':') => {}
                k => {
                    req.headers_mut().append(
                        HeaderName::from_bytes(k.as_bytes())?,
                        HeaderValue::from_bytes(v)?,
                    );
                }
            }
        }
        if let Some(a) = authority {
            req.headers_mut().insert(HOST, a);
        }
        let mut cx = self.cx.clone();
        cx.start = Instant::now();
        // A call made while serving a traced request gets a span under the request's, and its
        // upstream attempts carry the trace on (`traceparent`; see telemetry/trace).
        let span = trace::current().map(|parent| {
            let upstream = Value::Owned(call.upstream.as_str().into());
            let attributes = vec![("gateway.upstream", upstream)];
            InternalSpan::start(
                parent.tracer(),
                Some(&parent),
                "plugin http_call",
                attributes,
            )
        });
        cx.trace = span.as_ref().map(|s| s.context().clone());
        let res = route.forward(req, &cx).await;
        if let Some(span) = span {
            let failed = res.status().is_server_error();
            span.end(failed.then(|| res.status().to_string()));
        }
        let (parts, body) = res.into_parts();
        let collected = Limited::new(body, MAX_RESPONSE_BODY).collect().await?;
        let trailers = collected
            .trailers()
            .map(|t| pairs(t.iter()))
            .unwrap_or_default();
        let mut headers = vec![(
            ":status".to_owned(),
            Bytes::copy_from_slice(parts.status.as_str().as_bytes()),
        )];
        headers.extend(pairs(parts.headers.iter()));
        Ok(HttpCallResponse {
            headers,
            body: collected.to_bytes(),
            trailers,
        })
    }
}

fn pairs<'a>(it: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>) -> Vec<(String, Bytes)> {
    it.map(|(k, v)| (k.as_str().to_owned(), Bytes::copy_from_slice(v.as_bytes())))
        .collect()
}
