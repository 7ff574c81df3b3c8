//! A named cache: its memory tier (objects by primary key, the filter's `key`, and under it by
//! the values of the request headers its answers vary on; bounded by bytes, least recently used
//! first out) and its disk tier when configured ([`Disk`]), which every stored object is also
//! written to and a memory miss is read from. A store lives in a process-wide registry by
//! gateway and name, so a reload that keeps a cache keeps its objects ([`PerGateway`]). It
//! also keeps the fetches in flight, for coalescing, with their answers as they arrive
//! ([`Flight`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode};
use tokio::sync::watch;
use tokio::time::Instant;

use super::disk::{Disk, DiskFill, Guard, Stored, body::FileBody};
use super::flight::Flight;
use super::metrics::TierMetrics;
use crate::body::Body;
use crate::per_gateway::PerGateway;
use crate::telemetry::{Counter, Registry};

/// What a store counts for each object beside its body, head and keys (the map entries, the
/// LRU entry, the `Arc`).
const OBJECT_OVERHEAD: usize = 160;

/// A stored answer.
#[derive(Debug)]
pub struct Object {
    pub status: StatusCode,
    /// The head as stored: without `Age` and framing headers (set when it is served).
    pub headers: HeaderMap,
    pub body: Payload,
    /// The path of the request that fetched it (for purges).
    pub path: String,
    /// When it was stored (or last revalidated).
    pub stored: Instant,
    pub initial_age: Duration,
    pub lifetime: Duration,
    pub always_revalidate: bool,
    /// How long past `lifetime` it is served while revalidated in the background.
    pub stale_while_revalidate: Duration,
    /// How long past `lifetime` it is served when the upstream fails.
    pub stale_if_error: Duration,
    /// The request headers its variants are chosen by.
    pub vary: Vec<HeaderName>,
}

impl Object {
    /// Its current age (RFC 9111 §4.2.3).
    pub fn age(&self, now: Instant) -> Duration {
        self.initial_age + now.saturating_duration_since(self.stored)
    }

    /// Fresh, and may be served without asking the upstream.
    pub fn fresh(&self, now: Instant) -> bool {
        !self.always_revalidate && self.age(now) < self.lifetime
    }

    /// How long it has been stale (zero while fresh).
    pub fn staleness(&self, now: Instant) -> Duration {
        self.age(now).saturating_sub(self.lifetime)
    }

    fn size(&self, keys: usize) -> usize {
        let head: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 32)
            .sum();
        self.body.len() as usize + head + self.path.len() + keys + OBJECT_OVERHEAD
    }
}

/// Where an object's body is.
#[derive(Debug, Clone)]
pub enum Payload {
    Memory(Bytes),
    /// In the disk tier's file (an object too large for the memory tier, read from disk).
    File(Arc<Stored>),
}

impl Payload {
    pub fn len(&self) -> u64 {
        match self {
            Self::Memory(b) => b.len() as u64,
            Self::File(s) => s.opened.body_len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes `first..end` as a body.
    pub fn slice(&self, first: u64, end: u64) -> Body {
        match self {
            Self::Memory(b) if first == 0 && end == b.len() as u64 => Body::full(b.clone()),
            Self::Memory(b) => Body::full(b.slice(first as usize..end as usize)),
            Self::File(s) => Body::new(FileBody::new(s.clone(), first, end)),
        }
    }
}

/// Which tier an object was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Memory,
    Disk,
}

/// The variant key of a request: the values of the `vary` headers.
pub fn variant(vary: &[HeaderName], req: &HeaderMap) -> String {
    let mut out = String::new();
    for name in vary {
        out.push_str(name.as_str());
        out.push(':');
        for (i, v) in req.get_all(name).iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&String::from_utf8_lossy(v.as_bytes()));
        }
        out.push('\n');
    }
    out
}

struct Slot {
    object: Arc<Object>,
    tick: u64,
    size: usize,
}

