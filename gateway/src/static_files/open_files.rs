//! Open descriptors of files too large for the memory cache (nginx's `open_file_cache`): a
//! request for one is answered from the kept descriptor with no lookup on the blocking pool
//! (path resolution, `open`, `fstat`, the precompressed siblings' probes). The HTTP/1.1 fast
//! path sends it with `sendfile` after its 200's (or a range's 206's) header lines, kept as wire
//! text, and answers a revalidation with its 304 from kept lines too; the general path (TLS,
//! HTTP/2 and HTTP/3, other conditional requests) streams it.
//!
//! Any number of responses share one descriptor: `sendfile` and the streamed path's positional
//! reads take their offset as an argument and leave the file position alone.
//!
//! The answer's `Content-Length` is the file's length when it was opened, and a file written
//! in place changes under the descriptor: so each answer first reads the descriptor's status
//! (`fstat`, no disk access) and a changed length or modification time makes the request look
//! the file up again. A file replaced by another (renamed over it) is not seen that way: the
//! entry is trusted for `revalidate_after`, like a cached file, then one request looks the
//! path up again while the others keep being answered. Entries nobody asked for in the minute
//! after they fell due are closed (checked as files are looked up), so a deleted file's space
//! is not held for long; a config reload closes them all. A file whose answer depends on
//! `Accept-Encoding` (one with precompressed siblings or compressed on the fly) is not kept,
//! and none is with the memory cache off.

use std::io;

use bytes::Bytes;

use super::LargeFile;
use super::cache::{Cache, Cached, Marks};
use super::conditional::Revalidation;
use super::descriptors::{self, Slot};
use super::resolve::{self, Streamed};

/// How long after falling due an entry nobody asked for is kept (nginx's `inactive`).
pub(super) const INACTIVE_MS: u64 = 60_000;

/// The open files of one `static` terminal; its budget is `cache.max_open_files`.
pub(super) type OpenFiles = Cache<OpenFile>;

/// A large file's descriptor and what its answers need, kept open.
pub(super) struct OpenFile {
    /// The file as its lookup found it (identity, nothing offered by `Accept-Encoding`).
    streamed: Streamed,
    /// Its 200's header lines for the fast path ([`LargeFile::lines`]).
    lines: Bytes,
    /// Where the length's line starts in `lines` ([`LargeFile::length_at`]).
    length_at: usize,
    /// Its 304's header lines for the fast path, as a cached file's
    /// ([`super::response::not_modified_lines`]).
    not_modified: Bytes,
    marks: Marks,
    _slot: Slot<'static>,
}

impl OpenFile {
    /// Keeps `streamed` open with its fast-path answers' header lines (those of `large`, and
    /// its 304's), checked at `now`, if the static files' share of descriptors has room.
    pub(super) fn new(
        streamed: Streamed,
        large: LargeFile,
        not_modified: Bytes,
        now: u64,
    ) -> io::Result<Self> {
        let kept = Self {
            streamed,
            lines: large.lines,
            length_at: large.length_at,
            not_modified,
            marks: Marks::default(),
            _slot: descriptors::slot()?,
        };
        kept.set_checked(now);
        Ok(kept)
    }

    /// Whether the file has not been written since it was opened (its answer still holds):
    /// the same length and modification time.
    pub(super) fn unchanged(&self) -> bool {
        self.streamed
            .file
            .metadata()
            .is_ok_and(|meta| resolve::version(&meta) == self.streamed.version)
    }

    /// Whether this entry answers a request at `now`: the file is unchanged, and not due for
    /// its re-check (or another request claimed it). `false` leaves the lookup to the caller,
    /// the re-check claimed when it was due.
    pub(super) fn answers(&self, now: u64, ttl: u64) -> bool {
        self.unchanged() && !self.claim_revalidation(now, ttl)
    }

    /// The fast path's answer.
    pub(super) fn large(&self) -> LargeFile {
        LargeFile {
            lines: self.lines.clone(),
            length_at: self.length_at,
            file: self.streamed.file.clone(),
            len: self.streamed.len,
        }
    }

    /// The fast path's 304 when `revalidation` finds the file unchanged.
    pub(super) fn not_modified(&self, revalidation: Revalidation<'_>) -> Option<Bytes> {
        let s = &self.streamed;
        revalidation
            .not_modified(&s.etag, s.version.http_secs())
            .then(|| self.not_modified.clone())
    }

    /// The general path's: the file to stream, ranges and preconditions applied to it there.
    pub(super) fn streamed(&self) -> Streamed {
        self.streamed.clone()
    }
}

impl Cached for OpenFile {
    fn weight(&self) -> usize {
        1
    }

    fn marks(&self) -> &Marks {
        &self.marks
    }
}
