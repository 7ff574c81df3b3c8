//! The HTTP/1.1 fast path: the gateway's own HTTP/1.1 engine for every request without a body.
//!
//! A request is parsed with httparse (the parser hyper uses) and answered here in one of four
//! ways, chosen per request from what the route's chain and terminal are (decided at config
//! load):
//! - `GET` and `HEAD` for a route without filters whose answer needs nothing but the route:
//!   a fixed response or a cached static file, from wire text made ahead of time plus the
//!   server's fields and the `Date` line (on a plain TCP connection, a file not in the cache is
//!   looked up here too and a large one sent from disk with `sendfile`);
//! - such requests for a filterless proxy route, forwarded as text ([`forward`]);
//! - everything else without a body (routes with filters, other methods, preconditions, no
//!   matching route, requests the entry rules refuse or change) through the one service every
//!   protocol shares, the route's filter chain and terminal, with the response encoded here as
//!   hyper encodes it ([`general`]);
//! - a request with `Connection: close` is answered too, and ends the connection ([`close`]).
//!
//! Only what hyper alone still does hands the connection over to hyper for the rest of its
//! life, with the bytes not yet answered: a request with a body or framing headers, `Expect`,
//! `Upgrade`, `Connection` other than `keep-alive` or one `close`, HTTP/1.0, a target outside a
//! conservative subset of what hyper takes, more headers than [`MAX_HEADERS`], a parse error
//! (hyper answers it), and requests while an ACME challenge is pending.
//! The bytes arrive through the framing checks ([`super::checked`]) and the activity tracking
//! ([`super::idle`]) as they would for hyper, so refusals, timeouts and the drain behave the
//! same; route metrics, the access log and traces record each answer as the general path does
//! (a sampled request's server span ends once its answer has been written). The listener
//! setting `http1_fast_path: false` turns this off.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf, BytesMut};
use gateway_http1::date;
use gateway_http1::fields::{field_text, push_field};
use http::{HeaderMap, Method, StatusCode, Version};
use stream_proxy::clock::coarse_unix_secs;
use stream_proxy::watchdog::Signal;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::{ConnWatch, FastPathCounters, ListenerRuntime};
use super::idle::Verdict;
use super::sendfile::SendFile;
use crate::generation::{CompiledRoute, Generation};
use crate::request;
use crate::router::strip_port;
use crate::server::service::{ConnService, RequestFacts};
use crate::static_files::{
    LargeFile, Looked, Missed, Prepared, PreparedFile, RangeSpec, Ranged, Recheck, Revalidation,
    StaticFiles,
};
use crate::telemetry::trace::ServerSpan;
use crate::telemetry::{Counter, RequestText, first_line};
use crate::terminal::Terminal;
use answers::{Answers, WriteAll};
use forward::Forwarded;
use general::General;

mod answers;
mod forward;
mod general;

/// Most header lines a request on the fast path may have; one with more is hyper's (which
/// allows 128).
const MAX_HEADERS: usize = 32;

/// The read buffer's first size: a request head of a browser is 0.5–2 KiB.
const READ_CHUNK: usize = 4096;

/// Answers gathered from pipelined requests before they are written.
const OUT_LIMIT: usize = 64 * 1024;

/// The largest request target hyper's URI parser takes.
const MAX_TARGET: usize = u16::MAX as usize - 1;

/// How the fast path left a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Closed: the client ended it, an error, a deadline or the drain.
    Closed,
    /// hyper serves the rest, starting with the bytes left in the read buffer.
    HandOff,
}

/// A request the fast path may answer, as read from its head.
#[derive(Debug, Default, PartialEq, Eq)]
struct Plain<'b> {
    head: bool,
    /// Only the service can answer it ([`general`]): a method other than `GET` and `HEAD`, or a
    /// field the prepared answers read once (`Host`, `Accept-Encoding`, `Range` and the
    /// revalidation's) given twice.
    general: bool,
    /// The request target (path and query).
    target: &'b str,
    /// The target's path, without the query.
    path: &'b str,
    host: Option<&'b [u8]>,
    accept_encoding: Option<&'b [u8]>,
    /// Every header line, for the access log (read only when it is on, so that a request
    /// does not pay for what it may not need).
    headers: &'b [httparse::Header<'b>],
    /// A precondition other than the revalidation's (`If-Match`, `If-Unmodified-Since`,
    /// `If-Range`): the general path answers it.
    conditional: bool,
    /// One `If-None-Match` and one `If-Modified-Since` at most: a cached or kept file's 304 is
    /// answered here.
    revalidation: Revalidation<'b>,
    /// The one `Range` value: a cached file or a large file kept open answers it here (its 206).
    range: Option<&'b [u8]>,
    /// `Connection: close`: the connection ends with this answer.
    close: bool,
}

/// Request-target bytes the fast path takes: visible ASCII except the characters hyper's URI
/// parser refuses or treats specially (`#` starts a fragment) and a few it takes that no
/// well-behaved client sends unencoded. A target with any other byte goes to hyper.
const fn target_byte_table() -> [bool; 256] {
    let mut t = [false; 256];
    let mut b = 0x21;
    while b < 0x7f {
        t[b] = !matches!(
            b as u8,
            b'"' | b'#' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}'
        );
        b += 1;
    }
    t
}

static TARGET_BYTES: [bool; 256] = target_byte_table();

/// The length of `target`'s path (up to its query) when every byte of it is one the fast path
/// takes; `None` otherwise.
fn plain_target(target: &str) -> Option<usize> {
    let bytes = target.as_bytes();
    if bytes.first() != Some(&b'/') || bytes.len() > MAX_TARGET {
        return None;
    }
    let mut path = bytes.len();
    for (i, &b) in bytes.iter().enumerate() {
        if !TARGET_BYTES[b as usize] {
            return None;
        }
        if b == b'?' && path == bytes.len() {
            path = i;
        }
    }
    Some(path)
}