#[derive(Default)]
struct Primary {
    /// The `Vary` names of the last answer stored under this key.
    vary: Vec<HeaderName>,
    /// By variant key; a list, since most keys have one variant and few have many.
    variants: Vec<(String, Slot)>,
}

/// Primary keys are hashed with foldhash, seeded at random per map: a lookup on every hit hashes
/// the key, and the keys come from requests.
type Hasher = foldhash::fast::RandomState;

#[derive(Default)]
struct Inner {
    /// By primary key; the key is shared with the LRU order's entries.
    primaries: HashMap<Arc<str>, Primary, Hasher>,
    /// Use order: tick → (primary, variant).
    lru: BTreeMap<u64, (Arc<str>, String)>,
    tick: u64,
    bytes: usize,
    objects: usize,
}

/// The store's series.
struct Metrics {
    tier: TierMetrics,
    purged: Counter,
}

/// One named cache.
pub struct Store {
    capacity: Mutex<usize>,
    inner: Mutex<Inner>,
    /// Fetches in flight by primary key: a receiver that sees the answer's flight once the
    /// leading request found it storable, and its sender go when the fetch has ended (stored
    /// or not).
    inflight: Mutex<HashMap<String, watch::Receiver<Option<Arc<Flight>>>>>,
    disk: ArcSwapOption<Disk>,
    metrics: Metrics,
}

/// The fetch a request leads; dropping it lets the waiters go.
pub struct Leader {
    store: Arc<Store>,
    key: String,
    flight: watch::Sender<Option<Arc<Flight>>>,
}

impl Leader {
    /// Shows the waiters the answer being stored, for them to stream.
    pub(super) fn publish(&self, flight: Arc<Flight>) {
        self.flight.send_replace(Some(flight));
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        lock(&self.store.inflight).remove(&self.key);
    }
}

