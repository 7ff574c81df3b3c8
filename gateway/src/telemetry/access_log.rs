//! Access log: one line per request, and per L4 connection or UDP session, in JSON or the
//! combined format, to stdout, stderr or a file. The request path only builds a small record and
//! queues it; a dedicated thread (`writer`) formats (`format`) and writes the queue every 100 ms,
//! so a slow disk never blocks requests (records are dropped and counted when the queue is
//! full). SIGUSR1 makes the writer reopen its file, for logrotate.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use gateway_config::model::AccessLogConfig;

use super::metrics::{Counter, Registry};
use super::trace::OpenSpan;
use super::trace::context::hex;

mod format;
mod writer;

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
    /// The upstream the request was proxied to, when it was.
    pub upstream: Option<Arc<str>>,
    /// Trace id, when the request is traced.
    pub trace_id: Option<String>,
    /// What the route's filters and terminal said about the request, when anything.
    pub notes: Option<Box<LogNotes>>,
}

impl AccessRecord {
    /// The authenticated user, if any.
    pub fn user(&self) -> Option<&str> {
        self.notes.as_ref()?.user.as_deref()
    }
}

/// What a route's filters and terminal did that its access-log line shows, carried on the
/// response's extensions to the service, which records them. Boxed in the record: most
/// requests have none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogNotes {
    /// The user an authentication filter let in: a verified token's `sub`, or the user
    /// `basic_auth` let in.
    pub user: Option<Arc<str>>,
    /// What a `cache` filter did: `hit`, `stale` (served stale), `revalidated` (a 304
    /// refreshed it), `miss` (fetched) or `pass` (neither read nor written: the method, or the
    /// request's own `no-store`).
    pub cache: Option<&'static str>,
    /// An authentication filter's refusal: the filter and its reason (`("jwt", "expired")`),
    /// the reasons its metric counts.
    pub auth: Option<(&'static str, &'static str)>,
    /// `preflight` (a preflight answered here), `denied` (an origin the policy does not allow).
    pub cors: Option<&'static str>,
    /// The `Location` of a redirect the route's `redirect` terminal answered.
    pub redirect: Option<Box<str>>,
    /// For a request picked for a copy to the route's mirror: `copied`, or `dropped` (too many
    /// copies in flight). How the copy ended comes later, in its metric.
    pub mirror: Option<&'static str>,
    /// The encoding a `compress` filter gave the answer (`gzip`, `br`, `zstd`).
    pub compress: Option<&'static str>,
}

impl LogNotes {
    /// The notes on a response's extensions, added when there were none.
    pub fn on(extensions: &mut http::Extensions) -> &mut Self {
        extensions.get_or_insert_default()
    }
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
        // Borrowed, not copied, when the value is UTF-8.
        text.push_str(&String::from_utf8_lossy(user_agent));
        let user_agent_end = text.len();
        text.push_str(&String::from_utf8_lossy(referer));
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
    queue: Arc<Queue>,
    dropped: Counter,
}

impl AccessLog {
    /// Starts the writer thread.
    pub fn start(cfg: &AccessLogConfig, registry: &Registry) -> std::io::Result<Self> {
        let sink = match cfg.path.as_str() {
            "stdout" => Sink::Stdout,
            "stderr" => Sink::Stderr,
            p => Sink::File(PathBuf::from(p)),
        };
        let out = writer::open(&sink)?;
        let queue = Arc::new(Queue::default());
        let theirs = queue.clone();
        let format = cfg.format;
        let thread = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer::run(&theirs, sink, out, format))?;
        *lock(&queue.thread) = Some(thread);
        Ok(Self {
            queue,
            dropped: registry.counter(
                "gateway_access_log_dropped_total",
                "Access log records dropped because the writer fell behind.",
                &[],
            ),
        })
    }

    /// Queues a request's record; never blocks.
    pub fn log(&self, record: AccessRecord) {
        self.send(Entry::Http(record));
    }

    /// [`AccessLog::log`] for a request whose span was recorded (`span`): the record names its
    /// trace.
    pub fn log_traced(&self, mut record: AccessRecord, span: Option<&OpenSpan>) {
        record.trace_id = span.and_then(OpenSpan::trace_id).map(|id| hex(&id));
        self.log(record);
    }

    /// Queues an L4 connection's record; never blocks.
    pub fn log_stream(&self, record: StreamRecord) {
        self.send(Entry::Stream(record));
    }

    /// Adds the entry to the queue without waking the writer (a wake-up is a system call on
    /// each side and a switch between threads, which per request cost more than the rest of
    /// a small request): it writes every [`FLUSH_EVERY`], or sooner once [`WAKE_AT`] wait.
    fn send(&self, entry: Entry) {
        let mut waiting = lock(&self.queue.waiting);
        if waiting.entries.len() >= CAPACITY {
            drop(waiting);
            self.dropped.inc();
            return;
        }
        waiting.entries.push(entry);
        let wake = waiting.entries.len() == WAKE_AT;
        drop(waiting);
        if wake {
            self.queue.wake.notify_one();
        }
    }

    /// Asks the writer to reopen its file (logrotate).
    pub fn reopen(&self) {
        lock(&self.queue.waiting).reopen = true;
        self.queue.wake.notify_one();
    }

    /// Has the writer write what is queued and stop, waiting up to `timeout` for it (the
    /// gateway's exit). Records sent afterwards are not written.
    pub async fn close(&self, timeout: Duration) {
        lock(&self.queue.waiting).closed = true;
        self.queue.wake.notify_one();
        let Some(thread) = lock(&self.queue.thread).take() else {
            return;
        };
        let join = tokio::task::spawn_blocking(move || thread.join());
        if tokio::time::timeout(timeout, join).await.is_err() {
            tracing::warn!("the access log writer did not finish in time");
        }
    }
}

/// Records waiting for the writer, shared by the handles and the writer thread.
#[derive(Default)]
struct Queue {
    waiting: Mutex<Waiting>,
    /// Wakes the writer before its next round: many records waiting, a reopen, the close.
    wake: Condvar,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct Waiting {
    entries: Vec<Entry>,
    /// SIGUSR1 asked for the file to be reopened.
    reopen: bool,
    /// The gateway is exiting.
    closed: bool,
}

/// Most records waiting; more are dropped and counted.
const CAPACITY: usize = 16 * 1024;
/// Records waiting that wake the writer before its round.
const WAKE_AT: usize = 1024;
/// How often the writer writes what is waiting (so how late a line can appear).
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// The queue's lock; a panic while it was held left nothing half-done worth refusing.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

enum Sink {
    Stdout,
    Stderr,
    File(PathBuf),
}
