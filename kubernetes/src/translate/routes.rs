//! HTTPRoutes attached to our Gateways' listeners become config routes: one per listener,
//! hostname and match, ordered by the Gateway API's precedence (the config matches first to
//! last). Backends are Services' ready endpoints; a rule whose backends all fail answers 500,
//! and the share of a rule's traffic that its unresolved backendRefs would have had answers 500
//! too.

use std::cmp::Reverse;

use gateway_config::model::{RawConfig, RouteConfig, UpstreamConfig};
use serde_json::{Map, Value, json};

use super::gateways::{ServedGateway, ServedListener};
use super::{Refusal, Verdict, generation, reference_granted};
use crate::watch::{Key, Kind, Snapshot};

/// One HTTPRoute's or GRPCRoute's verdicts, per parent of ours.
#[derive(Debug)]
pub struct RouteReport {
    /// `HttpRoute` or `GrpcRoute`.
    pub kind: Kind,
    /// Namespace and name.
    pub key: Key,
    /// `metadata.generation`.
    pub generation: i64,
    /// Its parentRefs that name our Gateways.
    pub parents: Vec<ParentReport>,
}

/// One parent's conditions.
#[derive(Debug)]
pub struct ParentReport {
    /// The parentRef as written.
    pub parent_ref: Value,
    /// Accepted.
    pub accepted: Verdict,
    /// ResolvedRefs.
    pub resolved: Verdict,
}

