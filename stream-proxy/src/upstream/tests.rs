//! Health and bookkeeping through the public `Targets` API (the balancers' own distributions are
//! tested next to each balancer). Time is paused so ejection windows are exact.

use std::net::IpAddr;
use std::time::Duration;

use super::*;

fn set(n: u16, balance: Balance) -> Targets {
    let specs = (0..n)
        .map(|i| {
            let a = format!("127.0.0.1:{}", 9000 + i);
            TargetSpec::new(&a, a.parse().unwrap(), 1)
        })
        .collect();
    Targets::new(
        specs,
        balance,
        HealthPolicy {
            unhealthy_after: 2,
            healthy_after: 2,
            eject_for: Duration::from_secs(10),
        },
    )
}

fn picks(t: &Targets, n: usize) -> Vec<usize> {
    let mut counts = vec![0; t.len()];
    for _ in 0..n {
        counts[t.select(0, &[]).unwrap().index()] += 1;
    }
    counts
}

#[tokio::test(start_paused = true)]
async fn passive_ejection_lasts_eject_for_then_one_failure_ejects_again() {
    let t = set(3, Balance::RoundRobin);
    t.report_failure(1);
    assert_eq!(
        t.health(1),
        Some(Health::Healthy),
        "one failure is not enough"
    );
    t.report_failure(1);
    assert_eq!(t.health(1), Some(Health::Ejected));
    assert_eq!(picks(&t, 100), [50, 0, 50]);

    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        t.health(1),
        Some(Health::Healthy),
        "the window is over: probe again"
    );
    t.report_failure(1);
    assert_eq!(
        t.health(1),
        Some(Health::Ejected),
        "still failing: out again at once"
    );

    tokio::time::advance(Duration::from_secs(10)).await;
    t.report_success(1);
    t.report_failure(1);
    assert_eq!(
        t.health(1),
        Some(Health::Healthy),
        "a success resets the count"
    );

    let s = &t.snapshot()[1];
    assert_eq!((s.failures, s.ejections, s.recoveries), (4, 2, 1));
}

#[tokio::test(start_paused = true)]
async fn success_inside_the_window_does_not_end_an_ejection() {
    let t = set(2, Balance::RoundRobin);
    t.report_failure(0);
    t.report_failure(0);
    t.report_success(0); // a request that started before the ejection
    assert_eq!(t.health(0), Some(Health::Ejected));
}

#[tokio::test(start_paused = true)]
async fn all_down_selects_nothing_and_exclusion_is_honoured() {
    let t = set(2, Balance::LeastRequests);
    assert_eq!(t.select(0, &[0]).unwrap().index(), 1);
    assert!(t.select(0, &[0, 1]).is_none());
    // Only active checks can take every target out.
    for i in 0..2 {
        t.report_check(i, false);
        t.report_check(i, false);
    }
    assert!(t.select(0, &[]).is_none());
}

#[tokio::test(start_paused = true)]
async fn the_last_selectable_target_is_never_ejected_on_passive_signals() {
    let t = set(2, Balance::RoundRobin);
    t.report_failure(0);
    t.report_failure(0);
    assert_eq!(t.health(0), Some(Health::Ejected));
    for _ in 0..5 {
        t.report_failure(1);
    }
    assert_eq!(t.health(1), Some(Health::Healthy), "the last one stays in");
    assert_eq!(picks(&t, 10), [0, 10]);
    // Nor does another instance's report take it out.
    assert!(t.eject_from_peer("127.0.0.1:9001", Duration::from_secs(30)));
    assert_eq!(t.health(1), Some(Health::Healthy));
    let s = &t.snapshot()[1];
    assert_eq!((s.failures, s.ejections, s.ejections_spared), (5, 0, 5));

    // Once the other target is back in, the next failure ejects this one, and the other,
    // now the last, is spared in turn.
    tokio::time::advance(Duration::from_secs(10)).await;
    t.report_failure(1);
    assert_eq!(t.health(1), Some(Health::Ejected));
    t.report_failure(0);
    assert_eq!(t.health(0), Some(Health::Healthy));
    assert_eq!(t.snapshot()[0].ejections_spared, 1);
}

#[tokio::test(start_paused = true)]
async fn a_single_target_stays_in_on_failures_but_active_checks_take_it_down() {
    let t = set(1, Balance::RoundRobin);
    for _ in 0..10 {
        t.report_failure(0);
    }
    assert_eq!(t.health(0), Some(Health::Healthy));
    assert_eq!(t.select(0, &[]).unwrap().index(), 0);
    t.report_check(0, false);
    t.report_check(0, false);
    assert_eq!(t.health(0), Some(Health::Down));
    assert!(t.select(0, &[]).is_none());
    let s = &t.snapshot()[0];
    assert_eq!((s.failures, s.ejections, s.ejections_spared), (10, 1, 9));
}