/// Whether a request leads the fetch of a key or waits for another's.
pub(super) enum Fetch {
    Lead(Leader),
    Wait(watch::Receiver<Option<Arc<Flight>>>),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store {
    fn new(name: &str, capacity: usize, registry: &Registry) -> Self {
        let labels = [("cache", name), ("tier", "memory")];
        Self {
            capacity: Mutex::new(capacity),
            inner: Mutex::default(),
            inflight: Mutex::default(),
            disk: ArcSwapOption::empty(),
            metrics: Metrics {
                tier: TierMetrics::new(registry, &labels),
                purged: registry.counter(
                    "gateway_cache_purged_total",
                    "Objects removed by the admin API's purge, by cache.",
                    &[("cache", name)],
                ),
            },
        }
    }

    /// The object for a request under `primary`, counted as used.
    pub fn get(&self, primary: &str, req: &HeaderMap) -> Option<Arc<Object>> {
        let mut inner = lock(&self.inner);
        let inner = &mut *inner;
        let p = inner.primaries.get_mut(primary)?;
        let v = variant(&p.vary, req);
        let (_, slot) = p.variants.iter_mut().find(|(k, _)| *k == v)?;
        inner.tick += 1;
        let (k, val) = inner.lru.remove(&slot.tick)?;
        slot.tick = inner.tick;
        inner.lru.insert(inner.tick, (k, val));
        Some(slot.object.clone())
    }

    /// Stores an object for a request under `primary`, in memory (evicting what the bound
    /// needs) and on disk. False when neither tier takes it.
    pub fn put(&self, primary: &str, req: &HeaderMap, object: Object) -> bool {
        self.put_guarded(primary, req, object, None)
    }

    /// [`Store::put`], dropping `done` once the object can be found: at once when it went to
    /// memory, else when its file is written (requests coalesced on its fetch wait for that).
    pub fn put_guarded(
        &self,
        primary: &str,
        req: &HeaderMap,
        object: Object,
        done: Option<Guard>,
    ) -> bool {
        let v = variant(&object.vary, req);
        let object = Arc::new(object);
        let in_memory = self.put_memory(primary, &v, object.clone());
        let done = if in_memory { None } else { done };
        let on_disk = self
            .disk
            .load()
            .as_ref()
            .is_some_and(|d| d.write(primary, &v, object, done));
        in_memory || on_disk
    }

    /// Whether it has a disk tier.
    pub fn has_disk(&self) -> bool {
        self.disk.load().is_some()
    }

    /// The memory tier's bound.
    pub fn memory_bound(&self) -> usize {
        *lock(&self.capacity)
    }

    /// Starts streaming an object too large for memory to disk (`object` is its head); `None`
    /// without a disk tier, or when its writer is behind.
    pub fn begin_fill(&self, primary: &str, req: &HeaderMap, object: Object) -> Option<DiskFill> {
        let disk = self.disk.load_full()?;
        disk.begin_fill(primary, &variant(&object.vary, req), Arc::new(object))
    }

    /// Ends a fill begun by [`Store::begin_fill`]: its file goes into place, and replaces any
    /// version in memory; `done` is dropped once it can be found.
    pub fn end_fill(&self, fill: DiskFill, done: Option<Guard>) {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        Self::forget(inner, &fill.primary, &fill.variant);
        self.publish(inner);
        drop(guard);
        fill.finish(done);
    }

    /// Stores an object in memory under `primary` and variant `v`. False when its body is not
    /// in memory, or it alone exceeds the bound: an older version goes then.
    fn put_memory(&self, primary: &str, v: &str, object: Arc<Object>) -> bool {
        let size = object.size(primary.len() + v.len());
        let capacity = *lock(&self.capacity);
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        if size > capacity || matches!(object.body, Payload::File(_)) {
            Self::forget(inner, primary, v);
            self.publish(inner);
            return false;
        }
        let key = match inner.primaries.get_key_value(primary) {
            Some((k, _)) => k.clone(),
            None => {
                let k: Arc<str> = Arc::from(primary);
                inner.primaries.insert(k.clone(), Primary::default());
                k
            }
        };
        let p = inner.primaries.get_mut(primary).expect("just inserted");
        if p.vary != object.vary {
            // The answer now varies on other headers: the old variants are unreachable.
            let old = std::mem::take(&mut p.variants);
            p.vary = object.vary.clone();
            for (_, s) in old {
                inner.lru.remove(&s.tick);
                inner.bytes -= s.size;
                inner.objects -= 1;
            }
        }
        let p = inner.primaries.get_mut(primary).expect("just inserted");
        inner.tick += 1;
        let slot = Slot {
            object,
            tick: inner.tick,
            size,
        };
        let old = match p.variants.iter_mut().find(|(k, _)| *k == v) {
            Some((_, s)) => Some(std::mem::replace(s, slot)),
            None => {
                // Most keys have one variant: no room for more until there are more.
                p.variants.reserve_exact(1);
                p.variants.push((v.to_owned(), slot));
                None
            }
        };
        if let Some(old) = old {
            inner.lru.remove(&old.tick);
            inner.bytes -= old.size;
            inner.objects -= 1;
        }
        inner.lru.insert(inner.tick, (key, v.to_owned()));
        inner.bytes += size;
        inner.objects += 1;
        let evicted = Self::evict(inner, capacity);
        self.metrics.tier.evictions.add(evicted as u64);
        self.metrics.tier.writes.inc();
        self.publish(inner);
        true
    }

    /// Whether the disk tier has an object for a request under `primary` (counted as used).
    pub fn on_disk(&self, primary: &str, req: &HeaderMap) -> bool {
        self.disk
            .load()
            .as_ref()
            .is_some_and(|d| d.lookup(primary, req).is_some())
    }

    /// The object for a request under `primary` from memory, else from disk (promoted to
    /// memory when it fits there), with the tier it was found in.
    pub async fn find(&self, primary: &str, req: &HeaderMap) -> Option<(Arc<Object>, Tier)> {
        if let Some(o) = self.get(primary, req) {
            return Some((o, Tier::Memory));
        }
        let disk = self.disk.load_full()?;
        let id = disk.lookup(primary, req)?;
        let capacity = *lock(&self.capacity) as u64;
        let object = Arc::new(disk.load(id, capacity).await?);
        if matches!(object.body, Payload::Memory(_)) {
            self.put_memory(primary, &variant(&object.vary, req), object.clone());
        }
        Some((object, Tier::Disk))
    }

    /// Sets the disk tier: kept when its directory is the same (only its bound may change),
    /// started on a new one (which it scans), dropped when `None`.
    pub fn set_disk(
        &self,
        name: &str,
        disk: Option<&gateway_config::model::CacheDiskConfig>,
        registry: &Registry,
    ) -> std::io::Result<()> {
        let Some(cfg) = disk else {
            self.disk.store(None);
            return Ok(());
        };
        if let Some(live) = self.disk.load().as_ref()
            && live.root() == cfg.path
        {
            live.resize(cfg.size.bytes());
            return Ok(());
        }
        let tier = Disk::start(name, &cfg.path, cfg.size.bytes(), registry)?;
        self.disk.store(Some(Arc::new(tier)));
        Ok(())
    }

    /// Evicts the least recently used objects until `capacity` holds: how many went.
    fn evict(inner: &mut Inner, capacity: usize) -> usize {
        let mut n = 0;
        while inner.bytes > capacity {
            let Some((_, (primary, v))) = inner.lru.pop_first() else {
                break;
            };
            Self::unlink(inner, &primary, &v);
            n += 1;
        }
        n
    }

    /// Removes the object of `primary` and variant `v`, if in memory.
    fn forget(inner: &mut Inner, primary: &str, v: &str) {
        let tick = inner
            .primaries
            .get(primary)
            .and_then(|p| p.variants.iter().find(|(k, _)| k == v))
            .map(|(_, s)| s.tick);
        if let Some(tick) = tick {
            inner.lru.remove(&tick);
            Self::unlink(inner, primary, v);
        }
    }

    /// Removes one object already out of the LRU order.
    fn unlink(inner: &mut Inner, primary: &str, v: &str) {
        let Some(p) = inner.primaries.get_mut(primary) else {
            return;
        };
        if let Some(i) = p.variants.iter().position(|(k, _)| k == v) {
            let (_, s) = p.variants.swap_remove(i);
            inner.bytes -= s.size;
            inner.objects -= 1;
        }
        if p.variants.is_empty() {
            inner.primaries.remove(primary);
        }
    }

    /// Removes every variant under `primary` from both tiers (an unsafe method's answer
    /// invalidates it): how many objects went.
    pub fn remove(&self, primary: &str) -> usize {
        let mut gone: Vec<String> = self
            .disk
            .load()
            .as_ref()
            .map(|d| d.remove(primary))
            .unwrap_or_default();
        let mut inner = lock(&self.inner);
        if let Some(p) = inner.primaries.remove(primary) {
            for (v, s) in p.variants {
                inner.lru.remove(&s.tick);
                inner.bytes -= s.size;
                inner.objects -= 1;
                gone.push(v);
            }
            self.publish(&inner);
        }
        gone.sort_unstable();
        gone.dedup();
        gone.len()
    }

    /// Removes the objects whose request path `matches`: how many went.
    pub fn purge(&self, matches: impl Fn(&str) -> bool + Send + Sync + 'static) -> usize {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        let gone: Vec<(u64, Arc<str>, String)> = inner
            .primaries
            .iter()
            .flat_map(|(k, p)| {
                p.variants
                    .iter()
                    .filter(|(_, s)| matches(&s.object.path))
                    .map(|(v, s)| (s.tick, k.clone(), v.clone()))
            })
            .collect();
        for (tick, primary, v) in &gone {
            inner.lru.remove(tick);
            Self::unlink(inner, primary, v);
        }
        self.publish(inner);
        drop(guard);
        let mut keys: Vec<(String, String)> = gone
            .into_iter()
            .map(|(_, p, v)| (p.to_string(), v))
            .collect();
        if let Some(d) = self.disk.load().as_ref() {
            keys.extend(d.purge(Arc::new(matches)));
        }
        keys.sort_unstable();
        keys.dedup();
        self.metrics.purged.add(keys.len() as u64);
        keys.len()
    }

    fn publish(&self, inner: &Inner) {
        self.metrics.tier.bytes.set(inner.bytes as i64);
        self.metrics.tier.objects.set(inner.objects as i64);
    }

    /// Sets the bound, evicting what exceeds it.
    pub fn resize(&self, capacity: usize) {
        *lock(&self.capacity) = capacity;
        let mut inner = lock(&self.inner);
        let evicted = Self::evict(&mut inner, capacity);
        self.metrics.tier.evictions.add(evicted as u64);
        self.publish(&inner);
    }

    /// Leads the fetch of `primary`, or joins the one in flight.
    pub(super) fn fetch(self: &Arc<Self>, primary: &str) -> Fetch {
        let mut inflight = lock(&self.inflight);
        if let Some(rx) = inflight.get(primary) {
            return Fetch::Wait(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        inflight.insert(primary.to_owned(), rx);
        Fetch::Lead(Leader {
            store: self.clone(),
            key: primary.to_owned(),
            flight: tx,
        })
    }
}

static STORES: PerGateway<String, Store> = PerGateway::new();

/// The live store named `name` in the gateway owning `registry`, or a new one bounded by
/// `capacity` (a live one keeps its bound until [`Store::resize`]: a generation that is only
/// checked, or fails to build, must not shrink it).
pub fn get_or_insert(registry: &Arc<Registry>, name: &str, capacity: usize) -> Arc<Store> {
    STORES.get_or_insert(registry, name.to_owned(), || {
        Store::new(name, capacity, registry)
    })
}

#[cfg(test)]
impl Object {
    /// A `200` for `path` with `body`, no header and no `Vary`, fresh for a minute from now: what
    /// the cache's unit tests store.
    pub(crate) fn sample(path: &str, body: Bytes) -> Self {
        Object {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Payload::Memory(body),
            path: path.into(),
            stored: Instant::now(),
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(60),
            always_revalidate: false,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
            vary: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(body: usize, path: &str) -> Object {
        Object::sample(path, Bytes::from(vec![b'x'; body]))
    }

    #[test]
    fn evicts_least_recently_used_within_the_bound() {
        let registry = Arc::new(Registry::default());
        let store = get_or_insert(&registry, "t", 3 * (1000 + 400));
        let h = HeaderMap::new();
        for k in ["a", "b", "c"] {
            assert!(store.put(k, &h, object(1000, k)));
        }
        assert!(store.get("a", &h).is_some());
        assert!(store.put("d", &h, object(1000, "d")));
        assert!(store.get("b", &h).is_none(), "b was least recently used");
        assert!(store.get("a", &h).is_some() && store.get("d", &h).is_some());
        assert!(
            !store.put("e", &h, object(10_000, "e")),
            "larger than the bound"
        );
        assert_eq!(store.purge(|p| p.starts_with('a')), 1);
        assert_eq!(store.remove("d"), 1);
        let inner = lock(&store.inner);
        assert_eq!(inner.objects, 1);
        assert_eq!(inner.lru.len(), 1);
    }

    #[test]
    fn variants_by_vary_and_vary_change_drops_them() {
        let registry = Arc::new(Registry::default());
        let store = get_or_insert(&registry, "t", 1 << 20);
        let mut en = HeaderMap::new();
        en.insert("accept-language", "en".parse().unwrap());
        let mut fr = HeaderMap::new();
        fr.insert("accept-language", "fr".parse().unwrap());
        let mut o = object(10, "/");
        o.vary = vec![HeaderName::from_static("accept-language")];
        store.put("k", &en, o);
        assert!(store.get("k", &en).is_some());
        assert!(store.get("k", &fr).is_none());
        store.put("k", &fr, object(10, "/"));
        assert!(
            store.get("k", &en).is_some(),
            "no Vary: one variant for all"
        );
        assert_eq!(lock(&store.inner).objects, 1);
    }
}
