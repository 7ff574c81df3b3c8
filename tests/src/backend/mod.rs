//! Backends for the proxy tests, all on 127.0.0.1:0 in this process:
//!
//! * [`Backend`]: a hyper server (HTTP/1.1 and h2c, or TLS with ALPN) that records what it
//!   receives and answers by path: `/healthz`, `/slow/MS`, `/slow-body/MS` (the head at once,
//!   the body after MS), `/status/CODE`, `/download/BYTES`,
//!   `/upload`, `/hop`, `/trailers`, anything else with its name. It can be stopped (the port
//!   then refuses) and started again on the same port.
//! * [`WsEcho`]: a WebSocket echo server (tokio-tungstenite).
//! * [`l4`]: TCP, TLS and UDP backends for the stream (L4) tests.
//! * [`grpc`]: an echo gRPC service (tonic + prost, no protoc) and a client over any
//!   HTTP/2 connection.

pub mod grpc;
pub mod l4;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Body type of the test backends.
pub type TestBody = BoxBody<Bytes, std::io::Error>;

/// A request as a backend saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: Method,
    /// Request target as received (origin-form for HTTP/1.1, absolute for HTTP/2).
    pub uri: http::Uri,
    /// Protocol version.
    pub version: Version,
    /// Headers.
    pub headers: HeaderMap,
}

impl Seen {
    /// A header as str ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

struct State {
    name: String,
    requests: AtomicUsize,
    health_checks: AtomicUsize,
    healthy: AtomicBool,
    seen: Mutex<Vec<Seen>>,
}

/// An HTTP backend.
pub struct Backend {
    state: Arc<State>,
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    task: Option<JoinHandle<()>>,
}

impl Backend {
    /// Starts a cleartext backend (HTTP/1.1 and h2c) called `name`.
    pub async fn start(name: &str) -> Self {
        Self::launch(name, "127.0.0.1:0".parse().expect("addr"), None).await
    }

    /// Starts a cleartext backend called `name` on `addr` (an IPv4 or IPv6 address, port 0
    /// for any free one).
    pub async fn start_on(name: &str, addr: SocketAddr) -> Self {
        Self::launch(name, addr, None).await
    }

    /// Starts a TLS backend offering `h2` and `http/1.1`, with a certificate for `localhost`
    /// and 127.0.0.1 from `ca`.
    pub async fn start_tls(name: &str, ca: &crate::TestCa) -> Self {
        let acceptor = tls_acceptor(ca);
        Self::launch(name, "127.0.0.1:0".parse().expect("addr"), Some(acceptor)).await
    }

    /// Like [`Backend::start_tls`], and clients must present a certificate issued by `ca`.
    pub async fn start_mtls(name: &str, ca: &crate::TestCa) -> Self {
        let acceptor = tls_acceptor_with(ca, true);
        Self::launch(name, "127.0.0.1:0".parse().expect("addr"), Some(acceptor)).await
    }

    async fn launch(name: &str, addr: SocketAddr, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let state = Arc::new(State {
            name: name.to_owned(),
            requests: AtomicUsize::new(0),
            health_checks: AtomicUsize::new(0),
            healthy: AtomicBool::new(true),
            seen: Mutex::new(Vec::new()),
        });
        let mut b = Self {
            state,
            addr,
            tls,
            task: None,
        };
        b.serve().await;
        b
    }

    async fn serve(&mut self) {
        let listener = bind_reusable(self.addr).await;
        self.addr = listener.local_addr().expect("local addr");
        let (state, tls) = (self.state.clone(), self.tls.clone());
        self.task = Some(tokio::spawn(async move {
            // Dropping this set (when the task is aborted) aborts every connection.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let (state, tls) = (state.clone(), tls.clone());
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(state, req).await) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match tls {
                        None => {
                            let _ = builder
                                .serve_connection_with_upgrades(TokioIo::new(tcp), svc)
                                .await;
                        }
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(tcp).await {
                                let _ = builder
                                    .serve_connection_with_upgrades(TokioIo::new(tls), svc)
                                    .await;
                            }
                        }
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        }));
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The name it answers with.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// Requests served (health checks excluded).
    pub fn requests(&self) -> usize {
        self.state.requests.load(Relaxed)
    }

    /// `/healthz` requests served.
    pub fn health_checks(&self) -> usize {
        self.state.health_checks.load(Relaxed)
    }

    /// The last request seen (health checks excluded).
    pub fn last(&self) -> Option<Seen> {
        self.state.seen.lock().expect("lock").last().cloned()
    }

    /// Makes `/healthz` answer 200 (true) or 503 (false).
    pub fn set_healthy(&self, healthy: bool) {
        self.state.healthy.store(healthy, Relaxed);
    }

