//! Terminal `static`: files from a root directory, with nginx `root` semantics (the whole
//! request path names a file under the root). Small files are served from memory with every
//! header precomputed; large ones stream from disk in large chunks. See docs/static-files.md.
//!
//! The modules: `path` (safe request-path normalisation), `resolve` (file-system lookup under
//! the root, index files, precompressed siblings), `cache` (the in-memory cache), `conditional`
//! (validators, preconditions, ranges), `encoding` (Accept-Encoding and compression), `mime`
//! (content types), `stream` (the file body), `response` (header assembly), `sealed` (large
//! cached bodies in sealed memory files, which the HTTP/1.1 fast path sends with `sendfile`) and
//! `prepared` (the HTTP/1.1 fast path's entry points).

mod cache;
mod conditional;
mod descriptors;
pub(crate) mod encoding;
pub(crate) mod mime;
mod misses;
mod open_files;
mod path;
mod prepared;
mod resolve;
mod response;
mod sealed;
mod stream;

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyDataStream;
use tokio_util::io::StreamReader;

use self::cache::{Cache, Cached, Entry};
use self::conditional::{Asked, Plan, Validators};
pub use self::conditional::{RangeSpec, Revalidation};
use self::encoding::{Accept, Encoding};
use self::misses::{Miss, Misses, follow};
use self::open_files::{INACTIVE_MS, OpenFile, OpenFiles};
pub use self::prepared::{LargeFile, Looked, Missed, Prepared, PreparedFile, Ranged, Recheck};
use self::resolve::{Found, Settings, Streamed, Want};
use self::response::Representation;
pub use self::sealed::SealedFile;
use self::stream::FileBody;
use crate::body::Body;
use crate::error::error_response;

/// A compiled `static` terminal.
pub struct StaticFiles {
    settings: Arc<Settings>,
    cache: Cache<Entry>,
    /// Large files kept open for the HTTP/1.1 fast path.
    open: OpenFiles,
    /// When `open` was last swept of files nobody asks for, in ms of [`now_ms`].
    swept: std::sync::atomic::AtomicU64,
    /// Lookups in progress, which concurrent misses for the same file wait for.
    misses: Misses,
    /// Lookups sent to the blocking pool, for tests.
    #[cfg(test)]
    lookups: std::sync::atomic::AtomicUsize,
    /// `cache.revalidate_after` in milliseconds of [`now_ms`].
    revalidate: u64,
    /// What a fresh response map holds; a request's map is reused up to this size.
    reusable_map: usize,
}

/// The request's header map, as a cached file's response gets it.
enum RequestHeaders<'a> {
    /// Read for the preconditions; the response gets a fresh map.
    Read(&'a HeaderMap),
    /// Read, then emptied for the response (a route without filters), which also gets the
    /// server's `Server` header.
    Reuse(HeaderMap, Option<&'a HeaderValue>),
}

impl RequestHeaders<'_> {
    fn get(&self) -> &HeaderMap {
        match self {
            Self::Read(map) => map,
            Self::Reuse(map, _) => map,
        }
    }
}

/// A response map with room for every header a file response carries.
fn fresh_map() -> HeaderMap {
    HeaderMap::with_capacity(response::HEADERS)
}

impl StaticFiles {
    /// Builds the terminal from validated config.
    pub fn new(cfg: &gateway_config::model::StaticConfig) -> Result<Self, String> {
        // Symlinks are judged against the canonical root, so it is resolved once here.
        let root = std::fs::canonicalize(&cfg.root)
            .map_err(|e| format!("root {}: {e}", cfg.root.display()))?;
        if !root.is_dir() {
            return Err(format!("root {} is not a directory", root.display()));
        }
        let cache_control = cfg
            .cache_control
            .as_deref()
            .map(HeaderValue::from_str)
            .transpose()
            .map_err(|_| "cache_control is not a valid header value".to_owned())?;
        let (max_file, max_total) = (
            cfg.cache.max_file_size.bytes(),
            cfg.cache.max_total_size.as_usize(),
        );
        let settings = Settings {
            root,
            index: cfg.index.clone(),
            precompressed: codings(&cfg.precompressed),
            compress: codings(&cfg.compress),
            compress_min_size: cfg.compress_min_size.bytes(),
            cache_max_file: (max_file > 0 && max_total > 0).then_some(max_file),
            cache_control,
        };
        // With the memory cache off, nothing is kept open either.
        let max_open = match settings.cache_max_file {
            Some(_) => cfg.cache.max_open_files,
            None => 0,
        };
        Ok(Self {
            settings: Arc::new(settings),
            cache: Cache::new(max_total),
            open: OpenFiles::new(max_open),
            swept: std::sync::atomic::AtomicU64::new(0),
            misses: Misses::default(),
            #[cfg(test)]
            lookups: std::sync::atomic::AtomicUsize::new(0),
            revalidate: millis(cfg.cache.revalidate_after.get()),
            reusable_map: fresh_map().capacity(),
        })
    }

