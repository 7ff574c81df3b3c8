//! WebSocket through the reverse proxy: an HTTP/1.1 Upgrade, and a WebSocket over HTTP/2
//! (extended CONNECT, RFC 8441) carried to an HTTP/1.1 upstream. And only the protocols a
//! route allows (`proxy.upgrades`, `[websocket]` by default): a request for another goes to
//! the backend without `Upgrade`, and a backend that switches anyway gets no tunnel.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use gateway_tests::TestGateway;
use gateway_tests::backend::WsEcho;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::proxy::{upstream, yaml};

/// The answer to a WebSocket opened over HTTP/2 (extended CONNECT to `/chat`) on `addr`.
async fn websocket_over_h2(addr: SocketAddr) -> http::Response<hyper::body::Incoming> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    // The server's SETTINGS (with ENABLE_CONNECT_PROTOCOL) arrive with the first exchange.
    let warm = http::Request::get(format!("http://{addr}/"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let _ = tx.send_request(warm).await;
    let mut req = http::Request::connect(format!("http://{addr}/chat"))
        .header("sec-websocket-version", "13")
        .body(Empty::<Bytes>::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    tx.send_request(req).await.unwrap()
}

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
    let mut res = websocket_over_h2(gw.addr("main")).await;
    assert_eq!(res.status(), 200);
    assert!(!res.headers().contains_key("sec-websocket-accept"));
    let io = hyper::upgrade::on(&mut res).await.unwrap();
    let mut ws =
        tokio_tungstenite::WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Client, None)
            .await;
    echo_round_trip(&mut ws).await;
}

/// A backend that answers the first request of every connection with `101 Switching
/// Protocols` to `foo`, asked or not, then echoes every byte; it records each request head.
async fn switching_backend() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let head = read_head(&mut tcp).await;
                seen.lock().unwrap().push(head);
                let switch = "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: foo\r\n\r\n";
                if tcp.write_all(switch.as_bytes()).await.is_err() {
                    return;
                }
                let (mut r, mut w) = tcp.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, heads)
}

/// Reads up to the end of a head (what follows it in the same read is kept in it).
async fn read_head(tcp: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Sends `upgrade` (the `Upgrade` value) on a new connection to `gw`'s `main`; the connection
/// and the head of the answer.
async fn ask_upgrade(gw: &TestGateway, upgrade: &str) -> (TcpStream, String) {
    let mut tcp = TcpStream::connect(gw.addr("main")).await.unwrap();
    let req = format!(
        "GET /tunnel HTTP/1.1\r\nHost: app\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: {upgrade}\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut tcp).await;
    (tcp, head)
}

#[tokio::test]
async fn an_upgrade_the_route_does_not_allow_reaches_the_backend_without_upgrade() {
    let (backend, heads) = switching_backend().await;
    let gw = TestGateway::start(&yaml(&format!("    targets: [{backend}]"), "")).await;
    for (i, upgrade) in ["h2c", "foo", "websocket, foo"].into_iter().enumerate() {
        let (_tcp, head) = ask_upgrade(&gw, upgrade).await;
        // The backend switched though nobody asked it to: that is a broken answer, not a
        // tunnel.
        assert!(head.starts_with("HTTP/1.1 502 "), "{upgrade}: {head}");
        let heads = heads.lock().unwrap();
        // A connection that switched is never used for another request.
        assert_eq!(heads.len(), i + 1, "{upgrade}: {heads:?}");
        let seen = heads[i].to_ascii_lowercase();
        assert!(seen.starts_with("get /tunnel "), "{seen}");
        assert!(!seen.contains("upgrade"), "{upgrade} was forwarded: {seen}");
        assert!(!seen.contains("http2-settings"), "{seen}");
    }
}

#[tokio::test]
async fn an_upgrade_listed_in_the_route_upgrades_is_tunnelled() {
    let (backend, heads) = switching_backend().await;
    let upstream = format!("    targets: [{backend}]");
    let gw = TestGateway::start(&yaml(&upstream, ", upgrades: [FOO]")).await;
    let (mut tcp, head) = ask_upgrade(&gw, "foo").await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    let seen = heads.lock().unwrap()[0].to_ascii_lowercase();
    assert!(seen.contains("\r\nupgrade: foo\r\n"), "{seen}");
    tcp.write_all(b"ping through the tunnel").await.unwrap();
    let mut back = [0u8; 23];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut back))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(&back, b"ping through the tunnel");
    // The list replaces the default: WebSocket and h2c are not allowed on this route.
    for upgrade in ["h2c", "websocket"] {
        let (_tcp, head) = ask_upgrade(&gw, upgrade).await;
        assert!(head.starts_with("HTTP/1.1 502 "), "{upgrade}: {head}");
    }
}

#[tokio::test]
async fn an_empty_upgrades_list_refuses_websocket_too() {
    let echo = WsEcho::start().await;
    let upstream = format!("    targets: [{}]", echo.addr());
    let gw = TestGateway::start(&yaml(&upstream, ", upgrades: []")).await;
    let tcp = TcpStream::connect(gw.addr("main")).await.unwrap();
    let url = format!("ws://{}/chat", gw.addr("main"));
    let refused = tokio_tungstenite::client_async(url, tcp).await;
    assert!(refused.is_err(), "a WebSocket opened through upgrades: []");

    // Nor over HTTP/2's extended CONNECT.
    let res = websocket_over_h2(gw.addr("main")).await;
    assert_eq!(res.status(), 405);
}