/// A route's rules, compiled once whatever the parent.
struct Rule {
    matches: Vec<Value>,
    filters: Vec<Value>,
    terminal: (&'static str, Value),
}

/// A route's rules (or why it cannot be served) and its ResolvedRefs verdict.
type Compiled = (Result<Vec<Rule>, Refusal>, Verdict);

/// Precedence, most specific first.
type SortKey = (
    u8,
    Reverse<usize>,
    u8,
    Reverse<usize>,
    u8,
    Reverse<usize>,
    Reverse<usize>,
    String,
    Key,
    usize,
    usize,
);

pub(super) fn translate(
    snapshot: &Snapshot,
    gateways: &mut [ServedGateway],
    fragment: &mut RawConfig,
) -> Vec<RouteReport> {
    let mut reports = Vec::new();
    let mut routes: Vec<(SortKey, Value)> = Vec::new();
    let all = snapshot
        .all(Kind::HttpRoute)
        .map(|r| (Kind::HttpRoute, r))
        .chain(snapshot.all(Kind::GrpcRoute).map(|r| (Kind::GrpcRoute, r)));
    for (route_kind, ((ns, name), route)) in all {
        let mut report = RouteReport {
            kind: route_kind,
            key: (ns.clone(), name.clone()),
            generation: generation(route),
            parents: Vec::new(),
        };
        let mut compiled: Option<Compiled> = None;
        let hostnames = hostnames(route);
        for parent in route["spec"]["parentRefs"].as_array().into_iter().flatten() {
            let group = parent["group"]
                .as_str()
                .unwrap_or("gateway.networking.k8s.io");
            let kind = parent["kind"].as_str().unwrap_or("Gateway");
            let pns = parent["namespace"].as_str().unwrap_or(ns);
            let pname = parent["name"].as_str().unwrap_or_default();
            if group != "gateway.networking.k8s.io" || kind != "Gateway" {
                continue;
            }
            let Some(gw) = gateways
                .iter_mut()
                .find(|g| g.report.key.0 == pns && g.report.key.1 == pname)
            else {
                continue;
            };
            let (rules, resolved) =
                compiled.get_or_insert_with(|| compile(snapshot, route_kind, ns, route, fragment));
            let (rules, resolved) = (rules.as_ref().map_err(Clone::clone), resolved.clone());
            let attached = attach(gw, parent, ns, &hostnames, &["HTTP", "HTTPS"]);
            let accepted = match (&attached, &rules) {
                (Err(e), _) => Err(e.clone()),
                (Ok(_), Err(e)) => Err(e.clone()),
                (Ok(_), Ok(_)) => Ok(()),
            };
            if let (Ok(listeners), Ok(rules)) = (&attached, rules) {
                let created = route["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or_default();
                for (listener, hosts) in listeners {
                    if let Some(l) = gw.report.listeners.iter_mut().find(|l| &l.name == listener) {
                        l.attached += 1;
                    }
                    let config_name = gw
                        .listeners
                        .iter()
                        .find(|l| &l.name == listener)
                        .map(|l| l.config_name.clone())
                        .unwrap_or_default();
                    emit(
                        &mut routes,
                        (route_kind, ns, name),
                        created,
                        &config_name,
                        hosts,
                        rules,
                    );
                }
            }
            report.parents.push(ParentReport {
                parent_ref: parent.clone(),
                accepted,
                resolved,
            });
        }
        if !report.parents.is_empty() {
            reports.push(report);
        }
    }
    routes.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, route) in routes {
        match serde_json::from_value::<RouteConfig>(route) {
            Ok(r) => fragment.routes.push(r),
            Err(e) => tracing::error!(error = %e, "kubernetes route not built"),
        }
    }
    reports
}

/// A listener's spec name and the hostnames matched on it (`None`: any host).
pub(super) type Attachment = (String, Vec<Option<String>>);

/// The listeners (by spec name) a parentRef attaches to, with the hostnames matched on each
/// (`None`: any host).
#[allow(clippy::type_complexity, reason = "a one-off pairing read right below")]
pub(super) fn attach(
    gw: &ServedGateway,
    parent: &Value,
    route_ns: &str,
    hostnames: &[String],
    protocols: &[&str],
) -> Result<Vec<Attachment>, Refusal> {
    let section = parent["sectionName"].as_str();
    let port = parent["port"].as_u64();
    let candidates: Vec<&ServedListener> = gw
        .listeners
        .iter()
        .filter(|l| protocols.contains(&l.protocol.as_str()))
        .filter(|l| section.is_none_or(|s| s == l.name))
        .filter(|l| port.is_none_or(|p| p == u64::from(l.port)))
        .collect();
    if candidates.is_empty() {
        return Err(("NoMatchingParent", "no accepted listener matches".into()));
    }
    let allowed: Vec<&&ServedListener> = candidates.iter().filter(|l| l.admits(route_ns)).collect();
    if allowed.is_empty() {
        return Err((
            "NotAllowedByListeners",
            "the listeners do not allow routes from this namespace".into(),
        ));
    }
    let mut out = Vec::new();
    for l in allowed {
        let hosts = intersect(l.hostname.as_deref(), hostnames);
        if !hosts.is_empty() {
            out.push((l.name.clone(), hosts));
        }
    }
    if out.is_empty() {
        return Err((
            "NoMatchingListenerHostname",
            "no route hostname matches a listener hostname".into(),
        ));
    }
    Ok(out)
}

/// A route's `spec.hostnames`, lowercase.
pub(super) fn hostnames(route: &Value) -> Vec<String> {
    route["spec"]["hostnames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h.as_str().map(str::to_ascii_lowercase))
        .collect()
}

/// The hostnames a route serves on a listener.
fn intersect(listener: Option<&str>, route: &[String]) -> Vec<Option<String>> {
    match (listener, route.is_empty()) {
        (None, true) => vec![None],
        (None, false) => route.iter().cloned().map(Some).collect(),
        (Some(l), true) => vec![Some(l.to_owned())],
        (Some(l), false) => route
            .iter()
            .filter_map(|r| {
                if r == l || wildcard_covers(r, l) {
                    Some(Some(l.to_owned()))
                } else if wildcard_covers(l, r) {
                    Some(Some(r.clone()))
                } else {
                    None
                }
            })
            .collect(),
    }
}

/// `*.example.com` covers `a.example.com` and `a.b.example.com`.
fn wildcard_covers(pattern: &str, host: &str) -> bool {
    pattern
        .strip_prefix('*')
        .is_some_and(|suffix| host.len() > suffix.len() && host.ends_with(suffix))
}

/// One config route per host and match, each with its precedence.
fn emit(
    out: &mut Vec<(SortKey, Value)>,
    (kind, ns, name): (Kind, &String, &String),
    created: &str,
    listener: &str,
    hosts: &[Option<String>],
    rules: &[Rule],
) {
    for host in hosts {
        for (i, rule) in rules.iter().enumerate() {
            for (j, m) in rule.matches.iter().enumerate() {
                let mut matcher = m.clone();
                if let Some(h) = host {
                    matcher["host"] = json!(h);
                }
                let (host_rank, host_len) = match host {
                    None => (2, 0),
                    Some(h) if h.starts_with('*') => (1, h.len()),
                    Some(h) => (0, h.len()),
                };
                let (path_rank, path_len) = if let Some(p) = m["path"].as_str() {
                    (0, p.len())
                } else if let Some(p) = m["path_prefix"].as_str() {
                    (1, p.len())
                } else {
                    (2, 0)
                };
                let key: SortKey = (
                    host_rank,
                    Reverse(host_len),
                    path_rank,
                    Reverse(path_len),
                    u8::from(m["methods"].is_null()),
                    Reverse(m["headers"].as_object().map_or(0, Map::len)),
                    Reverse(m["query"].as_object().map_or(0, Map::len)),
                    created.to_owned(),
                    (ns.clone(), name.clone()),
                    i,
                    j,
                );
                let mut route = json!({
                    // Unique per listener and host: a route attached twice is two config routes.
                    "name": format!(
                        "kubernetes/{ns}/{name}/{i}/{j}/{listener}/{}{}",
                        host.as_deref().unwrap_or("*"),
                        if kind == Kind::GrpcRoute { "/grpc" } else { "" }
                    ),
                    "listeners": [listener],
                    "match": matcher,
                    "filters": rule.filters,
                });
                route[rule.terminal.0] = rule.terminal.1.clone();
                out.push((key, route));
            }
        }
    }
}

/// A route's rules, or why it cannot be served; and its ResolvedRefs verdict.
fn compile(
    snapshot: &Snapshot,
    kind: Kind,
    ns: &str,
    route: &Value,
    fragment: &mut RawConfig,
) -> Compiled {
    let mut resolved: Verdict = Ok(());
    let mut rules = Vec::new();
    for rule in route["spec"]["rules"].as_array().into_iter().flatten() {
        match compile_rule(snapshot, kind, ns, rule, fragment, &mut resolved) {
            Ok(r) => rules.push(r),
            Err(e) => return (Err(e), resolved),
        }
    }
    (Ok(rules), resolved)
}

fn unsupported(msg: impl Into<String>) -> Refusal {
    ("UnsupportedValue", msg.into())
}

fn compile_rule(
    snapshot: &Snapshot,
    kind: Kind,
    ns: &str,
    rule: &Value,
    fragment: &mut RawConfig,
    resolved: &mut Verdict,
) -> Result<Rule, Refusal> {
    let default_match = [json!({"path": {"type": "PathPrefix", "value": "/"}})];
    let written = rule["matches"].as_array().filter(|m| !m.is_empty());
    let mut matches = Vec::new();
    let mut prefix_only = true;
    let grpc = kind == Kind::GrpcRoute;
    for m in written.map_or(&default_match[..], Vec::as_slice) {
        let (m, is_prefix) = if grpc {
            (compile_grpc_match(m)?, false)
        } else {
            compile_match(m)?
        };
        prefix_only &= is_prefix;
        matches.push(m);
    }
    let mut filters = Vec::new();
    let mut headers = Map::new();
    let mut redirect = None;
    let mut mirror = None;
    for f in rule["filters"].as_array().into_iter().flatten() {
        match f["type"].as_str().unwrap_or_default() {
            "RequestHeaderModifier" => {
                header_edits(&f["requestHeaderModifier"], "request", &mut headers)
            }
            "ResponseHeaderModifier" => {
                header_edits(&f["responseHeaderModifier"], "response", &mut headers)
            }
            "RequestRedirect" => redirect = Some(redirect_of(&f["requestRedirect"], prefix_only)?),
            "URLRewrite" => {
                filters.push(json!({ "rewrite": rewrite_of(&f["urlRewrite"], prefix_only)? }))
            }
            "RequestMirror" => {
                let m = &f["requestMirror"];
                match backend(snapshot, kind, ns, &m["backendRef"], fragment) {
                    Ok(Some(upstream)) => {
                        let percent = if let Some(p) = m["percent"].as_f64() {
                            p
                        } else if let Some(n) = m["fraction"]["numerator"].as_f64() {
                            100.0 * n / m["fraction"]["denominator"].as_f64().unwrap_or(100.0)
                        } else {
                            100.0
                        };
                        mirror = Some(json!({ "upstream": upstream, "percent": percent }));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        if resolved.is_ok() {
                            *resolved = Err(e);
                        }
                    }
                }
            }
            other => return Err(unsupported(format!("filter {other} is not supported"))),
        }
    }
    if !headers.is_empty() {
        filters.insert(0, json!({ "headers": headers }));
    }
    if let Some(r) = redirect {
        return Ok(Rule {
            matches,
            filters,
            terminal: ("redirect", r),
        });
    }
    let mut split = Vec::new();
    let mut unresolved = 0;
    for b in rule["backendRefs"].as_array().into_iter().flatten() {
        let weight = b["weight"].as_u64().unwrap_or(1);
        if b["filters"].as_array().is_some_and(|f| !f.is_empty()) {
            return Err(unsupported("filters on a backendRef are not supported"));
        }
        match backend(snapshot, kind, ns, b, fragment) {
            Ok(Some(upstream)) => split.push(json!({ "upstream": upstream, "weight": weight })),
            Ok(None) => {}
            Err(e) => {
                // The spec's answer for the share of requests an unusable backendRef would
                // have had: 500, while the usable ones take theirs.
                unresolved += weight;
                if resolved.is_ok() {
                    *resolved = Err(e);
                }
            }
        }
    }
    let weights: u64 = split.iter().filter_map(|s| s["weight"].as_u64()).sum();
    if weights > 0 && unresolved > 0 {
        split.push(json!({ "status": 500, "weight": unresolved }));
    }
    let terminal = if weights == 0 {
        // The Gateway API's answer for a rule with no usable backend.
        (
            "respond",
            json!({ "status": 500, "body": "no usable backend\n" }),
        )
    } else {
        let mut proxy = json!({ "split": split });
        if let Some(m) = mirror {
            proxy["mirror"] = m;
        }
        if let Some(t) = timeout(&rule["timeouts"]) {
            proxy["timeout"] = json!(t);
        }
        ("proxy", proxy)
    };
    Ok(Rule {
        matches,
        filters,
        terminal,
    })
}

/// A GRPCRoute match: the method is the path `/SERVICE/METHOD`.
fn compile_grpc_match(m: &Value) -> Result<Value, Refusal> {
    let method = &m["method"];
    let service = method["service"].as_str();
    let name = method["method"].as_str();
    let mut out = match method["type"].as_str().unwrap_or("Exact") {
        "Exact" => match (service, name) {
            (Some(s), Some(n)) => json!({ "path": format!("/{s}/{n}") }),
            (Some(s), None) => json!({ "path_prefix": format!("/{s}/") }),
            (None, Some(n)) => json!({ "path_regex": format!("^/[^/]+/{}$", regex::escape(n)) }),
            (None, None) => json!({ "path_prefix": "/" }),
        },
        "RegularExpression" => {
            let re = format!(
                "^/{}/{}$",
                service.unwrap_or("[^/]+"),
                name.unwrap_or("[^/]+")
            );
            json!({ "path_regex": regex_of("method", &re)? })
        }
        other => return Err(unsupported(format!("method match type {other}"))),
    };
    let headers = compile_match(&json!({ "headers": m["headers"] }))?.0;
    for key in ["headers", "header_regex"] {
        if let Some(h) = headers.get(key) {
            out[key] = h.clone();
        }
    }
    Ok(out)
}

/// A match as config `match:`; also whether its path is a prefix (for prefix rewrites).
fn compile_match(m: &Value) -> Result<(Value, bool), Refusal> {
    let mut out = Map::new();
    let mut query = Map::new();
    let mut query_regex = Map::new();
    for q in m["queryParams"].as_array().into_iter().flatten() {
        let name = q["name"].as_str().unwrap_or_default();
        let value = q["value"].as_str().unwrap_or_default();
        match q["type"].as_str().unwrap_or("Exact") {
            "Exact" => query.insert(name.to_owned(), json!(value)),
            "RegularExpression" => query_regex.insert(name.to_owned(), regex_of("query", value)?),
            other => return Err(unsupported(format!("query parameter match type {other}"))),
        };
    }
    if !query.is_empty() {
        out.insert("query".into(), Value::Object(query));
    }
    if !query_regex.is_empty() {
        out.insert("query_regex".into(), Value::Object(query_regex));
    }
    let path = &m["path"];
    let value = path["value"].as_str().unwrap_or("/").to_owned();
    let mut is_prefix = false;
    match path["type"].as_str().unwrap_or("PathPrefix") {
        "Exact" => {
            out.insert("path".into(), json!(value));
        }
        "PathPrefix" => {
            is_prefix = true;
            out.insert("path_prefix".into(), json!(value));
        }
        "RegularExpression" => {
            out.insert("path_regex".into(), regex_of("path", &value)?);
        }
        other => return Err(unsupported(format!("path match type {other}"))),
    }
    let mut headers = Map::new();
    let mut header_regex = Map::new();
    for h in m["headers"].as_array().into_iter().flatten() {
        let name = h["name"].as_str().unwrap_or_default().to_ascii_lowercase();
        let value = h["value"].as_str().unwrap_or_default();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(unsupported(format!("header match `{name}`")));
        }
        match h["type"].as_str().unwrap_or("Exact") {
            "Exact" if http::HeaderValue::from_str(value).is_ok() => {
                headers.insert(name, json!(value));
            }
            "Exact" => return Err(unsupported(format!("header match `{name}`"))),
            "RegularExpression" => {
                header_regex.insert(name, regex_of("header", value)?);
            }
            other => return Err(unsupported(format!("header match type {other}"))),
        }
    }
    if !headers.is_empty() {
        out.insert("headers".into(), Value::Object(headers));
    }
    if !header_regex.is_empty() {
        out.insert("header_regex".into(), Value::Object(header_regex));
    }
    if let Some(method) = m["method"].as_str() {
        out.insert("methods".into(), json!([method]));
    }
    Ok((Value::Object(out), is_prefix))
}

/// A `RegularExpression` match's value (path, header or query parameter), checked to
/// compile. It is kept as a search: the Gateway API leaves anchoring to the implementation,
/// and `^...$` asks for a whole value.
fn regex_of(what: &str, re: &str) -> Result<Value, Refusal> {
    regex::Regex::new(re).map_err(|e| unsupported(format!("{what} regex `{re}`: {e}")))?;
    Ok(json!(re))
}

/// RequestHeaderModifier / ResponseHeaderModifier as `headers:` filter keys.
fn header_edits(modifier: &Value, side: &str, out: &mut Map<String, Value>) {
    for (op, key) in [("set", "set"), ("add", "add")] {
        let entries: Map<String, Value> = modifier[op]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| Some((h["name"].as_str()?.to_ascii_lowercase(), h["value"].clone())))
            .collect();
        if !entries.is_empty() {
            out.insert(format!("{side}_{key}"), Value::Object(entries));
        }
    }
    if let Some(remove) = modifier["remove"].as_array().filter(|r| !r.is_empty()) {
        out.insert(format!("{side}_remove"), Value::Array(remove.clone()));
    }
}