/// Reads a parsed request's line and headers; `None` when hyper should have it.
fn classify<'a, 'b: 'a>(req: &'a httparse::Request<'_, 'b>) -> Option<Plain<'a>> {
    if req.version != Some(1) {
        return None;
    }
    let (head, general) = match req.method? {
        "GET" => (false, false),
        "HEAD" => (true, false),
        _ => (false, true),
    };
    let target = req.path?;
    // The path ends at an ASCII byte, so slicing there is on a character boundary.
    let path = &target[..plain_target(target)?];
    let mut plain = Plain {
        head,
        general,
        target,
        path,
        headers: req.headers,
        ..Plain::default()
    };
    let mut connection_lines = 0;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        // By length first: one comparison for most headers a client sends.
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        match name.len() {
            // A second `Host` or `Accept-Encoding` is the service's; any `Connection` but
            // `keep-alive` or `close` is hyper's.
            4 if is(b"host") && plain.host.replace(h.value).is_some() => plain.general = true,
            15 if is(b"accept-encoding") && plain.accept_encoding.replace(h.value).is_some() => {
                plain.general = true;
            }
            10 if is(b"connection") => {
                connection_lines += 1;
                if h.value.eq_ignore_ascii_case(b"close") {
                    plain.close = true;
                } else if !h.value.eq_ignore_ascii_case(b"keep-alive") {
                    return None;
                }
            }
            // A body, or a request hyper treats specially.
            14 if is(b"content-length") => return None,
            17 if is(b"transfer-encoding") => return None,
            6 if is(b"expect") => return None,
            7 if is(b"upgrade") => return None,
            // A second `Range` is the service's (which reads the first).
            5 if is(b"range") && plain.range.replace(h.value).is_some() => plain.general = true,
            8 if is(b"if-match") || is(b"if-range") => plain.conditional = true,
            // A second line of either is the service's (which reads them all).
            13 if is(b"if-none-match")
                && plain.revalidation.if_none_match.replace(h.value).is_some() =>
            {
                plain.general = true;
            }
            17 if is(b"if-modified-since")
                && plain
                    .revalidation
                    .if_modified_since
                    .replace(h.value)
                    .is_some() =>
            {
                plain.general = true;
            }
            19 if is(b"if-unmodified-since") => plain.conditional = true,
            _ => {}
        }
    }
    // hyper reads `Connection` lines in order and a later `keep-alive` can undo a `close`:
    // with a `close` among several, the connection is hyper's to keep or end.
    if plain.close && connection_lines > 1 {
        return None;
    }
    Some(plain)
}

/// The host a route's `host` condition sees: the `Host` header without its port, `""` when
/// absent or not visible ASCII (as `router::request_host` reads it from a header map).
fn host_of(value: Option<&[u8]>) -> &str {
    value.and_then(field_text).map_or("", strip_port)
}

/// The per-connection side of the fast path: what every answer on the connection shares.
pub struct Lane<'a> {
    svc: &'a Arc<ConnService>,
    /// The listener's count of requests answered here.
    answered: &'a Counter,
    /// The listener's count of requests answered here through the service ([`general`]).
    through_chain: &'a Counter,
    /// The listener's own header lines (HSTS, `Alt-Svc`), added to every response as the
    /// general path adds them.
    listener_lines: Vec<u8>,
    /// What routing gets for the header conditions it never has here.
    no_headers: HeaderMap,
    /// Whether the connection is a plain socket that takes `sendfile`: a file not in the
    /// cache is then looked up and answered here (a large one sent from disk).
    sends_files: bool,
}

impl<'a> Lane<'a> {
    /// The fast path of one connection served by `svc`; `sends_files` as
    /// [`SendFile::sends_files`] says of the connection.
    pub fn new(
        svc: &'a Arc<ConnService>,
        counters: &'a FastPathCounters,
        sends_files: bool,
    ) -> Self {
        let mut listener_lines = Vec::new();
        let lines = [
            ("strict-transport-security", svc.policy.hsts.as_ref()),
            ("alt-svc", svc.alt_svc.as_ref()),
        ];
        for (name, value) in lines {
            if let Some(value) = value {
                push_field(&mut listener_lines, name.as_bytes(), value.as_bytes());
            }
        }
        Self {
            svc,
            answered: &counters.answered,
            through_chain: &counters.through_chain,
            listener_lines,
            no_headers: HeaderMap::new(),
            sends_files,
        }
    }

