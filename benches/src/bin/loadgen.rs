//! A minimal closed-loop HTTP/1.1 load generator for `scripts/soak.sh` on machines without wrk
//! or h2load: `loadgen URL CONNECTIONS SECONDS`. Each connection sends GETs back to back on one
//! kept-alive connection (reconnecting if it drops) and the totals are printed at the end:
//! requests, 2xx, other statuses, errors, requests per second.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

#[derive(Default)]
struct Totals {
    ok: AtomicU64,
    other: AtomicU64,
    errors: AtomicU64,
}

async fn worker(uri: hyper::Uri, until: Instant, totals: Arc<Totals>) {
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    while Instant::now() < until {
        let Ok(tcp) = TcpStream::connect(&authority).await else {
            totals.errors.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await
        else {
            totals.errors.fetch_add(1, Relaxed);
            continue;
        };
        tokio::spawn(conn);
        while Instant::now() < until {
            let req = hyper::Request::get(path.as_str())
                .header("host", authority.as_str())
                .body(Empty::<Bytes>::new())
                .expect("request");
            let done = async {
                let res = sender.send_request(req).await?;
                let status = res.status();
                res.into_body().collect().await?;
                Ok::<_, hyper::Error>(status)
            };
            match done.await {
                Ok(s) if s.is_success() => totals.ok.fetch_add(1, Relaxed),
                Ok(_) => totals.other.fetch_add(1, Relaxed),
                Err(_) => {
                    totals.errors.fetch_add(1, Relaxed);
                    break;
                }
            };
        }
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: loadgen URL CONNECTIONS SECONDS");
        std::process::exit(2);
    }
    let uri: hyper::Uri = args[1].parse().expect("URL");
    let connections: usize = args[2].parse().expect("CONNECTIONS");
    let seconds: u64 = args[3].parse().expect("SECONDS");
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let totals = Arc::new(Totals::default());
    let tasks: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(worker(uri.clone(), until, totals.clone())))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (ok, other, errors) = (
        totals.ok.load(Relaxed),
        totals.other.load(Relaxed),
        totals.errors.load(Relaxed),
    );
    println!(
        "requests: {}, ok, {ok} 2xx, {other} other statuses, errored {errors}, {:.0} requests/s over {elapsed:.1}s",
        ok + other,
        (ok + other) as f64 / elapsed
    );
    if other > 0 {
        println!("Non-2xx responses: {other}");
    }
}