    /// The answer when it needs no waiting: a file from the cache that needs no re-check, or a
    /// request refused for its method or path. `None`: [`StaticFiles::serve`] answers.
    ///
    /// Most requests for a cached file end here, so the request path makes no future for them
    /// (the service and the filter chain answer at once, as for a synthetic response).
    pub fn serve_now(
        &self,
        method: &Method,
        uri: &http::Uri,
        headers: &HeaderMap,
    ) -> Option<Response<Body>> {
        match self.fresh_now(method, uri, headers)? {
            Ok((entry, head, want)) => {
                Some(self.serve_cached(&entry, RequestHeaders::Read(headers), head, want))
            }
            Err(refused) => Some(*refused),
        }
    }

    /// [`StaticFiles::serve_now`] on a route without filters: the response takes over the
    /// request's header map (see [`crate::terminal::Respond`]) and carries `server`.
    pub fn serve_now_alone(
        &self,
        req: &mut Request<Body>,
        server: Option<&HeaderValue>,
    ) -> Option<Response<Body>> {
        match self.fresh_now(req.method(), req.uri(), req.headers())? {
            Ok((entry, head, want)) => {
                let request = RequestHeaders::Reuse(std::mem::take(req.headers_mut()), server);
                Some(self.serve_cached(&entry, request, head, want))
            }
            Err(refused) => Some(crate::filter::with_server(*refused, server)),
        }
    }

    /// Keeps a large file a lookup found open for the next requests (see [`open_files`]), or
    /// forgets the one kept under `key` when the lookup found something else; and closes files
    /// nobody asked for in the minute after they fell due (at most one sweep a second).
    fn track_open(&self, key: &str, found: &Result<Found, StatusCode>, now: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let kept = match found {
            Ok(Found::Stream(s)) if !s.vary && self.open.budget() > 0 => {
                let last_modified = s.version.last_modified();
                let not_modified =
                    response::not_modified_lines(&self.representation(s, &last_modified));
                OpenFile::new(s.clone(), self.large(s), not_modified, now)
            }
            _ => {
                self.open.remove(key);
                return;
            }
        };
        match kept {
            Ok(open) => self.open.insert(key, Arc::new(open)),
            Err(e) => {
                tracing::debug!(error = %e, "a large file is not kept open; it is opened per request");
                self.open.remove(key);
            }
        }
        let swept = self.swept.load(Relaxed);
        if now.saturating_sub(swept) >= 1_000
            && self
                .swept
                .compare_exchange(swept, now, Relaxed, Relaxed)
                .is_ok()
        {
            let due = now.saturating_sub(self.revalidate.saturating_add(INACTIVE_MS));
            self.open.drop_checked_before(due);
        }
    }

