//! Native stream filters on TCP: allow and deny lists and the per-client connection rate.
//! (UDP sessions go through the same filters: see `udp.rs`. Data-inspecting filters are tested
//! in stream-proxy's own integration tests, with a filter supplied through the resolver.)

use gateway_tests::TestGateway;
use gateway_tests::backend::l4::{Mode, TcpBackend};

use super::{config, exchange};

fn stream(name: &str, filters: &str) -> String {
    format!(
        "  - name: {name}\n    bind: 127.0.0.1:0\n    protocol: tcp\n    upstream: app\n    filters:\n{filters}"
    )
}

#[tokio::test]
async fn allow_and_deny_lists() {
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let streams = [
        stream("deny", "      - deny: [127.0.0.0/8]\n"),
        stream("allow-other", "      - allow: [10.0.0.0/8, \"::1/128\"]\n"),
        stream(
            "allow-me",
            "      - allow: [10.0.0.0/8, 127.0.0.1/32]\n      - deny: [192.168.0.0/16]\n",
        ),
    ]
    .concat();
    let gw = TestGateway::start(&config(&[("app", &[echo.addr()])], &streams)).await;
    assert_eq!(exchange(gw.stream_addr("deny"), b"hi").await, b"");
    assert_eq!(exchange(gw.stream_addr("allow-other"), b"hi").await, b"");
    assert_eq!(exchange(gw.stream_addr("allow-me"), b"hi").await, b"hi");
    assert_eq!(gw.stream_stats("deny").filter_denials, 1);
    assert_eq!(gw.stream_stats("allow-other").filter_denials, 1);
    assert_eq!(gw.stream_stats("allow-me").filter_denials, 0);
    // Refused connections never reach the upstream.
    assert_eq!(echo.connections(), 1);
}

#[tokio::test]
async fn connection_rate_per_client() {
    let echo = TcpBackend::start(Mode::Echo, false).await;
    let streams = stream(
        "s",
        "      - connection_rate: { connections: 2, per: 1m, burst: 1 }\n",
    );
    let gw = TestGateway::start(&config(&[("app", &[echo.addr()])], &streams)).await;
    let addr = gw.stream_addr("s");
    for _ in 0..3 {
        assert_eq!(exchange(addr, b"ok").await, b"ok");
    }
    assert_eq!(exchange(addr, b"over").await, b"");
    assert_eq!(gw.stream_stats("s").filter_denials, 1);
    assert_eq!(echo.connections(), 3);
}