fn redirect_of(r: &Value, prefix_only: bool) -> Result<Value, Refusal> {
    let mut out = Map::new();
    if let Some(s) = r["scheme"].as_str() {
        out.insert("scheme".into(), json!(s));
    }
    if let Some(h) = r["hostname"].as_str() {
        out.insert("host".into(), json!(h));
    }
    if let Some(p) = r["port"].as_u64() {
        out.insert("port".into(), json!(p));
    }
    out.insert(
        "status".into(),
        json!(r["statusCode"].as_u64().unwrap_or(302)),
    );
    path_modifier(&r["path"], prefix_only, &mut out)?;
    Ok(Value::Object(out))
}

fn rewrite_of(r: &Value, prefix_only: bool) -> Result<Value, Refusal> {
    let mut out = Map::new();
    if let Some(h) = r["hostname"].as_str() {
        out.insert("host".into(), json!(h));
    }
    path_modifier(&r["path"], prefix_only, &mut out)?;
    Ok(Value::Object(out))
}

fn path_modifier(
    p: &Value,
    prefix_only: bool,
    out: &mut Map<String, Value>,
) -> Result<(), Refusal> {
    match p["type"].as_str() {
        None => {}
        Some("ReplaceFullPath") => {
            out.insert("path".into(), p["replaceFullPath"].clone());
        }
        Some("ReplacePrefixMatch") if prefix_only => {
            out.insert("replace_prefix".into(), p["replacePrefixMatch"].clone());
        }
        Some("ReplacePrefixMatch") => {
            return Err(unsupported("ReplacePrefixMatch needs PathPrefix matches"));
        }
        Some(other) => return Err(unsupported(format!("path modifier {other}"))),
    }
    Ok(())
}

