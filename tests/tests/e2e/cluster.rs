//! Several gateway instances sharing state through a real Redis server (`cluster:`): a global
//! rate limit counted exactly across three instances, the configured fallbacks while Redis is
//! down (and no request waiting on it), counting resuming after Redis restarts, no wrong
//! answer from connections Redis closed (a restart, `CLIENT KILL`) once it is back, passive
//! ejections reaching the other instance within a second, and a plugin's shared data with CAS
//! across instances. Each test starts its own `redis-server` on a free loopback port and skips
//! (printing why) when it is not installed.

use std::time::Duration;

use gateway_tests::backend::Backend;
use gateway_tests::redis::RedisServer;
use gateway_tests::{Client, TestGateway, http1, temp_dir};
use stream_proxy::upstream::Health;
use tokio::time::Instant;

use crate::wasm::install;

/// The value of one series on the gateway's /metrics (0 when absent).
fn metric(gw: &TestGateway, series: &str) -> u64 {
    let text = gw.gateway().telemetry().registry.render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

fn cluster_up(gw: &TestGateway) -> bool {
    gw.gateway()
        .generation()
        .cluster
        .as_ref()
        .is_some_and(|c| c.is_up())
}

/// Waits (bounded) until every instance's link to Redis is up.
async fn all_up(gws: &[TestGateway]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gws.iter().all(cluster_up) {
        assert!(Instant::now() < deadline, "cluster link not up after 10s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 3 s) for a counter that is updated after the event the test saw, then checks
/// it is exactly `want`.
async fn metric_reaches(gw: &TestGateway, name: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while metric(gw, name) < want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(metric(gw, name), want, "{name}");
}

async fn start_three(yaml: &str) -> (Vec<TestGateway>, Vec<Client>) {
    let mut gws = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let gw = TestGateway::start(yaml).await;
        clients.push(http1(gw.addr("main")).await);
        gws.push(gw);
    }
    all_up(&gws).await;
    (gws, clients)
}

/// `n` requests to `path`, round robin over the instances; the statuses in order.
async fn round_robin(clients: &mut [Client], path: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    let k = clients.len();
    for i in 0..n {
        statuses.push(clients[i % k].get(path).await.status());
    }
    statuses
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

fn limits_config(redis: &str) -> String {
    format!(
        r#"
server: {{ watch_config: false }}
cluster: {{ redis: "{redis}", prefix: t1, timeout: 50ms }}
listeners:
  - name: main
    bind: 127.0.0.1:0
routes:
  - name: local-fallback
    match: {{ path: /a }}
    filters:
      - rate_limit: {{ requests: 10, per: 1m, scope: global }}
    respond: {{ body: "a" }}
  - name: fail-closed
    match: {{ path: /deny }}
    filters:
      - rate_limit: {{ requests: 10, per: 1m, scope: global, fallback: deny }}
    respond: {{ body: "deny" }}
  - name: fail-open
    match: {{ path: /allow }}
    filters:
      - rate_limit: {{ requests: 10, per: 1m, scope: global, fallback: allow }}
    respond: {{ body: "allow" }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_a_global_limit_and_fall_back_while_redis_is_down() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let (gws, mut clients) = start_three(&limits_config(&redis.url())).await;

    // 30 requests spread over three instances: exactly the limit of 10 passes.
    let statuses = round_robin(&mut clients, "/a", 30).await;
    assert_eq!(count(&statuses, 200), 10, "{statuses:?}");
    assert_eq!(count(&statuses, 429), 20, "{statuses:?}");
    assert!(statuses[..10].iter().all(|s| *s == 200), "{statuses:?}");
    let refused = clients[1].get("/a").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(
        refused.header("ratelimit-policy"),
        r#""local-fallback";q=10;w=60"#
    );
    assert!(
        refused
            .header("ratelimit")
            .starts_with(r#""local-fallback";r=0;t="#),
        "{}",
        refused.header("ratelimit")
    );
    let retry: u64 = refused.header("retry-after").parse().unwrap();
    assert!((1..=7).contains(&retry), "retry-after {retry}");
    // The bucket is in Redis, under the prefix, keyed by the client address.
    let mut conn = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("t1:rl:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys, ["t1:rl:local-fallback:0:ip:127.0.0.1"]);
    for gw in &gws {
        assert_eq!(
            metric(
                gw,
                "gateway_rate_limit_fallback_total{route=\"local-fallback\"}"
            ),
            0
        );
    }

    // Redis goes away: every route still answers at once, as its fallback says.
    redis.stop();
    let started = Instant::now();
    for (i, c) in clients.iter_mut().enumerate() {
        // The local bucket of each instance allows the whole limit by itself.
        let mut ok = 0;
        for _ in 0..12 {
            let res = c.get("/a").await;
            assert!(
                matches!(res.status(), 200 | 429),
                "instance {i}: {}",
                res.status()
            );
            ok += usize::from(res.status() == 200);
        }
        assert_eq!(ok, 10, "instance {i}: the local fallback limits alone");
        let res = c.get("/deny").await;
        assert_eq!(res.status(), 503, "fail closed");
        assert_eq!(res.header("retry-after"), "1");
        let res = c.get("/allow").await;
        assert_eq!(res.status(), 200, "fail open");
        assert_eq!(res.header("ratelimit"), "", "no limit was applied");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "42 requests took {:?}",
        started.elapsed()
    );
    for gw in &gws {
        assert!(!cluster_up(gw));
        assert!(
            metric(
                gw,
                "gateway_rate_limit_fallback_total{route=\"local-fallback\"}"
            ) >= 12
        );
        assert_eq!(
            metric(
                gw,
                "gateway_rate_limit_fallback_total{route=\"fail-closed\"}"
            ),
            1
        );
        // Only the call that found Redis gone (and perhaps a ping) failed: the other requests
        // fell back at once, without trying Redis and waiting for `cluster.timeout`.
        let errors = metric(gw, "gateway_cluster_redis_errors_total");
        assert!((1..=2).contains(&errors), "{errors} failed Redis calls");
        assert_eq!(metric(gw, "gateway_cluster_redis_up"), 0);
    }

    // Redis is back (empty: nothing persisted): the instances reconnect by themselves and
    // count globally again.
    redis.resume().await;
    all_up(&gws).await;
    let statuses = round_robin(&mut clients, "/a", 30).await;
    assert_eq!(count(&statuses, 200), 10, "{statuses:?}");
    let statuses = round_robin(&mut clients, "/deny", 15).await;
    assert_eq!(count(&statuses, 200), 10, "{statuses:?}");
    assert_eq!(count(&statuses, 429), 5, "{statuses:?}");
    for gw in &gws {
        assert_eq!(metric(gw, "gateway_cluster_redis_up"), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passive_ejection_reaches_the_other_instance_within_a_second() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let live = Backend::start("live").await;
    // A port nothing listens on: connections are refused.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = format!(
        r#"
server: {{ watch_config: false }}
cluster: {{ redis: "{}", share_health: true }}
listeners:
  - name: main
    bind: 127.0.0.1:0
upstreams:
  u:
    targets: ["{}", "{dead}"]
    health_check: {{ unhealthy_after: 1, eject_for: 30s }}
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: u }}
"#,
        redis.url(),
        live.addr()
    );
    let gws = [
        TestGateway::start(&yaml).await,
        TestGateway::start(&yaml).await,
    ];
    all_up(&gws).await;
    let health = |gw: &TestGateway| {
        gw.gateway()
            .generation()
            .upstreams
            .get("u")
            .unwrap()
            .targets
            .health(1)
            .unwrap()
    };
    assert_eq!(health(&gws[1]), Health::Healthy);

    // Requests through the first instance until it ejects the dead target.
    let mut c = http1(gws[0].addr("main")).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while health(&gws[0]) != Health::Ejected {
        assert!(
            Instant::now() < deadline,
            "first instance never ejected the target"
        );
        let _ = c.get("/").await;
    }
    let ejected_at = Instant::now();
    // Milliseconds on a quiet machine (printed below); the bound leaves room for a CI machine
    // whose two cores are busy with the rest of the suite.
    while health(&gws[1]) != Health::Ejected {
        assert!(
            ejected_at.elapsed() < Duration::from_secs(3),
            "the second instance did not learn of the ejection within three seconds"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("ejection shared in {:?}", ejected_at.elapsed());
    // Redis delivers a PUBLISH to the subscribers before it answers the publisher, and the
    // sender counts the event on that answer: the peer may apply it before it is counted here.
    metric_reaches(
        &gws[0],
        "gateway_cluster_health_events_total{direction=\"sent\"}",
        1,
    )
    .await;
    metric_reaches(
        &gws[1],
        "gateway_cluster_health_events_total{direction=\"received\"}",
        1,
    )
    .await;
    // The second instance now sends everything to the live target without trying the dead one.
    let mut c = http1(gws[1].addr("main")).await;
    for _ in 0..6 {
        assert_eq!(c.get("/").await.status(), 200);
    }
    assert_eq!(
        health(&gws[0]),
        Health::Ejected,
        "its own report is not applied twice"
    );
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_shared_data_with_global_scope_counts_across_instances() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let mut gws = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let dir = temp_dir();
        install(dir.path(), "shared_counter", "sc.wasm");
        let yaml = format!(
            r#"
server: {{ watch_config: false }}
cluster: {{ redis: "{}", prefix: t3 }}
listeners:
  - name: main
    bind: 127.0.0.1:0
plugins:
  counter:
    wasm: sc.wasm
    shared_data: {{ scope: global }}
routes:
  - match: {{ path_prefix: / }}
    filters:
      - plugin: counter
    respond: {{ body: ok }}
"#,
            redis.url()
        );
        let gw = TestGateway::start_in(dir, &yaml).await;
        clients.push(http1(gw.addr("main")).await);
        gws.push(gw);
    }
    all_up(&gws).await;
    // The count already in Redis (another instance's work) is where the plugin goes on from.
    let mut conn = redis.connection().await;
    redis::cmd("HSET")
        .arg("t3:shared:shared-counter/requests")
        .arg("v")
        .arg(&1000u64.to_le_bytes()[..])
        .arg("c")
        .arg(7)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    // Concurrent requests on all three instances: every count from 1001 to 1060 exactly once.
    let mut tasks = Vec::new();
    for (i, mut c) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..20 {
                let r = c.get("/").await;
                assert_eq!(r.status(), 200, "instance {i}");
                seen.push(r.header("x-request-count").parse::<u64>().unwrap());
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (1001..=1060).collect::<Vec<_>>());
    let (value, cas): (Vec<u8>, u32) = redis::cmd("HMGET")
        .arg("t3:shared:shared-counter/requests")
        .arg("v")
        .arg("c")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, 1060u64.to_le_bytes());
    assert!(cas >= 7 + 60, "every write bumped the token: {cas}");
    drop(gws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_an_unchanged_cluster_and_a_changed_one_starts_anew() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let config = |prefix: &str, extra: &str| {
        format!(
            r#"
server: {{ watch_config: false }}
cluster: {{ redis: "{}", prefix: {prefix} }}
listeners:
  - name: main
    bind: 127.0.0.1:0
routes:
  - name: limited
    match: {{ path: /a }}
    filters:
      - rate_limit: {{ requests: 5, per: 1m, scope: global }}
    respond: {{ body: "a" }}
{extra}"#,
            redis.url()
        )
    };
    let gw = TestGateway::start(&config("r1", "")).await;
    all_up(std::slice::from_ref(&gw)).await;
    let cluster = || gw.gateway().generation().cluster.clone().unwrap();
    let before = cluster();
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..3 {
        assert_eq!(c.get("/a").await.status(), 200);
    }

    // Another route, same cluster settings: same connection, the count goes on.
    let extra = "  - name: other\n    match: { path: /b }\n    respond: { body: b }\n";
    std::fs::write(gw.dir().join("gateway.yaml"), config("r1", extra)).unwrap();
    gw.gateway().reload().await.expect("reload");
    assert!(std::sync::Arc::ptr_eq(&before, &cluster()));
    let statuses = [c.get("/a").await.status(), c.get("/a").await.status()];
    assert_eq!(statuses, [200, 200]);
    assert_eq!(c.get("/a").await.status(), 429);
    assert_eq!(c.get("/b").await.status(), 200);

    // A new prefix: a new connection, and buckets of its own.
    std::fs::write(gw.dir().join("gateway.yaml"), config("r2", extra)).unwrap();
    gw.gateway().reload().await.expect("reload");
    let after = cluster();
    assert!(!std::sync::Arc::ptr_eq(&before, &after));
    drop(before);
    all_up(std::slice::from_ref(&gw)).await;
    let statuses = round_robin(std::slice::from_mut(&mut c), "/a", 6).await;
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
}

/// Global queues without a plugin in between: what `proxy_enqueue_shared_queue` and
/// `proxy_dequeue_shared_queue` do for a VM with `shared_data: { scope: global }`, on two
/// clusters (two instances) sharing one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_queue_carries_items_and_wakes_the_owner_across_instances() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let settings = gateway_config::model::ClusterConfig {
        redis: redis.url(),
        prefix: "t5".into(),
        timeout: gateway_config::Duration::from_millis(50),
        share_health: false,
    };
    let registries = [
        gateway::telemetry::Registry::new(),
        gateway::telemetry::Registry::new(),
    ];
    let [producer, consumer] = [0, 1].map(|i| {
        gateway::cluster::Cluster::get_or_start(&registries[i], &settings).expect("cluster")
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(producer.is_up() && consumer.is_up()) {
        assert!(Instant::now() < deadline, "cluster link not up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Give the consumer's subscriber a moment to subscribe.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The consumer's VM registers the queue; the producer's side enqueues on it by name.
    let host = gateway::wasm::host();
    let (woken_tx, mut woken) = tokio::sync::mpsc::unbounded_channel();
    let id = host.shared.register_queue_in(
        Some(&consumer.shared_data()),
        "t5-vm",
        "jobs",
        Some(std::sync::Arc::new(move |id| {
            let _ = woken_tx.send(id);
        })),
    );
    let store = producer.shared_data();
    let name = wasm_host::shared::global_queue_name("t5-vm", "jobs");
    for item in ["one", "two"] {
        store
            .0
            .enqueue(&name, bytes::Bytes::from(item))
            .expect("enqueued");
    }
    let mut conn = redis.connection().await;
    let len: usize = redis::cmd("LLEN")
        .arg("t5:queue:t5-vm/jobs")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 2, "the items wait in Redis");
    let first = tokio::time::timeout(Duration::from_secs(1), woken.recv())
        .await
        .expect("the owner is told within a second");
    assert_eq!(first, Some(id));
    // The consumer takes them in order, from Redis.
    assert_eq!(
        host.shared.dequeue(id),
        Some(Some(bytes::Bytes::from("one")))
    );
    assert_eq!(
        host.shared.dequeue(id),
        Some(Some(bytes::Bytes::from("two")))
    );
    assert_eq!(host.shared.dequeue(id), Some(None));
}

/// One instance of the restart tests: the shared counter plugin on `/` and a global limit of 10
/// a minute on `/limited`, with a `timeout` generous enough that a busy machine causes no
/// fallback of its own.
async fn restart_instance(redis: &RedisServer, prefix: &str) -> TestGateway {
    let dir = temp_dir();
    install(dir.path(), "shared_counter", "rc.wasm");
    let yaml = format!(
        r#"
server: {{ watch_config: false }}
cluster: {{ redis: "{}", prefix: {prefix}, timeout: 1s }}
listeners:
  - name: main
    bind: 127.0.0.1:0
plugins:
  restart_counter:
    wasm: rc.wasm
    shared_data: {{ scope: global }}
routes:
  - name: limited
    match: {{ path: /limited }}
    filters:
      - rate_limit: {{ requests: 10, per: 1m, scope: global }}
    respond: {{ body: "limited" }}
  - match: {{ path_prefix: / }}
    filters:
      - plugin: restart_counter
    respond: {{ body: ok }}
"#,
        redis.url()
    );
    TestGateway::start_in(dir, &yaml).await
}

/// Every client sends `per_client` requests to `/` at the same time as the others; the
/// clients back, and every count the plugin reported, sorted.
async fn count_under_load(clients: Vec<Client>, per_client: usize) -> (Vec<Client>, Vec<u64>) {
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut seen = Vec::with_capacity(per_client);
                for _ in 0..per_client {
                    let r = c.get("/").await;
                    assert_eq!(r.status(), 200);
                    seen.push(r.header("x-request-count").parse::<u64>().unwrap());
                }
                (c, seen)
            })
        })
        .collect();
    let mut clients = Vec::new();
    let mut counts = Vec::new();
    for t in tasks {
        let (c, seen) = t.await.unwrap();
        clients.push(c);
        counts.extend(seen);
    }
    counts.sort_unstable();
    (clients, counts)
}

/// The shared counter's value in Redis.
async fn stored_count(redis: &RedisServer, key: &str) -> u64 {
    let mut conn = redis.connection().await;
    let value: Vec<u8> = redis::cmd("HGET")
        .arg(key)
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();
    u64::from_le_bytes(value.try_into().expect("eight bytes"))
}

/// Issue 60 item 11: after Redis restarts (data kept in a dump), connections from before the
/// restart cost no wrong answer. Two instances, three clients each, 30 concurrent requests
/// through a plugin counting in global shared data per phase, and a global rate limit.
/// Restart 1 lets the links see Redis down and reconnect (connections pooled before it must
/// not be reused); restart 2 is quick, so a link may still hold its connection from before
/// (it must be replaced and the call run again, not fall back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_costs_no_wrong_answer_once_redis_is_back() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let gws = [
        restart_instance(&redis, "t6").await,
        restart_instance(&redis, "t6").await,
    ];
    all_up(&gws).await;
    let key = "t6:shared:shared-counter/requests";
    let mut conn = redis.connection().await;
    redis::cmd("HSET")
        .arg(key)
        .arg("v")
        .arg(&2000u64.to_le_bytes()[..])
        .arg("c")
        .arg(1)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    drop(conn);
    let mut clients = Vec::new();
    for i in 0..6 {
        clients.push(http1(gws[i % 2].addr("main")).await);
    }
    let limited = async |clients: &mut [Client], n: usize| -> Vec<u16> {
        let mut statuses = Vec::new();
        for i in 0..n {
            // Alternately on each instance.
            statuses.push(clients[i % 2].get("/limited").await.status());
        }
        statuses
    };

    let (c, counts) = count_under_load(clients, 5).await;
    clients = c;
    assert_eq!(counts, (2001..=2030).collect::<Vec<_>>());
    assert_eq!(limited(&mut clients, 4).await, [200; 4]);

    // Restart 1: Redis is gone long enough for both links to report it down.
    redis.shutdown_saving().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while gws.iter().any(cluster_up) {
        assert!(
            Instant::now() < deadline,
            "a link never noticed Redis was gone"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    redis.resume().await;
    all_up(&gws).await;
    assert_eq!(limited(&mut clients, 2).await, [200; 2]);
    let (c, counts) = count_under_load(clients, 5).await;
    clients = c;
    assert_eq!(counts, (2031..=2060).collect::<Vec<_>>(), "after restart 1");
    for gw in &gws {
        assert_eq!(
            metric(gw, "gateway_cluster_redis_retries_total"),
            0,
            "the links reconnected: no connection from before the restart was used"
        );
    }

    // Restart 2: quick, so a link may not have noticed.
    redis.shutdown_saving().await;
    redis.resume().await;
    all_up(&gws).await;
    let errors: Vec<u64> = gws
        .iter()
        .map(|gw| metric(gw, "gateway_cluster_redis_errors_total"))
        .collect();
    // 6 of the limit of 10 were used before: the bucket came back with the dump.
    assert_eq!(
        limited(&mut clients, 6).await,
        [200, 200, 200, 200, 429, 429]
    );
    let (_, counts) = count_under_load(clients, 5).await;
    assert_eq!(counts, (2061..=2090).collect::<Vec<_>>(), "after restart 2");

    assert_eq!(stored_count(&redis, key).await, 2090);
    for (gw, errors) in gws.iter().zip(errors) {
        assert!(cluster_up(gw), "the link is up");
        assert_eq!(metric(gw, "gateway_cluster_redis_up"), 1);
        assert_eq!(
            metric(gw, "gateway_cluster_redis_errors_total"),
            errors,
            "no Redis call failed once Redis was back"
        );
        assert_eq!(
            metric(gw, "gateway_rate_limit_fallback_total{route=\"limited\"}"),
            0
        );
        eprintln!(
            "calls run again on a fresh connection: {}",
            metric(gw, "gateway_cluster_redis_retries_total")
        );
    }
}

/// Issue 60 item 11: a connection Redis closes while it stays up (`CLIENT KILL`, as its idle
/// `timeout` or a restart between two pings does) is replaced, and the call that found it
/// closed runs again on the new one: the plugin's pooled connection and the rate limiter's
/// shared one both, with no fallback and no failed call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_redis_closed_is_replaced_without_a_fallback() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let gw = restart_instance(&redis, "t7").await;
    all_up(std::slice::from_ref(&gw)).await;
    let mut c = http1(gw.addr("main")).await;
    for want in 1..=3u64 {
        let r = c.get("/").await;
        assert_eq!(r.header("x-request-count"), want.to_string());
    }
    assert_eq!(c.get("/limited").await.status(), 200);

    // Every connection but this one (the gateway's subscriber is not of type normal).
    let mut conn = redis.connection().await;
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        killed >= 2,
        "the link's and the pool's connections: {killed}"
    );

    // The plugin first: its pooled connection is found closed before the link's is.
    let r = c.get("/").await;
    assert_eq!(r.header("x-request-count"), "4");
    assert_eq!(c.get("/limited").await.status(), 200);
    assert_eq!(
        stored_count(&redis, "t7:shared:shared-counter/requests").await,
        4
    );
    assert!(cluster_up(&gw));
    assert_eq!(metric(&gw, "gateway_cluster_redis_errors_total"), 0);
    assert_eq!(
        metric(&gw, "gateway_rate_limit_fallback_total{route=\"limited\"}"),
        0
    );
    assert!(metric(&gw, "gateway_cluster_redis_retries_total") >= 1);
    // The bucket kept counting in Redis: 2 of 10 used.
    let mut left = 0;
    while c.get("/limited").await.status() == 200 {
        left += 1;
        assert!(left <= 10, "the limit was not applied");
    }
    assert_eq!(left, 8);
}
