//! The in-memory cache of small files (nginx's `open_file_cache` plus the content). An entry
//! holds the file's bytes, its compressed variants and each one's 200 header map precomputed, so
//! a hit does no file I/O and allocates nothing beyond its copy of that map. Entries are trusted
//! for `revalidate_after`, then one request re-checks the file (path, inode, size, mtime) while
//! the others keep being served. The map is sharded behind read-write locks, so readers never
//! wait on each other; total bytes are bounded with CLOCK eviction (a "used" bit per entry).
//!
//! The map is generic over what it holds ([`Cached`]): the same map keeps the descriptors of
//! files too large for it ([`super::open_files`]), with a budget in descriptors.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};

use super::encoding::{Accept, Encoding};
use super::resolve::Stamp;
use super::response::{self, Representation};
use super::sealed::SealedFile;

/// Bytes charged per entry on top of its content (map slot, header values, key).
const ENTRY_OVERHEAD: usize = 512;
/// Bytes charged per representation for its 200's header map (up to nine headers) and the
/// same headers as wire text for the HTTP/1.1 fast path.
const VARIANT_OVERHEAD: usize = 1536;
const SHARDS: usize = 16;

/// Bodies from this size on are held in a sealed memory file ([`SealedFile`]), which the
/// HTTP/1.1 fast path sends with `sendfile`. Below it, the kernel's copy of the bytes costs less
/// than the second system call (the head, then the file) and the descriptor each one holds.
pub(super) const SEALED_FROM: usize = 32 * 1024;

/// One representation held in memory.
pub(super) struct Variant {
    pub(super) encoding: Option<Encoding>,
    pub(super) body: Bytes,
    /// The memory file `body` maps, for a body of at least [`SEALED_FROM`] bytes.
    pub(super) sealed: Option<Arc<SealedFile>>,
    pub(super) etag: HeaderValue,
    /// The headers of a 200 for it, `Server` slot first (see [`response::ok_headers`]).
    pub(super) ok_headers: HeaderMap,
    /// The same headers as the HTTP/1.1 fast path writes them ([`response::wire_lines`]).
    pub(super) wire: Bytes,
    /// Where `wire`'s `Content-Length` line starts, the last: the lines before it are the
    /// representation's, which a 206 of it carries too.
    pub(super) length_at: usize,
    /// Its 304's header lines for the fast path ([`response::not_modified_lines`]).
    pub(super) not_modified: Bytes,
}

impl Variant {
    /// `file`: the file's headers with this representation's coding; `etag` replaces its ETag.
    fn new(body: Bytes, etag: HeaderValue, file: Representation<'_>) -> Self {
        let rep = Representation {
            etag: &etag,
            ..file
        };
        let ok_headers = response::ok_headers(&rep, HeaderValue::from(body.len()));
        let wire = response::wire_lines(&ok_headers);
        // `ok_headers` inserts the length last, after the representation's headers.
        let length_at = response::representation_lines(&rep).len();
        debug_assert!(wire[length_at..].starts_with(b"content-length: "));
        let not_modified = response::not_modified_lines(&rep);
        let (body, sealed) = seal_large(body);
        Self {
            encoding: file.encoding,
            body,
            sealed,
            etag,
            ok_headers,
            wire,
            length_at,
            not_modified,
        }
    }
}

/// Moves a large body into a sealed memory file; a body that stays on the heap (small, or the
/// memory file could not be made) is served as before, written rather than sent as a file.
fn seal_large(body: Bytes) -> (Bytes, Option<Arc<SealedFile>>) {
    if body.len() < SEALED_FROM {
        return (body, None);
    }
    match SealedFile::copy_of(&body) {
        Ok(sealed) => {
            let sealed = Arc::new(sealed);
            (sealed.bytes(), Some(sealed))
        }
        Err(e) => {
            tracing::debug!(error = %e, "no memory file for a cached body; it is written instead of sent as a file");
            (body, None)
        }
    }
}

/// A cached file.
pub(super) struct Entry {
    pub(super) stamp: Stamp,
    pub(super) content_type: HeaderValue,
    pub(super) last_modified: HeaderValue,
    /// Last-Modified as seconds since the epoch, for If-Modified-Since.
    pub(super) modified: u64,
    /// Whether the response depends on Accept-Encoding.
    pub(super) vary: bool,
    pub(super) identity: Variant,
    /// Encoded variants, in server preference order.
    encoded: Box<[Variant]>,
    marks: Marks,
    weight: usize,
}

