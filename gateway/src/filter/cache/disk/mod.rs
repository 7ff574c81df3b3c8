//! A cache's disk tier: every object the memory tier stores is also written to a file under
//! `caches.NAME.disk.path` ([`file`]), by one writer thread per tier, off the request path
//! ([`writer`]); an object too large for memory is streamed there as its answer arrives. A
//! memory miss reads it back (whole, and promoted to memory, when it fits there; else streamed
//! from the file, [`body`]). The index of the files (keys, sizes, use order) lives in memory,
//! is rebuilt from the directory at start ([`scan`]) while requests go on, and bounds the
//! files' total size, least recently used out. A write that fails (disk full, directory gone)
//! costs the store only: the client already has its answer.
//!
//! Writing every object, rather than only what memory evicts, keeps the tier whole across a
//! crash or a restart, and makes a memory eviction free.

pub mod body;
pub mod file;
mod index;
mod scan;
mod writer;

use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use http::HeaderMap;

use super::metrics::TierMetrics;
use super::store::{Object, Payload};
use crate::telemetry::{Counter, Registry};
use file::{Id, Opened};
use index::Index;
pub use writer::{DiskFill, Guard, PathMatch};
use writer::{Job, send};

/// Jobs waiting for the writer, at most.
const QUEUE_JOBS: usize = 4096;
/// Bodies waiting for the writer, at most, in bytes (past it a store skips the disk: a disk
/// slower than the traffic must not hold the memory of every object it has yet to write).
const QUEUE_BYTES: u64 = 64 << 20;

/// A file of the tier opened for reading its body; it stays readable while open even when the
/// tier removes or replaces its file meanwhile.
#[derive(Debug)]
pub struct Stored {
    pub opened: Opened,
    id: Id,
    tier: Weak<Files>,
}

impl Stored {
    /// The body did not match its CRC: the file goes.
    pub fn reject(&self) {
        if let Some(t) = self.tier.upgrade() {
            t.reject(self.id);
        }
    }
}

struct Metrics {
    tier: TierMetrics,
    failed_io: Counter,
    failed_busy: Counter,
    rejected: Counter,
}

/// What the writer thread and the tier's handles share.
pub struct Files {
    root: PathBuf,
    capacity: AtomicU64,
    index: Mutex<Index>,
    metrics: Metrics,
    /// Set when the tier is dropped: a scan still running stops.
    closed: AtomicBool,
    /// Bytes of bodies waiting for the writer.
    queued: AtomicU64,
    /// The last write failed (logged once per run of failures).
    failing: AtomicBool,
    /// Numbers the fills streamed in.
    fills: AtomicU64,
    /// Writes and fills queued or under way: while there are none, a removal has nothing to
    /// catch in the writer's queue.
    writing: AtomicU64,
    /// Begins the names of this run's temporary files (`{random}-`): the scan removes those of
    /// other runs only.
    run: String,
}

/// The disk tier of one cache.
pub struct Disk {
    tier: Arc<Files>,
    jobs: SyncSender<Job>,
}

/// The bytes a write queued holds in memory: a body in a file (a refreshed head) holds none.
fn held(object: &Object) -> u64 {
    match &object.body {
        Payload::Memory(b) => b.len() as u64,
        Payload::File(_) => 0,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Creates `path` when missing, as serving will; the error says why it cannot be.
pub fn prepare(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path)
        .and_then(|_| {
            let probe = path.join(".probe");
            std::fs::write(&probe, b"")?;
            std::fs::remove_file(probe)
        })
        .map_err(|e| format!("cannot use `{}` as a cache directory: {e}", path.display()))
}

/// Checks what [`prepare`] would do without creating anything (`gateway validate`): the
/// path, or the nearest part of it that exists, is a directory.
pub fn check(path: &Path) -> Result<(), String> {
    let mut p = path;
    loop {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) => {
                return Err(format!(
                    "cannot use `{}` as a cache directory: `{}` is not a directory",
                    path.display(),
                    p.display()
                ));
            }
            Err(_) => match p.parent() {
                Some(parent) => p = parent,
                None => return Ok(()),
            },
        }
    }
}