#[tokio::test(start_paused = true)]
async fn active_checks_mark_down_and_bring_back() {
    let t = set(2, Balance::Random);
    t.report_check(0, false);
    assert_eq!(t.health(0), Some(Health::Healthy));
    t.report_check(0, false);
    assert_eq!(t.health(0), Some(Health::Down));
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(
        t.health(0),
        Some(Health::Down),
        "no time limit on an active verdict"
    );
    assert_eq!(picks(&t, 50), [0, 50]);
    t.report_check(0, true);
    assert_eq!(t.health(0), Some(Health::Down));
    t.report_check(0, true);
    assert_eq!(t.health(0), Some(Health::Healthy));
    let s = &t.snapshot()[0];
    assert_eq!((s.check_failures, s.ejections, s.recoveries), (2, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn passing_checks_end_a_passive_ejection_early() {
    let t = set(2, Balance::RoundRobin);
    t.report_check(0, true);
    t.report_check(0, true);
    t.report_failure(0);
    t.report_failure(0);
    assert_eq!(t.health(0), Some(Health::Ejected));
    t.report_check(0, true);
    assert_eq!(
        t.health(0),
        Some(Health::Ejected),
        "passes from before the ejection do not count"
    );
    t.report_check(0, true);
    assert_eq!(t.health(0), Some(Health::Healthy));
}

#[tokio::test]
async fn selections_count_in_flight_until_dropped() {
    let t = set(3, Balance::LeastRequests);
    let held: Vec<Selection> = (0..6).map(|_| t.select(0, &[]).unwrap()).collect();
    assert!(
        t.snapshot()
            .iter()
            .all(|s| s.in_flight == 2 && s.attempts == 2)
    );
    drop(held);
    assert!(t.snapshot().iter().all(|s| s.in_flight == 0));
}

#[tokio::test]
async fn least_requests_avoids_a_busy_target() {
    let t = set(3, Balance::LeastRequests);
    let busy: Vec<Selection> = (0..30).map(|_| t.select(0, &[1, 2]).unwrap()).collect();
    assert_eq!(picks(&t, 100), [0, 50, 50]);
    drop(busy);
}

#[tokio::test]
async fn consistent_hash_is_sticky_through_targets() {
    let t = set(4, Balance::ConsistentHash);
    let key = hash_bytes(b"user-7");
    let first = t.select(key, &[]).unwrap().index();
    for _ in 0..20 {
        assert_eq!(t.select(key, &[]).unwrap().index(), first);
    }
    let retry = t.select(key, &[first]).unwrap().index();
    assert_ne!(retry, first);
}

#[tokio::test(start_paused = true)]
async fn ejections_are_reported_to_the_listener_and_peer_reports_eject_for_their_window() {
    let t = set(3, Balance::RoundRobin);
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = told.clone();
    assert!(t.set_ejection_listener(Arc::new(move |target, window| {
        sink.lock().unwrap().push((target.to_owned(), window));
    })));
    t.report_failure(0);
    assert!(
        told.lock().unwrap().is_empty(),
        "one failure is not an ejection"
    );
    t.report_failure(0);
    assert_eq!(
        *told.lock().unwrap(),
        [("127.0.0.1:9000".to_owned(), Duration::from_secs(10))]
    );

    // A peer's report ejects without echoing it back, for the peer's window.
    assert!(t.eject_from_peer("127.0.0.1:9002", Duration::from_secs(3)));
    assert!(!t.eject_from_peer("127.0.0.1:1", Duration::from_secs(3)));
    assert_eq!(told.lock().unwrap().len(), 1);
    assert_eq!(t.health(2), Some(Health::Ejected));
    assert_eq!(picks(&t, 10), [0, 10, 0]);
    tokio::time::advance(Duration::from_millis(3001)).await;
    assert_eq!(t.health(2), Some(Health::Healthy));
    // A shorter peer window never shortens a local ejection.
    assert!(t.eject_from_peer("127.0.0.1:9000", Duration::from_secs(1)));
    tokio::time::advance(Duration::from_millis(2000)).await;
    assert_eq!(t.health(0), Some(Health::Ejected));
}

/// A lookup whose answers the test changes: `None` fails.
fn feed() -> (Arc<Mutex<Option<Vec<IpAddr>>>>, resolve::Lookup) {
    let answer: Arc<Mutex<Option<Vec<IpAddr>>>> = Arc::new(Mutex::new(None));
    let a = answer.clone();
    let lookup: resolve::Lookup = Arc::new(move |host| {
        assert_eq!(host, "app.internal");
        a.lock()
            .unwrap()
            .clone()
            .ok_or_else(|| std::io::Error::other("no such host"))
    });
    (answer, lookup)
}

fn named(balance: &str) -> gateway_config::Upstream {
    let yaml = format!(
        "upstreams:\n  app:\n    targets: [ {{ address: app.internal:8080, weight: 3 }}, 127.0.0.1:9000 ]\n    balance: {balance}\n    hash_on: path\n"
    );
    let config = gateway_config::load_str(&yaml, "t.yaml", std::path::Path::new(".")).unwrap();
    config.upstreams["app"].clone()
}

fn ids(t: &Targets) -> Vec<String> {
    t.snapshot().into_iter().map(|s| s.id).collect()
}

#[tokio::test(start_paused = true)]
async fn every_address_of_a_name_is_a_target_and_refreshes_keep_the_state_of_those_that_stay() {
    let (answer, lookup) = feed();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    // Not resolvable at first: only the address target serves.
    let t = Targets::from_config_with(&named("round_robin"), lookup, None);
    assert_eq!(ids(&t), ["127.0.0.1:9000"]);
    assert_eq!(t.resolve_failures(), 1);

    *answer.lock().unwrap() = Some(vec![ip("10.0.0.2"), ip("10.0.0.1"), ip("10.0.0.2")]);
    assert!(t.refresh());
    assert_eq!(
        ids(&t),
        [
            "app.internal:8080@10.0.0.1",
            "app.internal:8080@10.0.0.2",
            "127.0.0.1:9000"
        ]
    );
    let snap = t.snapshot();
    assert_eq!(snap[0].authority, "app.internal:8080");
    assert_eq!(snap[0].addr, "10.0.0.1:8080".parse().unwrap());
    assert_eq!((snap[0].weight, snap[1].weight, snap[2].weight), (3, 3, 1));
    assert_eq!(
        picks(&t, 70),
        [30, 30, 10],
        "the entry's weight applies to each address"
    );
    // The same answer changes nothing.
    assert!(!t.refresh());

    // 10.0.0.1 is ejected; a selection on 10.0.0.2 is in flight across the change.
    t.report_failure(0);
    t.report_failure(0);
    assert_eq!(t.health(0), Some(Health::Ejected));
    let held = t.select(0, &[0, 2]).unwrap();
    assert_eq!(held.target().id.as_ref(), "app.internal:8080@10.0.0.2");

    // 10.0.0.2 vanishes, 10.0.0.3 appears: the ejected one stays ejected, the new one starts
    // healthy, and the vanished one lives on for the request that holds it.
    *answer.lock().unwrap() = Some(vec![ip("10.0.0.1"), ip("10.0.0.3")]);
    assert!(t.refresh());
    assert_eq!(
        ids(&t),
        [
            "app.internal:8080@10.0.0.1",
            "app.internal:8080@10.0.0.3",
            "127.0.0.1:9000"
        ]
    );
    assert_eq!(t.health(0), Some(Health::Ejected));
    assert_eq!(t.health(1), Some(Health::Healthy));
    t.report_failure_on(held.state());
    assert_eq!(held.state().stats.failures.load(Relaxed), 1);
    assert_eq!(
        t.snapshot()[1].failures,
        0,
        "a report on a vanished target charges no other"
    );
    drop(held);

    // A failed or empty lookup keeps the last good set, and is counted.
    *answer.lock().unwrap() = None;
    assert!(!t.refresh());
    *answer.lock().unwrap() = Some(Vec::new());
    assert!(!t.refresh());
    assert_eq!(t.resolve_failures(), 3);
    assert_eq!(t.len(), 3);
}

#[test]
fn a_set_with_no_target_yet_selects_none_with_every_balancer() {
    for balance in ["round_robin", "least_requests", "random", "consistent_hash"] {
        let (_, lookup) = feed();
        let mut up = named(balance);
        up.targets.truncate(1);
        let t = Targets::from_config_with(&up, lookup, None);
        assert!(t.is_empty());
        assert!(t.select(7, &[]).is_none(), "{balance}");
    }
}

#[test]
fn localhost_resolves_to_a_target_per_address() {
    let yaml = "upstreams:\n  app:\n    targets: [localhost:8080]\n";
    let config = gateway_config::load_str(yaml, "t.yaml", std::path::Path::new(".")).unwrap();
    let t = Targets::from_config(&config.upstreams["app"]);
    let addrs: Vec<SocketAddr> = t.snapshot().iter().map(|s| s.addr).collect();
    assert!(
        addrs.contains(&"127.0.0.1:8080".parse().unwrap()),
        "{addrs:?}"
    );
    assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
}

#[test]
fn a_vanished_target_and_its_attachment_go_when_its_last_selection_ends() {
    let (answer, lookup) = feed();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    *answer.lock().unwrap() = Some(vec![ip("10.0.0.1"), ip("10.0.0.2")]);
    let live = Arc::new(());
    let attacher: Attacher = {
        let live = live.clone();
        Arc::new(move |_: &TargetSpec| {
            let a: Attachment = Arc::new(live.clone());
            Some(a)
        })
    };
    let t = Targets::from_config_with(&named("round_robin"), lookup, Some(attacher));
    // The test's and the attacher's, and one attachment for each of the name's two addresses
    // and the address target.
    assert_eq!(Arc::strong_count(&live), 5);
    let held = t.select(0, &[1, 2]).unwrap();
    assert_eq!(held.target().addr.ip(), ip("10.0.0.1"));
    assert!(held.state().attachment::<Arc<()>>().is_some());
    *answer.lock().unwrap() = Some(vec![ip("10.0.0.2")]);
    assert!(t.refresh());
    assert_eq!(t.len(), 2);
    assert_eq!(
        Arc::strong_count(&live),
        5,
        "kept while a selection holds it"
    );
    drop(held);
    assert_eq!(Arc::strong_count(&live), 4);
}
