//! An HTTP/3 test client (quinn + h3 + h3-quinn) trusting a [`TestCa`], with 0-RTT resumption
//! for the early-data tests, and a UDP relay that can go silent to play a client that vanishes
//! without closing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Buf, Bytes};
use h3::client::{RequestStream, SendRequest};
use http::Request;

use crate::{TestCa, TestResponse};

/// The open h3 request streams of a client.
pub type Stream = RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

/// Errors of the test client, as text (tests only compare or print them).
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A QUIC client config trusting `ca`, offering ALPN `h3`, with early data allowed (used only
/// when a resumption ticket permits it). Reuse one config to resume sessions.
pub fn client_config(ca: &TestCa) -> quinn::ClientConfig {
    client_config_offering(ca, &[b"h3"])
}

/// A QUIC client config trusting `ca` and offering `alpn` (early data allowed, as above).
pub fn client_config_offering(ca: &TestCa, alpn: &[&[u8]]) -> quinn::ClientConfig {
    let mut tls = ca.client_config(alpn);
    tls.enable_early_data = true;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS config");
    quinn::ClientConfig::new(Arc::new(quic))
}

/// An HTTP/3 client on one QUIC connection.
pub struct H3Client {
    /// The QUIC connection (for stats, close, 0-RTT checks).
    pub conn: quinn::Connection,
    endpoint: quinn::Endpoint,
    send: SendRequest<h3_quinn::OpenStreams, Bytes>,
    authority: String,
    /// Whether requests went out as 0-RTT early data.
    pub early: bool,
}

/// Connects to `addr` with a fresh config trusting `ca`.
pub async fn connect(addr: SocketAddr, server_name: &str, ca: &TestCa) -> H3Client {
    connect_with(addr, server_name, &client_config(ca), false)
        .await
        .expect("HTTP/3 connect")
}

/// Connects with `config`. With `early`, sends requests as 0-RTT data when the config holds a
/// ticket that allows it (see [`H3Client::early`]); otherwise waits for the handshake.
pub async fn connect_with(
    addr: SocketAddr,
    server_name: &str,
    config: &quinn::ClientConfig,
    early: bool,
) -> Result<H3Client, Error> {
    let bind: SocketAddr = if addr.is_ipv6() {
        "[::1]:0"
    } else {
        "127.0.0.1:0"
    }
    .parse()?;
    let endpoint = quinn::Endpoint::client(bind)?;
    let connecting = endpoint.connect_with(config.clone(), addr, server_name)?;
    let (conn, used_early) = if early {
        match connecting.into_0rtt() {
            Ok((conn, _accepted)) => (conn, true),
            Err(connecting) => (connecting.await?, false),
        }
    } else {
        (connecting.await?, false)
    };
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    Ok(H3Client {
        conn,
        endpoint,
        send,
        authority: format!("{server_name}:{}", addr.port()),
        early: used_early,
    })
}

impl H3Client {
    /// GET `path`.
    pub async fn get(&self, path: &str) -> TestResponse {
        self.send(
            self.request("GET", path)
                .body(Bytes::new())
                .expect("request"),
        )
        .await
        .expect("HTTP/3 request failed")
    }

    /// GET `path`, returning the error instead of panicking.
    pub async fn get_result(&self, path: &str) -> Result<TestResponse, Error> {
        self.send(self.request("GET", path).body(Bytes::new())?)
            .await
    }

    /// A request builder for `path` on this connection's authority.
    pub fn request(&self, method: &str, path: &str) -> http::request::Builder {
        Request::builder()
            .method(method)
            .uri(format!("https://{}{path}", self.authority))
    }

    /// Sends a request with a body and collects the response.
    pub async fn send(&self, req: Request<Bytes>) -> Result<TestResponse, Error> {
        let (head, body) = req.into_parts();
        let mut stream = self.open(Request::from_parts(head, ())).await?;
        if !body.is_empty() {
            stream.send_data(body).await?;
        }
        stream.finish().await?;
        collect(stream).await
    }

    /// Sends a request head (no body) and returns the stream, to read the response as it comes.
    /// Several may be open at once: each call uses its own handle to the connection.
    pub async fn open(&self, req: Request<()>) -> Result<Stream, Error> {
        Ok(self.send.clone().send_request(req).await?)
    }

    /// Closes the connection cleanly (H3_NO_ERROR) and waits for the close to go out.
    pub async fn close(self) {
        self.conn.close(quinn::VarInt::from_u32(0x100), b"");
        self.endpoint.wait_idle().await;
    }
}

/// Reads a whole response from `stream`.
pub async fn collect(mut stream: Stream) -> Result<TestResponse, Error> {
    let res = stream.recv_response().await?;
    let mut body = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await? {
        while chunk.has_remaining() {
            let c = chunk.chunk();
            body.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    let trailers = stream.recv_trailers().await?;
    let (head, ()) = res.into_parts();
    Ok(TestResponse {
        head,
        body: Bytes::from(body),
        trailers,
    })
}

/// A UDP relay between clients and `upstream`, one socket per client so the upstream sees a
/// distinct peer. [`Relay::blackhole`] drops every datagram from then on: the client has
/// vanished as far as the server can tell, without a CONNECTION_CLOSE.
pub struct Relay {
    /// Where clients connect.
    pub addr: SocketAddr,
    silent: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Starts relaying to `upstream` (one client at a time).
    pub async fn start(upstream: SocketAddr) -> Relay {
        let front = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let back = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind");
        back.connect(upstream).await.expect("connect");
        let addr = front.local_addr().expect("addr");
        let silent = Arc::new(AtomicBool::new(false));
        let quiet = silent.clone();
        let task = tokio::spawn(async move {
            let (mut a, mut b) = (vec![0u8; 65536], vec![0u8; 65536]);
            let mut client: Option<SocketAddr> = None;
            loop {
                tokio::select! {
                    Ok((n, from)) = front.recv_from(&mut a) => {
                        client = Some(from);
                        if !quiet.load(Ordering::Relaxed) {
                            let _ = back.send(&a[..n]).await;
                        }
                    }
                    Ok(n) = back.recv(&mut b) => {
                        if let (Some(c), false) = (client, quiet.load(Ordering::Relaxed)) {
                            let _ = front.send_to(&b[..n], c).await;
                        }
                    }
                }
            }
        });
        Relay { addr, silent, task }
    }

    /// Drops everything from now on, both ways.
    pub fn blackhole(&self) {
        self.silent.store(true, Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
