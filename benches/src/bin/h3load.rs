//! h3load: an HTTP/3 load generator with h2load's command line, for the benchmark harness.
//!
//! `h3load -c N -m M (-D SECONDS | -n REQUESTS) [--sni NAME] [--ca PEM] URL` opens N QUIC
//! connections, keeps M requests in flight on each (GET, whole body read), and measures only
//! once every connection is up. It prints h2load-style summary lines and then one JSON object:
//! `requests`, `rps`, `p50_ms`, `p99_ms`, `errors`, `non2xx`, `bytes`, `transfer_mib_s`.
//! Certificates are not verified unless `--ca` is given (benchmarks use self-signed ones).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use gateway_config::model::UpstreamTlsConfig;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// What the command line asked for.
struct Args {
    conns: usize,
    streams: usize,
    duration: Option<Duration>,
    requests: Option<u64>,
    sni: Option<String>,
    ca: Option<String>,
    url: http::Uri,
}

fn usage() -> Error {
    "usage: h3load -c CONNS -m STREAMS (-D SECONDS | -n REQUESTS) [--sni NAME] [--ca PEM] https://HOST:PORT/PATH".into()
}

/// Parses h2load-style flags (`-c10` or `-c 10`).
fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        conns: 1,
        streams: 1,
        duration: None,
        requests: None,
        sni: None,
        ca: None,
        url: http::Uri::default(),
    };
    let mut url = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.as_str() {
            "--sni" | "--ca" => (arg.clone(), None),
            a if a.starts_with('-') && a.len() > 2 => (a[..2].to_owned(), Some(a[2..].to_owned())),
            a if a.starts_with('-') => (a.to_owned(), None),
            _ => {
                url = Some(arg);
                continue;
            }
        };
        let mut value = || inline.clone().or_else(|| it.next()).ok_or_else(usage);
        match flag.as_str() {
            "-c" => args.conns = value()?.parse()?,
            "-m" => args.streams = value()?.parse()?,
            "-D" => args.duration = Some(Duration::from_secs_f64(value()?.parse()?)),
            "-n" => args.requests = Some(value()?.parse()?),
            "--sni" => args.sni = Some(value()?),
            "--ca" => args.ca = Some(value()?),
            // h2load's thread count: one thread here (pin the process with taskset).
            "-t" => {
                value()?;
            }
            _ => return Err(usage()),
        }
    }
    args.url = url.ok_or_else(usage)?.parse()?;
    if args.duration.is_none() && args.requests.is_none() {
        args.duration = Some(Duration::from_secs(10));
    }
    if args.conns == 0 || args.streams == 0 {
        return Err(usage());
    }
    Ok(args)
}

/// The QUIC client's TLS: the gateway's own upstream client config (ALPN `h3`), verifying
/// against `ca`, or accepting any certificate without one (load tests run against self-signed
/// ones; handshake signatures are still checked).
fn client_config(ca: Option<&str>) -> Result<quinn::ClientConfig, Error> {
    let upstream = UpstreamTlsConfig {
        ca: ca.map(std::path::PathBuf::from),
        insecure_skip_verify: ca.is_none(),
        ..UpstreamTlsConfig::default()
    };
    let tls = gateway::proxy::tls::client_config(&upstream, b"h3")
        .map_err(|(key, e)| format!("{key}: {e}"))?;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// Counters one request loop keeps; merged at the end.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    errors: u64,
    non2xx: u64,
    bytes: u64,
}

/// Sends GETs on `send` until the deadline or the shared request budget runs out.
async fn run_stream(
    conn: quinn::Connection,
    mut send: Sender,
    uri: http::Uri,
    deadline: Option<Instant>,
    budget: Arc<AtomicU64>,
) -> Tally {
    let mut t = Tally::default();
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        // The budget counts down from -n (u64::MAX with -D alone).
        if budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err()
        {
            break;
        }
        let start = Instant::now();
        match one_request(&mut send, &uri).await {
            Ok((status, bytes)) => {
                let us = start.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                t.latencies_us.push(us);
                t.bytes += bytes;
                if !status.is_success() {
                    t.non2xx += 1;
                }
            }
            Err(_) => {
                t.errors += 1;
                // A closed connection fails every request at once: stop instead of spinning.
                if conn.close_reason().is_some() {
                    break;
                }
            }
        }
    }
    t
}

