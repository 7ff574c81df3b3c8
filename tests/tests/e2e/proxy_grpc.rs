//! gRPC through the reverse proxy: unary, server streaming, bidirectional streaming and an
//! error status, over h2c end to end and over TLS on both legs. `grpc-status` travels in
//! trailers, so these prove trailers survive the proxy.

use bytes::Bytes;
use futures_util::StreamExt;
use gateway_tests::backend::grpc::{
    self, BIDI, Channel, EchoReply, EchoRequest, FAIL, GrpcBackend, SERVER_STREAM, UNARY,
};
use gateway_tests::{TestCa, TestGateway};
use http::uri::PathAndQuery;
use http_body_util::BodyExt;

use super::proxy::yaml;

fn req(message: &str, count: u32) -> EchoRequest {
    EchoRequest {
        message: message.into(),
        count,
    }
}

async fn exercise(channel: Channel, origin: &str, backend: &str) {
    let mut client = channel.client(origin);

    client.ready().await.unwrap();
    let reply: EchoReply = client
        .unary(
            tonic::Request::new(req("hi", 0)),
            PathAndQuery::from_static(UNARY),
            grpc::codec(),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (reply.message.as_str(), reply.backend.as_str()),
        ("hi", backend)
    );

    client.ready().await.unwrap();
    let mut stream = client
        .server_streaming(
            tonic::Request::new(req("tick", 50)),
            PathAndQuery::from_static(SERVER_STREAM),
            grpc::codec(),
        )
        .await
        .unwrap()
        .into_inner();
    let mut n = 0;
    while let Some(reply) = stream.message().await.unwrap() {
        assert_eq!(reply.message, format!("tick {n}"));
        n += 1;
    }
    assert_eq!(n, 50);

    client.ready().await.unwrap();
    let outbound = futures_util::stream::iter((0..20).map(|i| req(&format!("m{i}"), 0)));
    let mut replies = client
        .streaming(
            tonic::Request::new(outbound),
            PathAndQuery::from_static(BIDI),
            grpc::codec(),
        )
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(r) = replies.next().await {
        got.push(r.unwrap().message);
    }
    assert_eq!(got, (0..20).map(|i| format!("m{i}")).collect::<Vec<_>>());

    client.ready().await.unwrap();
    let status = client
        .unary(
            tonic::Request::new(req("x", 0)),
            PathAndQuery::from_static(FAIL),
            grpc::codec(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert_eq!(status.message(), "no such echo");
}

#[tokio::test]
async fn grpc_over_h2c() {
    let backend = GrpcBackend::start("g1").await;
    let gw = TestGateway::start(&yaml(
        &format!("    targets: [{}]\n    protocol: h2c", backend.addr()),
        "",
    ))
    .await;
    let origin = format!("http://{}", gw.addr("main"));
    exercise(Channel::h2c(gw.addr("main")).await, &origin, "g1").await;

    // The trailers themselves, as a raw HTTP/2 client sees them.
    let mut frame = vec![0u8];
    let msg = prost::Message::encode_to_vec(&req("raw", 0));
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    let tcp = tokio::net::TcpStream::connect(gw.addr("main"))
        .await
        .unwrap();
    let (mut tx, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let request = http::Request::post(format!("{origin}{UNARY}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(Bytes::from(frame)))
        .unwrap();
    let res = tx.send_request(request).await.unwrap();
    assert_eq!(res.headers()["content-type"], "application/grpc");
    let collected = res.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
}

#[tokio::test]
async fn grpc_over_tls_both_ways() {
    let ca = TestCa::new();
    let backend = GrpcBackend::start_tls("g2", &ca).await;
    let dir = gateway_tests::temp_dir();
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    ca.write(
        dir.path(),
        "gw",
        &["gw.test"],
        gateway_tests::KeyKind::Ecdsa,
    );
    let config = format!(
        r#"
certificates:
  gw: {{ cert: gw.pem, key: gw.key }}
listeners:
  - name: main
    bind: 127.0.0.1:0
    protocols: [http1, http2]
    tls: {{ certificates: [gw] }}
upstreams:
  app:
    targets: [{}]
    protocol: http2
    tls: {{ ca: ca.pem, server_name: localhost }}
routes:
  - match: {{ path_prefix: / }}
    proxy: {{ upstream: app }}
"#,
        backend.addr()
    );
    let gw = TestGateway::start_in(dir, &config).await;
    let tls = gateway_tests::tls_connect(gw.addr("main"), "gw.test", ca.client_config(&[b"h2"]))
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let origin = format!("https://gw.test:{}", gw.addr("main").port());
    exercise(Channel::handshake(tls).await, &origin, "g2").await;
}