    /// Appends the answer to `req` to `answers`, or says why not.
    fn answer(&self, req: &Plain<'_>, answers: &mut Answers) -> Outcome {
        let svc = self.svc;
        // An ACME challenge's answer is hyper's (the service checks for it on its calls).
        if let Some(c) = &svc.http01
            && c.http_answer(req.path).is_some()
        {
            return Outcome::HandOff;
        }
        // A request the entry rules would refuse or change goes to the service, which applies
        // them (`crate::request`).
        if req.general
            || req.target.len() > svc.policy.max_uri
            || !request::passes_unchanged(req.host, req.path, &svc.policy.entry)
        {
            return Outcome::General(None);
        }
        let start = Instant::now();
        let generation = svc.generation.load();
        let router = &generation.router;
        if router.matches_headers() {
            return Outcome::General(None);
        }
        let Some(listener) = generation.listener_index(&svc.conn.listener) else {
            return Outcome::General(None);
        };
        let host = if router.matches_hosts() {
            host_of(req.host)
        } else {
            ""
        };
        let method = if req.head { Method::HEAD } else { Method::GET };
        let Some(index) = router.find_index(listener, &method, host, req.path, &self.no_headers)
        else {
            return Outcome::General(None);
        };
        let route = router.route(index);
        let server = generation.server_header.as_ref();
        // What the service gets when it answers after all: the route found here, which it
        // would find again.
        let routed = || Outcome::General(Some((Arc::clone(&generation), index)));
        // A route's filters run in the service, through the one filter chain.
        if !route.chain.is_empty() {
            return routed();
        }
        match &route.terminal {
            Terminal::Respond(r) => {
                let Some(canned) = r.canned() else {
                    return routed();
                };
                svc.activity.request_started(false);
                let out = &mut answers.text;
                out.extend_from_slice(&canned.head);
                if !canned.sets_server
                    && let Some(server) = server
                {
                    push_field(out, b"server", server.as_bytes());
                }
                out.extend_from_slice(&self.listener_lines);
                out.extend_from_slice(&canned.length);
                end_head(out, req.close);
                if !req.head {
                    answers.push_body(&canned.body, None);
                }
                let bytes = canned.body.len();
                let observe = || self.observe(req);
                self.record(route, r.status(), bytes, start, observe, answers);
            }
            Terminal::Static(files) => {
                if req.conditional {
                    return routed();
                }
                svc.activity.request_started(false);
                // `HEAD` ignores `Range` (RFC 9110 §14.2): its 200 head below.
                if let Some(range) = req.range.filter(|_| !req.head) {
                    let Some((status, bytes)) = self.push_range(req, range, files, server, answers)
                    else {
                        svc.activity.request_done();
                        return routed();
                    };
                    let observe = || self.observe(req);
                    self.record(route, status, bytes, start, observe, answers);
                    svc.activity.request_done();
                    self.answered.inc();
                    return Outcome::Answered;
                }
                let revalidating = req.revalidation.is_asked();
                let found = files.prepared(
                    req.path,
                    req.accept_encoding,
                    self.sends_files,
                    req.revalidation,
                );
                let job = match found {
                    None => {
                        svc.activity.request_done();
                        return routed();
                    }
                    Some(Prepared::NotModified(lines)) => {
                        self.push_not_modified(&lines, req.close, server, answers);
                        let observe = || self.observe(req);
                        self.record(route, StatusCode::NOT_MODIFIED, 0, start, observe, answers);
                        None
                    }
                    Some(Prepared::Ready(file)) => {
                        self.push_file(&file, (req.head, req.close), server, answers);
                        let bytes = file.body.len();
                        let observe = || self.observe(req);
                        self.record(route, StatusCode::OK, bytes, start, observe, answers);
                        None
                    }
                    Some(Prepared::Large(file)) => {
                        self.push_large(&file, (req.head, req.close), server, answers);
                        let bytes = usize::try_from(file.len).unwrap_or(usize::MAX);
                        let observe = || self.observe(req);
                        self.record(route, StatusCode::OK, bytes, start, observe, answers);
                        None
                    }
                    Some(Prepared::Recheck(recheck)) => Some(Job::Recheck(recheck)),
                    Some(Prepared::Missed(missed)) => Some(Job::LookUp(missed)),
                };
                if let Some(job) = job {
                    return Outcome::Waits(Box::new(Pending {
                        files: files.clone(),
                        job,
                        head: req.head,
                        close: req.close,
                        revalidating,
                        observed: self.observe(req),
                        generation: arc_swap::Guard::into_inner(generation),
                        index,
                        start,
                    }));
                }
            }
            Terminal::Proxy(proxy) => {
                return match self.rewrite(req, proxy, &generation, index, start) {
                    Some(job) => Outcome::Forwards(job),
                    None => routed(),
                };
            }
        }
        svc.activity.request_done();
        self.answered.inc();
        Outcome::Answered
    }

    /// Appends a cached file's 200 to a `HEAD` (`head`) or a `GET`, and `Connection: close`
    /// when it ends the connection (`close`).
    fn push_file(
        &self,
        file: &PreparedFile,
        (head, close): (bool, bool),
        server: Option<&http::HeaderValue>,
        answers: &mut Answers,
    ) {
        let out = &mut answers.text;
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        if let Some(server) = server {
            push_field(out, b"server", server.as_bytes());
        }
        out.extend_from_slice(&file.lines);
        out.extend_from_slice(&self.listener_lines);
        end_head(out, close);
        if !head {
            answers.push_body(&file.body, file.sealed.as_ref());
        }
    }

    /// What the access log and the tracer take from `req`, when they are on.
    fn observe(&self, req: &Plain<'_>) -> Observed {
        let telemetry = &self.svc.telemetry;
        Observed {
            facts: telemetry.access_log.is_on().then(|| facts(req)),
            span: telemetry.tracer.load_full().map(|tracer| {
                let conn = &self.svc.conn;
                ServerSpan::start_h1(&tracer, req.head, req.target, req.headers, conn)
            }),
        }
    }

    /// Records a request answered here as the general path does: the route's metrics, the
    /// access log's record, and the head of its span, which `answers` ends once written.
    /// `observe` runs only when the log or traces are on: without them a request moves no
    /// telemetry state around.
    fn record(
        &self,
        route: &CompiledRoute,
        status: StatusCode,
        bytes: usize,
        start: Instant,
        observe: impl FnOnce() -> Observed,
        answers: &mut Answers,
    ) {
        let elapsed = start.elapsed();
        route.metrics.record(Version::HTTP_11, status, elapsed);
        let telemetry = &self.svc.telemetry;
        if !telemetry.access_log.is_on() && !telemetry.tracer.is_on() {
            return;
        }
        let observed = observe();
        let open = observed.span.and_then(|s| s.end_head(status, &route.name));
        if let Some(facts) = observed.facts
            && let Some(log) = telemetry.access_log.load_full()
        {
            let (conn, route) = (&self.svc.conn, route.name.clone());
            let version = Version::HTTP_11;
            let record = facts.into_record(conn, version, status, bytes as u64, elapsed, route);
            log.log_traced(record, open.as_ref());
        }
        if let Some(open) = open {
            answers.push_span(open);
        }
    }

