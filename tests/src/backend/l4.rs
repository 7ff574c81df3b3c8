//! Backends for the L4 stream tests, all on 127.0.0.1:0 in this process:
//!
//! * [`TcpBackend`]: echoes (or, in `drain` mode, reads to EOF then answers with the byte count
//!   and SHA-256 of what it got, which proves half-close end to end). It can expect a PROXY
//!   protocol header first and records what it said.
//! * [`TlsTag`]: a TLS server (rustls) for given names that writes its tag after the handshake.
//! * [`UdpEcho`]: echoes datagrams and records the source addresses it saw.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use sha2::{Digest, Sha256};
use stream_proxy::proxy_protocol::{self, ProxyHeader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

/// What a [`TcpBackend`] does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Write back everything read; shut down the write side after the client's FIN.
    Echo,
    /// Read until the client's FIN, then write `"<bytes> <sha256 hex>\n"` and close.
    Drain,
    /// Write `tag\n` at once, then echo.
    Tag,
    /// Write `hello\n` and shut down the write side at once, then read until the client's FIN
    /// and record how much arrived (see [`TcpBackend::received`]).
    Greet,
}

#[derive(Default)]
struct TcpState {
    connections: AtomicUsize,
    headers: Mutex<Vec<ProxyHeader>>,
    received: Mutex<Vec<u64>>,
}

/// A TCP test backend.
pub struct TcpBackend {
    addr: SocketAddr,
    state: Arc<TcpState>,
    task: JoinHandle<()>,
}

impl TcpBackend {
    /// Starts a backend in `mode`; with `proxy_protocol` every connection must start with a
    /// PROXY header (recorded), else it is closed.
    pub async fn start(mode: Mode, proxy_protocol: bool) -> Self {
        Self::start_tagged(mode, proxy_protocol, "").await
    }

    /// Starts a [`Mode::Tag`] backend writing `tag`.
    pub async fn tag(tag: &str) -> Self {
        Self::start_tagged(Mode::Tag, false, tag).await
    }

    /// Starts a [`Mode::Tag`] backend writing `tag`, on `addr` (port 0 for any).
    pub async fn tag_on(tag: &str, addr: SocketAddr) -> Self {
        Self::start_on(Mode::Tag, false, tag, addr).await
    }

    async fn start_tagged(mode: Mode, proxy_protocol: bool, tag: &str) -> Self {
        let any = "127.0.0.1:0".parse().expect("addr");
        Self::start_on(mode, proxy_protocol, tag, any).await
    }

    async fn start_on(mode: Mode, proxy_protocol: bool, tag: &str, addr: SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(TcpState::default());
        let (st, tag) = (state.clone(), format!("{tag}\n"));
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                st.connections.fetch_add(1, Relaxed);
                let (st, tag) = (st.clone(), tag.clone());
                conns.spawn(async move {
                    let _ = serve_tcp(tcp, mode, proxy_protocol, &st, &tag).await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Self { addr, state, task }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Relaxed)
    }

    /// Bytes received by finished [`Mode::Greet`] connections.
    pub fn received(&self) -> Vec<u64> {
        self.state.received.lock().expect("lock").clone()
    }

    /// PROXY headers received, in order.
    pub fn headers(&self) -> Vec<ProxyHeader> {
        self.state.headers.lock().expect("lock").clone()
    }
}

impl Drop for TcpBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_tcp(
    mut tcp: TcpStream,
    mode: Mode,
    proxy_protocol: bool,
    state: &TcpState,
    tag: &str,
) -> std::io::Result<()> {
    let mut pending = BytesMut::new();
    if proxy_protocol {
        let timeout = std::time::Duration::from_secs(5);
        let header = proxy_protocol::read_header(&mut tcp, &mut pending, timeout)
            .await
            .map_err(std::io::Error::other)?;
        state.headers.lock().expect("lock").push(header);
    }
    let (mut r, mut w) = tcp.split();
    match mode {
        Mode::Echo | Mode::Tag => {
            if mode == Mode::Tag {
                w.write_all(tag.as_bytes()).await?;
            }
            w.write_all(&pending).await?;
            tokio::io::copy(&mut r, &mut w).await?;
            w.shutdown().await
        }
        Mode::Greet => {
            w.write_all(b"hello\n").await?;
            w.shutdown().await?;
            let (total, _) = read_all(&mut r, &pending).await?;
            state.received.lock().expect("lock").push(total);
            Ok(())
        }
        Mode::Drain => {
            let (total, hash) = read_all(&mut r, &pending).await?;
            w.write_all(format!("{total} {hash}\n").as_bytes()).await?;
            w.shutdown().await
        }
    }
}

/// Reads `r` to its end; returns the byte count and SHA-256 (hex) of `pending` and all of it.
async fn read_all(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    pending: &[u8],
) -> std::io::Result<(u64, String)> {
    let mut hash = Sha256::new();
    hash.update(pending);
    let mut total = pending.len() as u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok((total, hex(&hash.finalize())));
        }
        hash.update(&buf[..n]);
        total += n as u64;
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A TLS server for `names` that writes `tag` after the handshake and closes.
pub struct TlsTag {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TlsTag {
    /// Starts it with a certificate for `names` issued by `ca`.
    pub async fn start(ca: &crate::TestCa, names: &[&str], tag: &str) -> Self {
        Self::start_on(ca, names, tag, "127.0.0.1:0".parse().expect("addr")).await
    }

    /// [`TlsTag::start`] bound to `addr`.
    pub async fn start_on(ca: &crate::TestCa, names: &[&str], tag: &str, addr: SocketAddr) -> Self {
        use rustls_pki_types::pem::PemObject;
        let (cert, key) = ca.issue(names, crate::KeyKind::Ecdsa);
        let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("cert");
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let tag = format!("{tag}\n");
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, tag) = (acceptor.clone(), tag.clone());
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let _ = tls.write_all(tag.as_bytes()).await;
                        let _ = tls.shutdown().await;
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

impl Drop for TlsTag {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A UDP echo server.
pub struct UdpEcho {
    addr: SocketAddr,
    sources: Arc<Mutex<HashSet<SocketAddr>>>,
    datagrams: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl UdpEcho {
    /// Starts it.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("addr")).await
    }

    /// [`UdpEcho::start`] bound to `addr`.
    pub async fn start_on(addr: SocketAddr) -> Self {
        let socket = UdpSocket::bind(addr).await.expect("bind");
        // Many clients' 64 KiB datagrams at once overflow the default 208 KiB buffer.
        let _ = socket2::SockRef::from(&socket).set_recv_buffer_size(4 << 20);
        let addr = socket.local_addr().expect("addr");
        let sources = Arc::new(Mutex::new(HashSet::new()));
        let datagrams = Arc::new(AtomicUsize::new(0));
        let (s, d) = (sources.clone(), datagrams.clone());
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                s.lock().expect("lock").insert(from);
                d.fetch_add(1, Relaxed);
                let _ = socket.send_to(&buf[..n], from).await;
            }
        });
        Self {
            addr,
            sources,
            datagrams,
            task,
        }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Distinct source addresses seen (one per gateway session).
    pub fn sources(&self) -> usize {
        self.sources.lock().expect("lock").len()
    }

    /// Datagrams received.
    pub fn datagrams(&self) -> usize {
        self.datagrams.load(Relaxed)
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.task.abort();
    }
}
