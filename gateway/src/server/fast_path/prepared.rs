//! The answers the fast path makes itself, for a route without filters: a `respond` route's
//! fixed response, a `redirect` (its `Location` made from the head's host and path), a static
//! file (cached, or looked up here and sent from disk), a range of it (206), its 304 and the
//! general path's error pages, each recorded in the route's metrics, the access log and the
//! trace as the general path records it. Other requests go on to
//! [`super::forward`] or [`super::general`].

use std::sync::Arc;
use std::time::Instant;

use gateway_http1::date;
use gateway_http1::fields::push_field;
use http::{Method, StatusCode, Version};
use stream_proxy::clock::coarse_unix_secs;

use super::Lane;
use super::answers::Answers;
use super::classify::{Plain, facts, host_of};
use super::forward::Forwarded;
use crate::generation::{CompiledRoute, Generation};
use crate::request;
use crate::server::service::RequestFacts;
use crate::static_files::{
    LargeFile, Looked, Missed, Prepared, PreparedFile, RangeSpec, Ranged, Recheck, StaticFiles,
};
use crate::telemetry::LogNotes;
use crate::telemetry::trace::ServerSpan;
use crate::terminal::{Origin, Terminal};

impl Lane<'_> {
    /// Appends the answer to `req` to `answers`, or says why not.
    pub(super) fn answer(&self, req: &Plain<'_>, answers: &mut Answers) -> Outcome {
        let svc = self.svc;
        // An ACME challenge's answer is hyper's (the service checks for it on its calls).
        if let Some(c) = &svc.http01
            && c.http_answer(req.path).is_some()
        {
            return Outcome::HandOff;
        }
        // A request the entry rules would refuse or change goes to the service, which applies
        // them (`crate::request`); so does one whose trusted proxy names its client, which the
        // service makes the request's (`ListenerPolicy::client_of`).
        if req.general
            || (self.trusted_peer && crate::forwarded::names_a_client(req.headers))
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
        let Some(index) = router.find_index(listener, &method, host, req.path, &super::NO_HEADERS)
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
                out.extend_from_slice(self.listener_lines);
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
            Terminal::Redirect(r) => {
                // Made from the request's host and path, which the entry rules passed as they
                // are; a host it will not write is the service's to refuse.
                let Some(location) = r.location(&origin(req, &svc.conn)) else {
                    return routed();
                };
                svc.activity.request_started(false);
                let out = &mut answers.text;
                let (length, body) = r.push_wire_head(out, &location);
                if let Some(server) = server {
                    push_field(out, b"server", server.as_bytes());
                }
                out.extend_from_slice(self.listener_lines);
                out.extend_from_slice(length);
                end_head(out, req.close);
                if !req.head {
                    answers.push_body(body, None);
                }
                let observe = || {
                    let mut observed = self.observe(req);
                    if let Some(facts) = &mut observed.facts {
                        let redirect = location.to_str().ok().map(Box::from);
                        facts.notes = Some(Box::new(LogNotes {
                            redirect,
                            ..LogNotes::default()
                        }));
                    }
                    observed
                };
                self.record(route, r.status(), body.len(), start, observe, answers);
            }
            // A mirror tees request bodies and sends copies: the general path's work.
            Terminal::Proxy(proxy) if !proxy.mirrors() => {
                return match self.rewrite(req, proxy, &generation, index, start) {
                    Some(job) => Outcome::Forwards(job),
                    None => routed(),
                };
            }
            // Only when every upstream of the split takes text requests, and no trace needs
            // the general path: a pick made here is then the request's only one.
            Terminal::Split(split) if split.forwards_as_text() && !svc.telemetry.tracer.is_on() => {
                let Some(proxy) = split.pick_upstream() else {
                    return routed();
                };
                return match self.rewrite(req, proxy, &generation, index, start) {
                    Some(job) => Outcome::Forwards(job),
                    None => routed(),
                };
            }
            Terminal::Proxy(_) | Terminal::Split(_) => return routed(),
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
        out.extend_from_slice(self.listener_lines);
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
    pub(super) fn record(
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
    pub(super) async fn finish_waiting(&self, pending: Pending, answers: &mut Answers) -> bool {
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
        out.extend_from_slice(self.listener_lines);
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
        out.extend_from_slice(self.listener_lines);
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
        out.extend_from_slice(self.listener_lines);
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
        self.push_response(crate::error::error_response(status), how, server, answers)
    }

    /// Appends a response the gateway made whole (an error page) as the general path sends it
    /// (the `Server` field when it has none, the listener's fields, the head encoded as
    /// [`gateway_http1::response::push_head`] encodes every response), to a `HEAD` (`head`) or a
    /// `GET`, with `Connection: close` when it ends the connection (`close`); returns the body's
    /// length.
    pub(super) fn push_response(
        &self,
        res: http::Response<crate::body::Body>,
        (head, close): (bool, bool),
        server: Option<&http::HeaderValue>,
        answers: &mut Answers,
    ) -> usize {
        let mut res = crate::filter::with_server(res, server);
        self.svc.decorate(&mut res);
        let body = res.body().as_full().cloned().unwrap_or_default();
        let length = gateway_http1::BodyLength::Known(body.len() as u64);
        let to = gateway_http1::response::Answering {
            head_only: head,
            close,
        };
        let now = stream_proxy::clock::coarse_unix_secs();
        let (status, headers) = (res.status(), res.headers());
        gateway_http1::response::push_head(&mut answers.text, status, headers, length, to, now);
        if !head {
            answers.push_body(&body, None);
        }
        body.len()
    }
}

/// What became of a request.
pub(super) enum Outcome {
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
pub(super) struct Pending {
    files: Arc<StaticFiles>,
    job: Job,
    head: bool,
    pub(super) close: bool,
    /// The request revalidates: once the file is checked or looked up, the general path
    /// answers it (its 304 or 200) from the entry made fresh.
    revalidating: bool,
    observed: Observed,
    generation: Arc<Generation>,
    index: usize,
    start: Instant,
}

/// What the access log and the tracer took from a request, each when on.
pub(super) struct Observed {
    pub(super) facts: Option<RequestFacts>,
    pub(super) span: Option<ServerSpan>,
}

/// What a redirect's `Location` is made from, read off the request's head.
fn origin<'r>(req: &Plain<'r>, conn: &crate::connection::ConnInfo) -> Origin<'r> {
    Origin {
        scheme: if conn.tls { "https" } else { "http" },
        authority: req
            .host
            .and_then(|h| std::str::from_utf8(h).ok())
            .filter(|h| !h.is_empty()),
        local: conn.local,
        path: req.path,
        query: req.target.get(req.path.len() + 1..),
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
