//! Access log: one line per request, and per L4 connection or UDP session, in JSON or the
//! combined format, to stdout, stderr or a file. The request path only builds a small record and
//! `try_send`s it; a dedicated thread formats (`format`) and writes, so a slow disk never blocks
//! requests (records are dropped and counted when the queue is full). SIGUSR1 makes the writer
//! reopen its file, for logrotate.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime};

use gateway_config::model::{AccessLogConfig, AccessLogFormat};

use super::metrics::{Counter, Registry};
use format::Formatter;

mod format;

/// One finished request.
#[derive(Debug)]
pub struct AccessRecord {
    /// When the request arrived.
    pub time: SystemTime,
    /// Client IP.
    pub client: IpAddr,
    /// Method.
    pub method: http::Method,
    /// Target (path and query as received), host, user agent and referer.
    pub request: RequestText,
    /// `HTTP/1.1`, `HTTP/2.0`, `HTTP/3.0`.
    pub protocol: &'static str,
    /// Response status.
    pub status: u16,
    /// Response body bytes (from Content-Length; 0 when streamed with unknown length).
    pub bytes: u64,
    /// Time to the response head.
    pub duration: Duration,
    /// Route name ("" when none matched).
    pub route: Arc<str>,
    /// Trace id, when the request is traced.
    pub trace_id: Option<String>,
}

/// A request's texts for its record in one allocation (a record is made per request): the
/// target, the host, the `User-Agent` and the `Referer`, the header values read lossily when
/// they are not UTF-8.
#[derive(Debug, Default)]
pub struct RequestText {
    text: String,
    /// Where the target, the host and the user agent end.
    ends: [usize; 3],
}

impl RequestText {
    /// The texts of a request; an absent header is empty.
    pub fn new(target: &str, host: &str, user_agent: &[u8], referer: &[u8]) -> Self {
        let len = target.len() + host.len() + user_agent.len() + referer.len();
        let mut text = String::with_capacity(len);
        text.push_str(target);
        let target_end = text.len();
        text.push_str(host);
        let host_end = text.len();
        push_lossy(&mut text, user_agent);
        let user_agent_end = text.len();
        push_lossy(&mut text, referer);
        Self {
            text,
            ends: [target_end, host_end, user_agent_end],
        }
    }

    /// Path and query as received.
    pub fn target(&self) -> &str {
        &self.text[..self.ends[0]]
    }

    /// Host requested, without its port.
    pub fn host(&self) -> &str {
        &self.text[self.ends[0]..self.ends[1]]
    }

    /// `User-Agent`.
    pub fn user_agent(&self) -> &str {
        &self.text[self.ends[1]..self.ends[2]]
    }

    /// `Referer`.
    pub fn referer(&self) -> &str {
        &self.text[self.ends[2]..]
    }
}

/// `bytes` as text, invalid UTF-8 replaced (as `String::from_utf8_lossy` reads it).
fn push_lossy(out: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => out.push_str(text),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
    }
}

/// One ended L4 connection (TCP) or session (UDP).
#[derive(Debug)]
pub struct StreamRecord {
    /// When the connection was accepted.
    pub time: SystemTime,
    /// Stream name.
    pub stream: Arc<str>,
    /// `TCP` or `UDP`.
    pub protocol: &'static str,
    /// The client (from the PROXY protocol header when the stream accepts one).
    pub client: SocketAddr,
    /// The target connected to, if any.
    pub target: Option<SocketAddr>,
    /// The TLS server name, when SNI routing read one.
    pub sni: Option<String>,
    /// Client → upstream bytes.
    pub bytes_in: u64,
    /// Upstream → client bytes.
    pub bytes_out: u64,
    /// How long it lasted.
    pub duration: Duration,
    /// Why it ended abnormally, if it did.
    pub error: Option<String>,
}

/// What goes through the queue to the writer.
#[derive(Debug)]
enum Entry {
    Http(AccessRecord),
    Stream(StreamRecord),
}

/// The request-side handle.
#[derive(Clone)]
pub struct AccessLog {
    tx: SyncSender<Entry>,
    dropped: Counter,
    reopen: Arc<AtomicBool>,
}

enum Sink {
    Stdout,
    Stderr,
    File(PathBuf),
}

impl AccessLog {
    /// Starts the writer thread.
    pub fn start(cfg: &AccessLogConfig, registry: &Registry) -> std::io::Result<Self> {
        let sink = match cfg.path.as_str() {
            "stdout" => Sink::Stdout,
            "stderr" => Sink::Stderr,
            p => Sink::File(PathBuf::from(p)),
        };
        let out = open(&sink)?;
        let (tx, rx) = sync_channel(16 * 1024);
        let reopen = Arc::new(AtomicBool::new(false));
        let format = cfg.format;
        let flag = reopen.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer(rx, sink, out, format, flag))?;
        Ok(Self {
            tx,
            dropped: registry.counter(
                "gateway_access_log_dropped_total",
                "Access log records dropped because the writer fell behind.",
                &[],
            ),
            reopen,
        })
    }

    /// Queues a request's record; never blocks.
    pub fn log(&self, record: AccessRecord) {
        self.send(Entry::Http(record));
    }

    /// Queues an L4 connection's record; never blocks.
    pub fn log_stream(&self, record: StreamRecord) {
        self.send(Entry::Stream(record));
    }

    fn send(&self, entry: Entry) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(entry) {
            self.dropped.inc();
        }
    }

    /// Asks the writer to reopen its file (logrotate).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Relaxed);
    }
}

fn open(sink: &Sink) -> std::io::Result<Box<dyn Write + Send>> {
    Ok(match sink {
        Sink::Stdout => Box::new(std::io::stdout()),
        Sink::Stderr => Box::new(std::io::stderr()),
        Sink::File(p) => Box::new(OpenOptions::new().create(true).append(true).open(p)?),
    })
}

fn writer(
    rx: Receiver<Entry>,
    sink: Sink,
    out: Box<dyn Write + Send>,
    format: AccessLogFormat,
    reopen: Arc<AtomicBool>,
) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    let mut line = Vec::with_capacity(512);
    let mut formatter = Formatter::default();
    let mut write = |out: &mut BufWriter<Box<dyn Write + Send>>, e: Entry| {
        line.clear();
        let f = &mut formatter;
        match (format, e) {
            (AccessLogFormat::Json, Entry::Http(r)) => f.http_json(&r, &mut line),
            (AccessLogFormat::Combined, Entry::Http(r)) => f.http_combined(&r, &mut line),
            (AccessLogFormat::Json, Entry::Stream(r)) => f.stream_json(&r, &mut line),
            (AccessLogFormat::Combined, Entry::Stream(r)) => f.stream_basic(&r, &mut line),
        }
        let _ = out.write_all(&line);
    };
    loop {
        let first = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(r) => Some(r),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.flush();
                return;
            }
        };
        if reopen.swap(false, Ordering::Relaxed) {
            let _ = out.flush();
            match open(&sink) {
                Ok(w) => out = BufWriter::with_capacity(64 * 1024, w),
                Err(e) => tracing::error!(error = %e, "cannot reopen the access log"),
            }
        }
        if let Some(r) = first {
            write(&mut out, r);
            // Drain what is queued, then flush once: prompt lines without a syscall per line.
            while let Ok(r) = rx.try_recv() {
                write(&mut out, r);
            }
            let _ = out.flush();
        }
    }
}
