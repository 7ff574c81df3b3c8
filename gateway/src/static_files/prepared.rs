//! The HTTP/1.1 fast path's entry points (`server::fast_path`): a cached file's answer as header
//! lines and body ([`StaticFiles::prepared`]), a range of it ([`StaticFiles::prepared_range`]),
//! and the re-check ([`StaticFiles::recheck`]) or lookup ([`StaticFiles::look_up`]) such a
//! request does itself, sharing the cache, the files kept open and concurrent misses with the
//! general path.

use std::sync::Arc;

use gateway_http1::fields::push_field;
use http::StatusCode;

use super::cache::{self, Cached, Entry};
use super::conditional::{self, RangeSpec, Revalidation};
use super::encoding::Accept;
use super::misses::{Miss, follow};
use super::resolve::{self, Found, Streamed, Want};
use super::sealed::SealedFile;
use super::{StaticFiles, now_ms, path, response};

/// What the HTTP/1.1 fast path gets for a cached file ([`StaticFiles::prepared`]).
pub enum Prepared {
    /// The answer.
    Ready(PreparedFile),
    /// The file is due for its re-check and this request does it ([`StaticFiles::recheck`]).
    Recheck(Recheck),
    /// The file is not cached and this request looks it up ([`StaticFiles::look_up`]).
    Missed(Missed),
    /// A file too large for the cache, kept open: the answer, sent from disk.
    Large(LargeFile),
    /// The cached file (or large file kept open) has not changed since the request's
    /// revalidation: its 304's header lines (without `Server`, `Date` or the status line).
    NotModified(bytes::Bytes),
}

/// A fast-path request for a file not in the cache.
pub struct Missed {
    key: String,
    accept: Accept,
    /// The file is kept open and due for its re-check, which this request claimed.
    due: bool,
}

/// What the fast path's lookup of a file not in the cache found ([`StaticFiles::look_up`]).
pub enum Looked {
    /// The file, now cached.
    File(PreparedFile),
    /// A file too large for the cache, sent whole from disk.
    Large(LargeFile),
    /// The error the general path answers with (a missing or unreadable file), as
    /// [`crate::error::error_response`] makes it.
    Error(StatusCode),
    /// Anything else (a directory's redirect, a large file compressed on the fly): the
    /// general path answers it, looking the file up again.
    General,
}

/// A large file's 200 for the fast path: its header lines (as [`PreparedFile::lines`]) and the
/// open file, which a plain TCP connection sends with `sendfile`.
#[derive(Clone)]
pub struct LargeFile {
    pub lines: bytes::Bytes,
    /// Where `lines`' `Content-Length` line starts, the last: the lines before it are the
    /// representation's, which a 206 of the file carries too.
    pub length_at: usize,
    pub file: Arc<std::fs::File>,
    /// The file's length when it was opened: what `Content-Length` says.
    pub len: u64,
}

impl LargeFile {
    /// The header lines of any answer with the file's bytes, without their length.
    pub fn representation_lines(&self) -> &[u8] {
        &self.lines[..self.length_at]
    }
}

/// What the fast path sends a range of ([`StaticFiles::prepared_range`]).
pub enum Ranged {
    /// A cached file's identity representation, from memory.
    Cached(PreparedFile),
    /// A large file kept open, from disk.
    Large(LargeFile),
}

impl Ranged {
    /// The representation's length.
    pub fn total(&self) -> u64 {
        match self {
            Ranged::Cached(f) => f.body.len() as u64,
            Ranged::Large(f) => f.len,
        }
    }

    /// The header lines of any answer with its bytes, without their length.
    pub fn representation_lines(&self) -> &[u8] {
        match self {
            Ranged::Cached(f) => &f.lines[..f.length_at],
            Ranged::Large(f) => f.representation_lines(),
        }
    }

    /// What a request's `Range` value asks of it, as the general path reads it.
    pub fn range(&self, value: &[u8]) -> RangeSpec {
        conditional::parse_range(value, self.total())
    }
}

/// A re-check claimed by a fast-path request.
pub struct Recheck {
    key: String,
    prev: Arc<Entry>,
    accept: Accept,
    /// When it was claimed, in ms of the cache's clock.
    now: u64,
}