impl Entry {
    pub(super) fn new(
        stamp: Stamp,
        content_type: HeaderValue,
        body: Bytes,
        encoded: Vec<(Encoding, Bytes, HeaderValue)>,
        cache_control: Option<&HeaderValue>,
    ) -> Self {
        let version = stamp.version;
        let last_modified = version.last_modified();
        let identity_etag = version.etag(None);
        let file = Representation {
            content_type: &content_type,
            last_modified: &last_modified,
            etag: &identity_etag,
            vary: !encoded.is_empty(),
            encoding: None,
            cache_control,
        };
        let encoded: Box<[Variant]> = encoded
            .into_iter()
            .map(|(e, b, t)| {
                let rep = Representation {
                    encoding: Some(e),
                    ..file
                };
                Variant::new(b, t, rep)
            })
            .collect();
        let identity = Variant::new(body, identity_etag.clone(), file);
        let weight = ENTRY_OVERHEAD
            + VARIANT_OVERHEAD * (1 + encoded.len())
            + identity.body.len()
            + encoded.iter().map(|v| v.body.len()).sum::<usize>();
        let vary = file.vary;
        Self {
            content_type,
            last_modified,
            modified: version.http_secs(),
            vary,
            identity,
            encoded,
            stamp,
            marks: Marks::default(),
            weight,
        }
    }

    /// The best variant for `accept` (identity when nothing encoded is acceptable).
    pub(super) fn choose(&self, accept: &Accept) -> &Variant {
        let mut best = &self.identity;
        let mut best_q = 0;
        for v in &self.encoded {
            let q = v.encoding.map_or(0, |e| accept.q(e));
            if q > best_q {
                (best, best_q) = (v, q);
            }
        }
        best
    }
}

impl Cached for Entry {
    fn weight(&self) -> usize {
        self.weight
    }

    fn marks(&self) -> &Marks {
        &self.marks
    }
}

/// When an entry was last checked against the disk, and its CLOCK bit.
#[derive(Default)]
pub(super) struct Marks {
    /// In ms of the terminal's clock.
    checked: AtomicU64,
    /// New entries start cold: a file requested once (a crawler's scan) is the first to go.
    /// The insert that brings one in does not evict it (see `Cache::evict`).
    used: AtomicBool,
}

/// What the sharded map holds: an entry with a weight against the map's budget and its
/// [`Marks`].
pub(super) trait Cached {
    /// What the entry costs against the map's budget.
    fn weight(&self) -> usize;

    fn marks(&self) -> &Marks;

    /// Records that the file was just checked against the disk.
    fn set_checked(&self, now: u64) {
        self.marks().checked.store(now, Relaxed);
    }

    /// Whether the entry was checked less than `ttl` ago (no request needs to claim a re-check).
    fn is_fresh(&self, now: u64, ttl: u64) -> bool {
        !recheck_due(self.marks().checked.load(Relaxed), now, ttl)
    }

    /// Whether this request should re-check the file. Exactly one request claims each expired
    /// window; concurrent ones keep using the entry until the check is done.
    fn claim_revalidation(&self, now: u64, ttl: u64) -> bool {
        let checked = &self.marks().checked;
        let last = checked.load(Relaxed);
        recheck_due(last, now, ttl)
            && checked
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
    }

    fn touch(&self) {
        // Read first: writing a shared cache line on every hit would make cores contend.
        let used = &self.marks().used;
        if !used.load(Relaxed) {
            used.store(true, Relaxed);
        }
    }
}

/// Whether an entry last checked at `checked` is due for a re-check at `now` (all in
/// milliseconds of the terminal's clock).
fn recheck_due(checked: u64, now: u64, ttl: u64) -> bool {
    now.saturating_sub(checked) >= ttl
}

/// Paths are hashed with foldhash, seeded at random per map: a lookup hashes the request's path
/// twice (shard, then slot), and SipHash, std's default, is a noticeable share of a cached
/// file's request. Keys are paths of files that exist; the random seeds keep even
/// file names chosen to collide from being aimed at one slot.
type Hasher = foldhash::fast::RandomState;

type Shard<E> = RwLock<HashMap<Box<str>, Arc<E>, Hasher>>;

/// The sharded map with a budget: bytes for the memory cache, descriptors for the open files.
pub(super) struct Cache<E> {
    shards: Box<[Shard<E>]>,
    /// Picks the shard; each shard's map has a hasher of its own (other seeds), so the keys of
    /// one shard do not share the bits their map indexes by.
    hasher: Hasher,
    total: AtomicUsize,
    max_total: usize,
    /// CLOCK hand: the next shard to sweep.
    hand: AtomicUsize,
}

