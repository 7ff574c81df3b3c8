//! Test harness for end-to-end tests: the real gateway started in-process from YAML on
//! 127.0.0.1:0 ports, real HTTP/1.1, h2c and TLS clients, raw sockets for malformed input, and
//! certificates generated per test.

pub mod backend;
pub mod h3;
pub mod kube;
pub mod otlp;
pub mod pebble;
pub mod ports;
pub mod redis;
pub mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub use tls::{KeyKind, TestCa};

/// A gateway running in this process, with its config directory.
pub struct TestGateway {
    gateway: Option<gateway::Gateway>,
    dir: tempfile::TempDir,
}

impl TestGateway {
    /// Writes `yaml` as `gateway.yaml` into a fresh temp dir and starts the gateway on it.
    pub async fn start(yaml: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::start_in(dir, yaml).await
    }

    /// Like [`TestGateway::start`] in a prepared directory (certificates, files, plugins).
    pub async fn start_in(dir: tempfile::TempDir, yaml: &str) -> Self {
        Self::try_start_in(dir, yaml)
            .await
            .unwrap_or_else(|e| panic!("gateway failed to start: {e}"))
    }

    /// Starts, returning the error instead of panicking.
    pub async fn try_start_in(dir: tempfile::TempDir, yaml: &str) -> Result<Self, String> {
        let path = dir.path().join("gateway.yaml");
        std::fs::write(&path, yaml).expect("write config");
        let config = gateway_config::load(&path).map_err(|e| e.to_string())?;
        let gateway = gateway::Gateway::start(config)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            gateway: Some(gateway),
            dir,
        })
    }

    /// The bound address of a listener.
    pub fn addr(&self, listener: &str) -> SocketAddr {
        self.gateway
            .as_ref()
            .and_then(|g| g.listener_addr(listener))
            .unwrap_or_else(|| panic!("no listener named {listener}"))
    }

    /// The bound address of an L4 stream.
    pub fn stream_addr(&self, stream: &str) -> SocketAddr {
        self.gateway
            .as_ref()
            .and_then(|g| g.stream_addr(stream))
            .unwrap_or_else(|| panic!("no stream named {stream}"))
    }

    /// A copy of an L4 stream's counters.
    pub fn stream_stats(&self, stream: &str) -> stream_proxy::StreamStatsSnapshot {
        self.gateway
            .as_ref()
            .and_then(|g| g.stream_stats(stream))
            .unwrap_or_else(|| panic!("no stream named {stream}"))
            .snapshot()
    }

    /// The config directory (relative paths in the YAML resolve here).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The running gateway.
    pub fn gateway(&self) -> &gateway::Gateway {
        self.gateway.as_ref().expect("running")
    }

    /// Drains and stops the gateway.
    pub async fn shutdown(mut self) {
        if let Some(g) = self.gateway.take() {
            g.shutdown().await;
        }
    }

    /// [`TestGateway::shutdown`], keeping the directory (to read what the gateway left in it).
    pub async fn shutdown_keeping_dir(mut self) -> tempfile::TempDir {
        if let Some(g) = self.gateway.take() {
            g.shutdown().await;
        }
        std::mem::replace(&mut self.dir, temp_dir())
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(g) = &self.gateway {
            g.shutdown_token().cancel();
        }
    }
}

/// A fresh temp dir to prepare files in before [`TestGateway::start_in`].
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// The head of a config whose routes are served on two listeners: `fast` with the HTTP/1.1 fast
/// path (the default) and `general` without it, with the admin port for their counters. A test
/// appends its own `upstreams:` and `routes:` and compares the two listeners' answers.
pub const FAST_AND_GENERAL_LISTENERS: &str = "\
admin: { bind: 127.0.0.1:0 }
server: { watch_config: false }
listeners:
  - name: fast
    bind: 127.0.0.1:0
  - name: general
    bind: 127.0.0.1:0
    http1_fast_path: false
";

/// A config file `g.yaml` in `dir` for the gateway binary run as its own process, whose
/// listener is to bind the port `yaml` is given: one from the reserved range ([`ports`]),
/// which no parallel test's outgoing connection can take before the gateway binds it.
pub fn binary_config(dir: &Path, yaml: impl FnOnce(u16) -> String) -> (u16, PathBuf) {
    let port = ports::reserved_port();
    (port, write_file(dir, "g.yaml", yaml(port)))
}

/// Writes `contents` to `dir/rel`, creating parent directories.
pub fn write_file(dir: &Path, rel: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(&path, contents).expect("write file");
    path
}

