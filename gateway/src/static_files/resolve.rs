//! Finds the file for a normalised request path: joins it to the root, canonicalises it and
//! checks the result is still under the canonical root (symlinks inside the root are fine; one
//! that points outside is "not found"), opens it without following a last-moment symlink or
//! blocking on a FIFO, picks the index file for directories and the precompressed siblings.
//! Everything here is blocking file I/O, run on the blocking pool in one hop per lookup.

use std::ffi::OsString;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

use super::cache::Entry;
use super::conditional::Version;
use super::encoding::{Accept, Encoding, compress_buffer};
use super::mime;

/// The per-terminal settings lookups need (shared with the blocking pool).
pub(super) struct Settings {
    /// Canonical root directory.
    pub(super) root: PathBuf,
    pub(super) index: Vec<String>,
    pub(super) precompressed: Vec<Encoding>,
    pub(super) compress: Vec<Encoding>,
    pub(super) compress_min_size: u64,
    /// Largest file kept in memory; `None` when the cache is off.
    pub(super) cache_max_file: Option<u64>,
    pub(super) cache_control: Option<HeaderValue>,
}

/// What a request wants, as far as choosing a representation goes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Want {
    pub(super) accept: Accept,
    /// A GET with `Range`: served in identity coding, since ranges address those bytes.
    pub(super) range: bool,
    /// Whether the request carries any precondition (`If-...`), see [`super::conditional::plan`].
    pub(super) preconditions: bool,
}

/// What identifies one version of a file and its siblings; equal stamps mean a cached entry
/// is still good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stamp {
    path: PathBuf,
    ino: u64,
    dev: u64,
    pub(super) version: Version,
    siblings: [Option<(u64, Version)>; 3],
}

#[cfg(test)]
impl Stamp {
    pub(super) fn for_tests(len: u64) -> Self {
        Self {
            path: PathBuf::from("/t"),
            ino: 1,
            dev: 1,
            version: Version {
                len,
                mtime: 1,
                mtime_nsec: 0,
            },
            siblings: [None; 3],
        }
    }
}

/// A lookup's result.
pub(super) enum Found {
    /// A directory asked for without its trailing slash.
    Redirect,
    /// The previous cached entry still matches the disk.
    Unchanged,
    /// A small file, read and prepared for the cache.
    Cached(Arc<Entry>),
    /// A file to stream.
    Stream(Streamed),
}

/// A large file opened for streaming, with the representation chosen.
#[derive(Clone)]
pub(super) struct Streamed {
    pub(super) content_type: http::HeaderValue,
    pub(super) version: Version,
    pub(super) vary: bool,
    /// The file to send: the original, or the chosen precompressed sibling. Shared: a file
    /// kept open ([`super::open_files`]) answers many requests, each reading at its own offsets.
    pub(super) file: Arc<File>,
    /// Length of `file`.
    pub(super) len: u64,
    /// ETag of the chosen representation.
    pub(super) etag: http::HeaderValue,
    pub(super) encoding: Option<Encoding>,
    /// `file` is the original and must be compressed with `encoding` on the fly.
    pub(super) compress: bool,
}

/// A regular file or a directory, opened.
struct Opened {
    file: File,
    meta: Metadata,
    canonical: PathBuf,
}

/// Looks up `key` (a normalised request path). `prev` is the cached entry being revalidated.
pub(super) fn lookup(
    s: &Settings,
    key: &str,
    want: Want,
    prev: Option<&Entry>,
) -> Result<Found, StatusCode> {
    let rel = key.trim_matches('/');
    let requested = if rel.is_empty() {
        s.root.clone()
    } else {
        s.root.join(rel)
    };
    let found = open_under(&s.root, &requested)?;
    let (name, main) = match (found.meta.is_dir(), key.ends_with('/')) {
        (true, false) => return Ok(Found::Redirect),
        (true, true) => find_index(s, &requested)?,
        // `/file.txt/` names a directory that is not one.
        (false, true) => return Err(StatusCode::NOT_FOUND),
        (false, false) => (requested, found),
    };
    let mut siblings: [Option<Opened>; 3] = [None, None, None];
    for &e in &s.precompressed {
        let mut p = OsString::from(name.as_os_str());
        p.push(".");
        p.push(e.extension());
        // A sibling that cannot be opened is simply not offered.
        siblings[e.index()] = open_under(&s.root, Path::new(&p))
            .ok()
            .filter(|f| f.meta.is_file());
    }
    let stamp = Stamp {
        ino: main.meta.ino(),
        dev: main.meta.dev(),
        version: version(&main.meta),
        siblings: siblings
            .each_ref()
            .map(|o| o.as_ref().map(|f| (f.meta.ino(), version(&f.meta)))),
        path: main.canonical.clone(),
    };
    if prev.is_some_and(|p| p.stamp == stamp) {
        return Ok(Found::Unchanged);
    }
    let ty = mime::type_of(&name);
    let may_compress = ty.compressible && stamp.version.len >= s.compress_min_size;
    let fits = |f: &Opened| s.cache_max_file.is_some_and(|max| f.meta.len() <= max);
    if fits(&main) && siblings.iter().flatten().all(fits) {
        let entry = fill(s, main, siblings, stamp, ty, may_compress).map_err(|e| io_status(&e))?;
        return Ok(Found::Cached(Arc::new(entry)));
    }
    Ok(Found::Stream(choose(
        s,
        main,
        siblings,
        &stamp,
        ty,
        may_compress,
        want,
    )))
}

