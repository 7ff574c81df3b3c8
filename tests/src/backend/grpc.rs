//! An echo gRPC service for proxy tests, written without protoc: prost derives the messages
//! and this file holds the glue tonic-build would generate. Served by hyper (h2c or TLS) and
//! called through any HTTP/2 connection via [`Channel`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::{Stream, StreamExt};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::codegen::BoxFuture;
use tonic::{Request, Response, Status, Streaming};

/// Request message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoRequest {
    /// Text to echo.
    #[prost(string, tag = "1")]
    pub message: String,
    /// For server streaming: how many replies.
    #[prost(uint32, tag = "2")]
    pub count: u32,
}

/// Reply message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoReply {
    /// The echoed text.
    #[prost(string, tag = "1")]
    pub message: String,
    /// Which backend answered.
    #[prost(string, tag = "2")]
    pub backend: String,
}

/// Method paths.
pub const UNARY: &str = "/test.Echo/Unary";
/// Server streaming: `count` replies.
pub const SERVER_STREAM: &str = "/test.Echo/ServerStream";
/// Bidirectional: one reply per request message.
pub const BIDI: &str = "/test.Echo/Bidi";
/// Always fails with NOT_FOUND and a message.
pub const FAIL: &str = "/test.Echo/Fail";

type Codec = tonic_prost::ProstCodec<EchoReply, EchoRequest>;
type ReplyStream = Pin<Box<dyn Stream<Item = Result<EchoReply, Status>> + Send>>;

#[derive(Clone)]
struct Echo(Arc<str>);

impl tonic::server::UnaryService<EchoRequest> for Echo {
    type Response = EchoReply;
    type Future = BoxFuture<Response<EchoReply>, Status>;
    fn call(&mut self, req: Request<EchoRequest>) -> Self::Future {
        let backend = self.0.to_string();
        Box::pin(async move {
            Ok(Response::new(EchoReply {
                message: req.into_inner().message,
                backend,
            }))
        })
    }
}

struct Fail;

impl tonic::server::UnaryService<EchoRequest> for Fail {
    type Response = EchoReply;
    type Future = BoxFuture<Response<EchoReply>, Status>;
    fn call(&mut self, _req: Request<EchoRequest>) -> Self::Future {
        Box::pin(async { Err(Status::not_found("no such echo")) })
    }
}

impl tonic::server::ServerStreamingService<EchoRequest> for Echo {
    type Response = EchoReply;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<Response<ReplyStream>, Status>;
    fn call(&mut self, req: Request<EchoRequest>) -> Self::Future {
        let backend = self.0.to_string();
        Box::pin(async move {
            let req = req.into_inner();
            let replies = (0..req.count).map(move |i| {
                Ok(EchoReply {
                    message: format!("{} {i}", req.message),
                    backend: backend.clone(),
                })
            });
            Ok(Response::new(
                Box::pin(futures_util::stream::iter(replies)) as ReplyStream
            ))
        })
    }
}

impl tonic::server::StreamingService<EchoRequest> for Echo {
    type Response = EchoReply;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<Response<ReplyStream>, Status>;
    fn call(&mut self, req: Request<Streaming<EchoRequest>>) -> Self::Future {
        let backend = self.0.to_string();
        Box::pin(async move {
            let replies = req.into_inner().map(move |m| {
                m.map(|m| EchoReply {
                    message: m.message,
                    backend: backend.clone(),
                })
            });
            Ok(Response::new(Box::pin(replies) as ReplyStream))
        })
    }
}

async fn dispatch(echo: Echo, req: http::Request<Incoming>) -> http::Response<tonic::body::Body> {
    let mut grpc = tonic::server::Grpc::new(Codec::default());
    match req.uri().path() {
        UNARY => grpc.unary(echo, req).await,
        SERVER_STREAM => grpc.server_streaming(echo, req).await,
        BIDI => grpc.streaming(echo, req).await,
        FAIL => grpc.unary(Fail, req).await,
        _ => Status::unimplemented("no such method").into_http(),
    }
}

/// A gRPC echo server (HTTP/2 only: h2c, or TLS with ALPN h2).
pub struct GrpcBackend {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl GrpcBackend {
    /// Starts an h2c server called `name`.
    pub async fn start(name: &str) -> Self {
        Self::launch(name, None, "127.0.0.1:0".parse().expect("addr")).await
    }

    /// Starts an h2c server called `name` on `addr` (port 0 for any).
    pub async fn start_on(name: &str, addr: SocketAddr) -> Self {
        Self::launch(name, None, addr).await
    }

    /// Starts a TLS server called `name` with a certificate for localhost from `ca`.
    pub async fn start_tls(name: &str, ca: &crate::TestCa) -> Self {
        let any = "127.0.0.1:0".parse().expect("addr");
        Self::launch(name, Some(super::tls_acceptor(ca)), any).await
    }

    async fn launch(name: &str, tls: Option<tokio_rustls::TlsAcceptor>, addr: SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let echo = Echo(Arc::from(name));
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (echo, tls) = (echo.clone(), tls.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let echo = echo.clone();
                        async move { Ok::<_, Infallible>(dispatch(echo, req).await) }
                    });
                    let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    match tls {
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                        }
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(tcp).await {
                                let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
                            }
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

impl Drop for GrpcBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A tonic client transport over one hyper HTTP/2 connection (h2c or TLS).
#[derive(Clone)]
pub struct Channel(http2::SendRequest<tonic::body::Body>);

impl Channel {
    /// HTTP/2 handshake on an established connection.
    pub async fn handshake<IO>(io: IO) -> Self
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("h2 handshake");
        tokio::spawn(conn);
        Self(tx)
    }

    /// An h2c connection to `addr`.
    pub async fn h2c(addr: SocketAddr) -> Self {
        Self::handshake(tokio::net::TcpStream::connect(addr).await.expect("connect")).await
    }

    /// A tonic client whose requests go to `origin` (e.g. `http://127.0.0.1:8080`).
    pub fn client(&self, origin: &str) -> tonic::client::Grpc<Self> {
        tonic::client::Grpc::with_origin(self.clone(), origin.parse().expect("origin"))
    }
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Channel {
    type Response = http::Response<Incoming>;
    type Error = hyper::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

/// The codec for client calls.
pub fn codec() -> tonic_prost::ProstCodec<EchoRequest, EchoReply> {
    tonic_prost::ProstCodec::default()
}
