//! The stream server through its public API, with what only an embedder can supply: a
//! data-inspecting filter from the resolver (the shape a proxy-wasm network filter takes), and
//! reloads applied directly. Real sockets on 127.0.0.1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use stream_proxy::upstream::Targets;
use stream_proxy::{
    CloseSummary, CompiledStreams, ConnectionInfo, Decision, Resolver, StreamError, StreamFilter,
    StreamFilterFactory, StreamServer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

type Closed = Arc<Mutex<Vec<CloseSummary>>>;

/// Upper-cases client bytes, closes on `QUIT`, and keeps the close summaries.
struct Upper(Closed);

impl StreamFilterFactory for Upper {
    fn name(&self) -> &str {
        "upper"
    }
    fn create(&self) -> Box<dyn StreamFilter> {
        Box::new(Upper(self.0.clone()))
    }
    fn inspects_data(&self) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl StreamFilter for Upper {
    async fn on_downstream_data(&mut self, data: &mut BytesMut, eos: bool) -> Decision {
        if data.windows(4).any(|w| w == b"QUIT") {
            return Decision::Close;
        }
        data.make_ascii_uppercase();
        if eos {
            data.extend_from_slice(b"<eos>");
        }
        Decision::Continue
    }
    async fn on_close(&mut self, _: &ConnectionInfo, summary: &CloseSummary) {
        self.0.lock().unwrap().push(summary.clone());
    }
}

struct Env {
    config: gateway_config::Config,
    closed: Closed,
}

impl Resolver for Env {
    fn targets(&self, upstream: &str) -> Option<Arc<Targets>> {
        let u = self.config.upstreams.get(upstream)?;
        Some(Arc::new(Targets::from_config(u)))
    }
    fn plugin(&self, name: &str) -> Result<Arc<dyn StreamFilterFactory>, String> {
        match name {
            "upper" => Ok(Arc::new(Upper(self.closed.clone()))),
            _ => Err(format!("unknown plugin {name}")),
        }
    }
}

async fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = tcp.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

fn wasm_file() -> std::path::PathBuf {
    let path = std::env::temp_dir().join("stream-proxy-test-plugin.wasm");
    std::fs::write(&path, b"\0asm").unwrap();
    path
}

fn build(yaml: &str, closed: &Closed) -> Result<CompiledStreams, StreamError> {
    let yaml = format!(
        "plugins:\n  upper: {{ wasm: {} }}\n{yaml}",
        wasm_file().display()
    );
    let config = gateway_config::load_str(&yaml, "<test>", Path::new(".")).unwrap();
    let env = Env {
        config: config.clone(),
        closed: closed.clone(),
    };
    CompiledStreams::build(&config, &env)
}

fn tcp_streams(target: SocketAddr, streams: &[(&str, &str)]) -> String {
    let mut yaml = format!("upstreams:\n  app:\n    targets: [{target}]\nstreams:\n");
    for (name, extra) in streams {
        yaml.push_str(&format!(
            "  - {{ name: {name}, bind: 127.0.0.1:0, protocol: tcp, upstream: app{extra} }}\n"
        ));
    }
    yaml
}

async fn exchange(addr: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(payload).await.unwrap();
    tcp.shutdown().await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut out)).await;
    out
}

#[tokio::test]
async fn data_filters_see_both_directions_and_the_end_of_stream() {
    let closed = Closed::default();
    let yaml = tcp_streams(echo().await, &[("s", ", filters: [{ plugin: upper }]")]);
    let streams = build(&yaml, &closed).unwrap();
    let server = StreamServer::start(&streams, &CancellationToken::new()).unwrap();
    let addr = server.local_addr("s").unwrap();

    assert_eq!(exchange(addr, b"hello, ").await, b"HELLO, <eos>");
    // A filter's Close ends the connection; the filter still gets on_close.
    assert_eq!(exchange(addr, b"QUIT").await, b"");
    server.drain(Duration::from_secs(1)).await;

    let closed = closed.lock().unwrap();
    assert_eq!(closed.len(), 2);
    let (ok, quit) = match closed[0].error {
        None => (&closed[0], &closed[1]),
        Some(_) => (&closed[1], &closed[0]),
    };
    assert_eq!((ok.bytes_in, ok.bytes_out), (12, 12));
    assert!(ok.target.is_some() && ok.error.is_none());
    assert_eq!(quit.error.as_deref(), Some("closed by filter `upper`"));
    let stats = server.stats("s").unwrap().snapshot();
    assert_eq!((stats.filter_closes, stats.connections_accepted), (1, 2));
}

#[tokio::test]
async fn udp_streams_refuse_data_filters_and_unknown_plugins_are_located() {
    let closed = Closed::default();
    let yaml = "upstreams:\n  dns:\n    targets: [127.0.0.1:53]\nstreams:\n  - { name: u, bind: 127.0.0.1:0, protocol: udp, upstream: dns, filters: [{ plugin: upper }] }\n";
    match build(yaml, &closed) {
        Err(StreamError::Config { key, message }) => {
            assert_eq!(key, "streams[0].filters[0].plugin");
            assert!(message.contains("need TCP"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn reload_adds_keeps_and_drains_removed_streams() {
    let closed = Closed::default();
    let target = echo().await;
    let first = build(&tcp_streams(target, &[("keep", ""), ("gone", "")]), &closed).unwrap();
    let server = StreamServer::start(&first, &CancellationToken::new()).unwrap();
    let (keep, gone) = (
        server.local_addr("keep").unwrap(),
        server.local_addr("gone").unwrap(),
    );
    let mut open = TcpStream::connect(gone).await.unwrap();
    open.write_all(b"1").await.unwrap();
    let mut b = [0u8; 1];
    open.read_exact(&mut b).await.unwrap();

    let second = build(&tcp_streams(target, &[("keep", ""), ("new", "")]), &closed).unwrap();
    server.reload(&second, Duration::from_millis(500)).unwrap();
    assert_eq!(server.local_addr("keep"), Some(keep));
    assert!(server.local_addr("gone").is_none());
    assert_eq!(
        exchange(server.local_addr("new").unwrap(), b"n").await,
        b"n"
    );
    assert_eq!(exchange(keep, b"k").await, b"k");
    // The removed stream accepts no more, but its open connection lives until the drain
    // timeout.
    assert!(TcpStream::connect(gone).await.is_err());
    open.write_all(b"2").await.unwrap();
    open.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"2");
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(3), open.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "closed after the drain timeout");
    server.drain(Duration::from_secs(1)).await;
}