    /// Stops accepting and closes every connection: the port refuses from now on.
    pub async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Serves again on the same port after [`Backend::stop`].
    pub async fn restart(&mut self) {
        self.stop().await;
        self.serve().await;
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Binds with SO_REUSEADDR so a stopped backend's port can be bound again at once.
async fn bind_reusable(addr: SocketAddr) -> TcpListener {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .expect("socket");
    socket.set_reuseaddr(true).expect("reuseaddr");
    // A port just released may still be held for a moment by the aborted task's drop.
    for _ in 0..50 {
        if socket.bind(addr).is_ok() {
            return socket.listen(1024).expect("listen");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("cannot bind backend to {addr}");
}

fn tls_acceptor(ca: &crate::TestCa) -> tokio_rustls::TlsAcceptor {
    tls_acceptor_with(ca, false)
}

/// With `mutual`, clients must present a certificate issued by `ca`.
fn tls_acceptor_with(ca: &crate::TestCa, mutual: bool) -> tokio_rustls::TlsAcceptor {
    use rustls_pki_types::pem::PemObject;
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"], crate::KeyKind::Ecdsa);
    let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("cert");
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = if mutual {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der()).expect("root");
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("verifier");
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(chain, key).expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

fn full(body: impl Into<Bytes>) -> TestBody {
    Full::new(body.into()).map_err(|e| match e {}).boxed()
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<TestBody> {
    let path = req.uri().path().to_owned();
    if path.ends_with("/healthz") {
        state.health_checks.fetch_add(1, Relaxed);
        let ok = state.healthy.load(Relaxed);
        let mut res = Response::new(full(if ok { "ok" } else { "unhealthy" }));
        if !ok {
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        return res;
    }
    state.requests.fetch_add(1, Relaxed);
    state.seen.lock().expect("lock").push(Seen {
        method: req.method().clone(),
        uri: req.uri().clone(),
        version: req.version(),
        headers: req.headers().clone(),
    });
    let mut res = route(&state, &path, req).await;
    res.headers_mut().insert(
        "x-backend",
        http::HeaderValue::from_str(&state.name).expect("name"),
    );
    res
}

async fn route(state: &State, path: &str, req: Request<Incoming>) -> Response<TestBody> {
    let arg = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.parse::<u64>().ok())
    };
    if let Some(ms) = arg("/slow/") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return Response::new(full("slow"));
    }
    if let Some(ms) = arg("/slow-body/") {
        let body = futures_util::stream::once(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"slow body")))
        });
        return Response::new(BodyExt::boxed(StreamBody::new(body)));
    }
    if let Some(code) = arg("/status/") {
        let mut res = Response::new(full(format!("status {code}")));
        *res.status_mut() = StatusCode::from_u16(code as u16).expect("status");
        return res;
    }
    if let Some(bytes) = arg("/download/") {
        return download(bytes);
    }
    match path {
        "/upload" => {
            let mut body = req.into_body();
            let mut total = 0u64;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => total += f.data_ref().map_or(0, |d| d.len() as u64),
                    Err(_) => break,
                }
            }
            Response::new(full(total.to_string()))
        }
        "/hop" => Response::builder()
            .header("connection", "x-hop-named")
            .header("x-hop-named", "1")
            .header("keep-alive", "timeout=5")
            .header("proxy-authenticate", "Basic")
            .header("x-end-to-end", "1")
            .body(full("hop"))
            .expect("response"),
        "/trailers" => {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-checksum", "abc".parse().expect("value"));
            let frames = futures_util::stream::iter([
                Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"data"))),
                Ok(Frame::trailers(trailers)),
            ]);
            Response::new(BodyExt::boxed(StreamBody::new(frames)))
        }
        _ => Response::new(full(state.name.clone())),
    }
}

/// `bytes` of a repeating pattern in 64 KiB chunks, produced as the client reads.
fn download(bytes: u64) -> Response<TestBody> {
    const CHUNK: usize = 64 * 1024;
    let chunk = Bytes::from((0..CHUNK).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let stream = futures_util::stream::unfold(bytes, move |left| {
        let chunk = chunk.clone();
        async move {
            if left == 0 {
                return None;
            }
            let n = left.min(CHUNK as u64) as usize;
            Some((Ok(Frame::data(chunk.slice(..n))), left - n as u64))
        }
    });
    let mut res = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    res.headers_mut()
        .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(bytes));
    res
}

/// A WebSocket echo server: every text or binary message comes back unchanged.
pub struct WsEcho {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl WsEcho {
    /// Starts the server.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("addr")).await
    }

    /// Starts the server on `addr` (port 0 for any).
    pub async fn start_on(addr: SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                        return;
                    };
                    while let Some(Ok(msg)) = ws.next().await {
                        if msg.is_text() || msg.is_binary() {
                            if futures_util::SinkExt::send(&mut ws, msg).await.is_err() {
                                return;
                            }
                        } else if msg.is_close() {
                            return;
                        }
                    }
                });
            }
        });
        Self { addr, task }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for WsEcho {
    fn drop(&mut self) {
        self.task.abort();
    }
}