    /// Finishes a request whose file needed its re-check or a lookup: its answer appended to
    /// `answers`, or `false` when the general path has to answer it.
    async fn finish_waiting(&self, pending: Pending, answers: &mut Answers) -> bool {
        let looked = match pending.job {
            Job::Recheck(recheck) => match pending.files.recheck(recheck).await {
                Some(file) => Looked::File(file),
                None => Looked::General,
            },
            Job::LookUp(missed) => pending.files.look_up(missed).await,
        };
        let server = pending.generation.server_header.as_ref();
        let how = (pending.head, pending.close);
        let (status, bytes) = match looked {
            Looked::File(_) | Looked::Large(_) if pending.revalidating => {
                self.svc.activity.request_done();
                return false;
            }
            Looked::File(file) => {
                self.push_file(&file, how, server, answers);
                (StatusCode::OK, file.body.len())
            }
            Looked::Large(file) => {
                self.push_large(&file, how, server, answers);
                (
                    StatusCode::OK,
                    usize::try_from(file.len).unwrap_or(usize::MAX),
                )
            }
            Looked::Error(status) => (status, self.push_error(status, how, server, answers)),
            Looked::General => {
                self.svc.activity.request_done();
                return false;
            }
        };
        let route = pending.generation.router.route(pending.index);
        let observe = || pending.observed;
        self.record(route, status, bytes, pending.start, observe, answers);
        self.answered.inc();
        self.svc.activity.request_done();
        true
    }

    /// Appends the 200 of a large file sent from disk, as the general path writes it (the
    /// `Server` line after the file's own, which that path adds last).
    fn push_large(
        &self,
        file: &LargeFile,
        (head, close): (bool, bool),
        server: Option<&http::HeaderValue>,
        answers: &mut Answers,
    ) {
        let out = &mut answers.text;
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        out.extend_from_slice(&file.lines);
        if let Some(server) = server {
            push_field(out, b"server", server.as_bytes());
        }
        out.extend_from_slice(&self.listener_lines);
        end_head(out, close);
        if !head && let Ok(len) = usize::try_from(file.len) {
            answers.push_disk(&file.file, 0, len);
        }
    }

    /// Appends the answer to a `GET` of a static file with a `Range` (`range`, its value) when
    /// the file is cached or a large one kept open: its 206 for a satisfiable range (of the
    /// identity bytes; from disk with `sendfile` for a large file), its 200 for a range the
    /// general path ignores (another unit, several ranges, bad syntax); returns the status and
    /// the body's length. `None` leaves the request to the general path: a revalidation, a file
    /// neither cached nor kept open or due for its re-check, a large file on a connection that
    /// does not send files (TLS), and an unsatisfiable range (its 416).
    fn push_range(
        &self,
        req: &Plain<'_>,
        range: &[u8],
        files: &StaticFiles,
        server: Option<&http::HeaderValue>,
        answers: &mut Answers,
    ) -> Option<(StatusCode, usize)> {
        // `If-None-Match` and `If-Modified-Since` come before `Range`: the general path's.
        if req.revalidation.is_asked() {
            return None;
        }
        let file = files.prepared_range(req.path)?;
        // A file on disk is sent only with `sendfile`, which a TLS connection cannot take.
        if matches!(file, Ranged::Large(_)) && !self.sends_files {
            return None;
        }
        let (first, last) = match file.range(range) {
            RangeSpec::Bytes(first, last) => (first, last),
            RangeSpec::Ignore => {
                let whole = usize::try_from(file.total()).ok()?;
                let how = (false, req.close);
                match &file {
                    Ranged::Cached(f) => self.push_file(f, how, server, answers),
                    Ranged::Large(f) => self.push_large(f, how, server, answers),
                }
                return Some((StatusCode::OK, whole));
            }
            RangeSpec::Unsatisfiable => return None,
        };
        let (start, len) = (
            usize::try_from(first).ok()?,
            usize::try_from(last - first + 1).ok()?,
        );
        let out = &mut answers.text;
        // As the general path's 206 (`static_files::response::partial`), `Server` last.
        out.extend_from_slice(b"HTTP/1.1 206 Partial Content\r\n");
        out.extend_from_slice(file.representation_lines());
        push_field(out, b"content-length", len.to_string().as_bytes());
        let content_range = format!("bytes {first}-{last}/{}", file.total());
        push_field(out, b"content-range", content_range.as_bytes());
        if let Some(server) = server {
            push_field(out, b"server", server.as_bytes());
        }
        out.extend_from_slice(&self.listener_lines);
        end_head(out, req.close);
        match &file {
            // The range is within the body (clamped to it), whose length fits in usize.
            Ranged::Cached(f) => answers.push_body(&f.body.slice(start..start + len), None),
            Ranged::Large(f) => answers.push_disk(&f.file, first, len),
        }
        Some((StatusCode::PARTIAL_CONTENT, len))
    }

    /// Appends a cached file's 304 (`lines`, its validators) as the general path writes it,
    /// `Server` after them; with `Connection: close` when it ends the connection (`close`).
    fn push_not_modified(
        &self,
        lines: &[u8],
        close: bool,
        server: Option<&http::HeaderValue>,
        answers: &mut Answers,
    ) {
        let out = &mut answers.text;
        out.extend_from_slice(b"HTTP/1.1 304 Not Modified\r\n");
        out.extend_from_slice(lines);
        if let Some(server) = server {
            push_field(out, b"server", server.as_bytes());
        }
        out.extend_from_slice(&self.listener_lines);
        end_head(out, close);
    }

    /// Appends the general path's error response for `status` (a static file's 404 or 403);
    /// returns the body's length.
    fn push_error(
        &self,
        status: StatusCode,
        how: (bool, bool),
        server: Option<&http::HeaderValue>,
        answers: &mut Answers,
    ) -> usize {
        self.push_response(&crate::error::error_response(status), how, server, answers)
    }

