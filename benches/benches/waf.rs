//! Cost of the `waf` and `rate_limit` filters.
//!
//! - `waf/detectors`: the libinjection calls alone, and the full detector set (byte classes,
//!   pre-checks, benign-verdict cache) on typical benign values and on attacks.
//! - `waf/filter`: a typical browser GET (path, three query arguments, user agent, referer,
//!   cookies) through a policy with every built-in detector and 50 custom rules; an attack; a
//!   JSON POST body.
//! - `rate_limit/decide`: one token-bucket decision for a returning client and for a stream of
//!   distinct clients.
//! - `waf/e2e`: the same GET through a real in-process gateway (one `current_thread` runtime,
//!   one kept-alive HTTP/1.1 connection), bare and behind each filter: the difference is the
//!   filter's share of a whole request.
//!
//! Run: `cargo bench -p gateway-benches --bench waf`

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use gateway::filter::RateLimitFilterFactory;
use gateway::filter::rate_limit::decide;
use gateway::filter::waf::detect::{Detectors, Enabled, Kind, sqli, xss};
use gateway::filter::waf::{Policy, WafFilter, WafFilterFactory};
use gateway::telemetry::Registry;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

const UA: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36";
const REFERER: &str = "https://shop.example.com/products?category=shoes&color=blue";
const COOKIE: &str =
    "session=3f9a1c7e5b2d4a6f8e0c1b3d5f7a9c2e; theme=dark; _ga=GA1.2.1234567890.1700000000";
const GET_PATH: &str = "/api/v1/products?page=2&sort=price&q=running+shoes";

/// 50 custom rules spread over the targets a real policy uses.
fn rules() -> String {
    let mut r = Vec::new();
    let bots = [
        "badbot",
        "evilcrawler",
        "scrapy",
        "httrack",
        "sitesucker",
        "webzip",
        "teleport",
        "offline explorer",
        "emailcollector",
        "extractorpro",
    ];
    for (i, b) in bots.iter().enumerate() {
        r.push(format!(
            "{{ id: {}, where: \"header:user-agent\", match: \"(?i){b}\" }}",
            1000 + i
        ));
    }
    let paths = [
        "^/wp-admin",
        "^/wp-login\\\\.php",
        "\\\\.php$",
        "^/phpmyadmin",
        "^/\\\\.well-known/security",
        "^/admin/",
        "^/cgi-bin/",
        "\\\\.(bak|old|swp)$",
        "^/server-status",
        "^/actuator",
    ];
    for (i, p) in paths.iter().enumerate() {
        r.push(format!(
            "{{ id: {}, where: path, match: \"{p}\" }}",
            2000 + i
        ));
    }
    for (i, q) in [
        "debug=",
        "(?i)xdebug",
        "__proto__",
        "constructor\\\\[",
        "(?i)phpinfo",
    ]
    .iter()
    .enumerate()
    {
        r.push(format!(
            "{{ id: {}, where: query, match: \"{q}\" }}",
            3000 + i
        ));
    }
    for (i, a) in ["[^0-9]", "^0", "^.{12,}$", "-", "\\\\s"]
        .iter()
        .enumerate()
    {
        r.push(format!(
            "{{ id: {}, where: \"arg:page\", match: \"{a}\" }}",
            4000 + i
        ));
    }
    for (i, a) in [
        "(?i)<\\\\s*script",
        "(?i)\\\\bsleep\\\\s*\\\\(",
        "\\\\$\\\\{jndi:",
        "(?i)eval\\\\s*\\\\(",
        "\\\\{\\\\{.*\\\\}\\\\}",
    ]
    .iter()
    .enumerate()
    {
        r.push(format!(
            "{{ id: {}, where: \"arg:q\", match: \"{a}\" }}",
            5000 + i
        ));
    }
    for (i, c) in ["[^0-9a-f]", "^.{65,}$", "^$", "(?i)admin", "\\\\.\\\\."]
        .iter()
        .enumerate()
    {
        r.push(format!(
            "{{ id: {}, where: \"cookie:session\", match: \"{c}\" }}",
            6000 + i
        ));
    }
    for (i, m) in ["^TRACE$", "^TRACK$", "^(PROPFIND|MKCOL)$"]
        .iter()
        .enumerate()
    {
        r.push(format!(
            "{{ id: {}, where: method, match: \"{m}\" }}",
            7000 + i
        ));
    }
    for (i, h) in [
        "(?i)semalt\\\\.com",
        "(?i)buttons-for-website",
        "(?i)darodar",
    ]
    .iter()
    .enumerate()
    {
        r.push(format!(
            "{{ id: {}, where: \"header:referer\", match: \"{h}\" }}",
            8000 + i
        ));
    }
    r.push(
        "{ id: 9000, where: client_ip, match: \"^203\\\\.0\\\\.113\\\\.\", action: log }".into(),
    );
    r.push("{ id: 9001, where: client_ip, match: \"^198\\\\.51\\\\.100\\\\.\" }".into());
    r.push("{ id: 9002, where: body, match: \"(?i)<!ENTITY\" }".into());
    r.push("{ id: 9003, where: body, match: \"\\\\$\\\\{jndi:\" }".into());
    assert_eq!(r.len(), 50);
    r.iter().map(|x| format!("      - {x}\n")).collect()
}