/// A cached file's 200 for the HTTP/1.1 fast path: its header lines after `Server`
/// (`name: value` CRLF each, `Content-Length` included) and its body.
pub struct PreparedFile {
    /// Header lines, without `Server`, `Date` or the status line.
    pub lines: bytes::Bytes,
    /// Where `lines`' `Content-Length` line starts, the last (as [`LargeFile::length_at`]).
    pub length_at: usize,
    /// The representation's bytes (not sent for `HEAD`).
    pub body: bytes::Bytes,
    /// The memory file `body` maps, when it is large enough to be sent with `sendfile`.
    pub sealed: Option<Arc<SealedFile>>,
}

impl PreparedFile {
    fn of(entry: &Entry, accept: &Accept) -> Self {
        Self::of_variant(entry.choose(accept))
    }

    fn of_variant(v: &cache::Variant) -> Self {
        Self {
            lines: v.wire.clone(),
            length_at: v.length_at,
            body: v.body.clone(),
            sealed: v.sealed.clone(),
        }
    }
}

impl StaticFiles {
    /// The HTTP/1.1 fast path's answer (`server::fast_path`) for a plain `GET` or `HEAD` of
    /// `path` (the request target's path, without its query) on a route without filters: the
    /// 200 of a cached file, chosen by `accept_encoding` (the request's one `Accept-Encoding`
    /// value, if any), its 304 when the request's `revalidation` finds it unchanged, or the
    /// file's re-check when it is due and this request claimed it (as [`StaticFiles::serve`]
    /// does: other requests meanwhile get the entry as it is). `None` when the file is not
    /// cached or the path is refused: the general path answers it. The caller hands on
    /// requests with other preconditions, and ranges ([`StaticFiles::prepared_range`]).
    ///
    /// With `look_up` (a connection that can send files from disk), a file not in the cache is
    /// [`Prepared::Missed`]: the fast path looks it up itself ([`StaticFiles::look_up`]).
    pub fn prepared(
        &self,
        path: &str,
        accept_encoding: Option<&[u8]>,
        look_up: bool,
        revalidation: Revalidation<'_>,
    ) -> Option<Prepared> {
        let key = path::normalize(path).ok()?.key;
        let accept = accept_encoding
            .map_or_else(Accept::default, |v| Accept::from_values(std::iter::once(v)));
        let Some(entry) = self.cache.get(&key) else {
            if !look_up {
                return None;
            }
            let open = self.open.get(&key);
            if let Some(open) = &open
                && open.answers(now_ms(), self.revalidate)
            {
                if let Some(lines) = open.not_modified(revalidation) {
                    return Some(Prepared::NotModified(lines));
                }
                return Some(Prepared::Large(open.large()));
            }
            return Some(Prepared::Missed(Missed {
                key: key.into_owned(),
                accept,
                due: open.is_some(),
            }));
        };
        let now = now_ms();
        if entry.claim_revalidation(now, self.revalidate) {
            return Some(Prepared::Recheck(Recheck {
                key: key.into_owned(),
                prev: entry,
                accept,
                now,
            }));
        }
        let v = entry.choose(&accept);
        if revalidation.not_modified(&v.etag, entry.modified) {
            return Some(Prepared::NotModified(v.not_modified.clone()));
        }
        Some(Prepared::Ready(PreparedFile::of_variant(v)))
    }

    /// The fast path's file for a plain `GET` of `path` with a `Range` (and no precondition): a
    /// cached file's identity representation (a range is of the bytes without a coding, as
    /// the general path serves it), or a large file kept open that answers now as it is
    /// (unchanged), each only when its re-check is not due. `None` (a file not cached nor kept
    /// open, or one due for its re-check) claims nothing: the general path answers the request
    /// as it would any range.
    pub fn prepared_range(&self, path: &str) -> Option<Ranged> {
        let key = path::normalize(path).ok()?.key;
        let now = now_ms();
        if let Some(entry) = self.cache.get(&key) {
            return entry
                .is_fresh(now, self.revalidate)
                .then(|| Ranged::Cached(PreparedFile::of_variant(&entry.identity)));
        }
        let open = self.open.get(&key)?;
        (open.is_fresh(now, self.revalidate) && open.unchanged())
            .then(|| Ranged::Large(open.large()))
    }