/// `timeouts.request` (or `backendRequest`) as a config duration; `0s` means none.
fn timeout(t: &Value) -> Option<String> {
    let t = t["request"].as_str().or(t["backendRequest"].as_str())?;
    let d: gateway_config::Duration = t.parse().ok()?;
    (!d.get().is_zero()).then(|| t.to_owned())
}

/// A backendRef's upstream name (added to `fragment`), `None` when its Service has no ready
/// endpoint, or the ResolvedRefs reason it cannot be used.
fn backend(
    snapshot: &Snapshot,
    route_kind: Kind,
    route_ns: &str,
    b: &Value,
    fragment: &mut RawConfig,
) -> Result<Option<String>, Refusal> {
    let ns = b["namespace"].as_str().unwrap_or(route_ns);
    let name = b["name"].as_str().unwrap_or_default();
    let port = b["port"].as_u64().unwrap_or(0);
    // gRPC backends are spoken to in cleartext HTTP/2, HTTP ones in HTTP/1.1.
    let (upstream, protocol) = if route_kind == Kind::GrpcRoute {
        (format!("kubernetes/{ns}/{name}/{port}/h2c"), "h2c")
    } else {
        (format!("kubernetes/{ns}/{name}/{port}"), "http1")
    };
    let targets = endpoints(snapshot, route_kind, route_ns, b)?;
    if fragment.upstreams.contains_key(&upstream) {
        return Ok(Some(upstream));
    }
    if targets.is_empty() {
        return Ok(None);
    }
    match serde_json::from_value::<UpstreamConfig>(
        json!({ "targets": targets, "protocol": protocol }),
    ) {
        Ok(u) => {
            fragment.upstreams.insert(upstream.clone(), u);
            Ok(Some(upstream))
        }
        Err(e) => Err(("BackendNotFound", e.to_string())),
    }
}

