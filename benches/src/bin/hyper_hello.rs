//! A bare hyper 1.x hello-world server: the floor of the side-by-side `hello` scenario.
//!
//! One thread (tokio `current_thread`), HTTP/1.1 only, keep-alive, `TCP_NODELAY`, and the same
//! response as every peer's synthetic hello (`200`, `text/plain`, `Hello, world!\n`). Nothing
//! else: no routing, no filters, no logging. A gateway that routes, filters and answers with
//! `respond` cannot beat this; the target is 0.9× of it.
//!
//! Usage: `hyper_hello [ADDR]` (default `127.0.0.1:8080`). Runs until killed.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue, SERVER};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const BODY: &[u8] = b"Hello, world!\n";

async fn hello(_req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut res = Response::new(Full::new(Bytes::from_static(BODY)));
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(SERVER, HeaderValue::from_static("hyper"));
    Ok(res)
}

fn main() -> std::io::Result<()> {
    let addr: SocketAddr = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("`{a}`: {e}"))
        })?,
        None => SocketAddr::from(([127, 0, 0, 1], 8080)),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(addr).await?;
        eprintln!("hyper_hello listening on {}", listener.local_addr()?);
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                // Out of file descriptors under a stress run: keep serving the open ones.
                Err(e) => {
                    eprintln!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(hello))
                    .await;
            });
        }
    })
}
