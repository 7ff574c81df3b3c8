//! The cluster's objects turned into config: our GatewayClasses' Gateways become listeners on
//! `listen_address` (one per port), their HTTPRoutes become routes and their Services'
//! ready endpoints become upstreams. Alongside the config comes a [`Report`] of what was
//! accepted and why not, from which status is written. A broken object only ever costs its own
//! routes: the rest of the cluster, and the file, keep serving.

mod gateways;
mod passthrough;
mod routes;
mod streams;

use std::path::Path;

use gateway_config::KubernetesConfig;
use gateway_config::model::RawConfig;
use serde_json::Value;

use crate::watch::{Key, Kind, Snapshot};

pub use gateways::{GatewayReport, ListenerReport, listener_name};
pub use routes::{ParentReport, RouteReport};

/// Why a condition is `False`: its reason and a message.
pub type Refusal = (&'static str, String);

/// A status condition's verdict: `Ok` is `True` with the positive reason.
pub type Verdict = Result<(), Refusal>;

/// What the cluster asks for, as config, and what status says about it.
#[derive(Debug, Default)]
pub struct Translation {
    /// Listeners, certificates, upstreams and routes to merge into the file's config.
    pub fragment: RawConfig,
    /// Accepted GatewayClasses, Gateways and routes, with reasons.
    pub report: Report,
}

/// What status is written from.
#[derive(Debug, Default)]
pub struct Report {
    /// GatewayClasses naming our controller.
    pub classes: Vec<(Key, i64)>,
    /// Gateways of those classes.
    pub gateways: Vec<GatewayReport>,
    /// HTTPRoutes naming at least one of those Gateways.
    pub routes: Vec<RouteReport>,
}

/// Translates a snapshot; certificates from Secrets are written into `cert_dir`.
pub fn translate(snapshot: &Snapshot, config: &KubernetesConfig, cert_dir: &Path) -> Translation {
    let mut out = Translation::default();
    for ((_, name), class) in snapshot.all(Kind::GatewayClass) {
        if class["spec"]["controllerName"].as_str() == Some(config.controller_name.as_str()) {
            out.report
                .classes
                .push(((String::new(), name.clone()), generation(class)));
        }
    }
    let classes: Vec<&str> = out
        .report
        .classes
        .iter()
        .map(|(k, _)| k.1.as_str())
        .collect();
    let mut gateways = gateways::translate(snapshot, config, &classes, cert_dir, &mut out.fragment);
    out.report.routes = routes::translate(snapshot, &mut gateways, &mut out.fragment);
    let streams = streams::translate(snapshot, config, &mut gateways, &mut out.fragment);
    out.report.routes.extend(streams);
    let passthrough = passthrough::translate(snapshot, config, &mut gateways, &mut out.fragment);
    out.report.routes.extend(passthrough);
    out.report.gateways = gateways.into_iter().map(|g| g.report).collect();
    out
}

/// Drops the routes the config loader refuses, each checked alone with the fragment's
/// listeners and upstreams, so one object the controller translated badly costs only its own
/// routes; their HTTPRoutes are reported not accepted. The whole is checked first: the usual
/// case costs one validation.
pub fn prune(t: &mut Translation) {
    let check = |fragment: &RawConfig| {
        gateway_config::load_str_with("", "<kubernetes>", Path::new("/"), Some(fragment))
    };
    let Err(whole) = check(&t.fragment) else {
        return;
    };
    let routes = std::mem::take(&mut t.fragment.routes);
    let mut kept = Vec::new();
    let mut refused = Vec::new();
    for route in routes {
        let mut alone = t.fragment.clone();
        alone.routes = vec![route.clone()];
        match check(&alone) {
            Ok(_) => kept.push(route),
            Err(e) => refused.push((route.name.clone().unwrap_or_default(), e.to_string())),
        }
    }
    t.fragment.routes = kept;
    if refused.is_empty() {
        // Not a route's fault (listeners, certificates, upstreams): the gateway will refuse
        // the whole and keep the last good state, and Programmed says why.
        tracing::error!(error = %whole, "kubernetes config does not validate");
        return;
    }
    for (name, error) in refused {
        tracing::warn!(route = %name, %error, "kubernetes route refused");
        // `kubernetes/NS/NAME/...`
        let mut parts = name.split('/').skip(1);
        let (Some(ns), Some(route)) = (parts.next(), parts.next()) else {
            continue;
        };
        for r in t
            .report
            .routes
            .iter_mut()
            .filter(|r| r.key.0 == ns && r.key.1 == route)
        {
            for p in &mut r.parents {
                p.accepted = Err(("UnsupportedValue", error.clone()));
            }
        }
    }
}

/// `metadata.generation`, reported back as `observedGeneration`.
pub fn generation(object: &Value) -> i64 {
    object["metadata"]["generation"].as_i64().unwrap_or(0)
}

/// Whether `namespace` is watched.
fn watched(config: &KubernetesConfig, namespace: &str) -> bool {
    config.namespaces.is_empty() || config.namespaces.iter().any(|n| n == namespace)
}

/// Whether a ReferenceGrant in `to_ns` lets a `from_kind` in `from_ns` refer to the
/// `to_group`/`to_kind` object `to_name`.
fn reference_granted(
    snapshot: &Snapshot,
    from_kind: &str,
    from_ns: &str,
    to_group: &str,
    to_kind: &str,
    to_ns: &str,
    to_name: &str,
) -> bool {
    snapshot
        .all(Kind::ReferenceGrant)
        .filter(|((ns, _), _)| ns == to_ns)
        .any(|(_, grant)| {
            let from_ok = grant["spec"]["from"].as_array().is_some_and(|from| {
                from.iter().any(|f| {
                    f["group"].as_str() == Some("gateway.networking.k8s.io")
                        && f["kind"].as_str() == Some(from_kind)
                        && f["namespace"].as_str() == Some(from_ns)
                })
            });
            let to_ok = grant["spec"]["to"].as_array().is_some_and(|to| {
                to.iter().any(|t| {
                    t["group"].as_str().unwrap_or_default() == to_group
                        && t["kind"].as_str() == Some(to_kind)
                        && t["name"].as_str().is_none_or(|n| n == to_name)
                })
            });
            from_ok && to_ok
        })
}

#[cfg(test)]
mod tests;
