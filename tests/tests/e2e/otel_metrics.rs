//! OTLP metrics export end to end (`telemetry.metrics`): the registry reaches a real OTLP
//! receiver over gRPC and HTTP/protobuf (decoded with `opentelemetry-proto`) with the values
//! `/metrics` shows, and a dead collector is counted without slowing requests.

use std::time::Duration;

use gateway_tests::otlp::{Metric, OtlpReceiver};
use gateway_tests::{TestGateway, http1};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};

fn config(endpoint: &str) -> String {
    format!(
        r#"
admin: {{ bind: 127.0.0.1:0 }}
server: {{ watch_config: false }}
telemetry:
  service_name: metrics-test
  metrics: {{ otlp_endpoint: "{endpoint}", interval: 100ms }}
listeners:
  - name: main
    bind: 127.0.0.1:0
routes:
  - name: hello
    match: {{ path_prefix: / }}
    respond: {{ status: 200, body: hi }}
"#
    )
}

fn label<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .and_then(|v| match v {
            any_value::Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        })
}

/// `gateway_http_requests_total{route="hello",status="2xx",protocol="http1"}` in an export.
fn hello_requests(metrics: &[Metric]) -> Option<i64> {
    let m = metrics
        .iter()
        .find(|m| m.name == "gateway_http_requests_total")?;
    let Some(metric::Data::Sum(sum)) = &m.data else {
        return None;
    };
    assert!(sum.is_monotonic, "counters are monotonic sums");
    assert_eq!(sum.aggregation_temporality, 2, "cumulative");
    sum.data_points
        .iter()
        .find(|p| {
            label(&p.attributes, "route") == Some("hello")
                && label(&p.attributes, "status") == Some("2xx")
                && label(&p.attributes, "protocol") == Some("http1")
        })
        .and_then(|p| match p.value {
            Some(number_data_point::Value::AsInt(n)) => Some(n),
            _ => None,
        })
}

async fn exports_the_registry(grpc: bool) {
    let collector = OtlpReceiver::start().await;
    let endpoint = if grpc {
        collector.grpc_endpoint()
    } else {
        collector.http_metrics_endpoint()
    };
    let gw = TestGateway::start(&config(&endpoint)).await;
    let mut c = http1(gw.addr("main")).await;
    for _ in 0..3 {
        assert_eq!(c.get("/").await.status(), 200);
    }
    let export = collector
        .wait_for_metrics(|m| hello_requests(m) == Some(3))
        .await
        .unwrap_or_else(|| panic!("no export with 3 requests: {:#?}", collector.metrics()));

    // The latency histogram comes along, with its buckets de-accumulated.
    let latency = export
        .iter()
        .find(|m| m.name == "gateway_http_request_duration_seconds")
        .expect("latency histogram");
    assert_eq!(latency.unit, "s");
    let Some(metric::Data::Histogram(h)) = &latency.data else {
        panic!("a histogram: {latency:#?}");
    };
    let p = h
        .data_points
        .iter()
        .find(|p| label(&p.attributes, "route") == Some("hello"))
        .expect("the route's series");
    assert_eq!(p.count, 3);
    assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
    assert_eq!(p.bucket_counts.iter().sum::<u64>(), 3);
    assert!(p.start_time_unix_nano > 0 && p.time_unix_nano > p.start_time_unix_nano);
    let (by_grpc, by_http) = collector.requests();
    assert_eq!((by_grpc > 0, by_http > 0), (grpc, !grpc));
}

#[tokio::test]
async fn grpc_export_carries_the_request_counters() {
    exports_the_registry(true).await;
}

#[tokio::test]
async fn http_export_carries_the_request_counters() {
    exports_the_registry(false).await;
}

#[tokio::test]
async fn a_dead_collector_is_counted_and_requests_go_on() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let gw = TestGateway::start(&config(&format!("http://{dead}"))).await;
    let mut c = http1(gw.addr("main")).await;
    let admin = gw.gateway().admin_addr().expect("admin");
    let scrape = gateway_tests::admin_head(&gw, "GET", "/metrics", "");
    let mut failures = 0;
    for _ in 0..100 {
        assert_eq!(c.get("/").await.status(), 200);
        let text = gateway_tests::raw(admin, scrape.as_bytes()).await;
        failures = text
            .lines()
            .find_map(|l| l.strip_prefix("gateway_metrics_export_failures_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if failures >= 2 {
            assert!(text.contains("gateway_metrics_exports_total 0\n"), "{text}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failures >= 2, "failed exports are counted");
}