/// A collected response.
#[derive(Debug)]
pub struct TestResponse {
    /// Status, headers, version.
    pub head: http::response::Parts,
    /// The whole body.
    pub body: Bytes,
    /// Trailers, if any.
    pub trailers: Option<http::HeaderMap>,
}

impl TestResponse {
    /// Status code as u16.
    pub fn status(&self) -> u16 {
        self.head.status.as_u16()
    }

    /// A header as str ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.head
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The body as UTF-8 text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// A client on one connection (HTTP/1.1 keep-alive or HTTP/2).
pub struct Client {
    sender: Sender,
    authority: String,
    scheme: &'static str,
}

impl Client {
    /// GET `path`.
    pub async fn get(&mut self, path: &str) -> TestResponse {
        let req = Request::get(path)
            .body(Full::new(Bytes::new()))
            .expect("request");
        self.send(req).await.expect("request failed")
    }

    /// Sends a request; the URI may be a path (authority and scheme are filled in for HTTP/2,
    /// Host for HTTP/1.1 when absent).
    pub async fn send(
        &mut self,
        mut req: Request<Full<Bytes>>,
    ) -> Result<TestResponse, hyper::Error> {
        let res = match &mut self.sender {
            Sender::H1(s) => {
                if !req.headers().contains_key(http::header::HOST) {
                    let host = http::HeaderValue::from_str(&self.authority).expect("host");
                    req.headers_mut().insert(http::header::HOST, host);
                }
                s.ready().await?;
                s.send_request(req).await?
            }
            Sender::H2(s) => {
                if req.uri().authority().is_none() {
                    let uri = format!("{}://{}{}", self.scheme, self.authority, req.uri());
                    *req.uri_mut() = uri.parse().expect("uri");
                }
                s.ready().await?;
                s.send_request(req).await?
            }
        };
        collect(res).await
    }
}

async fn collect(res: Response<hyper::body::Incoming>) -> Result<TestResponse, hyper::Error> {
    let (head, body) = res.into_parts();
    let collected = body.collect().await?;
    let trailers = collected.trailers().cloned();
    Ok(TestResponse {
        head,
        body: collected.to_bytes(),
        trailers,
    })
}

async fn handshake_h1<IO>(io: IO, authority: String, scheme: &'static str) -> Client
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("h1 handshake");
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Client {
        sender: Sender::H1(sender),
        authority,
        scheme,
    }
}

async fn handshake_h2<IO>(io: IO, authority: String, scheme: &'static str) -> Client
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Client {
        sender: Sender::H2(sender),
        authority,
        scheme,
    }
}

/// An HTTP/1.1 keep-alive client connected to `addr`.
pub async fn http1(addr: SocketAddr) -> Client {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    handshake_h1(tcp, addr.to_string(), "http").await
}

/// An h2c (prior knowledge) client connected to `addr`.
pub async fn http2c(addr: SocketAddr) -> Client {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    handshake_h2(tcp, addr.to_string(), "http").await
}

/// An h2c (prior knowledge) client over `io`, a connection to `authority` already made.
pub async fn http2c_over<IO>(io: IO, authority: String) -> Client
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    handshake_h2(io, authority, "http").await
}

/// An HTTP/1.1 keep-alive client over `io`, a connection to `authority` already made.
pub async fn http1_over<IO>(io: IO, authority: String) -> Client
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    handshake_h1(io, authority, "http").await
}

/// A connection to `addr` from the loopback address `source` (any of 127.0.0.0/8), so that
/// tests can be several clients on one machine.
pub async fn connect_from(source: std::net::IpAddr, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(source, 0))
        .expect("bind source");
    socket.connect(addr).await.expect("connect")
}

/// A TLS client: ALPN offers `alpn` (e.g. `[b"h2", b"http/1.1"]`); HTTP/2 is used when the
/// server picks `h2`. Returns the client and the negotiated ALPN protocol.
pub async fn https(
    addr: SocketAddr,
    server_name: &str,
    ca: &TestCa,
    alpn: &[&[u8]],
) -> (Client, Option<Vec<u8>>) {
    let tls = tls_connect(addr, server_name, ca.client_config(alpn))
        .await
        .expect("TLS handshake");
    let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let authority = format!("{server_name}:{}", addr.port());
    let client = if negotiated.as_deref() == Some(b"h2") {
        handshake_h2(tls, authority, "https").await
    } else {
        handshake_h1(tls, authority, "https").await
    };
    (client, negotiated)
}

