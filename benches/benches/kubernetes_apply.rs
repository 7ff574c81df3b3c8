//! What one HTTPRoute change costs among 1,000: the controller's translation of the whole
//! cluster (and its check that every route validates), then the gateway's load of the file
//! with the fragment merged and the build of the new generation. The bound for the
//! whole is one second. Printed once before: the memory the cluster's 1,000 routes hold (the
//! controller's copy of the objects, the fragment, the config and the generation) against the
//! same routes written in the file (config and generation).

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use gateway_config::KubernetesConfig;
use gateway_kubernetes::translate;
use gateway_kubernetes::watch::{Kind, Store};
use serde_json::json;

const ROUTES: usize = 1000;

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

#[allow(
    unsafe_code,
    reason = "a GlobalAlloc is an unsafe trait; this one only forwards"
)]
// SAFETY: every call forwards to the system allocator with the caller's own arguments.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes still held by what `make` returns.
fn held<T>(make: impl FnOnce() -> T) -> (isize, T) {
    let before = LIVE.load(Ordering::Relaxed);
    let kept = make();
    (LIVE.load(Ordering::Relaxed) - before, kept)
}

/// The same routes, hosts, header edits and upstreams as the cluster's, written in a file.
fn file_yaml() -> String {
    let mut y = String::from("listeners: [{ name: l, bind: '0.0.0.0:8080' }]\nupstreams:\n");
    for i in 0..ROUTES {
        y.push_str(&format!(
            "  svc{i}: {{ targets: ['10.0.{}.{}:9000', '10.1.{}.{}:9000'] }}\n",
            i / 250,
            i % 250 + 1,
            i / 250,
            i % 250 + 1
        ));
    }
    y.push_str("routes:\n");
    for i in 0..ROUTES {
        y.push_str(&format!(
            "  - {{ listeners: [l], match: {{ host: app{i}.example.com, path_prefix: /api }}, \
             filters: [{{ headers: {{ request_set: {{ x-route: svc{i} }} }} }}], \
             proxy: {{ split: [{{ upstream: svc{i}, weight: 1 }}] }} }}\n"
        ));
    }
    y
}

/// The cluster's objects: one Gateway, and per route a Service, an EndpointSlice and the
/// HTTPRoute (the first one's weight is `weight`).
fn objects(weight: u64) -> Vec<(Kind, serde_json::Value)> {
    let mut s = Vec::new();
    s.push((
        Kind::GatewayClass,
        json!({
        "metadata": {"name": "ours"}, "spec": {"controllerName": "gateway.dev/controller"}}),
    ));
    s.push((
        Kind::Gateway,
        json!({
        "metadata": {"namespace": "default", "name": "gw"},
        "spec": {"gatewayClassName": "ours",
                 "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}]}}),
    ));
    for i in 0..ROUTES {
        let svc = format!("svc{i}");
        s.push((
            Kind::Service,
            json!({
            "metadata": {"namespace": "default", "name": svc},
            "spec": {"ports": [{"name": "http", "port": 80}]}}),
        ));
        s.push((
            Kind::EndpointSlice,
            json!({
            "metadata": {"namespace": "default", "name": svc,
                         "labels": {"kubernetes.io/service-name": svc}},
            "ports": [{"name": "http", "port": 9000}],
            "endpoints": [{"addresses": [format!("10.0.{}.{}", i / 250, i % 250 + 1)]},
                          {"addresses": [format!("10.1.{}.{}", i / 250, i % 250 + 1)]}]}),
        ));
        // The first route is the one that changes.
        let w = if i == 0 { weight } else { 1 };
        s.push((Kind::HttpRoute, json!({
            "metadata": {"namespace": "default", "name": format!("r{i}"),
                         "creationTimestamp": "2026-12-07T00:00:00Z"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [format!("app{i}.example.com")],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                                "filters": [{"type": "RequestHeaderModifier",
                                             "requestHeaderModifier": {"set": [{"name": "x-route", "value": svc}]}}],
                                "backendRefs": [{"name": svc, "port": 80, "weight": w}]}]}})));
    }
    s
}

fn memory(config: &KubernetesConfig, telemetry: &Arc<gateway::telemetry::Telemetry>) {
    let (file, kept) = held(|| {
        let c = gateway_config::load_str(&file_yaml(), "bench.yaml", Path::new(".")).expect("file");
        gateway::generation::Generation::check(Arc::new(c), telemetry).expect("generation")
    });
    drop(kept);
    // The controller keeps the objects in its store; a snapshot lives only while translating.
    let (objects, store) = held(|| {
        let store = Store::new(0);
        for (kind, object) in objects(1) {
            store.insert(kind, object);
        }
        store
    });
    let snapshot = store.snapshot();
    let (fragment, t) = held(|| translate::translate(&snapshot, config, Path::new(".")).fragment);
    let (generation, kept) = held(|| {
        let c = gateway_config::load_str_with("", "bench.yaml", Path::new("."), Some(&t))
            .expect("cluster");
        gateway::generation::Generation::check(Arc::new(c), telemetry).expect("generation")
    });
    drop((kept, t, snapshot, store));
    let cluster = objects + fragment + generation;
    eprintln!(
        "  cluster: objects {} KiB, fragment {} KiB, config and generation {} KiB",
        objects / 1024,
        fragment / 1024,
        generation / 1024
    );
    eprintln!(
        "memory held for {ROUTES} routes: file {} KiB, cluster {} KiB ({:+.0} %)",
        file / 1024,
        cluster / 1024,
        (cluster as f64 / file as f64 - 1.0) * 100.0
    );
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
    memory(&config, &telemetry);
    let store = Store::new(0);
    for (kind, object) in objects(1) {
        store.insert(kind, object);
    }
    // The changing route, at each of its two weights.
    let changed: Vec<_> = [1, 2]
        .map(|w| {
            objects(w)
                .into_iter()
                .find(|(k, _)| *k == Kind::HttpRoute)
                .unwrap()
                .1
        })
        .into();
    let mut turn = 0;
    let mut group = c.benchmark_group("kubernetes");
    group.sample_size(10);
    group.bench_function("one_httproute_change_among_1000", |b| {
        b.iter(|| {
            turn ^= 1;
            store.insert(Kind::HttpRoute, changed[turn].clone());
            let snapshot = store.snapshot();
            let mut t = translate::translate(&snapshot, &config, Path::new("."));
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