    /// Re-checks a cached file for the fast path, on the blocking pool as the general path
    /// does: the answer from the entry as it is or as it is now, or `None` (the entry dropped)
    /// when the file is gone or no longer one the cache holds, for the general path to answer.
    pub async fn recheck(&self, recheck: Recheck) -> Option<PreparedFile> {
        #[cfg(test)]
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Recheck {
            key,
            prev,
            accept,
            now,
        } = recheck;
        let settings = self.settings.clone();
        let old = prev.clone();
        let want = Want {
            accept,
            range: false,
            preconditions: false,
        };
        let job = tokio::task::spawn_blocking(move || {
            let found = resolve::lookup(&settings, &key, want, Some(&old));
            (key, found)
        });
        let (key, found) = job.await.ok()?;
        match found {
            Ok(Found::Unchanged) => Some(PreparedFile::of(&prev, &accept)),
            Ok(Found::Cached(e)) => {
                e.set_checked(now);
                self.cache.insert(&key, e.clone());
                Some(PreparedFile::of(&e, &accept))
            }
            _ => {
                self.cache.remove(&key);
                None
            }
        }
    }

    /// Looks up a file the fast path found missing from the cache, sharing the lookup with
    /// concurrent misses as [`StaticFiles::serve`] does: the file (now cached), a large file
    /// to send from disk, the error status to answer with, or [`Looked::General`].
    pub async fn look_up(&self, missed: Missed) -> Looked {
        let Missed { key, accept, due } = missed;
        let now = now_ms();
        let lead = match self.misses.join(&key) {
            Miss::Lead(lead) => {
                // As in `serve`: a lookup that ended since the cache was read left its entry.
                if let Some(e) = self.cache.get(&key)
                    && e.is_fresh(now, self.revalidate)
                {
                    return Looked::File(PreparedFile::of(&e, &accept));
                }
                // (Fresh also when this request claimed its re-check: that set the time.)
                if !due
                    && let Some(open) = self.open.get(&key)
                    && open.is_fresh(now, self.revalidate)
                {
                    return Looked::Large(open.large());
                }
                Some(lead)
            }
            Miss::Follow(done) => {
                if let Some(status) = follow(done).await {
                    return Looked::Error(status);
                }
                if let Some(e) = self.cache.get(&key) {
                    return Looked::File(PreparedFile::of(&e, &accept));
                }
                if let Some(open) = self.open.get(&key) {
                    return Looked::Large(open.large());
                }
                None
            }
        };
        #[cfg(test)]
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let settings = self.settings.clone();
        let want = Want {
            accept,
            range: false,
            preconditions: false,
        };
        let job = tokio::task::spawn_blocking(move || {
            let found = resolve::lookup(&settings, &key, want, None);
            (key, found)
        });
        let Ok((key, found)) = job.await else {
            return Looked::General;
        };
        self.track_open(&key, &found, now);
        match found {
            Ok(Found::Cached(e)) => {
                e.set_checked(now);
                self.cache.insert(&key, e.clone());
                Looked::File(PreparedFile::of(&e, &accept))
            }
            Ok(Found::Stream(s)) if !s.compress => Looked::Large(self.large(&s)),
            Err(status) => {
                if let Some(lead) = &lead {
                    lead.failed(status);
                }
                Looked::Error(status)
            }
            Ok(_) => Looked::General,
        }
    }

    /// The fast path's answer for a large file sent whole: the headers of the general path's
    /// 200 for it ([`StaticFiles::serve_streamed`]) and the open file.
    pub(super) fn large(&self, s: &Streamed) -> LargeFile {
        let last_modified = s.version.last_modified();
        // As `response::ok` orders them: the representation's headers, then the length.
        let mut lines = response::representation_lines(&self.representation(s, &last_modified));
        let length_at = lines.len();
        push_field(&mut lines, b"content-length", s.len.to_string().as_bytes());
        LargeFile {
            lines: lines.into(),
            length_at,
            file: s.file.clone(),
            len: s.len,
        }
    }
}