    /// The headers of a large file's answers (`last_modified` made from its version).
    fn representation<'a>(
        &'a self,
        s: &'a Streamed,
        last_modified: &'a HeaderValue,
    ) -> Representation<'a> {
        Representation {
            content_type: &s.content_type,
            last_modified,
            etag: &s.etag,
            vary: s.vary,
            encoding: s.encoding,
            cache_control: self.settings.cache_control.as_ref(),
        }
    }

    /// What the two answers without a future share: the request's refusal, or the fresh cached
    /// entry that answers it. `None`: not cached, or due for its re-check ([`StaticFiles::serve`]).
    #[expect(
        clippy::type_complexity,
        reason = "one private call site pair; a named type would only restate the tuple"
    )]
    fn fresh_now(
        &self,
        method: &Method,
        uri: &http::Uri,
        headers: &HeaderMap,
    ) -> Option<Result<(Arc<Entry>, bool, Want), Box<Response<Body>>>> {
        let (head, key, want) = match admit(method, uri, headers) {
            Ok(admitted) => admitted,
            Err(refused) => return Some(Err(refused)),
        };
        let entry = self.cache.get(&key)?;
        let now = now_ms();
        entry
            .is_fresh(now, self.revalidate)
            .then_some(Ok((entry, head, want)))
    }

    /// Serves one request.
    pub async fn serve(self: Arc<Self>, req: Request<Body>) -> Response<Body> {
        let headers = req.headers();
        let (head, key, want) = match admit(req.method(), req.uri(), headers) {
            Ok(admitted) => admitted,
            Err(refused) => return *refused,
        };
        let now = now_ms();
        let prev = self.cache.get(&key);
        if let Some(e) = &prev
            && !e.claim_revalidation(now, self.revalidate)
        {
            return self.serve_cached(e, RequestHeaders::Read(headers), head, want);
        }
        // A large file kept open: streamed from the kept descriptor (see `prepared`).
        if prev.is_none()
            && let Some(open) = self.open.get(&key)
            && open.answers(now, self.revalidate)
        {
            return self.serve_streamed(open.streamed(), headers, head, want);
        }

        // A miss waits for a lookup of the same file already in progress; if that one left
        // nothing in the cache (a file too large for it, or a cancelled lookup), it looks the
        // file up itself.
        let lead = match prev {
            Some(_) => None,
            None => match self.misses.join(&key) {
                Miss::Lead(lead) => {
                    // A lookup may have ended between the cache read above and the join: it
                    // puts its entry in the cache before it lets go of the lead, so the entry
                    // is there now and this request needs no lookup of its own.
                    if let Some(e) = self.cache.get(&key)
                        && e.is_fresh(now, self.revalidate)
                    {
                        return self.serve_cached(&e, RequestHeaders::Read(headers), head, want);
                    }
                    Some(lead)
                }
                Miss::Follow(done) => {
                    if let Some(status) = follow(done).await {
                        return error_response(status);
                    }
                    if let Some(e) = self.cache.get(&key) {
                        return self.serve_cached(&e, RequestHeaders::Read(headers), head, want);
                    }
                    if let Some(open) = self.open.get(&key) {
                        return self.serve_streamed(open.streamed(), headers, head, want);
                    }
                    None
                }
            },
        };
        // A miss or a revalidation: one hop to the blocking pool does all the file work.
        #[cfg(test)]
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = key.into_owned();
        let settings = self.settings.clone();
        let old = prev.clone();
        let job = tokio::task::spawn_blocking(move || {
            let found = resolve::lookup(&settings, &key, want, old.as_deref());
            (key, found)
        });
        let Ok((key, found)) = job.await else {
            return error_response(StatusCode::INTERNAL_SERVER_ERROR);
        };
        self.track_open(&key, &found, now);
        match (found, prev) {
            (Ok(Found::Unchanged), Some(e)) => {
                self.serve_cached(&e, RequestHeaders::Read(headers), head, want)
            }
            (Ok(Found::Cached(e)), _) => {
                e.set_checked(now);
                self.cache.insert(&key, e.clone());
                self.serve_cached(&e, RequestHeaders::Read(headers), head, want)
            }
            (other, prev) => {
                // The file is gone, too large now, or a directory: forget the old entry.
                if prev.is_some() {
                    self.cache.remove(&key);
                }
                match other {
                    Ok(Found::Redirect) => {
                        response::redirect(path::dir_location(&key, req.uri().query()))
                    }
                    Ok(Found::Stream(s)) => self.serve_streamed(s, headers, head, want),
                    Err(status) => {
                        if let Some(lead) = &lead {
                            lead.failed(status);
                        }
                        error_response(status)
                    }
                    // `Unchanged` only answers a lookup that had a previous entry, and
                    // `Cached` is handled above.
                    Ok(Found::Unchanged | Found::Cached(_)) => {
                        error_response(StatusCode::INTERNAL_SERVER_ERROR)
                    }
                }
            }
        }
    }

    /// The hot path: everything is precomputed in the entry.
    fn serve_cached(
        &self,
        e: &Entry,
        request: RequestHeaders<'_>,
        head: bool,
        want: Want,
    ) -> Response<Body> {
        let v = if want.range {
            &e.identity
        } else {
            e.choose(&want.accept)
        };
        let len = v.body.len() as u64;
        let h = Representation {
            content_type: &e.content_type,
            last_modified: &e.last_modified,
            etag: &v.etag,
            vary: e.vary,
            encoding: v.encoding,
            cache_control: self.settings.cache_control.as_ref(),
        };
        let validators = Validators {
            etag: &v.etag,
            modified: e.modified,
            range_len: (want.range && v.encoding.is_none()).then_some(len),
        };
        let body = |b: bytes::Bytes| if head { Body::empty() } else { Body::full(b) };
        let plan = conditional::plan(request.get(), want.preconditions, &validators);
        let (reused, server) = match request {
            RequestHeaders::Read(_) => (None, None),
            RequestHeaders::Reuse(map, server) => (Some(map), server),
        };
        let map = || {
            reused.map_or_else(fresh_map, |map| {
                crate::terminal::response_map(map, response::HEADERS, self.reusable_map)
            })
        };
        let mut res = match plan {
            // The request's map is dropped (its headers have been read); hyper keeps the
            // response's for the connection's next request.
            Plan::Full => return response::ok_cached(&v.ok_headers, server, body(v.body.clone())),
            Plan::Partial { start, end } => {
                // Ranges are clamped to the body, whose length fits in usize.
                let slice = v.body.slice(start as usize..=end as usize);
                response::partial(map(), &h, body(slice), start, end, len)
            }
            Plan::NotModified => response::not_modified(map(), &h),
            Plan::PreconditionFailed => error_response(StatusCode::PRECONDITION_FAILED),
            Plan::Unsatisfiable => response::unsatisfiable(len),
        };
        if let Some(server) = server {
            res.headers_mut().insert(header::SERVER, server.clone());
        }
        res
    }

    /// A large file: headers computed now, the body streamed from the open file.
    fn serve_streamed(
        &self,
        s: Streamed,
        headers: &HeaderMap,
        head: bool,
        want: Want,
    ) -> Response<Body> {
        let last_modified = s.version.last_modified();
        let h = self.representation(&s, &last_modified);
        let validators = Validators {
            etag: &s.etag,
            modified: s.version.http_secs(),
            range_len: (want.range && s.encoding.is_none()).then_some(s.len),
        };
        match conditional::plan(headers, want.preconditions, &validators) {
            Plan::Full if head => {
                let len = (!s.compress).then(|| HeaderValue::from(s.len));
                response::ok(fresh_map(), &h, Body::empty(), len)
            }
            Plan::Full => match s.encoding.filter(|_| s.compress) {
                Some(e) => {
                    let raw = FileBody::new(s.file.clone(), 0, s.len);
                    let input = StreamReader::new(BodyDataStream::new(raw));
                    response::ok(fresh_map(), &h, encoding::compress_stream(e, input), None)
                }
                None => {
                    let body = Body::new(FileBody::new(s.file.clone(), 0, s.len));
                    response::ok(fresh_map(), &h, body, Some(HeaderValue::from(s.len)))
                }
            },
            Plan::Partial { start, end } => {
                let body = Body::new(FileBody::new(s.file.clone(), start, end - start + 1));
                response::partial(fresh_map(), &h, body, start, end, s.len)
            }
            Plan::NotModified => response::not_modified(fresh_map(), &h),
            Plan::PreconditionFailed => error_response(StatusCode::PRECONDITION_FAILED),
            Plan::Unsatisfiable => response::unsatisfiable(s.len),
        }
    }
}