    /// Appends a response the gateway made whole (an error page) as hyper writes it, to a
    /// `HEAD` (`head`) or a `GET`, with `Connection: close` when it ends the connection
    /// (`close`); returns the body's length.
    fn push_response(
        &self,
        res: &http::Response<crate::body::Body>,
        (head, close): (bool, bool),
        server: Option<&http::HeaderValue>,
        answers: &mut Answers,
    ) -> usize {
        let status = res.status();
        let body = res.body().as_full().cloned().unwrap_or_default();
        let out = &mut answers.text;
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\n");
        for (name, value) in res.headers() {
            push_field(out, name.as_str().as_bytes(), value.as_bytes());
        }
        if let Some(server) = server
            && !res.headers().contains_key(http::header::SERVER)
        {
            push_field(out, b"server", server.as_bytes());
        }
        out.extend_from_slice(&self.listener_lines);
        push_field(out, b"content-length", body.len().to_string().as_bytes());
        end_head(out, close);
        if !head {
            answers.push_body(&body, None);
        }
        body.len()
    }
}

/// What became of a request.
enum Outcome {
    /// Its answer is in the output.
    Answered,
    /// hyper answers it.
    HandOff,
    /// Its cached file is due for a re-check, or its file is not cached: this request does
    /// the check or the lookup before it is answered.
    Waits(Box<Pending>),
    /// A proxied request, rewritten: it is forwarded once the answers before it are written.
    Forwards(Box<Forwarded>),
    /// A body-less request the service answers ([`general`]), with the route found here when
    /// the entry rules leave the request as it is.
    General(Option<(Arc<Generation>, usize)>),
}

/// What a request waits for.
enum Job {
    Recheck(Recheck),
    LookUp(Missed),
}

/// A request waiting for its file's re-check or lookup.
struct Pending {
    files: Arc<StaticFiles>,
    job: Job,
    head: bool,
    close: bool,
    /// The request revalidates: once the file is checked or looked up, the general path
    /// answers it (its 304 or 200) from the entry made fresh.
    revalidating: bool,
    observed: Observed,
    generation: Arc<Generation>,
    index: usize,
    start: Instant,
}

/// What the access log and the tracer took from a request, each when on.
struct Observed {
    facts: Option<RequestFacts>,
    span: Option<ServerSpan>,
}

/// What the access log records of a request answered here: what the general path copies from
/// hyper's request (`service::RequestFacts::of`), read from the raw head.
fn facts(req: &Plain<'_>) -> RequestFacts {
    // The first of each, as a header map's `get` reads it.
    let first = |name| first_line(req.headers, name).unwrap_or_default();
    RequestFacts {
        time: std::time::SystemTime::now(),
        method: if req.head { Method::HEAD } else { Method::GET },
        text: RequestText::new(
            req.target,
            host_of(req.host),
            first("user-agent"),
            first("referer"),
        ),
    }
}

/// Ends a response head: `Connection: close` when the connection ends with it (hyper's line
/// for such an answer), the `Date` line and the blank line.
fn end_head(out: &mut Vec<u8>, close: bool) {
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    date::push_field(out, coarse_unix_secs());
    out.extend_from_slice(b"\r\n");
}

/// What answering the requests at the front of the buffer came to.
enum Front {
    /// Every complete request was answered; more bytes are needed for the next one.
    NeedMore,
    /// The answers reached [`OUT_LIMIT`]: write them, then go on with the buffer.
    Full,
    /// The request at the front of the buffer is hyper's.
    HandOff,
    /// The last answer ends the connection: the client asked for it to close.
    Close,
    /// The request at the front, `len` bytes, waits for its file's re-check or lookup.
    Waits(Box<Pending>, usize),
    /// The request at the front (already removed from the buffer) is proxied: it is forwarded
    /// once the answers before it are written.
    Forwards(Box<Forwarded>),
    /// The request at the front (already removed from the buffer) goes to the service once the
    /// answers before it are written.
    General(Box<General>),
}

/// Answers the complete requests at the front of `buf` into `out`, removing them from `buf`,
/// until one is hyper's or waits, the buffer holds no complete request, or `out` is full.
fn answer_front(lane: &Lane<'_>, buf: &mut BytesMut, out: &mut Answers) -> Front {
    while !buf.is_empty() {
        if out.len() >= OUT_LIMIT {
            return Front::Full;
        }
        // Left uninitialised: the parser writes the ones it finds, and filling every slot
        // first would be stores on every request for nothing.
        let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let len = match req.parse_with_uninit_headers(buf, &mut headers) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Front::NeedMore,
            // hyper answers a malformed head (400) or one with more headers (up to its own
            // limit) itself.
            Err(_) => return Front::HandOff,
        };
        let Some(plain) = classify(&req) else {
            return Front::HandOff;
        };
        match lane.answer(&plain, out) {
            // Whatever the client sent after it is not answered (nor was it by hyper).
            Outcome::Answered if plain.close => return Front::Close,
            Outcome::Answered => {}
            Outcome::HandOff => return Front::HandOff,
            Outcome::Waits(pending) => return Front::Waits(pending, len),
            Outcome::Forwards(job) => {
                buf.advance(len);
                return Front::Forwards(job);
            }
            Outcome::General(routed) => {
                let Some(job) = General::read(&req, &buf[..len], plain.close, routed) else {
                    return Front::HandOff;
                };
                buf.advance(len);
                return Front::General(job);
            }
        }
        buf.advance(len);
    }
    Front::NeedMore
}