impl<E: Cached> Cache<E> {
    pub(super) fn new(max_total: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: Hasher::default(),
            total: AtomicUsize::new(0),
            max_total,
            hand: AtomicUsize::new(0),
        }
    }

    fn shard(&self, key: &str) -> &Shard<E> {
        // Truncating the hash is fine: only its low bits pick the shard.
        let h = self.hasher.hash_one(key) as usize;
        &self.shards[h % SHARDS]
    }

    pub(super) fn get(&self, key: &str) -> Option<Arc<E>> {
        let entry = read(self.shard(key)).get(key).cloned();
        if let Some(e) = &entry {
            e.touch();
        }
        entry
    }

    /// Adds or replaces an entry, then evicts down to the budget. An entry larger than the
    /// whole budget is not kept.
    pub(super) fn insert(&self, key: &str, entry: Arc<E>) {
        let weight = entry.weight();
        if weight > self.max_total {
            self.remove(key);
            return;
        }
        if let Some(old) = write(self.shard(key)).insert(key.into(), entry) {
            self.total.fetch_sub(old.weight(), Relaxed);
        }
        if self.total.fetch_add(weight, Relaxed) + weight > self.max_total {
            self.evict(key);
        }
    }

    pub(super) fn remove(&self, key: &str) {
        if let Some(old) = write(self.shard(key)).remove(key) {
            self.total.fetch_sub(old.weight(), Relaxed);
        }
    }

    /// Drops every entry last checked before `since`: files nobody asked for since they fell
    /// due.
    pub(super) fn drop_checked_before(&self, since: u64) {
        for shard in &self.shards {
            write(shard).retain(|_, e| {
                let keep = e.marks().checked.load(Relaxed) >= since;
                if !keep {
                    self.total.fetch_sub(e.weight(), Relaxed);
                }
                keep
            });
        }
    }

    /// What the map may hold (0: nothing is kept).
    pub(super) fn budget(&self) -> usize {
        self.max_total
    }

    /// Bytes held.
    pub(super) fn total(&self) -> usize {
        self.total.load(Relaxed)
    }

    /// CLOCK: sweep shards in turn, giving used entries a second chance (clearing the bit) and
    /// dropping unused ones until the total fits; `keep` (the entry just inserted) is spared.
    /// Two rounds always suffice, since the first clears every bit.
    fn evict(&self, keep: &str) {
        for _ in 0..2 * SHARDS {
            if self.total() <= self.max_total {
                return;
            }
            let i = self.hand.fetch_add(1, Relaxed) % SHARDS;
            write(&self.shards[i]).retain(|k, e| {
                if self.total() <= self.max_total
                    || **k == *keep
                    || e.marks().used.swap(false, Relaxed)
                {
                    return true;
                }
                self.total.fetch_sub(e.weight(), Relaxed);
                false
            });
        }
    }
}

// A panic while a lock was held cannot leave a map half-updated (each operation is a single
// insert, remove or retain), so a poisoned lock is still safe to use.
fn read<E>(s: &Shard<E>) -> RwLockReadGuard<'_, HashMap<Box<str>, Arc<E>, Hasher>> {
    s.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<E>(s: &Shard<E>) -> RwLockWriteGuard<'_, HashMap<Box<str>, Arc<E>, Hasher>> {
    s.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::static_files::resolve::Stamp;

    fn entry(size: usize) -> Arc<Entry> {
        Arc::new(Entry::new(
            Stamp::for_tests(size as u64),
            HeaderValue::from_static("text/plain"),
            Bytes::from(vec![b'x'; size]),
            vec![(
                Encoding::Gzip,
                Bytes::from_static(b"gz"),
                HeaderValue::from_static("\"g\""),
            )],
            None,
        ))
    }

    #[test]
    fn insert_get_replace_remove() {
        let c = Cache::new(1 << 20);
        c.insert("/a", entry(100));
        assert_eq!(c.get("/a").unwrap().identity.body.len(), 100);
        assert!(c.get("/b").is_none());
        c.insert("/a", entry(200));
        assert_eq!(c.total(), ENTRY_OVERHEAD + 2 * VARIANT_OVERHEAD + 202);
        c.remove("/a");
        assert_eq!(c.total(), 0);
        assert!(c.get("/a").is_none());
    }

    #[test]
    fn bounded_with_clock_eviction() {
        let budget = 10 * (ENTRY_OVERHEAD + 2 * VARIANT_OVERHEAD + 1002);
        let c = Cache::new(budget);
        for i in 0..100 {
            c.insert(&format!("/f{i}"), entry(1000));
            // Keep /f0 hot: it should survive the sweeps.
            let _ = c.get("/f0");
            assert!(c.total() <= budget);
        }
        assert!(c.get("/f0").is_some());
        assert!(c.get("/f99").is_some());
        // Too large for the whole budget: not kept.
        c.insert("/huge", entry(budget));
        assert!(c.get("/huge").is_none());
        assert!(c.total() <= budget);
    }

    #[test]
    fn entries_not_checked_since_a_time_are_dropped() {
        let c = Cache::new(1 << 20);
        for (key, checked) in [("/old", 1_000), ("/new", 5_000)] {
            let e = entry(10);
            e.set_checked(checked);
            c.insert(key, e);
        }
        let before = c.total();
        c.drop_checked_before(2_000);
        assert!(c.get("/old").is_none());
        assert!(c.get("/new").is_some());
        assert_eq!(c.total(), before / 2);
    }

    #[test]
    fn choose_and_revalidation_claims() {
        let e = entry(10);
        let mut h = http::HeaderMap::new();
        assert!(e.choose(&Accept::from_headers(&h)).encoding.is_none());
        h.insert("accept-encoding", HeaderValue::from_static("gzip"));
        assert_eq!(
            e.choose(&Accept::from_headers(&h)).encoding,
            Some(Encoding::Gzip)
        );
        assert!(e.vary);

        e.set_checked(1_000);
        assert!(!e.claim_revalidation(1_500, 1_000));
        assert!(e.claim_revalidation(2_000, 1_000));
        // Claimed: the next caller in the same window serves the entry as is.
        assert!(!e.claim_revalidation(2_001, 1_000));
        assert!(e.claim_revalidation(5_000, 0));
    }
}