fn config() -> String {
    format!(
        r#"
server:
  worker_threads: 1
  watch_config: false
  drain_timeout: 1s
listeners:
  - name: plain
    bind: 127.0.0.1:0
    protocols: [http1]
waf:
  full:
    mode: block
    detect: [sqli, xss, path_traversal, scanner, protocol, command_injection]
    rules:
{}routes:
  - name: bare
    match: {{ path_prefix: /api }}
    respond: {{ status: 200, body: "Hello, world!\n", headers: {{ content-type: text/plain }} }}
  - name: waf
    match: {{ path_prefix: /waf }}
    filters: [ {{ waf: full }} ]
    respond: {{ status: 200, body: "Hello, world!\n", headers: {{ content-type: text/plain }} }}
  - name: limited
    match: {{ path_prefix: /limited }}
    filters: [ {{ rate_limit: {{ requests: 1000000000, per: 1s, key: client_ip }} }} ]
    respond: {{ status: 200, body: "Hello, world!\n", headers: {{ content-type: text/plain }} }}
"#,
        rules()
    )
}

fn load() -> gateway_config::Config {
    gateway_config::load_str(&config(), "waf-bench.yaml", std::path::Path::new("."))
        .expect("config")
}

fn policy() -> Arc<Policy> {
    let config = load();
    let factory = WafFilterFactory::new(&config.waf["full"], &Registry::new()).expect("policy");
    factory.policy().clone()
}

fn typical_get(path: &str) -> http::request::Parts {
    Request::get(path)
        .header("host", "shop.example.com")
        .header("user-agent", UA)
        .header(
            "accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        )
        .header("accept-language", "en-GB,en;q=0.9")
        .header("accept-encoding", "gzip, deflate, br")
        .header("referer", REFERER)
        .header("cookie", COOKIE)
        .body(())
        .expect("request")
        .into_parts()
        .0
}

const CLIENT: (IpAddr, &str) = (IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)), "bench");

fn detectors(c: &mut Criterion) {
    let mut g = c.benchmark_group("waf/detectors");
    g.throughput(Throughput::Elements(1));
    for (name, v) in [
        ("libinjection_sqli/word", "shoes"),
        ("libinjection_sqli/prose", "running shoes for men"),
        ("libinjection_sqli/user_agent", UA),
        (
            "libinjection_sqli/attack",
            "1' UNION SELECT username, password FROM users--",
        ),
    ] {
        g.bench_function(name, |b| b.iter(|| sqli::detect(black_box(v.as_bytes()))));
    }
    g.bench_function("libinjection_xss/attack", |b| {
        let v = b"<img src=x onerror=alert(1)>";
        b.iter(|| xss::detect(black_box(v), gateway::filter::waf::detect::features(v)))
    });
    let all = Detectors::new(Enabled {
        sqli: true,
        xss: true,
        traversal: true,
        scanner: true,
        protocol: true,
        cmdi: true,
    });
    for (name, kind, v) in [
        ("all/word", Kind::Value, "price"),
        (
            "all/uuid",
            Kind::Value,
            "550e8400-e29b-41d4-a716-446655440000",
        ),
        ("all/prose", Kind::Value, "running shoes"),
        ("all/user_agent_cached", Kind::Header, UA),
        ("all/sqli_attack", Kind::Value, "1' OR '1'='1"),
        ("all/xss_attack", Kind::Value, "<script>alert(1)</script>"),
        ("all/cmdi_attack", Kind::Value, "127.0.0.1; cat /etc/passwd"),
        (
            "all/traversal_attack",
            Kind::Path,
            "/static/../../etc/passwd",
        ),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| all.inspect(kind, black_box(v.as_bytes())))
        });
    }
    g.finish();
}