async fn one_request(send: &mut Sender, uri: &http::Uri) -> Result<(http::StatusCode, u64), Error> {
    let req = http::Request::get(uri.clone()).body(())?;
    let mut stream = send.send_request(req).await?;
    stream.finish().await?;
    let res = stream.recv_response().await?;
    let mut bytes = 0u64;
    while let Some(chunk) = stream.recv_data().await? {
        bytes += chunk.remaining() as u64;
    }
    Ok((res.status(), bytes))
}

fn percentile(sorted: &[u32], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    Some(f64::from(sorted[i.min(sorted.len() - 1)]) / 1000.0)
}

async fn run(args: Args) -> Result<(), Error> {
    let host = args
        .url
        .host()
        .ok_or_else(usage)?
        .trim_matches(|c| c == '[' || c == ']');
    let port = args.url.port_u16().unwrap_or(443);
    let addr: SocketAddr = tokio::net::lookup_host((host, port))
        .await?
        .next()
        .ok_or("the host resolves to no address")?;
    let sni = args.sni.clone().unwrap_or_else(|| host.to_owned());
    let config = client_config(args.ca.as_deref())?;
    let bind: SocketAddr = if addr.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()?;
    let mut endpoint = quinn::Endpoint::client(bind)?;
    endpoint.set_default_client_config(config);

    // Connect everything first: the clock starts when all connections are up (as h2load).
    let mut conns = Vec::with_capacity(args.conns);
    for _ in 0..args.conns {
        let conn = endpoint.connect(addr, &sni)?.await?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        conns.push((conn, send));
    }

    let started = Instant::now();
    let deadline = args.duration.map(|d| started + d);
    let budget = Arc::new(AtomicU64::new(args.requests.unwrap_or(u64::MAX)));
    let mut tasks = tokio::task::JoinSet::new();
    for (conn, send) in &conns {
        for _ in 0..args.streams {
            tasks.spawn(run_stream(
                conn.clone(),
                send.clone(),
                args.url.clone(),
                deadline,
                budget.clone(),
            ));
        }
    }
    let mut total = Tally::default();
    while let Some(t) = tasks.join_next().await {
        let t = t?;
        total.latencies_us.extend_from_slice(&t.latencies_us);
        total.errors += t.errors;
        total.non2xx += t.non2xx;
        total.bytes += t.bytes;
    }
    let elapsed = started.elapsed().as_secs_f64();
    for (conn, _) in &conns {
        conn.close(quinn::VarInt::from_u32(0x100), b"");
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;

    let done = total.latencies_us.len() as u64;
    total.latencies_us.sort_unstable();
    let rps = done as f64 / elapsed;
    let mib_s = total.bytes as f64 / elapsed / (1024.0 * 1024.0);
    let (p50, p99) = (
        percentile(&total.latencies_us, 0.50),
        percentile(&total.latencies_us, 0.99),
    );
    let ok = done - total.non2xx;
    println!(
        "finished in {elapsed:.2}s, {rps:.2} req/s, {:.2}MB/s",
        mib_s
    );
    println!(
        "requests: {} total, {} started, {done} done, {ok} succeeded, {} failed, {} errored, 0 timeout",
        done + total.errors,
        done + total.errors,
        total.non2xx + total.errors,
        total.errors
    );
    let ms = |v: Option<f64>| v.map_or_else(|| "null".to_owned(), |v| format!("{v:.3}"));
    println!("    50%   {}ms", ms(p50));
    println!("    99%   {}ms", ms(p99));
    println!(
        "{{\"requests\": {done}, \"rps\": {rps:.2}, \"p50_ms\": {}, \"p99_ms\": {}, \"errors\": {}, \"non2xx\": {}, \"bytes\": {}, \"transfer_mib_s\": {mib_s:.3}, \"seconds\": {elapsed:.3}, \"connections\": {}, \"streams\": {}}}",
        ms(p50),
        ms(p99),
        total.errors,
        total.non2xx,
        total.bytes,
        args.conns,
        args.streams
    );
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("h3load: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("h3load: {e}");
        std::process::exit(1);
    }
}
