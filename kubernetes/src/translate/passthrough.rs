//! TLSRoutes (experimental channel) attached to TLS listeners in `Passthrough` mode become
//! streams of the L4 proxy routed by the server name of the client's TLS ClientHello, one per
//! port on `listen_address`; the TLS itself is never terminated. Each hostname a route serves
//! on a listener (its hostnames intersected with the listener's) picks an upstream holding the
//! ready endpoints of the route's backends, each weighted by its backendRef's weight; a route
//! without hostnames on a listener without one takes every name no other route claims. A
//! hostname two routes claim on a port stays with the older one; the other is not accepted.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use gateway_config::KubernetesConfig;
use gateway_config::model::{RawConfig, StreamConfig, UpstreamConfig};
use serde_json::{Map, Value, json};

use super::gateways::{ServedGateway, ServedListener};
use super::generation;
use super::routes::{RouteReport, hostnames};
use super::streams::{attach_parents, targets};
use crate::watch::{Key, Kind, Snapshot};

/// Per server name (`None`: every name no other route claims), the route serving it and its
/// weighted targets.
type ByName = BTreeMap<Option<String>, (Key, Vec<(String, u64)>)>;

pub(super) fn translate(
    snapshot: &Snapshot,
    config: &KubernetesConfig,
    gateways: &mut [ServedGateway],
    fragment: &mut RawConfig,
) -> Vec<RouteReport> {
    let mut reports = Vec::new();
    let mut served: BTreeMap<u16, ByName> = BTreeMap::new();
    // The oldest route keeps a contested hostname, as the Gateway API's conflict rules say.
    let mut routes: Vec<_> = snapshot.all(Kind::TlsRoute).collect();
    routes.sort_by_key(|(key, r)| (r["metadata"]["creationTimestamp"].as_str(), *key));
    for ((ns, name), route) in routes {
        let key = (ns.clone(), name.clone());
        let hostnames = hostnames(route);
        let (targets, resolved) = targets(snapshot, Kind::TlsRoute, ns, route);
        let claim = |l: &ServedListener, hosts: Vec<Option<String>>| {
            let names = served.entry(l.port).or_default();
            let mut kept = false;
            for host in hosts {
                let slot = names
                    .entry(host)
                    .or_insert_with(|| (key.clone(), targets.clone()));
                kept |= slot.0 == key;
            }
            if kept {
                Ok(())
            } else {
                Err((
                    "UnsupportedValue",
                    format!(
                        "another route already serves these hostnames on port {}",
                        l.port
                    ),
                ))
            }
        };
        let parents = attach_parents(gateways, route, ns, &hostnames, "TLS", &resolved, claim);
        if !parents.is_empty() {
            reports.push(RouteReport {
                kind: Kind::TlsRoute,
                key,
                generation: generation(route),
                parents,
            });
        }
    }
    for (port, names) in served {
        stream(config, port, names, fragment);
    }
    reports
}

/// The stream of one port: an upstream per server name with targets, the unnamed route's as
/// the stream's fallback.
fn stream(config: &KubernetesConfig, port: u16, names: ByName, fragment: &mut RawConfig) {
    let mut sni_routes = Map::new();
    let mut fallback = None;
    for (host, (_, targets)) in names {
        if targets.is_empty() {
            continue;
        }
        let upstream = match &host {
            Some(h) => format!("kubernetes/tls/{port}/{h}"),
            None => format!("kubernetes/tls/{port}"),
        };
        let targets: Vec<Value> = targets
            .iter()
            .map(|(address, weight)| json!({ "address": address, "weight": weight }))
            .collect();
        match serde_json::from_value::<UpstreamConfig>(json!({ "targets": targets })) {
            Ok(u) => {
                fragment.upstreams.insert(upstream.clone(), u);
            }
            Err(e) => {
                tracing::error!(port, error = %e, "kubernetes TLS upstream not built");
                continue;
            }
        }
        match host {
            Some(h) => {
                sni_routes.insert(h, json!(upstream));
            }
            None => fallback = Some(upstream),
        }
    }
    if sni_routes.is_empty() && fallback.is_none() {
        return;
    }
    let stream = serde_json::from_value::<StreamConfig>(json!({
        "name": format!("kubernetes-tls-{port}"),
        "bind": SocketAddr::new(config.listen_address, port).to_string(),
        "protocol": "tcp",
        "sni_routes": sni_routes,
        "upstream": fallback,
    }));
    match stream {
        Ok(s) => fragment.streams.push(s),
        Err(e) => tracing::error!(port, error = %e, "kubernetes TLS stream not built"),
    }
}
