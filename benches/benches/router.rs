//! Router lookup cost: first-match-wins over a mixed table (exact hosts, wildcards, path
//! prefixes, a regex), for a hit near the front, one at the end, and a miss; and over an API
//! gateway's table of path prefixes only (one per service), for the first and the last service.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use gateway::router::{Matcher, Router};
use http::{HeaderMap, Method};

fn table(routes: usize) -> Router<usize> {
    let mut yaml = String::from("routes:\n");
    for i in 0..routes {
        let m = match i % 4 {
            0 => format!("{{ host: svc{i}.example.com, path_prefix: /api/v{i} }}"),
            1 => format!("{{ host: \"*.tenant{i}.example.com\" }}"),
            2 => format!("{{ path_prefix: /static/{i}, methods: [GET, HEAD] }}"),
            _ => format!("{{ path_regex: \"^/r{i}/[0-9]+$\" }}"),
        };
        yaml.push_str(&format!("  - match: {m}\n    respond: {{ body: r{i} }}\n"));
    }
    yaml.push_str("  - match: { path_prefix: / }\n    respond: { body: fallback }\n");
    yaml.push_str("listeners:\n  - name: l\n    bind: 127.0.0.1:0\n");
    compile(&yaml)
}

/// `routes` services, each a path prefix (`/svc0/`, `/svc1/`, ...), then a fallback.
fn services(routes: usize) -> Router<usize> {
    let mut yaml = String::from("routes:\n");
    for i in 0..routes {
        yaml.push_str(&format!(
            "  - match: {{ path_prefix: /svc{i}/ }}\n    respond: {{ body: s{i} }}\n"
        ));
    }
    yaml.push_str("  - respond: { body: fallback }\n");
    yaml.push_str("listeners:\n  - name: l\n    bind: 127.0.0.1:0\n");
    compile(&yaml)
}

fn compile(yaml: &str) -> Router<usize> {
    let config =
        gateway_config::load_str(yaml, "bench.yaml", std::path::Path::new(".")).expect("config");
    let compiled = config
        .routes
        .iter()
        .enumerate()
        .map(|(i, r)| (Matcher::new(r).expect("matcher"), r.listeners.clone(), i))
        .collect();
    Router::new(config.listeners.len(), compiled)
}

fn bench(c: &mut Criterion) {
    let headers = HeaderMap::new();
    for size in [10usize, 100] {
        let router = table(size);
        let mut group = c.benchmark_group(format!("router/{size}_routes"));
        group.bench_function("first", |b| {
            b.iter(|| {
                router.find(
                    0,
                    &Method::GET,
                    black_box("svc0.example.com"),
                    black_box("/api/v0/users"),
                    &headers,
                )
            })
        });
        let last = size - 1;
        let last_path = format!("/r{last}/42");
        group.bench_function("last_regex", |b| {
            b.iter(|| {
                router.find(
                    0,
                    &Method::GET,
                    black_box("other.host"),
                    black_box(&last_path),
                    &headers,
                )
            })
        });
        group.bench_function("fallback", |b| {
            b.iter(|| {
                router.find(
                    0,
                    &Method::GET,
                    black_box("nomatch.host"),
                    black_box("/nothing/here"),
                    &headers,
                )
            })
        });
        group.finish();
        let router = services(size);
        let mut group = c.benchmark_group(format!("router/{size}_services"));
        for (name, path) in [
            ("first", "/svc0/users/7".to_string()),
            ("last", format!("/svc{last}/users/7")),
        ] {
            group.bench_function(name, |b| {
                b.iter(|| router.find(0, &Method::GET, "", black_box(&path), &headers))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
