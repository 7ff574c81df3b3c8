//! Gateways of our classes: each listener is checked (protocol, certificates, port conflicts)
//! and the accepted ones become config listeners, one per port on `listen_address`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

use gateway_config::KubernetesConfig;
use gateway_config::model::{CertificateConfig, ListenerConfig, RawConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Refusal, Verdict, generation, reference_granted, watched};
use crate::watch::{Key, Kind, Snapshot};

/// One Gateway's verdicts.
#[derive(Debug)]
pub struct GatewayReport {
    /// Namespace and name.
    pub key: Key,
    /// `metadata.generation`.
    pub generation: i64,
    /// Its listeners, in spec order.
    pub listeners: Vec<ListenerReport>,
}

/// One Gateway listener's verdicts.
#[derive(Debug)]
pub struct ListenerReport {
    /// The listener's name in the Gateway.
    pub name: String,
    /// Its port.
    pub port: u16,
    /// Its protocol as written (`HTTP`, `HTTPS`, `TCP`, ...).
    pub protocol: &'static str,
    /// Accepted (protocol, port).
    pub accepted: Verdict,
    /// ResolvedRefs (certificates).
    pub resolved: Verdict,
    /// Routes attached to it.
    pub attached: u32,
}

/// A Gateway as the route translation needs it.
pub(super) struct ServedGateway {
    pub(super) report: GatewayReport,
    /// Accepted listeners: spec name, config listener name, hostname, allowed namespaces.
    pub(super) listeners: Vec<ServedListener>,
}