/// Connects and completes a TLS handshake with `config`.
pub async fn tls_connect(
    addr: SocketAddr,
    server_name: &str,
    config: rustls::ClientConfig,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// Sends raw bytes, half-closes nothing, and returns everything read until the server closes
/// or `timeout` passes without data.
pub async fn raw_with_timeout(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> String {
    String::from_utf8_lossy(&raw_bytes_with_timeout(addr, bytes, timeout).await).into_owned()
}

/// [`raw_with_timeout`] for binary answers.
pub async fn raw_bytes_with_timeout(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(timeout, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

/// `gateway_http1_fast_path_requests_total` of `listener`, read from the admin endpoint.
pub async fn fast_path_count(gw: &TestGateway, listener: &str) -> u64 {
    let series = format!("gateway_http1_fast_path_requests_total{{listener=\"{listener}\"}}");
    counter_value(gw, &series).await
}

/// `gateway_http1_fast_path_chain_requests_total` of `listener`: the fast path's requests
/// served through the route's filter chain and terminal rather than from prepared answers.
pub async fn fast_path_chain_count(gw: &TestGateway, listener: &str) -> u64 {
    let series = format!("gateway_http1_fast_path_chain_requests_total{{listener=\"{listener}\"}}");
    counter_value(gw, &series).await
}

/// The value of one counter series (`name{labels}`, as `/metrics` writes it) from the admin
/// endpoint; 0 when the series is not there yet.
pub async fn counter_value(gw: &TestGateway, series: &str) -> u64 {
    let (_, text) = admin_request(gw, "GET", "/metrics", "").await;
    let series = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.trim().parse().expect("count"))
}

/// The admin API's request head for `method path`, with the admin listener's address as
/// `Host` (the admin API refuses other hosts) and `extra` header lines (each ending in CRLF).
pub fn admin_head(gw: &TestGateway, method: &str, path: &str, extra: &str) -> String {
    let addr = gw.gateway().admin_addr().expect("admin");
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n{extra}Connection: close\r\n\r\n"
    )
}

/// Sends [`admin_head`] to the admin API; the status and the body of its answer.
pub async fn admin_request(
    gw: &TestGateway,
    method: &str,
    path: &str,
    extra: &str,
) -> (u16, String) {
    let addr = gw.gateway().admin_addr().expect("admin");
    let out = raw(addr, admin_head(gw, method, path, extra).as_bytes()).await;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (raw_status(&out), body)
}

/// An upstream on 127.0.0.1 that reads one request on every connection and answers it with
/// `answer` (raw bytes, whatever they are), then closes it.
pub async fn raw_target(answer: &'static [u8]) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(answer).await;
            });
        }
    });
    addr
}

/// An address on 127.0.0.1 where every connect is refused, for the test process's whole life.
///
/// The port is held by a socket that is bound but never listens: the kernel answers a SYN to it
/// with a reset, and no other test's `bind(":0")` can be given the port. (A listener bound and
/// dropped at once hands its port back to the pool, and a test running beside it was once given
/// it: the "dead" target then answered.)
pub fn refusing_addr() -> SocketAddr {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    let addr = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("bound address");
    // Held until the process ends, so the port is never handed to anyone else.
    std::mem::forget(socket);
    addr
}

/// A raw HTTP/1.1 response as (status line, fields without `Date` with names in lower case,
/// sorted, body): two answers compare equal when they differ only in field order, name case
/// and the second `Date` was written in.
pub fn normalized_response(raw: &str) -> (String, Vec<String>, String) {
    let (head, body) = raw.split_once("\r\n\r\n").expect("a whole response");
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_string();
    let mut fields: Vec<String> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').expect("a field");
            format!("{}: {}", n.to_ascii_lowercase(), v.trim())
        })
        .filter(|l| !l.starts_with("date:"))
        .collect();
    fields.sort();
    (status, fields, body.to_string())
}

/// [`raw_with_timeout`] with a 2 s quiet timeout.
pub async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    raw_with_timeout(addr, bytes, Duration::from_secs(2)).await
}

/// The status code of the first response in raw HTTP/1.1 text (0 if none).
pub fn raw_status(response: &str) -> u16 {
    response
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Resident and peak memory of this process in KiB (VmRSS, VmHWM).
pub fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A child process (a gateway binary the test runs, say) killed and reaped when the test ends,
/// passed or not.
pub struct Running(pub std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `gateway` binary built next to the test executable (`cargo build -p gateway` first).
pub fn gateway_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/debug/deps/e2e-xxxx -> target/debug/gateway
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    dir.join("gateway")
}
