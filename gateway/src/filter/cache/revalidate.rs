//! Background revalidation (`stale-while-revalidate`, RFC 5861): the client has its stale
//! answer already; one request per object (the store's fetch lead) asks the route's terminal
//! with the object's validator, and a 304 refreshes it, a storable answer replaces it, an
//! answer that may not be stored removes it, and an upstream failure leaves it as it was.
//! The filters after `cache` on the route do not run for it: it is the cache's own request.

use std::sync::Arc;
use std::time::SystemTime;

use http::{Request, StatusCode, request};
use http_body_util::{BodyExt, Limited};

use super::serve::Conditions;
use super::store::{Leader, Object, Payload};
use super::{Fetching, Shared, fresh, object, stored_head, validator};
use crate::body::Body;
use crate::context::RequestCx;

/// Starts revalidating `stale` for the request `req` (its head is copied as it is now).
pub(super) fn spawn(
    shared: &Arc<Shared>,
    leader: Leader,
    stale: &Arc<Object>,
    f: &Fetching,
    req: &request::Parts,
    cx: &RequestCx,
) {
    let mut head = wasm_host::state::copy_head(req);
    head.method = http::Method::GET;
    let _ = Conditions::take(&mut head.headers);
    if let Some((name, value)) = validator(stale) {
        head.headers.insert(name, value);
    }
    let f = Fetching {
        primary: f.primary.clone(),
        request: f.request.clone(),
        request_cc: f.request_cc.clone(),
        path: f.path.clone(),
        head: false,
        fwd: "stale",
        stale: Some(stale.clone()),
        fallback: None,
    };
    let (shared, stale, cx) = (shared.clone(), stale.clone(), cx.clone());
    tokio::spawn(async move {
        let _leader = leader;
        let res = shared
            .terminal
            .handle(Request::from_parts(head, Body::default()), &cx)
            .await;
        let (parts, body) = res.into_parts();
        let now = SystemTime::now();
        if parts.status == StatusCode::NOT_MODIFIED {
            shared.refresh(&stale, &parts.headers, &f, now);
            return;
        }
        if parts.status.is_server_error() {
            return;
        }
        match fresh::decide(
            &f.request,
            &f.request_cc,
            parts.status,
            &parts.headers,
            &shared.defaults,
            now,
        ) {
            Ok(freshness) => {
                let body = match Limited::new(body, shared.max_object_size).collect().await {
                    Ok(body) => body,
                    Err(e) => {
                        shared.not_stored(if e.is::<http_body_util::LengthLimitError>() {
                            fresh::NotStored::TooLarge
                        } else {
                            fresh::NotStored::Truncated
                        });
                        return;
                    }
                };
                let headers = stored_head(&parts.headers);
                let body = Payload::Memory(body.to_bytes());
                let obj = object(parts.status, headers, body, &f.path, &freshness);
                shared.store.put(&f.primary, &f.request, obj);
            }
            Err(r) => {
                shared.store.remove(&f.primary);
                shared.not_stored(r);
            }
        }
    });
}