impl Disk {
    /// Starts the tier of cache `name` on `root` (made by [`prepare`]) bounded by `capacity`
    /// bytes: its writer thread, and the scan that rebuilds its index.
    pub fn start(name: &str, root: &Path, capacity: u64, registry: &Registry) -> io::Result<Self> {
        let labels = [("cache", name), ("tier", "disk")];
        let failed = |reason| {
            registry.counter(
                "gateway_cache_write_failures_total",
                "Objects not written to a tier, by cache, tier and reason (io: the write failed; busy: the writer was behind).",
                &[("cache", name), ("tier", "disk"), ("reason", reason)],
            )
        };
        let tier = Arc::new(Files {
            root: root.to_owned(),
            capacity: AtomicU64::new(capacity),
            index: Mutex::default(),
            metrics: Metrics {
                tier: TierMetrics::new(registry, &labels),
                failed_io: failed("io"),
                failed_busy: failed("busy"),
                rejected: registry.counter(
                    "gateway_cache_disk_rejected_total",
                    "Files of the disk tier removed as unreadable: another format version, cut short or altered.",
                    &[("cache", name)],
                ),
            },
            closed: AtomicBool::new(false),
            queued: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            fills: AtomicU64::new(1),
            writing: AtomicU64::new(0),
            run: format!("{:x}-", rand::random::<u64>()),
        });
        tier.publish(&lock(&tier.index));
        let (jobs, rx) = std::sync::mpsc::sync_channel(QUEUE_JOBS);
        let t = tier.clone();
        std::thread::Builder::new()
            .name(format!("cache-{name}-writer"))
            .spawn(move || writer::run(&t, &rx))?;
        let t = tier.clone();
        std::thread::Builder::new()
            .name(format!("cache-{name}-scan"))
            .spawn(move || scan::run(&t))?;
        Ok(Self { tier, jobs })
    }

    /// The directory it keeps its files in.
    pub fn root(&self) -> &Path {
        &self.tier.root
    }

    /// Sets the bound, removing what exceeds it.
    pub fn resize(&self, capacity: u64) {
        self.tier.capacity.store(capacity, Ordering::Relaxed);
        let _ = self.jobs.try_send(Job::Evict);
    }

    /// The file of the object for a request under `primary`, counted as used.
    pub fn lookup(&self, primary: &str, req: &HeaderMap) -> Option<Id> {
        lock(&self.tier.index).lookup(primary, req)
    }

    /// Reads the object of `id`: its body whole when at most `whole` bytes, else left in the
    /// file to be streamed. `None` when the file is gone or unreadable (then removed).
    pub async fn load(&self, id: Id, whole: u64) -> Option<Object> {
        let tier = self.tier.clone();
        let read = tokio::task::spawn_blocking(move || {
            let (head, opened) = file::open(&id.path(&tier.root))?;
            if Id::of(&head.primary, &head.variant) != id {
                return Err(io::Error::new(ErrorKind::InvalidData, "misplaced file"));
            }
            let mut object = head.object;
            object.body = if opened.body_len <= whole {
                Payload::Memory(file::read_body(&opened)?)
            } else {
                Payload::File(Arc::new(Stored {
                    opened,
                    id,
                    tier: Arc::downgrade(&tier),
                }))
            };
            Ok(object)
        })
        .await;
        match read {
            Ok(Ok(object)) => Some(object),
            Ok(Err(e)) if e.kind() == ErrorKind::InvalidData => {
                tracing::warn!(file = %id.path(self.root()).display(), error = %e, "cache file rejected");
                self.tier.reject(id);
                None
            }
            Ok(Err(e)) => {
                if e.kind() != ErrorKind::NotFound {
                    tracing::warn!(file = %id.path(self.root()).display(), error = %e, "cache file unreadable");
                }
                let mut index = lock(&self.tier.index);
                index.remove(id);
                self.tier.publish(&index);
                None
            }
            Err(_) => None,
        }
    }

    /// Forgets the version of `id` on disk: outdated by one being stored, whether or not that
    /// one gets written.
    fn outdate(&self, id: Id) {
        let mut index = lock(&self.tier.index);
        index.remove(id);
        self.tier.publish(&index);
    }

