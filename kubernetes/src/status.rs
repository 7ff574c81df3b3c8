//! Status written back as the Gateway API asks: GatewayClass `Accepted`; Gateway `Accepted` and
//! `Programmed` with its address and per-listener conditions; HTTPRoute `status.parents`
//! entries with our `controllerName`. An object is patched only when what we would write
//! differs from what we last wrote (or read), so our own writes do not wake us forever.

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use gateway_config::KubernetesConfig;
use serde_json::{Value, json};

use crate::client::Client;
use crate::translate::{Report, Verdict};
use crate::watch::{Kind, Snapshot};

/// What was last written, per object path (conditions without their timestamps).
pub type Written = HashMap<String, Value>;

/// Writes every status that changed; failures are logged and retried on the next change.
pub async fn write(
    client: &Client,
    snapshot: &Snapshot,
    report: &Report,
    config: &KubernetesConfig,
    applied: &Result<(), String>,
    refused_ports: &BTreeMap<u16, String>,
    written: &mut Written,
) {
    let now = rfc3339_now();
    let programmed: Verdict = applied.clone().map_err(|e| ("Invalid", e));
    for ((_, name), generation) in &report.classes {
        let status = json!({ "conditions": [
            condition("Accepted", &Ok(()), "Accepted", "served by this gateway", *generation),
            condition("SupportedVersion", &Ok(()), "SupportedVersion", "", *generation),
        ]});
        put(
            client,
            snapshot,
            Kind::GatewayClass,
            "",
            name,
            status,
            written,
            &now,
        )
        .await;
    }
    for gw in &report.gateways {
        let listeners: Vec<Value> = gw
            .listeners
            .iter()
            .map(|l| {
                let ok = l.accepted.is_ok() && l.resolved.is_ok();
                let conflicted = matches!(&l.accepted, Err(("ProtocolConflict", _)));
                let listener_programmed = if let Some(e) = refused_ports.get(&l.port) {
                    Err(("Invalid", e.clone()))
                } else if ok {
                    programmed.clone()
                } else {
                    Err(("Invalid", "the listener is not accepted".to_owned()))
                };
                json!({
                    "name": l.name,
                    "supportedKinds": supported_kinds(l.protocol),
                    "attachedRoutes": l.attached,
                    "conditions": [
                        condition("Accepted", &l.accepted, "Accepted", "", gw.generation),
                        condition("ResolvedRefs", &l.resolved, "ResolvedRefs", "", gw.generation),
                        condition("Programmed", &listener_programmed, "Programmed", "", gw.generation),
                        json!({
                            "type": "Conflicted",
                            "status": if conflicted { "True" } else { "False" },
                            "reason": if conflicted { "ProtocolConflict" } else { "NoConflicts" },
                            "message": "",
                            "observedGeneration": gw.generation,
                        }),
                    ],
                })
            })
            .collect();
        let gateway_programmed = match gw.listeners.iter().find_map(|l| refused_ports.get(&l.port))
        {
            Some(e) => Err(("Invalid", e.clone())),
            None => programmed.clone(),
        };
        let any_listener = gw
            .listeners
            .iter()
            .any(|l| l.accepted.is_ok() && l.resolved.is_ok());
        let accepted: Verdict = if any_listener || gw.listeners.is_empty() {
            Ok(())
        } else {
            Err(("ListenersNotValid", "no listener is accepted".to_owned()))
        };
        let status = json!({
            "addresses": [{ "type": "IPAddress", "value": config.listen_address.to_string() }],
            "conditions": [
                condition("Accepted", &accepted, "Accepted", "", gw.generation),
                condition("Programmed", &gateway_programmed, "Programmed", "", gw.generation),
            ],
            "listeners": listeners,
        });
        let (ns, name) = &gw.key;
        put(
            client,
            snapshot,
            Kind::Gateway,
            ns,
            name,
            status,
            written,
            &now,
        )
        .await;
    }
    for route in &report.routes {
        let (ns, name) = &route.key;
        let current = snapshot.get(route.kind, ns, name);
        // Other controllers' entries are theirs to keep.
        let mut parents: Vec<Value> = current
            .and_then(|r| r["status"]["parents"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p["controllerName"].as_str() != Some(config.controller_name.as_str()))
            .collect();
        for p in &route.parents {
            parents.push(json!({
                "parentRef": p.parent_ref,
                "controllerName": config.controller_name,
                "conditions": [
                    condition("Accepted", &p.accepted, "Accepted", "", route.generation),
                    condition("ResolvedRefs", &p.resolved, "ResolvedRefs", "", route.generation),
                ],
            }));
        }
        let status = json!({ "parents": parents });
        put(
            client, snapshot, route.kind, ns, name, status, written, &now,
        )
        .await;
    }
}

/// The route kinds a listener of this protocol takes.
fn supported_kinds(protocol: &str) -> Value {
    let kinds: &[&str] = match protocol {
        "TCP" => &["TCPRoute"],
        "UDP" => &["UDPRoute"],
        "TLS" => &["TLSRoute"],
        _ => &["HTTPRoute", "GRPCRoute"],
    };
    kinds
        .iter()
        .map(|k| json!({ "group": "gateway.networking.k8s.io", "kind": k }))
        .collect()
}

fn condition(
    kind: &str,
    verdict: &Verdict,
    ok_reason: &str,
    ok_message: &str,
    generation: i64,
) -> Value {
    let (status, reason, message) = match verdict {
        Ok(()) => ("True", ok_reason, ok_message.to_owned()),
        Err((reason, message)) => ("False", *reason, message.clone()),
    };
    json!({
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    })
}

#[allow(
    clippy::too_many_arguments,
    reason = "one call site per kind, all alike"
)]
async fn put(
    client: &Client,
    snapshot: &Snapshot,
    kind: Kind,
    ns: &str,
    name: &str,
    mut status: Value,
    written: &mut Written,
    now: &str,
) {
    let path = format!("{}/status", kind.object(ns, name));
    let Some(object) = snapshot.get(kind, ns, name) else {
        return;
    };
    let current = &object["status"];
    if written.get(&path) == Some(&status) || strip_times(current.clone()) == status {
        written.insert(path, status);
        return;
    }
    let bare = status.clone();
    stamp(&mut status, current, now);
    match client.patch_status(&path, &status).await {
        Ok(()) => {
            written.insert(path, bare);
        }
        Err(e) => tracing::warn!(%path, error = %e, "kubernetes status not written"),
    }
}

