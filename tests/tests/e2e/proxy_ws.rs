//! WebSocket through the reverse proxy: an HTTP/1.1 Upgrade, and a WebSocket over HTTP/2
//! (extended CONNECT, RFC 8441) carried to an HTTP/1.1 upstream.

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use gateway_tests::TestGateway;
use gateway_tests::backend::WsEcho;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::proxy::{upstream, yaml};

async fn echo_round_trip<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    for i in 0..5 {
        ws.send(Message::text(format!("hello {i}"))).await.unwrap();
        let back = ws.next().await.unwrap().unwrap();
        assert_eq!(back.into_text().unwrap().as_str(), format!("hello {i}"));
    }
    let blob: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    ws.send(Message::binary(blob.clone())).await.unwrap();
    let back = ws.next().await.unwrap().unwrap();
    assert_eq!(back.into_data().as_ref(), &blob[..]);
}

#[tokio::test]
async fn websocket_upgrade_over_http1() {
    let echo = WsEcho::start().await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{}]", echo.addr()), "")).await;
    let tcp = tokio::net::TcpStream::connect(gw.addr("main"))
        .await
        .unwrap();
    let url = format!("ws://{}/chat", gw.addr("main"));
    let (mut ws, res) = tokio_tungstenite::client_async(url, tcp).await.unwrap();
    assert_eq!(res.status(), 101);
    assert_eq!(res.headers()["via"], "1.1 gateway");
    echo_round_trip(&mut ws).await;
    // The target counts the tunnel as in flight until it closes.
    assert_eq!(upstream(&gw).targets.snapshot()[0].in_flight, 1);
    ws.close(None).await.unwrap();
    drop(ws);
    for _ in 0..50 {
        if upstream(&gw).targets.snapshot()[0].in_flight == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the tunnel was never released");
}

#[tokio::test]
async fn websocket_over_http2_extended_connect() {
    let echo = WsEcho::start().await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{}]", echo.addr()), "")).await;
    let tcp = tokio::net::TcpStream::connect(gw.addr("main"))
        .await
        .unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    // The server's SETTINGS (with ENABLE_CONNECT_PROTOCOL) arrive with the first exchange.
    let warm = http::Request::get(format!("http://{}/", gw.addr("main")))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let _ = tx.send_request(warm).await;

    let mut req = http::Request::connect(format!("http://{}/chat", gw.addr("main")))
        .header("sec-websocket-version", "13")
        .body(Empty::<Bytes>::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let mut res = tx.send_request(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(!res.headers().contains_key("sec-websocket-accept"));
    let io = hyper::upgrade::on(&mut res).await.unwrap();
    let mut ws =
        tokio_tungstenite::WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Client, None)
            .await;
    echo_round_trip(&mut ws).await;
}