    /// Writes `object`, stored under `primary` and `variant`, in the background; `done` is
    /// dropped once it can be found. False when it is not going to be: larger than the whole
    /// tier, or the writer is behind.
    pub fn write(
        &self,
        primary: &str,
        variant: &str,
        object: Arc<Object>,
        done: Option<Guard>,
    ) -> bool {
        let id = Id::of(primary, variant);
        self.outdate(id);
        if object.body.len() > self.tier.capacity.load(Ordering::Relaxed) {
            return false;
        }
        let len = held(&object);
        let queued = self.tier.queued.fetch_add(len, Ordering::AcqRel);
        let job = Job::Write {
            id,
            primary: primary.to_owned(),
            variant: variant.to_owned(),
            object,
            done,
        };
        let busy = queued != 0 && queued + len > QUEUE_BYTES;
        self.tier.writing.fetch_add(1, Ordering::AcqRel);
        if busy || self.jobs.try_send(job).is_err() {
            self.tier.writing.fetch_sub(1, Ordering::AcqRel);
            self.tier.queued.fetch_sub(len, Ordering::AcqRel);
            self.tier.metrics.failed_busy.inc();
            return false;
        }
        true
    }

    /// Starts streaming `object` (its head; the body follows through [`DiskFill::push`]),
    /// stored under `primary` and `variant`. `None` when the writer is behind.
    pub fn begin_fill(
        &self,
        primary: &str,
        variant: &str,
        object: Arc<Object>,
    ) -> Option<DiskFill> {
        let id = Id::of(primary, variant);
        self.outdate(id);
        let fill = self.tier.fills.fetch_add(1, Ordering::Relaxed);
        let job = Job::Begin {
            fill,
            id,
            primary: primary.to_owned(),
            variant: variant.to_owned(),
            object,
        };
        self.tier.writing.fetch_add(1, Ordering::AcqRel);
        if self.jobs.try_send(job).is_err() {
            self.tier.writing.fetch_sub(1, Ordering::AcqRel);
            self.tier.metrics.failed_busy.inc();
            return None;
        }
        Some(DiskFill {
            tier: self.tier.clone(),
            jobs: self.jobs.clone(),
            fill,
            primary: primary.to_owned(),
            variant: variant.to_owned(),
            ended: false,
        })
    }

    /// Removes every variant under `primary`: their variant keys.
    pub fn remove(&self, primary: &str) -> Vec<String> {
        let gone = lock(&self.tier.index).remove_primary(primary);
        if self.tier.writing.load(Ordering::Acquire) > 0 {
            send(&self.jobs, Job::Forget(primary.to_owned()));
        }
        self.delete(gone)
    }

    /// Removes the objects whose request path `matches`: their primary and variant keys.
    pub fn purge(&self, matches: PathMatch) -> Vec<(String, String)> {
        let gone = lock(&self.tier.index).remove_matching(|p| matches(p));
        if self.tier.writing.load(Ordering::Acquire) > 0 {
            send(&self.jobs, Job::Purge(matches));
        }
        let keys = gone
            .iter()
            .map(|(_, p, v)| (p.clone(), v.clone()))
            .collect();
        self.delete(gone.into_iter().map(|(id, _, v)| (id, v)).collect());
        keys
    }

    /// Deletes the files of objects already out of the index. What the index does not hold
    /// yet (a write queued, not done) the `Forget` or `Purge` job sent before removes: the
    /// writer runs it after those writes.
    fn delete<T>(&self, gone: Vec<(Id, T)>) -> Vec<T> {
        self.tier.publish(&lock(&self.tier.index));
        let (ids, keys): (Vec<Id>, Vec<T>) = gone.into_iter().unzip();
        if !ids.is_empty() {
            send(&self.jobs, Job::Delete(ids));
        }
        keys
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        self.tier.closed.store(true, Ordering::Relaxed);
    }
}

impl Files {
    fn publish(&self, index: &Index) {
        self.metrics.tier.bytes.set(index.bytes() as i64);
        self.metrics.tier.objects.set(index.len() as i64);
    }

