//! Open descriptors of files too large for the memory cache, for the HTTP/1.1 fast path
//! (nginx's `open_file_cache`): a request for one is answered from the kept descriptor and its
//! 200's header lines, sent with `sendfile`, with no lookup on the blocking pool (path
//! resolution, `open`, `fstat`, the precompressed siblings' probes).
//!
//! Only `sendfile` reads these descriptors: it takes the offset as an argument and leaves the
//! file position alone, so any number of responses share one. The streamed path reads with the
//! file position and opens its own.
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

use super::LargeFile;
use super::cache::{Cache, Cached, Marks};
use super::conditional::Version;
use super::descriptors::{self, Slot};
use super::resolve;

/// How long after falling due an entry nobody asked for is kept (nginx's `inactive`).
pub(super) const INACTIVE_MS: u64 = 60_000;

/// The open files of one `static` terminal; its budget is `cache.max_open_files`.
pub(super) type OpenFiles = Cache<OpenFile>;

/// A large file's descriptor and answer, kept open.
pub(super) struct OpenFile {
    pub(super) large: LargeFile,
    /// The file's length and modification time when it was opened.
    version: Version,
    marks: Marks,
    _slot: Slot<'static>,
}

impl OpenFile {
    /// Keeps `large` (of `version`) open, checked at `now`, if the static files' share of
    /// descriptors has room.
    pub(super) fn new(large: LargeFile, version: Version, now: u64) -> io::Result<Self> {
        let kept = Self {
            large,
            version,
            marks: Marks::default(),
            _slot: descriptors::slot()?,
        };
        kept.set_checked(now);
        Ok(kept)
    }

    /// Whether the file has not been written since it was opened (its answer still holds).
    pub(super) fn unchanged(&self) -> bool {
        self.large
            .file
            .metadata()
            .is_ok_and(|meta| resolve::version(&meta) == self.version)
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
