//! Loopback throughput of the TCP relay, splice(2) against buffered copying, through the real
//! stream server: a client thread pushes N bytes through the proxy to a sink thread (both plain
//! blocking sockets, the same work in every round), rounds alternate between the two modes.
//!
//! ```text
//! cargo run --release -p stream-proxy --example relay_throughput -- [GiB per round] [rounds]
//! ```
//!
//! Prints MiB/s per round and the CPU time per GiB of the proxy's one worker thread (the
//! client and sink are other threads), which is the steadier figure on a busy machine.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stream_proxy::upstream::Targets;
use stream_proxy::{CompiledStreams, Resolver, StreamServer};
use tokio_util::sync::CancellationToken;

struct Upstreams(gateway_config::Config);

impl Resolver for Upstreams {
    fn targets(&self, upstream: &str) -> Option<Arc<Targets>> {
        self.0
            .upstreams
            .get(upstream)
            .map(|u| Arc::new(Targets::from_config(u)))
    }
}

/// A sink that reads everything and discards it; returns its address.
fn sink() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                let _ = conn.write_all(b"done");
            });
        }
    });
    addr
}

/// User plus system CPU time of thread `tid` of this process.
fn cpu(tid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    Duration::from_millis(f.iter().sum::<u64>() * 10)
}

/// The id of the calling thread (`/proc/thread-self` is `<pid>/task/<tid>`).
fn thread_id() -> String {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn push(proxy: SocketAddr, bytes: u64) {
    let mut conn = TcpStream::connect(proxy).expect("connect");
    let block = vec![0x5au8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        conn.write_all(&block[..n]).expect("write");
        left -= n as u64;
    }
    conn.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut done = Vec::new();
    conn.read_to_end(&mut done).expect("read");
    assert_eq!(done, b"done");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let gib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let bytes = gib << 30;
    let target = sink();
    let yaml = format!(
        "upstreams:\n  sink:\n    targets: [{target}]\nstreams:\n\
         \x20 - {{ name: splice, bind: 127.0.0.1:0, protocol: tcp, upstream: sink, zero_copy: true }}\n\
         \x20 - {{ name: buffered, bind: 127.0.0.1:0, protocol: tcp, upstream: sink, zero_copy: false }}\n"
    );
    let config =
        gateway_config::load_str(&yaml, "<bench>", std::path::Path::new(".")).expect("config");
    let worker = Arc::new(std::sync::Mutex::new(String::new()));
    let w = worker.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .on_thread_start(move || {
            let mut slot = w.lock().expect("lock");
            if slot.is_empty() {
                *slot = thread_id();
            }
        })
        .enable_all()
        .build()
        .expect("runtime");
    let shutdown = CancellationToken::new();
    let server = rt.block_on(async {
        let streams = CompiledStreams::build(&config, &Upstreams(config.clone())).expect("build");
        StreamServer::start(&streams, &shutdown).expect("start")
    });
    // The first thread started is the worker (blocking threads come later, if ever); its
    // start hook runs on the new thread, so wait for it.
    let tid = loop {
        let tid = worker.lock().expect("lock").clone();
        if !tid.is_empty() {
            break tid;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    println!("relay throughput, {gib} GiB per round, 1 proxy worker thread");
    let mut results: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for round in 0..rounds {
        for (m, mode) in ["splice", "buffered"].into_iter().enumerate() {
            let proxy = server.local_addr(mode).expect("stream");
            let (t0, c0) = (Instant::now(), cpu(&tid));
            push(proxy, bytes);
            let (took, cpu_used) = (t0.elapsed(), cpu(&tid) - c0);
            let mib_s = bytes as f64 / (1 << 20) as f64 / took.as_secs_f64();
            let cpu_per_gib = cpu_used.as_secs_f64() / gib as f64;
            println!(
                "round {round} {mode:>8}: {mib_s:8.0} MiB/s  {:6.2} s  cpu {cpu_per_gib:5.2} s/GiB",
                took.as_secs_f64()
            );
            results[m].0.push(mib_s);
            results[m].1.push(cpu_per_gib);
        }
    }
    for (m, mode) in ["splice", "buffered"].into_iter().enumerate() {
        let (tput, cpu) = &mut results[m];
        println!(
            "median {mode:>8}: {:8.0} MiB/s (best {:.0})  cpu {:5.2} s/GiB (best {:.2})",
            median(tput),
            tput.iter().cloned().fold(0.0, f64::max),
            median(cpu),
            cpu.iter().cloned().fold(f64::MAX, f64::min),
        );
    }
    shutdown.cancel();
}