/// Config codings in order, without duplicates.
fn codings(list: &[gateway_config::model::ContentEncoding]) -> Vec<Encoding> {
    let mut out: Vec<Encoding> = Vec::with_capacity(list.len());
    for &c in list {
        let e = Encoding::from_config(c);
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// What every request is checked for first: its method (`head` for HEAD), its path as a cache
/// key, and what it accepts; or the response that refuses it.
fn admit<'u>(
    method: &Method,
    uri: &'u http::Uri,
    headers: &HeaderMap,
) -> Result<(bool, std::borrow::Cow<'u, str>, Want), Box<Response<Body>>> {
    // The refusal is boxed: it is rare, and inline it would make every `Ok` that large.
    let head = match *method {
        Method::GET => false,
        Method::HEAD => true,
        _ => return Err(Box::new(response::method_not_allowed())),
    };
    let key = path::normalize(uri.path())
        .map_err(|e| Box::new(error_response(e.status())))?
        .key;
    let asked = Asked::of(headers);
    let want = Want {
        accept: if asked.accept_encoding {
            Accept::from_headers(headers)
        } else {
            Accept::default()
        },
        // Range is only defined for GET (RFC 9110 §14.2).
        range: !head && asked.range,
        preconditions: asked.preconditions,
    };
    Ok((head, key, want))
}

/// The cache's clock: the coarse monotonic clock (the kernel's last tick), read without a
/// TSC read and the conversion `Instant::now` does on every cached file's request. Its tick
/// (1–10 ms) can make a re-check that much late, which no `revalidate_after` notices.
fn now_ms() -> u64 {
    stream_proxy::clock::coarse_ms()
}

/// A duration in whole milliseconds, rounded up: a sub-millisecond `revalidate_after` still
/// trusts an entry for a moment rather than never.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200 concurrent requests for `path` under a root holding `a.txt`: their statuses, and
    /// how many lookups went to the blocking pool.
    async fn concurrent_requests(path: &'static str) -> (Vec<StatusCode>, usize) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.txt"), "hello").expect("write");
        let cfg: gateway_config::model::StaticConfig =
            serde_yaml::from_str(&format!("root: {}", dir.path().display())).expect("config");
        let files = Arc::new(StaticFiles::new(&cfg).expect("static"));
        let requests: Vec<_> = (0..200)
            .map(|_| {
                let files = files.clone();
                tokio::spawn(async move {
                    let req = Request::get(path).body(Body::empty()).expect("request");
                    files.serve(req).await.status()
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for r in requests {
            statuses.push(r.await.expect("task"));
        }
        let lookups = files.lookups.load(std::sync::atomic::Ordering::Relaxed);
        (statuses, lookups)
    }

    #[tokio::test]
    async fn a_cached_file_is_answered_at_once_until_it_needs_a_recheck() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.txt"), "hello").expect("write");
        let cfg: gateway_config::model::StaticConfig = serde_yaml::from_str(&format!(
            "{{ root: {}, cache: {{ revalidate_after: 1s }} }}",
            dir.path().display()
        ))
        .expect("config");
        let files = Arc::new(StaticFiles::new(&cfg).expect("static"));
        let uri = http::Uri::from_static("/a.txt");
        let headers = HeaderMap::new();
        let now = |method: &Method| files.serve_now(method, &uri, &headers);
        let get = || Request::get("/a.txt").body(Body::empty()).expect("request");
        let lookups = || files.lookups.load(std::sync::atomic::Ordering::Relaxed);

        assert!(now(&Method::GET).is_none(), "not cached yet");
        assert_eq!(files.clone().serve(get()).await.status(), StatusCode::OK);
        assert_eq!(lookups(), 1);

        let res = now(&Method::GET).expect("a cached file needs no future");
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()[header::CONTENT_LENGTH], "5");
        let head = now(&Method::HEAD).expect("HEAD too");
        assert_eq!(head.status(), StatusCode::OK);
        let refused = now(&Method::POST).expect("a refusal needs no future");
        assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(lookups(), 1, "answered from the cache");

        // Past `revalidate_after` the entry is not served at once: the request that claims
        // the re-check goes through `serve`, which looks the file up again.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        assert!(
            now(&Method::GET).is_none(),
            "a stale entry waits for its re-check"
        );
        assert_eq!(files.clone().serve(get()).await.status(), StatusCode::OK);
        assert_eq!(lookups(), 2);
        assert!(
            now(&Method::GET).is_some(),
            "fresh again after the re-check"
        );
    }

    #[tokio::test]
    async fn a_cached_200_is_a_copy_of_its_headers_with_the_server_slot_filled_or_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.txt"), "hello").expect("write");
        let cfg: gateway_config::model::StaticConfig = serde_yaml::from_str(&format!(
            "{{ root: {}, cache_control: max-age=60 }}",
            dir.path().display()
        ))
        .expect("config");
        let files = Arc::new(StaticFiles::new(&cfg).expect("static"));
        let get = || Request::get("/a.txt").body(Body::empty()).expect("request");
        let server = HeaderValue::from_static("gw");
        let mut req = get();
        assert!(files.serve_now_alone(&mut req, Some(&server)).is_none());
        assert_eq!(files.clone().serve(get()).await.status(), StatusCode::OK);

        let file_headers = [
            header::CONTENT_TYPE,
            header::CONTENT_LENGTH,
            header::ETAG,
            header::LAST_MODIFIED,
            header::ACCEPT_RANGES,
            header::CACHE_CONTROL,
        ];
        // A route without filters: the file's headers and the server's, none of the request's.
        let mut req = get();
        req.headers_mut()
            .insert("x-request", HeaderValue::from_static("1"));
        let res = files
            .serve_now_alone(&mut req, Some(&server))
            .expect("cached");
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("x-request").is_none());
        assert_eq!(res.headers().get_all(header::SERVER).iter().count(), 1);
        assert_eq!(res.headers()[header::SERVER], "gw");
        assert_eq!(res.headers()[header::CONTENT_LENGTH], "5");
        assert_eq!(res.headers()[header::CACHE_CONTROL], "max-age=60");
        assert_eq!(res.headers().len(), file_headers.len() + 1);
        for name in &file_headers {
            assert_eq!(res.headers().get_all(name).iter().count(), 1, "{name}");
        }
        let etag = res.headers()[header::ETAG].clone();

        // Without a `Server` header (configured off, or a route with filters, whose chain adds
        // it): no empty slot left behind.
        let mut req = get();
        let res = files.serve_now_alone(&mut req, None).expect("cached");
        assert!(res.headers().get(header::SERVER).is_none());
        assert_eq!(res.headers().len(), file_headers.len());
        let res = files
            .serve_now(&Method::GET, req.uri(), &HeaderMap::new())
            .expect("cached");
        assert!(res.headers().get(header::SERVER).is_none());
        assert_eq!(res.headers().len(), file_headers.len());

        // HEAD: the same headers, no body.
        let mut req = Request::head("/a.txt")
            .body(Body::empty())
            .expect("request");
        let res = files
            .serve_now_alone(&mut req, Some(&server))
            .expect("cached");
        assert_eq!(res.headers()[header::CONTENT_LENGTH], "5");
        assert!(http_body::Body::is_end_stream(res.body()));

        // The request's preconditions are read before its map is emptied for a 304, which
        // carries the server's header too.
        let mut req = get();
        req.headers_mut().insert(header::IF_NONE_MATCH, etag);
        let res = files
            .serve_now_alone(&mut req, Some(&server))
            .expect("cached");
        assert_eq!(res.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(res.headers()[header::SERVER], "gw");
        assert!(res.headers().get(header::CONTENT_TYPE).is_none());

        // A large request map is not kept for the connection's life.
        let mut req = get();
        *req.headers_mut() = HeaderMap::with_capacity(16 * response::HEADERS);
        let res = files.serve_now_alone(&mut req, None).expect("cached");
        assert!(res.headers().capacity() <= fresh_map().capacity());
    }

    /// The fast path's view of `path` on `files` (a connection that sends files).
    fn prepared(files: &StaticFiles, path: &str, accept: Option<&[u8]>) -> Prepared {
        files
            .prepared(path, accept, true, Revalidation::default())
            .expect("a plain GET is the fast path's")
    }

    /// Looks `path` up as the fast path does after a miss.
    async fn looked_up(files: &StaticFiles, path: &str, accept: Option<&[u8]>) -> Looked {
        match prepared(files, path, accept) {
            Prepared::Missed(missed) => files.look_up(missed).await,
            _ => panic!("{path}: expected a miss"),
        }
    }

    fn read_all(large: &LargeFile) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0; usize::try_from(large.len).expect("len")];
        large.file.read_exact_at(&mut buf, 0).expect("read");
        buf
    }

    #[tokio::test]
    async fn large_files_are_kept_open_until_due_then_looked_up_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let big = |byte: u8, len: usize| vec![byte; len];
        std::fs::write(dir.path().join("big.bin"), big(b'a', 4096)).expect("write");
        std::fs::write(dir.path().join("big.txt"), big(b't', 4096)).expect("write");
        let cfg: gateway_config::model::StaticConfig = serde_yaml::from_str(&format!(
            "{{ root: {}, compress: [gzip], cache: {{ max_file_size: 1KiB, revalidate_after: 1s }} }}",
            dir.path().display()
        ))
        .expect("config");
        let files = StaticFiles::new(&cfg).expect("static");
        let lookups = || files.lookups.load(std::sync::atomic::Ordering::Relaxed);

        let Looked::Large(first) = looked_up(&files, "/big.bin", None).await else {
            panic!("a file over the cache's limit is sent from disk");
        };
        assert_eq!(lookups(), 1);
        // Answered at once from the kept descriptor, the same headers and file.
        for _ in 0..3 {
            let Prepared::Large(kept) = prepared(&files, "/big.bin", Some(b"gzip")) else {
                panic!("kept open");
            };
            assert_eq!(kept.lines, first.lines);
            assert!(Arc::ptr_eq(&kept.file, &first.file));
        }
        assert_eq!(lookups(), 1, "no lookup while the kept file is fresh");

        // A new file under the same name: the kept one answers until its re-check is due...
        let tmp = dir.path().join("new.bin");
        std::fs::write(&tmp, big(b'b', 8192)).expect("write");
        std::fs::rename(&tmp, dir.path().join("big.bin")).expect("rename");
        let Prepared::Large(old) = prepared(&files, "/big.bin", None) else {
            panic!("kept open");
        };
        assert!(read_all(&old) == big(b'a', 4096), "the old file's bytes");
        // ...then one request looks it up again and the others keep the old one meanwhile.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let Prepared::Missed(missed) = prepared(&files, "/big.bin", None) else {
            panic!("due: this request looks the file up");
        };
        assert!(
            matches!(prepared(&files, "/big.bin", None), Prepared::Large(_)),
            "the re-check is claimed once"
        );
        let Looked::Large(new) = files.look_up(missed).await else {
            panic!("still large");
        };
        assert!(read_all(&new) == big(b'b', 8192), "the new file's bytes");
        let Prepared::Large(kept) = prepared(&files, "/big.bin", None) else {
            panic!("kept open");
        };
        assert!(Arc::ptr_eq(&kept.file, &new.file), "the new file is kept");
        assert_eq!(lookups(), 2);

        // Written in place (same descriptor, new length): seen at once, not when due.
        std::fs::write(dir.path().join("big.bin"), big(b'c', 5000)).expect("write");
        let Looked::Large(rewritten) = looked_up(&files, "/big.bin", None).await else {
            panic!("still large");
        };
        assert_eq!(rewritten.len, 5000);
        assert!(matches!(
            prepared(&files, "/big.bin", None),
            Prepared::Large(l) if l.len == 5000
        ));
        assert_eq!(lookups(), 3);

        // Gone: once due, the lookup answers 404 and the descriptor is closed.
        std::fs::remove_file(dir.path().join("big.bin")).expect("remove");
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let looked = looked_up(&files, "/big.bin", None).await;
        assert!(matches!(looked, Looked::Error(StatusCode::NOT_FOUND)));
        assert!(matches!(
            prepared(&files, "/big.bin", None),
            Prepared::Missed(_)
        ));
        drop((first, old, new, kept, rewritten));
        assert!(files.open.get("/big.bin").is_none());

        // A file whose answer depends on Accept-Encoding is not kept (here: compressed on the
        // fly for a client that takes gzip, sent as it is to one that does not).
        assert!(matches!(
            looked_up(&files, "/big.txt", None).await,
            Looked::Large(_)
        ));
        assert!(matches!(
            prepared(&files, "/big.txt", Some(b"gzip")),
            Prepared::Missed(_)
        ));
    }

    #[tokio::test]
    async fn the_general_path_streams_a_kept_file_without_a_lookup() {
        use http_body_util::BodyExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("big.bin"), &data).expect("write");
        let cfg: gateway_config::model::StaticConfig = serde_yaml::from_str(&format!(
            "{{ root: {}, cache: {{ max_file_size: 1KiB, revalidate_after: 60s }} }}",
            dir.path().display()
        ))
        .expect("config");
        let files = Arc::new(StaticFiles::new(&cfg).expect("static"));
        let lookups = || files.lookups.load(std::sync::atomic::Ordering::Relaxed);
        let send = |req: Request<Body>| {
            let files = files.clone();
            async move {
                let (parts, body) = files.serve(req).await.into_parts();
                let bytes = body.collect().await.expect("body").to_bytes();
                (parts, bytes)
            }
        };
        let get = |range: Option<&str>| {
            let mut b = Request::get("/big.bin");
            if let Some(r) = range {
                b = b.header(header::RANGE, r);
            }
            b.body(Body::empty()).expect("request")
        };

        let (res, body) = send(get(None)).await;
        assert_eq!(res.status, StatusCode::OK);
        assert!(body == data);
        assert_eq!(lookups(), 1);
        // From the kept descriptor: a range, a HEAD, the whole file again; and the fast path
        // finds it kept too.
        let (res, body) = send(get(Some("bytes=10-19"))).await;
        assert_eq!(res.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(res.headers[header::CONTENT_RANGE], "bytes 10-19/4096");
        assert_eq!(&body[..], &data[10..20]);
        let head = Request::head("/big.bin")
            .body(Body::empty())
            .expect("request");
        let (res, body) = send(head).await;
        assert_eq!(res.headers[header::CONTENT_LENGTH], "4096");
        assert!(body.is_empty());
        let (_, body) = send(get(None)).await;
        assert!(body == data);
        assert!(matches!(
            prepared(&files, "/big.bin", None),
            Prepared::Large(_)
        ));
        assert_eq!(lookups(), 1, "no lookup while the file is kept");

        // Written in place: looked up again at once.
        std::fs::write(dir.path().join("big.bin"), vec![7u8; 5000]).expect("write");
        let (res, body) = send(get(None)).await;
        assert_eq!(res.headers[header::CONTENT_LENGTH], "5000");
        assert!(body == vec![7u8; 5000]);
        assert_eq!(lookups(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_misses_for_a_large_file_share_its_lookup_once_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("big.bin"), vec![3u8; 4096]).expect("write");
        let cfg: gateway_config::model::StaticConfig = serde_yaml::from_str(&format!(
            "{{ root: {}, cache: {{ max_file_size: 1KiB }} }}",
            dir.path().display()
        ))
        .expect("config");
        let files = Arc::new(StaticFiles::new(&cfg).expect("static"));
        let requests: Vec<_> = (0..200)
            .map(|_| {
                let files = files.clone();
                tokio::spawn(async move {
                    let req = Request::get("/big.bin")
                        .body(Body::empty())
                        .expect("request");
                    let res = files.serve(req).await;
                    http_body_util::BodyExt::collect(res.into_body())
                        .await
                        .expect("body")
                        .to_bytes()
                        .len()
                })
            })
            .collect();
        for r in requests {
            assert_eq!(r.await.expect("task"), 4096);
        }
        // Those that waited for the first lookup are answered from the file it kept open.
        let lookups = files.lookups.load(std::sync::atomic::Ordering::Relaxed);
        assert!(lookups < 50, "200 concurrent misses made {lookups} lookups");
    }

    #[tokio::test]
    async fn no_file_is_kept_open_with_max_open_files_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("big.bin"), vec![0u8; 4096]).expect("write");
        let cfg: gateway_config::model::StaticConfig = serde_yaml::from_str(&format!(
            "{{ root: {}, cache: {{ max_file_size: 1KiB, max_open_files: 0 }} }}",
            dir.path().display()
        ))
        .expect("config");
        let files = StaticFiles::new(&cfg).expect("static");
        for _ in 0..2 {
            assert!(matches!(
                looked_up(&files, "/big.bin", None).await,
                Looked::Large(_)
            ));
        }
        assert_eq!(files.lookups.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_misses_for_one_file_make_one_lookup() {
        let (statuses, lookups) = concurrent_requests("/a.txt").await;
        assert!(
            statuses.iter().all(|s| *s == StatusCode::OK),
            "{statuses:?}"
        );
        assert_eq!(lookups, 1, "200 concurrent misses made {lookups} lookups");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_for_a_missing_file_share_lookups() {
        let (statuses, lookups) = concurrent_requests("/missing.txt").await;
        assert!(
            statuses.iter().all(|s| *s == StatusCode::NOT_FOUND),
            "{statuses:?}"
        );
        // A 404 is not cached, so a request arriving after a lookup ended looks again; only
        // requests waiting at the same time share one. Without sharing: one lookup each.
        assert!(
            lookups < 50,
            "200 concurrent requests made {lookups} lookups"
        );
    }
}
