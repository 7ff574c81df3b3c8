//! Translation of hand-written snapshots.

use std::net::{IpAddr, Ipv4Addr};

use gateway_config::KubernetesConfig;
use serde_json::json;

use super::translate;
use crate::watch::{Kind, Snapshot};

fn config() -> KubernetesConfig {
    KubernetesConfig {
        kubeconfig: None,
        controller_name: "gateway.dev/controller".into(),
        listen_address: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10)),
        namespaces: Vec::new(),
    }
}

fn cluster() -> Snapshot {
    let mut s = Snapshot::default();
    s.insert(
        Kind::GatewayClass,
        json!({
        "metadata": {"name": "ours", "generation": 1},
        "spec": {"controllerName": "gateway.dev/controller"}}),
    );
    s.insert(
        Kind::GatewayClass,
        json!({
        "metadata": {"name": "theirs"}, "spec": {"controllerName": "example.com/other"}}),
    );
    s.insert(
        Kind::Gateway,
        json!({
        "metadata": {"namespace": "default", "name": "gw", "generation": 2},
        "spec": {"gatewayClassName": "ours", "listeners": [
            {"name": "http", "port": 8080, "protocol": "HTTP"},
            {"name": "tls", "port": 9000, "protocol": "TLS"}]}}),
    );
    s.insert(
        Kind::Service,
        json!({
        "metadata": {"namespace": "default", "name": "web"},
        "spec": {"ports": [{"name": "http", "port": 80}]}}),
    );
    s.insert(
        Kind::EndpointSlice,
        json!({
        "metadata": {"namespace": "default", "name": "web-1",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 9001}],
        "endpoints": [
            {"addresses": ["198.18.0.10"], "conditions": {"ready": true}},
            {"addresses": ["198.18.0.11"], "conditions": {"ready": false}}]}),
    );
    s
}

/// Each translated route's path or path prefix, in the fragment's order.
fn route_paths(t: &super::Translation) -> Vec<String> {
    t.fragment
        .routes
        .iter()
        .map(|r| {
            r.matcher
                .path
                .clone()
                .or(r.matcher.path_prefix.clone())
                .expect("a path condition")
        })
        .collect()
}

fn route(rules: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": {"namespace": "default", "name": "r", "generation": 3,
                     "creationTimestamp": "2026-12-07T00:00:00Z"},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["a.example.com"], "rules": rules}})
}

#[test]
fn gateway_listeners_and_routes() {
    let mut s = cluster();
    s.insert(
        Kind::HttpRoute,
        route(json!([
        {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}, "method": "GET",
                      "headers": [{"name": "X-Env", "value": "canary"}]}],
         "filters": [{"type": "RequestHeaderModifier",
                      "requestHeaderModifier": {"set": [{"name": "X-From", "value": "gw"}]}}],
         "backendRefs": [{"name": "web", "port": 80, "weight": 3}, {"name": "missing", "port": 80}],
         "timeouts": {"request": "5s"}}])),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    assert_eq!(t.report.classes.len(), 1);
    let gw = &t.report.gateways[0];
    assert!(gw.listeners[0].accepted.is_ok());
    assert_eq!(gw.listeners[0].attached, 1);
    assert_eq!(
        gw.listeners[1].accepted.as_ref().unwrap_err().0,
        "UnsupportedProtocol"
    );
    let f = &t.fragment;
    assert_eq!(f.listeners.len(), 1);
    assert_eq!(f.listeners[0].bind, "198.18.0.10:8080");
    let up = &f.upstreams["kubernetes/default/web/80"];
    assert_eq!(up.targets.len(), 1, "only the ready endpoint");
    let r = &f.routes[0];
    assert_eq!(r.matcher.host.as_deref(), Some("a.example.com"));
    assert_eq!(r.matcher.path_prefix.as_deref(), Some("/api"));
    assert_eq!(r.matcher.headers["x-env"], "canary");
    let proxy = r.proxy.as_ref().unwrap();
    assert_eq!(proxy.backends(), vec![("kubernetes/default/web/80", 3)]);
    // The missing Service's share (weight 1 of 4) is answered 500, as the spec asks.
    let shares: Vec<_> = proxy.split.iter().map(|s| (s.status, s.weight)).collect();
    assert_eq!(shares, vec![(None, 3), (Some(500), 1)]);
    let parent = &t.report.routes[0].parents[0];
    assert!(parent.accepted.is_ok());
    assert_eq!(parent.resolved.as_ref().unwrap_err().0, "BackendNotFound");
}