pub(super) struct ServedListener {
    pub(super) name: String,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP` or `UDP`.
    pub(super) protocol: String,
    pub(super) config_name: String,
    pub(super) port: u16,
    pub(super) hostname: Option<String>,
    /// The namespaces whose routes it admits; `None`: every namespace.
    pub(super) namespaces: Option<BTreeSet<String>>,
}

impl ServedListener {
    /// Whether routes of namespace `ns` may attach.
    pub(super) fn admits(&self, ns: &str) -> bool {
        self.namespaces.as_ref().is_none_or(|n| n.contains(ns))
    }
}

/// The config listener's name for a port.
pub fn listener_name(port: u16) -> String {
    format!("kubernetes-{port}")
}

pub(super) fn translate(
    snapshot: &Snapshot,
    config: &KubernetesConfig,
    classes: &[&str],
    cert_dir: &Path,
    fragment: &mut RawConfig,
) -> Vec<ServedGateway> {
    // Per port and transport: its protocol and certificates, once every Gateway has been seen.
    let mut ports: BTreeMap<(u16, bool), (String, Vec<String>)> = BTreeMap::new();
    let mut served = Vec::new();
    for ((ns, name), gw) in snapshot.all(Kind::Gateway) {
        let class = gw["spec"]["gatewayClassName"].as_str().unwrap_or_default();
        if !classes.contains(&class) || !watched(config, ns) {
            continue;
        }
        let mut report = GatewayReport {
            key: (ns.clone(), name.clone()),
            generation: generation(gw),
            listeners: Vec::new(),
        };
        let mut listeners = Vec::new();
        for l in gw["spec"]["listeners"].as_array().into_iter().flatten() {
            let lname = l["name"].as_str().unwrap_or_default().to_owned();
            let port = l["port"]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(0);
            let protocol = l["protocol"].as_str().unwrap_or_default().to_owned();
            let mut lr = ListenerReport {
                name: lname.clone(),
                port,
                protocol: match protocol.as_str() {
                    "HTTPS" => "HTTPS",
                    "TCP" => "TCP",
                    "UDP" => "UDP",
                    "TLS" => "TLS",
                    _ => "HTTP",
                },
                accepted: Ok(()),
                resolved: Ok(()),
                attached: 0,
            };
            let mut certs = Vec::new();
            match protocol.as_str() {
                "HTTP" | "TCP" | "UDP" => {}
                // TLS is passed through to the backends by server name, never terminated here.
                "TLS" if l["tls"]["mode"].as_str() == Some("Passthrough") => {}
                "TLS" => {
                    lr.accepted = Err((
                        "UnsupportedProtocol",
                        "TLS listeners are served in Passthrough mode only".to_owned(),
                    ))
                }
                "HTTPS" => match certificates(snapshot, ns, l, cert_dir, fragment) {
                    Ok(c) => certs = c,
                    Err(e) => lr.resolved = Err(e),
                },
                other => {
                    lr.accepted = Err((
                        "UnsupportedProtocol",
                        format!(
                            "protocol {other} is not served (HTTP, HTTPS, TLS, TCP and UDP are)"
                        ),
                    ))
                }
            }
            if lr.accepted.is_ok() && lr.resolved.is_ok() {
                let entry = ports
                    .entry((port, protocol == "UDP"))
                    .or_insert_with(|| (protocol.clone(), Vec::new()));
                if entry.0 != protocol {
                    lr.accepted = Err((
                        "ProtocolConflict",
                        format!("port {port} already serves {}", entry.0),
                    ));
                } else {
                    entry.1.extend(certs);
                }
            }
            if lr.accepted.is_ok() && lr.resolved.is_ok() {
                listeners.push(ServedListener {
                    name: lname,
                    protocol: protocol.clone(),
                    config_name: listener_name(port),
                    port,
                    hostname: l["hostname"].as_str().map(str::to_ascii_lowercase),
                    namespaces: admitted(snapshot, ns, &l["allowedRoutes"]["namespaces"]),
                });
            }
            report.listeners.push(lr);
        }
        served.push(ServedGateway { report, listeners });
    }
    for ((port, _), (protocol, mut certs)) in ports {
        // TLS, TCP and UDP listeners become streams, and only once a route gives them a
        // backend.
        if protocol != "HTTP" && protocol != "HTTPS" {
            continue;
        }
        certs.sort();
        certs.dedup();
        let tls = (protocol == "HTTPS").then(|| json!({ "certificates": certs }));
        let listener = json!({
            "name": listener_name(port),
            "bind": SocketAddr::new(config.listen_address, port).to_string(),
            "tls": tls,
        });
        match serde_json::from_value::<ListenerConfig>(listener) {
            Ok(l) => fragment.listeners.push(l),
            Err(e) => tracing::error!(port, error = %e, "kubernetes listener not built"),
        }
    }
    served
}

/// The namespaces a listener's `allowedRoutes.namespaces` admits routes from (`None`: all):
/// its Gateway's own (`Same`, the default), every one (`All`), or those whose Namespace
/// object's labels the `selector` matches (`Selector`; a selector that cannot be read admits
/// none).
fn admitted(snapshot: &Snapshot, gateway_ns: &str, allowed: &Value) -> Option<BTreeSet<String>> {
    match allowed["from"].as_str().unwrap_or("Same") {
        "All" => None,
        "Selector" => Some(
            snapshot
                .all(Kind::Namespace)
                .filter(|(_, n)| selects(&allowed["selector"], &n["metadata"]["labels"]))
                .map(|((_, name), _)| name.clone())
                .collect(),
        ),
        _ => Some(BTreeSet::from([gateway_ns.to_owned()])),
    }
}

/// Whether a Kubernetes label selector (`matchLabels`, `matchExpressions` with `In`, `NotIn`,
/// `Exists`, `DoesNotExist`, all of them ANDed) matches `labels`. An empty selector matches
/// everything; an unknown operator matches nothing.
fn selects(selector: &Value, labels: &Value) -> bool {
    let label = |k: &str| labels[k].as_str();
    let by_label = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| label(k).is_some() && label(k) == v.as_str());
    let by_expression = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().unwrap_or_default();
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().unwrap_or_default() {
                "In" => label(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => label(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                _ => false,
            }
        });
    by_label && by_expression
}

/// The certificates of an HTTPS listener, written to `cert_dir` and named in `fragment`.
fn certificates(
    snapshot: &Snapshot,
    ns: &str,
    listener: &Value,
    cert_dir: &Path,
    fragment: &mut RawConfig,
) -> Result<Vec<String>, Refusal> {
    let refs = listener["tls"]["certificateRefs"].as_array();
    let refs = refs.filter(|r| !r.is_empty()).ok_or((
        "InvalidCertificateRef",
        "an HTTPS listener needs tls.certificateRefs".to_owned(),
    ))?;
    let mut names = Vec::new();
    for r in refs {
        let group = r["group"].as_str().unwrap_or_default();
        let kind = r["kind"].as_str().unwrap_or("Secret");
        let name = r["name"].as_str().unwrap_or_default();
        let secret_ns = r["namespace"].as_str().unwrap_or(ns);
        if !group.is_empty() || kind != "Secret" {
            return Err(("InvalidCertificateRef", format!("{kind} is not a Secret")));
        }
        if secret_ns != ns
            && !reference_granted(snapshot, "Gateway", ns, "", "Secret", secret_ns, name)
        {
            return Err((
                "RefNotPermitted",
                format!("no ReferenceGrant lets this Gateway use Secret {secret_ns}/{name}"),
            ));
        }
        let secret = snapshot.get(Kind::Secret, secret_ns, name).ok_or((
            "InvalidCertificateRef",
            format!("Secret {secret_ns}/{name} not found (or not kubernetes.io/tls)"),
        ))?;
        let pem = |k: &str| {
            secret["data"][k]
                .as_str()
                .and_then(|d| {
                    use base64::Engine as _;
                    base64::engine::general_purpose::STANDARD.decode(d).ok()
                })
                .unwrap_or_default()
        };
        let (cert, key) = (pem("tls.crt"), pem("tls.key"));
        let chain_ok = CertificateDer::pem_slice_iter(&cert).count() > 0
            && CertificateDer::pem_slice_iter(&cert).all(|c| c.is_ok());
        if !chain_ok || PrivateKeyDer::from_pem_slice(&key).is_err() {
            return Err((
                "InvalidCertificateRef",
                format!("Secret {secret_ns}/{name} has no usable tls.crt and tls.key"),
            ));
        }
        let config_name = format!("kubernetes/{secret_ns}/{name}");
        let (cert_path, key_path) = write_pair(cert_dir, &cert, &key).map_err(|e| {
            (
                "InvalidCertificateRef",
                format!("Secret {secret_ns}/{name}: {e}"),
            )
        })?;
        fragment.certificates.insert(
            config_name.clone(),
            CertificateConfig {
                cert: Some(cert_path),
                key: Some(key_path),
                acme: None,
                ocsp_stapling: true,
            },
        );
        names.push(config_name);
    }
    Ok(names)
}

/// Files named by their content's hash, so an unchanged Secret keeps the same paths (and
/// the config compares equal).
fn write_pair(
    dir: &Path,
    cert: &[u8],
    key: &[u8],
) -> std::io::Result<(std::path::PathBuf, std::path::PathBuf)> {
    let mut h = Sha256::new();
    h.update(cert);
    h.update(key);
    let id: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let cert_path = dir.join(format!("{id}.crt"));
    let key_path = dir.join(format!("{id}.key"));
    if !key_path.exists() {
        std::fs::write(&cert_path, cert)?;
        std::fs::write(&key_path, key)?;
    }
    Ok((cert_path, key_path))
}