/// Serves `io` on the fast path until the connection ends or hyper has to take over
/// ([`Ended::HandOff`]: `buf` then holds the bytes read and not answered).
pub async fn serve<IO>(
    lane: &Lane<'_>,
    rt: &ListenerRuntime,
    io: &mut IO,
    buf: &mut BytesMut,
    watch: &ConnWatch,
) -> Ended
where
    IO: AsyncRead + AsyncWrite + SendFile + Unpin,
{
    let mut out = Answers::with_room();
    loop {
        let front = match answer_front(lane, buf, &mut out) {
            // The re-check or lookup goes to the blocking pool; the answer joins the others
            // after it, in order.
            Front::Waits(pending, len) => {
                let close = pending.close;
                // Not boxed, unlike the forwarded request's exchange below: boxing it made the
                // connection's future smaller yet raised the peak memory of many connections
                // (docs/performance-log.md, "The fast path's future: the upstream exchange
                // boxed").
                if !lane.finish_waiting(*pending, &mut out).await {
                    // The service answers it after all (a revalidation of a file just looked
                    // up, say): the request is still at the front of the buffer.
                    match General::at_front(buf, len, close, None) {
                        Some(job) => Front::General(job),
                        None => Front::HandOff,
                    }
                } else if close {
                    Front::Close
                } else {
                    buf.advance(len);
                    Front::Full
                }
            }
            front => front,
        };
        // Answers already made go out before hyper takes over: they come first on the wire.
        if !out.is_empty() {
            let mut write = WriteAll {
                io: &mut *io,
                answers: &out,
                written: 0,
                done: false,
            };
            let wrote = until_done(&mut write, watch, rt, true).await;
            // Written whole, even when a drain then closes the connection: the answers'
            // spans end now. Otherwise they are dropped, and record that the client left.
            if write.done {
                out.clear();
            }
            if let Err(end) = wrote {
                return end;
            }
        }
        match front {
            Front::HandOff => return Ended::HandOff,
            Front::Close => return close(lane, io, watch, rt).await,
            Front::Forwards(job) => {
                let closes = job.closes();
                // Boxed for the request's time: the exchange with the upstream is kilobytes of
                // state, which every fast-path connection's future would otherwise carry for
                // its whole life, proxied or not; the box costs a proxied request one
                // allocation and the future's copy into it.
                let forwarded = Box::pin(lane.forward(*job, io, buf, &mut out, watch, rt));
                if let Err(end) = forwarded.await {
                    return end;
                }
                if closes {
                    return close(lane, io, watch, rt).await;
                }
                continue;
            }
            Front::General(job) => {
                // Boxed for the request's time, as the forwarded exchange above.
                let served = Box::pin(lane.serve_general(job, io, buf, &mut out, watch, rt));
                match served.await {
                    Ok(true) => return close(lane, io, watch, rt).await,
                    Ok(false) => continue,
                    Err(end) => return end,
                }
            }
            Front::Full | Front::Waits(..) => continue,
            Front::NeedMore => {}
        }
        if buf.len() >= rt.max_head {
            // A head larger than the limit: hyper answers 431.
            return Ended::HandOff;
        }
        let mut read = ReadMore {
            io: &mut *io,
            buf: &mut *buf,
        };
        match until_done(&mut read, watch, rt, false).await {
            Ok(0) if buf.is_empty() => return Ended::Closed,
            // The client ended mid-head: hyper reports it as it would have.
            Ok(0) => return Ended::HandOff,
            Ok(_) => {}
            Err(end) => return end,
        }
    }
}

thread_local! {
    /// A read buffer that a waiting connection of this thread let go, for the next one to read.
    static SPARE_READ_BUFFER: Cell<Option<BytesMut>> = const { Cell::new(None) };
}

/// Gives `buf` room to read into: the thread's spare buffer if it has none.
fn make_room(buf: &mut BytesMut) {
    if buf.capacity() == 0 {
        *buf = SPARE_READ_BUFFER
            .take()
            .unwrap_or_else(|| BytesMut::with_capacity(READ_CHUNK));
        return;
    }
    rewind(buf);
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// Lets go of an empty read buffer while its connection waits; a buffer grown past the usual
/// size (or still shared, so [`make_room`] could not rewind it) goes back to the allocator.
/// [`make_room`] rewound it before the read that found nothing, so it is at its start.
fn give_back(buf: &mut BytesMut) {
    let spare = std::mem::take(buf);
    if spare.capacity() == READ_CHUNK {
        SPARE_READ_BUFFER.set(Some(spare));
    }
}

/// Moves an empty buffer's free space back to the start of its memory. When the next request is
/// there already (pipelined, or arriving while the answer was written), reading on where the
/// last one ended would walk the requests through all 4 KiB, into lines no cache holds, instead
/// of the ones just used.
fn rewind(buf: &mut BytesMut) {
    if buf.is_empty() {
        // One byte more than the room after the cursor is found only by moving the (empty)
        // data to the start of the memory; `try_reclaim` never allocates. Refused when the
        // cursor is at the start already, or the memory is shared: nothing to do then.
        let _ = buf.try_reclaim(buf.capacity() + 1);
    }
}

/// Ends a connection whose last answer has been written. A TLS session is closed with its
/// `close_notify` (as hyper's shutdown does), so a client can tell the end from a truncation;
/// plain TCP needs no `shutdown`: the connection's close, right after, sends the FIN behind
/// the answer (once [`super::linger`] has read away what the client sent after its request).
async fn close<IO: AsyncWrite + Unpin>(
    lane: &Lane<'_>,
    io: &mut IO,
    watch: &ConnWatch,
    rt: &ListenerRuntime,
) -> Ended {
    if lane.svc.conn.tls {
        let mut shutdown =
            std::pin::pin!(async { tokio::io::AsyncWriteExt::shutdown(io).await.map(|()| 0) });
        let _ = until_done(&mut shutdown, watch, rt, true).await;
    }
    Ended::Closed
}

/// Runs an IO step until it is done or the watchdog ends the connection. While writing
/// (`writing`), a drain or idle signal lets the answers already made go out first and then
/// closes, as hyper's graceful shutdown does; while waiting for a request, it closes at once.
async fn until_done<F>(
    step: &mut F,
    watch: &ConnWatch,
    rt: &ListenerRuntime,
    writing: bool,
) -> Result<usize, Ended>
where
    F: Future<Output = std::io::Result<usize>> + Unpin,
{
    let mut draining = false;
    loop {
        let signal = match std::future::poll_fn(|cx| watch.poll_until(Pin::new(&mut *step), cx))
            .await
        {
            Ok(Ok(_)) if draining => return Err(Ended::Closed),
            Ok(Ok(n)) => return Ok(n),
            Ok(Err(e)) => {
                tracing::debug!(listener = %rt.name, error = %e, "connection ended with an error");
                return Err(Ended::Closed);
            }
            Err(signal) => signal,
        };
        let verdict = match signal {
            Signal::Stop => Verdict::Idle,
            Signal::Expired(code) => Verdict::from_code(code),
        };
        match verdict {
            Verdict::SlowHead => {
                tracing::debug!(listener = %rt.name, "request head not received in time; closing");
                return Err(Ended::Closed);
            }
            Verdict::WriteStalled => {
                // Dropping the connection drops what it buffered (see `conn::drive`).
                rt.metrics.write_timeouts.inc();
                tracing::debug!(listener = %rt.name, "client read nothing for write_timeout; closing");
                return Err(Ended::Closed);
            }
            Verdict::Idle | Verdict::Wait(_) if writing => draining = true,
            Verdict::Idle | Verdict::Wait(_) => return Err(Ended::Closed),
        }
    }
}

/// Reads what the client sent into the buffer's free space.
///
/// A connection waiting for its next request holds no read buffer: an empty one is given to the
/// thread's spare slot when the socket has nothing to read, and the next connection of the
/// thread to read takes it. So the connections of a worker take turns with the same few cache
/// lines, where each kept a buffer of its own that, with many connections, no cache held
/// between two of its requests.
struct ReadMore<'a, IO> {
    io: &'a mut IO,
    buf: &'a mut BytesMut,
}

