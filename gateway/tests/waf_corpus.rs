//! Detection and false-positive rates of the built-in WAF detectors on a corpus of real attack
//! payloads and of benign values that look dangerous (`tests/waf_corpus/*.txt`). Each value is
//! sent the two ways applications receive input: as a query argument (URL-encoded) and as a
//! JSON body field. Prints the rates (they are quoted in docs/waf.md) and asserts thresholds.
//!
//! Run: `cargo test -p gateway --test waf_corpus -- --nocapture`

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use gateway::filter::WafFilterFactory;
use gateway::filter::waf::{Policy, WafFilter};
use gateway::telemetry::Registry;
use http::Request;

const ATTACKS: &str = include_str!("waf_corpus/attacks.txt");
const BENIGN: &str = include_str!("waf_corpus/benign.txt");

const CONFIG: &str = r#"
waf:
  corpus:
    mode: block
    detect: [sqli, xss, path_traversal, scanner, protocol, command_injection]
routes:
  - match: { path_prefix: / }
    respond: { body: ok }
listeners:
  - name: l
    bind: 127.0.0.1:0
"#;

fn policy() -> Arc<Policy> {
    let config =
        gateway_config::load_str(CONFIG, "corpus.yaml", std::path::Path::new(".")).expect("config");
    let factory = WafFilterFactory::new(&config.waf["corpus"], &Registry::new()).expect("policy");
    factory.policy().clone()
}

/// Percent-encodes everything but unreserved characters, as a browser's form encoding would.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

const CLIENT: (IpAddr, &str) = (IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), "corpus");

fn blocked_in_query(policy: &Arc<Policy>, value: &str) -> bool {
    let uri = format!("/search?q={}&page=1", encode(value));
    let (parts, ()) = Request::get(uri).body(()).expect("request").into_parts();
    WafFilter::new(policy.clone())
        .check_head(&parts, CLIENT)
        .is_some()
}

fn blocked_in_json(policy: &Arc<Policy>, value: &str) -> bool {
    let body = serde_json::json!({ "title": "hello", "comment": value }).to_string();
    let (parts, ()) = Request::post("/comments")
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(())
        .expect("request")
        .into_parts();
    let mut f = WafFilter::new(policy.clone());
    f.check_head(&parts, CLIENT).is_some() || f.check_body(body.as_bytes(), CLIENT).is_some()
}

fn lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

fn pct(n: usize, of: usize) -> f64 {
    100.0 * n as f64 / of.max(1) as f64
}

#[test]
fn corpus_detection_and_false_positive_rates() {
    let policy = policy();
    let mut per_category: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let (mut attacks, mut detected_query, mut detected_json) = (0, 0, 0);
    let mut missed = Vec::new();
    for line in lines(ATTACKS) {
        let (category, payload) = line.split_once('\t').expect("CATEGORY<TAB>payload");
        let q = blocked_in_query(&policy, payload);
        let j = blocked_in_json(&policy, payload);
        attacks += 1;
        detected_query += usize::from(q);
        detected_json += usize::from(j);
        let e = per_category.entry(category).or_default();
        e.0 += 1;
        e.1 += usize::from(q);
        if !q || !j {
            missed.push(format!("{category}: {payload} (query {q}, json {j})"));
        }
    }
    let (mut benign, mut fp_query, mut fp_json) = (0, 0, 0);
    let mut false_positives = Vec::new();
    for value in lines(BENIGN) {
        let q = blocked_in_query(&policy, value);
        let j = blocked_in_json(&policy, value);
        benign += 1;
        fp_query += usize::from(q);
        fp_json += usize::from(j);
        if q || j {
            false_positives.push(format!("{value} (query {q}, json {j})"));
        }
    }

    println!("WAF corpus: {attacks} attacks, {benign} benign values");
    for (category, (n, hit)) in &per_category {
        println!(
            "  {category:<10} {hit}/{n} detected ({:.1}%) as a query argument",
            pct(*hit, *n)
        );
    }
    let dq = pct(detected_query, attacks);
    let dj = pct(detected_json, attacks);
    let fq = pct(fp_query, benign);
    let fj = pct(fp_json, benign);
    println!("  detection: {dq:.1}% as a query argument, {dj:.1}% as a JSON field");
    println!("  false positives: {fq:.1}% as a query argument, {fj:.1}% as a JSON field");
    for m in &missed {
        println!("  missed: {m}");
    }
    for f in &false_positives {
        println!("  false positive: {f}");
    }
    assert!(attacks >= 100 && benign >= 100, "corpus too small");
    assert!(dq >= 95.0 && dj >= 95.0, "detection below 95%");
    assert!(fq <= 2.0 && fj <= 2.0, "false positives above 2%");
}