#[test]
fn unusable_backends_answer_500_and_kinds_are_checked() {
    let mut s = cluster();
    s.insert(
        Kind::HttpRoute,
        route(json!([
        {"backendRefs": [{"group": "example.com", "kind": "Bucket", "name": "b"}]}])),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    assert_eq!(t.fragment.routes[0].respond.as_ref().unwrap().status, 500);
    let parent = &t.report.routes[0].parents[0];
    assert_eq!(parent.resolved.as_ref().unwrap_err().0, "InvalidKind");
}

#[test]
fn cross_namespace_backends_need_a_reference_grant() {
    let mut s = cluster();
    s.insert(
        Kind::Service,
        json!({
        "metadata": {"namespace": "other", "name": "web"},
        "spec": {"ports": [{"port": 80}]}}),
    );
    s.insert(
        Kind::HttpRoute,
        route(json!([
        {"backendRefs": [{"name": "web", "namespace": "other", "port": 80}]}])),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    let parent = &t.report.routes[0].parents[0];
    assert_eq!(parent.resolved.as_ref().unwrap_err().0, "RefNotPermitted");
    s.insert(Kind::ReferenceGrant, json!({
        "metadata": {"namespace": "other", "name": "g"},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "default"}],
                 "to": [{"group": "", "kind": "Service"}]}}));
    let t = translate(&s, &config(), std::path::Path::new("."));
    assert!(t.report.routes[0].parents[0].resolved.is_ok());
}