/// The ready endpoints (`ip:port`) of a backendRef, or the ResolvedRefs reason it cannot be
/// used.
pub(super) fn endpoints(
    snapshot: &Snapshot,
    route_kind: Kind,
    route_ns: &str,
    b: &Value,
) -> Result<Vec<String>, Refusal> {
    let group = b["group"].as_str().unwrap_or_default();
    let kind = b["kind"].as_str().unwrap_or("Service");
    let name = b["name"].as_str().unwrap_or_default();
    let ns = b["namespace"].as_str().unwrap_or(route_ns);
    if !group.is_empty() || kind != "Service" {
        return Err((
            "InvalidKind",
            format!("backend kind {group}/{kind} is not supported"),
        ));
    }
    let from = route_kind.name();
    if ns != route_ns && !reference_granted(snapshot, from, route_ns, "", "Service", ns, name) {
        return Err((
            "RefNotPermitted",
            format!("no ReferenceGrant lets this route use Service {ns}/{name}"),
        ));
    }
    let service = snapshot
        .get(Kind::Service, ns, name)
        .ok_or(("BackendNotFound", format!("Service {ns}/{name} not found")))?;
    let port = b["port"].as_u64().unwrap_or(0);
    let service_port = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_u64() == Some(port))
        .ok_or((
            "BackendNotFound",
            format!("Service {ns}/{name} has no port {port}"),
        ))?;
    let port_name = service_port["name"].as_str().unwrap_or_default();
    let mut targets = Vec::new();
    for (_, slice) in snapshot.all(Kind::EndpointSlice).filter(|((sns, _), s)| {
        sns == ns && s["metadata"]["labels"]["kubernetes.io/service-name"].as_str() == Some(name)
    }) {
        let Some(target_port) = slice["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|p| {
                (p["name"].as_str().unwrap_or_default() == port_name)
                    .then(|| p["port"].as_u64())
                    .flatten()
            })
        else {
            continue;
        };
        for e in slice["endpoints"].as_array().into_iter().flatten() {
            // An unset `ready` means ready (EndpointSlice API).
            if e["conditions"]["ready"].as_bool() == Some(false) {
                continue;
            }
            for a in e["addresses"].as_array().into_iter().flatten() {
                let Some(ip) = a.as_str().and_then(|a| a.parse::<std::net::IpAddr>().ok()) else {
                    continue;
                };
                let port = u16::try_from(target_port).unwrap_or(0);
                targets.push(std::net::SocketAddr::new(ip, port).to_string());
            }
        }
    }
    targets.sort();
    targets.dedup();
    Ok(targets)
}