/// The status without `lastTransitionTime`s, as it is compared.
fn strip_times(mut v: Value) -> Value {
    match &mut v {
        Value::Object(map) => {
            map.remove("lastTransitionTime");
            for (_, child) in map.iter_mut() {
                *child = strip_times(child.take());
            }
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                *item = strip_times(item.take());
            }
        }
        _ => {}
    }
    v
}

/// Gives every condition a `lastTransitionTime`: the current one's when its status did not
/// change, else now.
fn stamp(v: &mut Value, current: &Value, now: &str) {
    match v {
        Value::Object(map) => {
            if let Some(Value::Array(conditions)) = map.get_mut("conditions") {
                let before = current["conditions"].as_array();
                for c in conditions.iter_mut() {
                    let kept = before
                        .into_iter()
                        .flatten()
                        .find(|b| b["type"] == c["type"] && b["status"] == c["status"]);
                    let time = kept
                        .and_then(|b| b["lastTransitionTime"].as_str())
                        .unwrap_or(now);
                    c["lastTransitionTime"] = json!(time);
                }
            }
            for (key, child) in map.iter_mut() {
                if key != "conditions" {
                    stamp(child, &current[key.as_str()], now);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                stamp(item, &current[i], now);
            }
        }
        _ => {}
    }
}

/// `2026-12-07T04:30:00Z`.
fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_has_the_right_shape() {
        let t = super::rfc3339_now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
    }
}