#[test]
fn listener_hostnames_restrict_routes() {
    let mut s = cluster();
    s.insert(
        Kind::Gateway,
        json!({
        "metadata": {"namespace": "default", "name": "gw"},
        "spec": {"gatewayClassName": "ours", "listeners": [
            {"name": "http", "port": 8080, "protocol": "HTTP", "hostname": "b.example.com"}]}}),
    );
    s.insert(
        Kind::HttpRoute,
        route(json!([{"backendRefs": [{"name": "web", "port": 80}]}])),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    let parent = &t.report.routes[0].parents[0];
    assert_eq!(
        parent.accepted.as_ref().unwrap_err().0,
        "NoMatchingListenerHostname"
    );
    assert!(t.fragment.routes.is_empty());
}

#[test]
fn precedence_puts_exact_and_longer_paths_first() {
    let mut s = cluster();
    s.insert(
        Kind::HttpRoute,
        route(json!([
        {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
         "backendRefs": [{"name": "web", "port": 80}]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/long/er"}},
                     {"path": {"type": "Exact", "value": "/x"}}],
         "backendRefs": [{"name": "web", "port": 80}]}])),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    let order = route_paths(&t);
    assert_eq!(order, ["/x", "/long/er", "/"]);
}

#[test]
fn a_route_the_loader_refuses_costs_only_itself() {
    let mut s = cluster();
    s.insert(
        Kind::HttpRoute,
        route(json!([{"backendRefs": [{"name": "web", "port": 80}]}])),
    );
    // Past the CRD's own validation only in a hand-made snapshot: a path without its `/`.
    s.insert(
        Kind::HttpRoute,
        json!({
        "metadata": {"namespace": "default", "name": "bad"},
        "spec": {"parentRefs": [{"name": "gw"}],
                 "rules": [{"matches": [{"path": {"type": "Exact", "value": "no-slash"}}],
                            "backendRefs": [{"name": "web", "port": 80}]}]}}),
    );
    let mut t = translate(&s, &config(), std::path::Path::new("."));
    assert_eq!(t.fragment.routes.len(), 2);
    super::prune(&mut t);
    assert_eq!(t.fragment.routes.len(), 1);
    assert!(
        t.fragment.routes[0]
            .name
            .as_deref()
            .unwrap()
            .starts_with("kubernetes/default/r/")
    );
    let bad = t.report.routes.iter().find(|r| r.key.1 == "bad").unwrap();
    assert_eq!(
        bad.parents[0].accepted.as_ref().unwrap_err().0,
        "UnsupportedValue"
    );
    let good = t.report.routes.iter().find(|r| r.key.1 == "r").unwrap();
    assert!(good.parents[0].accepted.is_ok());
}

#[test]
fn grpc_methods_become_paths_and_backends_speak_h2c() {
    let mut s = cluster();
    s.insert(
        Kind::GrpcRoute,
        json!({
        "metadata": {"namespace": "default", "name": "g"},
        "spec": {"parentRefs": [{"name": "gw"}],
                 "rules": [{"matches": [{"method": {"service": "pkg.Svc", "method": "Get"}},
                                        {"method": {"service": "pkg.Svc"}}],
                            "backendRefs": [{"name": "web", "port": 80}]}]}}),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    let paths = route_paths(&t);
    assert_eq!(paths, ["/pkg.Svc/Get", "/pkg.Svc/"]);
    let up = &t.fragment.upstreams["kubernetes/default/web/80/h2c"];
    assert_eq!(up.protocol, gateway_config::model::UpstreamProtocol::H2c);
    assert_eq!(t.report.routes[0].kind, Kind::GrpcRoute);
    // Header conditions come along, exact and by expression.
    s.insert(
        Kind::GrpcRoute,
        json!({
        "metadata": {"namespace": "default", "name": "g"},
        "spec": {"parentRefs": [{"name": "gw"}],
                 "rules": [{"matches": [{"method": {"service": "pkg.Svc"},
                                         "headers": [{"name": "X-Tenant", "value": "a"},
                                                     {"type": "RegularExpression",
                                                      "name": "X-Env", "value": "^can"}]}],
                            "backendRefs": [{"name": "web", "port": 80}]}]}}),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    let m = &t.fragment.routes[0].matcher;
    assert_eq!(m.headers["x-tenant"], "a");
    assert_eq!(m.header_regex["x-env"], "^can");
}

#[test]
fn query_and_header_matches_become_conditions_exact_or_by_regex() {
    let mut s = cluster();
    s.insert(
        Kind::HttpRoute,
        route(json!([
        {"matches": [{"queryParams": [{"name": "v", "value": "2"},
                                      {"type": "RegularExpression", "name": "u", "value": "^[0-9]+$"}],
                      "headers": [{"type": "RegularExpression", "name": "X-Env", "value": "^can"}]}],
         "backendRefs": [{"name": "web", "port": 80}]}])),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    let m = &t.fragment.routes[0].matcher;
    assert_eq!(m.query["v"], "2");
    assert_eq!(m.query_regex["u"], "^[0-9]+$");
    assert_eq!(m.header_regex["x-env"], "^can");
    assert!(t.report.routes[0].parents[0].accepted.is_ok());
    // An expression that does not compile costs the route, with the reason.
    s.insert(
        Kind::HttpRoute,
        route(json!([
        {"matches": [{"headers": [{"type": "RegularExpression", "name": "x", "value": "("}]}],
         "backendRefs": [{"name": "web", "port": 80}]}])),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    let parent = &t.report.routes[0].parents[0];
    assert_eq!(parent.accepted.as_ref().unwrap_err().0, "UnsupportedValue");
}

#[test]
fn routes_from_other_namespaces_need_the_listener_to_allow_them() {
    let mut s = cluster();
    let mut r =
        route(json!([{"backendRefs": [{"name": "web", "port": 80, "namespace": "default"}]}]));
    r["metadata"]["namespace"] = json!("team");
    r["spec"]["parentRefs"] = json!([{"name": "gw", "namespace": "default"}]);
    s.insert(Kind::HttpRoute, r.clone());
    let t = translate(&s, &config(), std::path::Path::new("."));
    let parent = &t.report.routes[0].parents[0];
    assert_eq!(
        parent.accepted.as_ref().unwrap_err().0,
        "NotAllowedByListeners"
    );
    // Only the Gateway's own listener changes: `from: All`.
    s.insert(
        Kind::Gateway,
        json!({
        "metadata": {"namespace": "default", "name": "gw"},
        "spec": {"gatewayClassName": "ours", "listeners": [
            {"name": "http", "port": 8080, "protocol": "HTTP",
             "allowedRoutes": {"namespaces": {"from": "All"}}}]}}),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    let parent = &t.report.routes[0].parents[0];
    assert!(parent.accepted.is_ok());
    assert_eq!(parent.resolved.as_ref().unwrap_err().0, "RefNotPermitted");
}

#[test]
fn a_listener_selector_admits_routes_from_namespaces_with_matching_labels() {
    let namespace = |name: &str, labels: serde_json::Value| json!({"metadata": {"name": name, "labels": labels}});
    let admitted = |selector: serde_json::Value, labels: serde_json::Value| {
        let mut s = cluster();
        s.insert(Kind::Namespace, namespace("team", labels));
        s.insert(
            Kind::Gateway,
            json!({
            "metadata": {"namespace": "default", "name": "gw"},
            "spec": {"gatewayClassName": "ours", "listeners": [
                {"name": "http", "port": 8080, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": "Selector", "selector": selector}}}]}}),
        );
        let mut r = route(json!([{"backendRefs": [{"name": "web", "port": 80}]}]));
        r["metadata"]["namespace"] = json!("team");
        r["spec"]["parentRefs"] = json!([{"name": "gw", "namespace": "default"}]);
        s.insert(Kind::HttpRoute, r);
        let t = translate(&s, &config(), std::path::Path::new("."));
        match &t.report.routes[0].parents[0].accepted {
            Ok(()) => true,
            Err((reason, _)) => {
                assert_eq!(*reason, "NotAllowedByListeners");
                false
            }
        }
    };
    let labels = json!({"env": "prod", "team": "payments"});
    assert!(admitted(
        json!({"matchLabels": {"env": "prod"}}),
        labels.clone()
    ));
    assert!(!admitted(
        json!({"matchLabels": {"env": "dev"}}),
        labels.clone()
    ));
    assert!(!admitted(
        json!({"matchLabels": {"tier": "prod"}}),
        labels.clone()
    ));
    let expr = |op: &str, values: serde_json::Value| json!({"matchExpressions": [{"key": "team", "operator": op, "values": values}]});
    assert!(admitted(
        expr("In", json!(["payments", "search"])),
        labels.clone()
    ));
    assert!(!admitted(
        expr("NotIn", json!(["payments"])),
        labels.clone()
    ));
    assert!(admitted(expr("Exists", json!([])), labels.clone()));
    assert!(!admitted(expr("DoesNotExist", json!([])), labels.clone()));
    assert!(
        !admitted(expr("Near", json!([])), labels.clone()),
        "unknown operator"
    );
    assert!(
        admitted(json!({}), json!(null)),
        "an empty selector matches every namespace"
    );
    // Both parts must hold.
    let both = json!({"matchLabels": {"env": "prod"},
                      "matchExpressions": [{"key": "team", "operator": "In", "values": ["search"]}]});
    assert!(!admitted(both, labels));
}

#[test]
fn udp_routes_become_weighted_streams() {
    let mut s = cluster();
    s.insert(
        Kind::Gateway,
        json!({
        "metadata": {"namespace": "default", "name": "gw"},
        "spec": {"gatewayClassName": "ours", "listeners": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "http", "port": 53, "protocol": "HTTP"}]}}),
    );
    s.insert(
        Kind::UdpRoute,
        json!({
        "metadata": {"namespace": "default", "name": "dns"},
        "spec": {"parentRefs": [{"name": "gw"}],
                 "rules": [{"backendRefs": [{"name": "web", "port": 80, "weight": 3}]}]}}),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    // UDP and TCP ports are apart: both listeners are accepted.
    assert!(
        t.report.gateways[0]
            .listeners
            .iter()
            .all(|l| l.accepted.is_ok())
    );
    let stream = &t.fragment.streams[0];
    assert_eq!(stream.bind, "198.18.0.10:53");
    assert_eq!(stream.protocol, gateway_config::model::StreamProtocol::Udp);
    let up = &t.fragment.upstreams[stream.upstream.as_deref().unwrap()];
    assert!(matches!(
        &up.targets[0],
        gateway_config::model::TargetConfig::Weighted { weight: 3, .. }
    ));
    assert_eq!(t.report.routes[0].kind, Kind::UdpRoute);
    assert_eq!(t.report.gateways[0].listeners[0].attached, 1);
}

#[test]
fn tls_routes_become_streams_routed_by_server_name() {
    let mut s = cluster();
    s.insert(
        Kind::Gateway,
        json!({
        "metadata": {"namespace": "default", "name": "gw"},
        "spec": {"gatewayClassName": "ours", "listeners": [
            {"name": "pass", "port": 8443, "protocol": "TLS", "tls": {"mode": "Passthrough"}},
            {"name": "term", "port": 9443, "protocol": "TLS", "tls": {"mode": "Terminate"}}]}}),
    );
    let tls_route = |name: &str, created: &str, hostnames: serde_json::Value| {
        json!({
        "metadata": {"namespace": "default", "name": name, "creationTimestamp": created},
        "spec": {"parentRefs": [{"name": "gw", "sectionName": "pass"}], "hostnames": hostnames,
                 "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}})
    };
    s.insert(
        Kind::TlsRoute,
        tls_route(
            "a",
            "2026-12-07T00:00:00Z",
            json!(["a.example.com", "*.b.example.com"]),
        ),
    );
    s.insert(
        Kind::TlsRoute,
        tls_route("any", "2026-12-07T00:00:01Z", json!([])),
    );
    // Claims a name the older route `a` serves on the port (and sorts before `any` by name).
    s.insert(
        Kind::TlsRoute,
        tls_route("b-late", "2026-12-07T00:00:02Z", json!(["a.example.com"])),
    );
    let t = translate(&s, &config(), std::path::Path::new("."));
    let listeners = &t.report.gateways[0].listeners;
    assert!(listeners[0].accepted.is_ok());
    assert_eq!(listeners[0].attached, 2);
    assert_eq!(
        listeners[1].accepted.as_ref().unwrap_err().0,
        "UnsupportedProtocol",
        "TLS is not terminated"
    );
    assert_eq!(t.fragment.streams.len(), 1);
    let stream = &t.fragment.streams[0];
    assert_eq!(stream.bind, "198.18.0.10:8443");
    assert_eq!(stream.protocol, gateway_config::model::StreamProtocol::Tcp);
    assert_eq!(
        stream.sni_routes["a.example.com"],
        "kubernetes/tls/8443/a.example.com"
    );
    assert_eq!(
        stream.sni_routes["*.b.example.com"],
        "kubernetes/tls/8443/*.b.example.com"
    );
    assert_eq!(stream.upstream.as_deref(), Some("kubernetes/tls/8443"));
    for up in stream.sni_routes.values().chain(stream.upstream.iter()) {
        assert_eq!(
            t.fragment.upstreams[up].targets.len(),
            1,
            "{up}: the ready endpoint"
        );
    }
    let verdict = |name: &str| {
        let r = t.report.routes.iter().find(|r| r.key.1 == name).unwrap();
        assert_eq!(r.kind, Kind::TlsRoute);
        r.parents[0].accepted.clone()
    };
    assert!(verdict("a").is_ok() && verdict("any").is_ok());
    assert_eq!(verdict("b-late").unwrap_err().0, "UnsupportedValue");
}