/// Opens `path` if, once every symlink is resolved, it is still inside `root` and is a regular
/// file or a directory.
fn open_under(root: &Path, path: &Path) -> Result<Opened, StatusCode> {
    let canonical = std::fs::canonicalize(path).map_err(|e| io_status(&e))?;
    if !canonical.starts_with(root) {
        return Err(StatusCode::NOT_FOUND);
    }
    // The canonical path has no symlinks; O_NOFOLLOW refuses one swapped in since, and
    // O_NONBLOCK keeps a FIFO from blocking the open (regular files ignore it).
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&canonical)
        .map_err(|e| io_status(&e))?;
    let meta = file.metadata().map_err(|e| io_status(&e))?;
    if meta.is_dir() || meta.is_file() {
        Ok(Opened {
            file,
            meta,
            canonical,
        })
    } else {
        // Devices, sockets, FIFOs.
        Err(StatusCode::NOT_FOUND)
    }
}

/// The first configured index file in `dir`. No listing is ever generated: a directory without
/// one is "not found".
fn find_index(s: &Settings, dir: &Path) -> Result<(PathBuf, Opened), StatusCode> {
    for name in &s.index {
        let path = dir.join(name);
        match open_under(&s.root, &path) {
            Ok(f) if f.meta.is_file() => return Ok((path, f)),
            Ok(_) | Err(StatusCode::NOT_FOUND) => {}
            Err(status) => return Err(status),
        }
    }
    Err(StatusCode::NOT_FOUND)
}

pub(super) fn version(meta: &Metadata) -> Version {
    Version {
        len: meta.len(),
        mtime: meta.mtime(),
        mtime_nsec: meta.mtime_nsec(),
    }
}

/// Maps a file-system error to a status: missing things are 404, unreadable ones 403.
pub(super) fn io_status(e: &io::Error) -> StatusCode {
    match e.kind() {
        io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
        io::ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        _ => match e.raw_os_error() {
            // A file used as a directory, a name too long, a symlink loop, a symlink met by
            // O_NOFOLLOW: all mean "no such file here".
            Some(libc::ENOTDIR | libc::ENAMETOOLONG | libc::ELOOP | libc::EINVAL) => {
                StatusCode::NOT_FOUND
            }
            _ => {
                tracing::warn!(error = %e, "static file lookup failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        },
    }
}

/// Reads a small file and its siblings and prepares every representation for the cache.
fn fill(
    s: &Settings,
    main: Opened,
    mut siblings: [Option<Opened>; 3],
    stamp: Stamp,
    ty: mime::TypeInfo,
    may_compress: bool,
) -> io::Result<Entry> {
    let body = read_all(main.file, main.meta.len())?;
    let mut variants = Vec::with_capacity(3);
    for &e in &s.precompressed {
        if let (Some(sib), Some((_, v))) = (siblings[e.index()].take(), stamp.siblings[e.index()]) {
            let data = read_all(sib.file, sib.meta.len())?;
            variants.push((e, data, v.etag(Some(e.extension()))));
        }
    }
    if may_compress {
        for &e in &s.compress {
            if stamp.siblings[e.index()].is_none()
                && let Some(data) = compress_buffer(e, &body)
            {
                variants.push((e, data, stamp.version.etag(Some(e.extension()))));
            }
        }
    }
    Ok(Entry::new(
        stamp,
        ty.content_type,
        body,
        variants,
        s.cache_control.as_ref(),
    ))
}

fn read_all(mut file: File, len: u64) -> io::Result<Bytes> {
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.read_to_end(&mut buf)?;
    Ok(Bytes::from(buf))
}

/// Picks the representation of a large file: a sibling, on-the-fly compression, or identity.
fn choose(
    s: &Settings,
    main: Opened,
    mut siblings: [Option<Opened>; 3],
    stamp: &Stamp,
    ty: mime::TypeInfo,
    may_compress: bool,
    want: Want,
) -> Streamed {
    // Siblings first (they cost nothing to serve), then codings compressed on the fly.
    let offered = || {
        let precompressed = s
            .precompressed
            .iter()
            .filter(|e| siblings[e.index()].is_some());
        let live = s
            .compress
            .iter()
            .filter(|e| may_compress && siblings[e.index()].is_none());
        precompressed.chain(live).copied()
    };
    let vary = offered().next().is_some();
    let chosen = if want.range {
        None
    } else {
        want.accept.choose(offered())
    };
    let identity = |main: Opened| Streamed {
        content_type: ty.content_type.clone(),
        version: stamp.version,
        vary,
        len: main.meta.len(),
        file: Arc::new(main.file),
        etag: stamp.version.etag(None),
        encoding: None,
        compress: false,
    };
    match chosen {
        None => identity(main),
        Some(e) => match (siblings[e.index()].take(), stamp.siblings[e.index()]) {
            (Some(sib), Some((_, v))) => Streamed {
                len: sib.meta.len(),
                file: Arc::new(sib.file),
                etag: v.etag(Some(e.extension())),
                encoding: Some(e),
                ..identity(main)
            },
            _ => Streamed {
                etag: stamp.version.etag(Some(e.extension())),
                encoding: Some(e),
                compress: true,
                ..identity(main)
            },
        },
    }
}