impl<IO: AsyncRead + Unpin> Future for ReadMore<'_, IO> {
    type Output = std::io::Result<usize>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        make_room(this.buf);
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut *this.io), cx, this.buf);
        if read.is_pending() && this.buf.is_empty() {
            give_back(this.buf);
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &[u8], f: impl FnOnce(Option<Plain<'_>>)) {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        assert!(matches!(
            req.parse(head),
            Ok(httparse::Status::Complete(n)) if n == head.len()
        ));
        f(classify(&req));
    }

    #[test]
    fn plain_requests_are_read_and_the_rest_left_to_hyper() {
        parse(
            b"GET /a/b?x=1 HTTP/1.1\r\nhOsT: example.com:8080\r\nAccept-Encoding: gzip\r\nConnection: Keep-Alive\r\nIf-None-Match: \"x\"\r\n\r\n",
            |p| {
                let p = p.expect("plain");
                assert_eq!((p.head, p.target, p.path), (false, "/a/b?x=1", "/a/b"));
                assert_eq!(p.host, Some(&b"example.com:8080"[..]));
                assert_eq!(p.accept_encoding, Some(&b"gzip"[..]));
                assert_eq!(p.revalidation.if_none_match, Some(&b"\"x\""[..]));
                assert!(!p.conditional);
            },
        );
        parse(b"HEAD / HTTP/1.1\r\n\r\n", |p| {
            let p = p.expect("plain");
            assert!(p.head && !p.conditional && p.host.is_none() && !p.close);
        });
        for close in ["Connection: close", "connection: Close"] {
            let head = format!("GET / HTTP/1.1\r\nHost: a\r\n{close}\r\n\r\n");
            parse(head.as_bytes(), |p| assert!(p.expect("plain").close));
        }
        parse(
            b"GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: keep-alive\r\n\r\n",
            |p| assert!(!p.expect("plain").close),
        );
        for head in [
            &b"GET / HTTP/1.0\r\n\r\n"[..],
            b"GET http://a/ HTTP/1.1\r\n\r\n",
            b"GET * HTTP/1.1\r\n\r\n",
            b"GET /a{b} HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            b"GET / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: close, x\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\n\r\n",
        ] {
            parse(head, |p| {
                assert!(p.is_none(), "{:?}", String::from_utf8_lossy(head));
            });
        }
        // Only the service answers these: another method, or a field read once given twice.
        for head in [
            &b"POST / HTTP/1.1\r\n\r\n"[..],
            b"DELETE /a HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nAccept-Encoding: gzip\r\nAccept-Encoding: br\r\n\r\n",
            b"GET / HTTP/1.1\r\nRange: bytes=0-1\r\nRange: bytes=2-3\r\n\r\n",
            b"GET / HTTP/1.1\r\nIf-None-Match: \"a\"\r\nif-none-match: \"b\"\r\n\r\n",
            b"GET / HTTP/1.1\r\nIf-Modified-Since: x\r\nIf-Modified-Since: y\r\n\r\n",
        ] {
            parse(head, |p| {
                let p = p.unwrap_or_else(|| panic!("{:?}", String::from_utf8_lossy(head)));
                assert!(p.general, "{:?}", String::from_utf8_lossy(head));
            });
        }
        // A revalidation's two headers are read for a cached file's 304.
        parse(
            b"HEAD / HTTP/1.1\r\nif-modified-since: d\r\nIF-NONE-MATCH: *\r\n\r\n",
            |p| {
                let p = p.expect("plain");
                let r = p.revalidation;
                assert_eq!(
                    (r.if_none_match, r.if_modified_since),
                    (Some(&b"*"[..]), Some(&b"d"[..]))
                );
                assert!(!p.conditional);
            },
        );
        // A range alone is read for the fast path's 206; with `If-Range` it is a precondition's.
        parse(b"GET / HTTP/1.1\r\nrange: bytes=0-1\r\n\r\n", |p| {
            let p = p.expect("plain");
            assert_eq!((p.range, p.conditional), (Some(&b"bytes=0-1"[..]), false));
        });
        for conditional in [
            "Range: bytes=0-1\r\nIf-Range: \"x\"",
            "If-Match: *",
            "if-range: x",
            "If-Unmodified-Since: x",
        ] {
            let head = format!("GET / HTTP/1.1\r\n{conditional}\r\n\r\n");
            parse(head.as_bytes(), |p| assert!(p.expect("plain").conditional));
        }
    }

    #[test]
    fn the_access_log_facts_are_the_first_of_each_header_and_the_host_without_its_port() {
        parse(
            b"HEAD /a?b HTTP/1.1\r\nuser-agent: one\r\nHost: h:81\r\nUser-Agent: two\r\nREFERER: r\xff\r\n\r\n",
            |p| {
                let f = facts(&p.expect("plain"));
                assert_eq!(f.method, Method::HEAD);
                let t = &f.text;
                assert_eq!(
                    (t.target(), t.host(), t.user_agent(), t.referer()),
                    ("/a?b", "h", "one", "r\u{fffd}")
                );
            },
        );
        parse(b"GET / HTTP/1.1\r\n\r\n", |p| {
            let f = facts(&p.expect("plain"));
            let t = &f.text;
            assert_eq!((t.host(), t.user_agent(), t.referer()), ("", "", ""));
        });
    }

    #[test]
    fn every_target_taken_is_one_hyper_takes_with_the_same_path() {
        // Each byte alone and between others, in the path and in the query.
        for b in 0..=255u8 {
            let byte = [b];
            let Ok(text) = std::str::from_utf8(&byte) else {
                continue;
            };
            for target in [format!("/{text}"), format!("/a{text}b?c{text}d")] {
                let Some(path_len) = plain_target(&target) else {
                    continue;
                };
                let uri: http::Uri = target
                    .parse()
                    .unwrap_or_else(|e| panic!("{target:?} taken here, refused by http: {e}"));
                let path = target.split_once('?').map_or(&target[..], |(p, _)| p);
                assert_eq!(&target[..path_len], path, "{target:?}");
                assert_eq!(uri.path(), path, "{target:?}");
                assert_eq!(uri.path_and_query().map(|p| p.as_str()), Some(&target[..]));
            }
        }
        // What a client sends every day is taken.
        assert_eq!(plain_target("/static/app.3f9a.js?v=1&x=%20y?z"), Some(19));
        assert_eq!(plain_target("/a/b;c=d/e~f!g$h'i(j)k*l+m,n:o@p"), Some(32));
        assert_eq!(plain_target("/a b"), None);
        assert_eq!(plain_target("/a#frag"), None);
        assert_eq!(plain_target("a/b"), None);
    }

    #[test]
    fn the_host_is_read_as_the_router_reads_it() {
        assert_eq!(host_of(None), "");
        assert_eq!(host_of(Some(b"Example.com:8080")), "Example.com");
        assert_eq!(host_of(Some(b"[::1]:443")), "[::1]");
        assert_eq!(host_of(Some(b"a\xffb")), "");
        // The same as `router::request_host` over a header map with that value.
        for value in [&b"h.example:1"[..], b"h.example", b"[::1]", b"h:x"] {
            let mut map = HeaderMap::new();
            map.insert(
                http::header::HOST,
                http::HeaderValue::from_bytes(value).expect("value"),
            );
            let uri: http::Uri = "/".parse().expect("uri");
            assert_eq!(
                host_of(Some(value)),
                crate::router::request_host(&uri, &map)
            );
        }
    }

    #[test]
    fn an_emptied_read_buffer_is_read_into_from_its_start_again() {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let start = buf.as_ptr();
        buf.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        buf.advance(buf.len());
        assert_ne!(buf.as_ptr(), start);
        rewind(&mut buf);
        assert_eq!(buf.as_ptr(), start);
        assert_eq!(buf.capacity(), READ_CHUNK);

        // Bytes not yet answered stay where they are.
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n");
        buf.advance(4);
        let rest = buf.as_ptr();
        rewind(&mut buf);
        assert_eq!((buf.as_ptr(), &buf[..]), (rest, &b"/ HTTP/1.1\r\n"[..]));

        // A buffer with no memory yet is left without any.
        let mut fresh = BytesMut::new();
        rewind(&mut fresh);
        assert_eq!(fresh.capacity(), 0);
    }

    #[tokio::test]
    async fn a_connection_waiting_for_its_next_request_holds_no_read_buffer() {
        use tokio::io::AsyncWriteExt;

        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let (_client_a, mut server_a) = tokio::io::duplex(64);
        let (mut client_b, mut server_b) = tokio::io::duplex(64);
        let mut buf_a = BytesMut::with_capacity(READ_CHUNK);
        let memory = buf_a.as_ptr();
        let mut waiting = ReadMore {
            io: &mut server_a,
            buf: &mut buf_a,
        };
        assert!(Pin::new(&mut waiting).poll(&mut cx).is_pending());
        assert_eq!(waiting.buf.capacity(), 0);

        // The next connection of the thread to read takes the same memory.
        let mut buf_b = BytesMut::new();
        let mut reading = ReadMore {
            io: &mut server_b,
            buf: &mut buf_b,
        };
        client_b.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let Poll::Ready(Ok(n)) = Pin::new(&mut reading).poll(&mut cx) else {
            panic!("the bytes written were not read");
        };
        assert_eq!(&reading.buf[..n], b"GET / HTTP/1.1\r\n");
        assert_eq!(
            (reading.buf.as_ptr(), reading.buf.capacity()),
            (memory, READ_CHUNK)
        );

        // Bytes read and not yet answered are kept while the rest is awaited.
        assert!(Pin::new(&mut reading).poll(&mut cx).is_pending());
        assert_eq!(&reading.buf[..], b"GET / HTTP/1.1\r\n");
    }
}