    /// Removes an unreadable file and counts it.
    fn reject(self: &Arc<Self>, id: Id) {
        self.metrics.rejected.inc();
        let mut index = lock(&self.index);
        index.remove(id);
        self.publish(&index);
        drop(index);
        let path = id.path(&self.root);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || std::fs::remove_file(path))),
            Err(_) => drop(std::fs::remove_file(path)),
        }
    }

    /// Evicts past the bound; the files go.
    fn evict(&self) {
        let capacity = self.capacity.load(Ordering::Relaxed);
        let gone = {
            let mut index = lock(&self.index);
            let gone = index.evict(capacity);
            self.publish(&index);
            gone
        };
        self.metrics.tier.evictions.add(gone.len() as u64);
        for id in gone {
            let _ = std::fs::remove_file(id.path(&self.root));
        }
    }

    fn failed(&self, id: Id, e: &io::Error) {
        self.metrics.failed_io.inc();
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                dir = %self.root.display(),
                file = %id.path(&self.root).display(),
                error = %e,
                "cache disk write failed; objects are kept in memory only until a write succeeds"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::BodyExt;

    use super::*;

    fn object(path: &str, body: &'static [u8]) -> Arc<Object> {
        Arc::new(Object::sample(path, Bytes::from_static(body)))
    }

    /// Waits (on real time: the writer and the scan are threads) until `done`.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        for _ in 0..500 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what} did not happen within 5 s");
    }

    fn files(root: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for a in std::fs::read_dir(root).unwrap().filter_map(Result::ok) {
            for b in std::fs::read_dir(a.path()).into_iter().flatten().flatten() {
                for f in std::fs::read_dir(b.path()).into_iter().flatten().flatten() {
                    out.push(f.path());
                }
            }
        }
        out
    }

    async fn text(body: &Payload) -> String {
        let all = body
            .slice(0, body.len())
            .collect()
            .await
            .unwrap()
            .to_bytes();
        String::from_utf8(all.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_new_tier_finds_the_files_and_removes_the_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::default();
        let h = HeaderMap::new();
        let disk = Disk::start("t", dir.path(), 1 << 20, &registry).unwrap();
        assert!(disk.write("a", "", object("/a", b"body of a"), None));
        assert!(disk.write("b", "", object("/b", b"body of b"), None));
        until("two writes", || disk.tier.metrics.tier.writes.get() == 2).await;
        let id = disk.lookup("a", &h).expect("indexed once written");
        let whole = disk.load(id, 1 << 20).await.unwrap();
        assert!(matches!(whole.body, Payload::Memory(_)));
        assert_eq!(text(&whole.body).await, "body of a");
        let streamed = disk.load(id, 4).await.unwrap();
        assert!(matches!(streamed.body, Payload::File(_)));
        assert_eq!(text(&streamed.body).await, "body of a");
        assert_eq!(
            streamed
                .body
                .slice(2, 6)
                .collect()
                .await
                .unwrap()
                .to_bytes(),
            "dy o"
        );
        drop(disk);

        // One file cut short, one of another version, one temporary file left by a crash.
        let b = Id::of("b", "").path(dir.path());
        let bytes = std::fs::read(&b).unwrap();
        std::fs::write(&b, &bytes[..bytes.len() - 1]).unwrap();
        let c = Id::of("c", "").path(dir.path());
        std::fs::create_dir_all(c.parent().unwrap()).unwrap();
        std::fs::write(&c, b"GWCACHE\x00 from another version").unwrap();
        let tmp = Id::of("d", "")
            .path(dir.path())
            .with_extension("left-1.tmp");
        std::fs::create_dir_all(tmp.parent().unwrap()).unwrap();
        std::fs::write(&tmp, b"half").unwrap();
        let other = dir.path().join("README");
        std::fs::write(&other, b"not the cache's").unwrap();

        let disk = Disk::start("t", dir.path(), 1 << 20, &registry).unwrap();
        until("the scan", || disk.tier.metrics.rejected.get() == 2).await;
        until("a's entry", || disk.lookup("a", &h).is_some()).await;
        assert!(disk.lookup("b", &h).is_none() && disk.lookup("c", &h).is_none());
        assert_eq!(files(dir.path()), [Id::of("a", "").path(dir.path())]);
        assert!(other.exists(), "files not the tier's are left alone");
        let again = disk.load(disk.lookup("a", &h).unwrap(), 1 << 20).await;
        assert_eq!(text(&again.unwrap().body).await, "body of a");
    }

    #[tokio::test]
    async fn the_bound_holds_and_removals_reach_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::default();
        let h = HeaderMap::new();
        let body: &'static [u8] = &[b'x'; 1000];
        // Room for three files of a 1000-byte body and its head.
        let disk = Disk::start("t", dir.path(), 3 * 1100, &registry).unwrap();
        for (i, k) in ["k0", "k1", "k2", "k3", "k4"].into_iter().enumerate() {
            assert!(disk.write(k, "", object(&format!("/p/{k}"), body), None));
            until("the write", || {
                disk.tier.metrics.tier.writes.get() == i as u64 + 1
            })
            .await;
            if k == "k2" {
                disk.lookup("k0", &h).unwrap();
            }
        }
        let total: u64 = files(dir.path())
            .iter()
            .map(|f| std::fs::metadata(f).unwrap().len())
            .sum();
        assert!(total <= 3 * 1100, "{total} bytes on disk");
        assert_eq!(disk.tier.metrics.tier.evictions.get(), 2);
        assert!(disk.lookup("k0", &h).is_some(), "used: kept");
        assert!(disk.lookup("k1", &h).is_none() && disk.lookup("k2", &h).is_none());
        assert!(!disk.write("huge", "", object("/huge", &[0; 4000]), None));

        assert_eq!(disk.remove("k0"), [String::new()]);
        let purged = disk.purge(Arc::new(|p: &str| p.starts_with("/p/")));
        assert_eq!(purged.len(), 2);
        until("the files to go", || files(dir.path()).is_empty()).await;
        assert_eq!(disk.tier.metrics.tier.bytes.get(), 0);
    }

    #[tokio::test]
    async fn a_streamed_fill_lands_whole_and_an_abandoned_one_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::default();
        let h = HeaderMap::new();
        let disk = Disk::start("t", dir.path(), 1 << 20, &registry).unwrap();
        let mut fill = disk.begin_fill("s", "", object("/s", b"")).unwrap();
        for piece in [&b"streamed "[..], b"in ", b"pieces"] {
            assert!(fill.push(Bytes::from_static(piece)));
        }
        fill.finish(None);
        let mut gone = disk.begin_fill("g", "", object("/g", b"")).unwrap();
        assert!(gone.push(Bytes::from_static(b"half of it")));
        until("the fill", || disk.tier.metrics.tier.writes.get() == 1).await;
        drop(gone);
        let id = disk.lookup("s", &h).expect("indexed once ended");
        let loaded = disk.load(id, 0).await.unwrap();
        assert_eq!(text(&loaded.body).await, "streamed in pieces");
        until("the abandoned file to go", || files(dir.path()).len() == 1).await;
        assert!(disk.lookup("g", &h).is_none());

        // A body altered on disk: the stream ends in an error, not in the wrong bytes, and the
        // file goes.
        let path = id.path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let altered = disk.load(id, 0).await.unwrap();
        let body = altered.body.slice(0, altered.body.len()).collect().await;
        assert!(body.is_err());
        assert_eq!(disk.tier.metrics.rejected.get(), 1);
        until("the altered file to go", || !path.exists()).await;
    }

    #[tokio::test]
    async fn a_purge_or_removal_also_takes_writes_still_queued() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::default();
        let h = HeaderMap::new();
        let disk = Disk::start("t", dir.path(), 1 << 24, &registry).unwrap();
        let body: &'static [u8] = &[b'q'; 10_000];
        for i in 0..100 {
            assert!(disk.write(&format!("k{i}"), "", object(&format!("/q/{i}"), body), None));
        }
        assert!(disk.write("kept", "", object("/kept", body), None));
        disk.purge(Arc::new(|p: &str| p.starts_with("/q/")));
        assert!(disk.write("gone", "", object("/gone", body), None));
        disk.remove("gone");
        let kept = Id::of("kept", "").path(dir.path());
        // The writer runs the jobs in order: what was written before the purge goes after.
        until("the writer", || {
            disk.tier.metrics.tier.writes.get() == 102 && files(dir.path()) == [kept.clone()]
        })
        .await;
        assert!(disk.lookup("kept", &h).is_some());
        assert_eq!(disk.tier.metrics.tier.objects.get(), 1);
    }
}
