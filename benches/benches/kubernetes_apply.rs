//! What one HTTPRoute change costs among 1,000: the controller's translation of the whole
//! cluster (and its check that every route validates), then the gateway's load of the file
//! with the fragment merged and the build of the new generation. The bound for the
//! whole is one second.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use gateway_config::KubernetesConfig;
use gateway_kubernetes::translate;
use gateway_kubernetes::watch::{Kind, Snapshot};
use serde_json::json;

const ROUTES: usize = 1000;

fn cluster(weight: u64) -> Snapshot {
    let mut s = Snapshot::default();
    s.insert(
        Kind::GatewayClass,
        json!({
        "metadata": {"name": "ours"}, "spec": {"controllerName": "gateway.dev/controller"}}),
    );
    s.insert(
        Kind::Gateway,
        json!({
        "metadata": {"namespace": "default", "name": "gw"},
        "spec": {"gatewayClassName": "ours",
                 "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}]}}),
    );
    for i in 0..ROUTES {
        let svc = format!("svc{i}");
        s.insert(
            Kind::Service,
            json!({
            "metadata": {"namespace": "default", "name": svc},
            "spec": {"ports": [{"name": "http", "port": 80}]}}),
        );
        s.insert(
            Kind::EndpointSlice,
            json!({
            "metadata": {"namespace": "default", "name": svc,
                         "labels": {"kubernetes.io/service-name": svc}},
            "ports": [{"name": "http", "port": 9000}],
            "endpoints": [{"addresses": [format!("10.0.{}.{}", i / 250, i % 250 + 1)]},
                          {"addresses": [format!("10.1.{}.{}", i / 250, i % 250 + 1)]}]}),
        );
        // The first route is the one that changes.
        let w = if i == 0 { weight } else { 1 };
        s.insert(Kind::HttpRoute, json!({
            "metadata": {"namespace": "default", "name": format!("r{i}"),
                         "creationTimestamp": "2026-12-07T00:00:00Z"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [format!("app{i}.example.com")],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                                "filters": [{"type": "RequestHeaderModifier",
                                             "requestHeaderModifier": {"set": [{"name": "x-route", "value": svc}]}}],
                                "backendRefs": [{"name": svc, "port": 80, "weight": w}]}]}}));
    }
    s
}

fn bench(c: &mut Criterion) {
    let config = KubernetesConfig {
        kubeconfig: None,
        controller_name: "gateway.dev/controller".into(),
        listen_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        namespaces: Vec::new(),
    };
    let file =
        "listeners: [{ name: file, bind: '127.0.0.1:0' }]\nroutes: [{ respond: { body: ok } }]\n";
    let telemetry = gateway::telemetry::Telemetry::new();
    let snapshots = [cluster(1), cluster(2)];
    let mut turn = 0;
    let mut group = c.benchmark_group("kubernetes");
    group.sample_size(10);
    group.bench_function("one_httproute_change_among_1000", |b| {
        b.iter(|| {
            turn ^= 1;
            let mut t = translate::translate(&snapshots[turn], &config, Path::new("."));
            translate::prune(&mut t);
            let loaded = gateway_config::load_str_with(
                file,
                "bench.yaml",
                Path::new("."),
                Some(&t.fragment),
            )
            .expect("config");
            let generation = gateway::generation::Generation::check(Arc::new(loaded), &telemetry)
                .expect("generation");
            black_box(generation);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