fn filter(c: &mut Criterion) {
    let policy = policy();
    let mut g = c.benchmark_group("waf/filter");
    g.throughput(Throughput::Elements(1));
    let get = typical_get(GET_PATH);
    g.bench_function("typical_get_50_rules", |b| {
        b.iter(|| {
            let mut f = WafFilter::new(policy.clone());
            assert!(f.check_head(black_box(&get), CLIENT).is_none());
        })
    });
    let attack = typical_get("/api/v1/products?page=2&q=1%27%20OR%20%271%27%3D%271");
    g.bench_function("sqli_get_blocked", |b| {
        b.iter(|| {
            let mut f = WafFilter::new(policy.clone());
            assert!(f.check_head(black_box(&attack), CLIENT).is_some());
        })
    });
    let body = br#"{"order":{"items":[{"sku":"RS-42","qty":1},{"sku":"SK-7","qty":2}],"note":"Leave it with the neighbour, please","coupon":"SPRING24"}}"#;
    let post = Request::post("/api/v1/orders")
        .header("content-type", "application/json")
        .header("user-agent", UA)
        .header("cookie", COOKIE)
        .body(())
        .expect("request")
        .into_parts()
        .0;
    g.bench_function("json_post_body", |b| {
        b.iter(|| {
            let mut f = WafFilter::new(policy.clone());
            assert!(f.check_head(&post, CLIENT).is_none());
            assert!(f.check_body(black_box(body), CLIENT).is_none());
        })
    });
    g.finish();
}

fn rate_limit(c: &mut Criterion) {
    let config = load();
    let route = config
        .routes
        .iter()
        .find(|r| r.name == "limited")
        .expect("route");
    let registry = Registry::new();
    let gateway_config::Filter::RateLimit { settings, key } = &route.filters[0] else {
        panic!("rate_limit filter expected");
    };
    let factory =
        RateLimitFilterFactory::new("bench", 0, settings, key, &registry, None).expect("factory");
    let req = typical_get(GET_PATH);
    let mut g = c.benchmark_group("rate_limit/decide");
    g.throughput(Throughput::Elements(1));
    g.bench_function("same_client", |b| {
        b.iter(|| decide(&factory, black_box(&req), CLIENT.0))
    });
    let mut n = 0u32;
    g.bench_function("distinct_clients_1m", |b| {
        b.iter(|| {
            n = (n + 1) % 1_000_000;
            decide(&factory, &req, IpAddr::V4(Ipv4Addr::from(0x0A00_0000 + n)))
        })
    });
    g.finish();
}

fn e2e(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let gateway = rt
        .block_on(gateway::Gateway::start(load()))
        .expect("gateway starts");
    let addr = gateway.listener_addr("plain").expect("listener");
    let mut sender = rt.block_on(async {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        sender
    });
    let mut g = c.benchmark_group("waf/e2e");
    g.throughput(Throughput::Elements(1));
    g.measurement_time(Duration::from_secs(5));
    for (name, prefix) in [
        ("bare", "/api"),
        ("waf_50_rules", "/waf"),
        ("rate_limit", "/limited"),
    ] {
        let path = GET_PATH.replacen("/api", prefix, 1);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        let mut req = Request::get(path.as_str());
                        for (k, v) in [
                            ("host", "shop.example.com"),
                            ("user-agent", UA),
                            ("accept", "text/html,application/xhtml+xml,*/*;q=0.8"),
                            ("accept-language", "en-GB,en;q=0.9"),
                            ("accept-encoding", "gzip, deflate, br"),
                            ("referer", REFERER),
                            ("cookie", COOKIE),
                        ] {
                            req = req.header(k, v);
                        }
                        let res = sender
                            .send_request(req.body(Empty::<Bytes>::new()).expect("request"))
                            .await
                            .expect("response");
                        assert_eq!(res.status(), 200);
                        black_box(res.into_body().collect().await.expect("body"));
                    }
                    start.elapsed()
                })
            })
        });
    }
    g.finish();
    drop(sender);
    rt.block_on(gateway.shutdown());
}

criterion_group!(benches, detectors, filter, rate_limit, e2e);
criterion_main!(benches);
