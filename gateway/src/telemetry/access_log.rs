//! Access log: one line per request, and per L4 connection or UDP session, in JSON or the
//! combined format, to stdout, stderr or a file. The request path only builds a small record and
//! `try_send`s it; a dedicated thread formats
//! and writes, so a slow disk never blocks requests (records are dropped and counted when the
//! queue is full). SIGUSR1 makes the writer reopen its file, for logrotate.

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

/// One finished request.
#[derive(Debug)]
pub struct AccessRecord {
    /// When the request arrived.
    pub time: SystemTime,
    /// Client IP.
    pub client: IpAddr,
    /// Method.
    pub method: http::Method,
    /// Path and query as received.
    pub target: String,
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
    /// Host requested.
    pub host: String,
    /// User-Agent.
    pub user_agent: String,
    /// Referer.
    pub referer: String,
    /// Trace id, when the request is traced.
    pub trace_id: Option<String>,
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
    let mut line = String::with_capacity(512);
    let mut write = |out: &mut BufWriter<Box<dyn Write + Send>>, e: Entry| {
        line.clear();
        match (format, e) {
            (AccessLogFormat::Json, Entry::Http(r)) => format_json(&r, &mut line),
            (AccessLogFormat::Combined, Entry::Http(r)) => format_combined(&r, &mut line),
            (AccessLogFormat::Json, Entry::Stream(r)) => format_stream_json(&r, &mut line),
            (AccessLogFormat::Combined, Entry::Stream(r)) => format_stream_basic(&r, &mut line),
        }
        let _ = out.write_all(line.as_bytes());
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

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                use std::fmt::Write as _;
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn rfc3339(t: SystemTime) -> String {
    httpdate_like::rfc3339(t)
}

fn format_json(r: &AccessRecord, out: &mut String) {
    use std::fmt::Write as _;
    out.push_str("{\"time\":");
    json_str(out, &rfc3339(r.time));
    out.push_str(",\"client\":");
    json_str(out, &r.client.to_string());
    out.push_str(",\"method\":");
    json_str(out, r.method.as_str());
    out.push_str(",\"target\":");
    json_str(out, &r.target);
    out.push_str(",\"protocol\":");
    json_str(out, r.protocol);
    let _ = write!(
        out,
        ",\"status\":{},\"bytes\":{},\"duration_ms\":{:.3}",
        r.status,
        r.bytes,
        r.duration.as_secs_f64() * 1000.0
    );
    out.push_str(",\"route\":");
    json_str(out, &r.route);
    out.push_str(",\"host\":");
    json_str(out, &r.host);
    out.push_str(",\"user_agent\":");
    json_str(out, &r.user_agent);
    out.push_str(",\"referer\":");
    json_str(out, &r.referer);
    if let Some(t) = &r.trace_id {
        out.push_str(",\"trace_id\":");
        json_str(out, t);
    }
    out.push_str("}\n");
}

fn format_combined(r: &AccessRecord, out: &mut String) {
    use std::fmt::Write as _;
    let quote = |s: &str| s.replace('"', "\\\"");
    let _ = writeln!(
        out,
        "{} - - [{}] \"{} {} {}\" {} {} \"{}\" \"{}\"",
        r.client,
        httpdate_like::clf(r.time),
        r.method,
        quote(&r.target),
        r.protocol,
        r.status,
        r.bytes,
        if r.referer.is_empty() {
            "-".to_owned()
        } else {
            quote(&r.referer)
        },
        if r.user_agent.is_empty() {
            "-".to_owned()
        } else {
            quote(&r.user_agent)
        },
    );
}

fn format_stream_json(r: &StreamRecord, out: &mut String) {
    use std::fmt::Write as _;
    out.push_str("{\"time\":");
    json_str(out, &rfc3339(r.time));
    out.push_str(",\"stream\":");
    json_str(out, &r.stream);
    out.push_str(",\"protocol\":");
    json_str(out, r.protocol);
    out.push_str(",\"client\":");
    json_str(out, &r.client.to_string());
    if let Some(t) = r.target {
        out.push_str(",\"target\":");
        json_str(out, &t.to_string());
    }
    if let Some(sni) = &r.sni {
        out.push_str(",\"sni\":");
        json_str(out, sni);
    }
    let _ = write!(
        out,
        ",\"bytes_in\":{},\"bytes_out\":{},\"duration_ms\":{:.3}",
        r.bytes_in,
        r.bytes_out,
        r.duration.as_secs_f64() * 1000.0
    );
    if let Some(e) = &r.error {
        out.push_str(",\"error\":");
        json_str(out, e);
    }
    out.push_str("}\n");
}

/// nginx's `stream` "basic" layout: client, time, protocol, status (200 when both sides closed
/// cleanly, 500 otherwise; the JSON format carries the error), bytes sent to the client, bytes
/// received from it, seconds; then the stream and the target.
fn format_stream_basic(r: &StreamRecord, out: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "{} [{}] {} {} {} {} {:.3} {} {}",
        r.client.ip(),
        httpdate_like::clf(r.time),
        r.protocol,
        if r.error.is_none() { 200 } else { 500 },
        r.bytes_out,
        r.bytes_in,
        r.duration.as_secs_f64(),
        r.stream,
        r.target.map_or_else(|| "-".to_owned(), |t| t.to_string()),
    );
}

/// Timestamp formats without a date-time dependency: civil-from-days (Howard Hinnant).
mod httpdate_like {
    use std::time::{SystemTime, UNIX_EPOCH};

    fn parts(t: SystemTime) -> (i64, u32, u32, u64, u64, u64, u32) {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = d.as_secs();
        let days = (secs / 86_400) as i64;
        let rem = secs % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        (
            year,
            month,
            day,
            rem / 3600,
            rem % 3600 / 60,
            rem % 60,
            d.subsec_millis(),
        )
    }

    pub(super) fn rfc3339(t: SystemTime) -> String {
        let (y, mo, d, h, mi, s, ms) = parts(t);
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
    }

    pub(super) fn clf(t: SystemTime) -> String {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let (y, mo, d, h, mi, s, _) = parts(t);
        format!(
            "{d:02}/{}/{y:04}:{h:02}:{mi:02}:{s:02} +0000",
            MONTHS[(mo - 1) as usize]
        )
    }

    #[cfg(test)]
    mod tests {
        use std::time::{Duration, UNIX_EPOCH};

        #[test]
        fn formats_known_instants() {
            let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
            assert_eq!(super::rfc3339(t), "2023-11-14T22:13:20.123Z");
            assert_eq!(super::clf(t), "14/Nov/2023:22:13:20 +0000");
        }
    }
}
