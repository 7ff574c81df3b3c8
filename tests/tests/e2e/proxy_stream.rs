//! Large bodies stream through the proxy without being buffered: 1 GiB down and 1 GiB up, with
//! this process's resident memory (gateway, backend and client all live here) sampled all
//! along and bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::{TestGateway, rss_kib};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper_util::rt::TokioIo;

use super::proxy::yaml;

const GIB: u64 = 1 << 30;
/// Allowed growth of resident memory over the baseline, in KiB.
const MAX_GROWTH_KIB: u64 = 200 * 1024;

/// Samples VmRSS every 20 ms until dropped; keeps the peak.
struct RssWatch {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssWatch {
    fn start() -> Self {
        let peak = Arc::new(AtomicU64::new(rss_kib().0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Relaxed) {
                p.fetch_max(rss_kib().0, Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self { peak, stop }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }
}

impl Drop for RssWatch {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_each_way_with_bounded_memory() {
    let b = Backend::start("big").await;
    let gw = TestGateway::start(&yaml(
        &format!("    targets: [{}]\n    timeout: 10m", b.addr()),
        "",
    ))
    .await;
    let tcp = tokio::net::TcpStream::connect(gw.addr("main"))
        .await
        .unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);

    // Warm up pools and allocator before the baseline.
    let warm = http::Request::get("/download/1048576")
        .header("host", "big")
        .body(
            http_body_util::Empty::<Bytes>::new()
                .map_err(|e| match e {})
                .boxed(),
        )
        .unwrap();
    let res = tx.send_request(warm).await.unwrap();
    res.into_body().collect().await.unwrap();
    let baseline = rss_kib().0;
    let watch = RssWatch::start();

    // Download.
    tx.ready().await.unwrap();
    let down = http::Request::get(format!("/download/{GIB}"))
        .header("host", "big")
        .body(
            http_body_util::Empty::<Bytes>::new()
                .map_err(|e| match e {})
                .boxed(),
        )
        .unwrap();
    let res = tx.send_request(down).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    let mut received = 0u64;
    while let Some(frame) = body.frame().await {
        received += frame.unwrap().data_ref().map_or(0, |d| d.len() as u64);
    }
    assert_eq!(received, GIB);

    // Upload, produced as hyper asks for it.
    tx.ready().await.unwrap();
    let chunk = Bytes::from(vec![7u8; 256 * 1024]);
    let frames = futures_util::stream::iter(
        (0..GIB / chunk.len() as u64)
            .map(move |_| Ok::<_, std::io::Error>(Frame::data(chunk.clone()))),
    );
    let up = http::Request::post("/upload")
        .header("host", "big")
        .header("content-length", GIB)
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .unwrap();
    let res = tx.send_request(up).await.unwrap();
    assert_eq!(res.status(), 200);
    let text = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(text, GIB.to_string().as_bytes());

    let growth = watch.peak().saturating_sub(baseline);
    assert!(
        growth < MAX_GROWTH_KIB,
        "resident memory grew by {growth} KiB while moving 2 GiB"
    );
}
