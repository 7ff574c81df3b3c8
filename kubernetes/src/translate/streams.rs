//! TCPRoutes and UDPRoutes (experimental channel) attached to TCP and UDP listeners become
//! streams of the L4 proxy, one per port on `listen_address`, whose upstream holds the ready
//! endpoints of the route's backends, each weighted by its backendRef's weight. One route per
//! listener: a later one is refused.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use gateway_config::KubernetesConfig;
use gateway_config::model::{RawConfig, StreamConfig, UpstreamConfig};
use serde_json::{Value, json};

use super::gateways::{ServedGateway, ServedListener};
use super::routes::{ParentReport, RouteReport, attach, endpoints};
use super::{Verdict, generation};
use crate::watch::{Key, Kind, Snapshot};

/// A listener port's route: which one, and its weighted targets.
type Served = BTreeMap<(u16, &'static str), (Key, Vec<(String, u64)>)>;

pub(super) fn translate(
    snapshot: &Snapshot,
    config: &KubernetesConfig,
    gateways: &mut [ServedGateway],
    fragment: &mut RawConfig,
) -> Vec<RouteReport> {
    let mut reports = Vec::new();
    let mut served: Served = BTreeMap::new();
    for (kind, protocol, transport) in [
        (Kind::TcpRoute, "TCP", "tcp"),
        (Kind::UdpRoute, "UDP", "udp"),
    ] {
        for ((ns, name), route) in snapshot.all(kind) {
            let key = (ns.clone(), name.clone());
            let (targets, resolved) = targets(snapshot, kind, ns, route);
            let parents = attach_parents(gateways, route, ns, &[], protocol, &resolved, |l, _| {
                let slot = served
                    .entry((l.port, transport))
                    .or_insert_with(|| (key.clone(), targets.clone()));
                if slot.0 == key {
                    Ok(())
                } else {
                    Err((
                        "UnsupportedValue",
                        format!("port {} already carries another route", l.port),
                    ))
                }
            });
            if !parents.is_empty() {
                reports.push(RouteReport {
                    kind,
                    key,
                    generation: generation(route),
                    parents,
                });
            }
        }
    }
    for ((port, transport), (_, targets)) in served {
        if targets.is_empty() {
            continue;
        }
        let name = format!("kubernetes-{transport}-{port}");
        let targets: Vec<Value> = targets
            .iter()
            .map(|(address, weight)| json!({ "address": address, "weight": weight }))
            .collect();
        let upstream = serde_json::from_value::<UpstreamConfig>(json!({ "targets": targets }));
        let stream = serde_json::from_value::<StreamConfig>(json!({
            "name": name,
            "bind": SocketAddr::new(config.listen_address, port).to_string(),
            "protocol": transport,
            "upstream": name,
        }));
        match (upstream, stream) {
            (Ok(u), Ok(s)) => {
                fragment.upstreams.insert(name, u);
                fragment.streams.push(s);
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(port, error = %e, "kubernetes stream not built")
            }
        }
    }
    reports
}

/// The verdicts of an L4 route (namespace `ns`, `hostnames` for TLS) for each of its parentRefs
/// that names one of `gateways`: attached to the listeners of `protocol` it may use, each
/// listener (with the hostnames the route serves there) offered to `claim`, whose refusal is
/// the parent's `Accepted: False`. Listeners that take the route count it as attached.
pub(super) fn attach_parents(
    gateways: &mut [ServedGateway],
    route: &Value,
    ns: &str,
    hostnames: &[String],
    protocol: &str,
    resolved: &Verdict,
    mut claim: impl FnMut(&ServedListener, Vec<Option<String>>) -> Verdict,
) -> Vec<ParentReport> {
    let mut parents = Vec::new();
    for parent in route["spec"]["parentRefs"].as_array().into_iter().flatten() {
        let pns = parent["namespace"].as_str().unwrap_or(ns);
        let pname = parent["name"].as_str().unwrap_or_default();
        let Some(gw) = gateways
            .iter_mut()
            .find(|g| g.report.key.0 == pns && g.report.key.1 == pname)
        else {
            continue;
        };
        let mut accepted: Verdict = Ok(());
        match attach(gw, parent, ns, hostnames, &[protocol]) {
            Err(e) => accepted = Err(e),
            Ok(listeners) => {
                for (listener, hosts) in listeners {
                    let Some(l) = gw.listeners.iter().find(|l| l.name == listener) else {
                        continue;
                    };
                    if let Err(refused) = claim(l, hosts) {
                        accepted = Err(refused);
                        continue;
                    }
                    if let Some(r) = gw.report.listeners.iter_mut().find(|r| r.name == listener) {
                        r.attached += 1;
                    }
                }
            }
        }
        parents.push(ParentReport {
            parent_ref: parent.clone(),
            accepted,
            resolved: resolved.clone(),
        });
    }
    parents
}

/// Every ready endpoint of the route's backends with its backendRef's weight, and the route's
/// ResolvedRefs verdict.
pub(super) fn targets(
    snapshot: &Snapshot,
    kind: Kind,
    ns: &str,
    route: &Value,
) -> (Vec<(String, u64)>, Verdict) {
    let mut out = Vec::new();
    let mut resolved: Verdict = Ok(());
    for rule in route["spec"]["rules"].as_array().into_iter().flatten() {
        for b in rule["backendRefs"].as_array().into_iter().flatten() {
            let weight = b["weight"].as_u64().unwrap_or(1);
            match endpoints(snapshot, kind, ns, b) {
                Ok(addrs) if weight > 0 => out.extend(addrs.into_iter().map(|a| (a, weight))),
                Ok(_) => {}
                Err(e) => {
                    if resolved.is_ok() {
                        resolved = Err(e);
                    }
                }
            }
        }
    }
    (out, resolved)
}
